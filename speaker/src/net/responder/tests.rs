use std::io;
use std::sync::mpsc;
use std::time::Duration;

use tokio::time::Instant;

use super::thread::passes_quarantine;
use super::*;

#[test]
fn a_pause_quarantines_until_the_owned_set_is_renewed_or_the_quarantine_ends() {
    let t0 = Instant::now();
    let mut fuse = PauseFuse::new(t0);
    // Ordinary turns, a few milliseconds apart, never trip it.
    for ms in (5..100).step_by(5) {
        assert!(!fuse.turn(t0 + Duration::from_millis(ms)));
        assert!(!fuse.quarantined(t0 + Duration::from_millis(ms)));
    }
    // A 2 s gap: quarantined from the first turn after it.
    let resumed = t0 + Duration::from_millis(2095);
    assert!(fuse.turn(resumed));
    assert!(fuse.quarantined(resumed));
    assert!(fuse.quarantined(resumed + QUARANTINE - Duration::from_millis(1)));
    // Renewed by the daemon: answering again at once.
    fuse.renewed();
    assert!(!fuse.quarantined(resumed + Duration::from_millis(10)));
    // Another pause, never renewed: the quarantine ends by itself.
    let again = resumed + Duration::from_secs(5);
    assert!(fuse.turn(again));
    assert!(fuse.quarantined(again + Duration::from_millis(1)));
    assert!(!fuse.quarantined(again + QUARANTINE));
    assert!(!fuse.quarantined(again + QUARANTINE + Duration::from_millis(1)));
}

/// An owner starved, taken over and refuting it re-announces inside its quarantine: the
/// announcement is held, not dropped, and goes out once the quarantine ends (renewed or run
/// out) for an IP still owned then, once; one no longer owned then is not announced.
#[test]
fn an_announcement_asked_during_a_quarantine_goes_out_when_it_ends() {
    let t0 = Instant::now();
    let mut fuse = PauseFuse::new(t0);
    let paused = t0 + Duration::from_millis(211);
    assert!(fuse.turn(paused));
    let both = Owned::new([IpAddr::V4(VIP), IpAddr::V4(OTHER)]);
    let mut deferred = Deferred::default();
    for _ in 0..3 {
        deferred.defer(IpAddr::V4(VIP), &both);
    }
    deferred.defer(IpAddr::V4(OTHER), &both);
    // Not owned when asked: never held.
    deferred.defer(IpAddr::V4(CLIENT), &both);
    let asked = paused + Duration::from_millis(25);
    assert!(deferred.due(fuse.quarantined(asked), &both).is_empty());
    // The quarantine runs out with the same set: both go out, each once.
    let over = paused + QUARANTINE;
    assert_eq!(
        deferred.due(fuse.quarantined(over), &both),
        vec![IpAddr::V4(VIP), IpAddr::V4(OTHER)]
    );
    assert!(deferred.due(false, &both).is_empty());
    // Another pause; renewed with OTHER gone meanwhile: only VIP goes out.
    let again = over + Duration::from_secs(1);
    assert!(fuse.turn(again));
    deferred.defer(IpAddr::V4(VIP), &both);
    deferred.defer(IpAddr::V4(OTHER), &both);
    assert!(deferred.due(fuse.quarantined(again), &both).is_empty());
    fuse.renewed();
    let renewed = Owned::new([IpAddr::V4(VIP)]);
    assert_eq!(
        deferred.due(
            fuse.quarantined(again + Duration::from_millis(30)),
            &renewed
        ),
        vec![IpAddr::V4(VIP)]
    );
}
use swimlb_proto::ethernet::{EtherType, EthernetRepr, ZERO};
use swimlb_proto::ndp::{NdpRepr, NeighborFlags};

const OURS: MacAddr = MacAddr(2, 0, 0, 0, 0, 1);
const THEIRS: MacAddr = MacAddr(2, 0, 0, 0, 0, 2);
const VIP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 100);
const OTHER: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 101);
const CLIENT: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 2);
const VIP6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x100, 0, 0, 0, 0, 0x100);
const CLIENT6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x100, 0, 0, 0, 0, 2);

fn owned() -> Owned {
    Owned::new([IpAddr::V4(VIP), IpAddr::V6(VIP6)])
}

