//! The one loop both sources run. The standalone file and the Kubernetes API differ in what
//! they serve and in what they keep in step with the daemon (checks and hooks; records and
//! Events); the gossip, the owner watch, the links, the conflicts, the clock and the hold are
//! the same for both, and are handled here, once.
//!
//! A source implements [`Source`]: its own inputs ([`Source::next`]), its part on them
//! ([`Source::handle`]), and hooks on the shared ones, which default to nothing. [`run`] waits
//! on everything, hands each input to the [`Daemon`] and the hook, then looks at the hold and
//! lets the source catch up ([`Source::after`]).

use std::future::Future;

use prometheus_client::registry::Registry;
use swimlb_proto::KeyRing;
use tokio::sync::{broadcast, watch};
use tokio::time::Instant;

use crate::gossip::{GossipHandle, GossipMetrics, NodeIdentity, Phase};
use crate::model::announcer::Schedule;
use crate::model::engine::{Engine, Input, Start};
use crate::model::links::{Link, Route};
use crate::model::local::LocalState;
use crate::model::membership::LiveChange;
use crate::model::snapshot::Snapshot;
use crate::model::watch_knobs::Knobs;
use crate::net::answering::AnsweringLinks;
use crate::net::responder;
use crate::owner_watch::{WatchEvents, WatchMetrics};
use crate::run::daemon::{Daemon, FailoverMetrics, NetWatch, sleep_until, start_watch};
use crate::run::hold::JoinHold;
use crate::serve::status::StatusBoard;

/// The metrics every speaker has, registered, with the handles its parts count into. A source
/// registers its own on [`Instruments::registry`] before it is served.
pub(crate) struct Instruments {
    pub registry: Registry,
    pub board: StatusBoard,
    pub gossip: GossipMetrics,
    pub failovers: FailoverMetrics,
    pub responder: responder::Metrics,
    pub watch: WatchMetrics,
}

impl Instruments {
    /// Every shared metric of `node`'s speaker.
    pub(crate) fn register(node: &str) -> Instruments {
        let mut registry = Registry::default();
        let gossip = GossipMetrics::register(&mut registry);
        let failovers = FailoverMetrics::register(&mut registry);
        let watch = WatchMetrics::register(&mut registry);
        let responder = responder::Metrics::default();
        responder.register(&mut registry);
        let board = StatusBoard::new(node, &mut registry);
        crate::serve::process_metrics::register(&mut registry, board.subscribe());
        Instruments {
            registry,
            board,
            gossip,
            failovers,
            responder,
            watch,
        }
    }
}

/// What a source hands over once its gossip runs, to be wired the same way in both modes.
pub(crate) struct Parts {
    /// This node's record as first gossiped.
    pub local: LocalState,
    pub schedule: Schedule,
    /// What is served at start.
    pub snapshot: Snapshot,
    pub links: Vec<Link>,
    pub routes: Vec<Route>,
    pub net: NetWatch,
    pub hold: JoinHold,
    pub board: StatusBoard,
    pub failovers: FailoverMetrics,
    pub responder: responder::Metrics,
    pub watch: WatchMetrics,
    pub watch_knobs: Knobs,
    /// The owner watch's copy of the key ring.
    pub watch_ring: swimlb_proto::Result<KeyRing>,
}

/// Starts the owner watch beside `gossip`, the engine on the first live set, the responders,
/// and the daemon; returns it with the shared inputs.
pub(crate) async fn assemble(node: &str, gossip: GossipHandle, parts: Parts) -> (Daemon, Shared) {
    let (watch, watch_events) =
        start_watch(parts.watch_knobs, &gossip, parts.watch_ring, parts.watch);
    // Subscribe before the live set is read: a change in between is seen twice (harmless),
    // never missed.
    let changes = gossip.subscribe();
    let live = gossip.live().borrow().clone();
    let (engine, initial) = Engine::new(
        Instant::now(),
        Start {
            node: node.into(),
            schedule: parts.schedule,
            snapshot: parts.snapshot,
            live,
            links: parts.links.clone(),
            routes: parts.routes,
            hold: parts.hold.holding(),
        },
    );
    let (conflict_tx, conflicts) = responder::conflict_queue();
    let answering = AnsweringLinks::new(parts.links, parts.responder, conflict_tx);
    let shared = Shared {
        changes,
        phase: gossip.phase(),
        identity: gossip.identity_changes(),
        conflicts,
        net: parts.net,
        watch: watch_events,
    };
    let daemon = Daemon::new(
        engine,
        initial,
        parts.local,
        parts.board,
        answering,
        gossip,
        parts.failovers,
    )
    .await
    .with_watch(watch)
    .with_hold(parts.hold);
    (daemon, shared)
}

