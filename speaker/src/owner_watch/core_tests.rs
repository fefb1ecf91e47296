//! [`WatchCore`]s passing sealed datagrams by hand on a virtual clock: deterministic, no
//! sockets. The lossy and timing-heavy cases run in `swimlb-lab sim`; these pin each rule.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use smol_str::SmolStr;
use swimlb_proto::heartbeat::{MessageType, NodeRef};
use swimlb_proto::{KeyRing, SealStream, WatchMessage};

use super::core::{Command, Event, FAREWELL_INTERVAL_MS, POLL_WAIT, Plan, WatchCore, watch_addr};
use super::metrics::{CheckResult, DropReason, WatchMetrics};
use super::worst_case_detection;
use crate::gossip::replay::sender_id;
use crate::gossip::{Directory, NodeIdentity};
use crate::model::watch_knobs::Knobs;

const MS: Duration = Duration::from_millis(1);

fn ring() -> KeyRing {
    KeyRing::new("watch-core-test", &[[3; 32]]).unwrap()
}

fn identity(i: usize, bump: u64) -> NodeIdentity {
    NodeIdentity {
        node: SmolStr::new(format!("n{i}")),
        addr: SocketAddr::from((Ipv4Addr::LOCALHOST, 20_000 + 2 * i as u16)),
        bump,
    }
}

fn name(i: usize) -> String {
    format!("n{i}")
}

/// Nodes `0..n` with cores, every datagram delivered at once unless `cut` says otherwise.
struct Lab {
    ids: Vec<NodeIdentity>,
    cores: Vec<Option<WatchCore>>,
    events: Vec<Vec<Event>>,
    now: Duration,
    /// Whether a datagram from one node to another is lost.
    cut: Box<dyn Fn(usize, usize, MessageType) -> bool>,
    /// Whether the claims and refutations queued for the gossip are delivered (as the gossip
    /// would, never cut).
    gossip: bool,
}

impl Lab {
    fn new(n: usize) -> Lab {
        let ids: Vec<NodeIdentity> = (0..n).map(|i| identity(i, 10)).collect();
        let mut lab = Lab {
            ids,
            cores: Vec::new(),
            events: vec![Vec::new(); n],
            now: Duration::from_secs(1),
            cut: Box::new(|_, _, _| false),
            gossip: false,
        };
        for i in 0..n {
            let core = lab.core_for(i, &[]);
            lab.cores.push(Some(core));
        }
        lab
    }

    fn directory_for(&self, i: usize) -> Directory {
        Arc::new(
            self.ids
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .map(|(_, id)| (id.node.to_string(), id.clone()))
                .collect(),
        )
    }

    fn plan(&self, i: usize, watchers: &[usize]) -> Plan {
        Plan {
            me: self.ids[i].clone(),
            watchers: watchers.iter().map(|w| name(*w)).collect(),
            held: false,
            accused: BTreeMap::new(),
        }
    }

    fn core_for(&self, i: usize, watchers: &[usize]) -> WatchCore {
        WatchCore::new(
            Knobs::default(),
            ring(),
            watch_addr(self.ids[i].addr).unwrap(),
            self.plan(i, watchers),
            self.directory_for(i),
            WatchMetrics::default(),
            i as u64,
            self.now,
        )
        .unwrap()
    }

    fn core(&self, i: usize) -> &WatchCore {
        self.cores[i].as_ref().unwrap()
    }

    fn command(&mut self, i: usize, command: Command) {
        let now = self.now;
        self.cores[i].as_mut().unwrap().command(now, command);
        self.deliver(i);
    }

    fn index_of(&self, addr: SocketAddr) -> Option<usize> {
        self.ids
            .iter()
            .position(|id| watch_addr(id.addr) == Some(addr))
    }

    /// Delivers what node `i` queued (and what that causes), and collects the events.
    fn deliver(&mut self, i: usize) {
        let mut queue = vec![i];
        while let Some(from) = queue.pop() {
            let Some(core) = self.cores[from].as_mut() else {
                continue;
            };
            self.events[from].extend(core.drain_events());
            let relays: Vec<_> = core.drain_relays().collect();
            let out: Vec<_> = core.drain_outgoing().collect();
            let from_addr = watch_addr(self.ids[from].addr).unwrap();
            // A relay request is for the gossip itself, which sends it to nobody.
            let request =
                |p: &Vec<u8>| matches!(WatchMessage::parse(p), Ok(WatchMessage::Relay { .. }));
            for payload in relays.iter().filter(|p| self.gossip && !request(p)) {
                for to in (0..self.cores.len()).filter(|to| *to != from) {
                    if let Some(core) = self.cores[to].as_mut() {
                        core.handle_relayed(self.now, self.ids[from].addr, payload);
                        queue.push(to);
                    }
                }
            }
            for mut datagram in out {
                let Some(to) = self.index_of(datagram.to) else {
                    continue;
                };
                let kind = message_type(&datagram.bytes);
                if (self.cut)(from, to, kind) {
                    continue;
                }
                if let Some(core) = self.cores[to].as_mut() {
                    core.handle_datagram(self.now, from_addr, &mut datagram.bytes);
                    queue.push(to);
                }
            }
        }
    }

