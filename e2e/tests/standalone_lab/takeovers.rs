//! Failover: power-off, handover, kill, partition, the owner watch's hard cases.

use super::*;

#[test]
#[ignore = "needs root: network namespaces"]
fn a_powered_off_owner_is_replaced_and_gratuitous_arp_moves_the_clients_neighbor_entry() {
    let _one = one_lab("power-off");
    let mut run = Running::start(1, |_, _| {});
    let vip = IpAddr::V4(netns::vip_v4(0));
    let (prober, owner) = run.probe_until_steady(vip);
    let old = run.lab.node(run.index_of(&owner)).clone();
    let (before, _) = neighbor_entry(&run.lab, vip);
    assert_eq!(before.as_deref(), Some(netns::mac_text(old.mac).as_str()));

    let watcher = AnnouncementWatcher::start(&run.lab.client_netns, vec![vip]).unwrap();
    let fault = Instant::now();
    run.lab.set_link(old.index, false).unwrap();
    // Sample the neighbor entry's states while waiting: the kernel's own re-resolution would
    // go through PROBE/FAILED/INCOMPLETE; a gratuitous ARP replaces the MAC directly.
    let mut states = BTreeSet::new();
    let deadline = fault + Duration::from_secs(10);
    let sample = loop {
        let (_, state) = neighbor_entry(&run.lab, vip);
        states.insert(state);
        if let Some(s) = probe::failover(&prober.snapshot(), fault, &owner) {
            break Some(s);
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let (after, state) = neighbor_entry(&run.lab, vip);
    let sample = sample.unwrap_or_else(|| panic!("no other node answered\n{}", run.logs()));
    let new_owner = first_new_answerer(&prober, fault, &owner).unwrap();
    let new = run.lab.node(run.index_of(&new_owner)).clone();
    std::thread::sleep(Duration::from_millis(100));
    let garps: Vec<_> = watcher
        .seen()
        .into_iter()
        .filter(|a| a.at >= fault && a.mac == mac(new.mac))
        .collect();
    eprintln!(
        "power-off: {owner} -> {new_owner} in {:.0} ms, {} probes lost, neighbor states seen {states:?}",
        sample.failover_ms, sample.lost_probes
    );
    assert_eq!(
        after.as_deref(),
        Some(netns::mac_text(new.mac).as_str()),
        "the client's neighbor entry ({state}) holds the new owner's MAC"
    );
    assert!(
        !states.contains("FAILED") && !states.contains("INCOMPLETE") && state != "FAILED",
        "the entry never went through re-resolution: {states:?}"
    );
    assert!(
        !garps.is_empty(),
        "the client saw a gratuitous ARP from {new_owner}"
    );
    // Without the gratuitous ARP the kernel would keep the dead MAC until its unicast probes
    // failed: at least ucast_solicit x retrans_time after the fault.
    let eth0 = "net.ipv4.neigh.eth0";
    let kernel_floor_ms = read_sysctl_in(
        &run.lab,
        &run.lab.client_netns,
        &format!("{eth0}.ucast_solicit"),
    ) * read_sysctl_in(
        &run.lab,
        &run.lab.client_netns,
        &format!("{eth0}.retrans_time_ms"),
    );
    assert!(
        sample.failover_ms < kernel_floor_ms as f64,
        "traffic moved ({:.0} ms) before the kernel could have re-resolved ({kernel_floor_ms} ms)",
        sample.failover_ms
    );
    drop(prober);
    run.lab.teardown();
}

#[test]
#[ignore = "needs root: network namespaces"]
fn a_gracefully_stopped_owner_hands_over_losing_at_most_two_probes_and_cleans_up() {
    let _one = one_lab("graceful handover");
    let mut run = Running::start(2, |lab, daemons| {
        for node in &lab.nodes {
            let hook = notify_hook(daemons.dir(), &node.name);
            daemons
                .group_extra
                .insert(node.index, format!("    notify: {}\n", hook.display()));
        }
    });
    let vip = IpAddr::V4(netns::vip_v4(0));
    let (prober, owner) = run.probe_until_steady(vip);
    let index = run.index_of(&owner);
    let netns_of_owner = run.lab.node(index).netns.clone();
    assert!(
        run.lab
            .run_in(&netns_of_owner, "ip", &["link", "show", "swimlb0"])
            .is_ok(),
        "the running speaker holds its VIPs on swimlb0"
    );
    let fault = Instant::now();
    run.daemons.signal(&mut run.lab, index, "TERM").unwrap();
    let sample = wait_for_failover(&prober, fault, &owner, Duration::from_secs(10))
        .unwrap_or_else(|| panic!("no other node answered\n{}", run.logs()));
    std::thread::sleep(Duration::from_millis(300));
    let records = prober.stop();
    eprintln!(
        "graceful: {owner} stopped, failover {:.0} ms, {} probes lost",
        sample.failover_ms, sample.lost_probes
    );
    let status = run.daemons.exit_status(index);
    assert!(
        status.is_some_and(|s| s.success()),
        "the stopped speaker exited 0: {status:?}\n{}",
        run.logs()
    );
    assert!(
        run.lab
            .run_in(&netns_of_owner, "ip", &["link", "show", "swimlb0"])
            .is_err(),
        "the stopped speaker removed its swimlb0 holder link"
    );
    assert!(
        sample.lost_probes <= 2,
        "a graceful handover loses at most 2 probes, lost {}\n{}",
        sample.lost_probes,
        run.logs()
    );
    let last = records.iter().rev().find_map(|r| r.answer.as_ref());
    assert!(
        last.is_some_and(|(n, _)| *n != owner),
        "a new owner answers"
    );
    // The drain told the hook once, and the speaker let it run before exiting.
    let calls = std::fs::read_to_string(run.daemons.dir().join(format!("notify-{owner}.log")))
        .unwrap_or_default();
    assert_eq!(
        calls.lines().filter(|l| *l == "vip fault").count(),
        1,
        "one `fault` call when draining:\n{calls}"
    );
    assert_eq!(calls.lines().last(), Some("vip fault"), "{calls}");
    run.lab.teardown();
}

#[test]
#[ignore = "needs root: network namespaces"]
fn a_killed_speaker_is_replaced_and_its_kernel_stays_silent_for_the_vip() {
    let _one = one_lab("killed speaker");
    let mut run = Running::start(3, |_, _| {});
    let v4 = netns::vip_v4(0);
    let (prober, owner) = run.probe_until_steady(IpAddr::V4(v4));
    let index = run.index_of(&owner);
    let killed_mac = run.lab.node(index).mac;
    let fault = Instant::now();
    run.daemons.signal(&mut run.lab, index, "KILL").unwrap();
    let sample = wait_for_failover(&prober, fault, &owner, Duration::from_secs(10))
        .unwrap_or_else(|| panic!("no other node answered\n{}", run.logs()));
    let new_owner = first_new_answerer(&prober, fault, &owner).unwrap();
    let new_mac = netns::mac_text(run.lab.node(run.index_of(&new_owner)).mac);
    eprintln!(
        "kill: {owner} killed, {new_owner} answers after {:.0} ms, {} probes lost",
        sample.failover_ms, sample.lost_probes
    );
    // The killed node still holds the VIP on swimlb0; arp_ignore keeps its kernel from
    // answering for it, even for a request sent to its own MAC.
    let client = run.lab.client_netns.clone();
    let directed = arp_replies(&client, v4, Some(killed_mac), 3);
    assert!(
        directed.is_empty(),
        "ARP requests sent to the killed node's MAC got replies from {directed:?}"
    );
    let broadcast: BTreeSet<String> = arp_replies(&client, v4, None, 3).into_iter().collect();
    assert_eq!(
        broadcast,
        BTreeSet::from([new_mac]),
        "only the new owner answers ARP for the VIP"
    );
    drop(prober);
    run.lab.teardown();
}

#[test]
#[ignore = "needs root: network namespaces"]
fn a_healed_partition_ends_with_exactly_one_node_answering_arp_for_the_vip() {
    let _one = one_lab("partition");
    let mut run = Running::start(4, |_, _| {});
    let v4 = netns::vip_v4(0);
    let (prober, owner) = run.probe_until_steady(IpAddr::V4(v4));
    let index = run.index_of(&owner);
    // Cut the owner off at the IP layer: its gossip is dropped both ways, while its packet
    // socket still sees and answers ARP. Both sides elect an owner.
    let fault = Instant::now();
    run.lab.set_loss(index, 100).unwrap();
    let during = wait_for_failover(&prober, fault, &owner, Duration::from_secs(10));
    assert!(
        during.is_some(),
        "the majority side elected an owner during the partition\n{}",
        run.logs()
    );
    std::thread::sleep(Duration::from_secs(2));
    let client = run.lab.client_netns.clone();
    let split: BTreeSet<String> = arp_replies(&client, v4, None, 2).into_iter().collect();
    eprintln!("partition: {owner} cut off; ARP answerers during the partition: {split:?}");

    let log_lengths = run.log_lengths();
    run.lab.set_loss(index, 0).unwrap();
    let healed = Instant::now();
    // Wait (bounded) until all three speakers see each other and agree on one owner again,
    // five polls in a row.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut streak = 0;
    let (agreed, converged) = loop {
        let seen = run.agreed_owner();
        if let Ok(owner) = &seen {
            streak += 1;
            if streak == 5 {
                break (owner.clone(), healed.elapsed());
            }
        } else {
            streak = 0;
        }
        assert!(
            Instant::now() < deadline,
            "the healed speakers never agreed on an owner for a second: {seen:?}; conflicts counted per node: {:?}\n{}",
            run.conflicts_counted(),
            run.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    // Let any stale answering stop, then ask.
    std::thread::sleep(Duration::from_secs(2));
    let replies = arp_replies(&client, v4, None, 3);
    let macs: BTreeSet<String> = replies.iter().cloned().collect();
    // Not asserted (the issue does not ask): conflicts each speaker counted, i.e. another MAC
    // claiming a VIP it owned (each one answered with a burst of announcements).
    eprintln!(
        "partition healed: all agree on {agreed} ({converged:.1?} after the heal); ARP replies {replies:?}; conflicts counted per node: {:?}",
        run.conflicts_counted()
    );
    assert_eq!(
        macs,
        BTreeSet::from([netns::mac_text(run.lab.node(run.index_of(&agreed)).mac)]),
        "exactly one node (the agreed owner {agreed}) answers ARP for the VIP\n{}",
        run.logs()
    );
    // The heal is one rejoin: the majority side sees the cut node come back once, and nobody
    // sees a majority member go down (the flapping of issue 3).
    let since_heal = run.logs_since(&log_lengths);
    for (i, text) in since_heal.iter().enumerate() {
        let node = &run.lab.nodes[i].name;
        let downs: Vec<&str> = text.lines().filter(|l| l.contains("member down")).collect();
        assert!(
            downs.is_empty(),
            "{node} saw members go down after the heal: {downs:?}\n{}",
            run.logs()
        );
        if *node != owner {
            let ups = text
                .lines()
                .filter(|l| l.contains("member up") && l.contains(owner.as_str()))
                .count();
            assert_eq!(
                ups,
                1,
                "{node} saw {owner} come back {ups} times\n{}",
                run.logs()
            );
        }
    }
    drop(prober);
    run.lab.teardown();
}

#[test]
#[ignore = "needs root: network namespaces"]
fn a_false_takeover_is_refuted_and_the_live_owner_keeps_its_vip() {
    let _one = one_lab("false takeover");
    let mut run = Running::start(14, |_, _| {});
    let v4 = netns::vip_v4(0);
    let (prober, owner) = run.probe_until_steady(IpAddr::V4(v4));
    let index = run.index_of(&owner);
    // The owner's watch port goes deaf and mute for 400 ms while its gossip and its answers go
    // on: its watcher finds it silent, the second check fails, the watcher takes the VIP over
    // and claims it; the owner never hears the claim. Then the owner's heartbeats arrive again.
    let owner_netns = run.lab.node(index).netns.clone();
    let rules = "table inet swimlb_lab_watch {\n  chain in { type filter hook input priority -300; udp dport 7947 drop; }\n  chain out { type filter hook output priority -300; udp sport 7947 drop; }\n}\n";
    netns::nft_apply(&owner_netns, rules).expect("nft");
    std::thread::sleep(Duration::from_millis(400));
    let _ = run.lab.run_in(
        &owner_netns,
        "nft",
        &["delete", "table", "inet", "swimlb_lab_watch"],
    );
    let restored = Instant::now();
    // The watcher counts a refuted takeover.
    let deadline = Instant::now() + Duration::from_secs(10);
    let refuted = loop {
        let counts = run.metric_per_node("swimlb_owner_watch_takeovers_total{result=\"refuted\"}");
        if let Some(i) = counts.iter().position(|c| c.is_some_and(|c| c >= 1.0)) {
            break run.lab.nodes[i].name.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no node counted a refuted takeover: {counts:?}\n{}",
            run.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_ne!(refuted, owner, "the owner cannot take over from itself");
    // One owner again: the live owner, named by every speaker (the other members' accusations
    // made on the claim lapse after 5 s) and alone answering ARP.
    run.wait_until_agreed_on(&owner, Duration::from_secs(15));
    let macs: BTreeSet<String> = arp_replies(&run.lab.client_netns, v4, None, 3)
        .into_iter()
        .collect();
    assert_eq!(
        macs,
        BTreeSet::from([netns::mac_text(run.lab.node(index).mac)]),
        "only {owner} answers ARP for the VIP\n{}",
        run.logs()
    );
    // Nobody was declared down: the gossip never lost the owner.
    let logs = run.logs();
    assert!(!logs.contains("member down"), "a member went down\n{logs}");
    let answered_by_others = prober
        .snapshot()
        .iter()
        .filter(|r| r.sent >= restored + Duration::from_secs(1))
        .filter_map(|r| r.answer.as_ref())
        .filter(|(n, _)| *n != owner)
        .count();
    eprintln!(
        "false takeover by {refuted}, refuted; probes answered by another node from 1 s after the port came back: {answered_by_others}"
    );
    assert_eq!(answered_by_others, 0, "{}", run.logs());
    drop(prober);
    run.lab.teardown();
}

/// The owner's watch port mute (what it sends on 7947 is lost; what it receives arrives) while
/// its gossip and answers go on: its watcher finds it silent, the second check fails, and the
/// watcher takes over and claims. The owner hears the claim, and its refutation reaches the
/// watcher through the gossip while the port is still mute, so the watcher gives the VIP back
/// at once instead of answering beside the owner until the accusation lapses (5 s).
#[test]
#[ignore = "needs root: network namespaces"]
fn with_the_owner_watch_port_mute_its_refutation_arrives_through_the_gossip() {
    let _one = one_lab("watch port mute");
    let mut run = Running::start(15, |_, _| {});
    let v4 = netns::vip_v4(0);
    let (prober, owner) = run.probe_until_steady(IpAddr::V4(v4));
    let index = run.index_of(&owner);
    let asker = probe::ArpAsker::start(&run.lab.client_netns, v4, Duration::from_millis(10), 600)
        .expect("ARP asker");
    std::thread::sleep(Duration::from_millis(500));
    let owner_netns = run.lab.node(index).netns.clone();
    let rules = "table inet swimlb_lab_mute {\n  chain out { type filter hook output priority -300; udp sport 7947 drop; }\n}\n";
    netns::nft_apply(&owner_netns, rules).expect("nft");
    // The refuted takeover is counted while the port is still mute: only the gossip carried
    // the refutation.
    let deadline = Instant::now() + Duration::from_secs(3);
    let refuted = loop {
        let counts = run.metric_per_node("swimlb_owner_watch_takeovers_total{result=\"refuted\"}");
        if let Some(i) = counts.iter().position(|c| c.is_some_and(|c| c >= 1.0)) {
            break Some(run.lab.nodes[i].name.clone());
        }
        if Instant::now() >= deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = run.lab.run_in(
        &owner_netns,
        "nft",
        &["delete", "table", "inet", "swimlb_lab_mute"],
    );
    let answers = asker.stop();
    let refuted = refuted.unwrap_or_else(|| {
        panic!(
            "no refuted takeover within 3 s of the watch port going mute\n{}",
            run.logs()
        )
    });
    assert_ne!(refuted, owner, "the owner cannot take over from itself");
    // How long two MACs answered: from the first request two answered to the last.
    let (dual, dual_span) = probe::dual_span(&answers, Duration::from_millis(10));
    eprintln!(
        "takeover by {refuted} refuted through the gossip; ARP requests every 10 ms answered by two MACs: {dual} (over {} ms)",
        dual_span.as_millis()
    );
    assert!(
        dual_span < Duration::from_secs(1),
        "two MACs answered the VIP over {dual_span:?}\n{}",
        run.logs()
    );
    // The live owner keeps the VIP: every speaker names it again.
    run.wait_until_agreed_on(&owner, Duration::from_secs(10));
    drop(prober);
    run.lab.teardown();
}

/// The owner's link down for a moment (chaos seed 2 found it at 250 ms): its watcher takes the
/// VIP over and claims it, but the owner hears neither the claim nor the gratuitous ARPs. With
/// the link back the watcher hears the owner's heartbeats, the accusation ends refuted and the
/// watcher hands the VIP back; the owner, which never knew it lost the VIP, answers ARP but
/// announces nothing, so both answered until the watcher's hand-over deadline (2 s). Now the
/// watcher tells the owner, which announces: two MACs for much less than that.
#[test]
#[ignore = "needs root: network namespaces"]
fn an_owner_whose_link_was_down_a_moment_announces_the_vip_its_watcher_hands_back() {
    let _one = one_lab("owner link flap");
    let mut run = Running::start(16, |_, _| {});
    let v4 = netns::vip_v4(0);
    let (prober, owner) = run.probe_until_steady(IpAddr::V4(v4));
    let index = run.index_of(&owner);
    let asker = probe::ArpAsker::start(&run.lab.client_netns, v4, Duration::from_millis(10), 600)
        .expect("ARP asker");
    std::thread::sleep(Duration::from_millis(500));
    // 160 ms: the watcher takes over after about 110 ms, while the others' gossip cannot
    // declare the owner down before a failed probe (about 80 ms) and the shortest suspicion
    // (150 ms). With 250 ms (the chaos run's flap) they sometimes did, 3 runs in 6, before the
    // owner could refute: then the owner renews, a case of its own, not this test's.
    run.lab.set_link(index, false).expect("link down");
    std::thread::sleep(Duration::from_millis(160));
    run.lab.set_link(index, true).expect("link up");
    // Past the hand-over deadline: the old code's two MACs would all be seen.
    std::thread::sleep(Duration::from_secs(3));
    let answers = asker.stop();
    let counts = run.metric_per_node("swimlb_owner_watch_takeovers_total{result=\"refuted\"}");
    let refuted: Vec<&str> = counts
        .iter()
        .zip(&run.lab.nodes)
        .filter(|(c, _)| c.is_some_and(|c| c >= 1.0))
        .map(|(_, n)| n.name.as_str())
        .collect();
    let logs = run.logs();
    // What the test is about: a takeover from the live owner, refuted (not the owner declared
    // down: then it would have started again under a new identity). The owner, cut off, may
    // declare others down (they then renew): not this test's matter.
    assert!(
        !refuted.is_empty() && !refuted.contains(&owner.as_str()),
        "no watcher counted a refuted takeover: {counts:?}\n{logs}"
    );
    assert!(
        !logs.contains(&format!("member down member={owner}")),
        "{owner} went down\n{logs}"
    );
    let (dual, dual_span) = probe::dual_span(&answers, Duration::from_millis(10));
    eprintln!(
        "takeover by {refuted:?} refuted; ARP requests every 10 ms answered by two MACs: {dual} (over {} ms)",
        dual_span.as_millis()
    );
    assert!(
        logs.contains("telling it to announce them"),
        "no watcher told the owner\n{logs}"
    );
    assert!(
        dual_span < Duration::from_secs(1),
        "two MACs answered the VIP over {dual_span:?}\n{logs}"
    );
    run.wait_until_agreed_on(&owner, Duration::from_secs(10));
    drop(prober);
    run.lab.teardown();
}

#[test]
#[ignore = "needs root: network namespaces"]
fn the_second_in_line_takes_over_on_the_watch_when_the_owner_and_the_first_fail_together() {
    let _one = one_lab("second in line");
    // The VIP's line is node1, node2, node3; the second VIP's node2, node3, node1.
    let (mut run, prober, before) = Running::node1_owning_two_vips(
        17,
        "{node1: 150, node2: 120, default: 100}",
        "{node2: 150, node3: 120, default: 100}",
    );
    // node1 crashes while node2's link is down: node2, the VIP's first successor, cannot take
    // it; node3 finds node2 silent (it succeeds node2's VIP) and node1 silent (it is second in
    // line for node1's), and takes both over on the watch, before the gossip declares either down.
    run.daemons
        .signal(&mut run.lab, 1, "KILL")
        .expect("killing node1");
    run.lab.set_link(2, false).expect("node2's link down");
    let fault = Instant::now();
    let sample = wait_for_failover(&prober, fault, "node1", Duration::from_secs(10));
    run.lab.set_link(2, true).expect("node2's link up");
    let logs = run.logs_since(&before);
    let sample = sample.unwrap_or_else(|| panic!("no node answered the VIP\n{}", logs.join("\n")));
    let new_owner = first_new_answerer(&prober, fault, "node1").unwrap();
    eprintln!(
        "node1 killed and node2 cut off: {new_owner} answered after {:.0} ms",
        sample.failover_ms
    );
    let node3 = &logs[2];
    for member in ["node1", "node2"] {
        assert!(
            node3.contains(&format!("taking over member={member}")),
            "node3 did not take over from {member} on the watch\n{}",
            logs.join("\n")
        );
    }
    assert_eq!(new_owner, "node3", "{}", logs.join("\n"));
    drop(prober);
    run.lab.teardown();
}

#[test]
#[ignore = "needs root: network namespaces"]
fn the_second_in_line_takes_over_on_the_watch_when_the_owner_and_an_idle_first_die_together() {
    let _one = one_lab("an idle first in line");
    // The VIP's line is node1, node2, node3, the second VIP's node1, node3, node2: node1 owns
    // both, node2 owns nothing, so it sends node3 no heartbeats.
    let (mut run, prober, before) = Running::node1_owning_two_vips(
        18,
        "{node1: 150, node2: 120, default: 100}",
        "{node1: 150, node3: 120, default: 100}",
    );
    // node1 and node2 lose power together (one rack): node3 finds node1 silent and takes the
    // second VIP over (first in line); for the VIP, second in line, it checks node2 on the
    // watch, accuses it when it does not answer and takes that one too, before the gossip
    // declares either down.
    for node in [1, 2] {
        run.daemons
            .signal(&mut run.lab, node, "KILL")
            .expect("killing a speaker");
    }
    let fault = Instant::now();
    let sample = wait_for_failover(&prober, fault, "node1", Duration::from_secs(10));
    let logs = run.logs_since(&before);
    let sample = sample.unwrap_or_else(|| panic!("no node answered the VIP\n{}", logs.join("\n")));
    let new_owner = first_new_answerer(&prober, fault, "node1").unwrap();
    eprintln!(
        "node1 and node2 killed: {new_owner} answered after {:.0} ms",
        sample.failover_ms
    );
    let node3 = &logs[2];
    for said in [
        "checking the member ahead owner=node1 member=node2",
        "taking over member=node1",
    ] {
        assert!(
            node3.contains(said),
            "node3 did not log {said:?}\n{}",
            logs.join("\n")
        );
    }
    // Accused on the check's word: as the VIP's owner once node1 is accused, or ahead in line.
    assert!(
        node3.contains("taking over member=node2")
            || node3.contains("electing without it member=node2"),
        "node3 did not accuse node2 on the watch\n{}",
        logs.join("\n")
    );
    let second = format!("now owner ip={}", netns::vip_v4(1));
    assert!(node3.contains(&second), "{}", logs.join("\n"));
    assert_eq!(new_owner, "node3", "{}", logs.join("\n"));
    drop(prober);
    run.lab.teardown();
}

#[test]
#[ignore = "needs root: network namespaces"]
fn a_node_back_from_a_pause_takes_over_on_the_watch_from_an_owner_that_died_meanwhile() {
    let _one = one_lab("back from a pause");
    // Chaos seed 3's triple fault: node2 and node3 stopped, node1 (owner of both VIPs) powered
    // off, node2 continued a moment later while node3 stays stopped. The lines are node1,
    // node2, node3 and node1, node3, node2.
    let (mut run, prober, before) = Running::node1_owning_two_vips(
        19,
        "{node1: 150, node2: 120, default: 100}",
        "{node1: 150, node3: 120, default: 100}",
    );
    let pid = |run: &mut Running, node| run.daemons.pid(&mut run.lab, node).expect("a speaker");
    let (node2, node3) = (pid(&mut run, 2), pid(&mut run, 3));
    // node2 first, and node3 once node1 declared node2 down: node1 then tells node2 nothing
    // more, so node2 comes back holding node1 and node3 alive, as in the chaos run.
    for (pid, name) in [(node2, "node2"), (node3, "node3")] {
        pause::signal(pid, "STOP").expect("kill(1)");
        let down = format!("member down member={name}");
        run.wait_for_log(1, &before, &down, Duration::from_secs(10));
    }
    run.daemons
        .signal(&mut run.lab, 1, "KILL")
        .expect("killing a speaker");
    std::thread::sleep(Duration::from_millis(80));
    pause::signal(node2, "CONT").expect("kill(1)");
    let resumed = Instant::now();
    // node2 hears nobody: its gossip starts its suspicions over while it is deaf, up to the
    // longest; its watch forgot node1 in the pause. It checks the owner on the watch once its
    // pause hold ends, then node3, ahead of it in the second VIP's line (and in both when the
    // pause renewed node2's identity), and takes both.
    let sample = wait_for_failover(&prober, resumed, "node1", Duration::from_secs(10));
    let second = format!("now owner ip={}", netns::vip_v4(1));
    run.wait_for_log(2, &before, &second, Duration::from_secs(10));
    let logs = run.logs_since(&before);
    pause::signal(node3, "CONT").expect("kill(1)");
    let sample = sample.unwrap_or_else(|| panic!("no node answered the VIP\n{}", logs.join("\n")));
    let new_owner = first_new_answerer(&prober, resumed, "node1").unwrap();
    eprintln!(
        "node1 killed while node2 and node3 were stopped: {new_owner} answered {:.0} ms after \
         node2 was continued",
        sample.failover_ms
    );
    assert_eq!(new_owner, "node2", "{}", logs.join("\n"));
    let said = &logs[1];
    let check = "checking an owner this node is in line for owner=node1";
    assert!(said.contains(check), "{}", logs.join("\n"));
    for member in ["node1", "node3"] {
        let accused = [
            format!("taking over member={member}"),
            format!("electing without it member={member}"),
        ];
        assert!(
            accused.iter().any(|line| said.contains(line.as_str())),
            "node2 did not accuse {member} on the watch\n{}",
            logs.join("\n")
        );
    }
    drop(prober);
    run.lab.teardown();
}
