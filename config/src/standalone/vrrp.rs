//! A group's VRRPv3 router: `groups[i].vrrp` (`{vrid, advertInterval, priority?}`).
//!
//! With it, the speakers speak VRRPv3 (RFC 9568) for the group beside keepalived routers of the
//! same VRID: the owner advertises, every node listens, and a VRRP master that wins by the RFC's
//! rule keeps every speaker silent for the group's addresses. Priorities are one scale: swimlb's
//! 1 to 254 are VRRP's (255, the address owner, and 0, "giving up", are not configurable).

use std::time::Duration;

use serde_json::Value;

use super::{Walker, join};

/// The VRID range (RFC 9568 section 5.2.3).
pub const VRID: std::ops::RangeInclusive<i64> = 1..=255;
/// The shortest advertisement interval: one centisecond, VRRPv3's unit.
pub const MIN_ADVERT_INTERVAL: Duration = Duration::from_millis(10);
/// The longest: 4095 centiseconds (12 bits).
pub const MAX_ADVERT_INTERVAL: Duration = Duration::from_millis(40_950);
/// keepalived's default `advert_int`.
pub const DEFAULT_ADVERT_INTERVAL: Duration = Duration::from_secs(1);

/// The VRRP router of a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Vrrp {
    /// The virtual router id, the same as the keepalived routers' `virtual_router_id`.
    pub vrid: u8,
    /// How often the owner advertises (a whole number of centiseconds).
    pub advert_interval: Duration,
    /// The priority this node advertises and is compared with; `None`: its effective priority
    /// in the group.
    pub priority: Option<u8>,
}

impl Vrrp {
    /// The interval in centiseconds, as the advertisement carries it.
    pub fn interval_centis(&self) -> u16 {
        (self.advert_interval.as_millis() / 10).min(0x0fff) as u16
    }
}

impl Walker {
    pub(super) fn vrrp(&mut self, path: &str, v: &Value) -> Option<Vrrp> {
        let map = self.object(path, v, "groups[].vrrp")?;
        let vrid = match map.get("vrid") {
            Some(v) => self.integer(&join(path, "vrid"), v, *VRID.start(), *VRID.end()),
            None => {
                self.error(
                    &join(path, "vrid"),
                    "required: the virtual router id (keepalived's `virtual_router_id`)",
                );
                None
            }
        };
        let interval_at = join(path, "advertInterval");
        let advert_interval = match map.get("advertInterval") {
            Some(v) => self.duration(&interval_at, v),
            None => Some(DEFAULT_ADVERT_INTERVAL),
        };
        if let Some(d) = advert_interval
            && (d < MIN_ADVERT_INTERVAL
                || d > MAX_ADVERT_INTERVAL
                || d.as_nanos() % 10_000_000 != 0)
        {
            self.error(
                &interval_at,
                "must be a whole number of centiseconds from `10ms` to `40950ms` (VRRPv3's 12 bits)",
            );
        }
        let priority = map
            .get("priority")
            .map(|v| self.integer(&join(path, "priority"), v, 1, 254));
        let interval_ok = advert_interval.filter(|d| {
            (MIN_ADVERT_INTERVAL..=MAX_ADVERT_INTERVAL).contains(d)
                && d.as_nanos() % 10_000_000 == 0
        });
        Some(Vrrp {
            vrid: vrid? as u8,
            advert_interval: interval_ok?,
            priority: match priority {
                Some(p) => Some(p? as u8),
                None => None,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::standalone::Standalone;

    fn file(vrrp: &str) -> String {
        format!(
            "cluster: c\nbind: 192.0.2.10\nkeyFile: /k\n\
             groups: [{{name: g, addresses: [192.0.2.100, 2001:db8::100], interface: eth0, \
             vrrp: {vrrp}}}]"
        )
    }

    fn errors(vrrp: &str) -> String {
        Standalone::parse(&file(vrrp)).expect_err(vrrp).to_string()
    }

    #[test]
    fn a_vrrp_router_is_read_with_keepalived_defaults() {
        let config = Standalone::parse(&file("{vrid: 51}")).expect("parses");
        let vrrp = config.groups[0].vrrp.expect("vrrp");
        assert_eq!(vrrp.vrid, 51);
        assert_eq!(vrrp.advert_interval, Duration::from_secs(1));
        assert_eq!(vrrp.interval_centis(), 100);
        assert_eq!(vrrp.priority, None);
        let config =
            Standalone::parse(&file("{vrid: 7, advertInterval: 100ms, priority: 200}")).unwrap();
        let vrrp = config.groups[0].vrrp.expect("vrrp");
        assert_eq!((vrrp.interval_centis(), vrrp.priority), (10, Some(200)));
    }

    #[test]
    fn bad_vrrp_values_are_named() {
        assert!(errors("{advertInterval: 1s}").contains("groups[0].vrrp.vrid: required"));
        assert!(errors("{vrid: 0}").contains("groups[0].vrrp.vrid: 0 is out of range 1..=255"));
        assert!(errors("{vrid: 1, priority: 255}").contains("vrrp.priority: 255 is out of range"));
        assert!(errors("{vrid: 1, priority: 0}").contains("vrrp.priority: 0 is out of range"));
        for interval in ["5ms", "15ms", "41s"] {
            let e = errors(&format!("{{vrid: 1, advertInterval: {interval}}}"));
            assert!(
                e.contains("vrrp.advertInterval: must be a whole number"),
                "{e}"
            );
        }
        assert!(errors("{vrid: 1, auth: x}").contains("vrrp.auth: unknown field"));
    }
}
