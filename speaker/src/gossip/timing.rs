//! Timing profiles: the knobs of the SWIM protocol and of the driver around it.
//!
//! Two named profiles exist: [`Profile::Fast`] (the default, sub-second detection on a LAN) and
//! [`Profile::Lan`] (memberlist's LAN defaults, seconds, for noisy networks). Every knob is a
//! public field and may be overridden; [`Timing::validate`] rejects invalid combinations with
//! every problem listed, before anything runs. The numbers behind the profiles come from
//! `swimlb-lab sim` (docs/src/development/lab.md). The owner watch's knobs ([`crate::model::watch_knobs::Knobs`])
//! ride along: on in `fast`, off in `lan`.

use std::num::{NonZeroU8, NonZeroUsize};
use std::time::Duration;

use swimlb_proto::envelope::{MAX_PAYLOAD_LEN, OVERHEAD};

/// The largest foca packet: the envelope's payload bound minus the one-byte packet kind.
pub const MAX_FOCA_PACKET: usize = MAX_PAYLOAD_LEN - 1;

/// The default largest foca packet: sealed with its kind byte it makes a datagram of at most
/// 1,438 bytes, which fits a 1,500-byte MTU over IPv6 (1,452 bytes of UDP payload) as well as
/// IPv4 without fragmenting.
pub const DEFAULT_MAX_PACKET: usize = 1438 - 1 - OVERHEAD;
// 1,500 - 40 (IPv6 header) - 8 (UDP header).
const _: () = assert!(1 + DEFAULT_MAX_PACKET + OVERHEAD <= 1452);

use swimlb_config::standalone::GossipSettings;

use crate::model::watch_knobs::Knobs;
/// A named starting point for [`Timing`]: one type, the configuration's, so a file, the CLI and
/// the simulation name profiles alike.
pub use swimlb_config::standalone::Profile;

/// Parses a profile name (`fast` or `lan`).
pub fn parse_profile(name: &str) -> Result<Profile, TimingError> {
    match name {
        "fast" => Ok(Profile::Fast),
        "lan" => Ok(Profile::Lan),
        other => Err(TimingError::UnknownProfile(other.to_string())),
    }
}

/// Every timing knob of the gossip driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timing {
    /// How often each member probes one other member.
    pub probe_period: Duration,
    /// How long a direct probe waits for its ack before indirect probes go out.
    pub probe_rtt: Duration,
    /// Members asked to probe indirectly (and fan-out of foca's own gossip calls).
    pub indirect_probes: usize,
    /// How long a suspect stays alive before it is declared down once enough independent
    /// confirmations came back (Lifeguard's shortest suspicion; an unconfirmed one lasts
    /// `suspicion_max_mult` times this), for up to 10 members (see `scale_suspicion`).
    pub suspect_to_down_after: Duration,
    /// How many times each update is piggybacked before it is dropped (at least; see
    /// `scale_transmissions`).
    pub max_transmissions: u8,
    /// Scale the suspicion timeout with the number of members, as memberlist does:
    /// suspicion x max(1, log10 n). The core re-applies it as members come and go.
    pub scale_suspicion: bool,
    /// Raise transmissions with the number of members, as memberlist does: at least
    /// ceil(4 x log10(n + 1)).
    pub scale_transmissions: bool,
    /// After a failed probe, tell the suspect at once (it then refutes before the suspicion
    /// times out) instead of waiting for the gossip to reach it.
    pub notify_suspects: bool,
    /// foca's `notify_down_members`: foca answers every datagram from a member held as down
    /// with "you are down" (without it, the core does so itself, except for such a member's own
    /// "you are down"; see `core`).
    pub notify_down_members: bool,
    /// Period of the extra gossip rounds that spread updates between probes.
    pub gossip_period: Duration,
    /// Members each gossip round goes to.
    pub gossip_fanout: usize,
    /// Period of the announce to members believed down (heals partitions).
    pub announce_down_period: Duration,
    /// Down members each such round goes to.
    pub announce_down_fanout: usize,
    /// Period of the announce to one random member, to discover members missed while joining.
    pub announce_period: Duration,
    /// Period of the membership digest sent to one random member, which answers with the
    /// members we miss (see [`super::sync`]); zero turns it off.
    pub sync_period: Duration,
    /// How often the seeds are announced to until the node has joined.
    pub join_retry: Duration,
    /// How often a member re-offers its own metadata record to the gossip (anti-entropy for
    /// records lost on the way).
    pub meta_refresh: Duration,
    /// The largest foca packet, at most [`MAX_FOCA_PACKET`].
    pub max_packet_size: usize,
    /// Lifeguard: a suspicion nobody confirms lasts this many times the suspicion timeout
    /// (memberlist's `SuspicionMaxTimeoutMult`); 1 turns the shrinking suspicion off.
    pub suspicion_max_mult: u32,
    /// Lifeguard: independent confirmations that bring a suspicion down to the suspicion
    /// timeout (memberlist's `SuspicionMult - 2`).
    pub suspicion_confirmations: u32,
    /// Members a suspecting node asks to probe the suspect for it (see `core`); 0: none.
    pub suspicion_inquiries: usize,
    /// Lifeguard: local health stretches probe and suspicion timeouts up to this many times
    /// (memberlist's `AwarenessMaxMultiplier`); 1 turns local health off.
    pub health_max: u32,
    /// The owner watch: direct heartbeats from an IP's owner to the next node in
    /// line, with their interval `I`, misses `M` and off switch. Checked with the rest by
    /// [`Timing::validate`], also when switched off.
    pub owner_watch: Knobs,
}

