//! The records task of the Kubernetes speaker: what the loop tells it ([`ToWrite`]) becomes
//! `ServiceL2Status` writes, `nodeAssigned` Events and Warning Events, in a task of its own so
//! that an unreachable API server never delays an announcement.
//!
//! [`Book`] is the task's state and its decisions, without I/O: which records this node holds
//! (to write again when another node overwrote them), which Events are still to go out and in
//! what order, and which records seen on the watch say otherwise than this node wrote for
//! longer than a write's own two requests would ([`RECORD_SETTLE`]). [`run`] is the thin loop
//! around it: it applies what it is told, flushes the writer, publishes a round of Events,
//! and feeds the records' watch into the book.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ObjectReference, Service};
use kube::Client;
use kube::Resource as _;
use kube::runtime::watcher;
use swimlb_config::crd::{InterfaceInfo, ServiceL2Status, ServiceL2StatusStatus};
use swimlb_config::service::ServiceKey;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::compact::{CompactService, CompactStore};
use super::events::{EventType, EventWriter, Note, Reason};
use super::metrics::{KubeMetrics, Resource};
use super::records::{NODE_LABEL, RecordWriter, SERVICE_NAME_LABEL, SERVICE_NAMESPACE_LABEL};
use crate::run::daemon::sleep_until;

/// How soon a failed record write is tried again.
pub const RECORD_RETRY: Duration = Duration::from_secs(1);
/// Events written between two looks at the records to write.
const EVENTS_PER_ROUND: usize = 32;
/// How long a record must say otherwise than this node wrote before it is written again.
const RECORD_SETTLE: Duration = Duration::from_secs(1);
/// How long after a failure the records' watch starts over.
const RECORDS_REWATCH: Duration = Duration::from_secs(1);

/// What the records task is told.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum ToWrite {
    /// The record this node should hold for a Service now (`None`: none), and whether its
    /// record is an orphan this node deletes.
    Record {
        service: ServiceKey,
        record: Option<ServiceL2StatusStatus>,
        orphaned: bool,
    },
    /// A Warning Event on an object.
    Warning {
        object: ObjectReference,
        reason: Reason,
        note: String,
    },
    /// The node drains: it answers until its successors announce, but their records are
    /// theirs; it no longer writes back a record another node took over.
    Draining,
    /// Delete the record of a Service not served that this node sweeps.
    Sweep(ServiceKey),
    /// Forget which records this node wrote: it was cut off, and the others may have written
    /// over them meanwhile.
    Forget,
    /// A link's carrier came back: start the records' watch over at once (see [`run`]).
    Relist,
}

/// What the records' watch saw, told back to the loop for the sweep.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum SeenRecord {
    /// The watch lists every record again: forget those seen.
    Relisted,
    /// A record of `service` naming `node` (`None`: deleted).
    Record {
        service: ServiceKey,
        node: Option<String>,
    },
}

/// The records task's state (see the module docs). Pure: the writer's bookkeeping is handed in.
#[derive(Debug)]
pub(super) struct Book {
    /// This node's name.
    node: String,
    /// The records this node holds, to write again when they are overwritten: by Service, the
    /// interfaces (the rest of the status is the node and the key).
    mine: HashMap<ServiceKey, Arc<[InterfaceInfo]>>,
    /// The few distinct interface lists, shared (10,000 full statuses were 3 MB).
    interface_lists: Vec<Arc<[InterfaceInfo]>>,
    /// Services this node started announcing, kept as keys until their `nodeAssigned` Event is
    /// written (10,000 at a cold start): the Event is made when it is written.
    assigned_to: Vec<ServiceKey>,
    /// Warning Events to write, before any `nodeAssigned`.
    warnings: Vec<(ObjectReference, Note)>,
    /// Records seen saying otherwise than this node wrote, with the latest status seen and when
    /// to look again.
    suspect: HashMap<ServiceKey, (Instant, Option<ServiceL2StatusStatus>)>,
    draining: bool,
}

