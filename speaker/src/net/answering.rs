//! The links this node answers on: one responder thread per link, told exactly which IPs to
//! answer for, and the announcements to send.
//!
//! [`AnsweringLinks`] carries out the engine's [`Action::Silence`], [`Action::Answer`] and
//! [`Action::Announce`]. A responder is opened on every link the drivers name ([`AnsweringLinks::open`],
//! ahead of need) or at the latest when an IP is first answered there, and closed when the link
//! disappears, goes down or is re-created (a new index). Stopping is
//! immediate: a `Silence` reaches the thread before anything else of the same batch; an IP's
//! new owned set reaches the thread before its first announcement.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::Duration;

use swimlb_proto::ethernet::MacAddr;

use crate::model::engine::Action;
use crate::model::links::Link;
use crate::net::packet_socket;
use crate::net::responder::{self, Control, Owned, Responder};

/// The packet socket's read timeout. The responder thread no longer waits in it: it polls the
/// socket and an eventfd each command writes to, so a command is read at once (see
/// [`responder::IDLE_TURN`]), and reads the socket only once it is readable. When it was the
/// wait, at 50 ms a takeover's first gratuitous ARP waited up to 50 ms for the thread to look
/// (the lab's poweroff p50 was 338-350 ms over five runs of 20 trials, 314 ms with 5 ms), and
/// 5 ms cost each thread 200 idle wake-ups a second.
pub const COMMAND_LATENCY: Duration = Duration::from_millis(5);

/// Why a link cannot answer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The link is not among the node's links.
    #[error("interface {0}: no such link")]
    NoSuchLink(String),
    /// The packet socket could not be opened or its thread started.
    #[error("interface {iface}: packet socket: {source}")]
    PacketSocket {
        /// The link.
        iface: String,
        /// The error.
        source: std::io::Error,
    },
}

/// One link answered on.
#[derive(Debug)]
struct AnsweringLink {
    index: u32,
    mac: MacAddr,
    responder: Responder,
    owned: BTreeSet<IpAddr>,
    /// The owned set changed since the thread was last told.
    dirty: bool,
}

impl AnsweringLink {
    fn tell(&mut self) {
        self.responder
            .send(Control::SetOwned(Owned::new(self.owned.iter().copied())));
        self.dirty = false;
    }
}

/// What [`AnsweringLinks::set_links`] changed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct LinkChanges {
    /// The links whose responders stopped (gone, down or re-created).
    pub closed: Vec<String>,
    /// The answering links whose carrier came back (name, index).
    pub carrier_back: Vec<(String, u32)>,
}

/// The responders of one speaker.
#[derive(Debug)]
pub struct AnsweringLinks {
    links: Vec<Link>,
    open: BTreeMap<String, AnsweringLink>,
    metrics: responder::Metrics,
    conflicts: responder::ConflictSender,
}

impl AnsweringLinks {
    /// No responder yet; `links` are the node's links, `conflicts` receives what the responders
    /// see.
    pub fn new(
        links: Vec<Link>,
        metrics: responder::Metrics,
        conflicts: responder::ConflictSender,
    ) -> AnsweringLinks {
        AnsweringLinks {
            links,
            open: BTreeMap::new(),
            metrics,
            conflicts,
        }
    }

    /// The node's links changed: responders on links that are gone, down or re-created stop.
    pub fn set_links(&mut self, links: Vec<Link>) -> LinkChanges {
        let mut changes = LinkChanges::default();
        self.open.retain(|name, open| {
            let alive = links
                .iter()
                .any(|l| &l.name == name && l.index == open.index && l.up);
            if !alive {
                changes.closed.push(name.clone());
            }
            alive
        });
        for (name, open) in &self.open {
            let was = self.links.iter().find(|l| l.index == open.index);
            let now = links.iter().find(|l| l.index == open.index);
            if let (Some(was), Some(now)) = (was, now)
                && !was.carrier
                && now.carrier
            {
                changes.carrier_back.push((name.clone(), now.index));
            }
        }
        self.links = links;
        changes
    }

    /// Asks on `name` for the MACs of `targets`, from `sources` (see [`Control::Solicit`]).
    pub fn solicit(&mut self, name: &str, sources: Vec<IpAddr>, targets: Vec<IpAddr>) {
        if let Some(link) = self.open.get_mut(name) {
            link.responder.send(Control::Solicit { sources, targets });
        }
    }

    /// Opens a responder on `name` (the engine placed only usable links, so this normally
    /// succeeds): ensures the link answers.
    pub fn open(&mut self, name: &str) -> Result<(), Error> {
        if self.open.contains_key(name) {
            return Ok(());
        }
        let link = self
            .links
            .iter()
            .find(|l| l.name == name)
            .ok_or_else(|| Error::NoSuchLink(name.to_string()))?;
        let iface = pnet_datalink::interfaces()
            .into_iter()
            .find(|i| i.index == link.index)
            .ok_or_else(|| Error::NoSuchLink(name.to_string()))?;
        let socket_error = |source| Error::PacketSocket {
            iface: name.to_string(),
            source,
        };
        let channel = packet_socket::open(&iface, COMMAND_LATENCY).map_err(socket_error)?;
        let [a, b, c, d, e, f] = link.mac;
        let mac = MacAddr(a, b, c, d, e, f);
        let responder = Responder::spawn(
            name,
            mac,
            channel.tx,
            channel.rx,
            Some(channel.membership),
            self.metrics.clone(),
            self.conflicts.clone(),
        )
        .map_err(socket_error)?;
        tracing::info!(interface = name, %mac, "answering ARP and neighbor solicitations");
        self.open.insert(
            name.to_string(),
            AnsweringLink {
                index: link.index,
                mac,
                responder,
                owned: BTreeSet::new(),
                dirty: false,
            },
        );
        Ok(())
    }

    /// Carries out the link actions of one batch, in order; other actions are ignored.
    pub fn perform(&mut self, actions: &[Action]) {
        for action in actions {
            match action {
                Action::Silence { ip, links } => {
                    for name in links {
                        if let Some(link) = self.open.get_mut(name)
                            && link.owned.remove(ip)
                        {
                            link.tell();
                        }
                    }
                    tracing::info!(%ip, interfaces = ?links, "no longer answering");
                }
                Action::Answer { ip, links } => {
                    for name in links {
                        if let Err(e) = self.open(name) {
                            tracing::error!(%ip, error = %e, "cannot answer");
                            continue;
                        }
                        if let Some(link) = self.open.get_mut(name) {
                            link.owned.insert(*ip);
                            link.dirty = true;
                            tracing::info!(%ip, interface = %name, mac = %link.mac, "now owner");
                        }
                    }
                }
                Action::Announce { ip, link } => {
                    if let Some(link) = self.open.get_mut(link) {
                        if link.dirty {
                            link.tell();
                        }
                        link.responder.send(Control::Announce(*ip));
                    }
                }
                _ => {}
            }
        }
        for link in self.open.values_mut().filter(|l| l.dirty) {
            link.tell();
        }
    }

    /// Stops every responder.
    pub fn stop(self) {
        for (_, link) in self.open {
            link.responder.stop();
        }
    }
}
