//! The VRRP task: the sockets of every interface a VRRP group uses, one [`Router`] per group
//! and family, the advertisements the owner sends, and the set of yielded addresses it reports.
//!
//! The standalone source hands it a [`Plan`] after every input (which groups this node answers
//! for, with its priority); the task reports the addresses to yield whenever that set changes.
//! Reading happens on one thread per interface and family (a blocking raw socket with a read
//! timeout); everything else on the task, so the state has one owner.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family as MetricFamily;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until};

use super::socket::{self, Advert, DropReason, Family, Sender};
use super::{Master, Router, master_down_interval};

/// What the task needs to know of one group and family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouterPlan {
    /// The group.
    pub group: String,
    /// The family.
    pub family: Family,
    /// The VRID.
    pub vrid: u8,
    /// The advertisement interval, in centiseconds.
    pub interval_centis: u16,
    /// The interface (`None`: none to speak on).
    pub ifname: Option<String>,
    /// The group's addresses of this family.
    pub addresses: Vec<IpAddr>,
    /// This node's VRRP priority for the group.
    pub priority: u8,
    /// This node answers for the group: it advertises.
    pub advertise: bool,
    /// The election names this node for the group, answering or not (a yield): it claims the
    /// group before a winning router's Master_Down_Interval ends (see [`CLAIM`]).
    pub elected: bool,
    /// The gossip addresses of the other members the election counts alive: an advertisement
    /// from one of them is a fellow speaker's, forgotten at once when it leaves this set (see
    /// the module docs of [`crate::vrrp`]).
    pub speakers: BTreeSet<IpAddr>,
}

impl RouterPlan {
    fn interval(&self) -> Duration {
        super::interval_of(self.interval_centis)
    }
}

/// Every VRRP group and family of the file, in order.
pub type Plan = Vec<RouterPlan>;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouterLabels {
    group: String,
    family: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DropLabels {
    reason: &'static str,
}

/// The reasons a VRRP frame is dropped for ([`swimlb_proto::Error::as_str`] of what the
/// parsers return, and `no_address`).
pub const DROP_REASONS: [&str; 11] = [
    "hop_limit",
    "vrrp_version",
    "vrrp_type",
    "vrrp_address_count",
    "truncated",
    "bad_checksum",
    "malformed_ip_header",
    "bad_ipv4_header_checksum",
    "ip_protocol",
    "out_of_range",
    "no_address",
];

/// The VRRP metrics.
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    sent: MetricFamily<RouterLabels, Counter>,
    received: MetricFamily<RouterLabels, Counter>,
    dropped: MetricFamily<DropLabels, Counter>,
    foreign: MetricFamily<RouterLabels, Gauge>,
}

impl Metrics {
    /// Registers them into `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "swimlb_vrrp_adverts_sent",
            "VRRPv3 advertisements this node sent, by group and family (priority 0 included)",
            self.sent.clone(),
        );
        registry.register(
            "swimlb_vrrp_adverts_received",
            "Valid VRRPv3 advertisements heard for a group's VRID, by group and family",
            self.received.clone(),
        );
        registry.register(
            "swimlb_vrrp_dropped",
            "VRRP frames dropped by the checks (TTL, version, length, checksum), by reason",
            self.dropped.clone(),
        );
        registry.register(
            "swimlb_vrrp_foreign_master",
            "1 while a VRRP router that wins against this node by VRRP's rule advertises for the \
             group (keepalived, or on a speaker that does not own the group, its owner)",
            self.foreign.clone(),
        );
        // Every reason's series exists at 0 from the start (see the standalone source's
        // reload failures).
        for reason in DROP_REASONS {
            let _ = self.dropped.get_or_create(&DropLabels { reason });
        }
    }
}

