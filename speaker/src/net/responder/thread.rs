//! The responder's thread: it sleeps in one `poll(2)` on its packet socket and an eventfd the
//! daemon's side writes to with each command, so a command is seen at once and an idle thread
//! wakes only every [`IDLE_TURN`], for the pause fuse. Without a socket to poll (tests over
//! `pnet_datalink::dummy`) it waits in the receiver's own read timeout instead.

use std::io;
use std::net::{IpAddr, Ipv6Addr};
use std::os::fd::AsFd;
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;
use std::time::Duration;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::eventfd::{EfdFlags, EventFd};
use pnet_datalink::{DataLinkReceiver, DataLinkSender};
use prometheus_client::metrics::counter::Counter;
use swimlb_proto::ethernet::MacAddr;
use swimlb_proto::ndp;
use tokio::time::Instant;

use super::{
    Conflict, ConflictSender, Control, Drop, DropLabels, DropReasonLabel, Metrics, Owned, Reply,
    announcement, decide, report_conflict, solicitation,
};
use crate::net::packet_socket::Membership;

/// A running responder thread for one interface.
#[derive(Debug)]
pub struct Responder {
    control: mpsc::Sender<Control>,
    /// Written after each command so the thread's `poll` returns (`None` without a socket).
    wake: Option<Arc<EventFd>>,
    thread: Option<JoinHandle<()>>,
}

impl Responder {
    /// Starts the thread. With `membership` (the packet socket's second handle) the thread polls
    /// that socket and an eventfd; without it `rx.next()` must time out now and then so that
    /// control messages are seen without a frame arriving.
    pub fn spawn(
        name: &str,
        mac: MacAddr,
        tx: Box<dyn DataLinkSender>,
        rx: Box<dyn DataLinkReceiver>,
        membership: Option<Membership>,
        metrics: Metrics,
        conflicts: ConflictSender,
    ) -> io::Result<Responder> {
        let (control, commands) = mpsc::channel();
        let wake = match membership {
            Some(_) => Some(Arc::new(EventFd::from_flags(
                EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC,
            )?)),
            None => None,
        };
        let thread_wake = wake.clone();
        let thread = std::thread::Builder::new()
            .name(format!("responder-{name}"))
            .spawn(move || {
                let mut io = Io {
                    mac,
                    tx,
                    rx,
                    membership,
                    wake: thread_wake,
                    out: [0u8; 128],
                };
                run(&mut io, &metrics, &commands, &conflicts);
            })?;
        Ok(Responder {
            control,
            wake,
            thread: Some(thread),
        })
    }

    /// Sends a command; false when the thread is gone.
    pub fn send(&self, command: Control) -> bool {
        let sent = self.control.send(command).is_ok();
        if let Some(wake) = &self.wake {
            // Never blocks (non-blocking, and the counter cannot near its maximum: the thread
            // resets it each time it wakes).
            let _ = wake.write(1);
        }
        sent
    }