    /// Runs every core's timers up to `now + span`, in 100 us steps.
    fn run_for(&mut self, span: Duration) {
        let end = self.now + span;
        while self.now < end {
            self.now += Duration::from_micros(100);
            for i in 0..self.cores.len() {
                let now = self.now;
                let Some(core) = self.cores[i].as_mut() else {
                    continue;
                };
                if core.next_deadline().is_some_and(|at| at <= now) {
                    core.tick(now);
                    self.deliver(i);
                }
            }
        }
    }

    /// Node `i`'s next timer fires 500 ms late, longer than a watcher waits: its watch pauses.
    fn pause(&mut self, i: usize) {
        let deadline = self.core(i).next_deadline().unwrap();
        let late = deadline + Duration::from_millis(500);
        self.cores[i].as_mut().unwrap().tick(late);
        self.deliver(i);
        assert!(self.core(i).paused());
    }

    /// Node 0, watched by node 1, is not scheduled for 500 ms; node 1 takes its IP over and
    /// claims it; node 2 accuses node 0 (it is not node 0's watcher: no heartbeat of node 0
    /// reaches it); node 0's daemon refutes while the watch is paused.
    fn claimed_during_a_pause(&mut self) {
        self.command(0, Command::Plan(self.plan(0, &[1])));
        self.run_for(Duration::from_secs(1));
        self.pause(0);
        let claim = Command::Claim {
            ip: IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)),
            accused: self.ids[0].clone(),
        };
        self.command(1, claim);
        let mut plan = self.plan(2, &[]);
        plan.accused.insert(name(0), 10);
        self.command(2, Command::Plan(plan));
        self.command(0, Command::Refute);
    }

    fn alive_events(&self, i: usize) -> usize {
        self.events[i]
            .iter()
            .filter(|e| matches!(e, Event::Alive { .. }))
            .count()
    }

    fn silent_events(&self, i: usize) -> Vec<&Event> {
        self.events[i]
            .iter()
            .filter(|e| matches!(e, Event::Silent { .. }))
            .collect()
    }
}

/// The message type of a sealed datagram, read with the test ring.
fn message_type(bytes: &[u8]) -> MessageType {
    let mut copy = bytes.to_vec();
    let opened = ring().open_envelope(&mut copy).unwrap();
    WatchMessage::parse(opened.payload).unwrap().message_type()
}

/// `message` sealed as the watch of node `i` would seal it, in `stream`.
fn sealed(stream: &mut SealStream, message: &WatchMessage<'_>) -> Vec<u8> {
    let mut payload = [0u8; swimlb_proto::heartbeat::MAX_LEN];
    let len = message.emit(&mut payload).unwrap();
    let mut out = Vec::new();
    ring()
        .seal_in(stream, None, &payload[..len], &mut out)
        .unwrap();
    out
}

fn stream_of(id: &NodeIdentity) -> SealStream {
    SealStream::new(sender_id(watch_addr(id.addr).unwrap()), id.bump).unwrap()
}

#[test]
fn a_living_owner_goes_fast_once_acknowledged_and_is_never_found_silent() {
    let mut lab = Lab::new(3);
    lab.command(0, Command::Plan(lab.plan(0, &[1])));
    lab.run_for(Duration::from_secs(3));
    let owner = lab.core(0).metrics();
    assert!(owner.received_of(MessageType::Ack) >= 1);
    // Fast: about 50 heartbeats a second once established.
    let beats = owner.sent_of(MessageType::Heartbeat);
    assert!((120..=160).contains(&beats), "{beats} heartbeats in 3 s");
    assert_eq!(lab.core(1).watched().collect::<Vec<_>>(), vec!["n0"]);
    assert!(lab.events.iter().all(Vec::is_empty), "{:?}", lab.events);
    assert_eq!(lab.core(1).metrics().sent_of(MessageType::Poll), 0);
}

#[test]
fn a_crashed_owner_is_found_silent_after_a_failed_second_check_within_the_worst_case() {
    let mut lab = Lab::new(3);
    lab.command(0, Command::Plan(lab.plan(0, &[1])));
    lab.run_for(Duration::from_secs(2));
    let crashed = lab.now;
    lab.cores[0] = None;
    lab.run_for(Duration::from_millis(300));
    let silent = lab.silent_events(1);
    assert_eq!(silent.len(), 1, "{:?}", lab.events[1]);
    let Event::Silent { owner, silent_for } = silent[0] else {
        unreachable!()
    };
    assert_eq!(*owner, lab.ids[0]);
    assert!(*silent_for <= worst_case_detection(&Knobs::default()) + MS);
    let watcher = lab.core(1).metrics();
    // Two rounds: a poll to the owner and a relay through the third node each.
    assert_eq!(watcher.sent_of(MessageType::Poll), 2);
    assert_eq!(watcher.sent_of(MessageType::Relay), 2);
    assert_eq!(lab.core(2).metrics().sent_of(MessageType::Poll), 2);
    assert_eq!(watcher.checks(CheckResult::Silent), 1);
    assert!(lab.now - crashed > *silent_for);
}

