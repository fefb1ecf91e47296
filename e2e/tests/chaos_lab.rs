//! `swimlb-lab chaos` in the namespace lab (issue 27): a short seeded run of swimlb standalone
//! reports no violation, and a violation made on purpose (a second node's kernel answering
//! ARP for the VIP, its address added by hand) is caught, so the checker can fail; replays of
//! what the long runs found; every Kubernetes fault in turn on real nodes (the real control
//! plane, a real kubelet, containerd and kube-proxy per node), for swimlb in Kubernetes mode (no
//! violation) and for MetalLB (the run takes every fault).
//!
//! All need root (they make network namespaces): each is `#[ignore = "needs root: ..."]` and
//! runs with `--include-ignored`; run so without root, it fails saying why. They take a lock
//! and run one at a time: the fast gossip profile would take a few labs competing for two
//! cores for faults.

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use swimlb_e2e::chaos::invariants::{Invariant, World};
use swimlb_e2e::chaos::schedule::{self, Fault, FaultKind, Target, Traffic};
use swimlb_e2e::chaos::{self, Options};
use swimlb_e2e::netns;

static LAB: Mutex<()> = Mutex::new(());

fn one_lab(test: &str) -> MutexGuard<'static, ()> {
    netns::require_root(test);
    LAB.lock().unwrap_or_else(|e| e.into_inner())
}

fn options(seed: u64, duration: Duration, injected: Vec<Fault>) -> Options {
    Options {
        target: Target::Swimlb,
        duration,
        seed,
        nodes: 3,
        until_violation: false,
        scheduled: true,
        injected,
        program: PathBuf::from(env!("CARGO_BIN_EXE_swimlb-lab")),
    }
}

#[test]
#[ignore = "needs root: network namespaces"]
fn a_short_seeded_run_of_swimlb_reports_no_violation() {
    let _one = one_lab("chaos run");
    let report = chaos::run(
        &options(2, Duration::from_secs(60), Vec::new()),
        &mut |line| eprintln!("{line}"),
    )
    .expect("the chaos run");
    eprint!("{}", report.text());
    assert!(
        report.faults_per_kind.values().sum::<usize>() >= 3,
        "the run took faults: {:?}",
        report.faults_per_kind
    );
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(report.counted(), 0, "violations:\n{}", report.text());
}

#[test]
#[ignore = "needs root: network namespaces"]
fn a_second_node_answering_for_the_vip_is_caught_as_dual() {
    let _one = one_lab("chaos checker");
    let seed = 2;
    // No scheduled fault fits in 10 s: only the injected one happens.
    let duration = Duration::from_secs(10);
    assert!(schedule::schedule(seed, duration, 3, Target::Swimlb).is_empty());
    let rule = chaos::rule(Target::Swimlb, schedule::setup(seed, 3), 3);
    let owner = rule
        .expected(World::new(&[], &[], 3).at(Duration::ZERO), 0)
        .expect("an owner");
    let other = if owner == 1 { 2 } else { 1 };
    let injected = vec![Fault {
        at: Duration::from_secs(2),
        duration: Duration::from_secs(4),
        kind: FaultKind::ForeignAnswer {
            node: other,
            vip: 0,
        },
    }];
    let report = chaos::run(&options(seed, duration, injected), &mut |line| {
        eprintln!("{line}")
    })
    .expect("the chaos run");
    eprint!("{}", report.text());
    let dual: Vec<_> = report
        .violations
        .iter()
        .filter(|v| v.invariant == Invariant::Dual && v.vip == Some(0) && !v.excused)
        .collect();
    assert!(
        !dual.is_empty(),
        "node{other} answered beside node{owner} for 4 s and no dual was found:\n{}",
        report.text()
    );
    assert!(
        dual[0].detail.contains(&format!("node{other}")),
        "{:?}",
        dual[0]
    );
    assert_eq!(report.violations_per_invariant["dual"], dual.len());
}

/// The split the 300 s runs of seeds 1 and 3 found, alone: node2 stopped for 2.9 s while node3's
/// gossip to node1 is dropped (one way) for 5.4 s. Each node declares the others down; once
/// both faults are over the network is healthy, and the speakers must agree again within 10 s.
#[test]
#[ignore = "needs root: network namespaces"]
fn a_mesh_split_into_singletons_by_a_pause_and_a_one_way_drop_merges_again() {
    let _one = one_lab("chaos singletons");
    let ms = Duration::from_millis;
    let injected = vec![
        Fault {
            at: ms(2000),
            duration: ms(2900),
            kind: FaultKind::Pause { node: 2 },
        },
        Fault {
            at: ms(4600),
            duration: ms(5400),
            kind: FaultKind::Drop {
                traffic: Traffic::Membership,
                from: 3,
                to: 1,
                both: false,
            },
        },
    ];
    let mut options = options(3, Duration::from_secs(40), injected);
    options.scheduled = false;
    let report = chaos::run(&options, &mut |line| eprintln!("{line}")).expect("the chaos run");
    eprint!("{}", report.text());
    // From 10 s after the last fault (20 s) on, nothing may be found.
    let late: Vec<_> = report
        .violations
        .iter()
        .filter(|v| !v.excused && v.at >= Duration::from_secs(20))
        .collect();
    assert!(
        late.is_empty(),
        "the mesh did not merge within 10 s of the faults: {late:?}\n{}",
        report.text()
    );
}

