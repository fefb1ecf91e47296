//! `ServiceL2Status` records: which node announces each Service, as `kubectl get
//! servicel2statuses` shows it.
//!
//! One record per Service, in the speaker's namespace, under a name derived from the Service
//! ([`record_name`]), so every speaker writes the same object: a new owner takes the record
//! over with a forced server-side apply, and a dead owner's record never dangles (it cannot
//! delete its own, but it does not need to: the successor overwrites it). Writes per failover
//! are proportional to the Services that moved. Services sharing an IP (`allow-shared-ip`)
//! have one owner and one record each, all naming it, as in MetalLB: the owner writes them all.
//!
//! A record whose Service the snapshot does not serve (the Service is gone, or has no IP
//! served) is deleted: by the first live member by name when the Service stops being served
//! while the speakers run; and, for the records no event will ever touch again (the Service
//! went while every speaker was down, or before this speaker saw it), by the sweep
//! ([`Strays`]). Exactly one node sweeps each record, chosen from gossiped facts alone so every
//! speaker agrees: **the node the record names, if it is a live member; otherwise the first
//! live member by name**. The named node goes first because it wrote the record and is the one
//! that knows best it no longer serves the Service (its caches produced the record); the first
//! member covers a record left by a node that is gone or renamed. The sweep waits until the
//! served Services are known in full (the caches listed and the holdings filled: a half-known
//! snapshot would sweep valid records), and the caller also holds it while the mesh forms
//! (a lone node is the first live member of its own view) and while the node drains.
//!
//! [`Holdings`] follows what this node answers, IP by IP, and says which Services' records
//! changed. [`RecordWriter`] keeps what it wrote and what is still to write. [`RecordWriter::set`]
//! is pure bookkeeping (which records this node must write or delete); [`RecordWriter::flush`]
//! performs the pending writes and keeps those that fail (the API server may be away) for the
//! next flush, so the records become true again once it is back.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{Hash, Hasher};
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use super::hedge::{RECORD_COPIES_IN_FLIGHT, RECORD_HEDGES, hedged};
use crate::model::engine::placement::LinkSet;
use futures::StreamExt as _;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use sha2::{Digest, Sha256};
use swimlb_config::crd::{InterfaceInfo, ServiceL2Status, ServiceL2StatusStatus};
use swimlb_config::service::ServiceKey;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How many record writes a flush has in flight at once.
const FLUSH_CONCURRENCY: usize = 8;
/// A write that takes this long is logged.
const SLOW_WRITE: Duration = Duration::from_millis(500);

/// The field manager of the speakers' writes.
pub const FIELD_MANAGER: &str = "swimlb-speaker";
/// Label: the announcing node.
pub const NODE_LABEL: &str = "swimlb.io/node";
/// Label: the Service's name.
pub const SERVICE_NAME_LABEL: &str = "swimlb.io/service-name";
/// Label: the Service's namespace.
pub const SERVICE_NAMESPACE_LABEL: &str = "swimlb.io/service-namespace";

/// The record of `service`: `l2-` and the first 20 hex digits of `sha256(namespace/name)` (a
/// DNS label whatever the names are, and the same on every node).
pub fn record_name(service: &ServiceKey) -> String {
    let digest = Sha256::digest(format!("{}/{}", service.namespace, service.name).as_bytes());
    let hex: String = digest[..10].iter().map(|b| format!("{b:02x}")).collect();
    format!("l2-{hex}")
}

/// The status a record of `service` announced by `node` on `interfaces` holds.
pub fn record_status(
    node: &str,
    service: &ServiceKey,
    interfaces: &[String],
) -> ServiceL2StatusStatus {
    ServiceL2StatusStatus {
        node: node.to_string(),
        service_name: service.name.to_string(),
        service_namespace: service.namespace.to_string(),
        interfaces: interfaces
            .iter()
            .map(|name| InterfaceInfo { name: name.clone() })
            .collect(),
    }
}

/// One served IP as the records see it: its Services, the links this node answers it on (none:
/// this node does not), and whether nobody owns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpFacts {
    /// The Service it belongs to (the first of those sharing it).
    pub service: ServiceKey,
    /// The other Services sharing it, each with its own record (`None`: not shared, the
    /// common case, which allocates nothing).
    pub shared_with: Option<Box<[ServiceKey]>>,
    /// The links this node answers on (`None`: it does not answer); shared between the IPs
    /// answered on the same links (the engine's [`LinkSet`]s).
    pub links: Option<LinkSet>,
    /// The election names no owner.
    pub unowned: bool,
}

