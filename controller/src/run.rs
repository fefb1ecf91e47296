//! The running controller: leader election, watches, the Service controller, pool status and
//! releases, until a shutdown signal or the loss of the lease.
//!
//! [`run`] owns the order that makes restarts safe:
//!
//! 1. Serve `/metrics`, `/healthz`, `/readyz`; take part in the election for the Lease
//!    `--lease-namespace/--lease-name` (kube-lease-manager). A standby only waits: it opens no
//!    watch and writes nothing.
//! 2. Once leader: reflectors over Namespaces, the IPAddressPools and L2Advertisements of the
//!    configuration namespace (`--namespace`, where the speakers read theirs; a pool elsewhere
//!    is only reported, [`crate::stray_pools`]), and one reflector over Services, trimmed to what the controller reads ([`trim_service`]), that
//!    feeds the `kube::runtime::Controller` (`Controller::for_stream`) and whose store this loop
//!    also reads: one cache of the Services, not two. A change of a Namespace's labels
//!    re-reconciles the Services of that namespace (a pool's `namespaceSelectors` may now admit
//!    or refuse them).
//! 3. When every store is ready: validate the pools ([`config_in_force`]), `set_pools`, then load
//!    every existing assignment from the Service statuses ([`Context::load_existing`]). Only then
//!    does a reconcile run (each one waits for the `loaded` flag first). Addresses that no pool
//!    in force has (a pool rejected at this start, or deleted) stay with their Services, with a
//!    Warning Event (`AddressOutsidePools`) and the gauge `swimlb_addresses_outside_pools`:
//!    a restart never changes an address.
//! 4. Then, until shutdown: a configuration change re-validates and, when it applies,
//!    re-reconciles every Service; once a second, Services gone from the store release their
//!    addresses ([`Context::forget_missing`]) and every pool's status is written when it changed.
//!    An invalid pool gets a Warning Event (once per distinct set of errors) and a `Valid=False`
//!    status condition, and the last configuration in force stays.
//! 5. On SIGTERM (the `shutdown` future) the controller drains its running reconciles and the
//!    lease is released. Losing the lease stops everything as well, and [`run`] returns
//!    [`RunError::LostLease`] so the process exits and restarts from a fresh load.
//!
//! Every pool's status carries a `Valid` condition ([`valid_condition`]): False with the errors
//! while the pool is rejected.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{FutureExt, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{Controller, WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use kube_lease_manager::LeaseManagerBuilder;
use prometheus_client::registry::Registry;
use swimlb_config::crd::{IPAddressPool, IPAddressPoolStatus, L2Advertisement};
use swimlb_config::events::Reason;
use swimlb_config::pools::{ConfigError, Model, ObjectKind, Validated, validate};
use tokio::sync::watch;

use crate::allocator::Allocator;
use crate::http::Health;
use crate::metrics::{ApiResource, ControllerMetrics};
use swimlb_config::reflect::{
    Relists, RetryBackoff, Seen, spawn_store_observed, trim_meta, watch_config,
};
use swimlb_config::service::trim_service;

use crate::reconcile::{
    Context, FIELD_MANAGER, apply_pool_status, error_policy, pool_statuses, reconcile,
};

/// How often deleted Services are released and pool statuses written.
pub const HOUSEKEEPING_INTERVAL: Duration = Duration::from_secs(1);
/// At most this many reconciles (and so API writes) run at once: unbounded, a thousand new
/// Services opened a thousand connections at once.
pub const RECONCILE_CONCURRENCY: u16 = 16;
/// How long a shutdown waits for running reconciles.
pub const DRAIN_DEADLINE: Duration = Duration::from_secs(10);
/// How long a shutdown waits for the lease to be released.
pub const RELEASE_DEADLINE: Duration = Duration::from_secs(5);

/// What the controller runs with (from the command line).
#[derive(Clone, Debug)]
pub struct Settings {
    /// Serve Services of exactly this `loadBalancerClass` (`None`: Services without a class).
    pub load_balancer_class: Option<String>,
    /// The configuration namespace: the only one whose pools and advertisements are read.
    pub namespace: String,
    /// The Lease's namespace.
    pub lease_namespace: String,
    /// The Lease's name.
    pub lease_name: String,
    /// This replica's identity in the Lease and in Events.
    pub identity: String,
    /// The Lease duration in seconds (a standby takes over at most this long after the leader
    /// stops renewing).
    pub lease_duration_seconds: u64,
    /// The HTTP listen address.
    pub listen: SocketAddr,
    /// The speakers' gossip key Secret, in the Lease's namespace, that the leader creates when
    /// it is missing (`None`: never).
    pub gossip_key_secret: Option<String>,
}

