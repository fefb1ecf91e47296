//! The one module that talks to raw sockets: a filtered `AF_PACKET` channel per interface.
//!
//! A node with a busy NIC must not copy every frame into user space to find the few ARP requests
//! and neighbor solicitations it answers. The socket opened here:
//!
//! - is created with protocol 0, so it receives nothing until it is bound, and has a classic BPF
//!   program attached before that: the kernel passes only ARP frames and ICMPv6 neighbor
//!   solicitations and advertisements (IPv6 next header 58 directly after the fixed header, type
//!   135 or 136) and drops everything else before any copy;
//! - ignores the frames this host transmits (`PACKET_IGNORE_OUTGOING`), so our own gratuitous
//!   ARP never comes back as a "conflict";
//! - never turns promiscuous mode on; solicited-node multicast groups are joined one by one with
//!   `PACKET_ADD_MEMBERSHIP` / `PACKET_MR_MULTICAST` ([`Membership::join`]), so neighbor
//!   solicitations for our IPv6 addresses reach us without promiscuous mode.
//!
//! The socket is handed to `pnet_datalink` (`Config::socket_fd`), which binds it to the interface
//! and provides the sender and receiver the responder uses; tests use `pnet_datalink::dummy`
//! instead. `unsafe` is allowed in this module only; each block says why it is sound.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, IntoRawFd, OwnedFd, RawFd};
use std::time::Duration;

use pnet_datalink::{Channel, Config, DataLinkReceiver, DataLinkSender, NetworkInterface};
use socket2::{Domain, Protocol, SockFilter, Socket, Type};

// Classic BPF opcodes (linux/filter.h).
const BPF_LD_H_ABS: u16 = 0x28; // BPF_LD | BPF_H | BPF_ABS
const BPF_LD_B_ABS: u16 = 0x30; // BPF_LD | BPF_B | BPF_ABS
const BPF_JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
const BPF_RET_K: u16 = 0x06; // BPF_RET | BPF_K

const ETHERTYPE_ARP: u32 = 0x0806;
const ETHERTYPE_IPV6: u32 = 0x86dd;
const IPPROTO_ICMPV6: u32 = 58;
const ND_NEIGHBOR_SOLICIT: u32 = 135;
const ND_NEIGHBOR_ADVERT: u32 = 136;
/// Bytes of an accepted frame passed to user space: more than any ARP or ND frame we parse.
const SNAP_LEN: u32 = 1514;

/// The kernel-side filter as `(code, jt, jf, k)`: accept ARP, or IPv6 + ICMPv6 NS/NA without
/// extension headers; drop everything else.
///
/// Offsets: ethertype at 12, IPv6 next header at 14 + 6 = 20, ICMPv6 type at 14 + 40 = 54.
/// Jumps are relative to the next instruction.
const NEIGHBOR_FILTER: [(u16, u8, u8, u32); 10] = [
    /* 0 */ (BPF_LD_H_ABS, 0, 0, 12),
    /* 1 */ (BPF_JEQ_K, 6, 0, ETHERTYPE_ARP), // ARP -> 8 accept
    /* 2 */ (BPF_JEQ_K, 0, 6, ETHERTYPE_IPV6), // other -> 9 drop
    /* 3 */ (BPF_LD_B_ABS, 0, 0, 20),
    /* 4 */ (BPF_JEQ_K, 0, 4, IPPROTO_ICMPV6), // other -> 9 drop
    /* 5 */ (BPF_LD_B_ABS, 0, 0, 54),
    /* 6 */ (BPF_JEQ_K, 1, 0, ND_NEIGHBOR_SOLICIT), // NS -> 8 accept
    /* 7 */ (BPF_JEQ_K, 0, 1, ND_NEIGHBOR_ADVERT), // NA -> 8 accept, other -> 9 drop
    /* 8 */ (BPF_RET_K, 0, 0, SNAP_LEN),
    /* 9 */ (BPF_RET_K, 0, 0, 0),
];

/// The pieces of one interface's filtered channel.
pub struct LinkChannel {
    /// Sends whole Ethernet frames.
    pub tx: Box<dyn DataLinkSender>,
    /// Receives the frames the filter passes.
    pub rx: Box<dyn DataLinkReceiver>,
    /// Joins and leaves multicast groups on the same socket.
    pub membership: Membership,
}

impl std::fmt::Debug for LinkChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinkChannel")
            .field("membership", &self.membership)
            .finish_non_exhaustive()
    }
}

/// Opens the filtered socket for `interface` and hands it to pnet.
///
/// `read_timeout` bounds each blocking `next()` so the responder thread can look at its control
/// channel.
pub fn open(interface: &NetworkInterface, read_timeout: Duration) -> io::Result<LinkChannel> {
    let socket = Socket::new(Domain::PACKET, Type::RAW, Some(Protocol::from(0)))?;
    socket.attach_filter(&filter_program())?;
    let one: libc::c_int = 1;
    setsockopt(
        &socket,
        libc::SOL_PACKET,
        libc::PACKET_IGNORE_OUTGOING,
        &one,
    )?;
    let membership_fd: OwnedFd = socket.try_clone()?.into();
    let config = Config {
        read_timeout: Some(read_timeout),
        promiscuous: false,
        socket_fd: Some(socket.into_raw_fd()),
        ..Config::default()
    };
    // pnet now owns the descriptor: it binds it to the interface and closes it on drop.
    match pnet_datalink::channel(interface, config)? {
        Channel::Ethernet(tx, rx) => Ok(LinkChannel {
            tx,
            rx,
            membership: Membership {
                fd: membership_fd,
                ifindex: interface.index as i32,
            },
        }),
        _ => Err(io::Error::other("pnet returned a non-Ethernet channel")),
    }
}

