//! The standalone speaker: VIP groups from a file, on plain Linux hosts.
//!
//! One task owns every state machine of the node and is fed by its inputs in turn (STYLE.md
//! practice 5): gossip changes, check results, the announcer's and the settle timers, conflicts
//! seen by the responders, SIGHUP and the shutdown signal. Each input runs the pure parts
//! ([`LocalState`], [`Election`], [`Announcer`]) and the loop only carries out their effects:
//! gossip the node's metadata, tell the responder threads what to answer and announce, run
//! notify hooks, publish `/status` and metrics.
//!
//! Start-up order: the VIPs go onto the holder interface and the ARP sysctls are set before the
//! first answer can be given (so the kernel never answers for a VIP); then the responders, the
//! gossip, the checks, the HTTP listener. Shutdown (SIGTERM): the node marks itself draining,
//! so the peers elect a successor at once; it keeps answering each VIP until the successor's
//! gratuitous ARP / NA is seen (a "conflict" from the successor's MAC) or the drain deadline
//! passes, then leaves the mesh, removes the addresses and exits. Every group goes to `fault`
//! when the drain starts (one notify call each); the queued calls run before the exit, within
//! [`EXIT_HOOK_DEADLINE`].
//!
//! Readiness ([`ready`], `/readyz` and `/status` `ready`): the node has joined the mesh (a member
//! acknowledged it: gossip phase `Active`) or its file lists no peers. A node that reaches none of
//! its peers stays not ready (`joining`) while it serves, alone, what it elects; one that loses
//! every member goes back to `joining`. `/status` names, for each VIP this node owns, the
//! interface it announces it on.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use swimlb_config::keyfile::parse_key_file;
use swimlb_config::standalone::{
    GossipSettings as GossipConfig, Profile as ConfigProfile, Standalone,
};
use swimlb_proto::ethernet::MacAddr;
use swimlb_proto::{KeyId, KeyRing};
use tokio::sync::{broadcast, mpsc, watch};
use tokio::time::Instant;

use crate::addresses::{self, Addresses, HolderKind};
use crate::announcer::{Announcer, Effect, Schedule};
use crate::checks::{CheckEvent, CheckKey, CheckTasks, Tls};
use crate::election::{Election, Verdict};
use crate::gossip::{self, GossipMetrics, GossipSettings, Phase, Profile, Timing};
use crate::http::{self, AddressStatus, CheckStatus, MemberStatus, Status};
use crate::interfaces::{self, Link, Route};
use crate::local::LocalState;
use crate::membership::{LiveChange, LiveSet};
use crate::notify::{GroupState, HookResult, Notifier};
use crate::packet_socket;
use crate::responder::{self, Conflict, Control, Owned, Responder};
use crate::snapshot::{Interface, ServedIp, Snapshot};

