//! The owner watch's metrics, registered into a registry the caller hands in. Every label value
//! comes from a closed enum ([`MessageType`], [`DropReason`], [`CheckResult`],
//! [`TakeoverResult`]), so the series count is bounded whatever peers send.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use swimlb_proto::heartbeat::MessageType;

/// Why a received watch datagram was dropped (`swimlb_owner_watch_dropped_total{reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DropReason {
    /// The envelope did not open with the key ring (garbage, another key, truncated).
    Unauthentic,
    /// Its sender id is no member's watch address, or it names a member the gossip does not hold.
    UnknownSender,
    /// The replay guard refused its sequence.
    Replay,
    /// Its payload did not parse, or a claim whose claimant is not its sender.
    Malformed,
    /// An old incarnation or sequence number, or a reply to a poll no longer waited for.
    Stale,
    /// A version-3 envelope sealed for another receiver (captured on its way elsewhere).
    WrongReceiver,
}

impl DropReason {
    /// Every reason, for registering the series at 0.
    pub const ALL: [DropReason; 6] = [
        DropReason::Unauthentic,
        DropReason::UnknownSender,
        DropReason::Replay,
        DropReason::Malformed,
        DropReason::Stale,
        DropReason::WrongReceiver,
    ];

    /// The label value.
    pub const fn as_str(self) -> &'static str {
        match self {
            DropReason::Unauthentic => "unauthentic",
            DropReason::UnknownSender => "unknown_sender",
            DropReason::Replay => "replay",
            DropReason::Malformed => "malformed",
            DropReason::Stale => "stale",
            DropReason::WrongReceiver => "wrong_receiver",
        }
    }
}

/// How a second check, or the check of a member ahead in line, ended
/// (`swimlb_owner_watch_checks_total{result}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CheckResult {
    /// A poll was answered `alive`: the owner's window restarts.
    Vouched,
    /// No answer by the silence deadline.
    Silent,
}

impl CheckResult {
    /// Every result, for registering the series at 0.
    pub const ALL: [CheckResult; 2] = [CheckResult::Vouched, CheckResult::Silent];

    /// The label value.
    pub const fn as_str(self) -> &'static str {
        match self {
            CheckResult::Vouched => "vouched",
            CheckResult::Silent => "silent",
        }
    }
}

/// How a takeover on this node's own watch ended (`swimlb_owner_watch_takeovers_total{result}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TakeoverResult {
    /// The gossip declared the owner down, or it came back renewed.
    Confirmed,
    /// The owner was alive in the accused incarnation (heard, or still held when the accusation
    /// lapsed): a false takeover.
    Refuted,
}

impl TakeoverResult {
    /// Every result, for registering the series at 0.
    pub const ALL: [TakeoverResult; 2] = [TakeoverResult::Confirmed, TakeoverResult::Refuted];

