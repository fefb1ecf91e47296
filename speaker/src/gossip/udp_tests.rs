//! Capture and replay over real UDP on 127.0.0.1: two speakers run the tokio driver, and a
//! third member is a core the test drives on its own socket, so the test sees (and records)
//! every datagram the two send it. The recording is replayed to that member from an address
//! none of them knows, later and after one of the senders restarted. Waits are bounded; nothing
//! asserts on wall-clock speed.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use swimlb_proto::KeyRing;
use tokio::net::UdpSocket;
use tokio::sync::watch;
use tokio::time::Instant;

use super::core::{Core, GossipSettings};
use super::driver::{GossipHandle, spawn};
use super::metrics::{GossipMetrics, RejectReason};
use super::timing::Timing;
use crate::model::membership::{LiveChange, LiveSet, MemberMeta};

const KEY: [u8; 32] = [77; 32];
const CLUSTER: &str = "replay-udp";

fn ring() -> KeyRing {
    KeyRing::new(CLUSTER, &[KEY]).unwrap()
}

fn settings(node: &str, addr: SocketAddr, seeds: Vec<SocketAddr>, bump: u64) -> GossipSettings {
    GossipSettings {
        node: node.to_string(),
        addr,
        seeds,
        timing: Timing::fast(),
        bump,
        rng_seed: bump ^ u64::from(addr.port()),
    }
}

async fn start_driver(
    node: &str,
    bind: SocketAddr,
    seeds: Vec<SocketAddr>,
    bump: u64,
) -> GossipHandle {
    // A restarted driver binds the address its previous life just released: retry briefly.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match spawn(
            settings(node, bind, seeds.clone(), bump),
            bind,
            ring(),
            MemberMeta::new(node),
            GossipMetrics::default(),
        )
        .await
        {
            Ok(handle) => return handle,
            Err(err) if Instant::now() < deadline => {
                tracing::debug!(error = %err, "rebinding");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(err) => panic!("{node} cannot bind {bind}: {err}"),
        }
    }
}

/// What the test-driven member shares with the test.
#[derive(Default)]
struct Recorder {
    /// Datagrams received (source, bytes as received) while recording.
    recorded: Vec<(SocketAddr, Vec<u8>)>,
    recording: bool,
    /// Every change of its live set.
    changes: Vec<LiveChange>,
}

/// Runs a member named `member` on `socket` for good (the test aborts it), recording into
/// `shared` and publishing its live set.
async fn recording_member(
    socket: UdpSocket,
    seeds: Vec<SocketAddr>,
    metrics: GossipMetrics,
    shared: Arc<Mutex<Recorder>>,
    live: watch::Sender<LiveSet>,
) {
    let origin = Instant::now();
    let addr = socket.local_addr().unwrap();
    let mut core = Core::new(
        settings("member", addr, seeds, 1),
        ring(),
        MemberMeta::new("member"),
        metrics,
        Duration::ZERO,
    )
    .unwrap();
    let mut buf = vec![0u8; 9000];
    loop {
        for out in core.drain_outgoing().collect::<Vec<_>>() {
            let _ = socket.send_to(&out.bytes, out.to).await;
        }
        let changes: Vec<LiveChange> = core.drain_changes().collect();
        if !changes.is_empty() {
            live.send_replace(core.live().clone());
            shared.lock().unwrap().changes.extend(changes);
        }
        let deadline = core
            .next_deadline()
            .map_or(Instant::now() + Duration::from_secs(1), |at| origin + at);
        tokio::select! {
            received = socket.recv_from(&mut buf) => {
                let Ok((len, from)) = received else { continue };
                {
                    let mut shared = shared.lock().unwrap();
                    if shared.recording {
                        shared.recorded.push((from, buf[..len].to_vec()));
                    }
                }
                core.handle_datagram(origin.elapsed(), from, &mut buf[..len]);
            }
            () = tokio::time::sleep_until(deadline) => core.handle_due_timers(origin.elapsed()),
        }
    }
}

async fn wait_for(handle: &GossipHandle, what: &str, check: impl Fn(&LiveSet) -> bool) {
    let mut live = handle.live();
    let waited = tokio::time::timeout(Duration::from_secs(10), async {
        while !check(&live.borrow_and_update()) {
            if live.changed().await.is_err() {
                return false;
            }
        }
        true
    })
    .await;
    assert_eq!(waited, Ok(true), "waiting for {what}");
}

fn replays(metrics: &GossipMetrics) -> u64 {
    metrics.rejected_count(RejectReason::Replay)
}

