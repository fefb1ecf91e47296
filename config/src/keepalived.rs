//! keepalived's VRRP configuration turned into the standalone file (`swimlb-speaker
//! convert-keepalived`).
//!
//! Three steps, each collecting every problem before the next: [`syntax`] reads the text and
//! its includes into a tree of statements with their file and line; [`model`] reads the
//! keywords into typed values; [`convert`] maps them onto the standalone file's keys and writes
//! it as YAML, with comments that keep what has no key yet (each instance's
//! `virtual_router_id` and `advert_int`).
//!
//! Guarantees:
//! - every keyword either maps onto a key, is accepted with a warning that says why it has no
//!   effect in swimlb, or is refused with its file, line and why; nothing is dropped in silence;
//! - [`convert`] returns every refusal at once, or a file that [`Standalone::parse`] accepts
//!   (checked before it returns: a result it would refuse is refused here, with swimlb's
//!   error);
//! - the conversion is pure: files are read through [`Files`] ([`Disk`] reads the disk).
//!
//! What maps where, and why the rest is refused, is the table of the book's page "Switching
//! from keepalived".

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::{self, Write as _};
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use crate::duration::format_duration;
use crate::standalone::{DEFAULT_GOSSIP_PORT, Standalone};

pub mod model;
pub mod syntax;

pub use syntax::Files;

use model::{Instance, Keepalived, Notify, Reader, Script, SyncGroup};

/// Where the converted file says the gossip key is.
pub const KEY_FILE: &str = "/etc/swimlb/keys";

/// A place in a keepalived file.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Place {
    /// The file's path as given (`(stdin)` for standard input).
    pub file: String,
    /// The line, from 1; 0 for the file as a whole.
    pub line: u32,
}

impl Place {
    /// Line `line` of `file`.
    pub fn new(file: &str, line: u32) -> Place {
        Place {
            file: file.to_string(),
            line,
        }
    }
}

/// A keyword refused or warned about: `file:line: keyword: why`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Finding {
    /// The file.
    pub file: String,
    /// The line (0: the file as a whole).
    pub line: u32,
    /// The keyword (or the value) in question.
    pub keyword: String,
    /// Why, and what to do.
    pub why: String,
}

impl Finding {
    /// A finding about `keyword` at `at`.
    pub fn new(at: &Place, keyword: &str, why: impl Into<String>) -> Finding {
        Finding {
            file: at.file.clone(),
            line: at.line,
            keyword: keyword.to_string(),
            why: why.into(),
        }
    }
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}: {}: {}", self.file, self.keyword, self.why)
        } else {
            write!(
                f,
                "{}:{}: {}: {}",
                self.file, self.line, self.keyword, self.why
            )
        }
    }
}

/// What the command line adds to the file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Options {
    /// `cluster`; default `keepalived-` and the instances' `virtual_router_id`s.
    pub cluster: Option<String>,
    /// `node`; default `global_defs { router_id }`, else none (the hostname).
    pub node: Option<String>,
    /// This node's gossip address; replaces `unicast_src_ip` / `mcast_src_ip`.
    pub bind: Option<IpAddr>,
    /// The other nodes' gossip addresses; replace every `unicast_peer`.
    pub peers: Vec<IpAddr>,
}

/// A converted file.
#[derive(Debug, Clone, PartialEq)]
pub struct Converted {
    /// The standalone file, YAML with comments.
    pub yaml: String,
    /// Keywords accepted with no effect in swimlb, each with why.
    pub warnings: Vec<Finding>,
}

/// Reads files from the disk.
#[derive(Debug, Clone, Copy, Default)]
pub struct Disk;

impl Files for Disk {
    fn read(&self, path: &Path) -> Result<String, String> {
        std::fs::read_to_string(path).map_err(|e| e.to_string())
    }

    fn list(&self, dir: &Path) -> Result<Vec<String>, String> {
        let entries = std::fs::read_dir(dir).map_err(|e| e.to_string())?;
        Ok(entries
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect())
    }
}

