//! The Kubernetes mode's loop: reflectors in, the shared engine and drivers, records out.
//!
//! Watches ([`watch`](super::watch): trimmed reflector caches): Services, EndpointSlices, Nodes,
//! and in the speaker's namespace `IPAddressPool`s, `L2Advertisement`s and the speaker Pods (by
//! label selector: the gossip peers). Each watch event names the object it is about; the
//! [`Keeper`] settles only what that object touches (one Service and its IPs for a Service or
//! EndpointSlice event; every Service only when the resolved configuration changed), and the
//! engine moves only the IPs that differ. The Pods' IPs become the gossip's seeds. Nothing is
//! polled but the key file, and a membership change lists nothing: failover runs from gossip
//! alone, so it goes on while the API server is away (the caches stay as they were; the
//! watches resume with backoff).
//!
//! Written back, in their own task so an unreachable API server never delays an announcement:
//! one `ServiceL2Status` record per Service this node announces ([`records`](super::records);
//! only the records of the Services whose IPs changed are looked at), an Event `nodeAssigned`
//! on the Service when this node starts announcing it, and Warning Events on bad input: an
//! invalid `L2Advertisement` (from the first live member by name only, once per problem, not
//! once per speaker) and an interface an advertisement names that this node lacks (from that
//! node, once per advertisement and interface). Failed record writes are retried until the
//! records are true again; every failed write is counted. Records of Services not served
//! that no running speaker will touch again are swept by one node
//! ([`Strays`](super::records::Strays)), once the holdings are filled, the mesh has formed,
//! and not while draining; each deletion is counted.
//!
//! `swimlb_kubernetes_event_handling_seconds{resource}` times each watch event from its
//! arrival to the engine's actions for it carried out.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::Client;
use kube::Resource as _;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use swimlb_config::keyfile::parse_key_file;
use swimlb_config::reflect::Relister;
use swimlb_config::service::ServiceKey;
use swimlb_proto::{KeyId, KeyRing};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::events::Reason;
use super::metrics::{DroppedLabels, KubeMetrics, Resource};
use super::records::{Holdings, IpFacts, Strays};
use super::records_task::{self, SeenRecord, ToWrite};
use super::snapshot::{self, Changes, DropReason, Dropped, Keeper};
use super::watch::{Change, NeverListed, Stores, What};
use crate::gossip::{self, GossipMetrics, GossipSettings, Phase, Timing};
use crate::model::announcer::Schedule;
use crate::model::engine::{Engine, Input};
use crate::model::links::Link;
use crate::model::local::LocalState;
use crate::run::daemon::{Daemon, NetWatch};
use crate::run::driver::{self, Instruments, Parts, Shared};
use crate::run::hold::JoinHold;

/// How often the key file is read again (a mounted Secret changes in place).
pub const KEY_FILE_POLL: Duration = Duration::from_secs(2);

/// Everything the Kubernetes speaker runs with (the command line, validated).
#[derive(Debug, Clone)]
pub struct Settings {
    /// This node (`NODE_NAME`).
    pub node: String,
    /// The speaker's namespace (`POD_NAMESPACE`): pools, advertisements, records, peers.
    pub namespace: String,
    /// The gossip address (`$POD_IP:7946`).
    pub bind: SocketAddr,
    /// The gossip cluster name (the envelope's associated data).
    pub cluster: String,
    /// The key file (a mounted Secret); `None`: insecure.
    pub key_file: Option<PathBuf>,
    /// `/metrics`, `/healthz`, `/readyz`, `/status`.
    pub listen: SocketAddr,
    /// Gossip timings.
    pub timing: Timing,
    /// A node that comes back waits this long before it takes its IPs back (0: MetalLB's
    /// revertive behaviour).
    pub preempt_delay: Duration,
    /// Label selector of the speaker Pods.
    pub speaker_selector: String,
    /// What is served.
    pub options: snapshot::Options,
}

