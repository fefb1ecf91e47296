//! Two network namespaces joined by a veth pair, for the speaker's root-only tests.
//!
//! Namespace A holds the code under test (a thread that entered it with `setns`; threads it
//! spawns stay there), namespace B the client. Addresses are 198.51.100.1/24 and
//! 2001:db8:100::1/64 in A, .2 in B; names carry a tag and the process id; the namespaces are
//! deleted by a guard, also when an assertion fails. Each test binary uses a part of it; every
//! test that does is marked `#[ignore = "needs root: ..."]`, and [`require_root`] fails it, saying
//! why, when it runs without root anyway.
#![allow(dead_code)]

use std::future::Future;
use std::net::IpAddr;
use std::process::{Command, Output};

/// Panics unless this process runs as root (see the module doc).
pub fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "needs root (euid 0) to make network namespaces; run it as root \
         (sudo ./test.sh runs every root test with --include-ignored)"
    );
}

pub fn ip(s: &str) -> IpAddr {
    s.parse().expect("test address")
}

pub fn run(args: &[&str]) -> Output {
    Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {args:?}: {e}"))
}

pub fn must(args: &[&str]) -> String {
    let out = run(args);
    assert!(
        out.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Two namespaces and a veth pair between them; deleted on drop.
pub struct Lab {
    /// Namespace A.
    pub a: String,
    /// Namespace B.
    pub b: String,
    /// The veth end in A.
    pub veth_a: String,
    /// The veth end in B.
    pub veth_b: String,
}

impl Lab {
    pub fn new(tag: char) -> Self {
        let pid = std::process::id();
        let lab = Lab {
            a: format!("swlb-{tag}a-{pid}"),
            b: format!("swlb-{tag}b-{pid}"),
            veth_a: format!("v{tag}a{pid}"),
            veth_b: format!("v{tag}b{pid}"),
        };
        // The guard exists before the first command, so a failure below still cleans up.
        let (a, b, va, vb) = (&lab.a, &lab.b, &lab.veth_a, &lab.veth_b);
        must(&["ip", "netns", "add", a]);
        must(&["ip", "netns", "add", b]);
        must(&[
            "ip", "-n", a, "link", "add", va, "type", "veth", "peer", "name", vb, "netns", b,
        ]);
        for (ns, dev, v4, v6) in [
            (a, va, "198.51.100.1/24", "2001:db8:100::1/64"),
            (b, vb, "198.51.100.2/24", "2001:db8:100::2/64"),
        ] {
            must(&["ip", "-n", ns, "link", "set", "lo", "up"]);
            must(&["ip", "-n", ns, "addr", "add", v4, "dev", dev]);
            must(&["ip", "-n", ns, "addr", "add", v6, "dev", dev, "nodad"]);
            must(&["ip", "-n", ns, "link", "set", dev, "up"]);
        }
        lab
    }

    /// Whether the kernel knows the `dummy` link type (some VM kernels are built without it).
    pub fn kernel_has_dummy(&self) -> bool {
        let probe = run(&[
            "ip",
            "-n",
            &self.a,
            "link",
            "add",
            "swlprobe0",
            "type",
            "dummy",
        ]);
        if probe.status.success() {
            must(&["ip", "-n", &self.a, "link", "del", "swlprobe0"]);
        }
        probe.status.success()
    }

    /// Runs `body` on a thread inside namespace A, on a current-thread tokio runtime.
    pub fn run_in_a<T, F, Fut>(&self, body: F) -> T
    where
        T: Send + 'static,
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = T>,
    {
        let path = format!("/run/netns/{}", self.a);
        let thread = std::thread::spawn(move || {
            let ns = std::fs::File::open(&path).unwrap_or_else(|e| panic!("open {path}: {e}"));
            nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)
                .unwrap_or_else(|e| panic!("setns {path}: {e}"));
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("tokio runtime")
                .block_on(body())
        });
        match thread.join() {
            Ok(value) => value,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        // Deleting a namespace deletes the veth end in it, and with it the peer.
        let _ = run(&["ip", "netns", "del", &self.a]);
        let _ = run(&["ip", "netns", "del", &self.b]);
    }
}

/// Probes from namespace B whether anything answers ARP for `target` on the veth.
pub fn arp_answered(b: &str, veth_b: &str, target: &str) -> bool {
    let _ = run(&["ip", "-n", b, "neigh", "flush", "dev", veth_b]);
    run(&[
        "ip", "netns", "exec", b, "arping", "-c", "1", "-w", "1", "-I", veth_b, target,
    ])
    .status
    .success()
}
