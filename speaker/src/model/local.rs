//! What this node says about itself: the [`MemberMeta`] it gossips, built from the
//! configuration, its check results and its uptime.
//!
//! Pure: the caller passes `now`. The record's version grows by one each time any gossiped fact
//! changes, so peers can tell newer from older records.
//!
//! `settled` is one flag per member: a node is settled once it has been up for the longest
//! `preemptDelay` of its groups. (A per-group flag would let a group with a short delay preempt
//! sooner; with the usual single group, both are the same.)

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use swimlb_config::standalone::Standalone;
use tokio::time::Instant;

use crate::model::membership::{AnnounceFacts, CheckResult, GroupHealth, MemberMeta};

/// This node's gossiped facts and how they evolve.
#[derive(Debug, Clone)]
pub struct LocalState {
    meta: MemberMeta,
    started: Instant,
    settle_after: Duration,
}

impl LocalState {
    /// The first record of `node` for `config`, at `now`: every check failing, not settled
    /// (unless no group has a preemption delay).
    pub fn new(node: &str, config: &Standalone, now: Instant) -> LocalState {
        let settle_after = config
            .groups
            .iter()
            .map(|g| g.preempt_delay)
            .max()
            .unwrap_or_default();
        LocalState::with_groups(
            node,
            groups(node, config, &BTreeMap::new()),
            settle_after,
            now,
        )
    }

    /// The first record of `node` with `groups` (none for a Kubernetes speaker, whose Services
    /// carry no priorities or checks), settled after `settle_after` (its preemption delay).
    pub fn with_groups(
        node: &str,
        groups: BTreeMap<String, GroupHealth>,
        settle_after: Duration,
        now: Instant,
    ) -> LocalState {
        let mut meta = MemberMeta::new(node);
        meta.settled = settle_after.is_zero();
        meta.groups = groups;
        LocalState {
            meta,
            started: now,
            settle_after,
        }
    }

    /// The current record.
    pub fn meta(&self) -> &MemberMeta {
        &self.meta
    }

    /// When the node becomes settled, if it is not yet.
    pub fn settles_at(&self) -> Option<Instant> {
        (!self.meta.settled).then(|| self.started + self.settle_after)
    }

    /// Marks the node settled when its time has come. Returns whether the record changed.
    pub fn tick(&mut self, now: Instant) -> bool {
        if !self.meta.settled && now >= self.started + self.settle_after {
            self.meta.settled = true;
            self.meta.version += 1;
            return true;
        }
        false
    }

    /// Starts the preemption delay again at `now`: the node came back under a renewed gossip
    /// identity (after a cut), which the cluster treats as a new membership. Returns whether the
    /// record changed.
    pub fn rejoined(&mut self, now: Instant) -> bool {
        self.restart_preempt_delay(now)
    }

    /// Starts the preemption delay again at `now` (a rejoin, or a link that could not announce
    /// and can again: keepalived waits `preempt_delay` after a FAULT ends too). Returns whether
    /// the record changed.
    pub fn restart_preempt_delay(&mut self, now: Instant) -> bool {
        self.started = now;
        if !self.meta.settled || self.settle_after.is_zero() {
            return false;
        }
        self.meta.settled = false;
        self.meta.version += 1;
        true
    }

    /// Records check `check` of group `group` (names in the configuration). Returns whether the
    /// record changed.
    pub fn set_check(&mut self, group: &str, check: &str, passing: bool) -> bool {
        let Some(health) = self.meta.groups.get_mut(group) else {
            return false;
        };
        let Some(result) = health.checks.iter_mut().find(|c| c.name == check) else {
            return false;
        };
        if result.passing == passing {
            return false;
        }
        result.passing = passing;
        self.meta.version += 1;
        true
    }

