//! The engine, driven input by input: every path that used to live only in the daemon loop.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::Duration;

use proptest::prelude::*;
use swimlb_proto::ethernet::MacAddr;
use tokio::time::Instant;

use super::*;
use crate::model::links::{Link, MAIN_TABLE, Route};
use crate::model::membership::{GroupHealth, LiveSet, MemberMeta};
use crate::model::snapshot::{Interfaces, ServedIp, Snapshot};

pub(crate) fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

const OTHER_MAC: MacAddr = MacAddr(2, 0, 0, 0, 0, 9);

fn link(index: u32, name: &str) -> Link {
    Link::ethernet(index, name, [2, 0, 0, 0, 0, index as u8])
}

/// eth0 (index 2) holds the connected route of 192.0.2.0/24 and 2001:db8::/64; eth1 (3) and
/// eth2 (4) have none.
fn net() -> (Vec<Link>, Vec<Route>) {
    let routes = vec![
        Route {
            dst: ip("192.0.2.0"),
            prefix_len: 24,
            ifindex: 2,
            gateway: None,
            table: MAIN_TABLE,
            metric: 0,
        },
        Route {
            dst: ip("2001:db8::"),
            prefix_len: 64,
            ifindex: 2,
            gateway: None,
            table: MAIN_TABLE,
            metric: 0,
        },
    ];
    (
        vec![link(2, "eth0"), link(3, "eth1"), link(4, "eth2")],
        routes,
    )
}

fn without(links: &[Link], name: &str) -> Vec<Link> {
    links.iter().filter(|l| l.name != name).cloned().collect()
}

/// A settled member of group `api` at `priority`, able to announce on eth0..eth2.
pub(crate) fn member(node: &str, priority: u8) -> MemberMeta {
    let mut m = MemberMeta::new(node);
    m.settled = true;
    m.groups.insert(
        "api".into(),
        GroupHealth {
            priority,
            checks: vec![],
        },
    );
    m.announce.links = ["eth0", "eth1", "eth2"].map(String::from).into();
    m
}

pub(crate) fn live(members: &[MemberMeta]) -> LiveSet {
    let mut set = LiveSet::new();
    for m in members {
        set.upsert(m.clone());
    }
    set
}

fn snapshot(entries: &[(&str, Interfaces)]) -> Snapshot {
    let mut s = Snapshot::new();
    for (a, interfaces) in entries {
        s.insert(ip(a), ServedIp::group("api", interfaces.clone()))
            .unwrap();
    }
    s
}

pub(crate) fn engine(
    now: Instant,
    node: &str,
    snapshot: Snapshot,
    members: &[MemberMeta],
) -> Engine {
    let (links, routes) = net();
    Engine::new(
        now,
        Start {
            node: node.into(),
            schedule: Schedule::default(),
            snapshot,
            live: live(members),
            links,
            routes,
            hold: false,
        },
    )
    .0
}

fn answers(actions: &[Action]) -> Vec<(IpAddr, Vec<String>)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Answer { ip, links } => Some((*ip, links.clone())),
            _ => None,
        })
        .collect()
}

fn silences(actions: &[Action]) -> Vec<(IpAddr, Vec<String>)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Silence { ip, links } => Some((*ip, links.clone())),
            _ => None,
        })
        .collect()
}

fn announcements(actions: &[Action]) -> Vec<(IpAddr, String)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Announce { ip, link } => Some((*ip, link.clone())),
            _ => None,
        })
        .collect()
}

fn statuses(actions: &[Action]) -> Vec<IpAddr> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Status { ip, .. } => Some(*ip),
            _ => None,
        })
        .collect()
}

fn links(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| s.to_string()).collect()
}

#[test]
fn the_owner_answers_on_its_link_and_announces_a_burst_at_start() {
    let t0 = Instant::now();
    let (l, r) = net();
    let (engine, actions) = Engine::new(
        t0,
        Start {
            node: "a".into(),
            schedule: Schedule::default(),
            snapshot: snapshot(&[("192.0.2.1", Interfaces::Default)]),
            live: live(&[member("a", 50), member("b", 40)]),
            links: l,
            routes: r,
            hold: false,
        },
    );
    assert_eq!(answers(&actions), [(ip("192.0.2.1"), links(&["eth0"]))]);
    assert_eq!(announcements(&actions).len(), 5);
    assert!(
        !actions.iter().any(|a| matches!(a, Action::Facts(_))),
        "nothing named, everything placed: the default facts stand"
    );
    assert!(engine.answers(&ip("192.0.2.1")));
    assert_eq!(engine.next_deadline(), Some(t0 + Duration::from_secs(5)));
    let (_, backup) = Engine::new(
        t0,
        Start {
            node: "b".into(),
            schedule: Schedule::default(),
            snapshot: snapshot(&[("192.0.2.1", Interfaces::Default)]),
            live: live(&[member("a", 50), member("b", 40)]),
            links: net().0,
            routes: net().1,
            hold: false,
        },
    );
    assert!(answers(&backup).is_empty());
    assert_eq!(statuses(&backup), [ip("192.0.2.1")]);
}

