//! The faults the checker plays, their menu, and the run of one schedule with the properties
//! checked every [`SAMPLE`].

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use super::world::{Port, World, name};
use crate::model::election::Election;
use crate::model::membership::{LiveSet, MemberMeta};

/// How often the properties are looked at.
pub const SAMPLE: Duration = Duration::from_millis(10);
/// When the faults may start: every member has joined and answers by then (the start-up
/// hold's grace is 3 s).
pub const WARM: Duration = Duration::from_secs(4);
/// Two members may answer one VIP this long (the chaos runs' `LIMIT`).
pub const DUAL_LIMIT: Duration = Duration::from_secs(1);
/// After the last fault event, the members have this long to agree (the chaos runs' `SETTLE`).
pub const SETTLE: Duration = Duration::from_secs(2);
/// How long the run goes on after the last fault event (past an accusation's 5 s lapse).
pub const TAIL: Duration = Duration::from_secs(7);

/// One fault: what it does when it starts, and when and how it ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// SIGSTOP for that long, then SIGCONT.
    Pause { node: usize, ms: u64 },
    /// SIGKILL, and the daemon started again that much later (a renewed identity).
    Kill { node: usize, restart_ms: u64 },
    /// `port` cut from `from` to `to` (and back when `both`) for that long.
    Cut {
        from: usize,
        to: usize,
        port: Option<Port>,
        both: bool,
        ms: u64,
    },
    /// The watch datagrams from `from` to `to` delayed by `extra_ms` for `ms`.
    Delay {
        from: usize,
        to: usize,
        extra_ms: u64,
        ms: u64,
    },
}

impl Fault {
    /// How long after its start the fault's last event comes.
    pub fn span(&self) -> Duration {
        Duration::from_millis(match *self {
            Fault::Pause { ms, .. } | Fault::Cut { ms, .. } | Fault::Delay { ms, .. } => ms,
            Fault::Kill { restart_ms, .. } => restart_ms,
        })
    }

    /// The fault's start (`true`) or end in `world`.
    fn act(&self, world: &mut World, start: bool) {
        let now = world.now();
        match *self {
            Fault::Pause { node, ms } if start => {
                world.pause(node, now + Duration::from_millis(ms));
            }
            Fault::Pause { .. } => {}
            Fault::Kill { node, .. } if start => world.kill(node),
            Fault::Kill { node, .. } => world.restart(node),
            Fault::Cut {
                from,
                to,
                port,
                both,
                ..
            } => {
                let ports = port.map_or(vec![Port::Gossip, Port::Watch], |p| vec![p]);
                for p in ports {
                    world.cut(from, to, p, start);
                    if both {
                        world.cut(to, from, p, start);
                    }
                }
            }
            Fault::Delay {
                from, to, extra_ms, ..
            } => {
                let extra = if start { extra_ms } else { 0 };
                world.delay(from, to, Duration::from_millis(extra));
            }
        }
    }
}

/// The menu of faults for `n` members: pauses (150 ms, 0.6 s, 2.2 s), kills (restarted at
/// once or 0.4 s later), cuts of the gossip, the watch or both, one way or both, short (0.3 s:
/// lost datagrams) or long (4.4 s), and watch datagrams delayed by 90 ms for a second.
pub fn menu(n: usize) -> Vec<Fault> {
    let mut faults = Vec::new();
    for node in 0..n {
        for ms in [150, 600, 2200] {
            faults.push(Fault::Pause { node, ms });
        }
        for restart_ms in [0, 400] {
            faults.push(Fault::Kill { node, restart_ms });
        }
    }
    for from in 0..n {
        for to in (0..n).filter(|to| *to != from) {
            for port in [Some(Port::Gossip), Some(Port::Watch), None] {
                for ms in [300, 4400] {
                    faults.push(Fault::Cut {
                        from,
                        to,
                        port,
                        both: false,
                        ms,
                    });
                    if from < to {
                        faults.push(Fault::Cut {
                            from,
                            to,
                            port,
                            both: true,
                            ms,
                        });
                    }
                }
            }
            faults.push(Fault::Delay {
                from,
                to,
                extra_ms: 90,
                ms: 1000,
            });
        }
    }
    faults
}

/// A schedule: each fault with its start, after the previous fault's start.
pub type Schedule = Vec<(Duration, Fault)>;

/// What a run broke.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    /// (b) Two or more members answered `ip` for longer than [`DUAL_LIMIT`], the mesh whole
    /// from [`SETTLE`] before the episode to its end (the chaos runs' excuse).
    Dual {
        ip: IpAddr,
        nodes: Vec<String>,
        from: Duration,
        to: Duration,
    },
    /// (a) [`SETTLE`] after the last fault event, a member names another owner than the rule.
    Named {
        at: Duration,
        node: String,
        ip: IpAddr,
        named: Option<String>,
        rule: Option<String>,
    },
    /// (a) [`SETTLE`] after the last fault event, not the rule's owner alone answers.
    Answered {
        at: Duration,
        ip: IpAddr,
        nodes: Vec<String>,
        rule: Option<String>,
    },
    /// (c) A member answered while its hold says it must not.
    Held { at: Duration, node: String },
}

/// The owner and the first successor of `vip` among `n` members, all settled.
pub fn line(n: usize, vip: IpAddr) -> (Option<usize>, Option<usize>) {
    let mut live = LiveSet::new();
    for i in 0..n {
        let mut meta = MemberMeta::new(name(i));
        meta.settled = true;
        live.upsert(meta);
    }
    let election = Election::new(name(0), super::world::snapshot(&[vip]), &live);
    let index = |node: &str| (0..n).find(|i| name(*i) == node);
    let owner = election.owner(&vip).and_then(index);
    let first = election.successor(&vip, &live).and_then(|s| index(&s));
    (owner, first)
}