    /// Stops the thread and waits for it.
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        let _ = self.send(Control::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl std::ops::Drop for Responder {
    fn drop(&mut self) {
        self.halt();
    }
}

/// A turn of the responder's loop this much later than the last one means the thread (the
/// process) was not scheduled: stopped, or starved. The loop turns at least every
/// [`IDLE_TURN`] otherwise. The gossip's own pause watch uses the suspicion timeout (150 ms in
/// the `fast` profile): this fires no later.
pub const PAUSE_FUSE: Duration = Duration::from_millis(100);
/// The longest an idle responder sleeps: a turn of the loop with nothing to do, so that a pause
/// is told from a quiet link. Half the fuse: a turn is then late by more than this, 50 ms, only
/// when the thread was not scheduled. (It turned every 5 ms, its socket's read timeout, until
/// commands woke it through an eventfd: 200 wake-ups a second per link for nothing.)
pub const IDLE_TURN: Duration = Duration::from_millis(50);
/// How long a responder that woke from a pause answers nothing and sends no announcement unless
/// its owner set is renewed first (the daemon holds after a pause, then re-answers).
pub const QUARANTINE: Duration = Duration::from_millis(500);

/// What a responder thread does after a pause: the ARP requests queued while it slept, and the
/// announcements its daemon may still send from a stale view before the gossip reports the
/// pause, would claim IPs the cluster moved meanwhile. So it answers nothing for
/// [`QUARANTINE`], or until its owned set is renewed (the daemon's hold, then its release).
#[derive(Debug, Clone, Copy)]
pub struct PauseFuse {
    last_turn: Instant,
    quarantine_until: Option<Instant>,
}

impl PauseFuse {
    /// A fuse whose last turn is `now`.
    pub fn new(now: Instant) -> PauseFuse {
        PauseFuse {
            last_turn: now,
            quarantine_until: None,
        }
    }

    /// A loop turn at `now`; true when it found a pause (and started the quarantine).
    pub fn turn(&mut self, now: Instant) -> bool {
        let paused = now.saturating_duration_since(self.last_turn) > PAUSE_FUSE;
        self.last_turn = now;
        if paused {
            self.quarantine_until = Some(now + QUARANTINE);
        }
        paused
    }

    /// The owned set was renewed: the daemon has acted since the pause.
    pub fn renewed(&mut self) {
        self.quarantine_until = None;
    }

    /// Whether the thread must stay silent at `now`.
    pub fn quarantined(&mut self, now: Instant) -> bool {
        match self.quarantine_until {
            Some(until) if now < until => true,
            Some(_) => {
                self.quarantine_until = None;
                false
            }
            None => false,
        }
    }
}

/// Announcements the daemon asked for during a quarantine, sent when it ends for the IPs owned
/// then. Dropped, the hand-back after a refuted takeover lost its signal: an owner starved for
/// 111 ms, taken over by its successor and refuting it, re-announced 25 ms into its quarantine,
/// the successor never heard it and answered beside the owner, which answered again once the
/// quarantine ended, until its hand-over's 2 s deadline (Kubernetes chaos seed 6: 1.4 s).
/// Held, it goes out no earlier than the thread answers requests for that IP again.
#[derive(Debug, Default)]
pub struct Deferred(Vec<IpAddr>);

impl Deferred {
    /// Holds the announcement of `ip` (once, and only of an IP owned: bounded by the set).
    pub fn defer(&mut self, ip: IpAddr, owned: &Owned) {
        if owns(owned, ip) && !self.0.contains(&ip) {
            self.0.push(ip);
        }
    }

    /// The held announcements due once the quarantine is over (`quarantined` false): those of
    /// the IPs still owned, each once.
    pub fn due(&mut self, quarantined: bool, owned: &Owned) -> Vec<IpAddr> {
        if quarantined || self.0.is_empty() {
            return Vec::new();
        }
        let mut held = std::mem::take(&mut self.0);
        held.retain(|ip| owns(owned, *ip));
        held
    }
}

fn owns(owned: &Owned, ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => owned.contains_v4(a),
        IpAddr::V6(a) => owned.contains_v6(a),
    }
}

/// The thread's sockets and buffer.
struct Io {
    mac: MacAddr,
    tx: Box<dyn DataLinkSender>,
    rx: Box<dyn DataLinkReceiver>,
    membership: Option<Membership>,
    wake: Option<Arc<EventFd>>,
    out: [u8; 128],
}

/// What woke the thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Woken {
    /// The socket has a frame (or an error) to read.
    Frame,
    /// A command, or the idle turn: nothing to read.
    Nothing,
}

impl Io {
    /// Waits up to [`IDLE_TURN`] for a frame or a command; without a socket to poll, says a
    /// frame may be there (the receiver waits in its own read timeout).
    fn wait(&self) -> Woken {
        let (Some(membership), Some(wake)) = (&self.membership, &self.wake) else {
            return Woken::Frame;
        };
        let mut fds = [
            PollFd::new(membership.as_fd(), PollFlags::POLLIN),
            PollFd::new(wake.as_fd(), PollFlags::POLLIN),
        ];
        let timeout = PollTimeout::try_from(IDLE_TURN).unwrap_or(PollTimeout::MAX);
        // An error (EINTR) is a turn with nothing read.
        let _ = poll(&mut fds, timeout);
        let ready = |fd: &PollFd<'_>| fd.revents().is_some_and(|r| !r.is_empty());
        if ready(&fds[1]) {
            // Reset the counter; the commands are read next.
            let _ = wake.read();
        }
        if ready(&fds[0]) {
            Woken::Frame
        } else {
            Woken::Nothing
        }
    }
}

fn run(
    io: &mut Io,
    metrics: &Metrics,
    commands: &mpsc::Receiver<Control>,
    conflicts: &ConflictSender,
) {
    let mut owned = Owned::default();
    let mut fuse = PauseFuse::new(Instant::now());
    let mut deferred = Deferred::default();
    loop {
        notice_pause(&mut fuse, Instant::now());
        // Commands first: a stop or a new owned set takes effect before the next frame.
        if !obey(
            io,
            (&mut owned, &mut fuse, &mut deferred),
            metrics,
            commands,
        ) {
            return;
        }
        if io.wait() == Woken::Nothing {
            continue;
        }
        let frame = match io.rx.next() {
            Ok(frame) => frame,
            Err(e)
                if e.kind() == io::ErrorKind::TimedOut || e.kind() == io::ErrorKind::WouldBlock =>
            {
                continue;
            }
            Err(_) => {
                // A transient socket error (interface going down): back off briefly.
                std::thread::sleep(std::time::Duration::from_millis(50));
                continue;
            }
        };
        // The thread spends its time in the wait, so a stop most often ends there: the
        // frames that waited in the socket meanwhile are the cluster's past (a node held down
        // while stopped answered a queued ARP request for an IP its successor had taken).
        let now = Instant::now();
        notice_pause(&mut fuse, now);
        let decided = decide(frame, io.mac, &owned);
        if fuse.quarantined(now) && !passes_quarantine(&decided) {
            metrics
                .dropped
                .get_or_create(&DropLabels {
                    reason: DropReasonLabel::paused,
                })
                .inc();
            continue;
        }
        answer(io, decided, metrics, conflicts);
    }
}