/// The handle the standalone source keeps.
#[derive(Debug)]
pub struct VrrpHandle {
    plan: watch::Sender<Plan>,
    sources: watch::Receiver<BTreeSet<IpAddr>>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

/// Starts the task; returns its handle and the yielded addresses (every address of the plan's
/// routers at first: a router listens before it may answer).
pub fn spawn(plan: Plan, metrics: Metrics) -> (VrrpHandle, watch::Receiver<BTreeSet<IpAddr>>) {
    let first: BTreeSet<IpAddr> = plan.iter().flat_map(|p| p.addresses.clone()).collect();
    let (yield_tx, yield_rx) = watch::channel(first);
    let (plan_tx, plan_rx) = watch::channel(plan);
    let (stop_tx, stop_rx) = oneshot::channel();
    let (sources_tx, sources) = watch::channel(BTreeSet::new());
    let task = tokio::spawn(run(plan_rx, yield_tx, sources_tx, stop_rx, metrics));
    let handle = VrrpHandle {
        plan: plan_tx,
        sources,
        stop: Some(stop_tx),
        task,
    };
    (handle, yield_rx)
}

impl VrrpHandle {
    /// Hands the task the plan now (nothing happens when it did not change).
    pub fn update(&self, plan: Plan) {
        self.plan.send_if_modified(|old| {
            let changed = *old != plan;
            *old = plan;
            changed
        });
    }

    /// The addresses this node sends advertisements from, every interface and family (an IPv6
    /// router's is the interface's link-local address): the member gossips them, so the other
    /// speakers tell its advertisements from a foreign router's (see [`crate::vrrp`]).
    pub fn sources(&self) -> watch::Receiver<BTreeSet<IpAddr>> {
        self.sources.clone()
    }

    /// Sends priority 0 for every group advertised, and stops the task.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = tokio::time::timeout(Duration::from_secs(1), &mut self.task).await;
        self.task.abort();
    }
}

/// How long before a winning router's Master_Down_Interval ends the speaker the election names
/// claims the group: it sends its advertisement then, still silent, and answers when the
/// interval ends. A keepalived backup of the same priority counts the same Master_Down_Interval
/// from the same last advertisement: without the claim it becomes master at the same moment as
/// the speaker, and its gratuitous ARPs (five back to back) race the speaker's announcements
/// for the clients' neighbour entries; the owner's conflict damping ([`crate::model::engine`])
/// answers the later claims only after its hold-off, a second of dark VIP. Hearing the claim
/// first, such a backup stays backup. A router that is alive after all ignores a lower claim
/// and keeps the group with its next advertisement; a backup of a higher priority does not
/// wait for it (its own interval is shorter) and takes the group by VRRP's rule. At most one
/// advertisement interval ahead.
pub const CLAIM: Duration = Duration::from_millis(20);

/// One router's state on the task.
struct State {
    router: Router,
    plan: RouterPlan,
    listening_until: Instant,
    next_advert: Option<Instant>,
    yielding: bool,
    /// The last advertisement of the winner this node claimed the group against (one claim
    /// per silence).
    claimed: Option<Instant>,
}

impl State {
    /// When this node claims the group against `winner` (see [`CLAIM`]), unless it did.
    fn claim_at(&self, winner: Option<&Master>) -> Option<Instant> {
        let w = winner.filter(|_| self.plan.elected)?;
        if self.claimed == Some(w.heard) {
            return None;
        }
        let ahead = CLAIM.min(self.plan.interval());
        Some(w.down_at(self.plan.priority) - ahead)
    }
}

/// The sockets of one interface and family.
struct Io {
    sender: Option<Sender>,
    reading: Arc<AtomicBool>,
}

impl Drop for Io {
    fn drop(&mut self) {
        self.reading.store(false, Ordering::Relaxed);
    }
}

type Key = (String, Family);
type Heard = (String, Family, Result<Advert, DropReason>);

struct Task {
    routers: BTreeMap<Key, State>,
    io: BTreeMap<(String, Family), Io>,
    heard_tx: mpsc::Sender<Heard>,
    metrics: Metrics,
}

async fn run(
    mut plan: watch::Receiver<Plan>,
    yielded: watch::Sender<BTreeSet<IpAddr>>,
    sources: watch::Sender<BTreeSet<IpAddr>>,
    mut stop: oneshot::Receiver<()>,
    metrics: Metrics,
) {
    let (heard_tx, mut heard) = mpsc::channel(256);
    let mut task = Task {
        routers: BTreeMap::new(),
        io: BTreeMap::new(),
        heard_tx,
        metrics,
    };
    let first = plan.borrow_and_update().clone();
    task.apply(Instant::now(), first);
    loop {
        // Settled first: the plan may have arrived before the task ran, and the addresses
        // yielded while the routers listen must reach the source before anything else.
        let set = task.settle(Instant::now());
        yielded.send_if_modified(|old| {
            let changed = *old != set;
            *old = set;
            changed
        });
        let from = task.sources();
        sources.send_if_modified(|old| {
            let changed = *old != from;
            *old = from;
            changed
        });
        let deadline = task.next_deadline();
        tokio::select! {
            _ = &mut stop => {
                task.give_up_all();
                return;
            }
            Ok(()) = plan.changed() => {
                let next = plan.borrow_and_update().clone();
                task.apply(Instant::now(), next);
            }
            Some((ifname, family, result)) = heard.recv() => {
                task.heard(Instant::now(), &ifname, family, result);
            }
            _ = sleep_until(deadline.unwrap_or_else(|| Instant::now() + Duration::from_secs(3600))) => {}
        }
    }
}