/// Node 0 watched by nodes 1 and 2 (its first and second successors) crashes: node 2, not yet
/// its successor, hears it reported silent again with each new plan for a second (the plan a
/// daemon sends when the one before it in line is accused), and not after, nor once heard or
/// refuted.
#[test]
fn an_owner_found_silent_is_reported_again_with_each_plan_for_a_second() {
    let mut lab = Lab::new(4);
    lab.command(0, Command::Plan(lab.plan(0, &[1, 2])));
    lab.run_for(Duration::from_secs(2));
    lab.cores[0] = None;
    lab.run_for(Duration::from_millis(300));
    assert_eq!(lab.silent_events(2).len(), 1, "{:?}", lab.events[2]);
    let mut plan = lab.plan(2, &[]);
    plan.accused.insert(name(1), 10);
    lab.command(2, Command::Plan(plan.clone()));
    let silent = lab.silent_events(2);
    assert_eq!(
        silent.len(),
        2,
        "reported again with the plan: {:?}",
        lab.events[2]
    );
    let Event::Silent { owner, silent_for } = silent[1] else {
        unreachable!()
    };
    assert_eq!(*owner, lab.ids[0]);
    assert!(*silent_for >= Duration::from_millis(300), "{silent_for:?}");
    // The same plan sent again (a member down meanwhile) reports it again too.
    lab.command(2, Command::Plan(plan.clone()));
    assert_eq!(lab.silent_events(2).len(), 3);
    // Older than a second: its second check is too old to act on.
    lab.run_for(super::core::SILENT_AGAIN_WITHIN);
    lab.command(2, Command::Plan(plan.clone()));
    assert_eq!(lab.silent_events(2).len(), 3, "{:?}", lab.events[2]);
    assert_eq!(lab.core(2).metrics().checks(CheckResult::Silent), 1);
    // An owner heard since is not silent: node 1, cut off from node 3 and back (its heartbeats
    // heard again), is not reported to node 3 with the next plan.
    let cut = std::rc::Rc::new(std::cell::Cell::new(false));
    let cutting = cut.clone();
    lab.cut = Box::new(move |from, _, _| from == 1 && cutting.get());
    lab.command(1, Command::Plan(lab.plan(1, &[3])));
    lab.run_for(Duration::from_millis(500));
    cut.set(true);
    lab.run_for(Duration::from_millis(300));
    assert_eq!(lab.silent_events(3).len(), 1, "{:?}", lab.events[3]);
    // Node 3 accuses node 1, which refutes through the gossip while its watch datagrams are
    // still cut: not reported again after that (else: taken over again, refuted again, a loop).
    lab.gossip = true;
    let mut accusing = lab.plan(3, &[]);
    accusing.accused.insert(name(1), 10);
    lab.command(3, Command::Plan(accusing.clone()));
    assert_eq!(lab.silent_events(3).len(), 2, "{:?}", lab.events[3]);
    lab.command(1, Command::Refute);
    assert_eq!(lab.alive_events(3), 1, "{:?}", lab.events[3]);
    lab.command(3, Command::Plan(accusing));
    assert_eq!(lab.silent_events(3).len(), 2, "{:?}", lab.events[3]);
    cut.set(false);
    lab.run_for(Duration::from_millis(100));
    lab.command(3, Command::Plan(lab.plan(3, &[])));
    assert_eq!(lab.silent_events(3).len(), 2, "{:?}", lab.events[3]);
}

#[test]
fn lost_heartbeats_are_vouched_for_by_the_second_check_through_the_relay() {
    let mut lab = Lab::new(3);
    lab.command(0, Command::Plan(lab.plan(0, &[1])));
    lab.run_for(Duration::from_secs(2));
    // The owner's heartbeats and its direct path to the watcher are lost; the relay's is not.
    lab.cut = Box::new(|from, to, _| (from, to) == (0, 1) || (from, to) == (1, 0));
    lab.run_for(Duration::from_millis(150));
    assert!(lab.silent_events(1).is_empty(), "{:?}", lab.events[1]);
    assert_eq!(lab.core(1).metrics().checks(CheckResult::Vouched), 1);
    assert!(lab.core(2).metrics().sent_of(MessageType::PollReply) >= 1);
    // A second vouch without a heartbeat between: no longer watched (not its watcher any more).
    lab.run_for(Duration::from_millis(300));
    assert!(lab.silent_events(1).is_empty());
    assert_eq!(lab.core(1).watched().count(), 0);
}