/// Why the Kubernetes speaker stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The gossip could not start.
    #[error("gossip: {0}")]
    Gossip(#[from] gossip::GossipError),
    /// Links and routes could not be read.
    #[error("interfaces: {0}")]
    Interfaces(#[from] crate::net::netlink::Error),
    /// The HTTP listener could not be bound.
    #[error("listen {addr}: {source}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// The error.
        source: std::io::Error,
    },
    /// A watch's store was dropped before it was ready.
    #[error(transparent)]
    Watch(#[from] NeverListed),
}

/// The Kubernetes source's own inputs (beside the shared ones, [`Shared`]).
struct Inputs {
    changed: futures::channel::mpsc::UnboundedReceiver<Change>,
    key_poll: tokio::time::Interval,
    seen_records: mpsc::UnboundedReceiver<SeenRecord>,
}

/// One of the Kubernetes source's own inputs.
enum Own {
    /// The watches changed the caches: every change queued so far, handled together.
    Caches(Vec<Change>),
    /// Time to read the key file again.
    KeyPoll,
    /// The records task saw records (every one queued so far).
    Records(Vec<SeenRecord>),
}

/// The Kubernetes mode's state around the shared [`Daemon`].
struct Source {
    settings: Settings,
    stores: Stores,
    keeper: Keeper,
    daemon: Daemon,
    metrics: KubeMetrics,
    dropped: DroppedReport,
    ring_ids: Vec<KeyId>,
    /// What the records task was told, IP by IP.
    holdings: Holdings,
    /// Records of Services not served, to sweep.
    strays: Strays,
    /// A stray was seen or the members changed since the strays were last looked at.
    sweep_due: bool,
    /// Back under a renewed identity: every held record is written again once the mesh is
    /// active (the others may have overwritten them while this node was cut off).
    rewrite_due: bool,
    /// Whether this node was the first live member by name when the records were last synced.
    first: bool,
    /// `/status` as last synced into the records: unchanged, nothing to sync.
    board: watch::Receiver<crate::serve::http::Status>,
    /// The names of this node's links.
    links: BTreeSet<String>,
    /// (advertisement, interface) pairs naming an interface this node lacks.
    unknown_interfaces: BTreeSet<(String, String)>,
    /// Invalid advertisements not warned about yet (by the first member, once joined).
    invalid_ads: BTreeMap<(String, String), Vec<String>>,
    to_write: mpsc::UnboundedSender<ToWrite>,
    /// Starts the views' watches over.
    relister: Relister,
    records: tokio::task::JoinHandle<()>,
    http: tokio::task::JoinHandle<()>,
}

/// Runs the Kubernetes speaker until `shutdown` resolves (then drains).
pub async fn run(
    settings: Settings,
    client: Client,
    mut shutdown: impl Future<Output = ()> + Unpin,
) -> Result<(), Error> {
    let Some((mut source, mut shared, mut inputs)) =
        Source::start(settings, client, &mut shutdown).await?
    else {
        return Ok(());
    };
    source.update_ready();
    driver::run(&mut source, &mut shared, &mut inputs, shutdown).await;
    source.stop().await;
    Ok(())
}

impl driver::Source for Source {
    type Inputs = Inputs;
    type Event = Own;

    fn daemon(&mut self) -> &mut Daemon {
        &mut self.daemon
    }

    /// Ready once joined, or at once when no other speaker Pod is bound to a node (a one-node
    /// cluster has nobody to join: before, its speaker stayed `joining` for good and the
    /// DaemonSet's rollout never ended).
    fn ready(&self, phase: Phase) -> bool {
        crate::sources::ready(phase, self.stores.speaker_nodes() <= 1)
    }

    async fn next(inputs: &mut Inputs, _draining: bool) -> Own {
        tokio::select! {
            Some(change) = inputs.changed.next() => {
                let mut batch = vec![change];
                while let Ok(more) = inputs.changed.try_recv() {
                    batch.push(more);
                }
                Own::Caches(batch)
            }
            _ = inputs.key_poll.tick() => Own::KeyPoll,
            Some(seen) = inputs.seen_records.recv() => {
                let mut batch = vec![seen];
                while let Ok(more) = inputs.seen_records.try_recv() {
                    batch.push(more);
                }
                Own::Records(batch)
            }
        }
    }

    async fn handle(&mut self, event: Own) {
        match event {
            Own::Caches(batch) => self.caches_changed(&batch).await,
            Own::KeyPoll => self.rotate_keys().await,
            Own::Records(seen) => seen.into_iter().for_each(|s| self.record_seen(s)),
        }
    }

    /// The advertisements' interfaces are checked against the links.
    async fn net_changed(&mut self, links: &[Link]) {
        self.links = links.iter().map(|l| l.name.clone()).collect();
        self.check_interfaces();
    }

    /// Every watch starts over: the views' (see [`Relister`]) and the records' (see
    /// [`ToWrite::Relist`]). A node whose link was down for a few seconds otherwise heard
    /// what changed meanwhile seconds after the link's return (4.2 s for a node labelled
    /// excluded in chaos seed 1), and named another owner than its peers until then.
    fn carrier_back(&mut self) {
        self.relister.relist();
        let _ = self.to_write.send(ToWrite::Relist);
    }

    fn members_changed(&mut self) {
        self.sweep_due = true;
    }

    fn rejoined(&mut self) {
        self.rewrite_due = true;
    }

    fn draining(&mut self) {
        let _ = self.to_write.send(ToWrite::Draining);
    }

    fn after(&mut self) {
        self.sync_records();
        self.sweep();
    }
}

impl Source {
    /// `/readyz` again: alone or not changes with the speaker Pods, not only with the phase.
    fn update_ready(&mut self) {
        let phase = *self.daemon.phase().borrow();
        let ready = driver::Source::ready(self, phase);
        self.daemon.board.update(|s| s.ready = ready);
    }

    /// Serves `/healthz` at once, waits for the caches and the key (`None`: stopped meanwhile),
    /// then starts the gossip, the engine and the records task.
    async fn start(
        settings: Settings,
        client: Client,
        shutdown: &mut (impl Future<Output = ()> + Unpin),
    ) -> Result<Option<(Source, Shared, Inputs)>, Error> {
        let mut instruments = Instruments::register(&settings.node);
        let metrics = KubeMetrics::register(&mut instruments.registry);
        let board_seen = instruments.board.subscribe();
        // /healthz answers (and /readyz says not ready) while the watches list and the key is
        // awaited.
        let (_, http) = crate::serve::http::spawn(
            settings.listen,
            instruments.board.subscribe(),
            Arc::new(instruments.registry),
            instruments.board.listener_metrics(),
        )
        .await
        .map_err(|source| Error::Listen {
            addr: settings.listen,
            source,
        })?;
        let (relister, relists) = swimlb_config::reflect::relists();
        let (stores, mut changed) = Stores::spawn(
            &client,
            &settings.namespace,
            &settings.speaker_selector,
            &metrics,
            &relists,
        );
        tracing::info!("waiting for the first list of every watch");
        // A stop before the caches and the key are there ends the speaker at once: it owns
        // nothing.
        let Some(ring) = caches_and_key(&stores, &settings, shutdown).await? else {
            http.abort();
            return Ok(None);
        };
        let ring_ids: Vec<KeyId> = ring.key_ids().collect();
        let (net, links, routes) = NetWatch::start().await?;
        // What the first lists brought is in the stores: the first resync covers it.
        while changed.try_recv().is_ok() {}
        let (keeper, dropped, first_changes) = first_snapshot(&settings, &stores, &metrics);
        let snapshot = keeper.snapshot().clone();
        let local = first_record(&settings, &snapshot, &links, &routes);
        let watch_ring = ring.duplicate();
        let gossip = spawn_gossip(&settings, &stores, ring, &local, instruments.gossip).await?;
        let link_names = links.iter().map(|l| l.name.clone()).collect();
        let parts = Parts {
            local,
            schedule: Schedule::default(),
            snapshot,
            links,
            routes,
            net,
            hold: start_hold(&stores),
            board: instruments.board,
            failovers: instruments.failovers,
            responder: instruments.responder,
            watch: instruments.watch,
            watch_knobs: settings.timing.owner_watch,
            watch_ring,
        };
        let (daemon, shared) = driver::assemble(&settings.node, gossip, parts).await;
        let (to_write, to_write_rx) = mpsc::unbounded_channel();
        let (seen_tx, seen_records) = mpsc::unbounded_channel();
        let records = tokio::spawn(records_task::run(
            client,
            settings.namespace.clone(),
            settings.node.clone(),
            stores.services(),
            to_write_rx,
            seen_tx,
            metrics.clone(),
        ));
        let inputs = Inputs {
            changed,
            key_poll: tokio::time::interval(KEY_FILE_POLL),
            seen_records,
        };
        let mut source = Source {
            holdings: Holdings::new(&settings.node),
            strays: Strays::new(),
            sweep_due: false,
            rewrite_due: false,
            settings,
            stores,
            keeper,
            daemon,
            metrics,
            dropped,
            ring_ids,
            first: false,
            board: board_seen,
            links: link_names,
            unknown_interfaces: BTreeSet::new(),
            invalid_ads: BTreeMap::new(),
            to_write,
            relister,
            records,
            http,
        };
        source.first_sync(&first_changes);
        Ok(Some((source, shared, inputs)))
    }

    /// After the start: the first snapshot's warnings and interfaces, and every IP of it into
    /// the holdings (the caches listed in full): from now on a Service not held is not
    /// served, and its record may be swept.
    fn first_sync(&mut self, first_changes: &Changes) {
        self.note_invalid_ads(first_changes);
        self.check_interfaces();
        let ips: Vec<IpAddr> = self
            .daemon
            .engine
            .election()
            .outcomes()
            .keys()
            .copied()
            .collect();
        self.sync_ips(ips.into_iter());
        self.strays.synced();
    }

    /// Watches changed something: what is served, and who the peers are. Only the objects
    /// named by `batch` are looked at, unless a watch listed again.
    async fn caches_changed(&mut self, batch: &[Change]) {
        let mut resync = false;
        let mut config = false;
        let mut pods = false;
        let mut services: BTreeSet<ServiceKey> = BTreeSet::new();
        for change in batch {
            match (change.resource, &change.what) {
                (Resource::Pods, _) => pods = true,
                (_, What::Resync) => resync = true,
                (Resource::Services, What::Object { namespace, name }) => {
                    services.insert(ServiceKey::new(namespace.as_str(), name.as_str()));
                }
                (Resource::EndpointSlices, What::Object { namespace, name }) => {
                    services.extend(self.stores.slice_moved(&mut self.keeper, namespace, name));
                }
                _ => config = true,
            }
        }
        if resync {
            self.stores.resync(&mut self.keeper);
        } else {
            if config {
                self.stores.set_config(&mut self.keeper);
            }
            for key in &services {
                self.stores.set_service(&mut self.keeper, key);
            }
        }
        let changes = self.keeper.take_changes();
        self.dropped.apply(&changes);
        if !changes.ips.is_empty() {
            let entries = changes
                .ips
                .iter()
                .map(|ip| (*ip, self.keeper.snapshot().get_shared(ip).cloned()))
                .collect();
            self.daemon.handle(Input::Served(entries)).await;
            self.sync_ips(changes.ips.iter().copied());
        }
        let done = Instant::now();
        for change in batch {
            let seconds = done.saturating_duration_since(change.at).as_secs_f64();
            self.metrics.event_handled(change.resource, seconds);
        }
        self.note_invalid_ads(&changes);
        if resync || config {
            self.check_interfaces();
        }
        if pods {
            let peers = self.stores.peers(self.settings.bind.port());
            self.daemon.expect_members(self.stores.speaker_nodes());
            if let Err(e) = self.daemon.gossip().set_seeds(peers).await {
                tracing::warn!(error = %e, "gossip seeds not updated");
            }
            self.update_ready();
        }
    }

    /// Tells the records task what changed since the last sync, when `/status` changed at
    /// all (an announcement tick changes nothing). Every IP is compared, without allocating
    /// for the unchanged ones; the warnings waiting for the mesh go out.
    fn sync_records(&mut self) {
        self.warn_invalid_ads();
        self.rewrite_after_rejoin();
        if !self.board.has_changed().unwrap_or(false) {
            return;
        }
        self.board.mark_unchanged();
        let engine = &self.daemon.engine;
        let election = engine.election();
        let mut differ: Vec<IpAddr> = election
            .outcomes()
            .keys()
            .filter(|ip| {
                let service = election
                    .snapshot()
                    .get(ip)
                    .and_then(|s| s.belongs_to.service_names());
                let shared_with = election
                    .snapshot()
                    .get(ip)
                    .and_then(|s| s.shared_with.as_deref());
                let links = recorded_links(engine, ip);
                let unowned = election.owner(ip).is_none();
                !self
                    .holdings
                    .matches(ip, service, shared_with, links.map(|l| &**l), unowned)
            })
            .copied()
            .collect();
        differ.extend(
            self.holdings
                .ips()
                .filter(|ip| !election.outcomes().contains_key(ip)),
        );
        self.sync_ips(differ.into_iter());
    }

    /// After a rejoin, once the mesh is active again and this node's view holds the others:
    /// the records task forgets what it wrote (a node cut off cannot know whether the others
    /// wrote over it) and every held record is set again. Writes nothing the API already holds
    /// that another write would not have written anyway: one apply per held Service.
    fn rewrite_after_rejoin(&mut self) {
        if !self.rewrite_due || *self.daemon.phase().borrow() != Phase::Active {
            return;
        }
        self.rewrite_due = false;
        let _ = self.to_write.send(ToWrite::Forget);
        let held: BTreeSet<ServiceKey> = self.holdings.services().cloned().collect();
        self.tell(held);
    }

    /// Tells the records task about the Services of `ips` (every Service when this node
    /// became or stopped being the first live member: it deletes the orphans).
    fn sync_ips(&mut self, ips: impl Iterator<Item = IpAddr>) {
        self.board.mark_unchanged();
        let engine = &self.daemon.engine;
        let mut touched: BTreeSet<ServiceKey> = BTreeSet::new();
        for ip in ips {
            let facts = ip_facts(engine, &ip);
            touched.extend(self.holdings.set(ip, facts));
        }
        self.tell(touched);
    }

    /// Tells the records task the record this node should hold for each of `touched` (and for
    /// every held Service when this node became or stopped being the first live member).
    fn tell(&mut self, mut touched: BTreeSet<ServiceKey>) {
        let node = self.settings.node.as_str();
        let first = self
            .daemon
            .engine
            .live()
            .iter()
            .next()
            .map(|m| m.node.as_str())
            == Some(node);
        if first != self.first {
            self.first = first;
            touched.extend(self.holdings.services().cloned());
        }
        for service in touched {
            if self.holdings.holds(&service) {
                self.strays.served(&service);
            }
            let (record, unowned) = self.holdings.record(&service);
            let _ = self.to_write.send(ToWrite::Record {
                service,
                record,
                orphaned: unowned && first,
            });
        }
    }

    /// A record the records' watch saw: a stray when its Service is not served.
    fn record_seen(&mut self, seen: SeenRecord) {
        match seen {
            SeenRecord::Relisted => self.strays.clear(),
            SeenRecord::Record { service, node } => {
                let served = self.holdings.holds(&service);
                self.strays.seen(&service, node.as_deref(), served);
                self.sweep_due |= node.is_some() && !served;
            }
        }
    }

    /// Sweeps the strays this node deletes (module docs of [`records`](super::records)):
    /// once the mesh has formed (a lone node is the first member of its own view), and not
    /// while draining (the node is leaving: the others take over). Looked at only when a
    /// stray was seen or the members changed since.
    fn sweep(&mut self) {
        if !self.sweep_due || self.daemon.holding() || self.daemon.engine.draining() {
            return;
        }
        self.sweep_due = false;
        if self.strays.is_empty() {
            return;
        }
        let live = self.daemon.engine.live();
        let due = self.strays.due(
            &self.settings.node,
            |node| live.contains(node),
            live.iter().next().map(|m| m.node.as_str()),
        );
        for service in due {
            tracing::info!(%service, "sweeping the ServiceL2Status of a Service not served");
            let _ = self.to_write.send(ToWrite::Sweep(service));
        }
    }

    /// Remembers the invalid advertisements to warn about (and forgets the fixed ones).
    fn note_invalid_ads(&mut self, changes: &Changes) {
        for d in &changes.restored {
            if let Dropped::InvalidAdvertisement(e) = d {
                self.invalid_ads
                    .remove(&(e.namespace.clone(), e.name.clone()));
            }
        }
        for d in &changes.dropped {
            if let Dropped::InvalidAdvertisement(e) = d {
                self.invalid_ads
                    .entry((e.namespace.clone(), e.name.clone()))
                    .or_default()
                    .push(d.to_string());
            }
        }
    }

    /// A Warning Event on each invalid advertisement noted, from the first live member only
    /// (one Event per problem, not one per speaker), once the mesh has formed.
    fn warn_invalid_ads(&mut self) {
        if self.invalid_ads.is_empty() || self.daemon.holding() {
            return;
        }
        let pending = std::mem::take(&mut self.invalid_ads);
        if !self.first {
            return;
        }
        let ads = self.stores.advertisements();
        for ((namespace, name), notes) in pending {
            let Some(ad) = ads.iter().find(|a| {
                a.metadata.namespace.as_deref() == Some(namespace.as_str())
                    && a.metadata.name.as_deref() == Some(name.as_str())
            }) else {
                continue;
            };
            let _ = self.to_write.send(ToWrite::Warning {
                object: ad.object_ref(&()),
                reason: Reason::InvalidConfiguration,
                note: notes.join("; "),
            });
        }
    }

    /// Counts, logs and warns (an Event on the advertisement, from this node) about every
    /// interface an advertisement covering this node names and this node lacks, once per
    /// advertisement and interface.
    fn check_interfaces(&mut self) {
        let missing: BTreeSet<(String, String)> = self
            .keeper
            .named_interfaces(&self.settings.node)
            .into_iter()
            .filter(|(_, interface)| !self.links.contains(interface))
            .collect();
        if missing == self.unknown_interfaces {
            return;
        }
        let ads = self.stores.advertisements();
        for (ad_key, interface) in missing.difference(&self.unknown_interfaces) {
            tracing::warn!(
                advertisement = %ad_key,
                %interface,
                "the advertisement names an interface this node does not have: not announced there"
            );
            let Some(ad) = ads.iter().find(|a| {
                format!(
                    "{}/{}",
                    a.metadata.namespace.as_deref().unwrap_or_default(),
                    a.metadata.name.as_deref().unwrap_or_default()
                ) == *ad_key
            }) else {
                continue;
            };
            let _ = self.to_write.send(ToWrite::Warning {
                object: ad.object_ref(&()),
                reason: Reason::UnknownInterface,
                note: format!(
                    "interface {interface:?} is not on node {:?}; this node does not announce on it",
                    self.settings.node
                ),
            });
        }
        self.unknown_interfaces = missing;
        self.dropped.set(
            DropReason::UnknownInterface,
            self.unknown_interfaces.len() as i64,
        );
    }

    /// Reads the key file again and rotates when its keys changed.
    async fn rotate_keys(&mut self) {
        let Ok(ring) = read_keys(&self.settings) else {
            return;
        };
        let next: Vec<KeyId> = ring.key_ids().collect();
        if next == self.ring_ids {
            return;
        }
        let sealing = ring.sealing_key_id();
        match self.daemon.set_key_ring(ring).await {
            Ok(()) => {
                tracing::info!(keys = next.len(), %sealing, "gossip keys replaced");
                self.ring_ids = next;
            }
            Err(e) => tracing::error!(error = %e, "gossip keys not replaced"),
        }
    }

    async fn stop(self) {
        self.records.abort();
        self.http.abort();
        self.daemon.stop().await;
        tracing::info!("stopped");
    }
}

/// Waits for the first list of every watch, then for the key file (`None`: stopped first).
async fn caches_and_key(
    stores: &Stores,
    settings: &Settings,
    shutdown: &mut (impl Future<Output = ()> + Unpin),
) -> Result<Option<KeyRing>, Error> {
    tokio::select! {
        _ = shutdown => Ok(None),
        ring = async {
            stores.ready().await?;
            Ok::<KeyRing, Error>(wait_for_keys(settings).await)
        } => ring.map(Some),
    }
}

/// The snapshot of the caches as first listed, with what it dropped counted.
fn first_snapshot(
    settings: &Settings,
    stores: &Stores,
    metrics: &KubeMetrics,
) -> (Keeper, DroppedReport, Changes) {
    let mut keeper = Keeper::new(settings.options.clone());
    stores.resync(&mut keeper);
    let mut dropped = DroppedReport::new(metrics.dropped.clone());
    let first_changes = keeper.take_changes();
    dropped.apply(&first_changes);
    (keeper, dropped, first_changes)
}

/// This node's first record: no groups, unsettled for the preemption delay, and where it can
/// announce what the caches serve.
fn first_record(
    settings: &Settings,
    snapshot: &crate::model::snapshot::Snapshot,
    links: &[crate::model::links::Link],
    routes: &[crate::model::links::Route],
) -> LocalState {
    let mut local = LocalState::with_groups(
        &settings.node,
        BTreeMap::new(),
        settings.preempt_delay,
        Instant::now(),
    );
    let placement =
        crate::model::engine::placement::Placement::new(snapshot, links.to_vec(), routes.to_vec());
    local.set_announce(placement.facts(snapshot));
    local
}

/// The start-up hold, waiting for the speaker Pods that exist: their speakers would lose their
/// IPs to this one for a moment if it answered before they joined.
fn start_hold(stores: &Stores) -> JoinHold {
    let mut hold = JoinHold::new(Instant::now(), false);
    hold.expect(stores.speaker_nodes());
    hold
}

/// Starts the gossip with this node's first record, the speaker Pods as seeds.
async fn spawn_gossip(
    settings: &Settings,
    stores: &Stores,
    ring: KeyRing,
    local: &LocalState,
    metrics: GossipMetrics,
) -> Result<gossip::GossipHandle, Error> {
    let seeds = stores.peers(settings.bind.port());
    tracing::info!(peers = ?seeds, "gossip peers from the speaker Pods");
    Ok(gossip::spawn(
        GossipSettings {
            node: settings.node.clone(),
            addr: settings.bind,
            seeds,
            timing: settings.timing.clone(),
            bump: boot_millis(),
            rng_seed: boot_millis() ^ u64::from(std::process::id()),
        },
        settings.bind,
        ring,
        local.meta().clone(),
        metrics,
    )
    .await?)
}

/// `ip` as the records see it in the engine now (`None`: not served, or not a Service's).
fn ip_facts(engine: &Engine, ip: &IpAddr) -> Option<IpFacts> {
    let election = engine.election();
    let served = election.snapshot().get(ip)?;
    let (namespace, name) = served.belongs_to.service_names()?;
    let service = ServiceKey::new(namespace, name);
    let shared_with = served
        .shared_with
        .as_deref()
        .map(|others| others.iter().filter_map(|o| service_key(o)).collect());
    Some(IpFacts {
        service,
        shared_with,
        links: recorded_links(engine, ip).cloned(),
        unowned: election.owner(ip).is_none(),
    })
}

/// The links the records name for `ip`: those it is answered on, unless it is handed over
/// (the new owner's to record, though still answered here until it announces).
fn recorded_links<'e>(
    engine: &'e Engine,
    ip: &IpAddr,
) -> Option<&'e crate::model::engine::placement::LinkSet> {
    engine
        .answering()
        .get(ip)
        .filter(|_| !engine.handing_over(ip))
}

