//! The drivers around the [`Engine`], shared by every mode: they read inputs, call the engine
//! and carry out its actions. Nothing here decides.
//!
//! - [`Daemon`] holds the engine, the gossip handle, this node's record ([`LocalState`]), the
//!   responders ([`AnsweringLinks`]) and `/status` with the owner gauges ([`StatusBoard`]).
//!   [`Daemon::handle`] feeds one input and performs the actions: link actions go to the
//!   responders, status deltas to the board, new announce facts into the node's record and out
//!   through the gossip, notices to the log.
//! - [`NetWatch`] dumps links and routes in its own task whenever the kernel reports a change,
//!   so a netlink dump never delays a conflict or an announcement tick.
//! - [`JoinHold`] decides when a starting node may answer: not while the mesh forms (a node
//!   alone elects itself for everything, and two nodes would answer for one IP). The same hold
//!   comes back after a pause: when the gossip reports [`Phase::Paused`] (the process was not
//!   scheduled for longer than the suspicion timeout, see `gossip::driver`), the node answers
//!   nothing until it has heard the cluster again, so it never answers for an IP the cluster
//!   moved while it slept.
//! - [`FailoverMetrics`] is the failover latency histogram: for every
//!   [`Notice::TookOver`], from the last datagram heard from the previous owner to the moment
//!   this node handed its first announcement of the IP to the responder.

use std::net::IpAddr;
use std::time::Duration;

use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::sync::{broadcast, watch};
use tokio::time::Instant;

use crate::answering::AnsweringLinks;
use crate::engine::{Action, Engine, Input, Notice};
use crate::gossip::{GossipHandle, Phase};
use crate::interfaces::{self, InterfaceWatch, Link, Route};
use crate::local::LocalState;
use crate::membership::{AnnounceFacts, LiveChange, LiveSet, NodeName};
use crate::status::StatusBoard;

/// A starting node answers at the latest this long after start, joined or not (its peers may
/// all be down: then it serves alone).
pub const JOIN_GRACE: Duration = Duration::from_secs(3);
/// After joining, a node waits this long (and for every member's record) before it answers, so
/// that the members the join brought are known.
pub const JOIN_SETTLE: Duration = Duration::from_millis(200);

/// When a starting node may answer (pure; `now` is an argument).
#[derive(Debug, Clone)]
pub struct JoinHold {
    started: Instant,
    active_since: Option<Instant>,
    released: bool,
}

impl JoinHold {
    /// A hold from `now`; a node with no peers to join (`alone`) is never held.
    pub fn new(now: Instant, alone: bool) -> JoinHold {
        JoinHold {
            started: now,
            active_since: None,
            released: alone,
        }
    }

    /// Whether the hold is still on.
    pub fn holding(&self) -> bool {
        !self.released
    }

    /// Looks at the facts at `now`; returns true once, when the hold ends. The hold ends when
    /// the node has been `Active` for [`JOIN_SETTLE`] and holds every member's record (no
    /// placeholder of version 0), or [`JOIN_GRACE`] after start.
    pub fn release(&mut self, now: Instant, phase: Phase, live: &LiveSet) -> bool {
        if self.released {
            return false;
        }
        match phase {
            Phase::Active => {
                self.active_since.get_or_insert(now);
            }
            Phase::Joining | Phase::Left | Phase::Paused => self.active_since = None,
        }
        let settled = self
            .active_since
            .is_some_and(|t| now >= t + JOIN_SETTLE && live.iter().all(|m| m.version > 0));
        self.released = settled || now >= self.started + JOIN_GRACE;
        self.released
    }

    /// Puts the hold back on when the gossip reports a pause (the hold then ends as at start-up,
    /// [`JOIN_GRACE`] after `now` at the latest); returns true once per pause, when it does.
    pub fn rearm(&mut self, now: Instant, phase: Phase) -> bool {
        if phase != Phase::Paused || !self.released {
            return false;
        }
        *self = JoinHold::new(now, false);
        true
    }

    /// When to look again.
    pub fn next_deadline(&self) -> Option<Instant> {
        if self.released {
            return None;
        }
        let grace = self.started + JOIN_GRACE;
        Some(match self.active_since {
            Some(t) => grace.min(t + JOIN_SETTLE),
            None => grace,
        })
    }
}

/// `swimlb_failover_seconds`: how long the IPs this node took over were unanswered, as far as
/// this node can tell. One sample per IP taken over from a member that went down or left (see
/// [`Notice::TookOver`] for what is not a takeover), from the last datagram this node heard
/// from that member to the moment it handed its first gratuitous announcement of the IP to the
/// responder (which sends it at once). Not timed: a previous owner this node never heard from
/// directly. Cloning shares the series.
#[derive(Debug, Clone)]
pub struct FailoverMetrics {
    seconds: Histogram,
}

