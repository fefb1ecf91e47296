//! A blocking `kube::Client` for the lab's threads and tests: any object as JSON, resolved by
//! its `apiVersion` and `kind` through the API server's discovery, so the lab writes Nodes,
//! Pods, Services and swimlb's resources alike without a table of its own.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;

use anyhow::{Context as _, Result};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::discovery::{ApiCapabilities, ApiResource, Scope};
use serde_json::Value;

/// A client of one API server as one user, usable from any thread.
pub struct Kube {
    /// Taken on drop (shut down in the background, which any context allows).
    runtime: Option<tokio::runtime::Runtime>,
    /// The network namespace connections are made from (`None`: the caller's).
    netns: Option<String>,
    client: kube::Client,
    kinds: Mutex<HashMap<(String, String), (ApiResource, ApiCapabilities)>>,
}

impl std::fmt::Debug for Kube {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kube").finish_non_exhaustive()
    }
}

impl Drop for Kube {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// Whether `err` is the API server's answer with HTTP status `code`.
pub fn is_status(err: &anyhow::Error, code: u16) -> bool {
    err.chain().any(|e| {
        matches!(e.downcast_ref::<kube::Error>(), Some(kube::Error::Api(status)) if status.code == code)
    })
}

impl Kube {
    /// The user and server of the kubeconfig at `path`, through kube's ordinary config path.
    pub fn from_kubeconfig(path: &Path) -> Result<Kube> {
        Kube::from_kubeconfig_in(path, None)
    }