/// How long a draining speaker keeps answering at most, waiting for its successors.
pub const DRAIN_DEADLINE: Duration = Duration::from_secs(3);
/// Time a notify hook may run.
pub const NOTIFY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the speaker waits at exit for queued notify calls (the drain's `fault`).
pub const EXIT_HOOK_DEADLINE: Duration = Duration::from_secs(5);
/// After a conflict is answered with a burst, further conflicts for that IP are only counted
/// for this long.
pub const CONFLICT_HOLDOFF: Duration = Duration::from_secs(1);
/// A conflict for one IP is logged at most once per this interval.
pub const CONFLICT_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// When a conflict for one IP was last answered and last logged.
#[derive(Debug, Clone, Copy)]
struct ConflictGuard {
    reannounced: Option<Instant>,
    logged: Option<Instant>,
    /// A conflict came during the hold-off: re-announce when it ends, if still the owner.
    trailing: Option<Instant>,
}

/// Name of the interface holding the VIPs.
pub const HOLDER_NAME: &str = addresses::DEFAULT_DUMMY_NAME;

/// Why the speaker could not run.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// The key file could not be read or parsed.
    #[error("keyFile {path}: {message}")]
    Keys {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The key ring refused the keys.
    #[error("key ring: {0}")]
    KeyRing(swimlb_proto::Error),
    /// Gossip timings are invalid, or its socket could not be bound.
    #[error("gossip: {0}")]
    Gossip(#[from] gossip::GossipError),
    /// Addresses or sysctls could not be set.
    #[error("addresses: {0}")]
    Addresses(#[from] addresses::Error),
    /// Links and routes could not be read.
    #[error("interfaces: {0}")]
    Interfaces(#[from] interfaces::Error),
    /// An IP has no interface to announce on.
    #[error("{ip}: no interface to announce on: {reason}")]
    NoInterface {
        /// The IP.
        ip: IpAddr,
        /// Why.
        reason: &'static str,
    },
    /// A packet socket could not be opened.
    #[error("interface {iface}: packet socket: {source}")]
    PacketSocket {
        /// The interface.
        iface: String,
        /// The error.
        source: std::io::Error,
    },
    /// The HTTP listener could not be bound.
    #[error("listen {addr}: {source}")]
    Listen {
        /// The address.
        addr: std::net::SocketAddr,
        /// The error.
        source: std::io::Error,
    },
}

/// The key ring for `config`: from its key file, or the insecure well-known key.
pub fn key_ring(config: &Standalone) -> Result<KeyRing, DaemonError> {
    let keys = match &config.key_file {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| DaemonError::Keys {
                path: path.clone(),
                message: e.to_string(),
            })?;
            parse_key_file(&text).map_err(|errors| DaemonError::Keys {
                path: path.clone(),
                message: errors
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; "),
            })?
        }
        None => vec![insecure_key(&config.cluster)],
    };
    KeyRing::new(&config.cluster, &keys).map_err(DaemonError::KeyRing)
}

/// `insecure: true`: a key everybody can derive from the cluster name. Datagrams still carry
/// the envelope (so a misconfigured peer is rejected, not parsed), but they are not secret and
/// anyone on the network can forge them.
fn insecure_key(cluster: &str) -> [u8; 32] {
    let digest = ring_digest(format!("swimlb insecure key for {cluster}").as_bytes());
    let mut key = [0u8; 32];
    key.copy_from_slice(&digest);
    key
}

fn ring_digest(data: &[u8]) -> [u8; 32] {
    use sha2::Digest as _;
    sha2::Sha256::digest(data).into()
}

/// The gossip timings of `config`: the profile, then every override.
pub fn timing(config: &Standalone) -> Result<Timing, gossip::TimingError> {
    gossip_timing(&config.gossip)
}

/// The timings `g` describes: its profile, then every override, validated. The lab's `sim`
/// takes its flags through this too.
pub fn gossip_timing(g: &GossipConfig) -> Result<Timing, gossip::TimingError> {
    let profile = match g.profile {
        ConfigProfile::Fast => Profile::Fast,
        ConfigProfile::Lan => Profile::Lan,
    };
    let mut t = profile.timing();
    // Each override replaces the profile's value when the file sets it.
    fn set<T>(slot: &mut T, value: Option<T>) {
        if let Some(value) = value {
            *slot = value;
        }
    }
    let count = |n: std::num::NonZeroU32| n.get() as usize;
    set(&mut t.probe_period, g.probe_period);
    set(&mut t.probe_rtt, g.probe_rtt);
    set(&mut t.suspect_to_down_after, g.suspect_to_down);
    set(&mut t.gossip_period, g.periodic_gossip);
    set(&mut t.gossip_fanout, g.gossip_fanout.map(count));
    set(&mut t.indirect_probes, g.indirect_probes.map(count));
    // The config bounds it to 1..=255.
    set(
        &mut t.max_transmissions,
        g.max_transmissions
            .map(|n| u8::try_from(n.get()).unwrap_or(u8::MAX)),
    );
    set(&mut t.scale_suspicion, g.scale_suspicion);
    set(&mut t.scale_transmissions, g.scale_transmissions);
    set(&mut t.notify_suspects, g.notify_suspects);
    set(&mut t.notify_down_members, g.notify_down_members);
    set(&mut t.announce_down_period, g.announce_down_period);
    set(
        &mut t.announce_down_fanout,
        g.announce_down_fanout.map(count),
    );
    set(&mut t.announce_period, g.announce_period);
    set(&mut t.sync_period, g.sync_period);
    set(&mut t.join_retry, g.join_retry);
    set(&mut t.meta_refresh, g.meta_refresh);
    set(&mut t.max_packet_size, g.max_packet_size.map(count));
    t.validate()?;
    Ok(t)
}

/// What the election serves: every address of every group.
pub fn snapshot(config: &Standalone) -> Snapshot {
    let mut snapshot = Snapshot::new();
    for group in &config.groups {
        let iface = match &group.interface {
            Some(name) => Interface::Named(name.clone()),
            None => Interface::Default,
        };
        // A group moves as one: every address is ranked by the group's first address, so all
        // of them elect the same owner (keepalived's VRRP instance, MetalLB's first ingress IP).
        let order_ip = group.addresses.first().copied();
        for ip in &group.addresses {
            let mut served = ServedIp::group(group.name.clone(), iface.clone());
            served.order_ip = order_ip;
            // Duplicates across groups are rejected by the configuration's validation.
            let _ = snapshot.insert(*ip, served);
        }
    }
    snapshot
}

/// The announcement schedule of `config`.
pub fn schedule(config: &Standalone) -> Schedule {
    Schedule {
        burst: config.announce.burst.get(),
        second_burst_after: config.announce.second_burst_after,
        refresh: config.announce.refresh,
        ..Schedule::default()
    }
}

/// This node's name: the file's `node`, else the hostname.
pub fn node_name(config: &Standalone) -> String {
    config.node.clone().unwrap_or_else(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| "localhost".into())
    })
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AnnouncedLabels {
    ip: String,
    group_or_service: String,
    node: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CheckLabels {
    group: String,
    check: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OwnerLabels {
    ip: String,
    group_or_service: String,
    owner: String,
}

/// The daemon's own metrics (gossip and responder register theirs).
#[derive(Debug, Clone, Default)]
struct Metrics {
    announced: Family<AnnouncedLabels, Gauge>,
    owner: Family<OwnerLabels, Gauge>,
    check_up: Family<CheckLabels, Gauge>,
    notify_failures: prometheus_client::metrics::counter::Counter,
}

impl Metrics {
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "swimlb_announced",
            "1 while this node answers for the IP",
            self.announced.clone(),
        );
        registry.register(
            "swimlb_owner",
            "1 for the owner this node elected for each IP",
            self.owner.clone(),
        );
        registry.register(
            "swimlb_check_up",
            "1 while a health check passes on this node",
            self.check_up.clone(),
        );
        registry.register(
            "swimlb_notify_failures",
            "Notify hook calls that failed",
            self.notify_failures.clone(),
        );
    }
}

/// One interface the speaker answers on.
struct AnsweringLink {
    index: u32,
    mac: MacAddr,
    responder: Responder,
    owned: BTreeSet<IpAddr>,
}

/// Runs the standalone speaker until `shutdown` resolves (then drains) or a fatal error.
pub async fn run(
    config: Standalone,
    config_path: PathBuf,
    mut shutdown: impl std::future::Future<Output = ()> + Unpin,
    mut reload: mpsc::Receiver<()>,
) -> Result<(), DaemonError> {
    let node = node_name(&config);
    let ring = key_ring(&config)?;
    let mut ring_ids: Vec<KeyId> = ring.key_ids().collect();
    if config.insecure {
        tracing::warn!("insecure: gossip is neither secret nor authenticated");
    }
    let timing = timing(&config).map_err(gossip::GossipError::from)?;
    let mut registry = Registry::default();
    let gossip_metrics = GossipMetrics::register(&mut registry);
    let responder_metrics = responder::Metrics::default();
    responder_metrics.register(&mut registry);
    let metrics = Metrics::default();
    metrics.register(&mut registry);

    // Links and routes: which interface announces each VIP. Subscribe first so no change
    // between the snapshot and the loop is missed.
    let mut link_watch = interfaces::InterfaceWatch::subscribe()?;
    let (links, routes) = interfaces::snapshot().await?;
    let served = snapshot(&config);
    let placement = place(&served, &links, &routes)?;
    let announce_ifaces: Vec<String> = placement
        .values()
        .cloned()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();

    // The kernel must never answer for a VIP: sysctls and addresses before any responder.
    let vips: Vec<IpAddr> = served.iter().map(|(ip, _)| *ip).collect();
    let mut holder = match Addresses::setup(HOLDER_NAME, &vips, &announce_ifaces).await {
        // No dummy driver, or a holder a previous run (on such a kernel) left behind.
        Err(addresses::Error::KindUnsupported { .. })
        | Err(addresses::Error::NotDummy { kind: _, .. })
            if holder_is_ifb_or_missing().await =>
        {
            tracing::warn!(
                holder = HOLDER_NAME,
                "this kernel has no dummy links: holding the VIPs on an ifb link"
            );
            Addresses::setup_with(HolderKind::Ifb, HOLDER_NAME, &vips, &announce_ifaces).await?
        }
        other => other?,
    };

    let (conflict_tx, mut conflicts) = mpsc::unbounded_channel::<Conflict>();
    let mut answering: BTreeMap<String, AnsweringLink> = BTreeMap::new();
    for name in &announce_ifaces {
        let link = open_link(name, &links, responder_metrics.clone(), conflict_tx.clone())?;
        answering.insert(name.clone(), link);
    }

    let now = Instant::now();
    let mut local = LocalState::new(&node, &config, now);
    let settings = GossipSettings {
        node: node.clone(),
        addr: config.bind,
        seeds: config.peers.clone(),
        timing,
        bump: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(1),
        rng_seed: u64::from_le_bytes(
            ring_digest(node.as_bytes())[..8]
                .try_into()
                .unwrap_or([7; 8]),
        ) ^ std::process::id() as u64,
    };
    let gossip = gossip::spawn(
        settings,
        config.bind,
        ring,
        local.meta().clone(),
        gossip_metrics,
    )
    .await?;
    let mut changes = gossip.subscribe();
    let live_rx = gossip.live();
    let mut identity_rx = gossip.identity_changes();

    let (check_tx, mut check_events) = mpsc::channel::<CheckEvent>(64);
    let tls = Tls::new();
    let mut check_tasks = CheckTasks::start(&config, tls, check_tx);
    let mut last_outcome: BTreeMap<CheckKey, &'static str> = BTreeMap::new();

    let (hook_tx, mut hook_results) = mpsc::unbounded_channel::<(String, GroupState, HookResult)>();
    let mut notifiers = notifiers(&config, BTreeMap::new(), &hook_tx);
    let mut group_states: BTreeMap<String, GroupState> = BTreeMap::new();

    let live = live_rx.borrow().clone();
    let mut election = Election::new(node.clone(), served, &live);
    let mut announcer = Announcer::new(schedule(&config));
    let (status_tx, status_rx) = watch::channel(Status::default());
    let registry = Arc::new(registry);
    let (_http_addr, http_task) = http::spawn(config.listen, status_rx, registry.clone())
        .await
        .map_err(|source| DaemonError::Listen {
            addr: config.listen,
            source,
        })?;

    let mut config = config;
    let mut placement = placement;
    let effects = announcer.set_desired(Instant::now(), &election.desired());
    apply(&effects, &placement, &mut answering);
    let ctx = Publish {
        node: &node,
        metrics: &metrics,
        phase: gossip.phase(),
        alone: alone(&config),
    };
    let mut phase_rx = gossip.phase();
    publish(
        &ctx,
        &status_tx,
        &election,
        &live,
        &local,
        &config,
        &last_outcome,
        &placement,
        false,
    );
    update_groups(
        &config,
        &election,
        &local,
        &mut group_states,
        &notifiers,
        false,
    );

    let mut conflict_guard: BTreeMap<IpAddr, ConflictGuard> = BTreeMap::new();
    // The drain, once started: successors still to be seen, and the deadline.
    let mut draining: Option<(Instant, BTreeSet<IpAddr>)> = None;

    loop {
        let announce_at = announcer.next_deadline();
        let settle_at = local.settles_at();
        let drain_at = draining.as_ref().map(|(deadline, _)| *deadline);
        let trailing_at = conflict_guard.values().filter_map(|g| g.trailing).min();
        tokio::select! {
            _ = &mut shutdown, if draining.is_none() => {
                tracing::info!("draining: handing the VIPs over");
                local.drain();
                let _ = gossip.set_meta(local.meta().clone()).await;
                let owned: BTreeSet<IpAddr> = answering.values().flat_map(|l| l.owned.iter().copied()).collect();
                draining = Some((Instant::now() + DRAIN_DEADLINE, owned));
                // Every group goes to `fault`, one hook call each (later updates keep it there).
                update_groups(&config, &election, &local, &mut group_states, &notifiers, true);
                let live = live_rx.borrow().clone();
                publish(&ctx, &status_tx, &election, &live, &local, &config, &last_outcome, &placement, true);
                if draining.as_ref().is_some_and(|(_, left)| left.is_empty()) {
                    break;
                }
            }
            _ = sleep_until(drain_at) => {
                tracing::warn!("drain deadline passed before every successor announced");
                break;
            }
            change = changes.recv() => {
                let change = match change {
                    Ok(c) => Some(c),
                    Err(broadcast::error::RecvError::Lagged(n)) => {
                        tracing::warn!(missed = n, "gossip changes lagged: full re-election");
                        None
                    }
                    Err(broadcast::error::RecvError::Closed) => break,
                };
                match &change {
                    Some(LiveChange::Up(n)) => tracing::info!(member = %n, "member up"),
                    Some(LiveChange::Down(n)) => tracing::info!(member = %n, "member down"),
                    Some(LiveChange::Meta(n)) => tracing::debug!(member = %n, "member metadata changed"),
                    None => {}
                }
                let live = live_rx.borrow().clone();
                match &change {
                    Some(c) => {
                        let _ = election.apply_live(&live, c);
                    }
                    None => election = Election::new(node.clone(), election.snapshot().clone(), &live),
                }
                let now = Instant::now();
                let mut effects = Vec::new();
                if draining.is_none() {
                    effects = announcer.set_desired(now, &election.desired());
                    if matches!(change, Some(LiveChange::Up(_))) {
                        // A member (re)appeared, perhaps a healed partition: make sure it has
                        // our MAC for what we own.
                        effects.extend(announcer.member_joined(now));
                    }
                }
                apply(&effects, &placement, &mut answering);
                publish(&ctx, &status_tx, &election, &live, &local, &config, &last_outcome, &placement, draining.is_some());
                update_groups(&config, &election, &local, &mut group_states, &notifiers, draining.is_some());
            }
            Some(event) = check_events.recv() => {
                if !check_tasks.is_current(&event) {
                    // Sent by a task a reload stopped, before it stopped.
                    continue;
                }
                let CheckKey { group, check } = &event.key;
                tracing::info!(%group, %check, passing = event.passing, outcome = event.outcome.as_str(), "check changed");
                last_outcome.insert(event.key.clone(), event.outcome.as_str());
                if local.set_check(group, check, event.passing) {
                    let _ = gossip.set_meta(local.meta().clone()).await;
                }
                let live = live_rx.borrow().clone();
                publish(&ctx, &status_tx, &election, &live, &local, &config, &last_outcome, &placement, draining.is_some());
                update_groups(&config, &election, &local, &mut group_states, &notifiers, draining.is_some());
            }
            Ok(()) = phase_rx.changed() => {
                let phase = *phase_rx.borrow_and_update();
                tracing::info!(phase = phase.as_str(), "gossip phase");
                let live = live_rx.borrow().clone();
                publish(&ctx, &status_tx, &election, &live, &local, &config, &last_outcome, &placement, draining.is_some());
            }
            Ok(()) = identity_rx.changed() => {
                let bump = identity_rx.borrow_and_update().bump;
                tracing::info!(bump, "back in the cluster under a renewed identity: preempt delay starts again");
                local.rejoined(Instant::now());
                // The gossip core has already cleared `settled`; this sets it back when the node
                // has no preemption delay.
                let _ = gossip.set_meta(local.meta().clone()).await;
            }
            _ = sleep_until(settle_at) => {
                if local.tick(Instant::now()) {
                    tracing::info!("settled: may now take over from lower-priority owners");
                    let _ = gossip.set_meta(local.meta().clone()).await;
                }
            }
            _ = sleep_until(trailing_at) => {
                let now = Instant::now();
                let owned: BTreeSet<IpAddr> = announcer.answering().map(|(ip, _)| *ip).collect();
                let due: Vec<IpAddr> = conflict_guard
                    .iter()
                    .filter(|(_, g)| g.trailing.is_some_and(|t| t <= now))
                    .map(|(ip, _)| *ip)
                    .collect();
                for ip in due {
                    if let Some(g) = conflict_guard.get_mut(&ip) {
                        g.trailing = None;
                        if owned.contains(&ip) && draining.is_none() {
                            g.reannounced = Some(now);
                            let effects = announcer.conflict(now, ip);
                            apply(&effects, &placement, &mut answering);
                        }
                    }
                }
            }
            _ = sleep_until(announce_at) => {
                let effects = announcer.tick(Instant::now());
                apply(&effects, &placement, &mut answering);
            }
            Some(conflict) = conflicts.recv() => {
                if let Some((_, left)) = draining.as_mut() {
                    // The successor announced: stop answering for that IP now.
                    if left.remove(&conflict.ip) {
                        tracing::info!(ip = %conflict.ip, successor = %conflict.mac, "successor announced");
                        let desired: BTreeMap<IpAddr, Interface> = announcer
                            .answering()
                            .filter(|(ip, _)| left.contains(*ip))
                            .map(|(ip, i)| (*ip, i.clone()))
                            .collect();
                        let effects = announcer.set_desired(Instant::now(), &desired);
                        apply(&effects, &placement, &mut answering);
                    }
                    if left.is_empty() {
                        break;
                    }
                    continue;
                }
                // Two owners (a partition healing) each see the other's announcements as
                // conflicts: answering each one with a burst would feed a storm. One burst per
                // IP per hold-off, and one log line per IP per log interval.
                let now = Instant::now();
                let guard = conflict_guard.entry(conflict.ip).or_insert(ConflictGuard { reannounced: None, logged: None, trailing: None });
                if guard.logged.is_none_or(|t| now >= t + CONFLICT_LOG_INTERVAL) {
                    guard.logged = Some(now);
                    tracing::warn!(ip = %conflict.ip, other = %conflict.mac, "another MAC claims an address we own: re-announcing");
                }
                if guard.reannounced.is_none_or(|t| now >= t + CONFLICT_HOLDOFF) {
                    guard.reannounced = Some(now);
                    guard.trailing = None;
                    let effects = announcer.conflict(now, conflict.ip);
                    apply(&effects, &placement, &mut answering);
                } else if guard.trailing.is_none() {
                    // A claim during the hold-off still gets an answer when it ends, so the
                    // last word on the segment is the owner's (a node losing the IP may have
                    // claimed it once more before the gossip told it).
                    guard.trailing = guard.reannounced.map(|t| t + CONFLICT_HOLDOFF);
                }
            }
            changed = link_watch.changed() => {
                if let Err(e) = changed {
                    tracing::warn!(error = %e, "link and route notifications stopped; interface changes need a restart");
                    link_watch = interfaces::InterfaceWatch::subscribe()?;
                    continue;
                }
                let (links, routes) = match interfaces::snapshot().await {
                    Ok(snapshot) => snapshot,
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot read links and routes");
                        continue;
                    }
                };
                let next = place_lenient(election.snapshot(), &links, &routes);
                // Interfaces that went away or were re-created: their responders stop.
                answering.retain(|name, link| {
                    let alive = links.iter().any(|l| &l.name == name && l.index == link.index && l.up);
                    if !alive {
                        tracing::warn!(interface = %name, "interface gone or down: no longer answering on it");
                    }
                    alive
                });
                for name in next.values().collect::<BTreeSet<_>>() {
                    if !answering.contains_key(name) {
                        match open_link(name, &links, responder_metrics.clone(), conflict_tx.clone()) {
                            Ok(link) => {
                                answering.insert(name.clone(), link);
                            }
                            Err(e) => tracing::warn!(interface = %name, error = %e, "cannot answer on it"),
                        }
                    }
                }
                let ifaces: Vec<String> = next.values().cloned().collect::<BTreeSet<_>>().into_iter().collect();
                let vips: Vec<IpAddr> = election.snapshot().iter().map(|(ip, _)| *ip).collect();
                if let Err(e) = holder.reload(&vips, &ifaces).await {
                    tracing::warn!(error = %e, "cannot set the ARP sysctls on a new interface");
                }
                // Owned IPs whose interface changed move to the new one and are announced there.
                rehome(&announcer, &placement, &next, &BTreeSet::new(), &mut answering);
                placement = next;
                let live = live_rx.borrow().clone();
                publish(&ctx, &status_tx, &election, &live, &local, &config, &last_outcome, &placement, draining.is_some());
            }
            Some((group, state, result)) = hook_results.recv() => {
                if result != HookResult::Ok {
                    metrics.notify_failures.inc();
                    tracing::warn!(%group, state = state.as_str(), result = result.as_str(), "notify hook failed");
                }
            }
            Some(()) = reload.recv(), if draining.is_none() => {
                match reload_config(&config_path) {
                    Ok(next) if next.cluster == config.cluster && next.bind == config.bind => {
                        for field in restart_only_changes(&config, &next) {
                            tracing::warn!(field, "reload: this change needs a restart and is not applied");
                        }
                        let next_ring = match key_ring(&next) {
                            Ok(ring) => ring,
                            Err(e) => {
                                tracing::error!(error = %e, "reload refused: keys");
                                continue;
                            }
                        };
                        let Ok((links, routes)) = interfaces::snapshot().await else {
                            tracing::error!("reload refused: cannot read links and routes");
                            continue;
                        };
                        let served = snapshot(&next);
                        match place(&served, &links, &routes) {
                            Ok(next_placement) => {
                                let ifaces: Vec<String> = next_placement.values().cloned().collect::<BTreeSet<_>>().into_iter().collect();
                                let vips: Vec<IpAddr> = served.iter().map(|(ip, _)| *ip).collect();
                                if let Err(e) = holder.reload(&vips, &ifaces).await {
                                    tracing::error!(error = %e, "reload refused: addresses");
                                    continue;
                                }
                                for name in &ifaces {
                                    if !answering.contains_key(name) {
                                        match open_link(name, &links, responder_metrics.clone(), conflict_tx.clone()) {
                                            Ok(link) => {
                                                answering.insert(name.clone(), link);
                                            }
                                            Err(e) => tracing::error!(interface = %name, error = %e, "cannot answer on it"),
                                        }
                                    }
                                }
                                // Unchanged checks keep running with their state; the others
                                // start failing, and so does what we gossip for them.
                                let unchanged = check_tasks.reload(&next);
                                last_outcome.retain(|key, _| unchanged.contains(key));
                                if local.reload(&next, &unchanged) {
                                    let _ = gossip.set_meta(local.meta().clone()).await;
                                }
                                let live = live_rx.borrow().clone();
                                let _ = election.apply_snapshot(served, &live);
                                let effects = announcer.set_desired(Instant::now(), &election.desired());
                                // What stops is answered where it was placed; what starts, where
                                // it is placed now. Owned IPs whose interface changed move.
                                let (stops, starts): (Vec<Effect>, Vec<Effect>) = effects
                                    .into_iter()
                                    .partition(|e| matches!(e, Effect::StopAnswering { .. }));
                                apply(&stops, &placement, &mut answering);
                                apply(&starts, &next_placement, &mut answering);
                                let started: BTreeSet<IpAddr> = starts
                                    .iter()
                                    .filter_map(|e| match e {
                                        Effect::StartAnswering { ip, .. } => Some(*ip),
                                        _ => None,
                                    })
                                    .collect();
                                rehome(&announcer, &placement, &next_placement, &started, &mut answering);
                                placement = next_placement;
                                notifiers = self::notifiers(&next, std::mem::take(&mut notifiers), &hook_tx);
                                group_states.retain(|name, _| next.groups.iter().any(|g| &g.name == name));
                                config = next;
                                publish(&ctx, &status_tx, &election, &live, &local, &config, &last_outcome, &placement, false);
                                update_groups(&config, &election, &local, &mut group_states, &notifiers, false);
                                let next_ids: Vec<KeyId> = next_ring.key_ids().collect();
                                if next_ids != ring_ids {
                                    // Rotation: the first key seals from now on; peers are
                                    // still answered with the key they use while it is here.
                                    let sealing = next_ring.sealing_key_id();
                                    let _ = gossip.set_key_ring(next_ring).await;
                                    tracing::info!(keys = next_ids.len(), %sealing, "gossip keys replaced");
                                    ring_ids = next_ids;
                                }
                                tracing::info!("configuration reloaded");
                            }
                            Err(e) => tracing::error!(error = %e, "reload refused"),
                        }
                    }
                    Ok(_) => tracing::error!("reload refused: cluster and bind cannot change without a restart"),
                    Err(e) => tracing::error!(error = %e, "reload refused: invalid configuration"),
                }
            }
        }
    }

    // Leave: peers see us go at once. Then stop answering and clean up.
    let _ = gossip.leave().await;
    check_tasks.stop();
    for (_, link) in answering {
        link.responder.stop();
    }
    http_task.abort();
    // The drain's `fault` calls are queued: let them run, within a deadline.
    let hooks_deadline = Instant::now() + EXIT_HOOK_DEADLINE;
    for (group, (_, notifier)) in notifiers {
        if !notifier.finish(hooks_deadline).await {
            tracing::warn!(%group, "notify hook still running at exit: killed");
        }
    }
    holder.teardown().await?;
    tracing::info!("stopped");
    Ok(())
}