/// Why the controller stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The HTTP port could not be bound.
    #[error("--listen {addr}: {source}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// The bind error.
        #[source]
        source: std::io::Error,
    },
    /// The lease manager could not start.
    #[error("Lease {namespace}/{name}: {source}")]
    Lease {
        /// The Lease's namespace.
        namespace: String,
        /// The Lease's name.
        name: String,
        /// The lease manager's error.
        #[source]
        source: kube_lease_manager::LeaseManagerError,
    },
    /// Another replica took the lease, or the lease task ended, while this one led.
    #[error(
        "Lease {namespace}/{name}: leadership lost; exiting so a restart reloads every assignment"
    )]
    LostLease {
        /// The Lease's namespace.
        namespace: String,
        /// The Lease's name.
        name: String,
    },
}

impl RunError {
    /// The log word.
    pub fn as_str(&self) -> &'static str {
        match self {
            RunError::Listen { .. } => "listen",
            RunError::Lease { .. } => "lease",
            RunError::LostLease { .. } => "lost_lease",
        }
    }
}

/// What to do with a freshly validated configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConfigDecision {
    /// Put this model in force (no pool error, or nothing was in force yet: the valid part).
    Apply(Model),
    /// A pool is invalid: the configuration in force stays.
    KeepPrevious,
}

impl ConfigDecision {
    /// The log word.
    pub fn as_str(&self) -> &'static str {
        match self {
            ConfigDecision::Apply(_) => "apply",
            ConfigDecision::KeepPrevious => "keep_previous",
        }
    }
}

/// Decides which pools are in force (pure). Advertisement errors never block pools (the
/// controller does not use advertisements). With an invalid pool, the previous configuration
/// stays in force, as MetalLB does; at the start, with nothing in force, the valid pools apply.
pub fn config_in_force(previous: Option<&Model>, validated: &Validated) -> ConfigDecision {
    let pool_error = validated
        .errors
        .iter()
        .any(|e| e.kind == ObjectKind::IPAddressPool);
    match (pool_error, previous) {
        (true, Some(_)) => ConfigDecision::KeepPrevious,
        _ => ConfigDecision::Apply(validated.model.clone()),
    }
}

/// The errors of each pool, by (namespace, name) (pure).
pub fn pool_errors(errors: &[ConfigError]) -> BTreeMap<(String, String), Vec<String>> {
    let mut out: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for e in errors
        .iter()
        .filter(|e| e.kind == ObjectKind::IPAddressPool)
    {
        out.entry((e.namespace.clone(), e.name.clone()))
            .or_default()
            .push(e.to_string());
    }
    out
}

/// Why the leader stops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stop {
    Signal,
    LostLease,
}