impl IpFacts {
    /// Every Service holding the IP: the first, then the others sharing it.
    pub fn services(&self) -> impl Iterator<Item = &ServiceKey> {
        std::iter::once(&self.service).chain(self.shared_with.iter().flatten())
    }
}

/// What this node holds, IP by IP, and the record of each Service that follows from it: kept
/// up to date from the IPs that changed, so a change costs what it touches.
#[derive(Debug, Default)]
pub struct Holdings {
    node: String,
    ips: HashMap<IpAddr, IpFacts>,
    /// The IPs of each Service (mostly one: a small vector).
    by_service: HashMap<ServiceKey, Vec<IpAddr>>,
}

impl Holdings {
    /// Nothing held yet, by `node`.
    pub fn new(node: &str) -> Holdings {
        Holdings {
            node: node.to_string(),
            ..Holdings::default()
        }
    }

    /// Whether `ip`'s facts as last set are these (without allocating): its Service, the
    /// others sharing it (`namespace/name`), its links, whether it is unowned.
    pub fn matches(
        &self,
        ip: &IpAddr,
        service: Option<(&str, &str)>,
        shared_with: Option<&[String]>,
        links: Option<&BTreeSet<String>>,
        unowned: bool,
    ) -> bool {
        let is = |key: &ServiceKey, (namespace, name): (&str, &str)| {
            key.namespace == namespace && key.name == name
        };
        let same_siblings = match (
            self.ips.get(ip).map(|f| f.shared_with.as_deref()),
            shared_with,
        ) {
            (None | Some(None), None) => true,
            (Some(Some(held)), Some(now)) => {
                held.len() == now.len()
                    && held
                        .iter()
                        .zip(now)
                        .all(|(key, s)| s.split_once('/').is_some_and(|s| is(key, s)))
            }
            _ => false,
        };
        match (self.ips.get(ip), service) {
            (None, None) => true,
            (Some(f), Some(service)) => {
                is(&f.service, service)
                    && same_siblings
                    && f.unowned == unowned
                    && f.links.as_deref() == links
            }
            _ => false,
        }
    }

    /// Every IP with facts.
    pub fn ips(&self) -> impl Iterator<Item = &IpAddr> {
        self.ips.keys()
    }

    /// Every Service with an IP.
    pub fn services(&self) -> impl Iterator<Item = &ServiceKey> {
        self.by_service.keys()
    }

    /// Whether `service` has an IP (shared or not): the snapshot serves it.
    pub fn holds(&self, service: &ServiceKey) -> bool {
        self.by_service.contains_key(service)
    }

    /// Sets `ip`'s facts (`None`: no longer served). Returns the Services whose record may
    /// have changed (none when the facts are the same).
    pub fn set(&mut self, ip: IpAddr, facts: Option<IpFacts>) -> Vec<ServiceKey> {
        if self.ips.get(&ip) == facts.as_ref() {
            return Vec::new();
        }
        let mut touched: Vec<ServiceKey> = Vec::new();
        for service in facts.iter().flat_map(IpFacts::services) {
            let ips = self
                .by_service
                .entry(service.clone())
                .or_insert_with(|| Vec::with_capacity(1));
            if !ips.contains(&ip) {
                ips.push(ip);
                ips.sort_unstable();
            }
            touched.push(service.clone());
        }
        let before = match facts {
            Some(facts) => self.ips.insert(ip, facts),
            None => self.ips.remove(&ip),
        };
        for service in before.iter().flat_map(IpFacts::services) {
            if touched.contains(service) {
                continue;
            }
            if let Some(ips) = self.by_service.get_mut(service) {
                ips.retain(|held| *held != ip);
                if ips.is_empty() {
                    self.by_service.remove(service);
                }
            }
            touched.push(service.clone());
        }
        touched
    }

