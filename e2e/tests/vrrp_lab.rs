//! VRRPv3 beside keepalived, in the namespace lab: keepalived-fast (VRRPv3, `advert_int 0.1`)
//! on node1 and standalone speakers with `vrrp: {vrid: 51, advertInterval: 100ms}` on node2
//! and node3, the client probing the VIP every 10 ms.
//!
//! - beside a keepalived master of higher priority (150) the speakers stay silent: every probe
//!   is answered by node1, and the speakers count the foreign master;
//! - keepalived stopped (priority 0): a speaker takes the VIP;
//! - keepalived started again with a lower priority (50): it stays BACKUP (its own notify FIFO
//!   says so) and never answers, while the speaker owns.
//!
//! - speakers alone with `vrrp:` answer once their routers have listened, and the owner
//!   advertises;
//! - a speaker owner SIGKILLed beside a keepalived backup (priority 50): its successor, of lower
//!   priority, forgets its advertisements when the mesh declares it dead (the owner watch's
//!   pace, not the dead owner's Master_Down_Interval), and keepalived stays BACKUP;
//! - over IPv6 (`ipv6_*`): keepalived-fast as an IPv6 VRRPv3 router (the lab's IPv6 VIP as its
//!   `virtual_ipaddress`, advertising from its link-local address) keeps the speakers silent as
//!   MASTER, hands the VIP to a speaker when stopped and when SIGKILLed, and stays BACKUP
//!   beside a speaker owner; a crashed speaker owner's IPv6 successor takes over on the mesh's
//!   word (the speakers' link-local sources are in their gossip records);
//! - keepalived with `unicast_peer` beside a speaker owner becomes MASTER: it never hears the
//!   speakers (why `convert-keepalived` writes no `vrrp:` for a unicast instance);
//! - `swimlb-lab migrate --from keepalived-fast` runs once and ends with the rule's owner.
//!
//! Root only: `#[ignore = "needs root: ..."]`, run with `--include-ignored` (as `sudo ./test.sh`
//! does). Every wait is bounded; no duration is asserted beyond the functional bounds named.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use swimlb_e2e::demo::http_get;
use swimlb_e2e::failover::{self, Daemons as _, SwimlbDaemons};
use swimlb_e2e::keepalived::VRID;
use swimlb_e2e::lab::VrrpState;
use swimlb_e2e::migrate::keepalived::{Routers, group_vrrp};
use swimlb_e2e::netns::{self, Lab};
use swimlb_e2e::probe::{self, PROBE_PORT, ProbeRecord, Prober};
use tokio::time::Instant;

/// The IPv4 router's gauge (keepalived-fast speaks IPv4 only here).
const FOREIGN_V4: &str = "swimlb_vrrp_foreign_master{group=\"vip\",family=\"ipv4\"}";

/// One lab at a time: two labs competing for the machine's cores would make members look
/// silent.
static LAB: Mutex<()> = Mutex::new(());

/// The lab to oneself, number `n` (run id `<pid>x<n>`); panics, naming `test`, without root.
fn one_lab(test: &str, n: u32) -> (MutexGuard<'static, ()>, Lab) {
    netns::require_root(test);
    let guard = LAB.lock().unwrap_or_else(|e| e.into_inner());
    let id = format!("{}x{n}", std::process::id());
    (
        guard,
        Lab::create_with_id(3, &id).expect("building the lab"),
    )
}

fn program() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_swimlb-lab"))
}

/// Per node, the sum of `/metrics` samples whose line starts with `prefix`.
fn metric(lab: &Lab, prefix: &str) -> Vec<Option<f64>> {
    let nodes: Vec<SocketAddr> = failover::http_addrs(lab);
    let prefix = prefix.to_string();
    probe::in_netns(&lab.client_netns, move || {
        nodes
            .iter()
            .map(|addr| {
                let body = http_get(*addr, "/metrics")?;
                let values: Vec<f64> = body
                    .lines()
                    .filter(|l| l.starts_with(prefix.as_str()))
                    .filter_map(|l| l.split_whitespace().last()?.parse().ok())
                    .collect();
                (!values.is_empty()).then(|| values.iter().sum())
            })
            .collect()
    })
    .expect("metrics")
}

