//! The conversion, keyword by keyword: each mapping read back through the standalone parser,
//! each refusal with its line.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::*;
use crate::standalone::CheckKind;

/// Files in memory.
#[derive(Default)]
pub(super) struct Memory(pub(super) BTreeMap<PathBuf, String>);

impl Files for Memory {
    fn read(&self, path: &Path) -> Result<String, String> {
        self.0
            .get(path)
            .cloned()
            .ok_or_else(|| "No such file or directory".to_string())
    }
    fn list(&self, dir: &Path) -> Result<Vec<String>, String> {
        Ok(self
            .0
            .keys()
            .filter(|p| p.parent() == Some(dir))
            .filter_map(|p| Some(p.file_name()?.to_string_lossy().into_owned()))
            .collect())
    }
}

const FILE: &str = "/etc/keepalived/keepalived.conf";

/// A unicast instance `VI_1` on eth0 with `body` added, after `before`.
fn instance(before: &str, body: &str) -> String {
    format!(
        "{before}\nvrrp_instance VI_1 {{\n    interface eth0\n    virtual_router_id 51\n    priority 101\n    unicast_src_ip 192.0.2.10\n    unicast_peer {{\n        192.0.2.11\n    }}\n    virtual_ipaddress {{\n        192.0.2.100\n    }}\n{body}\n}}\n"
    )
}

fn run(text: &str) -> Result<Converted, Vec<Finding>> {
    convert(
        Some(Path::new(FILE)),
        text,
        &Memory::default(),
        &Options::default(),
    )
}

/// `text` without `instance`'s `unicast_peer` block, converted with the peer on the command
/// line: a multicast keepalived.
fn run_multicast(text: &str) -> Result<Converted, Vec<Finding>> {
    let options = Options {
        peers: vec!["192.0.2.11".parse().unwrap()],
        ..Options::default()
    };
    let text = text.replace("    unicast_peer {\n        192.0.2.11\n    }\n", "");
    convert(Some(Path::new(FILE)), &text, &Memory::default(), &options)
}

fn converted(text: &str) -> (Standalone, Converted) {
    let mut c = run(text).unwrap_or_else(|e| panic!("refused: {e:#?}"));
    let s = Standalone::parse(&c.yaml).unwrap();
    // The VRRPv2 and unicast warnings of `instance`'s text (no `version 3`, `unicast_peer`):
    // their own test below.
    c.warnings
        .retain(|w| w.keyword != "version" && w.keyword != "unicast_peer");
    (s, c)
}

#[test]
fn an_instance_gets_its_vrrp_router_and_v2_is_warned_about() {
    let text = instance("", "    advert_int 0.1");
    let c = run_multicast(&text).expect("converts");
    let s = Standalone::parse(&c.yaml).unwrap();
    let vrrp = s.groups[0].vrrp.expect("vrrp written");
    assert_eq!(
        (vrrp.vrid, vrrp.advert_interval),
        (51, Duration::from_millis(100))
    );
    assert!(
        c.yaml
            .contains("    vrrp: {vrid: 51, advertInterval: 100ms}\n"),
        "{}",
        c.yaml
    );
    let v2: Vec<&Finding> = c
        .warnings
        .iter()
        .filter(|w| w.keyword == "version")
        .collect();
    assert_eq!(v2.len(), 1, "{:?}", c.warnings);
    assert!(v2[0].why.contains("vrrp_version 3"));
    for version in ["global_defs {\n    vrrp_version 3\n}", ""] {
        let body = if version.is_empty() {
            "    version 3"
        } else {
            ""
        };
        let c = run_multicast(&instance(version, body)).expect("converts");
        assert!(
            c.warnings.iter().all(|w| w.keyword != "version"),
            "{:?}",
            c.warnings
        );
    }
    let errors = run_multicast(&instance("", "    advert_int 50")).expect_err("refused");
    assert!(errors[0].to_string().contains("advert_int: `50`: VRRPv3"));
}

