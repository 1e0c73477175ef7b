//! The UDP side of `scout` discovery (docs/protocol.md §9.5): a socket in
//! the scouting group on the interface of `tcp_host`, which multicasts
//! this node's hellos and reads the others'. What a hello leads to (asking
//! the node for its announcement) is the peer-to-peer backend's
//! (`backend::p2p::scout_peers`), which speaks the control protocol.

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::sync::Arc;

use milonga_wire::scout::Hello;

use crate::model::error::OpenError;
use crate::model::node::NodeCore;
use crate::util::stats;

/// Most datagrams read in one turn: a flood costs each turn a bounded
/// amount of work (the rest waits in the socket, or is dropped by the
/// kernel when its buffer is full).
const MAX_READ: usize = 1024;

/// A node's scouting socket.
pub(crate) struct Scout {
    sock: UdpSocket,
    group: SocketAddrV4,
    /// The addresses of the interfaces it joined the group on: `tcp_host`,
    /// then the node's other addresses.
    ifaces: Vec<Ipv4Addr>,
    node: Arc<NodeCore>,
}

/// Whether `endpoint` (`tcp://A:P`) names `ip` as an IPv4 literal.
fn from_its_address(endpoint: &str, ip: std::net::IpAddr) -> bool {
    endpoint
        .strip_prefix("tcp://")
        .and_then(|hp| hp.parse::<SocketAddrV4>().ok())
        .is_some_and(|a| std::net::IpAddr::V4(*a.ip()) == ip)
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
    /// `tcp_host`. Refused when that is not one address of this host on a
    /// network (loopback and `0.0.0.0` would announce what other hosts
    /// cannot reach).
    pub(crate) fn open(node: Arc<NodeCore>) -> Result<Scout, OpenError> {
        use socket2::{Domain, Protocol, Socket, Type};
        let cfg = &node.cfg;
        let group: SocketAddrV4 = cfg.scout_group.parse().map_err(|e| {
            config_err(
                "scout_group",
                format!("{:?} is not ADDRESS:PORT: {e}", cfg.scout_group),
            )
        })?;
        if !group.ip().is_multicast() {
            return Err(config_err(
                "scout_group",
                format!("{} is not an IPv4 multicast address", group.ip()),
            ));
        }
        let iface: Ipv4Addr = cfg.tcp_host.parse().map_err(|_| {
            config_err(
                "tcp_host",
                format!(
                    "scouting needs this host's IPv4 address on the network to scout, not {:?}",
                    cfg.tcp_host
                ),
            )
        })?;
        if iface.is_loopback() || iface.is_unspecified() {
            return Err(config_err(
                "tcp_host",
                format!(
                    "scouting announces tcp_host to other hosts: {iface} is not reachable from them; set this host's address on the network to scout"
                ),
            ));
        }
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
        Ok(Scout {
            sock: s.into(),
            group,
            ifaces,
            node,
        })
    }

    /// Readable when a datagram waits.
    pub(crate) fn fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.sock.as_raw_fd()
    }

    /// The addresses of the interfaces it scouts on, `tcp_host` first.
    pub(crate) fn ifaces(&self) -> &[Ipv4Addr] {
        &self.ifaces
    }

    /// Multicasts `hello`, an encoded [`Hello`], on the interface of
    /// `iface` (a full send buffer drops it: the next one follows within
    /// an interval).
    pub(crate) fn send(&self, iface: Ipv4Addr, hello: &[u8]) {
        let sent = socket2::SockRef::from(&self.sock)
            .set_multicast_if_v4(&iface)
            .and_then(|()| self.sock.send_to(hello, self.group));
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
            let (n, from) = match self.sock.recv_from(&mut buf) {
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
