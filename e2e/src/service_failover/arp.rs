//! The ARP-level takeover as the client's segment sees it, beside the client's first answered
//! request: a listener on the client's `eth0` that only listens (it asks nothing, so the client's
//! kernel learns the new owner as it would without it) and records every frame claiming the IP
//! (a reply to the client's kernel, or a gratuitous ARP). The takeover is the first claim from
//! a node other than the old owner after the fault ([`takeover_ms`]), `failover --scenario
//! poweroff`'s figure as the network sees it, without the probe responders real nodes lack.

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::Result;
use swimlb_proto::Frame;
use swimlb_proto::arp::ArpOperation;
use tokio::time::Instant;

use crate::probe::{open_eth0, spawn_in};

/// One frame claiming the IP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim {
    /// When it arrived.
    pub at: Instant,
    /// Its sender's MAC.
    pub mac: [u8; 6],
}

/// The listener; [`ArpWatch::stop`] returns what it saw.
#[derive(Debug)]
pub struct ArpWatch {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
    claims: Arc<Mutex<Vec<Claim>>>,
}

impl ArpWatch {
    /// Starts listening on `netns`'s `eth0` for frames claiming `ip`.
    pub fn start(netns: &str, ip: Ipv4Addr) -> Result<ArpWatch> {
        let stop = Arc::new(AtomicBool::new(false));
        let claims: Arc<Mutex<Vec<Claim>>> = Arc::default();
        let (flag, seen) = (stop.clone(), claims.clone());
        let setup = || open_eth0(Duration::from_millis(5));
        let handle = spawn_in(netns, "arp-watch", setup, move |mut channel| {
            while !flag.load(Ordering::Relaxed) {
                let Ok(bytes) = channel.rx.next() else {
                    continue;
                };
                if let Some(mac) = claim(bytes, ip) {
                    seen.lock().expect("ARP claims").push(Claim {
                        at: Instant::now(),
                        mac,
                    });
                }
            }
        })?;
        Ok(ArpWatch {
            stop,
            handle: Some(handle),
            claims,
        })
    }

    /// Stops listening; every claim seen, in order.
    pub fn stop(mut self) -> Vec<Claim> {
        self.halt();
        std::mem::take(&mut *self.claims.lock().expect("ARP claims"))
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

impl Drop for ArpWatch {
    fn drop(&mut self) {
        self.halt();
    }
}

/// The sender's MAC of an ARP reply or gratuitous ARP from `ip`; `None` for anything else.
fn claim(bytes: &[u8], ip: Ipv4Addr) -> Option<[u8; 6]> {
    match Frame::parse(bytes) {
        Ok(Frame::Arp { arp, .. })
            if arp.sender_ip == ip
                && (arp.operation == ArpOperation::Reply || arp.is_gratuitous()) =>
        {
            let m = arp.sender_mac;
            Some([m.0, m.1, m.2, m.3, m.4, m.5])
        }
        _ => None,
    }
}

/// Fault to the first claim after it from a MAC other than `old` (the old owner's).
pub fn takeover_ms(claims: &[Claim], fault: Instant, old: [u8; 6]) -> Option<f64> {
    claims
        .iter()
        .find(|c| c.at >= fault && c.mac != old)
        .map(|c| (c.at - fault).as_secs_f64() * 1000.0)
}

/// The distinct MACs that claimed the IP after the fault, other than `old`: more than one is a
/// takeover that moved twice.
pub fn new_claimants(claims: &[Claim], fault: Instant, old: [u8; 6]) -> usize {
    let mut macs: Vec<[u8; 6]> = claims
        .iter()
        .filter(|c| c.at >= fault && c.mac != old)
        .map(|c| c.mac)
        .collect();
    macs.sort_unstable();
    macs.dedup();
    macs.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use swimlb_proto::arp::ArpRepr;
    use swimlb_proto::ethernet::MacAddr;

    fn frame(operation: ArpOperation, sender: Ipv4Addr, target: Ipv4Addr) -> Vec<u8> {
        let arp = ArpRepr {
            operation,
            sender_mac: MacAddr(2, 0, 0, 0, 0, 2),
            sender_ip: sender,
            target_mac: MacAddr(0, 0, 0, 0, 0, 0),
            target_ip: target,
        };
        let mut bytes = vec![0u8; arp.frame_len()];
        arp.emit_frame(&mut bytes).unwrap();
        bytes
    }

    #[test]
    fn replies_and_gratuitous_arp_from_the_ip_are_claims_requests_are_not() {
        let vip = Ipv4Addr::new(198, 51, 100, 100);
        let client = Ipv4Addr::new(198, 51, 100, 1);
        let mac = Some([2, 0, 0, 0, 0, 2]);
        assert_eq!(claim(&frame(ArpOperation::Reply, vip, client), vip), mac);
        assert_eq!(claim(&frame(ArpOperation::Request, vip, vip), vip), mac);
        assert_eq!(claim(&frame(ArpOperation::Request, vip, client), vip), None);
        assert_eq!(claim(&frame(ArpOperation::Reply, client, vip), vip), None);
        assert_eq!(claim(&[0u8; 10], vip), None);
    }

    #[test]
    fn the_takeover_is_the_first_claim_after_the_fault_from_another_node() {
        let fault = Instant::now();
        let (old, new, third) = ([1; 6], [2; 6], [3; 6]);
        let at = |ms: u64, mac| Claim {
            at: fault + Duration::from_millis(ms),
            mac,
        };
        let before = Claim {
            at: fault - Duration::from_millis(5),
            mac: new,
        };
        let claims = [
            before,
            at(10, old),
            at(120, new),
            at(130, third),
            at(200, new),
        ];
        assert!(takeover_ms(&claims, fault, old).is_some_and(|ms| (ms - 120.0).abs() < 0.001));
        assert_eq!(new_claimants(&claims, fault, old), 2);
        assert_eq!(takeover_ms(&claims[..2], fault, old), None);
        assert_eq!(new_claimants(&claims[..2], fault, old), 0);
    }
}