#[test]
fn a_watcher_tells_its_gossip_the_owner_lives_at_most_every_50_ms() {
    let mut lab = Lab::new(3);
    lab.command(0, Command::Plan(lab.plan(0, &[1])));
    lab.run_for(Duration::from_secs(1));
    lab.cores[1].as_mut().unwrap().drain_heard().for_each(drop);
    lab.run_for(Duration::from_secs(1));
    let heard: Vec<_> = lab.cores[1].as_mut().unwrap().drain_heard().collect();
    assert!(
        (12..=21).contains(&heard.len()),
        "{} reports in 1 s",
        heard.len()
    );
    assert!(
        heard.iter().all(|h| *h == (lab.ids[0].addr, 10)),
        "{heard:?}"
    );
    let owner_heard = lab.cores[0].as_mut().unwrap().drain_heard().count();
    assert_eq!(owner_heard, 0, "the owner hears no heartbeat");
    // The owner falls silent: no more reports.
    lab.cores[0] = None;
    lab.run_for(Duration::from_millis(200));
    lab.cores[1].as_mut().unwrap().drain_heard().for_each(drop);
    lab.run_for(Duration::from_secs(1));
    assert_eq!(lab.cores[1].as_mut().unwrap().drain_heard().count(), 0);
}

#[test]
fn a_live_owner_answers_the_polls_of_a_watcher_it_declared_down() {
    // Node 1 watches node 0. Node 0's gossip declares node 1 down (falsely: their gossip was
    // cut), so node 0 heartbeats it no more; the relay through node 2 is cut too (chaos seed 3
    // at 1,253 s), so only node 0's own answer can vouch for it.
    let mut lab = Lab::new(3);
    lab.command(0, Command::Plan(lab.plan(0, &[1])));
    lab.run_for(Duration::from_secs(2));
    assert_eq!(lab.core(1).watched().collect::<Vec<_>>(), vec!["n0"]);
    lab.cut = Box::new(|from, to, _| matches!((from, to), (1, 2) | (2, 1)));
    let without_1: Directory = Arc::new(
        lab.directory_for(0)
            .iter()
            .filter(|(node, _)| **node != name(1))
            .map(|(node, id)| (node.clone(), id.clone()))
            .collect(),
    );
    lab.cores[0].as_mut().unwrap().set_directory(without_1);
    lab.run_for(Duration::from_millis(400));
    assert!(lab.silent_events(1).is_empty(), "{:?}", lab.events[1]);
    assert!(lab.core(1).metrics().checks(CheckResult::Vouched) >= 1);
    assert!(lab.core(0).metrics().sent_of(MessageType::PollReply) >= 1);
    assert_eq!(
        lab.core(1).watched().count(),
        0,
        "answered but no longer heartbeated: not watched any more"
    );
}

#[test]
fn a_dropped_watcher_gets_a_farewell_and_polls_no_one() {
    let mut lab = Lab::new(3);
    lab.command(0, Command::Plan(lab.plan(0, &[1])));
    lab.run_for(Duration::from_secs(1));
    lab.command(0, Command::Plan(lab.plan(0, &[2])));
    assert_eq!(lab.core(0).watchers().collect::<Vec<_>>(), vec!["n2"]);
    lab.run_for(Duration::from_secs(5));
    assert_eq!(lab.core(1).metrics().sent_of(MessageType::Poll), 0);
    assert!(lab.events.iter().all(Vec::is_empty), "{:?}", lab.events);
    assert!(u64::from(FAREWELL_INTERVAL_MS) > 60_000);
}

#[test]
fn a_claim_reaches_every_member_and_a_refutation_reports_the_accused_alive() {
    let mut lab = Lab::new(4);
    let ip = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1));
    lab.command(
        1,
        Command::Claim {
            ip,
            accused: lab.ids[0].clone(),
        },
    );
    for i in [0, 2, 3] {
        assert_eq!(
            lab.events[i],
            vec![Event::Claimed {
                claimant: name(1),
                accused: name(0),
                incarnation: 10,
                ip
            }]
        );
    }
    // Node 2 accuses node 0 in incarnation 10; node 3 in an older one.
    let mut plan = lab.plan(2, &[]);
    plan.accused.insert(name(0), 10);
    lab.command(2, Command::Plan(plan));
    let mut plan = lab.plan(3, &[]);
    plan.accused.insert(name(0), 9);
    lab.command(3, Command::Plan(plan));
    lab.command(0, Command::Refute);
    lab.run_for(Duration::from_millis(100));
    // Three refutations, one interval apart, and the answer to node 2's own recheck (every
    // accuser checks the accused again).
    assert_eq!(lab.alive_events(2), 4);
    assert_eq!(lab.alive_events(3), 0);
    // Refutations carry seq 0: they arm no detector.
    assert_eq!(lab.core(2).watched().count(), 0);
}

#[test]
fn a_reminder_reaches_the_owner_alone_as_a_claim_and_never_the_gossip() {
    let mut lab = Lab::new(4);
    lab.gossip = true;
    let ip = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1));
    lab.command(
        1,
        Command::Remind {
            ip,
            owner: lab.ids[0].clone(),
        },
    );
    // The owner reads it as a claim in its current incarnation (its daemon refutes it and
    // announces); the others hear nothing, so none of them accuses the owner again.
    assert_eq!(
        lab.events[0],
        vec![Event::Claimed {
            claimant: name(1),
            accused: name(0),
            incarnation: 10,
            ip
        }]
    );
    assert!(lab.events[2].is_empty() && lab.events[3].is_empty());
    assert_eq!(lab.core(1).metrics().sent_of(MessageType::Claim), 1);
}