#[test]
fn a_dead_owner_moves_only_its_ips_and_reports_only_those() {
    let t0 = Instant::now();
    // 20 IPs; with equal priorities the hash spreads them over a, b and c.
    let entries: Vec<(String, Interfaces)> = (1..=20)
        .map(|i| (format!("192.0.2.{i}"), Interfaces::Default))
        .collect();
    let entries: Vec<(&str, Interfaces)> = entries
        .iter()
        .map(|(a, i)| (a.as_str(), i.clone()))
        .collect();
    let members = [member("a", 50), member("b", 50), member("c", 50)];
    let mut b = engine(t0, "b", snapshot(&entries), &members);
    let owned_by_a: BTreeSet<IpAddr> = b
        .election()
        .outcomes()
        .iter()
        .filter(|(_, o)| o.owner() == Some("a"))
        .map(|(ip, _)| *ip)
        .collect();
    assert!(!owned_by_a.is_empty());
    let actions = b.handle(
        t0 + ms(100),
        Input::Member {
            node: "a".into(),
            record: None,
            joined: false,
        },
    );
    let reported: BTreeSet<IpAddr> = statuses(&actions).into_iter().collect();
    assert_eq!(reported, owned_by_a, "status deltas for the moved IPs only");
    let taken: BTreeSet<IpAddr> = answers(&actions).into_iter().map(|(ip, _)| ip).collect();
    assert!(taken.is_subset(&owned_by_a));
    assert!(!taken.is_empty(), "b takes some of a's IPs");
    assert_eq!(announcements(&actions).len(), 5 * taken.len());
    assert!(silences(&actions).is_empty());
}

#[test]
fn silences_come_before_answers_and_announcements() {
    let t0 = Instant::now();
    let s = snapshot(&[
        ("192.0.2.1", Interfaces::named(["eth1"])),
        ("192.0.2.2", Interfaces::named(["eth2"])),
    ]);
    let mut a = engine(t0, "a", s, &[member("a", 50)]);
    // eth1 goes and the snapshot swaps interfaces in one step: silence first.
    let (l, r) = net();
    let actions = a.handle(
        t0 + ms(10),
        Input::Net {
            links: without(&l, "eth1"),
            routes: r,
        },
    );
    let first_other = actions
        .iter()
        .position(|a| !matches!(a, Action::Silence { .. } | Action::Facts(_)))
        .unwrap();
    assert!(
        actions[first_other..]
            .iter()
            .all(|a| !matches!(a, Action::Silence { .. })),
        "{actions:?}"
    );
    assert_eq!(silences(&actions), [(ip("192.0.2.1"), links(&["eth1"]))]);
}

#[test]
fn a_drain_keeps_answering_until_the_successor_announces() {
    let t0 = Instant::now();
    let s = snapshot(&[
        ("192.0.2.1", Interfaces::Default),
        ("192.0.2.2", Interfaces::Default),
    ]);
    let mut a = engine(t0, "a", s, &[member("a", 50), member("b", 40)]);
    assert_eq!(a.answering().len(), 2);
    assert!(a.handle(t0 + ms(1), Input::Drain).is_empty());
    assert!(a.draining());
    // Our own draining record arrives: the election names b, but a keeps answering.
    let mut draining = member("a", 50);
    draining.draining = true;
    draining.version = 2;
    let actions = a.handle(
        t0 + ms(2),
        Input::Member {
            node: "a".into(),
            record: Some(draining),
            joined: false,
        },
    );
    assert!(silences(&actions).is_empty());
    assert_eq!(a.election().owner(&ip("192.0.2.1")), Some("b"));
    let actions = a.handle(
        t0 + ms(50),
        Input::Conflict {
            ip: ip("192.0.2.1"),
            mac: OTHER_MAC,
        },
    );
    assert_eq!(silences(&actions), [(ip("192.0.2.1"), links(&["eth0"]))]);
    assert!(!actions.contains(&Action::Drained));
    let actions = a.handle(
        t0 + ms(60),
        Input::Conflict {
            ip: ip("192.0.2.2"),
            mac: OTHER_MAC,
        },
    );
    assert_eq!(silences(&actions).len(), 1);
    assert!(actions.contains(&Action::Drained), "{actions:?}");
    assert_eq!(a.next_deadline(), None);
    assert!(
        a.handle(t0 + ms(5000), Input::Tick).is_empty(),
        "drained once"
    );
}

#[test]
fn a_drain_ends_at_its_deadline_when_no_successor_announces() {
    let t0 = Instant::now();
    let s = snapshot(&[("192.0.2.1", Interfaces::Default)]);
    let mut a = engine(t0, "a", s, &[member("a", 50)]);
    a.handle(t0, Input::Drain);
    assert_eq!(a.next_deadline(), Some(t0 + DRAIN_DEADLINE));
    assert!(a.handle(t0 + ms(2999), Input::Tick).is_empty());
    let actions = a.handle(t0 + DRAIN_DEADLINE, Input::Tick);
    assert_eq!(
        actions,
        [
            Action::Notice(Notice::DrainDeadline { left: 1 }),
            Action::Drained
        ]
    );
    let empty = engine(t0, "b", Snapshot::new(), &[member("b", 50)]).handle(t0, Input::Drain);
    assert_eq!(empty, [Action::Drained], "nothing to hand over");
}

