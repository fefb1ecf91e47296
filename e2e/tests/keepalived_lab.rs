//! keepalived in the lab, as the comparison peer of `swimlb-lab failover` (root only).

use std::time::Duration;

use swimlb_e2e::failover::{self, Implementation, KeepalivedDaemons, Options, Scenario};
use swimlb_e2e::netns;

#[test]
fn keepalived_moves_the_vip_when_its_master_loses_its_link() {
    if !netns::is_root() {
        eprintln!("keepalived_moves_the_vip_when_its_master_loses_its_link: skipped: needs root");
        return;
    }
    let options = Options {
        implementation: Implementation::Keepalived,
        scenario: Scenario::Poweroff,
        nodes: 2,
        trials: 1,
        loss: 0,
        probe_interval: Duration::from_millis(10),
    };
    let report = failover::run(
        &options,
        &|lab| Ok(Box::new(KeepalivedDaemons::new(lab))),
        &mut |line| eprintln!("{line}"),
    )
    .unwrap();
    assert_eq!(
        (report.trials, report.failed_trials, report.samples.len()),
        (1, 0, 1),
        "the backup answered after the master's link went down"
    );
    assert!(
        report.samples[0].lost_probes > 0,
        "a default keepalived loses probes while it waits for adverts"
    );
    // The trial started from one MASTER (see `converge`): the backup waits for three missed
    // adverts (advert_int 1), so no failover of a converged lab takes a few milliseconds, the
    // figure a fault taken while both nodes were still MASTER gave.
    assert!(
        report.samples[0].failover_ms >= 1000.0,
        "a default keepalived fails over only after missed adverts: {:?}",
        report.samples[0]
    );
}
