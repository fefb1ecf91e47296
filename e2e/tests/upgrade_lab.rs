//! A rolling upgrade across an envelope version in the namespace lab (`swimlb_e2e::upgrade`):
//! three speakers start with the previous release's wire behaviour, are rolled node by node to
//! the current one, one is rolled back and forward again, all under the chaos checker. Needs
//! root (network namespaces): `#[ignore = "needs root: ..."]`, run with `--include-ignored`.

use std::path::PathBuf;

use swimlb_e2e::netns;
use swimlb_e2e::upgrade;

#[test]
#[ignore = "needs root: network namespaces"]
fn a_rolling_upgrade_across_the_envelope_version_keeps_one_owner_per_vip() {
    netns::require_root("upgrade lab");
    let real = PathBuf::from(env!("CARGO_BIN_EXE_swimlb-lab"));
    let dir = std::env::temp_dir().join(format!("swimlb-upgrade-lab-{}", std::process::id()));
    let outcome =
        upgrade::run(&real, &dir, &mut |line| eprintln!("{line}")).expect("the upgrade run");
    let report = &outcome.report;
    eprint!("{}", report.text());
    eprintln!("started: {:?}", outcome.started);
    eprintln!("mesh moves: {:?}", outcome.mesh_moves);
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(report.counted(), 0, "violations:\n{}", report.text());
    // Every node started as the previous release and was rolled; node 2 back and forward.
    for (i, versions) in upgrade::STARTS.iter().enumerate() {
        let node = format!("node{}", i + 1);
        assert_eq!(
            outcome.started.get(&node).map(Vec::as_slice),
            Some(*versions),
            "{node}"
        );
    }
    // The speakers of this build followed the mesh: version 2 beside a previous-release
    // speaker, version 3 once none was left, 2 again on node 2's rollback, 3 at the end.
    for node in ["node1", "node3"] {
        let moves = &outcome.mesh_moves[node];
        assert_eq!(moves.last(), Some(&3), "{node}: {moves:?}");
        assert!(
            moves.windows(2).any(|w| w == [3, 2]),
            "{node} went back to version 2 on the rollback: {moves:?}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
