//! A rolling update's moment: the owner's speaker is replaced while its successor pauses.
//!
//! Seen on real nodes (`kubectl set image`, a loaded machine): the owner's speaker drained and
//! left; its successor, answering for the VIP, was not scheduled for 120 ms, held its answers
//! after the pause, and during that hold heard of the speaker Pods (the terminating one and the
//! new one on the owner's node). The hold waited for as many members as there were Pods' nodes,
//! that is for the new speaker to join, and the VIP went unanswered 2.0 s. The Pods count at
//! start only (`speaker/src/run/hold.rs`): here the successor answers again after its hold's
//! settle time, long before the new speaker starts.

use super::*;
use swimlb_e2e::pause;

/// How long after the successor is continued the owner's new speaker starts (1-2 s on the real
/// nodes; less than the hold's 3 s grace, so a hold that waits for it is seen).
const REPLACED_AFTER: Duration = Duration::from_millis(2000);

/// The length of each speaker's log now.
fn log_lengths(run: &Running) -> Vec<usize> {
    (1..=run.lab.nodes.len())
        .map(|i| {
            std::fs::metadata(run.daemons.log_path(&run.lab, i)).map_or(0, |m| m.len() as usize)
        })
        .collect()
}

/// Waits (at most `limit`) until node `index` has logged `text` past `lengths`.
fn wait_for_log(run: &Running, index: usize, lengths: &[usize], text: &str, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let log = std::fs::read(run.daemons.log_path(&run.lab, index)).unwrap_or_default();
        let from = lengths[index - 1].min(log.len());
        if String::from_utf8_lossy(&log[from..]).contains(text) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "node {index} did not log `{text}` within {limit:?}\n{}",
            run.logs()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The rollout's Pod changes on `node`: the old speaker Pod terminating (a graceful delete:
/// no kubelet finishes it here) and its replacement created and running.
fn replace_pod(run: &Running, node: &str, ip: &str, phase: &str) {
    let api = run.cluster().api();
    let old = format!("speaker-{node}");
    let new = format!("speaker-{node}-next");
    match phase {
        "terminating" => {
            api.delete("v1", "Pod", Some(NAMESPACE), &old)
                .expect("deleting the old speaker Pod");
        }
        _ => {
            let labels = api
                .get("v1", "Pod", Some(NAMESPACE), &old)
                .expect("reading the old speaker Pod")
                .and_then(|pod| pod["metadata"]["labels"].as_object().cloned())
                .expect("the old speaker Pod's labels");
            api.create(json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": new, "namespace": NAMESPACE, "labels": labels},
                "spec": {"nodeName": node, "hostNetwork": true,
                    "serviceAccountName": "swimlb-speaker",
                    "containers": [{"name": "speaker", "image": "swimlb"}]}}))
                .expect("creating the new speaker Pod");
            run.cluster()
                .pod_running(node, NAMESPACE, &new, ip)
                .expect("the new speaker Pod running");
        }
    }
}

#[test]
#[ignore = "needs root: network namespaces"]
fn a_successor_paused_while_the_owners_speaker_is_replaced_answers_before_the_new_one_joins() {
    let _one = one_lab("kubernetes pause in a rollout");
    let mut run = Running::start(12);
    let (prober, owner) = run.settle();
    let o = run.index_of(&owner);
    let owner_ip = run.lab.node(o).v4.to_string();
    // The owner's speaker drains and leaves (SIGTERM, as the kubelet stops it); its successor
    // answers.
    let left = Instant::now();
    run.daemons.signal(&mut run.lab, o, "TERM").unwrap();
    let successor = wait_for_failover(&run, &prober, left, &owner);
    let s = run.index_of(&successor);
    let third = (1..=run.lab.nodes.len())
        .find(|&i| i != o && i != s)
        .unwrap();
    let pid = run
        .daemons
        .pid(&mut run.lab, s)
        .expect("the successor's speaker");
    let other = run
        .daemons
        .pid(&mut run.lab, third)
        .expect("the third speaker");
    let before = log_lengths(&run);
    // A scheduling pause longer than a watcher waits (100 ms), while the old Pod terminates. The
    // loaded machine starved every speaker: the third is stopped around the successor's pause,
    // else its watch would find the successor silent and take the VIP (it does when only the
    // successor stops), and comes back forgetting what it watched.
    let stopped = Instant::now();
    pause::signal(other, "STOP").expect("kill(1)");
    pause::signal(pid, "STOP").expect("kill(1)");
    replace_pod(&run, &owner, &owner_ip, "terminating");
    std::thread::sleep(Duration::from_millis(200));
    pause::signal(pid, "CONT").expect("kill(1)");
    pause::signal(other, "CONT").expect("kill(1)");
    let resumed = Instant::now();
    let paused = "paused longer than a watcher waits";
    wait_for_log(&run, s, &before, paused, Duration::from_secs(2));
    // The new Pod appears in the successor's hold; ARP asks for the VIP every 20 ms until the
    // owner's new speaker starts.
    replace_pod(&run, &owner, &owner_ip, "created");
    let asked = Instant::now();
    let requests = REPLACED_AFTER.saturating_sub(resumed.elapsed()).as_millis() / 20;
    let vip = netns::vip_v4(0);
    let client = run.lab.client_netns.clone();
    let interval = Duration::from_millis(20);
    let claims = probe::arp_claims(&client, vip, None, requests as usize, interval)
        .expect("ARP requests from the client");
    let replaced = Instant::now();
    run.daemons.start(&mut run.lab, o).expect("the new speaker");
    run.owner_of(&vip.to_string(), |n| n.is_some());
    let first = claims.iter().find(|c| c.reply).map(|c| {
        let node = run.lab.nodes.iter().find(|n| n.mac == c.mac);
        let name = node.map_or_else(|| netns::mac_text(c.mac), |n| n.name.clone());
        (name, asked.duration_since(stopped) + c.at)
    });
    eprintln!(
        "{owner}'s speaker left, {successor} paused 200 ms: the first ARP answer for the VIP \
         {:?} after the pause began, the new speaker started {:?} after it",
        first,
        replaced.duration_since(stopped)
    );
    let logs = run.logs();
    drop(prober.stop());
    assert!(
        first.is_some(),
        "nobody answered ARP for the VIP after {successor}'s pause before {owner}'s new \
         speaker started\n{logs}"
    );
}
