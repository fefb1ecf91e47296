//! The responder on a real veth, with a real Linux neighbor. Root only: the test is
//! `#[ignore = "needs root: ..."]` and runs with `--include-ignored` (as `sudo ./test.sh` does).
//!
//! The client's kernel resolves the VIP with its own ARP requests and neighbor solicitations;
//! the node's kernel does not have the VIP at all, so every answer the client gets comes from
//! the speaker's responder through the filtered packet socket.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use swimlb_e2e::netns::{self, Lab};
use swimlb_e2e::probe;
use swimlb_proto::ethernet::MacAddr;
use swimlb_speaker::net::packet_socket;
use swimlb_speaker::net::responder::{
    Control, DropLabels, DropReasonLabel, Metrics, Owned, Responder,
};

fn start_responder(
    netns_name: &str,
) -> (
    Responder,
    Metrics,
    swimlb_speaker::net::responder::ConflictReceiver,
) {
    let (tx, rx) = std::sync::mpsc::channel();
    let ns = netns_name.to_string();
    // The socket belongs to the namespace of the thread that creates it.
    std::thread::spawn(move || {
        let result = (|| -> anyhow::Result<_> {
            probe::enter_netns(&ns)?;
            let iface = pnet_datalink_interfaces()
                .into_iter()
                .find(|i| i.name == "eth0")
                .ok_or_else(|| anyhow::anyhow!("no eth0"))?;
            let mac = iface
                .mac
                .ok_or_else(|| anyhow::anyhow!("eth0 has no MAC"))?;
            let channel = packet_socket::open(&iface, Duration::from_millis(20))?;
            Ok((mac, channel))
        })();
        let _ = tx.send(result);
    });
    let (mac, channel) = rx.recv().unwrap().unwrap();
    let metrics = Metrics::default();
    let (conflicts_tx, conflicts_rx) = swimlb_speaker::net::responder::conflict_queue();
    let responder = Responder::spawn(
        "eth0",
        mac,
        channel.tx,
        channel.rx,
        Some(channel.membership),
        metrics.clone(),
        conflicts_tx,
    )
    .unwrap();
    (responder, metrics, conflicts_rx)
}

fn pnet_datalink_interfaces() -> Vec<pnet_datalink::NetworkInterface> {
    pnet_datalink::interfaces()
}

/// The client's neighbor entry for `ip`, after it tried to reach it.
fn resolve(lab: &Lab, ip: IpAddr) -> String {
    let family = if ip.is_ipv4() { "-4" } else { "-6" };
    let _ = Lab::command_in(&lab.client_netns, "ping")
        .args([family, "-c", "1", "-W", "1", &ip.to_string()])
        .output();
    neighbor(lab, ip)
}

fn neighbor(lab: &Lab, ip: IpAddr) -> String {
    lab.run_in(
        &lab.client_netns,
        "ip",
        &["neigh", "show", &ip.to_string(), "dev", "eth0"],
    )
    .unwrap()
}

fn set_neighbor(lab: &Lab, ip: IpAddr, mac: &str) {
    lab.run_in(
        &lab.client_netns,
        "ip",
        &[
            "neigh",
            "replace",
            &ip.to_string(),
            "lladdr",
            mac,
            "dev",
            "eth0",
            "nud",
            "stale",
        ],
    )
    .unwrap();
}

fn flush(lab: &Lab) {
    lab.run_in(&lab.client_netns, "ip", &["neigh", "flush", "dev", "eth0"])
        .unwrap();
}

