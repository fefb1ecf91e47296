//! keepalived in the lab, as the comparison peer of `swimlb-lab failover`. Root only: each test
//! is `#[ignore = "needs root: ..."]` and runs with `--include-ignored` (as `sudo ./test.sh` does).
//!
//! The tests take a lock and run one at a time: `failover::run` names its lab after the
//! process, so two labs of this binary at once would share their namespaces.

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use swimlb_e2e::failover::{self, Implementation, KeepalivedDaemons, Options, Sample, Scenario};
use swimlb_e2e::keepalived::Tuning;
use swimlb_e2e::netns;

/// One lab at a time (see the module doc).
static LAB: Mutex<()> = Mutex::new(());

/// The lab to oneself; panics, naming `test`, without root.
fn one_lab(test: &str) -> MutexGuard<'static, ()> {
    netns::require_root(test);
    LAB.lock().unwrap_or_else(|e| e.into_inner())
}

/// One power-off trial of keepalived with `tuning` on two nodes; its one sample.
fn one_poweroff(implementation: Implementation, tuning: Tuning) -> Sample {
    let options = Options {
        implementation,
        scenario: Scenario::Poweroff,
        nodes: 2,
        trials: 1,
        loss: 0,
        probe_interval: Duration::from_millis(10),
        api_down: false,
        flood: None,
    };
    let report = failover::run(
        &options,
        &|lab| Ok(Box::new(KeepalivedDaemons::new(lab, tuning))),
        &mut |line| eprintln!("{line}"),
    )
    .unwrap();
    assert_eq!(report.run.implementation, implementation.as_str());
    assert_eq!(
        (
            report.run.trials,
            report.run.failed_trials,
            report.samples.len()
        ),
        (1, 0, 1),
        "the backup answered after the master's link went down"
    );
    report.samples[0]
}

#[test]
#[ignore = "needs root: network namespaces and keepalived"]
fn keepalived_moves_the_vip_when_its_master_loses_its_link() {
    let _one = one_lab("keepalived defaults");
    let sample = one_poweroff(Implementation::Keepalived, Tuning::Defaults);
    assert!(
        sample.lost_probes > 0,
        "a default keepalived loses probes while it waits for adverts"
    );
    // The trial started from one MASTER (see `converge`): the backup waits for three missed
    // adverts (advert_int 1), so no failover of a converged lab takes a few milliseconds, the
    // figure a fault taken while both nodes were still MASTER gave.
    assert!(
        sample.failover_ms >= 1000.0,
        "a default keepalived fails over only after missed adverts: {sample:?}"
    );
}

#[test]
#[ignore = "needs root: network namespaces and keepalived"]
fn keepalived_tuned_for_speed_moves_the_vip_after_missed_tenth_of_a_second_adverts() {
    let _one = one_lab("keepalived-fast");
    let sample = one_poweroff(Implementation::KeepalivedFast, Tuning::Fast);
    // Three missed adverts of 0.1 s: at least a few probe intervals, never the milliseconds of
    // a second MASTER already answering.
    assert!(
        sample.failover_ms >= 100.0 && sample.lost_probes > 0,
        "{sample:?}"
    );
}