#[test]
fn a_reload_leaves_unchanged_ips_alone_and_rehomes_a_changed_interface() {
    let t0 = Instant::now();
    let before = snapshot(&[
        ("192.0.2.1", Interfaces::Default),
        ("192.0.2.2", Interfaces::named(["eth1"])),
    ]);
    let mut a = engine(t0, "a", before, &[member("a", 50)]);
    let after = snapshot(&[
        ("192.0.2.1", Interfaces::Default),
        ("192.0.2.2", Interfaces::named(["eth2"])),
        ("192.0.2.3", Interfaces::Default),
    ]);
    let actions = a.handle(t0 + ms(10), Input::Snapshot(after));
    assert_eq!(silences(&actions), [(ip("192.0.2.2"), links(&["eth1"]))]);
    assert_eq!(
        answers(&actions),
        [
            (ip("192.0.2.2"), links(&["eth2"])),
            (ip("192.0.2.3"), links(&["eth0"]))
        ]
    );
    let announced: BTreeSet<(IpAddr, String)> = announcements(&actions).into_iter().collect();
    assert_eq!(
        announced,
        BTreeSet::from([
            (ip("192.0.2.2"), "eth2".to_string()),
            (ip("192.0.2.3"), "eth0".to_string())
        ])
    );
    assert!(
        actions.iter().all(|a| !matches!(a,
            Action::Status { ip, .. } | Action::Answer { ip, .. } | Action::Silence { ip, .. }
                if *ip == self::ip("192.0.2.1"))),
        "the unchanged IP is untouched: {actions:?}"
    );
}

#[test]
fn a_conflict_storm_gets_one_burst_per_second_and_a_trailing_one() {
    let t0 = Instant::now();
    let s = snapshot(&[("192.0.2.1", Interfaces::Default)]);
    let mut a = engine(t0, "a", s, &[member("a", 50)]);
    let mut bursts = Vec::new();
    let mut logged = 0;
    for i in 0..100u64 {
        let actions = a.handle(
            t0 + ms(i * 10),
            Input::Conflict {
                ip: ip("192.0.2.1"),
                mac: OTHER_MAC,
            },
        );
        logged += actions
            .iter()
            .filter(|a| matches!(a, Action::Notice(Notice::Conflict { .. })))
            .count();
        bursts.push(announcements(&actions).len());
    }
    // The first claim is answered with a burst at once; the 99 that follow within the second
    // are only counted.
    assert_eq!(bursts[0], 5, "{bursts:?}");
    assert_eq!(bursts.iter().sum::<usize>(), 5, "{bursts:?}");
    assert_eq!(logged, 1);
    let deadline = a.next_deadline().unwrap();
    assert_eq!(deadline, t0 + ms(1000));
    let trailing = a.handle(deadline, Input::Tick);
    assert_eq!(announcements(&trailing).len(), 5, "one trailing burst");
    // A second later, a new claim is answered at once.
    let later = a.handle(
        t0 + ms(2500),
        Input::Conflict {
            ip: ip("192.0.2.1"),
            mac: OTHER_MAC,
        },
    );
    assert_eq!(announcements(&later).len(), 5);
}

#[test]
fn a_lost_link_stops_answering_and_is_gossiped_and_its_return_is_too() {
    let t0 = Instant::now();
    let s = snapshot(&[("192.0.2.1", Interfaces::named(["eth1"]))]);
    let mut a = engine(t0, "a", s, &[member("a", 50), member("b", 40)]);
    assert_eq!(a.facts().links, BTreeSet::from(["eth1".to_string()]));
    let (l, r) = net();
    let mut down = l.clone();
    down[1].up = false;
    let actions = a.handle(
        t0 + ms(10),
        Input::Net {
            links: down,
            routes: r.clone(),
        },
    );
    assert_eq!(silences(&actions), [(ip("192.0.2.1"), links(&["eth1"]))]);
    assert!(actions.contains(&Action::Facts(AnnounceFacts::default())));
    assert!(
        actions.contains(&Action::Notice(Notice::Unplaced {
            ip: ip("192.0.2.1"),
            reason: NoInterface::NamedDown
        })),
        "{actions:?}"
    );
    // The gossip brings our own record with the facts: b is elected, a stays silent.
    let mut gossiped = member("a", 50);
    gossiped.announce = a.facts().clone();
    gossiped.version = 2;
    a.handle(
        t0 + ms(20),
        Input::Member {
            node: "a".into(),
            record: Some(gossiped.clone()),
            joined: false,
        },
    );
    assert_eq!(a.election().owner(&ip("192.0.2.1")), Some("b"));
    // The link returns: the facts say so; once gossiped, a (higher priority) takes it back.
    let actions = a.handle(
        t0 + ms(30),
        Input::Net {
            links: l,
            routes: r,
        },
    );
    assert!(answers(&actions).is_empty(), "not before the gossip");
    let Some(Action::Facts(facts)) = actions.iter().find(|a| matches!(a, Action::Facts(_))) else {
        panic!("no facts: {actions:?}");
    };
    gossiped.announce = facts.clone();
    gossiped.version = 3;
    let actions = a.handle(
        t0 + ms(40),
        Input::Member {
            node: "a".into(),
            record: Some(gossiped),
            joined: false,
        },
    );
    assert_eq!(answers(&actions), [(ip("192.0.2.1"), links(&["eth1"]))]);
}

