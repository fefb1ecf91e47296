//! The keepalived keywords the converter reads, as typed values: `global_defs`, `vrrp_script`,
//! `vrrp_instance` and `vrrp_sync_group`.
//!
//! Every keyword of the tree ends in one of three places: a field of the model, a warning (the
//! keyword has no effect in swimlb, and why), or a refusal (swimlb would behave differently, and
//! why). A keyword the reader does not know is refused: nothing is dropped in silence.

use std::net::IpAddr;
use std::time::Duration;

use super::syntax::Statement;
use super::{Finding, Place};

/// The whole configuration.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Keepalived {
    /// `global_defs`.
    pub global: GlobalDefs,
    /// `vrrp_script` blocks, in file order.
    pub scripts: Vec<Script>,
    /// `vrrp_instance` blocks, in file order.
    pub instances: Vec<Instance>,
    /// `vrrp_sync_group` blocks, in file order.
    pub sync_groups: Vec<SyncGroup>,
}

/// `global_defs`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GlobalDefs {
    /// `router_id`.
    pub router_id: Option<String>,
    /// `script_user USER [GROUP]`, as `user[:group]`.
    pub script_user: Option<String>,
    /// `vrrp_garp_master_*`.
    pub garp: Garp,
    /// `vrrp_version` (keepalived's default is 2).
    pub vrrp_version: Option<u8>,
}

/// The gratuitous ARP settings, as given (`None`: not written).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Garp {
    /// `garp_master_delay`: the second burst's delay; zero for none.
    pub delay: Option<(Duration, Place)>,
    /// `garp_master_repeat`: announcements per burst.
    pub repeat: Option<(u32, Place)>,
    /// `garp_master_refresh`: the refresh period; zero for none.
    pub refresh: Option<(Duration, Place)>,
    /// `garp_master_refresh_repeat`: announcements per refresh.
    pub refresh_repeat: Option<(u32, Place)>,
}

/// `vrrp_script NAME`.
#[derive(Debug, Clone, PartialEq)]
pub struct Script {
    /// Its name.
    pub name: String,
    /// Where it is.
    pub at: Place,
    /// `script`, split into program and arguments as keepalived splits it.
    pub argv: Option<Vec<String>>,
    /// `interval` (default 1 s).
    pub interval: Duration,
    /// `timeout`.
    pub timeout: Option<Duration>,
    /// `weight` (default 0).
    pub weight: i32,
    /// `rise` (default 1).
    pub rise: u32,
    /// `fall` (default 1).
    pub fall: u32,
    /// `user USER [GROUP]`, as `user[:group]`.
    pub user: Option<String>,
}

/// A script tracked by an instance, with the instance's own weight if it gives one.
#[derive(Debug, Clone, PartialEq)]
pub struct Tracked {
    /// The `vrrp_script`'s name.
    pub name: String,
    /// `weight N` on the `track_script` line.
    pub weight: Option<i32>,
    /// Where it is.
    pub at: Place,
}

/// A virtual address line.
#[derive(Debug, Clone, PartialEq)]
pub struct Vip {
    /// The address.
    pub address: IpAddr,
    /// `dev`.
    pub dev: Option<String>,
    /// Where it is.
    pub at: Place,
}

/// A notify program: the program and its own arguments.
#[derive(Debug, Clone, PartialEq)]
pub struct Notify {
    /// The command line, split.
    pub argv: Vec<String>,
    /// Where it is.
    pub at: Place,
}

/// `vrrp_instance NAME`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Instance {
    /// Its name.
    pub name: String,
    /// Where it is.
    pub at: Place,
    /// `interface`.
    pub interface: Option<String>,
    /// `virtual_router_id`.
    pub vrid: Option<u8>,
    /// `priority` (default 100).
    pub priority: Option<u8>,
    /// `advert_int`, as written.
    pub advert_int: Option<String>,
    /// `version` (else `global_defs`' `vrrp_version`, else 2).
    pub version: Option<u8>,
    /// `virtual_ipaddress` and `virtual_ipaddress_excluded`.
    pub addresses: Vec<Vip>,
    /// `preempt_delay`.
    pub preempt_delay: Option<Duration>,
    /// `unicast_src_ip` or `mcast_src_ip`.
    pub source: Option<(IpAddr, Place)>,
    /// `unicast_peer`.
    pub peers: Vec<(IpAddr, Place)>,
    /// `track_script`.
    pub tracked: Vec<Tracked>,
    /// `notify`.
    pub notify: Option<Notify>,
    /// `garp_master_*`.
    pub garp: Garp,
}

