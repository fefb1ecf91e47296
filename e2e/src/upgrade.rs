//! A rolling upgrade across an envelope version on the namespace lab, with the chaos checker's
//! invariants on: the speakers start with the previous release's wire behaviour, the speakers'
//! roll restarts them node by node with the current one, one node is rolled back and forward
//! again, and the checker counts violations over the whole run (one owner per VIP, no dark
//! period beyond its bound, agreement, no crash).
//!
//! **The previous release.** Each speaker runs as this build, with `SWIMLB_ENVELOPE_VERSION=2`
//! for the starts that stand for the previous release: it then seals and opens version 2 only
//! and announces nothing, which is what the previous release does on the wire (the envelope's
//! version-2 path and the metadata record are the same code; only the largest gossip packet is
//! 8 bytes smaller, the room version 3 needs). Building the previous
//! release from the git history instead would test the same bytes at the cost of a second full
//! build of the speaker on every CI run (on a fresh machine, minutes); a later release whose
//! previous one differs in more than the envelope will need that build (see the upgrade page).
//!
//! The switch is made by a wrapper script the lab runs as its speaker program: it reads the
//! node from the `--config` argument, counts the node's starts, sets the variable from the
//! node's list of versions (one per start, the last one repeating), copies the speaker's log to
//! this run's directory (the lab's own goes with the lab) and execs the real program, so the
//! process the lab signals is the speaker.

pub mod kubernetes;
pub mod watch;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};

use crate::chaos::schedule::{Fault, FaultKind, Target};
use crate::chaos::{self, Options, Report};

/// The versions each node starts with, one per start: the previous release, the roll, and
/// for node 2 a rollback to the previous release and forward again.
pub const STARTS: [&[u8]; 3] = [&[2, 3], &[2, 3, 2, 3], &[2, 3]];

/// The run's length after the lab converged.
pub const DURATION: Duration = Duration::from_secs(60);

/// The faults: the roll (every node stopped with SIGTERM and started again, one at a time,
/// over 5 to 25 s), then node 2 killed and restarted twice (at 32 s and 45 s).
pub fn faults() -> Vec<Fault> {
    let s = Duration::from_secs;
    vec![
        Fault {
            at: s(5),
            duration: s(20),
            kind: FaultKind::RollingUpdate,
        },
        Fault {
            at: s(32),
            duration: s(4),
            kind: FaultKind::Kill { node: 2 },
        },
        Fault {
            at: s(45),
            duration: s(4),
            kind: FaultKind::Kill { node: 2 },
        },
    ]
}

/// What a run found beside the checker's report.
#[derive(Debug)]
pub struct Outcome {
    /// The chaos report of the run.
    pub report: Report,
    /// Per node (`node1`...), the versions it started with, in order.
    pub started: BTreeMap<String, Vec<u8>>,
    /// Per node, the mesh versions its speakers logged moving to, in order.
    pub mesh_moves: BTreeMap<String, Vec<u8>>,
}