fn filter_program() -> Vec<SockFilter> {
    NEIGHBOR_FILTER
        .iter()
        .map(|&(code, jt, jf, k)| SockFilter::new(code, jt, jf, k))
        .collect()
}

/// Joins and leaves link-layer multicast groups on the responder's socket.
#[derive(Debug)]
pub struct Membership {
    fd: OwnedFd,
    ifindex: i32,
}

impl AsFd for Membership {
    /// The packet socket itself (a second descriptor of it): the responder polls it.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Membership {
    /// Receive frames sent to the multicast `mac` (a solicited-node group's `33:33:ff:..`).
    /// Joining twice is counted by the kernel; leave as many times as joined.
    pub fn join(&self, mac: [u8; 6]) -> io::Result<()> {
        self.change(libc::PACKET_ADD_MEMBERSHIP, mac)
    }

    /// Stop receiving frames sent to the multicast `mac`.
    pub fn leave(&self, mac: [u8; 6]) -> io::Result<()> {
        self.change(libc::PACKET_DROP_MEMBERSHIP, mac)
    }

    fn change(&self, option: libc::c_int, mac: [u8; 6]) -> io::Result<()> {
        let mut mreq = libc::packet_mreq {
            mr_ifindex: self.ifindex,
            mr_type: libc::PACKET_MR_MULTICAST as libc::c_ushort,
            mr_alen: 6,
            mr_address: [0; 8],
        };
        mreq.mr_address[..6].copy_from_slice(&mac);
        setsockopt_raw(self.fd.as_raw_fd(), libc::SOL_PACKET, option, &mreq)
    }
}

fn setsockopt<T>(
    socket: &Socket,
    level: libc::c_int,
    name: libc::c_int,
    value: &T,
) -> io::Result<()> {
    setsockopt_raw(socket.as_raw_fd(), level, name, value)
}

fn setsockopt_raw<T>(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    value: &T,
) -> io::Result<()> {
    // SAFETY: `fd` is an open socket owned by the caller for the duration of the call; `value`
    // points to a live, initialized `T` and the length passed is exactly `size_of::<T>()`, so the
    // kernel reads only memory we own.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (value as *const T).cast::<libc::c_void>(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs [`NEIGHBOR_FILTER`] over `frame` as the kernel's classic BPF interpreter would.
    fn run_filter(frame: &[u8]) -> u32 {
        let mut pc = 0usize;
        let mut a: u32 = 0;
        // Classic BPF only jumps forward, so the program ends within its length.
        for _ in 0..NEIGHBOR_FILTER.len() {
            let (code, jt, jf, k) = NEIGHBOR_FILTER[pc];
            match code {
                BPF_LD_H_ABS => match frame.get(k as usize..k as usize + 2) {
                    Some(b) => a = u32::from(u16::from_be_bytes([b[0], b[1]])),
                    None => return 0,
                },
                BPF_LD_B_ABS => match frame.get(k as usize) {
                    Some(b) => a = u32::from(*b),
                    None => return 0,
                },
                BPF_JEQ_K => {
                    pc += 1 + usize::from(if a == k { jt } else { jf });
                    continue;
                }
                BPF_RET_K => return k,
                other => panic!("unexpected opcode {other:#x}"),
            }
            pc += 1;
        }
        panic!("filter did not return");
    }

    fn frame(ethertype: u16, next_header: u8, icmp_type: u8) -> Vec<u8> {
        let mut f = vec![0u8; 80];
        f[12..14].copy_from_slice(&ethertype.to_be_bytes());
        f[20] = next_header;
        f[54] = icmp_type;
        f
    }

    #[test]
    fn filter_accepts_arp_and_neighbor_discovery_only() {
        assert_eq!(run_filter(&frame(0x0806, 0, 0)), SNAP_LEN, "ARP");
        assert_eq!(run_filter(&frame(0x86dd, 58, 135)), SNAP_LEN, "NS");
        assert_eq!(run_filter(&frame(0x86dd, 58, 136)), SNAP_LEN, "NA");
        assert_eq!(run_filter(&frame(0x86dd, 58, 128)), 0, "echo request");
        assert_eq!(run_filter(&frame(0x86dd, 17, 135)), 0, "UDP");
        assert_eq!(run_filter(&frame(0x0800, 58, 135)), 0, "IPv4");
        assert_eq!(run_filter(&frame(0x8100, 0, 0)), 0, "VLAN tag");
        assert_eq!(run_filter(&[0u8; 10]), 0, "runt frame");
    }

    #[test]
    fn filter_jumps_stay_inside_the_program() {
        for (pc, (code, jt, jf, _)) in NEIGHBOR_FILTER.iter().enumerate() {
            if *code == BPF_JEQ_K {
                assert!(
                    pc + 1 + usize::from(*jt.max(jf)) < NEIGHBOR_FILTER.len(),
                    "instruction {pc}"
                );
            }
        }
        assert_eq!(filter_program().len(), NEIGHBOR_FILTER.len());
    }
}