impl Default for FailoverMetrics {
    fn default() -> FailoverMetrics {
        FailoverMetrics {
            // 10 ms .. 10.24 s, doubling.
            seconds: Histogram::new(exponential_buckets(0.01, 2.0, 11)),
        }
    }
}

impl FailoverMetrics {
    /// The histogram, registered into `registry`.
    pub fn register(registry: &mut Registry) -> FailoverMetrics {
        let metrics = FailoverMetrics::default();
        registry.register(
            "swimlb_failover_seconds",
            "From the last datagram heard from an IP's owner that went down or left to this node's first gratuitous announcement of the IP, one sample per IP taken over",
            metrics.seconds.clone(),
        );
        metrics
    }
}

/// Times every [`Notice::TookOver`] among `actions` into `failovers`: from when its previous
/// owner was last heard from (`last_heard`; `None`: never directly, not timed) to `announced`,
/// when the actions' announcements were handed to the responders. Returns each takeover with
/// its duration, for the log.
pub(crate) fn observe_takeovers<'a>(
    actions: &'a [Action],
    announced: Instant,
    last_heard: impl Fn(&str) -> Option<Instant>,
    failovers: &FailoverMetrics,
) -> Vec<(IpAddr, &'a NodeName, Option<Duration>)> {
    actions
        .iter()
        .filter_map(|action| match action {
            Action::Notice(Notice::TookOver { ip, from }) => {
                let took = last_heard(from).map(|heard| announced.saturating_duration_since(heard));
                if let Some(took) = took {
                    failovers.seconds.observe(took.as_secs_f64());
                }
                Some((*ip, from, took))
            }
            _ => None,
        })
        .collect()
}

/// The latest links and routes, dumped in the background after every kernel notification.
#[derive(Debug)]
pub struct NetWatch {
    rx: watch::Receiver<(Vec<Link>, Vec<Route>)>,
    task: tokio::task::JoinHandle<()>,
}

impl NetWatch {
    /// Subscribes, then dumps once (no change between the two is missed).
    pub async fn start() -> Result<(NetWatch, Vec<Link>, Vec<Route>), interfaces::Error> {
        let mut watch_kernel = InterfaceWatch::subscribe()?;
        let (links, routes) = interfaces::snapshot().await?;
        let (tx, rx) = watch::channel((links.clone(), routes.clone()));
        let task = tokio::spawn(async move {
            loop {
                if let Err(e) = watch_kernel.changed().await {
                    tracing::warn!(error = %e, "link and route notifications stopped: subscribing again");
                    match InterfaceWatch::subscribe() {
                        Ok(w) => watch_kernel = w,
                        Err(e) => {
                            tracing::error!(error = %e, "interface changes are no longer seen");
                            return;
                        }
                    }
                }
                match interfaces::snapshot().await {
                    Ok(net) => {
                        if tx.send(net).is_err() {
                            return;
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "cannot read links and routes"),
                }
            }
        });
        Ok((NetWatch { rx, task }, links, routes))
    }

    /// The links and routes last dumped.
    pub fn latest(&self) -> (Vec<Link>, Vec<Route>) {
        self.rx.borrow().clone()
    }

    /// Resolves with the next links and routes.
    pub async fn changed(&mut self) -> Option<(Vec<Link>, Vec<Route>)> {
        self.rx.changed().await.ok()?;
        Some(self.rx.borrow_and_update().clone())
    }
}

impl Drop for NetWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The engine and the drivers of one speaker.
#[derive(Debug)]
pub struct Daemon {
    /// The decision core.
    pub engine: Engine,
    /// This node's gossiped record.
    pub local: LocalState,
    /// `/status` and the owner gauges.
    pub board: StatusBoard,
    answering: AnsweringLinks,
    gossip: GossipHandle,
    failovers: FailoverMetrics,
    live: watch::Receiver<LiveSet>,
    drained: bool,
}

impl Daemon {
    /// Wires the parts; `initial` are the engine's first actions, performed at once.
    pub async fn new(
        engine: Engine,
        initial: Vec<Action>,
        local: LocalState,
        board: StatusBoard,
        answering: AnsweringLinks,
        gossip: GossipHandle,
        failovers: FailoverMetrics,
    ) -> Daemon {
        let live = gossip.live();
        board.members(live.borrow().iter());
        let mut answering = answering;
        open_placed(&mut answering, &engine);
        let mut daemon = Daemon {
            engine,
            local,
            board,
            answering,
            gossip,
            failovers,
            live,
            drained: false,
        };
        daemon.perform(initial).await;
        daemon
    }

