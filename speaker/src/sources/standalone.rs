//! The standalone source: VIP groups from a file, on plain Linux hosts.
//!
//! A mode is a source of inputs for the shared [`Engine`](crate::model::engine::Engine), run by the
//! shared drivers ([`Daemon`]). This module owns what only the standalone mode has: the file
//! (turned into a [`Snapshot`]), this node's record (priorities, check results, `settled`), the
//! health checks, the notify hooks, SIGHUP reloads, and the VIPs on a dummy link with the ARP
//! sysctls that keep the kernel from answering for them. Its loop only reads inputs and calls
//! one handler per input; every decision is the engine's.
//!
//! Start-up order: the VIPs go onto the holder interface and the ARP sysctls are set before the
//! first answer can be given (so the kernel never answers for a VIP); then the responders, the
//! gossip, the checks, the HTTP listener. A starting node answers nothing until it has joined the
//! mesh and holds every member's record ([`JoinHold`]), so two nodes never answer for one VIP
//! while the mesh forms. Shutdown (SIGTERM): the node marks itself draining, so the peers elect a
//! successor at once; it keeps answering each VIP until the successor's gratuitous ARP / NA is
//! seen or the drain deadline passes, then leaves the mesh, removes the addresses and exits.
//! Every group goes to `fault` when the drain starts (one notify call each); the queued calls run
//! before the exit, within [`EXIT_HOOK_DEADLINE`].
//!
//! Readiness ([`ready`], `/readyz` and `/status` `ready`): the node has joined the mesh (a member
//! acknowledged it: gossip phase `Active`) or its file lists no peers. A node that reaches none of
//! its peers stays not ready (`joining`) while it serves, alone, what it elects; one that loses
//! every member goes back to `joining`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use swimlb_config::keyfile::{parse_key_file, read_key_file};
use swimlb_config::standalone::{ScriptUser, Standalone};
use swimlb_proto::{KeyId, KeyRing};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::gossip::metadata::MAX_META_RECORD_LEN;
use crate::gossip::{self, GossipMetrics, GossipSettings, Phase, Timing};
use crate::model::announcer::Schedule;
use crate::model::engine::Input;
use crate::model::engine::placement::Placement;
use crate::model::links::{Link, Route};
use crate::model::local::CheckKey;
use crate::model::local::LocalState;
use crate::model::snapshot::{Interfaces, ServedIp, Snapshot};
use crate::net::addresses::{self, Addresses, HolderKind};
use crate::net::netlink;
use crate::run::daemon::{Daemon, NetWatch};
use crate::run::driver::{self, Instruments, Parts, Shared};
use crate::run::hold::JoinHold;
use crate::serve::http::{self, CheckStatus};
use crate::sources::checks::{CheckEvent, CheckTasks, Tls};
use crate::sources::notify::{GroupState, HookResult, Notifier};
use crate::sources::ready;
use crate::vrrp::task::VrrpHandle;

mod metrics;

use metrics::{CheckLabels, Metrics};

