//! What `swimlb-speaker check-config` prints for a valid file: every group, its addresses, and
//! each check's worst-case detection time (`interval x fall + timeout`), so an operator can order
//! the timings of stacked layers (a load balancer's own checks should detect before ours).
//!
//! It also prints each group's expected failover, an *estimate* derived from the gossip timings
//! ([`FailoverEstimate`], pure): on a node failure, one probe period until a member probes the
//! dead node, one more for the direct probe (`probeRtt`) and the indirect ones (foca suspects a
//! member when the period ends without an ack), the suspicion timeout, one gossip round to
//! spread the news; on a failing check, the check's worst case plus one gossip round for the
//! record. These are not bounds: lost probes and a loaded machine make failovers longer, and the
//! measured figures are in the book's Benchmarks page (`docs/src/benchmarks.md`).
//!
//! One line describes the owner watch: on or off, its interval and misses, the
//! longest time until a watcher finds a crashed owner silent
//! ([`owner_watch::worst_case_detection`], before the second check) and the datagrams per second
//! it costs per watched pair ([`owner_watch::packets_per_second_per_pair`]).

use std::fmt::Write as _;

use std::time::Duration;

use swimlb_config::duration::format_duration;
use swimlb_config::keyfile::{parse_key_file, read_key_file};
use swimlb_config::standalone::{CheckKind, Standalone};
use tokio::time::Instant;

use crate::gossip::Timing;
use crate::gossip::metadata::{MAX_META_RECORD_LEN, MetaRecord};
use crate::model::local::LocalState;
use crate::model::membership::AnnounceFacts;
use crate::model::snapshot::Interfaces;
use crate::model::watch_knobs::Knobs;
use crate::owner_watch;

/// What the standalone daemon would refuse at start-up in a file that parsed: the key file (each
/// bad line), the key ring, and [`start_refusals`]. Empty when it would start; otherwise one
/// line per problem, and the timings when they are valid.
pub fn refusals(config: &Standalone) -> (Vec<String>, Option<Timing>) {
    let mut problems = Vec::new();
    if let Some(key_file) = &config.key_file {
        let found: Vec<String> = match read_key_file(key_file) {
            Ok(text) => parse_key_file(&text)
                .err()
                .unwrap_or_default()
                .iter()
                .map(ToString::to_string)
                .collect(),
            Err(e) => vec![e.to_string()],
        };
        problems.extend(
            found
                .iter()
                .map(|p| format!("keyFile {}: {p}", key_file.display())),
        );
        // The ring's own refusals (a 32-bit key id shared by two keys), once the file reads.
        if found.is_empty()
            && let Err(e) = crate::sources::standalone::key_ring(config)
        {
            problems.push(e.to_string());
        }
    }
    // Programs and users as the daemon vets them at start-up and on a reload.
    if let Err(more) = crate::sources::scripts::vet(config) {
        problems.extend(more);
    }
    let (more, timing) = start_refusals(config);
    problems.extend(more);
    (problems, timing)
}

/// What the daemon refuses at start-up that no file decides: the gossip timings, this node's
/// gossip record at its largest, and the insecure key ring. Pure but for the hostname, read
/// when the file names no node.
pub fn start_refusals(config: &Standalone) -> (Vec<String>, Option<Timing>) {
    let mut problems = Vec::new();
    if config.key_file.is_none()
        && let Err(e) = crate::sources::standalone::key_ring(config)
    {
        problems.push(e.to_string());
    }
    let timing = match crate::sources::standalone::timing(config) {
        Ok(t) => Some(t),
        Err(e) => {
            problems.push(format!("gossip: {e}"));
            None
        }
    };
    let len = largest_record(config);
    if len > MAX_META_RECORD_LEN {
        problems.push(format!(
            "groups: this node's gossip record (priorities, check names and results, interfaces) can reach {len} bytes, more than {MAX_META_RECORD_LEN}: use fewer groups or checks, or shorter names"
        ));
    }
    (problems, timing)
}

