//! The owner watch's thread: its own UDP socket and its own clock around a [`WatchCore`], which
//! holds every rule (heartbeats, the second check, claims, refutations, pauses). The loop only
//! reads a datagram, a command, a directory change or the timer, calls the core, sends what it
//! queued and hands its events to the daemon.
//!
//! **Its own thread.** The watch runs on a dedicated OS thread with a single-threaded tokio
//! runtime, so the heartbeats and the watch timers never wait behind reconciliation, a netlink
//! dump or the HTTP server on the speaker's main runtime. Every wake-up measures how late its
//! timer fired (`swimlb_owner_watch_timer_lateness_seconds`); more than half an interval late
//! is logged (at most once every ten seconds), as FRR does for BFD.
//!
//! **The socket.** The watch listens on the gossip address's port + 1 ([`watch_addr`]: 7947
//! beside the default 7946); a member's watch address follows from its gossip address, which
//! the gossip's [`Directory`] gives. A datagram the socket cannot take at once is dropped: the
//! next heartbeat follows within an interval.

use std::net::SocketAddr;
use std::time::Duration;

use rand::RngExt;
use swimlb_proto::KeyRing;
use swimlb_proto::envelope::MAX_DATAGRAM_LEN;
use tokio::net::UdpSocket;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::core::{Command, Event, Plan, WatchCore};
use super::metrics::WatchMetrics;
use crate::gossip::WatchRelayed;
use crate::gossip::driver::{Directory, WatchLink};
use crate::model::watch_knobs::Knobs;

pub use super::core::{
    CHECK_ROUNDS, FAREWELL_INTERVAL_MS, MAX_WATCHERS, check_round_at, watch_addr,
};

/// The lateness warning is logged at most this often.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// The daemon's side of a running watch.
#[derive(Debug)]
pub struct WatchHandle {
    commands: mpsc::UnboundedSender<Command>,
    local_addr: SocketAddr,
    metrics: WatchMetrics,
}

/// The events of a running watch, for the mode's loop.
#[derive(Debug)]
pub struct WatchEvents(mpsc::UnboundedReceiver<Event>);

impl WatchEvents {
    /// Events from a watch that never runs (switched off): none, ever.
    pub fn none() -> WatchEvents {
        let (_, rx) = mpsc::unbounded_channel();
        WatchEvents(rx)
    }

    /// The next event; `None` once the watch is gone (or never ran).
    pub async fn recv(&mut self) -> Option<Event> {
        self.0.recv().await
    }
}

impl WatchHandle {
    /// Binds `bind` and starts the watch thread. `directory` is the gossip's; `plan` the first.
    pub fn start(
        knobs: Knobs,
        bind: SocketAddr,
        ring: KeyRing,
        directory: watch::Receiver<Directory>,
        link: Option<WatchLink>,
        plan: Plan,
        metrics: WatchMetrics,
    ) -> std::io::Result<(WatchHandle, WatchEvents)> {
        let socket = std::net::UdpSocket::bind(bind)?;
        socket.set_nonblocking(true)?;
        let local_addr = socket.local_addr()?;
        let seed = plan.me.bump ^ rand::rng().random::<u64>();
        let first = directory.borrow().clone();
        let mut core = WatchCore::new(
            knobs,
            ring,
            local_addr,
            plan,
            first,
            metrics.clone(),
            seed,
            Duration::ZERO,
        )
        .map_err(|e| std::io::Error::other(e.to_string()))?;
        if let Some(link) = &link {
            core.set_wire_rule(link.wire_rule());
        }
        let (commands_tx, commands_rx) = mpsc::unbounded_channel();
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        std::thread::Builder::new()
            .name("owner-watch".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(e) => {
                        tracing::error!(error = %e, "owner watch: no runtime; gossip alone detects");
                        return;
                    }
                };
                runtime.block_on(async move {
                    let socket = match UdpSocket::from_std(socket) {
                        Ok(socket) => socket,
                        Err(e) => {
                            tracing::error!(error = %e, "owner watch socket; gossip alone detects");
                            return;
                        }
                    };
                    let driver = Driver {
                        core,
                        knobs,
                        origin: Instant::now(),
                        socket,
                        directory,
                        link,
                        events: events_tx,
                        last_warn: None,
                    };
                    driver.run(commands_rx).await;
                });
            })?;
        Ok((
            WatchHandle {
                commands: commands_tx,
                local_addr,
                metrics,
            },
            WatchEvents(events_rx),
        ))
    }

    /// The address the watch listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The watch's metrics.
    pub fn metrics(&self) -> &WatchMetrics {
        &self.metrics
    }

    /// Sends `command` (a stopped thread ignores it).
    pub fn send(&self, command: Command) {
        let _ = self.commands.send(command);
    }
}