    /// Records where the node can announce (the engine's [`AnnounceFacts`]). Returns whether
    /// the record changed.
    pub fn set_announce(&mut self, facts: AnnounceFacts) -> bool {
        if self.meta.announce == facts {
            return false;
        }
        self.meta.announce = facts;
        self.meta.version += 1;
        true
    }

    /// Records the addresses this node sends VRRP advertisements from
    /// ([`MemberMeta::vrrp_sources`]). Returns whether the record changed.
    pub fn set_vrrp_sources(&mut self, sources: BTreeSet<std::net::IpAddr>) -> bool {
        if self.meta.vrrp_sources == sources {
            return false;
        }
        self.meta.vrrp_sources = sources;
        self.meta.version += 1;
        true
    }

    /// Marks the node draining (SIGTERM). Returns whether the record changed.
    pub fn drain(&mut self) -> bool {
        if self.meta.draining {
            return false;
        }
        self.meta.draining = true;
        self.meta.version += 1;
        true
    }

    /// Applies a reloaded configuration. The checks in `unchanged` (still running with their
    /// state, see [`crate::sources::checks::CheckTasks::reload`]) keep their results; every other check
    /// starts failing, as its restarted task does. Returns whether the record changed.
    pub fn reload(&mut self, config: &Standalone, unchanged: &BTreeSet<CheckKey>) -> bool {
        let kept: BTreeMap<(String, String), bool> = self
            .meta
            .groups
            .iter()
            .flat_map(|(g, h)| {
                h.checks
                    .iter()
                    .filter(|c| unchanged.contains(&CheckKey::new(g, &c.name)))
                    .map(move |c| ((g.clone(), c.name.clone()), c.passing))
            })
            .collect();
        let groups = groups(&self.meta.node, config, &kept);
        self.settle_after = config
            .groups
            .iter()
            .map(|g| g.preempt_delay)
            .max()
            .unwrap_or_default();
        if groups == self.meta.groups {
            return false;
        }
        self.meta.groups = groups;
        self.meta.version += 1;
        true
    }
}

fn groups(
    node: &str,
    config: &Standalone,
    kept: &BTreeMap<(String, String), bool>,
) -> BTreeMap<String, GroupHealth> {
    config
        .groups
        .iter()
        .map(|g| {
            let checks = g
                .checks
                .iter()
                .map(|c| CheckResult {
                    name: c.name.clone(),
                    passing: kept
                        .get(&(g.name.clone(), c.name.clone()))
                        .copied()
                        .unwrap_or(false),
                    weight: c.weight,
                })
                .collect();
            (
                g.name.clone(),
                GroupHealth {
                    priority: g.priority.of(node),
                    checks,
                },
            )
        })
        .collect()
}

/// A check across reloads: its group's name and its own (both unique, so stable when checks or
/// groups are reordered).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CheckKey {
    /// The group's name.
    pub group: String,
    /// The check's name, unique within its group.
    pub check: String,
}