/// Carries out the commands waiting; false on a stop (or when the daemon's side is gone).
fn obey(
    io: &mut Io,
    (owned, fuse, deferred): (&mut Owned, &mut PauseFuse, &mut Deferred),
    metrics: &Metrics,
    commands: &mpsc::Receiver<Control>,
) -> bool {
    loop {
        match commands.try_recv() {
            Ok(Control::SetOwned(next)) => {
                if let Some(m) = &io.membership {
                    update_groups(m, owned, &next);
                }
                *owned = next;
                fuse.renewed();
            }
            Ok(Control::Announce(ip)) => {
                if fuse.quarantined(Instant::now()) {
                    deferred.defer(ip, owned);
                    continue;
                }
                announce(io, ip, metrics);
            }
            Ok(Control::Solicit { sources, targets }) => {
                for target in targets {
                    if let Some(Ok(len)) = solicitation(io.mac, &sources, target, &mut io.out) {
                        send(
                            &mut *io.tx,
                            &io.out[..len],
                            metrics,
                            &metrics.peer_solicitations,
                        );
                    }
                }
            }
            Ok(Control::Stop) | Err(mpsc::TryRecvError::Disconnected) => return false,
            Err(mpsc::TryRecvError::Empty) => {
                for ip in deferred.due(fuse.quarantined(Instant::now()), owned) {
                    announce(io, ip, metrics);
                }
                return true;
            }
        }
    }
}

/// Sends a gratuitous announcement of `ip`.
fn announce(io: &mut Io, ip: IpAddr, metrics: &Metrics) {
    if let Ok(len) = announcement(io.mac, ip, &mut io.out) {
        send(
            &mut *io.tx,
            &io.out[..len],
            metrics,
            &metrics.gratuitous_sent,
        );
    }
}

/// Sends the reply `decide` chose, or counts why there is none and hands a claim to the daemon.
fn answer(
    io: &mut Io,
    decided: Result<Reply, Drop>,
    metrics: &Metrics,
    conflicts: &ConflictSender,
) {
    match decided {
        Ok(reply) => {
            let counter = match reply {
                Reply::Arp(_) => {
                    metrics.arp_requests.inc();
                    &metrics.arp_replies
                }
                Reply::Ndp(_) => {
                    metrics.ndp_solicitations.inc();
                    &metrics.ndp_adverts
                }
            };
            if let Ok(len) = reply.emit(&mut io.out) {
                send(&mut *io.tx, &io.out[..len], metrics, counter);
            }
        }
        Err(drop) => {
            metrics
                .dropped
                .get_or_create(&DropLabels {
                    reason: (&drop).into(),
                })
                .inc();
            if let Drop::Conflict { ip, mac } = drop {
                metrics.conflicts.inc();
                report_conflict(conflicts, metrics, Conflict { ip, mac });
            }
        }
    }
}

/// Whether a decision goes through the quarantine after a pause: no reply does (the request
/// may be the cluster's past), but another MAC's claim does. It is how an old owner learns the
/// new one announced an IP it hands over; missed, both answer until the hand-over's deadline
/// (Kubernetes chaos seed 1 at 1,379 s on 9bd8cfa: 1.8 s, the old owner just starved).
pub(super) fn passes_quarantine(decided: &Result<Reply, Drop>) -> bool {
    matches!(decided, Err(Drop::Conflict { .. }))
}

/// A turn of the fuse at `now`, said in the log when it found a pause.
fn notice_pause(fuse: &mut PauseFuse, now: Instant) {
    if fuse.turn(now) {
        tracing::warn!(
            "the responder was not scheduled for over {PAUSE_FUSE:?}: answering nothing until the speaker renews what it owns (at most {QUARANTINE:?})"
        );
    }
}

fn send(tx: &mut dyn DataLinkSender, frame: &[u8], metrics: &Metrics, sent: &Counter) {
    match tx.send_to(frame, None) {
        Some(Ok(())) => {
            sent.inc();
        }
        _ => {
            metrics.send_errors.inc();
        }
    }
}

/// Joins the solicited-node groups of new IPv6 addresses and leaves those of removed ones.
fn update_groups(membership: &Membership, old: &Owned, new: &Owned) {
    let group = |ip: &Ipv6Addr| {
        let m = ndp::multicast_mac(ndp::solicited_node_multicast(*ip));
        [m.0, m.1, m.2, m.3, m.4, m.5]
    };
    for ip in new.v6().iter().filter(|ip| !old.contains_v6(**ip)) {
        let _ = membership.join(group(ip));
    }
    for ip in old.v6().iter().filter(|ip| !new.contains_v6(**ip)) {
        let _ = membership.leave(group(ip));
    }
}
