//! Benchmarks of the receive fast paths: ARP request parse, neighbor solicitation parse, and the
//! gossip envelope's seal and open of a 1,400-byte datagram.
//!
//! `cargo bench -p swimlb-proto` (add `-- --measurement-time 2 --warm-up-time 1` for a short
//! run). Targets from the issue: at least 10 million ARP parses per second on one core, envelope
//! seal and open above 1 GB/s. The benchmark prints figures; it never fails on them.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use swimlb_proto::{Frame, KeyRing, envelope, golden};

const DATAGRAM_LEN: usize = 1400;
/// [`KeyRing::seal`] seals envelope version 2 (no receiver named), whose overhead is smaller.
const PAYLOAD_LEN: usize = DATAGRAM_LEN - envelope::OVERHEAD_V2;

fn frames(c: &mut Criterion) {
    let mut group = c.benchmark_group("frame");
    group.throughput(Throughput::Elements(1));
    group.bench_function("arp_request_parse", |b| {
        b.iter(|| Frame::parse(black_box(&golden::ARP_REQUEST)))
    });
    group.bench_function("neighbor_solicit_parse", |b| {
        b.iter(|| Frame::parse(black_box(&golden::NS_MULTICAST)))
    });
    group.finish();
}

fn envelope(c: &mut Criterion) {
    let ring = KeyRing::new("edge-1", &[[0x11; 32]]).expect("valid ring");
    let payload = vec![0x5au8; PAYLOAD_LEN];
    let mut group = c.benchmark_group("envelope_1400_bytes");
    group.throughput(Throughput::Bytes(DATAGRAM_LEN as u64));
    let mut out = Vec::with_capacity(DATAGRAM_LEN);
    group.bench_function("seal", |b| {
        b.iter(|| {
            out.clear();
            ring.seal(black_box(&payload), &mut out).expect("seal");
        })
    });
    let mut sealed = Vec::new();
    ring.seal(&payload, &mut sealed).expect("seal");
    assert_eq!(sealed.len(), DATAGRAM_LEN);
    let mut buf = sealed.clone();
    // Opening decrypts in place, so each iteration first restores the sealed bytes (a 1,400-byte
    // copy, included in the figure).
    group.bench_function("open", |b| {
        b.iter(|| {
            buf.copy_from_slice(&sealed);
            ring.open(black_box(&mut buf))
                .map(|p| p.len())
                .expect("open")
        })
    });
    group.finish();
}

criterion_group!(benches, frames, envelope);
criterion_main!(benches);