/// The next watch payload that arrived through the gossip; pending for ever without a link,
/// or once the gossip has stopped.
async fn next_relayed(link: &mut Option<WatchLink>) -> WatchRelayed {
    if let Some(open) = link {
        if let Some(relayed) = open.recv().await {
            return relayed;
        }
        *link = None;
    }
    std::future::pending().await
}

/// The watch thread: the socket and the clock around the core.
struct Driver {
    core: WatchCore,
    knobs: Knobs,
    origin: Instant,
    socket: UdpSocket,
    directory: watch::Receiver<Directory>,
    /// The second path for claims and refutations, through the gossip.
    link: Option<WatchLink>,
    events: mpsc::UnboundedSender<Event>,
    last_warn: Option<Duration>,
}

impl Driver {
    async fn run(mut self, mut commands: mpsc::UnboundedReceiver<Command>) {
        let mut buf = vec![0u8; MAX_DATAGRAM_LEN + 1];
        loop {
            let wake = self.core.next_deadline().map_or_else(
                || Instant::now() + Duration::from_secs(3600),
                |at| self.origin + at,
            );
            tokio::select! {
                received = self.socket.recv_from(&mut buf) => {
                    if let Ok((len, from)) = received {
                        // A member the gossip just learnt may be the sender.
                        if self.directory.has_changed().unwrap_or(false) {
                            self.refresh_directory();
                        }
                        let now = self.caught_up();
                        self.core.handle_datagram(now, from, &mut buf[..len]);
                    }
                }
                relayed = next_relayed(&mut self.link) => {
                    if self.directory.has_changed().unwrap_or(false) {
                        self.refresh_directory();
                    }
                    let now = self.caught_up();
                    self.core.handle_relayed(now, relayed.from, &relayed.payload);
                }
                command = commands.recv() => {
                    let Some(command) = command else {
                        return;
                    };
                    let now = self.caught_up();
                    self.core.command(now, command);
                }
                changed = self.directory.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    self.refresh_directory();
                }
                () = tokio::time::sleep_until(wake) => {
                    let now = self.now();
                    let late = self.core.tick(now);
                    self.warn_if_late(now, late);
                }
            }
            self.flush();
        }
    }

    fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    /// The time now, once the timers already due have run: a datagram or a command that waited
    /// while the thread was not scheduled (a pause) comes after the late tick that notices the
    /// pause, as it would have had the thread run on time (`select!` picks among ready branches
    /// at random).
    fn caught_up(&mut self) -> Duration {
        let now = self.now();
        if self.core.next_deadline().is_some_and(|at| at <= now) {
            let late = self.core.tick(now);
            self.warn_if_late(now, late);
        }
        now
    }

    fn refresh_directory(&mut self) {
        let directory = self.directory.borrow_and_update().clone();
        self.core.set_directory(directory);
    }

    /// Sends what the core queued and hands its events to the daemon.
    fn flush(&mut self) {
        for out in self.core.drain_outgoing() {
            // A full socket buffer drops it: the next heartbeat follows within an interval.
            let _ = self.socket.try_send_to(&out.bytes, out.to);
        }
        for payload in self.core.drain_relays() {
            if let Some(link) = &self.link {
                link.relay(payload);
            }
        }
        for (addr, bump) in self.core.drain_heard() {
            if let Some(link) = &self.link {
                link.heard(addr, bump);
            }
        }
        for event in self.core.drain_events() {
            let _ = self.events.send(event);
        }
    }

    fn warn_if_late(&mut self, now: Duration, late: Duration) {
        if late > self.knobs.interval / 2
            && self
                .last_warn
                .is_none_or(|at| now.saturating_sub(at) >= WARN_EVERY)
        {
            self.last_warn = Some(now);
            tracing::warn!(
                late_ms = late.as_secs_f64() * 1000.0,
                interval_ms = self.knobs.interval.as_secs_f64() * 1000.0,
                "owner watch timer fired more than half an interval late"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    //! Two watch threads on loopback sockets, real sealing: the watcher hears the owner, stays
    //! quiet while it lives, reports it silent once its thread is gone, and drops what is
    //! forged, replayed or from a stranger. Waits are bounded; nothing asserts a duration.

    use std::collections::BTreeMap;
    use std::net::{Ipv4Addr, UdpSocket as StdUdpSocket};
    use std::sync::Arc;

    use prometheus_client::registry::Registry;
    use smol_str::SmolStr;
    use swimlb_proto::heartbeat;
    use swimlb_proto::{SealStream, WatchMessage};

    use super::*;
    use crate::gossip::NodeIdentity;
    use crate::gossip::replay::sender_id;

    const KEY: [u8; 32] = [7; 32];

    fn ring() -> KeyRing {
        KeyRing::new("watch-test", &[KEY]).unwrap()
    }

    struct Node {
        handle: WatchHandle,
        events: WatchEvents,
        identity: NodeIdentity,
        registry: Registry,
    }

    /// A watch on a free loopback port; its gossip address (the directory's) is one below.
    fn start(name: &str, directory: watch::Receiver<Directory>, watchers: &[&str]) -> Node {
        let mut registry = Registry::default();
        let metrics = WatchMetrics::register(&mut registry);
        // A free port whose predecessor is not 0.
        let probe = StdUdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let port = probe.local_addr().unwrap().port().max(2);
        drop(probe);
        let bind = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let identity = NodeIdentity {
            node: SmolStr::new(name),
            addr: SocketAddr::from((Ipv4Addr::LOCALHOST, port - 1)),
            bump: 100,
        };
        let plan = Plan {
            me: identity.clone(),
            watchers: watchers.iter().map(|w| w.to_string()).collect(),
            held: false,
            accused: BTreeMap::new(),
        };
        let knobs = Knobs::default();
        let (handle, events) =
            WatchHandle::start(knobs, bind, ring(), directory, None, plan, metrics).unwrap();
        Node {
            handle,
            events,
            identity,
            registry,
        }
    }

    fn metric(registry: &Registry, line_start: &str) -> f64 {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
        text.lines()
            .filter(|l| l.starts_with(line_start))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    fn directory_of(nodes: &[&NodeIdentity]) -> Directory {
        Arc::new(
            nodes
                .iter()
                .map(|id| (id.node.to_string(), (*id).clone()))
                .collect(),
        )
    }

    /// Waits (bounded) for the first event `pick` accepts.
    async fn first(events: &mut WatchEvents, pick: impl Fn(&Event) -> bool) -> Option<Event> {
        tokio::time::timeout(Duration::from_secs(10), async {
            while let Some(event) = events.recv().await {
                if pick(&event) {
                    return Some(event);
                }
            }
            None
        })
        .await
        .ok()
        .flatten()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_watcher_hears_its_owner_and_reports_it_silent_once_it_is_gone() {
        let (dir_tx, dir_rx) = watch::channel(Directory::default());
        let owner = start("owner", dir_rx.clone(), &["watcher"]);
        let mut watcher = start("watcher", dir_rx, &[]);
        dir_tx.send_replace(directory_of(&[&owner.identity, &watcher.identity]));
        // The owner's plan is re-sent so that it looks its watcher up in the new directory.
        owner.handle.send(Command::Plan(Plan {
            me: owner.identity.clone(),
            watchers: vec!["watcher".into()],
            held: false,
            accused: BTreeMap::new(),
        }));

        // Established: the watcher acknowledged and the owner went fast.
        let deadline = Instant::now() + Duration::from_secs(10);
        while metric(
            &owner.registry,
            "swimlb_owner_watch_received_total{type=\"ack\"}",
        ) < 1.0
        {
            assert!(Instant::now() < deadline, "no acknowledgement");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Alive: half a second of fast heartbeats and no silence.
        let quiet = tokio::time::timeout(Duration::from_millis(500), watcher.events.recv()).await;
        assert!(quiet.is_err(), "an event while the owner lives: {quiet:?}");
        let beats = metric(
            &watcher.registry,
            "swimlb_owner_watch_received_total{type=\"heartbeat\"}",
        );
        assert!(beats >= 5.0, "{beats} heartbeats in over half a second");
        assert_eq!(
            metric(&watcher.registry, "swimlb_owner_watch_dropped_total"),
            0.0
        );

        // The owner's thread stops with its handle: the watcher reports it silent.
        let owner_identity = owner.identity.clone();
        drop(owner.handle);
        let silent = first(&mut watcher.events, |e| matches!(e, Event::Silent { .. })).await;
        match silent {
            Some(Event::Silent { owner, .. }) => assert_eq!(owner, owner_identity),
            other => panic!("no silence reported: {other:?}"),
        }
        // The second check ran and found nothing.
        assert!(
            metric(
                &watcher.registry,
                "swimlb_owner_watch_checks_total{result=\"silent\"}"
            ) >= 1.0
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn forged_replayed_and_stranger_datagrams_are_dropped_and_counted() {
        let (dir_tx, dir_rx) = watch::channel(Directory::default());
        let node = start("watcher", dir_rx, &[]);
        let to = node.handle.local_addr();
        let sender = StdUdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let sender_port = sender.local_addr().unwrap().port();
        let stranger = NodeIdentity {
            node: SmolStr::new("stranger"),
            addr: SocketAddr::from((Ipv4Addr::LOCALHOST, sender_port - 1)),
            bump: 5,
        };
        let mut payload = [0u8; heartbeat::MAX_LEN];
        let beat = WatchMessage::Heartbeat {
            incarnation: 5,
            seq: 1,
            interval_ms: 20,
        };
        let len = beat.emit(&mut payload).unwrap();
        let seal = |ring: &KeyRing, stream: &mut SealStream| {
            let mut out = Vec::new();
            ring.seal_in(stream, None, &payload[..len], &mut out)
                .unwrap();
            out
        };
        let mut stream = SealStream::new(sender_id(sender.local_addr().unwrap()), 1).unwrap();
        let wait_for = |what: &str, want: f64| {
            let deadline = Instant::now() + Duration::from_secs(10);
            while metric(&node.registry, what) < want {
                assert!(Instant::now() < deadline, "{what} never reached {want}");
                std::thread::sleep(Duration::from_millis(10));
            }
        };

        // Not in the directory yet: a stranger.
        let first = seal(&ring(), &mut stream);
        sender.send_to(&first, to).unwrap();
        wait_for(
            "swimlb_owner_watch_dropped_total{reason=\"unknown_sender\"}",
            1.0,
        );
        // Sealed with another key.
        let other = KeyRing::new("watch-test", &[[9; 32]]).unwrap();
        sender.send_to(&seal(&other, &mut stream), to).unwrap();
        wait_for(
            "swimlb_owner_watch_dropped_total{reason=\"unauthentic\"}",
            1.0,
        );
        // Garbage.
        sender.send_to(b"not an envelope", to).unwrap();
        wait_for(
            "swimlb_owner_watch_dropped_total{reason=\"unauthentic\"}",
            2.0,
        );
        // A member now: its heartbeat is heard (and armed a detector); the same envelope again
        // is a replay.
        dir_tx.send_replace(directory_of(&[&stranger]));
        let fresh = seal(&ring(), &mut stream);
        // The directory reaches the thread asynchronously: resend fresh envelopes until one is
        // admitted.
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut last = fresh;
        loop {
            sender.send_to(&last, to).unwrap();
            std::thread::sleep(Duration::from_millis(20));
            if metric(
                &node.registry,
                "swimlb_owner_watch_received_total{type=\"heartbeat\"}",
            ) >= 1.0
            {
                break;
            }
            assert!(Instant::now() < deadline, "never admitted");
            last = seal(&ring(), &mut stream);
        }
        sender.send_to(&last, to).unwrap();
        wait_for("swimlb_owner_watch_dropped_total{reason=\"replay\"}", 1.0);
        assert_eq!(
            metric(
                &node.registry,
                "swimlb_owner_watch_received_total{type=\"heartbeat\"}"
            ),
            1.0,
            "the replay was not heard"
        );
    }
}
