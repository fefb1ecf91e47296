//! What the lab measures with: a UDP responder on every node that answers with its node name,
//! and a prober in the client namespace that sends to the VIP every few milliseconds and records
//! who answered.
//!
//! Both run as threads of the lab process, each moved into its namespace with `setns`, so the
//! fault (taken by the lab's main thread) and every probe are timed on one clock.
//!
//! Failover time is measured as DESIGN.md defines it: from the fault to the first answer from a
//! node other than the old owner.

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context as _, Result};
use swimlb_proto::Frame;
use swimlb_proto::arp::{ArpOperation, ArpRepr};
use swimlb_proto::ethernet::MacAddr;
use tokio::time::Instant;

/// The UDP port of the responders.
pub const PROBE_PORT: u16 = 5599;

pub use swimlb_control_plane::netns::enter_netns;

/// Starts thread `name` in network namespace `netns`: it enters the namespace and runs `setup`
/// there (opening its sockets) before this returns, with `setup`'s error if it failed; then it
/// runs `body` with what `setup` made.
pub fn spawn_in<S, B>(
    netns: &str,
    name: &str,
    setup: impl FnOnce() -> Result<S> + Send + 'static,
    body: B,
) -> Result<JoinHandle<()>>
where
    B: FnOnce(S) + Send + 'static,
{
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let ns = netns.to_string();
    let handle = std::thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            let made = enter_netns(&ns).and_then(|()| setup());
            match made {
                Ok(made) => {
                    let _ = ready_tx.send(Ok(()));
                    body(made);
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                }
            }
        })?;
    ready_rx
        .recv()
        .with_context(|| format!("thread {name} died"))?
        .with_context(|| format!("thread {name} in {netns}"))?;
    Ok(handle)
}

/// Runs `f` on a thread inside `netns` and returns its result.
pub fn in_netns<T: Send + 'static>(
    netns: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T> {
    let ns = netns.to_string();
    std::thread::spawn(move || enter_netns(&ns).map(|()| f()))
        .join()
        .map_err(|_| anyhow::anyhow!("a thread in {netns} panicked"))?
}

/// A background thread; stops when dropped.
#[derive(Debug)]
pub struct Worker {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl Worker {
    /// Stops the thread and waits for it.
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.halt();
    }
}

/// Starts a responder in `netns` that answers every datagram on [`PROBE_PORT`] (IPv4 and IPv6)
/// with `name`, echoing the first 8 bytes (the probe's sequence number) before it.
pub fn spawn_responder(netns: &str, name: &str) -> Result<Vec<Worker>> {
    let v4 = spawn_responder_family(netns, name, false)?;
    let v6 = spawn_responder_family(netns, name, true)?;
    Ok(vec![v4, v6])
}

fn spawn_responder_family(netns: &str, name: &str, v6: bool) -> Result<Worker> {
    let stop = Arc::new(AtomicBool::new(false));
    let (name, flag) = (name.to_string(), stop.clone());
    let setup = move || -> Result<UdpSocket> {
        let s = if v6 {
            socket_v6_only(PROBE_PORT)?
        } else {
            UdpSocket::bind(("0.0.0.0", PROBE_PORT))?
        };
        // Only bounds how long a stop request waits.
        s.set_read_timeout(Some(Duration::from_millis(50)))?;
        Ok(s)
    };
    let handle = spawn_in(netns, &format!("responder-{name}"), setup, move |socket| {
        let mut buf = [0u8; 64];
        let mut reply = Vec::with_capacity(64);
        while !flag.load(Ordering::Relaxed) {
            if let Ok((n, from)) = socket.recv_from(&mut buf)
                && n >= 8
            {
                reply.clear();
                reply.extend_from_slice(&buf[..8]);
                reply.extend_from_slice(name.as_bytes());
                let _ = socket.send_to(&reply, from);
            }
        }
    })?;
    Ok(Worker {
        stop,
        handle: Some(handle),
    })
}

fn socket_v6_only(port: u16) -> Result<UdpSocket> {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::IPV6, Type::DGRAM, None)?;
    s.set_only_v6(true)?;
    s.bind(&SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, port)).into())?;
    Ok(s.into())
}

/// One probe's fate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeRecord {
    /// Sequence number.
    pub seq: u64,
    /// When it was sent.
    pub sent: Instant,
    /// Who answered and when (`None`: lost).
    pub answer: Option<(String, Instant)>,
}

/// A running prober.
#[derive(Debug)]
pub struct Prober {
    worker: Worker,
    log: Arc<Mutex<Vec<ProbeRecord>>>,
}