/// Runs the controller until `shutdown` resolves (then drains and releases the lease) or the
/// lease is lost.
pub async fn run(
    client: Client,
    settings: Settings,
    registry: Registry,
    metrics: ControllerMetrics,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), RunError> {
    let (health_tx, health_rx) = watch::channel(Health::default());
    let (bound, http_task) = crate::http::spawn(
        settings.listen,
        health_rx,
        Arc::new(registry),
        metrics.listener.clone(),
    )
    .await
    .map_err(|source| RunError::Listen {
        addr: settings.listen,
        source,
    })?;
    tracing::info!(listen = %bound, identity = %settings.identity, "serving /metrics /healthz /readyz");

    let (stop_tx, stop_rx) = watch::channel(None::<Stop>);
    let signal_stop = stop_tx.clone();
    tokio::spawn(async move {
        shutdown.await;
        let _ = signal_stop.send(Some(Stop::Signal));
    });

    let Some(lease) = lease_manager_retrying(&client, &settings, stop_rx.clone()).await else {
        // Stopped before the API server first answered: nothing to drain or release.
        http_task.abort();
        return Ok(());
    };
    tracing::debug!("lease manager built");
    let (mut leader, lease_task) = lease.watch().await;
    health_tx.send_modify(|h| h.ready = true);

    let became_leader = wait_for_lease(&mut leader, stop_rx.clone(), &settings.lease_name).await;

    let outcome = if became_leader {
        tracing::info!(lease = %settings.lease_name, "leader: starting");
        health_tx.send_modify(|h| {
            h.leader = true;
            h.ready = false;
        });
        let mut lost = leader.clone();
        let lease_stop = stop_tx.clone();
        tokio::spawn(async move {
            let _ = lost.wait_for(|l| !*l).await;
            let _ = lease_stop.send(Some(Stop::LostLease));
        });
        if let Some(name) = settings.gossip_key_secret.clone() {
            tokio::spawn(crate::gossip_key::ensure_with_retries(
                client.clone(),
                settings.lease_namespace.clone(),
                name,
                metrics.clone(),
            ));
        }
        lead(
            client,
            &settings,
            metrics,
            health_tx.clone(),
            stop_rx.clone(),
        )
        .await;
        match *stop_rx.borrow() {
            Some(Stop::LostLease) => Err(RunError::LostLease {
                namespace: settings.lease_namespace.clone(),
                name: settings.lease_name.clone(),
            }),
            _ => Ok(()),
        }
    } else if *leader.borrow() || stop_rx.borrow().is_some() {
        Ok(())
    } else {
        Err(RunError::LostLease {
            namespace: settings.lease_namespace.clone(),
            name: settings.lease_name.clone(),
        })
    };

    health_tx.send_modify(|h| h.draining = true);
    // Dropping the last receiver makes the lease task release the lease and end.
    drop(leader);
    match tokio::time::timeout(RELEASE_DEADLINE, lease_task).await {
        Ok(Ok(Ok(_))) => tracing::info!(lease = %settings.lease_name, "lease released"),
        Ok(Ok(Err(e))) => tracing::warn!(error = %e, "lease release failed"),
        Ok(Err(e)) => tracing::warn!(error = %e, "lease task failed"),
        Err(_) => tracing::warn!("lease release timed out"),
    }
    http_task.abort();
    outcome
}

/// How long the first attempts to build the lease manager wait between them (doubling up to
/// [`LEASE_RETRY_MAX`]).
const LEASE_RETRY_MIN: Duration = Duration::from_millis(500);
/// The longest wait between two attempts to build the lease manager.
const LEASE_RETRY_MAX: Duration = Duration::from_secs(10);

/// The lease manager, built as soon as the API server answers: a Pod started before its node's
/// service rules (the API server's ClusterIP) or before the API server itself waits for them,
/// with a warning per failed attempt, instead of exiting into the kubelet's restart backoff.
/// `None` when `stop` fired first.
async fn lease_manager_retrying(
    client: &Client,
    settings: &Settings,
    mut stop: watch::Receiver<Option<Stop>>,
) -> Option<kube_lease_manager::LeaseManager> {
    let mut wait = LEASE_RETRY_MIN;
    loop {
        match lease_manager(client, settings).await {
            Ok(lease) => return Some(lease),
            Err(e) => {
                tracing::warn!(error = %e, retry_in = ?wait, "cannot start the lease manager yet")
            }
        }
        tokio::select! {
            _ = stop.wait_for(Option::is_some) => return None,
            () = tokio::time::sleep(wait) => {}
        }
        wait = (wait * 2).min(LEASE_RETRY_MAX);
    }
}

/// The lease manager of `settings`' lease.
async fn lease_manager(
    client: &Client,
    settings: &Settings,
) -> Result<kube_lease_manager::LeaseManager, RunError> {
    let duration = settings.lease_duration_seconds.max(2);
    LeaseManagerBuilder::new(client.clone(), &settings.lease_name)
        .with_namespace(&settings.lease_namespace)
        .with_identity(&settings.identity)
        .with_field_manager(FIELD_MANAGER)
        .with_duration(duration)
        .with_grace((duration / 3).max(1))
        .build()
        .await
        .map_err(|source| RunError::Lease {
            namespace: settings.lease_namespace.clone(),
            name: settings.lease_name.clone(),
            source,
        })
}

/// A standby waits for the lease (true) or the stop (false).
async fn wait_for_lease(
    leader: &mut watch::Receiver<bool>,
    mut stop: watch::Receiver<Option<Stop>>,
    lease: &str,
) -> bool {
    loop {
        if *leader.borrow_and_update() {
            return true;
        }
        tracing::info!(%lease, "standby: waiting for the lease");
        tokio::select! {
            _ = stop.wait_for(Option::is_some) => return false,
            changed = leader.changed() => if changed.is_err() { return false },
        }
    }
}

/// Resolves when `stop` fires (or its sender is gone).
async fn stopped(mut stop: watch::Receiver<Option<Stop>>) {
    let _ = stop.wait_for(Option::is_some).await;
}