fn arp(op: ArpOperation, dst: MacAddr, sender: (MacAddr, Ipv4Addr), target: Ipv4Addr) -> Vec<u8> {
    let repr = ArpRepr {
        operation: op,
        sender_mac: sender.0,
        sender_ip: sender.1,
        target_mac: ZERO,
        target_ip: target,
    };
    let mut buf = vec![0u8; repr.frame_len()];
    repr.emit_frame(&mut buf).unwrap();
    buf[..6].copy_from_slice(&[dst.0, dst.1, dst.2, dst.3, dst.4, dst.5]);
    buf
}

fn ns(src: Ipv6Addr, dst_mac: MacAddr, target: Ipv6Addr) -> Vec<u8> {
    let dst_addr = if dst_mac == OURS {
        target
    } else {
        ndp::solicited_node_multicast(target)
    };
    let f = NdpFrame {
        ethernet: EthernetRepr {
            dst: dst_mac,
            src: THEIRS,
            ethertype: EtherType::Ipv6,
        },
        ndp: NdpRepr {
            src_addr: src,
            dst_addr,
            message: NdpMessage::NeighborSolicit {
                target,
                source_link_addr: if src.is_unspecified() {
                    None
                } else {
                    Some(THEIRS)
                },
            },
        },
    };
    let mut buf = vec![0u8; f.frame_len()];
    f.emit(&mut buf).unwrap();
    buf
}

fn na(target: Ipv6Addr, mac: MacAddr) -> Vec<u8> {
    let mut f = NdpFrame::unsolicited_advert(mac, target);
    f.ndp.message = NdpMessage::NeighborAdvert {
        flags: NeighborFlags {
            router: false,
            solicited: false,
            override_: true,
        },
        target,
        target_link_addr: Some(mac),
    };
    let mut buf = vec![0u8; f.frame_len()];
    f.emit(&mut buf).unwrap();
    buf
}

#[test]
fn the_quarantine_after_a_pause_holds_back_replies_not_another_macs_claims() {
    use ArpOperation::Request as Req;
    let request = decide(&arp(Req, BROADCAST, (THEIRS, CLIENT), VIP), OURS, &owned());
    assert!(request.is_ok());
    assert!(
        !passes_quarantine(&request),
        "a request waits out the quarantine"
    );
    let claim = decide(&arp(Req, BROADCAST, (THEIRS, VIP), VIP), OURS, &owned());
    assert!(matches!(claim, Err(Drop::Conflict { .. })));
    assert!(passes_quarantine(&claim), "a claim reaches the daemon");
    let other = decide(
        &arp(Req, BROADCAST, (THEIRS, CLIENT), OTHER),
        OURS,
        &owned(),
    );
    assert!(!passes_quarantine(&other));
}

#[test]
fn arp_table() {
    use ArpOperation::{Reply as Rep, Request as Req};
    let snm = ndp::multicast_mac(ndp::solicited_node_multicast(VIP6));
    let table: Vec<(&str, Vec<u8>, Result<(), Drop>)> = vec![
        (
            "broadcast request for the VIP",
            arp(Req, BROADCAST, (THEIRS, CLIENT), VIP),
            Ok(()),
        ),
        (
            "unicast refresh to our MAC",
            arp(Req, OURS, (THEIRS, CLIENT), VIP),
            Ok(()),
        ),
        (
            "RFC 5227 probe from 0.0.0.0",
            arp(Req, BROADCAST, (THEIRS, Ipv4Addr::UNSPECIFIED), VIP),
            Ok(()),
        ),
        (
            "request for another address",
            arp(Req, BROADCAST, (THEIRS, CLIENT), OTHER),
            Err(Drop::NotOwned),
        ),
        (
            "unicast to another MAC",
            arp(Req, THEIRS, (THEIRS, CLIENT), VIP),
            Err(Drop::NotForUs),
        ),
        (
            "our own request",
            arp(Req, BROADCAST, (OURS, VIP), CLIENT),
            Err(Drop::FromUs),
        ),
        (
            "gratuitous ARP from another MAC",
            arp(Req, BROADCAST, (THEIRS, VIP), VIP),
            Err(Drop::Conflict {
                ip: IpAddr::V4(VIP),
                mac: THEIRS,
            }),
        ),
        (
            "reply from another MAC for the VIP",
            arp(Rep, OURS, (THEIRS, VIP), CLIENT),
            Err(Drop::Conflict {
                ip: IpAddr::V4(VIP),
                mac: THEIRS,
            }),
        ),
        (
            "reply about another address",
            arp(Rep, OURS, (THEIRS, CLIENT), OTHER),
            Err(Drop::NotARequest),
        ),
        (
            "multicast frame not ours",
            arp(Req, snm, (THEIRS, CLIENT), VIP),
            Err(Drop::NotForUs),
        ),
    ];
    for (name, frame, expected) in table {
        let got = decide(&frame, OURS, &owned());
        match (got, expected) {
            (Ok(Reply::Arp(r)), Ok(())) => {
                assert_eq!(r.operation, ArpOperation::Reply, "{name}");
                assert_eq!((r.sender_mac, r.sender_ip), (OURS, VIP), "{name}");
                assert_eq!(r.target_mac, THEIRS, "{name}");
            }
            (got, expected) => assert_eq!(got.map(|_| ()), expected, "{name}"),
        }
    }
}

