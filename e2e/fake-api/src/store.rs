//! The object store behind the fake API server: every object of every served resource, the
//! global resourceVersion, the bounded watch-event history and the write rules.
//!
//! Owns: create, get, list (with selectors and pagination), replace, patch (merge, JSON,
//! strategic, apply), the status subresource, delete with finalizers, and the start of a watch
//! (backlog from the history plus a live subscription taken under the same lock, so a watcher
//! never misses or repeats an event). All methods are synchronous and take `now` (RFC 3339) as an
//! argument; the HTTP layer holds the store in a mutex and never awaits while holding it.
//!
//! Guarantees: the resourceVersion only grows and every write that changes an object gets a new
//! one; a write that changes nothing is a no-op (no new resourceVersion, no event), as in the real
//! server; `generation` starts at 1 and grows only when something outside `metadata` and `status`
//! changes; objects with finalizers are only marked for deletion.

use serde_json::{Map, Value, json};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use tokio::sync::broadcast;

use super::api_error::ApiError;
use super::apply::{self, ApplyRequest, Scope};
use super::patch::{self, PatchError};
use super::resources::{NAMESPACES, RESOURCES, ResourceKind};
use super::schema;
use super::selector::{FieldSelector, LabelSelector};
use super::validation::{self, FieldError, FieldErrorKind};

/// The type of a watch event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

/// One change in the history: the object after the change (for a deletion, the last state with
/// the deletion's resourceVersion) and before it.
#[derive(Debug, Clone)]
pub struct WatchRecord {
    pub resource_version: u64,
    pub resource: usize,
    pub namespace: String,
    pub event: EventType,
    pub object: Value,
    pub previous: Option<Value>,
}

/// What a watch selects.
#[derive(Debug, Clone)]
pub struct WatchFilter {
    pub resource: usize,
    pub namespace: Option<String>,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
}

impl WatchFilter {
    fn matches(&self, object: &Value) -> bool {
        self.labels.matches(object) && self.fields.matches(object)
    }

    /// The event a watcher with this filter sees for `record`, if any: an object that starts
    /// matching is ADDED, one that stops matching is DELETED, as in the real server.
    pub fn translate(&self, record: &WatchRecord) -> Option<EventType> {
        if record.resource != self.resource {
            return None;
        }
        if let Some(ns) = &self.namespace
            && *ns != record.namespace
        {
            return None;
        }
        let now = self.matches(&record.object);
        let before = record.previous.as_ref().is_some_and(|p| self.matches(p));
        match record.event {
            EventType::Added => now.then_some(EventType::Added),
            EventType::Deleted => now.then_some(EventType::Deleted),
            EventType::Modified => match (before, now) {
                (true, true) => Some(EventType::Modified),
                (false, true) => Some(EventType::Added),
                (true, false) => Some(EventType::Deleted),
                (false, false) => None,
            },
        }
    }
}

/// How a watch starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchStart {
    /// `resourceVersion` absent or "0": synthetic ADDED events for the current objects first.
    FromNow,
    /// `sendInitialEvents=true`: the current objects, then a bookmark marking the end.
    InitialEvents,
    /// Events after this resourceVersion.
    After(u64),
}

/// The beginning of a watch: events to send first, then the live subscription.
#[derive(Debug)]
pub enum WatchBegin {
    Stream {
        backlog: Vec<(EventType, Value)>,
        /// Set for `InitialEvents`: the resourceVersion of the end-of-initial-events bookmark.
        initial_end: Option<u64>,
        /// The resourceVersion the backlog reaches; live events after it follow.
        resource_version: u64,
        live: broadcast::Receiver<Arc<WatchRecord>>,
    },
    /// The stream carries only this error event (410 Expired, 504 too large).
    Error(ApiError),
}

/// Patch document types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchKind {
    Merge,
    Json,
    Strategic,
    Apply,
}

impl PatchKind {
    /// Maps a `Content-Type` to a patch kind (415 for anything else).
    pub fn from_content_type(ct: &str) -> Result<Self, ApiError> {
        match ct.split(';').next().unwrap_or_default().trim() {
            "application/merge-patch+json" => Ok(Self::Merge),
            "application/json-patch+json" => Ok(Self::Json),
            "application/strategic-merge-patch+json" => Ok(Self::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+cbor" => Ok(Self::Apply),
            other => Err(ApiError::UnsupportedMediaType(format!(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml (got {other:?})"
            ))),
        }
    }
}

/// Per-request write context.
#[derive(Debug, Clone)]
pub struct WriteContext {
    /// RFC 3339 timestamp of the request.
    pub now: String,
    /// The `fieldManager` query parameter, if given.
    pub field_manager: Option<String>,
    /// The manager name used when `fieldManager` is absent (from the User-Agent).
    pub default_manager: String,
    /// The `force` query parameter.
    pub force: bool,
}

impl WriteContext {
    fn manager(&self) -> &str {
        self.field_manager
            .as_deref()
            .unwrap_or(&self.default_manager)
    }
}

/// The list page a continue token resumes: the snapshot the first page took (shared by every
/// page, so a page costs its own size, not the rest's) and where the next page starts.
#[derive(Debug)]
struct ContinueSnapshot {
    resource_version: u64,
    items: Arc<Vec<Value>>,
    offset: usize,
}

type ObjectKey = (usize, String, String);

/// How managedFields are produced for a write.
#[derive(Debug, Clone, Copy)]
enum Ownership<'a> {
    /// An ordinary update by this manager.
    Update(&'a str),
    /// Already computed by server-side apply.
    Applied,
}

const CONTINUE_SNAPSHOTS: usize = 32;
const BROADCAST_CAPACITY: usize = 8192;

/// The store. See the module doc.
#[derive(Debug)]
pub struct Store {
    resource_version: u64,
    objects: BTreeMap<ObjectKey, Value>,
    history: VecDeque<Arc<WatchRecord>>,
    history_capacity: usize,
    /// Events with a resourceVersion up to this one may have been dropped from the history.
    compacted_through: u64,
    events: broadcast::Sender<Arc<WatchRecord>>,
    next_uid: u64,
    next_continue: u64,
    continues: VecDeque<(String, ContinueSnapshot)>,
    /// The Services holding each clusterIP, kept with `objects` so that allocating one is a walk
    /// over this index instead of a copy of every Service.
    cluster_ips: BTreeMap<IpAddr, Vec<ObjectKey>>,
    /// The Services holding each nodePort (explicit nodePorts may collide, hence a list).
    node_ports: BTreeMap<i64, Vec<ObjectKey>>,
}

fn meta_str<'a>(object: &'a Value, field: &str) -> Option<&'a str> {
    object.get("metadata")?.get(field)?.as_str()
}

fn meta_mut(object: &mut Value) -> &mut Map<String, Value> {
    if !object.is_object() {
        *object = Value::Object(Map::new());
    }
    let Value::Object(root) = object else {
        unreachable!("the value was just made an object")
    };
    let meta = root
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    if !meta.is_object() {
        *meta = Value::Object(Map::new());
    }
    let Value::Object(meta) = meta else {
        unreachable!("metadata was just made an object")
    };
    meta
}

fn without_meta_and_status(object: &Value) -> Value {
    let mut o = object.clone();
    if let Some(m) = o.as_object_mut() {
        m.remove("metadata");
        m.remove("status");
    }
    o
}

fn without_resource_version(object: &Value) -> Value {
    let mut o = object.clone();
    if let Some(m) = o.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("resourceVersion");
    }
    o
}

fn parse_resource_version(value: &str) -> Result<u64, ApiError> {
    value
        .parse::<u64>()
        .map_err(|_| ApiError::BadRequest(format!("invalid resource version: {value:?}")))
}

