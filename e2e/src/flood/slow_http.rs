//! Slow HTTP clients at every node's listener (`failover --flood slow-http N`): from
//! [`SOURCES`] extra addresses of the client, `N` connections to each node's HTTP port, each
//! sends the start of a request head and then one byte a second, never the blank line that ends
//! it; a connection the listener closes is opened again a second later. Beside them a scraper
//! asks every node for `/status` and `/healthz` in a loop from the client's own address.
//!
//! The listener holds at most 8 connections from one address and 512 in all (80 addresses
//! can hold 640: the cap in all is met), and closes a head
//! unfinished after 5 s (`swimlb_proto::listener::Limits`), so most of them are refused and
//! counted; what it holds is bounded by its caps times its buffers. When the flood stops it
//! prints, per node: connections opened, scrapes answered and failed, the listener's counters
//! and the daemon's peak resident memory.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context as _, Result};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::lab::HTTP_PORT;
use crate::netns::Lab;
use crate::probe::spawn_in;

/// The client's extra addresses the slow connections come from: 198.51.100.120 to .199 (free
/// in the lab: nodes are .11 to .90, the few VIPs from .100, Kubernetes Pods from .201).
pub const SOURCES: u8 = 80;
const FIRST_SOURCE: u8 = 120;

fn source(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(
        198,
        51,
        100,
        FIRST_SOURCE + (i % usize::from(SOURCES)) as u8,
    )
}

/// What the scraper and the slow clients saw of one node.
#[derive(Debug, Default)]
struct NodeCounts {
    opened: AtomicU64,
    scrapes_ok: AtomicU64,
    scrapes_failed: AtomicU64,
    peak_rss_kib: AtomicU64,
}

