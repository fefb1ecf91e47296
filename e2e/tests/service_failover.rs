//! `service-failover` on real nodes, one short trial of each policy per implementation: three
//! real nodes (kubelet, containerd, kube-proxy) run the implementation's own manifest and the
//! backend `swimlb-echo` behind a `Local` and a `Cluster` LoadBalancer Service; the client,
//! outside the nodes, reaches each Service's IP through the lab's segment before the owner (the
//! node the implementation's rule names, checked) is powered off and after.
//!
//! - swimlb: `deploy/swimlb.yaml`, the project's image.
//! - MetalLB: its controller and speaker built static from the pinned module into images of
//!   their own, run from its `metallb-native.yaml` (images replaced, webhook left out) with the
//!   same pool, backend and Services. Before each fault every speaker must see every member in
//!   memberlist and the one node MetalLB's order names must alone announce the IP (checked again
//!   by the client's ARP entry).
//!
//! Root only (`#[ignore = "needs root: ..."]`).

use std::time::Duration;

use serde_json::Value;
use swimlb_e2e::kubelab::Policy;
use swimlb_e2e::service_failover::{self, Implementation, Options};

/// One lab at a time: two labs of real nodes competing for two cores would be faults of their own.
static LAB: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
#[ignore = "needs root: real kubelets, containerd and kube-proxy in network namespaces"]
fn a_client_of_local_and_cluster_services_is_answered_again_after_the_owner_powers_off() {
    let value = one_trial_of_each_policy(Implementation::Swimlb, Duration::from_secs(10));
    for result in value["results"].as_array().expect("results") {
        for field in ["p50", "p90", "p99", "max"] {
            assert!(
                result["first_success_ms"][field].is_f64(),
                "first_success_ms.{field} in {result}"
            );
        }
    }
    for info in value["node_info"].as_array().expect("node_info") {
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
}

#[test]
#[ignore = "needs root: real kubelets, containerd and kube-proxy in network namespaces"]
fn metallb_from_its_own_images_answers_a_client_again_after_the_owner_powers_off() {
    one_trial_of_each_policy(Implementation::Metallb, Duration::from_secs(12));
}

/// Runs one trial of `Local` and one of `Cluster` with `implementation`, checks what every trial
/// must show, and returns the JSON report.
fn one_trial_of_each_policy(implementation: Implementation, window: Duration) -> Value {
    let _one = LAB.lock().unwrap_or_else(|e| e.into_inner());
    let started = tokio::time::Instant::now();
    let name = implementation.name();
    let json = std::env::temp_dir().join(format!(
        "service-failover-{name}-{}.json",
        std::process::id()
    ));
    let options = Options {
        implementations: vec![implementation],
        policies: vec![Policy::Local, Policy::Cluster],
        trials: 1,
        window,
        nodes: 3,
        json: Some(json.clone()),
    };
    let report = service_failover::run(&options, &mut |line| eprintln!("{line}"))
        .unwrap_or_else(|e| panic!("service-failover --impl {name}: {e:#}"));
    assert_eq!(report.results.len(), 2);
    for result in &report.results {
        // A trial fails (and is listed here) when the speakers did not settle on the owner the
        // rule names, when the client's ARP named another, or when nothing answered before.
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
        assert!(
            trial.new_owner.is_some() && trial.new_owner.as_deref() != Some(trial.owner.as_str()),
            "{}: the IP is answered by {:?} after {} powered off",
            result.policy,
            trial.new_owner,
            trial.owner
        );
        assert!(
            trial.long_lived.iter().all(|l| l.ok_before > 0),
            "{}: a long-lived connection was not answered before the fault: {:?}",
            result.policy,
            trial.long_lived
        );
        eprintln!(
            "{} {}: {} powered off, first new request answered after {:.0} ms, {} answering now",
            result.implementation,
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
        assert!(result["impl"] == name, "{result}");
        assert!(result["policy"].is_string(), "{result}");
        assert!(result["first_success_ms"]["p99"].is_f64(), "{result}");
    }
    assert_eq!(value["node_info"].as_array().map(Vec::len), Some(3));
    eprintln!(
        "service-failover {name} test done in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    value
}
