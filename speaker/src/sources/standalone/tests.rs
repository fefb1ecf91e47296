//! The standalone source's pure parts: the snapshot, the schedule, readiness, reloads and its
//! metrics.

use prometheus_client::registry::Registry;

use super::*;
use crate::sources::ready;

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("swimlb-reload-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn a_reload_is_refused_with_its_reason_for_every_bad_file_and_key_file() {
    let dir = temp_dir("refused");
    let keys = dir.join("keys");
    swimlb_config::keyfile::write_key_file(
        &keys,
        &format!("{}\n", swimlb_config::keyfile::encode_key(&[7; 32])),
    )
    .unwrap();
    let file = |extra: &str| {
        format!(
            "cluster: lab\nnode: n1\nbind: 192.0.2.10\nkeyFile: {}\n{extra}groups: [{{name: api, addresses: [192.0.2.100]}}]\n",
            keys.display()
        )
    };
    let path = dir.join("speaker.yaml");
    std::fs::write(&path, file("")).unwrap();
    let running = Standalone::parse(&file("")).unwrap();
    let reason = |path: &Path| prepare_reload(&running, path).err().map(|(r, _)| r);
    assert_eq!(reason(&path), None, "the running file reloads");

    assert_eq!(
        reason(&dir.join("missing.yaml")),
        Some(ReloadFailure::Unreadable)
    );
    std::fs::write(&path, "cluster: lab\nbind: [oops\n").unwrap();
    assert_eq!(reason(&path), Some(ReloadFailure::Invalid));
    std::fs::write(&path, file("").replace("cluster: lab", "cluster: other")).unwrap();
    assert_eq!(reason(&path), Some(ReloadFailure::RestartOnly));
    let groups: String = (0..9)
        .map(|i| format!("  - {{name: g{i}-{}, addresses: [192.0.2.{}], checks: [{{name: c-{}, exec: /bin/true}}]}}\n", "x".repeat(55), 10 + i, "y".repeat(58)))
        .collect();
    let big = file("").replace(
        "groups: [{name: api, addresses: [192.0.2.100]}]\n",
        &format!("groups:\n{groups}"),
    );
    std::fs::write(&path, big).unwrap();
    assert_eq!(reason(&path), Some(ReloadFailure::GossipRecord));

    // The file is fine; the key file was rotated to garbage, then emptied, then removed.
    std::fs::write(&path, file("")).unwrap();
    for garbage in ["not a key\n", "", "# nothing\n"] {
        std::fs::write(&keys, garbage).unwrap();
        let (reason, message) = prepare_reload(&running, &path).unwrap_err();
        assert_eq!(reason, ReloadFailure::Keys, "{garbage:?}");
        assert!(
            message.starts_with(&format!("keyFile {}", keys.display())),
            "{message}"
        );
    }
    std::fs::remove_file(&keys).unwrap();
    assert_eq!(reason(&path), Some(ReloadFailure::Keys));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_refused_reload_is_counted_by_reason_and_clears_the_success_gauge_until_one_applies() {
    let metrics = Metrics::default();
    let mut registry = Registry::default();
    metrics.register(&mut registry);
    let text = |registry: &Registry| {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, registry).unwrap();
        out
    };
    let before = text(&registry);
    assert!(before.contains("swimlb_config_last_reload_successful 1\n"));
    assert!(
        before.contains("swimlb_config_reload_failures_total{reason=\"unreadable\"} 0\n"),
        "every reason exposed at 0 from the start:\n{before}"
    );
    metrics.reload_failed(ReloadFailure::Invalid);
    metrics.reload_failed(ReloadFailure::Keys);
    metrics.reload_failed(ReloadFailure::Keys);
    let after = text(&registry);
    assert!(
        after.contains("swimlb_config_reload_failures_total{reason=\"keys\"} 2\n"),
        "{after}"
    );
    assert!(
        after.contains("swimlb_config_reload_failures_total{reason=\"invalid\"} 1\n"),
        "{after}"
    );
    assert!(
        after.contains("swimlb_config_last_reload_successful 0\n"),
        "{after}"
    );
    metrics.reload_applied();
    assert!(text(&registry).contains("swimlb_config_last_reload_successful 1\n"));
}