#[test]
fn a_move_told_reaches_the_other_owner_directly_and_through_the_gossip_and_a_third_party_cannot_tell_one()
 {
    let mut lab = Lab::new(4);
    lab.gossip = false;
    let ip = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1));
    let moved = Event::Moved {
        sender: name(1),
        ip,
        from: name(1),
        to: name(2),
    };
    let command = |lab: &Lab| Command::Move {
        ip,
        from: lab.ids[1].clone(),
        to: lab.ids[2].clone(),
    };
    lab.command(1, command(&lab));
    assert_eq!(lab.events[2], vec![moved.clone()]);
    assert!(lab.events[0].is_empty() && lab.events[3].is_empty());
    assert_eq!(lab.core(1).metrics().sent_of(MessageType::Move), 1);
    // Through the gossip as well (every member reads it; only the two act on it).
    lab.events = vec![Vec::new(); 4];
    lab.gossip = true;
    lab.command(1, command(&lab));
    assert_eq!(lab.events[2], vec![moved.clone(), moved.clone()]);
    assert_eq!(lab.events[3], vec![moved]);

    // Node 3 telling a move between nodes 1 and 2: dropped.
    let from = watch_addr(lab.ids[3].addr).unwrap();
    let mut stream = stream_of(&lab.ids[3]);
    let forged = WatchMessage::Move {
        ip,
        epoch: 1,
        from: NodeRef {
            name: "n1",
            addr: lab.ids[1].addr,
            bump: 10,
        },
        to: NodeRef {
            name: "n2",
            addr: lab.ids[2].addr,
            bump: 10,
        },
    };
    let core = lab.cores[0].as_mut().unwrap();
    core.handle_datagram(lab.now, from, &mut sealed(&mut stream, &forged));
    assert_eq!(core.metrics().drops(DropReason::Malformed), 1);
    assert_eq!(core.drain_events().count(), 0);
}

#[test]
fn with_the_accused_cut_off_on_the_watch_port_its_refutation_reaches_the_claimant_through_the_gossip()
 {
    let alive_at_1 = |gossip: bool| {
        let mut lab = Lab::new(3);
        lab.gossip = gossip;
        // Everything node 0's watch sends is lost; what it receives arrives.
        lab.cut = Box::new(|from, _, _| from == 0);
        let ip = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1));
        let mut plan = lab.plan(1, &[]);
        plan.accused.insert(name(0), 10);
        lab.command(1, Command::Plan(plan));
        lab.command(
            1,
            Command::Claim {
                ip,
                accused: lab.ids[0].clone(),
            },
        );
        let claimed = Event::Claimed {
            claimant: name(1),
            accused: name(0),
            incarnation: 10,
            ip,
        };
        // Through both paths: the daemon's accusations take a claim once.
        let claims = lab.events[0].iter().filter(|e| **e == claimed).count();
        assert_eq!(claims, if gossip { 2 } else { 1 });
        lab.command(0, Command::Refute);
        lab.run_for(Duration::from_millis(100));
        lab.events[1]
            .iter()
            .filter(|e| matches!(e, Event::Alive { node, incarnation: 10 } if *node == name(0)))
            .count()
    };
    assert_eq!(
        alive_at_1(false),
        0,
        "the watch port alone loses every refutation"
    );
    assert_eq!(
        alive_at_1(true),
        3,
        "each of the three refutations, through the gossip"
    );
}

#[test]
fn a_claimant_cut_off_from_a_live_owner_learns_it_is_alive_through_a_third_member() {
    // Node 1 claimed node 0's IPs; every datagram between the two is lost both ways (node 0
    // never hears the claim, and its refutation could not reach node 1 anyway), node 2
    // reaches both.
    let alive_at_1 = |owner_lives: bool| {
        let mut lab = Lab::new(3);
        lab.cut = Box::new(|from, to, _| (from, to) == (0, 1) || (from, to) == (1, 0));
        if !owner_lives {
            lab.cores[0] = None;
        }
        let mut plan = lab.plan(1, &[]);
        plan.accused.insert(name(0), 10);
        lab.command(1, Command::Plan(plan));
        let ip = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1));
        let accused = lab.ids[0].clone();
        lab.command(1, Command::Claim { ip, accused });
        lab.run_for(Duration::from_millis(350));
        let alive = lab.events[1]
            .iter()
            .filter(|e| matches!(e, Event::Alive { node, incarnation: 10 } if *node == name(0)))
            .count();
        let relays = lab.core(1).metrics().sent_of(MessageType::Relay);
        // The accusation ends: no more rechecks.
        lab.command(1, Command::Plan(lab.plan(1, &[])));
        lab.run_for(Duration::from_millis(300));
        let after = lab.core(1).metrics().sent_of(MessageType::Relay) - relays;
        (alive, relays, after)
    };
    let (alive, relays, after) = alive_at_1(true);
    assert_eq!(
        alive, 1,
        "node 2 vouched for node 0 once: the accusation ends"
    );
    assert_eq!((relays, after), (1, 0), "one round, then nothing");
    let (alive, relays, after) = alive_at_1(false);
    assert_eq!(alive, 0, "a dead owner is vouched for by nobody");
    assert_eq!(relays, 3, "a round every 100 ms while the plan accuses it");
    assert_eq!(after, 0, "nothing once the plan no longer accuses it");
}