#[test]
fn a_held_engine_answers_nothing_until_released() {
    let t0 = Instant::now();
    let (l, r) = net();
    let (mut a, actions) = Engine::new(
        t0,
        Start {
            node: "a".into(),
            schedule: Schedule::default(),
            snapshot: snapshot(&[("192.0.2.1", Interfaces::Default)]),
            live: live(&[member("a", 50)]),
            links: l,
            routes: r,
            hold: true,
        },
    );
    assert!(answers(&actions).is_empty());
    let actions = a.handle(t0 + ms(5), Input::Hold(false));
    assert_eq!(answers(&actions), [(ip("192.0.2.1"), links(&["eth0"]))]);
    let actions = a.handle(t0 + ms(6), Input::Hold(true));
    assert_eq!(silences(&actions), [(ip("192.0.2.1"), links(&["eth0"]))]);
}

#[test]
fn a_joining_member_gets_one_more_burst_of_what_we_own() {
    let t0 = Instant::now();
    let s = snapshot(&[("192.0.2.1", Interfaces::Default)]);
    let mut a = engine(t0, "a", s, &[member("a", 50)]);
    a.handle(t0 + ms(5000), Input::Tick);
    let actions = a.handle(
        t0 + ms(9000),
        Input::Member {
            node: "b".into(),
            record: Some(member("b", 40)),
            joined: true,
        },
    );
    assert_eq!(announcements(&actions).len(), 5);
}

fn takeovers(actions: &[Action]) -> Vec<(IpAddr, NodeName)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Notice(Notice::TookOver { ip, from }) => Some((*ip, from.clone())),
            _ => None,
        })
        .collect()
}

fn down(node: &str) -> Input {
    Input::Member {
        node: node.into(),
        record: None,
        joined: false,
    }
}

fn changed(record: MemberMeta) -> Input {
    Input::Member {
        node: record.node.clone(),
        record: Some(record),
        joined: false,
    }
}

#[test]
fn a_takeover_from_a_dead_owner_is_told_once_right_after_its_first_announcement() {
    let t0 = Instant::now();
    let s = snapshot(&[("192.0.2.1", Interfaces::Default)]);
    let members = [member("a", 50), member("b", 40)];
    let (_, at_start) = Engine::new(
        t0,
        Start {
            node: "a".into(),
            schedule: Schedule::default(),
            snapshot: s.clone(),
            live: live(&members),
            links: net().0,
            routes: net().1,
            hold: false,
        },
    );
    assert_eq!(announcements(&at_start).len(), 5);
    assert!(takeovers(&at_start).is_empty(), "owning at start-up");
    let mut b = engine(t0, "b", s, &members);
    let actions = b.handle(t0 + ms(700), down("a"));
    assert_eq!(
        takeovers(&actions),
        [(ip("192.0.2.1"), "a".to_string())],
        "{actions:?}"
    );
    let told = actions
        .iter()
        .position(|a| matches!(a, Action::Notice(Notice::TookOver { .. })))
        .unwrap();
    let first_announcement = actions
        .iter()
        .position(|a| matches!(a, Action::Announce { .. }))
        .unwrap();
    assert!(first_announcement < told, "{actions:?}");
    // The second burst and a conflict's burst are no takeover.
    assert_eq!(b.next_deadline(), Some(t0 + ms(5700)));
    let second = b.handle(t0 + ms(5700), Input::Tick);
    assert_eq!(announcements(&second).len(), 5);
    let conflict = b.handle(
        t0 + ms(5800),
        Input::Conflict {
            ip: ip("192.0.2.1"),
            mac: OTHER_MAC,
        },
    );
    assert!(!announcements(&conflict).is_empty());
    assert!(takeovers(&second).is_empty() && takeovers(&conflict).is_empty());
}

#[test]
fn taking_over_from_a_live_owner_is_no_failover() {
    let t0 = Instant::now();
    let s = snapshot(&[("192.0.2.1", Interfaces::Default)]);
    // a outranks b until its priority drops (a check failing): b preempts a live member.
    let mut b = engine(t0, "b", s.clone(), &[member("a", 50), member("b", 40)]);
    let mut lower = member("a", 30);
    lower.version = 2;
    let actions = b.handle(t0 + ms(10), changed(lower));
    assert_eq!(announcements(&actions).len(), 5);
    assert!(takeovers(&actions).is_empty(), "{actions:?}");
    // a drains: its handover is graceful (it answers until b announces), then it leaves.
    let mut b = engine(t0, "b", s, &[member("a", 50), member("b", 40)]);
    let mut draining = member("a", 50);
    draining.draining = true;
    draining.version = 2;
    let actions = b.handle(t0 + ms(10), changed(draining));
    assert_eq!(announcements(&actions).len(), 5);
    let left = b.handle(t0 + ms(20), down("a"));
    assert!(
        takeovers(&actions).is_empty() && takeovers(&left).is_empty(),
        "{actions:?} {left:?}"
    );
}