    /// Feeds `input` at the current time and performs the actions.
    pub async fn handle(&mut self, input: Input) {
        let actions = self.engine.handle(Instant::now(), input);
        self.perform(actions).await;
    }

    /// A change from the gossip's stream (`Err`: some were missed: resynchronise). Returns
    /// false when the gossip has stopped.
    pub async fn membership(
        &mut self,
        change: Result<LiveChange, broadcast::error::RecvError>,
    ) -> bool {
        let input = match change {
            Ok(change) => {
                let (node, joined) = match change {
                    LiveChange::Up(node) => {
                        tracing::info!(member = %node, "member up");
                        (node, true)
                    }
                    LiveChange::Down(node) => {
                        tracing::info!(member = %node, "member down");
                        (node, false)
                    }
                    LiveChange::Meta(node) => {
                        tracing::debug!(member = %node, "member metadata changed");
                        (node, false)
                    }
                };
                let record = self.live.borrow().get(&node).cloned();
                self.board.member(&node, record.as_ref());
                Input::Member {
                    node,
                    record,
                    joined,
                }
            }
            Err(broadcast::error::RecvError::Lagged(missed)) => {
                tracing::warn!(missed, "gossip changes lagged: full re-election");
                let live = self.live.borrow().clone();
                self.board.members(live.iter());
                Input::Live(live)
            }
            Err(broadcast::error::RecvError::Closed) => return false,
        };
        self.handle(input).await;
        true
    }

    /// Gossips this node's record after a change to it.
    pub async fn publish_meta(&mut self) {
        if let Err(e) = self.gossip.set_meta(self.local.meta().clone()).await {
            tracing::error!(error = %e, "this node's record could not be gossiped");
        }
    }

    /// When the engine wants the next tick.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.engine.next_deadline()
    }

    /// Whether the drain is over.
    pub fn drained(&self) -> bool {
        self.drained
    }

    /// The gossip's phase, watched.
    pub fn phase(&self) -> watch::Receiver<Phase> {
        self.gossip.phase()
    }

    /// The gossip handle.
    pub fn gossip(&self) -> &GossipHandle {
        &self.gossip
    }

    /// New links and routes: the responders on dead links stop, the engine places again.
    pub async fn net(&mut self, links: Vec<Link>, routes: Vec<Route>) {
        for name in self.answering.set_links(links.clone()) {
            tracing::warn!(interface = %name, "interface gone or down: no longer answering on it");
        }
        self.handle(Input::Net { links, routes }).await;
        open_placed(&mut self.answering, &self.engine);
    }

    /// Carries out `actions`, in order.
    pub async fn perform(&mut self, actions: Vec<Action>) {
        self.answering.perform(&actions);
        // The announcements are with the responders: the failovers among them end now.
        let gossip = &self.gossip;
        for (ip, from, took) in observe_takeovers(
            &actions,
            Instant::now(),
            |node| gossip.last_heard_before_down(node),
            &self.failovers,
        ) {
            tracing::info!(
                %ip,
                previous_owner = %from,
                failover_ms = took.map(|t| t.as_secs_f64() * 1000.0),
                "took over from a member that went down or left"
            );
        }
        let mut facts_changed = false;
        for action in actions {
            match action {
                Action::Silence { .. } | Action::Answer { .. } | Action::Announce { .. } => {}
                Action::Facts(facts) => {
                    tracing::info!(links = ?facts.links, unplaced = facts.unplaced.len(), "can announce on");
                    if regained(&self.local.meta().announce, &facts)
                        && self.local.restart_preempt_delay(Instant::now())
                    {
                        tracing::info!("a link can announce again: preempt delay starts again");
                    }
                    facts_changed |= self.local.set_announce(facts);
                }
                Action::Status { ip, view } => self.board.address(ip, view.as_ref()),
                Action::Notice(notice) => log(&notice),
                Action::Drained => self.drained = true,
            }
        }
        if facts_changed {
            self.publish_meta().await;
        }
    }

    /// Leaves the mesh and stops the responders.
    pub async fn stop(self) {
        if let Err(e) = self.gossip.leave().await {
            tracing::warn!(error = %e, "leaving the mesh");
        }
        self.answering.stop();
    }
}