impl Prober {
    /// Starts probing `target` from `netns` every `interval`. Answers arriving more than
    /// `interval x 50` after their probe count as lost.
    pub fn start(netns: &str, target: SocketAddr, interval: Duration) -> Result<Prober> {
        let stop = Arc::new(AtomicBool::new(false));
        let log: Arc<Mutex<Vec<ProbeRecord>>> = Arc::default();
        let (flag, records) = (stop.clone(), log.clone());
        let setup = move || -> Result<UdpSocket> {
            let bind: SocketAddr = if target.is_ipv4() {
                "0.0.0.0:0".parse()?
            } else {
                "[::]:0".parse()?
            };
            let s = UdpSocket::bind(bind)?;
            s.set_read_timeout(Some(Duration::from_millis(1)))?;
            Ok(s)
        };
        let handle = spawn_in(netns, "prober", setup, move |socket| {
            let start = Instant::now();
            let mut seq: u64 = 0;
            let mut buf = [0u8; 128];
            while !flag.load(Ordering::Relaxed) {
                let due = start + interval * (seq as u32);
                let now = Instant::now();
                if now >= due {
                    // A send error (no route while the owner moves) is a lost probe, not a stop.
                    let _ = socket.send_to(&seq.to_be_bytes(), target);
                    records.lock().expect("probe log").push(ProbeRecord {
                        seq,
                        sent: now,
                        answer: None,
                    });
                    seq += 1;
                    continue;
                }
                // Wait for answers until the next probe is due.
                let wait = due.duration_since(now).max(Duration::from_micros(100));
                if socket.set_read_timeout(Some(wait)).is_err() {
                    continue;
                }
                if let Ok((n, _)) = socket.recv_from(&mut buf)
                    && n >= 8
                {
                    let now = Instant::now();
                    let answered = u64::from_be_bytes(buf[..8].try_into().expect("8 bytes"));
                    let name = String::from_utf8_lossy(&buf[8..n]).into_owned();
                    let mut log = records.lock().expect("probe log");
                    if let Some(r) = log.get_mut(answered as usize)
                        && r.answer.is_none()
                        && now.duration_since(r.sent) <= interval * 50
                    {
                        r.answer = Some((name, now));
                    }
                }
            }
        })?;
        Ok(Prober {
            worker: Worker {
                stop,
                handle: Some(handle),
            },
            log,
        })
    }

    /// A copy of the records so far.
    pub fn snapshot(&self) -> Vec<ProbeRecord> {
        self.log.lock().expect("probe log").clone()
    }

    /// The node that answered the latest answered probe.
    pub fn current_owner(&self) -> Option<String> {
        let log = self.log.lock().expect("probe log");
        log.iter()
            .rev()
            .find_map(|r| r.answer.as_ref().map(|(n, _)| n.clone()))
    }

    /// Stops probing and returns every record.
    pub fn stop(self) -> Vec<ProbeRecord> {
        self.worker.stop();
        std::mem::take(&mut *self.log.lock().expect("probe log"))
    }
}

/// Opens the speaker's filtered packet socket (ARP and NDP) on `eth0` of the calling thread's
/// namespace; reads wait at most `read_timeout`.
pub fn open_eth0(
    read_timeout: Duration,
) -> Result<swimlb_speaker::net::packet_socket::LinkChannel> {
    let iface = pnet_datalink::interfaces()
        .into_iter()
        .find(|i| i.name == "eth0")
        .context("no eth0 in this namespace")?;
    Ok(swimlb_speaker::net::packet_socket::open(
        &iface,
        read_timeout,
    )?)
}

/// One ARP frame claiming an address, as the client saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArpClaim {
    /// Since the first request was sent.
    pub at: Duration,
    /// The MAC that claimed the address.
    pub mac: [u8; 6],
    /// A reply (to anyone), rather than a gratuitous request.
    pub reply: bool,
}

/// The client's ARP request for `ip` (broadcast, or unicast to `to`), as its kernel would send
/// it: its own MAC and address, so the nodes learn nothing new of the client.
fn arp_request(ip: Ipv4Addr, to: Option<[u8; 6]>) -> Result<Vec<u8>> {
    let request = ArpRepr {
        operation: ArpOperation::Request,
        sender_mac: MacAddr(0x02, 0, 0, 0, 0, 0xfe),
        sender_ip: crate::netns::CLIENT_V4,
        target_mac: MacAddr(0, 0, 0, 0, 0, 0),
        target_ip: ip,
    };
    let mut frame = vec![0u8; request.frame_len()];
    request
        .emit_frame(&mut frame)
        .context("building the ARP request")?;
    if let Some(dst) = to {
        frame[..6].copy_from_slice(&dst);
    }
    Ok(frame)
}

/// The claim `bytes` makes on `ip`: its sender's MAC and whether it is a reply, for an ARP reply
/// or a gratuitous ARP from `ip`; `None` for any other frame.
fn arp_claim(bytes: &[u8], ip: Ipv4Addr) -> Option<([u8; 6], ArpOperation)> {
    match Frame::parse(bytes) {
        Ok(Frame::Arp { arp, .. })
            if arp.sender_ip == ip
                && (arp.operation == ArpOperation::Reply || arp.is_gratuitous()) =>
        {
            let m = arp.sender_mac;
            Some(([m.0, m.1, m.2, m.3, m.4, m.5], arp.operation))
        }
        _ => None,
    }
}

