//! The standalone speaker's configuration file, and its validation.
//!
//! The file is YAML (a JSON file is YAML too). Parsing happens in two steps that never stop at
//! the first problem: the YAML becomes a tree, then [`Standalone::from_tree`] walks the whole tree
//! and either returns the validated model or every error found, each with its path
//! (`groups[0].checks[1].interval: ...`). Unknown keys are errors, so a typo never silently falls
//! back to a default. The keys known, with their types, defaults and meanings, are one table,
//! [`keys::KEYS`], which the reference page is written from.
//!
//! The validated model uses parsed types only: socket addresses, IP addresses, [`Duration`]s,
//! `NonZeroU32`. Defaults follow keepalived where it has one (check interval 1 s, timeout = interval,
//! rise 1, fall 1, priority 100, gratuitous ARP 5 at once and 5 more after 5 s, refresh off).
//!
//! ```
//! let text = "
//! cluster: edge-1
//! node: master-0
//! bind: 192.0.2.10:7946
//! peers: [192.0.2.11:7946]
//! keyFile: /etc/swimlb/keys
//! groups:
//!   - name: api
//!     addresses: [192.0.2.100/32]
//!     checks:
//!       - {name: api, tcp: \"127.0.0.1:6443\", interval: 1s, fall: 2}
//! ";
//! let config = swimlb_config::standalone::Standalone::parse(text).unwrap();
//! assert_eq!(config.groups[0].checks[0].worst_case_detection().as_millis(), 3000);
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Map, Value};

use crate::duration::parse_duration;

mod checks;
pub mod keys;
mod vrrp;

pub use vrrp::Vrrp;

/// The default gossip port.
pub const DEFAULT_GOSSIP_PORT: u16 = 7946;
/// The default address of the HTTP listener (`/metrics`, `/healthz`, `/readyz`, `/status`): the
/// loopback, so nothing off the host reaches it until `listen` names an address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7572";
/// keepalived's default priority.
pub const DEFAULT_PRIORITY: u8 = 100;
/// The most missed intervals `ownerWatchMisses` accepts. The fewest (3) is the speaker's to check,
/// with the interval, so the knobs' errors come from one place.
pub const MAX_OWNER_WATCH_MISSES: u32 = 1000;

/// One problem in a configuration file, with where it is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct ConfigError {
    /// Where: `groups[0].checks[1].interval`, or `(file)` for the whole file.
    pub path: String,
    /// What is wrong, and what would be right.
    pub message: String,
}

/// All problems found in one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

/// The validated standalone configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Standalone {
    /// Gossip cluster name; also the envelope's associated data.
    pub cluster: String,
    /// This node's name; `None` means "the hostname", resolved by the speaker.
    pub node: Option<String>,
    /// Gossip socket address.
    pub bind: SocketAddr,
    /// Seeds to announce to.
    pub peers: Vec<SocketAddr>,
    /// Key file (one base64 key per line). `None` only with `insecure: true`.
    pub key_file: Option<PathBuf>,
    /// Gossip without encryption or authentication. Must be set explicitly.
    pub insecure: bool,
    /// HTTP listener for metrics, health and status.
    pub listen: SocketAddr,
    /// Gossip timing.
    pub gossip: GossipSettings,
    /// Gratuitous ARP / unsolicited NA schedule.
    pub announce: AnnounceSettings,
    /// Who exec checks and notify hooks run as (keepalived's `script_user`); `None`: root, or
    /// the speaker's own user when it is not root. A check's own `user` wins over it.
    pub script_user: Option<ScriptUser>,
    /// VIP groups.
    pub groups: Vec<Group>,
}

/// Who a program the speaker runs (an exec check, a notify hook) runs as, as written: `user`,
/// `user:group`, or numeric ids. The speaker resolves the names when it loads the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptUser {
    /// A user name or a numeric uid.
    pub user: String,
    /// A group name or a numeric gid; `None`: the user's primary group.
    pub group: Option<String>,
}

impl fmt::Display for ScriptUser {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.group {
            Some(group) => write!(f, "{}:{group}", self.user),
            None => f.write_str(&self.user),
        }
    }
}

/// Named gossip timing profiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Profile {
    /// Sub-second detection on a LAN (the default).
    #[default]
    Fast,
    /// memberlist-like timings, for noisy networks.
    Lan,
}

impl Profile {
    /// The profile's name in files and on the command line.
    pub const fn as_str(&self) -> &'static str {
        match self {
            Profile::Fast => "fast",
            Profile::Lan => "lan",
        }
    }
}

/// Gossip timing: a profile plus optional overrides. The speaker validates the combination.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GossipSettings {
    /// Base profile.
    pub profile: Profile,
    /// Probe period override.
    pub probe_period: Option<Duration>,
    /// Probe round-trip timeout override.
    pub probe_rtt: Option<Duration>,
    /// Suspicion timeout override.
    pub suspect_to_down: Option<Duration>,
    /// Periodic gossip interval override.
    pub periodic_gossip: Option<Duration>,
    /// Periodic gossip fan-out override.
    pub gossip_fanout: Option<NonZeroU32>,
    /// Indirect probes override.
    pub indirect_probes: Option<NonZeroU32>,
    /// Minimum transmissions of each update override.
    pub max_transmissions: Option<NonZeroU32>,
    /// Scale the suspicion with the member count (memberlist's rule) override.
    pub scale_suspicion: Option<bool>,
    /// Raise transmissions with the member count override.
    pub scale_transmissions: Option<bool>,
    /// Tell a suspect at once after a failed probe override.
    pub notify_suspects: Option<bool>,
    /// foca's `notify_down_members` override.
    pub notify_down_members: Option<bool>,
    /// Period of the announces to members held down (partition heals) override.
    pub announce_down_period: Option<Duration>,
    /// Members held down announced to per period override.
    pub announce_down_fanout: Option<NonZeroU32>,
    /// Period of the announce to one random member override.
    pub announce_period: Option<Duration>,
    /// Period of the membership digest exchange override (`0s` turns it off).
    pub sync_period: Option<Duration>,
    /// Join retry period override.
    pub join_retry: Option<Duration>,
    /// Metadata re-offer period override.
    pub meta_refresh: Option<Duration>,
    /// Largest gossip packet override (bytes).
    pub max_packet_size: Option<NonZeroU32>,
    /// Owner watch (direct heartbeats from an IP's owner to its successor) on or off override.
    pub owner_watch: Option<bool>,
    /// Owner watch heartbeat interval override. The speaker refuses one below 10 ms or above 1 s.
    pub owner_watch_interval: Option<Duration>,
    /// Owner watch missed intervals before silence override. The speaker refuses fewer than 3.
    pub owner_watch_misses: Option<NonZeroU32>,
}