impl Store {
    /// An empty store with the `default`, `kube-system`, `kube-public` and `kube-node-lease`
    /// namespaces, keeping at most `history_capacity` watch events.
    pub fn new(history_capacity: usize, now: &str) -> Self {
        let (events, _) = broadcast::channel(BROADCAST_CAPACITY);
        let mut store = Self {
            resource_version: 0,
            objects: BTreeMap::new(),
            history: VecDeque::new(),
            history_capacity: history_capacity.max(1),
            compacted_through: 0,
            events,
            next_uid: 1,
            next_continue: 1,
            continues: VecDeque::new(),
            cluster_ips: BTreeMap::new(),
            node_ports: BTreeMap::new(),
        };
        let ctx = WriteContext {
            now: now.to_string(),
            field_manager: None,
            default_manager: "kube-apiserver".into(),
            force: false,
        };
        for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            let body = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
            // Valid by construction; a failure here would only lose a namespace.
            let _ = store.create(NAMESPACES, None, body, &ctx);
        }
        store
    }

    /// The current (highest) resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.resource_version
    }

    /// A copy of every object of `resource` (all namespaces), sorted by namespace and name.
    pub fn objects(&self, resource: usize) -> Vec<Value> {
        self.objects_of(resource, None)
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// The stored objects of `resource` (in `namespace` when given), in key order: a range of
    /// the map, not a scan of every resource.
    fn objects_of<'a>(
        &'a self,
        resource: usize,
        namespace: Option<&'a str>,
    ) -> impl Iterator<Item = (&'a ObjectKey, &'a Value)> + 'a {
        let start = (
            resource,
            namespace.unwrap_or_default().to_string(),
            String::new(),
        );
        self.objects
            .range(start..)
            .take_while(move |((r, ns, _), _)| *r == resource && namespace.is_none_or(|n| n == ns))
    }

    /// Stores `object` under `key`, keeping the Service allocation indexes in step.
    fn put(&mut self, key: ObjectKey, object: Value) {
        let service = key.0 == resource_index("services");
        if service {
            self.index_service(&key, &object);
        }
        if let Some(old) = self.objects.insert(key.clone(), object)
            && service
        {
            self.unindex_service(&key, &old);
        }
    }

    /// Removes the object under `key`, keeping the Service allocation indexes in step.
    fn take(&mut self, key: &ObjectKey) {
        if let Some(old) = self.objects.remove(key)
            && key.0 == resource_index("services")
        {
            self.unindex_service(key, &old);
        }
    }

    fn service_holdings(service: &Value) -> (Vec<IpAddr>, Vec<i64>) {
        let ips = string_list(service.pointer("/spec/clusterIPs"))
            .iter()
            .filter_map(|ip| ip.parse().ok())
            .collect();
        let ports = service
            .pointer("/spec/ports")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|p| p.get("nodePort").and_then(Value::as_i64))
            .collect();
        (ips, ports)
    }

    fn index_service(&mut self, key: &ObjectKey, service: &Value) {
        let (ips, ports) = Self::service_holdings(service);
        for ip in ips {
            self.cluster_ips.entry(ip).or_default().push(key.clone());
        }
        for port in ports {
            self.node_ports.entry(port).or_default().push(key.clone());
        }
    }

    fn unindex_service(&mut self, key: &ObjectKey, service: &Value) {
        let (ips, ports) = Self::service_holdings(service);
        for ip in ips {
            release_holding(&mut self.cluster_ips, ip, key);
        }
        for port in ports {
            release_holding(&mut self.node_ports, port, key);
        }
    }

    fn kind(resource: usize) -> Result<&'static ResourceKind, ApiError> {
        RESOURCES
            .get(resource)
            .ok_or_else(|| ApiError::Internal(format!("no resource with index {resource}")))
    }

    fn key(resource: usize, namespace: Option<&str>, name: &str) -> ObjectKey {
        (
            resource,
            namespace.unwrap_or_default().to_string(),
            name.to_string(),
        )
    }

    fn not_found(kind: &ResourceKind, name: &str) -> ApiError {
        ApiError::NotFound {
            resource: kind.qualified_name(),
            name: name.to_string(),
        }
    }

    fn stale(kind: &ResourceKind, name: &str) -> ApiError {
        ApiError::Conflict {
            resource: kind.qualified_name(),
            name: name.to_string(),
            detail: "the object has been modified; please apply your changes to the latest version and try again".into(),
        }
    }

    fn invalid(kind: &ResourceKind, name: &str, errors: Vec<FieldError>) -> ApiError {
        ApiError::Invalid {
            kind: kind.kind.to_string(),
            name: name.to_string(),
            errors,
        }
    }

    /// Reads one object.
    pub fn get(
        &self,
        resource: usize,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Value, ApiError> {
        let kind = Self::kind(resource)?;
        self.objects
            .get(&Self::key(resource, namespace, name))
            .cloned()
            .ok_or_else(|| Self::not_found(kind, name))
    }

    /// Lists objects. `resource_version` and `version_match` follow the real semantics for the
    /// cases kube uses ("0"/absent/NotOlderThan: the current state; Exact: only the current
    /// resourceVersion can be served, older ones are 410); `limit` and `continue` paginate over a
    /// snapshot taken by the first page.
    #[allow(clippy::too_many_arguments)]
    pub fn list(
        &mut self,
        resource: usize,
        namespace: Option<&str>,
        labels: &LabelSelector,
        fields: &FieldSelector,
        resource_version: Option<&str>,
        version_match: Option<&str>,
        limit: Option<usize>,
        continue_token: Option<&str>,
    ) -> Result<Value, ApiError> {
        let kind = Self::kind(resource)?;
        let (list_rv, snapshot_items, snapshot_offset) = if let Some(token) =
            continue_token.filter(|t| !t.is_empty())
        {
            let pos = self.continues.iter().position(|(t, _)| t == token).ok_or_else(|| {
                ApiError::Expired("The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.".into())
            })?;
            let snap = &self.continues[pos].1;
            (snap.resource_version, snap.items.clone(), snap.offset)
        } else {
            if let Some(rv) = resource_version.filter(|rv| !rv.is_empty() && *rv != "0") {
                let rv = parse_resource_version(rv)?;
                if rv > self.resource_version {
                    return Err(ApiError::TooLargeResourceVersion {
                        requested: rv,
                        current: self.resource_version,
                    });
                }
                if version_match == Some("Exact") && rv != self.resource_version {
                    return Err(ApiError::Expired(format!(
                        "too old resource version: {rv} ({})",
                        self.resource_version
                    )));
                }
            }
            if let Some(m) = version_match
                && m != "NotOlderThan"
                && m != "Exact"
            {
                return Err(ApiError::BadRequest(format!(
                    "resourceVersionMatch: Unsupported value: {m:?}"
                )));
            }
            let items: Vec<Value> = self
                .objects_of(resource, namespace)
                .map(|(_, v)| v)
                .filter(|v| labels.matches(v) && fields.matches(v))
                .cloned()
                .collect();
            (self.resource_version, Arc::new(items), 0)
        };
        let (all, offset) = (snapshot_items, snapshot_offset);
        let rest = all.len().saturating_sub(offset);
        let page_len = match limit.filter(|l| *l > 0) {
            Some(limit) if rest > limit => limit,
            _ => rest,
        };
        let mut metadata = json!({"resourceVersion": list_rv.to_string()});
        if page_len < rest {
            let token = format!("fake-continue-{}", self.next_continue);
            self.next_continue += 1;
            metadata["continue"] = Value::String(token.clone());
            metadata["remainingItemCount"] = json!(rest - page_len);
            self.continues.push_back((
                token,
                ContinueSnapshot {
                    resource_version: list_rv,
                    items: all.clone(),
                    offset: offset + page_len,
                },
            ));
            while self.continues.len() > CONTINUE_SNAPSHOTS {
                self.continues.pop_front();
            }
        }
        let items: Vec<Value> = if offset == 0 && page_len == all.len() {
            // The whole list in one page: no second copy.
            Arc::try_unwrap(all).unwrap_or_else(|shared| shared.as_ref().clone())
        } else {
            all.get(offset..offset + page_len)
                .map(<[Value]>::to_vec)
                .unwrap_or_default()
        };
        Ok(json!({
            "apiVersion": kind.api_version(),
            "kind": format!("{}List", kind.kind),
            "metadata": metadata,
            "items": items,
        }))
    }

    fn record(&mut self, record: WatchRecord) {
        let record = Arc::new(record);
        self.history.push_back(record.clone());
        while self.history.len() > self.history_capacity {
            if let Some(dropped) = self.history.pop_front() {
                self.compacted_through = dropped.resource_version;
            }
        }
        // No receivers is fine: nobody is watching.
        let _ = self.events.send(record);
    }

    fn next_resource_version(&mut self) -> u64 {
        self.resource_version += 1;
        self.resource_version
    }

    /// Checks `apiVersion`/`kind` of a body (filling them when absent) and that it is an object.
    fn check_type(kind: &ResourceKind, body: &mut Value) -> Result<(), ApiError> {
        let Some(m) = body.as_object_mut() else {
            return Err(ApiError::BadRequest(format!(
                "the body of a {} must be a JSON object",
                kind.kind
            )));
        };
        let api_version = kind.api_version();
        match m.get("apiVersion").and_then(Value::as_str) {
            None | Some("") => {
                m.insert("apiVersion".into(), Value::String(api_version));
            }
            Some(v) if v == api_version => {}
            Some(v) => {
                return Err(ApiError::BadRequest(format!(
                    "the API version in the data ({v}) does not match the expected API version ({api_version})"
                )));
            }
        }
        match m.get("kind").and_then(Value::as_str) {
            None | Some("") => {
                m.insert("kind".into(), Value::String(kind.kind.into()));
            }
            Some(k) if k == kind.kind => {}
            Some(k) => {
                return Err(ApiError::BadRequest(format!(
                    "the kind in the data ({k}) does not match the expected kind ({})",
                    kind.kind
                )));
            }
        }
        if let Some(meta) = m.get("metadata")
            && !meta.is_object()
            && !meta.is_null()
        {
            return Err(ApiError::BadRequest(
                "metadata must be a JSON object".into(),
            ));
        }
        Ok(())
    }

    /// Makes the body's namespace agree with the URL's (400 when they differ, as the real server).
    fn check_namespace(
        kind: &ResourceKind,
        body: &mut Value,
        namespace: Option<&str>,
    ) -> Result<(), ApiError> {
        let meta = meta_mut(body);
        if !kind.namespaced {
            meta.remove("namespace");
            return Ok(());
        }
        let url_ns = namespace.unwrap_or_default();
        match meta.get("namespace").and_then(Value::as_str) {
            None | Some("") => {
                meta.insert("namespace".into(), Value::String(url_ns.to_string()));
                Ok(())
            }
            Some(ns) if ns == url_ns => Ok(()),
            Some(_) => Err(ApiError::BadRequest(
                "the namespace of the provided object does not match the namespace sent on the request".into(),
            )),
        }
    }

    fn check_name(body: &mut Value, name: &str) -> Result<(), ApiError> {
        let meta = meta_mut(body);
        match meta.get("name").and_then(Value::as_str) {
            None | Some("") => {
                meta.insert("name".into(), Value::String(name.to_string()));
                Ok(())
            }
            Some(n) if n == name => Ok(()),
            Some(n) => Err(ApiError::BadRequest(format!(
                "the name of the object ({n}) does not match the name on the URL ({name})"
            ))),
        }
    }

    /// The lowest free clusterIP of a family (hosts 1 to 254 of 192.0.2.0/24, 1 to 0xfffe of
    /// 2001:db8:ffff::/112), skipping those in `taken` (allocated by this request).
    fn lowest_free_cluster_ip(&self, v6: bool, taken: &BTreeSet<IpAddr>) -> Option<IpAddr> {
        let limit: u32 = if v6 { 0xfffe } else { 254 };
        let address = |host: u32| -> IpAddr {
            if v6 {
                IpAddr::V6(Ipv6Addr::new(
                    0x2001,
                    0xdb8,
                    0xffff,
                    0,
                    0,
                    0,
                    0,
                    u16::try_from(host).unwrap_or(u16::MAX),
                ))
            } else {
                IpAddr::V4(Ipv4Addr::new(
                    192,
                    0,
                    2,
                    u8::try_from(host).unwrap_or(u8::MAX),
                ))
            }
        };
        let host_of = |ip: &IpAddr| -> u32 {
            match ip {
                IpAddr::V4(a) => u32::from(a.octets()[3]),
                IpAddr::V6(a) => u32::from(a.segments()[7]),
            }
        };
        let mut from = 1;
        loop {
            if from > limit {
                return None;
            }
            let held = self
                .cluster_ips
                .range(address(from)..=address(limit))
                .map(|(ip, _)| host_of(ip));
            let host = lowest_gap(held, from, limit)?;
            if !taken.contains(&address(host)) {
                return Some(address(host));
            }
            from = host + 1;
        }
    }

    /// Cluster IPs for a Service: `ipFamilyPolicy` (SingleStack, PreferDualStack,
    /// RequireDualStack; the fake cluster is dual-stack), `ipFamilies`, and one clusterIP per
    /// family, from 192.0.2.0/24 and 2001:db8:ffff::/112. The primary clusterIP is immutable.
    fn assign_cluster_ips(
        &self,
        spec: &mut Map<String, Value>,
        old_spec: &Value,
        updating: bool,
    ) -> Vec<FieldError> {
        let mut errs = Vec::new();
        let old_ips = string_list(old_spec.get("clusterIPs"));
        let mut requested = string_list(spec.get("clusterIPs"));
        let single = spec
            .get("clusterIP")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        if requested.is_empty() && !single.is_empty() {
            requested.push(single.clone());
        }
        if !single.is_empty() && requested.first() != Some(&single) {
            errs.push(FieldError::new(
                "spec.clusterIPs[0]",
                FieldErrorKind::Invalid,
                format!(
                    "{:?}: must match `clusterIP` when present",
                    requested.first().cloned().unwrap_or_default()
                ),
            ));
        }
        if updating && !old_ips.is_empty() {
            if requested.len() < old_ips.len() && old_ips.starts_with(&requested) {
                requested = old_ips.clone();
            } else if requested.first() != old_ips.first() {
                errs.push(FieldError::new(
                    "spec.clusterIPs[0]",
                    FieldErrorKind::Invalid,
                    format!(
                        "{:?}: may not change once set",
                        requested.first().cloned().unwrap_or_default()
                    ),
                ));
                return errs;
            }
        }
        let policy = spec
            .get("ipFamilyPolicy")
            .and_then(Value::as_str)
            .or_else(|| old_spec.get("ipFamilyPolicy").and_then(Value::as_str))
            .unwrap_or("SingleStack")
            .to_string();
        if !["SingleStack", "PreferDualStack", "RequireDualStack"].contains(&policy.as_str()) {
            errs.push(FieldError::new("spec.ipFamilyPolicy", FieldErrorKind::NotSupported, format!("{policy:?}: supported values: \"PreferDualStack\", \"RequireDualStack\", \"SingleStack\"")));
            return errs;
        }
        let headless = requested.first().is_some_and(|ip| ip == "None");
        let mut families = string_list(spec.get("ipFamilies"));
        if families.is_empty() {
            families = if !headless && !requested.is_empty() {
                requested
                    .iter()
                    .map(|ip| {
                        if ip.contains(':') {
                            "IPv6".to_string()
                        } else {
                            "IPv4".to_string()
                        }
                    })
                    .collect()
            } else {
                string_list(old_spec.get("ipFamilies"))
            };
        }
        if families.is_empty() {
            families.push("IPv4".into());
        }
        if policy != "SingleStack" && families.len() == 1 {
            let other = if families[0] == "IPv4" {
                "IPv6"
            } else {
                "IPv4"
            };
            families.push(other.into());
        }
        for (i, f) in families.iter().enumerate() {
            if f != "IPv4" && f != "IPv6" {
                errs.push(FieldError::new(
                    format!("spec.ipFamilies[{i}]"),
                    FieldErrorKind::NotSupported,
                    format!("{f:?}: supported values: \"IPv4\", \"IPv6\""),
                ));
            }
        }
        if families.len() > 2 || (families.len() == 2 && families[0] == families[1]) {
            errs.push(FieldError::new(
                "spec.ipFamilies",
                FieldErrorKind::Invalid,
                "may contain at most one IPv4 and one IPv6 family",
            ));
        }
        if policy == "SingleStack" && families.len() > 1 {
            errs.push(FieldError::new("spec.ipFamilyPolicy", FieldErrorKind::Invalid, "\"SingleStack\": must be RequireDualStack or PreferDualStack when multiple 'ipFamilies' are specified"));
        }
        if requested.len() > families.len() && !headless {
            errs.push(FieldError::new(
                "spec.clusterIPs",
                FieldErrorKind::Invalid,
                "may not have more IPs than ipFamilies",
            ));
        }
        if !errs.is_empty() {
            return errs;
        }
        let ips = if headless {
            vec!["None".to_string()]
        } else {
            // The addresses this request takes (the index holds those already stored).
            let mut used: BTreeSet<IpAddr> = BTreeSet::new();
            let mut ips = Vec::new();
            for (i, family) in families.iter().enumerate() {
                let v6 = family == "IPv6";
                match requested.get(i) {
                    Some(ip) if old_ips.get(i) == Some(ip) => ips.push(ip.clone()),
                    Some(ip) => {
                        let parsed: Option<std::net::IpAddr> = ip.parse().ok();
                        let in_range = match parsed {
                            Some(std::net::IpAddr::V4(a)) => !v6 && a.octets()[..3] == [192, 0, 2],
                            Some(std::net::IpAddr::V6(a)) => {
                                v6 && a.segments()[..7] == [0x2001, 0xdb8, 0xffff, 0, 0, 0, 0]
                            }
                            None => false,
                        };
                        if !in_range {
                            let range = if v6 {
                                "2001:db8:ffff::/112"
                            } else {
                                "192.0.2.0/24"
                            };
                            errs.push(FieldError::new(format!("spec.clusterIPs[{i}]"), FieldErrorKind::Invalid, format!("{ip:?}: failed to allocate IP {ip}: provided IP is not in the valid range. The range of valid IPs is {range}")));
                        } else if parsed
                            .is_some_and(|p| self.cluster_ips.contains_key(&p) || !used.insert(p))
                        {
                            errs.push(FieldError::new(format!("spec.clusterIPs[{i}]"), FieldErrorKind::Invalid, format!("{ip:?}: failed to allocate IP {ip}: provided IP is already allocated")));
                        }
                        ips.push(ip.clone());
                    }
                    None => {
                        let candidate = self.lowest_free_cluster_ip(v6, &used);
                        match candidate {
                            Some(ip) => {
                                used.insert(ip);
                                ips.push(ip.to_string());
                            }
                            None => errs.push(FieldError::new(
                                format!("spec.clusterIPs[{i}]"),
                                FieldErrorKind::Invalid,
                                "failed to allocate IP: the range is full",
                            )),
                        }
                    }
                }
            }
            ips
        };
        spec.insert(
            "clusterIP".into(),
            Value::String(ips.first().cloned().unwrap_or_default()),
        );
        spec.insert("clusterIPs".into(), json!(ips));
        spec.insert("ipFamilies".into(), json!(families));
        spec.insert("ipFamilyPolicy".into(), Value::String(policy));
        errs
    }

    /// The lowest nodePort of 30000-32767 that no Service other than `except` holds and that is
    /// not in `taken` (allocated by this request).
    fn lowest_free_node_port(&self, except: &ObjectKey, taken: &BTreeSet<i64>) -> Option<i64> {
        const FIRST: u32 = 30000;
        const LAST: u32 = 32767;
        let mut from = FIRST;
        loop {
            if from > LAST {
                return None;
            }
            let held = self
                .node_ports
                .range(i64::from(from)..=i64::from(LAST))
                .filter(|(_, holders)| holders.iter().any(|k| k != except))
                .filter_map(|(port, _)| u32::try_from(*port).ok());
            let port = i64::from(lowest_gap(held, from, LAST)?);
            if !taken.contains(&port) {
                return Some(port);
            }
            from = u32::try_from(port + 1).ok()?;
        }
    }

    /// Service defaults and allocations (clusterIP from 192.0.2.0/24, nodePorts from
    /// 30000-32767), carrying allocated values over from `old` on update.
    fn prepare_service(
        &self,
        service: &mut Value,
        old: Option<&Value>,
        key: &ObjectKey,
    ) -> Vec<FieldError> {
        let mut errs = Vec::new();
        // Since Kubernetes 1.32 (LoadBalancerIPMode GA) an ingress entry with an IP gets
        // `ipMode: VIP` by default.
        if let Some(Value::Array(ingress)) = service.pointer_mut("/status/loadBalancer/ingress") {
            for entry in ingress.iter_mut().filter_map(Value::as_object_mut) {
                if entry
                    .get("ip")
                    .and_then(Value::as_str)
                    .is_some_and(|ip| !ip.is_empty())
                {
                    entry.entry("ipMode").or_insert(json!("VIP"));
                }
            }
        }
        let old_spec = old
            .and_then(|o| o.get("spec"))
            .cloned()
            .unwrap_or(Value::Null);
        let old_class = old_spec.get("loadBalancerClass").cloned();
        if old.is_some()
            && service.pointer("/spec/type").and_then(Value::as_str) == Some("LoadBalancer")
            && old_spec.get("type").and_then(Value::as_str) == Some("LoadBalancer")
            && service.pointer("/spec/loadBalancerClass").cloned() != old_class
        {
            errs.push(FieldError::new(
                "spec.loadBalancerClass",
                FieldErrorKind::Invalid,
                "may not change once set",
            ));
        }
        let Some(spec) = service.get_mut("spec").and_then(Value::as_object_mut) else {
            errs.push(FieldError::new("spec", FieldErrorKind::Required, ""));
            return errs;
        };
        let ty = spec
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("ClusterIP")
            .to_string();
        spec.insert("type".into(), Value::String(ty.clone()));
        spec.entry("sessionAffinity").or_insert(json!("None"));
        spec.entry("internalTrafficPolicy")
            .or_insert(json!("Cluster"));
        let needs_node_ports = ty == "NodePort"
            || (ty == "LoadBalancer"
                && spec
                    .get("allocateLoadBalancerNodePorts")
                    .and_then(Value::as_bool)
                    != Some(false));
        if ty == "NodePort" || ty == "LoadBalancer" {
            spec.entry("externalTrafficPolicy")
                .or_insert(json!("Cluster"));
            if ty == "LoadBalancer" {
                spec.entry("allocateLoadBalancerNodePorts")
                    .or_insert(json!(true));
            }
        }
        if ty != "ExternalName" {
            errs.extend(self.assign_cluster_ips(spec, &old_spec, old.is_some()));
        }
        let old_ports = old_spec
            .get("ports")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        // The nodePorts this request takes (the index holds those already stored).
        let mut used: BTreeSet<i64> = BTreeSet::new();
        if let Some(Value::Array(ports)) = spec.get_mut("ports") {
            for (i, port) in ports.iter_mut().enumerate() {
                let Some(p) = port.as_object_mut() else {
                    continue;
                };
                p.entry("protocol").or_insert(json!("TCP"));
                if let Some(n) = p.get("port").cloned() {
                    p.entry("targetPort").or_insert(n);
                }
                if !needs_node_ports {
                    continue;
                }
                let has = p
                    .get("nodePort")
                    .and_then(Value::as_i64)
                    .is_some_and(|n| n != 0);
                if !has {
                    let carried = old_ports
                        .iter()
                        .find(|o| {
                            o.get("port") == p.get("port")
                                && o.get("protocol").unwrap_or(&json!("TCP"))
                                    == p.get("protocol").unwrap_or(&json!("TCP"))
                        })
                        .and_then(|o| o.get("nodePort").and_then(Value::as_i64));
                    match carried.or_else(|| self.lowest_free_node_port(key, &used)) {
                        Some(n) => {
                            used.insert(n);
                            p.insert("nodePort".into(), json!(n));
                        }
                        // The real server refuses the Service too (an internal error there).
                        None => errs.push(FieldError::new(
                            format!("spec.ports[{i}].nodePort"),
                            FieldErrorKind::Invalid,
                            "failed to allocate a nodePort: range is full",
                        )),
                    }
                }
            }
        }
        errs
    }

    /// Kind-specific defaults before validation; returns field errors found while defaulting.
    fn prepare(
        &self,
        kind: &ResourceKind,
        object: &mut Value,
        old: Option<&Value>,
        key: &ObjectKey,
    ) -> Vec<FieldError> {
        match (kind.group, kind.plural) {
            ("", "services") => self.prepare_service(object, old, key),
            _ if kind.is_custom() => schema::custom_resource_errors(kind.kind, object),
            _ => Vec::new(),
        }
    }

    fn validate(kind: &ResourceKind, object: &Value, old: Option<&Value>) -> Vec<FieldError> {
        let mut errs = validation::metadata_errors(kind, object);
        match (kind.group, kind.plural) {
            ("", "services") => errs.extend(validation::service_errors(object)),
            ("", "pods") => errs.extend(validation::pod_errors(object, old)),
            ("discovery.k8s.io", "endpointslices") => {
                errs.extend(validation::endpoint_slice_errors(object, old))
            }
            ("coordination.k8s.io", "leases") => errs.extend(validation::lease_errors(object)),
            ("", "events") => errs.extend(validation::events_core_errors(object)),
            ("events.k8s.io", "events") => errs.extend(validation::events_v1_errors(object)),
            _ => {}
        }
        errs
    }

    /// Creates an object (POST to a collection).
    pub fn create(
        &mut self,
        resource: usize,
        namespace: Option<&str>,
        body: Value,
        ctx: &WriteContext,
    ) -> Result<Value, ApiError> {
        self.create_with(
            resource,
            namespace,
            body,
            ctx,
            Ownership::Update(ctx.manager()),
        )
    }

    fn create_with(
        &mut self,
        resource: usize,
        namespace: Option<&str>,
        mut body: Value,
        ctx: &WriteContext,
        ownership: Ownership<'_>,
    ) -> Result<Value, ApiError> {
        let kind = Self::kind(resource)?;
        Self::check_type(kind, &mut body)?;
        Self::check_namespace(kind, &mut body, namespace)?;
        let meta = meta_mut(&mut body);
        if meta
            .get("resourceVersion")
            .and_then(Value::as_str)
            .is_some_and(|rv| !rv.is_empty())
        {
            return Err(ApiError::Unknown(
                "resourceVersion should not be set on objects to be created".into(),
            ));
        }
        let name_empty = meta
            .get("name")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty);
        if name_empty
            && let Some(prefix) = meta
                .get("generateName")
                .and_then(Value::as_str)
                .filter(|p| !p.is_empty())
        {
            let suffix = generated_suffix(self.next_uid);
            meta.insert("name".into(), Value::String(format!("{prefix}{suffix}")));
        }
        let name = meta
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        if name.is_empty() {
            return Err(Self::invalid(
                kind,
                "",
                vec![FieldError::new(
                    "metadata.name",
                    FieldErrorKind::Required,
                    "name or generateName is required",
                )],
            ));
        }
        let ns = kind.namespaced.then(|| namespace.unwrap_or_default());
        if let Some(ns) = ns
            && !self.objects.contains_key(&Self::key(NAMESPACES, None, ns))
        {
            return Err(Self::not_found(&RESOURCES[NAMESPACES], ns));
        }
        let key = Self::key(resource, ns, &name);
        if self.objects.contains_key(&key) {
            return Err(ApiError::AlreadyExists {
                resource: kind.qualified_name(),
                name,
            });
        }
        let uid = format!("00000000-0000-4000-8000-{:012x}", self.next_uid);
        self.next_uid += 1;
        let meta = meta_mut(&mut body);
        meta.insert("uid".into(), Value::String(uid));
        meta.insert("creationTimestamp".into(), Value::String(ctx.now.clone()));
        meta.insert("generation".into(), json!(1));
        meta.remove("deletionTimestamp");
        meta.remove("deletionGracePeriodSeconds");
        meta.remove("selfLink");
        if let Ownership::Update(_) = ownership {
            meta.remove("managedFields");
        }
        if let Some(m) = body.as_object_mut() {
            match (kind.group, kind.plural) {
                ("", "pods") => {
                    m.insert("status".into(), json!({"phase": "Pending"}));
                }
                ("", "namespaces") => {
                    m.insert("status".into(), json!({"phase": "Active"}));
                }
                ("", "services") => {
                    m.insert("status".into(), json!({"loadBalancer": {}}));
                }
                _ if kind.status_subresource && kind.is_custom() => {
                    m.remove("status");
                }
                _ => {}
            }
        }
        let mut errs = self.prepare(kind, &mut body, None, &key);
        errs.extend(Self::validate(kind, &body, None));
        if !errs.is_empty() {
            return Err(Self::invalid(kind, &name, errs));
        }
        if let Ownership::Update(manager) = ownership {
            let scope = if kind.status_subresource {
                Scope::AllButStatus
            } else {
                Scope::All
            };
            apply::record_update(
                None,
                &mut body,
                manager,
                scope,
                &kind.api_version(),
                &ctx.now,
            );
        }
        let rv = self.next_resource_version();
        meta_mut(&mut body).insert("resourceVersion".into(), Value::String(rv.to_string()));
        self.put(key.clone(), body.clone());
        self.record(WatchRecord {
            resource_version: rv,
            resource,
            namespace: key.1,
            event: EventType::Added,
            object: body.clone(),
            previous: None,
        });
        Ok(body)
    }

    /// Replaces an object (PUT), on the main resource or on `/status`.
    pub fn replace(
        &mut self,
        resource: usize,
        namespace: Option<&str>,
        name: &str,
        mut body: Value,
        status: bool,
        ctx: &WriteContext,
    ) -> Result<Value, ApiError> {
        let kind = Self::kind(resource)?;
        Self::check_type(kind, &mut body)?;
        Self::check_name(&mut body, name)?;
        Self::check_namespace(kind, &mut body, namespace)?;
        let old = self.get(resource, namespace, name)?;
        match meta_str(&body, "resourceVersion").filter(|rv| !rv.is_empty()) {
            None if !kind.unconditional_update => {
                return Err(Self::invalid(
                    kind,
                    name,
                    vec![FieldError::new(
                        "metadata.resourceVersion",
                        FieldErrorKind::Invalid,
                        "0x0: must be specified for an update",
                    )],
                ));
            }
            Some(rv) if Some(rv) != meta_str(&old, "resourceVersion") => {
                return Err(Self::stale(kind, name));
            }
            _ => {}
        }
        self.commit_update(
            resource,
            namespace,
            old,
            body,
            status,
            ctx,
            Ownership::Update(ctx.manager()),
        )
    }

    /// Patches an object; an apply patch creates it when absent.
    #[allow(clippy::too_many_arguments)]
    pub fn patch(
        &mut self,
        resource: usize,
        namespace: Option<&str>,
        name: &str,
        patch_kind: PatchKind,
        body: &[u8],
        status: bool,
        ctx: &WriteContext,
    ) -> Result<Value, ApiError> {
        let kind = Self::kind(resource)?;
        if patch_kind != PatchKind::Apply && ctx.force {
            return Err(Self::invalid(
                kind,
                name,
                vec![FieldError::new(
                    "force",
                    FieldErrorKind::Forbidden,
                    "may not be specified for non-apply patch",
                )],
            ));
        }
        let document: Value = serde_json::from_slice(body).map_err(|e| match patch_kind {
            PatchKind::Apply => ApiError::BadRequest(format!("error decoding apply patch: the fake API server accepts apply patches only as JSON (JSON is YAML; YAML syntax is not supported): {e}")),
            _ => ApiError::BadRequest(format!("error decoding patch: {e}")),
        })?;
        if patch_kind == PatchKind::Apply {
            return self.apply_patch(resource, namespace, name, document, status, ctx);
        }
        if patch_kind == PatchKind::Strategic && kind.is_custom() {
            return Err(ApiError::UnsupportedMediaType(format!(
                "strategic merge patch is not supported for {}",
                kind.qualified_name()
            )));
        }
        let old = self.get(resource, namespace, name)?;
        let patched = match patch_kind {
            PatchKind::Merge => {
                if !document.is_object() {
                    return Err(ApiError::BadRequest(
                        "merge patch must be a JSON object".into(),
                    ));
                }
                Ok(patch::merge_patch(&old, &document))
            }
            PatchKind::Json => patch::json_patch(&old, &document),
            PatchKind::Strategic => patch::strategic_merge_patch(&old, &document),
            PatchKind::Apply => Err(PatchError::WrongShape {
                expected: "an apply document",
            }),
        }
        .map_err(|e| match e {
            PatchError::WrongShape { .. } | PatchError::BadOperation { .. } => {
                ApiError::BadRequest(e.to_string())
            }
            _ => Self::invalid(
                kind,
                name,
                vec![FieldError::new(
                    "patch",
                    FieldErrorKind::Invalid,
                    e.to_string(),
                )],
            ),
        })?;
        let mut patched = patched;
        Self::check_type(kind, &mut patched)?;
        Self::check_name(&mut patched, name)?;
        Self::check_namespace(kind, &mut patched, namespace)?;
        if meta_str(&patched, "resourceVersion") != meta_str(&old, "resourceVersion") {
            return Err(Self::stale(kind, name));
        }
        self.commit_update(
            resource,
            namespace,
            old,
            patched,
            status,
            ctx,
            Ownership::Update(ctx.manager()),
        )
    }

    fn apply_patch(
        &mut self,
        resource: usize,
        namespace: Option<&str>,
        name: &str,
        mut document: Value,
        status: bool,
        ctx: &WriteContext,
    ) -> Result<Value, ApiError> {
        let kind = Self::kind(resource)?;
        let Some(manager) = ctx.field_manager.as_deref().filter(|m| !m.is_empty()) else {
            return Err(ApiError::Invalid {
                kind: "PatchOptions.meta.k8s.io".into(),
                name: String::new(),
                errors: vec![FieldError::new(
                    "fieldManager",
                    FieldErrorKind::Required,
                    "is required for apply patch",
                )],
            });
        };
        if !document.is_object() {
            return Err(ApiError::BadRequest(
                "apply patch must be a JSON object".into(),
            ));
        }
        for field in ["apiVersion", "kind"] {
            if document
                .get(field)
                .and_then(Value::as_str)
                .is_none_or(str::is_empty)
            {
                return Err(ApiError::BadRequest(format!(
                    "{field} must be set in an apply patch"
                )));
            }
        }
        Self::check_type(kind, &mut document)?;
        Self::check_name(&mut document, name)?;
        Self::check_namespace(kind, &mut document, namespace)?;
        let scope = match (status, kind.status_subresource) {
            (true, _) => Scope::StatusOnly,
            (false, true) => Scope::AllButStatus,
            (false, false) => Scope::All,
        };
        let api_version = kind.api_version();
        let req = ApplyRequest {
            manager,
            force: ctx.force,
            scope,
            api_version: &api_version,
            now: &ctx.now,
        };
        let live = self
            .objects
            .get(&Self::key(
                resource,
                kind.namespaced.then(|| namespace.unwrap_or_default()),
                name,
            ))
            .cloned();
        let Some(live) = live else {
            if status {
                return Err(Self::not_found(kind, name));
            }
            let key = Self::key(
                resource,
                kind.namespaced.then(|| namespace.unwrap_or_default()),
                name,
            );
            let normalize = |v: &mut Value| {
                let _ = self.prepare(kind, v, None, &key);
            };
            let created = apply::apply(None, &document, req, &normalize)
                .map_err(|conflicts| ApiError::ApplyConflict { conflicts })?;
            return self.create_with(resource, namespace, created, ctx, Ownership::Applied);
        };
        if let Some(rv) = meta_str(&document, "resourceVersion").filter(|rv| !rv.is_empty())
            && Some(rv) != meta_str(&live, "resourceVersion")
        {
            return Err(Self::stale(kind, name));
        }
        let key = Self::key(
            resource,
            kind.namespaced.then(|| namespace.unwrap_or_default()),
            name,
        );
        let normalize = |v: &mut Value| {
            let _ = self.prepare(kind, v, Some(&live), &key);
        };
        let applied = apply::apply(Some(&live), &document, req, &normalize)
            .map_err(|conflicts| ApiError::ApplyConflict { conflicts })?;
        self.commit_update(
            resource,
            namespace,
            live,
            applied,
            status,
            ctx,
            Ownership::Applied,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn commit_update(
        &mut self,
        resource: usize,
        namespace: Option<&str>,
        old: Value,
        new: Value,
        status: bool,
        ctx: &WriteContext,
        ownership: Ownership<'_>,
    ) -> Result<Value, ApiError> {
        let kind = Self::kind(resource)?;
        let name = meta_str(&old, "name").unwrap_or_default().to_string();
        if !kind.status_subresource && status {
            return Err(Self::not_found(kind, &name));
        }
        if let Some(uid) = meta_str(&new, "uid").filter(|u| !u.is_empty())
            && Some(uid) != meta_str(&old, "uid")
        {
            return Err(ApiError::Conflict {
                resource: kind.qualified_name(),
                name,
                detail: format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    meta_str(&old, "uid").unwrap_or_default()
                ),
            });
        }
        let mut result = if status {
            // The status subresource changes only `.status` (and field ownership).
            let mut r = old.clone();
            if let Some(m) = r.as_object_mut() {
                match new.get("status") {
                    Some(s) => m.insert("status".into(), s.clone()),
                    None => m.remove("status"),
                };
            }
            if let Ownership::Applied = ownership {
                let managed = new.pointer("/metadata/managedFields").cloned();
                let meta = meta_mut(&mut r);
                match managed {
                    Some(mf) => meta.insert("managedFields".into(), mf),
                    None => meta.remove("managedFields"),
                };
            }
            r
        } else {
            let mut r = new.clone();
            if kind.status_subresource
                && let Some(m) = r.as_object_mut()
            {
                match old.get("status") {
                    Some(s) => m.insert("status".into(), s.clone()),
                    None => m.remove("status"),
                };
            }
            let old_meta = old
                .get("metadata")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default();
            let meta = meta_mut(&mut r);
            for field in [
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
                "resourceVersion",
            ] {
                match old_meta.get(field) {
                    Some(v) => meta.insert(field.into(), v.clone()),
                    None => meta.remove(field),
                };
            }
            if let Ownership::Update(_) = ownership {
                match old_meta.get("managedFields") {
                    Some(v) => meta.insert("managedFields".into(), v.clone()),
                    None => meta.remove("managedFields"),
                };
            }
            r
        };
        if meta_str(&old, "deletionTimestamp").is_some() {
            let before: Vec<Value> = old
                .pointer("/metadata/finalizers")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let after: Vec<Value> = result
                .pointer("/metadata/finalizers")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            if after.iter().any(|f| !before.contains(f)) {
                return Err(Self::invalid(
                    kind,
                    &name,
                    vec![FieldError::new(
                        "metadata.finalizers",
                        FieldErrorKind::Forbidden,
                        "no new finalizers can be added if the object is being deleted",
                    )],
                ));
            }
        }
        let key = Self::key(
            resource,
            kind.namespaced.then(|| namespace.unwrap_or_default()),
            &name,
        );
        let mut errs = self.prepare(kind, &mut result, Some(&old), &key);
        errs.extend(Self::validate(kind, &result, Some(&old)));
        if !errs.is_empty() {
            return Err(Self::invalid(kind, &name, errs));
        }
        if let Ownership::Update(manager) = ownership {
            let scope = match (status, kind.status_subresource) {
                (true, _) => Scope::StatusOnly,
                (false, true) => Scope::AllButStatus,
                (false, false) => Scope::All,
            };
            apply::record_update(
                Some(&old),
                &mut result,
                manager,
                scope,
                &kind.api_version(),
                &ctx.now,
            );
        }
        if without_resource_version(&result) == without_resource_version(&old) {
            return Ok(old);
        }
        if without_meta_and_status(&result) != without_meta_and_status(&old) {
            let generation = old
                .pointer("/metadata/generation")
                .and_then(Value::as_i64)
                .unwrap_or(0)
                + 1;
            meta_mut(&mut result).insert("generation".into(), json!(generation));
        }
        let rv = self.next_resource_version();
        meta_mut(&mut result).insert("resourceVersion".into(), Value::String(rv.to_string()));
        let finalizers_left = result
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_some_and(|f| !f.is_empty());
        let event = if meta_str(&result, "deletionTimestamp").is_some() && !finalizers_left {
            self.take(&key);
            EventType::Deleted
        } else {
            self.put(key.clone(), result.clone());
            EventType::Modified
        };
        self.record(WatchRecord {
            resource_version: rv,
            resource,
            namespace: key.1,
            event,
            object: result.clone(),
            previous: Some(old),
        });
        Ok(result)
    }

    /// Deletes an object, honouring finalizers and `DeleteOptions.preconditions`.
    pub fn delete(
        &mut self,
        resource: usize,
        namespace: Option<&str>,
        name: &str,
        options: &Value,
        ctx: &WriteContext,
    ) -> Result<Value, ApiError> {
        let kind = Self::kind(resource)?;
        let old = self.get(resource, namespace, name)?;
        if let Some(pre) = options.get("preconditions") {
            if let Some(uid) = pre.get("uid").and_then(Value::as_str)
                && Some(uid) != meta_str(&old, "uid")
            {
                return Err(ApiError::Conflict {
                    resource: kind.qualified_name(),
                    name: name.into(),
                    detail: format!(
                        "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                        meta_str(&old, "uid").unwrap_or_default()
                    ),
                });
            }
            if let Some(rv) = pre.get("resourceVersion").and_then(Value::as_str)
                && Some(rv) != meta_str(&old, "resourceVersion")
            {
                return Err(ApiError::Conflict {
                    resource: kind.qualified_name(),
                    name: name.into(),
                    detail: format!(
                        "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                        meta_str(&old, "resourceVersion").unwrap_or_default()
                    ),
                });
            }
        }
        if options
            .get("dryRun")
            .and_then(Value::as_array)
            .is_some_and(|d| !d.is_empty())
        {
            return Err(ApiError::BadRequest(
                "the fake API server does not support dryRun".into(),
            ));
        }
        if let Some(policy) = options.get("propagationPolicy").and_then(Value::as_str)
            && !["Orphan", "Background", "Foreground"].contains(&policy)
        {
            return Err(ApiError::Invalid {
                kind: "DeleteOptions".into(),
                name: String::new(),
                errors: vec![FieldError::new(
                    "propagationPolicy",
                    FieldErrorKind::NotSupported,
                    format!(
                        "{policy:?}: supported values: \"Foreground\", \"Background\", \"Orphan\""
                    ),
                )],
            });
        }
        let key = Self::key(
            resource,
            kind.namespaced.then(|| namespace.unwrap_or_default()),
            name,
        );
        if resource == NAMESPACES {
            let contained: Vec<ObjectKey> = self
                .objects
                .keys()
                .filter(|(r, ns, _)| *r != NAMESPACES && *ns == name)
                .cloned()
                .collect();
            for (r, ns, n) in contained {
                self.delete(r, Some(&ns), &n, &Value::Null, ctx)?;
            }
        }
        let has_finalizers = old
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_some_and(|f| !f.is_empty());
        if has_finalizers {
            if meta_str(&old, "deletionTimestamp").is_some() {
                return Ok(old);
            }
            let mut marked = old.clone();
            let rv = self.next_resource_version();
            let meta = meta_mut(&mut marked);
            meta.insert("deletionTimestamp".into(), Value::String(ctx.now.clone()));
            meta.insert("deletionGracePeriodSeconds".into(), json!(0));
            meta.insert("resourceVersion".into(), Value::String(rv.to_string()));
            self.put(key.clone(), marked.clone());
            self.record(WatchRecord {
                resource_version: rv,
                resource,
                namespace: key.1,
                event: EventType::Modified,
                object: marked.clone(),
                previous: Some(old),
            });
            return Ok(marked);
        }
        let mut gone = old.clone();
        let rv = self.next_resource_version();
        meta_mut(&mut gone).insert("resourceVersion".into(), Value::String(rv.to_string()));
        self.take(&key);
        self.record(WatchRecord {
            resource_version: rv,
            resource,
            namespace: key.1,
            event: EventType::Deleted,
            object: gone.clone(),
            previous: Some(old),
        });
        Ok(gone)
    }

    /// Starts a watch: the backlog (initial objects or history after a resourceVersion) and the
    /// live subscription, taken together so no event is lost or repeated.
    pub fn watch(&self, filter: &WatchFilter, start: WatchStart) -> WatchBegin {
        let live = self.events.subscribe();
        let current = self.resource_version;
        let initial = || -> Vec<(EventType, Value)> {
            self.objects_of(filter.resource, filter.namespace.as_deref())
                .map(|(_, v)| v)
                .filter(|v| filter.matches(v))
                .map(|v| (EventType::Added, v.clone()))
                .collect()
        };
        match start {
            WatchStart::FromNow => WatchBegin::Stream {
                backlog: initial(),
                initial_end: None,
                resource_version: current,
                live,
            },
            WatchStart::InitialEvents => WatchBegin::Stream {
                backlog: initial(),
                initial_end: Some(current),
                resource_version: current,
                live,
            },
            WatchStart::After(rv) if rv > current => {
                WatchBegin::Error(ApiError::TooLargeResourceVersion {
                    requested: rv,
                    current,
                })
            }
            WatchStart::After(rv) if rv < self.compacted_through => {
                WatchBegin::Error(ApiError::Expired(format!(
                    "too old resource version: {rv} ({})",
                    self.compacted_through + 1
                )))
            }
            WatchStart::After(rv) => {
                // The history is in resourceVersion order.
                let first = self.history.partition_point(|r| r.resource_version <= rv);
                let backlog = self
                    .history
                    .range(first..)
                    .filter_map(|r| filter.translate(r).map(|t| (t, r.object.clone())))
                    .collect();
                WatchBegin::Stream {
                    backlog,
                    initial_end: None,
                    resource_version: current,
                    live,
                }
            }
        }
    }
}

