//! The upgrade page's key rotation (docs/src/install/upgrade.md, "Rotating the gossip key") on
//! real nodes, through the Secret: a new key from `swimlb-speaker keygen` in a speaker's Pod,
//! then three `kubectl patch`es of `swimlb-gossip-key` (the new key second, then first, then the
//! old one dropped), each once every speaker logged `gossip keys replaced` (`kubectl logs`): the
//! real kubelet rewrites the mounted file at its next sync of the Pod (the kubelet's default
//! `syncFrequency`, 1 minute, plus up to half of it as jitter), the speaker reads it every 2 s.
//! Meanwhile the client asks for the Service's IP by ARP every 100 ms and sends it an HTTP
//! request on a new connection every 100 ms. Afterwards: no speaker refused a
//! datagram (the rotation's own failure), the Secret and each mounted file hold the new key
//! alone, no Pod restarted, the owner is the same; and, unless the owner watch took the IP over
//! meanwhile (the owner's process silent past the watch's limit, which a loaded machine does
//! and the rotation does not), only the owner answered ARP and no two requests in a row failed
//! (one alone, between answered ones, is not a dark owner).

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use swimlb_e2e::kubelab;
use swimlb_e2e::lab::{HTTP_PORT, http_get};
use swimlb_e2e::probe::{self, ArpAsker};
use tokio::time::Instant;

use super::install::{NAMESPACE, STAGE, Served, kubectl, wait_for};
use super::{Cluster, container_pid};

/// How long one step may wait for every speaker: the kubelet's sync period (1 minute) and its
/// jitter (half of it), the speaker's 2 s reading, and a margin for a loaded machine.
const STEP_LIMIT: Duration = Duration::from_secs(150);

/// The keys the Secret holds (its `keys`, decoded).
fn secret_keys(cluster: &Cluster) -> String {
    let secret = cluster
        .plane
        .admin()
        .get("v1", "Secret", Some(NAMESPACE), "swimlb-gossip-key")
        .expect("reading the gossip key Secret")
        .expect("the gossip key Secret");
    let bytes: k8s_openapi::ByteString =
        serde_json::from_value(secret["data"]["keys"].clone()).expect("base64 data");
    String::from_utf8(bytes.0).expect("a key file is text")
}

/// How many times speaker Pod `pod` logged that its keys were replaced.
fn replacements(cluster: &Cluster, pod: &str) -> usize {
    kubectl(cluster, &["-n", NAMESPACE, "logs", pod])
        .matches("gossip keys replaced")
        .count()
}

/// Patches the Secret's `keys` to `keys` and waits until every speaker logged its `step`-th
/// replacement; returns how long each took after the patch.
fn step(cluster: &Cluster, served: &Served, step: usize, keys: &str) -> Vec<(String, Duration)> {
    let data =
        serde_json::to_value(k8s_openapi::ByteString(keys.as_bytes().to_vec())).expect("base64");
    let patch = serde_json::json!({"data": {"keys": data}}).to_string();
    let args = [
        "-n",
        NAMESPACE,
        "patch",
        "secret",
        "swimlb-gossip-key",
        "--type",
        "merge",
        "-p",
        &patch,
    ];
    kubectl(cluster, &args);
    let patched = Instant::now();
    let mut done: Vec<(String, Duration)> = Vec::new();
    let what = format!("step {step}: every speaker logging `gossip keys replaced`");
    wait_for(&what, STEP_LIMIT, || {
        for (pod, node) in &served.speakers {
            if !done.iter().any(|(n, _)| n == node) && replacements(cluster, pod) >= step {
                done.push((node.clone(), patched.elapsed()));
            }
        }
        (done.len() == served.speakers.len()).then_some(())
    });
    done
}

/// No speaker refused a datagram (`swimlb_gossip_rejected_total`, every reason 0), from each
/// node's `/metrics` as the client reads it.
fn no_gossip_refused(cluster: &Cluster) {
    for node in &cluster.nodes {
        let addr = SocketAddr::from((node.ip, HTTP_PORT));
        let metrics = probe::in_netns(&cluster.lab.client_netns, move || {
            http_get(addr, "/metrics")
        })
        .expect("the client's namespace")
        .unwrap_or_else(|| panic!("no /metrics from {}", node.name));
        let refused: Vec<&str> = metrics
            .lines()
            .filter(|l| l.starts_with("swimlb_gossip_rejected_total"))
            .filter(|l| !l.ends_with(" 0"))
            .collect();
        assert!(refused.is_empty(), "{}: {refused:?}", node.name);
    }
}