#[test]
fn through_the_gossip_only_claims_and_refutations_from_members_are_read() {
    let mut lab = Lab::new(2);
    let now = lab.now;
    let member = lab.ids[1].addr;
    let core = lab.cores[0].as_mut().unwrap();
    let drops = |core: &WatchCore, reason| core.metrics().drops(reason);
    let payload = |message: &WatchMessage<'_>| {
        let mut buf = [0u8; swimlb_proto::heartbeat::MAX_LEN];
        let len = message.emit(&mut buf).unwrap();
        buf[..len].to_vec()
    };
    let refute = payload(&WatchMessage::Heartbeat {
        incarnation: 10,
        seq: 0,
        interval_ms: 20,
    });
    let stranger = identity(7, 1).addr;
    core.handle_relayed(now, stranger, &refute);
    assert_eq!(drops(core, DropReason::UnknownSender), 1);
    // A watch heartbeat, a poll and garbage are the watch port's business only.
    let beat = payload(&WatchMessage::Heartbeat {
        incarnation: 10,
        seq: 1,
        interval_ms: 20,
    });
    let poll = payload(&WatchMessage::Poll {
        nonce: 1,
        incarnation: 10,
    });
    for refused in [&beat[..], &poll, &[0xff, 1, 2], &[]] {
        core.handle_relayed(now, member, refused);
    }
    assert_eq!(drops(core, DropReason::Malformed), 4);
    assert_eq!(
        core.watched().count(),
        0,
        "a relayed heartbeat arms no detector"
    );
    assert_eq!(
        core.drain_outgoing().count(),
        0,
        "a relayed poll is not answered"
    );
    // A refutation from a member in the incarnation accused here is read.
    let mut plan = lab.plan(0, &[]);
    plan.accused.insert(name(1), 10);
    let core = lab.cores[0].as_mut().unwrap();
    core.command(now, Command::Plan(plan));
    core.handle_relayed(now, member, &refute);
    assert_eq!(
        core.drain_events().collect::<Vec<_>>(),
        vec![Event::Alive {
            node: name(1),
            incarnation: 10
        }]
    );
}

#[test]
fn a_late_tick_pauses_the_watch_denies_polls_until_two_plans_end_it() {
    let mut lab = Lab::new(3);
    lab.command(0, Command::Plan(lab.plan(0, &[1])));
    lab.command(2, Command::Plan(lab.plan(2, &[0])));
    lab.run_for(Duration::from_secs(1));
    // Node 0's timer fires 500 ms late, longer than M x I.
    let deadline = lab.core(0).next_deadline().unwrap();
    let late = lab.cores[0]
        .as_mut()
        .unwrap()
        .tick(deadline + Duration::from_millis(500));
    assert_eq!(late, Duration::from_millis(500));
    let beats_before_pause = lab.core(0).metrics().sent_of(MessageType::Heartbeat);
    lab.deliver(0);
    assert_eq!(lab.events[0], vec![Event::Paused { late }]);
    assert!(lab.core(0).paused());
    assert_eq!(lab.core(0).watchers().count(), 0);
    assert_eq!(lab.core(0).watched().count(), 0, "node 0 watched node 2");
    // A poll is answered "not alive" now (sealed in a later epoch than node 1's own stream).
    let mut stream =
        SealStream::new(sender_id(watch_addr(lab.ids[1].addr).unwrap()), 1_000).unwrap();
    let mut poll = sealed(
        &mut stream,
        &WatchMessage::Poll {
            nonce: 5,
            incarnation: 10,
        },
    );
    let from = watch_addr(lab.ids[1].addr).unwrap();
    let now = lab.now;
    let core = lab.cores[0].as_mut().unwrap();
    core.handle_datagram(now, from, &mut poll);
    let mut reply = core.drain_outgoing().next().unwrap();
    let opened = ring().open_envelope(&mut reply.bytes).unwrap();
    assert_eq!(
        WatchMessage::parse(opened.payload).unwrap(),
        WatchMessage::PollReply {
            nonce: 5,
            alive: false
        }
    );
    // A claim against it now is not refuted, and arms no timer that could never fire.
    let before = lab.core(0).next_deadline();
    lab.command(0, Command::Refute);
    assert_eq!(lab.core(0).next_deadline(), before);
    assert_eq!(
        lab.core(0).metrics().sent_of(MessageType::Heartbeat),
        beats_before_pause
    );
    // A plan that does not hold: still paused. One that holds, then one that does not: over.
    lab.command(0, Command::Plan(lab.plan(0, &[1])));
    assert!(lab.core(0).paused());
    let mut held = lab.plan(0, &[1]);
    held.held = true;
    lab.command(0, Command::Plan(held));
    assert!(lab.core(0).paused());
    lab.command(0, Command::Plan(lab.plan(0, &[1])));
    assert!(!lab.core(0).paused());
    assert_eq!(lab.core(0).watchers().collect::<Vec<_>>(), vec!["n1"]);
}

