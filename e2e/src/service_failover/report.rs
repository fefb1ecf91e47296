//! What one `service-failover` trial's record says, as the JSON reports it: from the client's
//! requests ([`super::client::Record`]) and the fault's time.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

use super::client::{Outcome, Record, Request};
use crate::trial::{Percentiles, percentiles};

/// One trial.
#[derive(Debug, Clone, Serialize)]
pub struct TrialReport {
    /// 1-based.
    pub trial: usize,
    /// The owner before the fault (the one the election rule names, checked by ARP).
    pub owner: String,
    /// The node answering the IP's ARP at the end of the window, if any.
    pub new_owner: Option<String>,
    /// Fault to the end of the first successful request on a new connection sent after the
    /// link was surely down; `None` when none succeeded in the window.
    pub first_success_ms: Option<f64>,
    /// Fault to the first ARP frame claiming the IP from another node that the client's
    /// segment carried ([`super::arp`]): the takeover as `failover --scenario poweroff` sees it.
    pub arp_takeover_ms: Option<f64>,
    /// Distinct nodes other than the old owner that claimed the IP after the fault (1: it moved
    /// once).
    pub arp_new_claimants: usize,
    /// Fault to the sending of the last new request that failed (the end of the failures;
    /// `None` when none failed).
    pub last_failure_ms: Option<f64>,
    /// Fault to the first time the API server showed the old owner's Node not Ready (the
    /// node lifecycle controller's verdict), within the window.
    pub node_not_ready_ms: Option<f64>,
    /// Fault to the first time the Service's EndpointSlices showed none of the old owner's
    /// endpoints ready (what kube-proxy on the other nodes acts on), within the window.
    pub endpoints_not_ready_ms: Option<f64>,
    /// New connections' requests sent after the fault.
    pub new_requests: usize,
    /// Of those, the failed share in each second after the fault (0 to 1).
    pub failed_share_per_s: Vec<f64>,
    /// Of those, in each second after the fault: how they ended, and on what port ([`Second`]).
    pub seconds: Vec<Second>,
    /// What each long-lived connection saw.
    pub long_lived: Vec<LongLived>,
}

/// One long-lived connection through a trial.
#[derive(Debug, Clone, Serialize)]
pub struct LongLived {
    /// Its requests answered in the second before the fault.
    pub ok_before: usize,
    /// Fault to the end of its first failed request sent after the fault.
    pub first_failure_ms: Option<f64>,
    /// Whether the connection open at the fault answered every request after it (it survived).
    pub survived: bool,
    /// Fault to the end of the first request answered on a connection opened again.
    pub reopened_ok_ms: Option<f64>,
    /// Its requests sent after the fault.
    pub requests_after: usize,
    /// Its failed requests after the fault.
    pub failed: usize,
}

/// How long the kernel's connection tracking keeps a connection whose SYN was never answered
/// (`nf_conntrack_tcp_timeout_syn_sent`'s default): a SYN from the same address and port
/// within it is the same connection to conntrack, sent where the first one went.
pub const SYN_SENT_TIMEOUT: Duration = Duration::from_secs(120);

/// What the new connections' requests sent in one second after the fault gave.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Second {
    /// Requests sent.
    pub sent: usize,
    /// The failed ones, by how they ended.
    pub failed: BTreeMap<Outcome, usize>,
    /// Sent from a local port whose previous request (new or long-lived, in this client's run)
    /// had failed less than [`SYN_SENT_TIMEOUT`] before.
    pub on_port_failed_before: usize,
    /// Of those, the failed ones.
    pub failed_on_port_failed_before: usize,
    /// The answered ones, by the Pod that answered.
    pub answered_by: BTreeMap<String, usize>,
}

/// [`Second`] for each of the `seconds` seconds after `fault`, from the client's whole record.
pub fn seconds(record: &Record, fault: Instant, seconds: usize) -> Vec<Second> {
    let mut out = vec![Second::default(); seconds];
    // Every request of the run in the order sent, each with whether it is a new connection's.
    let mut all: Vec<(&Request, bool)> = record.new.iter().map(|r| (r, true)).collect();
    all.extend(record.long.iter().flatten().map(|r| (r, false)));
    all.sort_by_key(|(r, _)| r.sent);
    let mut last_failed: HashMap<u16, Option<Instant>> = HashMap::new();
    for (r, new) in all {
        let before = r.port != 0
            && last_failed
                .get(&r.port)
                .copied()
                .flatten()
                .is_some_and(|t| r.sent.saturating_duration_since(t) < SYN_SENT_TIMEOUT);
        if r.port != 0 {
            last_failed.insert(r.port, (!r.ok).then_some(r.sent));
        }
        if !new || r.sent < fault {
            continue;
        }
        let Some(s) = out.get_mut(r.sent.duration_since(fault).as_secs() as usize) else {
            continue;
        };
        s.sent += 1;
        if r.ok {
            let name = r.backend.and_then(|i| record.backends.get(i));
            *s.answered_by
                .entry(name.cloned().unwrap_or_default())
                .or_default() += 1;
        } else {
            *s.failed.entry(r.outcome).or_default() += 1;
        }
        s.on_port_failed_before += usize::from(before);
        s.failed_on_port_failed_before += usize::from(before && !r.ok);
    }
    out
}