    /// The record this node should hold for `service` (`None`: it answers none of its IPs),
    /// on the links of every IP it answers; and whether some IP of it has no owner (or the
    /// Service is gone): then its record is an orphan.
    pub fn record(&self, service: &ServiceKey) -> (Option<ServiceL2StatusStatus>, bool) {
        let Some(ips) = self.by_service.get(service) else {
            return (None, true);
        };
        let facts = ips.iter().filter_map(|ip| self.ips.get(ip));
        let mut links: Option<BTreeSet<&str>> = None;
        let mut unowned = false;
        for f in facts {
            unowned |= f.unowned;
            if let Some(l) = &f.links {
                links
                    .get_or_insert_default()
                    .extend(l.iter().map(String::as_str));
            }
        }
        let record = links.map(|links| {
            let links: Vec<String> = links.into_iter().map(str::to_string).collect();
            record_status(&self.node, service, &links)
        });
        (record, unowned)
    }
}

/// The records the API holds for Services the snapshot does not serve: no owner will write
/// them and no orphan delete will come for them, so one node sweeps each (module docs: the
/// node the record names if it is live, else the first live member by name). Mostly empty: a
/// record is kept here only while its Service is not served.
#[derive(Debug, Default)]
pub struct Strays {
    /// Service -> the node its record names (empty: none), and whether its delete was
    /// handed out already.
    records: HashMap<ServiceKey, (String, bool)>,
    /// The served Services are known in full: sweeping may start.
    synced: bool,
}

impl Strays {
    /// None known, and no sweep until [`Strays::synced`].
    pub fn new() -> Strays {
        Strays::default()
    }

    /// The served Services are known in full from now on (the caches listed and every IP
    /// of the snapshot is in the holdings): sweeping may start.
    pub fn synced(&mut self) {
        self.synced = true;
    }

    /// The API holds a record of `service` naming `node` (`None`: the record is gone);
    /// `served`: whether the snapshot serves the Service now. A record seen again (written
    /// again) may be handed out again.
    pub fn seen(&mut self, service: &ServiceKey, node: Option<&str>, served: bool) {
        match node {
            Some(node) if !served => {
                self.records
                    .insert(service.clone(), (node.to_string(), false));
            }
            _ => {
                self.records.remove(service);
            }
        }
    }

    /// `service` is served now: its record is no stray (its owner writes it).
    pub fn served(&mut self, service: &ServiceKey) {
        self.records.remove(service);
    }

    /// The records forgotten: the watch on them lists again.
    pub fn clear(&mut self) {
        self.records.clear();
    }

    /// Whether no stray is known.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// The strays `node` deletes now (none before [`Strays::synced`]): those whose record
    /// names it, and, when it is the `first` live member by name, those whose record names no
    /// member `is_live` says is live. Each is handed out once, until it is seen again.
    pub fn due(
        &mut self,
        node: &str,
        is_live: impl Fn(&str) -> bool,
        first: Option<&str>,
    ) -> Vec<ServiceKey> {
        if !self.synced {
            return Vec::new();
        }
        let first = first == Some(node);
        let mut due = Vec::new();
        for (service, (named, handed_out)) in &mut self.records {
            let mine = if named.as_str() == node {
                true
            } else {
                first && !is_live(named)
            };
            if mine && !*handed_out {
                *handed_out = true;
                due.push(service.clone());
            }
        }
        due.sort();
        due
    }
}

/// A record's status in a word: what [`RecordWriter`] keeps of what it wrote.
fn fingerprint(status: &ServiceL2StatusStatus) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    status.node.hash(&mut hasher);
    status.service_name.hash(&mut hasher);
    status.service_namespace.hash(&mut hasher);
    for interface in &status.interfaces {
        interface.name.hash(&mut hasher);
    }
    hasher.finish()
}

/// One write the writer has to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    /// Apply the record of the Service with this status.
    Apply(ServiceL2StatusStatus),
    /// Delete the record of the Service.
    Delete,
    /// Delete the record of a Service not served ([`Strays`]), counted when it is deleted.
    Sweep,
}

/// Why a write failed.
#[derive(Debug, thiserror::Error)]
#[error("ServiceL2Status {name} of {service}: {source}")]
pub struct WriteError {
    /// The record.
    pub name: String,
    /// Its Service.
    pub service: ServiceKey,
    /// The API's error.
    #[source]
    pub source: kube::Error,
}

/// The records this node writes, and those still to write.
#[derive(Debug)]
pub struct RecordWriter {
    api: Api<ServiceL2Status>,
    /// What the API holds from this node, as far as it knows ([`fingerprint`] of the status);
    /// records given up included, until the watch shows them written over.
    written: HashMap<ServiceKey, u64>,
    /// What is still to do.
    pending: BTreeMap<ServiceKey, Write>,
    /// Records swept since the last [`RecordWriter::take_swept`].
    swept: u64,
    /// Leave for copies of slow writes ([`RECORD_COPIES_IN_FLIGHT`]).
    copies: Arc<Semaphore>,
}

