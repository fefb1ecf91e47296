//! Frames emitted by `swimlb-proto`, decoded by an independent implementation (Wireshark's
//! `tshark`): each must decode without a malformed-packet or expert note, with good checksums,
//! and with the same field values we meant to write.
//!
//! Needs `tshark` on `PATH` (Debian: `apt-get install tshark`). Without it the test FAILS, unless
//! `SWIMLB_SKIP_TSHARK=1` is set, in which case it says so and passes.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::process::Command;

use swimlb_proto::arp::{ArpOperation, ArpRepr};
use swimlb_proto::ethernet::{self, MacAddr};
use swimlb_proto::ndp::{self, NdpFrame, NdpMessage, NdpRepr};
use swimlb_proto::vrrp::{VrrpAddresses, VrrpFrame, VrrpRepr};

const A_MAC: MacAddr = MacAddr(2, 0, 0, 0, 0, 1);
const B_MAC: MacAddr = MacAddr(2, 0, 0, 0, 0, 2);
const A_IP4: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 10);
const B_IP4: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 20);
const A_IP6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1);
const B_IP6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 2);

const FIELDS: &[&str] = &[
    "eth.src",
    "eth.dst",
    "arp.opcode",
    "arp.src.hw_mac",
    "arp.src.proto_ipv4",
    "arp.dst.hw_mac",
    "arp.dst.proto_ipv4",
    "ipv6.src",
    "ipv6.dst",
    "ipv6.hlim",
    "icmpv6.type",
    "icmpv6.code",
    "icmpv6.checksum.status",
    "icmpv6.nd.ns.target_address",
    "icmpv6.nd.na.target_address",
    "icmpv6.nd.na.flag.r",
    "icmpv6.nd.na.flag.s",
    "icmpv6.nd.na.flag.o",
    "icmpv6.opt.src_linkaddr",
    "icmpv6.opt.target_linkaddr",
    "ip.src",
    "ip.dst",
    "ip.ttl",
    "ip.checksum.status",
    "vrrp.version",
    "vrrp.type",
    "vrrp.virt_rtr_id",
    "vrrp.prio",
    "vrrp.addr_count",
    "vrrp.short_adver_int",
    "vrrp.checksum.status",
    "vrrp.ip_addr",
    "vrrp.ipv6_addr",
    "_ws.malformed",
    "_ws.expert.message",
];

