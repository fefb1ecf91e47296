//! The gossip module's metrics, registered into a registry the caller hands in.
//!
//! Every label is a closed enum ([`MemberState`], [`Direction`], [`RejectReason`]), so the
//! series count is bounded whatever peers send.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

macro_rules! label_value {
    ($ty:ty) => {
        impl EncodeLabelValue for $ty {
            fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
                EncodeLabelValue::encode(&self.as_str(), encoder)
            }
        }
    };
}

/// A member's state as foca sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemberState {
    /// Alive.
    Alive,
    /// Suspected, still counted alive by swimlb.
    Suspect,
    /// Declared down.
    Down,
}

impl MemberState {
    /// The label value.
    pub const fn as_str(&self) -> &'static str {
        match self {
            MemberState::Alive => "alive",
            MemberState::Suspect => "suspect",
            MemberState::Down => "down",
        }
    }
}
label_value!(MemberState);

/// Traffic direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Received.
    In,
    /// Sent.
    Out,
}

impl Direction {
    /// The label value.
    pub const fn as_str(&self) -> &'static str {
        match self {
            Direction::In => "in",
            Direction::Out => "out",
        }
    }
}
label_value!(Direction);

/// Why a received datagram was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RejectReason {
    /// The envelope did not open: the `as_str()` of the [`swimlb_proto::Error`] (truncated,
    /// wrong_magic, unsupported_version, unknown_key, authentication_failed, too_large). Kept as
    /// the label string so errors carrying data (a key id) still map to one series.
    Envelope(&'static str),
    /// Sent from our own address or identity.
    FromSelf,
    /// The payload inside a valid envelope did not decode.
    Decode,
    /// The payload decoded but was not acceptable to foca (malformed, too big, stray).
    Protocol,
    /// A metadata record in the payload was undecodable or too large.
    Metadata,
    /// An authentic datagram seen before, too old to tell, or sent before its sender restarted
    /// (see [`super::replay`]).
    Replay,
}

impl RejectReason {
    /// The reason for an envelope that did not open.
    pub const fn envelope(err: &swimlb_proto::Error) -> RejectReason {
        RejectReason::Envelope(err.as_str())
    }

    /// The label value.
    pub const fn as_str(&self) -> &'static str {
        match self {
            RejectReason::Envelope(label) => label,
            RejectReason::FromSelf => "from_self",
            RejectReason::Decode => "decode",
            RejectReason::Protocol => "protocol",
            RejectReason::Metadata => "metadata",
            RejectReason::Replay => "replay",
        }
    }
}
label_value!(RejectReason);

/// How a suspicion this node timed ended (see [`super::lifeguard`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SuspicionOutcome {
    /// The suspect showed it is alive (a higher incarnation, or a newer identity).
    Refuted,
    /// The suspect was declared down after at least one independent confirmation, here or by
    /// another member.
    Confirmed,
    /// This node's own timeout ran out with no confirmation and it declared the suspect down.
    Expired,
}

