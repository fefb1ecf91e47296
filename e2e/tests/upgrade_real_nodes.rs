//! A `kubectl set image` rolling upgrade of the speakers' DaemonSet across the envelope version
//! on three real nodes (kubelet, containerd, kube-proxy), then `kubectl rollout undo`, under the
//! chaos checker's invariants (`swimlb_e2e::upgrade::kubernetes`): the speakers start from the
//! previous release's stand-in (the project's image with `SWIMLB_ENVELOPE_VERSION=2` in its
//! configuration), the DaemonSet's RollingUpdate replaces them node by node with the project's
//! image, and back. Root only (`#[ignore = "needs root: ..."]`).

use swimlb_e2e::upgrade::kubernetes::{self, CURRENT_VERSION, NODES, Options, PREVIOUS_VERSION};

#[test]
#[ignore = "needs root: real kubelets, containerd and kube-proxy in network namespaces"]
fn a_kubectl_set_image_upgrade_and_its_rollback_on_real_nodes_keep_one_owner_per_vip() {
    let started = tokio::time::Instant::now();
    let json = std::env::temp_dir().join(format!("upgrade-real-nodes-{}.json", std::process::id()));
    let options = Options {
        rollback: true,
        json: Some(json.clone()),
    };
    let outcome = kubernetes::run(&options, &mut |line| {
        eprintln!("{:>7.1} s  {line}", started.elapsed().as_secs_f64())
    })
    .unwrap_or_else(|e| panic!("the upgrade on real nodes: {e:#}"));
    eprint!("{}", outcome.text());
    assert_eq!(outcome.counted(), 0, "{}", outcome.text());
    // Both phases rolled every node, one stop per node.
    let names: Vec<String> = (1..=NODES).map(|n| format!("node{n}")).collect();
    assert_eq!(outcome.phases.len(), 2);
    for phase in &outcome.phases {
        let mut stopped = phase.stopped.clone();
        stopped.sort();
        assert_eq!(stopped, names, "{}: {:?}", phase.name, phase.stopped);
        assert!(
            phase.rollout_status.contains("successfully rolled out"),
            "{}: {}",
            phase.name,
            phase.rollout_status
        );
        assert!(phase.requests > 0, "{}: the client ran", phase.name);
    }
    // Each node ran the previous release, the current one, the previous one again; the mesh
    // spoke version 2, then 3 once no previous-release speaker was left, then 2 again.
    for name in &names {
        assert_eq!(
            outcome.started[name],
            [PREVIOUS_VERSION, CURRENT_VERSION, PREVIOUS_VERSION],
            "{name}"
        );
        let moves = &outcome.mesh_versions[name];
        assert_eq!(moves.first(), Some(&PREVIOUS_VERSION), "{name}: {moves:?}");
        assert_eq!(moves.last(), Some(&PREVIOUS_VERSION), "{name}: {moves:?}");
        assert!(moves.contains(&CURRENT_VERSION), "{name}: {moves:?}");
    }
    let _ = std::fs::remove_file(&json);
    eprintln!(
        "upgrade on real nodes done in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}