/// One emitted frame and the fields tshark must report for it (all others must be empty).
struct Case {
    name: &'static str,
    bytes: Vec<u8>,
    expect: Vec<(&'static str, String)>,
}

fn arp_case(name: &'static str, arp: ArpRepr) -> Case {
    let mut bytes = vec![0xa5; arp.frame_len()];
    arp.emit_frame(&mut bytes).unwrap();
    Case {
        name,
        bytes,
        expect: vec![
            ("eth.src", arp.sender_mac.to_string()),
            ("eth.dst", arp.ethernet_dst().to_string()),
            ("arp.opcode", arp.operation.code().to_string()),
            ("arp.src.hw_mac", arp.sender_mac.to_string()),
            ("arp.src.proto_ipv4", arp.sender_ip.to_string()),
            ("arp.dst.hw_mac", arp.target_mac.to_string()),
            ("arp.dst.proto_ipv4", arp.target_ip.to_string()),
        ],
    }
}

fn ndp_case(name: &'static str, frame: NdpFrame) -> Case {
    let mut bytes = vec![0xa5; frame.frame_len()];
    frame.emit(&mut bytes).unwrap();
    let NdpRepr {
        src_addr,
        dst_addr,
        message,
    } = frame.ndp;
    let mut expect = vec![
        ("eth.src", frame.ethernet.src.to_string()),
        ("eth.dst", frame.ethernet.dst.to_string()),
        ("ipv6.src", src_addr.to_string()),
        ("ipv6.dst", dst_addr.to_string()),
        ("ipv6.hlim", "255".to_string()),
        ("icmpv6.code", "0".to_string()),
        ("icmpv6.checksum.status", "1".to_string()),
    ];
    match message {
        NdpMessage::NeighborSolicit {
            target,
            source_link_addr,
        } => {
            expect.push(("icmpv6.type", "135".into()));
            expect.push(("icmpv6.nd.ns.target_address", target.to_string()));
            if let Some(mac) = source_link_addr {
                expect.push(("icmpv6.opt.src_linkaddr", mac.to_string()));
            }
        }
        NdpMessage::NeighborAdvert {
            flags,
            target,
            target_link_addr,
        } => {
            expect.push(("icmpv6.type", "136".into()));
            expect.push(("icmpv6.nd.na.target_address", target.to_string()));
            expect.push(("icmpv6.nd.na.flag.r", u8::from(flags.router).to_string()));
            expect.push(("icmpv6.nd.na.flag.s", u8::from(flags.solicited).to_string()));
            expect.push(("icmpv6.nd.na.flag.o", u8::from(flags.override_).to_string()));
            if let Some(mac) = target_link_addr {
                expect.push(("icmpv6.opt.target_linkaddr", mac.to_string()));
            }
        }
    }
    Case {
        name,
        bytes,
        expect,
    }
}

fn vrrp_case(name: &'static str, frame: VrrpFrame<'_>) -> Case {
    let mut bytes = vec![0xa5; frame.frame_len()];
    frame.emit(&mut bytes).unwrap();
    let v = frame.packet.vrrp;
    let addrs = v
        .addresses
        .iter()
        .map(|a| a.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let mut expect = vec![
        ("eth.src", frame.ethernet.src.to_string()),
        ("eth.dst", frame.ethernet.dst.to_string()),
        ("vrrp.version", "3".to_string()),
        ("vrrp.type", "1".to_string()),
        ("vrrp.virt_rtr_id", v.vrid.to_string()),
        ("vrrp.prio", v.priority.to_string()),
        ("vrrp.addr_count", v.addresses.len().to_string()),
        ("vrrp.short_adver_int", v.max_advert_interval.to_string()),
        ("vrrp.checksum.status", "1".to_string()),
    ];
    match (frame.packet.src_addr, frame.packet.dst_addr) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            expect.push(("ip.src", s.to_string()));
            expect.push(("ip.dst", d.to_string()));
            expect.push(("ip.ttl", "255".into()));
            expect.push(("ip.checksum.status", "1".into()));
            expect.push(("vrrp.ip_addr", addrs));
        }
        (s, d) => {
            expect.push(("ipv6.src", s.to_string()));
            expect.push(("ipv6.dst", d.to_string()));
            expect.push(("ipv6.hlim", "255".into()));
            expect.push(("vrrp.ipv6_addr", addrs));
        }
    }
    Case {
        name,
        bytes,
        expect,
    }
}

fn cases() -> Vec<Case> {
    let request = ArpRepr {
        operation: ArpOperation::Request,
        sender_mac: B_MAC,
        sender_ip: B_IP4,
        target_mac: ethernet::ZERO,
        target_ip: A_IP4,
    };
    let ns = NdpFrame {
        ethernet: ethernet::EthernetRepr {
            dst: ndp::multicast_mac(ndp::solicited_node_multicast(A_IP6)),
            src: B_MAC,
            ethertype: ethernet::EtherType::Ipv6,
        },
        ndp: NdpRepr {
            src_addr: B_IP6,
            dst_addr: ndp::solicited_node_multicast(A_IP6),
            message: NdpMessage::NeighborSolicit {
                target: A_IP6,
                source_link_addr: Some(B_MAC),
            },
        },
    };
    let mut dad = ns;
    dad.ndp.src_addr = Ipv6Addr::UNSPECIFIED;
    dad.ndp.message = NdpMessage::NeighborSolicit {
        target: A_IP6,
        source_link_addr: None,
    };
    static V4: [Ipv4Addr; 3] = [
        Ipv4Addr::new(192, 0, 2, 100),
        Ipv4Addr::new(198, 51, 100, 7),
        Ipv4Addr::new(203, 0, 113, 255),
    ];
    static V6: [Ipv6Addr; 2] = [
        Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0x42),
        Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 0x10),
    ];
    vec![
        arp_case("arp request", request),
        arp_case("arp reply", request.reply_to(A_MAC).unwrap()),
        arp_case(
            "gratuitous arp request",
            ArpRepr::gratuitous_request(A_MAC, A_IP4),
        ),
        arp_case(
            "gratuitous arp reply",
            ArpRepr::gratuitous_reply(A_MAC, A_IP4),
        ),
        ndp_case("multicast solicitation", ns),
        ndp_case("dad solicitation", dad),
        ndp_case("solicited advert", ns.reply_to(A_MAC).unwrap()),
        ndp_case("advert answering dad", dad.reply_to(A_MAC).unwrap()),
        ndp_case(
            "unsolicited advert",
            NdpFrame::unsolicited_advert(A_MAC, A_IP6),
        ),
        vrrp_case(
            "vrrp ipv4",
            VrrpFrame::advertisement(
                IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)),
                VrrpRepr {
                    vrid: 51,
                    priority: 255,
                    max_advert_interval: 4095,
                    addresses: VrrpAddresses::Ipv4(&V4),
                },
            ),
        ),
        vrrp_case(
            "vrrp ipv6",
            VrrpFrame::advertisement(
                IpAddr::V6(Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1)),
                VrrpRepr {
                    vrid: 1,
                    priority: 0,
                    max_advert_interval: 10,
                    addresses: VrrpAddresses::Ipv6(&V6),
                },
            ),
        ),
    ]
}