impl RecordWriter {
    /// A writer of records in `namespace`.
    pub fn new(client: kube::Client, namespace: &str) -> RecordWriter {
        RecordWriter {
            api: Api::namespaced(client, namespace),
            written: HashMap::new(),
            pending: BTreeMap::new(),
            swept: 0,
            copies: Arc::new(Semaphore::new(RECORD_COPIES_IN_FLIGHT)),
        }
    }

    /// Deletes the record of `service`, a Service the snapshot does not serve, left by a
    /// node that no longer takes care of it ([`Strays::due`]). Undone by a later
    /// [`RecordWriter::set`] (the Service is served again).
    pub fn sweep(&mut self, service: &ServiceKey) {
        self.written.remove(service);
        self.pending.insert(service.clone(), Write::Sweep);
    }

    /// Forgets which records this node wrote: after a cut, the API may hold what others wrote
    /// over them, so the next [`RecordWriter::set`] of each writes it again.
    pub fn forget(&mut self) {
        self.written.clear();
    }

    /// How many records were swept (deleted by this node, not found gone) since the last call.
    pub fn take_swept(&mut self) -> u64 {
        std::mem::take(&mut self.swept)
    }

    /// The record this node should hold for one Service (`None`: none), and whether the
    /// Service is orphaned (announced by nobody, or gone: its record is deleted). A Service
    /// this node stops announcing to another node is left alone: its new owner takes it over.
    /// One Service at a time: a watch event costs what it changes. Returns whether a write of
    /// the record is pending now.
    pub fn set(
        &mut self,
        service: &ServiceKey,
        desired: Option<ServiceL2StatusStatus>,
        orphaned: bool,
    ) -> bool {
        match desired {
            Some(status) => {
                if self.written.get(service) != Some(&fingerprint(&status)) {
                    self.pending.insert(service.clone(), Write::Apply(status));
                    return true;
                }
                self.pending.remove(service);
                false
            }
            None if orphaned => {
                self.written.remove(service);
                self.pending.insert(service.clone(), Write::Delete);
                true
            }
            None => {
                // Given up: another node takes it (its apply wins); a delete not done yet would
                // remove that node's record. What this node wrote is kept: the API holds it
                // until the new owner's write, which the watch shows ([`RecordWriter::observe`]
                // forgets it then), so a record given up and taken back before anybody wrote
                // over it (this node was held for a moment after a pause) is not written again.
                self.pending.remove(service);
                false
            }
        }
    }

    /// The API server holds `status` (`None`: no record) for `service`'s record, as the watch
    /// on the records saw it. If this node wrote the record and it says otherwise now (another
    /// node overwrote it while the two could not hear each other, or somebody deleted it), the
    /// writer forgets it wrote it and returns true: the caller sets the record again, so a
    /// record never stays stale while its owner lives.
    ///
    /// A write is two requests or three (the first time the object is created between two of
    /// its status), the watch shows each, and a copy of a slow write ([`super::hedge`]) may
    /// still land: the caller calls this only once what it saw has stood for a while
    /// ([`RecordWriter::differs`] first).
    pub fn observe(
        &mut self,
        service: &ServiceKey,
        status: Option<&ServiceL2StatusStatus>,
    ) -> bool {
        match self.written.get(service) {
            Some(mine) if status.map(fingerprint) != Some(*mine) => {
                self.written.remove(service);
                true
            }
            _ => false,
        }
    }

    /// Whether this node wrote `service`'s record and `status` says otherwise.
    pub fn differs(&self, service: &ServiceKey, status: Option<&ServiceL2StatusStatus>) -> bool {
        self.written
            .get(service)
            .is_some_and(|mine| status.map(fingerprint) != Some(*mine))
    }

    /// Takes `status` as written for `service`, as a successful flush would (tests of the
    /// callers' bookkeeping, without an API server).
    #[cfg(test)]
    pub(crate) fn assume_written(&mut self, service: &ServiceKey, status: &ServiceL2StatusStatus) {
        self.pending.remove(service);
        self.written.insert(service.clone(), fingerprint(status));
    }

