//! What a simulation run reports: its JSON figures and the terminal table.

use super::*;

/// Percentiles of the detection time, in milliseconds.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Quantiles {
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest sample.
    pub max: f64,
}

/// The result of one run (the JSON `sim --json` writes).
#[derive(Debug, Clone, Serialize)]
pub struct SimReport {
    /// Cluster size.
    pub nodes: usize,
    /// Loss in percent.
    pub loss: f64,
    /// Profile name.
    pub profile: &'static str,
    /// Crash-to-last-survivor detection time.
    pub detection_ms: Quantiles,
    /// MemberDown of members that were not crashed, summed over all observers.
    pub false_downs: u64,
    /// Datagrams sent per member per second after warm-up, the gossip's and the owner watch's.
    pub packets_per_member_per_s: f64,
    /// Sealed bytes of the gossip sent per member per second after warm-up (the watch's are
    /// not modelled as bytes).
    pub bytes_per_member_per_s: f64,
    /// Crashes measured.
    pub crashes: usize,
    /// Crashes not seen by every survivor within the cap (counted at the cap in the quantiles).
    pub undetected: usize,
    /// Simulated seconds until every node saw every node (or the warm-up's 30 s cap).
    pub warmup_s: f64,
    /// Whether every node saw every node by the end of the warm-up.
    pub converged: bool,
    /// Simulated seconds.
    pub duration_s: f64,
    /// RNG seed.
    pub seed: u64,
    /// How the suspicions the members timed ended (Lifeguard), summed over the members running
    /// at the end (a crashed member's counts go with it).
    pub suspicions: SuspicionCounts,
    /// Whether the owner watch ran beside the gossip.
    pub watch: bool,
    /// IPs each member owned (0 without the watch).
    pub ips_per_member: usize,
    /// Watch takeovers of a member that was running in the accused incarnation and not
    /// stalled, outside the partition phase: false takeovers, each refuted by the accused.
    pub refuted_takeovers: u64,
    /// Watch takeovers of a crashed member (of an incarnation that no longer runs).
    pub confirmed_takeovers: u64,
    /// From a crash to the first watcher's takeover of the crashed member.
    pub watch_detect_ms: Quantiles,
    /// Crashes no watcher took over before every survivor's gossip had (not in
    /// `watch_detect_ms`).
    pub watch_undetected: usize,
    /// Owner watch datagrams (heartbeats, acknowledgements, polls, relays, replies) sent per
    /// member per second after warm-up; `packets_per_member_per_s` includes them.
    pub watch_packets_per_member_per_s: f64,
    /// With `--kinds`: the gossip's datagrams per member per second after warm-up by what they
    /// carry (foca's `ping`, `ack`, `ping_req`, `indirect_ping`, `indirect_ack`,
    /// `forwarded_ack`, `gossip`, `announce`, `feed`, `turn_undead`, `broadcast`; the
    /// speaker's `meta`, `meta_pull`, `sync`, `inquire`, `inquiry_ping`, `inquiry_pong`,
    /// `verdict`, `watch_relay`); they add up to the gossip's share of
    /// `packets_per_member_per_s`.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub gossip_kinds: BTreeMap<String, f64>,
    /// The partition phase, when one was asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partition: Option<PartitionReport>,
    /// The slow-member phase, when one was asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slow: Option<StallReport>,
    /// The paused-member phase, when one was asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pause: Option<StallReport>,
}

/// Suspicions by how they ended (`swimlb_gossip_suspicions_total{outcome}`).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct SuspicionCounts {
    /// The suspect refuted.
    pub refuted: u64,
    /// Declared down with at least one independent confirmation.
    pub confirmed: u64,
    /// Declared down by a lone observer's timeout.
    pub expired: u64,
}

