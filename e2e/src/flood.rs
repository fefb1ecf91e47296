//! Floods from the lab's client, paced at a fixed rate on a thread of their own (`soak
//! --flood-pps` and `failover --flood arp|gossip PPS`).
//!
//! - [`FloodKind::Frames`]: minimal IPv4/UDP frames to node1's MAC (not ARP: the speaker's
//!   kernel filter drops them before user space).
//! - [`FloodKind::Arp`]: broadcast ARP requests for the VIP, as a client (or a scanner) asking
//!   very often: every speaker sees them, the owner answers each.
//! - [`FloodKind::Gossip`]: forged datagrams at every node's gossip port, in turn: a wrong magic,
//!   an unknown key id, and the cluster's own key id with a tag that does not verify (the
//!   costliest: it takes an AES-GCM open to reject). Each is rejected and counted by reason.
//! - [`FloodKind::Claims`]: forged claims for the VIP, in turn a broadcast ARP reply and an
//!   unsolicited neighbor advertisement (Override set) for the IPv6 VIP, in which a MAC that
//!   is no node's says it has the address. Every speaker sees them; the owner's conflict queue
//!   holds each claim once (`swimlb_conflicts_dropped_total`).
//! - [`FloodKind::SlowHttp`]: not frames but `N` slow HTTP connections held at each node's
//!   listener, with a `/status` and `/healthz` scraper beside them ([`slow_http`]).
//!
//! The pacing sends in batches of 64 and sleeps at most 1 ms, so the rate holds on a busy core;
//! `sent` counts what the kernel accepted (for `slow-http`, the connections opened).

use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use swimlb_proto::envelope::{KEY_LEN, KeyId, MAGIC, VERSION};
use tokio::time::Instant;

use crate::netns::{self, Lab};
use crate::probe::spawn_in;

pub mod slow_http;

/// What a flood sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FloodKind {
    /// Non-ARP frames to node1.
    Frames,
    /// ARP requests for the VIP, broadcast.
    Arp,
    /// Forged gossip datagrams to every node's gossip port.
    Gossip,
    /// Forged ARP and NDP claims for the VIP from a MAC that is no node's.
    Claims,
    /// Slow HTTP connections at every node's listener (the rate: connections per node).
    SlowHttp,
}

impl FloodKind {
    /// The CLI's and the JSON's name.
    pub const fn as_str(&self) -> &'static str {
        match self {
            FloodKind::Frames => "frames",
            FloodKind::Arp => "arp",
            FloodKind::Gossip => "gossip",
            FloodKind::Claims => "claims",
            FloodKind::SlowHttp => "slow-http",
        }
    }

    /// The kinds `failover --flood` takes.
    pub const CHOICES: [FloodKind; 4] = [
        FloodKind::Arp,
        FloodKind::Gossip,
        FloodKind::Claims,
        FloodKind::SlowHttp,
    ];

    /// One of [`FloodKind::CHOICES`] by name (what `failover --flood` takes).
    pub fn parse(name: &str) -> Option<FloodKind> {
        FloodKind::CHOICES.into_iter().find(|k| k.as_str() == name)
    }
}

/// A running flood; stops when dropped.
#[derive(Debug)]
pub struct Flood {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Flood {
    /// Starts `kind` at `pps` from the lab's client. `key`: the cluster's gossip key (for the
    /// forged datagrams that carry its id).
    pub fn start(
        lab: &Lab,
        kind: FloodKind,
        pps: u64,
        key: Option<[u8; KEY_LEN]>,
    ) -> Result<Flood> {
        if pps == 0 {
            bail!("a flood needs a rate above 0");
        }
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let (flag, count) = (stop.clone(), sent.clone());
        let thread = match kind {
            FloodKind::Frames => {
                let frame = udp_frame(lab.node(1).mac);
                frames(&lab.client_netns, vec![frame], pps, flag, count)?
            }
            FloodKind::Arp => {
                let frame = arp_request(netns::vip_v4(0).octets());
                frames(&lab.client_netns, vec![frame], pps, flag, count)?
            }
            FloodKind::Claims => {
                let claims = vec![
                    forged_arp_claim(netns::vip_v4(0).octets()),
                    forged_nd_claim(netns::vip_v6(0)),
                ];
                frames(&lab.client_netns, claims, pps, flag, count)?
            }
            FloodKind::SlowHttp => slow_http::start(lab, pps, flag, count)?,
            FloodKind::Gossip => {
                let key = key.context("the gossip flood needs the cluster's key")?;
                let targets: Vec<SocketAddr> = lab
                    .nodes
                    .iter()
                    .map(|n| SocketAddr::from((n.v4, crate::lab::GOSSIP_PORT)))
                    .collect();
                let setup = || Ok(UdpSocket::bind("0.0.0.0:0")?);
                let forged = forged_datagrams(&key);
                spawn_in(&lab.client_netns, "flood", setup, move |socket| {
                    let mut i = 0usize;
                    paced(pps, &flag, &count, || {
                        i += 1;
                        socket
                            .send_to(&forged[i % forged.len()], targets[i % targets.len()])
                            .is_ok()
                    });
                })?
            }
        };
        Ok(Flood {
            stop,
            sent,
            thread: Some(thread),
        })
    }

