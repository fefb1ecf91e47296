//! `decide` throughput: ARP requests and neighbor solicitations for an owned address, and ARP for
//! an address not owned (the common case on a busy segment).
//!
//! `cargo bench -p swimlb-speaker --bench responder`

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use swimlb_proto::arp::{ArpOperation, ArpRepr};
use swimlb_proto::ethernet::{EtherType, EthernetRepr, MacAddr, ZERO};
use swimlb_proto::ndp::{self, NdpFrame, NdpMessage, NdpRepr};
use swimlb_speaker::net::responder::{Owned, decide};

const OURS: MacAddr = MacAddr(2, 0, 0, 0, 0, 1);
const THEIRS: MacAddr = MacAddr(2, 0, 0, 0, 0, 2);

fn arp_request(target: Ipv4Addr) -> Vec<u8> {
    let repr = ArpRepr {
        operation: ArpOperation::Request,
        sender_mac: THEIRS,
        sender_ip: Ipv4Addr::new(198, 51, 100, 2),
        target_mac: ZERO,
        target_ip: target,
    };
    let mut buf = vec![0u8; repr.frame_len()];
    repr.emit_frame(&mut buf)
        .expect("buffer sized by frame_len");
    buf
}

fn solicitation(target: Ipv6Addr) -> Vec<u8> {
    let f = NdpFrame {
        ethernet: EthernetRepr {
            dst: ndp::multicast_mac(ndp::solicited_node_multicast(target)),
            src: THEIRS,
            ethertype: EtherType::Ipv6,
        },
        ndp: NdpRepr {
            src_addr: Ipv6Addr::new(0x2001, 0xdb8, 0x100, 0, 0, 0, 0, 2),
            dst_addr: ndp::solicited_node_multicast(target),
            message: NdpMessage::NeighborSolicit {
                target,
                source_link_addr: Some(THEIRS),
            },
        },
    };
    let mut buf = vec![0u8; f.frame_len()];
    f.emit(&mut buf).expect("buffer sized by frame_len");
    buf
}

fn bench(c: &mut Criterion) {
    // 1,000 owned addresses of each family: lookups are a binary search.
    let owned = Owned::new(
        (0..1000u32)
            .map(|i| IpAddr::V4(Ipv4Addr::from(0xc633_6400 + i)))
            .chain(
                (0..1000u16)
                    .map(|i| IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0x100, 0, 0, 0, 1, i))),
            ),
    );
    let mut group = c.benchmark_group("decide");
    group.throughput(Throughput::Elements(1));
    let owned_arp = arp_request(Ipv4Addr::new(198, 51, 100, 100));
    group.bench_function("arp_request_owned", |b| {
        b.iter(|| decide(black_box(&owned_arp), OURS, &owned))
    });
    let other_arp = arp_request(Ipv4Addr::new(203, 0, 113, 9));
    group.bench_function("arp_request_not_owned", |b| {
        b.iter(|| decide(black_box(&other_arp), OURS, &owned))
    });
    let ns = solicitation(Ipv6Addr::new(0x2001, 0xdb8, 0x100, 0, 0, 0, 1, 7));
    group.bench_function("neighbor_solicitation_owned", |b| {
        b.iter(|| decide(black_box(&ns), OURS, &owned))
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
