//! `service-failover --impl metallb` on real nodes, one short trial of each policy: MetalLB's
//! controller and speaker, built static from the pinned module into images of their own and
//! imported into three real nodes (kubelet, containerd, kube-proxy), run from MetalLB's
//! `metallb-native.yaml` (images replaced, webhook left out) with the same pool, backend and
//! Services as swimlb's test (`service_failover.rs`). Before each fault every speaker must see
//! every member in memberlist and the one node MetalLB's order names must alone announce the IP
//! (checked again by the client's ARP entry). Root only (`#[ignore = "needs root: ..."]`).

use std::time::Duration;

use serde_json::Value;
use swimlb_e2e::kubelab::Policy;
use swimlb_e2e::service_failover::{self, Implementation, Options};

#[test]
#[ignore = "needs root: real kubelets, containerd and kube-proxy in network namespaces"]
fn metallb_from_its_own_images_answers_a_client_again_after_the_owner_powers_off() {
    let started = tokio::time::Instant::now();
    let json =
        std::env::temp_dir().join(format!("service-failover-mlb-{}.json", std::process::id()));
    let options = Options {
        implementations: vec![Implementation::Metallb],
        policies: vec![Policy::Local, Policy::Cluster],
        trials: 1,
        window: Duration::from_secs(12),
        nodes: 3,
        json: Some(json.clone()),
    };
    let report = service_failover::run(&options, &mut |line| eprintln!("{line}"))
        .unwrap_or_else(|e| panic!("service-failover --impl metallb: {e:#}"));
    assert_eq!(report.results.len(), 2);
    for result in &report.results {
        assert_eq!(result.implementation, "metallb");
        // A trial fails (and is listed here) when MetalLB's speakers did not settle on the owner
        // its order names, when the client's ARP named another, or when nothing answered before.
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
        eprintln!(
            "metallb {}: {} powered off, first new request answered after {:.0} ms, {} now",
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
        assert!(result["impl"] == "metallb", "{result}");
        assert!(result["first_success_ms"]["p99"].is_f64(), "{result}");
    }
    assert_eq!(value["node_info"].as_array().map(Vec::len), Some(3));
    eprintln!(
        "service-failover metallb test done in {:.0} s",
        started.elapsed().as_secs_f64()
    );
}