/// Sends `requests` ARP requests for `ip` from `netns`'s `eth0`, `interval` apart (broadcast, or
/// unicast to `to`), and returns every frame that claimed `ip` (replies, gratuitous ARP) until
/// `interval` after the last request.
pub fn arp_claims(
    netns: &str,
    ip: Ipv4Addr,
    to: Option<[u8; 6]>,
    requests: usize,
    interval: Duration,
) -> Result<Vec<ArpClaim>> {
    let (tx, rx) = std::sync::mpsc::channel();
    let setup = || open_eth0(Duration::from_millis(5));
    let frame = arp_request(ip, to)?;
    let thread = spawn_in(netns, "arp-claims", setup, move |mut channel| {
        let mut claims = Vec::new();
        let start = Instant::now();
        let end = start + interval * requests as u32;
        let mut sent = 0;
        while Instant::now() < end {
            if sent < requests && Instant::now() >= start + interval * sent as u32 {
                let _ = channel.tx.send_to(&frame, None);
                sent += 1;
            }
            let Ok(bytes) = channel.rx.next() else {
                continue;
            };
            if let Some((mac, operation)) = arp_claim(bytes, ip) {
                claims.push(ArpClaim {
                    at: start.elapsed(),
                    mac,
                    reply: operation == ArpOperation::Reply,
                });
            }
        }
        let _ = tx.send(claims);
    })?;
    let _ = thread.join();
    rx.recv().context("the ARP thread died")
}

/// The MACs that replied to one of an [`ArpAsker`]'s requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArpAnswers {
    /// When the request was sent, since the asker started.
    pub at: Duration,
    /// Every distinct MAC whose reply for the address arrived after this request and before
    /// the next one (gratuitous ARP is not a reply).
    pub macs: BTreeSet<[u8; 6]>,
}

/// Asks "who has" an address by ARP from the client, periodically, in the background, and
/// records who replied to each request.
#[derive(Debug)]
pub struct ArpAsker {
    worker: Worker,
    log: Arc<Mutex<Vec<ArpAnswers>>>,
}

impl ArpAsker {
    /// Starts broadcasting an ARP request for `ip` from `netns`'s `eth0` every `interval`, at
    /// most `requests` times (then it only listens until stopped). A reply is put down to the
    /// latest request: one slower than `interval` counts for the next.
    pub fn start(
        netns: &str,
        ip: Ipv4Addr,
        interval: Duration,
        requests: usize,
    ) -> Result<ArpAsker> {
        let stop = Arc::new(AtomicBool::new(false));
        let log: Arc<Mutex<Vec<ArpAnswers>>> = Arc::default();
        let (flag, answers) = (stop.clone(), log.clone());
        let frame = arp_request(ip, None)?;
        let setup = || open_eth0(Duration::from_millis(5));
        let handle = spawn_in(netns, "arp-asker", setup, move |mut channel| {
            let start = Instant::now();
            let mut sent = 0;
            while !flag.load(Ordering::Relaxed) {
                if sent < requests && Instant::now() >= start + interval * sent as u32 {
                    let at = start.elapsed();
                    // A send error is a request nobody answered, not a stop.
                    let _ = channel.tx.send_to(&frame, None);
                    answers.lock().expect("ARP log").push(ArpAnswers {
                        at,
                        macs: BTreeSet::new(),
                    });
                    sent += 1;
                }
                let Ok(bytes) = channel.rx.next() else {
                    continue;
                };
                if let Some((mac, ArpOperation::Reply)) = arp_claim(bytes, ip)
                    && let Some(latest) = answers.lock().expect("ARP log").last_mut()
                {
                    latest.macs.insert(mac);
                }
            }
        })?;
        Ok(ArpAsker {
            worker: Worker {
                stop,
                handle: Some(handle),
            },
            log,
        })
    }

    /// A copy of every request's answers so far, in order.
    pub fn snapshot(&self) -> Vec<ArpAnswers> {
        self.log.lock().expect("ARP log").clone()
    }

    /// Stops asking and returns every request's answers, in order.
    pub fn stop(self) -> Vec<ArpAnswers> {
        self.worker.stop();
        std::mem::take(&mut *self.log.lock().expect("ARP log"))
    }
}

/// How many distinct whole seconds (counted from the asker's start) hold a request that two or
/// more different MACs replied to: seconds in which the address had two owners.
pub fn dual_answer_seconds(answers: &[ArpAnswers]) -> usize {
    answers
        .iter()
        .filter(|a| a.macs.len() >= 2)
        .map(|a| a.at.as_secs())
        .collect::<BTreeSet<u64>>()
        .len()
}