/// The encoded length of this node's gossip record at its largest: every named interface
/// present, every address on the default interface unplaceable, the widest counters.
pub fn largest_record(config: &Standalone) -> usize {
    let node = crate::sources::standalone::node_name(config);
    let mut local = LocalState::new(&node, config, Instant::now());
    let served = crate::sources::standalone::snapshot(config);
    let mut facts = AnnounceFacts::default();
    for (ip, ip_served) in served.iter() {
        match &ip_served.interfaces {
            Interfaces::Default => {
                facts.unplaced.insert(*ip);
            }
            Interfaces::Named(names) => facts.links.extend(names.iter().cloned()),
        }
    }
    local.set_announce(facts);
    let mut meta = local.meta().clone();
    meta.version = u64::MAX;
    meta.settled = true;
    meta.draining = true;
    let record = MetaRecord {
        bump: u64::MAX,
        meta,
    };
    match postcard::to_allocvec(&record) {
        Ok(bytes) => bytes.len(),
        Err(_) => usize::MAX,
    }
}

/// The failover a group may expect on a node failure, estimated from the gossip timings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailoverEstimate {
    /// Until some member probes the failed node: one probe period.
    pub until_probed: Duration,
    /// The probe itself: the direct probe's rtt, then the indirect probes until the period ends.
    pub probe: Duration,
    /// The suspicion timeout for the cluster's size.
    pub suspicion: Duration,
    /// One periodic gossip round, spreading the verdict (or a check's result).
    pub gossip_round: Duration,
}

impl FailoverEstimate {
    /// The estimate for `timing` with `members` members (this node included).
    pub fn of(timing: &Timing, members: usize) -> FailoverEstimate {
        let (suspicion, _) = timing.scaled(members);
        FailoverEstimate {
            until_probed: timing.probe_period,
            probe: timing.probe_period,
            suspicion,
            gossip_round: timing.gossip_period,
        }
    }

    /// On a node failure: the sum of the parts.
    pub fn node_failure(&self) -> Duration {
        self.until_probed + self.probe + self.suspicion + self.gossip_round
    }

    /// On a failing check detected within `detection`: that, then one gossip round.
    pub fn failing_check(&self, detection: Duration) -> Duration {
        detection.saturating_add(self.gossip_round)
    }
}

/// Members of the cluster as the file describes it: this node and its other peers.
fn members(config: &Standalone) -> usize {
    config.peers.iter().filter(|p| **p != config.bind).count() + 1
}

/// The owner watch's line of the report (pure).
pub fn owner_watch_line(knobs: &Knobs) -> String {
    let knobs_text = format!(
        "heartbeat every {}, silent after {} missed",
        format_duration(knobs.interval),
        knobs.misses,
    );
    if knobs.enabled {
        format!(
            "owner watch: on, {knobs_text}; finds a crashed owner silent in at most {} (then the second check), {} packet(s)/s per watched pair",
            format_duration(owner_watch::worst_case_detection(knobs)),
            format_rate(owner_watch::packets_per_second_per_pair(knobs)),
        )
    } else {
        format!(
            "owner watch: off ({knobs_text} once switched on, finding a crashed owner silent in at most {}), {} packet(s)/s per watched pair; gossip alone detects a failed owner",
            format_duration(owner_watch::worst_case_detection(knobs)),
            format_rate(owner_watch::packets_per_second_per_pair(knobs)),
        )
    }
}

/// A rate with at most one decimal, without a trailing `.0`.
fn format_rate(rate: f64) -> String {
    let text = format!("{rate:.1}");
    text.strip_suffix(".0").map(str::to_string).unwrap_or(text)
}