impl Default for Timing {
    fn default() -> Timing {
        Timing::fast()
    }
}

impl Timing {
    /// The timings of `profile`.
    pub fn of(profile: Profile) -> Timing {
        match profile {
            Profile::Fast => Timing::fast(),
            Profile::Lan => Timing::lan(),
        }
    }

    /// The timings a configuration's gossip section describes: its profile, then every
    /// override it sets, validated. The one place a knob is applied: a new knob costs this line
    /// and its parsing in the configuration.
    pub fn from_settings(g: &GossipSettings) -> Result<Timing, TimingError> {
        let mut t = Timing::of(g.profile);
        fn set<T>(slot: &mut T, value: Option<T>) {
            if let Some(value) = value {
                *slot = value;
            }
        }
        let count = |n: std::num::NonZeroU32| n.get() as usize;
        set(&mut t.probe_period, g.probe_period);
        set(&mut t.probe_rtt, g.probe_rtt);
        set(&mut t.suspect_to_down_after, g.suspect_to_down);
        set(&mut t.gossip_period, g.periodic_gossip);
        set(&mut t.gossip_fanout, g.gossip_fanout.map(count));
        set(&mut t.indirect_probes, g.indirect_probes.map(count));
        // The configuration bounds it to 1..=255.
        set(
            &mut t.max_transmissions,
            g.max_transmissions
                .map(|n| u8::try_from(n.get()).unwrap_or(u8::MAX)),
        );
        set(&mut t.scale_suspicion, g.scale_suspicion);
        set(&mut t.scale_transmissions, g.scale_transmissions);
        set(&mut t.notify_suspects, g.notify_suspects);
        set(&mut t.notify_down_members, g.notify_down_members);
        set(&mut t.announce_down_period, g.announce_down_period);
        set(
            &mut t.announce_down_fanout,
            g.announce_down_fanout.map(count),
        );
        set(&mut t.announce_period, g.announce_period);
        set(&mut t.sync_period, g.sync_period);
        set(&mut t.join_retry, g.join_retry);
        set(&mut t.meta_refresh, g.meta_refresh);
        set(&mut t.max_packet_size, g.max_packet_size.map(count));
        set(&mut t.owner_watch.enabled, g.owner_watch);
        set(&mut t.owner_watch.interval, g.owner_watch_interval);
        set(
            &mut t.owner_watch.misses,
            g.owner_watch_misses.map(std::num::NonZeroU32::get),
        );
        t.validate()?;
        Ok(t)
    }