impl Book {
    /// An empty book for `node`.
    pub(super) fn new(node: &str) -> Book {
        Book {
            node: node.to_string(),
            mine: HashMap::new(),
            interface_lists: Vec::new(),
            assigned_to: Vec::new(),
            warnings: Vec::new(),
            suspect: HashMap::new(),
            draining: false,
        }
    }

    /// Applies one thing the loop told.
    pub(super) fn told(&mut self, item: ToWrite, writer: &mut RecordWriter) {
        match item {
            ToWrite::Record {
                service,
                record,
                orphaned,
            } => {
                let taken = match &record {
                    Some(r) => {
                        // Another node's record, seen but not settled yet: the Service is this
                        // node's now, so what the API holds is not what it wrote (at worst a
                        // write of its own seen half done, written once more). Written at once,
                        // not a settle time later.
                        if let Some((_, seen)) = self.suspect.remove(&service) {
                            writer.observe(&service, seen.as_ref());
                        }
                        let interfaces = self.shared_list(&r.interfaces);
                        self.mine.insert(service.clone(), interfaces).is_none()
                    }
                    None => {
                        self.mine.remove(&service);
                        false
                    }
                };
                // Taken, and the record changes hands: an Event. A record taken back that the
                // API still holds from this node (held for a moment after a pause) is no news.
                if writer.set(&service, record, orphaned) && taken {
                    self.assigned_to.push(service);
                }
            }
            ToWrite::Warning {
                object,
                reason,
                note,
            } => self.warnings.push((
                object,
                Note {
                    type_: EventType::Warning,
                    reason,
                    action: "Validate",
                    note,
                },
            )),
            ToWrite::Draining => {
                self.draining = true;
                self.suspect.clear();
            }
            ToWrite::Sweep(service) => writer.sweep(&service),
            ToWrite::Forget => writer.forget(),
            // The watch is the task's, not the book's.
            ToWrite::Relist => {}
        }
    }

    /// `interfaces` as one of the shared lists (lists no record uses any more go first).
    fn shared_list(&mut self, interfaces: &[InterfaceInfo]) -> Arc<[InterfaceInfo]> {
        if let Some(list) = self.interface_lists.iter().find(|l| ***l == *interfaces) {
            return list.clone();
        }
        self.interface_lists.retain(|l| Arc::strong_count(l) > 1);
        let list: Arc<[InterfaceInfo]> = interfaces.to_vec().into();
        self.interface_lists.push(list.clone());
        list
    }

    /// The next round of Events, at most [`EVENTS_PER_ROUND`], warnings first, so that records
    /// keep being written while thousands of Events go out (a cold start, a node taking over
    /// many Services). `uid` gives a Service's uid, when the cache still has the Service.
    pub(super) fn event_round(
        &mut self,
        mut uid: impl FnMut(&ServiceKey) -> Option<String>,
    ) -> Vec<(ObjectReference, Note)> {
        let warnings = self.warnings.len().min(EVENTS_PER_ROUND);
        let mut round: Vec<(ObjectReference, Note)> = self.warnings.drain(..warnings).collect();
        let room = (EVENTS_PER_ROUND - round.len()).min(self.assigned_to.len());
        let assigned = assigned(&self.node);
        round.extend(
            self.assigned_to
                .drain(..room)
                .map(|service| (service_ref(&service, uid(&service)), assigned.clone())),
        );
        // A cold start queued 10,000 (half a megabyte): not kept once written.
        if self.assigned_to.is_empty() && self.assigned_to.capacity() > EVENTS_PER_ROUND {
            self.assigned_to = Vec::new();
        }
        if self.warnings.is_empty() && self.warnings.capacity() > EVENTS_PER_ROUND {
            self.warnings = Vec::new();
        }
        round
    }

    /// Whether Events are still waiting.
    pub(super) fn more_events(&self) -> bool {
        !self.warnings.is_empty() || !self.assigned_to.is_empty()
    }

