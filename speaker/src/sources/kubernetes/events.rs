//! The Events the speaker writes: `nodeAssigned` on a Service it starts announcing, and
//! warnings about bad input.
//!
//! [`EventWriter`] creates `events.k8s.io/v1` Events as kube's `Recorder` does (same fields,
//! same names: the object's name and the time in hexadecimal nanoseconds), but keeps nothing:
//! kube's `Recorder` caches every Event it published for six minutes to count repeats, and
//! scans that cache on every publish, which at 10,000 Services is tens of megabytes and a
//! quadratic start. The speaker's Events do not repeat (one per owner change, one per problem),
//! so there is nothing to count.

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, PostParams};
pub use swimlb_config::events::Reason;

/// `Normal` or `Warning`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// Something worth knowing.
    Normal,
    /// Something wrong.
    Warning,
}

impl EventType {
    fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// One Event to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    /// Its type.
    pub type_: EventType,
    /// The reason.
    pub reason: Reason,
    /// The action (`Announce`, `Validate`).
    pub action: &'static str,
    /// The text.
    pub note: String,
}

/// Writes Events as one reporter (the speaker of one node).
#[derive(Clone)]
pub struct EventWriter {
    client: Client,
    controller: String,
    instance: String,
    /// Told apart from another Event on the same object in the same nanosecond.
    sequence: u64,
}

impl std::fmt::Debug for EventWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventWriter")
            .field("controller", &self.controller)
            .field("instance", &self.instance)
            .finish_non_exhaustive()
    }
}

impl EventWriter {
    /// A writer reporting as `controller` on `instance`.
    pub fn new(client: Client, controller: &str, instance: &str) -> EventWriter {
        EventWriter {
            client,
            controller: controller.to_string(),
            instance: instance.to_string(),
            sequence: 0,
        }
    }

    /// The Event `note` about `object`, at `now` (pure).
    pub fn event(&mut self, object: &ObjectReference, note: &Note, now: Timestamp) -> Event {
        self.sequence = self.sequence.wrapping_add(1);
        let name = object.name.as_deref().unwrap_or(&self.controller);
        let nanos = now
            .as_nanosecond()
            .unsigned_abs()
            .wrapping_add(u128::from(self.sequence));
        Event {
            action: Some(note.action.to_string()),
            event_time: Some(MicroTime(now)),
            metadata: ObjectMeta {
                namespace: object.namespace.clone(),
                name: Some(format!("{name}.{nanos:x}")),
                ..ObjectMeta::default()
            },
            note: Some(note.note.clone()),
            reason: Some(note.reason.as_str().to_string()),
            regarding: Some(object.clone()),
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            type_: Some(note.type_.as_str().to_string()),
            ..Event::default()
        }
    }

    /// Creates the Event `note` about `object` (in the object's namespace, `default` for a
    /// cluster-scoped object).
    pub async fn publish(&mut self, object: &ObjectReference, note: &Note) -> kube::Result<()> {
        let event = self.event(object, note, Timestamp::now());
        let namespace = object.namespace.as_deref().unwrap_or("default");
        let api: Api<Event> = Api::namespaced(self.client.clone(), namespace);
        api.create(&PostParams::default(), &event).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn events_have_kubes_fields_and_distinct_names() {
        let api = swimlb_control_plane::test_plane::TestPlane::start_async("events").await;
        let mut writer = EventWriter::new(api.client().await, "swimlb-speaker", "n1");
        let object = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Service".into()),
            namespace: Some("default".into()),
            name: Some("web".into()),
            ..ObjectReference::default()
        };
        let note = Note {
            type_: EventType::Warning,
            reason: Reason::InvalidConfiguration,
            action: "Validate",
            note: "bad".into(),
        };
        let now = Timestamp::now();
        let a = writer.event(&object, &note, now);
        let b = writer.event(&object, &note, now);
        assert_ne!(
            a.metadata.name, b.metadata.name,
            "same object, same instant"
        );
        assert_eq!(a.reporting_instance.as_deref(), Some("n1"));
        assert_eq!(a.type_.as_deref(), Some("Warning"));
        writer.publish(&object, &note).await.unwrap();
        writer.publish(&object, &note).await.unwrap();
        let stored: Vec<_> = api
            .admin()
            .list("events.k8s.io/v1", "Event", Some("default"))
            .unwrap()
            .into_iter()
            .filter(|e| e["reportingController"] == "swimlb-speaker")
            .collect();
        assert_eq!(stored.len(), 2, "{stored:?}");
        assert_eq!(stored[0]["reason"], "InvalidConfiguration");
        assert_eq!(stored[0]["regarding"]["name"], "web");
    }
}