    /// Whether writes are pending (a failed one included).
    pub fn is_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Performs the pending writes; those that fail stay pending and are returned.
    pub async fn flush(&mut self) -> Vec<WriteError> {
        let pending = std::mem::take(&mut self.pending);
        // A few at once: a node that takes over several Services (its peer died) writes their
        // records in about one write's time instead of one after the other, which a lossy link
        // (a lost segment waits out a retransmission timeout) stretches into seconds.
        let this = &*self;
        let done: Vec<_> = futures::stream::iter(pending)
            .map(|(service, write)| async move {
                let result = this.perform(&service, &write).await;
                (service, write, result)
            })
            .buffer_unordered(FLUSH_CONCURRENCY)
            .collect()
            .await;
        let mut errors = Vec::new();
        for (service, write, result) in done {
            match result {
                Ok(changed) => match write {
                    Write::Apply(status) => {
                        self.written.insert(service, fingerprint(&status));
                    }
                    Write::Sweep if changed => self.swept += 1,
                    Write::Sweep | Write::Delete => {}
                },
                Err(source) => {
                    errors.push(WriteError {
                        name: record_name(&service),
                        service: service.clone(),
                        source,
                    });
                    self.pending.insert(service, write);
                }
            }
        }
        errors
    }

    /// One write: a record applied (hedged: [`super::hedge`]), or deleted; returns whether it
    /// changed the API's records (a record already gone is not deleted, but the write is done).
    async fn perform(&self, service: &ServiceKey, write: &Write) -> Result<bool, kube::Error> {
        let name = record_name(service);
        let started = tokio::time::Instant::now();
        let sent = AtomicU32::new(0);
        let result = match write {
            Write::Apply(status) => {
                // A copy holds its leave until it ends.
                let attempt = |leave: Option<OwnedSemaphorePermit>| {
                    sent.fetch_add(1, Ordering::Relaxed);
                    let name = &name;
                    async move {
                        let _leave = leave;
                        self.apply(name, service, status).await
                    }
                };
                let copy = || {
                    let leave = self.copies.clone().try_acquire_owned().ok()?;
                    Some(attempt(Some(leave)))
                };
                hedged(&RECORD_HEDGES, attempt(None), copy)
                    .await
                    .map(|()| true)
            }
            Write::Delete | Write::Sweep => {
                match self.api.delete(&name, &DeleteParams::default()).await {
                    Ok(_) => Ok(true),
                    Err(kube::Error::Api(e)) if e.code == 404 => Ok(false),
                    Err(e) => Err(e),
                }
            }
        };
        let took = started.elapsed();
        if took >= SLOW_WRITE {
            // The chaos lab's stale records: the logs must say when a write was late.
            tracing::info!(
                %service,
                took_ms = took.as_millis() as u64,
                ok = result.is_ok(),
                sent = sent.load(Ordering::Relaxed),
                "a ServiceL2Status write was slow"
            );
        }
        result
    }

    /// Applies `status` to `service`'s record: the status first, the truth a reader takes
    /// (under loss every request can wait out retransmissions: one, not two, before the record
    /// names the new owner), then the object's labels; a record not there yet is created
    /// first. Two requests, three the first time.
    async fn apply(
        &self,
        name: &str,
        service: &ServiceKey,
        status: &ServiceL2StatusStatus,
    ) -> Result<(), kube::Error> {
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let body = serde_json::json!({
            "apiVersion": "swimlb.io/v1beta1",
            "kind": "ServiceL2Status",
            "metadata": { "name": name },
            "status": status,
        });
        let object = serde_json::json!({
            "apiVersion": "swimlb.io/v1beta1",
            "kind": "ServiceL2Status",
            "metadata": {
                "name": name,
                "labels": {
                    NODE_LABEL: status.node,
                    SERVICE_NAME_LABEL: service.name,
                    SERVICE_NAMESPACE_LABEL: service.namespace,
                },
            },
            "spec": {},
        });
        let status_first = self
            .api
            .patch_status(name, &params, &Patch::Apply(&body))
            .await;
        let created = match status_first {
            Ok(_) => false,
            Err(kube::Error::Api(e)) if e.code == 404 => true,
            Err(e) => return Err(e),
        };
        self.api
            .patch(name, &params, &Patch::Apply(&object))
            .await?;
        if created {
            self.api
                .patch_status(name, &params, &Patch::Apply(&body))
                .await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