    /// The watch saw `service`'s record holding `status` at `now`: suspect when it differs from
    /// what this node wrote (not while draining: the successors' records are theirs).
    pub(super) fn seen(
        &mut self,
        now: Instant,
        service: ServiceKey,
        status: Option<ServiceL2StatusStatus>,
        writer: &RecordWriter,
    ) {
        if let Some(entry) = self.suspect.get_mut(&service) {
            entry.1 = status;
        } else if !self.draining && writer.differs(&service, status.as_ref()) {
            self.suspect.insert(service, (now + RECORD_SETTLE, status));
        }
    }

    /// When a suspect record is due for a second look.
    pub(super) fn next_look(&self) -> Option<Instant> {
        self.suspect.values().map(|(at, _)| *at).min()
    }

    /// The second look at the suspects due at `now`: a record still saying otherwise is written
    /// again. Returns the Services written again.
    pub(super) fn look_again(
        &mut self,
        now: Instant,
        writer: &mut RecordWriter,
    ) -> Vec<ServiceKey> {
        let due: Vec<ServiceKey> = self
            .suspect
            .iter()
            .filter(|(_, (at, _))| *at <= now)
            .map(|(service, _)| service.clone())
            .collect();
        let mut rewritten = Vec::new();
        for service in due {
            let Some((_, status)) = self.suspect.remove(&service) else {
                continue;
            };
            if !writer.observe(&service, status.as_ref()) {
                continue;
            }
            // A record this node gave up, written by its new owner: forgotten, nothing to write.
            let Some(interfaces) = self.mine.get(&service) else {
                continue;
            };
            let status = ServiceL2StatusStatus {
                node: self.node.clone(),
                service_name: service.name.to_string(),
                service_namespace: service.namespace.to_string(),
                interfaces: interfaces.to_vec(),
            };
            writer.set(&service, Some(status), false);
            rewritten.push(service);
        }
        rewritten
    }
}

/// A watch event on the records: what to tell the loop, and the record seen (its Service and
/// status; `None` status: deleted).
pub(super) fn seen_on_watch(
    event: &watcher::Event<ServiceL2Status>,
) -> (
    Option<SeenRecord>,
    Option<(ServiceKey, Option<ServiceL2StatusStatus>)>,
) {
    match event {
        watcher::Event::Apply(r) | watcher::Event::InitApply(r) => match record_service(r) {
            Some(service) => (
                Some(SeenRecord::Record {
                    service: service.clone(),
                    node: Some(record_node(r).to_string()),
                }),
                Some((service, r.status.clone())),
            ),
            None => (None, None),
        },
        watcher::Event::Delete(r) => match record_service(r) {
            Some(service) => (
                Some(SeenRecord::Record {
                    service: service.clone(),
                    node: None,
                }),
                Some((service, None)),
            ),
            None => (None, None),
        },
        watcher::Event::Init => (Some(SeenRecord::Relisted), None),
        watcher::Event::InitDone => (None, None),
    }
}