#[test]
fn ndp_table() {
    let snm = ndp::multicast_mac(ndp::solicited_node_multicast(VIP6));
    let other6 = Ipv6Addr::new(0x2001, 0xdb8, 0x100, 0, 0, 0, 0, 0x101);
    let other_snm = ndp::multicast_mac(ndp::solicited_node_multicast(other6));
    // (case, frame, expected: Ok((reply's Ethernet destination, IPv6 destination, Solicited)))
    type Case<'a> = (&'a str, Vec<u8>, Result<(MacAddr, Ipv6Addr, bool), Drop>);
    let cases: Vec<Case<'_>> = vec![
        (
            "multicast solicitation",
            ns(CLIENT6, snm, VIP6),
            Ok((THEIRS, CLIENT6, true)),
        ),
        (
            "unicast solicitation to our MAC",
            ns(CLIENT6, OURS, VIP6),
            Ok((THEIRS, CLIENT6, true)),
        ),
        (
            "duplicate address detection from ::",
            ns(Ipv6Addr::UNSPECIFIED, snm, VIP6),
            Ok((MacAddr(0x33, 0x33, 0, 0, 0, 1), ndp::ALL_NODES, false)),
        ),
        (
            "solicitation for another address",
            ns(CLIENT6, other_snm, other6),
            Err(Drop::NotOwned),
        ),
        (
            "solicitation to another group",
            ns(CLIENT6, other_snm, VIP6),
            Err(Drop::NotForUs),
        ),
        (
            "advertisement from another MAC",
            na(VIP6, THEIRS),
            Err(Drop::Conflict {
                ip: IpAddr::V6(VIP6),
                mac: THEIRS,
            }),
        ),
        (
            "advertisement about another address",
            na(other6, THEIRS),
            Err(Drop::NotARequest),
        ),
    ];
    for (name, frame, expected) in cases {
        match (decide(&frame, OURS, &owned()), expected) {
            (Ok(Reply::Ndp(f)), Ok((dst_mac, dst_ip, solicited))) => {
                assert_eq!(f.ethernet.dst, dst_mac, "{name}");
                assert_eq!(f.ethernet.src, OURS, "{name}");
                assert_eq!(f.ndp.dst_addr, dst_ip, "{name}");
                let NdpMessage::NeighborAdvert {
                    flags,
                    target,
                    target_link_addr,
                } = f.ndp.message
                else {
                    panic!("{name}: not an advertisement");
                };
                assert_eq!((target, target_link_addr), (VIP6, Some(OURS)), "{name}");
                assert!(flags.override_, "{name}");
                assert_eq!(flags.solicited, solicited, "{name}");
            }
            (got, expected) => assert_eq!(got.map(|_| ()), expected.map(|_| ()), "{name}"),
        }
    }
}

#[test]
fn garbage_is_a_counted_drop() {
    assert_eq!(
        decide(&[], OURS, &owned()),
        Err(Drop::Malformed(WireError::Truncated))
    );
    let mut bad = arp(ArpOperation::Request, BROADCAST, (THEIRS, CLIENT), VIP);
    bad[14] = 9; // hardware type
    assert!(matches!(
        decide(&bad, OURS, &owned()),
        Err(Drop::Malformed(_))
    ));
    let mut ipv4 = vec![0u8; 60];
    ipv4[12..14].copy_from_slice(&[0x08, 0x00]);
    assert_eq!(
        decide(&ipv4, OURS, &owned()),
        Err(Drop::NotNeighborDiscovery)
    );
}

#[test]
fn nothing_is_answered_without_ownership() {
    let frame = arp(ArpOperation::Request, BROADCAST, (THEIRS, CLIENT), VIP);
    assert_eq!(decide(&frame, OURS, &Owned::default()), Err(Drop::NotOwned));
}

