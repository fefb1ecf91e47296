//! Takeovers: a powered-off owner, an owner that comes back, one cut off from the gossip.

use super::*;

#[test]
#[ignore = "needs root: network namespaces, real nodes"]
fn cluster_policy_metallbs_owner_powered_off_moves_the_ip_the_neighbour_entry_and_the_record() {
    let _one = one_lab("kubernetes cluster policy");
    let mut run = Running::start(1);
    let (prober, owner) = run.settle();
    let names = run.node_names();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let vip = IpAddr::V4(netns::vip_v4(0));
    let expected = converge::metallb_owner(&names, vip);
    assert_eq!(
        Some(&owner),
        expected.as_ref(),
        "MetalLB's order names the owner"
    );
    assert_eq!(
        run.ingress(APPS, SERVICE),
        vec![vip.to_string()],
        "the controller assigned the VIP"
    );
    let record = run
        .daemons
        .before_fault(&owner, false)
        .expect("observing the record")
        .unwrap_or_else(|reason| panic!("{reason}\n{}", run.logs()))
        .expect("a record watch in Kubernetes mode");
    assert_eq!(
        neighbour_mac(&run.lab, vip).as_deref(),
        Some(run.mac_of(&owner).as_str())
    );
    let watcher = AnnouncementWatcher::start(&run.lab.client_netns, vec![vip]).unwrap();
    let fault = Instant::now();
    run.lab.set_link(run.index_of(&owner), false).unwrap();
    let new_owner = wait_for_failover(&run, &prober, fault, &owner);
    std::thread::sleep(Duration::from_millis(100));
    let new_mac = mac(run.lab.node(run.index_of(&new_owner)).mac);
    assert!(
        watcher
            .seen()
            .iter()
            .any(|a| a.at >= fault && a.mac == new_mac),
        "the client saw no gratuitous ARP from {new_owner}"
    );
    assert_eq!(
        neighbour_mac(&run.lab, vip).as_deref(),
        Some(run.mac_of(&new_owner).as_str()),
        "the client's neighbour entry holds the new owner's MAC"
    );
    let (named, _) = record
        .join()
        .unwrap_or_else(|| panic!("the record never changed\n{}", run.logs()));
    assert_eq!(named, new_owner, "the record names the node that answers");
}

/// The owner of a settled lab (MetalLB's, [`Running::settle`] checks) is taken out by `fault`
/// long enough to be declared down, comes back, and gets the VIP back after its preemption delay
/// (`preempt`): not before, and then within a few seconds (the figure is printed; the book's
/// comes from the failover trials).
fn the_owner_gets_its_ip_back_after(run: &mut Running, fault: Fault, preempt: Duration) {
    let (prober, owner) = run.settle();
    // Every speaker settles `preempt` after its start: until then all rank alike and a
    // returning owner takes its IP back at once.
    std::thread::sleep(
        (run.started + preempt + Duration::from_secs(1)).saturating_duration_since(Instant::now()),
    );
    let back = run.out_and_back(&owner, fault, Duration::from_secs(3));
    if !preempt.is_zero() {
        // Its preemption delay restarts when it rejoins, after `back`: before it ends, the
        // VIP stays where it went.
        let early = run.placed_on(&owner, preempt - Duration::from_secs(1));
        assert!(
            early.is_err(),
            "{owner} took the VIP back {:?} after it came back, before its preempt delay of {preempt:?}\n{}",
            early.unwrap(),
            run.logs()
        );
    }
    let limit = preempt.saturating_sub(back.elapsed()) + Duration::from_secs(10);
    if let Err(seen) = run.placed_on(&owner, limit) {
        panic!(
            "{owner} did not get the VIP back within {limit:?} of its preempt delay: {seen}\n{}",
            run.logs()
        );
    }
    eprintln!(
        "{owner} came back ({fault:?}) and holds the VIP again {:?} later (preempt delay {preempt:?})",
        back.elapsed()
    );
    drop(prober);
}

#[test]
#[ignore = "needs root: network namespaces, real nodes"]
fn a_powered_off_owner_that_comes_back_gets_its_ip_back() {
    let _one = one_lab("kubernetes owner back after a poweroff");
    let mut run = Running::start(7);
    the_owner_gets_its_ip_back_after(&mut run, Fault::PowerOff, Duration::ZERO);
}

#[test]
#[ignore = "needs root: network namespaces, real nodes"]
fn a_returning_owner_waits_for_its_preempt_delay_before_taking_its_ip_back() {
    let _one = one_lab("kubernetes owner back after its preempt delay");
    let mut run = Running::start_with(8, &["--preempt-delay", "30s"]);
    the_owner_gets_its_ip_back_after(&mut run, Fault::PowerOff, Duration::from_secs(30));
}

#[test]
#[ignore = "needs root: network namespaces, real nodes"]
fn an_owner_cut_off_from_the_gossip_gets_its_ip_back_when_the_cut_heals() {
    let _one = one_lab("kubernetes owner back after a gossip cut");
    let mut run = Running::start(9);
    the_owner_gets_its_ip_back_after(&mut run, Fault::GossipCut, Duration::ZERO);
}