    /// Stops the flood; what was sent.
    pub fn stop(mut self) -> u64 {
        self.halt();
        self.sent.load(Ordering::Relaxed)
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        self.halt();
    }
}

/// Calls `send` `pps` times a second until `stop`; counts the sends that succeeded.
fn paced(pps: u64, stop: &AtomicBool, sent: &AtomicU64, mut send: impl FnMut() -> bool) {
    let start = Instant::now();
    let mut n: u64 = 0;
    while !stop.load(Ordering::Relaxed) {
        let due = start + Duration::from_secs_f64(n as f64 / pps as f64);
        let now = Instant::now();
        if now < due {
            std::thread::sleep((due - now).min(Duration::from_millis(1)));
            continue;
        }
        for _ in 0..64 {
            if send() {
                sent.fetch_add(1, Ordering::Relaxed);
            }
            n += 1;
        }
    }
}

/// Sends `frames` in turn from `netns`'s `eth0`.
fn frames(
    netns: &str,
    frames: Vec<Vec<u8>>,
    pps: u64,
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
) -> Result<std::thread::JoinHandle<()>> {
    let setup = || -> Result<_> {
        let iface = pnet_datalink::interfaces()
            .into_iter()
            .find(|i| i.name == "eth0")
            .context("no eth0")?;
        let config = pnet_datalink::Config {
            promiscuous: false,
            ..Default::default()
        };
        match pnet_datalink::channel(&iface, config)? {
            pnet_datalink::Channel::Ethernet(tx, _rx) => Ok(tx),
            _ => bail!("not an Ethernet channel"),
        }
    };
    spawn_in(netns, "flood", setup, move |mut tx| {
        let mut i = 0usize;
        paced(pps, &stop, &sent, || {
            i += 1;
            tx.send_to(&frames[i % frames.len()], None)
                .is_some_and(|r| r.is_ok())
        });
    })
}

const CLIENT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0xfe];

/// A minimal IPv4/UDP frame from the client to node1 (at `dst_mac`), port 9 (discard).
fn udp_frame(dst_mac: [u8; 6]) -> Vec<u8> {
    let mut frame = vec![0u8; 60];
    frame[..6].copy_from_slice(&dst_mac);
    frame[6..12].copy_from_slice(&CLIENT_MAC);
    frame[12..14].copy_from_slice(&[0x08, 0x00]);
    frame[14] = 0x45;
    frame[16..18].copy_from_slice(&46u16.to_be_bytes());
    frame[22] = 64;
    frame[23] = 17;
    frame[26..30].copy_from_slice(&netns::CLIENT_V4.octets());
    frame[30..34].copy_from_slice(&[198, 51, 100, 11]);
    frame[36..38].copy_from_slice(&9u16.to_be_bytes());
    frame[38..40].copy_from_slice(&26u16.to_be_bytes());
    frame
}

/// A broadcast ARP request from the client for `target`.
fn arp_request(target: [u8; 4]) -> Vec<u8> {
    let mut frame = vec![0u8; 60];
    frame[..6].copy_from_slice(&[0xff; 6]);
    frame[6..12].copy_from_slice(&CLIENT_MAC);
    frame[12..14].copy_from_slice(&[0x08, 0x06]);
    frame[14..16].copy_from_slice(&1u16.to_be_bytes()); // Ethernet
    frame[16..18].copy_from_slice(&0x0800u16.to_be_bytes()); // IPv4
    frame[18] = 6;
    frame[19] = 4;
    frame[20..22].copy_from_slice(&1u16.to_be_bytes()); // request
    frame[22..28].copy_from_slice(&CLIENT_MAC);
    frame[28..32].copy_from_slice(&netns::CLIENT_V4.octets());
    frame[38..42].copy_from_slice(&target);
    frame
}

/// The MAC the forged claims come from (locally administered, no node's).
const FORGER_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x99];