    /// The label value.
    pub const fn as_str(self) -> &'static str {
        match self {
            TakeoverResult::Confirmed => "confirmed",
            TakeoverResult::Refuted => "refuted",
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TypeLabel {
    r#type: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
}

/// The watch's metrics (cloning shares the series).
#[derive(Debug, Clone)]
pub struct WatchMetrics {
    sent: Family<TypeLabel, Counter>,
    received: Family<TypeLabel, Counter>,
    dropped: Family<ReasonLabel, Counter>,
    lateness: Histogram,
    checks: Family<ResultLabel, Counter>,
    takeovers: Family<ResultLabel, Counter>,
    watchers: Gauge,
    watched: Gauge,
}

impl Default for WatchMetrics {
    fn default() -> WatchMetrics {
        WatchMetrics {
            sent: Family::default(),
            received: Family::default(),
            dropped: Family::default(),
            // 50 us to about 0.8 s.
            lateness: Histogram::new(exponential_buckets(0.000_05, 2.0, 15)),
            checks: Family::default(),
            takeovers: Family::default(),
            watchers: Gauge::default(),
            watched: Gauge::default(),
        }
    }
}

const MESSAGE_TYPES: [MessageType; 7] = [
    MessageType::Heartbeat,
    MessageType::Ack,
    MessageType::Poll,
    MessageType::PollReply,
    MessageType::Relay,
    MessageType::Claim,
    MessageType::Move,
];

impl WatchMetrics {
    /// Registers the series in `registry`, every label value at 0 (a family without series
    /// would not be exposed at all).
    pub fn register(registry: &mut Registry) -> WatchMetrics {
        let m = WatchMetrics::default();
        for r#type in MESSAGE_TYPES {
            let _ = m.sent.get_or_create(&type_label(r#type));
            let _ = m.received.get_or_create(&type_label(r#type));
        }
        for reason in DropReason::ALL {
            let _ = m.dropped.get_or_create(&ReasonLabel {
                reason: reason.as_str(),
            });
        }
        for result in CheckResult::ALL {
            let _ = m.checks.get_or_create(&ResultLabel {
                result: result.as_str(),
            });
        }
        for result in TakeoverResult::ALL {
            let _ = m.takeovers.get_or_create(&ResultLabel {
                result: result.as_str(),
            });
        }
        registry.register(
            "swimlb_owner_watch_sent",
            "Owner watch datagrams sent, by type",
            m.sent.clone(),
        );
        registry.register(
            "swimlb_owner_watch_received",
            "Owner watch datagrams received and admitted, by type",
            m.received.clone(),
        );
        registry.register(
            "swimlb_owner_watch_dropped",
            "Owner watch datagrams dropped, by reason (malformed, unauthentic, unknown_sender, replay, stale)",
            m.dropped.clone(),
        );
        registry.register(
            "swimlb_owner_watch_timer_lateness_seconds",
            "How late the owner watch thread's timers fired",
            m.lateness.clone(),
        );
        registry.register(
            "swimlb_owner_watch_checks",
            "Second checks of a silent owner, and checks of a member ahead in line for its IPs, by result (vouched: it answered; silent: it did not)",
            m.checks.clone(),
        );
        registry.register(
            "swimlb_owner_watch_takeovers",
            "Takeovers on this node's own watch, by result (confirmed: the gossip declared the owner down; refuted: it was alive)",
            m.takeovers.clone(),
        );
        registry.register(
            "swimlb_owner_watch_watchers",
            "Members this node sends heartbeats to",
            m.watchers.clone(),
        );
        registry.register(
            "swimlb_owner_watch_watched",
            "Owners this node watches",
            m.watched.clone(),
        );
        m
    }

    /// Counts a takeover's end.
    pub fn takeover(&self, result: TakeoverResult) {
        self.takeovers
            .get_or_create(&ResultLabel {
                result: result.as_str(),
            })
            .inc();
    }

    /// Takeovers counted with `result` so far.
    pub fn takeovers(&self, result: TakeoverResult) -> u64 {
        self.takeovers
            .get_or_create(&ResultLabel {
                result: result.as_str(),
            })
            .get()
    }

    pub(super) fn dropped(&self, reason: DropReason) {
        self.dropped
            .get_or_create(&ReasonLabel {
                reason: reason.as_str(),
            })
            .inc();
    }

    /// Datagrams dropped for `reason` so far.
    pub fn drops(&self, reason: DropReason) -> u64 {
        self.dropped
            .get_or_create(&ReasonLabel {
                reason: reason.as_str(),
            })
            .get()
    }

    pub(super) fn sent(&self, r#type: MessageType) {
        self.sent.get_or_create(&type_label(r#type)).inc();
    }

    /// Datagrams of `type` queued for sending so far.
    pub fn sent_of(&self, r#type: MessageType) -> u64 {
        self.sent.get_or_create(&type_label(r#type)).get()
    }

    pub(super) fn received(&self, r#type: MessageType) {
        self.received.get_or_create(&type_label(r#type)).inc();
    }

    /// Datagrams of `type` received and admitted so far.
    pub fn received_of(&self, r#type: MessageType) -> u64 {
        self.received.get_or_create(&type_label(r#type)).get()
    }

    pub(super) fn checked(&self, result: CheckResult) {
        self.checks
            .get_or_create(&ResultLabel {
                result: result.as_str(),
            })
            .inc();
    }

    /// Second checks that ended with `result` so far.
    pub fn checks(&self, result: CheckResult) -> u64 {
        self.checks
            .get_or_create(&ResultLabel {
                result: result.as_str(),
            })
            .get()
    }

    pub(super) fn late(&self, lateness: std::time::Duration) {
        self.lateness.observe(lateness.as_secs_f64());
    }

    pub(super) fn sizes(&self, watchers: usize, watched: usize) {
        self.watchers
            .set(i64::try_from(watchers).unwrap_or(i64::MAX));
        self.watched.set(i64::try_from(watched).unwrap_or(i64::MAX));
    }
}

fn type_label(r#type: MessageType) -> TypeLabel {
    TypeLabel {
        r#type: r#type.as_str(),
    }
}
