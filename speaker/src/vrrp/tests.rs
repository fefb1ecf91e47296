//! The VRRP state on a virtual clock: who wins, Master_Down_Interval, priority 0.

use std::net::IpAddr;
use std::time::Duration;

use tokio::time::Instant;

use super::*;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn the_higher_priority_wins_then_the_higher_address() {
    let (low, high) = (ip("192.0.2.10"), ip("192.0.2.11"));
    assert!(wins((101, low), (100, Some(high))));
    assert!(!wins((99, high), (100, Some(low))));
    assert!(wins((100, high), (100, Some(low))));
    assert!(!wins((100, low), (100, Some(high))));
    // Compared as integers, not as text: .9 < .10.
    assert!(wins((100, ip("192.0.2.10")), (100, Some(ip("192.0.2.9")))));
    assert!(wins((100, ip("fe80::2")), (100, Some(ip("fe80::1")))));
    // No address of our own: every tie is lost.
    assert!(wins((100, low), (100, None)));
}

#[test]
fn skew_and_master_down_follow_the_rfc() {
    // RFC 9568 section 6.1: Skew_Time = ((256 - Priority) * Master_Adver_Interval) / 256.
    assert_eq!(skew(100, ms(1000)), ms(609) + Duration::from_micros(375));
    assert_eq!(
        master_down_interval(100, ms(100)),
        ms(300) + ms(60) + Duration::from_nanos(937_500)
    );
    assert_eq!(
        master_down_interval(254, ms(1000)),
        ms(3007) + Duration::from_micros(812) + Duration::from_nanos(500)
    );
    assert_eq!(interval_of(10), ms(100));
    assert_eq!(interval_of(0), ms(10));
}

#[test]
fn a_master_that_wins_is_held_until_master_down_interval() {
    let t0 = Instant::now();
    let me = Some(ip("192.0.2.12"));
    let keepalived = ip("192.0.2.10");
    let mut r = Router::default();
    r.heard(t0, keepalived, 101, 10);
    assert_eq!(r.winner(100, me).map(|(a, _)| a), Some(keepalived));
    // Heard again 100 ms later: the deadline moves.
    r.heard(t0 + ms(100), keepalived, 101, 10);
    let down = master_down_interval(100, ms(100));
    assert_eq!(r.next_deadline(100), Some(t0 + ms(100) + down));
    assert!(!r.expire(t0 + ms(100) + down - ms(1), 100));
    assert!(r.winner(100, me).is_some());
    assert!(r.expire(t0 + ms(100) + down, 100));
    assert_eq!(r.winner(100, me), None);
    assert_eq!(r.next_deadline(100), None);
}

#[test]
fn a_lower_master_does_not_hold_and_priority_zero_lets_go_at_once() {
    let t0 = Instant::now();
    let me = Some(ip("192.0.2.11"));
    let mut r = Router::default();
    r.heard(t0, ip("192.0.2.10"), 100, 10); // same priority, lower address
    r.heard(t0, ip("192.0.2.9"), 50, 10);
    assert_eq!(r.winner(100, me), None);
    r.heard(t0, ip("192.0.2.200"), 100, 10); // same priority, higher address
    assert_eq!(r.winner(100, me).map(|(a, _)| a), Some(ip("192.0.2.200")));
    r.heard(t0 + ms(5), ip("192.0.2.200"), 0, 10);
    assert_eq!(r.winner(100, me), None);
    // The best of several winners is named.
    r.heard(t0, ip("192.0.2.20"), 150, 10);
    r.heard(t0, ip("192.0.2.30"), 120, 10);
    assert_eq!(r.winner(100, me).map(|(a, _)| a), Some(ip("192.0.2.20")));
    // Our own advertisement never holds us.
    let mut own = Router::default();
    own.heard(t0, ip("192.0.2.11"), 200, 10);
    assert_eq!(own.winner(100, me), None);
}

#[test]
fn a_fellow_speaker_forgotten_lets_go_at_once_and_keepalived_holds_on() {
    let t0 = Instant::now();
    let me = Some(ip("192.0.2.12"));
    let (speaker, keepalived) = (ip("192.0.2.13"), ip("192.0.2.10"));
    let mut r = Router::default();
    r.heard(t0, speaker, 120, 10);
    r.heard(t0, keepalived, 50, 10);
    assert_eq!(r.winner(100, me).map(|(a, _)| a), Some(speaker));
    // The mesh declared the speaker dead 110 ms on: no Master_Down_Interval to wait.
    assert!(r.forget(&speaker));
    assert!(!r.forget(&speaker));
    assert_eq!(r.winner(100, me), None);
    assert!(!r.expire(t0 + ms(110), 100));
    assert_eq!(r.masters().keys().collect::<Vec<_>>(), [&keepalived]);
    // Wrongly accused: its next advertisement holds this node again.
    r.heard(t0 + ms(200), speaker, 120, 10);
    assert_eq!(r.winner(100, me).map(|(a, _)| a), Some(speaker));
    // A keepalived master that wins is not forgotten by the mesh's word: only by its own.
    r.heard(t0 + ms(200), keepalived, 150, 10);
    assert_eq!(r.winner(100, me).map(|(a, _)| a), Some(keepalived));
}

#[test]
fn a_yielded_address_is_silent_whoever_owns_it_and_answered_at_once_after() {
    use std::collections::BTreeSet;

    use crate::model::announcer::Schedule;
    use crate::model::engine::{Action, Engine, Input, Start};
    use crate::model::links::{Link, MAIN_TABLE, Route};
    use crate::model::membership::{GroupHealth, LiveSet, MemberMeta};
    use swimlb_config::standalone::Standalone;

    let t0 = Instant::now();
    let vip = ip("192.0.2.100");
    let config = Standalone::parse(
        "cluster: c\nnode: a\nbind: 192.0.2.10\ninsecure: true\n\
         groups: [{name: api, addresses: [192.0.2.100], vrrp: {vrid: 51}}]",
    )
    .expect("parses");
    let snapshot = crate::sources::standalone::snapshot(&config);
    let mut me = MemberMeta::new("a");
    me.groups.insert(
        "api".into(),
        GroupHealth {
            priority: 100,
            checks: vec![],
        },
    );
    me.settled = true;
    let mut live = LiveSet::new();
    live.upsert(me);
    let routes = vec![Route {
        dst: ip("192.0.2.0"),
        prefix_len: 24,
        ifindex: 2,
        gateway: None,
        table: MAIN_TABLE,
        metric: 0,
    }];
    let (mut engine, actions) = Engine::new(
        t0,
        Start {
            node: "a".into(),
            schedule: Schedule::default(),
            snapshot,
            live,
            links: vec![Link::ethernet(2, "eth0", [2, 0, 0, 0, 0, 2])],
            routes,
            hold: false,
        },
    );
    assert!(actions.iter().any(|a| matches!(a, Action::Answer { .. })));
    let actions = engine.handle(t0 + ms(1), Input::Yield(BTreeSet::from([vip])));
    assert!(
        actions
            .iter()
            .any(|a| matches!(a, Action::Silence { ip, .. } if *ip == vip))
    );
    assert!(!engine.answers(&vip));
    assert!(engine.election().owns(&vip), "still elected: only silent");
    let actions = engine.handle(t0 + ms(2), Input::Yield(BTreeSet::new()));
    assert!(
        actions
            .iter()
            .any(|a| matches!(a, Action::Answer { ip, .. } if *ip == vip))
    );
    assert!(
        actions
            .iter()
            .any(|a| matches!(a, Action::Announce { ip, .. } if *ip == vip))
    );
}
