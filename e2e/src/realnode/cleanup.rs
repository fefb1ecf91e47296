//! What a real node leaves on the machine, and its removal: the cgroup subtree of its Pods (in
//! every hierarchy), the mounts under its folder (the kubelet's volumes, containerd's root
//! filesystems and Pod network namespaces), and processes that outlive their parent (runc shims,
//! containers). Everything here is idempotent and bounded, and says what it could not remove.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};

/// How many rounds [`kill_cgroup_tree`] kills before it gives up.
const KILL_ROUNDS: usize = 50;

/// The mount points of every cgroup hierarchy (v1 and the cgroup2 one beside them).
pub fn cgroup_mounts() -> Vec<PathBuf> {
    mounts()
        .into_iter()
        .filter(|(_, fstype)| fstype == "cgroup" || fstype == "cgroup2")
        .map(|(point, _)| PathBuf::from(point))
        .collect()
}

/// (mount point, filesystem type) of every mount of this mount namespace, in mount order.
fn mounts() -> Vec<(String, String)> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            // `36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices`
            let (left, right) = line.split_once(" - ")?;
            let point = left.split_whitespace().nth(4)?;
            let fstype = right.split_whitespace().next()?;
            Some((unescape(point), fstype.to_string()))
        })
        .collect()
}

/// A mountinfo path with its octal escapes (`\040` for a space) decoded.
fn unescape(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    let mut rest = path;
    while let Some(i) = rest.find('\\') {
        out.push_str(&rest[..i]);
        let code = rest
            .get(i + 1..i + 4)
            .and_then(|o| u8::from_str_radix(o, 8).ok());
        match code {
            Some(byte) => {
                out.push(char::from(byte));
                rest = &rest[i + 4..];
            }
            None => {
                out.push('\\');
                rest = &rest[i + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// Makes cgroup `root` (`/swimlb-node-...`) in every v1 hierarchy, as the kubelet wants its
/// `cgroupRoot` to exist; cpuset's CPUs and memory nodes copied from the parent (a new v1
/// cpuset has none, and no process could join it).
pub fn make_cgroup_root(root: &str) -> Result<()> {
    for mount in cgroup_mounts() {
        let dir = mount.join(root.trim_start_matches('/'));
        std::fs::create_dir_all(&dir).with_context(|| format!("making {}", dir.display()))?;
        for file in ["cpuset.cpus", "cpuset.mems"] {
            let parent = mount.join(file);
            if let Ok(value) = std::fs::read_to_string(&parent)
                && std::fs::read_to_string(dir.join(file)).is_ok_and(|v| v.trim().is_empty())
            {
                std::fs::write(dir.join(file), value.trim())
                    .with_context(|| format!("writing {}", dir.join(file).display()))?;
            }
        }
    }
    Ok(())
}

/// Every process in cgroup `root` or below it, in any hierarchy.
pub fn cgroup_pids(root: &str) -> Vec<u32> {
    let mut pids = Vec::new();
    for mount in cgroup_mounts() {
        let mut stack = vec![mount.join(root.trim_start_matches('/'))];
        while let Some(dir) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(entry.path());
                }
            }
            let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
            pids.extend(procs.lines().filter_map(|p| p.trim().parse::<u32>().ok()));
        }
    }
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// SIGKILLs `pids` (those already gone are no error).
pub fn kill_pids(pids: &[u32]) {
    if pids.is_empty() {
        return;
    }
    let _ = Command::new("kill")
        .arg("-9")
        .args(pids.iter().map(u32::to_string))
        .stderr(std::process::Stdio::null())
        .status();
}

/// Kills every process in cgroup `root` until none is left (containers forked while it runs
/// are caught by the next round).
pub fn kill_cgroup_tree(root: &str) -> Result<()> {
    for _ in 0..KILL_ROUNDS {
        let pids = cgroup_pids(root);
        if pids.is_empty() {
            return Ok(());
        }
        kill_pids(&pids);
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!(
        "processes still in cgroup {root} after {KILL_ROUNDS} rounds: {:?}",
        cgroup_pids(root)
    )
}

/// Processes whose command line contains `needle` (a node's folder: the runc shims that
/// containerd started name its socket).
pub fn pids_with_argument(needle: &str) -> Vec<u32> {
    let me = std::process::id();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(needle))
        })
        .collect()
}

/// Removes cgroup `root` and everything below it, deepest first, in every hierarchy.
pub fn remove_cgroup_tree(root: &str) -> Result<()> {
    let mut left = Vec::new();
    for mount in cgroup_mounts() {
        let top = mount.join(root.trim_start_matches('/'));
        let mut dirs = Vec::new();
        let mut stack = vec![top];
        while let Some(dir) = stack.pop() {
            if let Ok(entries) = std::fs::read_dir(&dir) {
                for entry in entries.flatten() {
                    if entry.file_type().is_ok_and(|t| t.is_dir()) {
                        stack.push(entry.path());
                    }
                }
                dirs.push(dir);
            }
        }
        // Children were pushed after their parents: the reverse removes them first.
        for dir in dirs.iter().rev() {
            if let Err(e) = std::fs::remove_dir(dir) {
                left.push(format!("{}: {e}", dir.display()));
            }
        }
    }
    if !left.is_empty() {
        bail!("cgroups left behind: {}", left.join("; "));
    }
    Ok(())
}

/// Unmounts everything mounted under `dir`, the latest first (a lazy unmount when a plain one
/// fails: a mount still held by a dying process goes when it does).
pub fn unmount_under(dir: &Path) -> Result<()> {
    let prefix = format!("{}/", dir.display());
    let mut points: Vec<String> = mounts()
        .into_iter()
        .map(|(point, _)| point)
        .filter(|p| p.starts_with(&prefix) || *p == dir.display().to_string())
        .collect();
    points.reverse();
    let mut failed = Vec::new();
    for point in points {
        let plain = Command::new("umount").arg(&point).output();
        if plain.is_ok_and(|o| o.status.success()) {
            continue;
        }
        let lazy = Command::new("umount").args(["--lazy", &point]).output();
        if !lazy.is_ok_and(|o| o.status.success()) && is_mounted(&point) {
            failed.push(point);
        }
    }
    if !failed.is_empty() {
        bail!("could not unmount {}", failed.join(", "));
    }
    Ok(())
}

fn is_mounted(point: &str) -> bool {
    mounts().iter().any(|(p, _)| p == point)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_decode_to_the_path() {
        assert_eq!(unescape(r"/tmp/a\040b"), "/tmp/a b");
        assert_eq!(unescape(r"/plain"), "/plain");
        assert_eq!(unescape(r"/odd\x"), r"/odd\x");
    }

    #[test]
    fn this_machine_lists_its_cgroup_hierarchies() {
        // Every Linux machine the lab runs on mounts at least one.
        assert!(!cgroup_mounts().is_empty());
    }
}
