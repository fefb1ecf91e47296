//! A fake Kubernetes API server for tests: an in-memory object store served over HTTP on
//! 127.0.0.1, reached by real `kube::Client`s through a generated kubeconfig.
//!
//! It serves Namespaces, Services, Nodes, Pods, Events (core/v1 and events.k8s.io/v1),
//! EndpointSlices, Leases and the swimlb.io/v1beta1 custom resources (IPAddressPool,
//! L2Advertisement, ServiceL2Status), and, stored with metadata checks only, what
//! `deploy/swimlb.yaml` holds (ServiceAccounts, CustomResourceDefinitions, RBAC, Deployments,
//! DaemonSets, PodDisruptionBudgets, NetworkPolicies) with: get, list (label and field selectors, `limit` and
//! `continue`), watch (newline-delimited JSON events; ADDED for the current objects when started
//! without a resourceVersion or with "0"; `sendInitialEvents` with the end bookmark; events after
//! a resourceVersion from a bounded history and an ERROR event with a 410 `Expired` Status when
//! that history no longer reaches back; periodic BOOKMARKs with `allowWatchBookmarks`; the stream
//! ends at `timeoutSeconds`), create, replace with optimistic concurrency (409 on a stale
//! resourceVersion), merge, JSON, strategic merge and apply patches, the status subresource
//! (spec and metadata changes through it are ignored; status changes through the main resource are
//! ignored), delete with finalizers (deletionTimestamp, then gone when the last finalizer goes), and
//! discovery (`/api`, `/apis`, `/api/v1`, `/apis/{g}/{v}`, `/version`, and the `/openapi/v3`
//! documents kubectl reads before it applies, without schemas).
//!
//! It rejects what a real server rejects, with the same code and reason: invalid names (422),
//! a body name or namespace that differs from the URL (400 BadRequest: the real server answers
//! BadRequest here, not 422), a create with a resourceVersion (500, as the real server), an
//! existing name (409 AlreadyExists), a stale resourceVersion (409 Conflict), a PUT of a custom
//! resource without resourceVersion (422), a missing namespace (404), unknown resources (404), a
//! malformed body (400), unsupported patch types and strategic merge on custom resources (415),
//! bad selectors or unsupported field selectors (400), new finalizers on a deleting object (422),
//! and the kind-specific checks in [`validation`]: Services (type, ports, nodePorts, clusterIPs and
//! IP families, loadBalancerClass, ingress IPs), Pods (containers; the spec is immutable except
//! images, as in the real server), EndpointSlices, Leases, Events, labels, annotations and
//! finalizers everywhere. Defaults the real server applies and controllers see: Service
//! clusterIP(s), ipFamilies/ipFamilyPolicy, nodePorts, port protocol and targetPort,
//! sessionAffinity, traffic policies, `status.loadBalancer.ingress[].ipMode: VIP`; Pod phase
//! Pending; Namespace phase Active; a status given on create is dropped for Services and custom
//! resources with a status subresource.
//!
//! Simplified, compared with a real server:
//! - Custom resources are checked against their CRD's structural schema by [`schema`]: types
//!   and required fields (422), unknown fields pruned, defaults applied; formats, enums,
//!   patterns and CEL rules are not checked, and `fieldValidation` is ignored (unknown fields
//!   are pruned silently, as with `fieldValidation=Ignore`).
//! - Server-side apply treats every list as atomic (see [`apply`]): right for custom resources
//!   without list markers and for `status.loadBalancer.ingress`, coarser than the real server for
//!   core lists with merge keys (ports, conditions). Strategic merge knows a fixed table of merge
//!   keys (see [`patch`]).
//! - `limit`/`continue` paginate over a snapshot taken by the first page (the last 32 snapshots
//!   are kept; an older token is 410); a list at an older `resourceVersion` with `Exact` matching
//!   is 410 instead of served from history; a watch from a resourceVersion newer than the
//!   server's is an immediate 504 ERROR event (the real server waits up to 3 s first).
//! - Service clusterIPs come from 192.0.2.0/24 and 2001:db8:ffff::/112 (documentation ranges;
//!   the fake cluster is dual-stack) and nodePorts from 30000-32767, the lowest free first (the
//!   real server picks at random); a full range refuses the Service with 422 (the real server
//!   answers 500 there).
//! - Pods are deleted at once (no graceful termination); deleting a Namespace deletes its objects
//!   at once (no Terminating phase); `propagationPolicy` is checked but there is no garbage
//!   collector; `deletecollection` is 405 and `dryRun` is 400.
//! - PUT of a missing object is 404 (some real kinds create on update); no authentication,
//!   authorization, admission webhooks or protobuf. Each request is recorded with its bearer
//!   token as the user ([`FakeApi::requests`], [`FakeApi::kubeconfig_for_user`]), like a line
//!   of an audit log, so a test can tell who wrote what.
//! - `generation` is kept for every kind (it grows when anything outside metadata and status
//!   changes).
//!
//! Use: `FakeApi::start().await?` binds 127.0.0.1 on a free port and writes a kubeconfig;
//! `client()` builds a `kube::Client` from that kubeconfig through kube's ordinary config path;
//! `create` and `create_many` seed objects directly (the same checks and defaults as a POST).
//!
//! Cost: every request takes the store's mutex; a write costs O(log n) plus the size of the
//! object (clusterIPs and nodePorts are allocated from indexes kept with the store, not by
//! scanning it), a list or a watch start O(the stored objects of that resource).
//! Tests talk over real sockets, so they run on real time (a paused tokio clock would auto-advance
//! while waiting on I/O and fire kube's timeouts).