    /// The default profile, tuned with `swimlb-lab sim` for sub-second detection to every member
    /// with no false downs at 5 % loss.
    pub fn fast() -> Timing {
        Timing {
            probe_period: Duration::from_millis(80),
            probe_rtt: Duration::from_millis(30),
            indirect_probes: 3,
            suspect_to_down_after: Duration::from_millis(150),
            max_transmissions: 8,
            // A flat, short suspicion is safe because suspects are told at once and refute
            // while the suspicion spreads, and because it is only this short once members
            // asked to probe the suspect confirm it (Lifeguard; unconfirmed it lasts 6 x as
            // long: no false down at 10 % loss over 600 s with 100 members, seeds 1-5);
            // scaling it would cost 150 ms per decade of members.
            scale_suspicion: false,
            scale_transmissions: true,
            notify_suspects: true,
            notify_down_members: false,
            gossip_period: Duration::from_millis(20),
            gossip_fanout: 3,
            announce_down_period: Duration::from_secs(2),
            announce_down_fanout: 1,
            announce_period: Duration::from_secs(10),
            sync_period: Duration::from_secs(1),
            join_retry: Duration::from_millis(250),
            meta_refresh: Duration::from_secs(15),
            max_packet_size: DEFAULT_MAX_PACKET,
            suspicion_max_mult: 6,
            suspicion_confirmations: 3,
            suspicion_inquiries: 4,
            health_max: super::lifeguard::HEALTH_MAX,
            owner_watch: Knobs::default(),
        }
    }

    /// memberlist's LAN defaults (probe 1 s, timeout 500 ms, suspicion 4 x max(1, log10 n) s,
    /// gossip every 200 ms to 3).
    pub fn lan() -> Timing {
        Timing {
            probe_period: Duration::from_secs(1),
            probe_rtt: Duration::from_millis(500),
            indirect_probes: 3,
            suspect_to_down_after: Duration::from_secs(4),
            max_transmissions: 4,
            scale_suspicion: true,
            scale_transmissions: true,
            notify_suspects: true,
            notify_down_members: false,
            gossip_period: Duration::from_millis(200),
            gossip_fanout: 3,
            announce_down_period: Duration::from_secs(10),
            announce_down_fanout: 2,
            announce_period: Duration::from_secs(30),
            // A third of memberlist's push-pull interval (30 s, and longer above 32 members):
            // the digest is small (at most 514 bytes), and at 1,000 members a join storm left
            // 30 members short of one member for the first 30 s.
            sync_period: Duration::from_secs(10),
            join_retry: Duration::from_secs(1),
            meta_refresh: Duration::from_secs(30),
            max_packet_size: DEFAULT_MAX_PACKET,
            suspicion_max_mult: 6,
            suspicion_confirmations: 3,
            suspicion_inquiries: 4,
            health_max: super::lifeguard::HEALTH_MAX,
            // Off: this profile is for noisy networks, where gossip's seconds are the point; the
            // interval and misses are what switching it on (`ownerWatch: true`) starts from.
            owner_watch: Knobs {
                interval: Duration::from_millis(100),
                misses: 5,
                enabled: false,
            },
        }
    }