/// Whether the holder link is absent or an ifb link (ours, from a run on a kernel without the
/// dummy driver). Any other link of that name is not ours to take over.
async fn holder_is_ifb_or_missing() -> bool {
    match interfaces::snapshot().await {
        Ok((links, _)) => match links.iter().find(|l| l.name == HOLDER_NAME) {
            None => true,
            Some(l) => l.kind.as_deref() == Some("ifb"),
        },
        Err(_) => false,
    }
}

/// The settings a reload does not apply (the gossip socket, its peers and timings, the HTTP
/// listener, the node name) that differ between `running` and `next`.
fn restart_only_changes(running: &Standalone, next: &Standalone) -> Vec<&'static str> {
    let mut changed = Vec::new();
    if next.node != running.node {
        changed.push("node");
    }
    if next.peers != running.peers {
        changed.push("peers");
    }
    if next.gossip != running.gossip {
        changed.push("gossip");
    }
    if next.listen != running.listen {
        changed.push("listen");
    }
    changed
}

fn reload_config(path: &Path) -> Result<Standalone, String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    Standalone::parse(&text).map_err(|e| e.to_string())
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The interface of every IP: the named one, or the one with a connected route to it.
fn place(
    served: &Snapshot,
    links: &[Link],
    routes: &[Route],
) -> Result<BTreeMap<IpAddr, String>, DaemonError> {
    let mut placement = BTreeMap::new();
    for (ip, entry) in served.iter() {
        let named = match &entry.interface {
            Interface::Named(n) => Some(n.as_str()),
            Interface::Default => None,
        };
        let link = interfaces::choose(*ip, named, links, routes).map_err(|reason| {
            DaemonError::NoInterface {
                ip: *ip,
                reason: reason.as_str(),
            }
        })?;
        placement.insert(*ip, link.name.clone());
    }
    Ok(placement)
}