/// How often the client sends a request on a new connection.
const REQUEST_EVERY: Duration = Duration::from_millis(100);

/// One request of the client: when it was sent, whether the `web` Pod's answer came.
#[derive(Debug, Clone, Copy)]
struct Request {
    sent: Instant,
    ok: bool,
}

/// The client: from the client's namespace, `GET /` on a new connection to `ip`:80 every
/// [`REQUEST_EVERY`], each recorded. Light on purpose: the machine's two cores also run both
/// nodes, the control plane and the speakers under test.
struct HttpClient {
    stop: Arc<AtomicBool>,
    requests: Arc<Mutex<Vec<Request>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HttpClient {
    fn start(netns: &str, ip: std::net::Ipv4Addr) -> HttpClient {
        let stop = Arc::new(AtomicBool::new(false));
        let requests: Arc<Mutex<Vec<Request>>> = Arc::default();
        let (flag, log) = (stop.clone(), requests.clone());
        let addr = SocketAddr::from((ip, 80));
        let thread = probe::spawn_in(
            netns,
            "rotation-client",
            || Ok(()),
            move |()| {
                while !flag.load(Ordering::SeqCst) {
                    let sent = Instant::now();
                    let ok = http_get(addr, "/").is_some_and(|body| body.starts_with("web-"));
                    log.lock().expect("requests").push(Request { sent, ok });
                    std::thread::sleep(REQUEST_EVERY.saturating_sub(sent.elapsed()));
                }
            },
        )
        .expect("the client");
        HttpClient {
            stop,
            requests,
            thread: Some(thread),
        }
    }

    fn stop(mut self) -> Vec<Request> {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        std::mem::take(&mut *self.requests.lock().expect("requests"))
    }
}

/// How many times the speakers logged a takeover by the owner watch (the owner's process silent
/// past the watch's limit).
fn watch_takeovers(cluster: &Cluster, served: &Served) -> usize {
    served
        .speakers
        .iter()
        .map(|(pod, _)| {
            kubectl(cluster, &["-n", NAMESPACE, "logs", pod])
                .matches("owner silent on the watch")
                .count()
        })
        .sum()
}

/// The most requests of `stream` (in the order sent) that failed one after another.
fn longest_failed_run(stream: &[Request]) -> usize {
    let mut sorted: Vec<&Request> = stream.iter().collect();
    sorted.sort_by_key(|r| r.sent);
    let (mut longest, mut run) = (0, 0);
    for r in sorted {
        run = if r.ok { 0 } else { run + 1 };
        longest = longest.max(run);
    }
    longest
}

/// Seconds since `start` of `at`, to one decimal.
fn secs(start: Instant, at: Instant) -> String {
    format!("{:.1}", at.saturating_duration_since(start).as_secs_f64())
}

/// Prints when requests failed and when another node answered ARP, and what each speaker logged
/// of its members and ownership, for a rotation that went wrong.
fn report_trouble(
    cluster: &Cluster,
    served: &Served,
    start: Instant,
    requests: &[Request],
    answers: &[probe::ArpAnswers],
) {
    let failed: Vec<String> = requests
        .iter()
        .filter(|r| !r.ok)
        .map(|r| secs(start, r.sent))
        .collect();
    eprintln!("failed requests sent at (s): {}", failed.join(" "));
    let others: Vec<String> = answers
        .iter()
        .filter(|a| a.macs.iter().any(|m| *m != served.owner_mac))
        .map(|a| format!("{:.1}", a.at.as_secs_f64()))
        .collect();
    eprintln!("ARP answered by another node at (s): {}", others.join(" "));
    for (pod, node) in &served.speakers {
        let log = kubectl(cluster, &["-n", NAMESPACE, "logs", pod]);
        let lines: Vec<&str> = log
            .lines()
            .filter(|l| {
                [
                    "member", "owner", "suspect", "down", "refused", "rejected", "replaced",
                ]
                .iter()
                .any(|w| l.contains(w))
            })
            .collect();
        eprintln!("{pod} on {node}:\n{}", lines.join("\n"));
    }
}

/// Runs the rotation (see the module's documentation).
pub(crate) fn rotate_the_gossip_key(cluster: &Cluster, served: &Served) {
    let old = secret_keys(cluster);
    let old = old.trim();
    assert_eq!(
        old.lines().count(),
        1,
        "the controller makes one key: {old}"
    );
    let pod = &served.speakers[0].0;
    let new = kubectl(
        cluster,
        &[
            "-n",
            NAMESPACE,
            "exec",
            pod,
            "--",
            "swimlb-speaker",
            "keygen",
        ],
    );
    let new = new.trim().to_string();
    assert_eq!(new.len(), 44, "one base64 key: {new}");
    let stalls_before = watch_takeovers(cluster, served);
    let netns = &cluster.lab.client_netns;
    let client = HttpClient::start(netns, served.ip);
    let arp = ArpAsker::start(netns, served.ip, Duration::from_millis(100), usize::MAX)
        .expect("the ARP asker");
    let start = Instant::now();
    for (n, keys) in [
        (1, format!("{old}\n{new}\n")),
        (2, format!("{new}\n{old}\n")),
        (3, format!("{new}\n")),
    ] {
        let took = step(cluster, served, n, &keys);
        let took: Vec<String> = took
            .iter()
            .map(|(node, d)| format!("{node} {:.1} s", d.as_secs_f64()))
            .collect();
        eprintln!(
            "step {n}: every speaker replaced its keys ({}), {:.1} s into the rotation",
            took.join(", "),
            start.elapsed().as_secs_f64()
        );
    }
    let (requests, answers) = (client.stop(), arp.stop());
    check_traffic(cluster, served, start, stalls_before, &requests, &answers);
    assert_eq!(secret_keys(cluster).trim(), new);
    for node in &cluster.nodes {
        let pid = container_pid(node, "speaker");
        let keys = PathBuf::from(format!("/proc/{pid}/root/etc/swimlb/gossip/keys"));
        let mounted = std::fs::read_to_string(&keys).expect("the mounted key file");
        assert_eq!(mounted.trim(), new, "{}'s mounted key file", node.name);
    }
    let owner = kubelab::wait_for_owner(&cluster.lab, &served.ip.to_string(), STAGE, |o| {
        o == Some(served.owner.as_str())
    });
    assert!(owner.is_ok(), "the owner moved: {owner:?}");
}

/// The traffic during the rotation and what it left (see the module's documentation).
fn check_traffic(
    cluster: &Cluster,
    served: &Served,
    start: Instant,
    stalls_before: usize,
    requests: &[Request],
    answers: &[probe::ArpAnswers],
) {
    let failed = requests.iter().filter(|r| !r.ok).count();
    let macs: BTreeSet<[u8; 6]> = answers
        .iter()
        .flat_map(|a| a.macs.iter().copied())
        .collect();
    let unanswered = answers.iter().filter(|a| a.macs.is_empty()).count();
    eprintln!(
        "during the rotation ({:.1} s): {} HTTP requests, {failed} failed; {} ARP requests, \
         {unanswered} unanswered (a reply later than 100 ms counts for the next), answered by \
         {} MAC(s)",
        start.elapsed().as_secs_f64(),
        requests.len(),
        answers.len(),
        macs.len()
    );
    if failed > 0 || macs.len() > 1 {
        report_trouble(cluster, served, start, requests, answers);
    }
    // The rotation's own failure is a refused datagram; a takeover by the owner watch (the
    // owner's process silent past the watch's limit: a stalled machine) is not the rotation's.
    no_gossip_refused(cluster);
    let stalls = watch_takeovers(cluster, served) - stalls_before;
    // A dark owner fails every request while it lasts; one request alone failing between two
    // answered ones (a SYN lost to a stale conntrack entry of a reused port, a connect slower
    // than the client's 200 ms on a loaded machine) is not the owner.
    let run = longest_failed_run(requests);
    eprintln!("the longest run of consecutive failed requests: {run}");
    if stalls == 0 {
        assert!(run <= 1, "requests to {} failed {run} in a row", served.ip);
        assert_eq!(
            macs,
            BTreeSet::from([served.owner_mac]),
            "only {} answers for {}",
            served.owner,
            served.ip
        );
    } else {
        eprintln!(
            "{stalls} takeover(s) by the owner watch during the rotation (the owner silent past \
             the watch's limit, then refuted: the machine stalled it, no datagram refused): the \
             traffic is printed above, not asserted"
        );
    }
    super::install::all_ready_without_restart(cluster);
}
