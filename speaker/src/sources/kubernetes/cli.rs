//! `swimlb-speaker kubernetes`: flags with the environment fallbacks a DaemonSet passes (the
//! downward API's `NODE_NAME`, `POD_NAMESPACE`, `POD_IP`), validated all at once (exit 64 with
//! every error).
//!
//! The owner watch's flags (`--owner-watch`, `--owner-watch-interval`, `--owner-watch-misses`)
//! default to the gossip profile's knobs and override them one by one; an error names the flag.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use swimlb_config::duration::parse_duration;
use swimlb_config::standalone::{GossipSettings, MAX_OWNER_WATCH_MISSES};

use super::run::Settings;
use super::snapshot;
use crate::gossip::Timing;
use crate::gossip::timing::parse_profile;
use crate::model::watch_knobs::{Knobs, KnobsError};

/// The gossip port when `--bind` is not given.
pub const GOSSIP_PORT: u16 = 7946;

/// The HTTP port when `--listen` names an address alone.
pub const HTTP_PORT: u16 = 7572;

/// `--listen`'s parser: an address alone gets [`HTTP_PORT`] (the downward API's IPv6 host
/// address included).
fn listen_address(text: &str) -> Result<SocketAddr, String> {
    swimlb_proto::listener::parse_listen(text, HTTP_PORT)
}

/// The flags of `swimlb-speaker kubernetes`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// This node's name (the downward API's spec.nodeName).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,
    /// The speaker's namespace: pools, advertisements, status records and peers live there.
    #[arg(long, env = "POD_NAMESPACE", default_value = "swimlb-system")]
    pub namespace: String,
    /// This Pod's IP (the downward API's status.podIP): the default gossip address.
    #[arg(long, env = "POD_IP")]
    pub pod_ip: Option<IpAddr>,
    /// The gossip address; default `$POD_IP:7946`.
    #[arg(long)]
    pub bind: Option<SocketAddr>,
    /// The gossip cluster name (the same on every speaker).
    #[arg(long, default_value = "swimlb")]
    pub cluster: String,
    /// The gossip key file (a mounted Secret: one base64 key per line, the first seals); a
    /// change of the file rotates the keys without a restart.
    #[arg(long, env = "SWIMLB_KEY_FILE")]
    pub key_file: Option<PathBuf>,
    /// Run without a key: gossip is neither secret nor authenticated.
    #[arg(long)]
    pub insecure: bool,
    /// `/metrics`, `/healthz`, `/readyz`, `/status`: address:port, or an address alone (port
    /// 7572). The manifest sets SWIMLB_LISTEN to the node's own address (status.hostIP).
    #[arg(long, env = "SWIMLB_LISTEN", default_value = "0.0.0.0:7572", value_parser = listen_address)]
    pub listen: SocketAddr,
    /// Serve only Services of this loadBalancerClass (default: those without a class).
    #[arg(long)]
    pub load_balancer_class: Option<String>,
    /// Let nodes labelled node.kubernetes.io/exclude-from-external-load-balancers announce.
    #[arg(long)]
    pub ignore_exclude_lb: bool,
    /// Gossip timing profile: fast or lan.
    #[arg(long, default_value = "fast")]
    pub gossip_profile: String,
    /// A node that comes back waits this long before it takes its IPs back (`0s`: at once, as
    /// MetalLB does).
    #[arg(long, default_value = "0s")]
    pub preempt_delay: String,
    /// The owner watch (direct heartbeats from an IP's owner to the next node in line): `on` or
    /// `off`. Default: the profile's (on in fast, off in lan).
    #[arg(long, value_name = "on|off")]
    pub owner_watch: Option<String>,
    /// The owner watch's heartbeat interval, 10ms to 1s. Default: the profile's (20ms in fast,
    /// 100ms in lan).
    #[arg(long, value_name = "DURATION")]
    pub owner_watch_interval: Option<String>,
    /// Missed heartbeat intervals before the owner watch finds an owner silent, 3 to 1000.
    /// Default: the profile's (5).
    #[arg(long, value_name = "N")]
    pub owner_watch_misses: Option<String>,
    /// Label selector of the speaker Pods (the gossip peers).
    #[arg(
        long,
        default_value = "app.kubernetes.io/name=swimlb,app.kubernetes.io/component=speaker"
    )]
    pub speaker_selector: String,
}