/// Per policy over the trials.
#[derive(Debug, Clone, Serialize)]
pub struct PolicyReport {
    /// `swimlb-kubernetes`.
    #[serde(rename = "impl")]
    pub implementation: String,
    /// `local` or `cluster`.
    pub policy: String,
    /// The LoadBalancer IP.
    pub ip: String,
    /// Over the trials with a success.
    pub first_success_ms: Percentiles,
    /// Mean over the trials of each second's failed share.
    pub failed_share_per_s: Vec<f64>,
    /// Over the trials with a takeover: [`TrialReport::arp_takeover_ms`].
    pub arp_takeover_ms: Percentiles,
    /// Over the trials with a failure: [`TrialReport::last_failure_ms`].
    pub last_failure_ms: Percentiles,
    /// Over the trials where it happened: [`TrialReport::endpoints_not_ready_ms`].
    pub endpoints_not_ready_ms: Percentiles,
    /// Every trial.
    pub trials: Vec<TrialReport>,
    /// Trials not measured, and why.
    pub failed_trials: Vec<String>,
}

fn ms(from: Instant, to: Instant) -> f64 {
    to.saturating_duration_since(from).as_secs_f64() * 1000.0
}

/// Whether a new connection's request succeeded in the second before `fault`.
pub fn ok_before(record: &Record, fault: Instant) -> bool {
    record
        .new
        .iter()
        .any(|r| r.ok && r.sent < fault && r.sent + Duration::from_secs(1) >= fault)
}

/// Fault to the end of the first successful new request sent at or after `down` (when the
/// fault had surely taken effect: the link-down command returned).
pub fn first_success_ms(requests: &[Request], fault: Instant, down: Instant) -> Option<f64> {
    requests
        .iter()
        .filter(|r| r.ok && r.sent >= down)
        .map(|r| ms(fault, r.done))
        .min_by(f64::total_cmp)
}

/// Fault to the sending of the last failed request sent after the fault.
pub fn last_failure_ms(requests: &[Request], fault: Instant) -> Option<f64> {
    requests
        .iter()
        .filter(|r| !r.ok && r.sent >= fault)
        .map(|r| ms(fault, r.sent))
        .max_by(f64::total_cmp)
}

/// The failed share of the requests sent in each of the `seconds` seconds after the fault (0
/// for a second without requests).
pub fn failed_share_per_s(requests: &[Request], fault: Instant, seconds: usize) -> Vec<f64> {
    let mut sent = vec![0usize; seconds];
    let mut failed = vec![0usize; seconds];
    for r in requests.iter().filter(|r| r.sent >= fault) {
        let s = r.sent.duration_since(fault).as_secs() as usize;
        if s < seconds {
            sent[s] += 1;
            failed[s] += usize::from(!r.ok);
        }
    }
    sent.iter()
        .zip(&failed)
        .map(|(&n, &f)| if n == 0 { 0.0 } else { f as f64 / n as f64 })
        .collect()
}

/// What a long-lived connection saw.
pub fn long_lived(requests: &[Request], fault: Instant) -> LongLived {
    let before = requests
        .iter()
        .filter(|r| r.sent < fault && r.sent + Duration::from_secs(1) >= fault && r.ok)
        .count();
    let after: Vec<&Request> = requests.iter().filter(|r| r.sent >= fault).collect();
    let first_failure = after.iter().position(|r| !r.ok);
    // A failure drops the connection: the next request that succeeds is on a new one.
    let reopened_ok =
        first_failure.and_then(|i| after[i..].iter().find(|r| r.ok).map(|r| ms(fault, r.done)));
    LongLived {
        ok_before: before,
        first_failure_ms: first_failure.map(|i| ms(fault, after[i].done)),
        survived: first_failure.is_none() && !after.is_empty(),
        reopened_ok_ms: reopened_ok,
        requests_after: after.len(),
        failed: after.iter().filter(|r| !r.ok).count(),
    }
}