#[test]
fn a_claim_heard_during_a_pause_is_refuted_once_the_pause_ends_in_the_same_incarnation() {
    let mut lab = Lab::new(3);
    lab.claimed_during_a_pause();
    // Nothing goes out.
    lab.run_for(Duration::from_millis(100));
    assert_eq!(lab.alive_events(2), 0);
    // The daemon's hold comes back, then ends (a plan that holds, then one that does not): the
    // refutation goes.
    let mut held = lab.plan(0, &[1]);
    held.held = true;
    lab.command(0, Command::Plan(held));
    lab.command(0, Command::Plan(lab.plan(0, &[1])));
    assert!(!lab.core(0).paused());
    lab.run_for(Duration::from_millis(100));
    assert_eq!(
        lab.alive_events(2),
        4,
        "three refutations, one interval apart, and the answer to node 2's own recheck"
    );
    // A node renewed during the pause refutes nothing: its old incarnation was the accused.
    // (No watchers from here on: every heartbeat it sends would be a refutation.)
    lab.pause(0);
    lab.command(0, Command::Refute);
    let mut held = lab.plan(0, &[]);
    held.held = true;
    lab.command(0, Command::Plan(held));
    let mut renewed = lab.plan(0, &[]);
    renewed.me.bump += 1;
    let beats = lab.core(0).metrics().sent_of(MessageType::Heartbeat);
    lab.command(0, Command::Plan(renewed));
    assert!(!lab.core(0).paused());
    lab.run_for(Duration::from_millis(100));
    assert_eq!(
        lab.core(0).metrics().sent_of(MessageType::Heartbeat),
        beats,
        "no refutation from the renewed node"
    );
}

#[test]
fn a_node_that_owns_nothing_after_a_pause_ends_it_with_the_daemons_hold_and_refutes() {
    let mut lab = Lab::new(3);
    lab.claimed_during_a_pause();
    // Node 1 keeps the IP: node 0 owns nothing from here on. Its hold comes back and ends, and
    // no plan of it ever answers for anything: the pause ends all the same.
    let mut held = lab.plan(0, &[]);
    held.held = true;
    lab.command(0, Command::Plan(held));
    assert!(lab.core(0).paused());
    lab.command(0, Command::Plan(lab.plan(0, &[])));
    assert!(!lab.core(0).paused());
    lab.run_for(Duration::from_millis(100));
    assert_eq!(
        lab.alive_events(2),
        4,
        "the deferred refutation goes out (3), and node 2's recheck is answered"
    );
}

#[test]
fn a_paused_watcher_reports_no_owner_silent_until_the_pause_ends() {
    let mut lab = Lab::new(3);
    lab.command(0, Command::Plan(lab.plan(0, &[1])));
    lab.run_for(Duration::from_secs(1));
    // Node 1 pauses; the owner's heartbeats arm its detector again, then the owner stops.
    lab.pause(1);
    lab.run_for(Duration::from_millis(100));
    assert_eq!(lab.core(1).watched().count(), 1);
    lab.cores[0] = None;
    lab.run_for(Duration::from_millis(300));
    assert!(lab.silent_events(1).is_empty(), "{:?}", lab.events[1]);
    assert_eq!(lab.core(1).watched().count(), 0);
}

#[test]
fn an_owner_renewed_in_the_gossip_is_not_reported_silent() {
    let mut lab = Lab::new(3);
    lab.command(0, Command::Plan(lab.plan(0, &[1])));
    lab.run_for(Duration::from_secs(1));
    lab.cores[0] = None;
    // The gossip now holds node 0 under a newer identity.
    lab.ids[0].bump = 11;
    let directory = lab.directory_for(1);
    lab.cores[1].as_mut().unwrap().set_directory(directory);
    lab.run_for(Duration::from_millis(300));
    assert!(lab.silent_events(1).is_empty(), "{:?}", lab.events[1]);
    assert_eq!(lab.core(1).metrics().checks(CheckResult::Silent), 1);
    assert_eq!(lab.core(1).watched().count(), 0);
}