/// Like [`place`], but an IP without an interface is left out (and logged) instead of failing:
/// at run time a missing interface must not stop the other VIPs.
fn place_lenient(served: &Snapshot, links: &[Link], routes: &[Route]) -> BTreeMap<IpAddr, String> {
    let mut placement = BTreeMap::new();
    for (ip, entry) in served.iter() {
        let named = match &entry.interface {
            Interface::Named(n) => Some(n.as_str()),
            Interface::Default => None,
        };
        match interfaces::choose(*ip, named, links, routes) {
            Ok(link) => {
                placement.insert(*ip, link.name.clone());
            }
            Err(reason) => {
                tracing::warn!(%ip, reason = reason.as_str(), "no interface to announce on")
            }
        }
    }
    placement
}

fn open_link(
    name: &str,
    links: &[Link],
    metrics: responder::Metrics,
    conflicts: mpsc::UnboundedSender<Conflict>,
) -> Result<AnsweringLink, DaemonError> {
    let link = links
        .iter()
        .find(|l| l.name == name)
        .ok_or(DaemonError::NoInterface {
            ip: IpAddr::from([0, 0, 0, 0]),
            reason: "named_missing",
        })?;
    let iface = pnet_datalink::interfaces()
        .into_iter()
        .find(|i| i.index == link.index)
        .ok_or(DaemonError::NoInterface {
            ip: IpAddr::from([0, 0, 0, 0]),
            reason: "named_missing",
        })?;
    let channel = packet_socket::open(&iface, Duration::from_millis(50)).map_err(|source| {
        DaemonError::PacketSocket {
            iface: name.to_string(),
            source,
        }
    })?;
    let [a, b, c, d, e, f] = link.mac;
    let mac = MacAddr(a, b, c, d, e, f);
    let responder = Responder::spawn(
        name,
        mac,
        channel.tx,
        channel.rx,
        Some(channel.membership),
        metrics,
        conflicts,
    )
    .map_err(|source| DaemonError::PacketSocket {
        iface: name.to_string(),
        source,
    })?;
    tracing::info!(interface = name, %mac, "answering ARP and neighbor solicitations");
    Ok(AnsweringLink {
        index: link.index,
        mac,
        responder,
        owned: BTreeSet::new(),
    })
}