/// `namespace/name` as a key.
fn service_key(belongs_to: &str) -> Option<ServiceKey> {
    let (namespace, name) = belongs_to.split_once('/')?;
    Some(ServiceKey::new(namespace, name))
}

/// What the snapshot left out: the gauge by reason, kept from the changes (a drop is logged
/// when it appears, not again on every event).
#[derive(Debug, Default)]
struct DroppedReport {
    gauge: Family<DroppedLabels, Gauge>,
    counts: BTreeMap<DropReason, i64>,
}

impl DroppedReport {
    fn new(gauge: Family<DroppedLabels, Gauge>) -> DroppedReport {
        DroppedReport {
            gauge,
            counts: BTreeMap::new(),
        }
    }

    fn apply(&mut self, changes: &Changes) {
        let mut touched = BTreeSet::new();
        for d in &changes.restored {
            *self.counts.entry(d.reason()).or_default() -= 1;
            touched.insert(d.reason());
        }
        for d in &changes.dropped {
            tracing::warn!(reason = d.as_str(), "not served: {d}");
            *self.counts.entry(d.reason()).or_default() += 1;
            touched.insert(d.reason());
        }
        for reason in touched {
            let n = self.counts.get(&reason).copied().unwrap_or_default();
            self.set(reason, n);
        }
    }