/// Time a notify hook may run.
pub const NOTIFY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the speaker waits at exit for queued notify calls (the drain's `fault`).
pub const EXIT_HOOK_DEADLINE: Duration = Duration::from_secs(5);

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
    Interfaces(#[from] netlink::Error),
    /// An exec check's or notify hook's program or user was refused
    /// ([`crate::sources::scripts::vet`]).
    #[error("{}", .0.join("; "))]
    Scripts(Vec<String>),
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
            let text = read_key_file(path).map_err(|e| DaemonError::Keys {
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
pub(crate) fn insecure_key(cluster: &str) -> [u8; 32] {
    let digest = ring_digest(format!("swimlb insecure key for {cluster}").as_bytes());
    let mut key = [0u8; 32];
    key.copy_from_slice(&digest);
    key
}

pub(crate) fn ring_digest(data: &[u8]) -> [u8; 32] {
    use sha2::Digest as _;
    sha2::Sha256::digest(data).into()
}

/// The gossip timings of `config`: the profile, then every override.
pub fn timing(config: &Standalone) -> Result<Timing, gossip::TimingError> {
    Timing::from_settings(&config.gossip)
}

/// What the election serves: every address of every group.
pub fn snapshot(config: &Standalone) -> Snapshot {
    let mut snapshot = Snapshot::new();
    for group in &config.groups {
        let interfaces = Interfaces::named(group.interface.iter().cloned());
        // A group moves as one: every address is ranked by the group's first address, so all
        // of them elect the same owner (keepalived's VRRP instance, MetalLB's first ingress IP).
        let order_ip = group.addresses.first().copied();
        for ip in &group.addresses {
            let mut served = ServedIp::group(group.name.clone(), interfaces.clone());
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

/// Why a reload was refused: the speaker keeps serving what it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReloadFailure {
    /// The file cannot be read.
    Unreadable,
    /// The file does not validate.
    Invalid,
    /// `cluster` or `bind` changed: only a restart applies them.
    RestartOnly,
    /// The key file cannot be read or holds a bad line, or the key ring refuses the keys, or
    /// the gossip could not take them.
    Keys,
    /// This node's gossip record would outgrow what the gossip carries.
    GossipRecord,
    /// The VIPs could not be put on the holder link, or the ARP sysctls set.
    Addresses,
}

impl ReloadFailure {
    /// Every reason.
    pub const ALL: [ReloadFailure; 6] = [
        ReloadFailure::Unreadable,
        ReloadFailure::Invalid,
        ReloadFailure::RestartOnly,
        ReloadFailure::Keys,
        ReloadFailure::GossipRecord,
        ReloadFailure::Addresses,
    ];

    /// The metric label.
    pub const fn as_str(&self) -> &'static str {
        match self {
            ReloadFailure::Unreadable => "unreadable",
            ReloadFailure::Invalid => "invalid",
            ReloadFailure::RestartOnly => "restart_only",
            ReloadFailure::Keys => "keys",
            ReloadFailure::GossipRecord => "gossip_record",
            ReloadFailure::Addresses => "addresses",
        }
    }
}

/// The file at `path` as a reload would apply it over `running`, with its key ring; or why the
/// reload is refused, with what to log. Reads the file and the key file, nothing else.
pub fn prepare_reload(
    running: &Standalone,
    path: &Path,
) -> Result<(Standalone, KeyRing), (ReloadFailure, String)> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        (
            ReloadFailure::Unreadable,
            format!("{}: {e}", path.display()),
        )
    })?;
    let next = Standalone::parse(&text).map_err(|e| (ReloadFailure::Invalid, e.to_string()))?;
    let next = crate::sources::scripts::vet_to_run(&next)
        .map_err(|problems| (ReloadFailure::Invalid, problems.join("\n")))?;
    if next.cluster != running.cluster || next.bind != running.bind {
        return Err((
            ReloadFailure::RestartOnly,
            "cluster and bind cannot change without a restart".to_string(),
        ));
    }
    let ring = key_ring(&next).map_err(|e| (ReloadFailure::Keys, e.to_string()))?;
    let len = crate::sources::config_report::largest_record(&next);
    if len > MAX_META_RECORD_LEN {
        return Err((
            ReloadFailure::GossipRecord,
            format!(
                "this node's gossip record could reach {len} bytes, more than {MAX_META_RECORD_LEN}"
            ),
        ));
    }
    Ok((next, ring))
}

/// The receivers the loop waits on (kept apart from [`Source`] so its handlers can borrow it
/// mutably while the loop polls these).
/// The standalone source's own inputs (beside the shared ones, [`Shared`]).
struct Inputs {
    check_events: mpsc::Receiver<CheckEvent>,
    hook_results: mpsc::UnboundedReceiver<(String, GroupState, HookResult)>,
    /// SIGHUP.
    reload: mpsc::Receiver<()>,
    /// The addresses a VRRP router outside the mesh holds.
    vrrp: watch::Receiver<BTreeSet<IpAddr>>,
    /// The addresses this node sends VRRP advertisements from (gossiped).
    vrrp_sources: watch::Receiver<BTreeSet<IpAddr>>,
}

/// One of the standalone source's own inputs.
enum Own {
    Check(CheckEvent),
    HookDone((String, GroupState, HookResult)),
    Reload,
    Yield(BTreeSet<IpAddr>),
    VrrpSources(BTreeSet<IpAddr>),
}

/// The standalone mode's state around the shared [`Daemon`].
struct Source {
    config: Standalone,
    path: PathBuf,
    daemon: Daemon,
    holder: Addresses,
    checks: CheckTasks,
    last_outcome: BTreeMap<CheckKey, &'static str>,
    notifiers: BTreeMap<String, (Hook, Notifier)>,
    hook_tx: mpsc::UnboundedSender<(String, GroupState, HookResult)>,
    group_states: BTreeMap<String, GroupState>,
    metrics: Metrics,
    ring_ids: Vec<KeyId>,
    /// The links and routes last dumped (a reload places the new file on them).
    net: watch::Receiver<(Vec<Link>, Vec<Route>)>,
    http: JoinHandle<()>,
    vrrp: Option<VrrpHandle>,
}

/// Runs the standalone speaker until `shutdown` resolves (then drains) or a fatal error.
pub async fn run(
    config: Standalone,
    config_path: PathBuf,
    shutdown: impl std::future::Future<Output = ()> + Unpin,
    reload: mpsc::Receiver<()>,
) -> Result<(), DaemonError> {
    let (mut source, mut shared, mut inputs) = Source::start(config, config_path, reload).await?;
    driver::run(&mut source, &mut shared, &mut inputs, shutdown).await;
    source.stop().await
}

impl driver::Source for Source {
    type Inputs = Inputs;
    type Event = Own;

    fn daemon(&mut self) -> &mut Daemon {
        &mut self.daemon
    }

    async fn next(inputs: &mut Inputs, draining: bool) -> Own {
        tokio::select! {
            Some(event) = inputs.check_events.recv() => Own::Check(event),
            Some(result) = inputs.hook_results.recv() => Own::HookDone(result),
            Some(()) = inputs.reload.recv(), if !draining => Own::Reload,
            Ok(()) = inputs.vrrp.changed() => Own::Yield(inputs.vrrp.borrow_and_update().clone()),
            Ok(()) = inputs.vrrp_sources.changed() => {
                Own::VrrpSources(inputs.vrrp_sources.borrow_and_update().clone())
            }
            else => std::future::pending().await,
        }
    }

    async fn handle(&mut self, event: Own) {
        match event {
            Own::Check(event) => self.check(event).await,
            Own::HookDone(result) => self.hook_done(result),
            Own::Reload => self.reload().await,
            Own::Yield(ips) => {
                tracing::debug!(addresses = ips.len(), "vrrp: addresses yielded");
                self.daemon.handle(Input::Yield(ips)).await
            }
            Own::VrrpSources(sources) => {
                if self.daemon.local.set_vrrp_sources(sources) {
                    self.daemon.publish_meta().await;
                }
            }
        }
    }

    fn ready(&self, phase: Phase) -> bool {
        ready(phase, alone(&self.config))
    }

    /// The ARP sysctls follow the announcing links.
    async fn net_changed(&mut self, _links: &[Link]) {
        let ifaces: Vec<String> = self.daemon.engine.placed_links().into_iter().collect();
        let vips: Vec<IpAddr> = self
            .daemon
            .engine
            .election()
            .snapshot()
            .iter()
            .map(|(ip, _)| *ip)
            .collect();
        if let Err(e) = self.holder.reload(&vips, &ifaces).await {
            tracing::warn!(error = %e, "cannot set the ARP sysctls on a new interface");
        }
    }

    fn after(&mut self) {
        self.update_groups();
        if let Some(vrrp) = &self.vrrp {
            vrrp.update(crate::sources::vrrp::plan(
                &self.config,
                &self.daemon,
                &self.net,
            ));
        }
    }
}

impl Source {
    /// Builds everything in start-up order (see the module docs).
    async fn start(
        config: Standalone,
        path: PathBuf,
        reload: mpsc::Receiver<()>,
    ) -> Result<(Source, Shared, Inputs), DaemonError> {
        let config = crate::sources::scripts::vet_to_run(&config).map_err(DaemonError::Scripts)?;
        let node = node_name(&config);
        let ring = key_ring(&config)?;
        let ring_ids: Vec<KeyId> = ring.key_ids().collect();
        if config.insecure {
            tracing::warn!("insecure: gossip is neither secret nor authenticated");
        }
        let timing = timing(&config).map_err(gossip::GossipError::from)?;
        let mut instruments = Instruments::register(&node);
        let metrics = Metrics::default();
        metrics.register(&mut instruments.registry);
        let vrrp_metrics = crate::vrrp::task::Metrics::default();
        vrrp_metrics.register(&mut instruments.registry);

        let (net, links, routes) = NetWatch::start().await?;
        let served = snapshot(&config);
        let placement = Placement::new(&served, links.clone(), routes.clone());
        let announce_links: Vec<String> = placement.used_links().into_iter().collect();
        // The kernel must never answer for a VIP: sysctls and addresses before any responder.
        let vips: Vec<IpAddr> = served.iter().map(|(ip, _)| *ip).collect();
        let holder = hold_vips(&vips, &announce_links).await?;

        let mut local = LocalState::new(&node, &config, Instant::now());
        local.set_announce(placement.facts(&served));
        let watch_knobs = timing.owner_watch;
        let watch_ring = ring.duplicate();
        let gossip = spawn_gossip(&config, &node, timing, ring, &local, instruments.gossip).await?;
        let alone = alone(&config);
        let net_view = net.subscribe();
        let http_status = instruments.board.subscribe();
        let http_metrics = instruments.board.listener_metrics();
        let parts = Parts {
            local,
            schedule: schedule(&config),
            snapshot: served,
            links,
            routes,
            net,
            hold: JoinHold::new(Instant::now(), alone),
            board: instruments.board,
            failovers: instruments.failovers,
            responder: instruments.responder,
            watch: instruments.watch,
            watch_knobs,
            watch_ring,
        };
        let (daemon, shared) = driver::assemble(&node, gossip, parts).await;

        let (check_tx, check_events) = mpsc::channel(64);
        let checks = CheckTasks::start(&config, Tls::new(), check_tx);
        let (hook_tx, hook_results) = mpsc::unbounded_channel();
        let notifiers = notifiers(&config, BTreeMap::new(), &hook_tx);
        let (_, http) = http::spawn(
            config.listen,
            http_status,
            Arc::new(instruments.registry),
            http_metrics,
        )
        .await
        .map_err(|source| DaemonError::Listen {
            addr: config.listen,
            source,
        })?;
        // Every VRRP group's addresses yielded until its router has listened (see crate::vrrp).
        let (vrrp, yielded) = crate::vrrp::task::spawn(Vec::new(), vrrp_metrics);
        let inputs = Inputs {
            check_events,
            hook_results,
            reload,
            vrrp: yielded,
            vrrp_sources: vrrp.sources(),
        };
        let mut source = Source {
            config,
            path,
            daemon,
            holder,
            checks,
            last_outcome: BTreeMap::new(),
            notifiers,
            hook_tx,
            group_states: BTreeMap::new(),
            metrics,
            ring_ids,
            net: net_view,
            http,
            vrrp: Some(vrrp),
        };
        let first: BTreeSet<IpAddr> = source
            .config
            .groups
            .iter()
            .filter(|g| g.vrrp.is_some())
            .flat_map(|g| g.addresses.iter().copied())
            .collect();
        source.daemon.handle(Input::Yield(first)).await;
        driver::Source::after(&mut source);
        let ready = ready(*shared.phase.borrow(), alone);
        source.daemon.board.update(|s| s.ready = ready);
        source.daemon.check_hold().await;
        source.publish_checks();
        source.update_groups();
        Ok((source, shared, inputs))
    }

    async fn check(&mut self, event: CheckEvent) {
        if !self.checks.is_current(&event) {
            // Sent by a task a reload stopped, before it stopped.
            return;
        }
        let CheckKey { group, check } = &event.key;
        tracing::info!(%group, %check, passing = event.passing, outcome = event.outcome.as_str(), "check changed");
        self.last_outcome
            .insert(event.key.clone(), event.outcome.as_str());
        if self.daemon.local.set_check(group, check, event.passing) {
            self.daemon.publish_meta().await;
        }
        self.publish_checks();
    }

    fn hook_done(&mut self, (group, state, result): (String, GroupState, HookResult)) {
        if result != HookResult::Ok {
            self.metrics.notify_failures.inc();
            tracing::warn!(%group, state = state.as_str(), result = result.as_str(), "notify hook failed");
        }
    }

    /// SIGHUP: read the file again and apply what can change without a restart.
    async fn reload(&mut self) {
        let (next, next_ring) = match prepare_reload(&self.config, &self.path) {
            Ok(prepared) => prepared,
            Err((reason, error)) => {
                tracing::error!(reason = reason.as_str(), %error, "reload refused: serving the configuration already running");
                self.metrics.reload_failed(reason);
                return;
            }
        };
        for field in restart_only_changes(&self.config, &next) {
            tracing::warn!(
                field,
                "reload: this change needs a restart and is not applied"
            );
        }
        let served = snapshot(&next);
        let (links, routes) = self.net.borrow().clone();
        let ifaces: Vec<String> = Placement::new(&served, links, routes)
            .used_links()
            .into_iter()
            .collect();
        let vips: Vec<IpAddr> = served.iter().map(|(ip, _)| *ip).collect();
        if let Err(e) = self.holder.reload(&vips, &ifaces).await {
            tracing::error!(reason = ReloadFailure::Addresses.as_str(), error = %e, "reload refused: serving the configuration already running");
            self.metrics.reload_failed(ReloadFailure::Addresses);
            return;
        }
        // Unchanged checks keep running with their state; the others start failing, and so does
        // what we gossip for them.
        let unchanged = self.checks.reload(&next);
        self.last_outcome.retain(|key, _| unchanged.contains(key));
        if self.daemon.local.reload(&next, &unchanged) {
            self.daemon.publish_meta().await;
        }
        self.daemon.handle(Input::Snapshot(served)).await;
        self.notifiers = notifiers(&next, std::mem::take(&mut self.notifiers), &self.hook_tx);
        self.group_states
            .retain(|name, _| next.groups.iter().any(|g| &g.name == name));
        self.config = next;
        self.publish_checks();
        if self.rotate_keys(next_ring).await {
            self.metrics.reload_applied();
        } else {
            self.metrics.reload_failed(ReloadFailure::Keys);
        }
        tracing::info!("configuration reloaded");
    }

    /// Rotation: the first key seals from now on; peers are still answered with the key they
    /// use while it is here.
    /// Returns whether the gossip holds `ring`'s keys now.
    async fn rotate_keys(&mut self, ring: KeyRing) -> bool {
        let ids: Vec<KeyId> = ring.key_ids().collect();
        if ids == self.ring_ids {
            return true;
        }
        let sealing = ring.sealing_key_id();
        match self.daemon.set_key_ring(ring).await {
            Ok(()) => {
                tracing::info!(keys = ids.len(), %sealing, "gossip keys replaced");
                self.ring_ids = ids;
                true
            }
            Err(e) => {
                tracing::error!(error = %e, "gossip keys not replaced");
                false
            }
        }
    }

    /// Each group's state on this node, and a notify call for each change.
    fn update_groups(&mut self) {
        let draining = self.daemon.engine.draining();
        let election = self.daemon.engine.election();
        for group in &self.config.groups {
            let owns = group.addresses.iter().any(|ip| election.owns(ip));
            let fault = self
                .daemon
                .local
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
            if self.group_states.insert(group.name.clone(), state) != Some(state) {
                tracing::info!(group = %group.name, state = state.as_str(), "group state");
                if let Some((_, n)) = self.notifiers.get(&group.name) {
                    n.notify(state);
                }
            }
        }
    }

    /// The checks in `/status` and `swimlb_check_up`.
    fn publish_checks(&self) {
        let mut checks = Vec::new();
        for group in &self.config.groups {
            let results = self.daemon.local.meta().groups.get(&group.name);
            for (c, check) in group.checks.iter().enumerate() {
                let passing = results
                    .and_then(|h| h.checks.get(c))
                    .is_some_and(|r| r.passing);
                self.metrics
                    .check_up
                    .get_or_create(&CheckLabels {
                        group: group.name.clone(),
                        check: check.name.clone(),
                    })
                    .set(i64::from(passing));
                let last = self
                    .last_outcome
                    .get(&CheckKey::new(&group.name, &check.name))
                    .copied()
                    .unwrap_or("none");
                checks.push(CheckStatus {
                    group: group.name.clone(),
                    check: check.name.clone(),
                    passing,
                    last: last.to_string(),
                });
            }
        }
        self.daemon.board.update(|s| s.checks = checks);
    }

    /// Leave, stop answering, run the queued hooks, take the VIPs off.
    async fn stop(mut self) -> Result<(), DaemonError> {
        if let Some(vrrp) = self.vrrp.take() {
            vrrp.stop().await;
        }
        self.daemon.stop().await;
        self.checks.stop();
        self.http.abort();
        let hooks_deadline = Instant::now() + EXIT_HOOK_DEADLINE;
        for (group, (_, notifier)) in self.notifiers {
            if !notifier.finish(hooks_deadline).await {
                tracing::warn!(%group, "notify hook still running at exit: killed");
            }
        }
        self.holder.teardown().await?;
        tracing::info!("stopped");
        Ok(())
    }
}

/// Puts the VIPs on the holder link and sets the ARP sysctls of `announce_links`.
async fn hold_vips(vips: &[IpAddr], announce_links: &[String]) -> Result<Addresses, DaemonError> {
    match Addresses::setup(HOLDER_NAME, vips, announce_links).await {
        // No dummy driver, or a holder a previous run (on such a kernel) left behind.
        Err(addresses::Error::KindUnsupported { .. })
        | Err(addresses::Error::NotDummy { kind: _, .. })
            if holder_is_ifb_or_missing().await =>
        {
            tracing::warn!(
                holder = HOLDER_NAME,
                "this kernel has no dummy links: holding the VIPs on an ifb link"
            );
            Ok(Addresses::setup_with(HolderKind::Ifb, HOLDER_NAME, vips, announce_links).await?)
        }
        other => Ok(other?),
    }
}

/// Starts the gossip task with this node's first record.
async fn spawn_gossip(
    config: &Standalone,
    node: &str,
    timing: Timing,
    ring: KeyRing,
    local: &LocalState,
    metrics: GossipMetrics,
) -> Result<gossip::GossipHandle, DaemonError> {
    let settings = GossipSettings {
        node: node.to_string(),
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
    Ok(gossip::spawn(settings, config.bind, ring, local.meta().clone(), metrics).await?)
}

/// A notify hook as it runs: its program and the user it runs as.
type Hook = (PathBuf, Option<ScriptUser>);

/// The notify hooks of `config`. A group whose program and user did not change keeps its
/// notifier from `previous`, so its calls stay in order across a reload.
fn notifiers(
    config: &Standalone,
    mut previous: BTreeMap<String, (Hook, Notifier)>,
    done: &mpsc::UnboundedSender<(String, GroupState, HookResult)>,
) -> BTreeMap<String, (Hook, Notifier)> {
    config
        .groups
        .iter()
        .filter_map(|g| {
            let hook: Hook = (g.notify.clone()?, config.script_user.clone());
            let notifier = match previous.remove(&g.name) {
                Some((old, notifier)) if old == hook => notifier,
                _ => Notifier::spawn(
                    hook.0.clone(),
                    g.name.clone(),
                    hook.1.clone(),
                    NOTIFY_TIMEOUT,
                    done.clone(),
                ),
            };
            Some((g.name.clone(), (hook, notifier)))
        })
        .collect()
}

/// Whether a file describes a node with no peers to join (the file refuses a peer that is
/// `bind` itself).
fn alone(config: &Standalone) -> bool {
    config.peers.is_empty()
}

/// Whether the holder link is absent or an ifb link (ours, from a run on a kernel without the
/// dummy driver). Any other link of that name is not ours to take over.
async fn holder_is_ifb_or_missing() -> bool {
    match netlink::snapshot().await {
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

#[cfg(test)]
mod tests;
