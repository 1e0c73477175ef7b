//! Which addresses a node binds and announces when `tcp_host` is `auto`:
//! those of every interface that is up, multicast-capable and not
//! loopback, among those `interfaces` names (by name or CIDR) when it
//! names any. The first is the one its announcement names; the node binds
//! the same ports on the others (docs/discovery.md).

use std::net::Ipv4Addr;

use crate::util::sys::{ipv4_interfaces, Ipv4Iface};

/// Whether `iface` is one that `wanted` names: its name, or a CIDR
/// (`10.0.0.0/8`) holding its address.
fn named(iface: &Ipv4Iface, wanted: &str) -> bool {
    if let Some((net, len)) = wanted.split_once('/') {
        let (Ok(net), Ok(len)) = (net.parse::<Ipv4Addr>(), len.parse::<u32>()) else {
            return false;
        };
        if len > 32 {
            return false;
        }
        let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
        return u32::from(iface.addr) & mask == u32::from(net) & mask;
    }
    iface.name == wanted
}

/// The addresses to use among `all` (at least one, each once, in the
/// kernel's order), or why there is none.
fn choose(all: &[Ipv4Iface], wanted: &[String]) -> Result<Vec<Ipv4Addr>, String> {
    let mut chosen: Vec<Ipv4Addr> = Vec::new();
    for i in all
        .iter()
        .filter(|i| i.up && i.multicast && !i.loopback)
        .filter(|i| wanted.is_empty() || wanted.iter().any(|w| named(i, w)))
    {
        if !chosen.contains(&i.addr) {
            chosen.push(i.addr);
        }
    }
    Some(chosen).filter(|c| !c.is_empty()).ok_or_else(|| {
        let have: Vec<String> = all
            .iter()
            .map(|i| {
                let mut f = Vec::new();
                if !i.up {
                    f.push("down");
                }
                if !i.multicast {
                    f.push("no multicast");
                }
                if i.loopback {
                    f.push("loopback");
                }
                let f = if f.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", f.join(", "))
                };
                format!("{} {}/{}{f}", i.name, i.addr, i.prefix)
            })
            .collect();
        let which = if wanted.is_empty() {
            "no interface is up, multicast-capable and not loopback".to_owned()
        } else {
            format!("no usable interface matches interfaces = {wanted:?}")
        };
        format!(
            "tcp_host is auto, but {which}; this host has: {}",
            have.join("; ")
        )
    })
}

/// The addresses for `tcp_host = auto` on this host, the first the one
/// announced.
pub(crate) fn pick(wanted: &[String]) -> Result<Vec<Ipv4Addr>, String> {
    choose(&ipv4_interfaces(), wanted)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iface(name: &str, addr: [u8; 4], up: bool, multicast: bool, loopback: bool) -> Ipv4Iface {
        Ipv4Iface {
            name: name.into(),
            addr: addr.into(),
            prefix: 24,
            up,
            multicast,
            loopback,
        }
    }

    #[test]
    fn auto_takes_every_usable_interface_that_interfaces_names() {
        let all = [
            iface("lo", [127, 0, 0, 1], true, false, true),
            iface("eth0", [10, 0, 0, 5], false, true, false),
            iface("eth1", [192, 168, 1, 7], true, true, false),
            iface("docker0", [172, 17, 0, 1], true, true, false),
        ];
        let w = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            choose(&all, &[]),
            Ok(vec![
                Ipv4Addr::new(192, 168, 1, 7),
                Ipv4Addr::new(172, 17, 0, 1)
            ]),
            "eth0 is down, lo is loopback"
        );
        assert_eq!(
            choose(&all, &w(&["docker0"])),
            Ok(vec![Ipv4Addr::new(172, 17, 0, 1)])
        );
        assert_eq!(
            choose(&all, &w(&["172.16.0.0/12", "eth1"])),
            Ok(vec![
                Ipv4Addr::new(192, 168, 1, 7),
                Ipv4Addr::new(172, 17, 0, 1)
            ])
        );
        let e = choose(&all, &w(&["eth0", "lo"])).unwrap_err();
        assert!(
            e.contains("eth0 10.0.0.5/24 (down)")
                && e.contains("lo 127.0.0.1/24 (no multicast, loopback)"),
            "{e}"
        );
        assert!(choose(&all, &w(&["10.0.0.0/33"])).is_err());
    }

    #[test]
    fn this_host_lists_its_loopback() {
        assert!(ipv4_interfaces()
            .iter()
            .any(|i| i.loopback && i.addr.is_loopback()));
    }
}
