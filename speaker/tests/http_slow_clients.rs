//! The speaker's HTTP listener under hostile clients: hundreds of unfinished request heads
//! (a few hundred KiB of header bytes each, never the blank line that ends them) and a
//! `/status` scraper in a loop, with 10,000 addresses in `/status`; then as many heads under
//! the head bound that never end. The process's resident memory (VmRSS) must stay within a
//! bound while they hold on, and the listener must count what it closed.
//!
//! The listener runs in this process (the module the daemon serves with, on the loopback), so
//! the figure is the listener's cost, not a whole speaker's. `cargo test -p swimlb-speaker
//! --test http_slow_clients -- --nocapture` prints it.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;
use swimlb_speaker::model::election::VerdictKind;
use swimlb_speaker::serve::http::{self, AddressStatus, Status};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::watch;

/// Unfinished requests held open at once.
const SLOW_CLIENTS: usize = 600;
/// Header bytes each sends (without the final CRLF CRLF).
const HEAD_BYTES: usize = 300 * 1024;
/// Addresses in `/status`.
const ADDRESSES: u32 = 10_000;
/// What the listener may add to the process's resident memory while they hold on.
const BOUND_MIB: u64 = 32;

fn vm_rss_kib() -> u64 {
    let text = std::fs::read_to_string("/proc/self/status").expect("reads /proc/self/status");
    text.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status")
}

fn big_status() -> Status {
    let addresses = (0..ADDRESSES)
        .map(|i| {
            // 10.0.0.0/8 stands for a pool; nothing is sent to it.
            let ip = IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i));
            let entry = AddressStatus {
                ip,
                group: format!("namespace-{}/service-{i}", i % 50).into(),
                owner: Some(format!("node-{}", i % 7).into()),
                verdict: VerdictKind::NotOwner,
                interfaces: None,
                owner_since: Some(1_700_000_000.0),
            };
            (ip, entry)
        })
        .collect::<BTreeMap<_, _>>();
    Status {
        node: "node-0".into(),
        ready: true,
        addresses,
        ..Status::default()
    }
}

/// Sends the start of a request and `head_bytes` of one header, then holds the socket until
/// `hold` ends. Returns whether the server took every byte.
async fn slow_client(
    addr: std::net::SocketAddr,
    client: usize,
    head_bytes: usize,
    mut hold: watch::Receiver<bool>,
) -> bool {
    // Many clients, not one: each source address of the loopback holds a few connections, so
    // the listener's cap in all is what they meet, not its cap per client.
    let source = Ipv4Addr::new(127, 0, 1 + (client / 200) as u8, 1 + (client % 200) as u8);
    let Ok(socket) = tokio::net::TcpSocket::new_v4() else {
        return false;
    };
    if socket.bind((source, 0).into()).is_err() {
        return false;
    }
    let Ok(mut s) = socket.connect(addr).await else {
        return false;
    };
    let chunk = vec![b'a'; 4 * 1024];
    let mut all = s
        .write_all(b"GET /status HTTP/1.1\r\nhost: x\r\nx-pad: ")
        .await
        .is_ok();
    let mut sent = 0;
    while all && sent < head_bytes {
        all = s.write_all(&chunk).await.is_ok();
        sent += chunk.len();
    }
    let _ = hold.wait_for(|done| *done).await;
    drop(s);
    all
}

async fn scrape_status(addr: std::net::SocketAddr) -> Option<usize> {
    let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
    s.write_all(b"GET /status HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .ok()?;
    let mut body = Vec::new();
    s.read_to_end(&mut body).await.ok()?;
    body.starts_with(b"HTTP/1.1 200").then_some(body.len())
}

/// `SLOW_CLIENTS` clients of `head_bytes` each held for 2 s (less than the header timeout)
/// while a scraper reads `/status` 40 times; returns the peak VmRSS in KiB and how many scrapes
/// were answered.
async fn hold_slow_clients(addr: std::net::SocketAddr, head_bytes: usize) -> (u64, usize) {
    let (hold_tx, hold) = watch::channel(false);
    let clients: Vec<_> = (0..SLOW_CLIENTS)
        .map(|client| tokio::spawn(slow_client(addr, client, head_bytes, hold.clone())))
        .collect();
    let scraper = tokio::spawn(async move {
        let mut scrapes = 0;
        let mut peak = 0;
        for _ in 0..40 {
            if scrape_status(addr).await.is_some() {
                scrapes += 1;
            }
            peak = peak.max(vm_rss_kib());
        }
        (scrapes, peak)
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    let held = vm_rss_kib();
    let (scrapes, peak) = scraper.await.unwrap();
    hold_tx.send(true).unwrap();
    let mut complete = 0;
    for c in clients {
        if c.await.unwrap() {
            complete += 1;
        }
    }
    eprintln!(
        "{SLOW_CLIENTS} clients sending {head_bytes} header bytes each: VmRSS {held} KiB while \
         held (peak {} KiB); {complete} clients sent every byte; {scrapes}/40 scrapes answered",
        peak.max(held)
    );
    (peak.max(held), scrapes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unfinished_requests_and_a_status_scraper_hold_a_bounded_amount_of_memory() {
    let (_tx, rx) = watch::channel(big_status());
    let metrics = http::ListenerMetrics::default();
    let (addr, task) = http::spawn(
        "127.0.0.1:0".parse().unwrap(),
        rx,
        Arc::new(Registry::default()),
        metrics.clone(),
    )
    .await
    .expect("binds the loopback");
    // One scrape first, so the allocator has seen a body of the full size.
    let size = scrape_status(addr).await.expect("/status answers");
    let before = vm_rss_kib();
    eprintln!("/status {size} bytes; VmRSS before {before} KiB");
    // Heads far over the bound: closed as they pass it, so the scraper gets through.
    let (oversized, scrapes) = hold_slow_clients(addr, HEAD_BYTES).await;
    assert!(
        scrapes > 0,
        "the scraper got no /status beside oversized heads"
    );
    // Heads under the bound that never end, from more clients than there are slots: each new
    // connection, the scraper's included, takes the slot of the oldest unfinished head, so the
    // scraper still gets through.
    let (unfinished, beside) = hold_slow_clients(addr, 4 * 1024).await;
    assert!(
        beside > 0,
        "the scraper got no /status while unfinished heads held every slot"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        scrape_status(addr).await.is_some(),
        "/status answers once the unfinished heads are gone"
    );
    task.abort();

    let grown_mib = oversized.max(unfinished).saturating_sub(before) / 1024;
    eprintln!("peak growth +{grown_mib} MiB (bound {BOUND_MIB} MiB)");
    assert!(
        grown_mib < BOUND_MIB,
        "resident memory grew by {grown_mib} MiB (bound {BOUND_MIB} MiB)"
    );
    use swimlb_proto::listener::DropReason;
    assert!(metrics.dropped(DropReason::head_too_large) > 0);
    assert!(metrics.dropped(DropReason::evicted) > 0);
}