impl Task {
    fn apply(&mut self, now: Instant, plan: Plan) {
        let mut keep = BTreeSet::new();
        for p in plan {
            let key = (p.group.clone(), p.family);
            keep.insert(key.clone());
            if let Some(ifname) = &p.ifname {
                self.open(ifname, p.family);
            }
            let lost = self
                .routers
                .get(&key)
                .filter(|st| st.plan.advertise && !p.advertise && !st.yielding)
                .map(|st| st.plan.clone());
            if let Some(old) = lost {
                // It lost the group: the keepalived routers need not wait.
                self.give_up(&key, &old);
            }
            match self.routers.get_mut(&key) {
                Some(state) => {
                    forget_departed(state, &p);
                    if !state.plan.advertise && p.advertise {
                        state.next_advert = Some(now);
                    }
                    state.plan = p;
                }
                None => {
                    let listening_until = now + master_down_interval(p.priority, p.interval());
                    self.routers.insert(
                        key,
                        State {
                            router: Router::default(),
                            next_advert: p.advertise.then_some(now),
                            plan: p,
                            listening_until,
                            yielding: true,
                            claimed: None,
                        },
                    );
                }
            }
        }
        self.routers.retain(|k, _| keep.contains(k));
        let used: BTreeSet<(String, Family)> = self
            .routers
            .values()
            .filter_map(|s| Some((s.plan.ifname.clone()?, s.plan.family)))
            .collect();
        self.io.retain(|k, _| used.contains(k));
    }

    /// Opens the sockets of `ifname` and `family` unless open (a sender that could not be
    /// opened is tried again with the next plan).
    fn open(&mut self, ifname: &str, family: Family) {
        let key = (ifname.to_string(), family);
        if self.io.get(&key).is_some_and(|io| io.sender.is_some()) {
            return;
        }
        let Ok(ifindex) = nix::net::if_::if_nametoindex(ifname) else {
            tracing::warn!(interface = ifname, "vrrp: no such interface");
            return;
        };
        if !self.io.contains_key(&key) {
            let reading = Arc::new(AtomicBool::new(true));
            match socket::receiver(ifname, ifindex, family) {
                Ok(receiver) => spawn_reader(
                    receiver,
                    ifname.to_string(),
                    family,
                    reading.clone(),
                    self.heard_tx.clone(),
                ),
                Err(e) => {
                    tracing::warn!(interface = ifname, family = family.as_str(), error = %e, "vrrp: cannot listen");
                    reading.store(false, Ordering::Relaxed);
                }
            }
            self.io.insert(
                key.clone(),
                Io {
                    sender: None,
                    reading,
                },
            );
        }
        let sender = socket::source_address(ifname, family).and_then(|src| {
            socket::sender(ifname, ifindex, src)
                .inspect_err(|e| {
                    tracing::warn!(interface = ifname, family = family.as_str(), error = %e, "vrrp: cannot send");
                })
                .ok()
        });
        if let Some(io) = self.io.get_mut(&key) {
            io.sender = sender;
        }
    }

    fn heard(
        &mut self,
        now: Instant,
        ifname: &str,
        family: Family,
        result: Result<Advert, DropReason>,
    ) {
        let advert = match result {
            Ok(a) => a,
            Err(reason) => {
                self.metrics
                    .dropped
                    .get_or_create(&DropLabels { reason })
                    .inc();
                return;
            }
        };
        let own = self
            .io
            .get(&(ifname.to_string(), family))
            .and_then(|io| io.sender.as_ref())
            .map(Sender::src);
        if own == Some(advert.src) {
            return;
        }
        for state in self.routers.values_mut() {
            let p = &state.plan;
            if p.family == family && p.vrid == advert.vrid && p.ifname.as_deref() == Some(ifname) {
                self.metrics.received.get_or_create(&labels(p)).inc();
                state
                    .router
                    .heard(now, advert.src, advert.priority, advert.interval_centis);
            }
        }
    }

