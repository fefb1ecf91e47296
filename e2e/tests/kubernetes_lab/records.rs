//! Records the RBAC denies, Local policy's endpoints, the API server down, a rolling restart.

use super::*;

/// `swimlb_kubernetes_write_errors_total{resource="servicel2statuses"}` of `node`'s speaker.
fn record_write_errors(run: &Running, node: &str) -> Option<f64> {
    let addr = SocketAddr::from((run.lab.node(run.index_of(node)).v4, failover::HTTP_PORT));
    let body = probe::in_netns(&run.lab.client_netns, move || {
        swimlb_e2e::demo::http_get(addr, "/metrics")
    })
    .ok()??;
    Some(swimlb_e2e::scrape::sum(
        &swimlb_e2e::scrape::samples(&body),
        "swimlb_kubernetes_write_errors_total",
        Some(("resource", "servicel2statuses")),
    ))
}

#[test]
#[ignore = "needs root: network namespaces, real nodes"]
fn a_record_write_the_rbac_denies_is_counted_and_retried_and_the_failover_still_happens() {
    let _one = one_lab("kubernetes RBAC denial");
    let mut run = Running::start(10);
    let (prober, owner) = run.settle();
    // The speakers' Role loses the writes of their records (a manifest edited by hand, or an
    // older one): the real API server answers 403.
    let api = run.cluster().api();
    let role = api
        .get(
            "rbac.authorization.k8s.io/v1",
            "Role",
            Some(NAMESPACE),
            "swimlb-speaker",
        )
        .unwrap()
        .expect("the speakers' Role");
    let read_only = json!({"rules": [
        {"apiGroups": ["swimlb.io"], "resources": ["ipaddresspools", "l2advertisements"],
            "verbs": ["list", "watch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
        {"apiGroups": ["swimlb.io"], "resources": ["servicel2statuses"],
            "verbs": ["list", "watch"]}]});
    api.merge_patch(
        "rbac.authorization.k8s.io/v1",
        "Role",
        Some(NAMESPACE),
        "swimlb-speaker",
        read_only,
        false,
    )
    .unwrap();
    let fault = Instant::now();
    run.lab.set_link(run.index_of(&owner), false).unwrap();
    let taker = wait_for_failover(&run, &prober, fault, &owner);
    // The new owner's write is refused: counted and retried, the speaker keeps running.
    let deadline = Instant::now() + PLACED;
    while record_write_errors(&run, &taker).unwrap_or(0.0) < 2.0 {
        assert!(
            Instant::now() < deadline,
            "{taker} counted no refused record write\n{}",
            run.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        run.cluster().record_node(APPS, SERVICE).as_deref(),
        Some(owner.as_str()),
        "the refused write changed nothing"
    );
    let log = run.speaker_log(run.index_of(&taker));
    assert!(
        log.lines()
            .any(|l| l.contains("ServiceL2Status write failed") && l.contains("forbidden")),
        "{taker}'s log says why the write failed\n{log}"
    );
    // The Role restored: the next retry writes the record.
    api.merge_patch(
        "rbac.authorization.k8s.io/v1",
        "Role",
        Some(NAMESPACE),
        "swimlb-speaker",
        json!({"rules": role["rules"]}),
        false,
    )
    .unwrap();
    assert!(
        run.cluster()
            .wait_record(APPS, SERVICE, PLACED, |n| n == taker)
            .is_some(),
        "the record names {taker} once the Role allows it\n{}",
        run.logs()
    );
    drop(prober);
}

#[test]
#[ignore = "needs root: network namespaces, real nodes"]
fn local_policy_follows_the_ready_endpoints_and_without_one_nobody_answers_and_status_says_why() {
    let _one = one_lab("kubernetes local policy");
    let run = Running::start(2);
    let ip = Ipv4Addr::new(198, 51, 100, 101);
    let api = run.cluster().api();
    api.create(kubelab::service(
        "local",
        &ip.to_string(),
        Policy::Local,
        None,
    ))
    .unwrap();
    api.create(kubelab::endpoint_slice("local", 0, &["node1", "node2"]))
        .unwrap();
    let expected = converge::metallb_owner(&["node1", "node2"], IpAddr::V4(ip));
    let owner = run.owner_of(&ip.to_string(), |o| o.is_some() && o == expected.as_deref());
    let owner = owner.expect("an owner");
    let want = vec![run.mac_of(&owner)];
    assert_eq!(run.answerers_become(ip, &want), want);

    // The endpoints move to node3 alone: the IP follows.
    let slice = json!({"endpoints": [{"addresses": ["203.0.113.30"], "nodeName": "node3",
        "conditions": {"ready": true}}]});
    api.merge_patch(
        "discovery.k8s.io/v1",
        "EndpointSlice",
        Some(APPS),
        "local-0",
        slice,
        false,
    )
    .unwrap();
    run.owner_of(&ip.to_string(), |o| o == Some("node3"));
    let want = vec![run.mac_of("node3")];
    assert_eq!(run.answerers_become(ip, &want), want);

    // No ready endpoint anywhere: nobody answers, and every speaker says why.
    let none = json!({"endpoints": [{"addresses": ["203.0.113.30"], "nodeName": "node3",
        "conditions": {"ready": false, "serving": false}}]});
    api.merge_patch(
        "discovery.k8s.io/v1",
        "EndpointSlice",
        Some(APPS),
        "local-0",
        none,
        false,
    )
    .unwrap();
    run.owner_of(&ip.to_string(), |o| o.is_none());
    let views = kubelab::address_views(&run.lab, &ip.to_string());
    assert!(
        views.iter().all(|v| v
            .as_ref()
            .is_some_and(|v| v.verdict == "no_ready_endpoints")),
        "every speaker's /status gives the reason: {views:?}"
    );
    // The responder may lag `/status` here: in 1 of 5 runs the last owner answered ARP for
    // about 0.4 s after every `/status` said nobody owns the IP (an open problem, in
    // docs/src/development/open-problems.md). Nobody may answer once 2 s have passed.
    let answerers = run.answerers_become(ip, &[]);
    assert!(
        answerers.is_empty(),
        "nobody answers ARP for {ip}, but {answerers:?} do\n{}",
        run.logs()
    );
}

#[test]
#[ignore = "needs root: network namespaces, real nodes"]
fn with_the_api_server_down_a_powered_off_owner_still_moves_and_the_record_is_corrected_after() {
    let _one = one_lab("kubernetes API server outage");
    let mut run = Running::start(3);
    let (prober, owner) = run.settle();
    let _ = run
        .daemons
        .before_fault(&owner, false)
        .unwrap()
        .unwrap_or_else(|reason| panic!("{reason}\n{}", run.logs()));
    run.set_api_server(false);
    let fault = Instant::now();
    run.lab.set_link(run.index_of(&owner), false).unwrap();
    let new_owner = wait_for_failover(&run, &prober, fault, &owner);
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        run.cluster().api().raw_text("/readyz").is_err(),
        "the API server is away: nothing can be written"
    );
    run.set_api_server(true);
    let corrected = run
        .cluster()
        .wait_record(APPS, SERVICE, Duration::from_secs(30), |n| n == new_owner);
    assert!(
        corrected.is_some(),
        "the record was not corrected to {new_owner} once the API server was back\n{}",
        run.logs()
    );
    assert_eq!(
        run.cluster().records().all(),
        vec![(format!("{APPS}/{SERVICE}"), new_owner.clone())],
        "exactly one record, naming the new owner: nothing stale"
    );
    // The old owner comes back (it was cut off: it believed it owned the IP all along, and its
    // record was overwritten behind its back). Whoever the speakers then agree on, the record
    // names it within a few seconds, and there is still one record.
    run.lab.set_link(run.index_of(&owner), true).unwrap();
    std::thread::sleep(Duration::from_secs(5));
    let agreed = run
        .owner_of(&netns::vip_v4(0).to_string(), |o| o.is_some())
        .unwrap();
    assert!(
        run.cluster()
            .wait_record(APPS, SERVICE, Duration::from_secs(15), |n| n == agreed)
            .is_some(),
        "the record does not name {agreed}, the owner the speakers agree on after the heal: {:?}\n{}",
        run.cluster().records().all(),
        run.logs()
    );
    assert_eq!(run.cluster().records().all().len(), 1);
    drop(prober);
}

/// `kubectl rollout restart` of the speakers' DaemonSet: the DaemonSet controller replaces one
/// speaker Pod at a time (the kubelet stops the old container with SIGTERM, the next node's
/// only once the new Pod is Ready).
#[test]
#[ignore = "needs root: network namespaces, real nodes"]
fn a_rolling_restart_of_every_speaker_loses_no_probe() {
    let _one = one_lab("kubernetes rolling restart");
    let mut run = Running::start(4);
    let (prober, _) = run.settle();
    let start = Instant::now();
    run.rollout_restart();
    run.owner_of(&netns::vip_v4(0).to_string(), |o| o.is_some());
    std::thread::sleep(Duration::from_secs(1));
    let records = prober.stop();
    // The last probes' answers may still be in flight.
    let settled = &records[..records.len().saturating_sub(5)];
    let lost: Vec<u64> = settled
        .iter()
        .filter(|r| r.sent >= start && r.answer.is_none())
        .map(|r| r.seq)
        .collect();
    let answered = settled.iter().filter(|r| r.answer.is_some()).count();
    eprintln!(
        "rolling restart: {} probes, {answered} answered, lost {lost:?}, {} owner changes",
        settled.len(),
        probe::owner_changes(settled)
    );
    assert!(
        lost.is_empty(),
        "probes lost during the rolling restart: {lost:?}\n{}",
        run.logs()
    );
}
