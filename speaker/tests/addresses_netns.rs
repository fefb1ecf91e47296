//! Interface choice and standalone addresses against a real kernel, in network namespaces.
//!
//! Each test builds two namespaces joined by a veth pair (198.51.100.0/24, 2001:db8:100::/64;
//! names carry the process id), runs the code under test on a thread that entered namespace A
//! (`setns`), and probes from namespace B with `arping` and `ping`. Root only: each test is
//! `#[ignore = "needs root: ..."]` and runs with `--include-ignored` (as `sudo ./test.sh` does);
//! run so without root, it fails saying why. Needs iproute2, arping (Thomas Habets' 2.x) and
//! iputils-ping.
//! The namespaces are deleted by a guard, also when an assertion fails.

mod netns;

use std::time::Duration;

use netns::{Lab, arp_answered, ip, must, require_root, run};

use swimlb_speaker::model::links::{NoInterface, choose};
use swimlb_speaker::net::addresses::{Addresses, Error as AddressError, HolderKind};
use swimlb_speaker::net::netlink::{InterfaceWatch, snapshot};

/// Pings `target` over IPv6 from namespace B: a reply needs a neighbor advertisement first.
fn ns_answered(b: &str, veth_b: &str, target: &str) -> bool {
    let _ = run(&["ip", "-n", b, "-6", "neigh", "flush", "dev", veth_b]);
    let pinged = run(&[
        "ip", "netns", "exec", b, "ping", "-6", "-c", "1", "-W", "1", target,
    ]);
    let neigh = must(&["ip", "-n", b, "-6", "neigh", "show", target, "dev", veth_b]);
    assert_eq!(
        pinged.status.success(),
        neigh.contains("lladdr"),
        "ping and neighbour table disagree about {target}: {neigh}"
    );
    pinged.status.success()
}