    /// Forgets silent senders, sends what is due, and returns the yielded addresses.
    fn settle(&mut self, now: Instant) -> BTreeSet<IpAddr> {
        let mut yielded = BTreeSet::new();
        let keys: Vec<Key> = self.routers.keys().cloned().collect();
        for key in keys {
            let own = self.own_address(&key);
            let state = self.routers.get_mut(&key).expect("present");
            let priority = state.plan.priority;
            state.router.expire(now, priority);
            let winner = state.router.winner(priority, own);
            let was = state.yielding;
            state.yielding = winner.is_some() || now < state.listening_until;
            if let Some((_, m)) = winner
                && state.claim_at(Some(&m)).is_some_and(|at| at <= now)
            {
                // The claim: the backups of the VRID hear it before they count the winner
                // down (see CLAIM).
                state.claimed = Some(m.heard);
                let plan = state.plan.clone();
                self.send(&plan, plan.priority);
            }
            let state = self.routers.get_mut(&key).expect("present");
            if state.yielding
                && !was
                && let Some((addr, m)) = winner
            {
                tracing::info!(group = %state.plan.group, family = state.plan.family.as_str(), master = %addr, priority = m.priority, "vrrp: a router outside the mesh holds the group");
            } else if was && !state.yielding {
                tracing::info!(group = %state.plan.group, family = state.plan.family.as_str(), "vrrp: no router outside the mesh holds the group");
            }
            self.metrics
                .foreign
                .get_or_create(&labels(&state.plan))
                .set(i64::from(winner.is_some()));
            if state.yielding {
                yielded.extend(state.plan.addresses.iter().copied());
            }
            let due = state.next_advert.is_some_and(|t| t <= now);
            if state.plan.advertise && !state.yielding && due {
                state.next_advert = Some(now + state.plan.interval());
                let plan = state.plan.clone();
                self.send(&plan, plan.priority);
            } else if !state.plan.advertise {
                state.next_advert = None;
            }
        }
        yielded
    }

    /// The addresses the open senders send from.
    fn sources(&self) -> BTreeSet<IpAddr> {
        self.io
            .values()
            .filter_map(|io| io.sender.as_ref().map(Sender::src))
            .collect()
    }

    fn own_address(&self, key: &Key) -> Option<IpAddr> {
        let state = self.routers.get(key)?;
        let ifname = state.plan.ifname.clone()?;
        self.io
            .get(&(ifname, state.plan.family))?
            .sender
            .as_ref()
            .map(Sender::src)
    }

    fn next_deadline(&self) -> Option<Instant> {
        self.routers
            .iter()
            .flat_map(|(key, s)| {
                let winner = s.router.winner(s.plan.priority, self.own_address(key));
                [
                    s.router.next_deadline(s.plan.priority),
                    s.next_advert,
                    (s.listening_until > Instant::now()).then_some(s.listening_until),
                    s.claim_at(winner.as_ref().map(|(_, m)| m)),
                ]
            })
            .flatten()
            .min()
    }

    fn send(&self, plan: &RouterPlan, priority: u8) {
        let Some(ifname) = &plan.ifname else { return };
        let Some(sender) = self
            .io
            .get(&(ifname.clone(), plan.family))
            .and_then(|io| io.sender.as_ref())
        else {
            return;
        };
        match sender.send(plan.vrid, priority, plan.interval_centis, &plan.addresses) {
            Ok(()) => {
                self.metrics.sent.get_or_create(&labels(plan)).inc();
            }
            Err(e) => {
                tracing::warn!(group = %plan.group, error = %e, "vrrp: advertisement not sent");
            }
        }
    }

    fn give_up(&self, key: &Key, plan: &RouterPlan) {
        tracing::info!(group = %key.0, family = key.1.as_str(), "vrrp: priority 0, the group given up");
        self.send(plan, 0);
    }

    fn give_up_all(&self) {
        for (key, state) in &self.routers {
            if state.plan.advertise && !state.yielding {
                self.give_up(key, &state.plan);
            }
        }
    }
}

/// Forgets the advertisements of the fellow speakers that left the election since the last
/// plan: the mesh declared them dead, their Master_Down_Interval is not waited for.
fn forget_departed(state: &mut State, next: &RouterPlan) {
    for gone in state.plan.speakers.difference(&next.speakers) {
        if state.router.forget(gone) {
            tracing::info!(group = %next.group, family = next.family.as_str(), speaker = %gone, "vrrp: a fellow speaker left the mesh: its advertisements forgotten");
        }
    }
}

