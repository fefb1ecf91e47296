//! The HTTP side of the fake API server: routing, query parameters, discovery, and watch streams.
//!
//! Owns: turning a hyper request into a store call and the answer into a response, and running
//! one task per watch that writes newline-delimited JSON events until `timeoutSeconds`, a broken
//! connection, a lagging subscription (then a 410 ERROR event) or server shutdown. Guarantees: the
//! store mutex is never held across an await; every error is a `Status` object with the real code.

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper::{Method, Request, Response, StatusCode, header};
use serde_json::{Value, json};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tokio::sync::{broadcast, mpsc, watch};
use tokio::time::Instant;

use super::api_error::ApiError;
use super::resources::{self, RESOURCES, ResourceKind, ResourcePath, Route};
use super::selector::{FieldSelector, LabelSelector};
use super::store::{
    EventType, PatchKind, Store, WatchBegin, WatchFilter, WatchRecord, WatchStart, WriteContext,
    rfc3339,
};

/// Response body type.
pub type Body = BoxBody<Bytes, Infallible>;

/// Tunables of the fake server.
#[derive(Debug, Clone)]
pub struct FakeApiConfig {
    /// Watch events kept for resuming watches; older resourceVersions get 410 Expired.
    pub history_capacity: usize,
    /// How often a watch with `allowWatchBookmarks=true` gets a BOOKMARK event.
    pub bookmark_interval: Duration,
    /// Watch duration when the client sends no `timeoutSeconds`.
    pub default_watch_timeout: Duration,
    /// Where to listen (`127.0.0.1:0` by default: a free port on loopback). The lab binds an
    /// address of its bridge so that node namespaces reach the server.
    pub bind: std::net::SocketAddr,
}

impl Default for FakeApiConfig {
    fn default() -> Self {
        Self {
            history_capacity: 1000,
            bookmark_interval: Duration::from_secs(1),
            default_watch_timeout: Duration::from_secs(1800),
            bind: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
        }
    }
}

/// State shared by all connections.
#[derive(Debug)]
pub struct Shared {
    pub store: Mutex<Store>,
    pub config: FakeApiConfig,
    pub shutdown: watch::Receiver<bool>,
    pub server_address: String,
    /// The last [`REQUEST_LOG_CAPACITY`] requests, oldest first.
    pub requests: Mutex<std::collections::VecDeque<RequestRecord>>,
}

/// How many requests [`Shared::requests`] keeps.
pub const REQUEST_LOG_CAPACITY: usize = 100_000;

/// One request as the server saw it: who sent it and what it asked, like a line of a real
/// server's audit log. The fake server authenticates nobody: `user` is the bearer token as sent
/// (the kubeconfigs of [`super::FakeApi::kubeconfig_for_user`] carry the user's name as token).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestRecord {
    /// The bearer token (empty without one).
    pub user: String,
    /// `GET`, `POST`, `PUT`, `PATCH`, `DELETE`.
    pub method: String,
    /// The path, without the query.
    pub path: String,
    /// Whether the query asked for a watch.
    pub watch: bool,
    /// The response's status code.
    pub code: u16,
}