/// Reflects the Namespaces into a store, driven by a background task that sends every
/// Namespace whose labels changed (not the first sight of one: nothing was decided with labels
/// it did not have yet) on the returned channel. The task ends when `stop` fires.
fn reflect_namespaces(
    api: Api<Namespace>,
    metrics: ControllerMetrics,
    mut stop: watch::Receiver<Option<Stop>>,
) -> (
    Store<Namespace>,
    futures::channel::mpsc::UnboundedReceiver<Namespace>,
) {
    let (reader, writer) = reflector::store();
    let (changed_tx, changed_rx) = futures::channel::mpsc::unbounded();
    let stream = watcher(api, watch_config())
        .backoff(RetryBackoff::new())
        .modify(|ns: &mut Namespace| trim_meta(ns.meta_mut()))
        .reflect(writer);
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        let mut labels = BTreeMap::<String, BTreeMap<String, String>>::new();
        loop {
            let event = tokio::select! {
                _ = stop.wait_for(Option::is_some) => return,
                event = stream.next() => event,
            };
            match event {
                None => return,
                Some(Err(e)) => {
                    metrics.watch_error(ApiResource::Namespaces);
                    tracing::warn!(error = %e, "namespace watch failed; retrying");
                }
                Some(Ok(watcher::Event::Apply(ns) | watcher::Event::InitApply(ns))) => {
                    if namespace_labels_changed(&mut labels, &ns) {
                        tracing::debug!(namespace = %ns.name_any(), "namespace labels changed");
                        let _ = changed_tx.unbounded_send(ns);
                    }
                }
                Some(Ok(watcher::Event::Delete(ns))) => {
                    labels.remove(&ns.name_any());
                }
                Some(Ok(watcher::Event::Init | watcher::Event::InitDone)) => {}
            }
        }
    });
    (reader, changed_rx)
}

/// Records `ns`'s labels in `known` and tells whether they differ from those recorded before
/// (pure; false for a Namespace seen for the first time).
pub fn namespace_labels_changed(
    known: &mut BTreeMap<String, BTreeMap<String, String>>,
    ns: &Namespace,
) -> bool {
    let now = ns.labels().clone();
    match known.insert(ns.name_any(), now.clone()) {
        Some(before) => before != now,
        None => false,
    }
}