/// When gratuitous ARP and unsolicited neighbor advertisements are sent after a takeover.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnnounceSettings {
    /// Announcements per burst (keepalived's `garp_master_repeat`, 5).
    pub burst: NonZeroU32,
    /// Delay before the second burst (keepalived's `garp_master_delay`, 5 s); `None` disables it.
    pub second_burst_after: Option<Duration>,
    /// Periodic refresh (keepalived's `garp_master_refresh`, off).
    pub refresh: Option<Duration>,
}

impl Default for AnnounceSettings {
    fn default() -> Self {
        AnnounceSettings {
            burst: NonZeroU32::new(5).expect("5 is not zero"),
            second_burst_after: Some(Duration::from_secs(5)),
            refresh: None,
        }
    }
}

/// A group of VIPs that move together.
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    /// Unique name; appears in metrics, `/status` and notify calls.
    pub name: String,
    /// The virtual addresses.
    pub addresses: Vec<IpAddr>,
    /// Interface to announce on; `None` = the interface holding a route to the address.
    pub interface: Option<String>,
    /// Base priority per node.
    pub priority: PriorityMap,
    /// How long a node must be up before it may take the group over (keepalived `preempt_delay`).
    pub preempt_delay: Duration,
    /// Health checks, in file order.
    pub checks: Vec<Check>,
    /// Program run on every state change with the group name and the new state.
    pub notify: Option<PathBuf>,
    /// The VRRPv3 router spoken beside keepalived, if any.
    pub vrrp: Option<Vrrp>,
}

/// Base priorities: per node, with a default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PriorityMap {
    /// Explicit priorities.
    pub nodes: BTreeMap<String, u8>,
    /// Priority of every other node.
    pub default: u8,
}

impl PriorityMap {
    /// The base priority of `node`.
    pub fn of(&self, node: &str) -> u8 {
        self.nodes.get(node).copied().unwrap_or(self.default)
    }
}

impl Default for PriorityMap {
    fn default() -> Self {
        PriorityMap {
            nodes: BTreeMap::new(),
            default: DEFAULT_PRIORITY,
        }
    }
}

/// A health check.
#[derive(Debug, Clone, PartialEq)]
pub struct Check {
    /// Unique within the group.
    pub name: String,
    /// What is checked.
    pub kind: CheckKind,
    /// Time between two runs.
    pub interval: Duration,
    /// Time a run may take before it counts as a failure.
    pub timeout: Duration,
    /// Consecutive passes to become passing.
    pub rise: NonZeroU32,
    /// Consecutive failures to become failing.
    pub fall: NonZeroU32,
    /// keepalived's weight: `> 0` adds while passing, `< 0` subtracts while failing, `0` means a
    /// failure makes the node ineligible for the group (FAULT).
    pub weight: i32,
}

impl Check {
    /// The longest time from a failure to the check reporting it: `interval x fall + timeout`.
    pub fn worst_case_detection(&self) -> Duration {
        self.interval
            .saturating_mul(self.fall.get())
            .saturating_add(self.timeout)
    }
}

/// The kinds of health check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckKind {
    /// HTTP(S) GET; passes on the expected status (any 2xx when `expect_status` is `None`).
    Http {
        /// `http://` or `https://` URL.
        url: String,
        /// Accept any TLS certificate.
        insecure: bool,
        /// Exact status to expect.
        expect_status: Option<u16>,
    },
    /// TCP connect to `host:port`.
    Tcp {
        /// Host (name or address) and port.
        target: String,
    },
    /// Run a program; exit status 0 passes. No shell is involved.
    Exec {
        /// Program and arguments.
        argv: Vec<String>,
        /// Who it runs as: the check's `user`, else the file's `scriptUser`.
        user: Option<ScriptUser>,
    },
}

impl CheckKind {
    /// The kind's name as written in files.
    pub const fn as_str(&self) -> &'static str {
        match self {
            CheckKind::Http { .. } => "http",
            CheckKind::Tcp { .. } => "tcp",
            CheckKind::Exec { .. } => "exec",
        }
    }
}

impl Standalone {
    /// Parses and validates a YAML (or JSON) file's text.
    pub fn parse(text: &str) -> Result<Standalone, ConfigErrors> {
        let tree: Value = serde_saphyr::from_str(text).map_err(|e| {
            ConfigErrors(vec![ConfigError {
                path: "(file)".into(),
                message: e.to_string(),
            }])
        })?;
        Standalone::from_tree(&tree)
    }

