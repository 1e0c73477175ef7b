//! Filters applied at the publisher (docs/protocol.md §4.4).
//!
//! A subscription with a filter subscribes to `@f/<id>/<its prefixes>` and
//! declares the filter to each publisher it connects to. A publisher's data
//! socket keeps each distinct filter once (by id), evaluates it once per
//! sample of a key it matches, and sends the samples that pass under
//! `@f/<id>/<key>`, numbered per (filter, key): what does not pass never
//! crosses the wire. A filter is forgotten when no subscription holds its
//! prefix any more.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use milonga_wire::cbor::{decode_payload, Encoded};
use milonga_wire::filter::{changed, Declaration, Expr, Filter, FILTERED_KEY_PREFIX};
use milonga_wire::frame::{self, Encoding, Header, Kind};
use milonga_wire::{Bytes, Key, KeyExpr, Value};

use super::outlet::Outlet;
use super::Me;
use crate::util::stats;

/// Most distinct filters a data socket keeps.
pub(crate) const MAX_FILTERS: usize = 256;

/// What one key last sent through one filter.
#[derive(Debug, Default)]
struct KeyState {
    last_value: Option<Value>,
    last_sent: Option<Instant>,
    seq: u64,
}

/// One distinct filter declared to a data socket.
#[derive(Debug)]
pub(crate) struct PubFilter {
    keys: KeyExpr,
    filter: Filter,
    expr: Option<Expr>,
    /// `@f/<id>/`
    prefix: String,
    per_key: HashMap<String, KeyState>,
}

impl PubFilter {
    /// Whether the sample passes; updates the key's state when it does.
    fn pass(&mut self, key: &str, value: &Value, me: &Me) -> bool {
        stats::inc(&me.counters.filter_evaluations);
        if let Some(e) = &self.expr {
            match e.eval(value) {
                Ok(true) => {}
                Ok(false) => return false,
                Err(err) => {
                    let n = me
                        .counters
                        .filter_errors
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                        + 1;
                    if n <= 10 || n % 1000 == 0 {
                        limited!(warn, filter = %self.filter.canonical(), %key, %err, "a filter could not be evaluated on a sample; it did not pass");
                    }
                    return false;
                }
            }
        }
        let st = self.per_key.entry(key.to_owned()).or_default();
        let now = Instant::now();
        if let (Some(p), Some(t)) = (self.filter.min_period_ms, st.last_sent) {
            if now.duration_since(t) < Duration::from_millis(p) {
                return false;
            }
        }
        let (abs, rel) = (self.filter.abs_change, self.filter.rel_change);
        if abs.is_some() || rel.is_some() {
            if let Some(old) = &st.last_value {
                if !changed(old, value, abs, rel) {
                    return false;
                }
            }
            st.last_value = Some(value.clone());
        }
        st.last_sent = Some(now);
        true
    }
}

/// Registers a filter declared to data socket `d` (if it names this node
/// and socket). Malformed ones are counted and dropped.
pub(super) fn declare(d: &mut Outlet, me: &Me, msg: &[u8]) {
    let decl = match Declaration::decode(msg) {
        Ok(x) => x,
        Err(err) => {
            stats::inc(&me.counters.filters_malformed);
            limited!(warn, %err, "dropped a malformed filter declaration");
            return;
        }
    };
    if decl.node != me.id.to_hex() || decl.socket != d.name {
        return;
    }
    let id = decl.filter.id_for(&decl.keys);
    if d.filters.contains_key(&id) {
        return;
    }
    if d.filters.len() >= MAX_FILTERS {
        stats::inc(&me.counters.filters_refused);
        tracing::warn!(
            limit = MAX_FILTERS,
            "refused a filter: this socket keeps too many"
        );
        return;
    }
    let (Ok(keys), Ok(expr)) = (KeyExpr::new(decl.keys.as_str()), decl.filter.validate()) else {
        stats::inc(&me.counters.filters_malformed);
        return;
    };
    stats::inc(&me.counters.filters_declared);
    d.filters.insert(
        id.clone(),
        PubFilter {
            keys,
            filter: decl.filter,
            expr,
            prefix: format!("{FILTERED_KEY_PREFIX}{id}/"),
            per_key: HashMap::new(),
        },
    );
}

/// Forgets the filters no subscription holds any more.
pub(super) fn prune(d: &mut Outlet) {
    let subs = &d.subscriptions;
    d.filters
        .retain(|_, f| subs.keys().any(|p| p.starts_with(f.prefix.as_bytes())));
}

/// The frames of sample `seq` of `key` for every filter it passes, each
/// evaluated once. Runs under the data socket's lock, after the sample was
/// accepted; a frame the socket then refuses counts as `filtered_dropped`.
pub(super) fn apply(
    d: &mut Outlet,
    me: &Me,
    key: &str,
    timestamp_ns: u64,
    enc: &Encoded,
    schema_id: u32,
    flags: u8,
) -> Vec<Vec<u8>> {
    // The value is decoded only for keys some filter selects.
    if !d.filters.values().any(|f| f.keys.matches(key)) {
        return Vec::new();
    }
    let payload = match &enc.tail {
        None => enc.head.clone(),
        Some(t) => {
            let mut v = Vec::with_capacity(enc.head.len() + t.len());
            v.extend_from_slice(&enc.head);
            v.extend_from_slice(t);
            Bytes::from(v)
        }
    };
    let value = match enc.encoding {
        Encoding::Raw => Value::Bytes(payload.clone()),
        // A schema'd sample is filtered on its named fields.
        Encoding::Compact => match d.schemas.get(&schema_id).map(|(_, p)| p.read(&payload)) {
            Some(Ok(v)) => v,
            _ => return Vec::new(),
        },
        e => match decode_payload(e, payload.clone(), None) {
            Ok(v) => v,
            Err(_) => return Vec::new(),
        },
    };
    let mut out = Vec::new();
    for f in d.filters.values_mut() {
        if !f.keys.matches(key) || !f.pass(key, &value, me) {
            continue;
        }
        let st = f.per_key.entry(key.to_owned()).or_default();
        st.seq += 1;
        let Ok(k) = Key::internal(format!("{}{key}", f.prefix)) else {
            // The prefixed key is longer than a key may be.
            stats::inc(&me.counters.filtered_dropped);
            continue;
        };
        let header = Header {
            kind: Kind::Sample,
            flags,
            encoding: enc.encoding,
            domain_tag: me.domain_tag,
            schema_id,
            node_id: me.id,
            seq: st.seq,
            timestamp_ns,
        };
        out.push(frame::encode(&k, &header, &payload));
    }
    out
}