/// A store observer: every event tells `changed`, every watch error is counted.
fn observe<K>(
    changed: &futures::channel::mpsc::UnboundedSender<()>,
    metrics: &ControllerMetrics,
    resource: ApiResource,
) -> impl FnMut(Seen<'_, K>) + Send + 'static {
    let changed = changed.clone();
    let metrics = metrics.clone();
    move |seen| match seen {
        Seen::Event(_) => {
            let _ = changed.unbounded_send(());
        }
        Seen::Error(_) => metrics.watch_error(resource),
    }
}

/// The Services of the store in `namespace`.
fn services_in(services: &Store<Service>, namespace: &str) -> Vec<ObjectRef<Service>> {
    services
        .state()
        .iter()
        .filter(|s| s.namespace().as_deref() == Some(namespace))
        .map(|s| ObjectRef::from_obj(s.as_ref()))
        .collect()
}

/// What housekeeping remembers between rounds.
#[derive(Default)]
struct Housekeeping {
    in_force: Option<Model>,
    /// The errors last reported per pool (an Event is published when they change).
    reported: BTreeMap<(String, String), Vec<String>>,
    /// The status last written per pool.
    written: BTreeMap<(String, String), IPAddressPoolStatus>,
}

/// The leader's caches: what the reconciler and housekeeping read.
struct Caches {
    namespaces: Store<Namespace>,
    pools: Store<IPAddressPool>,
    advertisements: Store<L2Advertisement>,
    services: Store<Service>,
    /// Set once the Service watch listed in full.
    services_ready: watch::Receiver<bool>,
}

impl Caches {
    /// Whether every cache listed in full (false: stopped first).
    async fn ready(&mut self, stop: &mut watch::Receiver<Option<Stop>>) -> bool {
        let startup = async {
            let ready = futures::future::join4(
                self.namespaces
                    .wait_until_ready()
                    .inspect(|_| tracing::debug!("namespaces ready")),
                self.pools
                    .wait_until_ready()
                    .inspect(|_| tracing::debug!("pools ready")),
                self.advertisements
                    .wait_until_ready()
                    .inspect(|_| tracing::debug!("advertisements ready")),
                self.services_ready
                    .wait_for(|ready| *ready)
                    .map(|r| r.map(|_| ()))
                    .inspect(|_| tracing::debug!("services ready")),
            )
            .await;
            tracing::debug!(?ready, "stores");
            ready.0.is_ok() && ready.1.is_ok() && ready.2.is_ok() && ready.3.is_ok()
        };
        tokio::select! {
            r = startup => r,
            _ = stop.wait_for(Option::is_some) => false,
        }
    }
}

/// What the leader's loop holds of the running Service controller.
struct Running {
    ctx: Arc<Context>,
    recorder: Recorder,
    /// Set once every existing assignment is loaded: no reconcile decides before.
    loaded: watch::Sender<bool>,
    /// Asks the controller to reconcile every Service again.
    resync: futures::channel::mpsc::UnboundedSender<()>,
    task: tokio::task::JoinHandle<()>,
}

/// The leader's work, until `stop` fires.
async fn lead(
    client: Client,
    settings: &Settings,
    metrics: ControllerMetrics,
    health: watch::Sender<Health>,
    stop: watch::Receiver<Option<Stop>>,
) {
    let (config_tx, mut config_rx) = futures::channel::mpsc::unbounded::<()>();
    let (namespaces, namespace_changes) = reflect_namespaces(
        Api::<Namespace>::all(client.clone()),
        metrics.clone(),
        stop.clone(),
    );
    let pools = spawn_store_observed(
        Api::<IPAddressPool>::namespaced(client.clone(), &settings.namespace),
        watch_config(),
        |_| {},
        observe(&config_tx, &metrics, ApiResource::IpAddressPools),
        Relists::never(),
        stopped(stop.clone()),
    );
    let advertisements = spawn_store_observed(
        Api::<L2Advertisement>::namespaced(client.clone(), &settings.namespace),
        watch_config(),
        |_| {},
        observe(&config_tx, &metrics, ApiResource::L2Advertisements),
        Relists::never(),
        stopped(stop.clone()),
    );
    drop(config_tx);
    // One cache of the Services, trimmed to what the controller reads: the Controller is fed
    // from this reflector (and drives it), and this loop reads the same store for the load
    // before the first reconcile and for releases.
    let (services, service_writer) = reflector::store();
    let (services_ready_tx, services_ready) = watch::channel(false);
    let service_events = watcher(Api::<Service>::all(client.clone()), watch_config())
        .backoff(RetryBackoff::new())
        .modify(trim_service)
        .reflect(service_writer)
        // Readiness from the stream itself: a second waiter on the store's `wait_until_ready`
        // (the Controller is the first) is not woken when it becomes ready (kube-runtime 5).
        .inspect_ok(move |event| {
            if matches!(event, watcher::Event::InitDone) {
                services_ready_tx.send_replace(true);
            }
        })
        .applied_objects();
    let mut caches = Caches {
        namespaces,
        pools,
        advertisements,
        services,
        services_ready,
    };
    let by_namespace = caches.services.clone();
    let controller = Controller::for_stream(service_events, caches.services.clone())
        // A Namespace's labels decide which pools may serve its Services.
        .watches_stream(namespace_changes.map(Ok), move |ns: Namespace| {
            services_in(&by_namespace, &ns.name_any())
        })
        .with_config(
            kube::runtime::controller::Config::default().concurrency(RECONCILE_CONCURRENCY),
        );
    let running = run_controller(
        controller,
        client.clone(),
        settings,
        metrics,
        &caches,
        &stop,
    );
    tokio::spawn(crate::stray_pools::report(
        Api::<crate::stray_pools::PoolMeta>::all(client),
        settings.namespace.clone(),
        running.recorder.clone(),
        running.ctx.metrics.clone(),
        stopped(stop.clone()),
    ));
    let mut stopped = stop.clone();
    let ready = caches.ready(&mut stopped).await;
    tracing::debug!(ready, "caches");
    if ready {
        let mut state = Housekeeping::default();
        apply_config(
            &running.ctx,
            &running.recorder,
            &caches.pools,
            &caches.advertisements,
            &mut state,
        )
        .await;
        load_existing(&running.ctx, &caches.services);
        let _ = running.loaded.send(true);
        health.send_modify(|h| h.ready = true);
        housekeep(&running, &caches, &mut config_rx, &mut state, &mut stopped).await;
    }
    let Running {
        resync,
        loaded,
        task,
        ..
    } = running;
    drop(resync);
    // Reconciles still waiting for the load (a stop before the caches were ready) go on and
    // find the allocator not loaded: they write nothing.
    drop(loaded);
    match tokio::time::timeout(DRAIN_DEADLINE, task).await {
        Ok(_) => tracing::info!("controller drained"),
        Err(_) => tracing::warn!("controller drain timed out"),
    }
}

/// Starts the Service controller: its reconciles wait until the existing assignments are
/// loaded ([`Running::loaded`]), and it drains when `stop` fires.
fn run_controller(
    controller: Controller<Service>,
    client: Client,
    settings: &Settings,
    metrics: ControllerMetrics,
    caches: &Caches,
    stop: &watch::Receiver<Option<Stop>>,
) -> Running {
    let reporter = Reporter {
        controller: FIELD_MANAGER.into(),
        instance: Some(settings.identity.clone()),
    };
    let recorder = Recorder::new(client.clone(), reporter.clone());
    let ctx = Arc::new(Context {
        client,
        allocator: Arc::new(Mutex::new(Allocator::new(
            settings.load_balancer_class.clone(),
            &Model::default(),
        ))),
        namespaces: caches.namespaces.clone(),
        recorder: recorder.clone(),
        reporter,
        metrics,
    });
    let (loaded, loaded_rx) = watch::channel(false);
    let (resync, resync_rx) = futures::channel::mpsc::unbounded::<()>();
    let mut graceful = stop.clone();
    let reconciler = move |svc: Arc<Service>, ctx: Arc<Context>| {
        let mut loaded = loaded_rx.clone();
        async move {
            // Nothing is decided before every existing assignment is loaded.
            let _ = loaded.wait_for(|l| *l).await;
            reconcile(svc, ctx).await
        }
    };
    let watch_metrics = ctx.metrics.clone();
    let task = tokio::spawn(
        controller
            .reconcile_all_on(resync_rx)
            .graceful_shutdown_on(async move {
                let _ = graceful.wait_for(Option::is_some).await;
            })
            .run(reconciler, error_policy, ctx.clone())
            .for_each(move |result| {
                match result {
                    // The Service watch (it retries with backoff).
                    Err(e @ kube::runtime::controller::Error::QueueError(_)) => {
                        watch_metrics.watch_error(ApiResource::Services);
                        tracing::warn!(error = %e, "service watch failed; retrying");
                    }
                    Err(e) => tracing::debug!(error = %e, "controller"),
                    Ok(_) => {}
                }
                async {}
            }),
    );
    Running {
        ctx,
        recorder,
        loaded,
        resync,
        task,
    }
}

/// Loads the assignments the Services already hold, before the first reconcile.
fn load_existing(ctx: &Context, services: &Store<Service>) {
    let existing = services.state();
    match ctx.load_existing(existing.iter().map(AsRef::as_ref)) {
        Ok(conflicts) => {
            for c in &conflicts {
                tracing::warn!(service = %c.service, reason = c.error.as_str(), error = %c.error, "existing assignment not honoured");
            }
            tracing::info!(
                services = existing.len(),
                conflicts = conflicts.len(),
                "existing assignments loaded"
            );
        }
        Err(e) => tracing::error!(error = %e, "cannot load existing assignments"),
    }
}

/// The leader's loop once loaded: configuration changes re-validated (a burst at once), and
/// every [`HOUSEKEEPING_INTERVAL`] the addresses of deleted Services released and the pools'
/// statuses written; until `stop` fires.
async fn housekeep(
    running: &Running,
    caches: &Caches,
    config_rx: &mut futures::channel::mpsc::UnboundedReceiver<()>,
    state: &mut Housekeeping,
    stop: &mut watch::Receiver<Option<Stop>>,
) {
    let Running {
        ctx,
        recorder,
        resync,
        ..
    } = running;
    let mut tick = tokio::time::interval(HOUSEKEEPING_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.wait_for(Option::is_some) => break,
            Some(()) = config_rx.next() => {
                while config_rx.try_recv().is_ok() {}
                if apply_config(ctx, recorder, &caches.pools, &caches.advertisements, state).await {
                    let _ = resync.unbounded_send(());
                }
            }
            _ = tick.tick() => {
                match ctx.forget_missing(&caches.services) {
                    Ok(gone) if !gone.is_empty() => {
                        tracing::info!(released = gone.len(), "released the addresses of deleted Services");
                        let _ = resync.unbounded_send(());
                    }
                    Ok(_) => {}
                    Err(e) => tracing::error!(error = %e, "cannot release"),
                }
                // Whole seconds: what the API keeps of a transition time.
                let now = Timestamp::from_second(Timestamp::now().as_second()).unwrap_or(Timestamp::UNIX_EPOCH);
                write_pool_statuses(ctx, &caches.pools, state, now).await;
            }
        }
    }
}