impl SuspicionOutcome {
    /// The label value.
    pub const fn as_str(&self) -> &'static str {
        match self {
            SuspicionOutcome::Refuted => "refuted",
            SuspicionOutcome::Confirmed => "confirmed",
            SuspicionOutcome::Expired => "expired",
        }
    }
}
label_value!(SuspicionOutcome);

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: SuspicionOutcome,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct StateLabels {
    state: MemberState,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct DirectionLabels {
    direction: Direction,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReasonLabels {
    reason: RejectReason,
}

/// The gossip metrics. Cloning shares the same series.
#[derive(Debug, Clone)]
pub struct GossipMetrics {
    members: Family<StateLabels, Gauge>,
    member_down: Counter,
    detect_seconds: Histogram,
    packets: Family<DirectionLabels, Counter>,
    bytes: Family<DirectionLabels, Counter>,
    rejected: Family<ReasonLabels, Counter>,
    sync_updates: Counter,
    health: Gauge,
    suspicions: Family<OutcomeLabels, Counter>,
    envelope_version: Gauge,
    /// The four traffic series, resolved once: they are counted on every datagram, and a
    /// family lookup (hash and lock) per datagram was a measurable share of the simulation.
    traffic: [(Counter, Counter); 2],
}

impl Default for GossipMetrics {
    fn default() -> GossipMetrics {
        let packets = Family::<DirectionLabels, Counter>::default();
        let bytes = Family::<DirectionLabels, Counter>::default();
        let series = |direction| {
            let labels = DirectionLabels { direction };
            (
                packets.get_or_create(&labels).clone(),
                bytes.get_or_create(&labels).clone(),
            )
        };
        let traffic = [series(Direction::In), series(Direction::Out)];
        GossipMetrics {
            members: Family::default(),
            member_down: Counter::default(),
            // 10 ms .. ~82 s
            detect_seconds: Histogram::new(exponential_buckets(0.01, 2.0, 14)),
            packets,
            bytes,
            rejected: Family::default(),
            sync_updates: Counter::default(),
            health: Gauge::default(),
            suspicions: Family::default(),
            envelope_version: Gauge::default(),
            traffic,
        }
    }
}

impl GossipMetrics {
    /// Metrics registered into `registry` (names get the registry's prefix, if any, after
    /// `swimlb_`).
    pub fn register(registry: &mut Registry) -> GossipMetrics {
        let metrics = GossipMetrics::default();
        registry.register(
            "swimlb_members",
            "Gossip members by state",
            metrics.members.clone(),
        );
        registry.register(
            "swimlb_member_down",
            "Members declared down",
            metrics.member_down.clone(),
        );
        registry.register(
            "swimlb_failover_detect_seconds",
            "From the later of the member's first suspicion seen here and the last datagram heard from it, to its MemberDown",
            metrics.detect_seconds.clone(),
        );
        registry.register(
            "swimlb_gossip_packets",
            "Gossip datagrams",
            metrics.packets.clone(),
        );
        registry.register(
            "swimlb_gossip_bytes",
            "Gossip bytes (sealed datagrams)",
            metrics.bytes.clone(),
        );
        registry.register(
            "swimlb_gossip_rejected",
            "Received gossip datagrams dropped, by reason",
            metrics.rejected.clone(),
        );
        registry.register(
            "swimlb_gossip_sync_updates",
            "Member updates sent to peers whose membership digest differed from ours (members the gossip had not brought them)",
            metrics.sync_updates.clone(),
        );
        registry.register(
            "swimlb_gossip_local_health",
            "Lifeguard local health score: 0 is healthy; probe and suspicion timeouts are stretched by score + 1",
            metrics.health.clone(),
        );
        registry.register(
            "swimlb_gossip_suspicions",
            "Suspicions this node timed, by how they ended (refuted, confirmed, expired)",
            metrics.suspicions.clone(),
        );
        registry.register(
            "swimlb_gossip_envelope_version",
            "The envelope version this node seals to the mesh's members: the highest every live member announced (2 while a member of the previous release is alive)",
            metrics.envelope_version.clone(),
        );
        metrics.envelope_version.set(2);
        // Every outcome has its series from the start, at 0 (a rate over a series that appears
        // at its first increment misses that increment).
        for outcome in [
            SuspicionOutcome::Refuted,
            SuspicionOutcome::Confirmed,
            SuspicionOutcome::Expired,
        ] {
            drop(metrics.suspicions.get_or_create(&OutcomeLabels { outcome }));
        }
        metrics
    }

    pub(crate) fn set_envelope_version(&self, version: u8) {
        self.envelope_version.set(i64::from(version));
    }

    /// The mesh's envelope version last set (see [`super::wire_rule`]).
    pub fn envelope_version(&self) -> i64 {
        self.envelope_version.get()
    }

    pub(crate) fn set_health(&self, score: u32) {
        self.health.set(i64::from(score));
    }

    /// The local health score last set.
    pub fn health_score(&self) -> i64 {
        self.health.get()
    }

    pub(crate) fn suspicion(&self, outcome: SuspicionOutcome) {
        self.suspicions
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
    }

    /// Suspicions that ended with `outcome` (for tests and the lab).
    pub fn suspicions_ended(&self, outcome: SuspicionOutcome) -> u64 {
        self.suspicions
            .get_or_create(&OutcomeLabels { outcome })
            .get()
    }

    pub(crate) fn set_members(&self, alive: usize, suspect: usize, down: usize) {
        for (state, n) in [
            (MemberState::Alive, alive),
            (MemberState::Suspect, suspect),
            (MemberState::Down, down),
        ] {
            self.members
                .get_or_create(&StateLabels { state })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    pub(crate) fn member_down(&self, detect_seconds: Option<f64>) {
        self.member_down.inc();
        if let Some(seconds) = detect_seconds {
            self.detect_seconds.observe(seconds);
        }
    }

    pub(crate) fn packet(&self, direction: Direction, len: usize) {
        let (packets, bytes) = self.series(direction);
        packets.inc();
        bytes.inc_by(len as u64);
    }

    fn series(&self, direction: Direction) -> &(Counter, Counter) {
        match direction {
            Direction::In => &self.traffic[0],
            Direction::Out => &self.traffic[1],
        }
    }

    pub(crate) fn sync_updates(&self, sent: usize) {
        self.sync_updates.inc_by(sent as u64);
    }

    /// Member updates sent in answer to differing membership digests.
    pub fn sync_updates_sent(&self) -> u64 {
        self.sync_updates.get()
    }

    pub(crate) fn rejected(&self, reason: RejectReason) {
        self.rejected.get_or_create(&ReasonLabels { reason }).inc();
    }

    /// How many datagrams were dropped for `reason` (for tests and the lab).
    pub fn rejected_count(&self, reason: RejectReason) -> u64 {
        self.rejected.get_or_create(&ReasonLabels { reason }).get()
    }

    /// Total datagrams and bytes in `direction`.
    pub fn traffic(&self, direction: Direction) -> (u64, u64) {
        let (packets, bytes) = self.series(direction);
        (packets.get(), bytes.get())
    }

    /// Members declared down so far.
    pub fn member_downs(&self) -> u64 {
        self.member_down.get()
    }
}