/// A classic pcap file (microsecond timestamps, link type Ethernet) holding `frames`.
fn pcap(frames: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
    out.extend_from_slice(&2u16.to_le_bytes());
    out.extend_from_slice(&4u16.to_le_bytes());
    out.extend_from_slice(&0i32.to_le_bytes()); // thiszone
    out.extend_from_slice(&0u32.to_le_bytes()); // sigfigs
    out.extend_from_slice(&65535u32.to_le_bytes()); // snaplen
    out.extend_from_slice(&1u32.to_le_bytes()); // LINKTYPE_ETHERNET
    for (i, f) in frames.iter().enumerate() {
        out.extend_from_slice(&(i as u32).to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&(f.len() as u32).to_le_bytes());
        out.extend_from_slice(&(f.len() as u32).to_le_bytes());
        out.extend_from_slice(f);
    }
    out
}

/// Wireshark 4.0 prints booleans as 1/0, later versions as True/False.
fn normalize(value: &str) -> String {
    match value {
        "True" => "1".into(),
        "False" => "0".into(),
        other => other.to_string(),
    }
}

#[test]
fn tshark_decodes_emitted_frames_with_the_same_fields() {
    if Command::new("tshark").arg("-v").output().is_err() {
        if std::env::var("SWIMLB_SKIP_TSHARK").as_deref() == Ok("1") {
            eprintln!(
                "tshark not found and SWIMLB_SKIP_TSHARK=1: independent decoder test skipped"
            );
            return;
        }
        panic!(
            "tshark not found on PATH: install it (apt-get install tshark) or set \
             SWIMLB_SKIP_TSHARK=1 to skip the independent decoder test"
        );
    }
    let cases = cases();
    let frames: Vec<&[u8]> = cases.iter().map(|c| c.bytes.as_slice()).collect();
    let path = std::env::temp_dir().join(format!(
        "swimlb-proto-independent-{}.pcap",
        std::process::id()
    ));
    std::fs::write(&path, pcap(&frames)).unwrap();
    let mut cmd = Command::new("tshark");
    cmd.arg("-r")
        .arg(&path)
        .args(["-o", "ip.check_checksum:TRUE", "-T", "fields"])
        .args([
            "-E",
            "separator=|",
            "-E",
            "occurrence=a",
            "-E",
            "aggregator=,",
        ]);
    for f in FIELDS {
        cmd.args(["-e", f]);
    }
    let output = cmd.output().expect("run tshark");
    let _ = std::fs::remove_file(&path);
    assert!(
        output.status.success(),
        "tshark failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8(output.stdout).unwrap();
    let rows: Vec<&str> = stdout.lines().collect();
    assert_eq!(rows.len(), cases.len(), "tshark output:\n{stdout}");
    for (case, row) in cases.iter().zip(rows) {
        let got: BTreeMap<&str, String> = FIELDS
            .iter()
            .copied()
            .zip(row.split('|').map(normalize))
            .filter(|(_, v)| !v.is_empty())
            .collect();
        let want: BTreeMap<&str, String> = case.expect.iter().cloned().collect();
        assert_eq!(got, want, "{}: tshark row {row}", case.name);
    }
}