fn labels(plan: &RouterPlan) -> RouterLabels {
    RouterLabels {
        group: plan.group.clone(),
        family: plan.family.as_str(),
    }
}

fn spawn_reader(
    receiver: socket::Receiver,
    ifname: String,
    family: Family,
    reading: Arc<AtomicBool>,
    tx: mpsc::Sender<Heard>,
) {
    let name = format!("vrrp-{ifname}-{}", family.as_str());
    let spawned = std::thread::Builder::new().name(name).spawn(move || {
        while reading.load(Ordering::Relaxed) && !tx.is_closed() {
            match receiver.read() {
                Ok(None) => {}
                Ok(Some(result)) => {
                    // Full: the task is behind; the next advertisement comes an interval later.
                    let _ = tx.try_send((ifname.clone(), family, result));
                }
                Err(e) => {
                    tracing::warn!(interface = %ifname, error = %e, "vrrp: read failed");
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        }
    });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "vrrp: no reading thread");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(elected: bool) -> State {
        State {
            router: Router::default(),
            plan: RouterPlan {
                group: "vip".into(),
                family: Family::V4,
                vrid: 51,
                interval_centis: 10,
                ifname: None,
                addresses: vec!["198.51.100.100".parse().unwrap()],
                priority: 100,
                advertise: false,
                elected,
                speakers: BTreeSet::new(),
            },
            listening_until: Instant::now(),
            next_advert: None,
            yielding: true,
            claimed: None,
        }
    }

    #[test]
    fn the_elected_speaker_claims_once_per_silence_ahead_of_master_down() {
        let t0 = Instant::now();
        let keepalived = Master {
            priority: 101,
            interval: Duration::from_millis(100),
            heard: t0,
        };
        let down = keepalived.down_at(100);
        let mut s = state(true);
        assert_eq!(s.claim_at(Some(&keepalived)), Some(down - CLAIM));
        assert_eq!(s.claim_at(None), None);
        // Claimed against this silence: not again, until the winner is heard again.
        s.claimed = Some(t0);
        assert_eq!(s.claim_at(Some(&keepalived)), None);
        let again = Master {
            heard: t0 + Duration::from_millis(100),
            ..keepalived
        };
        assert_eq!(s.claim_at(Some(&again)), Some(again.down_at(100) - CLAIM));
        // Only the speaker the election names claims.
        assert_eq!(state(false).claim_at(Some(&keepalived)), None);
        // Never more than one interval ahead.
        let mut fast = state(true);
        fast.plan.interval_centis = 1;
        let quick = Master {
            interval: Duration::from_millis(10),
            ..keepalived
        };
        assert_eq!(
            fast.claim_at(Some(&quick)),
            Some(quick.down_at(100) - Duration::from_millis(10))
        );
    }

    #[test]
    fn a_fellow_speakers_link_local_advertisement_goes_with_it_and_a_foreign_ones_stays() {
        let now = Instant::now();
        let fellow: IpAddr = "fe80::3".parse().unwrap();
        let keepalived: IpAddr = "fe80::1".parse().unwrap();
        let local: IpAddr = "fe80::2".parse().unwrap();
        let mut s = state(true);
        s.plan.family = Family::V6;
        s.plan.addresses = vec!["2001:db8:100::100".parse().unwrap()];
        // The fellow's record announced its link-local source: it is one of the speakers.
        s.plan.speakers = [fellow, "198.51.100.13".parse().unwrap()].into();
        s.router.heard(now, fellow, 120, 20);
        assert_eq!(s.router.winner(100, Some(local)).map(|w| w.0), Some(fellow));
        // The mesh declares it dead: its advertisement is forgotten at once.
        let mut next = s.plan.clone();
        next.speakers = ["198.51.100.12".parse().unwrap()].into();
        forget_departed(&mut s, &next);
        assert_eq!(s.router.winner(100, Some(local)), None);
        // keepalived's (a source no member announces) keeps its VRRP meaning when the plan
        // changes.
        s.plan = next.clone();
        s.router.heard(now, keepalived, 150, 10);
        next.speakers.clear();
        forget_departed(&mut s, &next);
        assert_eq!(
            s.router.winner(100, Some(local)).map(|w| w.0),
            Some(keepalived)
        );
    }
}
