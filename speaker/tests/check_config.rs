//! `swimlb-speaker check-config` as an operator runs it: exit status and output.

use std::process::Command;

/// A file in a folder of its own, removed with it when dropped (the tests run side by side).
struct TempFile {
    dir: std::path::PathBuf,
    path: std::path::PathBuf,
}

impl std::ops::Deref for TempFile {
    type Target = std::path::Path;
    fn deref(&self) -> &std::path::Path {
        &self.path
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn write_temp(name: &str, text: &str) -> TempFile {
    let dir =
        std::env::temp_dir().join(format!("swimlb-check-config-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    TempFile { dir, path }
}

fn check_config(path: &std::path::Path) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_swimlb-speaker"))
        .arg("check-config")
        .arg(path)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

#[test]
fn an_invalid_file_exits_64_and_lists_every_error() {
    let path = write_temp(
        "bad.yaml",
        "cluster: edge-1\nbind: 192.0.2.10:7946\ninsecure: true\ngroups:\n  - name: api\n    addresses: [192.0.2.100/24]\n    checks:\n      - {name: lb, tcp: 'localhost:9443', interval: 1, fall: 0}\n",
    );
    let (code, stdout, stderr) = check_config(&path);
    assert_eq!(code, Some(64), "{stderr}");
    assert!(stdout.is_empty(), "{stdout}");
    assert!(
        stderr.contains("groups[0].addresses[0]: `192.0.2.100/24`"),
        "{stderr}"
    );
    assert!(
        stderr.contains("groups[0].checks[0].interval: `1` has no unit"),
        "{stderr}"
    );
    assert!(
        stderr.contains("groups[0].checks[0].fall: 0 is out of range"),
        "{stderr}"
    );
    assert!(stderr.contains("3 error(s)"), "{stderr}");
}

#[test]
fn a_valid_file_prints_detection_times() {
    let keys = write_temp("keys", "");
    swimlb_config::keyfile::write_key_file(
        &keys,
        &format!("{}\n", swimlb_config::keyfile::encode_key(&[7; 32])),
    )
    .unwrap();
    let path = write_temp(
        "good.yaml",
        &format!(
            "cluster: edge-1\nbind: 192.0.2.10:7946\nkeyFile: {}\ngroups:\n  - name: api\n    addresses: [192.0.2.100]\n    checks:\n      - {{name: lb, tcp: 'localhost:9443', interval: 1s, timeout: 500ms, fall: 3}}\n",
            keys.display()
        ),
    );
    let (code, stdout, stderr) = check_config(&path);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stdout.contains("detects a failure in at most 3.5s"),
        "{stdout}"
    );
    // No peers: one member; the default (fast) profile.
    assert!(
        stdout.contains("expected failover (estimate): on a node failure at most 110ms by the owner watch (the gossip alone: about 330ms (80ms until probed + 80ms probe + 150ms suspicion + 20ms gossip round, fast profile, 1 member(s))); on a failing check about 3.52s (3.5s + 20ms gossip round)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("owner watch: on, heartbeat every 20ms, silent after 5 missed; finds a crashed owner silent in at most 110ms"),
        "{stdout}"
    );
    assert!(
        stdout.contains(
            "the measured figures are in the book's Benchmarks page (docs/src/benchmarks.md)"
        ),
        "{stdout}"
    );
}

#[test]
fn gossip_overrides_the_daemon_would_refuse_are_an_error() {
    let path = write_temp(
        "badtiming.yaml",
        "cluster: edge-1\nbind: 192.0.2.10:7946\ninsecure: true\ngossip: {probePeriod: 100ms, probeRtt: 200ms}\ngroups: [{name: a, addresses: [192.0.2.100]}]\n",
    );
    let (code, stdout, stderr) = check_config(&path);
    assert_eq!(code, Some(64), "{stdout}");
    assert!(
        stderr.contains("probe_rtt (200ms) must be below"),
        "{stderr}"
    );
}

#[test]
fn an_owner_watch_too_fast_and_too_forgiving_is_refused_with_both_values() {
    let path = write_temp(
        "badwatch.yaml",
        "cluster: edge-1\nbind: 192.0.2.10:7946\ninsecure: true\ngossip: {ownerWatchInterval: 5ms, ownerWatchMisses: 2}\ngroups: [{name: a, addresses: [192.0.2.100]}]\n",
    );
    let (code, stdout, stderr) = check_config(&path);
    assert_eq!(code, Some(64), "{stdout}");
    assert!(
        stderr.contains("owner watch interval 5ms is shorter than the minimum of 10ms"),
        "{stderr}"
    );
    assert!(
        stderr.contains("owner watch misses 2 is fewer than the minimum of 3"),
        "{stderr}"
    );
}

#[test]
fn an_unreadable_key_file_is_an_error() {
    let path = write_temp(
        "nokey.yaml",
        "cluster: edge-1\nbind: 192.0.2.10:7946\nkeyFile: /nonexistent/swimlb/keys\ngroups: [{name: a, addresses: [192.0.2.100]}]\n",
    );
    let (code, _, stderr) = check_config(&path);
    assert_eq!(code, Some(64));
    assert!(
        stderr.contains("keyFile /nonexistent/swimlb/keys"),
        "{stderr}"
    );
}

#[test]
fn an_exec_check_in_a_directory_others_may_write_is_an_error_with_the_path_and_mode() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = std::env::temp_dir().join(format!("swimlb-check-config-exec-{}", std::process::id()));
    let scripts = dir.join("scripts");
    std::fs::create_dir_all(&scripts).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let script = scripts.join("check.sh");
    std::fs::write(&script, "#!/bin/sh\nexit 0\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = dir.join("speaker.yaml");
    std::fs::write(
        &path,
        format!(
            "cluster: edge-1\nbind: 192.0.2.10:7946\ninsecure: true\ngroups:\n  - name: api\n    addresses: [192.0.2.100]\n    checks:\n      - {{name: lb, tcp: 'localhost:9443'}}\n      - {{name: script, exec: [{}, --quick]}}\n",
            script.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&scripts, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (code, _, stderr) = check_config(&path);
    assert_eq!(code, Some(0), "a safe directory passes: {stderr}");
    std::fs::set_permissions(&scripts, std::fs::Permissions::from_mode(0o777)).unwrap();
    let (code, _, stderr) = check_config(&path);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(code, Some(64), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "groups[0].checks[1].exec: {}: {} is writable by every user (mode 0777)",
            script.display(),
            scripts.display()
        )),
        "{stderr}"
    );
}

#[test]
fn keygen_prints_a_key_the_key_file_parser_accepts() {
    let out = Command::new(env!("CARGO_BIN_EXE_swimlb-speaker"))
        .arg("keygen")
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let keys = swimlb_config::keyfile::parse_key_file(&text).unwrap();
    assert_eq!(keys.len(), 1);
    assert_ne!(keys[0], [0u8; 32]);
}

/// One file per mistake in `tests/check_config/`, each naming on its first line
/// (`# error: ...`) the one error `check-config` must report; `valid.yaml`, which each of them
/// departs from by one change, passes. A checkout gives the key files in `keys/` the mode of
/// the umask: they are made `0600` first, but `keys/readable`, made `0644`.
#[test]
fn every_mistake_in_the_table_is_named_exactly() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/check_config");
    for entry in std::fs::read_dir(dir.join("keys")).unwrap() {
        let path = entry.unwrap().path();
        let mode = if path.ends_with("readable") {
            0o644
        } else {
            0o600
        };
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() > 30, "the table lost its files: {files:?}");
    let mut failures = Vec::new();
    for path in &files {
        let name = path.file_name().unwrap().to_str().unwrap();
        let text = std::fs::read_to_string(path).unwrap();
        let expected = text
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("# error: "));
        let out = Command::new(env!("CARGO_BIN_EXE_swimlb-speaker"))
            .current_dir(&dir)
            .args(["check-config", name])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let prefix = format!("{name}: ");
        let named: Vec<&str> = stderr
            .lines()
            .filter_map(|l| l.strip_prefix(&prefix))
            .collect();
        let ok = match expected {
            None => out.status.code() == Some(0) && named.is_empty(),
            Some(error) => out.status.code() == Some(64) && named == [error, "1 error(s)"],
        };
        if !ok {
            failures.push(format!(
                "{name}: exit {:?}, expected {expected:?}, got:\n{stderr}",
                out.status.code()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