/// What stalling one member did (`sim --slow MS`, `sim --pause MS`).
#[derive(Debug, Clone, Serialize)]
pub struct StallReport {
    /// The stalled member's index.
    pub member: usize,
    /// The lag (slow) or the pause, in milliseconds.
    pub stall_ms: f64,
    /// How long each stall lasted, in milliseconds (10 s when slow, the pause when paused).
    pub window_ms: f64,
    /// Stalls run.
    pub stalls: usize,
    /// `MemberDown` of any member other than the stalled one, summed over observers (the
    /// stalled one's own observations included): the false downs a stall must not cause.
    pub false_downs_of_others: u64,
    /// `MemberDown` of the stalled member, summed over observers.
    pub downs_of_stalled: u64,
    /// Per stall, from its end until every member held the stalled one alive and it held every
    /// member (a stall not recovered within 10 s counts 10 s).
    pub recover_ms: Quantiles,
    /// Stalls not recovered within 10 s.
    pub unrecovered: usize,
    /// The stalled member's highest local health score seen (sampled every 100 ms).
    pub max_health: i64,
    /// Watch takeovers of the stalled member during the stalls and their recoveries, summed
    /// over watchers (not counted as refuted: a stalled owner is silent).
    pub stalled_takeovers: u64,
}

/// What a partition and its heal did (`sim --partition SECONDS`).
#[derive(Debug, Clone, Serialize)]
pub struct PartitionReport {
    /// Members cut off (every third member, seed 2 among them, so each side keeps a seed).
    pub cut_off: usize,
    /// Simulated seconds the cut lasted.
    pub cut_s: f64,
    /// Whether every member saw every member again within 60 s of the heal.
    pub healed: bool,
    /// From the heal until every member saw every member.
    pub heal_ms: f64,
    /// `MemberDown` events after the heal seen by members of the larger side, summed over
    /// observers: the flapping a heal must not cause (a down there moves that member's IPs).
    pub downs_after_heal: u64,
    /// `MemberDown` events after the heal seen by the members that were cut off. A cut-off
    /// member rejoins under a renewed identity and then learns that the old identities of its
    /// side are down, so some are expected; they move nothing, because a renewed member is
    /// unsettled.
    pub cut_off_downs_after_heal: u64,
    /// Watch takeovers of running members from the cut until 5 s after everyone saw everyone
    /// (across the cut, mostly; not counted as refuted).
    pub takeovers: u64,
}

impl Quantiles {
    /// The median, 99th percentile and largest of `sorted` (zeros when it is empty).
    pub(super) fn of(sorted: &[f64]) -> Quantiles {
        Quantiles {
            p50: quantile(sorted, 0.5),
            p99: quantile(sorted, 0.99),
            max: sorted.last().copied().unwrap_or(0.0),
        }
    }
}

pub(super) fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The table header matching [`table_row`].
pub fn table_header() -> String {
    format!(
        "{:>6} {:>5} {:>7} {:>7} {:>8} {:>8} {:>8} {:>6} {:>6} {:>9} {:>11} {:>7} {:>7} {:>7} {:>9} {:>7}",
        "nodes",
        "loss%",
        "profile",
        "crashes",
        "p50_ms",
        "p99_ms",
        "max_ms",
        "undet",
        "false",
        "pkts/m/s",
        "bytes/m/s",
        "refuted",
        "w_p50",
        "w_p99",
        "w_pkts/m/s",
        "wall_s"
    )
}

/// One table row.
pub fn table_row(r: &SimReport, wall: Duration) -> String {
    format!(
        "{:>6} {:>5} {:>7} {:>7} {:>8.0} {:>8.0} {:>8.0} {:>6} {:>6} {:>9.1} {:>11.0} {:>7} {:>7.0} {:>7.0} {:>9.1} {:>7.1}",
        r.nodes,
        r.loss,
        r.profile,
        r.crashes,
        r.detection_ms.p50,
        r.detection_ms.p99,
        r.detection_ms.max,
        r.undetected,
        r.false_downs,
        r.packets_per_member_per_s,
        r.bytes_per_member_per_s,
        r.refuted_takeovers,
        r.watch_detect_ms.p50,
        r.watch_detect_ms.p99,
        r.watch_packets_per_member_per_s,
        wall.as_secs_f64()
    )
}