/// The report for a valid configuration and its gossip `timing` (the profile with the file's
/// overrides), as lines of text.
pub fn report(config: &Standalone, timing: &Timing) -> String {
    let mut out = String::new();
    let addresses: usize = config.groups.iter().map(|g| g.addresses.len()).sum();
    let _ = writeln!(
        out,
        "valid: cluster {}, node {}, gossip {} ({} profile), {} peer(s), {} group(s), {} address(es)",
        config.cluster,
        config.node.as_deref().unwrap_or("(hostname)"),
        config.bind,
        config.gossip.profile.as_str(),
        config.peers.len(),
        config.groups.len(),
        addresses,
    );
    if config.insecure {
        let _ = writeln!(
            out,
            "WARNING: insecure: gossip is neither encrypted nor authenticated"
        );
    }
    let _ = writeln!(out, "{}", owner_watch_line(&timing.owner_watch));
    let members = members(config);
    let estimate = FailoverEstimate::of(timing, members);
    let gossip_alone = format!(
        "{} ({} until probed + {} probe + {} suspicion + {} gossip round, {} profile, {} member(s))",
        format_duration(estimate.node_failure()),
        format_duration(estimate.until_probed),
        format_duration(estimate.probe),
        format_duration(estimate.suspicion),
        format_duration(estimate.gossip_round),
        config.gossip.profile.as_str(),
        members,
    );
    let node_failure = if timing.owner_watch.enabled {
        format!(
            "on a node failure at most {} by the owner watch (the gossip alone: about {gossip_alone})",
            format_duration(crate::owner_watch::worst_case_detection(
                &timing.owner_watch
            )),
        )
    } else {
        format!("on a node failure about {gossip_alone}")
    };
    for group in &config.groups {
        let list: Vec<String> = group.addresses.iter().map(ToString::to_string).collect();
        let _ = writeln!(
            out,
            "group {}: {} on {}, priority {} (default), preempt delay {}",
            group.name,
            list.join(", "),
            group
                .interface
                .as_deref()
                .unwrap_or("(interface with a route to the address)"),
            group.priority.default,
            format_duration(group.preempt_delay),
        );
        for (node, p) in &group.priority.nodes {
            let _ = writeln!(out, "  priority {node}: {p}");
        }
        let worst = write_checks(&mut out, group);
        match worst {
            Some(w) => {
                let _ = writeln!(
                    out,
                    "  expected failover (estimate): {node_failure}; on a failing check about {} ({} + {} gossip round)",
                    format_duration(estimate.failing_check(w)),
                    format_duration(w),
                    format_duration(estimate.gossip_round),
                );
            }
            None => {
                let _ = writeln!(
                    out,
                    "  expected failover (estimate): {node_failure}; no checks"
                );
            }
        }
    }
    let _ = writeln!(
        out,
        "failover figures are estimates from the timings, not bounds: lost probes and load make them longer; the measured figures are in the book's Benchmarks page (docs/src/benchmarks.md)"
    );
    out
}

