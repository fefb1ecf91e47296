//! Election over 10,000 IPs and 1,000 members (the targets: full computation at most
//! 500 ms, incremental recomputation after one member dies at most 5 ms, state at most 50 MB),
//! and the whole engine's answer to one membership change at that size (issue 12: at most 5 ms,
//! status deltas included).
//!
//! Run: `cargo bench -p swimlb-speaker --bench election`. Before criterion runs, it prints the
//! memory of the election state (counted from its structures, and as the growth of VmRSS) and
//! the on-CPU time of a one-thread full election (unaffected by other load on the machine).
//! Numbers only: nothing here fails on a timing.

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use criterion::{BatchSize, Criterion, criterion_group};
use swimlb_speaker::model::announcer::Schedule;
use swimlb_speaker::model::election::{Election, elect_with_threads, order_hash};
use swimlb_speaker::model::engine::{Engine, Input, Start};
use swimlb_speaker::model::links::{Link, MAIN_TABLE, Route};
use swimlb_speaker::model::membership::{LiveChange, LiveSet, MemberMeta};
use swimlb_speaker::model::snapshot::{ServedIp, Snapshot};

const IPS: u32 = 10_000;
const MEMBERS: usize = 1_000;

fn node(i: usize) -> String {
    format!("node-{i:04}")
}

/// 1,000 settled members, no groups: every one is a candidate for every IP (the worst case for
/// hashing, as for Kubernetes Services with no node selector).
fn live_set() -> LiveSet {
    let mut live = LiveSet::new();
    for i in 0..MEMBERS {
        let mut meta = MemberMeta::new(node(i));
        meta.settled = true;
        live.upsert(meta);
    }
    live
}

/// 10,000 IPs, half IPv4 from the benchmarking range 198.18.0.0/15, half IPv6 from 2001:db8::/32.
fn snapshot() -> Snapshot {
    let mut snapshot = Snapshot::new();
    for n in 0..IPS {
        let ip = if n.is_multiple_of(2) {
            let v = n / 2;
            IpAddr::V4(Ipv4Addr::new(198, 18, (v >> 8) as u8, (v & 0xff) as u8))
        } else {
            IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, n as u16))
        };
        snapshot
            .insert(ip, ServedIp::service("ns", &format!("svc-{n}")))
            .expect("distinct IPs");
    }
    snapshot
}

/// The first IP of [`snapshot`].
fn election_ip() -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(198, 18, 0, 0))
}

fn vm_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Nanoseconds this thread has spent on a CPU (first field of /proc/thread-self/schedstat): a
/// figure that, unlike wall time, does not grow when other processes share the cores.
fn thread_cpu_ns() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    stat.split_whitespace().next()?.parse().ok()
}

fn report_cpu_time() {
    let live = live_set();
    let snapshot = snapshot();
    for round in 1..=3 {
        let wall = tokio::time::Instant::now();
        let cpu = thread_cpu_ns();
        let outcomes = elect_with_threads(&snapshot, &live, 1);
        let cpu = thread_cpu_ns()
            .zip(cpu)
            .map(|(after, before)| after - before);
        println!(
            "full election on one thread, round {round}: wall {:.0} ms, on-CPU {} ({} IPs)",
            wall.elapsed().as_secs_f64() * 1e3,
            cpu.map_or("unavailable".to_string(), |ns| format!(
                "{:.0} ms",
                ns as f64 / 1e6
            )),
            outcomes.len()
        );
    }
    // schedstat advances at scheduler ticks, so time 100 rounds of clone + apply and subtract
    // 100 clones.
    let election = Election::new(node(0), snapshot, &live);
    let victim = election
        .owner(&election_ip())
        .unwrap_or_default()
        .to_string();
    let mut without = live.clone();
    without.remove(&victim);
    let cpu = thread_cpu_ns();
    for _ in 0..100 {
        black_box(election.clone());
    }
    let clones = thread_cpu_ns()
        .zip(cpu)
        .map(|(after, before)| after - before);
    let mut moved = 0;
    let cpu = thread_cpu_ns();
    for _ in 0..100 {
        let mut copy = election.clone();
        moved = copy
            .apply_live(&without, &LiveChange::Down(victim.clone()))
            .len();
        black_box(copy);
    }
    let both = thread_cpu_ns()
        .zip(cpu)
        .map(|(after, before)| after - before);
    if let (Some(clones), Some(both)) = (clones, both) {
        println!(
            "incremental after {victim} dies: on-CPU {:.2} ms per change, {moved} IPs moved",
            both.saturating_sub(clones) as f64 / 1e8
        );
    }
    let names: Vec<String> = (0..MEMBERS).map(node).collect();
    let cpu = thread_cpu_ns();
    for ip in 0..100 {
        let text = format!("2001:db8::{ip:x}");
        for name in &names {
            black_box(order_hash(name, &text));
        }
    }
    if let Some(ns) = thread_cpu_ns()
        .zip(cpu)
        .map(|(after, before)| after - before)
    {
        println!(
            "order_hash: {:.1} ns on-CPU per hash (100,000 hashes)",
            ns as f64 / 1e5
        );
    }
}