/// Re-validates the pools and puts the decision in force. Returns whether the pools changed.
async fn apply_config(
    ctx: &Context,
    recorder: &Recorder,
    pools: &Store<IPAddressPool>,
    advertisements: &Store<L2Advertisement>,
    state: &mut Housekeeping,
) -> bool {
    let pool_objects: Vec<IPAddressPool> = pools.state().iter().map(|p| (**p).clone()).collect();
    let ad_objects: Vec<L2Advertisement> = advertisements
        .state()
        .iter()
        .map(|a| (**a).clone())
        .collect();
    let validated = validate(&pool_objects, &ad_objects);
    for e in &validated.errors {
        tracing::warn!(error = %e, "invalid configuration");
    }
    let errors = pool_errors(&validated.errors);
    for ((namespace, name), messages) in &errors {
        if state.reported.get(&(namespace.clone(), name.clone())) == Some(messages) {
            continue;
        }
        let Some(pool) = pool_objects
            .iter()
            .find(|p| p.namespace().as_deref() == Some(namespace) && &p.name_any() == name)
        else {
            continue;
        };
        let event = Event {
            type_: EventType::Warning,
            reason: Reason::InvalidConfiguration.as_str().into(),
            note: Some(messages.join("; ")),
            action: "Validate".into(),
            secondary: None,
        };
        if let Err(e) = recorder.publish(&event, &pool.object_ref(&())).await {
            ctx.metrics.write_error(ApiResource::Events);
            tracing::warn!(pool = %name, error = %e, "cannot publish event");
        }
    }
    state.reported = errors;
    let decision = config_in_force(state.in_force.as_ref(), &validated);
    match decision {
        ConfigDecision::Apply(model) => {
            if state.in_force.as_ref() == Some(&model) {
                return false;
            }
            tracing::info!(
                decision = "apply",
                pools = model.pools.len(),
                errors = validated.errors.len(),
                "configuration"
            );
            match ctx.allocator.lock() {
                Ok(mut allocator) => {
                    allocator.set_pools(&model);
                    ctx.metrics.observe_usage(&allocator.usage());
                }
                Err(_) => {
                    tracing::error!("the allocator lock is poisoned");
                    return false;
                }
            }
            state.in_force = Some(model);
            true
        }
        ConfigDecision::KeepPrevious => {
            tracing::warn!(
                decision = "keep_previous",
                errors = validated.errors.len(),
                "configuration rejected; the previous pools stay in force"
            );
            false
        }
    }
}