/// `vrrp_sync_group NAME`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SyncGroup {
    /// Its name.
    pub name: String,
    /// Where it is.
    pub at: Place,
    /// The instances of `group { }`.
    pub members: Vec<(String, Place)>,
    /// `notify`.
    pub notify: Option<Notify>,
    /// `sync_group_tracking_weight`: the members' script weights count.
    pub tracking_weight: bool,
}

/// Keywords of the VRRP protocol itself: swimlb does not speak VRRP, so they change nothing.
const VRRP_ONLY: &[&str] = &[
    "native_ipv6",
    "strict_mode",
    "skip_check_adv_addr",
    "check_unicast_src",
    "unicast_ttl",
    "unicast_fault_no_peer",
    "mcast_dst_ip",
    "lower_prio_no_advert",
    "higher_prio_send_advert",
    "garp_lower_prio_delay",
    "garp_lower_prio_repeat",
    "down_timer_adverts",
    "old_unicast_checksum",
    "kernel_rx_buf_size",
    "accept",
    "no_accept",
    "debug",
    "promote_secondaries",
    "linkbeat_use_polling",
    "notify_priority_changes",
    "track_src_ip",
];

/// `global_defs` keywords of the VRRP protocol or of keepalived's process.
const GLOBAL_NO_EFFECT: &[&str] = &[
    "vrrp_skip_check_adv_addr",
    "vrrp_strict",
    "vrrp_check_unicast_src",
    "vrrp_iptables",
    "vrrp_ipsets",
    "vrrp_mcast_group4",
    "vrrp_mcast_group6",
    "vrrp_lower_prio_no_advert",
    "vrrp_higher_prio_send_advert",
    "vrrp_garp_lower_prio_delay",
    "vrrp_garp_lower_prio_repeat",
    "vrrp_down_timer_adverts",
    "vrrp_startup_delay",
    "vrrp_rx_bufs_policy",
    "vrrp_rx_bufs_multiplier",
    "vrrp_no_swap",
    "vrrp_rt_priority",
    "vrrp_priority",
    "vrrp_cpu_affinity",
    "max_auto_priority",
    "min_auto_priority_delay",
    "dynamic_interfaces",
    "default_interface",
    "lvs_id",
    "process_names",
    "process_name",
    "vrrp_process_name",
    "checker_process_name",
    "bfd_process_name",
    "linkbeat_use_polling",
    "script_security",
    "enable_traps",
    "snmp_socket",
    "enable_snmp_vrrp",
    "enable_snmp_keepalived",
    "enable_snmp_rfc",
    "enable_snmp_rfcv2",
    "enable_snmp_rfcv3",
    "enable_snmp_checker",
    "enable_dbus",
];

const MAIL: &[&str] = &[
    "notification_email",
    "notification_email_from",
    "smtp_server",
    "smtp_helo_name",
    "smtp_connect_timeout",
    "smtp_alert",
    "smtp_alert_vrrp",
    "smtp_alert_checker",
];

const FIFO: &[&str] = &[
    "notify_fifo",
    "notify_fifo_script",
    "vrrp_notify_fifo",
    "vrrp_notify_fifo_script",
];

/// Collects the model and what was warned about or refused.
#[derive(Debug, Default)]
pub struct Reader {
    /// What swimlb would do differently: the conversion fails with each of these.
    pub refusals: Vec<Finding>,
    /// Keywords accepted with no effect in swimlb, each with why.
    pub warnings: Vec<Finding>,
}

impl Reader {
    fn refuse(&mut self, s: &Statement, why: impl Into<String>) {
        self.refusals.push(Finding::new(&s.at, &s.keyword, why));
    }

    fn warn(&mut self, s: &Statement, why: impl Into<String>) {
        self.warnings.push(Finding::new(&s.at, &s.keyword, why));
    }