/// Carries out the announcer's effects on the responder threads.
fn apply(
    effects: &[Effect],
    placement: &BTreeMap<IpAddr, String>,
    answering: &mut BTreeMap<String, AnsweringLink>,
) {
    let mut touched: BTreeSet<String> = BTreeSet::new();
    for effect in effects {
        let (Effect::StartAnswering { ip, .. }
        | Effect::StopAnswering { ip, .. }
        | Effect::Announce { ip, .. }) = effect;
        let Some(name) = placement.get(ip) else {
            continue;
        };
        let Some(link) = answering.get_mut(name) else {
            continue;
        };
        match effect {
            Effect::StartAnswering { .. } => {
                link.owned.insert(*ip);
                touched.insert(name.clone());
                tracing::info!(%ip, interface = %name, mac = %link.mac, "now owner");
            }
            Effect::StopAnswering { .. } => {
                link.owned.remove(ip);
                // Stopping is immediate: tell the thread before anything else happens.
                link.responder
                    .send(Control::SetOwned(Owned::new(link.owned.iter().copied())));
                tracing::info!(%ip, interface = %name, "no longer owner");
            }
            Effect::Announce { .. } => {
                if touched.remove(name) {
                    link.responder
                        .send(Control::SetOwned(Owned::new(link.owned.iter().copied())));
                }
                link.responder.send(Control::Announce(*ip));
            }
        }
    }
    for name in touched {
        if let Some(link) = answering.get(&name) {
            link.responder
                .send(Control::SetOwned(Owned::new(link.owned.iter().copied())));
        }
    }
}