#[test]
fn a_unicast_instance_gets_no_vrrp_router_and_says_why() {
    let c = run(&instance("global_defs {\n    vrrp_version 3\n}", "")).expect("converts");
    let s = Standalone::parse(&c.yaml).unwrap();
    assert_eq!(s.groups[0].vrrp, None, "{}", c.yaml);
    let unicast: Vec<&Finding> = c
        .warnings
        .iter()
        .filter(|w| w.keyword == "unicast_peer")
        .collect();
    assert_eq!(unicast.len(), 1, "{:?}", c.warnings);
    assert!(unicast[0].why.contains("no `vrrp:` written"));
    assert!(unicast[0].to_string().starts_with(&format!("{FILE}:")));
}

/// The one refusal of `text`, as printed.
fn refusal(text: &str) -> String {
    let errors = run(text).expect_err("refused");
    assert_eq!(errors.len(), 1, "{errors:#?}");
    errors[0].to_string()
}

#[test]
fn an_instance_becomes_a_group_with_this_nodes_priority() {
    let (s, c) = converted(&instance("global_defs {\n    router_id master-0\n}", ""));
    assert_eq!(s.cluster, "keepalived-51");
    assert_eq!(s.node.as_deref(), Some("master-0"));
    assert_eq!(s.bind.to_string(), "192.0.2.10:7946");
    assert_eq!(s.peers[0].to_string(), "192.0.2.11:7946");
    assert_eq!(s.key_file.as_deref(), Some(Path::new(KEY_FILE)));
    let g = &s.groups[0];
    assert_eq!(g.name, "VI_1");
    assert_eq!(g.addresses, ["192.0.2.100".parse::<IpAddr>().unwrap()]);
    assert_eq!(g.interface.as_deref(), Some("eth0"));
    assert_eq!(g.priority.of("master-0"), 101);
    assert_eq!(
        g.priority.of("master-1"),
        100,
        "keepalived's default for the others"
    );
    assert!(
        c.yaml
            .contains("# keepalived: vrrp_instance VI_1, virtual_router_id 51, advert_int 1\n"),
        "{}",
        c.yaml
    );
}

#[test]
fn the_command_line_names_the_cluster_and_node_and_replaces_the_mesh() {
    let options = Options {
        cluster: Some("api".into()),
        node: Some("n1".into()),
        bind: Some("198.51.100.11".parse().unwrap()),
        peers: vec!["198.51.100.12".parse().unwrap()],
    };
    let c = convert(
        Some(Path::new(FILE)),
        &instance("", ""),
        &Memory::default(),
        &options,
    )
    .unwrap();
    let s = Standalone::parse(&c.yaml).unwrap();
    assert_eq!((s.cluster.as_str(), s.node.as_deref()), ("api", Some("n1")));
    assert_eq!(s.bind.to_string(), "198.51.100.11:7946");
    assert_eq!(s.peers.len(), 1);
    assert_eq!(s.groups[0].priority.of("n1"), 101);
}

#[test]
fn without_a_node_name_the_priority_is_every_nodes() {
    let (s, _) = converted(&instance("", ""));
    assert_eq!(s.node, None);
    assert_eq!(s.groups[0].priority.default, 101);
}

#[test]
fn a_multicast_instance_needs_its_peers_on_the_command_line() {
    let text = "vrrp_instance lab {\n    interface eth0\n    virtual_ipaddress {\n        198.51.100.100/24 dev eth0\n    }\n}\n";
    let errors = run(text).unwrap_err();
    let lines: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert_eq!(
        lines,
        [
            format!(
                "{FILE}:1: unicast_src_ip: no instance gives this node's address: swimlb's gossip needs it; add `--bind ADDRESS`"
            ),
            format!(
                "{FILE}:1: unicast_peer: no unicast_peer: keepalived finds its peers by multicast, swimlb needs their addresses; add `--peer ADDRESS` for each other node"
            ),
        ]
    );
}