impl Args {
    /// The validated settings, or every problem.
    pub fn settings(&self) -> Result<Settings, Vec<String>> {
        let mut errors = Vec::new();
        let node = self.node_name.clone().filter(|n| !n.is_empty());
        if node.is_none() {
            errors.push("--node-name (or NODE_NAME) is required".to_string());
        }
        let bind = self
            .bind
            .or_else(|| self.pod_ip.map(|ip| SocketAddr::new(ip, GOSSIP_PORT)));
        if bind.is_none() {
            errors.push("--bind or --pod-ip (or POD_IP) is required".to_string());
        }
        match (&self.key_file, self.insecure) {
            (None, false) => errors.push(
                "--key-file (or SWIMLB_KEY_FILE) is required, or --insecure to run without a key"
                    .to_string(),
            ),
            (Some(_), true) => errors.push("--key-file and --insecure exclude each other".into()),
            _ => {}
        }
        let timing = parse_profile(&self.gossip_profile)
            .map_err(|e| e.to_string())
            .and_then(|profile| {
                Timing::from_settings(&GossipSettings {
                    profile,
                    ..GossipSettings::default()
                })
                .map_err(|e| e.to_string())
            });
        let timing = timing
            .map_err(|e| errors.push(format!("--gossip-profile: {e}")))
            .ok();
        // On top of the profile's knobs; with an unknown profile, on top of the default ones so
        // a bad watch flag is still named.
        let base = timing
            .as_ref()
            .map_or_else(Knobs::default, |t| t.owner_watch);
        let owner_watch = self
            .owner_watch_knobs(base)
            .map_err(|e| errors.extend(e))
            .ok();
        let timing = timing.zip(owner_watch).map(|(timing, owner_watch)| Timing {
            owner_watch,
            ..timing
        });
        let preempt_delay = parse_duration(&self.preempt_delay)
            .map_err(|e| errors.push(format!("--preempt-delay: {e}")))
            .ok();
        match (node, bind, timing, preempt_delay) {
            (Some(node), Some(bind), Some(timing), Some(preempt_delay)) if errors.is_empty() => {
                Ok(Settings {
                    node,
                    namespace: self.namespace.clone(),
                    bind,
                    cluster: self.cluster.clone(),
                    key_file: self.key_file.clone(),
                    listen: self.listen,
                    timing,
                    preempt_delay,
                    speaker_selector: self.speaker_selector.clone(),
                    options: snapshot::Options {
                        load_balancer_class: self.load_balancer_class.clone(),
                        ignore_exclude_lb: self.ignore_exclude_lb,
                    },
                })
            }
            _ => Err(errors),
        }
    }

