//! Which publishers a subscription follows: from the announcements
//! discovery holds, the endpoints to connect to and the publications that
//! match (docs/protocol.md §9.2). No I/O.

use std::collections::{BTreeMap, BTreeSet};

use milonga_wire::{KeyExpr, NodeId};

use crate::model::qos::Reliability;
use milonga_wire::announce::Announcement;

/// A publication a subscription matches, as announced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MatchedPublication {
    /// The data endpoint serving it.
    pub endpoint: String,
    /// That data socket's name in history queries and filter declarations.
    pub socket: String,
    pub reliability: Reliability,
    /// Samples kept per key.
    pub history: usize,
    /// The schema its samples are written with, if any.
    pub schema: Option<u32>,
}

/// Where a subscription connects, and what it should know of its
/// publishers: computed from discovery by [`routes_for`].
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Routes {
    /// Data and liveliness endpoints to connect to.
    pub endpoints: BTreeSet<String>,
    /// Liveliness endpoint -> its node.
    pub liveliness: BTreeMap<String, NodeId>,
    /// Nodes publishing a matching key -> their names.
    pub publishers: BTreeMap<NodeId, String>,
    /// Matching keys announced by those nodes.
    pub keys: BTreeSet<String>,
    /// Each matching publication, by (node, key).
    pub publications: BTreeMap<(NodeId, String), MatchedPublication>,
    /// Every node alive in the domain: sequence state of others is
    /// forgotten.
    pub live: BTreeSet<NodeId>,
    /// The key (Z85) each live node that has one announces: with security
    /// on, a frame naming the node is taken only from a connection to
    /// that key's holder.
    pub node_keys: BTreeMap<NodeId, String>,
    /// Every data endpoint those nodes announce (matching or not): a
    /// connection to one that is no longer announced by its live node (it
    /// moved: another address of a node on several networks) is closed.
    pub announced: BTreeSet<String>,
}

/// The routes of a subscription to `expr`, given every peer's
/// announcement (this node's own included). An `inproc` endpoint of
/// another process is not reachable and is left out.
pub(crate) fn routes_for(expr: &KeyExpr, peers: &[&Announcement]) -> Routes {
    let mut r = Routes::default();
    let me = std::process::id();
    for a in peers {
        let Some(id) = a.id() else { continue };
        r.live.insert(id);
        // The key its frames come with: a secured broker's that shows it
        // (and vouches for them), else its own.
        if let Some(k) = a.via.as_ref().or(a.key.as_ref()) {
            r.node_keys.insert(id, k.clone());
        }
        r.announced.extend(a.data_endpoints().map(str::to_owned));
        let mut matched = false;
        for p in &a.publications {
            if !expr.matches(&p.key) {
                continue;
            }
            if let Some(ep) = a.publication_endpoint(p) {
                if ep.starts_with("inproc://") && a.pid != me {
                    continue;
                }
                r.endpoints.insert(ep.to_owned());
                r.keys.insert(p.key.clone());
                r.publications.insert(
                    (id, p.key.clone()),
                    MatchedPublication {
                        endpoint: ep.to_owned(),
                        socket: p.socket_name().to_owned(),
                        reliability: p.reliability,
                        history: p.history,
                        schema: p.schema,
                    },
                );
                matched = true;
            }
        }
        if matched {
            r.publishers.insert(id, a.name.clone());
            if let Some(ep) = &a.liveliness {
                r.endpoints.insert(ep.clone());
                r.liveliness.insert(ep.clone(), id);
            }
        }
    }
    r
}