    /// Validates an already-parsed tree, reporting every error.
    pub fn from_tree(tree: &Value) -> Result<Standalone, ConfigErrors> {
        let mut w = Walker::default();
        let config = w.standalone(tree);
        match config {
            Some(c) if w.errors.is_empty() => Ok(c),
            _ => Err(ConfigErrors(w.errors)),
        }
    }

    /// Every address of every group, with the group's index.
    pub fn addresses(&self) -> impl Iterator<Item = (usize, IpAddr)> + '_ {
        self.groups
            .iter()
            .enumerate()
            .flat_map(|(i, g)| g.addresses.iter().map(move |a| (i, *a)))
    }
}

/// Collects errors while reading a tree; each reader returns `None` after recording an error.
#[derive(Default)]
struct Walker {
    errors: Vec<ConfigError>,
    /// The file's `scriptUser`, read before the groups: the default `user` of exec checks.
    script_user: Option<ScriptUser>,
}

impl Walker {
    fn error(&mut self, path: &str, message: impl Into<String>) {
        self.errors.push(ConfigError {
            path: path.to_string(),
            message: message.into(),
        });
    }

    /// The value as a mapping whose keys are all keys of `section` in [`keys::KEYS`]; unknown
    /// keys are reported.
    fn object<'v>(
        &mut self,
        path: &str,
        v: &'v Value,
        section: &str,
    ) -> Option<&'v Map<String, Value>> {
        let known = keys::known(section);
        let Some(map) = v.as_object() else {
            self.error(path, format!("expected a mapping, found {}", kind(v)));
            return None;
        };
        for key in map.keys() {
            if !known.contains(&key.as_str()) {
                self.error(
                    &join(path, key),
                    format!("unknown field; expected one of: {}", known.join(", ")),
                );
            }
        }
        Some(map)
    }

    fn string(&mut self, path: &str, v: &Value) -> Option<String> {
        match v {
            Value::String(s) if !s.trim().is_empty() => Some(s.trim().to_string()),
            Value::String(_) => {
                self.error(path, "must not be empty");
                None
            }
            other => {
                self.error(path, format!("expected a string, found {}", kind(other)));
                None
            }
        }
    }

    fn bool(&mut self, path: &str, v: &Value) -> Option<bool> {
        match v {
            Value::Bool(b) => Some(*b),
            other => {
                self.error(
                    path,
                    format!("expected true or false, found {}", kind(other)),
                );
                None
            }
        }
    }

    fn integer(&mut self, path: &str, v: &Value, min: i64, max: i64) -> Option<i64> {
        match v.as_i64() {
            Some(n) if (min..=max).contains(&n) => Some(n),
            Some(n) => {
                self.error(path, format!("{n} is out of range {min}..={max}"));
                None
            }
            None => {
                self.error(path, format!("expected an integer, found {}", kind(v)));
                None
            }
        }
    }

    fn duration(&mut self, path: &str, v: &Value) -> Option<Duration> {
        let text = match v {
            Value::String(s) => s.as_str(),
            Value::Number(n) => {
                self.error(
                    path,
                    crate::duration::DurationError::MissingUnit(n.to_string()).to_string(),
                );
                return None;
            }
            other => {
                self.error(
                    path,
                    format!(
                        "expected a duration such as `1s` or `900ms`, found {}",
                        kind(other)
                    ),
                );
                return None;
            }
        };
        match parse_duration(text) {
            Ok(d) => Some(d),
            Err(e) => {
                self.error(path, e.to_string());
                None
            }
        }
    }

    fn socket_addr(
        &mut self,
        path: &str,
        v: &Value,
        default_port: Option<u16>,
    ) -> Option<SocketAddr> {
        let text = self.string(path, v)?;
        if let Ok(addr) = text.parse::<SocketAddr>() {
            return Some(addr);
        }
        if let (Some(port), Ok(ip)) = (default_port, text.parse::<IpAddr>()) {
            return Some(SocketAddr::new(ip, port));
        }
        self.error(
            path,
            format!(
                "`{text}` is not an address with a port (`192.0.2.10:7946`, `[2001:db8::1]:7946`)"
            ),
        );
        None
    }

    fn list<'v>(&mut self, path: &str, v: &'v Value) -> Option<&'v [Value]> {
        match v {
            Value::Array(items) => Some(items),
            other => {
                self.error(path, format!("expected a list, found {}", kind(other)));
                None
            }
        }
    }

    fn standalone(&mut self, tree: &Value) -> Option<Standalone> {
        let map = self.object("(file)", tree, "")?;
        let cluster = match map.get("cluster") {
            Some(v) => self.string("cluster", v).and_then(|c| self.cluster_name(c)),
            None => {
                self.error(
                    "cluster",
                    "required: the gossip cluster name, the same on every node",
                );
                None
            }
        };
        let node = match map.get("node") {
            Some(v) => self.string("node", v),
            None => None,
        };
        let bind = match map.get("bind") {
            Some(v) => self.socket_addr("bind", v, Some(DEFAULT_GOSSIP_PORT)),
            None => {
                self.error(
                    "bind",
                    "required: this node's gossip address, for example `192.0.2.10:7946`",
                );
                None
            }
        };
        let peers = map
            .get("peers")
            .map(|v| self.peers(v, bind))
            .unwrap_or_default();
        let insecure = map
            .get("insecure")
            .and_then(|v| self.bool("insecure", v))
            .unwrap_or(false);
        let key_file = map
            .get("keyFile")
            .and_then(|v| self.string("keyFile", v))
            .map(PathBuf::from);
        match (&key_file, insecure) {
            (None, false) if !map.contains_key("keyFile") => self.error(
                "keyFile",
                "required: gossip is authenticated; set `insecure: true` to run without a key (test setups only)",
            ),
            (Some(_), true) => self.error("insecure", "`insecure: true` and a `keyFile` contradict each other"),
            _ => {}
        }
        let listen = match map.get("listen") {
            Some(v) => self.socket_addr("listen", v, None),
            None => DEFAULT_LISTEN.parse().ok(),
        };
        let gossip = map
            .get("gossip")
            .map(|v| self.gossip(v))
            .unwrap_or_default();
        let announce = map
            .get("announce")
            .map(|v| self.announce(v))
            .unwrap_or_default();
        self.script_user = map
            .get("scriptUser")
            .and_then(|v| self.script_user("scriptUser", v));
        let groups = match map.get("groups") {
            Some(v) => self.groups(v),
            None => {
                self.error(
                    "groups",
                    "required: at least one group of virtual addresses",
                );
                Vec::new()
            }
        };
        Some(Standalone {
            cluster: cluster?,
            node,
            bind: bind?,
            peers,
            key_file,
            insecure,
            listen: listen?,
            gossip,
            announce,
            script_user: self.script_user.clone(),
            groups,
        })
    }

    /// `user`, `user:group`, a uid or `uid:gid`: no space, neither part empty.
    fn script_user(&mut self, path: &str, v: &Value) -> Option<ScriptUser> {
        let text = match v {
            Value::Number(n) if n.as_u64().is_some_and(|n| n <= u64::from(u32::MAX)) => {
                n.to_string()
            }
            Value::String(s) => s.clone(),
            other => {
                self.error(
                    path,
                    format!("expected a user name or uid, found {}", kind(other)),
                );
                return None;
            }
        };
        let (user, group) = match text.split_once(':') {
            Some((u, g)) => (u, Some(g)),
            None => (text.as_str(), None),
        };
        let plain = |s: &str| {
            !s.is_empty()
                && !s.contains(':')
                && !s.chars().any(|c| c.is_whitespace() || c.is_control())
        };
        if !plain(user) || group.is_some_and(|g| !plain(g)) {
            self.error(
                path,
                format!("`{text}` is not `user` or `user:group` (names or numeric ids)"),
            );
            return None;
        }
        Some(ScriptUser {
            user: user.to_string(),
            group: group.map(str::to_string),
        })
    }

    /// The seeds: each once, reachable from the gossip socket `bind` (when it is valid).
    fn peers(&mut self, v: &Value, bind: Option<SocketAddr>) -> Vec<SocketAddr> {
        let mut peers: Vec<SocketAddr> = Vec::new();
        let Some(items) = self.list("peers", v) else {
            return peers;
        };
        for (i, item) in items.iter().enumerate() {
            let here = format!("peers[{i}]");
            let Some(p) = self.socket_addr(&here, item, Some(DEFAULT_GOSSIP_PORT)) else {
                continue;
            };
            if let Some(first) = peers.iter().position(|q| *q == p) {
                self.error(&here, format!("{p} is already listed at peers[{first}]"));
                continue;
            }
            if bind == Some(p) {
                self.error(
                    &here,
                    format!("{p} is this node's own `bind` address: list the other nodes"),
                );
                continue;
            }
            let ip = p.ip();
            if p.port() == 0 || ip.is_unspecified() || ip.is_multicast() || is_broadcast(ip) {
                self.error(
                    &here,
                    format!("{p} cannot be a peer: a datagram to it reaches no node"),
                );
            } else if let Some(bind) = bind
                && !reaches(bind, p)
            {
                self.error(
                    &here,
                    format!(
                        "{p} is {} and the gossip socket (`bind: {bind}`) is {}: it cannot send to it",
                        family(p),
                        family(bind)
                    ),
                );
            }
            peers.push(p);
        }
        peers
    }

    fn cluster_name(&mut self, name: String) -> Option<String> {
        if name.len() > 253
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
        {
            self.error(
                "cluster",
                format!("`{name}`: use at most 253 letters, digits, `-` and `.`"),
            );
            return None;
        }
        Some(name)
    }

    fn gossip(&mut self, v: &Value) -> GossipSettings {
        let mut g = GossipSettings::default();
        let Some(map) = self.object("gossip", v, "gossip") else {
            return g;
        };
        if let Some(v) = map.get("profile") {
            match v.as_str() {
                Some("fast") => g.profile = Profile::Fast,
                Some("lan") => g.profile = Profile::Lan,
                _ => self.error(
                    "gossip.profile",
                    format!("expected `fast` or `lan`, found {}", show(v)),
                ),
            }
        }
        let dur = |w: &mut Walker, key: &str| {
            map.get(key)
                .and_then(|v| w.duration(&format!("gossip.{key}"), v))
        };
        g.probe_period = dur(self, "probePeriod");
        g.probe_rtt = dur(self, "probeRtt");
        g.suspect_to_down = dur(self, "suspectToDown");
        g.periodic_gossip = dur(self, "periodicGossip");
        let count = |w: &mut Walker, key: &str, max: i64| {
            map.get(key)
                .and_then(|v| w.integer(&format!("gossip.{key}"), v, 1, max))
                .and_then(|n| u32::try_from(n).ok())
                .and_then(NonZeroU32::new)
        };
        let flag = |w: &mut Walker, key: &str| {
            map.get(key)
                .and_then(|v| w.bool(&format!("gossip.{key}"), v))
        };
        g.gossip_fanout = count(self, "gossipFanout", 64);
        g.indirect_probes = count(self, "indirectProbes", 64);
        g.max_transmissions = count(self, "maxTransmissions", 255);
        g.scale_suspicion = flag(self, "scaleSuspicion");
        g.scale_transmissions = flag(self, "scaleTransmissions");
        g.notify_suspects = flag(self, "notifySuspects");
        g.notify_down_members = flag(self, "notifyDownMembers");
        g.announce_down_period = dur(self, "announceDownPeriod");
        g.announce_down_fanout = count(self, "announceDownFanout", 64);
        g.announce_period = dur(self, "announcePeriod");
        g.sync_period = dur(self, "syncPeriod");
        g.join_retry = dur(self, "joinRetry");
        g.meta_refresh = dur(self, "metaRefresh");
        g.max_packet_size = count(self, "maxPacketSize", 65_535);
        g.owner_watch = flag(self, "ownerWatch");
        g.owner_watch_interval = dur(self, "ownerWatchInterval");
        g.owner_watch_misses = count(self, "ownerWatchMisses", i64::from(MAX_OWNER_WATCH_MISSES));
        g
    }

    fn announce(&mut self, v: &Value) -> AnnounceSettings {
        let mut a = AnnounceSettings::default();
        let Some(map) = self.object("announce", v, "announce") else {
            return a;
        };
        if let Some(n) = map
            .get("burst")
            .and_then(|v| self.integer("announce.burst", v, 1, 100))
        {
            a.burst = NonZeroU32::new(n as u32).unwrap_or(a.burst);
        }
        if let Some(v) = map.get("secondBurstAfter") {
            a.second_burst_after = self.optional_duration("announce.secondBurstAfter", v);
        }
        if let Some(v) = map.get("refresh") {
            a.refresh = self.optional_duration("announce.refresh", v);
            if a.refresh.is_some_and(|d| d < Duration::from_secs(1)) {
                self.error(
                    "announce.refresh",
                    "a refresh faster than 1s floods the segment; use at least `1s`",
                );
            }
        }
        a
    }

    /// `off`, `null`/`~` or `0s` disable; otherwise a duration.
    fn optional_duration(&mut self, path: &str, v: &Value) -> Option<Duration> {
        match v {
            Value::Null => None,
            Value::Bool(false) => None,
            Value::String(s) if s == "off" => None,
            _ => self.duration(path, v).filter(|d| !d.is_zero()),
        }
    }

    fn groups(&mut self, v: &Value) -> Vec<Group> {
        let Some(items) = self.list("groups", v) else {
            return Vec::new();
        };
        if items.is_empty() {
            self.error("groups", "at least one group is needed");
        }
        let mut groups: Vec<Group> = Vec::new();
        let mut names: BTreeMap<String, usize> = BTreeMap::new();
        let mut owners: BTreeMap<IpAddr, String> = BTreeMap::new();
        for (i, item) in items.iter().enumerate() {
            let path = format!("groups[{i}]");
            let Some(group) = self.group(&path, item) else {
                continue;
            };
            if let Some(first) = names.insert(group.name.clone(), i) {
                self.error(
                    &format!("{path}.name"),
                    format!("`{}` is also the name of groups[{first}]", group.name),
                );
            }
            for (j, addr) in group.addresses.iter().enumerate() {
                let here = format!("{path}.addresses[{j}]");
                if let Some(other) = owners.insert(*addr, here.clone()) {
                    self.error(&here, format!("{addr} is already listed at {other}"));
                }
            }
            groups.push(group);
        }
        groups
    }

    fn group(&mut self, path: &str, v: &Value) -> Option<Group> {
        let map = self.object(path, v, "groups[]")?;
        let name = self.required_label(path, map);
        let mut addresses = Vec::new();
        match map.get("addresses") {
            Some(v) => {
                if let Some(items) = self.list(&join(path, "addresses"), v) {
                    if items.is_empty() {
                        self.error(&join(path, "addresses"), "at least one address is needed");
                    }
                    for (j, item) in items.iter().enumerate() {
                        if let Some(a) = self.vip(&format!("{path}.addresses[{j}]"), item) {
                            addresses.push(a);
                        }
                    }
                }
            }
            None => self.error(
                &join(path, "addresses"),
                "required: the virtual addresses of the group",
            ),
        }
        let interface = map
            .get("interface")
            .and_then(|v| self.string(&join(path, "interface"), v));
        // The name as written: a space around it is part of the name the kernel would be asked for.
        let written = map.get("interface").and_then(Value::as_str);
        if let Some(ifname) = written.filter(|_| interface.is_some())
            && !is_interface_name(ifname)
        {
            self.error(
                &join(path, "interface"),
                format!(
                    "`{ifname}` is not a Linux interface name (at most 15 bytes, no `/`, `:` or space, not `.` or `..`)"
                ),
            );
        }
        let priority = map
            .get("priority")
            .map(|v| self.priority(&join(path, "priority"), v))
            .unwrap_or_default();
        let preempt_delay = map
            .get("preemptDelay")
            .and_then(|v| self.duration(&join(path, "preemptDelay"), v))
            .unwrap_or(Duration::ZERO);
        let mut checks: Vec<Check> = Vec::new();
        if let Some(v) = map.get("checks")
            && let Some(items) = self.list(&join(path, "checks"), v)
        {
            for (j, item) in items.iter().enumerate() {
                let cpath = format!("{path}.checks[{j}]");
                if let Some(c) = self.check(&cpath, item) {
                    if let Some(k) = checks.iter().position(|o| o.name == c.name) {
                        self.error(
                            &join(&cpath, "name"),
                            format!("`{}` is also the name of checks[{k}]", c.name),
                        );
                    }
                    checks.push(c);
                }
            }
        }
        let notify = map
            .get("notify")
            .and_then(|v| self.string(&join(path, "notify"), v))
            .map(PathBuf::from);
        if let Some(p) = &notify
            && !p.is_absolute()
        {
            self.error(
                &join(path, "notify"),
                format!("`{}` must be an absolute path", p.display()),
            );
        }
        let vrrp = match map.get("vrrp") {
            Some(v) => Some(self.vrrp(&join(path, "vrrp"), v)?),
            None => None,
        };
        Some(Group {
            vrrp,
            name: name?,
            addresses,
            interface,
            priority,
            preempt_delay,
            checks,
            notify,
        })
    }

    /// The required `name` of the mapping at `path`, a [`label`](Self::label).
    fn required_label(&mut self, path: &str, map: &Map<String, Value>) -> Option<String> {
        let at = join(path, "name");
        match map.get("name") {
            Some(v) => self.string(&at, v).and_then(|n| self.label(&at, n)),
            None => {
                self.error(&at, "required");
                None
            }
        }
    }

    /// Group and check names appear in metric labels: keep them short and plain.
    fn label(&mut self, path: &str, name: String) -> Option<String> {
        let ok = name.len() <= 63
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.');
        if ok {
            Some(name)
        } else {
            self.error(
                path,
                format!("`{name}`: use at most 63 letters, digits, `-`, `_` and `.`"),
            );
            None
        }
    }

    fn vip(&mut self, path: &str, v: &Value) -> Option<IpAddr> {
        let text = self.string(path, v)?;
        let (ip_text, prefix) = match text.split_once('/') {
            Some((ip, p)) => (ip, Some(p)),
            None => (text.as_str(), None),
        };
        let Ok(ip) = ip_text.parse::<IpAddr>() else {
            self.error(path, format!("`{text}` is not an IP address"));
            return None;
        };
        let host_len = if ip.is_ipv4() { "32" } else { "128" };
        if let Some(p) = prefix
            && p != host_len
        {
            self.error(
                path,
                format!(
                    "`{text}`: a virtual address is one address; write `{ip}` or `{ip}/{host_len}`"
                ),
            );
            return None;
        }
        if ip.is_unspecified() || ip.is_loopback() || ip.is_multicast() {
            self.error(
                path,
                format!("`{ip}` cannot be a virtual address (unspecified, loopback or multicast)"),
            );
            return None;
        }
        if let IpAddr::V4(v4) = ip
            && v4.is_broadcast()
        {
            self.error(path, "the broadcast address cannot be a virtual address");
            return None;
        }
        Some(ip)
    }

    fn priority(&mut self, path: &str, v: &Value) -> PriorityMap {
        let mut map = PriorityMap::default();
        match v {
            Value::Number(_) => {
                if let Some(n) = self.integer(path, v, 1, 254) {
                    map.default = n as u8;
                }
            }
            Value::Object(entries) => {
                for (node, p) in entries {
                    let here = join(path, node);
                    if let Some(n) = self.integer(&here, p, 1, 254) {
                        if node == "default" {
                            map.default = n as u8;
                        } else {
                            map.nodes.insert(node.clone(), n as u8);
                        }
                    }
                }
            }
            other => self.error(
                path,
                format!("expected a number or a mapping such as `{{master-0: 50, default: 40}}`, found {}", kind(other)),
            ),
        }
        map
    }
}