/// The `Valid` condition type of a pool's status.
pub const CONDITION_VALID: &str = "Valid";

/// A pool's `Valid` condition (pure): True without errors, False with them (reason
/// `InvalidConfiguration`, the errors in the message). The transition time is `previous`'s when
/// the status is unchanged, else `now`.
pub fn valid_condition(
    errors: Option<&Vec<String>>,
    generation: Option<i64>,
    previous: Option<&Condition>,
    now: Timestamp,
) -> Condition {
    let (status, reason, message) = match errors {
        Some(e) if !e.is_empty() => ("False", "InvalidConfiguration", e.join("; ")),
        _ => ("True", "Valid", String::new()),
    };
    let last_transition_time = match previous {
        Some(p) if p.status == status => p.last_transition_time.clone(),
        _ => Time(now),
    };
    Condition {
        last_transition_time,
        message,
        observed_generation: generation,
        reason: reason.into(),
        status: status.into(),
        type_: CONDITION_VALID.into(),
    }
}

/// Writes the status (counts and the `Valid` condition) of every pool object whose status
/// changed since the last write.
async fn write_pool_statuses(
    ctx: &Context,
    pools: &Store<IPAddressPool>,
    state: &mut Housekeeping,
    now: Timestamp,
) {
    let usage = match ctx.allocator.lock() {
        Ok(allocator) => {
            let kept = i64::try_from(allocator.kept_outside_pools()).unwrap_or(i64::MAX);
            ctx.metrics.addresses_outside_pools.set(kept);
            allocator.usage()
        }
        Err(_) => return,
    };
    let statuses = pool_statuses(&usage);
    let mut present = BTreeMap::new();
    for pool in pools.state() {
        let key = (pool.namespace().unwrap_or_default(), pool.name_any());
        let mut status = statuses.get(&key.1).cloned().unwrap_or_default();
        let previous = pool
            .status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == CONDITION_VALID))
            .or_else(|| {
                state
                    .written
                    .get(&key)
                    .and_then(|s| s.conditions.iter().find(|c| c.type_ == CONDITION_VALID))
            });
        status.conditions = vec![valid_condition(
            state.reported.get(&key),
            pool.metadata.generation,
            previous,
            now,
        )];
        let already = pool.status.is_some() && state.written.get(&key) == Some(&status);
        if !already {
            match apply_pool_status(&ctx.client, &key.0, &key.1, &status).await {
                Ok(()) => {}
                Err(e) => {
                    ctx.metrics.write_error(ApiResource::IpAddressPools);
                    tracing::warn!(error = %e, "pool status");
                    continue;
                }
            }
        }
        present.insert(key, status);
    }
    state.written = present;
}