pub mod api_error;
pub mod apply;
pub mod patch;
pub mod resources;
pub mod schema;
pub mod selector;
pub mod server;
pub mod store;
pub mod validation;

use anyhow::Context as _;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use server::Shared;
pub use server::{FakeApiConfig, RequestRecord};
use store::Store;

/// A running fake API server. Dropping it stops the server and removes its kubeconfig.
#[derive(Debug)]
pub struct FakeApi {
    addr: SocketAddr,
    kubeconfig: PathBuf,
    shared: Arc<Shared>,
    shutdown: watch::Sender<bool>,
    /// `true` while the server plays unreachable ([`FakeApi::set_reachable`]).
    outage: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
    /// Kubeconfigs written by [`FakeApi::kubeconfig_for_user`], removed on drop.
    user_kubeconfigs: Mutex<Vec<PathBuf>>,
}

impl FakeApi {
    /// Plays an API server outage (`false`) or ends it (`true`): while unreachable, every open
    /// connection (watches included) is cut and new ones are closed at once; the store, the
    /// port and the resourceVersions are kept, so clients resume (a watch from an old enough
    /// resourceVersion gets 410 Gone and re-lists, as with a real API server).
    pub fn set_reachable(&self, reachable: bool) {
        self.outage.send_replace(!reachable);
    }

    /// Starts a server with the default configuration on 127.0.0.1 (a free port).
    pub async fn start() -> anyhow::Result<Self> {
        Self::start_with(FakeApiConfig::default()).await
    }