/// Node `n`'s announcement for the engine's tests: process `pid`,
/// endpoints `tcp://127.0.0.1:5<n>00` (control), `..01` (best effort),
/// `..02` (reliable), `..03` (liveliness), and one publication per
/// (key, reliability, history depth).
#[cfg(test)]
pub(crate) fn test_announcement(
    n: u8,
    pid: u32,
    pubs: &[(&str, Reliability, usize)],
) -> Announcement {
    Announcement {
        protocol: 1,
        domain: "lab".into(),
        node_id: NodeId([n; 16]).to_hex(),
        name: format!("n{n}"),
        host: "h".into(),
        pid,
        start_time: 0,
        control: format!("tcp://127.0.0.1:5{n}00"),
        data_best_effort: Some(format!("tcp://127.0.0.1:5{n}01")),
        data_reliable: Some(format!("tcp://127.0.0.1:5{n}02")),
        liveliness: Some(format!("tcp://127.0.0.1:5{n}03")),
        publications: pubs
            .iter()
            .map(|(k, r, h)| milonga_wire::announce::PublicationInfo {
                key: (*k).into(),
                reliability: *r,
                history: *h,
                endpoint: None,
                socket: None,
                schema: None,
            })
            .collect(),
        services: vec![],
        key: None,
        id_salt: None,
        via: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(n: u8, pid: u32, pubs: &[(&str, Reliability)]) -> Announcement {
        let pubs: Vec<_> = pubs.iter().map(|(k, r)| (*k, *r, 3)).collect();
        test_announcement(n, pid, &pubs)
    }

    #[test]
    fn a_subscription_follows_only_the_nodes_that_publish_what_it_matches() {
        use Reliability::*;
        let a = node(
            1,
            1,
            &[("sr/ps/1/current", BestEffort), ("other/x", Reliable)],
        );
        let b = node(2, 2, &[("sr/ps/2/current", Reliable)]);
        let c = node(3, 3, &[("other/y", BestEffort)]);
        let r = routes_for(&KeyExpr::new("sr/ps/*/current").unwrap(), &[&a, &b, &c]);
        let ids = |ns: &[u8]| ns.iter().map(|n| NodeId([*n; 16])).collect::<BTreeSet<_>>();
        // Every node is alive; only 1 and 2 are followed.
        assert_eq!(r.live, ids(&[1, 2, 3]));
        assert_eq!(
            r.publishers.keys().copied().collect::<BTreeSet<_>>(),
            ids(&[1, 2])
        );
        // The data endpoint of the matching publication's reliability and
        // the liveliness endpoint of each; nothing of node 3.
        let want: BTreeSet<String> = [
            "tcp://127.0.0.1:5101",
            "tcp://127.0.0.1:5103",
            "tcp://127.0.0.1:5202",
            "tcp://127.0.0.1:5203",
        ]
        .map(String::from)
        .into();
        assert_eq!(r.endpoints, want);
        assert_eq!(r.keys.len(), 2);
        let p = &r.publications[&(NodeId([2; 16]), "sr/ps/2/current".to_owned())];
        assert_eq!((p.reliability, p.history), (Reliable, 3));
        assert_eq!(r.liveliness["tcp://127.0.0.1:5103"], NodeId([1; 16]));
    }

    #[test]
    fn an_inproc_endpoint_of_another_process_is_left_out() {
        let mut a = node(1, std::process::id() + 1, &[("k", Reliability::BestEffort)]);
        a.data_best_effort = Some("inproc://milonga-x-be".into());
        let mut mine = a.clone();
        mine.pid = std::process::id();
        let expr = KeyExpr::new("k").unwrap();
        let r = routes_for(&expr, &[&a]);
        assert!(r.endpoints.is_empty() && r.publishers.is_empty(), "{r:?}");
        assert_eq!(r.live.len(), 1, "the node is still alive");
        let r = routes_for(&expr, &[&mine]);
        assert!(r.endpoints.contains("inproc://milonga-x-be"), "{r:?}");
    }

    #[test]
    fn a_publication_served_on_a_socket_of_its_own_is_followed_there() {
        use Reliability::*;
        let mut a = node(1, 1, &[("sr/ps/1", BestEffort), ("sr/rf/1", BestEffort)]);
        a.publications[1].endpoint = Some("tcp://127.0.0.1:5109".into());
        a.publications[1].socket = Some("best_effort/2".into());
        let r = routes_for(&KeyExpr::new("sr/rf/*").unwrap(), &[&a]);
        let want: BTreeSet<String> = ["tcp://127.0.0.1:5109", "tcp://127.0.0.1:5103"]
            .map(String::from)
            .into();
        assert_eq!(r.endpoints, want, "its own endpoint, not the node's");
        let p = &r.publications[&(NodeId([1; 16]), "sr/rf/1".to_owned())];
        assert_eq!(p.socket, "best_effort/2", "queries name its socket");
        // Both data endpoints are the node's: a connection to either stays.
        assert!(r.announced.contains("tcp://127.0.0.1:5101"));
        assert!(r.announced.contains("tcp://127.0.0.1:5109"));
        // Without the field, the node's endpoint of its reliability.
        let r = routes_for(&KeyExpr::new("sr/ps/*").unwrap(), &[&a]);
        assert!(r.endpoints.contains("tcp://127.0.0.1:5101"), "{r:?}");
        let p = &r.publications[&(NodeId([1; 16]), "sr/ps/1".to_owned())];
        assert_eq!(p.socket, "best_effort");
        // Announced only when set.
        let json = String::from_utf8(a.to_json()).unwrap();
        assert_eq!(json.matches("\"endpoint\"").count(), 1, "{json}");
        assert_eq!(Announcement::from_json(json.as_bytes()).unwrap(), a);
    }

    #[test]
    fn an_announcement_with_a_bad_node_id_is_skipped() {
        let mut a = node(1, 1, &[("k", Reliability::BestEffort)]);
        a.node_id = "not hex".into();
        let r = routes_for(&KeyExpr::new("k").unwrap(), &[&a]);
        assert_eq!(r, Routes::default());
    }
}