    /// Checks every knob and every combination; lists all problems at once.
    pub fn validate(&self) -> Result<(), TimingError> {
        let mut problems = Vec::new();
        let nonzero = [
            ("probe_period", self.probe_period),
            ("probe_rtt", self.probe_rtt),
            ("suspect_to_down_after", self.suspect_to_down_after),
            ("gossip_period", self.gossip_period),
            ("announce_down_period", self.announce_down_period),
            ("announce_period", self.announce_period),
            ("join_retry", self.join_retry),
            ("meta_refresh", self.meta_refresh),
        ];
        for (name, value) in nonzero {
            if value.is_zero() {
                problems.push(format!("{name} must be greater than zero"));
            }
        }
        if self.probe_rtt >= self.probe_period {
            problems.push(format!(
                "probe_rtt ({:?}) must be below probe_period ({:?})",
                self.probe_rtt, self.probe_period
            ));
        }
        for (name, value) in [
            ("suspicion_max_mult", self.suspicion_max_mult as usize),
            ("health_max", self.health_max as usize),
            ("indirect_probes", self.indirect_probes),
            ("gossip_fanout", self.gossip_fanout),
            ("announce_down_fanout", self.announce_down_fanout),
            ("max_transmissions", usize::from(self.max_transmissions)),
        ] {
            if value == 0 {
                problems.push(format!("{name} must be at least 1"));
            }
        }
        if self.max_packet_size < 512 || self.max_packet_size > MAX_FOCA_PACKET {
            problems.push(format!(
                "max_packet_size ({}) must be between 512 and {MAX_FOCA_PACKET}",
                self.max_packet_size
            ));
        }
        if let Err(watch) = self.owner_watch.validate() {
            problems.extend(watch.iter().map(ToString::to_string));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(TimingError::Invalid(problems.join("; ")))
        }
    }

    /// Suspicion timeout and transmissions for `members` known members (self included).
    pub fn scaled(&self, members: usize) -> (Duration, u8) {
        let suspicion = if self.scale_suspicion {
            let log = (members.max(1) as f64).log10().max(1.0);
            self.suspect_to_down_after.mul_f64(log)
        } else {
            self.suspect_to_down_after
        };
        let transmissions = if self.scale_transmissions {
            let wanted = (4.0 * ((members + 1) as f64).log10())
                .ceil()
                .clamp(1.0, 255.0) as u8;
            self.max_transmissions.max(wanted)
        } else {
            self.max_transmissions
        };
        (suspicion, transmissions)
    }

    /// The foca configuration for these timings with `members` known members, after
    /// [`Timing::validate`].
    pub fn foca_config(&self, members: usize) -> Result<foca::Config, TimingError> {
        self.validate()?;
        let count = |name: &str, n: usize| {
            NonZeroUsize::new(n).ok_or_else(|| TimingError::Invalid(format!("{name} is zero")))
        };
        let mut config = foca::Config::simple();
        config.probe_period = self.probe_period;
        config.probe_rtt = self.probe_rtt;
        config.num_indirect_probes = count("indirect_probes", self.indirect_probes)?;
        let (suspicion, transmissions) = self.scaled(members);
        config.max_transmissions = NonZeroU8::new(transmissions)
            .ok_or_else(|| TimingError::Invalid("max_transmissions is zero".into()))?;
        config.suspect_to_down_after = suspicion;
        config.max_packet_size = count("max_packet_size", self.max_packet_size)?;
        // A node learns it was declared down from the gossip, or from our answer to its announce
        // (see `core`); telling every down sender costs spurious renewals under loss.
        config.notify_down_members = self.notify_down_members;
        config.periodic_gossip = Some(foca::PeriodicParams {
            frequency: self.gossip_period,
            num_members: count("gossip_fanout", self.gossip_fanout)?,
        });
        config.periodic_announce_to_down_members = Some(foca::PeriodicParams {
            frequency: self.announce_down_period,
            num_members: count("announce_down_fanout", self.announce_down_fanout)?,
        });
        config.periodic_announce = Some(foca::PeriodicParams {
            frequency: self.announce_period,
            num_members: NonZeroUsize::MIN,
        });
        Ok(config)
    }
}