#[test]
fn a_takeover_held_back_is_told_when_first_announced_and_forgotten_if_the_ip_moves_on() {
    let t0 = Instant::now();
    let s = snapshot(&[("192.0.2.1", Interfaces::Default)]);
    let held = |s: Snapshot| {
        Engine::new(
            t0,
            Start {
                node: "b".into(),
                schedule: Schedule::default(),
                snapshot: s,
                live: live(&[member("a", 50), member("b", 40)]),
                links: net().0,
                routes: net().1,
                hold: true,
            },
        )
        .0
    };
    let mut b = held(s.clone());
    let while_held = b.handle(t0 + ms(10), down("a"));
    assert!(announcements(&while_held).is_empty() && takeovers(&while_held).is_empty());
    let released = b.handle(t0 + ms(900), Input::Hold(false));
    assert_eq!(takeovers(&released), [(ip("192.0.2.1"), "a".to_string())]);
    // a comes back before b announced: the IP is a's again and the takeover is forgotten, so
    // b's later preemption of a live a is told as nothing.
    let mut b = held(s);
    b.handle(t0 + ms(10), down("a"));
    b.handle(
        t0 + ms(20),
        Input::Member {
            node: "a".into(),
            record: Some(member("a", 50)),
            joined: true,
        },
    );
    let released = b.handle(t0 + ms(900), Input::Hold(false));
    assert!(answers(&released).is_empty());
    let mut lower = member("a", 30);
    lower.version = 2;
    let preempted = b.handle(t0 + ms(1000), changed(lower));
    assert_eq!(announcements(&preempted).len(), 5);
    assert!(takeovers(&preempted).is_empty(), "{preempted:?}");
}

#[test]
fn a_resynchronised_live_set_without_the_owner_is_a_takeover() {
    let t0 = Instant::now();
    let s = snapshot(&[("192.0.2.1", Interfaces::Default)]);
    let mut b = engine(t0, "b", s, &[member("a", 50), member("b", 40)]);
    let actions = b.handle(t0 + ms(10), Input::Live(live(&[member("b", 40)])));
    assert_eq!(takeovers(&actions), [(ip("192.0.2.1"), "a".to_string())]);
}

#[test]
fn the_new_owner_times_the_failover_from_the_last_datagram_of_the_old_one() {
    let t0 = Instant::now();
    let s = snapshot(&[("192.0.2.1", Interfaces::Default)]);
    let members = [member("a", 50), member("b", 40)];
    let mut registry = prometheus_client::registry::Registry::default();
    let failovers = crate::run::daemon::FailoverMetrics::register(&mut registry);
    let heard_a = t0 + ms(100);
    let last_heard = |node: &str| (node == "a").then_some(heard_a);
    let (mut b, at_start) = Engine::new(
        t0,
        Start {
            node: "b".into(),
            schedule: Schedule::default(),
            snapshot: s.clone(),
            live: live(&members),
            links: net().0,
            routes: net().1,
            hold: false,
        },
    );
    let (_, a_at_start) = Engine::new(
        t0,
        Start {
            node: "a".into(),
            schedule: Schedule::default(),
            snapshot: s,
            live: live(&members),
            links: net().0,
            routes: net().1,
            hold: false,
        },
    );
    for actions in [&at_start, &a_at_start] {
        assert!(
            crate::run::daemon::observe_takeovers(actions, t0, last_heard, &failovers).is_empty()
        );
    }
    let text = crate::serve::http::metrics_text(&registry);
    assert!(text.contains("swimlb_failover_seconds_count 0\n"), "{text}");

    let actions = b.handle(t0 + ms(790), down("a"));
    let timed =
        crate::run::daemon::observe_takeovers(&actions, t0 + ms(800), last_heard, &failovers);
    assert_eq!(
        timed,
        [(ip("192.0.2.1"), &"a".to_string(), Some(ms(700)))],
        "from a's last datagram to b's first announcement"
    );
    let text = crate::serve::http::metrics_text(&registry);
    assert!(text.contains("swimlb_failover_seconds_count 1\n"), "{text}");
    assert!(text.contains("swimlb_failover_seconds_sum 0.7\n"), "{text}");
    assert!(
        text.contains(r#"swimlb_failover_seconds_bucket{le="0.64"} 0"#)
            && text.contains(r#"swimlb_failover_seconds_bucket{le="1.28"} 1"#),
        "{text}"
    );
    // A previous owner never heard from directly is not timed.
    let never = crate::run::daemon::observe_takeovers(&actions, t0 + ms(800), |_| None, &failovers);
    assert_eq!(never, [(ip("192.0.2.1"), &"a".to_string(), None)]);
    assert!(
        crate::serve::http::metrics_text(&registry).contains("swimlb_failover_seconds_count 1\n")
    );
}

/// `192.0.2.1` served on eth0 by the nodes of `only` alone (as an endpoint's nodes are).
fn served_only(only: &[&str]) -> Vec<(IpAddr, Option<Arc<ServedIp>>)> {
    let mut served = ServedIp::group("api", Interfaces::named(["eth0"]));
    served.nodes = crate::model::snapshot::NodeFilter::Only(Arc::new(
        only.iter().map(|n| n.to_string()).collect(),
    ));
    vec![(ip("192.0.2.1"), Some(Arc::new(served)))]
}

fn notices(actions: &[Action]) -> Vec<Notice> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Notice(n) => Some(n.clone()),
            _ => None,
        })
        .collect()
}