impl CheckKey {
    /// The key of `check` in group `group`.
    pub fn new(group: &str, check: &str) -> CheckKey {
        CheckKey {
            group: group.to_string(),
            check: check.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(preempt: &str) -> Standalone {
        Standalone::parse(&format!(
            "cluster: c\nbind: 192.0.2.10\ninsecure: true\ngroups: [{{name: api, addresses: [192.0.2.100], preemptDelay: {preempt}, priority: {{n1: 50, default: 40}}, checks: [{{name: lb, tcp: 'h:1', weight: 20}}, {{name: be, tcp: 'h:2'}}]}}]"
        ))
        .unwrap()
    }

    #[test]
    fn first_record_has_priority_failing_checks_and_is_unsettled() {
        let now = Instant::now();
        let s = LocalState::new("n1", &config("10s"), now);
        let g = &s.meta().groups["api"];
        assert_eq!(g.priority, 50);
        assert_eq!(
            g.checks
                .iter()
                .map(|c| (c.name.as_str(), c.passing, c.weight))
                .collect::<Vec<_>>(),
            [("lb", false, 20), ("be", false, 0)]
        );
        assert!(!s.meta().settled);
        assert_eq!(s.settles_at(), Some(now + Duration::from_secs(10)));
        assert_eq!(
            LocalState::new("n2", &config("10s"), now).meta().groups["api"].priority,
            40
        );
    }

    #[test]
    fn settles_after_the_preempt_delay_and_bumps_the_version() {
        let now = Instant::now();
        let mut s = LocalState::new("n1", &config("10s"), now);
        assert!(!s.tick(now + Duration::from_secs(9)));
        assert!(s.tick(now + Duration::from_secs(10)));
        assert!(s.meta().settled);
        assert_eq!(s.meta().version, 2);
        assert!(!s.tick(now + Duration::from_secs(11)));
        assert_eq!(s.settles_at(), None);
    }

    #[test]
    fn a_rejoin_starts_the_preempt_delay_again() {
        let now = Instant::now();
        let mut s = LocalState::new("n1", &config("10s"), now);
        assert!(s.tick(now + Duration::from_secs(10)));
        let back = now + Duration::from_secs(60);
        assert!(s.rejoined(back));
        assert!(!s.meta().settled);
        assert_eq!(s.settles_at(), Some(back + Duration::from_secs(10)));
        assert!(s.tick(back + Duration::from_secs(10)));
        let mut zero = LocalState::new("n1", &config("0s"), now);
        assert!(
            !zero.rejoined(back),
            "without a delay the node stays settled"
        );
        assert!(zero.meta().settled);
    }

    #[test]
    fn a_speaker_without_groups_settles_after_its_delay() {
        let now = Instant::now();
        let mut s = LocalState::with_groups("n1", BTreeMap::new(), Duration::from_secs(2), now);
        assert!(s.meta().groups.is_empty());
        assert_eq!(s.settles_at(), Some(now + Duration::from_secs(2)));
        assert!(s.tick(now + Duration::from_secs(2)));
    }

    #[test]
    fn zero_delay_is_settled_at_once() {
        assert!(
            LocalState::new("n1", &config("0s"), Instant::now())
                .meta()
                .settled
        );
    }

    #[test]
    fn check_changes_bump_the_version_once() {
        let mut s = LocalState::new("n1", &config("0s"), Instant::now());
        assert!(s.set_check("api", "lb", true));
        assert!(!s.set_check("api", "lb", true));
        assert!(!s.set_check("nope", "lb", true));
        assert!(!s.set_check("api", "nope", true));
        assert_eq!(s.meta().version, 2);
        assert!(s.drain());
        assert!(!s.drain());
        assert_eq!(s.meta().version, 3);
    }

    #[test]
    fn reload_keeps_results_of_unchanged_checks() {
        let mut s = LocalState::new("n1", &config("0s"), Instant::now());
        s.set_check("api", "lb", true);
        s.set_check("api", "be", true);
        let both = BTreeSet::from([CheckKey::new("api", "lb"), CheckKey::new("api", "be")]);
        assert!(
            !s.reload(&config("0s"), &both),
            "same configuration, same record"
        );
        assert!(s.meta().groups["api"].checks[0].passing);
    }

    #[test]
    fn reload_resets_restarted_checks_to_failing_like_their_new_tasks() {
        let mut s = LocalState::new("n1", &config("0s"), Instant::now());
        s.set_check("api", "lb", true);
        s.set_check("api", "be", true);
        let version = s.meta().version;
        let only_be = BTreeSet::from([CheckKey::new("api", "be")]);
        assert!(s.reload(&config("0s"), &only_be));
        let checks = &s.meta().groups["api"].checks;
        assert_eq!(
            checks
                .iter()
                .map(|c| (c.name.as_str(), c.passing))
                .collect::<Vec<_>>(),
            [("lb", false), ("be", true)]
        );
        assert_eq!(s.meta().version, version + 1);
    }
}