#[test]
fn forged_replayed_malformed_stale_and_stranger_datagrams_are_dropped_and_counted() {
    let mut lab = Lab::new(2);
    let now = lab.now;
    let from = watch_addr(lab.ids[1].addr).unwrap();
    let mut stream = stream_of(&lab.ids[1]);
    let core = lab.cores[0].as_mut().unwrap();
    let drops = |core: &WatchCore, reason| core.metrics().drops(reason);

    core.handle_datagram(now, from, &mut b"not an envelope".to_vec());
    assert_eq!(drops(core, DropReason::Unauthentic), 1);

    let stranger = identity(7, 1);
    let mut theirs = stream_of(&stranger);
    let beat = WatchMessage::Heartbeat {
        incarnation: 10,
        seq: 1,
        interval_ms: 20,
    };
    core.handle_datagram(now, from, &mut sealed(&mut theirs, &beat));
    assert_eq!(drops(core, DropReason::UnknownSender), 1);

    let first = sealed(&mut stream, &beat);
    core.handle_datagram(now, from, &mut first.clone());
    core.handle_datagram(now, from, &mut first.clone());
    assert_eq!(drops(core, DropReason::Replay), 1);
    assert_eq!(core.metrics().received_of(MessageType::Heartbeat), 1);

    let mut garbage = Vec::new();
    ring()
        .seal_in(&mut stream, None, &[0xff, 1, 2], &mut garbage)
        .unwrap();
    core.handle_datagram(now, from, &mut garbage);
    assert_eq!(drops(core, DropReason::Malformed), 1);

    // A claim whose claimant is not its sender.
    let forged = WatchMessage::Claim {
        ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
        epoch: 1,
        claimant: NodeRef {
            name: "n5",
            addr: from,
            bump: 1,
        },
        accused: NodeRef {
            name: "n0",
            addr: from,
            bump: 10,
        },
    };
    core.handle_datagram(now, from, &mut sealed(&mut stream, &forged));
    assert_eq!(drops(core, DropReason::Malformed), 2);

    // A reply to no poll, and a heartbeat not newer than the last.
    let reply = WatchMessage::PollReply {
        nonce: 99,
        alive: true,
    };
    core.handle_datagram(now, from, &mut sealed(&mut stream, &reply));
    core.handle_datagram(now + MS, from, &mut sealed(&mut stream, &beat));
    assert_eq!(drops(core, DropReason::Stale), 2);
    assert_eq!(core.drain_events().count(), 0);
}

#[test]
fn a_member_checked_on_request_is_silent_only_when_neither_it_nor_a_relay_answers() {
    let mut lab = Lab::new(3);
    let check = |lab: &Lab| Command::Check {
        member: lab.ids[1].clone(),
    };
    lab.command(2, check(&lab));
    lab.run_for(Duration::from_millis(500));
    assert!(lab.silent_events(2).is_empty(), "a live member answers");
    // Cut from node 2 both ways: node 0 relays the poll, and its answer vouches.
    lab.cut = Box::new(|from, to, _| matches!((from, to), (1, 2) | (2, 1)));
    lab.command(2, check(&lab));
    lab.run_for(Duration::from_millis(500));
    assert!(lab.silent_events(2).is_empty(), "the relay vouches");
    lab.cut = Box::new(|_, _, _| false);
    lab.cores[1] = None;
    lab.command(2, check(&lab));
    // A second request while the check runs changes nothing.
    lab.run_for(Duration::from_millis(20));
    lab.command(2, check(&lab));
    lab.run_for(Duration::from_millis(500));
    let silent = lab.silent_events(2);
    assert_eq!(silent.len(), 1, "reported once: {silent:?}");
    let Event::Silent { owner, silent_for } = silent[0] else {
        unreachable!()
    };
    assert_eq!(owner, &lab.ids[1]);
    let rounds = Knobs::default().interval;
    assert!(
        *silent_for >= POLL_WAIT && *silent_for <= POLL_WAIT + rounds,
        "the verdict comes a poll's wait after the last round: {silent_for:?}"
    );
    // A pause forgets the checks: nothing is reported from a check asked for before it.
    let mut lab = Lab::new(3);
    lab.cores[1] = None;
    lab.command(2, check(&lab));
    lab.pause(2);
    lab.run_for(Duration::from_millis(500));
    assert!(lab.silent_events(2).is_empty(), "{:?}", lab.events[2]);
}

#[test]
fn an_owner_sends_all_its_watchers_heartbeats_in_one_wake_up_per_interval() {
    let mut lab = Lab::new(4);
    lab.command(0, Command::Plan(lab.plan(0, &[1, 2, 3])));
    lab.run_for(Duration::from_secs(1));
    let beats_before = lab.core(0).metrics().sent_of(MessageType::Heartbeat);
    let mut wake_ups = 0u64;
    let end = lab.now + Duration::from_secs(1);
    while lab.now < end {
        lab.now += Duration::from_micros(100);
        for i in 0..4 {
            let now = lab.now;
            let core = lab.cores[i].as_mut().unwrap();
            if core.next_deadline().is_some_and(|at| at <= now) {
                core.tick(now);
                lab.deliver(i);
                wake_ups += u64::from(i == 0);
            }
        }
    }
    let beats = lab.core(0).metrics().sent_of(MessageType::Heartbeat) - beats_before;
    // All three fast, on one grid: three beats in each of about 50 wake-ups a second.
    assert_eq!(beats, 3 * wake_ups, "{beats} beats in {wake_ups} wake-ups");
    assert!((49..=51).contains(&wake_ups), "{wake_ups} wake-ups in 1 s");
    assert!(lab.events.iter().all(Vec::is_empty), "{:?}", lab.events);
}