/// A broadcast ARP reply in which [`FORGER_MAC`] says it has `vip`.
fn forged_arp_claim(vip: [u8; 4]) -> Vec<u8> {
    let mut frame = vec![0u8; 60];
    frame[..6].copy_from_slice(&[0xff; 6]);
    frame[6..12].copy_from_slice(&FORGER_MAC);
    frame[12..14].copy_from_slice(&[0x08, 0x06]);
    frame[14..22].copy_from_slice(&[0, 1, 0x08, 0, 6, 4, 0, 2]); // Ethernet, IPv4, reply
    frame[22..28].copy_from_slice(&FORGER_MAC);
    frame[28..32].copy_from_slice(&vip);
    frame[32..38].copy_from_slice(&[0xff; 6]);
    frame[38..42].copy_from_slice(&vip);
    frame
}

/// An unsolicited neighbor advertisement (Override set, to all nodes) in which [`FORGER_MAC`]
/// says it has `vip`.
fn forged_nd_claim(vip: std::net::Ipv6Addr) -> Vec<u8> {
    let [a, b, c, d, e, f] = FORGER_MAC;
    let frame = swimlb_proto::ndp::NdpFrame::unsolicited_advert(
        swimlb_proto::ethernet::MacAddr(a, b, c, d, e, f),
        vip,
    );
    let mut out = vec![0u8; frame.frame_len()];
    frame
        .emit(&mut out)
        .expect("a buffer of the frame's length");
    out
}

/// Three forged datagrams of 100 bytes: a wrong magic, an unknown key id, and `key`'s id with a
/// tag that does not verify.
fn forged_datagrams(key: &[u8; KEY_LEN]) -> Vec<Vec<u8>> {
    let datagram = |magic: [u8; 4], key_id: [u8; 4], fill: u8| {
        let mut d = vec![fill; 100];
        d[..4].copy_from_slice(&magic);
        d[4] = VERSION;
        d[5..9].copy_from_slice(&key_id);
        d
    };
    vec![
        datagram(*b"xxxx", KeyId::of(key).0, 0x11),
        datagram(MAGIC, [0xde, 0xad, 0xbe, 0xef], 0x22),
        datagram(MAGIC, KeyId::of(key).0, 0x33),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use swimlb_proto::{Frame, KeyRing};

    #[test]
    fn the_arp_flood_is_a_request_for_the_vip_our_parser_reads() {
        let frame = arp_request([198, 51, 100, 100]);
        match Frame::parse(&frame) {
            Ok(Frame::Arp { arp, .. }) => {
                assert_eq!(arp.target_ip, netns::vip_v4(0));
                assert_eq!(arp.sender_ip, netns::CLIENT_V4);
                assert!(!arp.is_gratuitous());
            }
            other => panic!("not an ARP request: {other:?}"),
        }
    }

    #[test]
    fn the_claims_are_an_arp_reply_and_an_override_advert_from_the_forger() {
        match Frame::parse(&forged_arp_claim(netns::vip_v4(0).octets())) {
            Ok(Frame::Arp { arp, .. }) => {
                assert_eq!(arp.sender_ip, netns::vip_v4(0));
                let [a, b, c, d, e, f] = FORGER_MAC;
                assert_eq!(
                    arp.sender_mac,
                    swimlb_proto::ethernet::MacAddr(a, b, c, d, e, f)
                );
                assert!(arp.is_gratuitous());
            }
            other => panic!("not an ARP claim: {other:?}"),
        }
        let nd = swimlb_proto::ndp::NdpFrame::parse(&forged_nd_claim(netns::vip_v6(0)))
            .expect("a valid advertisement");
        match nd.ndp.message {
            swimlb_proto::ndp::NdpMessage::NeighborAdvert { flags, target, .. } => {
                assert_eq!(target, netns::vip_v6(0));
                assert!(flags.override_);
            }
            other => panic!("not an advertisement: {other:?}"),
        }
        for k in FloodKind::CHOICES {
            assert_eq!(FloodKind::parse(k.as_str()), Some(k));
        }
    }

    #[test]
    fn each_forged_datagram_is_rejected_for_its_own_reason() {
        let key = [7u8; KEY_LEN];
        let ring = KeyRing::new("lab", &[key]).unwrap();
        let reasons: Vec<String> = forged_datagrams(&key)
            .iter()
            .map(|d| format!("{:?}", ring.open(&mut d.clone()).unwrap_err()))
            .collect();
        assert_eq!(reasons.len(), 3);
        let all = reasons.join(" ").to_lowercase();
        for needle in ["magic", "unknownkey", "auth"] {
            assert!(all.contains(needle), "{needle} not among {reasons:?}");
        }
    }
}