/// Two VIPs for `n` members: the first pair of 192.0.2.100.. that one member owns both of,
/// with different first successors (the chaos moment's shape).
pub fn vips(n: usize) -> Vec<IpAddr> {
    let candidates: Vec<IpAddr> = (100..=250)
        .map(|h| IpAddr::V4(Ipv4Addr::new(192, 0, 2, h)))
        .collect();
    for (k, a) in candidates.iter().enumerate() {
        for b in &candidates[k + 1..] {
            let (oa, sa) = line(n, *a);
            let (ob, sb) = line(n, *b);
            if oa == ob && sa != sb {
                return vec![*a, *b];
            }
        }
    }
    candidates[..2].to_vec()
}

/// Plays `schedule` on `n` members serving `vips` from [`WARM`] on; returns what it broke
/// (empty: nothing) and the world at the end.
pub fn run(n: usize, vips: &[IpAddr], schedule: &Schedule) -> (Vec<Violation>, World) {
    let mut world = World::new(n, vips, 1);
    world.run_until(WARM);
    let mut events: Vec<(Duration, Fault, bool)> = Vec::new();
    let mut at = WARM;
    for (after, fault) in schedule {
        at += *after;
        events.push((at, *fault, true));
        events.push((at + fault.span(), *fault, false));
    }
    events.sort_by_key(|(at, _, start)| (*at, !*start));
    let last = events.last().map_or(WARM, |(at, _, _)| *at);
    let mut monitor = Monitor::default();
    let mut next = 0;
    while world.now() < last + TAIL {
        while let Some((at, fault, start)) = events.get(next).filter(|e| e.0 <= world.now()) {
            fault.act(&mut world, *start);
            let _ = at;
            next += 1;
        }
        let to = (world.now() + SAMPLE).min(events.get(next).map_or(Duration::MAX, |e| e.0));
        world.run_until(to.max(world.now() + Duration::from_millis(1)));
        monitor.look(&world, last + SETTLE);
    }
    monitor.close(&world);
    (monitor.violations, world)
}

/// Watches the properties as the run goes.
#[derive(Debug, Default)]
struct Monitor {
    /// Per VIP: since when two or more answer, and whether the mesh was cut meanwhile.
    dual: BTreeMap<IpAddr, (Duration, Vec<usize>, bool)>,
    /// When the mesh was last seen cut.
    last_cut: Option<Duration>,
    violations: Vec<Violation>,
}

impl Monitor {
    fn look(&mut self, world: &World, settled_from: Duration) {
        let now = world.now();
        let rule = world.rule();
        let cut = world.mesh_cut();
        if cut {
            self.last_cut = Some(now);
        }
        // As the chaos runs judge: an episode that starts within SETTLE of a cut is excused.
        let cut_lately = self
            .last_cut
            .is_some_and(|at| now.saturating_sub(at) <= SETTLE);
        for (ip, owner) in &rule {
            let answering = world.answering(ip);
            if answering.len() >= 2 {
                let entry = self
                    .dual
                    .entry(*ip)
                    .or_insert((now, answering.clone(), cut_lately));
                entry.2 |= cut;
                for i in &answering {
                    if !entry.1.contains(i) {
                        entry.1.push(*i);
                    }
                }
            } else if let Some(episode) = self.dual.remove(ip) {
                self.end_dual(*ip, episode, now);
            }
            if now >= settled_from {
                self.settled(world, *ip, owner, &answering);
            }
        }
        for i in (0..world.len()).filter(|i| world.active(*i)) {
            let node = world.node(i).expect("active");
            if !node.answering.is_empty() && node.hold.holding() {
                self.push(Violation::Held {
                    at: now,
                    node: name(i),
                });
            }
        }
    }

    fn settled(&mut self, world: &World, ip: IpAddr, rule: &Option<String>, answering: &[usize]) {
        let now = world.now();
        for i in (0..world.len()).filter(|i| world.active(*i)) {
            let named = world.named(i).and_then(|m| m.get(&ip).cloned().flatten());
            if named != *rule {
                self.push(Violation::Named {
                    at: now,
                    node: name(i),
                    ip,
                    named,
                    rule: rule.clone(),
                });
            }
        }
        let names: Vec<String> = answering.iter().map(|i| name(*i)).collect();
        if names.len() != 1 || Some(&names[0]) != rule.as_ref() {
            self.push(Violation::Answered {
                at: now,
                ip,
                nodes: names,
                rule: rule.clone(),
            });
        }
    }

    fn end_dual(
        &mut self,
        ip: IpAddr,
        (from, nodes, cut): (Duration, Vec<usize>, bool),
        to: Duration,
    ) {
        if !cut && to.saturating_sub(from) > DUAL_LIMIT {
            self.push(Violation::Dual {
                ip,
                nodes: nodes.iter().map(|i| name(*i)).collect(),
                from,
                to,
            });
        }
    }

    fn close(&mut self, world: &World) {
        let open: Vec<_> = std::mem::take(&mut self.dual).into_iter().collect();
        for (ip, episode) in open {
            self.end_dual(ip, episode, world.now());
        }
    }

    /// Keeps the first violation of each kind and member (a run reports what it broke, not
    /// every sample of it).
    fn push(&mut self, v: Violation) {
        let key = |v: &Violation| match v {
            Violation::Dual { ip, .. } => format!("dual {ip}"),
            Violation::Named { node, ip, .. } => format!("named {node} {ip}"),
            Violation::Answered { ip, .. } => format!("answered {ip}"),
            Violation::Held { node, .. } => format!("held {node}"),
        };
        if !self.violations.iter().any(|w| key(w) == key(&v)) {
            self.violations.push(v);
        }
    }
}