#[test]
fn addresses_keep_the_address_and_warn_about_what_does_not_apply() {
    let (s, c) = converted(&instance(
        "",
        "    virtual_ipaddress_excluded {\n        2001:db8::100/64 dev eth0 label eth0:1\n    }",
    ));
    assert_eq!(
        s.groups[0].addresses,
        [
            "192.0.2.100".parse::<IpAddr>().unwrap(),
            "2001:db8::100".parse().unwrap()
        ]
    );
    let warned: Vec<&str> = c.warnings.iter().map(|w| w.why.as_str()).collect();
    assert!(
        warned[0].starts_with("the prefix /64 does not apply"),
        "{warned:?}"
    );
    assert!(
        warned[1].starts_with("`label` does not apply"),
        "{warned:?}"
    );
    assert_eq!(c.warnings[0].line, 14);
}

#[test]
fn an_address_on_another_interface_is_refused_at_its_line() {
    let text = instance(
        "",
        "    virtual_ipaddress_excluded {\n        192.0.2.200/24 dev eth1\n    }",
    );
    assert_eq!(
        refusal(&text),
        format!(
            "{FILE}:14: 192.0.2.200: `dev eth1` is not the instance's interface (eth0): a group announces on one interface; put the address in an instance of its own on eth1"
        )
    );
}

#[test]
fn scripts_become_exec_checks_with_keepalived_weights() {
    let (s, c) = converted(&instance(
        "vrrp_script chk_haproxy {\n    script \"/bin/sh -c 'pidof haproxy'\"\n    interval 2\n    timeout 1.5\n    weight 20\n    rise 3\n    fall 2\n}\nvrrp_script chk_api {\n    script /usr/local/bin/check-api --quick\n    weight -30\n}",
        "    track_script {\n        chk_haproxy\n        chk_api weight -10\n    }",
    ));
    let checks = &s.groups[0].checks;
    assert_eq!(checks.len(), 2);
    assert_eq!(checks[0].name, "chk_haproxy");
    assert!(
        matches!(&checks[0].kind, CheckKind::Exec { argv, user: None } if argv == &["/bin/sh", "-c", "pidof haproxy"]),
        "{:?}",
        checks[0].kind
    );
    assert_eq!(checks[0].interval, Duration::from_secs(2));
    assert_eq!(checks[0].timeout, Duration::from_millis(1500));
    assert_eq!((checks[0].rise.get(), checks[0].fall.get()), (3, 2));
    assert_eq!(checks[0].weight, 20);
    assert_eq!(checks[1].weight, -10, "the instance's weight wins");
    assert_eq!(checks[1].timeout, Duration::from_secs(1), "the interval");
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
}

#[test]
fn a_timeout_longer_than_the_interval_is_refused() {
    let text = instance(
        "vrrp_script chk {\n    script /bin/true\n    interval 1\n    timeout 3\n}",
        "    track_script {\n        chk\n    }",
    );
    assert!(
        refusal(&text).starts_with(&format!(
            "{FILE}:1: chk: timeout 3s is longer than interval 1s"
        )),
        "{}",
        refusal(&text)
    );
}

#[test]
fn a_reversed_weight_and_a_missing_script_are_refused() {
    let text = instance(
        "vrrp_script chk {\n    script /bin/true\n    weight 10 reverse\n}",
        "    track_script {\n        chk\n        gone\n    }",
    );
    let errors = run(&text).unwrap_err();
    assert_eq!(errors.len(), 2, "{errors:#?}");
    assert_eq!((errors[0].line, errors[0].keyword.as_str()), (3, "weight"));
    assert_eq!(
        errors[1].to_string(),
        format!("{FILE}:18: gone: no vrrp_script is named `gone`")
    );
}