/// One line per check of `group`; returns the longest time one takes to detect a failure.
fn write_checks(out: &mut String, group: &swimlb_config::standalone::Group) -> Option<Duration> {
    let mut worst = None;
    for check in &group.checks {
        let target = match &check.kind {
            CheckKind::Http { url, .. } => url.clone(),
            CheckKind::Tcp { target } => target.clone(),
            CheckKind::Exec { argv, .. } => argv.join(" "),
        };
        let effect = match check.weight {
            0 => "failure makes the node ineligible".to_string(),
            w if w > 0 => format!("+{w} while passing"),
            w => format!("{w} while failing"),
        };
        let detection = check.worst_case_detection();
        worst = worst.max(Some(detection));
        let _ = writeln!(
            out,
            "  check {} ({} {}): every {}, timeout {}, rise {}, fall {}, {}; detects a failure in at most {}",
            check.name,
            check.kind.as_str(),
            target,
            format_duration(check.interval),
            format_duration(check.timeout),
            check.rise,
            check.fall,
            effect,
            format_duration(detection),
        );
    }
    worst
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_check_config_calls_too_large_is_one_the_gossip_refuses_at_start() {
        let config = Standalone::parse(include_str!(
            "../../tests/check_config/gossip_record_too_large.yaml"
        ))
        .unwrap();
        let (problems, _) = refusals(&config);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(largest_record(&config) > MAX_META_RECORD_LEN);
        // The record the daemon hands the gossip at start (no announce facts yet) is refused.
        let local = LocalState::new("master-0", &config, Instant::now());
        let record = MetaRecord {
            bump: 1,
            meta: local.meta().clone(),
        };
        assert!(matches!(
            record.encode(),
            Err(crate::gossip::metadata::MetaError::TooLarge { .. })
        ));
        // One group fewer fits.
        let mut smaller = config.clone();
        smaller.groups.pop();
        assert!(largest_record(&smaller) <= MAX_META_RECORD_LEN);
        assert!(refusals(&smaller).0.is_empty());
    }

    #[test]
    fn report_shows_detection_time_per_check() {
        let config = Standalone::parse(
            "cluster: c\nnode: n1\nbind: 192.0.2.10\ninsecure: true\ngroups: [{name: api, addresses: [192.0.2.100], checks: [{name: lb, tcp: 'localhost:9443', interval: 1s, timeout: 900ms, fall: 2, weight: 20}, {name: be, exec: /bin/true, interval: 2s, fall: 3}]}]",
        )
        .unwrap();
        let text = report(&config, &Timing::fast());
        assert!(text.contains("check lb (tcp localhost:9443): every 1s, timeout 900ms, rise 1, fall 2, +20 while passing; detects a failure in at most 2.9s"), "{text}");
        assert!(text.contains("check be (exec /bin/true): every 2s, timeout 2s, rise 1, fall 3, failure makes the node ineligible; detects a failure in at most 8s"), "{text}");
        assert!(
            text.contains("expected failover (estimate): on a node failure at most 110ms by the owner watch (the gossip alone: about 330ms (80ms until probed + 80ms probe + 150ms suspicion + 20ms gossip round, fast profile, 1 member(s))); on a failing check about 8.02s (8s + 20ms gossip round)"),
            "{text}"
        );
        assert!(
            text.contains(
                "the measured figures are in the book's Benchmarks page (docs/src/benchmarks.md)"
            ),
            "{text}"
        );
        assert!(text.contains("WARNING: insecure"), "{text}");
    }

    #[test]
    fn node_failure_estimate_adds_two_probe_periods_suspicion_and_a_gossip_round() {
        let fast = FailoverEstimate::of(&Timing::fast(), 3);
        assert_eq!(
            fast.node_failure(),
            Duration::from_millis(80 + 80 + 150 + 20)
        );
        assert_eq!(
            fast.failing_check(Duration::from_millis(2900)),
            Duration::from_millis(2920)
        );
        // lan scales suspicion with log10 of the members, from 10 on.
        let lan = Timing::lan();
        assert_eq!(
            FailoverEstimate::of(&lan, 3).node_failure(),
            Duration::from_millis(1000 + 1000 + 4000 + 200)
        );
        assert_eq!(
            FailoverEstimate::of(&lan, 100).suspicion,
            Duration::from_secs(8)
        );
    }

    #[test]
    fn report_shows_the_owner_watch_with_its_detection_and_cost() {
        let config = Standalone::parse(
            "cluster: c\nnode: n1\nbind: 192.0.2.10\ninsecure: true\ngroups: [{name: api, addresses: [192.0.2.100]}]",
        )
        .unwrap();
        let text = report(&config, &Timing::fast());
        // 5 x 20ms + 5ms jitter + 5ms slack; 50 heartbeats and 1 acknowledgement a second.
        assert!(
            text.contains("owner watch: on, heartbeat every 20ms, silent after 5 missed; finds a crashed owner silent in at most 110ms (then the second check), 51 packet(s)/s per watched pair"),
            "{text}"
        );
    }

    #[test]
    fn the_owner_watch_line_says_when_it_is_off_and_what_switching_it_on_gives() {
        assert_eq!(
            owner_watch_line(&Timing::lan().owner_watch),
            "owner watch: off (heartbeat every 100ms, silent after 5 missed once switched on, finding a crashed owner silent in at most 550ms), 0 packet(s)/s per watched pair; gossip alone detects a failed owner"
        );
        let knobs = Knobs {
            interval: Duration::from_millis(30),
            misses: 3,
            enabled: true,
        };
        assert_eq!(
            owner_watch_line(&knobs),
            "owner watch: on, heartbeat every 30ms, silent after 3 missed; finds a crashed owner silent in at most 105ms (then the second check), 34.3 packet(s)/s per watched pair"
        );
    }
}