/// The wrapper script (see the module docs).
fn wrapper(real: &Path, dir: &Path) -> String {
    format!(
        r#"#!/bin/bash
# swimlb upgrade lab: runs {real} with the envelope version this start stands for.
dir={dir}
node=""
prev=""
for arg in "$@"; do
  if [ "$prev" = "--config" ]; then node=$(basename "$arg" .yaml); fi
  prev=$arg
done
if [ -z "$node" ]; then exec {real} "$@"; fi
n=$(( $(cat "$dir/$node.starts" 2>/dev/null || echo 0) + 1 ))
echo "$n" > "$dir/$node.starts"
read -r -a versions < "$dir/$node.versions"
i=$(( n <= ${{#versions[@]}} ? n - 1 : ${{#versions[@]}} - 1 ))
export SWIMLB_ENVELOPE_VERSION=${{versions[$i]}}
echo "$node $n $SWIMLB_ENVELOPE_VERSION" >> "$dir/starts.log"
exec {real} "$@" 2> >(tee -a "$dir/$node.log" >&2)
"#,
        real = shell_quote(&real.to_string_lossy()),
        dir = shell_quote(&dir.to_string_lossy()),
    )
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Writes the wrapper and the nodes' version lists into `dir`; returns the wrapper's path.
pub fn prepare(real: &Path, dir: &Path, starts: &[&[u8]]) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for (i, versions) in starts.iter().enumerate() {
        let list: Vec<String> = versions.iter().map(u8::to_string).collect();
        std::fs::write(
            dir.join(format!("node{}.versions", i + 1)),
            list.join(" ") + "\n",
        )?;
    }
    let path = dir.join("speaker-wrapper");
    std::fs::write(&path, wrapper(real, dir))?;
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
    Ok(path)
}

/// Runs the upgrade on `nodes` (3) nodes of the namespace lab with `real` as the speaker
/// program, keeping the wrapper, the starts and the speakers' logs in `dir`.
pub fn run(real: &Path, dir: &Path, progress: &mut dyn FnMut(&str)) -> Result<Outcome> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("clearing {}", dir.display()))?;
    }
    let program = prepare(real, dir, &STARTS)?;
    let options = Options {
        target: Target::Swimlb,
        duration: DURATION,
        seed: 0,
        nodes: STARTS.len(),
        until_violation: false,
        scheduled: false,
        injected: faults(),
        program,
    };
    let report = chaos::run(&options, progress)?;
    let starts = std::fs::read_to_string(dir.join("starts.log")).context("the starts log")?;
    let started = parse_starts(&starts)?;
    let mut mesh_moves = BTreeMap::new();
    for node in started.keys() {
        let log = std::fs::read_to_string(dir.join(format!("{node}.log"))).unwrap_or_default();
        mesh_moves.insert(node.clone(), parse_moves(&log));
    }
    Ok(Outcome {
        report,
        started,
        mesh_moves,
    })
}

/// The starts log's lines `node N VERSION`, per node in order.
pub fn parse_starts(text: &str) -> Result<BTreeMap<String, Vec<u8>>> {
    let mut started: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [node, _, version] = fields.as_slice() else {
            bail!("starts log line {line:?}");
        };
        let version = version
            .parse()
            .with_context(|| format!("version in {line:?}"))?;
        started.entry(node.to_string()).or_default().push(version);
    }
    Ok(started)
}

/// The versions a speaker's log says the mesh moved to (`the mesh's envelope version changed
/// ... to=N`), in order.
pub fn parse_moves(log: &str) -> Vec<u8> {
    log.lines()
        .filter(|l| l.contains("the mesh's envelope version changed"))
        .filter_map(|l| {
            let to = l.split_whitespace().find_map(|w| w.strip_prefix("to="))?;
            to.trim_matches(|c: char| !c.is_ascii_digit()).parse().ok()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_logs_are_read_back() {
        let starts = parse_starts("node1 1 2\nnode2 1 2\nnode1 2 3\n").unwrap();
        assert_eq!(starts["node1"], vec![2, 3]);
        assert_eq!(starts["node2"], vec![2]);
        assert!(parse_starts("node1 x\n").is_err());
        let log = "2026-01-01T00:00:00Z  INFO swimlb_speaker::gossip::wire_rule: the mesh's \
                   envelope version changed from=2 to=3 members=2\nother line to=9\n";
        assert_eq!(parse_moves(log), vec![3]);
    }

    #[test]
    fn the_wrapper_picks_one_version_per_start_and_repeats_the_last() {
        let dir =
            std::env::temp_dir().join(format!("swimlb-upgrade-wrapper-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        // The "speaker" prints the variable it was given.
        let real = dir.join("fake-speaker");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(&real, "#!/bin/sh\necho \"$SWIMLB_ENVELOPE_VERSION\"\n").unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o755)).unwrap();
        let wrapper = prepare(&real, &dir, &[&[2, 3]]).unwrap();
        let config = dir.join("node1.yaml");
        let mut seen = Vec::new();
        for _ in 0..3 {
            let out = std::process::Command::new(&wrapper)
                .args(["speaker", "standalone", "--config"])
                .arg(&config)
                .output()
                .unwrap();
            assert!(out.status.success(), "{out:?}");
            seen.push(String::from_utf8(out.stdout).unwrap().trim().to_string());
        }
        assert_eq!(seen, ["2", "3", "3"]);
        let started = parse_starts(&std::fs::read_to_string(dir.join("starts.log")).unwrap());
        assert_eq!(started.unwrap()["node1"], vec![2, 3, 3]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