/// The global addresses of `dev` in `ns`, as `inet 198.51.100.10/32` lines (link-local ones
/// change state on their own while DAD runs, so they are left out).
fn global_addresses(ns: &str, dev: &str) -> Vec<String> {
    must(&["ip", "-n", ns, "addr", "show", "dev", dev])
        .lines()
        .filter(|line| line.contains("scope global"))
        .map(|line| {
            line.split_whitespace()
                .take(2)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

fn sysctl(ns: &str, iface: &str, name: &str) -> String {
    let path = format!("/proc/sys/net/ipv4/conf/{iface}/{name}");
    must(&["ip", "netns", "exec", ns, "cat", &path])
        .trim()
        .to_string()
}

async fn change_within_5s(watch: &mut InterfaceWatch) {
    tokio::time::timeout(Duration::from_secs(5), watch.changed())
        .await
        .expect("a link or route change notification within 5 s")
        .expect("the watch stays open");
}

async fn drain(watch: &mut InterfaceWatch) {
    for _ in 0..20 {
        if tokio::time::timeout(Duration::from_millis(200), watch.changed())
            .await
            .is_err()
        {
            return;
        }
    }
}

#[test]
#[ignore = "needs root: network namespaces"]
fn the_veth_holding_the_route_is_chosen_until_it_turns_noarp_or_down() {
    require_root();
    let lab = Lab::new('c');
    let (a, va) = (lab.a.clone(), lab.veth_a.clone());
    lab.run_in_a(move || async move {
        let mut watch = InterfaceWatch::subscribe().expect("subscribe to link and route changes");
        let (links, routes) = snapshot().await.expect("snapshot");
        let chosen = choose(ip("198.51.100.50"), None, &links, &routes).expect("an IPv4 choice");
        assert_eq!(chosen.name, va);
        assert!(chosen.up && chosen.ethernet && !chosen.noarp && chosen.mac != [0; 6]);
        assert_eq!(chosen.kind.as_deref(), Some("veth"));
        let chosen6 = choose(ip("2001:db8:100::50"), None, &links, &routes).expect("IPv6 choice");
        assert_eq!(chosen6.name, va);
        assert_eq!(
            choose(ip("203.0.113.1"), None, &links, &routes),
            Err(NoInterface::NoRoute)
        );
        assert_eq!(
            choose(ip("203.0.113.1"), Some("lo"), &links, &routes),
            Err(NoInterface::NamedLoopback)
        );

        // NOARP keeps the route but makes the link unusable: the next best route (none) is tried.
        drain(&mut watch).await;
        must(&["ip", "-n", &a, "link", "set", &va, "arp", "off"]);
        change_within_5s(&mut watch).await;
        let (links, routes) = snapshot().await.expect("snapshot");
        assert_eq!(
            choose(ip("198.51.100.50"), None, &links, &routes),
            Err(NoInterface::NoUsableRoute)
        );
        assert_eq!(
            choose(ip("198.51.100.50"), Some(&va), &links, &routes),
            Err(NoInterface::NamedNoArp)
        );
        must(&["ip", "-n", &a, "link", "set", &va, "arp", "on"]);

        // Down: the kernel drops the connected routes, and the named link says it is down.
        drain(&mut watch).await;
        must(&["ip", "-n", &a, "link", "set", &va, "down"]);
        change_within_5s(&mut watch).await;
        let (links, routes) = snapshot().await.expect("snapshot");
        assert_eq!(
            choose(ip("198.51.100.50"), None, &links, &routes),
            Err(NoInterface::NoRoute)
        );
        assert_eq!(
            choose(ip("198.51.100.50"), Some(&va), &links, &routes),
            Err(NoInterface::NamedDown)
        );

        // Up again: the choice comes back without a restart.
        must(&["ip", "-n", &a, "link", "set", &va, "up"]);
        change_within_5s(&mut watch).await;
        let mut back = false;
        for _ in 0..50 {
            let (links, routes) = snapshot().await.expect("snapshot");
            if choose(ip("198.51.100.50"), None, &links, &routes).map(|l| l.name.clone())
                == Ok(va.clone())
            {
                back = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(back, "the veth is chosen again after it came back up");
    });
}

#[test]
#[ignore = "needs root: network namespaces"]
fn standalone_vips_sit_on_the_holder_while_the_kernel_stays_silent_and_teardown_removes_them() {
    require_root();
    let lab = Lab::new('a');
    let kind = if lab.kernel_has_dummy() {
        HolderKind::Dummy
    } else {
        eprintln!("this kernel has no dummy link type: the VIPs sit on an ifb link instead");
        HolderKind::Ifb
    };
    let (a, b, va, vb) = (
        lab.a.clone(),
        lab.b.clone(),
        lab.veth_a.clone(),
        lab.veth_b.clone(),
    );
    lab.run_in_a(move || async move {
        let announce = [va.clone()];

        // Control: with the default sysctls the kernel answers ARP on the veth for an address
        // that sits on another interface (weak host model). This is what arp_ignore must stop.
        must(&["ip", "-n", &a, "link", "add", "ctl0", "type", kind.as_str()]);
        must(&["ip", "-n", &a, "link", "set", "ctl0", "up"]);
        must(&[
            "ip",
            "-n",
            &a,
            "addr",
            "add",
            "198.51.100.11/32",
            "dev",
            "ctl0",
        ]);
        must(&[
            "ip",
            "-n",
            &a,
            "addr",
            "add",
            "2001:db8:100::11/128",
            "dev",
            "ctl0",
            "nodad",
        ]);
        assert!(
            arp_answered(&b, &vb, "198.51.100.11"),
            "control: by default the kernel answers ARP for an address on another interface"
        );
        // IPv6 needs no sysctl: the kernel answers an NS only for the receiving interface's
        // own addresses (proxy_ndp is off).
        assert!(
            !ns_answered(&b, &vb, "2001:db8:100::11"),
            "the kernel answered an NS on the veth for an address on another interface"
        );

        if kind == HolderKind::Ifb {
            let refused = Addresses::setup("swimlb0", &[], &announce).await;
            assert!(
                matches!(
                    refused,
                    Err(AddressError::KindUnsupported { kind: "dummy", .. })
                ),
                "a kernel without dummy gives a typed error: {refused:?}"
            );
        }
        let not_ours = Addresses::setup_with(kind, &va, &[ip("198.51.100.10")], &announce).await;
        assert!(
            matches!(&not_ours, Err(AddressError::NotDummy { kind, .. }) if kind == "veth"),
            "a link of another kind is refused: {not_ours:?}"
        );
        must(&["ip", "-n", &a, "link", "show", &va]);
        assert_eq!(
            sysctl(&a, &va, "arp_ignore"),
            "0",
            "a refused setup changes nothing"
        );

        let vips = [ip("198.51.100.10"), ip("2001:db8:100::10")];
        let mut addresses = Addresses::setup_with(kind, "swimlb0", &vips, &announce)
            .await
            .expect("setup");
        let shown = must(&["ip", "-n", &a, "addr", "show", "dev", "swimlb0"]);
        assert!(shown.contains("inet 198.51.100.10/32"), "{shown}");
        assert!(shown.contains("inet6 2001:db8:100::10/128"), "{shown}");
        assert!(shown.contains("nodad"), "{shown}");
        assert!(shown.contains(",UP"), "{shown}");
        assert_eq!(sysctl(&a, &va, "arp_ignore"), "1");
        assert_eq!(sysctl(&a, &va, "arp_announce"), "2");

        assert!(
            arp_answered(&b, &vb, "198.51.100.1"),
            "control: the veth's own address"
        );
        assert!(
            !arp_answered(&b, &vb, "198.51.100.10"),
            "the kernel answered ARP for the VIP"
        );
        assert!(
            !arp_answered(&b, &vb, "198.51.100.11"),
            "arp_ignore covers every other address"
        );
        assert!(
            ns_answered(&b, &vb, "2001:db8:100::1"),
            "control: the veth's own IPv6 address"
        );
        assert!(
            !ns_answered(&b, &vb, "2001:db8:100::10"),
            "the kernel answered an NS for the VIP"
        );

        // Services can bind the VIPs at once (IPv6 without DAD).
        for vip in vips {
            std::net::TcpListener::bind((vip, 0))
                .unwrap_or_else(|e| panic!("bind a service to {vip}: {e}"));
        }

        // Reload with the same configuration changes nothing; with a new one it converges.
        let before = global_addresses(&a, "swimlb0");
        assert_eq!(before.len(), 2, "{before:?}");
        addresses
            .reload(&vips, &announce)
            .await
            .expect("reload, same");
        assert_eq!(global_addresses(&a, "swimlb0"), before);
        addresses
            .reload(&[ip("198.51.100.12")], &announce)
            .await
            .expect("reload, new set");
        assert_eq!(global_addresses(&a, "swimlb0"), ["inet 198.51.100.12/32"]);
        assert_eq!(addresses.vips(), &[ip("198.51.100.12")]);

        // A reload that drops the announcing interface keeps it silent while the VIPs stay;
        // a sysctl someone reset is set again by the next reload.
        addresses
            .reload(&[ip("198.51.100.12")], &[])
            .await
            .expect("reload, no interface");
        assert_eq!(sysctl(&a, &va, "arp_ignore"), "1");
        assert!(
            !arp_answered(&b, &vb, "198.51.100.12"),
            "the kernel answered for a VIP"
        );
        must(&[
            "ip",
            "netns",
            "exec",
            &a,
            "sh",
            "-c",
            &format!("echo 0 > /proc/sys/net/ipv4/conf/{va}/arp_ignore"),
        ]);
        addresses
            .reload(&[ip("198.51.100.12")], &announce)
            .await
            .expect("reload, back");
        assert_eq!(sysctl(&a, &va, "arp_ignore"), "1");

        addresses.teardown().await.expect("teardown");
        let gone = run(&["ip", "-n", &a, "link", "show", "swimlb0"]);
        assert!(!gone.status.success(), "the holder link is deleted");
        assert_eq!(sysctl(&a, &va, "arp_ignore"), "0");
        assert_eq!(sysctl(&a, &va, "arp_announce"), "0");
        assert!(
            arp_answered(&b, &vb, "198.51.100.11"),
            "with the sysctls restored the kernel answers as before"
        );
    });
}