    /// Starts a server with `config` on `config.bind` and writes its kubeconfig.
    pub async fn start_with(config: FakeApiConfig) -> anyhow::Result<Self> {
        let listener = TcpListener::bind(config.bind)
            .await
            .with_context(|| format!("binding {}", config.bind))?;
        let addr = listener.local_addr().context("reading the bound address")?;
        let (shutdown, shutdown_rx) = watch::channel(false);
        let now = store::rfc3339(
            std::time::SystemTime::now()
                .duration_since(std::time::SystemTime::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
        );
        let shared = Arc::new(Shared {
            store: Mutex::new(Store::new(config.history_capacity, &now)),
            config,
            shutdown: shutdown_rx.clone(),
            server_address: addr.to_string(),
            requests: Mutex::new(std::collections::VecDeque::new()),
        });
        let kubeconfig = std::env::temp_dir().join(format!(
            "swimlb-fake-api-{}-{}.kubeconfig",
            std::process::id(),
            addr.port()
        ));
        std::fs::write(&kubeconfig, kubeconfig_yaml(addr, None))
            .with_context(|| format!("writing {}", kubeconfig.display()))?;
        let (outage, outage_rx) = watch::channel(false);
        let task = tokio::spawn(accept_loop(
            listener,
            shared.clone(),
            shutdown_rx,
            outage_rx,
        ));
        Ok(Self {
            addr,
            kubeconfig,
            shared,
            shutdown,
            outage,
            task: Some(task),
            user_kubeconfigs: Mutex::new(Vec::new()),
        })
    }

    /// `http://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The kubeconfig file pointing at this server (no authentication, namespace `default`).
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// Writes a kubeconfig for this server whose user sends `user` as its bearer token, so that
    /// [`FakeApi::requests`] tells its requests apart (nothing is authenticated or refused).
    pub fn kubeconfig_for_user(&self, user: &str) -> anyhow::Result<PathBuf> {
        anyhow::ensure!(
            !user.is_empty() && user.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'),
            "user {user:?}: letters, digits and '-' only"
        );
        let path = std::env::temp_dir().join(format!(
            "swimlb-fake-api-{}-{}-{user}.kubeconfig",
            std::process::id(),
            self.addr.port()
        ));
        std::fs::write(&path, kubeconfig_yaml(self.addr, Some(user)))
            .with_context(|| format!("writing {}", path.display()))?;
        self.user_kubeconfigs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(path.clone());
        Ok(path)
    }

    /// The requests served so far (the last [`server::REQUEST_LOG_CAPACITY`]), oldest first.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.shared
            .requests
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .cloned()
            .collect()
    }

    /// A client built from the kubeconfig through kube's ordinary configuration path.
    pub async fn client(&self) -> anyhow::Result<kube::Client> {
        let kubeconfig = kube::config::Kubeconfig::read_from(&self.kubeconfig)
            .context("reading the fake kubeconfig")?;
        let config = kube::Config::from_custom_kubeconfig(
            kubeconfig,
            &kube::config::KubeConfigOptions::default(),
        )
        .await
        .context("loading the fake kubeconfig")?;
        kube::Client::try_from(config).context("building a client for the fake API server")
    }

    /// Every stored object of a resource named `services` or `ipaddresspools.swimlb.io`
    /// (the real server's qualified names), sorted by namespace and name.
    pub fn objects(&self, resource: &str) -> anyhow::Result<Vec<Value>> {
        let index = Self::index(resource)?;
        Ok(self.lock_store().objects(index))
    }

    /// One stored object of `resource` (as [`FakeApi::objects`] names it), if it exists.
    pub fn get(&self, resource: &str, namespace: Option<&str>, name: &str) -> Option<Value> {
        let index = Self::index(resource).ok()?;
        self.lock_store().get(index, namespace, name).ok()
    }

    /// Creates `object` directly in the store (same validation and defaults as a POST), found by
    /// its `apiVersion` and `kind`; for seeding test fixtures without a client.
    pub fn create(&self, object: Value) -> anyhow::Result<Value> {
        let ctx = seed_context();
        seed_one(&mut self.lock_store(), object, &ctx)
    }

    /// Creates every object of `objects` as [`FakeApi::create`] does, one after another under a
    /// single lock of the store (for large fixtures). Stops at the first error; the objects
    /// before it stay created. Returns how many were created.
    pub fn create_many(&self, objects: impl IntoIterator<Item = Value>) -> anyhow::Result<usize> {
        let ctx = seed_context();
        let mut store = self.lock_store();
        let mut created = 0;
        for object in objects {
            seed_one(&mut store, object, &ctx)?;
            created += 1;
        }
        Ok(created)
    }

    /// Applies a JSON merge patch (RFC 7386) to an object, or to its `/status` when `status`,
    /// as a `PATCH` with `application/merge-patch+json` would (watchers see a MODIFIED event);
    /// for tests and the lab that play the kubelet or the endpoint controller without a client.
    pub fn merge_patch(
        &self,
        resource: &str,
        namespace: Option<&str>,
        name: &str,
        patch: &Value,
        status: bool,
    ) -> anyhow::Result<Value> {
        let index = Self::index(resource)?;
        let body = serde_json::to_vec(patch).context("encoding the patch")?;
        self.lock_store()
            .patch(
                index,
                namespace,
                name,
                store::PatchKind::Merge,
                &body,
                status,
                &seed_context(),
            )
            .map_err(|e| anyhow::anyhow!("patching {resource} {name}: {e}"))
    }