impl RequestRecord {
    /// Whether the request could change something (anything but a GET).
    pub fn is_write(&self) -> bool {
        self.method != "GET"
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Store> {
        // A panic while holding the lock would poison it; the store itself stays consistent
        // because every write either completes or returns before mutating.
        self.store
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

fn json_response(code: u16, value: &Value) -> Response<Body> {
    let body = serde_json::to_vec(value).unwrap_or_default();
    let mut resp = Response::new(Full::new(Bytes::from(body)).boxed());
    *resp.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    resp
}

fn error_response(err: &ApiError) -> Response<Body> {
    json_response(err.code(), &err.to_status())
}

fn now() -> String {
    let secs = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    rfc3339(secs)
}

/// Parsed query parameters the server understands.
#[derive(Debug, Default)]
struct Query {
    pairs: Vec<(String, String)>,
}

impl Query {
    fn get(&self, key: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    fn flag(&self, key: &str) -> Result<bool, ApiError> {
        match self.get(key) {
            None | Some("") | Some("false") | Some("0") => Ok(false),
            Some("true") | Some("1") => Ok(true),
            Some(other) => Err(ApiError::BadRequest(format!(
                "invalid boolean for {key}: {other:?}"
            ))),
        }
    }

    fn number(&self, key: &str) -> Result<Option<u64>, ApiError> {
        self.get(key)
            .filter(|v| !v.is_empty())
            .map(|v| {
                v.parse::<u64>()
                    .map_err(|_| ApiError::BadRequest(format!("invalid integer for {key}: {v:?}")))
            })
            .transpose()
    }
}

/// Handles one request; never fails (errors become `Status` responses).
pub async fn handle(
    shared: Arc<Shared>,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let query = Query {
        pairs: resources::parse_query(req.uri().query().unwrap_or_default()),
    };
    let content_type = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let user = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default()
        .to_string();
    let user_agent = req
        .headers()
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return Ok(error_response(&ApiError::BadRequest(format!(
                "reading the request body: {e}"
            ))));
        }
    };
    tracing::debug!(%method, %path, "fake api request");
    let response = match resources::parse_path(&path) {
        None => error_response(&ApiError::NotFound {
            resource: "the server could not find the requested resource".into(),
            name: path.clone(),
        }),
        Some(route) if method != Method::GET && !matches!(route, Route::Resource(_)) => {
            error_response(&ApiError::MethodNotAllowed(format!(
                "{method} is not supported on {path}"
            )))
        }
        Some(Route::Version) => json_response(
            200,
            &json!({
                "major": "1", "minor": "37", "gitVersion": "v1.37.0-swimlb-fake", "gitCommit": "0000000000000000000000000000000000000000",
                "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "none", "compiler": "rustc", "platform": "linux/amd64"
            }),
        ),
        Some(Route::CoreVersions) => json_response(
            200,
            &json!({
                "kind": "APIVersions", "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": shared.server_address}]
            }),
        ),
        Some(Route::GroupList) => json_response(200, &group_list()),
        Some(Route::ResourceList { group, version }) => {
            json_response(200, &resource_list(&group, &version))
        }
        Some(Route::OpenApiRoot) => json_response(200, &openapi_root()),
        Some(Route::OpenApiGroupVersion { group, version }) => {
            json_response(200, &openapi_group_version(&group, &version))
        }
        Some(Route::Resource(rp)) => {
            let ctx = WriteContext {
                now: now(),
                field_manager: query.get("fieldManager").map(str::to_string),
                default_manager: user_agent
                    .split('/')
                    .next()
                    .filter(|s| !s.is_empty())
                    .unwrap_or("unknown")
                    .to_string(),
                force: query.flag("force").unwrap_or(false),
            };
            match serve_resource(&shared, &method, &rp, &query, &content_type, &body, &ctx) {
                Ok(Served::Object(code, v)) => json_response(code, &v),
                Ok(Served::Watch(resp)) => resp,
                Err(e) => error_response(&e),
            }
        }
    };
    let record = RequestRecord {
        user,
        method: method.to_string(),
        watch: query.flag("watch").unwrap_or(false),
        path,
        code: response.status().as_u16(),
    };
    let mut requests = shared
        .requests
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if requests.len() >= REQUEST_LOG_CAPACITY {
        requests.pop_front();
    }
    requests.push_back(record);
    drop(requests);
    Ok(response)
}

fn group_list() -> Value {
    let mut groups: Vec<(&str, &str)> = RESOURCES
        .iter()
        .filter(|r| !r.group.is_empty())
        .map(|r| (r.group, r.version))
        .collect();
    groups.dedup();
    json!({
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": groups.iter().map(|(g, v)| {
            let gv = json!({"groupVersion": format!("{g}/{v}"), "version": v});
            json!({"name": g, "versions": [gv.clone()], "preferredVersion": gv})
        }).collect::<Vec<_>>()
    })
}

