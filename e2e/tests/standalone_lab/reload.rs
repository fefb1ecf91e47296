//! Reloads by SIGHUP: key rotation, a check right after a reload, a group added.

use super::*;

#[test]
#[ignore = "needs root: network namespaces"]
fn keys_rotated_by_sighup_one_node_at_a_time_never_move_the_vip_or_take_a_member_down() {
    let _one = one_lab("key rotation");
    let mut run = Running::start(9, |_, _| {});
    let (prober, owner) = run.probe_until_steady(IpAddr::V4(netns::vip_v4(0)));
    let steady_from = prober.snapshot().len();
    let lengths = run.log_lengths();
    let dir = run.daemons.dir().to_path_buf();
    let old = std::fs::read_to_string(dir.join("keys")).expect("the lab's key file");
    let new = swimlb_config::keyfile::encode_key(&[0x5a; 32]);
    // The documented procedure: the new key first on each node in turn (the others still seal
    // with the old one), then the old key dropped on each node in turn.
    for keys in [format!("{new}\n{old}"), format!("{new}\n")] {
        for i in 1..=run.lab.nodes.len() {
            let name = run.lab.node(i).name.clone();
            let key_path = dir.join(format!("keys-{name}"));
            swimlb_config::keyfile::write_key_file(&key_path, &keys).unwrap();
            let yaml_path = dir.join(format!("{name}.yaml"));
            let yaml: String = std::fs::read_to_string(&yaml_path)
                .unwrap()
                .lines()
                .map(|l| match l.starts_with("keyFile:") {
                    true => format!("keyFile: {}\n", key_path.display()),
                    false => format!("{l}\n"),
                })
                .collect();
            std::fs::write(&yaml_path, yaml).unwrap();
            let pid = run.daemons.pid(&mut run.lab, i).expect("speaker running");
            let hup = std::process::Command::new("kill")
                .args(["-HUP", &pid.to_string()])
                .status()
                .unwrap();
            assert!(hup.success());
            std::thread::sleep(Duration::from_secs(2));
        }
    }
    let records = prober.snapshot();
    let after = &records[steady_from.saturating_sub(1)..];
    let lost = after.iter().filter(|r| r.answer.is_none()).count();
    eprintln!(
        "key rotation: {} probes while rotating, {lost} lost, owner {owner}",
        after.len()
    );
    for (i, text) in run.logs_since(&lengths).iter().enumerate() {
        let node = &run.lab.nodes[i].name;
        assert_eq!(
            text.matches("gossip keys replaced").count(),
            2,
            "{node} took both key files\n{}",
            run.logs()
        );
        let downs: Vec<&str> = text.lines().filter(|l| l.contains("member down")).collect();
        assert!(
            downs.is_empty(),
            "{node} saw members go down while keys rotated: {downs:?}\n{}",
            run.logs()
        );
    }
    assert_eq!(
        probe::owner_changes(after),
        0,
        "the VIP stayed on {owner} while keys rotated\n{}",
        run.logs()
    );
    drop(prober);
    run.lab.teardown();
}

#[test]
#[ignore = "needs root: network namespaces"]
fn a_check_failing_right_after_a_sighup_that_changed_nothing_still_moves_the_vip() {
    let _one = one_lab("check after reload");
    // rise 3: a check task restarted by the reload would need three passes (600 ms) before a
    // failure could count; a failure within that time would go unreported (the bug this
    // guards against). A slow machine can only make this test pass wrongly, never fail.
    let check = FlagCheck {
        interval: Duration::from_millis(200),
        timeout: Duration::from_millis(200),
        rise: 3,
        fall: 2,
    };
    let mut run = Running::start(10, |lab, daemons| check.install(lab, daemons));
    let dir = run.daemons.dir().to_path_buf();
    let vip = IpAddr::V4(netns::vip_v4(0));
    let (prober, owner) = run.probe_until_steady(vip);
    let index = run.index_of(&owner);
    let lengths = run.log_lengths();
    run.sighup(index);
    run.wait_for_log(
        index,
        &lengths,
        "configuration reloaded",
        Duration::from_secs(10),
    );
    let fault = Instant::now();
    std::fs::remove_file(dir.join(format!("healthy-{owner}"))).unwrap();
    let sample =
        wait_for_failover(&prober, fault, &owner, Duration::from_secs(30)).unwrap_or_else(|| {
            panic!(
                "the owner's failing check went unreported after the reload\n{}",
                run.logs()
            )
        });
    // Functional, not a timing figure: 10x what the check and the gossip should take.
    let bound = (check.detection() + DETECTION_BOUND) * 10;
    eprintln!(
        "check after reload: {owner} failed its check, the VIP moved after {:.0} ms (bound {bound:?})",
        sample.failover_ms
    );
    assert!(
        sample.failover_ms <= bound.as_secs_f64() * 1e3,
        "the VIP moved after {:.0} ms, more than {bound:?}\n{}",
        sample.failover_ms,
        run.logs()
    );
    let reloaded = &run.logs_since(&lengths)[index - 1];
    assert!(
        !reloaded.contains("passing=true"),
        "an unchanged check was not restarted by the reload:\n{reloaded}"
    );
    drop(prober);
    run.lab.teardown();
}