/// Why timings were rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TimingError {
    /// One or more knobs, or their combination, are invalid.
    #[error("invalid gossip timing: {0}")]
    Invalid(String),
    /// The profile name is neither `fast` nor `lan`.
    #[error("unknown gossip profile {0:?} (expected \"fast\" or \"lan\")")]
    UnknownProfile(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_profiles_are_valid() {
        assert_eq!(Timing::fast().validate(), Ok(()));
        assert_eq!(Timing::lan().validate(), Ok(()));
    }

    #[test]
    fn probe_rtt_not_below_probe_period_is_rejected_with_both_values() {
        let mut timing = Timing::fast();
        timing.probe_rtt = timing.probe_period;
        let err = timing.validate().unwrap_err().to_string();
        assert!(
            err.contains("probe_rtt (80ms) must be below probe_period (80ms)"),
            "{err}"
        );
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let mut timing = Timing::fast();
        timing.gossip_fanout = 0;
        timing.max_packet_size = 100_000;
        timing.join_retry = Duration::ZERO;
        let err = timing.validate().unwrap_err().to_string();
        assert!(err.contains("gossip_fanout"), "{err}");
        assert!(err.contains("max_packet_size"), "{err}");
        assert!(err.contains("join_retry"), "{err}");
        assert!(timing.foca_config(3).is_err());
    }

    #[test]
    fn suspicion_and_transmissions_grow_with_cluster_size_like_memberlist() {
        let lan = Timing::lan();
        assert_eq!(lan.scaled(3), (Duration::from_secs(4), 4));
        assert_eq!(lan.scaled(1000), (Duration::from_secs(12), 13));
        let mut fixed = Timing::fast();
        fixed.scale_suspicion = false;
        fixed.scale_transmissions = false;
        assert_eq!(
            fixed.scaled(1000),
            (fixed.suspect_to_down_after, fixed.max_transmissions)
        );
    }

    #[test]
    fn the_owner_watch_is_on_in_fast_and_off_in_lan() {
        assert_eq!(Timing::fast().owner_watch, Knobs::default());
        assert!(Timing::fast().owner_watch.enabled);
        let lan = Timing::lan().owner_watch;
        assert!(!lan.enabled);
        assert_eq!((lan.interval, lan.misses), (Duration::from_millis(100), 5));
    }

    fn settings(text: &str) -> GossipSettings {
        let file = format!(
            "cluster: c\nbind: 192.0.2.10\ninsecure: true\ngossip: {text}\ngroups: [{{name: a, addresses: [192.0.2.100]}}]"
        );
        swimlb_config::standalone::Standalone::parse(&file)
            .unwrap()
            .gossip
    }

    #[test]
    fn owner_watch_overrides_apply_on_top_of_the_profile() {
        let t = Timing::from_settings(&settings(
            "{profile: lan, ownerWatch: true, ownerWatchInterval: 40ms, ownerWatchMisses: 7}",
        ))
        .unwrap();
        assert_eq!(
            t.owner_watch,
            Knobs {
                interval: Duration::from_millis(40),
                misses: 7,
                enabled: true,
            }
        );
        let off = Timing::from_settings(&settings("{ownerWatch: false}")).unwrap();
        assert_eq!(
            off.owner_watch,
            Knobs {
                enabled: false,
                ..Knobs::default()
            }
        );
    }

    #[test]
    fn an_owner_watch_too_fast_and_too_forgiving_is_refused_with_both_values() {
        let err =
            Timing::from_settings(&settings("{ownerWatchInterval: 5ms, ownerWatchMisses: 2}"))
                .unwrap_err()
                .to_string();
        assert!(
            err.contains("owner watch interval 5ms is shorter than the minimum of 10ms"),
            "{err}"
        );
        assert!(
            err.contains("owner watch misses 2 is fewer than the minimum of 3"),
            "{err}"
        );
    }

    #[test]
    fn an_owner_watch_switched_off_is_still_checked() {
        let err = Timing::from_settings(&settings("{ownerWatch: false, ownerWatchInterval: 2s}"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("owner watch interval 2s is longer than the slow rate of 1s"),
            "{err}"
        );
    }

    #[test]
    fn unknown_profile_name_is_rejected() {
        assert_eq!(parse_profile("fast"), Ok(Profile::Fast));
        assert!(matches!(
            parse_profile("wan"),
            Err(TimingError::UnknownProfile(_))
        ));
    }
}