/// The notify hooks of `config`. A group whose program did not change keeps its notifier from
/// `previous`, so its calls stay in order across a reload.
fn notifiers(
    config: &Standalone,
    mut previous: BTreeMap<String, (PathBuf, Notifier)>,
    done: &mpsc::UnboundedSender<(String, GroupState, HookResult)>,
) -> BTreeMap<String, (PathBuf, Notifier)> {
    config
        .groups
        .iter()
        .filter_map(|g| {
            let program = g.notify.clone()?;
            let notifier = match previous.remove(&g.name) {
                Some((old, notifier)) if old == program => notifier,
                _ => Notifier::spawn(
                    program.clone(),
                    g.name.clone(),
                    NOTIFY_TIMEOUT,
                    done.clone(),
                ),
            };
            Some((g.name.clone(), (program, notifier)))
        })
        .collect()
}

/// Moves the IPs this node answers for whose link changed from `before` to `after` (a route or
/// a reload placed them elsewhere), and announces them there. `skip`: IPs just started on their
/// new link.
fn rehome(
    announcer: &Announcer,
    before: &BTreeMap<IpAddr, String>,
    after: &BTreeMap<IpAddr, String>,
    skip: &BTreeSet<IpAddr>,
    answering: &mut BTreeMap<String, AnsweringLink>,
) {
    let owned: Vec<IpAddr> = announcer.answering().map(|(ip, _)| *ip).collect();
    for ip in owned {
        let (old_if, new_if) = (before.get(&ip), after.get(&ip));
        if old_if == new_if || skip.contains(&ip) {
            continue;
        }
        if let Some(link) = old_if.and_then(|n| answering.get_mut(n)) {
            link.owned.remove(&ip);
            link.responder
                .send(Control::SetOwned(Owned::new(link.owned.iter().copied())));
        }
        if let Some(link) = new_if.and_then(|n| answering.get_mut(n)) {
            link.owned.insert(ip);
            link.responder
                .send(Control::SetOwned(Owned::new(link.owned.iter().copied())));
            link.responder.send(Control::Announce(ip));
            tracing::info!(%ip, interface = ?new_if, "announcing on a new interface");
        }
    }
}

