//! The VRRP sockets of one interface and family: a raw IP socket for protocol 112 that joins
//! 224.0.0.18 or ff02::12 there and reads every advertisement, and one that sends from this
//! node's primary address (IPv4) or link-local address (IPv6), TTL / hop limit 255, no loop
//! back.
//!
//! Reading checks what RFC 9568 section 7.1 asks before anything else looks at a frame: TTL /
//! hop limit 255 (IPv4 from the header the kernel hands a raw socket, IPv6 from the
//! `IPV6_HOPLIMIT` control message), version, type, length and the checksum over the
//! pseudo-header ([`VrrpPacket::parse_ipv4`], [`VrrpRepr::parse`]).

use std::io;
use std::io::{IoSliceMut, Read as _};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};
use std::time::Duration;

use nix::sys::socket::{ControlMessageOwned, MsgFlags, SockaddrIn6, recvmsg, setsockopt, sockopt};
use socket2::{Domain, InterfaceIndexOrAddress, Protocol, Socket, Type};
use swimlb_proto::vrrp::{self, VrrpAddresses, VrrpPacket, VrrpRepr};

/// An advertisement read from the wire, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Advert {
    /// The sender.
    pub src: IpAddr,
    /// Its VRID.
    pub vrid: u8,
    /// Its priority.
    pub priority: u8,
    /// Its interval, in centiseconds.
    pub interval_centis: u16,
}

/// The address family of a VRRP router.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    /// VRRPv3 over IPv4.
    V4,
    /// VRRPv3 over IPv6.
    V6,
}

impl Family {
    /// The family of `ip`.
    pub fn of(ip: &IpAddr) -> Family {
        if ip.is_ipv4() { Family::V4 } else { Family::V6 }
    }

    /// `ipv4` or `ipv6`, for labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Family::V4 => "ipv4",
            Family::V6 => "ipv6",
        }
    }
}

/// The address this node sends from on `ifname`: its first IPv4 address there, or its
/// link-local IPv6 address.
pub fn source_address(ifname: &str, family: Family) -> Option<IpAddr> {
    let addrs = nix::ifaddrs::getifaddrs().ok()?;
    for a in addrs.filter(|a| a.interface_name == ifname) {
        let Some(addr) = a.address else { continue };
        match family {
            Family::V4 => {
                if let Some(v4) = addr.as_sockaddr_in() {
                    return Some(IpAddr::V4(v4.ip()));
                }
            }
            Family::V6 => {
                if let Some(v6) = addr.as_sockaddr_in6()
                    && (v6.ip().segments()[0] & 0xffc0) == 0xfe80
                {
                    return Some(IpAddr::V6(v6.ip()));
                }
            }
        }
    }
    None
}

/// The receiving socket of one interface and family.
#[derive(Debug)]
pub struct Receiver {
    socket: Socket,
    family: Family,
}

/// Opens the receiving socket on `ifname` (index `ifindex`), with a read timeout so a reading
/// thread can see that nobody listens any more.
pub fn receiver(ifname: &str, ifindex: u32, family: Family) -> io::Result<Receiver> {
    let socket = raw(family)?;
    socket.bind_device(Some(ifname.as_bytes()))?;
    match family {
        Family::V4 => socket
            .join_multicast_v4_n(&vrrp::IPV4_GROUP, &InterfaceIndexOrAddress::Index(ifindex))?,
        Family::V6 => {
            socket.join_multicast_v6(&vrrp::IPV6_GROUP, ifindex)?;
            setsockopt(&socket, sockopt::Ipv6RecvPacketInfo, &true).map_err(io::Error::from)?;
            setsockopt(&socket, sockopt::Ipv6RecvHopLimit, &true).map_err(io::Error::from)?;
        }
    }
    socket.set_read_timeout(Some(Duration::from_millis(200)))?;
    Ok(Receiver { socket, family })
}

/// Why a frame was dropped, for the counter's label.
pub type DropReason = &'static str;

impl Receiver {
    /// Reads the next frame: `Ok(None)` on a timeout, `Ok(Some(Err(reason)))` for a frame that
    /// fails a check.
    pub fn read(&self) -> io::Result<Option<Result<Advert, DropReason>>> {
        match self.family {
            Family::V4 => self.read_v4(),
            Family::V6 => self.read_v6(),
        }
    }

    fn read_v4(&self) -> io::Result<Option<Result<Advert, DropReason>>> {
        let mut buf = [0u8; 1500];
        let n = match (&self.socket).read(&mut buf) {
            Ok(n) => n,
            Err(e) if timed_out(&e) => return Ok(None),
            Err(e) => return Err(e),
        };
        Ok(Some(match VrrpPacket::parse_ipv4(&buf[..n]) {
            Ok(p) => Ok(advert(p.src_addr, &p.vrrp)),
            Err(e) => Err(e.as_str()),
        }))
    }