#[test]
fn announcements_are_gratuitous_arp_and_unsolicited_na() {
    let mut buf = [0u8; 128];
    let n = announcement(OURS, IpAddr::V4(VIP), &mut buf).unwrap();
    let Ok(Frame::Arp { ethernet, arp }) = Frame::parse(&buf[..n]) else {
        panic!("not ARP")
    };
    assert_eq!(ethernet.dst, BROADCAST);
    assert!(arp.is_gratuitous());
    assert_eq!(
        (arp.operation, arp.sender_mac, arp.target_ip),
        (ArpOperation::Request, OURS, VIP)
    );
    let n = announcement(OURS, IpAddr::V6(VIP6), &mut buf).unwrap();
    let Ok(Frame::Ndp(f)) = Frame::parse(&buf[..n]) else {
        panic!("not NDP")
    };
    assert_eq!(f.ndp.dst_addr, ndp::ALL_NODES);
}

/// The I/O loop over `pnet_datalink::dummy`: frames in, replies out, commands obeyed.
type Injected = mpsc::Sender<io::Result<Box<[u8]>>>;
type Conflicts = ConflictReceiver;

/// A responder on pnet's dummy channel: frames go in through the first handle, what it
/// sends comes out of the second. Its reads block until something is injected.
fn dummy_responder() -> (
    Responder,
    Injected,
    mpsc::Receiver<Box<[u8]>>,
    Conflicts,
    Metrics,
) {
    let iface = pnet_datalink::dummy::dummy_interface(0);
    let mut config = pnet_datalink::dummy::Config::default();
    let inject = config.inject_handle().unwrap();
    let wire = config.read_handle().unwrap();
    let Ok(pnet_datalink::Channel::Ethernet(tx, rx)) =
        pnet_datalink::dummy::channel(&iface, config)
    else {
        panic!("dummy channel");
    };
    let (conflict_tx, conflict_rx) = conflict_queue();
    let metrics = Metrics::default();
    let responder =
        Responder::spawn("test", OURS, tx, rx, None, metrics.clone(), conflict_tx).unwrap();
    (responder, inject, wire, conflict_rx, metrics)
}

fn dropped(metrics: &Metrics, reason: ConflictDropReason) -> u64 {
    metrics
        .conflicts_dropped
        .get_or_create(&ConflictDropLabels { reason })
        .get()
}

fn claim(i: usize) -> Conflict {
    Conflict {
        ip: IpAddr::V4(Ipv4Addr::from(0xc633_6400_u32 + i as u32)),
        mac: THEIRS,
    }
}

#[test]
fn a_flood_of_one_claim_takes_one_place_in_the_queue_until_the_daemon_takes_it() {
    let (tx, mut rx) = conflict_queue();
    let metrics = Metrics::default();
    for _ in 0..10_000 {
        report_conflict(&tx, &metrics, claim(0));
    }
    assert_eq!(dropped(&metrics, ConflictDropReason::already_queued), 9_999);
    assert_eq!(dropped(&metrics, ConflictDropReason::queue_full), 0);
    assert_eq!(rx.try_recv(), Ok(claim(0)));
    assert!(rx.try_recv().is_err());
    // Taken, the same claim is queued again; another MAC's claim of the address too.
    report_conflict(&tx, &metrics, claim(0));
    let other = Conflict {
        mac: MacAddr(2, 0, 0, 0, 0, 7),
        ..claim(0)
    };
    report_conflict(&tx, &metrics, other);
    assert_eq!(rx.try_recv(), Ok(claim(0)));
    assert_eq!(rx.try_recv(), Ok(other));
}

#[test]
fn a_flood_of_distinct_claims_fills_the_queue_to_its_bound_and_counts_the_rest_dropped() {
    let (tx, mut rx) = conflict_queue();
    let metrics = Metrics::default();
    let flood = 10 * CONFLICT_QUEUE;
    for i in 0..flood {
        report_conflict(&tx, &metrics, claim(i));
    }
    assert_eq!(
        dropped(&metrics, ConflictDropReason::queue_full),
        (flood - CONFLICT_QUEUE) as u64
    );
    let mut queued = 0;
    while rx.try_recv().is_ok() {
        queued += 1;
    }
    assert_eq!(queued, CONFLICT_QUEUE);
    assert!(
        lock(&rx.waiting).is_empty(),
        "every taken claim is forgotten"
    );
    // Drained, it takes claims again.
    report_conflict(&tx, &metrics, claim(flood));
    assert_eq!(rx.try_recv(), Ok(claim(flood)));
}