/// Sends every recorded datagram whose source is `from` to `to`, from `socket`, paced so the
/// loopback never drops one; returns how many were sent.
async fn replay(
    socket: &UdpSocket,
    recorded: &[(SocketAddr, Vec<u8>)],
    from: SocketAddr,
    to: SocketAddr,
) -> u64 {
    let mut sent = 0;
    for (_, bytes) in recorded.iter().filter(|(source, _)| *source == from) {
        socket.send_to(bytes, to).await.unwrap();
        sent += 1;
        if sent % 8 == 0 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    sent
}

/// Waits until `metrics` counts `expected` replays (bounded), then returns the count.
async fn replays_reach(metrics: &GossipMetrics, expected: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(5);
    while replays(metrics) < expected && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // A moment more, so a count above the expected one would show.
    tokio::time::sleep(Duration::from_millis(100)).await;
    replays(metrics)
}

async fn wait_live(
    live: &mut watch::Receiver<LiveSet>,
    what: &str,
    check: impl Fn(&LiveSet) -> bool,
) {
    let waited = tokio::time::timeout(Duration::from_secs(10), async {
        while !check(&live.borrow_and_update()) {
            if live.changed().await.is_err() {
                return false;
            }
        }
        true
    })
    .await;
    assert_eq!(waited, Ok(true), "waiting for {what}");
}

fn sees_all(live: &LiveSet) -> bool {
    live.len() == 3 && live.iter().all(|m| m.version >= 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn datagrams_recorded_over_udp_and_replayed_later_and_after_a_restart_change_nothing() {
    // a needs a fixed port to restart on: take a free one from the system.
    let a_addr = {
        let probe = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap()
    };
    let a = start_driver("a", a_addr, vec![], 1).await;
    let b = start_driver("b", "127.0.0.1:0".parse().unwrap(), vec![a_addr], 1).await;
    let b_addr = b.local_addr();
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let member_addr = socket.local_addr().unwrap();
    let metrics = GossipMetrics::default();
    let shared = Arc::new(Mutex::new(Recorder::default()));
    let (live_tx, mut live) = watch::channel(LiveSet::new());
    let member = tokio::spawn(recording_member(
        socket,
        vec![a_addr],
        metrics.clone(),
        shared.clone(),
        live_tx,
    ));
    wait_live(&mut live, "the member sees a and b", sees_all).await;
    for (handle, name) in [(&a, "a"), (&b, "b")] {
        wait_for(handle, &format!("{name} sees three members"), sees_all).await;
    }

    // Record what a and b send the member for a while.
    shared.lock().unwrap().recording = true;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let recorded = {
        let mut shared = shared.lock().unwrap();
        shared.recording = false;
        std::mem::take(&mut shared.recorded)
    };
    let from = |addr| recorded.iter().filter(|(f, _)| *f == addr).count();
    assert!(
        from(a_addr) > 10 && from(b_addr) > 10,
        "too little recorded: {} from a, {} from b",
        from(a_addr),
        from(b_addr)
    );
    assert_eq!(replays(&metrics), 0, "a datagram of a clean run refused");

    // Later, from an address nobody knows: every recorded datagram, to the member again.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let attacker = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let before = live.borrow().clone();
    shared.lock().unwrap().changes.clear();
    let mut sent = 0;
    for source in [a_addr, b_addr] {
        sent += replay(&attacker, &recorded, source, member_addr).await;
    }
    assert_eq!(
        replays_reach(&metrics, sent).await,
        sent,
        "every replay counted"
    );
    assert_eq!(
        shared.lock().unwrap().changes,
        vec![],
        "the replays changed the membership"
    );
    assert_eq!(*live.borrow(), before);

    // a restarts: a crash, then a new life at the same address under a larger bump.
    a.abort();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let a = start_driver("a", a_addr, vec![b_addr], 2).await;
    wait_for(&a, "the restarted a sees everyone", sees_all).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    wait_live(&mut live, "the member sees the restarted a", sees_all).await;
    assert_eq!(
        replays(&metrics),
        sent,
        "a datagram of a's new life refused"
    );

    // Again: a's datagrams are now from an older epoch, b's counters have moved on.
    let before = live.borrow().clone();
    shared.lock().unwrap().changes.clear();
    let mut again = 0;
    for source in [a_addr, b_addr] {
        again += replay(&attacker, &recorded, source, member_addr).await;
    }
    assert_eq!(
        replays_reach(&metrics, sent + again).await,
        sent + again,
        "every replay after the restart counted"
    );
    assert_eq!(
        shared.lock().unwrap().changes,
        vec![],
        "the replays changed the membership"
    );
    assert_eq!(*live.borrow(), before);
    member.abort();
    a.abort();
    b.abort();
}
