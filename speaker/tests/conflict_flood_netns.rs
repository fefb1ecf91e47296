//! A flood of forged claims for an owned VIP, against a real kernel: a running standalone
//! speaker (alone, an IPv4 and an IPv6 VIP on a veth in namespace A) gets ARP replies (one
//! test) or unsolicited neighbor advertisements with Override set (the other) from namespace
//! B in which another MAC claims the VIP, at about 100,000 frames/s for 3 s. The speaker's queue of
//! claims is bounded and holds each claim once, so the process's resident memory stays within
//! a bound; it counts the claims (and those it dropped as already queued) in `/metrics`, and
//! keeps answering for the VIP: alone, it stays the owner. Root only (see `netns/mod.rs`).

mod netns;

use std::path::PathBuf;
use std::time::Duration;

use netns::{Lab, arp_answered, require_root, run};
use swimlb_config::keyfile::{encode_key, write_key_file};
use swimlb_config::standalone::Standalone;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::time::Instant;

const VIP: [u8; 4] = [198, 51, 100, 10];
const VIP6: &str = "2001:db8:100::10";
/// The forger's MAC (locally administered).
const FORGER: [u8; 6] = [0x02, 0, 0, 0, 0, 0x99];
/// Frames per second, and for how long.
const RATE: u64 = 100_000;
const FLOOD: Duration = Duration::from_secs(3);
/// What the flood may add to the process's resident memory.
const BOUND_MIB: u64 = 32;

fn vm_rss_kib() -> u64 {
    let text = std::fs::read_to_string("/proc/self/status").expect("reads /proc/self/status");
    text.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status")
}

/// An ARP reply, broadcast, in which `FORGER` says it has the VIP.
fn forged_claim() -> [u8; 42] {
    let mut f = [0u8; 42];
    f[0..6].copy_from_slice(&[0xff; 6]);
    f[6..12].copy_from_slice(&FORGER);
    f[12..14].copy_from_slice(&[0x08, 0x06]);
    f[14..22].copy_from_slice(&[0, 1, 0x08, 0, 6, 4, 0, 2]);
    f[22..28].copy_from_slice(&FORGER);
    f[28..32].copy_from_slice(&VIP);
    f[32..38].copy_from_slice(&[0xff; 6]);
    f[38..42].copy_from_slice(&[198, 51, 100, 1]);
    f
}

/// An unsolicited neighbor advertisement (Override set, to all nodes) in which `FORGER` says
/// it has the IPv6 VIP.
fn forged_advert() -> Vec<u8> {
    use swimlb_proto::ethernet::MacAddr;
    use swimlb_proto::ndp::NdpFrame;
    let [a, b, c, d, e, f] = FORGER;
    let frame = NdpFrame::unsolicited_advert(MacAddr(a, b, c, d, e, f), VIP6.parse().unwrap());
    let mut out = vec![0u8; frame.frame_len()];
    frame.emit(&mut out).expect("an advertisement");
    out
}

/// The two kinds of claim.
#[derive(Debug, Clone, Copy)]
enum Claim {
    Arp,
    Ndp,
}

impl Claim {
    /// The speaker's HTTP listener: on A's address of the claims' family (an IPv6 listen
    /// address in the file works as an IPv4 one).
    fn listen(self) -> &'static str {
        match self {
            Claim::Arp => "198.51.100.1:7572",
            Claim::Ndp => "[2001:db8:100::1]:7572",
        }
    }

    fn frame(self) -> Vec<u8> {
        match self {
            Claim::Arp => forged_claim().to_vec(),
            Claim::Ndp => forged_advert(),
        }
    }

    /// Whether namespace B gets an answer for this family's VIP from A's speaker.
    async fn answered(self, b: &str, veth_b: &str) -> bool {
        let (b, vb) = (b.to_string(), veth_b.to_string());
        tokio::task::spawn_blocking(move || match self {
            Claim::Arp => arp_answered(&b, &vb, "198.51.100.10"),
            Claim::Ndp => nd_answered(&b, &vb),
        })
        .await
        .expect("probe thread")
    }
}

/// Whether B's kernel resolves the IPv6 VIP to a MAC other than the forger's: its neighbor
/// solicitation (sent for a ping nobody echoes) is answered by the speaker.
fn nd_answered(b: &str, veth_b: &str) -> bool {
    let _ = run(&["ip", "-n", b, "-6", "neigh", "flush", "dev", veth_b]);
    let _ = run(&[
        "ip", "netns", "exec", b, "ping", "-6", "-c", "1", "-W", "1", "-I", veth_b, VIP6,
    ]);
    let shown = run(&["ip", "-n", b, "-6", "neigh", "show", VIP6, "dev", veth_b]);
    let text = String::from_utf8_lossy(&shown.stdout).to_lowercase();
    text.contains("lladdr") && !text.contains("02:00:00:00:00:99") && !text.contains("failed")
}