fn config(extra: &str) -> Standalone {
    Standalone::parse(&format!(
        "cluster: lab\nnode: n1\nbind: 192.0.2.10\ninsecure: true\n{extra}groups: [{{name: api, addresses: [192.0.2.100, '2001:db8::100'], interface: eth0}}, {{name: web, addresses: [192.0.2.101]}}]"
    ))
    .unwrap()
}

#[test]
fn snapshot_has_every_address_with_its_group_and_interface() {
    let s = snapshot(&config(""));
    assert_eq!(s.len(), 3);
    let api = s.get(&"2001:db8::100".parse().unwrap()).unwrap();
    assert_eq!(api.group.as_deref(), Some("api"));
    assert_eq!(api.interfaces, Interfaces::named(["eth0"]));
    assert_eq!(
        s.get(&"192.0.2.101".parse().unwrap()).unwrap().interfaces,
        Interfaces::Default
    );
}

#[test]
fn every_address_of_a_group_elects_the_same_owner() {
    use crate::model::membership::{GroupHealth, LiveSet, MemberMeta};
    let config = config("");
    let mut live = LiveSet::new();
    for n in ["n1", "n2", "n3", "n4", "n5"] {
        let mut m = MemberMeta::new(n);
        m.settled = true;
        m.announce.links.insert("eth0".into());
        for g in ["api", "web"] {
            m.groups.insert(
                g.into(),
                GroupHealth {
                    priority: 100,
                    checks: vec![],
                },
            );
        }
        live.upsert(m);
    }
    let election = crate::model::election::Election::new("n1", snapshot(&config), &live);
    let a = election.owner(&"192.0.2.100".parse().unwrap());
    let b = election.owner(&"2001:db8::100".parse().unwrap());
    assert!(a.is_some());
    assert_eq!(a, b);
}

#[test]
fn a_reload_names_the_changes_it_does_not_apply() {
    let running = config("");
    assert!(restart_only_changes(&running, &config("")).is_empty());
    let next = config("gossip: {probePeriod: 300ms}\n");
    assert_eq!(restart_only_changes(&running, &next), ["gossip"]);
}

#[test]
fn timing_overrides_apply_and_bad_combinations_are_refused() {
    let t = timing(&config("gossip: {probePeriod: 300ms}\n")).unwrap();
    assert_eq!(t.probe_period, Duration::from_millis(300));
    let t = timing(&config(
        "gossip: {profile: lan, indirectProbes: 5, maxTransmissions: 12, scaleSuspicion: false, notifyDownMembers: true, announceDownPeriod: 1s, announceDownFanout: 2, syncPeriod: 0s, joinRetry: 100ms, maxPacketSize: 1200}\n",
    ))
    .unwrap();
    assert_eq!(
        (
            t.indirect_probes,
            t.max_transmissions,
            t.scale_suspicion,
            t.notify_down_members
        ),
        (5, 12, false, true)
    );
    assert_eq!(
        (
            t.announce_down_period,
            t.announce_down_fanout,
            t.sync_period,
            t.join_retry,
            t.max_packet_size
        ),
        (
            Duration::from_secs(1),
            2,
            Duration::ZERO,
            Duration::from_millis(100),
            1200
        )
    );
    assert!(timing(&config("gossip: {maxPacketSize: 100}\n")).is_err());
    assert!(timing(&config("gossip: {probePeriod: 100ms, probeRtt: 200ms}\n")).is_err());
}

#[test]
fn insecure_rings_of_one_cluster_interoperate_and_differ_across_clusters() {
    let a = key_ring(&config("")).unwrap();
    let b = key_ring(&config("")).unwrap();
    let mut sealed = Vec::new();
    a.seal(b"hello", &mut sealed).unwrap();
    assert_eq!(b.open(&mut sealed).unwrap(), b"hello");
    assert_ne!(insecure_key("lab"), insecure_key("other"));
}

#[test]
fn ready_once_joined_or_when_configured_alone() {
    assert!(ready(Phase::Active, false));
    assert!(!ready(Phase::Joining, false), "peers not reached yet");
    assert!(ready(Phase::Joining, true), "nobody to join");
    assert!(!ready(Phase::Left, true));
    assert!(alone(&config("")));
    assert!(!alone(&config("peers: [192.0.2.11:7946]\n")));
}

#[test]
fn schedule_follows_the_file() {
    let s = schedule(&config("announce: {burst: 3, secondBurstAfter: off}\n"));
    assert_eq!((s.burst, s.second_burst_after), (3, None));
}