#[test]
#[ignore = "needs root: network namespaces"]
fn a_group_added_by_sighup_is_served_without_moving_or_interrupting_the_first_vip() {
    let _one = one_lab("group added by reload");
    let mut run = Running::start(11, |_, _| {});
    let vip = IpAddr::V4(netns::vip_v4(0));
    let added = IpAddr::V4(netns::vip_v4(1));
    let (prober, owner) = run.probe_until_steady(vip);
    let steady_from = prober.snapshot().len();
    let lengths = run.log_lengths();
    let dir = run.daemons.dir().to_path_buf();
    // The group list ends each file: a second group is appended, on every node in turn.
    for i in 1..=run.lab.nodes.len() {
        let name = run.lab.node(i).name.clone();
        let yaml_path = dir.join(format!("{name}.yaml"));
        let mut yaml = std::fs::read_to_string(&yaml_path).unwrap();
        yaml.push_str(&format!(
            "  - name: second\n    addresses: [{added}]\n    interface: eth0\n"
        ));
        std::fs::write(&yaml_path, yaml).unwrap();
        run.sighup(i);
        run.wait_for_log(
            i,
            &lengths,
            "configuration reloaded",
            Duration::from_secs(10),
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    // The added VIP answers (the lab's responders listen on every address).
    let second = Prober::start(
        &run.lab.client_netns,
        SocketAddr::new(added, PROBE_PORT),
        Duration::from_millis(10),
    )
    .expect("prober");
    let second_owner = failover::wait_for_steady_owner(&second, 100, Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("the added VIP never answered steadily: {e}\n{}", run.logs()));
    let records = prober.snapshot();
    let after = &records[steady_from.saturating_sub(1)..];
    let lost = after.iter().filter(|r| r.answer.is_none()).count();
    eprintln!(
        "group added: {} probes to {vip} while reloading, {lost} lost, owner {owner}; {added} answered by {second_owner}",
        after.len()
    );
    assert_eq!(
        probe::owner_changes(after),
        0,
        "the first VIP stayed on {owner} while groups were added\n{}",
        run.logs()
    );
    assert!(
        after.last().and_then(|r| r.answer.as_ref()).is_some(),
        "the first VIP still answers"
    );
    // The owner never stopped answering for it (a stop and a restart in one step would lose
    // no probe but would show here). The lost-probe allowance is the graceful handover's.
    let owner_log = &run.logs_since(&lengths)[run.index_of(&owner) - 1];
    let stopped: Vec<&str> = owner_log
        .lines()
        .filter(|l| l.contains("no longer owner") && l.contains(&format!("ip={vip} ")))
        .collect();
    assert!(
        stopped.is_empty(),
        "{owner} stopped answering for {vip} during the reload: {stopped:?}"
    );
    assert!(
        lost <= 2,
        "{lost} probes to {vip} were lost while groups were added\n{}",
        run.logs()
    );
    // /status: every node has joined the mesh, and only the owner of each VIP names the
    // interface it announces it on.
    for (i, status) in run.statuses().into_iter().enumerate() {
        let node = run.lab.nodes[i].name.clone();
        let status = status.unwrap_or_else(|| panic!("{node} answers /status"));
        assert_eq!(status["ready"], true, "{node} is ready: {status}");
        for (ip, ip_owner) in [(vip, &owner), (added, &second_owner)] {
            let entry = status["addresses"]
                .as_array()
                .and_then(|a| a.iter().find(|e| e["ip"] == ip.to_string().as_str()))
                .unwrap_or_else(|| panic!("{node} lists {ip}: {status}"));
            let expected = match node == *ip_owner {
                true => serde_json::json!("eth0"),
                false => serde_json::Value::Null,
            };
            assert_eq!(entry["interface"], expected, "{node}, {ip}: {entry}");
        }
    }
    drop(second);
    drop(prober);
    run.lab.teardown();
}
