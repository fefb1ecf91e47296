//! Health checks and notify hooks, the preemption delay, IPv6, invalid files, split links.

use super::*;

#[test]
#[ignore = "needs root: network namespaces"]
fn a_failing_health_check_moves_the_vip_in_time_and_runs_the_notify_hooks() {
    let _one = one_lab("health check");
    // The check's timeout may not exceed its interval (runs would overlap). 300 ms rather than
    // a shorter interval: the bound below scales with the check, while the delays a loaded
    // machine adds (process start, scheduling) do not.
    let check = FlagCheck {
        interval: Duration::from_millis(300),
        timeout: Duration::from_millis(300),
        rise: 1,
        fall: 2,
    };
    let mut run = Running::start(5, |lab, daemons| check.install(lab, daemons));
    let dir = run.daemons.dir().to_path_buf();
    let vip = IpAddr::V4(netns::vip_v4(0));
    let (prober, owner) = run.probe_until_steady(vip);
    let fault = Instant::now();
    std::fs::remove_file(dir.join(format!("healthy-{owner}"))).unwrap();
    let sample = wait_for_failover(&prober, fault, &owner, Duration::from_secs(20))
        .unwrap_or_else(|| panic!("no other node answered\n{}", run.logs()));
    let new_owner = first_new_answerer(&prober, fault, &owner).unwrap();
    // The bound: twice the figure `check-config` prints for this file (the check's worst case,
    // interval x fall + timeout, plus one gossip round). That figure is already a worst case
    // for the check (a run rarely takes its whole timeout), so 2x leaves about 3x the usual
    // failover (~0.4-0.5 s here) for a loaded machine.
    let figure = failing_check_figure(&run, run.index_of(&owner));
    let bound = figure * 2;
    eprintln!(
        "health check: {owner} failed its check, {new_owner} answers after {:.0} ms (bound {bound:?})",
        sample.failover_ms
    );
    assert!(
        sample.failover_ms <= bound.as_secs_f64() * 1e3,
        "the VIP moved after {:.0} ms, more than {bound:?}\n{}",
        sample.failover_ms,
        run.logs()
    );
    // Hooks run detached from the decisions: wait (bounded) for their lines.
    let last_line = |node: &str| {
        std::fs::read_to_string(dir.join(format!("notify-{node}.log")))
            .unwrap_or_default()
            .lines()
            .last()
            .map(str::to_string)
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while (last_line(&owner).as_deref() != Some("vip fault")
        || last_line(&new_owner).as_deref() != Some("vip owner"))
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    let history = |node: &str| {
        std::fs::read_to_string(dir.join(format!("notify-{node}.log"))).unwrap_or_default()
    };
    assert_eq!(
        last_line(&owner).as_deref(),
        Some("vip fault"),
        "old owner's hook calls:\n{}",
        history(&owner)
    );
    assert_eq!(
        last_line(&new_owner).as_deref(),
        Some("vip owner"),
        "new owner's hook calls:\n{}",
        history(&new_owner)
    );
    assert!(
        history(&owner).lines().any(|l| l == "vip owner"),
        "the old owner's hook was told it owned the group first:\n{}",
        history(&owner)
    );
    drop(prober);
    run.lab.teardown();
}

#[test]
#[ignore = "needs root: network namespaces"]
fn a_restarted_higher_priority_node_waits_for_its_preempt_delay_before_taking_the_vip_back() {
    let _one = one_lab("preempt delay");
    let delay = Duration::from_secs(5);
    let mut run = Running::start(6, |lab, daemons| {
        for node in &lab.nodes {
            daemons.group_extra.insert(
                node.index,
                format!(
                    "    priority: {{node1: 150, default: 100}}\n    preemptDelay: {}s\n",
                    delay.as_secs()
                ),
            );
        }
    });
    let vip = IpAddr::V4(netns::vip_v4(0));
    let (prober, owner) = run.probe_until_steady(vip);
    assert_eq!(
        owner, "node1",
        "the highest priority owns the VIP at a cold start"
    );
    // Let everybody settle, so node1's restart is the only unsettled start.
    std::thread::sleep(delay + Duration::from_millis(500));
    let fault = Instant::now();
    run.daemons.signal(&mut run.lab, 1, "TERM").unwrap();
    let sample = wait_for_failover(&prober, fault, "node1", Duration::from_secs(10))
        .unwrap_or_else(|| panic!("no other node answered\n{}", run.logs()));
    let backup = first_new_answerer(&prober, fault, "node1").unwrap();
    eprintln!(
        "preempt: node1 stopped, {backup} took over after {:.0} ms",
        sample.failover_ms
    );
    let restart = Instant::now();
    run.daemons.start(&mut run.lab, 1).unwrap();
    // Within 3 s of the restart (well before the 5 s delay) node1 must not answer.
    let early = restart + Duration::from_secs(3);
    while Instant::now() < early {
        std::thread::sleep(Duration::from_millis(50));
    }
    let answered_early: Vec<String> = prober
        .snapshot()
        .iter()
        .filter_map(|r| r.answer.as_ref())
        .filter(|(n, at)| *at >= restart && *at < early && n == "node1")
        .map(|(n, _)| n.clone())
        .collect();
    assert!(
        answered_early.is_empty(),
        "node1 answered {} probes within 3 s of its restart, before its preempt delay\n{}",
        answered_early.len(),
        run.logs()
    );
    // After the delay it settles and, having the higher priority, takes the VIP back.
    let limit = restart + delay + Duration::from_secs(10);
    let back = loop {
        let records = prober.snapshot();
        if let Some((_, at)) = records
            .iter()
            .filter_map(|r| r.answer.as_ref())
            .find(|(n, at)| *at >= restart && n == "node1")
        {
            break Some(*at);
        }
        if Instant::now() > limit {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let back = back.unwrap_or_else(|| panic!("node1 never took the VIP back\n{}", run.logs()));
    eprintln!(
        "preempt: node1 answered again {:.0} ms after its restart (delay {delay:?})",
        back.duration_since(restart).as_secs_f64() * 1e3
    );
    assert!(
        back.duration_since(restart) >= delay,
        "node1 took the VIP back before its preempt delay"
    );
    drop(prober);
    run.lab.teardown();
}

#[test]
#[ignore = "needs root: network namespaces"]
fn an_ipv6_vip_fails_over_when_its_owner_is_powered_off() {
    let _one = one_lab("ipv6");
    let mut run = Running::start(7, |_, _| {});
    let vip = IpAddr::V6(netns::vip_v6(0));
    let (prober, owner) = run.probe_until_steady(vip);
    let index = run.index_of(&owner);
    let fault = Instant::now();
    run.lab.set_link(index, false).unwrap();
    let sample = wait_for_failover(&prober, fault, &owner, Duration::from_secs(10))
        .unwrap_or_else(|| panic!("no other node answered [{vip}]\n{}", run.logs()));
    let new_owner = first_new_answerer(&prober, fault, &owner).unwrap();
    eprintln!(
        "ipv6: {owner} powered off, {new_owner} answers [{vip}] after {:.0} ms, {} probes lost",
        sample.failover_ms, sample.lost_probes
    );
    let (entry, state) = neighbor_entry(&run.lab, vip);
    assert_eq!(
        entry.as_deref(),
        Some(netns::mac_text(run.lab.node(run.index_of(&new_owner)).mac).as_str()),
        "the client's IPv6 neighbor entry ({state}) holds the new owner's MAC"
    );
    drop(prober);
    run.lab.teardown();
}

#[test]
fn an_invalid_file_is_rejected_with_exit_64_and_every_error_listed() {
    let dir = std::env::temp_dir().join(format!("swimlb-labtests-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("bad.yaml");
    std::fs::write(
        &file,
        "cluster: \"\"\nbind: 198.51.100.11:99999\npeers: [nowhere]\ninsecure: true\ncolour: blue\ngroups:\n  - name: vip\n    addresses: [198.51.100.100, 198.51.100.100]\n    preemptDelay: soon\n    checks:\n      - {name: a, tcp: \"127.0.0.1:80\", interval: 5ms, fall: 0}\n      - {name: b}\n",
    )
    .unwrap();
    let out = std::process::Command::new(program())
        .args(["speaker", "standalone", "--config"])
        .arg(&file)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(64),
        "exit status; stderr:\n{stderr}"
    );
    let expected = [
        "colour: unknown field",
        "cluster: must not be empty",
        "bind: `198.51.100.11:99999` is not an address with a port",
        "peers[0]: `nowhere` is not an address with a port",
        "groups[0].preemptDelay: `soon` is not a duration",
        "groups[0].checks[0].interval: must be at least `10ms`",
        "groups[0].checks[0].fall: 0 is out of range",
        "groups[0].checks[1]: needs one of `http`, `tcp` or `exec`",
        "groups[0].addresses[1]: 198.51.100.100 is already listed at groups[0].addresses[0]",
    ];
    for e in expected {
        assert!(stderr.contains(e), "missing `{e}` in:\n{stderr}");
    }
    assert!(
        stderr.contains(&format!("{} error(s)", expected.len())),
        "the count of errors is listed:\n{stderr}"
    );
}

/// Gives node `index` two links into the lab's bridge: its lab link becomes `gos0` (gossip,
/// HTTP, its address) and a new `eth0` without an address announces the VIP.
fn split_gossip_and_announce_links(lab: &Lab, index: usize) {
    let node = lab.node(index);
    let ns = node.netns.as_str();
    let sw = lab.switch_netns.as_str();
    let port = format!("a{index}");
    let mac = netns::mac_text([0x02, 0, 0, 0, 0x01, index as u8]);
    let ip = |args: &[&str]| {
        let out = std::process::Command::new("ip")
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "ip {args:?}: {out:?}");
    };
    ip(&["-n", ns, "link", "set", "eth0", "down"]);
    ip(&["-n", ns, "link", "set", "eth0", "name", "gos0"]);
    ip(&["-n", ns, "link", "set", "gos0", "up"]);
    ip(&[
        "link", "add", "eth0", "netns", ns, "address", &mac, "type", "veth", "peer", "name", &port,
        "netns", sw,
    ]);
    ip(&["-n", sw, "link", "set", &port, "master", "br0"]);
    ip(&["-n", sw, "link", "set", &port, "up"]);
    ip(&["-n", ns, "link", "set", "eth0", "up"]);
}

#[test]
#[ignore = "needs root: network namespaces"]
fn an_owner_whose_announcing_link_goes_down_hands_the_vip_over_and_waits_its_delay_to_take_it_back()
{
    let _one = one_lab("announcing link down");
    let delay = Duration::from_secs(3);
    let mut run = Running::start(13, |lab, daemons| {
        for node in &lab.nodes {
            split_gossip_and_announce_links(lab, node.index);
            daemons.group_extra.insert(
                node.index,
                format!("    preemptDelay: {}s\n", delay.as_secs()),
            );
        }
    });
    let vip = IpAddr::V4(netns::vip_v4(0));
    let (prober, owner) = run.probe_until_steady(vip);
    // Everybody settled: the owner's link return is then the only reason to wait.
    std::thread::sleep(delay + Duration::from_millis(500));
    let index = run.index_of(&owner);
    let ns = run.lab.node(index).netns.clone();
    let fault = Instant::now();
    run.lab
        .run_in(&ns, "ip", &["link", "set", "eth0", "down"])
        .unwrap();
    let sample = wait_for_failover(&prober, fault, &owner, Duration::from_secs(5))
        .unwrap_or_else(|| panic!("nobody took the VIP over\n{}", run.logs()));
    eprintln!(
        "link down: {owner}'s eth0 down, another node answered after {:.0} ms",
        sample.failover_ms
    );
    // The old owner is still a member for everybody: only its announcing link failed.
    for (i, view) in run.views().iter().enumerate() {
        let (_, members) = view
            .as_ref()
            .unwrap_or_else(|| panic!("node{} does not answer", i + 1));
        assert_eq!(*members, 3, "node{} lost a member\n{}", i + 1, run.logs());
    }
    let up = Instant::now();
    run.lab
        .run_in(&ns, "ip", &["link", "set", "eth0", "up"])
        .unwrap();
    let early = up + delay - Duration::from_millis(500);
    while Instant::now() < early {
        std::thread::sleep(Duration::from_millis(50));
    }
    let answered_early = prober
        .snapshot()
        .iter()
        .filter_map(|r| r.answer.as_ref())
        .filter(|(n, at)| *at >= up && *at < early && *n == owner)
        .count();
    assert_eq!(
        answered_early,
        0,
        "{owner} took the VIP back before its preempt delay\n{}",
        run.logs()
    );
    // Once settled again it ranks first again (same hash) and takes the VIP back.
    let limit = up + delay + Duration::from_secs(10);
    let back = loop {
        let found = prober
            .snapshot()
            .iter()
            .filter_map(|r| r.answer.clone())
            .find(|(n, at)| *at >= up && *n == owner)
            .map(|(_, at)| at);
        if found.is_some() || Instant::now() > limit {
            break found;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let back = back.unwrap_or_else(|| panic!("{owner} never took the VIP back\n{}", run.logs()));
    eprintln!(
        "link up: {owner} answered again {:.0} ms after its link came back (delay {delay:?})",
        back.duration_since(up).as_secs_f64() * 1e3
    );
    drop(prober);
    run.lab.teardown();
}
