//! The timers that wait outside the heap while they have nothing to do (see [`super::timers`]):
//! foca's own handling of an answered probe's indirect-probe timer, on time, handed over later
//! and dropped; and a cluster at rest and after a crash over the simulated network.

use std::net::SocketAddr;
use std::time::Duration;

use foca::{AccumulatingRuntime, Foca, Member, NoCustomBroadcast, OwnedNotification};

use super::*;
use crate::gossip::simnet::{Links, SimNet};

fn id(i: u8) -> NodeIdentity {
    NodeIdentity {
        node: format!("node-{i}").into(),
        addr: SocketAddr::from(([192, 0, 2, i], 7946)),
        bump: 1,
    }
}

type Plain = Foca<NodeIdentity, PostcardCodec, StdRng, NoCustomBroadcast>;

/// Everything one foca call produced: sends (destination, bytes), timers, notifications, result.
type Output = (
    Vec<(NodeIdentity, Vec<u8>)>,
    Vec<(Duration, Timer<NodeIdentity>)>,
    Vec<OwnedNotification<NodeIdentity>>,
    Result<(), String>,
);

type Rt = AccumulatingRuntime<NodeIdentity>;

/// Runs one foca call with a fresh runtime and collects what it produced.
fn call(f: impl FnOnce(&mut Rt) -> Result<(), foca::Error>) -> Output {
    let mut rt = AccumulatingRuntime::new();
    let result = f(&mut rt);
    let rt = &mut rt;
    let sends = std::iter::from_fn(|| rt.to_send())
        .map(|(to, bytes)| (to, bytes.to_vec()))
        .collect();
    let timers = std::iter::from_fn(|| rt.to_schedule()).collect();
    let notes = std::iter::from_fn(|| rt.to_notify()).collect();
    (sends, timers, notes, result.map_err(|e| e.to_string()))
}

/// Node `i` holding `peer` alive, and its first probe timer (set as it became connected).
fn plain(i: u8, peer: u8) -> (Plain, Timer<NodeIdentity>) {
    let config = Timing::fast().foca_config(2).unwrap();
    let mut foca = Foca::new(
        id(i),
        config,
        StdRng::seed_from_u64(u64::from(i)),
        PostcardCodec,
    );
    let mut rt = AccumulatingRuntime::new();
    let alive = Member::new(id(peer), 0, State::Alive);
    foca.apply_many(std::iter::once(alive), true, &mut rt)
        .unwrap();
    let probe = std::iter::from_fn(|| rt.to_schedule())
        .map(|(_, t)| t)
        .find(|t| matches!(t, Timer::ProbeRandomMember(_)))
        .unwrap();
    (foca, probe)
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Indirect {
    OnTime,
    HandedOver,
    Dropped,
}

/// Node 1 probes node 2, which answers; node 2 then probes node 1 and node 1 answers (a call
/// between the indirect-probe timer's due time and node 1's next probe timer); then node 1's
/// next probe timer. Returns node 1's outputs from the ack on.
fn probe_cycle(indirect: Indirect) -> Vec<Output> {
    let ((mut a, probe), (mut b, b_probe)) = (plain(1, 2), plain(2, 1));
    let token = |t: &Timer<NodeIdentity>| matches!(t, Timer::ProbeRandomMember(_));
    let out = call(|rt| a.handle_timer(probe, rt));
    let (ping_to, ping) = out.0[0].clone();
    assert_eq!(ping_to, id(2));
    let send_indirect = out.1.iter().find(|(_, t)| !token(t)).unwrap().1.clone();
    assert!(matches!(send_indirect, Timer::SendIndirectProbe { .. }));
    let next_probe = out.1.iter().find(|(_, t)| token(t)).unwrap().1.clone();
    let out = call(|rt| b.handle_data(&ping, rt));
    let ack = out.0[0].1.clone();
    let mut outputs = vec![call(|rt| a.handle_data(&ack, rt))];
    if indirect == Indirect::OnTime {
        outputs.push(call(|rt| a.handle_timer(send_indirect.clone(), rt)));
    }
    let out = call(|rt| b.handle_timer(b_probe, rt));
    outputs.push(call(|rt| a.handle_data(&out.0[0].1, rt)));
    if indirect == Indirect::HandedOver {
        outputs.push(call(|rt| a.handle_timer(send_indirect, rt)));
    }
    outputs.push(call(|rt| a.handle_timer(next_probe, rt)));
    outputs
}

#[test]
fn foca_does_the_same_with_an_answered_probes_indirect_timer_handed_over_later_not_dropped() {
    let on_time = probe_cycle(Indirect::OnTime);
    let handed_over = probe_cycle(Indirect::HandedOver);
    // Handled, the timer of an answered probe sends nothing, sets no timer, notifies nothing.
    assert_eq!(on_time[1], (vec![], vec![], vec![], Ok(())));
    assert_eq!(handed_over[2], (vec![], vec![], vec![], Ok(())));
    // Everything else is the same, byte for byte: the ack, the call in between, the next
    // probe (a ping to the member, its timers, no error).
    assert_eq!(on_time[0], handed_over[0]);
    assert_eq!(on_time[2], handed_over[1]);
    assert_eq!(on_time[3], handed_over[3]);
    assert_eq!(on_time[3].3, Ok(()));
    assert_eq!(on_time[3].0.len(), 1, "the next probe pings");
    // Dropped, foca finds the probe cycle incomplete.
    let dropped = probe_cycle(Indirect::Dropped);
    let last = dropped.last().unwrap();
    assert_eq!(
        last.3,
        Err(foca::Error::IncompleteProbeCycle.to_string()),
        "{last:?}"
    );
}

fn cluster(n: usize) -> SimNet {
    let mut net = SimNet::new(3, Links::default());
    for i in 0..n {
        let settings = GossipSettings {
            node: format!("node-{i}"),
            addr: SimNet::addr(i),
            seeds: vec![SimNet::addr(0)],
            timing: Timing::fast(),
            bump: 1,
            rng_seed: 1000 + i as u64,
        };
        let meta = MemberMeta::new(format!("node-{i}"));
        let core = Core::new(settings, ring(), meta, GossipMetrics::default(), net.now()).unwrap();
        net.start(i, core);
    }
    net.run_for(Duration::from_secs(3));
    for i in 0..n {
        assert_eq!(net.core(i).unwrap().live().len(), n, "node {i} joined");
    }
    net
}

fn ring() -> KeyRing {
    KeyRing::new("timer-tests", &[[4; 32]]).unwrap()
}

/// What a core's heap wakes it for next, by kind.
fn next_kind(core: &Core) -> &'static str {
    match core.wire.timers.heap.peek().map(|s| &s.task) {
        Some(Task::Foca(Timer::SendIndirectProbe { .. })) => "indirect probe",
        Some(Task::Foca(Timer::ProbeRandomMember(_))) => "probe",
        Some(Task::SuspectSweep) => "sweep",
        Some(_) => "other",
        None => "none",
    }
}

