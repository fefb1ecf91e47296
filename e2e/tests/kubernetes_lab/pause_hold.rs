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

/// How long after the successor is continued the owner's new speaker may start at the
/// earliest (its node's kubelet is held until then; 1-2 s on a loaded machine's real nodes, less
/// than the hold's 3 s grace, so a hold that waits for it is seen).
const REPLACED_AFTER: Duration = Duration::from_millis(2000);

/// The length of each speaker's logs now.
fn log_lengths(run: &Running) -> Vec<usize> {
    (1..=run.lab.nodes.len())
        .map(|i| run.speaker_log(i).len())
        .collect()
}

/// Waits (at most `limit`) until node `index` has logged `text` past `lengths`.
fn wait_for_log(run: &Running, index: usize, lengths: &[usize], text: &str, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let log = run.speaker_log(index);
        let from = lengths[index - 1].min(log.len());
        if log.as_bytes()[from..]
            .windows(text.len())
            .any(|w| w == text.as_bytes())
        {
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

/// The pid of the kubelet in `netns`.
fn kubelet_pid(netns: &str) -> u32 {
    swimlb_e2e::chaos::driver::netns_pids(netns)
        .into_iter()
        .find(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim() == "kubelet")
        })
        .unwrap_or_else(|| panic!("no kubelet runs in {netns}"))
}

/// A process stopped with SIGSTOP, continued when dropped (also when the test fails).
struct Held(u32);

impl Held {
    fn stop(pid: u32) -> Held {
        pause::signal(pid, "STOP").expect("kill(1)");
        Held(pid)
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let _ = pause::signal(self.0, "CONT");
    }
}

/// The speaker Pod on `node` that is not being deleted: its name and uid.
fn speaker_pod(run: &Running, node: &str) -> Option<(String, String)> {
    let pods = run.daemons.cluster().speaker_pods().unwrap_or_default();
    pods.into_iter()
        .find(|p| p["spec"]["nodeName"] == node && p["metadata"]["deletionTimestamp"].is_null())
        .map(|p| {
            let s = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
            (s(&p["metadata"]["name"]), s(&p["metadata"]["uid"]))
        })
}

/// A rolling update's moment on real nodes: the owner's node's kubelet held (so the
/// replacement cannot start before the test lets it), the owner's speaker stopped with SIGTERM
/// as the kubelet stops it, its Pod deleted (terminating) while the successor and the third
/// speaker pause, then removed and the DaemonSet's new Pod created (seen by the successor's
/// hold) while ARP asks for the VIP; then the kubelet continues and starts the new speaker.
#[test]
#[ignore = "needs root: network namespaces, real nodes"]
fn a_successor_paused_while_the_owners_speaker_is_replaced_answers_before_the_new_one_joins() {
    let _one = one_lab("kubernetes pause in a rollout");
    let mut run = Running::start(12);
    let (prober, owner) = run.settle();
    let o = run.index_of(&owner);
    let (old, old_uid) = speaker_pod(&run, &owner).expect("the owner's speaker Pod");
    let kubelet = Held::stop(kubelet_pid(&run.lab.node(o).netns));
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
    let api = run.cluster().api();
    pause::signal(other, "STOP").expect("kill(1)");
    pause::signal(pid, "STOP").expect("kill(1)");
    api.delete("v1", "Pod", Some(NAMESPACE), &old)
        .expect("deleting the old speaker Pod");
    std::thread::sleep(Duration::from_millis(200));
    pause::signal(pid, "CONT").expect("kill(1)");
    pause::signal(other, "CONT").expect("kill(1)");
    let resumed = Instant::now();
    let paused = "paused longer than a watcher waits";
    wait_for_log(&run, s, &before, paused, Duration::from_secs(2));
    // The old Pod removed (as its kubelet would once the container stopped): the DaemonSet
    // creates the new one, which appears in the successor's hold; ARP asks for the VIP every
    // 20 ms until the owner's kubelet may start it.
    api.delete_pod_now(NAMESPACE, &old, &old_uid)
        .expect("removing the old speaker Pod");
    let deadline = Instant::now() + Duration::from_secs(10);
    while speaker_pod(&run, &owner).is_none() {
        assert!(
            Instant::now() < deadline,
            "the DaemonSet made no new speaker Pod on {owner}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let asked = Instant::now();
    let requests = REPLACED_AFTER.saturating_sub(resumed.elapsed()).as_millis() / 20;
    let vip = netns::vip_v4(0);
    let client = run.lab.client_netns.clone();
    let interval = Duration::from_millis(20);
    let claims = probe::arp_claims(&client, vip, None, requests as usize, interval)
        .expect("ARP requests from the client");
    let replaced = Instant::now();
    drop(kubelet);
    run.daemons.start(&mut run.lab, o).expect("the new speaker");
    run.owner_of(&vip.to_string(), |n| n.is_some());
    let first = claims.iter().find(|c| c.reply).map(|c| {
        let node = run.lab.nodes.iter().find(|n| n.mac == c.mac);
        let name = node.map_or_else(|| netns::mac_text(c.mac), |n| n.name.clone());
        (name, asked.duration_since(stopped) + c.at)
    });
    eprintln!(
        "{owner}'s speaker left, {successor} paused 200 ms: the first ARP answer for the VIP \
         {:?} after the pause began, the owner's kubelet continued {:?} after it",
        first,
        replaced.duration_since(stopped)
    );
    let logs = run.logs();
    drop(prober.stop());
    assert!(
        first.is_some(),
        "nobody answered ARP for the VIP after {successor}'s pause before {owner}'s new \
         speaker could start\n{logs}"
    );
}