/// Converts the keepalived configuration `text` (read from `path`; `None` for standard input)
/// into the standalone file, or returns every refusal.
pub fn convert(
    path: Option<&Path>,
    text: &str,
    files: &dyn Files,
    options: &Options,
) -> Result<Converted, Vec<Finding>> {
    let mut refusals = Vec::new();
    let tree = syntax::parse(path, text, files, &mut refusals);
    let mut reader = Reader::default();
    let model = reader.read(&tree);
    refusals.append(&mut reader.refusals);
    let mut warnings = reader.warnings;
    let file = syntax::display(path);
    let out = Converter {
        refusals: &mut refusals,
        warnings: &mut warnings,
        file: &file,
    }
    .convert(&model, options);
    // In the order of the files as read, then of their lines.
    let mut files_read = vec![file.clone()];
    for s in &tree {
        if !files_read.contains(&s.at.file) {
            files_read.push(s.at.file.clone());
        }
    }
    let rank = |f: &Finding| {
        let file = files_read
            .iter()
            .position(|r| *r == f.file)
            .unwrap_or(usize::MAX);
        (file, f.line)
    };
    refusals.sort_by_key(rank);
    warnings.sort_by_key(rank);
    if !refusals.is_empty() {
        return Err(refusals);
    }
    let yaml = emit(&out, &file);
    if let Err(errors) = Standalone::parse(&yaml) {
        return Err(errors
            .0
            .iter()
            .map(|e| {
                Finding::new(
                    &Place::new(&file, 0),
                    "(result)",
                    format!("swimlb would refuse the result: {e}"),
                )
            })
            .collect());
    }
    Ok(Converted { yaml, warnings })
}

/// The standalone file, before it is written.
#[derive(Debug, Clone, Default, PartialEq)]
struct Output {
    cluster: String,
    node: Option<String>,
    script_user: Option<String>,
    bind: Option<IpAddr>,
    peers: Vec<IpAddr>,
    announce: Vec<(&'static str, String, String)>,
    groups: Vec<OutGroup>,
}

#[derive(Debug, Clone, Default, PartialEq)]
struct OutGroup {
    comment: String,
    name: String,
    addresses: Vec<IpAddr>,
    interface: Option<String>,
    priority: u8,
    preempt_delay: Option<Duration>,
    checks: Vec<OutCheck>,
    notify: Option<String>,
    /// `vrrp: {vrid, advertInterval}`: the instance's, to run beside it.
    vrrp: Option<(u8, Duration)>,
}

#[derive(Debug, Clone, PartialEq)]
struct OutCheck {
    name: String,
    script: String,
    argv: Vec<String>,
    interval: Duration,
    timeout: Duration,
    rise: u32,
    fall: u32,
    weight: i32,
    user: Option<String>,
}

/// keepalived's default priority.
const KEEPALIVED_PRIORITY: u8 = 100;

struct Converter<'a> {
    refusals: &'a mut Vec<Finding>,
    warnings: &'a mut Vec<Finding>,
    file: &'a str,
}

