//! VRRPv3 beside keepalived (RFC 9568): a group with `vrrp:` is also a VRRP router.
//!
//! What a speaker does for such a group, per address family (each family is its own VRRP
//! router, as keepalived has one instance per family):
//!
//! - **Every speaker listens** on the group's interface (IP protocol 112, to 224.0.0.18 /
//!   ff02::12, TTL / hop limit 255 and checksum checked; a bad frame is counted by reason, never
//!   acted on) and keeps, per sender, the last advertisement heard ([`Router`]). A sender is
//!   forgotten when it advertises priority 0 or after its Master_Down_Interval (three of its
//!   advertised intervals plus the skew of this node's priority) without an advertisement.
//! - **A foreign master that wins keeps every speaker silent**: while a sender wins against this
//!   node by the RFC's rule ([`wins`]: higher priority, then higher primary address) the group's
//!   addresses of that family are yielded ([`crate::model::engine::Input::Yield`]): whoever the
//!   election names does not answer, as a VRRP backup would not. When the sender is forgotten
//!   the owner answers and announces at once, with no election round. [`task::CLAIM`] before a
//!   silent sender's Master_Down_Interval ends, the speaker the election names advertises
//!   (still silent), so that a keepalived backup of the same priority, whose timer would fire
//!   at the same moment, hears it first and stays backup.
//! - **The owner advertises**: the speaker that answers for the group sends an advertisement
//!   with its priority (`vrrp.priority`, else its effective priority in the group: one scale
//!   with keepalived's) every `advertInterval`, so keepalived routers of the VRID with a lower
//!   priority stay backup; and priority 0 when it stops answering for another reason than a
//!   yield (it lost the group, it drains, it stops), so they take over after the skew instead
//!   of Master_Down_Interval.
//! - **A starting speaker listens first**: until it has listened for one Master_Down_Interval
//!   it yields every address of its VRRP groups, as a VRRP router starts as backup.
//!
//! - **A fellow speaker's death is the mesh's word**: an advertisement from a member of the
//!   mesh (its source is the gossip address of a member the election counts alive, or one of
//!   the addresses its gossip record announces it sends VRRP advertisements from:
//!   [`task::VrrpHandle::sources`], an IPv6 router's link-local address) is heard as any
//!   router's, but when that member leaves the election (the owner watch accuses it, or the
//!   gossip declares it down or gone) its advertisement is forgotten at once
//!   ([`Router::forget`]): a successor of lower priority takes the group at the owner watch's
//!   pace instead of waiting out the dead owner's Master_Down_Interval. A member wrongly
//!   accused is heard again with its next advertisement. keepalived's advertisements (from
//!   addresses no member announces) keep their full VRRP meaning. A speaker of an earlier
//!   release announces no VRRP sources: when it advertises from another address than its
//!   gossip address (always over IPv6), its death waits for its Master_Down_Interval, as a
//!   keepalived backup would.
//!
//! This module is sans-IO (every call takes `now`); [`task`] owns the sockets.

pub mod socket;
pub mod task;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use tokio::time::Instant;

/// The RFC's order between two routers: `a` wins against `b` when its priority is higher, or
/// equal and its primary address higher (compared as unsigned integers, RFC 9568 section
/// 6.4.3). A router without an address (none on the interface) loses every tie.
pub fn wins(a: (u8, IpAddr), b: (u8, Option<IpAddr>)) -> bool {
    match a.0.cmp(&b.0) {
        std::cmp::Ordering::Greater => true,
        std::cmp::Ordering::Less => false,
        std::cmp::Ordering::Equal => b.1.is_none_or(|b| as_integer(a.1) > as_integer(b)),
    }
}

fn as_integer(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

/// Skew_Time: `(256 - priority) / 256` of the master's interval.
pub fn skew(priority: u8, interval: Duration) -> Duration {
    interval * (256 - u32::from(priority)) / 256
}

/// Master_Down_Interval: three intervals and the skew.
pub fn master_down_interval(priority: u8, interval: Duration) -> Duration {
    interval * 3 + skew(priority, interval)
}

/// An advertisement's interval field (centiseconds) as a duration; 0 counts as one centisecond.
pub fn interval_of(centis: u16) -> Duration {
    Duration::from_millis(u64::from(centis.max(1)) * 10)
}

/// A sender heard advertising.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Master {
    /// Its advertised priority (1 to 255).
    pub priority: u8,
    /// Its advertised interval.
    pub interval: Duration,
    /// When its last advertisement arrived.
    pub heard: Instant,
}

impl Master {
    /// When it is forgotten, for a listener of `priority`.
    pub fn down_at(&self, priority: u8) -> Instant {
        self.heard + master_down_interval(priority, self.interval)
    }
}

/// One family of one group's VRRP router, as this speaker hears it.
#[derive(Debug, Clone, Default)]
pub struct Router {
    masters: BTreeMap<IpAddr, Master>,
}

impl Router {
    /// An advertisement from `src` at `now`: priority 0 forgets the sender at once.
    pub fn heard(&mut self, now: Instant, src: IpAddr, priority: u8, interval_centis: u16) {
        if priority == 0 {
            self.masters.remove(&src);
        } else {
            let interval = interval_of(interval_centis);
            self.masters.insert(
                src,
                Master {
                    priority,
                    interval,
                    heard: now,
                },
            );
        }
    }

    /// Forgets `src` at once (a fellow speaker the mesh declared dead); returns whether it was
    /// heard.
    pub fn forget(&mut self, src: &IpAddr) -> bool {
        self.masters.remove(src).is_some()
    }

    /// Forgets the senders silent for their Master_Down_Interval at `now`, for a listener of
    /// `priority`; returns whether one was.
    pub fn expire(&mut self, now: Instant, priority: u8) -> bool {
        let before = self.masters.len();
        self.masters.retain(|_, m| m.down_at(priority) > now);
        self.masters.len() != before
    }

    /// The sender that wins against this node (`priority`, primary address `local`), if any:
    /// the best of those that do, by the same rule. Senders past their deadline count only
    /// until [`Router::expire`] forgets them.
    pub fn winner(&self, priority: u8, local: Option<IpAddr>) -> Option<(IpAddr, Master)> {
        self.masters
            .iter()
            .filter(|(addr, m)| {
                Some(**addr) != local && wins((m.priority, **addr), (priority, local))
            })
            .max_by(|(a, x), (b, y)| {
                (x.priority, as_integer(**a)).cmp(&(y.priority, as_integer(**b)))
            })
            .map(|(a, m)| (*a, *m))
    }

    /// When the next sender is forgotten, for a listener of `priority`.
    pub fn next_deadline(&self, priority: u8) -> Option<Instant> {
        self.masters.values().map(|m| m.down_at(priority)).min()
    }

    /// Every sender heard and not forgotten.
    pub fn masters(&self) -> &BTreeMap<IpAddr, Master> {
        &self.masters
    }
}
