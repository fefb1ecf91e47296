//! How long the allocator takes to assign 10,000 Services from a /16 (target: at most 50 ms),
//! and to load 10,000 existing assignments at start.
//!
//! Run: `cargo bench -p swimlb-controller --bench allocator`. Prints numbers; never fails on time.

use std::hint::black_box;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use swimlb_config::crd::IPAddressPool;
use swimlb_config::pools::validate;
use swimlb_config::service::{Protocol, ServiceKey, ServicePort, ServiceView};
use swimlb_controller::allocator::{Allocator, Verdict};

const SERVICES: usize = 10_000;

fn model() -> swimlb_config::pools::Model {
    let p = IPAddressPool::with_addresses("swimlb-system", "big", &["10.20.0.0/16"]);
    match validate(&[p], &[]).into_result() {
        Ok(m) => m,
        Err(e) => panic!("benchmark pool is invalid: {e:?}"),
    }
}

fn services() -> Vec<ServiceView> {
    (0..SERVICES)
        .map(|i| ServiceView {
            key: ServiceKey::new(format!("ns{}", i % 50), format!("svc{i}")),
            is_load_balancer: true,
            ports: vec![ServicePort {
                port: 80,
                protocol: Protocol::Tcp,
            }],
            ..Default::default()
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let model = model();
    let services = services();
    let mut group = c.benchmark_group("allocator");
    group.sample_size(20);
    group.bench_function("assign_10k_services_from_a_slash16", |b| {
        b.iter_batched(
            || {
                let mut a = Allocator::new(None, &model);
                a.load_existing(&[]);
                a
            },
            |mut a| {
                for s in &services {
                    let v = a.assign(s);
                    debug_assert!(matches!(v, Verdict::Assigned { .. }));
                    black_box(&v);
                }
                a
            },
            BatchSize::LargeInput,
        )
    });
    let mut assigned = Allocator::new(None, &model);
    assigned.load_existing(&[]);
    let with_status: Vec<ServiceView> = services
        .iter()
        .map(|s| {
            let mut s = s.clone();
            if let Verdict::Assigned { ips, .. } = assigned.assign(&s) {
                s.status_ips = ips;
            }
            s
        })
        .collect();
    group.bench_function("load_existing_10k_services", |b| {
        b.iter_batched(
            || Allocator::new(None, &model),
            |mut a| {
                black_box(a.load_existing(&with_status));
                a
            },
            BatchSize::LargeInput,
        )
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