impl Converter<'_> {
    fn refuse(&mut self, at: &Place, keyword: &str, why: impl Into<String>) {
        self.refusals.push(Finding::new(at, keyword, why));
    }

    fn convert(&mut self, k: &Keepalived, options: &Options) -> Output {
        let mut scripts: BTreeMap<&str, &Script> = BTreeMap::new();
        for s in &k.scripts {
            if scripts.insert(&s.name, s).is_some() {
                self.refuse(
                    &s.at,
                    "vrrp_script",
                    format!("`{}` is defined twice", s.name),
                );
            }
        }
        let mut instances: BTreeMap<&str, &Instance> = BTreeMap::new();
        for i in &k.instances {
            if instances.insert(&i.name, i).is_some() {
                self.refuse(
                    &i.at,
                    "vrrp_instance",
                    format!("`{}` is defined twice", i.name),
                );
            }
        }
        // Which sync group each instance is in.
        let mut member_of: BTreeMap<&str, usize> = BTreeMap::new();
        for (g, group) in k.sync_groups.iter().enumerate() {
            if group.members.is_empty() {
                self.refuse(
                    &group.at,
                    "vrrp_sync_group",
                    "has no `group { }` of instances",
                );
            }
            for (name, at) in &group.members {
                if !instances.contains_key(name.as_str()) {
                    self.refuse(at, name, format!("no vrrp_instance is named `{name}`"));
                } else if let Some(other) = member_of.insert(name, g) {
                    self.refuse(
                        at,
                        name,
                        format!(
                            "already in vrrp_sync_group {}: an instance moves with one group",
                            k.sync_groups[other].name
                        ),
                    );
                }
            }
        }
        let mut groups = Vec::new();
        let mut done = BTreeSet::new();
        let mut used_scripts = BTreeSet::new();
        for i in &k.instances {
            if done.contains(i.name.as_str()) {
                continue;
            }
            let (sync, members): (Option<&SyncGroup>, Vec<&Instance>) =
                match member_of.get(i.name.as_str()) {
                    Some(&g) => {
                        let sync = &k.sync_groups[g];
                        let members = k
                            .instances
                            .iter()
                            .filter(|m| member_of.get(m.name.as_str()) == Some(&g))
                            .collect();
                        (Some(sync), members)
                    }
                    None => (None, vec![i]),
                };
            for m in &members {
                done.insert(m.name.as_str());
                used_scripts.extend(m.tracked.iter().map(|t| t.name.clone()));
            }
            if let Some(mut g) = self.group(sync, &members, &scripts) {
                g.vrrp = self.vrrp(sync, &members, k.global.vrrp_version);
                groups.push(g);
            }
        }
        for s in &k.scripts {
            if !used_scripts.contains(&s.name) {
                self.warnings.push(Finding::new(
                    &s.at,
                    "vrrp_script",
                    format!("`{}` is tracked by no vrrp_instance: left out", s.name),
                ));
            }
        }
        self.unique_names(&mut groups, k);
        let mut out = Output {
            cluster: options.cluster.clone().unwrap_or_else(|| cluster_name(k)),
            node: options.node.clone().or_else(|| k.global.router_id.clone()),
            script_user: k.global.script_user.clone(),
            groups,
            ..Output::default()
        };
        if k.instances.is_empty() {
            self.refuse(
                &Place::new(self.file, 0),
                "vrrp_instance",
                "none in the file: nothing to convert",
            );
            return out;
        }
        self.mesh(k, options, &mut out);
        self.announce(k, &mut out);
        out
    }

    /// `bind` and `peers`: from the command line, else from the instances.
    fn mesh(&mut self, k: &Keepalived, options: &Options, out: &mut Output) {
        let at = k
            .instances
            .first()
            .map_or_else(|| Place::new(self.file, 0), |i| i.at.clone());
        out.bind = match options.bind {
            Some(b) => Some(b),
            None => {
                let sources: BTreeSet<IpAddr> = k
                    .instances
                    .iter()
                    .filter_map(|i| i.source.as_ref().map(|s| s.0))
                    .collect();
                match sources.len() {
                    0 => {
                        self.refuse(
                            &at,
                            "unicast_src_ip",
                            "no instance gives this node's address: swimlb's gossip needs it; \
                             add `--bind ADDRESS`",
                        );
                        None
                    }
                    1 => sources.first().copied(),
                    _ => {
                        let list: Vec<String> = sources.iter().map(ToString::to_string).collect();
                        self.refuse(
                            &at,
                            "unicast_src_ip",
                            format!(
                                "the instances use {}: swimlb gossips from one address; choose \
                                 it with `--bind ADDRESS`",
                                list.join(" and ")
                            ),
                        );
                        None
                    }
                }
            }
        };
        if !options.peers.is_empty() {
            out.peers = options.peers.clone();
        } else {
            for i in &k.instances {
                for (p, _) in &i.peers {
                    if !out.peers.contains(p) && Some(*p) != out.bind {
                        out.peers.push(*p);
                    }
                }
            }
            if out.peers.is_empty() && !k.instances.is_empty() {
                self.refuse(
                    &at,
                    "unicast_peer",
                    "no unicast_peer: keepalived finds its peers by multicast, swimlb needs their \
                     addresses; add `--peer ADDRESS` for each other node",
                );
            }
        }
    }

    /// `announce`: the `garp_master_*` settings of every instance (or of `global_defs`), which
    /// must agree, since swimlb has one schedule for every group.
    fn announce(&mut self, k: &Keepalived, out: &mut Output) {
        type Pick<'g, T> = fn(&'g model::Garp) -> &'g Option<(T, Place)>;
        fn effective<'g, T: Clone + PartialEq>(
            c: &mut Converter<'_>,
            k: &'g Keepalived,
            key: &str,
            pick: Pick<'g, T>,
        ) -> Option<T> {
            let global = pick(&k.global.garp);
            let mut values: Vec<(Option<T>, Place)> = Vec::new();
            for i in &k.instances {
                let v = pick(&i.garp).as_ref().or(global.as_ref());
                let at = v.map_or_else(|| i.at.clone(), |(_, at)| at.clone());
                values.push((v.map(|(x, _)| x.clone()), at));
            }
            if values.iter().all(|(v, _)| v.is_none()) {
                return None;
            }
            let first = &values[0].0;
            if let Some((_, at)) = values.iter().find(|(v, _)| v != first) {
                c.refuse(
                    at,
                    key,
                    "differs between instances (or from keepalived's default): swimlb announces \
                     every group on one schedule; give every instance the same value",
                );
                return None;
            }
            first.clone()
        }
        if let Some(d) = effective(self, k, "garp_master_delay", |g| &g.delay) {
            let value = if d.is_zero() {
                "off".to_string()
            } else {
                format_duration(d)
            };
            out.announce
                .push(("secondBurstAfter", value, "garp_master_delay".into()));
        }
        if let Some(n) = effective(self, k, "garp_master_repeat", |g| &g.repeat) {
            out.announce
                .push(("burst", n.to_string(), "garp_master_repeat".into()));
        }
        if let Some(d) = effective(self, k, "garp_master_refresh", |g| &g.refresh) {
            if !d.is_zero() && d < Duration::from_secs(1) {
                let at = k
                    .instances
                    .first()
                    .map_or_else(Place::default, |i| i.at.clone());
                self.refuse(
                    &at,
                    "garp_master_refresh",
                    "swimlb refreshes at most once a second",
                );
            }
            let value = if d.is_zero() {
                "off".to_string()
            } else {
                format_duration(d)
            };
            out.announce
                .push(("refresh", value, "garp_master_refresh".into()));
        }
        if let Some(n) = effective(self, k, "garp_master_refresh_repeat", |g| &g.refresh_repeat)
            && n != 1
        {
            let at = k
                .instances
                .iter()
                .find_map(|i| i.garp.refresh_repeat.as_ref().map(|r| r.1.clone()))
                .or_else(|| k.global.garp.refresh_repeat.as_ref().map(|r| r.1.clone()))
                .unwrap_or_default();
            self.refuse(
                &at,
                "garp_master_refresh_repeat",
                "swimlb sends one announcement per refresh",
            );
        }
    }

    /// One group: an instance, or the instances of a sync group.
    fn group(
        &mut self,
        sync: Option<&SyncGroup>,
        members: &[&Instance],
        scripts: &BTreeMap<&str, &Script>,
    ) -> Option<OutGroup> {
        let first = members[0];
        let (name, at, keyword) = match sync {
            Some(s) => (s.name.as_str(), s.at.clone(), "vrrp_sync_group"),
            None => (first.name.as_str(), first.at.clone(), "vrrp_instance"),
        };
        let refusals_before = self.refusals.len();
        let mut comment = String::from("keepalived:");
        if let Some(s) = sync {
            let _ = write!(comment, " vrrp_sync_group {};", s.name);
        }
        for (n, m) in members.iter().enumerate() {
            if n > 0 {
                comment.push(';');
            }
            let _ = write!(comment, " vrrp_instance {}", m.name);
            if let Some(v) = m.vrid {
                let _ = write!(comment, ", virtual_router_id {v}");
            }
            let _ = write!(
                comment,
                ", advert_int {}",
                m.advert_int.as_deref().unwrap_or("1")
            );
        }
        // What the members must agree on.
        let agree = |c: &mut Self, what: &str, values: Vec<String>| {
            let distinct: BTreeSet<&String> = values.iter().collect();
            if distinct.len() > 1 {
                let pairs: Vec<String> = members
                    .iter()
                    .zip(&values)
                    .map(|(m, v)| format!("{} has {v}", m.name))
                    .collect();
                c.refuse(
                    &at,
                    keyword,
                    format!(
                        "{}: the instances of a sync group become one swimlb group, with one {what}",
                        pairs.join(", ")
                    ),
                );
            }
        };
        let interfaces: Vec<String> = members
            .iter()
            .map(|m| m.interface.clone().unwrap_or_else(|| "no interface".into()))
            .collect();
        agree(self, "interface", interfaces);
        let priorities = members
            .iter()
            .map(|m| format!("priority {}", m.priority.unwrap_or(KEEPALIVED_PRIORITY)))
            .collect();
        agree(self, "priority", priorities);
        let delays = members
            .iter()
            .map(|m| {
                format!(
                    "preempt_delay {}",
                    format_duration(m.preempt_delay.unwrap_or_default())
                )
            })
            .collect();
        agree(self, "preemptDelay", delays);
        let interface = first.interface.clone();
        let mut addresses = Vec::new();
        for m in members {
            if m.addresses.is_empty() {
                self.refuse(
                    &m.at,
                    "vrrp_instance",
                    format!("`{}` has no virtual_ipaddress", m.name),
                );
            }
            for vip in &m.addresses {
                if let Some(dev) = &vip.dev
                    && Some(dev) != m.interface.as_ref()
                {
                    self.refuse(
                        &vip.at,
                        &vip.address.to_string(),
                        format!(
                            "`dev {dev}` is not the instance's interface ({}): a group announces \
                             on one interface; put the address in an instance of its own on {dev}",
                            m.interface.as_deref().unwrap_or("none")
                        ),
                    );
                }
                if addresses.contains(&vip.address) {
                    self.refuse(&vip.at, &vip.address.to_string(), "listed twice");
                } else {
                    addresses.push(vip.address);
                }
            }
        }
        let checks = self.checks(sync, members, scripts);
        // One notify program for the group.
        let mut notifies: Vec<&Notify> = sync.and_then(|s| s.notify.as_ref()).into_iter().collect();
        notifies.extend(members.iter().filter_map(|m| m.notify.as_ref()));
        let programs: BTreeSet<&String> = notifies.iter().map(|n| &n.argv[0]).collect();
        if programs.len() > 1 {
            let list: Vec<&str> = programs.iter().map(|p| p.as_str()).collect();
            self.refuse(
                &notifies[1].at,
                "notify",
                format!(
                    "{} for one group: swimlb runs one program per group; write one that runs \
                     them all",
                    list.join(" and ")
                ),
            );
        }
        if let Some(n) = notifies.first() {
            self.warnings.push(Finding::new(
                &n.at,
                "notify",
                format!(
                    "swimlb calls it as `{} GROUP owner|backup|fault`; keepalived called it with \
                     `INSTANCE NAME MASTER|BACKUP|FAULT PRIORITY`: adapt the script",
                    n.argv[0]
                ),
            ));
        }
        if self.refusals.len() > refusals_before {
            return None;
        }
        let delay = first.preempt_delay.filter(|d| !d.is_zero());
        Some(OutGroup {
            comment,
            name: sanitize(name),
            addresses,
            interface,
            priority: first.priority.unwrap_or(KEEPALIVED_PRIORITY),
            preempt_delay: delay,
            checks,
            notify: notifies.first().map(|n| n.argv[0].clone()),
            vrrp: None,
        })
    }

    /// The group's `vrrp:`, so that it runs beside the keepalived routers it came from: one
    /// instance's `virtual_router_id` and `advert_int`. A sync group of several instances has
    /// several VRIDs, which one group cannot speak for (warned: none written).
    fn vrrp(
        &mut self,
        sync: Option<&SyncGroup>,
        members: &[&Instance],
        global_version: Option<u8>,
    ) -> Option<(u8, Duration)> {
        let [one] = members else {
            if let Some(s) = sync {
                self.warnings.push(Finding::new(
                    &s.at,
                    "vrrp_sync_group",
                    "no `vrrp:` written: a group speaks for one VRID and these instances have \
                     several; stop keepalived on a node before swimlb starts there",
                ));
            }
            return None;
        };
        if let Some((_, at)) = one.peers.first() {
            // keepalived in unicast mode joins no multicast group: it would never hear a
            // speaker's advertisements (224.0.0.18 / ff02::12), and would become master beside
            // a speaker owner.
            self.warnings.push(Finding::new(
                at,
                "unicast_peer",
                "no `vrrp:` written: keepalived with unicast_peer does not hear a speaker's \
                 multicast advertisements, so it would answer beside a speaker owner; switch all \
                 at once, or make keepalived multicast (no unicast_peer) before switching node by \
                 node",
            ));
            return None;
        }
        let vrid = one.vrid?;
        let text = one.advert_int.as_deref().unwrap_or("1");
        let interval = text
            .parse::<f64>()
            .ok()
            .filter(|s| s.is_finite() && *s >= 0.01 && *s <= 40.95)
            .map(|s| Duration::from_millis(((s * 100.0).round() as u64) * 10));
        let Some(interval) = interval else {
            self.refuse(
                &one.at,
                "advert_int",
                format!("`{text}`: VRRPv3 carries 0.01 to 40.95 seconds"),
            );
            return None;
        };
        if one.version.or(global_version).unwrap_or(2) != 3 {
            self.warnings.push(Finding::new(
                &one.at,
                "version",
                "keepalived speaks VRRPv2 here (its default) and swimlb VRRPv3 only: set \
                 `vrrp_version 3` in global_defs on every keepalived router of this VRID before \
                 a speaker starts beside them",
            ));
        }
        Some((vrid, interval))
    }

    /// The checks of a group: each tracked script once, with the instance's weight (or the
    /// script's); in a sync group, weight 0 unless `sync_group_tracking_weight`, as keepalived
    /// sets it.
    fn checks(
        &mut self,
        sync: Option<&SyncGroup>,
        members: &[&Instance],
        scripts: &BTreeMap<&str, &Script>,
    ) -> Vec<OutCheck> {
        let mut checks: Vec<OutCheck> = Vec::new();
        for m in members {
            for t in &m.tracked {
                let Some(script) = scripts.get(t.name.as_str()) else {
                    self.refuse(
                        &t.at,
                        &t.name,
                        format!("no vrrp_script is named `{}`", t.name),
                    );
                    continue;
                };
                let Some(argv) = &script.argv else {
                    continue;
                };
                let mut weight = t.weight.unwrap_or(script.weight);
                if let Some(s) = sync
                    && !s.tracking_weight
                    && weight != 0
                {
                    self.warnings.push(Finding::new(
                        &t.at,
                        &t.name,
                        format!(
                            "weight {weight} becomes 0: keepalived sets the weights of a sync \
                             group's scripts to 0 (without sync_group_tracking_weight), so a \
                             failure takes the node out of the group"
                        ),
                    ));
                    weight = 0;
                }
                let timeout = script.timeout.unwrap_or(script.interval);
                if timeout > script.interval {
                    self.refuse(
                        &script.at,
                        &script.name,
                        format!(
                            "timeout {} is longer than interval {}: swimlb starts a run every \
                             interval, so runs would overlap; make the interval at least the \
                             timeout",
                            format_duration(timeout),
                            format_duration(script.interval)
                        ),
                    );
                    continue;
                }
                if script.interval < Duration::from_millis(10) {
                    self.refuse(
                        &script.at,
                        &script.name,
                        "swimlb runs a check at most every 10ms",
                    );
                    continue;
                }
                let check = OutCheck {
                    name: sanitize(&script.name),
                    script: script.name.clone(),
                    argv: argv.clone(),
                    interval: script.interval,
                    timeout,
                    rise: script.rise,
                    fall: script.fall,
                    weight,
                    user: script.user.clone(),
                };
                match checks.iter().find(|c| c.name == check.name) {
                    Some(same) if same.script == check.script && same.weight == check.weight => {}
                    Some(other) => self.refuse(
                        &t.at,
                        &t.name,
                        format!(
                            "becomes check `{}`, as does {} with weight {}: a group tracks each \
                             script once, with one weight",
                            check.name, other.script, other.weight
                        ),
                    ),
                    None => checks.push(check),
                }
            }
        }
        checks
    }

    /// Two instances whose sanitised names collide are refused.
    fn unique_names(&mut self, groups: &mut [OutGroup], k: &Keepalived) {
        let mut seen: BTreeSet<String> = BTreeSet::new();
        for g in groups.iter() {
            if !seen.insert(g.name.clone()) {
                let at = k
                    .instances
                    .iter()
                    .find(|i| sanitize(&i.name) == g.name)
                    .map_or_else(Place::default, |i| i.at.clone());
                self.refuse(
                    &at,
                    "vrrp_instance",
                    format!("two groups would be named `{}`: rename one", g.name),
                );
            }
        }
    }
}