fn resource_list(group: &str, version: &str) -> Value {
    let mut list = Vec::new();
    for r in RESOURCES
        .iter()
        .filter(|r| r.group == group && r.version == version)
    {
        list.push(json!({
            "name": r.plural, "singularName": r.singular, "namespaced": r.namespaced, "kind": r.kind,
            "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]
        }));
        if r.status_subresource {
            list.push(json!({
                "name": format!("{}/status", r.plural), "singularName": "", "namespaced": r.namespaced,
                "kind": r.kind, "verbs": ["get", "patch", "update"]
            }));
        }
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": list})
}

/// `/openapi/v3`: one entry per served group-version. kubectl asks for it before it applies:
/// it sends `fieldValidation=Strict` when the server's spec says PATCH takes it, and otherwise
/// wants the whole OpenAPI v2 schema to validate on the client.
fn openapi_root() -> Value {
    let mut paths = serde_json::Map::new();
    for r in RESOURCES {
        let prefix = r.path_prefix();
        let key = prefix.trim_start_matches('/').to_string();
        paths.entry(key).or_insert_with(
            || json!({"serverRelativeURL": format!("/openapi/v3{prefix}?hash=fake")}),
        );
    }
    json!({ "paths": paths })
}

/// `/openapi/v3/{prefix}`: a group-version's spec, reduced to what kubectl reads from it: the
/// PATCH operation of each resource, with its kind and its `fieldValidation` parameter. No
/// schemas. The fake server ignores `fieldValidation`: it checks no field names of built-in
/// kinds (kubernetes-validate --strict does, in e2e/tests/deploy.rs).
fn openapi_group_version(group: &str, version: &str) -> Value {
    let mut paths = serde_json::Map::new();
    for r in RESOURCES
        .iter()
        .filter(|r| r.group == group && r.version == version)
    {
        let path = if r.namespaced {
            format!(
                "{}/namespaces/{{namespace}}/{}/{{name}}",
                r.path_prefix(),
                r.plural
            )
        } else {
            format!("{}/{}/{{name}}", r.path_prefix(), r.plural)
        };
        paths.insert(
            path,
            json!({"patch": {
                "operationId": format!("patch{}", r.kind),
                "x-kubernetes-action": "patch",
                "x-kubernetes-group-version-kind": {"group": r.group, "version": r.version, "kind": r.kind},
                "parameters": [
                    {"name": "fieldManager", "in": "query", "schema": {"type": "string"}},
                    {"name": "fieldValidation", "in": "query", "schema": {"type": "string"}},
                    {"name": "force", "in": "query", "schema": {"type": "boolean"}}
                ],
                "responses": {"200": {"description": "OK"}}
            }}),
        );
    }
    json!({
        "openapi": "3.0.0",
        "info": {"title": "swimlb fake API server", "version": "v1.37.0"},
        "paths": paths,
    })
}

enum Served {
    Object(u16, Value),
    Watch(Response<Body>),
}

fn serve_resource(
    shared: &Arc<Shared>,
    method: &Method,
    rp: &ResourcePath,
    query: &Query,
    content_type: &str,
    body: &Bytes,
    ctx: &WriteContext,
) -> Result<Served, ApiError> {
    let kind = &RESOURCES[rp.resource];
    let status = match rp.subresource.as_deref() {
        None => false,
        Some("status") if kind.status_subresource => true,
        Some(other) => {
            return Err(ApiError::NotFound {
                resource: kind.qualified_name(),
                name: format!("{}/{other}", rp.name.as_deref().unwrap_or_default()),
            });
        }
    };
    if query.get("dryRun").is_some_and(|v| !v.is_empty()) && *method != Method::GET {
        return Err(ApiError::BadRequest(
            "the fake API server does not support dryRun".into(),
        ));
    }
    let ns = rp.namespace.as_deref();
    let parse_body = || -> Result<Value, ApiError> {
        serde_json::from_slice(body).map_err(|e| {
            ApiError::BadRequest(format!("error decoding the request body as JSON: {e}"))
        })
    };
    match (method.clone(), rp.name.as_deref()) {
        (Method::GET, None) => {
            let labels = LabelSelector::parse(query.get("labelSelector").unwrap_or_default())
                .map_err(|e| ApiError::BadRequest(format!("unable to parse labelSelector: {e}")))?;
            let fields = FieldSelector::parse(
                query.get("fieldSelector").unwrap_or_default(),
                kind.extra_field_selectors,
            )
            .map_err(|e| ApiError::BadRequest(format!("unable to parse fieldSelector: {e}")))?;
            if query.flag("watch")? {
                return start_watch(shared, kind, rp, query, labels, fields).map(Served::Watch);
            }
            if query.flag("sendInitialEvents")? {
                return Err(list_options_invalid(
                    "sendInitialEvents",
                    "sendInitialEvents is forbidden for list",
                ));
            }
            let rv = query.get("resourceVersion").filter(|v| !v.is_empty());
            let version_match = query.get("resourceVersionMatch").filter(|v| !v.is_empty());
            if version_match.is_some() && rv.is_none() {
                return Err(list_options_invalid(
                    "resourceVersionMatch",
                    "resourceVersionMatch is forbidden unless resourceVersion is provided",
                ));
            }
            let limit = query
                .number("limit")?
                .map(|l| usize::try_from(l).unwrap_or(usize::MAX));
            let list = shared.lock().list(
                rp.resource,
                ns,
                &labels,
                &fields,
                rv,
                version_match,
                limit,
                query.get("continue"),
            )?;
            Ok(Served::Object(200, list))
        }
        (_, None) if kind.namespaced && ns.is_none() => Err(ApiError::MethodNotAllowed(format!(
            "{method} is not supported on the cluster-wide collection of {}",
            kind.qualified_name()
        ))),
        (Method::POST, None) => Ok(Served::Object(
            201,
            shared.lock().create(rp.resource, ns, parse_body()?, ctx)?,
        )),
        (Method::DELETE, None) => Err(ApiError::MethodNotAllowed(
            "the fake API server does not support deletecollection".into(),
        )),
        (_, None) => Err(ApiError::MethodNotAllowed(format!(
            "{method} is not supported on a collection"
        ))),
        (_, Some(name)) if kind.namespaced && ns.is_none() => Err(ApiError::NotFound {
            resource: kind.qualified_name(),
            name: name.to_string(),
        }),
        (Method::GET, Some(name)) => Ok(Served::Object(
            200,
            shared.lock().get(rp.resource, ns, name)?,
        )),
        (Method::PUT, Some(name)) => Ok(Served::Object(
            200,
            shared
                .lock()
                .replace(rp.resource, ns, name, parse_body()?, status, ctx)?,
        )),
        (Method::PATCH, Some(name)) => {
            let patch_kind = PatchKind::from_content_type(content_type)?;
            let mut store = shared.lock();
            // An apply that creates the object answers 201 Created, as the real server.
            let existed = store.get(rp.resource, ns, name).is_ok();
            let object = store.patch(rp.resource, ns, name, patch_kind, body, status, ctx)?;
            Ok(Served::Object(if existed { 200 } else { 201 }, object))
        }
        (Method::DELETE, Some(name)) if !status => {
            let options = if body.is_empty() {
                Value::Null
            } else {
                parse_body()?
            };
            Ok(Served::Object(
                200,
                shared.lock().delete(rp.resource, ns, name, &options, ctx)?,
            ))
        }
        (m, Some(_)) => Err(ApiError::MethodNotAllowed(format!(
            "{m} is not supported here"
        ))),
    }
}

fn list_options_invalid(field: &str, detail: &str) -> ApiError {
    use super::validation::{FieldError, FieldErrorKind};
    ApiError::Invalid {
        kind: "ListOptions.meta.k8s.io".into(),
        name: String::new(),
        errors: vec![FieldError::new(field, FieldErrorKind::Forbidden, detail)],
    }
}

fn start_watch(
    shared: &Arc<Shared>,
    kind: &'static ResourceKind,
    rp: &ResourcePath,
    query: &Query,
    labels: LabelSelector,
    fields: FieldSelector,
) -> Result<Response<Body>, ApiError> {
    let bookmarks = query.flag("allowWatchBookmarks")?;
    let send_initial = query.flag("sendInitialEvents")?;
    let version_match = query.get("resourceVersionMatch").filter(|v| !v.is_empty());
    let rv = query.get("resourceVersion").filter(|v| !v.is_empty());
    let start = if send_initial {
        if version_match != Some("NotOlderThan") {
            return Err(list_options_invalid(
                "resourceVersionMatch",
                "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
            ));
        }
        if !bookmarks {
            return Err(list_options_invalid(
                "allowWatchBookmarks",
                "sendInitialEvents requires setting allowWatchBookmarks to true",
            ));
        }
        if let Some(v) = rv.filter(|v| *v != "0") {
            let requested = v
                .parse::<u64>()
                .map_err(|_| ApiError::BadRequest(format!("invalid resource version: {v:?}")))?;
            let current = shared.lock().resource_version();
            if requested > current {
                return Err(ApiError::TooLargeResourceVersion { requested, current });
            }
        }
        WatchStart::InitialEvents
    } else {
        if version_match.is_some() {
            return Err(list_options_invalid(
                "resourceVersionMatch",
                "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
            ));
        }
        match rv {
            None | Some("0") => WatchStart::FromNow,
            Some(v) => {
                WatchStart::After(v.parse::<u64>().map_err(|_| {
                    ApiError::BadRequest(format!("invalid resource version: {v:?}"))
                })?)
            }
        }
    };
    let timeout = match query.number("timeoutSeconds")? {
        Some(0) | None => shared.config.default_watch_timeout,
        Some(s) => Duration::from_secs(s),
    };
    let filter = WatchFilter {
        resource: rp.resource,
        namespace: rp.namespace.clone(),
        labels,
        fields,
    };
    let begin = shared.lock().watch(&filter, start);
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    let job = WatchJob {
        kind,
        filter,
        bookmark_interval: bookmarks.then_some(shared.config.bookmark_interval),
        deadline: Instant::now() + timeout,
        shutdown: shared.shutdown.clone(),
        tx,
    };
    tokio::spawn(job.run(begin));
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
    });
    let mut resp = Response::new(BodyExt::boxed(StreamBody::new(stream)));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    Ok(resp)
}