fn report_memory() {
    let before = vm_rss_kib();
    let live = live_set();
    let election = Election::new(node(0), snapshot(), &live);
    let after = vm_rss_kib();
    let counted = election.approximate_bytes();
    println!(
        "election state ({IPS} IPs, {MEMBERS} members): counted {:.2} MB; VmRSS growth for \
         LiveSet + snapshot + election: {}",
        counted as f64 / 1e6,
        match (before, after) {
            (Some(b), Some(a)) => format!("{:.2} MB", a.saturating_sub(b) as f64 / 1024.0),
            _ => "unavailable".to_string(),
        }
    );
    let owners = election
        .outcomes()
        .values()
        .filter(|o| o.owner().is_some())
        .count();
    println!("owned IPs: {owners}");
}

fn benches(c: &mut Criterion) {
    let live = live_set();
    let snapshot = snapshot();
    let names: Vec<String> = (0..MEMBERS).map(node).collect();
    c.bench_function("order_hash_x1000", |b| {
        b.iter(|| {
            for name in &names {
                black_box(order_hash(black_box(name), black_box("2001:db8::1f40")));
            }
        })
    });

    let mut group = c.benchmark_group("election_10k_ips_1k_members");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(8));

    group.bench_function("full_one_thread", |b| {
        b.iter(|| elect_with_threads(black_box(&snapshot), black_box(&live), 1))
    });

    group.bench_function("full", |b| {
        b.iter(|| Election::new(node(0), black_box(snapshot.clone()), black_box(&live)))
    });

    let election = Election::new(node(0), snapshot.clone(), &live);
    // The member owning the most IPs dies: the worst single death.
    let mut counts = std::collections::BTreeMap::<String, usize>::new();
    for outcome in election.outcomes().values() {
        if let Some(owner) = outcome.owner() {
            *counts.entry(owner.to_string()).or_default() += 1;
        }
    }
    let victim = counts
        .iter()
        .max_by_key(|(_, n)| **n)
        .map(|(n, _)| n.clone())
        .unwrap_or_else(|| node(0));
    let mut without = live.clone();
    let victim_meta = without.remove(&victim);
    println!(
        "victim {victim} owns {} IPs",
        counts.get(&victim).copied().unwrap_or(0)
    );

    group.sample_size(50);
    group.measurement_time(Duration::from_secs(5));
    group.bench_function("incremental_member_down", |b| {
        b.iter_batched(
            || election.clone(),
            |mut election| {
                let changes = election.apply_live(&without, &LiveChange::Down(victim.clone()));
                black_box(changes);
                election
            },
            BatchSize::LargeInput,
        )
    });

    if let Some(mut meta) = victim_meta {
        // The same member rejoining, settled (the costly case: it ties every owner's tier, so it is
        // hashed for every IP).
        let mut down = election.clone();
        down.apply_live(&without, &LiveChange::Down(victim.clone()));
        let mut back = without.clone();
        meta.version += 1;
        back.upsert(meta);
        group.bench_function("incremental_member_up", |b| {
            b.iter_batched(
                || down.clone(),
                |mut election| {
                    let changes = election.apply_live(&back, &LiveChange::Up(victim.clone()));
                    black_box(changes);
                    election
                },
                BatchSize::LargeInput,
            )
        });
    }
    group.finish();
    if measuring() {
        engine_benches(c, &live, &snapshot, &victim);
    }
}

