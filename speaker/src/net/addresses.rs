//! Standalone mode: the virtual IPs on a dummy interface, and an announcing interface on which
//! the kernel never answers ARP for them by itself.
//!
//! Owns (DESIGN.md, "Addresses"):
//! - a dummy link (default [`DEFAULT_DUMMY_NAME`]) holding every VIP of the speaker's groups as a
//!   host address (/32 or /128, IPv6 with `nodad` so it is usable at once), on every node, so
//!   services can bind to a VIP at any time whoever owns it;
//! - `net.ipv4.conf.<iface>.arp_ignore=1` and `arp_announce=2` on each announcing interface: the
//!   kernel answers ARP only for addresses configured on the receiving interface, and never
//!   uses a VIP as the source of its own ARP requests. Only the speaker's responder answers for
//!   a VIP, so a crashed speaker falls silent instead of splitting the brain.
//!
//! IPv6 needs no sysctl: Linux answers a neighbor solicitation only for addresses on the
//! receiving interface (`ndisc_recv_ns` looks the target up strictly on that device) unless
//! `proxy_ndp` is on with a proxy entry. The netns test checks this.
//!
//! Guarantees: [`Addresses::setup`] and [`Addresses::reload`] are idempotent (they converge the
//! dummy's addresses to the configured set, removing stale ones, keeping kernel link-local
//! ones); the sysctl values found before the first write are remembered and restored by
//! [`Addresses::teardown`], and only then: an interface that leaves the announcing set on a
//! reload keeps `arp_ignore`/`arp_announce` while the VIPs stay on this node, so the kernel
//! never answers for a VIP on it either. A link with the
//! dummy's name that is not a dummy is never touched. If the process dies without teardown,
//! the dummy and the sysctls stay: the kernel stays silent, which is the safe side.
//!
//! Namespaces: netlink requests use a socket opened in the calling thread's network namespace,
//! and the sysctls are written with blocking `std::fs` calls on the calling thread (a few bytes
//! to /proc, no disk), because `/proc/sys/net` shows the namespace of the thread that opens it.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use futures::TryStreamExt;
use rtnetlink::packet_route::{
    address::{AddressAttribute, AddressFlags, AddressHeaderFlags, AddressMessage},
    link::{InfoKind, LinkAttribute, LinkInfo, LinkMessage},
};
use rtnetlink::{Handle, LinkMessageBuilder, LinkUnspec};

/// `EOPNOTSUPP`: the kernel's answer to an unknown link type.
const EOPNOTSUPP: i32 = 95;

/// The dummy interface's name when the configuration names none.
pub const DEFAULT_DUMMY_NAME: &str = "swimlb0";

/// The link type that holds the VIPs. `dummy` is the standard; `ifb` is a fallback for kernels
/// built without the dummy driver (both are quiet, carrier-up, ARP-less virtual devices on which
/// local addresses can be bound).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum HolderKind {
    /// `ip link add NAME type dummy`.
    #[default]
    Dummy,
    /// `ip link add NAME type ifb`.
    Ifb,
}

impl HolderKind {
    /// The kernel's name of the link type (`IFLA_INFO_KIND`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Dummy => "dummy",
            Self::Ifb => "ifb",
        }
    }

    fn info_kind(self) -> InfoKind {
        match self {
            Self::Dummy => InfoKind::Dummy,
            Self::Ifb => InfoKind::Ifb,
        }
    }
}

/// Where the kernel's sysctls live.
pub const PROC_SYS: &str = "/proc/sys";

/// The ARP sysctls set on every announcing interface, with their values.
pub const ARP_SYSCTLS: [(&str, &str); 2] = [("arp_ignore", "1"), ("arp_announce", "2")];