/// Sends `frame` from namespace B's veth at `RATE` for `FLOOD`, sampling this process's
/// VmRSS as it goes; returns the frames sent and the peak VmRSS in KiB.
fn flood_from_b(b: &str, veth_b: &str, frame: Vec<u8>) -> (u64, u64) {
    let path = format!("/run/netns/{b}");
    let veth_b = veth_b.to_string();
    std::thread::spawn(move || {
        let ns = std::fs::File::open(&path).unwrap_or_else(|e| panic!("open {path}: {e}"));
        nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)
            .unwrap_or_else(|e| panic!("setns {path}: {e}"));
        let iface = pnet_datalink::interfaces()
            .into_iter()
            .find(|i| i.name == veth_b)
            .expect("the veth in namespace B");
        let Ok(pnet_datalink::Channel::Ethernet(mut tx, _rx)) =
            pnet_datalink::channel(&iface, pnet_datalink::Config::default())
        else {
            panic!("a packet socket on {veth_b}");
        };
        let started = Instant::now();
        let (mut sent, mut peak) = (0u64, 0u64);
        while started.elapsed() < FLOOD {
            // Catch up to the rate, then yield a moment.
            let due = RATE * started.elapsed().as_micros() as u64 / 1_000_000;
            while sent < due {
                if let Some(Ok(())) = tx.send_to(&frame, None) {
                    sent += 1;
                } else {
                    break;
                }
            }
            if sent % 10_000 < 200 {
                peak = peak.max(vm_rss_kib());
            }
            std::thread::sleep(Duration::from_micros(500));
        }
        (sent, peak.max(vm_rss_kib()))
    })
    .join()
    .expect("flood thread")
}

async fn metrics(listen: &str) -> String {
    let mut stream = tokio::net::TcpStream::connect(listen)
        .await
        .expect("connect");
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        .await
        .expect("request");
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .await
        .expect("response");
    response
}

/// The value of the sample line starting with `name` (labels included) in `text`.
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.trim().parse().ok())
}

#[test]
#[ignore = "needs root: network namespaces"]
fn a_flood_of_forged_claims_for_an_owned_vip_holds_bounded_memory_is_counted_and_the_owner_keeps_it()
 {
    flood(Claim::Arp, 'f');
}

#[test]
#[ignore = "needs root: network namespaces"]
fn a_flood_of_forged_neighbor_advertisements_for_an_owned_vip_is_bounded_counted_and_lost_on_no_one()
 {
    flood(Claim::Ndp, 'n');
}

/// Runs the speaker in A, floods it with `claim`s from B, and checks memory, counters and the
/// answer for the VIP. `tag`: the lab's namespaces' tag.
fn flood(claim: Claim, tag: char) {
    require_root();
    let lab = Lab::new(tag);
    let dir: PathBuf =
        std::env::temp_dir().join(format!("swimlb-flood-lab-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let keys = dir.join("keys");
    write_key_file(&keys, &format!("{}\n", encode_key(&[9; 32]))).unwrap();
    let path = dir.join("speaker.yaml");
    let text = format!(
        "cluster: flood-lab\nnode: a\nbind: 198.51.100.1:7946\nkeyFile: {}\nlisten: \"{}\"\ngroups:\n  - name: vip\n    addresses: [198.51.100.10, {VIP6}]\n    interface: {}\n",
        keys.display(),
        claim.listen(),
        lab.veth_a
    );
    std::fs::write(&path, &text).unwrap();
    let config = Standalone::parse(&text).unwrap();
    let (b, vb) = (lab.b.clone(), lab.veth_b.clone());
    lab.run_in_a(move || async move {
        let (_reload_tx, reload_rx) = tokio::sync::mpsc::channel(1);
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let shutdown = Box::pin(async move {
            let _ = stop_rx.await;
        });
        let speaker = tokio::spawn(swimlb_speaker::sources::standalone::run(
            config, path, shutdown, reload_rx,
        ));
        // Alone, the speaker answers once its start-up hold (3 s) is over.
        let mut serving = false;
        for _ in 0..20 {
            tokio::time::sleep(Duration::from_millis(500)).await;
            if claim.answered(&b, &vb).await {
                serving = true;
                break;
            }
        }
        assert!(serving, "the VIP was never answered");
        let before = vm_rss_kib();

        // The flood runs on its own thread; the speaker's runtime goes on meanwhile.
        let (fb, fvb) = (b.clone(), vb.clone());
        let frame = claim.frame();
        let (sent, peak) = tokio::task::spawn_blocking(move || flood_from_b(&fb, &fvb, frame))
            .await
            .expect("flood");
        tokio::time::sleep(Duration::from_millis(500)).await;
        let text = metrics(claim.listen()).await;
        let seen = sample(&text, "swimlb_conflicts_total ").unwrap_or(0.0);
        let coalesced = sample(
            &text,
            "swimlb_conflicts_dropped_total{reason=\"already_queued\"} ",
        )
        .unwrap_or(0.0);
        let full = sample(
            &text,
            "swimlb_conflicts_dropped_total{reason=\"queue_full\"} ",
        )
        .unwrap_or(0.0);
        let grown_mib = peak.saturating_sub(before) / 1024;
        eprintln!(
            "{claim:?}: {sent} forged claims in {FLOOD:?}; the speaker saw {seen}, dropped {coalesced} already \
             queued and {full} with its queue full; VmRSS {before} KiB before, peak {peak} KiB \
             (+{grown_mib} MiB)"
        );
        assert!(sent > RATE, "the flood sent only {sent} frames");
        assert!(seen > 1000.0, "the speaker saw {seen} claims:\n{text}");
        // One claim, again and again: it waits once, so the rest are dropped as already
        // queued and the queue never fills.
        assert!(coalesced > 0.0, "no claim dropped as already queued:\n{text}");
        assert_eq!(full, 0.0, "{text}");
        assert!(
            grown_mib < BOUND_MIB,
            "resident memory grew by {grown_mib} MiB (bound {BOUND_MIB} MiB)"
        );
        assert!(
            claim.answered(&b, &vb).await,
            "the owner lost the VIP to the flood"
        );

        let _ = stop_tx.send(());
        let stopped = tokio::time::timeout(Duration::from_secs(15), speaker).await;
        assert!(
            matches!(stopped, Ok(Ok(Ok(())))),
            "the speaker did not stop cleanly: {stopped:?}"
        );
    });
    let _ = std::fs::remove_dir_all(&dir);
}