/// The dual answers seed 1's 1,800 s run found: a node's link down for 2.3-2.5 s, long enough
/// for it to hold every other member down and take every VIP alone. Once its link is back it
/// must let go before the dual answers last a second. Each node is cut once, 10 s apart.
#[test]
#[ignore = "needs root: network namespaces"]
fn a_node_cut_off_long_enough_to_be_alone_lets_go_of_the_vips_once_back() {
    let _one = one_lab("chaos link flaps");
    let injected: Vec<Fault> = (1..=3)
        .map(|node| Fault {
            at: Duration::from_secs(4 + 10 * (node as u64 - 1)),
            duration: Duration::from_millis(2400),
            kind: FaultKind::LinkFlap { node },
        })
        .collect();
    let mut options = options(1, Duration::from_secs(36), injected);
    options.scheduled = false;
    let report = chaos::run(&options, &mut |line| eprintln!("{line}")).expect("the chaos run");
    eprint!("{}", report.text());
    for e in &report.dual_episodes {
        eprintln!(
            "dual: VIP {} at {:.3} s for {} ms by {:?}",
            e.vip,
            e.at.as_secs_f64(),
            e.span.as_millis(),
            e.nodes
        );
    }
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(report.counted(), 0, "violations:\n{}", report.text());
}

/// Every Kubernetes fault once, for `target`: the exclude label on the first VIP's owner and
/// the `Local` Service's endpoint of the second's turning not ready, the API server killed
/// while the first VIP's owner is killed (it restarts before the API server is back), etcd
/// compacted, the controller down while two Services are created (one asking for the first
/// VIP without sharing it), and a rolling update of the speakers. Runs them and checks that
/// each was applied once, without error, and that every invariant of Kubernetes was checked.
fn every_kubernetes_fault(target: Target) -> chaos::Report {
    let rule = chaos::rule(target, schedule::setup(1, 3), 3);
    let calm = World::new(&[], &[], 3);
    let owner = |vip| {
        rule.expected(calm.at(Duration::ZERO), vip)
            .expect("an owner")
    };
    let fault = |at_ms: u64, ms: u64, kind| Fault {
        at: Duration::from_millis(at_ms),
        duration: Duration::from_millis(ms),
        kind,
    };
    let injected = vec![
        fault(3000, 5000, FaultKind::Exclude { node: owner(0) }),
        fault(3000, 5000, FaultKind::EndpointNotReady { node: owner(1) }),
        fault(12_000, 6000, FaultKind::ApiDown),
        fault(13_000, 3000, FaultKind::Kill { node: owner(0) }),
        fault(22_000, 500, FaultKind::EtcdCompaction),
        fault(24_000, 4000, FaultKind::ControllerRestart),
        fault(25_000, 8000, FaultKind::ServiceChurn { number: 1 }),
        fault(36_000, 12_000, FaultKind::RollingUpdate),
    ];
    let options = Options {
        target,
        scheduled: false,
        ..options(1, Duration::from_secs(60), injected.clone())
    };
    let report = chaos::run(&options, &mut |line| eprintln!("{line}")).expect("the chaos run");
    eprint!("{}", report.text());
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    for f in &injected {
        // A fault on a speaker whose kubelet has not started it again yet is skipped, said so.
        let skipped = report
            .skipped
            .iter()
            .filter(|s| s.contains(&format!("{} (Apply)", f.kind.describe())))
            .count();
        assert_eq!(
            report
                .faults_per_kind
                .get(f.kind.as_str())
                .copied()
                .unwrap_or(0)
                + skipped,
            1,
            "{:?} applied or skipped once: {:?}",
            f.kind,
            report.skipped
        );
    }
    for invariant in ["stale_record", "double_allocation", "dual", "dark", "crash"] {
        assert!(
            report.violations_per_invariant.contains_key(invariant),
            "{invariant} checked: {:?}",
            report.violations_per_invariant
        );
    }
    report
}

/// swimlb in Kubernetes mode under every Kubernetes fault: every invariant holds, the record
/// ones and misplaced included.
#[test]
#[ignore = "needs root: network namespaces, the real control plane and real nodes (e2e/k8s/build.sh, e2e/k8s/node/build.sh)"]
fn every_kubernetes_fault_in_turn_leaves_every_invariant_holding() {
    let _one = one_lab("chaos run in Kubernetes");
    let report = every_kubernetes_fault(Target::SwimlbKubernetes);
    assert!(report.skipped.is_empty(), "skipped: {:?}", report.skipped);
    assert!(report.violations_per_invariant.contains_key("misplaced"));
    assert_eq!(report.counted(), 0, "violations:\n{}", report.text());
}

/// MetalLB, the peer, under the same faults on the same lab: the run takes every fault and
/// checks every invariant; its violations are the benchmarks page's figures, not asserted here.
/// A measurement run on demand (`measure_`: CI skips it): on real nodes MetalLB's speaker,
/// killed while the API server is away, went into the kubelet's restart backoff, and the run's
/// later roll found no speaker container on that node to stop (the lab's open problems).
#[test]
#[ignore = "needs root: network namespaces, the real control plane, real nodes and MetalLB's programs (e2e/k8s/build.sh, e2e/k8s/node/build.sh)"]
fn measure_metallb_takes_every_kubernetes_fault_of_the_chaos_run() {
    let _one = one_lab("chaos run of MetalLB");
    let report = every_kubernetes_fault(Target::Metallb);
    assert!(report.probes > 1000, "probed: {}", report.probes);
}
