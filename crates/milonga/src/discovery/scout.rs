//! The UDP side of `scout` discovery (docs/protocol.md §9.5): a socket in
//! the scouting group (IPv4, or IPv6 when `tcp_host` is an IPv6 address)
//! on the interface of `tcp_host`, which multicasts this node's hellos and
//! reads the others'. What a hello leads to (asking
//! the node for its announcement) is the peer-to-peer backend's
//! (`backend::p2p::scout_peers`), which speaks the control protocol.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket};
use std::sync::Arc;

use milonga_wire::scout::Hello;

use crate::model::error::OpenError;
use crate::model::node::NodeCore;
use crate::util::stats;

/// Most datagrams read in one turn: a flood costs each turn a bounded
/// amount of work (the rest waits in the socket, or is dropped by the
/// kernel when its buffer is full).
const MAX_READ: usize = 1024;

/// A node's scouting sockets.
pub(crate) struct Scout {
    /// Bound to the group: the hellos arrive here.
    rx: UdpSocket,
    /// Hellos leave here: the same socket over IPv4; over IPv6 one bound
    /// to `tcp_host`, so that the hellos come from the address they name
    /// (the kernel would pick a link-local one for a link-local group).
    tx: UdpSocket,
    group: SocketAddr,
    /// The addresses of the interfaces it joined the group on: `tcp_host`,
    /// then the node's other addresses.
    ifaces: Vec<IpAddr>,
    node: Arc<NodeCore>,
}

/// Whether `endpoint` (`tcp://A:P`, `tcp://[A]:P`) names `ip` as an IP
/// literal.
fn from_its_address(endpoint: &str, ip: IpAddr) -> bool {
    endpoint
        .strip_prefix("tcp://")
        .and_then(|hp| hp.parse::<SocketAddr>().ok())
        .is_some_and(|a| a.ip() == ip)
}

/// The control endpoint at `iface` with `port`.
pub(crate) fn endpoint_at(iface: IpAddr, port: &str) -> String {
    match iface {
        IpAddr::V4(a) => format!("tcp://{a}:{port}"),
        IpAddr::V6(a) => format!("tcp://[{a}]:{port}"),
    }
}

/// `text`, the value of `key`, as a multicast group and port of the
/// family `A` (`ADDRESS:PORT`, `[ADDRESS]:PORT`).
fn parse_group<A>(key: &str, text: &str, multicast: impl Fn(&A) -> bool) -> Result<A, OpenError>
where
    A: std::str::FromStr,
    A::Err: std::fmt::Display,
{
    let g: A = text
        .parse()
        .map_err(|e| config_err(key, format!("{text:?} is not a group and port: {e}")))?;
    if !multicast(&g) {
        return Err(config_err(key, format!("{text} is not a multicast group")));
    }
    Ok(g)
}

/// Why a configuration cannot scout.
fn config_err(key: &str, why: String) -> OpenError {
    OpenError::Config {
        key: key.into(),
        why,
    }
}

impl Scout {
    /// Joins the scouting group on the interface whose address is
    /// `iface` (the node's `tcp_host`; the group of its family), and on
    /// those of the node's other addresses. The caller has checked that
    /// `iface` is an address other hosts reach (`control::scouts`).
    pub(crate) fn open(node: Arc<NodeCore>, iface: IpAddr) -> Result<Scout, OpenError> {
        match iface {
            IpAddr::V4(v4) => Scout::open_v4(node, v4),
            IpAddr::V6(v6) => Scout::open_v6(node, v6),
        }
    }