/// `a` owns 192.0.2.1 (its endpoint is on `a`) among live `a` and `b`.
fn owner_a(t0: Instant) -> Engine {
    let members = [member("a", 50), member("b", 50)];
    let mut a = engine(t0, "a", Snapshot::new(), &members);
    a.handle(t0, Input::Served(served_only(&["a"])));
    assert!(a.answers(&ip("192.0.2.1")));
    a
}

#[test]
fn an_ip_moved_to_a_live_member_is_answered_until_that_member_announces_it() {
    let t0 = Instant::now();
    let mut a = owner_a(t0);
    let vip = ip("192.0.2.1");
    let moved = a.handle(t0 + ms(100), Input::Served(served_only(&["b"])));
    assert!(silences(&moved).is_empty(), "{moved:?}");
    assert!(a.answers(&vip));
    assert_eq!(a.election().owner(&vip), Some("b"));
    // Still answered, no longer announced: nothing due but the hand-over's deadline.
    assert_eq!(a.next_deadline(), Some(t0 + ms(100) + HANDOVER_DEADLINE));
    let claimed = a.handle(
        t0 + ms(130),
        Input::Conflict {
            ip: vip,
            mac: OTHER_MAC,
        },
    );
    assert_eq!(silences(&claimed), vec![(vip, vec!["eth0".to_string()])]);
    assert_eq!(
        notices(&claimed),
        vec![Notice::HandedOver {
            ip: vip,
            mac: OTHER_MAC
        }]
    );
    assert!(!a.answers(&vip));
    assert_eq!(a.next_deadline(), None);
}

#[test]
fn a_hand_over_nobody_announces_ends_at_its_deadline() {
    let t0 = Instant::now();
    let mut a = owner_a(t0);
    let vip = ip("192.0.2.1");
    a.handle(t0 + ms(100), Input::Served(served_only(&["b"])));
    assert!(silences(&a.handle(t0 + ms(2000), Input::Tick)).is_empty());
    let late = a.handle(t0 + ms(100) + HANDOVER_DEADLINE, Input::Tick);
    assert_eq!(silences(&late), vec![(vip, vec!["eth0".to_string()])]);
    assert_eq!(notices(&late), vec![Notice::HandoverDeadline { ip: vip }]);
    assert!(!a.answers(&vip));
}

#[test]
fn a_successor_that_announced_first_or_no_successor_at_all_means_silence_at_once() {
    let t0 = Instant::now();
    let vip = ip("192.0.2.1");
    // b saw the move first and announced; a re-announced (a conflict), then saw it too.
    let mut a = owner_a(t0);
    a.handle(
        t0 + ms(50),
        Input::Conflict {
            ip: vip,
            mac: OTHER_MAC,
        },
    );
    let moved = a.handle(t0 + ms(100), Input::Served(served_only(&["b"])));
    assert_eq!(silences(&moved), vec![(vip, vec!["eth0".to_string()])]);
    // No ready endpoint anywhere: nobody to hand over to.
    let mut a = owner_a(t0);
    let gone = a.handle(t0 + ms(100), Input::Served(served_only(&[])));
    assert_eq!(silences(&gone), vec![(vip, vec!["eth0".to_string()])]);
    // The successor is not a live member.
    let mut a = owner_a(t0);
    let gone = a.handle(t0 + ms(100), Input::Served(served_only(&["c"])));
    assert_eq!(silences(&gone), vec![(vip, vec!["eth0".to_string()])]);
}

#[test]
fn an_ip_that_comes_back_during_its_hand_over_is_announced_again() {
    let t0 = Instant::now();
    let mut a = owner_a(t0);
    let vip = ip("192.0.2.1");
    a.handle(t0 + ms(100), Input::Served(served_only(&["b"])));
    let back = a.handle(t0 + ms(200), Input::Served(served_only(&["a"])));
    assert!(silences(&back).is_empty());
    assert!(
        announcements(&back).contains(&(vip, "eth0".to_string())),
        "{back:?}"
    );
    // Owned again: a claim is a conflict, not the end of a hand-over.
    let claimed = a.handle(
        t0 + ms(300),
        Input::Conflict {
            ip: vip,
            mac: OTHER_MAC,
        },
    );
    assert!(silences(&claimed).is_empty());
    assert!(a.answers(&vip));
}

fn moves(actions: &[Action]) -> Vec<(IpAddr, String, String)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Moved { ip, from, to } => Some((*ip, from.to_string(), to.to_string())),
            _ => None,
        })
        .collect()
}

fn moved(from: &str, to: &str) -> Input {
    Input::Moved {
        ip: ip("192.0.2.1"),
        from: from.into(),
        to: to.into(),
    }
}