/// Requests two or more MACs replied to, and the span from the first to the last of them (one
/// `interval` added for the last request's own): how long the address had two owners.
pub fn dual_span<'a>(
    answers: impl IntoIterator<Item = &'a ArpAnswers>,
    interval: Duration,
) -> (usize, Duration) {
    let twice: Vec<Duration> = answers
        .into_iter()
        .filter(|a| a.macs.len() >= 2)
        .map(|a| a.at)
        .collect();
    let span = match (twice.first(), twice.last()) {
        (Some(first), Some(last)) => *last - *first + interval,
        _ => Duration::ZERO,
    };
    (twice.len(), span)
}

/// What one fault cost, from the probe records.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FailoverSample {
    /// From the fault to the first answer from a node other than `old_owner`.
    pub failover_ms: f64,
    /// Probes sent after the fault (and before that first answer) that got no answer.
    pub lost_probes: u64,
}

/// Measures a failover in `records`: the fault happened at `fault`, `old_owner` answered before.
/// `None` when no other node answered.
pub fn failover(
    records: &[ProbeRecord],
    fault: Instant,
    old_owner: &str,
) -> Option<FailoverSample> {
    let first_new = records
        .iter()
        .filter_map(|r| r.answer.as_ref().map(|(n, at)| (n, *at)))
        .filter(|(n, at)| *at >= fault && n.as_str() != old_owner)
        .map(|(_, at)| at)
        .min()?;
    let lost_probes = records
        .iter()
        .filter(|r| r.sent >= fault && r.sent < first_new && r.answer.is_none())
        .count() as u64;
    Some(FailoverSample {
        failover_ms: first_new.duration_since(fault).as_secs_f64() * 1e3,
        lost_probes,
    })
}

/// How many times the answering node changed in `records` (a change with no fault is a false
/// failover).
pub fn owner_changes(records: &[ProbeRecord]) -> usize {
    let mut changes = 0;
    let mut last: Option<&str> = None;
    for r in records {
        if let Some((n, _)) = &r.answer {
            if last.is_some_and(|l| l != n) {
                changes += 1;
            }
            last = Some(n);
        }
    }
    changes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(seq: u64, t0: Instant, sent_ms: u64, answer: Option<(&str, u64)>) -> ProbeRecord {
        ProbeRecord {
            seq,
            sent: t0 + Duration::from_millis(sent_ms),
            answer: answer.map(|(n, ms)| (n.to_string(), t0 + Duration::from_millis(ms))),
        }
    }

    #[test]
    fn failover_runs_from_fault_to_first_answer_of_another_node() {
        let t0 = Instant::now();
        let records = vec![
            record(0, t0, 0, Some(("node1", 1))),
            record(1, t0, 10, Some(("node1", 11))),
            record(2, t0, 20, None),
            record(3, t0, 30, None),
            record(4, t0, 40, Some(("node2", 42))),
            record(5, t0, 50, Some(("node2", 51))),
        ];
        let fault = t0 + Duration::from_millis(15);
        let s = failover(&records, fault, "node1").unwrap();
        assert!((s.failover_ms - 27.0).abs() < 1e-6, "{s:?}");
        assert_eq!(s.lost_probes, 2);
        assert_eq!(owner_changes(&records), 1);
    }

    #[test]
    fn no_new_owner_means_no_sample() {
        let t0 = Instant::now();
        let records = vec![
            record(0, t0, 0, Some(("node1", 1))),
            record(1, t0, 10, None),
        ];
        assert_eq!(failover(&records, t0, "node1"), None);
        assert_eq!(owner_changes(&records), 0);
    }

    fn asked(at_ms: u64, macs: &[u8]) -> ArpAnswers {
        ArpAnswers {
            at: Duration::from_millis(at_ms),
            macs: macs.iter().map(|&m| [2, 0, 0, 0, 0, m]).collect(),
        }
    }

    #[test]
    fn a_second_is_dual_when_a_request_in_it_got_two_macs() {
        let answers = vec![
            asked(0, &[1]),
            asked(100, &[1, 2]),
            // Same second again: still one second.
            asked(900, &[1, 2]),
            asked(1000, &[2]),
            asked(1100, &[]),
            // Three MACs count as dual too.
            asked(2999, &[1, 2, 3]),
            asked(3000, &[1]),
        ];
        assert_eq!(dual_answer_seconds(&answers), 2);
    }

    #[test]
    fn one_mac_per_request_is_never_dual_even_if_it_changes() {
        let answers = vec![asked(0, &[1]), asked(100, &[2]), asked(200, &[1])];
        assert_eq!(dual_answer_seconds(&answers), 0);
        assert_eq!(dual_answer_seconds(&[]), 0);
    }
}