/// Starts `per_node` slow connections to every node and the scraper, on a thread in the
/// client's namespace; `opened` counts every connection opened, all nodes together.
pub(super) fn start(
    lab: &Lab,
    per_node: u64,
    stop: Arc<AtomicBool>,
    opened: Arc<AtomicU64>,
) -> Result<std::thread::JoinHandle<()>> {
    let nodes: Vec<(String, String, SocketAddr)> = lab
        .nodes
        .iter()
        .map(|n| {
            (
                n.name.clone(),
                n.netns.clone(),
                SocketAddr::from((n.v4, HTTP_PORT)),
            )
        })
        .collect();
    let setup = || -> Result<_> {
        for i in 0..usize::from(SOURCES) {
            let out = std::process::Command::new("ip")
                .args([
                    "addr",
                    "replace",
                    &format!("{}/32", source(i)),
                    "dev",
                    "eth0",
                ])
                .output()
                .context("ip addr")?;
            anyhow::ensure!(
                out.status.success(),
                "ip addr replace {}: {}",
                source(i),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?)
    };
    spawn_in(&lab.client_netns, "slow-http", setup, move |runtime| {
        let counts: Vec<Arc<NodeCounts>> = nodes.iter().map(|_| Arc::default()).collect();
        runtime.block_on(run(&nodes, per_node, &stop, &counts));
        for i in 0..usize::from(SOURCES) {
            let _ = std::process::Command::new("ip")
                .args(["addr", "del", &format!("{}/32", source(i)), "dev", "eth0"])
                .output();
        }
        let total = counts
            .iter()
            .map(|c| c.opened.load(Ordering::Relaxed))
            .sum();
        opened.store(total, Ordering::Relaxed);
        let metrics: Vec<Option<String>> = nodes
            .iter()
            .map(|(_, _, addr)| crate::lab::http_get(*addr, "/metrics"))
            .collect();
        for (((name, _, _), c), text) in nodes.iter().zip(&counts).zip(metrics) {
            eprintln!("{}", summary(name, c, text.as_deref()));
        }
    })
}

/// The slow clients, the scraper and the memory sampler, until `stop`.
async fn run(
    nodes: &[(String, String, SocketAddr)],
    per_node: u64,
    stop: &Arc<AtomicBool>,
    counts: &[Arc<NodeCounts>],
) {
    let mut tasks = tokio::task::JoinSet::new();
    for ((_, ns, addr), c) in nodes.iter().zip(counts) {
        for k in 0..per_node as usize {
            tasks.spawn(slow_client(*addr, source(k), stop.clone(), c.clone()));
        }
        tasks.spawn(scraper(*addr, stop.clone(), c.clone()));
        tasks.spawn(rss_sampler(ns.clone(), stop.clone(), c.clone()));
    }
    while tasks.join_next().await.is_some() {}
}

async fn slow_client(addr: SocketAddr, from: Ipv4Addr, stop: Arc<AtomicBool>, c: Arc<NodeCounts>) {
    while !stop.load(Ordering::Relaxed) {
        if let Ok(socket) = tokio::net::TcpSocket::new_v4()
            && socket.bind((from, 0).into()).is_ok()
            && let Ok(Ok(mut s)) =
                tokio::time::timeout(Duration::from_secs(1), socket.connect(addr)).await
        {
            c.opened.fetch_add(1, Ordering::Relaxed);
            let mut open = s
                .write_all(b"GET /status HTTP/1.1\r\nhost: lab\r\nx-slow: ")
                .await
                .is_ok();
            while open && !stop.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_secs(1)).await;
                open = s.write_all(b"a").await.is_ok();
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// `GET /status` then `GET /healthz`, ten times a second, each a connection of its own.
async fn scraper(addr: SocketAddr, stop: Arc<AtomicBool>, c: Arc<NodeCounts>) {
    while !stop.load(Ordering::Relaxed) {
        for path in ["/status", "/healthz"] {
            let counter = if get_ok(addr, path).await {
                &c.scrapes_ok
            } else {
                &c.scrapes_failed
            };
            counter.fetch_add(1, Ordering::Relaxed);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn get_ok(addr: SocketAddr, path: &str) -> bool {
    let exchange = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nhost: lab\r\nconnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .ok()?;
        let mut answer = Vec::new();
        s.read_to_end(&mut answer).await.ok()?;
        Some(answer.starts_with(b"HTTP/1.1 200"))
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(2), exchange).await,
        Ok(Some(true))
    )
}

/// Samples, every 200 ms, the resident memory of the swimlb daemon in `ns` (the process whose
/// network namespace it is and whose name starts with `swimlb`).
async fn rss_sampler(ns: String, stop: Arc<AtomicBool>, c: Arc<NodeCounts>) {
    while !stop.load(Ordering::Relaxed) {
        if let Some(kib) = daemon_rss_kib(&ns) {
            c.peak_rss_kib.fetch_max(kib, Ordering::Relaxed);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn daemon_rss_kib(ns: &str) -> Option<u64> {
    use std::os::unix::fs::MetadataExt as _;
    let inode = std::fs::metadata(format!("/run/netns/{ns}")).ok()?.ino();
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter(|e| {
            std::fs::metadata(e.path().join("ns/net")).is_ok_and(|m| m.ino() == inode)
                && std::fs::read_to_string(e.path().join("comm"))
                    .is_ok_and(|comm| comm.starts_with("swimlb"))
        })
        .filter_map(|e| {
            let status = std::fs::read_to_string(e.path().join("status")).ok()?;
            status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .max()
}

/// One node's line: its counts, and its listener's counters from `metrics`.
fn summary(name: &str, c: &NodeCounts, metrics: Option<&str>) -> String {
    let dropped: Vec<String> = metrics
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.strip_prefix("swimlb_http_connections_dropped_total{reason=\""))
        .filter_map(|l| l.split_once("\"} "))
        .map(|(reason, n)| format!("{reason} {n}"))
        .collect();
    format!(
        "slow-http {name}: {} slow connections opened; /status and /healthz answered {}, failed {}; \
         listener dropped: {}; peak VmRSS {:.1} MiB",
        c.opened.load(Ordering::Relaxed),
        c.scrapes_ok.load(Ordering::Relaxed),
        c.scrapes_failed.load(Ordering::Relaxed),
        if dropped.is_empty() {
            "(no /metrics)".to_string()
        } else {
            dropped.join(", ")
        },
        c.peak_rss_kib.load(Ordering::Relaxed) as f64 / 1024.0
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netns;

    #[test]
    fn the_sources_are_free_lab_addresses() {
        let all: Vec<Ipv4Addr> = (0..usize::from(SOURCES)).map(source).collect();
        assert_eq!(all.first(), Some(&Ipv4Addr::new(198, 51, 100, 120)));
        assert_eq!(all.last(), Some(&Ipv4Addr::new(198, 51, 100, 199)));
        assert_eq!(source(usize::from(SOURCES)), all[0], "they wrap around");
        let last_node = netns::MAX_NODES as u8 + 10;
        // The real nodes' Pods: a /24 of their own.
        let (pods, bits) = crate::realnode::POD_RANGE.split_once('/').unwrap();
        let pods: Ipv4Addr = pods.parse().unwrap();
        assert_eq!(bits, "24");
        for a in &all {
            assert!(a.octets()[3] > last_node && *a != netns::CLIENT_V4);
            assert_ne!(a.octets()[..3], pods.octets()[..3], "{a} is a Pod's");
        }
    }

    #[test]
    fn the_summary_reads_the_listeners_counters() {
        let c = NodeCounts::default();
        c.opened.store(3000, Ordering::Relaxed);
        let text = "swimlb_http_connections_dropped_total{reason=\"client_limit\"} 2600\n\
                    swimlb_http_connections_dropped_total{reason=\"header_timeout\"} 400\n";
        let line = summary("node1", &c, Some(text));
        assert!(line.contains("3000 slow connections"), "{line}");
        assert!(
            line.contains("client_limit 2600, header_timeout 400"),
            "{line}"
        );
    }
}
