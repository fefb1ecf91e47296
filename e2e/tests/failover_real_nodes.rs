//! `failover --impl swimlb-kubernetes` on real nodes: three real nodes (kubelet, containerd,
//! kube-proxy in each node namespace) run `deploy/swimlb.yaml`; the probes reach the lab's
//! responders through the real kube-proxy (the Service `default/web` on the first VIP, its
//! EndpointSlice naming each node's own address). One `poweroff` trial and one `kill` trial (the
//! speaker's container process killed, its Pod replaced after the trial) on one cluster: each
//! must be measured, the first answer after the fault must come from the node the election rule
//! names among the others, and the `ServiceL2Status` record must name it too.
//!
//! Root only (`#[ignore = "needs root: ..."]`).

use std::net::IpAddr;
use std::time::Duration;

use swimlb_e2e::failover::{self, Implementation, Options, Scenario};
use swimlb_e2e::lab::rule;
use swimlb_e2e::netns;
use swimlb_e2e::realnode::daemons::RealDaemons;

#[test]
#[ignore = "needs root: real kubelets, containerd and kube-proxy in network namespaces"]
fn a_poweroff_and_a_kill_of_the_owner_on_real_nodes_hand_the_vip_to_the_rules_next_node() {
    let started = tokio::time::Instant::now();
    let options = Options {
        implementation: Implementation::SwimlbKubernetes,
        scenario: Scenario::Poweroff,
        nodes: 3,
        trials: 1,
        loss: 0,
        probe_interval: Duration::from_millis(10),
        api_down: false,
        flood: None,
    };
    let reports = failover::run_scenarios(
        &options,
        &[Scenario::Poweroff, Scenario::Kill],
        &|lab| {
            Ok(Box::new(RealDaemons::start(
                lab,
                Implementation::SwimlbKubernetes,
                &mut |line| eprintln!("{line}"),
            )?))
        },
        &mut |line| eprintln!("{line}"),
    )
    .unwrap_or_else(|e| panic!("failover on real nodes: {e:#}"));
    let names = ["node1", "node2", "node3"];
    for report in &reports {
        let scenario = &report.run.scenario;
        assert_eq!(
            (report.run.failed_trials, report.samples.len()),
            (0, 1),
            "{scenario}: {}",
            report.table()
        );
        let [handover] = report.handovers.as_slice() else {
            panic!("{scenario}: not one handover: {:?}", report.handovers);
        };
        let others: Vec<&str> = names
            .into_iter()
            .filter(|n| *n != handover.faulted)
            .collect();
        let vip = IpAddr::V4(netns::vip_v4(0));
        assert_eq!(
            Some(handover.answered.clone()),
            rule::metallb_owner(&others, vip),
            "{scenario}: the first answer after the fault"
        );
        assert!(
            report.samples[0].status_ms.is_some(),
            "{scenario}: the record did not name {} after the fault",
            handover.answered
        );
        assert_eq!(report.node_info.len(), 3, "{scenario}");
        assert!(
            report
                .node_info
                .iter()
                .all(|i| i.container_runtime.starts_with("containerd://")
                    && i.kubelet_version.starts_with('v')),
            "{:?}",
            report.node_info
        );
    }
    eprintln!(
        "failover on real nodes: {:.0} s",
        started.elapsed().as_secs_f64()
    );
}
