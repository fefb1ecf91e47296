//! `swimlb-speaker check-config` as an operator runs it: exit status and output.

use std::process::Command;

fn write_temp(name: &str, text: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("swimlb-check-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
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
    let keys = write_temp(
        "keys",
        &format!("{}\n", swimlb_config::keyfile::encode_key(&[7; 32])),
    );
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