    /// Sets one reason's count in place (a scrape never sees the family emptied); 0 removes it.
    fn set(&mut self, reason: DropReason, n: i64) {
        if n > 0 {
            self.counts.insert(reason, n);
            self.gauge.get_or_create(&DroppedLabels { reason }).set(n);
        } else {
            self.counts.remove(&reason);
            self.gauge.remove(&DroppedLabels { reason });
        }
    }
}

/// The key ring from the key file; waits (not ready, logging once) while the file is missing or
/// empty, for example until the controller has created the Secret.
async fn wait_for_keys(settings: &Settings) -> KeyRing {
    let mut said = false;
    loop {
        match read_keys(settings) {
            Ok(ring) => return ring,
            Err(why) => {
                if !said {
                    tracing::warn!(reason = %why, "waiting for the gossip key (the Secret is not there yet)");
                    said = true;
                }
            }
        }
        tokio::time::sleep(KEY_FILE_POLL).await;
    }
}

fn read_keys(settings: &Settings) -> Result<KeyRing, String> {
    let keys = match &settings.key_file {
        Some(path) => {
            // The standalone mode's rules: at most 1 MiB, readable by its owner only (the
            // manifest's Secret volume gives the file mode 0400).
            let text = swimlb_config::keyfile::read_key_file(path)
                .map_err(|e| format!("{}: {e}", path.display()))?;
            parse_key_file(&text).map_err(|errors| {
                errors
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; ")
            })?
        }
        None => vec![crate::sources::standalone::insecure_key(&settings.cluster)],
    };
    KeyRing::new(&settings.cluster, &keys).map_err(|e| e.to_string())
}