/// Errors of standalone address handling; each names the interface, address or file.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The rtnetlink socket could not be opened.
    #[error("cannot open an rtnetlink socket: {0}")]
    Socket(#[source] std::io::Error),
    /// A netlink request about a link failed.
    #[error("interface {name:?}: {op} failed: {source}")]
    Link {
        /// The interface.
        name: String,
        /// What was attempted: "dump links", "create dummy", "set up", "delete".
        op: &'static str,
        /// The netlink error.
        source: Box<rtnetlink::Error>,
    },
    /// A link with the dummy's name exists and is of another kind: swimlb will not manage it.
    #[error(
        "interface {name:?} exists and is of kind {kind:?}, not {wanted}; refusing to manage it"
    )]
    NotDummy {
        /// The interface.
        name: String,
        /// Its `IFLA_INFO_KIND`, or "none".
        kind: String,
        /// The kind swimlb creates.
        wanted: &'static str,
    },
    /// The kernel does not know the link type (driver not built or module not loaded).
    #[error(
        "interface {name:?}: the kernel has no {kind:?} link type (load its module, or use another holder kind)"
    )]
    KindUnsupported {
        /// The interface.
        name: String,
        /// The link type.
        kind: &'static str,
    },
    /// The dummy was created but a dump does not show it.
    #[error("interface {name:?} is missing right after it was created")]
    DummyMissing {
        /// The interface.
        name: String,
    },
    /// A netlink request about an address failed.
    #[error("address {addr} on interface {name:?}: {op} failed: {source}")]
    Address {
        /// The interface.
        name: String,
        /// The address.
        addr: IpAddr,
        /// What was attempted: "add", "delete".
        op: &'static str,
        /// The netlink error.
        source: Box<rtnetlink::Error>,
    },
    /// Dumping the addresses of the dummy failed.
    #[error("interface {name:?}: address dump failed: {source}")]
    AddressDump {
        /// The interface.
        name: String,
        /// The netlink error.
        source: Box<rtnetlink::Error>,
    },
    /// The name cannot be an interface name (empty, longer than 15 bytes, `/`, `.`, `..`).
    #[error("{name:?} is not a valid interface name")]
    BadInterfaceName {
        /// The rejected name.
        name: String,
    },
    /// A sysctl could not be read (for an announcing interface: does it exist?).
    #[error("sysctl {}: read failed: {source}", path.display())]
    SysctlRead {
        /// The file under /proc/sys.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A sysctl could not be written.
    #[error("sysctl {}: writing {value:?} failed: {source}", path.display())]
    SysctlWrite {
        /// The file under /proc/sys.
        path: PathBuf,
        /// The value written.
        value: String,
        /// The OS error.
        source: std::io::Error,
    },
}

/// The host prefix length of an address: 32 for IPv4, 128 for IPv6.
pub fn host_prefix(ip: IpAddr) -> u8 {
    match ip {
        IpAddr::V4(_) => 32,
        IpAddr::V6(_) => 128,
    }
}

fn is_ipv6_link_local(ip: IpAddr) -> bool {
    matches!(ip, IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80)
}

/// What to change on the dummy so it holds exactly the wanted VIPs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AddressPlan {
    /// VIPs to add, as host addresses, in the order given.
    pub add: Vec<IpAddr>,
    /// Addresses (with their present prefix length) to remove.
    pub remove: Vec<(IpAddr, u8)>,
}

impl AddressPlan {
    /// Whether nothing needs changing.
    pub fn is_empty(&self) -> bool {
        self.add.is_empty() && self.remove.is_empty()
    }
}

/// Diffs the addresses present on the dummy against the wanted VIPs. A VIP present with a
/// prefix other than the host prefix is removed and added again; IPv6 link-local addresses
/// (the kernel's own) are left alone; duplicates in `wanted` are added once.
pub fn plan(present: &[(IpAddr, u8)], wanted: &[IpAddr]) -> AddressPlan {
    let mut plan = AddressPlan::default();
    let mut seen = BTreeSet::new();
    for &vip in wanted {
        if seen.insert(vip) && !present.contains(&(vip, host_prefix(vip))) {
            plan.add.push(vip);
        }
    }
    for &(addr, prefix_len) in present {
        let wanted_here = seen.contains(&addr) && prefix_len == host_prefix(addr);
        if !wanted_here && !is_ipv6_link_local(addr) {
            plan.remove.push((addr, prefix_len));
        }
    }
    plan
}