/// Steps the network 1 ms at a time for `span`; returns, for node `i`, the deadlines it was
/// woken at (due within a step), with their kinds, and in how many steps it held a timer back.
fn watch(net: &mut SimNet, i: usize, span: Duration) -> (Vec<(Duration, &'static str)>, usize) {
    let (mut wakes, mut held) = (Vec::new(), 0);
    let end = net.now() + span;
    while net.now() < end {
        let core = net.core(i).unwrap();
        let next = core.next_deadline().map(|at| (at, next_kind(core)));
        held += usize::from(!core.wire.held.is_empty());
        net.run_for(Duration::from_millis(1));
        if let Some((at, kind)) = next
            && at <= net.now()
            && wakes.last().is_none_or(|(last, _)| *last != at)
        {
            wakes.push((at, kind));
        }
    }
    (wakes, held)
}

#[test]
fn at_rest_no_answered_probes_indirect_timer_nor_the_sweep_wakes_a_core_and_a_crash_wakes_both() {
    let mut net = cluster(3);
    let (wakes, held) = watch(&mut net, 0, Duration::from_secs(2));
    let kinds = |wakes: &[(Duration, &str)], kind| wakes.iter().filter(|w| w.1 == kind).count();
    assert!(kinds(&wakes, "probe") >= 20, "{wakes:?}");
    assert_eq!(kinds(&wakes, "indirect probe"), 0, "{wakes:?}");
    assert_eq!(kinds(&wakes, "sweep"), 0, "{wakes:?}");
    assert!(held > 0, "answered probes' timers were held back");
    assert!(net.core(0).unwrap().sweep_parked.is_some());
    // A crash: the probe of the crashed member goes unanswered, its indirect probe is due on
    // time, the sweep runs while it is suspect, and it goes down.
    net.crash(2);
    let (wakes, _) = watch(&mut net, 0, Duration::from_secs(2));
    assert!(kinds(&wakes, "indirect probe") > 0, "{wakes:?}");
    assert!(kinds(&wakes, "sweep") > 0, "{wakes:?}");
    for i in [0, 1] {
        assert!(!net.core(i).unwrap().live().contains("node-2"), "node {i}");
    }
    // Over, the sweep parks again.
    net.run_for(Duration::from_secs(3));
    for i in [0, 1] {
        assert!(net.core(i).unwrap().sweep_parked.is_some(), "node {i}");
    }
}