/// What the kernel accepts as a link name (`dev_valid_name`): 1 to 15 bytes, no `/`, `:` or
/// whitespace, not `.` or `..`.
fn is_interface_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 15
        && name != "."
        && name != ".."
        && !name.contains(['/', ':'])
        && !name.bytes().any(|b| b.is_ascii_whitespace() || b == 0x0b)
}

fn is_broadcast(ip: IpAddr) -> bool {
    matches!(ip, IpAddr::V4(v4) if v4.is_broadcast())
}

/// Whether a UDP socket bound to `bind` can send to `peer`: the same family, or a socket bound
/// to `[::]` (dual-stack), which reaches IPv4 too.
fn reaches(bind: SocketAddr, peer: SocketAddr) -> bool {
    bind.is_ipv4() == peer.is_ipv4() || (bind.is_ipv6() && bind.ip().is_unspecified())
}

fn family(addr: SocketAddr) -> &'static str {
    if addr.is_ipv4() { "IPv4" } else { "IPv6" }
}

fn join(path: &str, key: &str) -> String {
    if path == "(file)" {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "nothing",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

fn show(v: &Value) -> String {
    match v {
        Value::String(s) => format!("`{s}`"),
        other => kind(other).to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SKETCH: &str = r#"
cluster: edge-1
node: master-0
bind: 192.0.2.10:7946
peers: [192.0.2.11:7946, 192.0.2.12:7946]
keyFile: /etc/swimlb/keys
groups:
  - name: api
    addresses: [192.0.2.100/32, 2001:db8::100/128]
    interface: eth0
    priority: {master-0: 50, default: 40}
    preemptDelay: 0s
    checks:
      - {name: lb, http: "https://localhost:9443/readyz", interval: 1s, timeout: 900ms, rise: 3, fall: 2, weight: 20}
      - {name: api, http: "https://localhost:6443/readyz", interval: 1s, timeout: 900ms, rise: 3, fall: 2, weight: 5}
    notify: /etc/swimlb/notify.sh
"#;

    #[test]
    fn the_design_sketch_is_valid() {
        let c = Standalone::parse(SKETCH).unwrap();
        assert_eq!(c.cluster, "edge-1");
        assert_eq!(c.node.as_deref(), Some("master-0"));
        assert_eq!(c.peers.len(), 2);
        assert_eq!(c.listen, DEFAULT_LISTEN.parse().unwrap());
        let g = &c.groups[0];
        assert_eq!(
            g.addresses,
            vec![
                "192.0.2.100".parse::<IpAddr>().unwrap(),
                "2001:db8::100".parse().unwrap()
            ]
        );
        assert_eq!(g.priority.of("master-0"), 50);
        assert_eq!(g.priority.of("master-1"), 40);
        assert_eq!(g.checks[0].rise.get(), 3);
        assert_eq!(g.checks[0].weight, 20);
        assert_eq!(
            g.checks[0].worst_case_detection(),
            Duration::from_millis(2_900)
        );
        assert_eq!(
            g.notify.as_deref(),
            Some(std::path::Path::new("/etc/swimlb/notify.sh"))
        );
        assert_eq!(c.announce, AnnounceSettings::default());
    }

    #[test]
    fn check_defaults_follow_keepalived() {
        let c = Standalone::parse(
            "cluster: c\nbind: 192.0.2.10\ninsecure: true\ngroups: [{name: g, addresses: [192.0.2.100], checks: [{name: x, exec: /bin/true}]}]",
        )
        .unwrap();
        let check = &c.groups[0].checks[0];
        assert_eq!(check.interval, Duration::from_secs(1));
        assert_eq!(check.timeout, Duration::from_secs(1));
        assert_eq!(
            (check.rise.get(), check.fall.get(), check.weight),
            (1, 1, 0)
        );
        assert_eq!(c.bind.port(), DEFAULT_GOSSIP_PORT);
        assert_eq!(c.groups[0].priority.of("anyone"), DEFAULT_PRIORITY);
        assert_eq!(
            check.kind,
            CheckKind::Exec {
                argv: vec!["/bin/true".into()],
                user: None
            }
        );
    }

    fn errors_of(text: &str) -> Vec<String> {
        Standalone::parse(text)
            .unwrap_err()
            .0
            .into_iter()
            .map(|e| e.to_string())
            .collect()
    }

    #[test]
    fn every_error_is_reported_with_its_path() {
        let errors = errors_of(
            r#"
cluster: edge-1
bind: 192.0.2.10:7946
keyFile: /etc/swimlb/keys
gossip: {profile: quick}
groups:
  - name: api
    addresses: [192.0.2.100/24, not-an-ip]
    priority: {master-0: 300}
    checks:
      - {name: lb, http: "localhost:9443/readyz", intervl: 1s}
      - {name: lb, tcp: "localhost:6443", interval: 1, timeout: 2s, rise: 0}
  - name: api
    addresses: [192.0.2.100]
"#,
        );
        let expected = [
            "gossip.profile: expected `fast` or `lan`, found `quick`",
            "groups[0].addresses[0]: `192.0.2.100/24`: a virtual address is one address; write `192.0.2.100` or `192.0.2.100/32`",
            "groups[0].addresses[1]: `not-an-ip` is not an IP address",
            "groups[0].priority.master-0: 300 is out of range 1..=254",
            "groups[0].checks[0].intervl: unknown field; expected one of: name, http, https, tcp, exec, user, insecure, expectStatus, interval, timeout, rise, fall, weight",
            "groups[0].checks[0].http: `localhost:9443/readyz` must start with http:// or https://",
            "groups[0].checks[1].interval: `1` has no unit (use ms, s, m or h, for example `1s`)",
            "groups[0].checks[1].rise: 0 is out of range 1..=1000",
            "groups[1].name: `api` is also the name of groups[0]",
        ];
        assert_eq!(errors, expected);
    }

    #[test]
    fn a_peer_that_is_bind_and_an_interface_with_a_space_are_named() {
        let errors = errors_of(
            "cluster: c\nbind: 192.0.2.10:7946\npeers: [192.0.2.10, 192.0.2.11]\ninsecure: true\ngroups: [{name: a, addresses: [192.0.2.100], interface: 'eth0 '}]",
        );
        assert_eq!(
            errors,
            [
                "peers[0]: 192.0.2.10:7946 is this node's own `bind` address: list the other nodes",
                "groups[0].interface: `eth0 ` is not a Linux interface name (at most 15 bytes, no `/`, `:` or space, not `.` or `..`)",
            ]
        );
    }

    #[test]
    fn an_exec_check_runs_as_its_user_else_the_files_script_user() {
        let c = Standalone::parse(
            "cluster: c\nbind: 192.0.2.10\ninsecure: true\nscriptUser: 'nobody:nogroup'\ngroups: [{name: a, addresses: [192.0.2.100], checks: [{name: x, exec: /bin/true}, {name: second, exec: /bin/true, user: 1000}]}]",
        )
        .unwrap();
        let user = |j: usize| match &c.groups[0].checks[j].kind {
            CheckKind::Exec { user, .. } => user.as_ref().map(ToString::to_string),
            other => panic!("{other:?}"),
        };
        assert_eq!(user(0).as_deref(), Some("nobody:nogroup"));
        assert_eq!(user(1).as_deref(), Some("1000"));
        assert_eq!(
            errors_of(
                "cluster: c\nbind: 192.0.2.10\ninsecure: true\nscriptUser: 'a b'\ngroups: [{name: a, addresses: [192.0.2.100], checks: [{name: x, tcp: 'h:1', user: root}, {name: second, exec: /bin/true, user: 'root:'}]}]"
            ),
            [
                "scriptUser: `a b` is not `user` or `user:group` (names or numeric ids)",
                "groups[0].checks[0].user: applies to `exec` checks only",
                "groups[0].checks[1].user: `root:` is not `user` or `user:group` (names or numeric ids)",
            ]
        );
    }

    #[test]
    fn missing_required_fields_are_named() {
        assert_eq!(
            errors_of("{}"),
            [
                "cluster: required: the gossip cluster name, the same on every node",
                "bind: required: this node's gossip address, for example `192.0.2.10:7946`",
                "keyFile: required: gossip is authenticated; set `insecure: true` to run without a key (test setups only)",
                "groups: required: at least one group of virtual addresses",
            ]
        );
    }

    #[test]
    fn timeout_longer_than_interval_is_rejected() {
        let errors = errors_of(
            "cluster: c\nbind: 192.0.2.10\ninsecure: true\ngroups: [{name: g, addresses: [192.0.2.100], checks: [{name: x, tcp: 'h:1', interval: 1s, timeout: 2s}]}]",
        );
        assert_eq!(
            errors,
            [
                "groups[0].checks[0].timeout: 2s is longer than the interval (1s): runs would overlap"
            ]
        );
    }

    #[test]
    fn the_same_address_in_two_groups_is_rejected() {
        let errors = errors_of(
            "cluster: c\nbind: 192.0.2.10\ninsecure: true\ngroups: [{name: a, addresses: [192.0.2.100]}, {name: b, addresses: ['192.0.2.100/32']}]",
        );
        assert_eq!(
            errors,
            ["groups[1].addresses[0]: 192.0.2.100 is already listed at groups[0].addresses[0]"]
        );
    }

    #[test]
    fn a_check_of_two_kinds_is_rejected() {
        let errors = errors_of(
            "cluster: c\nbind: 192.0.2.10\ninsecure: true\ngroups: [{name: a, addresses: [192.0.2.100], checks: [{name: x, tcp: 'h:1', exec: /bin/true}]}]",
        );
        assert_eq!(
            errors,
            ["groups[0].checks[0]: has tcp and exec: a check is exactly one of them"]
        );
    }

    #[test]
    fn insecure_and_key_file_together_are_rejected() {
        let errors = errors_of(
            "cluster: c\nbind: 192.0.2.10\ninsecure: true\nkeyFile: /k\ngroups: [{name: a, addresses: [192.0.2.100]}]",
        );
        assert_eq!(
            errors,
            ["insecure: `insecure: true` and a `keyFile` contradict each other"]
        );
    }

    #[test]
    fn yaml_syntax_errors_carry_the_line() {
        let errors = errors_of("cluster: [c\nbind: x\n");
        assert_eq!(errors.len(), 1);
        assert!(errors[0].starts_with("(file): "), "{}", errors[0]);
        assert!(errors[0].contains("line"), "{}", errors[0]);
    }

    #[test]
    fn wrong_types_are_named() {
        let errors = errors_of("cluster: 5\nbind: [x]\ninsecure: 'yes please'\ngroups: {}\n");
        assert_eq!(
            errors,
            [
                "cluster: expected a string, found a number",
                "bind: expected a string, found a list",
                "insecure: expected true or false, found a string",
                "keyFile: required: gossip is authenticated; set `insecure: true` to run without a key (test setups only)",
                "groups: expected a list, found a mapping",
            ]
        );
    }

    #[test]
    fn announce_and_gossip_overrides_are_read() {
        let c = Standalone::parse(
            "cluster: c\nbind: 192.0.2.10\ninsecure: true\nannounce: {burst: 3, secondBurstAfter: off, refresh: 60s}\ngossip: {profile: lan, probePeriod: 500ms, gossipFanout: 4}\ngroups: [{name: a, addresses: [2001:db8::1]}]",
        )
        .unwrap();
        assert_eq!(c.announce.burst.get(), 3);
        assert_eq!(c.announce.second_burst_after, None);
        assert_eq!(c.announce.refresh, Some(Duration::from_secs(60)));
        assert_eq!(c.gossip.profile, Profile::Lan);
        assert_eq!(c.gossip.probe_period, Some(Duration::from_millis(500)));
        assert_eq!(c.gossip.gossip_fanout.map(NonZeroU32::get), Some(4));
    }

    #[test]
    fn owner_watch_knobs_are_read() {
        let c = Standalone::parse(
            "cluster: c\nbind: 192.0.2.10\ninsecure: true\ngossip: {ownerWatch: false, ownerWatchInterval: 50ms, ownerWatchMisses: 4}\ngroups: [{name: a, addresses: [192.0.2.100]}]",
        )
        .unwrap();
        assert_eq!(c.gossip.owner_watch, Some(false));
        assert_eq!(
            c.gossip.owner_watch_interval,
            Some(Duration::from_millis(50))
        );
        assert_eq!(c.gossip.owner_watch_misses.map(NonZeroU32::get), Some(4));
        let defaults = Standalone::parse(
            "cluster: c\nbind: 192.0.2.10\ninsecure: true\ngroups: [{name: a, addresses: [192.0.2.100]}]",
        )
        .unwrap();
        assert_eq!(
            (
                defaults.gossip.owner_watch,
                defaults.gossip.owner_watch_interval,
                defaults.gossip.owner_watch_misses
            ),
            (None, None, None)
        );
    }

    #[test]
    fn owner_watch_knobs_of_the_wrong_type_are_named() {
        let errors = errors_of(
            "cluster: c\nbind: 192.0.2.10\ninsecure: true\ngossip: {ownerWatch: 'on', ownerWatchInterval: 20, ownerWatchMisses: 0}\ngroups: [{name: a, addresses: [192.0.2.100]}]",
        );
        assert_eq!(
            errors,
            [
                "gossip.ownerWatch: expected true or false, found a string",
                "gossip.ownerWatchInterval: `20` has no unit (use ms, s, m or h, for example `1s`)",
                "gossip.ownerWatchMisses: 0 is out of range 1..=1000",
            ]
        );
    }
}