/// The records task (see the module docs). Counts every failed write.
pub(super) async fn run(
    client: Client,
    namespace: String,
    node: String,
    services: CompactStore<CompactService>,
    mut told: mpsc::UnboundedReceiver<ToWrite>,
    seen_back: mpsc::UnboundedSender<SeenRecord>,
    metrics: KubeMetrics,
) {
    let mut writer = RecordWriter::new(client.clone(), &namespace);
    let mut book = Book::new(&node);
    let mut recorder = EventWriter::new(client.clone(), "swimlb-speaker", &node);
    // The records as the API server holds them: one this node wrote and somebody else
    // overwrote (the other side of a healed partition) or deleted is written again. After an
    // error the watch starts over (a fresh list) a second later: kube's default backoff grows
    // to 30 s while a node is cut off, and the node that comes back must see at once what the
    // other side wrote meanwhile.
    let records_api = kube::Api::<ServiceL2Status>::namespaced(client, &namespace);
    let watch_records = || watcher(records_api.clone(), super::watch::watch_config()).boxed();
    let mut seen_records = Some(watch_records());
    let mut rewatch_at: Option<Instant> = None;
    let mut next = None;
    loop {
        // Everything told so far, at once.
        while let Some(item) = next.take().or_else(|| told.try_recv().ok()) {
            if matches!(item, ToWrite::Relist) {
                // The watch's connection outlived the carrier: the server sends what it missed
                // on its retransmit timer, backed off for as long as the link was down, and
                // only then would this node see that another wrote over its records meanwhile
                // (and look again [`RECORD_SETTLE`] later). A fresh list, on a fresh connection.
                seen_records = Some(watch_records());
                rewatch_at = None;
            }
            book.told(item, &mut writer);
        }
        for e in writer.flush().await {
            metrics.write_error(Resource::ServiceL2Statuses);
            tracing::warn!(error = %e, "ServiceL2Status write failed; retrying");
        }
        metrics.records_swept(writer.take_swept());
        // The uids as the cache holds them now (a Service deleted meanwhile: none, and the
        // Event goes out without it).
        let round = {
            let services = services.lock();
            book.event_round(|key| services.get(key).and_then(CompactService::uid))
        };
        for (object, event) in round {
            if let Err(e) = recorder.publish(&object, &event).await {
                metrics.write_error(Resource::Events);
                tracing::warn!(
                    object = object.name.as_deref().unwrap_or_default(),
                    reason = event.reason.as_str(),
                    error = %e,
                    "cannot publish an event"
                );
            }
        }
        let more = book.more_events();
        let retry = writer.is_pending() && !more;
        let look_at = book.next_look();
        tokio::select! {
            biased;
            item = told.recv() => match item {
                Some(item) => next = Some(item),
                None => return,
            },
            () = std::future::ready(()), if more => {}
            _ = tokio::time::sleep(RECORD_RETRY), if retry => {}
            () = sleep_until(look_at), if look_at.is_some() => {
                for service in book.look_again(Instant::now(), &mut writer) {
                    tracing::info!(%service, "the ServiceL2Status of a Service this node announces names another node; writing it again");
                }
            }
            () = sleep_until(rewatch_at), if rewatch_at.is_some() => {
                seen_records = Some(watch_records());
                rewatch_at = None;
            }
            event = async { seen_records.as_mut().expect("guarded").next().await }, if seen_records.is_some() => {
                match event {
                    Some(Ok(event)) => {
                        let (back, seen) = seen_on_watch(&event);
                        if let Some(back) = back {
                            let _ = seen_back.send(back);
                        }
                        if let Some((service, status)) = seen {
                            book.seen(Instant::now(), service, status, &writer);
                        }
                    }
                    Some(Err(e)) => {
                        metrics.watch_error(Resource::ServiceL2Statuses);
                        tracing::debug!(error = %e, "ServiceL2Status watch failed; retrying");
                        seen_records = None;
                        rewatch_at = Some(Instant::now() + RECORDS_REWATCH);
                    }
                    None => {
                        seen_records = None;
                        rewatch_at = Some(Instant::now() + RECORDS_REWATCH);
                    }
                }
            }
        }
    }
}

/// The Service a record is about, from its labels.
fn record_service(record: &ServiceL2Status) -> Option<ServiceKey> {
    let labels = record.metadata.labels.as_ref()?;
    Some(ServiceKey::new(
        labels.get(SERVICE_NAMESPACE_LABEL)?,
        labels.get(SERVICE_NAME_LABEL)?,
    ))
}

/// The node a record names: its status's, else its label's (empty: none).
fn record_node(record: &ServiceL2Status) -> &str {
    match &record.status {
        Some(status) if !status.node.is_empty() => &status.node,
        _ => record
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(NODE_LABEL))
            .map_or("", String::as_str),
    }
}

/// The Event `nodeAssigned` of `node` (MetalLB's words).
fn assigned(node: &str) -> Note {
    Note {
        type_: EventType::Normal,
        reason: Reason::NodeAssigned,
        action: "Announce",
        note: format!("announcing from node {node:?} with protocol \"layer2\""),
    }
}