    fn read_v6(&self) -> io::Result<Option<Result<Advert, DropReason>>> {
        let mut buf = [0u8; 1500];
        let mut space = nix::cmsg_space!(libc::in6_pktinfo, libc::c_int);
        let mut iov = [IoSliceMut::new(&mut buf)];
        let msg = match recvmsg::<SockaddrIn6>(
            std::os::fd::AsRawFd::as_raw_fd(&self.socket),
            &mut iov,
            Some(&mut space),
            MsgFlags::empty(),
        ) {
            Ok(msg) => msg,
            Err(nix::errno::Errno::EAGAIN) => return Ok(None),
            Err(e) => return Err(io::Error::from(e)),
        };
        let mut hop_limit = None;
        let mut dst = None;
        for cmsg in msg.cmsgs().map_err(io::Error::from)? {
            match cmsg {
                ControlMessageOwned::Ipv6HopLimit(h) => hop_limit = Some(h),
                ControlMessageOwned::Ipv6PacketInfo(info) => {
                    dst = Some(Ipv6Addr::from(info.ipi6_addr.s6_addr));
                }
                _ => {}
            }
        }
        let src = msg.address.map(|a| a.ip());
        let n = msg.bytes;
        let (Some(src), Some(dst)) = (src, dst) else {
            return Ok(Some(Err("no_address")));
        };
        if hop_limit != Some(i32::from(vrrp::HOP_LIMIT)) {
            return Ok(Some(Err("hop_limit")));
        }
        Ok(Some(
            match VrrpRepr::parse(IpAddr::V6(src), IpAddr::V6(dst), &buf[..n]) {
                Ok(r) => Ok(advert(IpAddr::V6(src), &r)),
                Err(e) => Err(e.as_str()),
            },
        ))
    }
}

fn advert(src: IpAddr, r: &VrrpRepr<'_>) -> Advert {
    Advert {
        src,
        vrid: r.vrid,
        priority: r.priority,
        interval_centis: r.max_advert_interval,
    }
}

fn timed_out(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

fn raw(family: Family) -> io::Result<Socket> {
    let domain = match family {
        Family::V4 => Domain::IPV4,
        Family::V6 => Domain::IPV6,
    };
    Socket::new(
        domain,
        Type::RAW,
        Some(Protocol::from(i32::from(vrrp::PROTOCOL))),
    )
}

/// The sending socket of one interface and family, bound to the address it sends from.
#[derive(Debug)]
pub struct Sender {
    socket: Socket,
    src: IpAddr,
    dst: SocketAddr,
}

/// Opens the sending socket on `ifname` from `src` ([`source_address`]).
pub fn sender(ifname: &str, ifindex: u32, src: IpAddr) -> io::Result<Sender> {
    let family = Family::of(&src);
    let socket = raw(family)?;
    socket.bind_device(Some(ifname.as_bytes()))?;
    let dst = match src {
        IpAddr::V4(v4) => {
            socket.set_multicast_if_v4(&v4)?;
            socket.set_multicast_ttl_v4(u32::from(vrrp::HOP_LIMIT))?;
            socket.set_multicast_loop_v4(false)?;
            socket.bind(&SocketAddr::new(src, 0).into())?;
            SocketAddr::new(IpAddr::V4(vrrp::IPV4_GROUP), 0)
        }
        IpAddr::V6(v6) => {
            socket.set_multicast_if_v6(ifindex)?;
            socket.set_multicast_hops_v6(u32::from(vrrp::HOP_LIMIT))?;
            socket.set_multicast_loop_v6(false)?;
            socket.bind(&SocketAddr::V6(SocketAddrV6::new(v6, 0, 0, ifindex)).into())?;
            SocketAddr::V6(SocketAddrV6::new(vrrp::IPV6_GROUP, 0, 0, ifindex))
        }
    };
    socket.set_nonblocking(true)?;
    Ok(Sender { socket, src, dst })
}

impl Sender {
    /// The address it sends from.
    pub fn src(&self) -> IpAddr {
        self.src
    }

    /// Sends one advertisement of `addresses` (all of this socket's family).
    pub fn send(
        &self,
        vrid: u8,
        priority: u8,
        interval_centis: u16,
        addresses: &[IpAddr],
    ) -> io::Result<()> {
        let v4: Vec<Ipv4Addr> = addresses
            .iter()
            .filter_map(|a| match a {
                IpAddr::V4(v) => Some(*v),
                IpAddr::V6(_) => None,
            })
            .collect();
        let v6: Vec<Ipv6Addr> = addresses
            .iter()
            .filter_map(|a| match a {
                IpAddr::V6(v) => Some(*v),
                IpAddr::V4(_) => None,
            })
            .collect();
        let list = match self.src {
            IpAddr::V4(_) => VrrpAddresses::Ipv4(&v4),
            IpAddr::V6(_) => VrrpAddresses::Ipv6(&v6),
        };
        let repr = VrrpRepr {
            vrid,
            priority,
            max_advert_interval: interval_centis,
            addresses: list,
        };
        let mut buf = vec![0u8; repr.buffer_len()];
        repr.emit(self.src, self.dst.ip(), &mut buf)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        self.socket.send_to(&buf, &self.dst.into())?;
        Ok(())
    }
}