#[test]
fn a_move_by_the_api_between_two_live_members_is_told_by_both_and_nobody_else() {
    let t0 = Instant::now();
    let vip = ip("192.0.2.1");
    let members = [member("a", 50), member("b", 50), member("c", 50)];
    for node in ["a", "b", "c"] {
        let mut e = engine(t0, node, Snapshot::new(), &members);
        e.handle(t0, Input::Served(served_only(&["a"])));
        let actions = e.handle(t0 + ms(10), Input::Served(served_only(&["b"])));
        let want = match node {
            "c" => vec![],
            _ => vec![(vip, "a".to_string(), "b".to_string())],
        };
        assert_eq!(moves(&actions), want, "{node}");
        // To a member that is not alive, or to nobody: nothing to tell.
        let gone = e.handle(t0 + ms(20), Input::Served(served_only(&["d"])));
        assert!(moves(&gone).is_empty(), "{node}: {gone:?}");
    }
}

#[test]
fn the_new_owner_told_of_a_move_answers_before_its_own_view_has_it() {
    let t0 = Instant::now();
    let vip = ip("192.0.2.1");
    let members = [member("a", 50), member("b", 50)];
    let mut b = engine(t0, "b", Snapshot::new(), &members);
    b.handle(t0, Input::Served(served_only(&["a"])));
    assert!(!b.answers(&vip));
    let told = b.handle(t0 + ms(100), moved("a", "b"));
    assert_eq!(answers(&told), vec![(vip, vec!["eth0".to_string()])]);
    assert!(announcements(&told).contains(&(vip, "eth0".to_string())));
    // Its own view catches up: nothing changes, nothing is announced again.
    let caught_up = b.handle(t0 + ms(300), Input::Served(served_only(&["b"])));
    assert!(answers(&caught_up).is_empty() && silences(&caught_up).is_empty());
    assert!(announcements(&caught_up).is_empty(), "{caught_up:?}");
    b.handle(t0 + ms(100) + MOVE_DEADLINE, Input::Tick);
    assert!(b.answers(&vip));
}

#[test]
fn the_old_owner_told_of_a_move_hands_over_before_its_own_view_has_it() {
    let t0 = Instant::now();
    let vip = ip("192.0.2.1");
    let mut a = owner_a(t0);
    let told = a.handle(t0 + ms(100), moved("a", "b"));
    assert!(silences(&told).is_empty());
    let claimed = a.handle(
        t0 + ms(102),
        Input::Conflict {
            ip: vip,
            mac: OTHER_MAC,
        },
    );
    assert_eq!(silences(&claimed), vec![(vip, vec!["eth0".to_string()])]);
    // The new owner announced before the word came: silent at once.
    let mut a = owner_a(t0);
    a.handle(
        t0 + ms(90),
        Input::Conflict {
            ip: vip,
            mac: OTHER_MAC,
        },
    );
    let told = a.handle(t0 + ms(100), moved("a", "b"));
    assert_eq!(silences(&told), vec![(vip, vec!["eth0".to_string()])]);
}

#[test]
fn a_told_move_this_node_does_not_come_to_see_ends_at_its_deadline() {
    let t0 = Instant::now();
    let vip = ip("192.0.2.1");
    let members = [member("a", 50), member("b", 50)];
    let mut b = engine(t0, "b", Snapshot::new(), &members);
    b.handle(t0, Input::Served(served_only(&["a"])));
    b.handle(t0 + ms(100), moved("a", "b"));
    assert!(b.answers(&vip));
    // Its own view still names a: it hands back to a, which must announce.
    let expired = b.handle(t0 + ms(100) + MOVE_DEADLINE, Input::Tick);
    assert!(silences(&expired).is_empty());
    let claimed = b.handle(
        t0 + ms(200) + MOVE_DEADLINE,
        Input::Conflict {
            ip: vip,
            mac: OTHER_MAC,
        },
    );
    assert_eq!(silences(&claimed), vec![(vip, vec!["eth0".to_string()])]);
}

#[test]
fn a_told_move_is_ignored_when_it_names_a_stranger_a_dead_member_or_an_old_owner() {
    let t0 = Instant::now();
    let vip = ip("192.0.2.1");
    let members = [member("a", 50), member("b", 50), member("c", 50)];
    let mut c = engine(t0, "c", Snapshot::new(), &members);
    c.handle(t0, Input::Served(served_only(&["a"])));
    assert!(c.handle(t0 + ms(10), moved("a", "b")).is_empty());
    let mut b = engine(t0, "b", Snapshot::new(), &members);
    b.handle(t0, Input::Served(served_only(&["a"])));
    // Not the owner b's view names, or a member b does not hold alive.
    assert!(b.handle(t0 + ms(10), moved("c", "b")).is_empty());
    assert!(b.handle(t0 + ms(10), moved("a", "d")).is_empty());
    assert!(!b.answers(&vip));
}

// The property: any sequence of inputs leaves the engine answering exactly what a fresh engine
// computes from the final facts, with the same status, once every move told has lapsed and
// every hand-over is over.

#[derive(Debug, Clone)]
enum Step {
    Up(usize, u8, bool),
    Down(usize),
    Serve(Vec<(u8, u8)>),
    /// One IP's entry alone ([`Input::Served`]): its interface, or gone.
    ServeOne(u8, Option<u8>),
    LinkUp(usize, bool),
    Hold(bool),
    Conflict(u8),
    /// A move told by a member: from, to, IP.
    Moved(usize, usize, u8),
    Tick(u64),
}

