//! The lab's namespaces as the failover tests use them. Root only: every test is
//! `#[ignore = "needs root: ..."]` and runs with `--include-ignored` (as `sudo ./test.sh` does).

use swimlb_e2e::netns::{self, Lab};

fn ping(from: &str, to: &str) -> bool {
    Lab::command_in(from, "ping")
        .args(["-c", "1", "-W", "1", to])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

#[test]
#[ignore = "needs root: network namespaces"]
fn nodes_reach_each_other_and_teardown_removes_everything() {
    netns::require_root("nodes_reach_each_other_and_teardown_removes_everything");
    let id = format!("{}x1", std::process::id());
    let mut lab = Lab::create_with_id(3, &id).unwrap();
    let client = lab.client_netns.clone();
    let n2 = lab.node(2).clone();
    assert!(
        ping(&client, &n2.v4.to_string()),
        "client -> node2 over IPv4"
    );
    assert!(
        ping(&client, &n2.v6.to_string()),
        "client -> node2 over IPv6"
    );
    let neigh = lab
        .run_in(&client, "ip", &["neigh", "show", &n2.v4.to_string()])
        .unwrap();
    assert!(
        neigh.contains(&netns::mac_text(n2.mac)),
        "client learned node2's MAC: {neigh}"
    );

    lab.set_link(2, false).unwrap();
    assert!(
        !ping(&client, &n2.v4.to_string()),
        "node2 is unreachable with its link down"
    );
    lab.set_link(2, true).unwrap();
    assert!(ping(&client, &n2.v4.to_string()), "node2 is back");

    let names = lab.namespaces();
    lab.teardown();
    let left = netns::list_namespaces().unwrap();
    for ns in names {
        assert!(!left.contains(&ns), "{ns} survived teardown");
    }
}

#[test]
#[ignore = "needs root: network namespaces"]
fn total_loss_cuts_a_node_off_and_zero_restores_it() {
    netns::require_root("total_loss_cuts_a_node_off_and_zero_restores_it");
    let id = format!("{}x2", std::process::id());
    let lab = Lab::create_with_id(1, &id).unwrap();
    let client = lab.client_netns.clone();
    let n1 = lab.node(1).v4.to_string();
    lab.set_loss(1, 100).unwrap();
    assert!(!ping(&client, &n1));
    lab.set_loss(1, 0).unwrap();
    assert!(ping(&client, &n1));
}

#[test]
#[ignore = "needs root: network namespaces"]
fn a_dead_run_is_cleaned_up_by_the_next() {
    netns::require_root("a_dead_run_is_cleaned_up_by_the_next");
    // A pid that cannot exist (above pid_max's hard limit of 2^22).
    let stale = format!("{}9999999-n1", netns::PREFIX);
    // Other tests of this binary may run cleanup_stale concurrently: only the creation and the
    // final absence are certain.
    // A run interrupted before its cleanup may have left this very name behind.
    let _ = std::process::Command::new("ip")
        .args(["netns", "del", &stale])
        .status();
    let made = std::process::Command::new("ip")
        .args(["netns", "add", &stale])
        .status()
        .unwrap();
    assert!(made.success());
    let stale_dir = std::env::temp_dir().join("swimlb-lab-9999999x1");
    std::fs::create_dir_all(&stale_dir).unwrap();
    netns::cleanup_stale().unwrap();
    assert!(!netns::list_namespaces().unwrap().contains(&stale));
    assert!(
        !stale_dir.exists(),
        "the dead run's work directory is removed"
    );
}

#[test]
#[ignore = "needs root: network namespaces"]
fn the_prober_records_which_node_answers() {
    use std::time::Duration;
    use swimlb_e2e::probe::{self, PROBE_PORT, Prober};
    netns::require_root("the_prober_records_which_node_answers");
    let id = format!("{}x3", std::process::id());
    let lab = Lab::create_with_id(2, &id).unwrap();
    let _r1 = probe::spawn_responder(&lab.node(1).netns, "node1").unwrap();
    let _r2 = probe::spawn_responder(&lab.node(2).netns, "node2").unwrap();
    for target in [lab.node(2).v4.to_string(), format!("[{}]", lab.node(2).v6)] {
        let addr = format!("{target}:{PROBE_PORT}").parse().unwrap();
        let prober = Prober::start(&lab.client_netns, addr, Duration::from_millis(10)).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        let records = prober.stop();
        assert!(records.len() >= 10, "{} probes in 300 ms", records.len());
        let answered: Vec<_> = records.iter().filter_map(|r| r.answer.as_ref()).collect();
        let lost: Vec<u64> = records
            .iter()
            .filter(|r| r.answer.is_none())
            .map(|r| r.seq)
            .collect();
        assert!(
            answered.len() + 2 >= records.len(),
            "{target}: {} probes, lost {lost:?}",
            records.len()
        );
        let others: Vec<&String> = answered
            .iter()
            .map(|(n, _)| n)
            .filter(|n| *n != "node2")
            .collect();
        assert!(others.is_empty(), "{target}: answers from {others:?}");
    }
}
