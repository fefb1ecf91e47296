//! `docs/src/reference/standalone.md`: every key of the standalone file, in the order of the
//! file, from the parser's own table ([`swimlb_config::standalone::keys::KEYS`]); the gossip
//! profiles' values from the speaker's [`Timing`], each checked against it before it is printed.

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use swimlb_config::duration::format_duration;
use swimlb_config::standalone::keys::{Allowed, KEYS, Key, WhenAbsent};
use swimlb_config::standalone::{Profile, Standalone};
use swimlb_speaker::gossip::Timing;

use super::{code, generated_comment, table};

/// The sections of the file, in order, each with its heading and introduction.
const SECTIONS: &[(&str, &str, &str)] = &[
    (
        "",
        "The top level",
        "Who this node is, how it reaches the other nodes, and the groups it serves.",
    ),
    (
        "gossip",
        "`gossip`",
        "The gossip's timing: a profile, and overrides of its knobs. The default of each \
         override is the profile's value, given for both profiles. The speaker checks the \
         combination too (a `probeRtt` not below `probePeriod` is refused), and so does \
         `swimlb-speaker check-config`. Change these only after measuring: `swimlb-lab sim` \
         takes the same overrides.",
    ),
    (
        "announce",
        "`announce`",
        "When a node becomes the owner of an address, it announces it with gratuitous ARP \
         (IPv4) and unsolicited neighbor advertisements (IPv6): a burst at once, optionally a \
         second burst later and a periodic refresh, as keepalived does. Its defaults are \
         keepalived's.",
    ),
    (
        "groups[]",
        "`groups[]`",
        "A group of virtual addresses that move together. For each group, every node computes \
         the same owner from what the gossip tells it: settled nodes first, then the highest \
         effective priority, then a hash of the node's name and the address.",
    ),
    (
        "groups[].checks[]",
        "`groups[].checks[]`",
        "A health check, run on every node. Each check is exactly one of `http`, `https`, \
         `tcp` and `exec`; its result changes the node's priority (`weight`) or makes it \
         ineligible for the group.",
    ),
    (
        "groups[].vrrp",
        "`groups[].vrrp`",
        "VRRPv3 beside keepalived, opt-in per group: see [Switching from \
         keepalived](../switching/keepalived.md) for the node-by-node switch and \
         [Security](../security.md) for what unauthenticated VRRP allows.",
    ),
];

/// The page's text.
pub fn page() -> anyhow::Result<String> {
    let example = swimlb_config::standalone::keys::EXAMPLE;
    Standalone::parse(example).map_err(|e| anyhow::anyhow!("the example does not parse: {e}"))?;
    let mut out = generated_comment();
    out.push_str(
        "# The standalone file\n\n\
         `swimlb-speaker standalone --config FILE` runs the speaker without Kubernetes, from \
         a YAML file (JSON is YAML too): virtual addresses for an API server or an ingress \
         router, with health checks, priorities and weights, like keepalived. This page lists \
         every key of the file, in the order of the file, with its type, its default, the \
         values it accepts and what it does. A key that is not listed here is an error, so a \
         typo never falls back to a default in silence.\n\n\
         `swimlb-speaker check-config FILE` \
         prints every error with its path (`groups[0].checks[1].interval: ...`), or each \
         check's worst-case detection time. SIGHUP reloads the file: a change of `cluster` or \
         `bind` refuses the reload as a whole, changes of `node`, `peers`, `gossip` and \
         `listen` wait for a restart (the reload logs a warning naming each), and everything \
         else applies at once; a file that does not validate is refused, and the speaker \
         serves on with what it ran. The [command line](cli.md) page lists the speaker's \
         flags.\n\n\
         An example that uses most keys:\n\n",
    );
    let _ = writeln!(out, "```yaml\n{}```\n", example);
    out.push_str(
        "Durations are written with a unit: `900ms`, `1s`, `1m30s` (`ms`, `s`, `m`, `h`). In a \
         path, `[]` stands for any element of a list.\n\n",
    );
    let mut listed = 0;
    for (section, heading, intro) in SECTIONS {
        let keys: Vec<&Key> = KEYS.iter().filter(|k| k.section() == *section).collect();
        ensure!(!keys.is_empty(), "section `{section}` has no key");
        let _ = writeln!(out, "## {heading}\n\n{intro}\n");
        let mut rows = Vec::new();
        for key in keys {
            rows.push(vec![
                code(key.path),
                key.ty.to_string(),
                default(key)?,
                allowed(key),
                key.meaning.to_string(),
            ]);
            listed += 1;
        }
        out.push_str(&table(
            &["Key", "Type", "Default", "Allowed", "Meaning"],
            &rows,
        ));
        out.push('\n');
    }
    ensure!(
        listed == KEYS.len(),
        "{} key(s) in no section of the page",
        KEYS.len() - listed
    );
    Ok(out)
}

