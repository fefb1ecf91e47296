//! Moves decided by the API: a compaction, endpoints handed over between speakers.

use super::*;

#[test]
#[ignore = "needs root: network namespaces, real nodes"]
fn an_owner_cut_off_from_the_api_server_across_a_compaction_lets_go_of_an_excluded_ip() {
    let _one = one_lab("kubernetes watches after etcd compaction");
    let mut run = Running::start(11);
    let (_prober, owner) = run.settle();
    let vip = netns::vip_v4(0).to_string();
    let index = run.index_of(&owner);
    // The owner's node loses the API server, not the gossip: it keeps answering, and misses
    // what follows.
    run.cut_api(index, true);
    run.set_excluded(&owner, true);
    // The history the owner last saw is compacted away, and the restarted API server's
    // cache starts after it: the owner's watches resume into 410 Gone.
    let revision = run.cluster().control_plane().compact_etcd().unwrap();
    eprintln!("etcd compacted at revision {revision}");
    run.set_api_server(false);
    run.set_api_server(true);
    run.cut_api(index, false);
    // It relists, sees its node excluded and lets go: one owner, named by everyone.
    let moved = run
        .owner_of(&vip, |o| o.is_some() && o != Some(owner.as_str()))
        .unwrap();
    let want = vec![run.mac_of(&moved)];
    assert_eq!(run.answerers_become(netns::vip_v4(0), &want), want);
    if let Err(seen) = run.placed_on(&moved, PLACED) {
        panic!(
            "{moved} never held the VIP in every way: {seen}\n{}",
            run.logs()
        );
    }
    // Whether the owner learnt of its exclusion by relisting after 410 Gone, or from the event
    // itself when it arrived before its connection was reset (both happen), is reported.
    let log = run.speaker_log(index);
    let relisted = ["410", "Expired", "too old"]
        .iter()
        .any(|w| log.contains(w));
    eprintln!("{owner} let go of the VIP; its watches met 410 Gone: {relisted}");
}

/// `swimlb-lab handover` on real nodes (a real kubelet, containerd and kube-proxy per node) for
/// three moves of a Local-policy Service's endpoint (node1 -> node2 -> node3 -> node1): each
/// move is measured, that is, before it the cluster was fully up, every speaker named the old
/// owner and it alone answered ARP, and after it the new owner alone answered for good and every
/// speaker named it. The dual and dark figures are printed, not asserted
/// (docs/src/development/lab.md, "`swimlb-lab handover`").
#[test]
#[ignore = "needs root: network namespaces, real nodes"]
fn endpoint_moves_decided_by_the_api_are_handed_over_between_speakers() {
    let _one = one_lab("kubernetes handover");
    let options = swimlb_e2e::handover::Options {
        nodes: 3,
        trials: 3,
        busy: 0,
        starve: None,
        api_lag: None,
    };
    let report = swimlb_e2e::handover::run(&options, &mut |line| eprintln!("{line}"))
        .expect("the handover run");
    eprint!("{}", report.table());
    assert!(
        report.not_measured.is_empty(),
        "every move measured: {:?}",
        report.not_measured
    );
    assert_eq!(report.samples.len(), 3);
    let path: Vec<&str> = report.samples.iter().map(|s| s.to.as_str()).collect();
    assert_eq!(path, ["node2", "node3", "node1"]);
    assert_eq!(report.node_info.len(), 3, "every Node's kubelet reported");
}