    /// Deletes an object as a `DELETE` without options would.
    pub fn delete(
        &self,
        resource: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> anyhow::Result<()> {
        let index = Self::index(resource)?;
        self.lock_store()
            .delete(index, namespace, name, &Value::Null, &seed_context())
            .map(drop)
            .map_err(|e| anyhow::anyhow!("deleting {resource} {name}: {e}"))
    }

    fn index(resource: &str) -> anyhow::Result<usize> {
        resources::RESOURCES
            .iter()
            .position(|r| r.qualified_name() == resource)
            .with_context(|| format!("the fake API server does not serve {resource:?}"))
    }

    /// The current resourceVersion of the store.
    pub fn resource_version(&self) -> u64 {
        self.lock_store().resource_version()
    }

    fn lock_store(&self) -> std::sync::MutexGuard<'_, Store> {
        self.shared
            .store
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Stops accepting connections, ends every watch and waits for the accept loop.
    pub async fn shutdown(mut self) {
        let _ = self.shutdown.send(true);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
        let _ = std::fs::remove_file(&self.kubeconfig);
        let users = self
            .user_kubeconfigs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for path in users.iter() {
            let _ = std::fs::remove_file(path);
        }
    }
}

fn seed_context() -> store::WriteContext {
    store::WriteContext {
        now: store::rfc3339(
            std::time::SystemTime::now()
                .duration_since(std::time::SystemTime::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
        ),
        field_manager: Some("swimlb-fake-api-seed".into()),
        default_manager: "swimlb-fake-api-seed".into(),
        force: false,
    }
}

/// Creates `object` in `store`, found by its `apiVersion` and `kind` (namespace `default` when
/// a namespaced object names none).
fn seed_one(store: &mut Store, object: Value, ctx: &store::WriteContext) -> anyhow::Result<Value> {
    let field = |name: &str| {
        object
            .get(name)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let (api_version, kind) = (field("apiVersion"), field("kind"));
    let index = resources::find_kind(&api_version, &kind)
        .with_context(|| format!("the fake API server does not serve {api_version}/{kind}"))?;
    let namespace = resources::RESOURCES[index].namespaced.then(|| {
        object
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or("default")
            .to_string()
    });
    store
        .create(index, namespace.as_deref(), object, ctx)
        .map_err(|e| anyhow::anyhow!("seeding {api_version}/{kind}: {e}"))
}

/// A kubeconfig for the server at `addr`; with `token`, its user sends it as bearer token.
fn kubeconfig_yaml(addr: SocketAddr, token: Option<&str>) -> String {
    let user = match token {
        Some(token) => format!("{{token: {token}}}"),
        None => "{}".to_string(),
    };
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: swimlb-fake\n  cluster:\n    server: http://{addr}\ncontexts:\n- name: swimlb-fake\n  context:\n    cluster: swimlb-fake\n    user: swimlb-fake\n    namespace: default\ncurrent-context: swimlb-fake\nusers:\n- name: swimlb-fake\n  user: {user}\n"
    )
}

async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    mut shutdown: watch::Receiver<bool>,
    outage: watch::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            _ = shutdown.changed() => return,
            a = listener.accept() => a,
        };
        let Ok((stream, _)) = accepted else {
            continue;
        };
        if *outage.borrow() {
            // Unreachable: the connection is closed before a byte is read.
            drop(stream);
            continue;
        }
        let shared = shared.clone();
        let mut conn_shutdown = shutdown.clone();
        let mut conn_outage = outage.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| server::handle(shared.clone(), req));
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                _ = conn => {}
                _ = conn_shutdown.changed() => {}
                _ = conn_outage.wait_for(|down| *down) => {}
            }
        });
    }
}
