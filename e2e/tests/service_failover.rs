//! `service-failover` on real nodes, one short trial of each policy: three real nodes
//! (kubelet, containerd, kube-proxy) run `deploy/swimlb.yaml` and the backend `swimlb-echo`
//! behind a `Local` and a `Cluster` LoadBalancer Service; the client, outside the nodes, reaches
//! each Service's IP through the lab's segment before the owner (the node the election rule
//! names, checked) is powered off and after. Root only (`#[ignore = "needs root: ..."]`).

use std::time::Duration;

use serde_json::Value;
use swimlb_e2e::kubelab::Policy;
use swimlb_e2e::service_failover::{self, Implementation, Options};

#[test]
#[ignore = "needs root: real kubelets, containerd and kube-proxy in network namespaces"]
fn a_client_of_local_and_cluster_services_is_answered_again_after_the_owner_powers_off() {
    let started = tokio::time::Instant::now();
    let json = std::env::temp_dir().join(format!("service-failover-{}.json", std::process::id()));
    let options = Options {
        implementations: vec![Implementation::Swimlb],
        policies: vec![Policy::Local, Policy::Cluster],
        trials: 1,
        window: Duration::from_secs(10),
        nodes: 3,
        json: Some(json.clone()),
    };
    let report = service_failover::run(&options, &mut |line| eprintln!("{line}"))
        .unwrap_or_else(|e| panic!("service-failover: {e:#}"));
    for result in &report.results {
        // A trial fails (and is listed here) when no request succeeded through the IP in the
        // second before the fault, or when the owner was not the one the election rule names.
        assert!(
            result.failed_trials.is_empty(),
            "{}: {:?}",
            result.policy,
            result.failed_trials
        );
        let trial = &result.trials[0];
        assert!(
            trial.arp_takeover_ms.is_some() && trial.arp_new_claimants >= 1,
            "{}: no other node claimed the IP by ARP after {} powered off: {trial:?}",
            result.policy,
            trial.owner
        );
        assert!(
            trial.first_success_ms.is_some(),
            "{}: no new request succeeded within the window after {} powered off",
            result.policy,
            trial.owner
        );
        assert!(
            trial.new_requests > 0,
            "{}: the client sent nothing",
            result.policy
        );
        assert_ne!(trial.new_owner.as_deref(), Some(trial.owner.as_str()));
        assert!(
            trial.long_lived.iter().all(|l| l.ok_before > 0),
            "{}: a long-lived connection was not answered before the fault: {:?}",
            result.policy,
            trial.long_lived
        );
        eprintln!(
            "{}: {} powered off, first new request answered after {:.0} ms, {} answering now",
            result.policy,
            trial.owner,
            trial.first_success_ms.unwrap_or_default(),
            trial.new_owner.as_deref().unwrap_or("?")
        );
    }
    assert_eq!(report.at_rest.len(), 3, "{:?}", report.at_rest);
    assert!(
        report.at_rest.iter().all(|a| a.working_set_mib > 0.0),
        "{:?}",
        report.at_rest
    );
    let text = std::fs::read_to_string(&json).expect("the JSON report");
    let _ = std::fs::remove_file(&json);
    let value: Value = serde_json::from_str(&text).expect("JSON");
    for result in value["results"].as_array().expect("results") {
        for field in ["p50", "p90", "p99", "max"] {
            assert!(
                result["first_success_ms"][field].is_f64(),
                "first_success_ms.{field} in {result}"
            );
        }
        assert!(result["impl"] == "swimlb-kubernetes" && result["policy"].is_string());
    }
    let infos = value["node_info"].as_array().expect("node_info");
    assert_eq!(infos.len(), 3);
    for info in infos {
        assert!(
            info["kubelet_version"]
                .as_str()
                .is_some_and(|v| v.starts_with('v'))
                && info["container_runtime"]
                    .as_str()
                    .is_some_and(|r| r.starts_with("containerd://")),
            "{info}"
        );
    }
    eprintln!(
        "service-failover test done in {:.0} s",
        started.elapsed().as_secs_f64()
    );
}