#[test]
fn io_loop_passes_a_claim_through_the_quarantine_and_holds_back_the_reply() {
    let (responder, inject, wire, mut conflict_rx, metrics) = dummy_responder();
    let frame = |f: Vec<u8>| inject.send(Ok(f.into_boxed_slice())).unwrap();
    responder.send(Control::SetOwned(owned()));
    responder.send(Control::Announce(IpAddr::V4(VIP)));
    let _ = inject.send(Err(io::Error::from(io::ErrorKind::TimedOut)));
    assert!(
        wire.recv_timeout(Duration::from_secs(5)).is_ok(),
        "announced"
    );
    // The loop blocks in its read with nothing injected: its next turn comes after a gap
    // longer than the fuse, as after a stop or a starved stretch.
    std::thread::sleep(PAUSE_FUSE * 3);
    frame(arp(ArpOperation::Request, BROADCAST, (THEIRS, CLIENT), VIP));
    frame(arp(ArpOperation::Request, BROADCAST, (THEIRS, VIP), VIP));
    let mut conflict = None;
    for _ in 0..200 {
        if let Ok(c) = conflict_rx.try_recv() {
            conflict = Some(c);
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let paused = metrics
        .dropped
        .get_or_create(&DropLabels {
            reason: DropReasonLabel::paused,
        })
        .get();
    let replied = wire.try_recv().is_ok();
    // Stopped before the assertions: a failing one would otherwise wait forever for the
    // loop, blocked in its read, to end.
    responder.send(Control::Stop);
    let _ = inject.send(Err(io::Error::from(io::ErrorKind::TimedOut)));
    responder.stop();
    assert_eq!(
        conflict,
        Some(Conflict {
            ip: IpAddr::V4(VIP),
            mac: THEIRS
        }),
        "the claim reaches the daemon"
    );
    assert_eq!(paused, 1, "the request waited out the quarantine");
    assert!(!replied, "no reply in the quarantine");
}

#[test]
fn io_loop_answers_only_while_owning() {
    let (responder, inject, wire, mut conflict_rx, metrics) = dummy_responder();
    // The dummy receiver blocks until something is injected: a timeout wakes the loop so it
    // reads the commands sent before it, as the real socket's read timeout does.
    // Once the thread has stopped, nobody is left to wake: a tick then goes nowhere.
    let tick = || {
        let _ = inject.send(Err(io::Error::from(io::ErrorKind::TimedOut)));
    };
    let frame = |f: Vec<u8>| inject.send(Ok(f.into_boxed_slice())).unwrap();
    let request = arp(ArpOperation::Request, BROADCAST, (THEIRS, CLIENT), VIP);
    let next_sent = || {
        Frame::parse(&wire.recv_timeout(Duration::from_secs(5)).unwrap())
            .map(|f| format!("{f:?}"))
            .unwrap()
    };
    // Commands and frames come on two channels, so the test never assumes their order:
    // commands are followed by an announcement, which the loop sends after every command
    // before it (a barrier), and a dropped frame is awaited on its counter.
    let barrier = || {
        responder.send(Control::Announce(IpAddr::V4(OTHER)));
        tick();
        let sent = next_sent();
        assert!(sent.contains("sender_ip: 198.51.100.101"), "{sent}");
    };
    let not_owned = || {
        metrics
            .dropped
            .get_or_create(&DropLabels {
                reason: DropReasonLabel::not_owned,
            })
            .get()
    };
    let await_dropped = |count: u64| {
        for _ in 0..500 {
            if not_owned() >= count {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(not_owned(), count);
    };

    // Not owning yet: the request is dropped.
    frame(request.clone());
    await_dropped(1);

    responder.send(Control::SetOwned(owned()));
    barrier();
    frame(request.clone());
    let reply = next_sent();
    assert!(
        reply.contains("operation: Reply") && reply.contains("sender_ip: 198.51.100.100"),
        "{reply}"
    );

    frame(arp(ArpOperation::Request, BROADCAST, (THEIRS, VIP), VIP));
    let conflict = conflict_rx.blocking_recv().unwrap();
    assert_eq!(
        conflict,
        Conflict {
            ip: IpAddr::V4(VIP),
            mac: THEIRS
        }
    );

    // Stopping is immediate: the next request is dropped, and nothing is sent for it.
    responder.send(Control::SetOwned(Owned::default()));
    barrier();
    frame(request);
    await_dropped(2);
    assert!(wire.try_recv().is_err(), "no reply once not owning");

    responder.send(Control::Stop);
    tick();
    responder.stop();
    assert_eq!(metrics.arp_replies.get(), 1);
    assert_eq!(metrics.gratuitous_sent.get(), 2);
    assert_eq!(metrics.conflicts.get(), 1);
}