fn default(key: &Key) -> anyhow::Result<String> {
    Ok(match key.default {
        WhenAbsent::Required => "required".into(),
        WhenAbsent::Value(v) => code(v),
        WhenAbsent::Means(text) => text.into(),
        WhenAbsent::SameAs(sibling) => format!("{}'s value", code(sibling)),
        WhenAbsent::Profile => {
            let mut both = Vec::new();
            for profile in [Profile::Fast, Profile::Lan] {
                let value = profile_value(key, profile)?;
                both.push(format!("{}: {}", profile.as_str(), code(&value)));
            }
            both.join(", ")
        }
    })
}

fn allowed(key: &Key) -> String {
    match key.allowed {
        Allowed::Any => "-".into(),
        Allowed::Integer { min, max } => format!("{min} to {max}"),
        Allowed::Text(text) => text.into(),
    }
}

/// The value `profile` gives the knob `key` overrides, as a file would write it; checked: a file
/// that writes it out gets the profile's timings unchanged.
fn profile_value(key: &Key, profile: Profile) -> anyhow::Result<String> {
    let t = Timing::of(profile);
    let ms = |d: Duration| format_duration(d);
    let value = match key.name() {
        "probePeriod" => ms(t.probe_period),
        "probeRtt" => ms(t.probe_rtt),
        "suspectToDown" => ms(t.suspect_to_down_after),
        "periodicGossip" => ms(t.gossip_period),
        "gossipFanout" => t.gossip_fanout.to_string(),
        "indirectProbes" => t.indirect_probes.to_string(),
        "maxTransmissions" => t.max_transmissions.to_string(),
        "scaleSuspicion" => t.scale_suspicion.to_string(),
        "scaleTransmissions" => t.scale_transmissions.to_string(),
        "notifySuspects" => t.notify_suspects.to_string(),
        "notifyDownMembers" => t.notify_down_members.to_string(),
        "announceDownPeriod" => ms(t.announce_down_period),
        "announceDownFanout" => t.announce_down_fanout.to_string(),
        "announcePeriod" => ms(t.announce_period),
        "syncPeriod" => ms(t.sync_period),
        "joinRetry" => ms(t.join_retry),
        "metaRefresh" => ms(t.meta_refresh),
        "maxPacketSize" => t.max_packet_size.to_string(),
        "ownerWatch" => t.owner_watch.enabled.to_string(),
        "ownerWatchInterval" => ms(t.owner_watch.interval),
        "ownerWatchMisses" => t.owner_watch.misses.to_string(),
        other => bail!("{}: no profile value is known for `{other}`", key.path),
    };
    let file = format!(
        "cluster: c\nbind: 192.0.2.10\ninsecure: true\ngroups: [{{name: g, addresses: [192.0.2.100]}}]\n\
         gossip: {{profile: {}, {}: {value}}}\n",
        profile.as_str(),
        key.name()
    );
    let config = Standalone::parse(&file)
        .map_err(|e| anyhow::anyhow!("{}: {value} does not parse: {e}", key.path))?;
    let written = Timing::from_settings(&config.gossip)
        .with_context(|| format!("{}: {value} is refused", key.path))?;
    ensure!(
        written == t,
        "{}: `{value}` is not the {} profile's value",
        key.path,
        profile.as_str()
    );
    Ok(value)
}