/// The policy's summary over `trials`.
pub fn summarize(
    implementation: &str,
    policy: &str,
    ip: &str,
    trials: Vec<TrialReport>,
    failed_trials: Vec<String>,
) -> PolicyReport {
    let over = |f: fn(&TrialReport) -> Option<f64>| {
        percentiles(&trials.iter().filter_map(f).collect::<Vec<f64>>())
    };
    let seconds = trials
        .iter()
        .map(|t| t.failed_share_per_s.len())
        .max()
        .unwrap_or(0);
    let mean = (0..seconds)
        .map(|s| {
            let v: Vec<f64> = trials
                .iter()
                .filter_map(|t| t.failed_share_per_s.get(s).copied())
                .collect();
            v.iter().sum::<f64>() / v.len().max(1) as f64
        })
        .collect();
    PolicyReport {
        implementation: implementation.into(),
        policy: policy.into(),
        ip: ip.into(),
        first_success_ms: over(|t| t.first_success_ms),
        failed_share_per_s: mean,
        arp_takeover_ms: over(|t| t.arp_takeover_ms),
        last_failure_ms: over(|t| t.last_failure_ms),
        endpoints_not_ready_ms: over(|t| t.endpoints_not_ready_ms),
        trials,
        failed_trials,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Within a microsecond (the times are f64 milliseconds).
    fn near(got: Option<f64>, want: f64) -> bool {
        got.is_some_and(|g| (g - want).abs() < 0.001)
    }

    fn req(fault: Instant, sent_ms: i64, took_ms: u64, ok: bool) -> Request {
        let sent = if sent_ms < 0 {
            fault - Duration::from_millis(sent_ms.unsigned_abs())
        } else {
            fault + Duration::from_millis(sent_ms as u64)
        };
        Request {
            sent,
            done: sent + Duration::from_millis(took_ms),
            ok,
            outcome: if ok {
                Outcome::Ok
            } else {
                Outcome::ConnectTimeout
            },
            port: 0,
            backend: ok.then_some(0),
            reopened: false,
        }
    }

    #[test]
    fn first_success_counts_only_requests_sent_after_the_fault() {
        let fault = Instant::now();
        let rs = [
            req(fault, -5, 20, true),
            req(fault, 10, 1000, false),
            req(fault, 300, 2, true),
            req(fault, 400, 1, true),
        ];
        assert!(near(first_success_ms(&rs, fault, fault), 302.0));
        assert_eq!(first_success_ms(&rs[..2], fault, fault), None);
        // Sent while the fault was being made: not counted.
        let down = fault + Duration::from_millis(350);
        assert!(near(first_success_ms(&rs, fault, down), 401.0));
    }

    #[test]
    fn failed_share_is_per_second_after_the_fault() {
        let fault = Instant::now();
        let rs = [
            req(fault, 0, 1, false),
            req(fault, 500, 1, true),
            req(fault, 1500, 1, true),
            req(fault, 3500, 1, false),
        ];
        assert_eq!(failed_share_per_s(&rs, fault, 3), vec![0.5, 0.0, 0.0]);
        assert!(near(last_failure_ms(&rs, fault), 3500.0));
        assert_eq!(last_failure_ms(&rs[1..3], fault), None);
    }

    #[test]
    fn a_long_lived_connection_that_broke_and_was_opened_again() {
        let fault = Instant::now();
        let mut rs = vec![
            req(fault, -10, 1, true),
            req(fault, 5, 1000, false),
            req(fault, 1010, 3, true),
        ];
        rs[2].reopened = true;
        let l = long_lived(&rs, fault);
        assert_eq!(l.ok_before, 1);
        assert!(near(l.first_failure_ms, 1005.0));
        assert!(!l.survived);
        assert!(near(l.reopened_ok_ms, 1013.0));
        assert_eq!(l.failed, 1);
        let kept = long_lived(&[req(fault, 5, 1, true)], fault);
        assert!(kept.survived && kept.first_failure_ms.is_none());
    }

    #[test]
    fn a_second_counts_outcomes_backends_and_ports_that_failed_before() {
        let fault = Instant::now();
        let on = |sent_ms, ok, port| Request {
            port,
            ..req(fault, sent_ms, 1, ok)
        };
        let mut long = on(-100_000, false, 7);
        long.outcome = Outcome::Reset;
        let record = Record {
            new: vec![
                // Port 5 failed before the fault, and again after it.
                on(-2000, false, 5),
                on(100, false, 5),
                // Port 6 failed, then answered: the answer clears it.
                on(200, false, 6),
                on(1200, true, 6),
                on(1300, true, 6),
                // Port 7's failure (a long-lived one's) is older than conntrack keeps it.
                on(30_000, true, 7),
                // Port 0: unknown, never counted as reused.
                on(400, false, 0),
                on(500, false, 0),
            ],
            long: vec![vec![long]],
            backends: vec!["echo-a".into()],
        };
        let s = seconds(&record, fault, 2);
        assert_eq!(s[0].sent, 4);
        assert_eq!(s[0].failed.get(&Outcome::ConnectTimeout), Some(&4));
        assert_eq!(
            (
                s[0].on_port_failed_before,
                s[0].failed_on_port_failed_before
            ),
            (1, 1)
        );
        assert_eq!(s[1].sent, 2);
        assert!(s[1].failed.is_empty());
        assert_eq!(s[1].answered_by.get("echo-a"), Some(&2));
        assert_eq!(
            (
                s[1].on_port_failed_before,
                s[1].failed_on_port_failed_before
            ),
            (1, 0)
        );
    }
}