/// One running watch.
struct WatchJob {
    kind: &'static ResourceKind,
    filter: WatchFilter,
    bookmark_interval: Option<Duration>,
    deadline: Instant,
    shutdown: watch::Receiver<bool>,
    tx: mpsc::Sender<Bytes>,
}

fn event_line(event: &str, object: &Value) -> Bytes {
    let mut line =
        serde_json::to_vec(&json!({"type": event, "object": object})).unwrap_or_default();
    line.push(b'\n');
    Bytes::from(line)
}

impl WatchJob {
    fn bookmark(&self, rv: u64, initial_end: bool) -> Bytes {
        let mut meta = json!({"resourceVersion": rv.to_string()});
        if initial_end {
            meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        event_line(
            "BOOKMARK",
            &json!({"kind": self.kind.kind, "apiVersion": self.kind.api_version(), "metadata": meta}),
        )
    }

    async fn send(&self, line: Bytes) -> bool {
        self.tx.send(line).await.is_ok()
    }

    async fn run(mut self, begin: WatchBegin) {
        let (backlog, initial_end, mut last_rv, mut live) = match begin {
            WatchBegin::Error(err) => {
                let _ = self.send(event_line("ERROR", &err.to_status())).await;
                return;
            }
            WatchBegin::Stream {
                backlog,
                initial_end,
                resource_version,
                live,
            } => (backlog, initial_end, resource_version, live),
        };
        for (event, object) in backlog {
            if !self.send(event_line(event.as_str(), &object)).await {
                return;
            }
        }
        if let Some(rv) = initial_end
            && !self.send(self.bookmark(rv, true)).await
        {
            return;
        }
        let period = self.bookmark_interval.unwrap_or(Duration::from_secs(3600));
        let mut ticker = tokio::time::interval_at(Instant::now() + period, period);
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(self.deadline) => return,
                _ = self.shutdown.changed() => return,
                () = self.tx.closed() => return,
                _ = ticker.tick(), if self.bookmark_interval.is_some() => {
                    if !self.send(self.bookmark(last_rv, false)).await {
                        return;
                    }
                }
                received = live.recv() => match received {
                    Ok(record) => {
                        if !self.forward(&record, &mut last_rv).await {
                            return;
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        let err = ApiError::Expired(format!("the watch fell behind; too old resource version: {last_rv}"));
                        let _ = self.send(event_line("ERROR", &err.to_status())).await;
                        return;
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                },
            }
        }
    }

    async fn forward(&self, record: &WatchRecord, last_rv: &mut u64) -> bool {
        if record.resource_version <= *last_rv {
            return true;
        }
        *last_rv = record.resource_version;
        match self.filter.translate(record) {
            Some(EventType::Deleted) => self.send(event_line("DELETED", &record.object)).await,
            Some(event) => self.send(event_line(event.as_str(), &record.object)).await,
            None => true,
        }
    }
}
