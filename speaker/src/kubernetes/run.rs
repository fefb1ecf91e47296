//! The Kubernetes mode's loop: reflectors in, the shared engine and drivers, records out.
//!
//! Watches (kube-rs reflectors, trimmed caches): Services, EndpointSlices, Nodes, and in the
//! speaker's namespace `IPAddressPool`s, `L2Advertisement`s and the speaker Pods (by label
//! selector: the gossip peers). Any change rebuilds the [`Snapshot`](crate::snapshot::Snapshot)
//! ([`snapshot::build`], pure) and hands it to the engine, which moves only the IPs that
//! differ; the Pods' IPs become the gossip's seeds. Nothing is polled but the key file, and a
//! membership change lists nothing: failover runs from gossip alone, so it goes on while the
//! API server is away (the caches stay as they were; the watches resume with backoff).
//!
//! Written back: one `ServiceL2Status` record per Service this node announces and an Event
//! `nodeAssigned` on the Service when this node starts announcing it ([`records`]). The writes
//! run in their own task, so an unreachable API server never delays an announcement; failed
//! writes are retried until the records are true again.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use kube::Client;
use kube::Resource as _;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use swimlb_config::crd::ServiceL2StatusStatus;
use swimlb_config::keyfile::parse_key_file;
use swimlb_config::service::ServiceKey;
use swimlb_proto::{KeyId, KeyRing};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::metrics::{DroppedLabels, KubeMetrics, Resource};
use super::records::{RecordWriter, record_status};
use super::snapshot;
use super::watch::{Change, NeverListed, Stores};
use crate::announcer::Schedule;
use crate::answering::AnsweringLinks;
use crate::daemon::{Daemon, JoinHold, NetWatch, sleep_until};
use crate::engine::{Engine, Input, Start};
use crate::gossip::{self, GossipMetrics, GossipSettings, Phase, Timing};
use crate::local::LocalState;
use crate::responder;
use crate::status::StatusBoard;