/// One link, `eth0`, with connected routes to every IP of [`snapshot`].
fn net() -> (Vec<Link>, Vec<Route>) {
    let link = Link::ethernet(2, "eth0", [2, 0, 0, 0, 0, 1]);
    let route = |dst: IpAddr, prefix_len| Route {
        dst,
        prefix_len,
        ifindex: 2,
        gateway: None,
        table: MAIN_TABLE,
        metric: 0,
    };
    let routes = vec![
        route(IpAddr::V4(Ipv4Addr::new(198, 18, 0, 0)), 15),
        route(
            IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0)),
            64,
        ),
    ];
    (vec![link], routes)
}

/// The engine's whole answer to `victim` going down and coming back: election, answered set,
/// announcements and status deltas. The local node is the one that takes most of the victim's
/// IPs (the busiest case for the drivers).
fn engine_benches(c: &mut Criterion, live: &LiveSet, snapshot: &Snapshot, victim: &str) {
    let (links, routes) = net();
    let start = |node: String| Start {
        node,
        schedule: Schedule::default(),
        snapshot: snapshot.clone(),
        live: live.clone(),
        links: links.clone(),
        routes: routes.clone(),
        hold: false,
    };
    let now = tokio::time::Instant::now();
    let (probe, _) = Engine::new(now, start(node(0)));
    let mut without = live.clone();
    let record = without.remove(victim);
    let successor = Election::new(node(0), snapshot.clone(), &without)
        .outcomes()
        .iter()
        .filter(|(ip, _)| probe.election().owner(ip) == Some(victim))
        .filter_map(|(_, o)| o.owner().map(str::to_string))
        .next()
        .unwrap_or_else(|| node(0));
    let (engine, _) = Engine::new(now, start(successor.clone()));
    let down = Input::Member {
        node: victim.to_string(),
        record: None,
        joined: false,
    };
    let mut after = engine.clone();
    let actions = after.handle(now, down.clone());
    println!(
        "engine on {successor}: {victim} down -> {} actions",
        actions.len()
    );
    let mut group = c.benchmark_group("engine_10k_ips_1k_members");
    group.sample_size(50);
    group.measurement_time(Duration::from_secs(5));
    group.bench_function("member_down", |b| {
        b.iter_batched(
            || engine.clone(),
            |mut engine| {
                black_box(engine.handle(now, down.clone()));
                engine
            },
            BatchSize::LargeInput,
        )
    });
    if let Some(mut meta) = record {
        meta.version += 1;
        let up = Input::Member {
            node: victim.to_string(),
            record: Some(meta),
            joined: true,
        };
        group.bench_function("member_up", |b| {
            b.iter_batched(
                || after.clone(),
                |mut engine| {
                    black_box(engine.handle(now, up.clone()));
                    engine
                },
                BatchSize::LargeInput,
            )
        });
    }
    group.finish();
}

criterion_group!(election, benches);

/// `cargo test --benches` runs this without `--bench`: criterion then runs each benchmark once as
/// a smoke test, and the minutes of unoptimised full elections below are skipped.
fn measuring() -> bool {
    std::env::args().any(|a| a == "--bench")
}

fn main() {
    if !measuring() {
        println!("not measuring (run `cargo bench`): the reports are skipped");
        election();
        return;
    }
    report_memory();
    report_cpu_time();
    println!(
        "available parallelism: {:?}; load average: {}",
        std::thread::available_parallelism().map(usize::from),
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    election();
    Criterion::default().configure_from_args().final_summary();
}
