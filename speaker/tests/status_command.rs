//! `swimlb-speaker status` as a user runs it: the real binary against a real HTTP listener
//! (the speaker's own, serving a fixed `/status`) on 127.0.0.1, and against a port where nothing
//! listens. Every wait is bounded.

use std::collections::BTreeMap;
use std::io::Read as _;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::registry::Registry;
use swimlb_speaker::serve::http::{AddressStatus, MemberStatus, Status};
use tokio::sync::watch;
use tokio::time::Instant;

fn speaker() -> Command {
    Command::new(env!("CARGO_BIN_EXE_swimlb-speaker"))
}

fn status() -> Status {
    let ip: std::net::IpAddr = "198.51.100.100".parse().unwrap();
    Status {
        node: "node1".into(),
        ready: true,
        draining: false,
        members: BTreeMap::from([(
            "node2".to_string(),
            MemberStatus {
                node: "node2".into(),
                settled: true,
                draining: false,
            },
        )]),
        addresses: BTreeMap::from([(
            ip,
            AddressStatus {
                ip,
                group: "api".into(),
                owner: Some("node2".into()),
                verdict: swimlb_speaker::model::election::VerdictKind::NotOwner,
                interfaces: None,
                owner_since: None,
            },
        )]),
        checks: vec![],
    }
}

/// A listener serving `status()`, on a runtime of its own thread.
fn listener() -> (SocketAddr, tokio::runtime::Runtime) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (addr, _task) = runtime.block_on(async {
        let (tx, rx) = watch::channel(status());
        // The listener reads the channel for as long as the runtime lives.
        std::mem::forget(tx);
        swimlb_speaker::serve::http::spawn(
            "127.0.0.1:0".parse().unwrap(),
            rx,
            Arc::new(Registry::default()),
            swimlb_speaker::serve::http::ListenerMetrics::default(),
        )
        .await
        .unwrap()
    });
    (addr, runtime)
}

#[test]
fn status_prints_the_vip_its_owner_and_the_members_of_a_running_speaker() {
    let (addr, _runtime) = listener();
    let out = speaker()
        .args(["status", &addr.to_string()])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    let vip = stdout
        .lines()
        .find(|l| l.starts_with("198.51.100.100"))
        .unwrap_or_else(|| panic!("a row for the VIP:\n{stdout}"));
    let cells: Vec<&str> = vip.split_whitespace().collect();
    assert_eq!(
        cells,
        ["198.51.100.100", "api", "node2", "-", "not_owner", "-"]
    );
    assert!(stdout.contains("node2    alive   yes"), "{stdout}");
    assert!(stdout.contains("node1   ready"), "{stdout}");
}

#[test]
fn status_says_which_address_it_cannot_reach_and_exits_69() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap();
    let out = speaker()
        .args(["status", &closed.to_string()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(69), "{out:?}");
    assert!(
        stderr.contains(&format!("cannot reach the speaker at {closed}")),
        "{stderr}"
    );
    assert!(out.stdout.is_empty(), "{out:?}");
    let out = speaker().args(["status", "host:port"]).output().unwrap();
    assert_eq!(out.status.code(), Some(64), "{out:?}");
}

#[test]
fn status_watch_redraws_every_second_until_stopped() {
    let (addr, _runtime) = listener();
    let mut child = speaker()
        .args(["status", "--watch", &addr.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let text = Arc::new(Mutex::new(String::new()));
    let reader = {
        let text = text.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = stdout.read(&mut buf) {
                text.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        })
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    while frames_in(&text.lock().unwrap()) < 2 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    // SIGINT, as Ctrl-C sends: the command stops cleanly.
    let _ = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status();
    let exit = child.wait().unwrap();
    reader.join().unwrap();
    let text = text.lock().unwrap().clone();
    assert!(frames_in(&text) >= 2, "two frames within 15 s:\n{text}");
    assert_eq!(text.matches("198.51.100.100").count(), frames_in(&text));
    // Not a terminal: frames follow each other, no escape codes.
    assert!(!text.contains('\x1b'), "{text:?}");
    assert!(exit.success(), "{exit:?}");
}

fn frames_in(text: &str) -> usize {
    text.matches("Every 1s: ").count()
}