/// The inputs every source has: what the gossip, the owner watch, the responders and the kernel
/// report.
pub(crate) struct Shared {
    /// Members up, down and changed.
    pub changes: broadcast::Receiver<LiveChange>,
    /// The gossip's phase.
    pub phase: watch::Receiver<Phase>,
    /// This node's gossip identity (renewed on a rejoin).
    pub identity: watch::Receiver<NodeIdentity>,
    /// Another host answering for an IP this node answers for.
    pub conflicts: responder::ConflictReceiver,
    /// Links and routes.
    pub net: NetWatch,
    /// The owner watch's events.
    pub watch: WatchEvents,
}

/// What a source adds to the shared [`Daemon`].
pub(crate) trait Source {
    /// The source's own inputs, waited on beside [`Shared`].
    type Inputs;
    /// One of them, ready to handle.
    type Event;

    /// The daemon the source drives.
    fn daemon(&mut self) -> &mut Daemon;

    /// Waits for the next of the source's own inputs. Must be cancel-safe: it is dropped when
    /// a shared input comes first. `draining`: the node is handing over, inputs that would
    /// start something new (a reload) wait.
    fn next(inputs: &mut Self::Inputs, draining: bool) -> impl Future<Output = Self::Event>;

    /// Acts on one of the source's own inputs.
    fn handle(&mut self, event: Self::Event) -> impl Future<Output = ()>;

    /// Whether `/readyz` says ready in `phase`.
    fn ready(&self, phase: Phase) -> bool {
        phase == Phase::Active
    }

    /// The daemon placed again on new links (`links`).
    fn net_changed(&mut self, links: &[Link]) -> impl Future<Output = ()> {
        let _ = links;
        async {}
    }

    /// A link's carrier came back (after [`Daemon::net`]): connections that outlived it wait
    /// for the kernel's backed-off retransmissions.
    fn carrier_back(&mut self) {}

    /// The members changed (after the daemon elected again).
    fn members_changed(&mut self) {}

    /// This node is back in the cluster under a renewed identity (after
    /// [`Daemon::rejoined`]).
    fn rejoined(&mut self) {}

    /// The drain starts (before [`Daemon::drain`]).
    fn draining(&mut self) {}

    /// After every input: what the source keeps in step with the daemon.
    fn after(&mut self) {}
}

/// Runs `source` until `shutdown` resolves and the drain is over, or the gossip stops.
pub(crate) async fn run<S: Source>(
    source: &mut S,
    shared: &mut Shared,
    own: &mut S::Inputs,
    mut shutdown: impl Future<Output = ()> + Unpin,
) {
    loop {
        let daemon = source.daemon();
        let draining = daemon.engine.draining();
        let settles_at = daemon.local.settles_at();
        let hold_at = daemon.hold_deadline();
        let tick_at = daemon.next_deadline();
        tokio::select! {
            _ = &mut shutdown, if !draining => {
                tracing::info!("draining: handing the addresses over");
                source.draining();
                source.daemon().drain().await;
            }
            change = shared.changes.recv() => {
                if !source.daemon().membership(change).await {
                    break;
                }
                source.members_changed();
            }
            Ok(()) = shared.phase.changed() => {
                let phase = *shared.phase.borrow_and_update();
                tracing::info!(phase = phase.as_str(), "gossip phase");
                let ready = source.ready(phase);
                source.daemon().board.update(|s| s.ready = ready);
            }
            Ok(()) = shared.identity.changed() => {
                let bump = shared.identity.borrow_and_update().bump;
                source.daemon().rejoined(bump).await;
                source.rejoined();
            }
            _ = sleep_until(settles_at) => source.daemon().settle().await,
            // Looked at below, as after every input.
            _ = sleep_until(hold_at) => {}
            _ = sleep_until(tick_at) => source.daemon().handle(Input::Tick).await,
            Some(c) = shared.conflicts.recv() => {
                source.daemon().handle(Input::Conflict { ip: c.ip, mac: c.mac }).await;
            }
            Some((links, routes)) = shared.net.changed() => {
                if source.daemon().net(links.clone(), routes).await {
                    source.carrier_back();
                }
                source.net_changed(&links).await;
            }
            Some(event) = shared.watch.recv() => source.daemon().watch_event(event).await,
            event = S::next(own, draining) => source.handle(event).await,
        }
        source.daemon().check_hold().await;
        if source.daemon().drained() {
            break;
        }
        source.after();
    }
}