/// Checks that `name` can be an interface name and so a directory under
/// `/proc/sys/net/ipv4/conf/` (no path traversal).
pub fn check_interface_name(name: &str) -> Result<(), Error> {
    let bad = name.is_empty()
        || name.len() > 15
        || name == "."
        || name == ".."
        || name.contains(['/', '\0'])
        || name.chars().any(char::is_whitespace);
    if bad {
        Err(Error::BadInterfaceName {
            name: name.to_string(),
        })
    } else {
        Ok(())
    }
}

/// The ARP sysctls of the announcing interfaces, with the values found before swimlb changed
/// them. Works on any root directory so it can be tested on plain files.
#[derive(Debug, Clone)]
pub struct ArpSysctls {
    root: PathBuf,
    /// (interface, sysctl name, value found before the first write), in write order.
    saved: Vec<(String, &'static str, String)>,
}

impl ArpSysctls {
    /// Sysctls under `root` (normally [`PROC_SYS`]).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            saved: Vec::new(),
        }
    }

    /// The file of sysctl `net.ipv4.conf.<iface>.<name>`.
    pub fn path(&self, iface: &str, name: &str) -> PathBuf {
        self.root.join("net/ipv4/conf").join(iface).join(name)
    }

    /// Interfaces currently set (in the order they were first set).
    pub fn interfaces(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for (iface, _, _) in &self.saved {
            if !out.contains(&iface.as_str()) {
                out.push(iface);
            }
        }
        out
    }

    /// Sets [`ARP_SYSCTLS`] on every interface of `ifaces` (remembering the previous values the
    /// first time). Interfaces set before and missing from `ifaces` keep their values until
    /// [`Self::restore_all`]: the VIPs are still local, so the kernel must stay silent there too.
    /// Nothing is written for an invalid name (checked first, for all). On a read or write
    /// error, the sysctls already written stay remembered, so [`Self::restore_all`] undoes them.
    pub fn apply(&mut self, ifaces: &[String]) -> Result<(), Error> {
        for iface in ifaces {
            check_interface_name(iface)?;
        }
        for iface in ifaces {
            for (name, value) in ARP_SYSCTLS {
                let path = self.path(iface, name);
                let known = self.saved.iter().any(|(i, n, _)| i == iface && *n == name);
                if !known {
                    let previous = read_sysctl(&path)?;
                    self.saved.push((iface.clone(), name, previous));
                }
                write_sysctl(&path, value)?;
            }
        }
        Ok(())
    }

    /// Restores the remembered values of one interface and forgets them. An interface that
    /// disappeared meanwhile has nothing left to restore and is not an error.
    pub fn restore(&mut self, iface: &str) -> Result<(), Error> {
        let mut first_error = None;
        let saved = std::mem::take(&mut self.saved);
        for (i, name, previous) in saved {
            if i != iface {
                self.saved.push((i, name, previous));
                continue;
            }
            let path = self.path(&i, name);
            match write_sysctl(&path, &previous) {
                Err(Error::SysctlWrite { source, .. })
                    if source.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    first_error.get_or_insert(e);
                }
                Ok(()) => {}
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Restores every remembered value; tries all, returns the first error.
    pub fn restore_all(&mut self) -> Result<(), Error> {
        let mut first_error = None;
        for iface in self
            .interfaces()
            .into_iter()
            .map(str::to_string)
            .collect::<Vec<_>>()
        {
            if let Err(e) = self.restore(&iface) {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

fn read_sysctl(path: &Path) -> Result<String, Error> {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .map_err(|source| Error::SysctlRead {
            path: path.to_path_buf(),
            source,
        })
}

fn write_sysctl(path: &Path, value: &str) -> Result<(), Error> {
    // OpenOptions without create: a sysctl that does not exist is an error, not a new file.
    use std::io::Write;
    std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path)
        .and_then(|mut file| file.write_all(format!("{value}\n").as_bytes()))
        .map_err(|source| Error::SysctlWrite {
            path: path.to_path_buf(),
            value: value.to_string(),
            source,
        })
}

/// The standalone-mode addresses of this node: a dummy link with the VIPs, and the ARP
/// sysctls of the announcing interfaces. Call [`Self::teardown`] on a normal exit.
#[derive(Debug)]
pub struct Addresses {
    handle: Handle,
    task: tokio::task::JoinHandle<()>,
    kind: HolderKind,
    dummy_name: String,
    dummy_index: u32,
    vips: Vec<IpAddr>,
    sysctls: ArpSysctls,
}

impl Addresses {
    /// Creates the dummy link `dummy_name` if missing, sets it up, converges its addresses to
    /// `vips` and sets the ARP sysctls on `announce_ifaces`. On failure, what was already
    /// changed is undone (best effort: dummy removed, sysctls restored) before the error is
    /// returned.
    pub async fn setup(
        dummy_name: &str,
        vips: &[IpAddr],
        announce_ifaces: &[String],
    ) -> Result<Self, Error> {
        Self::setup_with(HolderKind::Dummy, dummy_name, vips, announce_ifaces).await
    }

    /// [`Self::setup`] with another link type than `dummy` holding the VIPs.
    pub async fn setup_with(
        kind: HolderKind,
        dummy_name: &str,
        vips: &[IpAddr],
        announce_ifaces: &[String],
    ) -> Result<Self, Error> {
        check_interface_name(dummy_name)?;
        for iface in announce_ifaces {
            check_interface_name(iface)?;
        }
        let (connection, handle, _) = rtnetlink::new_connection().map_err(Error::Socket)?;
        let task = tokio::spawn(connection);
        let mut this = Self {
            handle,
            task,
            kind,
            dummy_name: dummy_name.to_string(),
            dummy_index: 0,
            vips: Vec::new(),
            sysctls: ArpSysctls::new(PROC_SYS),
        };
        let result = async {
            this.dummy_index = this.ensure_dummy().await?;
            this.reload(vips, announce_ifaces).await
        }
        .await;
        match result {
            Ok(()) => Ok(this),
            Err(e) => {
                // Best effort: the original error is the one worth reporting.
                let _ = this.teardown().await;
                Err(e)
            }
        }
    }

    /// The dummy link's name.
    pub fn dummy_name(&self) -> &str {
        &self.dummy_name
    }

    /// The link type holding the VIPs.
    pub fn kind(&self) -> HolderKind {
        self.kind
    }

    /// The dummy link's interface index.
    pub fn dummy_index(&self) -> u32 {
        self.dummy_index
    }

    /// The VIPs configured by the last successful setup or reload.
    pub fn vips(&self) -> &[IpAddr] {
        &self.vips
    }

    /// Converges to a new configuration: adds missing VIPs, removes the ones no longer
    /// configured, sets the sysctls on the announcing interfaces (again, in case someone reset
    /// them; interfaces that left the set keep theirs until teardown). The dummy is set up again
    /// if someone set it down.
    pub async fn reload(
        &mut self,
        vips: &[IpAddr],
        announce_ifaces: &[String],
    ) -> Result<(), Error> {
        // Sysctls first: a VIP must never sit on this node while the kernel may answer for it.
        self.sysctls.apply(announce_ifaces)?;
        self.set_dummy_up().await?;
        let messages = present_messages(&self.handle, self.dummy_index, &self.dummy_name).await?;
        let present: Vec<(IpAddr, u8)> = messages.iter().filter_map(address_of).collect();
        let plan = plan(&present, vips);
        for &(addr, prefix_len) in &plan.remove {
            self.delete_address(addr, prefix_len, &messages).await?;
        }
        for &vip in &plan.add {
            let mut request = self
                .handle
                .address()
                .add(self.dummy_index, vip, host_prefix(vip))
                .replace();
            if vip.is_ipv6() {
                let message = request.message_mut();
                message.header.flags |= AddressHeaderFlags::Nodad;
                message
                    .attributes
                    .push(AddressAttribute::Flags(AddressFlags::Nodad));
            }
            request.execute().await.map_err(|source| Error::Address {
                name: self.dummy_name.clone(),
                addr: vip,
                op: "add",
                source: Box::new(source),
            })?;
        }
        let mut unique = Vec::new();
        for &vip in vips {
            if !unique.contains(&vip) {
                unique.push(vip);
            }
        }
        self.vips = unique;
        Ok(())
    }

    /// Removes the VIPs and the dummy link, then restores the sysctls (in that order, so the
    /// kernel never answers for a VIP in between). Tries every step; returns the first error.
    pub async fn teardown(mut self) -> Result<(), Error> {
        let mut first_error = None;
        if self.dummy_index != 0 {
            match present_messages(&self.handle, self.dummy_index, &self.dummy_name).await {
                Ok(messages) => {
                    for (addr, prefix_len) in messages.iter().filter_map(address_of) {
                        if is_ipv6_link_local(addr) {
                            continue;
                        }
                        if let Err(e) = self.delete_address(addr, prefix_len, &messages).await {
                            first_error.get_or_insert(e);
                        }
                    }
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
            let deleted = self.handle.link().del(self.dummy_index).execute().await;
            if let Err(source) = deleted {
                first_error.get_or_insert(Error::Link {
                    name: self.dummy_name.clone(),
                    op: "delete",
                    source: Box::new(source),
                });
            }
        }
        if let Err(e) = self.sysctls.restore_all() {
            first_error.get_or_insert(e);
        }
        self.task.abort();
        first_error.map_or(Ok(()), Err)
    }

    async fn find_link(&self) -> Result<Option<LinkMessage>, Error> {
        let links: Vec<LinkMessage> = self
            .handle
            .link()
            .get()
            .execute()
            .try_collect()
            .await
            .map_err(|source| Error::Link {
                name: self.dummy_name.clone(),
                op: "dump links",
                source: Box::new(source),
            })?;
        Ok(links.into_iter().find(|link| {
            link.attributes
                .iter()
                .any(|a| matches!(a, LinkAttribute::IfName(n) if *n == self.dummy_name))
        }))
    }

    /// Returns the dummy's index, creating it if missing; refuses a non-dummy link of that name.
    async fn ensure_dummy(&self) -> Result<u32, Error> {
        if let Some(link) = self.find_link().await? {
            return match link_kind(&link) {
                Some(kind) if kind == self.kind.info_kind() => Ok(link.header.index),
                other => Err(Error::NotDummy {
                    name: self.dummy_name.clone(),
                    kind: other.map_or_else(|| "none".to_string(), |k| k.to_string()),
                    wanted: self.kind.as_str(),
                }),
            };
        }
        let message = LinkMessageBuilder::<LinkUnspec>::new_with_info_kind(self.kind.info_kind())
            .name(self.dummy_name.clone())
            .up()
            .build();
        self.handle
            .link()
            .add(message)
            .execute()
            .await
            .map_err(|source| match source {
                rtnetlink::Error::NetlinkError(ref e) if e.raw_code() == -EOPNOTSUPP => {
                    Error::KindUnsupported {
                        name: self.dummy_name.clone(),
                        kind: self.kind.as_str(),
                    }
                }
                source => Error::Link {
                    name: self.dummy_name.clone(),
                    op: "create",
                    source: Box::new(source),
                },
            })?;
        match self.find_link().await? {
            Some(link) => Ok(link.header.index),
            None => Err(Error::DummyMissing {
                name: self.dummy_name.clone(),
            }),
        }
    }

    async fn set_dummy_up(&self) -> Result<(), Error> {
        self.handle
            .link()
            .set(LinkUnspec::new_with_index(self.dummy_index).up().build())
            .execute()
            .await
            .map_err(|source| Error::Link {
                name: self.dummy_name.clone(),
                op: "set up",
                source: Box::new(source),
            })
    }

    async fn delete_address(
        &self,
        addr: IpAddr,
        prefix_len: u8,
        messages: &[AddressMessage],
    ) -> Result<(), Error> {
        let Some(message) = messages
            .iter()
            .find(|m| address_of(m) == Some((addr, prefix_len)))
        else {
            return Ok(()); // already gone
        };
        self.handle
            .address()
            .del(message.clone())
            .execute()
            .await
            .map_err(|source| Error::Address {
                name: self.dummy_name.clone(),
                addr,
                op: "delete",
                source: Box::new(source),
            })
    }
}

impl Drop for Addresses {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn present_messages(
    handle: &Handle,
    index: u32,
    name: &str,
) -> Result<Vec<AddressMessage>, Error> {
    let messages: Vec<AddressMessage> = handle
        .address()
        .get()
        .set_link_index_filter(index)
        .execute()
        .try_collect()
        .await
        .map_err(|source| Error::AddressDump {
            name: name.to_string(),
            source: Box::new(source),
        })?;
    // The kernel ignores the index filter in dumps; rtnetlink filters, but be explicit.
    Ok(messages
        .into_iter()
        .filter(|m| m.header.index == index)
        .collect())
}

fn address_of(message: &AddressMessage) -> Option<(IpAddr, u8)> {
    // IFA_LOCAL is the interface's own address on point-to-point links; IFA_ADDRESS otherwise.
    let local = message.attributes.iter().find_map(|a| match a {
        AddressAttribute::Local(ip) => Some(*ip),
        _ => None,
    });
    let address = message.attributes.iter().find_map(|a| match a {
        AddressAttribute::Address(ip) => Some(*ip),
        _ => None,
    });
    local.or(address).map(|ip| (ip, message.header.prefix_len))
}

fn link_kind(link: &LinkMessage) -> Option<InfoKind> {
    link.attributes.iter().find_map(|a| match a {
        LinkAttribute::LinkInfo(infos) => infos.iter().find_map(|i| match i {
            LinkInfo::Kind(kind) => Some(kind.clone()),
            _ => None,
        }),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("test address")
    }

    #[test]
    fn a_fresh_dummy_gets_every_vip_as_a_host_address() {
        let p = plan(&[], &[ip("198.51.100.10"), ip("2001:db8:100::10")]);
        assert_eq!(p.add, vec![ip("198.51.100.10"), ip("2001:db8:100::10")]);
        assert!(p.remove.is_empty());
    }

    #[test]
    fn a_reload_removes_stale_vips_and_keeps_the_kernels_link_local_address() {
        let present = [
            (ip("198.51.100.10"), 32),
            (ip("198.51.100.11"), 32),
            (ip("fe80::1"), 64),
        ];
        let p = plan(&present, &[ip("198.51.100.10"), ip("198.51.100.12")]);
        assert_eq!(p.add, vec![ip("198.51.100.12")]);
        assert_eq!(p.remove, vec![(ip("198.51.100.11"), 32)]);
    }

    #[test]
    fn a_vip_present_with_a_subnet_prefix_is_replaced_by_a_host_address() {
        let p = plan(&[(ip("198.51.100.10"), 24)], &[ip("198.51.100.10")]);
        assert_eq!(p.add, vec![ip("198.51.100.10")]);
        assert_eq!(p.remove, vec![(ip("198.51.100.10"), 24)]);
    }

    #[test]
    fn a_converged_dummy_needs_no_change_and_duplicates_count_once() {
        let present = [(ip("198.51.100.10"), 32), (ip("2001:db8:100::10"), 128)];
        let wanted = [
            ip("2001:db8:100::10"),
            ip("198.51.100.10"),
            ip("198.51.100.10"),
        ];
        assert!(plan(&present, &wanted).is_empty());
        let p = plan(&[], &[ip("198.51.100.10"), ip("198.51.100.10")]);
        assert_eq!(p.add, vec![ip("198.51.100.10")]);
    }

    #[test]
    fn interface_names_that_could_escape_proc_sys_are_rejected() {
        for bad in ["", ".", "..", "a/b", "../all", "sixteen-chars-xx", "eth 0"] {
            assert!(
                matches!(
                    check_interface_name(bad),
                    Err(Error::BadInterfaceName { .. })
                ),
                "{bad:?}"
            );
        }
        for good in ["eth0", "eth0.100", "bond0", "swimlb0", "enp3s0f1"] {
            assert!(check_interface_name(good).is_ok(), "{good:?}");
        }
    }

    struct FakeProcSys(PathBuf);

    impl FakeProcSys {
        fn new(test: &str, ifaces: &[&str]) -> Self {
            let root =
                std::env::temp_dir().join(format!("swimlb-sysctl-{}-{test}", std::process::id()));
            let _ = std::fs::remove_dir_all(&root);
            for iface in ifaces {
                let dir = root.join("net/ipv4/conf").join(iface);
                std::fs::create_dir_all(&dir).expect("temp dir");
                std::fs::write(dir.join("arp_ignore"), "0\n").expect("temp file");
                std::fs::write(dir.join("arp_announce"), "0\n").expect("temp file");
            }
            Self(root)
        }

        fn value(&self, iface: &str, name: &str) -> String {
            std::fs::read_to_string(self.0.join("net/ipv4/conf").join(iface).join(name))
                .expect("sysctl file")
                .trim()
                .to_string()
        }
    }

    impl Drop for FakeProcSys {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn sysctls_are_set_and_the_previous_values_restored() {
        let proc_sys = FakeProcSys::new("restore", &["eth0"]);
        std::fs::write(proc_sys.0.join("net/ipv4/conf/eth0/arp_announce"), "1\n").expect("w");
        let mut sysctls = ArpSysctls::new(&proc_sys.0);
        sysctls.apply(&["eth0".to_string()]).expect("apply");
        assert_eq!(proc_sys.value("eth0", "arp_ignore"), "1");
        assert_eq!(proc_sys.value("eth0", "arp_announce"), "2");
        // applying twice must not remember swimlb's own values as "previous"
        sysctls.apply(&["eth0".to_string()]).expect("apply again");
        sysctls.restore_all().expect("restore");
        assert_eq!(proc_sys.value("eth0", "arp_ignore"), "0");
        assert_eq!(proc_sys.value("eth0", "arp_announce"), "1");
        assert!(sysctls.interfaces().is_empty());
    }

    #[test]
    fn an_interface_leaving_the_set_keeps_its_values_until_teardown() {
        let proc_sys = FakeProcSys::new("leave", &["eth0", "eth1"]);
        let mut sysctls = ArpSysctls::new(&proc_sys.0);
        sysctls
            .apply(&["eth0".to_string(), "eth1".to_string()])
            .expect("apply");
        sysctls.apply(&["eth1".to_string()]).expect("reload");
        assert_eq!(proc_sys.value("eth0", "arp_ignore"), "1");
        assert_eq!(proc_sys.value("eth1", "arp_ignore"), "1");
        assert_eq!(sysctls.interfaces(), vec!["eth0", "eth1"]);
        sysctls.restore_all().expect("restore");
        assert_eq!(proc_sys.value("eth0", "arp_ignore"), "0");
        assert_eq!(proc_sys.value("eth1", "arp_ignore"), "0");
    }

    #[test]
    fn a_missing_announcing_interface_is_an_error_naming_its_sysctl() {
        let proc_sys = FakeProcSys::new("missing", &["eth0"]);
        let mut sysctls = ArpSysctls::new(&proc_sys.0);
        let err = sysctls
            .apply(&["eth9".to_string()])
            .expect_err("no such interface");
        assert!(
            matches!(&err, Error::SysctlRead { path, .. } if path.ends_with("eth9/arp_ignore"))
        );
        assert!(err.to_string().contains("eth9"), "{err}");
    }

    #[test]
    fn restoring_an_interface_that_vanished_is_not_an_error() {
        let proc_sys = FakeProcSys::new("vanished", &["eth0"]);
        let mut sysctls = ArpSysctls::new(&proc_sys.0);
        sysctls.apply(&["eth0".to_string()]).expect("apply");
        std::fs::remove_dir_all(proc_sys.0.join("net/ipv4/conf/eth0")).expect("rm");
        assert!(sysctls.restore_all().is_ok());
    }
}