const NODES: [&str; 4] = ["a", "b", "c", "d"];
const IFACES: [&str; 3] = ["eth0", "eth1", "eth2"];

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (0..4usize, 1..100u8, any::<bool>()).prop_map(|(n, p, l)| Step::Up(n, p, l)),
        (0..4usize).prop_map(Step::Down),
        proptest::collection::vec((0..12u8, 0..4u8), 0..8).prop_map(Step::Serve),
        (0..12u8, proptest::option::of(0..4u8)).prop_map(|(h, i)| Step::ServeOne(h, i)),
        (0..3usize, any::<bool>()).prop_map(|(i, up)| Step::LinkUp(i, up)),
        any::<bool>().prop_map(Step::Hold),
        (0..12u8).prop_map(Step::Conflict),
        (0..4usize, 0..4usize, 0..12u8).prop_map(|(f, t, h)| Step::Moved(f, t, h)),
        (0..3000u64).prop_map(Step::Tick),
    ]
}

/// The facts a sequence of steps leaves, to start a fresh engine from.
struct World {
    live: LiveSet,
    snapshot: Snapshot,
    links: Vec<Link>,
    routes: Vec<Route>,
    hold: bool,
    version: u64,
}

fn served_ip(iface: u8) -> ServedIp {
    let interfaces = match iface {
        3 => Interfaces::Default,
        i => Interfaces::named([IFACES[usize::from(i)]]),
    };
    ServedIp::group("api", interfaces)
}

fn served(entries: &[(u8, u8)]) -> Snapshot {
    let mut s = Snapshot::new();
    for (host, iface) in entries {
        let _ = s.insert(IpAddr::from([192, 0, 2, *host]), served_ip(*iface));
    }
    s
}

impl World {
    fn input(&mut self, engine: &Engine, step: &Step) -> Input {
        match step {
            Step::Up(n, priority, eth1) => {
                let mut m = member(NODES[*n], *priority);
                if !eth1 {
                    m.announce.links.remove("eth1");
                }
                if *n == 0 {
                    // Our own record carries what the engine reported.
                    m.announce = engine.facts().clone();
                }
                self.version += 1;
                m.version = self.version;
                self.live.remove(NODES[*n]);
                self.live.upsert(m.clone());
                Input::Member {
                    node: m.node.clone(),
                    record: Some(m),
                    joined: true,
                }
            }
            Step::Down(n) => {
                self.live.remove(NODES[*n]);
                Input::Member {
                    node: NODES[*n].into(),
                    record: None,
                    joined: false,
                }
            }
            Step::Serve(entries) => {
                self.snapshot = served(entries);
                Input::Snapshot(self.snapshot.clone())
            }
            Step::ServeOne(host, iface) => {
                let ip = IpAddr::from([192, 0, 2, *host]);
                let entry = iface.map(served_ip);
                self.snapshot.remove(&ip);
                if let Some(e) = &entry {
                    let _ = self.snapshot.insert(ip, e.clone());
                }
                Input::Served(vec![(ip, entry.map(Arc::new))])
            }
            Step::LinkUp(i, up) => {
                self.links[*i].up = *up;
                Input::Net {
                    links: self.links.clone(),
                    routes: self.routes.clone(),
                }
            }
            Step::Hold(hold) => {
                self.hold = *hold;
                Input::Hold(*hold)
            }
            Step::Conflict(host) => Input::Conflict {
                ip: IpAddr::from([192, 0, 2, *host]),
                mac: OTHER_MAC,
            },
            Step::Moved(from, to, host) => Input::Moved {
                ip: IpAddr::from([192, 0, 2, *host]),
                from: NODES[*from].into(),
                to: NODES[*to].into(),
            },
            Step::Tick(_) => Input::Tick,
        }
    }
}

proptest! {
    #[test]
    fn any_sequence_of_inputs_ends_where_a_fresh_engine_starts(
        steps in proptest::collection::vec(step(), 1..40)
    ) {
        let t0 = Instant::now();
        let (links, routes) = net();
        let mut world = World {
            live: live(&[member("a", 50)]),
            snapshot: served(&[(1, 3), (2, 1)]),
            links,
            routes,
            hold: false,
            version: 10,
        };
        let start = |w: &World| Start {
            node: "a".into(),
            schedule: Schedule::default(),
            snapshot: w.snapshot.clone(),
            live: w.live.clone(),
            links: w.links.clone(),
            routes: w.routes.clone(),
            hold: w.hold,
        };
        let (mut engine, _) = Engine::new(t0, start(&world));
        let mut now = t0;
        for step in &steps {
            if let Step::Tick(dt) = step {
                now += ms(*dt);
            }
            let input = world.input(&engine, step);
            engine.handle(now, input);
        }
        // Once every move told has lapsed and every hand-over is over.
        now += MOVE_DEADLINE;
        engine.handle(now, Input::Tick);
        now += HANDOVER_DEADLINE;
        engine.handle(now, Input::Tick);
        let (fresh, _) = Engine::new(now, start(&world));
        prop_assert_eq!(engine.answering(), fresh.answering());
        prop_assert_eq!(&engine.views, &fresh.views);
        prop_assert_eq!(engine.facts(), fresh.facts());
    }
}
