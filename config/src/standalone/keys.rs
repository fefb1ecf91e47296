//! Every key of the standalone file, in the order of the file: the one table the parser reads its
//! lists of known keys from and the reference page (`docs/src/reference/standalone.md`) is
//! written from.
//!
//! Guarantees, each held by a unit test below that parses files rather than trusting the text:
//! - a key the parser accepts is in [`KEYS`] (the walker's known keys are [`known`] of it), and
//!   every key of [`KEYS`] is read: its `example` parses and changes the result;
//! - a stated [`WhenAbsent::Value`] is the parser's: writing it out changes nothing;
//! - a stated [`Allowed::Integer`] range is the parser's: both ends parse, one past them fails.

/// What a key's absence means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WhenAbsent {
    /// The file must give the key.
    Required,
    /// The value the parser uses when the key is absent, as YAML.
    Value(&'static str),
    /// No value: what the speaker does without one.
    Means(&'static str),
    /// The value of the sibling key with this name.
    SameAs(&'static str),
    /// The gossip profile's value (an override of [`crate::standalone::GossipSettings`]).
    Profile,
}

/// The values the parser accepts beyond the key's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allowed {
    /// Any value of the type.
    Any,
    /// An integer from `min` to `max`, both included.
    Integer {
        /// The smallest accepted.
        min: i64,
        /// The largest accepted.
        max: i64,
    },
    /// Said in words.
    Text(&'static str),
}

/// One key of the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Key {
    /// Where it is: `groups[].checks[].rise` (`[]`: any element of a list).
    pub path: &'static str,
    /// What it holds, in words (`duration`, `integer`, `list of mappings`).
    pub ty: &'static str,
    /// Its value when absent.
    pub default: WhenAbsent,
    /// The values accepted.
    pub allowed: Allowed,
    /// A valid value other than the default (YAML), for the page's readers and the tests.
    pub example: &'static str,
    /// What it does.
    pub meaning: &'static str,
}

impl Key {
    /// The mapping it is a key of: `groups[].checks[]`, or `""` for the top of the file.
    pub fn section(&self) -> &'static str {
        self.path
            .rsplit_once('.')
            .map_or("", |(section, _)| section)
    }

    /// Its own name: `rise`.
    pub fn name(&self) -> &'static str {
        self.path
            .rsplit_once('.')
            .map_or(self.path, |(_, name)| name)
    }
}

/// The keys of the mapping at `section` (`""`, `gossip`, `announce`, `groups[]`,
/// `groups[].checks[]`), in the order of [`KEYS`].
pub fn known(section: &str) -> Vec<&'static str> {
    KEYS.iter()
        .filter(|k| k.section() == section)
        .map(Key::name)
        .collect()
}

/// The key at `path`, if there is one.
pub fn key(path: &str) -> Option<&'static Key> {
    KEYS.iter().find(|k| k.path == path)
}

/// The kinds of health check: a check has exactly one of these keys.
pub const CHECK_KINDS: [&str; 4] = ["http", "https", "tcp", "exec"];

/// A file that uses most keys, for the top of the reference page; a test parses it.
pub const EXAMPLE: &str = r#"# /etc/swimlb/speaker.yaml
cluster: edge-1
node: master-0
bind: 192.0.2.10:7946
peers: [192.0.2.11:7946, 192.0.2.12:7946]
keyFile: /etc/swimlb/keys
listen: 192.0.2.10:7572
gossip:
  profile: fast
announce:
  burst: 5
  secondBurstAfter: 5s
  refresh: off
groups:
  - name: api
    addresses: [192.0.2.100, 2001:db8::100]
    interface: eth0
    priority: {master-0: 150, default: 100}
    preemptDelay: 0s
    checks:
      - name: lb
        http: https://localhost:9443/readyz
        insecure: true
        expectStatus: 200
        interval: 1s
        timeout: 900ms
        rise: 3
        fall: 2
        weight: 20
      - {name: api, tcp: "localhost:6443", interval: 1s, fall: 2}
    notify: /etc/swimlb/notify.sh
"#;