#[test]
fn nopreempt_is_refused_and_preempt_delay_maps() {
    assert!(
        refusal(&instance("", "    nopreempt"))
            .starts_with(&format!("{FILE}:13: nopreempt: swimlb is always revertive"))
    );
    let (s, _) = converted(&instance("", "    preempt_delay 30"));
    assert_eq!(s.groups[0].preempt_delay, Duration::from_secs(30));
}

#[test]
fn state_advert_int_and_authentication_are_accepted_with_a_note() {
    let (_, c) = converted(&instance(
        "",
        "    state MASTER\n    advert_int 0.1\n    authentication {\n        auth_type PASS\n        auth_pass secret\n    }",
    ));
    let warned: Vec<&str> = c.warnings.iter().map(|w| w.keyword.as_str()).collect();
    assert_eq!(warned, ["state", "authentication"]);
    assert!(c.yaml.contains("advert_int 0.1"), "{}", c.yaml);
    assert!(c.yaml.contains("swimlb-speaker keygen"), "{}", c.yaml);
}

#[test]
fn one_notify_maps_with_a_warning_and_per_state_scripts_are_refused() {
    let (s, c) = converted(&instance("", "    notify /etc/keepalived/notify.sh"));
    assert_eq!(
        s.groups[0].notify.as_deref(),
        Some(Path::new("/etc/keepalived/notify.sh"))
    );
    assert!(
        c.warnings[0].why.contains("adapt the script"),
        "{:?}",
        c.warnings
    );
    let text = instance("", "    notify_master /etc/keepalived/master.sh");
    assert!(refusal(&text).starts_with(&format!(
        "{FILE}:13: notify_master: swimlb runs one program per group"
    )));
    let text = instance("", "    notify \"/etc/keepalived/notify.sh extra\"");
    assert!(refusal(&text).contains("wrap the command in a script"));
}

#[test]
fn the_instances_interface_is_tracked_already_another_is_refused() {
    let (_, c) = converted(&instance("", "    track_interface {\n        eth0\n    }"));
    assert!(c.warnings.is_empty());
    let text = instance("", "    track_interface {\n        eth1 weight -20\n    }");
    assert!(refusal(&text).starts_with(&format!(
        "{FILE}:14: eth1: swimlb tracks the announcing interface only"
    )));
}

#[test]
fn garp_settings_become_the_announce_schedule() {
    let (s, _) = converted(&instance(
        "global_defs {\n    vrrp_garp_master_refresh 60\n}",
        "    garp_master_delay 0\n    garp_master_repeat 3",
    ));
    assert_eq!(s.announce.burst.get(), 3);
    assert_eq!(s.announce.second_burst_after, None);
    assert_eq!(s.announce.refresh, Some(Duration::from_secs(60)));
    let text = instance("", "    garp_master_refresh_repeat 2");
    assert!(refusal(&text).ends_with("swimlb sends one announcement per refresh"));
}

#[test]
fn instances_with_different_garp_settings_are_refused() {
    let mut text = instance("", "    garp_master_repeat 3");
    text.push_str(
        "vrrp_instance VI_2 {\n    interface eth0\n    virtual_ipaddress {\n        192.0.2.101\n    }\n}\n",
    );
    let r = refusal(&text);
    assert!(
        r.starts_with(&format!("{FILE}:15: garp_master_repeat: differs")),
        "{r}"
    );
}

const SYNC: &str = "vrrp_script chk {\n    script /bin/true\n    weight -20\n}\nvrrp_sync_group VG_1 {\n    group {\n        VI_EXT\n        VI_INT\n    }\n    notify /etc/keepalived/notify.sh\n}\n";

fn sync_instance(name: &str, interface: &str, address: &str, priority: u8) -> String {
    format!(
        "vrrp_instance {name} {{\n    interface {interface}\n    virtual_router_id {priority}\n    priority {priority}\n    unicast_src_ip 192.0.2.10\n    unicast_peer {{\n        192.0.2.11\n    }}\n    virtual_ipaddress {{\n        {address}\n    }}\n    track_script {{\n        chk\n    }}\n}}\n"
    )
}