/// Removes `key` from the holders of `value`, and the entry when nobody holds it any more.
fn release_holding<T: Ord>(index: &mut BTreeMap<T, Vec<ObjectKey>>, value: T, key: &ObjectKey) {
    if let Some(holders) = index.get_mut(&value) {
        if let Some(pos) = holders.iter().position(|k| k == key) {
            holders.swap_remove(pos);
        }
        if holders.is_empty() {
            index.remove(&value);
        }
    }
}

/// The lowest number of `from..=last` missing from `held` (ascending, numbers below `from`
/// ignored).
fn lowest_gap(held: impl Iterator<Item = u32>, from: u32, last: u32) -> Option<u32> {
    let mut next = from;
    for n in held {
        if n < next {
            continue;
        }
        if n > next {
            break;
        }
        next += 1;
    }
    (next <= last).then_some(next)
}

/// The strings of a JSON list (non-strings and a missing list give nothing).
fn string_list(value: Option<&Value>) -> Vec<String> {
    value
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// Index of a core/v1 resource by plural (the table is static; absent names map past its end).
fn resource_index(plural: &str) -> usize {
    super::resources::find("", "v1", plural).unwrap_or(usize::MAX)
}

/// Five characters from a counter, like the real server's random `generateName` suffix.
fn generated_suffix(seed: u64) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (0..5)
        .map(|_| {
            let c = ALPHABET[(x % ALPHABET.len() as u64) as usize];
            x /= ALPHABET.len() as u64;
            c as char
        })
        .collect()
}