    fn open_v4(node: Arc<NodeCore>, iface: Ipv4Addr) -> Result<Scout, OpenError> {
        use socket2::{Domain, Protocol, Socket, Type};
        let cfg = &node.cfg;
        let group = parse_group("scout_group", &cfg.scout_group, |g: &SocketAddrV4| {
            g.ip().is_multicast()
        })?;
        let err = |what: &str, e: std::io::Error| {
            config_err(
                "scouting",
                format!("cannot {what} (group {group}, interface {iface}): {e}"),
            )
        };
        let s = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))
            .map_err(|e| err("create a UDP socket", e))?;
        // Every node of this host shares the group's port.
        s.set_reuse_address(true)
            .and_then(|()| s.set_reuse_port(true))
            .map_err(|e| err("share the port", e))?;
        // Bound to the group: only its datagrams arrive.
        s.bind(&group.into()).map_err(|e| err("bind", e))?;
        let mut ifaces = vec![iface];
        ifaces.extend(node.other_hosts.iter().filter(|h| **h != iface));
        for i in &ifaces {
            s.join_multicast_v4(group.ip(), i).map_err(|e| {
                config_err(
                    "scouting",
                    format!("cannot join the group {group} on the interface of {i}: {e}"),
                )
            })?;
        }
        s.set_multicast_if_v4(&iface)
            .and_then(|()| s.set_multicast_ttl_v4(1))
            .and_then(|()| s.set_multicast_loop_v4(true))
            .and_then(|()| s.set_nonblocking(true))
            .map_err(|e| err("configure", e))?;
        let rx: UdpSocket = s.into();
        let tx = rx.try_clone().map_err(|e| err("clone the socket", e))?;
        Ok(Scout {
            rx,
            tx,
            group: group.into(),
            ifaces: ifaces.into_iter().map(IpAddr::V4).collect(),
            node,
        })
    }

    fn open_v6(node: Arc<NodeCore>, iface: Ipv6Addr) -> Result<Scout, OpenError> {
        use socket2::{Domain, Protocol, Socket, Type};
        let cfg = &node.cfg;
        let group = parse_group("scout_group6", &cfg.scout_group6, |g: &SocketAddrV6| {
            g.ip().is_multicast()
        })?;
        let index = crate::util::sys::ipv6_interface_index(iface).ok_or_else(|| {
            config_err(
                "tcp_host",
                format!("no interface of this host has the address {iface}"),
            )
        })?;
        let err = |what: &str, e: std::io::Error| {
            config_err(
                "scouting",
                format!("cannot {what} (group {group}, interface {iface}): {e}"),
            )
        };
        let rx = Socket::new(Domain::IPV6, Type::DGRAM, Some(Protocol::UDP))
            .map_err(|e| err("create a UDP socket", e))?;
        rx.set_only_v6(true)
            .and_then(|()| rx.set_reuse_address(true))
            .and_then(|()| rx.set_reuse_port(true))
            .map_err(|e| err("share the port", e))?;
        let bind = SocketAddrV6::new(*group.ip(), group.port(), 0, index);
        rx.bind(&bind.into()).map_err(|e| err("bind", e))?;
        rx.join_multicast_v6(group.ip(), index)
            .and_then(|()| rx.set_nonblocking(true))
            .map_err(|e| err("join the group", e))?;
        let tx = Socket::new(Domain::IPV6, Type::DGRAM, Some(Protocol::UDP))
            .map_err(|e| err("create a UDP socket", e))?;
        tx.set_only_v6(true)
            .and_then(|()| tx.bind(&SocketAddrV6::new(iface, 0, 0, 0).into()))
            .and_then(|()| tx.set_multicast_if_v6(index))
            .and_then(|()| tx.set_multicast_hops_v6(1))
            .and_then(|()| tx.set_multicast_loop_v6(true))
            .and_then(|()| tx.set_nonblocking(true))
            .map_err(|e| err("configure the sending socket", e))?;
        Ok(Scout {
            rx: rx.into(),
            tx: tx.into(),
            group: SocketAddr::V6(SocketAddrV6::new(*group.ip(), group.port(), 0, index)),
            ifaces: vec![IpAddr::V6(iface)],
            node,
        })
    }

    /// Readable when a datagram waits.
    pub(crate) fn fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.rx.as_raw_fd()
    }

    /// The addresses of the interfaces it scouts on, `tcp_host` first.
    pub(crate) fn ifaces(&self) -> &[IpAddr] {
        &self.ifaces
    }

    /// Multicasts `hello`, an encoded [`Hello`], on the interface of
    /// `iface` (a full send buffer drops it: the next one follows within
    /// an interval).
    pub(crate) fn send(&self, iface: IpAddr, hello: &[u8]) {
        let sent = match iface {
            IpAddr::V4(v4) => socket2::SockRef::from(&self.tx).set_multicast_if_v4(&v4),
            IpAddr::V6(_) => Ok(()),
        }
        .and_then(|()| self.tx.send_to(hello, self.group));
        if let Err(e) = sent {
            limited!(warn, group = %self.group, %iface, err = %e, "cannot send a scouting hello");
        }
    }

    /// Reads the datagrams waiting (at most [`MAX_READ`]): the hellos of
    /// other nodes of this domain. The rest is counted: malformed ones in
    /// `scout_malformed`, other domains' in `peers_foreign_domain`.
    pub(crate) fn receive(&self) -> Vec<Hello> {
        let c = &self.node.counters;
        let mut out = Vec::new();
        let mut buf = [0u8; 2048];
        for _ in 0..MAX_READ {
            let (n, from) = match self.rx.recv_from(&mut buf) {
                Ok(r) => r,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            };
            match Hello::decode(&buf[..n]) {
                Ok(h) if h.domain_tag != self.node.domain_tag => {
                    stats::inc(&c.peers_foreign_domain);
                }
                Ok(h) if h.node_id == self.node.id => {}
                Ok(h) if !from_its_address(&h.control, from.ip()) => {
                    // Its endpoint must be the address it sends from: no
                    // hello makes the nodes that hear it connect to a
                    // third party, and no host name is ever resolved.
                    stats::inc(&c.scout_malformed);
                    limited!(warn, %from, endpoint = %h.control, "dropped a hello whose endpoint is not the address it came from");
                }
                Ok(h) => out.push(h),
                Err(e) => {
                    stats::inc(&c.scout_malformed);
                    limited!(warn, %from, err = %e, "dropped a scouting datagram");
                }
            }
        }
        out
    }
}