const DURATION: &str = "duration";
const COUNT: Allowed = Allowed::Integer { min: 1, max: 64 };
const ONE_TO_THOUSAND: Allowed = Allowed::Integer { min: 1, max: 1000 };

/// Every key, in the order of the file: the top level, then `gossip`, `announce`, `groups[]` and
/// `groups[].checks[]`.
pub const KEYS: &[Key] = &[
    // The top level.
    Key {
        path: "cluster",
        ty: "string",
        default: WhenAbsent::Required,
        allowed: Allowed::Text("at most 253 letters, digits, `-` and `.`"),
        example: "edge-1",
        meaning: "The gossip cluster's name, the same on every node. It is sealed into every \
                  datagram, so two clusters on one network ignore each other.",
    },
    Key {
        path: "node",
        ty: "string",
        default: WhenAbsent::Means("the hostname"),
        allowed: Allowed::Any,
        example: "master-0",
        meaning: "This node's name in the gossip, in `priority` mappings, in metrics and in \
                  `/status`. Unique in the cluster.",
    },
    Key {
        path: "bind",
        ty: "address[:port]",
        default: WhenAbsent::Required,
        allowed: Allowed::Text("an IP address, with a port or without one (then 7946)"),
        example: "192.0.2.20:7946",
        meaning: "This node's gossip socket (UDP). `[::]` reaches IPv4 peers too.",
    },
    Key {
        path: "peers",
        ty: "list of address[:port]",
        default: WhenAbsent::Value("[]"),
        allowed: Allowed::Text(
            "each once, port 7946 when left out; of `bind`'s address family (unless `bind` is \
             `[::]`); not a multicast, broadcast or unspecified address, not port 0; not `bind` \
             itself",
        ),
        example: "[192.0.2.11:7946]",
        meaning: "The seeds this node announces itself to until it has joined: list every other \
                  node.",
    },
    Key {
        path: "keyFile",
        ty: "path",
        default: WhenAbsent::Means("required unless `insecure: true`"),
        allowed: Allowed::Any,
        example: "/etc/swimlb/keys",
        meaning: "The gossip key file: one base64 key per line (`swimlb-speaker keygen` prints \
                  one). The first line seals, every line opens, so keys rotate without downtime: \
                  add the new key second, reload every node, move it first, reload, drop the old \
                  one.",
    },
    Key {
        path: "insecure",
        ty: "boolean",
        default: WhenAbsent::Value("false"),
        allowed: Allowed::Text("not `true` together with a `keyFile`"),
        example: "true",
        meaning: "Gossip without a key: datagrams are neither secret nor authenticated, and \
                  anyone on the network can join the mesh or claim the addresses. For tests.",
    },
    Key {
        path: "listen",
        ty: "address:port",
        default: WhenAbsent::Value(super::DEFAULT_LISTEN),
        allowed: Allowed::Any,
        example: "192.0.2.10:7572",
        meaning: "The HTTP listener: `/metrics`, `/healthz`, `/readyz` and `/status`. The \
                  default, the loopback, answers only on the host itself: give the node's own \
                  address for Prometheus or `swimlb-speaker status` from elsewhere.",
    },
    Key {
        path: "scriptUser",
        ty: "user[:group]",
        default: WhenAbsent::Means("root (the speaker's own user when it is not root)"),
        allowed: Allowed::Text("a user name or uid, and a group name or gid, that exist"),
        example: "nobody:nogroup",
        meaning: "Who `exec` checks and `notify` programs run as (keepalived's `script_user`), \
                  with that user's uid and the group's gid (the user's primary group when none \
                  is given) and no supplementary groups; a check's own `user` wins over it. \
                  Whoever the user, a program runs with an empty environment but \
                  `PATH=/usr/sbin:/usr/bin:/sbin:/bin`, and the speaker refuses one any of \
                  whose path components is writable by a user other than root (see \
                  `groups[].checks[].exec`).",
    },
    Key {
        path: "gossip",
        ty: "mapping",
        default: WhenAbsent::Value("{}"),
        allowed: Allowed::Any,
        example: "{profile: lan}",
        meaning: "The gossip's timing: a profile, and overrides of its knobs (below).",
    },
    Key {
        path: "announce",
        ty: "mapping",
        default: WhenAbsent::Value("{}"),
        allowed: Allowed::Any,
        example: "{burst: 3}",
        meaning: "When a new owner sends gratuitous ARP and unsolicited neighbor advertisements \
                  (below).",
    },
    Key {
        path: "groups",
        ty: "list of mappings",
        default: WhenAbsent::Required,
        allowed: Allowed::Text("at least one group"),
        example: "[{name: web, addresses: [192.0.2.200]}]",
        meaning: "The groups of virtual addresses (below).",
    },
    // gossip
    Key {
        path: "gossip.profile",
        ty: "string",
        default: WhenAbsent::Value("fast"),
        allowed: Allowed::Text("`fast` or `lan`"),
        example: "lan",
        meaning: "The starting point for every knob below. `fast`: sub-second detection on a \
                  LAN. `lan`: memberlist's timings (seconds), for noisy networks.",
    },
    Key {
        path: "gossip.probePeriod",
        ty: DURATION,
        default: WhenAbsent::Profile,
        allowed: Allowed::Text("more than `probeRtt`"),
        example: "500ms",
        meaning: "How often each member probes one other member.",
    },
    Key {
        path: "gossip.probeRtt",
        ty: DURATION,
        default: WhenAbsent::Profile,
        allowed: Allowed::Text("more than `0s`, less than `probePeriod`"),
        example: "200ms",
        meaning: "How long a direct probe waits for its answer before other members are asked \
                  to probe indirectly.",
    },
    Key {
        path: "gossip.suspectToDown",
        ty: DURATION,
        default: WhenAbsent::Profile,
        allowed: Allowed::Text("more than `0s`"),
        example: "1s",
        meaning: "How long a suspect member stays alive before it is declared down, once other \
                  members confirmed the suspicion (an unconfirmed one lasts 6 times as long).",
    },
    Key {
        path: "gossip.periodicGossip",
        ty: DURATION,
        default: WhenAbsent::Profile,
        allowed: Allowed::Text("more than `0s`"),
        example: "50ms",
        meaning: "Period of the extra gossip rounds that spread updates between probes.",
    },
    Key {
        path: "gossip.gossipFanout",
        ty: "integer",
        default: WhenAbsent::Profile,
        allowed: COUNT,
        example: "4",
        meaning: "Members each gossip round goes to.",
    },
    Key {
        path: "gossip.indirectProbes",
        ty: "integer",
        default: WhenAbsent::Profile,
        allowed: COUNT,
        example: "5",
        meaning: "Members asked to probe a member that did not answer a direct probe.",
    },
    Key {
        path: "gossip.maxTransmissions",
        ty: "integer",
        default: WhenAbsent::Profile,
        allowed: Allowed::Integer { min: 1, max: 255 },
        example: "12",
        meaning: "How many times each update is piggybacked on other messages, at least (see \
                  `scaleTransmissions`).",
    },
    Key {
        path: "gossip.scaleSuspicion",
        ty: "boolean",
        default: WhenAbsent::Profile,
        allowed: Allowed::Any,
        example: "true",
        meaning: "Scale `suspectToDown` with the member count, as memberlist does: times \
                  max(1, log10 n).",
    },
    Key {
        path: "gossip.scaleTransmissions",
        ty: "boolean",
        default: WhenAbsent::Profile,
        allowed: Allowed::Any,
        example: "false",
        meaning: "Raise `maxTransmissions` with the member count, as memberlist does: at least \
                  ceil(4 x log10(n + 1)).",
    },
    Key {
        path: "gossip.notifySuspects",
        ty: "boolean",
        default: WhenAbsent::Profile,
        allowed: Allowed::Any,
        example: "false",
        meaning: "After a failed probe, tell the suspect at once, so a live one refutes before \
                  the suspicion times out.",
    },
    Key {
        path: "gossip.notifyDownMembers",
        ty: "boolean",
        default: WhenAbsent::Profile,
        allowed: Allowed::Any,
        example: "true",
        meaning: "Answer every datagram from a member held as down with \"you are down\" \
                  (foca's `notify_down_members`); off, the speaker does so itself, more sparingly.",
    },
    Key {
        path: "gossip.announceDownPeriod",
        ty: DURATION,
        default: WhenAbsent::Profile,
        allowed: Allowed::Text("more than `0s`"),
        example: "5s",
        meaning: "Period of the announces to members held as down, which heal a partition.",
    },
    Key {
        path: "gossip.announceDownFanout",
        ty: "integer",
        default: WhenAbsent::Profile,
        allowed: COUNT,
        example: "3",
        meaning: "Members held as down each such announce goes to.",
    },
    Key {
        path: "gossip.announcePeriod",
        ty: DURATION,
        default: WhenAbsent::Profile,
        allowed: Allowed::Text("more than `0s`"),
        example: "20s",
        meaning: "Period of the announce to one random member, which finds members missed while \
                  joining.",
    },
    Key {
        path: "gossip.syncPeriod",
        ty: DURATION,
        default: WhenAbsent::Profile,
        allowed: Allowed::Text("`0s` turns it off"),
        example: "0s",
        meaning: "Period of the membership digest sent to one random member, which answers \
                  with the members this node misses.",
    },
    Key {
        path: "gossip.joinRetry",
        ty: DURATION,
        default: WhenAbsent::Profile,
        allowed: Allowed::Text("more than `0s`"),
        example: "2s",
        meaning: "How often the peers are announced to until this node has joined.",
    },
    Key {
        path: "gossip.metaRefresh",
        ty: DURATION,
        default: WhenAbsent::Profile,
        allowed: Allowed::Text("more than `0s`"),
        example: "60s",
        meaning: "How often a member offers its own record (priority, checks, settled) to the \
                  gossip again, in case a copy was lost.",
    },
    Key {
        path: "gossip.maxPacketSize",
        ty: "integer (bytes)",
        default: WhenAbsent::Profile,
        allowed: Allowed::Integer {
            min: 1,
            max: 65_535,
        },
        example: "1200",
        meaning: "The largest gossip message. The speaker refuses one below 512 bytes or above \
                  what one sealed datagram carries; the default fits a 1,500-byte MTU over IPv4 \
                  and IPv6.",
    },
    Key {
        path: "gossip.ownerWatch",
        ty: "boolean",
        default: WhenAbsent::Profile,
        allowed: Allowed::Any,
        example: "false",
        meaning: "The owner watch: the owner of an address sends heartbeats straight to the \
                  next node in line, which takes over when they stop, before the gossip has \
                  declared the owner down.",
    },
    Key {
        path: "gossip.ownerWatchInterval",
        ty: DURATION,
        default: WhenAbsent::Profile,
        allowed: Allowed::Text("`10ms` to `1s` (checked by the speaker)"),
        example: "50ms",
        meaning: "The owner watch's heartbeat interval.",
    },
    Key {
        path: "gossip.ownerWatchMisses",
        ty: "integer",
        default: WhenAbsent::Profile,
        allowed: Allowed::Integer {
            min: 1,
            max: super::MAX_OWNER_WATCH_MISSES as i64,
        },
        example: "8",
        meaning: "Heartbeat intervals missed before the owner watch finds an owner silent; the \
                  speaker refuses fewer than 3.",
    },
    // announce
    Key {
        path: "announce.burst",
        ty: "integer",
        default: WhenAbsent::Value("5"),
        allowed: Allowed::Integer { min: 1, max: 100 },
        example: "3",
        meaning: "Gratuitous ARPs (and unsolicited neighbor advertisements) per address sent at \
                  once on a takeover (keepalived's `garp_master_repeat`).",
    },
    Key {
        path: "announce.secondBurstAfter",
        ty: DURATION,
        default: WhenAbsent::Value("5s"),
        allowed: Allowed::Text("a duration, or `off` (also `0s` or `null`)"),
        example: "off",
        meaning: "When a second burst follows the first (keepalived's `garp_master_delay`).",
    },
    Key {
        path: "announce.refresh",
        ty: DURATION,
        default: WhenAbsent::Value("off"),
        allowed: Allowed::Text("at least `1s`, or `off` (also `0s` or `null`)"),
        example: "60s",
        meaning: "Announce again every so often while owning (keepalived's \
                  `garp_master_refresh`), for switches that forget.",
    },
    // groups[]
    Key {
        path: "groups[].name",
        ty: "string",
        default: WhenAbsent::Required,
        allowed: Allowed::Text("at most 63 letters, digits, `-`, `_` and `.`; unique"),
        example: "web",
        meaning: "The group's name in metrics, `/status` and notify calls.",
    },
    Key {
        path: "groups[].addresses",
        ty: "list of IP addresses",
        default: WhenAbsent::Required,
        allowed: Allowed::Text(
            "at least one; each a single address (`/32` or `/128` may follow), in no other \
             group; not unspecified, loopback, multicast or broadcast",
        ),
        example: "[192.0.2.101]",
        meaning: "The virtual addresses. They move together, following the election of the \
                  first one. Every node holds them on a dummy interface, so a service can bind \
                  to them anywhere; only the owner answers ARP and NDP for them.",
    },
    Key {
        path: "groups[].interface",
        ty: "string",
        default: WhenAbsent::Means("the interface with the connected route to the address"),
        allowed: Allowed::Text("a Linux interface name: 1 to 15 bytes, no `/`, `:` or space"),
        example: "eth1",
        meaning: "The interface the owner answers and announces on. A node where it is \
                  missing, down or NOARP is no candidate for the group.",
    },
    Key {
        path: "groups[].priority",
        ty: "integer, or mapping of node name to integer",
        default: WhenAbsent::Value("100"),
        allowed: Allowed::Integer { min: 1, max: 254 },
        example: "{master-0: 150, default: 50}",
        meaning: "The base priority of every node, or of each node named, with `default` for \
                  the others. The highest effective priority (base plus the weights of the \
                  checks) owns the group.",
    },
    Key {
        path: "groups[].preemptDelay",
        ty: DURATION,
        default: WhenAbsent::Value("0s"),
        allowed: Allowed::Any,
        example: "30s",
        meaning: "How long a node must have been up before it counts as settled (keepalived's \
                  `preempt_delay`): settled nodes are elected before the others, so a node that \
                  comes back takes the group back only after this delay.",
    },
    Key {
        path: "groups[].checks",
        ty: "list of mappings",
        default: WhenAbsent::Value("[]"),
        allowed: Allowed::Text("unique names"),
        example: "[{name: ssh, tcp: \"127.0.0.1:22\"}]",
        meaning: "Health checks, run on every node (below).",
    },
    Key {
        path: "groups[].notify",
        ty: "path",
        default: WhenAbsent::Means("none"),
        allowed: Allowed::Text("an absolute path"),
        example: "/etc/swimlb/notify.sh",
        meaning: "A program run on every state change of the group, with two arguments: the \
                  group's name and `owner`, `backup` or `fault`. No shell is involved; a slow \
                  program never delays an announcement. It runs as `scriptUser`, with the \
                  environment and under the path rule of `exec` checks; after 30 s it is killed \
                  with every process it started.",
    },
    // groups[].checks[]
    Key {
        path: "groups[].checks[].name",
        ty: "string",
        default: WhenAbsent::Required,
        allowed: Allowed::Text("at most 63 letters, digits, `-`, `_` and `.`; unique in the group"),
        example: "ready",
        meaning: "The check's name in metrics and `/status`.",
    },
    Key {
        path: "groups[].checks[].http",
        ty: "URL",
        default: WhenAbsent::Means("none: a check has exactly one kind"),
        allowed: Allowed::Text("`http://` or `https://`, a host, a port from 1 to 65535"),
        example: "http://127.0.0.1:8080/healthz",
        meaning: "An HTTP(S) GET; passes on any 2xx status, or on `expectStatus`.",
    },
    Key {
        path: "groups[].checks[].https",
        ty: "URL",
        default: WhenAbsent::Means("none: a check has exactly one kind"),
        allowed: Allowed::Text("as `http`; `https://` is added when no scheme is given"),
        example: "localhost:9443/readyz",
        meaning: "An HTTPS GET, as `http`; the URL may leave out `https://`.",
    },
    Key {
        path: "groups[].checks[].tcp",
        ty: "host:port",
        default: WhenAbsent::Means("none: a check has exactly one kind"),
        allowed: Allowed::Text("a host name or address and a port from 1 to 65535"),
        example: "127.0.0.1:22",
        meaning: "A TCP connect; passes when the connection is accepted.",
    },
    Key {
        path: "groups[].checks[].exec",
        ty: "command line, or list of strings",
        default: WhenAbsent::Means("none: a check has exactly one kind"),
        allowed: Allowed::Text("not empty"),
        example: "[/usr/local/bin/check-api, --quick]",
        meaning: "A program and its arguments (a command line is split at spaces; no shell is \
                  involved); passes on exit status 0. A name without a `/` is looked up in \
                  `/usr/sbin:/usr/bin:/sbin:/bin` when the file is loaded. The file is refused \
                  when the program, or a directory above it, is owned by a user other than root \
                  or is writable by its group or by others (a directory with the sticky bit, \
                  such as `/tmp`, may be), as keepalived's `enable_script_security`; the rule \
                  is checked again before each run, and a run refused counts as a failure. On \
                  its timeout the program and every process it started (its process group) are \
                  killed.",
    },
    Key {
        path: "groups[].checks[].user",
        ty: "user[:group]",
        default: WhenAbsent::Means("the file's `scriptUser`"),
        allowed: Allowed::Text("`exec` checks only; a user and group that exist"),
        example: "nobody",
        meaning: "Who this check's program runs as (keepalived's `vrrp_script` `user`), as \
                  `scriptUser`.",
    },
    Key {
        path: "groups[].checks[].insecure",
        ty: "boolean",
        default: WhenAbsent::Value("false"),
        allowed: Allowed::Text("`https://` checks only"),
        example: "true",
        meaning: "Accept any TLS certificate.",
    },
    Key {
        path: "groups[].checks[].expectStatus",
        ty: "integer",
        default: WhenAbsent::Means("any 2xx"),
        allowed: Allowed::Integer { min: 100, max: 599 },
        example: "204",
        meaning: "The one HTTP status that passes (`http` and `https` checks only).",
    },
    Key {
        path: "groups[].checks[].interval",
        ty: DURATION,
        default: WhenAbsent::Value("1s"),
        allowed: Allowed::Text("at least `10ms`"),
        example: "2s",
        meaning: "Time between the starts of two runs.",
    },
    Key {
        path: "groups[].checks[].timeout",
        ty: DURATION,
        default: WhenAbsent::SameAs("interval"),
        allowed: Allowed::Text("more than `0s`, at most `interval`"),
        example: "500ms",
        meaning: "How long a run may take before it counts as a failure.",
    },
    Key {
        path: "groups[].checks[].rise",
        ty: "integer",
        default: WhenAbsent::Value("1"),
        allowed: ONE_TO_THOUSAND,
        example: "3",
        meaning: "Consecutive passes before a failing check passes. A check starts failing, so \
                  a node claims nothing before it has passed `rise` times.",
    },
    Key {
        path: "groups[].checks[].fall",
        ty: "integer",
        default: WhenAbsent::Value("1"),
        allowed: ONE_TO_THOUSAND,
        example: "2",
        meaning: "Consecutive failures before a passing check fails. The longest time to notice \
                  a failure is `interval` x `fall` + `timeout` (`check-config` prints it).",
    },
    Key {
        path: "groups[].checks[].weight",
        ty: "integer",
        default: WhenAbsent::Value("0"),
        allowed: Allowed::Integer {
            min: -253,
            max: 253,
        },
        example: "20",
        meaning: "keepalived's weight. Above 0: added to the node's priority while the check \
                  passes. Below 0: added while it fails. 0: while it fails the node may not own \
                  the group (`fault`).",
    },
    // groups[].vrrp
    Key {
        path: "groups[].vrrp",
        ty: "mapping",
        default: WhenAbsent::Means("no VRRP: the speakers neither send nor listen for VRRP"),
        allowed: Allowed::Text("`vrid` given; IPv4, IPv6 or both"),
        example: "{vrid: 51, advertInterval: 100ms}",
        meaning: "Speak VRRPv3 (RFC 9568, unauthenticated, as keepalived does) for the group \
                  on its interface, to run beside keepalived routers of the same VRID: the \
                  owner advertises the group's addresses, and while a VRRP master that is no \
                  speaker wins by VRRP's rule (higher priority, then higher address) no \
                  speaker answers for them. Opt-in: anyone on the segment can send VRRP.",
    },
    Key {
        path: "groups[].vrrp.vrid",
        ty: "integer",
        default: WhenAbsent::Required,
        allowed: Allowed::Integer { min: 1, max: 255 },
        example: "52",
        meaning: "The virtual router id: keepalived's `virtual_router_id`.",
    },
    Key {
        path: "groups[].vrrp.advertInterval",
        ty: DURATION,
        default: WhenAbsent::Value("1s"),
        allowed: Allowed::Text("a whole number of centiseconds, `10ms` to `40950ms`"),
        example: "100ms",
        meaning: "How often the owner advertises (keepalived's `advert_int`). A VRRP master \
                  is gone after three intervals without an advertisement plus the skew \
                  (`(256 - priority) / 256` of one).",
    },
    Key {
        path: "groups[].vrrp.priority",
        ty: "integer",
        default: WhenAbsent::Means("the owner's effective priority in the group"),
        allowed: Allowed::Integer { min: 1, max: 254 },
        example: "120",
        meaning: "The priority the owner advertises and is compared with. swimlb's priorities \
                  and VRRP's are one scale: a keepalived router with a higher priority than \
                  this wins the group.",
    },
];

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;
    use crate::standalone::{GossipSettings, Standalone};

    /// The smallest file with a group and a check, as a tree.
    fn minimal() -> Value {
        yaml(
            "cluster: c\nbind: 192.0.2.10\nkeyFile: /k\n\
             groups: [{name: g, addresses: [192.0.2.100], \
             checks: [{name: x, http: 'https://127.0.0.1:6443/readyz'}]}]",
        )
    }

    fn yaml(text: &str) -> Value {
        serde_saphyr::from_str(text).unwrap_or_else(|e| panic!("`{text}`: {e}"))
    }

    /// The mapping that holds the keys of `section` in `tree` (the first element of each list).
    fn section_mut<'t>(
        tree: &'t mut Value,
        section: &str,
    ) -> &'t mut serde_json::Map<String, Value> {
        let mut at = tree;
        for step in section.split('.').filter(|s| !s.is_empty()) {
            let (name, list) = match step.strip_suffix("[]") {
                Some(name) => (name, true),
                None => (step, false),
            };
            let map = at.as_object_mut().expect("a mapping");
            let child = map.entry(name.to_string()).or_insert_with(|| {
                if list {
                    Value::Array(vec![Value::Null])
                } else if name == "vrrp" {
                    // A `vrrp` mapping needs its `vrid`.
                    yaml("{vrid: 1}")
                } else {
                    Value::Object(serde_json::Map::new())
                }
            });
            at = if list {
                &mut child.as_array_mut().expect("a list")[0]
            } else {
                child
            };
        }
        at.as_object_mut().expect("a mapping")
    }

    /// `tree` without `key`.
    fn without(tree: &Value, key: &Key) -> Value {
        let mut tree = tree.clone();
        section_mut(&mut tree, key.section()).remove(key.name());
        tree
    }

    /// `tree` with `key` set to `value` (YAML).
    fn with(tree: &Value, key: &Key, value: &str) -> Value {
        let mut tree = tree.clone();
        section_mut(&mut tree, key.section()).insert(key.name().to_string(), yaml(value));
        tree
    }

    /// `tree` with `key` set to its example, without the keys that exclude it (the other check
    /// kinds, or `keyFile` for `insecure: true`).
    fn with_example(tree: &Value, key: &Key) -> Value {
        let mut tree = with(tree, key, key.example);
        let map = section_mut(&mut tree, key.section());
        if key.section() == "groups[].checks[]" && CHECK_KINDS.contains(&key.name()) {
            map.retain(|k, _| k == key.name() || !CHECK_KINDS.contains(&k.as_str()));
        }
        if key.path == "insecure" {
            map.remove("keyFile");
        }
        if key.path == "groups[].checks[].user" {
            map.retain(|k, _| !CHECK_KINDS.contains(&k.as_str()));
            map.insert("exec".into(), yaml("/bin/true"));
        }
        tree
    }

    fn parse(tree: &Value) -> Result<Standalone, String> {
        Standalone::from_tree(tree).map_err(|e| e.to_string())
    }

    #[test]
    fn the_example_file_is_valid() {
        let config = Standalone::parse(EXAMPLE).expect("the example parses");
        assert_eq!(config.groups[0].checks.len(), 2);
    }

    #[test]
    fn every_key_is_read_and_its_example_is_valid() {
        let base = parse(&minimal()).expect("the minimal file parses");
        for key in KEYS {
            let tree = with_example(&minimal(), key);
            let config =
                parse(&tree).unwrap_or_else(|e| panic!("{}: {}: {e}", key.path, key.example));
            assert_ne!(
                config, base,
                "{}: {} changes nothing",
                key.path, key.example
            );
        }
    }

    #[test]
    fn a_key_that_is_not_in_the_table_is_refused() {
        for section in [
            "",
            "gossip",
            "announce",
            "groups[]",
            "groups[].checks[]",
            "groups[].vrrp",
        ] {
            let mut tree = minimal();
            section_mut(&mut tree, section).insert("undocumented".into(), Value::Bool(true));
            let errors = parse(&tree).expect_err(section);
            assert!(
                errors.contains("undocumented: unknown field; expected one of: "),
                "{errors}"
            );
        }
    }

    #[test]
    fn every_stated_default_is_the_parsers() {
        for key in KEYS {
            let absent = parse(&without(&minimal(), key));
            match key.default {
                WhenAbsent::Value(value) => {
                    assert_eq!(
                        parse(&with(&minimal(), key, value)),
                        absent,
                        "{}: writing the stated default `{value}` changes the result",
                        key.path
                    );
                }
                WhenAbsent::SameAs(sibling) => {
                    let sibling = KEYS
                        .iter()
                        .find(|k| k.section() == key.section() && k.name() == sibling)
                        .unwrap_or_else(|| panic!("{}: no sibling {sibling}", key.path));
                    let one = with(&minimal(), sibling, sibling.example);
                    assert_eq!(
                        parse(&with(&one, key, sibling.example)),
                        parse(&one),
                        "{}: is not `{}` when absent",
                        key.path,
                        sibling.path
                    );
                }
                WhenAbsent::Profile => {
                    let config = absent.unwrap_or_else(|e| panic!("{}: {e}", key.path));
                    assert_eq!(config.gossip, GossipSettings::default(), "{}", key.path);
                }
                WhenAbsent::Required => {
                    let errors = absent.expect_err(key.path);
                    let at = format!("{}: required", key.path.replace("[]", "[0]"));
                    assert!(errors.contains(&at), "{}: {errors}", key.path);
                }
                WhenAbsent::Means(_) => {
                    if !CHECK_KINDS.contains(&key.name()) && key.path != "keyFile" {
                        absent.unwrap_or_else(|e| panic!("{}: {e}", key.path));
                    }
                }
            }
        }
    }

    #[test]
    fn every_stated_integer_range_is_the_parsers() {
        for key in KEYS {
            let Allowed::Integer { min, max } = key.allowed else {
                continue;
            };
            for ok in [min, max] {
                parse(&with(&minimal(), key, &ok.to_string()))
                    .unwrap_or_else(|e| panic!("{}: {ok} is refused: {e}", key.path));
            }
            for bad in [min - 1, max + 1] {
                let errors = parse(&with(&minimal(), key, &bad.to_string()))
                    .expect_err(&format!("{}: {bad} is accepted", key.path));
                assert!(errors.contains("out of range"), "{}: {errors}", key.path);
            }
        }
    }
}