/// Each group's state on this node, and a notify call for each change.
fn update_groups(
    config: &Standalone,
    election: &Election,
    local: &LocalState,
    states: &mut BTreeMap<String, GroupState>,
    notifiers: &BTreeMap<String, (PathBuf, Notifier)>,
    draining: bool,
) {
    for group in &config.groups {
        let owns = group
            .addresses
            .iter()
            .any(|ip| election.owner(ip) == Some(election.local()));
        let fault = local
            .meta()
            .groups
            .get(&group.name)
            .is_some_and(|h| h.checks.iter().any(|c| c.weight == 0 && !c.passing));
        // A draining node is handing its groups over: `fault` at once, even while it still
        // answers for them until the successor has announced.
        let state = if draining {
            GroupState::Fault
        } else if owns {
            GroupState::Owner
        } else if fault {
            GroupState::Fault
        } else {
            GroupState::Backup
        };
        if states.insert(group.name.clone(), state) != Some(state) {
            tracing::info!(group = %group.name, state = state.as_str(), "group state");
            if let Some((_, n)) = notifiers.get(&group.name) {
                n.notify(state);
            }
        }
    }
}

struct Publish<'a> {
    node: &'a str,
    metrics: &'a Metrics,
    /// The gossip's phase, for readiness.
    phase: watch::Receiver<Phase>,
    /// Configured without peers.
    alone: bool,
}

/// Whether a file describes a node with no peers to join (only itself, if anything).
fn alone(config: &Standalone) -> bool {
    config.peers.iter().all(|p| *p == config.bind)
}

/// Readiness (`/readyz`, `/status` `ready`): the node has joined the mesh (gossip phase
/// `Active`: a member acknowledged it), or it has no peers to join. A node whose peers are all
/// unreachable stays `joining` (not ready) although it serves what it elects, alone: its view of
/// the cluster is unconfirmed. Draining is reported on its own.
pub fn ready(phase: Phase, alone: bool) -> bool {
    match phase {
        Phase::Active => true,
        Phase::Joining => alone,
        Phase::Left => false,
    }
}