/// The default cluster name: `keepalived-` and every `virtual_router_id`, so that every node of
/// one keepalived setup derives the same one.
fn cluster_name(k: &Keepalived) -> String {
    let ids: BTreeSet<u8> = k.instances.iter().filter_map(|i| i.vrid).collect();
    let mut name = String::from("keepalived");
    for id in ids {
        let _ = write!(name, "-{id}");
    }
    name
}

/// A name the standalone file accepts for a group or a check: letters, digits, `-`, `_` and
/// `.`, at most 63; anything else becomes `-`.
fn sanitize(name: &str) -> String {
    let mut out: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '-'
            }
        })
        .collect();
    out.truncate(63);
    out
}

/// A YAML scalar for `s`: plain when that reads back as the same string, else double-quoted.
fn scalar(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars().all(|c| {
            c.is_ascii_alphanumeric() || matches!(c, '/' | '_' | '.' | '-' | '+' | '=' | ':')
        })
        && !s.starts_with(['-', '.'])
        && s.parse::<f64>().is_err()
        && !s.ends_with(':')
        && !base_sixty(s)
        && !matches!(
            s.to_ascii_lowercase().as_str(),
            "true" | "false" | "yes" | "no" | "on" | "off" | "null" | "y" | "n" | "inf" | "nan"
        );
    if plain {
        s.to_string()
    } else {
        serde_json::to_string(s).unwrap_or_default()
    }
}