    /// `base` with the owner watch flags applied and validated, or every problem, each
    /// prefixed with its flag.
    fn owner_watch_knobs(&self, base: Knobs) -> Result<Knobs, Vec<String>> {
        let mut errors = Vec::new();
        let mut knobs = base;
        match self.owner_watch.as_deref() {
            None => {}
            Some("on") => knobs.enabled = true,
            Some("off") => knobs.enabled = false,
            Some(other) => errors.push(format!(
                "--owner-watch: expected `on` or `off`, found `{other}`"
            )),
        }
        if let Some(text) = &self.owner_watch_interval {
            match parse_duration(text) {
                Ok(interval) => knobs.interval = interval,
                Err(e) => errors.push(format!("--owner-watch-interval: {e}")),
            }
        }
        if let Some(text) = &self.owner_watch_misses {
            // The minimum (3) is the knobs' to check, below, as for a file.
            match text.trim().parse::<u32>() {
                Ok(misses) if misses <= MAX_OWNER_WATCH_MISSES => knobs.misses = misses,
                Ok(misses) => errors.push(format!(
                    "--owner-watch-misses: {misses} is more than {MAX_OWNER_WATCH_MISSES}"
                )),
                Err(_) => errors.push(format!(
                    "--owner-watch-misses: `{text}` is not a whole number of intervals"
                )),
            }
        }
        if let Err(problems) = knobs.validate() {
            errors.extend(problems.iter().map(|p| {
                let flag = match p {
                    KnobsError::IntervalTooShort(_) | KnobsError::IntervalTooLong(_) => {
                        "--owner-watch-interval"
                    }
                    KnobsError::TooFewMisses(_) => "--owner-watch-misses",
                };
                format!("{flag}: {p}")
            }));
        }
        if errors.is_empty() {
            Ok(knobs)
        } else {
            Err(errors)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use clap::Parser;

    #[derive(clap::Parser, Debug)]
    struct Wrapper {
        #[command(flatten)]
        args: Args,
    }

    fn args(line: &[&str]) -> Args {
        let mut all = vec!["swimlb-speaker"];
        all.extend_from_slice(line);
        Wrapper::try_parse_from(all).unwrap().args
    }

    #[test]
    fn a_daemonset_passes_node_namespace_and_pod_ip() {
        let settings = args(&[
            "--node-name",
            "worker-1",
            "--pod-ip",
            "192.0.2.21",
            "--key-file",
            "/etc/swimlb/keys/keys",
            "--preempt-delay",
            "30s",
        ])
        .settings()
        .unwrap();
        assert_eq!(settings.node, "worker-1");
        assert_eq!(settings.bind, "192.0.2.21:7946".parse().unwrap());
        assert_eq!(settings.namespace, "swimlb-system");
        assert_eq!(settings.preempt_delay, Duration::from_secs(30));
    }

    #[test]
    fn the_listen_address_may_be_the_downward_apis_host_ip_alone_ipv6_included() {
        for (flag, want) in [
            ("--listen=192.0.2.21", "192.0.2.21:7572"),
            ("--listen=2001:db8::21", "[2001:db8::21]:7572"),
            ("--listen=[2001:db8::21]:9100", "[2001:db8::21]:9100"),
        ] {
            assert_eq!(args(&[flag]).listen, want.parse().unwrap(), "{flag}");
        }
        let e = Wrapper::try_parse_from(["swimlb-speaker", "--listen=$(SWIMLB_LISTEN)"])
            .expect_err("an unexpanded variable");
        assert!(e.to_string().contains("is not an address"), "{e}");
    }

    #[test]
    fn every_missing_or_bad_flag_is_named_at_once() {
        let errors = args(&["--gossip-profile", "wan", "--preempt-delay", "soon"])
            .settings()
            .unwrap_err();
        let text = errors.join("\n");
        for needle in [
            "--node-name",
            "--bind or --pod-ip",
            "--key-file",
            "--gossip-profile",
            "--preempt-delay",
        ] {
            assert!(text.contains(needle), "{needle} missing from:\n{text}");
        }
        assert_eq!(errors.len(), 5);
    }

    /// The errors of a command line with the required flags and `extra`; empty when valid.
    fn errors_of(extra: &[&str]) -> Vec<String> {
        let mut line = vec!["--node-name", "n1", "--pod-ip", "192.0.2.21", "--insecure"];
        line.extend_from_slice(extra);
        args(&line)
            .settings()
            .map(|_| Vec::new())
            .unwrap_or_else(|e| e)
    }

    /// The owner watch knobs of a valid command line with the required flags and `extra`.
    fn owner_watch(extra: &[&str]) -> Knobs {
        let mut line = vec!["--node-name", "n1", "--pod-ip", "192.0.2.21", "--insecure"];
        line.extend_from_slice(extra);
        args(&line).settings().unwrap().timing.owner_watch
    }

    #[test]
    fn the_owner_watch_defaults_to_the_profile_and_each_flag_overrides_one_knob() {
        assert_eq!(owner_watch(&[]), Knobs::default());
        assert_eq!(
            owner_watch(&["--gossip-profile", "lan"]),
            Timing::lan().owner_watch
        );
        assert_eq!(
            owner_watch(&["--gossip-profile", "lan", "--owner-watch", "on"]),
            Knobs {
                enabled: true,
                ..Timing::lan().owner_watch
            }
        );
        assert_eq!(
            owner_watch(&[
                "--owner-watch",
                "off",
                "--owner-watch-interval",
                "40ms",
                "--owner-watch-misses",
                "4",
            ]),
            Knobs {
                interval: Duration::from_millis(40),
                misses: 4,
                enabled: false,
            }
        );
    }

    #[test]
    fn every_bad_owner_watch_flag_is_named_with_its_value() {
        assert_eq!(
            errors_of(&[
                "--owner-watch",
                "maybe",
                "--owner-watch-interval",
                "5ms",
                "--owner-watch-misses",
                "2",
            ]),
            [
                "--owner-watch: expected `on` or `off`, found `maybe`",
                "--owner-watch-interval: owner watch interval 5ms is shorter than the minimum of 10ms",
                "--owner-watch-misses: owner watch misses 2 is fewer than the minimum of 3",
            ]
        );
        assert_eq!(
            errors_of(&[
                "--gossip-profile",
                "wan",
                "--owner-watch-interval",
                "soon",
                "--owner-watch-misses",
                "1001",
            ]),
            [
                "--gossip-profile: unknown gossip profile \"wan\" (expected \"fast\" or \"lan\")",
                "--owner-watch-interval: `soon` is not a duration (for example `900ms`, `1s`, `1m30s`)",
                "--owner-watch-misses: 1001 is more than 1000",
            ]
        );
        assert_eq!(
            errors_of(&["--owner-watch-misses=-1", "--owner-watch-interval", "2s"]),
            [
                "--owner-watch-misses: `-1` is not a whole number of intervals",
                "--owner-watch-interval: owner watch interval 2s is longer than the slow rate of 1s",
            ]
        );
    }
}