/// An object reference to the Service `key` whose uid is `uid`: `kubectl describe service`
/// selects the Events by the uid too, and lists none without it.
pub(super) fn service_ref(key: &ServiceKey, uid: Option<String>) -> ObjectReference {
    let mut service = Service::default();
    service.metadata.name = Some(key.name.to_string());
    service.metadata.namespace = Some(key.namespace.to_string());
    service.metadata.uid = uid;
    service.object_ref(&())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client pointing nowhere.
    fn client() -> Client {
        let config = kube::Config::new("http://127.0.0.1:9".parse().expect("url"));
        Client::try_from(config).expect("client")
    }

    /// A writer whose client points nowhere: the book only uses its bookkeeping.
    fn writer() -> RecordWriter {
        RecordWriter::new(client(), "swimlb-system")
    }

    /// A cache without the Services.
    fn no_uid(_: &ServiceKey) -> Option<String> {
        None
    }

    fn key(name: &str) -> ServiceKey {
        ServiceKey::new("default", name)
    }

    fn status(node: &str, service: &ServiceKey, interface: &str) -> ServiceL2StatusStatus {
        super::super::records::record_status(node, service, &[interface.to_string()])
    }

    fn record(service: &ServiceKey, node: &str, interface: &str) -> ToWrite {
        ToWrite::Record {
            service: service.clone(),
            record: Some(status(node, service, interface)),
            orphaned: false,
        }
    }

    /// The Service is another node's now (not an orphan).
    fn given_up(service: &ServiceKey) -> ToWrite {
        ToWrite::Record {
            service: service.clone(),
            record: None,
            orphaned: false,
        }
    }

    #[tokio::test]
    async fn one_node_assigned_event_per_service_taken_and_the_interface_lists_are_shared() {
        let (mut book, mut writer) = (Book::new("node1"), writer());
        for name in ["a", "b"] {
            book.told(record(&key(name), "node1", "eth0"), &mut writer);
        }
        // Told again (another link): still held, no second Event.
        book.told(record(&key("a"), "node1", "eth1"), &mut writer);
        assert_eq!(book.interface_lists.len(), 2);
        book.told(record(&key("b"), "node1", "eth1"), &mut writer);
        assert!(Arc::ptr_eq(&book.mine[&key("a")], &book.mine[&key("b")]));
        // The eth0 list is no record's any more: dropped when a new list comes.
        book.told(record(&key("c"), "node1", "eth2"), &mut writer);
        assert_eq!(book.interface_lists.len(), 2);
        let round = book.event_round(no_uid);
        let names: Vec<_> = round.iter().filter_map(|(o, _)| o.name.clone()).collect();
        assert_eq!(names, ["a", "b", "c"]);
        assert!(round.iter().all(|(_, n)| n.reason == Reason::NodeAssigned));
        assert!(!book.more_events());
        // Given up, then taken again before the record was written: a new Event.
        book.told(given_up(&key("a")), &mut writer);
        book.told(record(&key("a"), "node1", "eth1"), &mut writer);
        assert_eq!(book.event_round(no_uid).len(), 1);
    }

    #[tokio::test]
    async fn a_node_assigned_event_names_the_services_uid_as_the_cache_holds_it() {
        use super::super::compact::{Compact as _, Interner};
        use super::super::views::{ServiceView, trim_service};
        // The Service as the API server sends it, trimmed and compacted as the cache keeps it.
        let uid = "6f1d0c9a-2b3e-4f50-8a7b-9c0d1e2f3a4b";
        let mut view: ServiceView = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "default", "uid": uid,
                "resourceVersion": "7", "managedFields": [{"manager": "kubectl"}]},
            "spec": {"type": "LoadBalancer"}
        }))
        .expect("a Service");
        trim_service(&mut view);
        let cached: HashMap<ServiceKey, CompactService> = [(
            key("web"),
            CompactService::compact(view, &mut Interner::default()),
        )]
        .into();
        let (mut book, mut writer) = (Book::new("node1"), writer());
        // "gone" was deleted before its Event went out: the Event still goes, without a uid.
        for name in ["web", "gone"] {
            book.told(record(&key(name), "node1", "eth0"), &mut writer);
        }
        let round = book.event_round(|k| cached.get(k).and_then(CompactService::uid));
        let refs: Vec<_> = round
            .iter()
            .map(|(o, _)| (o.name.as_deref(), o.uid.as_deref()))
            .collect();
        assert_eq!(refs, [(Some("web"), Some(uid)), (Some("gone"), None)]);
        let (object, note) = &round[0];
        assert_eq!(object.kind.as_deref(), Some("Service"));
        let event = EventWriter::new(client(), "swimlb-speaker", "node1").event(
            object,
            note,
            k8s_openapi::jiff::Timestamp::now(),
        );
        let regarding = event.regarding.expect("regarding");
        assert_eq!(regarding.uid.as_deref(), Some(uid));
        assert_eq!(regarding.namespace.as_deref(), Some("default"));
    }

    #[tokio::test]
    async fn events_go_out_in_rounds_with_the_warnings_first() {
        let (mut book, mut writer) = (Book::new("node1"), writer());
        for i in 0..40 {
            book.told(record(&key(&format!("s{i}")), "node1", "eth0"), &mut writer);
        }
        book.told(
            ToWrite::Warning {
                object: service_ref(&key("bad"), None),
                reason: Reason::InvalidConfiguration,
                note: "no".into(),
            },
            &mut writer,
        );
        let first = book.event_round(no_uid);
        assert_eq!(first.len(), EVENTS_PER_ROUND);
        assert_eq!(first[0].1.reason, Reason::InvalidConfiguration);
        assert_eq!(first[0].1.type_, EventType::Warning);
        assert!(book.more_events());
        let second = book.event_round(no_uid);
        assert_eq!(second.len(), 41 - EVENTS_PER_ROUND);
        assert!(!book.more_events());
        assert!(book.event_round(no_uid).is_empty());
    }

    #[tokio::test]
    async fn a_record_overwritten_for_longer_than_a_write_is_written_again_but_not_while_draining()
    {
        let (mut book, mut writer) = (Book::new("node1"), writer());
        let (a, b) = (key("a"), key("b"));
        for service in [&a, &b] {
            book.told(record(service, "node1", "eth0"), &mut writer);
            writer.assume_written(service, &status("node1", service, "eth0"));
        }
        assert!(!writer.is_pending());
        let t0 = Instant::now();
        // What this node wrote, seen back: nothing to look at.
        book.seen(t0, a.clone(), Some(status("node1", &a, "eth0")), &writer);
        assert_eq!(book.next_look(), None);
        // Another node's, then (within the settle time) this node's again: a write's own two
        // requests look like this; nothing is written.
        book.seen(t0, a.clone(), Some(status("node2", &a, "eth0")), &writer);
        assert_eq!(book.next_look(), Some(t0 + RECORD_SETTLE));
        book.seen(t0, a.clone(), Some(status("node1", &a, "eth0")), &writer);
        assert!(book.look_again(t0, &mut writer).is_empty(), "not due yet");
        assert!(book.look_again(t0 + RECORD_SETTLE, &mut writer).is_empty());
        assert!(!writer.is_pending());
        // Deleted and left so: written again, with this node's interfaces.
        book.seen(t0, a.clone(), None, &writer);
        let rewritten = book.look_again(t0 + RECORD_SETTLE, &mut writer);
        assert_eq!(rewritten, std::slice::from_ref(&a));
        assert!(writer.is_pending());
        // Draining: the successors' records are theirs.
        book.told(ToWrite::Draining, &mut writer);
        book.seen(t0, b.clone(), Some(status("node2", &b, "eth0")), &writer);
        assert_eq!(book.next_look(), None);
    }

    #[tokio::test]
    async fn a_record_given_up_and_taken_back_before_anybody_wrote_over_it_is_not_written_again() {
        let (mut book, mut writer) = (Book::new("node1"), writer());
        let (a, b) = (key("a"), key("b"));
        for service in [&a, &b] {
            book.told(record(service, "node1", "eth0"), &mut writer);
            writer.assume_written(service, &status("node1", service, "eth0"));
        }
        assert_eq!(book.event_round(no_uid).len(), 2, "taken: one Event each");
        // Held for a moment after a pause: this node answers nothing, nobody takes over, the
        // API still holds its records.
        book.told(given_up(&a), &mut writer);
        book.told(given_up(&b), &mut writer);
        assert!(
            !writer.is_pending(),
            "a given-up record is its new owner's to write"
        );
        book.told(record(&a, "node1", "eth0"), &mut writer);
        assert!(
            !writer.is_pending(),
            "the API holds it still: nothing to write"
        );
        assert!(
            book.event_round(no_uid).is_empty(),
            "and no Event: nothing moved"
        );
        // b's new owner wrote its record: the watch shows it, and this node forgets it wrote b
        // without writing anything; taking b back now writes it.
        let t0 = Instant::now();
        book.seen(t0, b.clone(), Some(status("node2", &b, "eth0")), &writer);
        assert!(book.look_again(t0 + RECORD_SETTLE, &mut writer).is_empty());
        assert!(!writer.is_pending());
        book.told(record(&b, "node1", "eth0"), &mut writer);
        assert!(writer.is_pending(), "b is written again");
        assert_eq!(
            book.event_round(no_uid).len(),
            1,
            "b changed hands: an Event"
        );
    }

    #[tokio::test]
    async fn a_record_taken_back_while_another_nodes_write_of_it_settles_is_written_at_once() {
        let (mut book, mut writer) = (Book::new("node1"), writer());
        let a = key("a");
        book.told(record(&a, "node1", "eth0"), &mut writer);
        writer.assume_written(&a, &status("node1", &a, "eth0"));
        book.event_round(no_uid);
        book.told(given_up(&a), &mut writer);
        // Its new owner wrote it; the watch showed it a moment ago (not settled yet), and the
        // Service comes back to this node (the API moved it back).
        let t0 = Instant::now();
        book.seen(t0, a.clone(), Some(status("node2", &a, "eth0")), &writer);
        book.told(record(&a, "node1", "eth0"), &mut writer);
        assert!(writer.is_pending(), "written at once");
        assert_eq!(book.next_look(), None, "nothing left to look at");
        assert_eq!(
            book.event_round(no_uid).len(),
            1,
            "it changed hands: an Event"
        );
    }

    #[test]
    fn the_watch_tells_back_the_records_seen_and_a_relist() {
        let mut r = ServiceL2Status::new("l2-x", Default::default());
        r.metadata.labels = Some(
            [
                (SERVICE_NAMESPACE_LABEL.to_string(), "default".to_string()),
                (SERVICE_NAME_LABEL.to_string(), "web".to_string()),
                (NODE_LABEL.to_string(), "node2".to_string()),
            ]
            .into(),
        );
        let (back, seen) = seen_on_watch(&watcher::Event::Apply(r.clone()));
        assert_eq!(
            back,
            Some(SeenRecord::Record {
                service: key("web"),
                node: Some("node2".into())
            })
        );
        assert_eq!(seen, Some((key("web"), None)));
        let (back, _) = seen_on_watch(&watcher::Event::Delete(r.clone()));
        assert_eq!(
            back,
            Some(SeenRecord::Record {
                service: key("web"),
                node: None
            })
        );
        assert_eq!(
            seen_on_watch(&watcher::Event::Init).0,
            Some(SeenRecord::Relisted)
        );
        // A record without the labels is nobody's.
        r.metadata.labels = None;
        assert_eq!(seen_on_watch(&watcher::Event::Apply(r)), (None, None));
    }
}