/// Whether YAML 1.1 could read `s` as a base-60 number (`1000:1000`, `1:30.5`).
fn base_sixty(s: &str) -> bool {
    let digits = |t: &str| !t.is_empty() && t.chars().all(|c| c.is_ascii_digit() || c == '_');
    s.contains(':')
        && s.chars()
            .all(|c| c.is_ascii_digit() || matches!(c, ':' | '.' | '_'))
        && s.split(':').next().is_some_and(digits)
}

fn socket(ip: IpAddr) -> String {
    SocketAddr::new(ip, DEFAULT_GOSSIP_PORT).to_string()
}

/// The standalone file, with comments.
fn emit(out: &Output, file: &str) -> String {
    let mut y = String::new();
    let _ = writeln!(
        y,
        "# Converted from {file} by `swimlb-speaker convert-keepalived`."
    );
    let _ = writeln!(
        y,
        "# The priorities are this node's: the files of all nodes merge into one by joining the"
    );
    let _ = writeln!(y, "# groups' `priority` maps.");
    let _ = writeln!(y, "cluster: {}", scalar(&out.cluster));
    if let Some(node) = &out.node {
        let _ = writeln!(y, "node: {}", scalar(node));
    }
    if let Some(bind) = out.bind {
        let _ = writeln!(y, "bind: {}", scalar(&socket(bind)));
    }
    let peers: Vec<String> = out.peers.iter().map(|p| scalar(&socket(*p))).collect();
    let _ = writeln!(y, "peers: [{}]", peers.join(", "));
    let _ = writeln!(
        y,
        "# keepalived's authentication does not carry over: make one key with\n\
         # `swimlb-speaker keygen > {KEY_FILE}` and copy the file to every node."
    );
    let _ = writeln!(y, "keyFile: {KEY_FILE}");
    if let Some(user) = &out.script_user {
        let _ = writeln!(y, "scriptUser: {}   # script_user", scalar(user));
    }
    if !out.announce.is_empty() {
        let _ = writeln!(y, "announce:");
        for (key, value, from) in &out.announce {
            let _ = writeln!(y, "  {key}: {value}   # {from}");
        }
    }
    let _ = writeln!(y, "groups:");
    for g in &out.groups {
        let _ = writeln!(y, "  # {}", g.comment);
        let _ = writeln!(y, "  - name: {}", scalar(&g.name));
        let addresses: Vec<String> = g.addresses.iter().map(|a| scalar(&a.to_string())).collect();
        let _ = writeln!(y, "    addresses: [{}]", addresses.join(", "));
        if let Some(i) = &g.interface {
            let _ = writeln!(y, "    interface: {}", scalar(i));
        }
        match &out.node {
            Some(node) => {
                let _ = writeln!(y, "    priority: {{{}: {}}}", scalar(node), g.priority);
            }
            None => {
                let _ = writeln!(y, "    priority: {}", g.priority);
            }
        }
        if let Some(d) = g.preempt_delay {
            let _ = writeln!(y, "    preemptDelay: {}", format_duration(d));
        }
        if let Some((vrid, interval)) = g.vrrp {
            let _ = writeln!(
                y,
                "    vrrp: {{vrid: {vrid}, advertInterval: {}}}",
                format_duration(interval)
            );
        }
        if !g.checks.is_empty() {
            let _ = writeln!(y, "    checks:");
            for c in &g.checks {
                let argv: Vec<String> = c.argv.iter().map(|a| scalar(a)).collect();
                if c.name == c.script {
                    let _ = writeln!(y, "      - name: {}", scalar(&c.name));
                } else {
                    let _ = writeln!(
                        y,
                        "      - name: {}   # vrrp_script {}",
                        scalar(&c.name),
                        c.script
                    );
                }
                let _ = writeln!(y, "        exec: [{}]", argv.join(", "));
                let _ = writeln!(y, "        interval: {}", format_duration(c.interval));
                let _ = writeln!(y, "        timeout: {}", format_duration(c.timeout));
                let _ = writeln!(y, "        rise: {}", c.rise);
                let _ = writeln!(y, "        fall: {}", c.fall);
                let _ = writeln!(y, "        weight: {}", c.weight);
                if let Some(user) = &c.user {
                    let _ = writeln!(y, "        user: {}", scalar(user));
                }
            }
        }
        if let Some(n) = &g.notify {
            let _ = writeln!(
                y,
                "    notify: {}   # called with: group, owner|backup|fault",
                scalar(n)
            );
        }
    }
    y
}

#[cfg(test)]
mod tests;