    /// The model of the statements at the top of the file.
    pub fn read(&mut self, tree: &[Statement]) -> Keepalived {
        let mut k = Keepalived::default();
        for s in tree {
            match s.keyword.as_str() {
                "global_defs" => {
                    for d in self.block(s) {
                        self.global(&mut k.global, d);
                    }
                }
                "vrrp_script" => {
                    if let Some(script) = self.script(s) {
                        k.scripts.push(script);
                    }
                }
                "vrrp_instance" => {
                    if let Some(instance) = self.instance(s) {
                        k.instances.push(instance);
                    }
                }
                "vrrp_sync_group" => {
                    if let Some(group) = self.sync_group(s) {
                        k.sync_groups.push(group);
                    }
                }
                "virtual_server" | "virtual_server_group" => self.refuse(
                    s,
                    "swimlb moves addresses, it does not balance connections (no IPVS): keep this \
                     block in a keepalived of its own, and convert the file without it",
                ),
                "static_ipaddress" | "static_routes" | "static_rules" => self.refuse(
                    s,
                    "not virtual: keepalived sets these whatever the state; move them to the \
                     host's network configuration, and convert the file without them",
                ),
                "vrrp_track_file" | "vrrp_track_process" | "track_file" | "bfd_instance" => self
                    .refuse(
                        s,
                        "swimlb's checks are programs, HTTP requests or TCP connects: write it as \
                         a vrrp_script (an `exec` check)",
                    ),
                "garp_group" => self.refuse(
                    s,
                    "swimlb sends a burst back to back, with no delay between announcements",
                ),
                _ => self.unknown(s),
            }
        }
        k
    }

    fn unknown(&mut self, s: &Statement) {
        self.refuse(
            s,
            "not a keyword the converter knows: remove it (or convert it by hand) if it has no \
             bearing on the addresses",
        );
    }

