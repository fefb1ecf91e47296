//! Gratuitous ARP and unsolicited neighbor advertisements for the VIPs, as the client sees them.

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Result;
use swimlb_proto::Frame;
use swimlb_proto::arp::ArpOperation;
use swimlb_proto::ethernet::MacAddr;
use swimlb_proto::ndp::NdpMessage;
use tokio::time::Instant;

use crate::probe::{open_eth0, spawn_in};

/// One announcement seen by the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Announcement {
    /// When it arrived.
    pub at: Instant,
    /// The MAC that claimed the VIP.
    pub mac: MacAddr,
    /// The VIP.
    pub ip: IpAddr,
}

/// Records gratuitous ARP and unsolicited NA frames for `vips` arriving in `netns` on `eth0`.
#[derive(Debug)]
pub struct AnnouncementWatcher {
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Vec<Announcement>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl AnnouncementWatcher {
    /// Starts watching.
    pub fn start(netns: &str, vips: Vec<IpAddr>) -> Result<AnnouncementWatcher> {
        let stop = Arc::new(AtomicBool::new(false));
        let seen: Arc<Mutex<Vec<Announcement>>> = Arc::default();
        let (flag, log) = (stop.clone(), seen.clone());
        let setup = || open_eth0(Duration::from_millis(20));
        let thread = spawn_in(netns, "announcements", setup, move |mut channel| {
            while !flag.load(Ordering::Relaxed) {
                let Ok(frame) = channel.rx.next() else {
                    continue;
                };
                let at = Instant::now();
                let claim = match Frame::parse(frame) {
                    Ok(Frame::Arp { arp, .. })
                        if arp.is_gratuitous() || arp.operation == ArpOperation::Reply =>
                    {
                        Some((arp.sender_mac, IpAddr::V4(arp.sender_ip)))
                    }
                    Ok(Frame::Ndp(f)) => match f.ndp.message {
                        NdpMessage::NeighborAdvert {
                            target,
                            target_link_addr,
                            flags,
                        } if !flags.solicited => Some((
                            target_link_addr.unwrap_or(f.ethernet.src),
                            IpAddr::V6(target),
                        )),
                        _ => None,
                    },
                    _ => None,
                };
                if let Some((mac, ip)) = claim
                    && vips.contains(&ip)
                {
                    log.lock()
                        .expect("announcement log")
                        .push(Announcement { at, mac, ip });
                }
            }
        })?;
        Ok(AnnouncementWatcher {
            stop,
            seen,
            thread: Some(thread),
        })
    }

    /// Everything seen so far.
    pub fn seen(&self) -> Vec<Announcement> {
        self.seen.lock().expect("announcement log").clone()
    }
}

impl Drop for AnnouncementWatcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