/// A shutdown future for SIGTERM and SIGINT.
pub fn signals() -> std::io::Result<impl Future<Output = ()> + Send + 'static> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
            _ = int.recv() => tracing::info!("SIGINT: shutting down"),
        }
    }
    .boxed())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(name: &str, addresses: &[&str]) -> IPAddressPool {
        IPAddressPool::with_addresses("swimlb", name, addresses)
    }

    #[test]
    fn with_an_invalid_pool_the_previous_configuration_stays_in_force() {
        let good = validate(&[pool("a", &["192.0.2.0/28"])], &[]);
        let ConfigDecision::Apply(first) = config_in_force(None, &good) else {
            panic!("a valid configuration applies");
        };
        assert_eq!(first.pools.len(), 1);
        let bad = validate(
            &[pool("a", &["192.0.2.0/28"]), pool("b", &["192.0.2.300"])],
            &[],
        );
        assert!(!bad.errors.is_empty());
        assert_eq!(
            config_in_force(Some(&first), &bad),
            ConfigDecision::KeepPrevious
        );
    }

    #[test]
    fn the_valid_condition_turns_false_with_the_errors_and_keeps_its_time_while_unchanged() {
        let t0 = Timestamp::from_second(1_000).expect("valid");
        let t1 = Timestamp::from_second(2_000).expect("valid");
        let ok = valid_condition(None, Some(1), None, t0);
        assert_eq!((ok.status.as_str(), ok.reason.as_str()), ("True", "Valid"));
        let still = valid_condition(None, Some(2), Some(&ok), t1);
        assert_eq!(still.last_transition_time, Time(t0));
        assert_eq!(still.observed_generation, Some(2));
        let errors = vec!["spec.addresses[0]: bad".to_string()];
        let bad = valid_condition(Some(&errors), Some(3), Some(&still), t1);
        assert_eq!(bad.status, "False");
        assert_eq!(bad.reason, "InvalidConfiguration");
        assert!(bad.message.contains("spec.addresses[0]"));
        assert_eq!(bad.last_transition_time, Time(t1));
    }

    #[test]
    fn a_namespace_label_change_is_reported_and_its_first_sight_is_not() {
        let ns = |labels: serde_json::Value| -> Namespace {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": "team-a", "labels": labels},
            }))
            .expect("valid namespace")
        };
        let mut known = BTreeMap::new();
        assert!(!namespace_labels_changed(
            &mut known,
            &ns(serde_json::json!({}))
        ));
        assert!(!namespace_labels_changed(
            &mut known,
            &ns(serde_json::json!({}))
        ));
        assert!(namespace_labels_changed(
            &mut known,
            &ns(serde_json::json!({"team": "a"}))
        ));
        assert!(!namespace_labels_changed(
            &mut known,
            &ns(serde_json::json!({"team": "a"}))
        ));
        assert!(namespace_labels_changed(
            &mut known,
            &ns(serde_json::json!({}))
        ));
    }

    #[test]
    fn at_the_start_the_valid_pools_apply_even_beside_an_invalid_one() {
        let mixed = validate(
            &[pool("a", &["192.0.2.0/28"]), pool("b", &["nonsense"])],
            &[],
        );
        let decision = config_in_force(None, &mixed);
        assert_eq!(decision.as_str(), "apply");
        let ConfigDecision::Apply(model) = decision else {
            panic!("applies");
        };
        assert!(model.pools.contains_key("a"));
        assert!(!model.pools.contains_key("b"));
        let errors = pool_errors(&mixed.errors);
        assert_eq!(
            errors.keys().cloned().collect::<Vec<_>>(),
            vec![("swimlb".to_string(), "b".to_string())]
        );
    }
}