/// Refreshes `/status` and the owner gauges.
#[allow(clippy::too_many_arguments)]
fn publish(
    ctx: &Publish<'_>,
    status: &watch::Sender<Status>,
    election: &Election,
    live: &LiveSet,
    local: &LocalState,
    config: &Standalone,
    outcomes: &BTreeMap<CheckKey, &'static str>,
    placement: &BTreeMap<IpAddr, String>,
    draining: bool,
) {
    let verdicts = election.verdicts(live);
    ctx.metrics.announced.clear();
    ctx.metrics.owner.clear();
    let mut addresses = Vec::new();
    for (ip, served) in election.snapshot().iter() {
        let owner = election.owner(ip).map(str::to_string);
        let verdict = verdicts.get(ip).map(Verdict::as_str).unwrap_or("unknown");
        if let Some(o) = &owner {
            ctx.metrics
                .owner
                .get_or_create(&OwnerLabels {
                    ip: ip.to_string(),
                    group_or_service: served.belongs_to.clone(),
                    owner: o.clone(),
                })
                .set(1);
        }
        if owner.as_deref() == Some(ctx.node) && !draining {
            ctx.metrics
                .announced
                .get_or_create(&AnnouncedLabels {
                    ip: ip.to_string(),
                    group_or_service: served.belongs_to.clone(),
                    node: ctx.node.to_string(),
                })
                .set(1);
        }
        // Where this node announces it, when it owns it.
        let interface = (owner.as_deref() == Some(ctx.node))
            .then(|| placement.get(ip).cloned())
            .flatten();
        addresses.push(AddressStatus {
            ip: ip.to_string(),
            group: served.belongs_to.clone(),
            owner,
            verdict: verdict.to_string(),
            interface,
        });
    }
    let mut checks = Vec::new();
    for group in &config.groups {
        for (c, check) in group.checks.iter().enumerate() {
            let passing = local
                .meta()
                .groups
                .get(&group.name)
                .and_then(|h| h.checks.get(c))
                .is_some_and(|r| r.passing);
            ctx.metrics
                .check_up
                .get_or_create(&CheckLabels {
                    group: group.name.clone(),
                    check: check.name.clone(),
                })
                .set(i64::from(passing));
            checks.push(CheckStatus {
                group: group.name.clone(),
                check: check.name.clone(),
                passing,
                last: outcomes
                    .get(&CheckKey::new(&group.name, &check.name))
                    .copied()
                    .unwrap_or("none")
                    .to_string(),
            });
        }
    }
    let members = live
        .iter()
        .map(|m| MemberStatus {
            node: m.node.clone(),
            settled: m.settled,
            draining: m.draining,
        })
        .collect();
    status.send_replace(Status {
        node: ctx.node.to_string(),
        ready: ready(*ctx.phase.borrow(), ctx.alone),
        draining,
        members,
        addresses,
        checks,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(extra: &str) -> Standalone {
        Standalone::parse(&format!(
            "cluster: lab\nnode: n1\nbind: 192.0.2.10\ninsecure: true\n{extra}groups: [{{name: api, addresses: [192.0.2.100, '2001:db8::100'], interface: eth0}}, {{name: web, addresses: [192.0.2.101]}}]"
        ))
        .unwrap()
    }

    #[test]
    fn snapshot_has_every_address_with_its_group_and_interface() {
        let s = snapshot(&config(""));
        assert_eq!(s.len(), 3);
        let api = s.get(&"2001:db8::100".parse().unwrap()).unwrap();
        assert_eq!(api.group.as_deref(), Some("api"));
        assert_eq!(api.interface, Interface::Named("eth0".into()));
        assert_eq!(
            s.get(&"192.0.2.101".parse().unwrap()).unwrap().interface,
            Interface::Default
        );
    }

    #[test]
    fn every_address_of_a_group_elects_the_same_owner() {
        use crate::membership::{GroupHealth, LiveSet, MemberMeta};
        let config = config("");
        let mut live = LiveSet::new();
        for n in ["n1", "n2", "n3", "n4", "n5"] {
            let mut m = MemberMeta::new(n);
            m.settled = true;
            for g in ["api", "web"] {
                m.groups.insert(
                    g.into(),
                    GroupHealth {
                        priority: 100,
                        checks: vec![],
                    },
                );
            }
            live.upsert(m);
        }
        let election = Election::new("n1", snapshot(&config), &live);
        let a = election.owner(&"192.0.2.100".parse().unwrap());
        let b = election.owner(&"2001:db8::100".parse().unwrap());
        assert!(a.is_some());
        assert_eq!(a, b);
    }

    #[test]
    fn a_reload_names_the_changes_it_does_not_apply() {
        let running = config("");
        assert!(restart_only_changes(&running, &config("")).is_empty());
        let next = config("gossip: {probePeriod: 300ms}\n");
        assert_eq!(restart_only_changes(&running, &next), ["gossip"]);
    }

    #[test]
    fn timing_overrides_apply_and_bad_combinations_are_refused() {
        let t = timing(&config("gossip: {probePeriod: 300ms}\n")).unwrap();
        assert_eq!(t.probe_period, Duration::from_millis(300));
        let t = timing(&config(
            "gossip: {profile: lan, indirectProbes: 5, maxTransmissions: 12, scaleSuspicion: false, notifyDownMembers: true, announceDownPeriod: 1s, announceDownFanout: 2, syncPeriod: 0s, joinRetry: 100ms, maxPacketSize: 1200}\n",
        ))
        .unwrap();
        assert_eq!(
            (
                t.indirect_probes,
                t.max_transmissions,
                t.scale_suspicion,
                t.notify_down_members
            ),
            (5, 12, false, true)
        );
        assert_eq!(
            (
                t.announce_down_period,
                t.announce_down_fanout,
                t.sync_period,
                t.join_retry,
                t.max_packet_size
            ),
            (
                Duration::from_secs(1),
                2,
                Duration::ZERO,
                Duration::from_millis(100),
                1200
            )
        );
        assert!(timing(&config("gossip: {maxPacketSize: 100}\n")).is_err());
        assert!(timing(&config("gossip: {probePeriod: 100ms, probeRtt: 200ms}\n")).is_err());
    }

    #[test]
    fn insecure_rings_of_one_cluster_interoperate_and_differ_across_clusters() {
        let a = key_ring(&config("")).unwrap();
        let b = key_ring(&config("")).unwrap();
        let mut sealed = Vec::new();
        a.seal(b"hello", &mut sealed).unwrap();
        assert_eq!(b.open(&mut sealed).unwrap(), b"hello");
        assert_ne!(insecure_key("lab"), insecure_key("other"));
    }

    #[test]
    fn ready_once_joined_or_when_configured_alone() {
        assert!(ready(Phase::Active, false));
        assert!(!ready(Phase::Joining, false), "peers not reached yet");
        assert!(ready(Phase::Joining, true), "nobody to join");
        assert!(!ready(Phase::Left, true));
        assert!(alone(&config("")));
        assert!(alone(&config("peers: [192.0.2.10:7946]\n")), "only itself");
        assert!(!alone(&config("peers: [192.0.2.11:7946]\n")));
    }

    #[test]
    fn schedule_follows_the_file() {
        let s = schedule(&config("announce: {burst: 3, secondBurstAfter: off}\n"));
        assert_eq!((s.burst, s.second_burst_after), (3, None));
    }
}
