//! `/metrics` of a speaker that announces 10,000 IPs (issue 14's target: rendered in under 50 ms
//! and under 5 MB): every IP has its `swimlb_announced` and `swimlb_owner` series, set through
//! the status board as the engine's status deltas set them, with the process and gossip families
//! a speaker registers beside them. Prints the body's size once per format.
//!
//! `cargo bench -p swimlb-speaker --bench metrics`

use std::hint::black_box;
use std::net::{IpAddr, Ipv6Addr};

use criterion::{Criterion, criterion_group, criterion_main};
use prometheus_client::registry::Registry;
use swimlb_speaker::gossip::GossipMetrics;
use swimlb_speaker::model::engine::AddressView;
use swimlb_speaker::model::snapshot::Owner;
use swimlb_speaker::serve::http::{Request, route};
use swimlb_speaker::serve::status::StatusBoard;

const IPS: u32 = 10_000;

fn speaker_registry() -> (Registry, StatusBoard) {
    let mut registry = Registry::default();
    let board = StatusBoard::new("node-1", &mut registry);
    let _gossip = GossipMetrics::register(&mut registry);
    let links = std::sync::Arc::new(std::collections::BTreeSet::from(["eth0".to_string()]));
    for i in 0..IPS {
        let ip = IpAddr::V6(Ipv6Addr::new(
            0x2001,
            0xdb8,
            0,
            0,
            0,
            0,
            (i >> 16) as u16,
            i as u16,
        ));
        let view = AddressView {
            belongs_to: Owner::service(&format!("namespace-{}", i % 100), &format!("service-{i}")),
            owner: Some("node-1".into()),
            verdict: swimlb_speaker::model::election::VerdictKind::Owner,
            links: Some(links.clone()),
        };
        board.address(ip, Some(&view));
    }
    (registry, board)
}

fn render(c: &mut Criterion) {
    let (registry, board) = speaker_registry();
    let status = board.current();
    for (name, accept) in [
        ("classic text", None),
        (
            "OpenMetrics",
            Some("application/openmetrics-text; version=1.0.0"),
        ),
    ] {
        let request = Request {
            accept,
            ..Request::get("/metrics")
        };
        let (_, _, body) = route(&request, &status, &registry);
        println!(
            "/metrics ({name}) with {IPS} announced IPs: {} bytes ({:.2} MB)",
            body.len(),
            body.len() as f64 / 1e6
        );
        c.bench_function(&format!("metrics/render 10k announced IPs, {name}"), |b| {
            b.iter(|| black_box(route(&request, &status, &registry)))
        });
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20);
    targets = render
}
criterion_main!(benches);