/// Formats seconds since the Unix epoch as RFC 3339 UTC (`2026-01-02T03:04:05Z`).
pub fn rfc3339(unix_seconds: u64) -> String {
    let days = (unix_seconds / 86_400) as i64;
    let secs = unix_seconds % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx() -> WriteContext {
        WriteContext {
            now: "2026-11-22T00:00:00Z".into(),
            field_manager: None,
            default_manager: "test".into(),
            force: false,
        }
    }

    fn svc_index() -> usize {
        resource_index("services")
    }

    fn svc(name: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name}, "spec": {"ports": [{"port": 80}]}})
    }

    #[test]
    fn rfc3339_formats_known_instants() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
    }

    #[test]
    fn a_noop_update_keeps_the_resource_version_and_records_no_event() {
        let mut store = Store::new(100, "t");
        let created = store
            .create(svc_index(), Some("default"), svc("web"), &ctx())
            .unwrap();
        let rv = store.resource_version();
        let same = store
            .replace(
                svc_index(),
                Some("default"),
                "web",
                created.clone(),
                false,
                &ctx(),
            )
            .unwrap();
        assert_eq!(same, created);
        assert_eq!(store.resource_version(), rv);
    }

    #[test]
    fn services_get_a_cluster_ip_from_the_documentation_range_and_default_ports() {
        let mut store = Store::new(100, "t");
        let a = store
            .create(svc_index(), Some("default"), svc("a"), &ctx())
            .unwrap();
        let b = store
            .create(svc_index(), Some("default"), svc("b"), &ctx())
            .unwrap();
        assert_eq!(a["spec"]["clusterIP"], "192.0.2.1");
        assert_eq!(b["spec"]["clusterIP"], "192.0.2.2");
        assert_eq!(a["spec"]["ports"][0]["protocol"], "TCP");
        assert_eq!(a["spec"]["ports"][0]["targetPort"], 80);
    }

    #[test]
    fn applying_the_same_service_again_is_a_noop_and_defaults_are_no_conflict() {
        let mut store = Store::new(100, "t");
        let apply_as = |manager: &str| WriteContext {
            field_manager: Some(manager.into()),
            ..ctx()
        };
        let body = serde_json::to_vec(&svc("web")).unwrap();
        let first = store
            .patch(
                svc_index(),
                Some("default"),
                "web",
                PatchKind::Apply,
                &body,
                false,
                &apply_as("a"),
            )
            .unwrap();
        let again = store
            .patch(
                svc_index(),
                Some("default"),
                "web",
                PatchKind::Apply,
                &body,
                false,
                &apply_as("a"),
            )
            .unwrap();
        assert_eq!(
            again["metadata"]["resourceVersion"],
            first["metadata"]["resourceVersion"]
        );
        let shared = store.patch(
            svc_index(),
            Some("default"),
            "web",
            PatchKind::Apply,
            &body,
            false,
            &apply_as("b"),
        );
        assert!(
            shared.is_ok(),
            "the same ports, defaulted, are no conflict: {shared:?}"
        );
        let other = serde_json::to_vec(&json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"}, "spec": {"ports": [{"port": 81}]}})).unwrap();
        let conflict = store.patch(
            svc_index(),
            Some("default"),
            "web",
            PatchKind::Apply,
            &other,
            false,
            &apply_as("c"),
        );
        assert!(matches!(conflict, Err(ApiError::ApplyConflict { .. })));
    }

    #[test]
    fn dual_stack_services_get_one_cluster_ip_per_family_and_keep_them() {
        let mut store = Store::new(100, "t");
        let mut body = svc("dual");
        body["spec"]["ipFamilyPolicy"] = json!("RequireDualStack");
        let created = store
            .create(svc_index(), Some("default"), body, &ctx())
            .unwrap();
        assert_eq!(
            created["spec"]["clusterIPs"],
            json!(["192.0.2.1", "2001:db8:ffff::1"])
        );
        assert_eq!(created["spec"]["ipFamilies"], json!(["IPv4", "IPv6"]));
        let mut put = created.clone();
        put["spec"]["clusterIPs"] = json!(null);
        put["metadata"]["labels"] = json!({"a": "b"});
        let updated = store
            .replace(svc_index(), Some("default"), "dual", put, false, &ctx())
            .unwrap();
        assert_eq!(updated["spec"]["clusterIPs"], created["spec"]["clusterIPs"]);
        let mut v6 = svc("v6");
        v6["spec"]["ipFamilies"] = json!(["IPv6"]);
        let v6 = store
            .create(svc_index(), Some("default"), v6, &ctx())
            .unwrap();
        assert_eq!(v6["spec"]["clusterIP"], "2001:db8:ffff::2");
        let mut bad = svc("bad");
        bad["spec"]["ipFamilies"] = json!(["IPv4", "IPv6"]);
        assert!(
            matches!(
                store.create(svc_index(), Some("default"), bad, &ctx()),
                Err(ApiError::Invalid { .. })
            ),
            "SingleStack with two families"
        );
        let mut outside = svc("outside");
        outside["spec"]["clusterIP"] = json!("10.96.0.1");
        assert!(matches!(
            store.create(svc_index(), Some("default"), outside, &ctx()),
            Err(ApiError::Invalid { .. })
        ));
    }

    #[test]
    fn a_deleted_services_cluster_ip_and_node_port_are_handed_out_again_lowest_first() {
        let mut store = Store::new(100, "t");
        let lb = |store: &mut Store, name: &str| {
            let mut body = svc(name);
            body["spec"]["type"] = json!("LoadBalancer");
            store
                .create(svc_index(), Some("default"), body, &ctx())
                .unwrap()
        };
        let a = lb(&mut store, "a");
        let b = lb(&mut store, "b");
        assert_eq!(a["spec"]["ports"][0]["nodePort"], 30000);
        assert_eq!(b["spec"]["ports"][0]["nodePort"], 30001);
        store
            .delete(svc_index(), Some("default"), "a", &Value::Null, &ctx())
            .unwrap();
        let c = lb(&mut store, "c");
        assert_eq!(c["spec"]["clusterIP"], a["spec"]["clusterIP"]);
        assert_eq!(c["spec"]["ports"][0]["nodePort"], 30000);
        let d = lb(&mut store, "d");
        assert_eq!(d["spec"]["clusterIP"], "192.0.2.3");
        assert_eq!(d["spec"]["ports"][0]["nodePort"], 30002);
        // An update keeps what the Service holds.
        let mut relabelled = d.clone();
        relabelled["metadata"]["labels"] = json!({"x": "y"});
        let updated = store
            .replace(svc_index(), Some("default"), "d", relabelled, false, &ctx())
            .unwrap();
        assert_eq!(updated["spec"]["clusterIP"], "192.0.2.3");
        assert_eq!(updated["spec"]["ports"][0]["nodePort"], 30002);
    }

    #[test]
    fn a_full_cluster_ip_or_node_port_range_refuses_the_service() {
        let mut store = Store::new(10, "t");
        for i in 0..254 {
            let mut body = svc(&format!("s{i}"));
            body["spec"]["type"] = json!("NodePort");
            store
                .create(svc_index(), Some("default"), body, &ctx())
                .unwrap();
        }
        assert!(matches!(
            store.create(svc_index(), Some("default"), svc("one-too-many"), &ctx()),
            Err(ApiError::Invalid { .. })
        ));
        let mut ports = svc("many-ports");
        ports["spec"]["type"] = json!("NodePort");
        ports["spec"]["ipFamilies"] = json!(["IPv6"]);
        ports["spec"]["ports"] = json!(
            (0..2600)
                .map(|p| json!({"port": 1000 + p, "name": format!("p{p}")}))
                .collect::<Vec<_>>()
        );
        let err = store.create(svc_index(), Some("default"), ports, &ctx());
        assert!(
            matches!(&err, Err(ApiError::Invalid { errors, .. }) if errors.iter().any(|e| e.to_string().contains("range is full"))),
            "{err:?}"
        );
    }

    #[test]
    fn pages_follow_one_another_from_the_first_pages_snapshot_and_a_token_can_be_reused() {
        let mut store = Store::new(100, "t");
        for n in ["a", "b", "c", "d", "e"] {
            store
                .create(svc_index(), Some("default"), svc(n), &ctx())
                .unwrap();
        }
        let none = (LabelSelector::default(), FieldSelector::default());
        let page = |store: &mut Store, token: Option<&str>| {
            let list = store
                .list(
                    svc_index(),
                    None,
                    &none.0,
                    &none.1,
                    None,
                    None,
                    Some(2),
                    token,
                )
                .unwrap();
            let names: Vec<String> = list["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| i["metadata"]["name"].as_str().unwrap().to_string())
                .collect();
            let token = list["metadata"]["continue"].as_str().map(str::to_string);
            (names, token, list["metadata"]["remainingItemCount"].clone())
        };
        let (first, token1, left1) = page(&mut store, None);
        assert_eq!(
            (first, left1),
            (vec!["a".to_string(), "b".into()], json!(3))
        );
        store
            .delete(svc_index(), Some("default"), "c", &Value::Null, &ctx())
            .unwrap();
        let (second, token2, left2) = page(&mut store, token1.as_deref());
        assert_eq!(
            (second, left2),
            (vec!["c".to_string(), "d".into()], json!(1))
        );
        let (third, token3, _) = page(&mut store, token2.as_deref());
        assert_eq!((third, token3), (vec!["e".to_string()], None));
        let (again, _, _) = page(&mut store, token1.as_deref());
        assert_eq!(again, vec!["c".to_string(), "d".into()]);
    }

    #[test]
    fn history_overflow_makes_old_watches_expire() {
        let mut store = Store::new(2, "t");
        let filter = WatchFilter {
            resource: svc_index(),
            namespace: None,
            labels: LabelSelector::default(),
            fields: FieldSelector::default(),
        };
        let start = store.resource_version();
        for n in ["a", "b", "c"] {
            store
                .create(svc_index(), Some("default"), svc(n), &ctx())
                .unwrap();
        }
        assert!(matches!(
            store.watch(&filter, WatchStart::After(start)),
            WatchBegin::Error(ApiError::Expired(_))
        ));
        let recent = store.resource_version() - 1;
        let WatchBegin::Stream { backlog, .. } = store.watch(&filter, WatchStart::After(recent))
        else {
            panic!("a recent resourceVersion must be served");
        };
        assert_eq!(backlog.len(), 1);
    }
}