#[test]
fn a_sync_group_becomes_one_group_and_its_weights_zero() {
    let text = format!(
        "{SYNC}{}{}",
        sync_instance("VI_EXT", "eth0", "192.0.2.100", 101),
        sync_instance("VI_INT", "eth0", "192.0.2.101", 101)
    );
    let (s, c) = converted(&text);
    assert_eq!(s.groups.len(), 1);
    let g = &s.groups[0];
    assert_eq!(g.name, "VG_1");
    assert_eq!(g.addresses.len(), 2);
    assert_eq!(g.checks.len(), 1, "one script tracked twice is one check");
    assert_eq!(g.checks[0].weight, 0);
    assert!(
        c.warnings
            .iter()
            .any(|w| w.why.starts_with("weight -20 becomes 0"))
    );
    assert!(c.yaml.contains(
        "# keepalived: vrrp_sync_group VG_1; vrrp_instance VI_EXT, virtual_router_id 101, advert_int 1; vrrp_instance VI_INT"
    ));
}

#[test]
fn a_sync_group_over_two_interfaces_is_refused() {
    let text = format!(
        "{SYNC}{}{}",
        sync_instance("VI_EXT", "eth0", "192.0.2.100", 101),
        sync_instance("VI_INT", "eth1", "10.0.0.1", 101)
    );
    assert_eq!(
        refusal(&text),
        format!(
            "{FILE}:5: vrrp_sync_group: VI_EXT has eth0, VI_INT has eth1: the instances of a sync group become one swimlb group, with one interface"
        )
    );
}

#[test]
fn lvs_blocks_and_unknown_keywords_are_refused_each_with_its_line() {
    let text = instance(
        "virtual_server 192.0.2.100 80 {\n    lb_algo rr\n}",
        "    frobnicate yes",
    );
    let errors = run(&text).unwrap_err();
    let lines: Vec<(u32, &str)> = errors
        .iter()
        .map(|e| (e.line, e.keyword.as_str()))
        .collect();
    assert_eq!(lines, [(1, "virtual_server"), (15, "frobnicate")]);
}

#[test]
fn priority_255_is_refused() {
    let text = instance("", "").replace("priority 101", "priority 255");
    assert!(refusal(&text).contains("255 (the address owner) has no equivalent"));
}

#[test]
fn an_include_brings_its_instances() {
    let mut files = Memory::default();
    files
        .0
        .insert("/etc/keepalived/conf.d/vi_1.conf".into(), instance("", ""));
    let c = convert(
        Some(Path::new(FILE)),
        "global_defs {\n    router_id a\n}\ninclude conf.d/*.conf\n",
        &files,
        &Options::default(),
    )
    .unwrap();
    assert!(c.yaml.contains("- name: VI_1"), "{}", c.yaml);
}

#[test]
fn a_result_swimlb_would_refuse_is_refused() {
    // Peers of the other family than the bind address: only the standalone parser sees it.
    let text = instance("", "").replace("192.0.2.11", "2001:db8::11");
    let r = refusal(&text);
    assert!(
        r.starts_with(&format!(
            "{FILE}: (result): swimlb would refuse the result: peers[0]"
        )),
        "{r}"
    );
}

#[test]
fn names_are_made_valid_and_scalars_quoted_when_needed() {
    assert_eq!(sanitize("VI 1/ext"), "VI-1-ext");
    assert_eq!(scalar("eth0"), "eth0");
    assert_eq!(scalar("yes"), "\"yes\"");
    assert_eq!(scalar("51"), "\"51\"");
    assert_eq!(scalar("a b: c"), "\"a b: c\"");
    assert_eq!(scalar("[::1]:7946"), "\"[::1]:7946\"");
    assert_eq!(scalar("1000:1000"), "\"1000:1000\"");
    assert_eq!(scalar("192.0.2.10:7946"), "192.0.2.10:7946");
    assert_eq!(scalar("2001:db8::1"), "2001:db8::1");
}