#[test]
#[ignore = "needs root: network namespaces and a packet socket"]
fn a_linux_neighbor_learns_our_mac_only_while_we_own_the_vip() {
    netns::require_root("a_linux_neighbor_learns_our_mac_only_while_we_own_the_vip");
    let lab = Lab::create_with_id(1, &format!("{}x11", std::process::id())).unwrap();
    let node_mac = netns::mac_text(lab.node(1).mac);
    let vip = IpAddr::V4(Ipv4Addr::new(198, 51, 100, 100));
    let vip6 = IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0x100, 0, 0, 0, 0, 0x100));
    let (responder, metrics, mut conflicts) = start_responder(&lab.node(1).netns);

    // Not owned: the client's ARP request and neighbor solicitation go unanswered.
    assert!(
        !resolve(&lab, vip).contains(&node_mac),
        "answered before owning"
    );
    assert!(
        !resolve(&lab, vip6).contains(&node_mac),
        "answered NS before owning"
    );
    flush(&lab);

    // Owned: the kernel's own requests are answered with the node's MAC.
    responder.send(Control::SetOwned(Owned::new([vip, vip6])));
    std::thread::sleep(Duration::from_millis(100));
    let entry = resolve(&lab, vip);
    assert!(entry.contains(&node_mac), "ARP: {entry}");
    let entry = resolve(&lab, vip6);
    assert!(
        entry.contains(&node_mac),
        "NS to the solicited-node group: {entry}"
    );
    assert!(metrics.arp_replies.get() >= 1);
    assert!(metrics.ndp_adverts.get() >= 1);

    // A gratuitous ARP and an unsolicited NA move an existing entry that points elsewhere.
    for ip in [vip, vip6] {
        set_neighbor(&lab, ip, "02:00:00:00:00:99");
    }
    // The kernel ignores ARP updates within `locktime` (1 s) of the last change.
    std::thread::sleep(Duration::from_millis(1100));
    responder.send(Control::Announce(vip));
    responder.send(Control::Announce(vip6));
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        neighbor(&lab, vip).contains(&node_mac),
        "gratuitous ARP: {}",
        neighbor(&lab, vip)
    );
    assert!(
        neighbor(&lab, vip6).contains(&node_mac),
        "unsolicited NA: {}",
        neighbor(&lab, vip6)
    );

    // Another host claiming the VIP is a conflict.
    let claim = Lab::command_in(&lab.client_netns, "/usr/bin/python3")
        .args([
            "-c",
            "from scapy.all import *; sendp(Ether(src='02:00:00:00:00:fe', dst='ff:ff:ff:ff:ff:ff')/ARP(op=1, hwsrc='02:00:00:00:00:fe', psrc='198.51.100.100', pdst='198.51.100.100'), iface='eth0', verbose=False)",
        ])
        .output()
        .unwrap();
    assert!(
        claim.status.success(),
        "scapy: {}",
        String::from_utf8_lossy(&claim.stderr)
    );
    let conflict = conflicts.blocking_recv().unwrap();
    assert_eq!(conflict.ip, vip);
    assert_eq!(conflict.mac, MacAddr(2, 0, 0, 0, 0, 0xfe));

    // Stopping is immediate: after the owned set is emptied nothing answers.
    responder.send(Control::SetOwned(Owned::default()));
    std::thread::sleep(Duration::from_millis(100));
    flush(&lab);
    assert!(
        !resolve(&lab, vip).contains(&node_mac),
        "answered after release"
    );
    responder.stop();
}

#[test]
#[ignore = "needs root: network namespaces and a packet socket"]
fn arp_requests_that_waited_in_the_socket_while_the_process_was_stopped_go_unanswered() {
    netns::require_root(
        "arp_requests_that_waited_in_the_socket_while_the_process_was_stopped_go_unanswered",
    );
    let lab = Lab::create_with_id(1, &format!("{}x12", std::process::id())).unwrap();
    let node_mac = netns::mac_text(lab.node(1).mac);
    let vip = IpAddr::V4(Ipv4Addr::new(198, 51, 100, 100));
    let (responder, metrics, _conflicts) = start_responder(&lab.node(1).netns);
    responder.send(Control::SetOwned(Owned::new([vip])));
    std::thread::sleep(Duration::from_millis(100));
    assert!(resolve(&lab, vip).contains(&node_mac), "answering before");
    let replies = metrics.arp_replies.get();

    // A helper process stops this one (the responder's thread with it), has the client ask for
    // the VIP three times meanwhile, then lets it go on: the requests wait in the socket. While
    // stopped, the cluster may have moved the VIP; they are answered by nobody here.
    let pid = std::process::id();
    let script = format!(
        "kill -STOP {pid}; \
         ip netns exec {} arping -c 3 -W 0.05 -w 1 -I eth0 {vip} >/dev/null 2>&1; \
         kill -CONT {pid}",
        lab.client_netns
    );
    let status = std::process::Command::new("sh")
        .args(["-c", &script])
        .status()
        .expect("sh");
    assert!(status.success(), "stopping the test process: {status}");
    std::thread::sleep(Duration::from_millis(200));
    let paused = metrics
        .dropped
        .get_or_create(&DropLabels {
            reason: DropReasonLabel::paused,
        })
        .get();
    assert_eq!(
        metrics.arp_replies.get(),
        replies,
        "a request queued during the stop was answered after it"
    );
    assert!(paused >= 3, "{paused} dropped as paused, 3 asked");
    responder.stop();
}