/// The nodes that answered the probes sent from `from` on.
fn answerers(records: &[ProbeRecord], from: Instant) -> Vec<String> {
    let mut names: Vec<String> = records
        .iter()
        .filter(|r| r.sent >= from)
        .filter_map(|r| r.answer.as_ref().map(|(n, _)| n.clone()))
        .collect();
    names.sort();
    names.dedup();
    names
}

fn logs(daemons: &SwimlbDaemons, lab: &Lab) -> String {
    (2..=3)
        .map(|i| std::fs::read_to_string(daemons.log_path(lab, i)).unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n----\n")
}

/// A keepalived MASTER (priority 150) on node1, and speakers on node2 and node3 with the group's
/// `vrrp:` beside it.
struct Beside {
    _one: MutexGuard<'static, ()>,
    lab: Lab,
    responders: Vec<probe::Worker>,
    routers: Routers,
    prober: Prober,
    daemons: SwimlbDaemons,
}

/// Starts keepalived alone on node1 until it is MASTER and answers the client, then the speakers
/// on node2 and node3; checks for 4 s that only keepalived answers and that both speakers count
/// it as the foreign master.
fn speakers_beside_a_keepalived_master(test: &str, n: u32, v6: bool) -> Beside {
    let (_one, mut lab) = one_lab(test, n);
    let mut responders = Vec::new();
    for node in lab.nodes.clone() {
        responders.extend(probe::spawn_responder(&node.netns, &node.name).expect("responder"));
    }
    let (vip, mut routers) = family(v6);
    routers.start(&mut lab, 1, 150).expect("keepalived");
    routers
        .wait_state(1, &VrrpState::Master, Duration::from_secs(10))
        .expect("keepalived alone becomes MASTER");
    let prober = Prober::start(
        &lab.client_netns,
        SocketAddr::new(vip, PROBE_PORT),
        Duration::from_millis(10),
    )
    .expect("prober");
    let owner = failover::wait_for_steady_owner(&prober, 50, Duration::from_secs(10))
        .expect("keepalived answers");
    assert_eq!(owner, "node1");
    let mut daemons = SwimlbDaemons::new(&lab, program()).expect("speaker files");
    let started = Instant::now();
    for i in 2..=3 {
        daemons.group_extra.insert(i, group_vrrp());
        daemons.start(&mut lab, i).expect("a speaker");
    }
    // The speakers join each other, elect an owner and hear keepalived: 4 s of probes.
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(
        answerers(&prober.snapshot(), started),
        ["node1"],
        "a speaker answered beside the keepalived master\n{}",
        logs(&daemons, &lab)
    );
    let foreign = metric(&lab, if v6 { FOREIGN_V6 } else { FOREIGN_V4 });
    assert_eq!(
        (foreign[1], foreign[2]),
        (Some(1.0), Some(1.0)),
        "both speakers count the foreign master: {foreign:?}"
    );
    Beside {
        _one,
        lab,
        responders,
        routers,
        prober,
        daemons,
    }
}

#[test]
#[ignore = "needs root: network namespaces, keepalived and the speakers"]
fn speakers_stay_silent_beside_a_keepalived_master_and_keep_it_backup_when_they_own() {
    let Beside {
        _one,
        mut lab,
        responders,
        mut routers,
        prober,
        daemons,
    } = speakers_beside_a_keepalived_master("vrrp beside keepalived", 1, false);
    let received = metric(&lab, "swimlb_vrrp_adverts_received_total{");
    assert!(
        received[1].is_some_and(|n| n >= 10.0),
        "keepalived's adverts heard: {received:?}"
    );
    assert_eq!(
        routers.state(1),
        Some(VrrpState::Master),
        "no speaker advertised: keepalived stays MASTER"
    );

    // keepalived stops (priority 0, the VIP off eth0): a speaker takes the VIP.
    routers.stop(&mut lab, 1).expect("stopping keepalived");
    let stopped = Instant::now();
    let sample =
        swimlb_e2e::trial::wait_failover(&prober, stopped, "node1", Duration::from_secs(5))
            .unwrap_or_else(|| panic!("no speaker took over\n{}", logs(&daemons, &lab)));
    eprintln!("keepalived stopped -> speaker answering: {sample:?}");
    let speaker = failover::wait_for_steady_owner(&prober, 50, Duration::from_secs(10))
        .expect("a speaker answers steadily");
    assert!(speaker == "node2" || speaker == "node3", "{speaker}");
    let sent = metric(&lab, "swimlb_vrrp_adverts_sent_total{");
    assert!(
        sent.iter().flatten().any(|n| *n > 0.0),
        "the owner advertises: {sent:?}"
    );

    // keepalived back with a lower priority: it hears the speaker's adverts and stays BACKUP.
    let back = Instant::now();
    routers.start(&mut lab, 1, 50).expect("keepalived again");
    routers
        .wait_state(1, &VrrpState::Backup, Duration::from_secs(5))
        .expect("keepalived reports BACKUP");
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        routers.state(1),
        Some(VrrpState::Backup),
        "it never became MASTER"
    );
    assert_eq!(
        answerers(&prober.snapshot(), back),
        std::slice::from_ref(&speaker),
        "only the speaker answered while keepalived was BACKUP"
    );
    // The owner's gauge (the other speaker hears the owner itself, a router of the VRID too).
    let foreign = metric(&lab, FOREIGN_V4);
    let at = if speaker == "node2" { 1 } else { 2 };
    assert_eq!(
        foreign[at],
        Some(0.0),
        "a lower keepalived holds nothing: {foreign:?}"
    );
    routers.stop(&mut lab, 1).expect("stopping keepalived");
    drop(prober);
    drop(responders);
}