proptest::proptest! {
    /// Whatever the text, the scalar written reads back as that text, in a mapping and in a
    /// flow list.
    #[test]
    fn a_scalar_reads_back_as_its_text(text in "[ -~]{0,24}") {
        let written = scalar(&text);
        let tree: serde_json::Value =
            serde_saphyr::from_str(&format!("k: {written}\nl: [{written}, x]\nm: {{{written}: 1}}")).unwrap();
        proptest::prop_assert_eq!(tree["k"].as_str(), Some(text.as_str()));
        proptest::prop_assert_eq!(tree["l"][0].as_str(), Some(text.as_str()));
        proptest::prop_assert!(tree["m"].get(&text).is_some(), "{}", written);
    }
}

#[test]
fn script_user_and_a_scripts_user_map() {
    let (s, c) = converted(&instance(
        "global_defs {\n    script_user keepalived_script\n}\nvrrp_script chk {\n    script /bin/true\n    user nobody nogroup\n}",
        "    track_script {\n        chk\n    }",
    ));
    assert_eq!(
        s.script_user.map(|u| u.to_string()).as_deref(),
        Some("keepalived_script")
    );
    assert!(
        matches!(&s.groups[0].checks[0].kind, CheckKind::Exec { user: Some(u), .. } if u.to_string() == "nobody:nogroup"),
        "{}",
        c.yaml
    );
}

#[test]
fn each_keyword_swimlb_would_read_differently_is_refused_at_its_line() {
    let cases = [
        ("    dont_track_primary", 13, "dont_track_primary"),
        ("    use_vmac", 13, "use_vmac"),
        (
            "    virtual_routes {\n        0.0.0.0/0 via 192.0.2.1\n    }",
            13,
            "virtual_routes",
        ),
        (
            "    virtual_rules {\n        from 192.0.2.0/24 table 1\n    }",
            13,
            "virtual_rules",
        ),
        ("    notify_fault /x.sh", 13, "notify_fault"),
        ("    notify_stop /x.sh", 13, "notify_stop"),
        ("    notify \"/x.sh\" root", 13, "notify"),
        ("    notify x.sh", 13, "notify"),
        ("    track_file {\n        f\n    }", 13, "track_file"),
        ("    garp_extra_if 10", 13, "garp_extra_if"),
        ("    priority 256", 13, "priority"),
        ("    preempt_delay soon", 13, "preempt_delay"),
        (
            "    virtual_ipaddress {\n        192.0.2.5 peer 192.0.2.6\n    }",
            14,
            "192.0.2.5",
        ),
        (
            "    virtual_ipaddress {\n        192.0.2.5-9\n    }",
            14,
            "192.0.2.5-9",
        ),
        (
            "    unicast_peer {\n        not-an-address\n    }",
            14,
            "not-an-address",
        ),
    ];
    for (body, line, keyword) in cases {
        let errors = run(&instance("", body)).expect_err(keyword);
        assert_eq!(errors.len(), 1, "{keyword}: {errors:#?}");
        assert_eq!(
            (errors[0].line, errors[0].keyword.as_str()),
            (line, keyword),
            "{}",
            errors[0]
        );
    }
    for (before, keyword) in [
        (
            "static_ipaddress {\n    192.0.2.9/24 dev eth0\n}",
            "static_ipaddress",
        ),
        (
            "vrrp_track_process haproxy {\n    process haproxy\n}",
            "vrrp_track_process",
        ),
        ("global_defs {\n    frobnicate\n}", "frobnicate"),
        ("@main router_id a", "@main"),
    ] {
        let errors = run(&instance(before, "")).expect_err(keyword);
        assert_eq!(errors.len(), 1, "{keyword}: {errors:#?}");
        assert_eq!(errors[0].keyword, keyword, "{}", errors[0]);
    }
}