fn boot_millis() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::serve::http::metrics_text as encode;

    #[test]
    fn drops_are_counted_by_reason_in_place_and_cleared_when_gone() {
        let mut registry = prometheus_client::registry::Registry::default();
        let mut report = DroppedReport::default();
        registry.register("swimlb_snapshot_dropped", "drops", report.gauge.clone());
        let outside = |name: &str, ip: &str| snapshot::Dropped::OutsidePools {
            service: ServiceKey::new("ns", name),
            ip: ip.parse().unwrap(),
        };
        report.apply(&Changes {
            dropped: vec![outside("a", "192.0.2.1"), outside("b", "192.0.2.2")],
            ..Changes::default()
        });
        report.set(DropReason::UnknownInterface, 1);
        let text = encode(&registry);
        assert!(
            text.contains(r#"swimlb_snapshot_dropped{reason="outside_pools"} 2"#),
            "{text}"
        );
        assert!(
            text.contains(r#"swimlb_snapshot_dropped{reason="unknown_interface"} 1"#),
            "{text}"
        );
        report.apply(&Changes {
            restored: vec![outside("a", "192.0.2.1")],
            ..Changes::default()
        });
        assert!(encode(&registry).contains(r#"swimlb_snapshot_dropped{reason="outside_pools"} 1"#));
        report.apply(&Changes {
            restored: vec![outside("b", "192.0.2.2")],
            ..Changes::default()
        });
        report.set(DropReason::UnknownInterface, 0);
        let text = encode(&registry);
        assert!(!text.contains("outside_pools"), "{text}");
        assert!(!text.contains("unknown_interface"), "{text}");
    }

    #[test]
    fn a_service_key_is_namespace_slash_name() {
        assert_eq!(service_key("ns/web"), Some(ServiceKey::new("ns", "web")));
        assert_eq!(service_key("api"), None, "a standalone group is no Service");
    }
}
