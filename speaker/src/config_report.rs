//! What `swimlb-speaker check-config` prints for a valid file: every group, its addresses, and
//! each check's worst-case detection time (`interval x fall + timeout`), so an operator can order
//! the timings of stacked layers (a load balancer's own checks should detect before ours).

use std::fmt::Write as _;

use swimlb_config::duration::format_duration;
use swimlb_config::standalone::{CheckKind, Standalone};

/// The report for a valid configuration, as lines of text.
pub fn report(config: &Standalone) -> String {
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
        let mut worst = None;
        for check in &group.checks {
            let target = match &check.kind {
                CheckKind::Http { url, .. } => url.clone(),
                CheckKind::Tcp { target } => target.clone(),
                CheckKind::Exec { argv } => argv.join(" "),
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
        match worst {
            Some(w) => {
                let _ = writeln!(
                    out,
                    "  expected failover: on a failing check at most {} plus one gossip round; on a node failure, the gossip detection time of the {} profile",
                    format_duration(w),
                    config.gossip.profile.as_str()
                );
            }
            None => {
                let _ = writeln!(
                    out,
                    "  expected failover: no checks; on a node failure, the gossip detection time of the {} profile",
                    config.gossip.profile.as_str()
                );
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_shows_detection_time_per_check() {
        let config = Standalone::parse(
            "cluster: c\nnode: n1\nbind: 192.0.2.10\ninsecure: true\ngroups: [{name: api, addresses: [192.0.2.100], checks: [{name: lb, tcp: 'localhost:9443', interval: 1s, timeout: 900ms, fall: 2, weight: 20}, {name: be, exec: /bin/true, interval: 2s, fall: 3}]}]",
        )
        .unwrap();
        let text = report(&config);
        assert!(text.contains("check lb (tcp localhost:9443): every 1s, timeout 900ms, rise 1, fall 2, +20 while passing; detects a failure in at most 2.9s"), "{text}");
        assert!(text.contains("check be (exec /bin/true): every 2s, timeout 2s, rise 1, fall 3, failure makes the node ineligible; detects a failure in at most 8s"), "{text}");
        assert!(
            text.contains("expected failover: on a failing check at most 8s"),
            "{text}"
        );
        assert!(text.contains("WARNING: insecure"), "{text}");
    }
}