    fn block<'s>(&mut self, s: &'s Statement) -> &'s [Statement] {
        match &s.block {
            Some(b) => b,
            None => {
                self.refuse(s, "expected a block `{ ... }`");
                &[]
            }
        }
    }

    /// The statement's one argument.
    fn one<'s>(&mut self, s: &'s Statement) -> Option<&'s str> {
        match s.args.as_slice() {
            [one] if s.block.is_none() => Some(&one.text),
            _ => {
                self.refuse(s, "expected one value");
                None
            }
        }
    }

    fn integer(&mut self, s: &Statement, min: i64, max: i64) -> Option<i64> {
        let text = self.one(s)?;
        match text.parse::<i64>() {
            Ok(n) if (min..=max).contains(&n) => Some(n),
            _ => {
                self.refuse(
                    s,
                    format!("`{text}`: expected an integer from {min} to {max}"),
                );
                None
            }
        }
    }

    /// Seconds, with a fraction (`3`, `0.5`), to the millisecond.
    fn seconds(&mut self, s: &Statement) -> Option<Duration> {
        let text = self.one(s)?;
        let plain = !text.is_empty()
            && text.chars().all(|c| c.is_ascii_digit() || c == '.')
            && text.matches('.').count() <= 1
            && text.chars().next().is_some_and(|c| c.is_ascii_digit());
        let parsed = plain
            .then(|| crate::duration::parse_duration(&format!("{text}s")).ok())
            .flatten();
        match parsed {
            Some(d) if d.subsec_micros() % 1000 == 0 => Some(d),
            Some(_) => {
                self.refuse(s, format!("`{text}`: swimlb counts time in milliseconds"));
                None
            }
            None => {
                self.refuse(
                    s,
                    format!("`{text}`: expected seconds, such as `3` or `0.5`"),
                );
                None
            }
        }
    }

    fn address(&mut self, s: &Statement, text: &str) -> Option<IpAddr> {
        match text.parse::<IpAddr>() {
            Ok(ip) => Some(ip),
            Err(_) => {
                self.refuse(s, format!("`{text}` is not an IP address"));
                None
            }
        }
    }

    fn global(&mut self, g: &mut GlobalDefs, s: &Statement) {
        let k = s.keyword.as_str();
        match k {
            "router_id" => g.router_id = self.one(s).map(str::to_string),
            "vrrp_version" => g.vrrp_version = self.integer(s, 2, 3).map(|n| n as u8),
            "vrrp_garp_master_delay"
            | "vrrp_garp_master_repeat"
            | "vrrp_garp_master_refresh"
            | "vrrp_garp_master_refresh_repeat" => {
                self.garp(&mut g.garp, s, &k["vrrp_".len()..]);
            }
            "vrrp_garp_interval" | "vrrp_gna_interval" => self.garp_interval(s),
            // swimlb always applies keepalived's script security rule.
            "enable_script_security" => {}
            "script_user" => g.script_user = self.user(s),
            _ if MAIL.contains(&k) || k.starts_with("smtp_") => self.warn(
                s,
                "no effect: swimlb sends no mail; alert on its metrics (swimlb_announced, \
                 swimlb_check_up)",
            ),
            _ if FIFO.contains(&k) => self.warn(
                s,
                "no effect: swimlb writes no FIFO; a group's `notify` program hears every change \
                 of state",
            ),
            _ if GLOBAL_NO_EFFECT.contains(&k) => self.warn(
                s,
                "no effect: a setting of keepalived's VRRP or of its process, which swimlb's \
                 `vrrp:` does not have",
            ),
            _ => self.unknown(s),
        }
    }

    /// `garp_master_*` (`key` without `vrrp_`) into `garp`.
    fn garp(&mut self, garp: &mut Garp, s: &Statement, key: &str) {
        match key {
            "garp_master_delay" => garp.delay = self.seconds(s).map(|d| (d, s.at.clone())),
            "garp_master_refresh" => garp.refresh = self.seconds(s).map(|d| (d, s.at.clone())),
            "garp_master_repeat" => {
                garp.repeat = self.integer(s, 1, 100).map(|n| (n as u32, s.at.clone()));
            }
            _ => {
                garp.refresh_repeat = self.integer(s, 1, 255).map(|n| (n as u32, s.at.clone()));
            }
        }
    }

    fn garp_interval(&mut self, s: &Statement) {
        if self.seconds(s).is_some_and(|d| !d.is_zero()) {
            self.warn(
                s,
                "no effect: swimlb sends a burst back to back, with no delay between announcements",
            );
        }
    }

    fn script(&mut self, s: &Statement) -> Option<Script> {
        let texts = s.texts();
        let [name] = texts.as_slice() else {
            self.refuse(s, "expected a name");
            return None;
        };
        let mut script = Script {
            name: name.to_string(),
            at: s.at.clone(),
            argv: None,
            interval: Duration::from_secs(1),
            timeout: None,
            weight: 0,
            rise: 1,
            fall: 1,
            user: None,
        };
        for d in self.block(s) {
            match d.keyword.as_str() {
                "script" => script.argv = self.command(d, "script"),
                "interval" => {
                    if let Some(i) = self.seconds(d) {
                        script.interval = i;
                    }
                }
                "timeout" => script.timeout = self.seconds(d),
                "weight" => {
                    let texts = d.texts();
                    match texts.as_slice() {
                        [w] => match w.parse::<i32>() {
                            Ok(n) if (-253..=253).contains(&n) => script.weight = n,
                            _ => self.refuse(d, format!("`{w}`: expected -253 to 253")),
                        },
                        [_, "reverse"] => self.refuse(
                            d,
                            "`reverse` has no equivalent: a positive weight is added while the \
                             check passes, a negative one while it fails",
                        ),
                        _ => self.refuse(d, "expected a weight from -253 to 253"),
                    }
                }
                "rise" => script.rise = self.integer(d, 1, 1000).unwrap_or(1) as u32,
                "fall" => script.fall = self.integer(d, 1, 1000).unwrap_or(1) as u32,
                "init_fail" => {} // swimlb's checks always start failing.
                "user" => script.user = self.user(d),
                _ => self.unknown(d),
            }
        }
        if script.argv.is_none() {
            self.refuse(s, format!("`{name}` has no `script`"));
        }
        Some(script)
    }

    /// A command line: a quoted string, or the words of the line; split as keepalived splits it
    /// (spaces, with single and double quotes). A notify program's words after a quoted
    /// command are a user and a group, which swimlb cannot give a single program: refused.
    fn command(&mut self, s: &Statement, what: &str) -> Option<Vec<String>> {
        let line = match s.args.first() {
            Some(first) if first.quoted => {
                if s.args.len() > 1 {
                    self.refuse(
                        s,
                        format!(
                            "swimlb runs the {what} as the file's `scriptUser` (global_defs' \
                             script_user): move the user there"
                        ),
                    );
                    return None;
                }
                first.text.clone()
            }
            Some(_) => s.texts().join(" "),
            None => {
                self.refuse(s, "expected a command");
                return None;
            }
        };
        match split_command(&line) {
            Some(argv) if !argv.is_empty() => Some(argv),
            _ => {
                self.refuse(s, format!("`{line}`: a quote is not closed"));
                None
            }
        }
    }

    /// `USER [GROUP]` as `user[:group]`.
    fn user(&mut self, s: &Statement) -> Option<String> {
        match s.texts().as_slice() {
            [user] => Some(user.to_string()),
            [user, group] => Some(format!("{user}:{group}")),
            _ => {
                self.refuse(s, "expected a user and, optionally, a group");
                None
            }
        }
    }

    fn instance(&mut self, s: &Statement) -> Option<Instance> {
        let texts = s.texts();
        let [name] = texts.as_slice() else {
            self.refuse(s, "expected a name");
            return None;
        };
        let mut i = Instance {
            name: name.to_string(),
            at: s.at.clone(),
            ..Instance::default()
        };
        let mut track_interfaces = Vec::new();
        for d in self.block(s) {
            let k = d.keyword.as_str();
            match k {
                "state" => self.warn(
                    d,
                    "no effect: swimlb has no start state, the election decides at once (give \
                     the preferred node the higher priority)",
                ),
                "interface" => i.interface = self.one(d).map(str::to_string),
                "virtual_router_id" => i.vrid = self.integer(d, 1, 255).map(|n| n as u8),
                "priority" => {
                    if let Some(text) = self.one(d) {
                        match text.parse::<u8>() {
                            Ok(p @ 1..=254) => i.priority = Some(p),
                            Ok(255) => self.refuse(
                                d,
                                "255 (the address owner) has no equivalent: priorities go from 1 \
                                 to 254",
                            ),
                            _ => self.refuse(d, format!("`{text}`: expected 1 to 254")),
                        }
                    }
                }
                "advert_int" => i.advert_int = self.one(d).map(str::to_string),
                "version" => i.version = self.integer(d, 2, 3).map(|n| n as u8),
                "virtual_ipaddress" | "virtual_ipaddress_excluded" => {
                    for line in self.block(d) {
                        if let Some(vip) = self.vip(line) {
                            i.addresses.push(vip);
                        }
                    }
                }
                "nopreempt" | "no_preempt" => self.refuse(
                    d,
                    "swimlb is always revertive: a node that comes back with the higher priority \
                     takes the group back, after `preemptDelay` (keepalived's preempt_delay); \
                     remove nopreempt, with a preempt_delay if the return should wait",
                ),
                "preempt" => {} // keepalived's default, and swimlb's only way.
                "preempt_delay" => i.preempt_delay = self.seconds(d),
                "unicast_src_ip" | "mcast_src_ip" => {
                    if let Some(text) = self.one(d)
                        && let Some(ip) = self.address(d, text)
                    {
                        i.source = Some((ip, d.at.clone()));
                    }
                }
                "unicast_peer" => {
                    for line in self.block(d) {
                        self.peers(line, &mut i.peers);
                    }
                }
                "track_interface" => {
                    for line in self.block(d) {
                        track_interfaces.push(line);
                    }
                }
                "track_script" => {
                    for line in self.block(d) {
                        if let Some(t) = self.tracked(line) {
                            i.tracked.push(t);
                        }
                    }
                }
                "track_file" | "track_process" | "track_bfd" => self.refuse(
                    d,
                    "swimlb's checks are programs, HTTP requests or TCP connects: write it as a \
                     vrrp_script (an `exec` check)",
                ),
                "dont_track_primary" => self.refuse(
                    d,
                    "swimlb always tracks the announcing interface: a node whose interface is \
                     down, missing or NOARP is no candidate",
                ),
                "use_vmac" | "use_vmac_addr" | "vmac_xmit_base" | "use_ipvlan" | "vrf" => self
                    .refuse(
                        d,
                        "swimlb answers with the MAC address of the interface itself, in the \
                         default VRF",
                    ),
                "authentication" => self.warn(
                    d,
                    "does not carry over: swimlb seals every datagram with the key file \
                     (`keyFile`), the same on every node",
                ),
                "virtual_routes" | "virtual_rules" => self.refuse(
                    d,
                    "swimlb adds no routes or rules: add them from a notify program on `owner`, \
                     remove them on `backup` and `fault`, and convert the file without them",
                ),
                "notify" => i.notify = self.notify(d),
                "notify_master"
                | "notify_backup"
                | "notify_fault"
                | "notify_stop"
                | "notify_deleted"
                | "notify_master_rx_lower_pri" => self.per_state(d),
                "smtp_alert" => self.warn(
                    d,
                    "no effect: swimlb sends no mail; alert on its metrics (swimlb_announced)",
                ),
                "garp_master_delay"
                | "garp_master_repeat"
                | "garp_master_refresh"
                | "garp_master_refresh_repeat" => self.garp(&mut i.garp, d, k),
                "garp_interval" | "gna_interval" => self.garp_interval(d),
                "garp_extra_if" | "garp_extra_if_vmac" => {
                    self.refuse(d, "swimlb announces on the group's interface only")
                }
                _ if VRRP_ONLY.contains(&k) => self.warn(
                    d,
                    "no effect: a setting of keepalived's VRRP that swimlb's `vrrp:` does not \
                     have",
                ),
                _ => self.unknown(d),
            }
        }
        for line in track_interfaces {
            self.track_interface(line, i.interface.as_deref());
        }
        Some(i)
    }

    fn vip(&mut self, s: &Statement) -> Option<Vip> {
        let (addr_text, prefix) = match s.keyword.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s.keyword.as_str(), None),
        };
        if addr_text.contains('-') {
            self.refuse(
                s,
                "an address range: write each address on a line of its own",
            );
            return None;
        }
        let address = self.address(s, addr_text)?;
        let host = if address.is_ipv4() { "32" } else { "128" };
        if let Some(p) = prefix
            && p != host
        {
            self.warn(
                s,
                format!(
                    "the prefix /{p} does not apply: swimlb puts {address} on its own link as a \
                     single address, so the owner gets no route to the prefix from it"
                ),
            );
        }
        let mut dev = None;
        let texts = s.texts();
        let mut words = texts.iter();
        while let Some(option) = words.next() {
            match *option {
                "dev" => dev = words.next().map(|d| d.to_string()),
                "brd" | "scope" | "label" | "preferred_lft" => {
                    words.next();
                    self.warn(
                        s,
                        format!("`{option}` does not apply: the address goes on swimlb's own link"),
                    );
                }
                "home" | "-nodad" | "mngtmpaddr" | "noprefixroute" | "autojoin" | "no_track" => {
                    self.warn(
                        s,
                        format!("`{option}` does not apply: the address goes on swimlb's own link"),
                    );
                }
                other => {
                    self.refuse(
                        s,
                        format!("`{other}` has no equivalent: swimlb holds plain addresses"),
                    );
                    return None;
                }
            }
        }
        Some(Vip {
            address,
            dev,
            at: s.at.clone(),
        })
    }

    fn peers(&mut self, s: &Statement, out: &mut Vec<(IpAddr, Place)>) {
        let mut words =
            std::iter::once(s.keyword.as_str()).chain(s.args.iter().map(|w| w.text.as_str()));
        while let Some(word) = words.next() {
            match word {
                "min_ttl" | "max_ttl" => {
                    words.next();
                    self.warn(s, format!("no effect: `{word}` checks VRRP adverts"));
                }
                _ => {
                    if let Some(ip) = self.address(s, word) {
                        out.push((ip, s.at.clone()));
                    }
                }
            }
        }
    }

    fn tracked(&mut self, s: &Statement) -> Option<Tracked> {
        let texts = s.texts();
        let weight = match texts.as_slice() {
            [] => None,
            ["weight", w] => match w.parse::<i32>() {
                Ok(n) if (-253..=253).contains(&n) => Some(n),
                _ => {
                    self.refuse(s, format!("`{w}`: expected a weight from -253 to 253"));
                    return None;
                }
            },
            ["weight", _, "noreverse" | "no_reverse"] => {
                return self.tracked(&Statement {
                    args: s.args[..2].to_vec(),
                    ..s.clone()
                });
            }
            ["weight", _, "reverse"] => {
                self.refuse(
                    s,
                    "`reverse` has no equivalent: a positive weight is added while the check \
                     passes, a negative one while it fails",
                );
                return None;
            }
            _ => {
                self.refuse(s, "expected a script's name and `weight N`");
                return None;
            }
        };
        Some(Tracked {
            name: s.keyword.clone(),
            weight,
            at: s.at.clone(),
        })
    }

    fn track_interface(&mut self, s: &Statement, interface: Option<&str>) {
        if interface == Some(s.keyword.as_str()) {
            if !s.args.is_empty() {
                self.warn(
                    s,
                    "the weight does not apply: a node whose announcing interface is down is no \
                     candidate at all",
                );
            }
            return;
        }
        let name = &s.keyword;
        self.refuse(
            s,
            format!(
                "swimlb tracks the announcing interface only; for {name}, write a vrrp_script \
                 such as `script \"/bin/grep -qx up /sys/class/net/{name}/operstate\"` and track it"
            ),
        );
    }

    fn notify(&mut self, s: &Statement) -> Option<Notify> {
        let argv = self.command(s, "notify program")?;
        if argv.len() > 1 {
            self.refuse(
                s,
                "swimlb calls the program with two arguments of its own (the group and \
                 `owner`, `backup` or `fault`) and no others: wrap the command in a script",
            );
            return None;
        }
        if !argv[0].starts_with('/') {
            self.refuse(s, format!("`{}`: swimlb needs an absolute path", argv[0]));
            return None;
        }
        Some(Notify {
            argv,
            at: s.at.clone(),
        })
    }

    fn per_state(&mut self, s: &Statement) {
        self.refuse(
            s,
            "swimlb runs one program per group, with the group and `owner`, `backup` or `fault`: \
             write one that runs this script for its state, and give it as `notify`",
        );
    }

    fn sync_group(&mut self, s: &Statement) -> Option<SyncGroup> {
        let texts = s.texts();
        let [name] = texts.as_slice() else {
            self.refuse(s, "expected a name");
            return None;
        };
        let mut g = SyncGroup {
            name: name.to_string(),
            at: s.at.clone(),
            ..SyncGroup::default()
        };
        for d in self.block(s) {
            match d.keyword.as_str() {
                "group" => {
                    for line in self.block(d) {
                        g.members.push((line.keyword.clone(), line.at.clone()));
                        for w in &line.args {
                            g.members.push((w.text.clone(), line.at.clone()));
                        }
                    }
                }
                "notify" => g.notify = self.notify(d),
                "notify_master" | "notify_backup" | "notify_fault" | "notify_stop"
                | "notify_deleted" => self.per_state(d),
                "sync_group_tracking_weight" => g.tracking_weight = true,
                "smtp_alert" => self.warn(d, "no effect: swimlb sends no mail"),
                "global_tracking" | "notify_priority_changes" => {
                    self.warn(d, "no effect: swimlb reports no priority changes")
                }
                "track_interface" | "track_script" | "track_file" | "track_process"
                | "track_bfd" => self.refuse(
                    d,
                    "not converted in a sync group: track it in each of its vrrp_instances",
                ),
                _ => self.unknown(d),
            }
        }
        Some(g)
    }
}

/// Splits a command line at spaces, keeping what single or double quotes hold together (as
/// keepalived splits a script's line); `None` when a quote is not closed.
pub fn split_command(line: &str) -> Option<Vec<String>> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => current.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                in_word = true;
            }
            (None, '\\') => {
                if let Some(next) = chars.next() {
                    current.push(next);
                }
                in_word = true;
            }
            (None, c) if c.is_whitespace() => {
                if in_word {
                    out.push(std::mem::take(&mut current));
                    in_word = false;
                }
            }
            (None, c) => {
                current.push(c);
                in_word = true;
            }
        }
    }
    if quote.is_some() {
        return None;
    }
    if in_word {
        out.push(current);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_splits_at_spaces_but_not_inside_quotes() {
        assert_eq!(
            split_command("/bin/sh -c 'pidof haproxy || exit 1'").unwrap(),
            ["/bin/sh", "-c", "pidof haproxy || exit 1"]
        );
        assert_eq!(
            split_command("killall  -0 \"a b\"").unwrap(),
            ["killall", "-0", "a b"]
        );
        assert_eq!(split_command("x 'open"), None);
    }
}