    /// The same, connecting from network namespace `netns` (this one when `None`): the
    /// runtime's threads enter it, and kube's client makes its connections on them.
    pub fn from_kubeconfig_in(path: &Path, netns: Option<&str>) -> Result<Kube> {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder
            .worker_threads(1)
            .thread_name("kube-client")
            .enable_all();
        if let Some(netns) = netns {
            let netns = netns.to_string();
            builder.on_thread_start(move || {
                if let Err(e) = crate::netns::enter_netns(&netns) {
                    eprintln!("kube client thread: {e:#}");
                }
            });
        }
        let runtime = builder.build()?;
        let kubeconfig =
            Kubeconfig::read_from(path).with_context(|| format!("reading {}", path.display()))?;
        let build = async {
            let mut config =
                kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                    .await?;
            // A server that vanished (its namespace torn down) sends no reset: never wait on
            // it for long.
            config.connect_timeout = Some(std::time::Duration::from_secs(5));
            config.read_timeout = Some(std::time::Duration::from_secs(30));
            anyhow::Ok(kube::Client::try_from(config)?)
        };
        let client = std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    if let Some(netns) = netns {
                        crate::netns::enter_netns(netns)?;
                    }
                    runtime.block_on(build)
                })
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })?;
        Ok(Kube {
            runtime: Some(runtime),
            netns: netns.map(str::to_string),
            client,
            kinds: Mutex::new(HashMap::new()),
        })
    }

    /// The async client, for code that awaits (run it with [`Kube::block_on`]).
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// Runs `future` on this client's runtime, from its network namespace: kube's requests
    /// connect in the future that awaits them, so a client of another namespace runs it on a
    /// thread of that namespace.
    pub fn block_on<F>(&self, future: F) -> F::Output
    where
        F: std::future::Future + Send,
        F::Output: Send,
    {
        let runtime = self.runtime.as_ref().expect("the runtime lives until drop");
        // Called from an async test, the caller's thread may not block on another runtime.
        let in_async = tokio::runtime::Handle::try_current().is_ok();
        if self.netns.is_none() && !in_async {
            return runtime.block_on(future);
        }
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    if let Some(netns) = &self.netns
                        && let Err(e) = crate::netns::enter_netns(netns)
                    {
                        eprintln!("kube client: {e:#}");
                    }
                    runtime.block_on(future)
                })
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }

    /// The API of `kind` in `api_version` (in `namespace` when it is namespaced).
    pub fn api(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
    ) -> Result<Api<DynamicObject>> {
        let key = (api_version.to_string(), kind.to_string());
        let known = self.kinds.lock().expect("kinds").get(&key).cloned();
        let (resource, caps) = match known {
            Some(found) => found,
            None => {
                let (group, version) = match api_version.split_once('/') {
                    Some((g, v)) => (g, v),
                    None => ("", api_version),
                };
                let gvk = kube::api::GroupVersionKind::gvk(group, version, kind);
                let found = self
                    .block_on(kube::discovery::pinned_kind(&self.client, &gvk))
                    .with_context(|| format!("discovering {api_version} {kind}"))?;
                self.kinds.lock().expect("kinds").insert(key, found.clone());
                found
            }
        };
        Ok(match (caps.scope, namespace) {
            (Scope::Namespaced, Some(ns)) => {
                Api::namespaced_with(self.client.clone(), ns, &resource)
            }
            (Scope::Namespaced, None) => Api::all_with(self.client.clone(), &resource),
            (Scope::Cluster, _) => Api::all_with(self.client.clone(), &resource),
        })
    }

    /// The API for `object` (its `apiVersion`, `kind` and `metadata.namespace`).
    fn api_for(&self, object: &Value) -> Result<(Api<DynamicObject>, String)> {
        let api_version = object["apiVersion"].as_str().context("no apiVersion")?;
        let kind = object["kind"].as_str().context("no kind")?;
        let namespace = object["metadata"]["namespace"].as_str();
        let name = object["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        Ok((self.api(api_version, kind, namespace)?, name))
    }

    /// Creates `object`; the object the server stored.
    pub fn create(&self, object: Value) -> Result<Value> {
        let (api, _) = self.api_for(&object)?;
        let dynamic: DynamicObject = serde_json::from_value(object)?;
        let created = self.block_on(api.create(&PostParams::default(), &dynamic))?;
        Ok(serde_json::to_value(created)?)
    }

    /// Creates every object of `objects`, at most `parallel` requests in flight: an object that
    /// needs another (a namespace) goes in an earlier call.
    pub fn create_all(&self, objects: Vec<Value>, parallel: usize) -> Result<()> {
        use futures::{StreamExt as _, TryStreamExt as _};
        let mut requests = Vec::with_capacity(objects.len());
        for object in objects {
            let (api, _) = self.api_for(&object)?;
            let dynamic: DynamicObject = serde_json::from_value(object)?;
            requests.push(async move { api.create(&PostParams::default(), &dynamic).await });
        }
        self.block_on(
            futures::stream::iter(requests)
                .buffered(parallel.max(1))
                .try_for_each(|_| async { Ok(()) }),
        )?;
        Ok(())
    }

    /// Applies `object` server-side as `manager`, taking over conflicting fields (`force`).
    pub fn apply(&self, object: Value, manager: &str) -> Result<Value> {
        let (api, name) = self.api_for(&object)?;
        let params = PatchParams::apply(manager).force();
        let applied = self.block_on(api.patch(&name, &params, &Patch::Apply(&object)))?;
        Ok(serde_json::to_value(applied)?)
    }

    /// Applies `object`'s status server-side as `manager` (`force`).
    pub fn apply_status(&self, object: Value, manager: &str) -> Result<Value> {
        let (api, name) = self.api_for(&object)?;
        let params = PatchParams::apply(manager).force();
        let applied = self.block_on(api.patch_status(&name, &params, &Patch::Apply(&object)))?;
        Ok(serde_json::to_value(applied)?)
    }

    /// The object, or `None` when it does not exist.
    pub fn get(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Option<Value>> {
        let api = self.api(api_version, kind, namespace)?;
        match self.block_on(api.get_opt(name))? {
            Some(object) => Ok(Some(serde_json::to_value(object)?)),
            None => Ok(None),
        }
    }

    /// Every object of `kind` (in `namespace`, or in all).
    pub fn list(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
    ) -> Result<Vec<Value>> {
        let api = self.api(api_version, kind, namespace)?;
        let list = self.block_on(api.list(&Default::default()))?;
        list.items
            .into_iter()
            .map(|o| {
                let mut v = serde_json::to_value(o)?;
                // Items of a list carry no apiVersion or kind: give them back.
                v["apiVersion"] = Value::from(api_version);
                v["kind"] = Value::from(kind);
                Ok(v)
            })
            .collect()
    }

    /// A JSON merge patch of the object (of its status with `status`).
    pub fn merge_patch(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
        patch: Value,
        status: bool,
    ) -> Result<Value> {
        let api = self.api(api_version, kind, namespace)?;
        let params = PatchParams::default();
        let patched = if status {
            self.block_on(api.patch_status(name, &params, &Patch::Merge(&patch)))?
        } else {
            self.block_on(api.patch(name, &params, &Patch::Merge(&patch)))?
        };
        Ok(serde_json::to_value(patched)?)
    }

    /// Deletes the object (foreground: its dependents first); whether it existed.
    pub fn delete(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<bool> {
        self.delete_with(api_version, kind, namespace, name, &DeleteParams::default())
    }

    /// Deletes the Pod `namespace/name` of `uid` at once (grace period 0), as a kubelet
    /// finishes a graceful deletion once its containers stopped; whether it existed.
    pub fn delete_pod_now(&self, namespace: &str, name: &str, uid: &str) -> Result<bool> {
        let mut params = DeleteParams::default().grace_period(0);
        params.preconditions = Some(kube::api::Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        });
        self.delete_with("v1", "Pod", Some(namespace), name, &params)
    }

    fn delete_with(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
        params: &DeleteParams,
    ) -> Result<bool> {
        let api = self.api(api_version, kind, namespace)?;
        match self.block_on(api.delete(name, params)) {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// `POST path` with `body`, as JSON (a subresource such as a ServiceAccount's `token`).
    pub fn raw_post(&self, path: &str, body: &Value) -> Result<Value> {
        let request = http::Request::post(path)
            .header("content-type", "application/json")
            .body(serde_json::to_vec(body)?)?;
        Ok(serde_json::from_str(&self.send(request)?)?)
    }

    /// `GET path` as JSON (`/version`).
    pub fn raw_get(&self, path: &str) -> Result<Value> {
        Ok(serde_json::from_str(&self.raw_text(path)?)?)
    }

    /// `GET path` as text (`/readyz`).
    pub fn raw_text(&self, path: &str) -> Result<String> {
        self.send(http::Request::get(path).body(Vec::new())?)
    }

    /// Sends `request`; the answer's body, or an error naming the method and the path.
    fn send(&self, request: http::Request<Vec<u8>>) -> Result<String> {
        let what = format!("{} {}", request.method(), request.uri());
        self.block_on(self.client.request_text(request))
            .with_context(|| what)
    }
}