/// The IPv6 router's gauge.
const FOREIGN_V6: &str = "swimlb_vrrp_foreign_master{group=\"vip\",family=\"ipv6\"}";

/// Waits (at most `limit`) until the last 50 probes were all answered by one node that `fits`
/// (the window holds the former owner's answers for a while); returns it.
fn wait_owner(prober: &Prober, limit: Duration, fits: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let steady = failover::wait_for_steady_owner(prober, 50, left)
            .unwrap_or_else(|e| panic!("no steady owner: {e}"));
        if fits(&steady) {
            return steady;
        }
        assert!(
            Instant::now() < deadline,
            "{steady} still answers after {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Node `index`'s keepalived log, for failure messages.
fn keepalived_log(lab: &Lab, index: usize) -> String {
    let name = &lab.node(index).name;
    std::fs::read_to_string(lab.work_dir().join(format!("keepalived-{name}.log")))
        .unwrap_or_default()
}

/// IPv6 beside a real keepalived (an IPv6 VRRPv3 router advertising from its link-local
/// address to ff02::12): its MASTER (150) keeps the speakers silent; stopped (priority 0) and,
/// back as MASTER, crashed (SIGKILL: Master_Down_Interval), it hands the IPv6 VIP to a
/// speaker; back with 50 it stays BACKUP while the speaker owns.
#[test]
#[ignore = "needs root: network namespaces, keepalived and the speakers"]
fn ipv6_speakers_stay_silent_beside_keepalived_take_over_when_it_stops_or_crashes() {
    let Beside {
        _one,
        mut lab,
        responders,
        mut routers,
        prober,
        daemons,
    } = speakers_beside_a_keepalived_master("vrrp beside keepalived over ipv6", 5, true);
    assert_eq!(routers.state(1), Some(VrrpState::Master));

    // Stopped: priority 0, a speaker takes the VIP at once.
    let stopped = Instant::now();
    routers.stop(&mut lab, 1).expect("stopping keepalived");
    taken_by_a_speaker(&prober, stopped, "keepalived stopped", &daemons, &lab);

    // Back with 150: it preempts the speaker's lower adverts, and the speakers yield again.
    routers.start(&mut lab, 1, 150).expect("keepalived again");
    routers
        .wait_state(1, &VrrpState::Master, Duration::from_secs(5))
        .expect("keepalived preempts");
    wait_owner(&prober, Duration::from_secs(10), |n| n == "node1");

    // Crashed: no priority 0, a speaker takes the VIP after Master_Down_Interval.
    let crashed = Instant::now();
    routers.kill(&mut lab, 1).expect("SIGKILL");
    let speaker = taken_by_a_speaker(&prober, crashed, "keepalived SIGKILLed", &daemons, &lab);

    // Back with 50: it hears the speaker's adverts and stays BACKUP.
    let entered = masters_entered(&lab, 1);
    let back = Instant::now();
    routers.start(&mut lab, 1, 50).expect("keepalived again");
    routers
        .wait_state(1, &VrrpState::Backup, Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("{e}\n{}", keepalived_log(&lab, 1)));
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(routers.state(1), Some(VrrpState::Backup));
    assert_eq!(
        masters_entered(&lab, 1),
        entered,
        "keepalived became MASTER"
    );
    assert_eq!(
        answerers(&prober.snapshot(), back),
        std::slice::from_ref(&speaker),
        "only the speaker answered while keepalived was BACKUP"
    );
    routers.stop(&mut lab, 1).expect("stopping keepalived");
    drop(prober);
    drop(responders);
}

/// Waits until a speaker answers the IPv6 VIP after keepalived on node1 went (`what`, at `at`);
/// returns it.
fn taken_by_a_speaker(
    prober: &Prober,
    at: Instant,
    what: &str,
    daemons: &SwimlbDaemons,
    lab: &Lab,
) -> String {
    let sample = swimlb_e2e::trial::wait_failover(prober, at, "node1", Duration::from_secs(5))
        .unwrap_or_else(|| panic!("no speaker took over\n{}", logs(daemons, lab)));
    eprintln!("ipv6: {what} -> speaker answering: {sample:?}");
    let speaker = wait_owner(prober, Duration::from_secs(10), |n| n != "node1");
    assert!(speaker == "node2" || speaker == "node3", "{speaker}");
    speaker
}

/// Why `convert-keepalived` writes no `vrrp:` for a unicast instance: keepalived with
/// `unicast_peer` (priority 50) beside a speaker owner (100) never hears the speaker's
/// multicast advertisements and becomes MASTER, a second answerer.
#[test]
#[ignore = "needs root: network namespaces, keepalived and the speakers"]
fn unicast_keepalived_does_not_hear_a_speaker_owner_and_becomes_master_beside_it() {
    let (_one, mut lab) = one_lab("unicast keepalived beside speakers", 6);
    let mut daemons = SwimlbDaemons::new(&lab, program()).expect("speaker files");
    for i in 2..=3 {
        daemons.group_extra.insert(i, group_vrrp());
        daemons.start(&mut lab, i).expect("a speaker");
    }
    // The owner advertises once its router has listened.
    let deadline = Instant::now() + Duration::from_secs(15);
    while !metric(&lab, "swimlb_vrrp_adverts_sent_total{")
        .iter()
        .flatten()
        .any(|n| *n > 0.0)
    {
        assert!(
            Instant::now() < deadline,
            "no speaker advertises\n{}",
            logs(&daemons, &lab)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut routers = Routers::unicast();
    routers.start(&mut lab, 1, 50).expect("keepalived");
    routers
        .wait_state(1, &VrrpState::Master, Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("{e}\n{}", keepalived_log(&lab, 1)));
    let received = metric(&lab, "swimlb_vrrp_adverts_received_total{");
    eprintln!("unicast keepalived MASTER beside a speaker owner; the speakers heard {received:?}");
    assert!(
        !keepalived_log(&lab, 1).contains("received higher priority"),
        "keepalived heard a speaker"
    );
    routers.stop(&mut lab, 1).expect("stopping keepalived");
}

/// Each node's `/status`, for failure messages.
fn statuses(lab: &Lab) -> String {
    let nodes: Vec<SocketAddr> = failover::http_addrs(lab);
    probe::in_netns(&lab.client_netns, move || {
        nodes
            .iter()
            .map(|a| http_get(*a, "/status").unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n")
    })
    .unwrap_or_default()
}

#[test]
#[ignore = "needs root: network namespaces and the speakers"]
fn speakers_alone_with_vrrp_answer_after_listening_and_the_owner_advertises() {
    let (_one, mut lab) = one_lab("vrrp without keepalived", 2);
    let mut responders = Vec::new();
    for node in lab.nodes.clone() {
        responders.extend(probe::spawn_responder(&node.netns, &node.name).expect("responder"));
    }
    let mut daemons = SwimlbDaemons::new(&lab, program()).expect("speaker files");
    for i in 1..=3 {
        daemons.group_extra.insert(i, group_vrrp());
    }
    for i in 1..=3 {
        daemons.start(&mut lab, i).expect("a speaker");
    }
    let prober = Prober::start(
        &lab.client_netns,
        SocketAddr::new(IpAddr::V4(netns::vip_v4(0)), PROBE_PORT),
        Duration::from_millis(10),
    )
    .expect("prober");
    let owner = failover::wait_for_steady_owner(&prober, 50, Duration::from_secs(15))
        .unwrap_or_else(|e| panic!("{e}\n{}\n{}", statuses(&lab), logs(&daemons, &lab)));
    let at = owner
        .trim_start_matches("node")
        .parse::<usize>()
        .expect("a node")
        - 1;
    let sent = metric(
        &lab,
        "swimlb_vrrp_adverts_sent_total{group=\"vip\",family=\"ipv4\"}",
    );
    assert!(
        sent[at].is_some_and(|n| n > 0.0),
        "{owner} advertises: {sent:?}"
    );
    drop(prober);
    drop(responders);
}

/// How many times node `index`'s keepalived entered MASTER, by its log.
fn masters_entered(lab: &Lab, index: usize) -> usize {
    let log = lab
        .work_dir()
        .join(format!("keepalived-{}.log", lab.node(index).name));
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .matches("Entering MASTER STATE")
        .count()
}

#[test]
#[ignore = "needs root: network namespaces, keepalived and the speakers"]
fn a_crashed_speaker_owner_is_succeeded_by_the_meshs_word_and_keepalived_stays_backup() {
    crashed_speaker_owner("vrrp between speakers", 3, false);
}

/// The same over IPv6: the speakers advertise from their link-local addresses, which their
/// gossip records announce, and keepalived is an IPv6 VRRPv3 router.
#[test]
#[ignore = "needs root: network namespaces, keepalived and the speakers"]
fn ipv6_a_crashed_speaker_owner_is_succeeded_by_the_meshs_word_and_keepalived_stays_backup() {
    crashed_speaker_owner("vrrp between speakers over ipv6", 4, true);
}

/// The lab's VIP of the family (`v6`), and keepalived-fast's routers for it.
fn family(v6: bool) -> (IpAddr, Routers) {
    if v6 {
        (IpAddr::V6(netns::vip_v6(0)), Routers::ipv6())
    } else {
        (IpAddr::V4(netns::vip_v4(0)), Routers::default())
    }
}

/// Waits until node2 watches node3 on the owner watch and hears its heartbeats (before that,
/// the gossip alone would find node3's crash).
fn wait_watching(lab: &Lab) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let watched = metric(lab, "swimlb_owner_watch_watched");
        let received = metric(lab, "swimlb_owner_watch_received");
        if watched[1].is_some_and(|n| n >= 1.0) && received[1].is_some_and(|n| n > 0.0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "node2 does not watch node3: watched {watched:?}, received {received:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn crashed_speaker_owner(test: &str, n: u32, v6: bool) {
    let (_one, mut lab) = one_lab(test, n);
    let (vip, mut routers) = family(v6);
    let mut responders = Vec::new();
    for node in lab.nodes.clone() {
        responders.extend(probe::spawn_responder(&node.netns, &node.name).expect("responder"));
    }
    // node3 owns with 120; node2, its successor, has 100: it hears node3's adverts as a
    // router that wins against it.
    let mut daemons = SwimlbDaemons::new(&lab, program()).expect("speaker files");
    for i in 2..=3 {
        // Adverts every 200 ms: keepalived (VRRPv3) learns the master's interval, and its
        // Master_Down_Interval (760 ms at 50) leaves the owner watch (about 110 ms) a margin
        // a loaded machine does not eat.
        let extra = format!(
            "    priority: {{node3: 120}}\n    vrrp: {{vrid: {VRID}, advertInterval: 200ms}}\n"
        );
        daemons.group_extra.insert(i, extra);
        daemons.start(&mut lab, i).expect("a speaker");
    }
    let prober = Prober::start(
        &lab.client_netns,
        SocketAddr::new(vip, PROBE_PORT),
        Duration::from_millis(10),
    )
    .expect("prober");
    let owner = failover::wait_for_steady_owner(&prober, 50, Duration::from_secs(15))
        .unwrap_or_else(|e| panic!("{e}\n{}\n{}", statuses(&lab), logs(&daemons, &lab)));
    assert_eq!(owner, "node3", "the higher priority owns");
    // keepalived beside them with 50: it hears node3 (120) and stays BACKUP.
    routers.start(&mut lab, 1, 50).expect("keepalived");
    routers
        .wait_state(1, &VrrpState::Backup, Duration::from_secs(5))
        .expect("keepalived reports BACKUP");
    let entered = masters_entered(&lab, 1);
    wait_watching(&lab);

    let fault = Instant::now();
    daemons.signal(&mut lab, 3, "KILL").expect("SIGKILL");
    let sample = swimlb_e2e::trial::wait_failover(&prober, fault, "node3", Duration::from_secs(5))
        .unwrap_or_else(|| panic!("nobody took over\n{}", logs(&daemons, &lab)));
    eprintln!("speaker owner SIGKILLed -> successor answering ({vip}): {sample:?}");
    // The steady window is the last 50 probes: node3's answers leave it first.
    let deadline = Instant::now() + Duration::from_secs(10);
    let successor = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let steady = failover::wait_for_steady_owner(&prober, 50, left)
            .unwrap_or_else(|e| panic!("{e}\n{}", logs(&daemons, &lab)));
        if steady != "node3" || Instant::now() > deadline {
            break steady;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(successor, "node2");
    // Two seconds of probes while node2 owns: keepalived (50) hears it and stays BACKUP.
    std::thread::sleep(Duration::from_secs(2));
    // node3's probe responder answers until the client has node2's MAC: from node2's first
    // answer on, only node2.
    let records = prober.snapshot();
    let took = records
        .iter()
        .find(|r| r.sent >= fault && r.answer.as_ref().is_some_and(|(n, _)| n != "node3"))
        .map(|r| r.sent)
        .expect("a successor answered");
    assert_eq!(
        answerers(&records, took),
        ["node2"],
        "only the successor answered after it took over"
    );
    assert_eq!(routers.state(1), Some(VrrpState::Backup));
    assert_eq!(
        masters_entered(&lab, 1),
        entered,
        "keepalived became MASTER while a speaker was alive"
    );
    // node2 let node3's advertisements go by the mesh's word, not by their Master_Down_Interval.
    let log = std::fs::read_to_string(daemons.log_path(&lab, 2)).unwrap_or_default();
    let label = if v6 { "ipv6" } else { "ipv4" };
    assert!(
        log.lines()
            .any(|l| l.contains("a fellow speaker left the mesh") && l.contains(label)),
        "node2 waited for node3's {label} adverts to time out\n{log}"
    );
    routers.stop(&mut lab, 1).expect("stopping keepalived");
    drop(prober);
    drop(responders);
}

/// `swimlb-lab migrate --from keepalived-fast` once (one crash per mixed state): the switch
/// ends with the rule's owner answering and named by every speaker, each crash of
/// keepalived's MASTER beside speakers was taken over, and the chaos checker's invariants held
/// over the whole run.
#[test]
#[ignore = "needs root: network namespaces, keepalived and the speakers"]
fn migrate_from_keepalived_fast_ends_with_the_rules_owner() {
    netns::require_root("migrate --from keepalived-fast");
    let _guard = LAB.lock().unwrap_or_else(|e| e.into_inner());
    let options = swimlb_e2e::migrate::keepalived::Options { trials: 1 };
    let report =
        swimlb_e2e::migrate::keepalived::run(program(), &options, &mut |l| eprintln!("{l}"))
            .unwrap_or_else(|e| panic!("{e:#}"));
    eprint!("{}", report.table());
    assert!(report.final_owner_ok, "{}", report.table());
    assert_eq!(
        report.violated().count(),
        0,
        "the chaos checker's invariants\n{}",
        report.table()
    );
    assert_eq!(report.steps.len(), 3);
    assert_eq!(report.failovers.len(), 2);
    for f in &report.failovers {
        assert_eq!(f.failover_ms.len(), 1, "{f:?}");
    }
}