/// Opens a responder on every link some IP is placed on, before any of them is needed: a new
/// owner then answers at once instead of opening its packet socket first (tens of
/// milliseconds), and conflicts on those links are seen all along.
fn open_placed(answering: &mut AnsweringLinks, engine: &Engine) {
    for link in engine.placed_links() {
        if let Err(e) = answering.open(&link) {
            tracing::warn!(error = %e, "cannot answer on a placed link yet");
        }
    }
}

/// Whether `next` can announce something `before` could not: a link back, or an IP placed
/// again.
fn regained(before: &AnnounceFacts, next: &AnnounceFacts) -> bool {
    !next.links.is_subset(&before.links) || !before.unplaced.is_subset(&next.unplaced)
}

fn log(notice: &Notice) {
    match notice {
        Notice::Conflict { ip, mac } => {
            tracing::warn!(%ip, other = %mac, "another MAC claims an address we own: re-announcing")
        }
        Notice::SuccessorAnnounced { ip, mac } => {
            tracing::info!(%ip, successor = %mac, "successor announced")
        }
        Notice::DrainDeadline { left } => {
            tracing::warn!(
                left,
                "drain deadline passed before every successor announced"
            )
        }
        Notice::Unplaced { ip, reason } => {
            tracing::warn!(%ip, reason = reason.as_str(), "owner, but no interface to announce on")
        }
        // Logged with its duration where it is timed (`Daemon::perform`).
        Notice::TookOver { .. } => {}
    }
}

/// Sleeps until `at`, or forever.
pub async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::membership::MemberMeta;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_joining_node_waits_for_every_record_and_the_settle_time() {
        let t0 = Instant::now();
        let mut hold = JoinHold::new(t0, false);
        let mut live = LiveSet::new();
        live.upsert(MemberMeta::new("a"));
        let mut placeholder = MemberMeta::new("b");
        placeholder.version = 0;
        live.upsert(placeholder);
        assert!(!hold.release(t0 + ms(10), Phase::Joining, &live));
        assert_eq!(hold.next_deadline(), Some(t0 + JOIN_GRACE));
        assert!(!hold.release(t0 + ms(20), Phase::Active, &live));
        assert_eq!(hold.next_deadline(), Some(t0 + ms(20) + JOIN_SETTLE));
        assert!(
            !hold.release(t0 + ms(500), Phase::Active, &live),
            "b's record is missing"
        );
        live.upsert(MemberMeta::new("b"));
        assert!(hold.release(t0 + ms(501), Phase::Active, &live));
        assert!(!hold.holding());
        assert!(!hold.release(t0 + ms(502), Phase::Active, &live), "once");
    }

    #[test]
    fn a_link_back_or_an_ip_placed_again_is_a_regain() {
        let ip: std::net::IpAddr = "192.0.2.1".parse().unwrap();
        let none = AnnounceFacts::default();
        let eth1 = AnnounceFacts {
            links: ["eth1".to_string()].into(),
            ..AnnounceFacts::default()
        };
        let unplaced = AnnounceFacts {
            unplaced: [ip].into(),
            ..AnnounceFacts::default()
        };
        assert!(regained(&none, &eth1));
        assert!(!regained(&eth1, &none), "a loss is not a regain");
        assert!(regained(&unplaced, &none));
        assert!(!regained(&none, &unplaced));
        assert!(!regained(&eth1, &eth1));
    }

    #[test]
    fn a_node_that_reaches_nobody_serves_after_the_grace_and_one_alone_at_once() {
        let t0 = Instant::now();
        let live = LiveSet::new();
        let mut hold = JoinHold::new(t0, false);
        assert!(!hold.release(t0 + JOIN_GRACE - ms(1), Phase::Joining, &live));
        assert!(hold.release(t0 + JOIN_GRACE, Phase::Joining, &live));
        assert!(!JoinHold::new(t0, true).holding());
    }

    #[test]
    fn a_pause_puts_the_hold_back_until_the_node_is_active_again() {
        let t0 = Instant::now();
        let live = LiveSet::new();
        let mut hold = JoinHold::new(t0, true);
        assert!(!hold.rearm(t0, Phase::Active));
        assert!(hold.rearm(t0 + ms(10), Phase::Paused));
        assert!(hold.holding());
        assert!(!hold.rearm(t0 + ms(20), Phase::Paused), "once per pause");
        assert!(!hold.release(t0 + ms(30), Phase::Paused, &live));
        assert!(!hold.release(t0 + ms(40), Phase::Active, &live));
        assert!(hold.release(t0 + ms(40) + JOIN_SETTLE, Phase::Active, &live));
    }
}