/// How often the key file is read again (a mounted Secret changes in place).
pub const KEY_FILE_POLL: Duration = Duration::from_secs(2);
/// How soon a failed record write is tried again.
pub const RECORD_RETRY: Duration = Duration::from_secs(1);

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
    Interfaces(#[from] crate::interfaces::Error),
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

/// What the records task is told: the records this node holds, and the orphans to delete.
#[derive(Debug, Clone, Default, PartialEq)]
struct Desired {
    records: BTreeMap<ServiceKey, ServiceL2StatusStatus>,
    orphaned: BTreeSet<ServiceKey>,
}

/// The receivers the loop waits on, apart from [`Source`] so its handlers can borrow it.
struct Inputs {
    changed: futures::channel::mpsc::UnboundedReceiver<Change>,
    changes: tokio::sync::broadcast::Receiver<crate::membership::LiveChange>,
    phase: watch::Receiver<Phase>,
    conflicts: mpsc::UnboundedReceiver<crate::responder::Conflict>,
    net: NetWatch,
    key_poll: tokio::time::Interval,
}

/// The Kubernetes mode's state around the shared [`Daemon`].
struct Source {
    settings: Settings,
    stores: Stores,
    daemon: Daemon,
    metrics: KubeMetrics,
    dropped: DroppedReport,
    hold: JoinHold,
    ring_ids: Vec<KeyId>,
    desired: watch::Sender<Desired>,
    records: tokio::task::JoinHandle<()>,
    http: tokio::task::JoinHandle<()>,
}

/// Runs the Kubernetes speaker until `shutdown` resolves (then drains).
pub async fn run(
    settings: Settings,
    client: Client,
    mut shutdown: impl Future<Output = ()> + Unpin,
) -> Result<(), Error> {
    let Some((mut source, mut inputs)) = Source::start(settings, client, &mut shutdown).await?
    else {
        return Ok(());
    };
    loop {
        let draining = source.daemon.engine.draining();
        tokio::select! {
            _ = &mut shutdown, if !draining => source.drain().await,
            Some(change) = inputs.changed.next() => {
                // Every change queued so far is in the stores: handled together.
                let mut batch = vec![change];
                while let Ok(more) = inputs.changed.try_recv() {
                    batch.push(more);
                }
                source.caches_changed(&batch).await;
            }
            change = inputs.changes.recv() => {
                if !source.daemon.membership(change).await {
                    break;
                }
            }
            Ok(()) = inputs.phase.changed() => {
                let now = *inputs.phase.borrow_and_update();
                tracing::info!(phase = now.as_str(), "gossip phase");
                source.daemon.board.update(|s| s.ready = now == Phase::Active);
            }
            _ = sleep_until(source.daemon.local.settles_at()) => source.settle().await,
            _ = sleep_until(source.hold.next_deadline()) => {}
            _ = sleep_until(source.daemon.next_deadline()) => source.daemon.handle(Input::Tick).await,
            Some(c) = inputs.conflicts.recv() => {
                source.daemon.handle(Input::Conflict { ip: c.ip, mac: c.mac }).await;
            }
            Some((links, routes)) = inputs.net.changed() => source.daemon.net(links, routes).await,
            _ = inputs.key_poll.tick() => source.rotate_keys().await,
        }
        source.check_hold().await;
        if source.daemon.drained() {
            break;
        }
        source.publish_records();
    }
    source.stop().await;
    Ok(())
}

impl Source {
    /// Serves `/healthz` at once, waits for the caches and the key (`None`: stopped meanwhile),
    /// then starts the gossip, the engine and the records task.
    async fn start(
        settings: Settings,
        client: Client,
        shutdown: &mut (impl Future<Output = ()> + Unpin),
    ) -> Result<Option<(Source, Inputs)>, Error> {
        let (registry, board, gossip_metrics, responder_metrics, metrics) = registry(&settings);
        // /healthz answers (and /readyz says not ready) while the watches list and the key is
        // awaited.
        let (_, http) = crate::http::spawn(settings.listen, board.subscribe(), Arc::new(registry))
            .await
            .map_err(|source| Error::Listen {
                addr: settings.listen,
                source,
            })?;
        let (stores, mut changed) = Stores::spawn(
            &client,
            &settings.namespace,
            &settings.speaker_selector,
            &metrics,
        );
        tracing::info!("waiting for the first list of every watch");
        // A stop before the caches and the key are there ends the speaker at once: it owns
        // nothing.
        let ring = tokio::select! {
            _ = shutdown => {
                http.abort();
                return Ok(None);
            }
            ring = async {
                stores.ready().await?;
                Ok::<KeyRing, Error>(wait_for_keys(&settings).await)
            } => ring?,
        };
        let ring_ids: Vec<KeyId> = ring.key_ids().collect();
        let (net, links, routes) = NetWatch::start().await?;
        // What the first lists brought is in the stores: the first build covers it.
        while changed.try_recv().is_ok() {}
        let built = stores.build(&settings.options);
        let mut dropped = DroppedReport {
            gauge: metrics.dropped.clone(),
            ..DroppedReport::default()
        };
        dropped.update(&built);
        let local = first_record(&settings, &built.snapshot, &links, &routes);
        let gossip = spawn_gossip(&settings, &stores, ring, &local, gossip_metrics).await?;
        // Subscribe before the live set is read: a change in between is seen twice, never missed.
        let changes = gossip.subscribe();
        let phase = gossip.phase();
        let live = gossip.live().borrow().clone();
        let (engine, initial) = Engine::new(
            Instant::now(),
            Start {
                node: settings.node.clone(),
                schedule: Schedule::default(),
                snapshot: built.snapshot,
                live,
                links: links.clone(),
                routes,
                hold: true,
            },
        );
        let (conflict_tx, conflicts) = mpsc::unbounded_channel();
        let answering = AnsweringLinks::new(links, responder_metrics, conflict_tx);
        let daemon = Daemon::new(engine, initial, local, board, answering, gossip).await;
        let (desired, desired_rx) = watch::channel(Desired::default());
        let records = tokio::spawn(write_records(
            client,
            settings.clone(),
            desired_rx,
            metrics.clone(),
        ));
        let inputs = Inputs {
            changed,
            changes,
            phase,
            conflicts,
            net,
            key_poll: tokio::time::interval(KEY_FILE_POLL),
        };
        let source = Source {
            settings,
            stores,
            daemon,
            metrics,
            dropped,
            hold: JoinHold::new(Instant::now(), false),
            ring_ids,
            desired,
            records,
            http,
        };
        Ok(Some((source, inputs)))
    }

    /// SIGTERM: mark draining (peers elect successors at once), hand over, then stop.
    async fn drain(&mut self) {
        tracing::info!("draining: handing the IPs over");
        if self.daemon.local.drain() {
            self.daemon.publish_meta().await;
        }
        self.daemon.board.update(|s| s.draining = true);
        self.daemon.handle(Input::Drain).await;
    }

    /// Watches changed something: what is served, and who the peers are.
    async fn caches_changed(&mut self, batch: &[Change]) {
        let built = self.stores.build(&self.settings.options);
        self.dropped.update(&built);
        self.daemon.handle(Input::Snapshot(built.snapshot)).await;
        let done = Instant::now();
        for change in batch {
            let seconds = done.saturating_duration_since(change.at).as_secs_f64();
            self.metrics.event_handled(change.resource, seconds);
        }
        if batch.iter().any(|c| c.resource == Resource::Pods) {
            let peers = self.stores.peers(self.settings.bind.port());
            if let Err(e) = self.daemon.gossip().set_seeds(peers).await {
                tracing::warn!(error = %e, "gossip seeds not updated");
            }
        }
    }

    async fn settle(&mut self) {
        if self.daemon.local.tick(Instant::now()) {
            self.daemon.publish_meta().await;
        }
    }

    /// Ends the start-up hold when the mesh has formed (or the grace passed).
    async fn check_hold(&mut self) {
        let phase = *self.daemon.phase().borrow();
        if self
            .hold
            .release(Instant::now(), phase, self.daemon.engine.live())
        {
            tracing::info!("mesh formed: answering what this node owns");
            self.daemon.handle(Input::Hold(false)).await;
        }
    }

    /// Tells the records task what this node should hold now.
    fn publish_records(&self) {
        self.desired.send_if_modified(|d| {
            let next = desired(&self.settings.node, &self.daemon.engine);
            let modified = *d != next;
            *d = next;
            modified
        });
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
        match self.daemon.gossip().set_key_ring(ring).await {
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

/// This node's first record: no groups, unsettled for the preemption delay, and where it can
/// announce what the caches serve.
fn first_record(
    settings: &Settings,
    snapshot: &crate::snapshot::Snapshot,
    links: &[crate::interfaces::Link],
    routes: &[crate::interfaces::Route],
) -> LocalState {
    let mut local = LocalState::with_groups(
        &settings.node,
        BTreeMap::new(),
        settings.preempt_delay,
        Instant::now(),
    );
    let placement =
        crate::engine::placement::Placement::new(snapshot, links.to_vec(), routes.to_vec());
    local.set_announce(placement.facts(snapshot));
    local
}

/// Every metric of the Kubernetes speaker, registered; the parts that need a handle returned.
fn registry(
    settings: &Settings,
) -> (
    Registry,
    StatusBoard,
    GossipMetrics,
    responder::Metrics,
    KubeMetrics,
) {
    let mut registry = Registry::default();
    let gossip = GossipMetrics::register(&mut registry);
    let responder = responder::Metrics::default();
    responder.register(&mut registry);
    let kube = KubeMetrics::register(&mut registry);
    let board = StatusBoard::new(&settings.node, &mut registry);
    crate::process_metrics::register(&mut registry, board.subscribe());
    (registry, board, gossip, responder, kube)
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

/// The records this node should hold: one per Service whose IP it answers for; and the
/// Services that nobody announces, whose records the first live member (by name) deletes.
fn desired(node: &str, engine: &Engine) -> Desired {
    let election = engine.election();
    let mut records = BTreeMap::new();
    for (ip, links) in engine.answering() {
        let Some(service) = election
            .snapshot()
            .get(ip)
            .and_then(|s| service_key(&s.belongs_to))
        else {
            continue;
        };
        let links: Vec<String> = links.iter().cloned().collect();
        records.insert(service.clone(), record_status(node, &service, &links));
    }
    let first_member = engine.live().iter().next().map(|m| m.node.as_str());
    let orphaned = if first_member == Some(node) {
        election
            .outcomes()
            .iter()
            .filter(|(_, o)| o.owner().is_none())
            .filter_map(|(ip, _)| service_key(&election.snapshot().get(ip)?.belongs_to))
            .collect()
    } else {
        BTreeSet::new()
    };
    Desired { records, orphaned }
}

/// `namespace/name` as a key.
fn service_key(belongs_to: &str) -> Option<ServiceKey> {
    let (namespace, name) = belongs_to.split_once('/')?;
    Some(ServiceKey::new(namespace, name))
}

/// The records task: applies what `desired` says, retries failures, and tells each Service
/// this node starts announcing with an Event.
async fn write_records(
    client: Client,
    settings: Settings,
    mut desired: watch::Receiver<Desired>,
    metrics: KubeMetrics,
) {
    let mut writer = RecordWriter::new(client.clone(), &settings.namespace);
    let reporter = Reporter {
        controller: "swimlb-speaker".into(),
        instance: Some(settings.node.clone()),
    };
    let recorder = Recorder::new(client, reporter);
    let mut announced: BTreeSet<ServiceKey> = BTreeSet::new();
    loop {
        let current = desired.borrow_and_update().clone();
        let now: BTreeSet<ServiceKey> = current.records.keys().cloned().collect();
        for service in now.difference(&announced) {
            let event = Event {
                type_: EventType::Normal,
                reason: "nodeAssigned".into(),
                note: Some(format!(
                    "announcing from node {:?} with protocol \"layer2\"",
                    settings.node
                )),
                action: "Announce".into(),
                secondary: None,
            };
            let object = Service::object_ref_for(service);
            if let Err(e) = recorder.publish(&event, &object).await {
                metrics.write_error(Resource::Events);
                tracing::warn!(%service, error = %e, "cannot publish the nodeAssigned event");
            }
        }
        announced = now;
        writer.set_desired(current.records, &current.orphaned);
        for e in writer.flush().await {
            metrics.write_error(Resource::ServiceL2Statuses);
            tracing::warn!(error = %e, "ServiceL2Status write failed; retrying");
        }
        let retry = writer.is_pending();
        tokio::select! {
            changed = desired.changed() => if changed.is_err() { return },
            _ = tokio::time::sleep(RECORD_RETRY), if retry => {}
        }
    }
}

/// An object reference to a Service by key.
trait ObjectRefFor {
    fn object_ref_for(key: &ServiceKey) -> k8s_openapi::api::core::v1::ObjectReference;
}

impl ObjectRefFor for Service {
    fn object_ref_for(key: &ServiceKey) -> k8s_openapi::api::core::v1::ObjectReference {
        let mut service = Service::default();
        service.metadata.name = Some(key.name.clone());
        service.metadata.namespace = Some(key.namespace.clone());
        service.object_ref(&())
    }
}

/// What the snapshot left out: the gauge by reason, and one warning per object when it is first
/// left out (not again on every rebuild).
#[derive(Debug, Default)]
struct DroppedReport {
    gauge: Family<DroppedLabels, Gauge>,
    /// The messages of the last rebuild's drops.
    seen: BTreeSet<String>,
    /// The reasons the gauge holds.
    reasons: BTreeSet<&'static str>,
}

impl DroppedReport {
    fn update(&mut self, built: &snapshot::Built) {
        let mut counts: BTreeMap<&'static str, i64> = BTreeMap::new();
        let mut seen = BTreeSet::new();
        for d in &built.dropped {
            *counts.entry(d.as_str()).or_default() += 1;
            let message = d.to_string();
            if !self.seen.contains(&message) {
                tracing::warn!(reason = d.as_str(), "not served: {message}");
            }
            seen.insert(message);
        }
        // Set in place: a scrape never sees the family emptied.
        for gone in self.reasons.iter().filter(|r| !counts.contains_key(*r)) {
            self.gauge.remove(&DroppedLabels { reason: gone });
        }
        for (reason, n) in &counts {
            self.gauge.get_or_create(&DroppedLabels { reason }).set(*n);
        }
        self.reasons = counts.into_keys().collect();
        self.seen = seen;
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
            let text =
                std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
            parse_key_file(&text).map_err(|errors| {
                errors
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; ")
            })?
        }
        None => vec![crate::standalone::insecure_key(&settings.cluster)],
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

    use crate::http::metrics_text as encode;

    #[test]
    fn drops_are_counted_by_reason_in_place_and_cleared_when_gone() {
        let mut registry = Registry::default();
        let mut report = DroppedReport::default();
        registry.register("swimlb_snapshot_dropped", "drops", report.gauge.clone());
        let outside = |name: &str, ip: &str| snapshot::Dropped::OutsidePools {
            service: ServiceKey::new("ns", name),
            ip: ip.parse().unwrap(),
        };
        let built = |dropped| snapshot::Built {
            dropped,
            ..snapshot::Built::default()
        };
        report.update(&built(vec![
            outside("a", "192.0.2.1"),
            outside("b", "192.0.2.2"),
        ]));
        assert!(
            encode(&registry).contains(r#"swimlb_snapshot_dropped{reason="outside_pools"} 2"#),
            "{}",
            encode(&registry)
        );
        assert_eq!(report.seen.len(), 2);
        report.update(&built(vec![]));
        assert!(
            !encode(&registry).contains("outside_pools"),
            "{}",
            encode(&registry)
        );
        assert!(report.seen.is_empty());
    }

    #[test]
    fn a_service_key_is_namespace_slash_name() {
        assert_eq!(service_key("ns/web"), Some(ServiceKey::new("ns", "web")));
        assert_eq!(service_key("api"), None, "a standalone group is no Service");
    }
}
