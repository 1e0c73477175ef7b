//! Node configuration: one typed struct, units in the names.
//!
//! Values come from [`Config::default`], then the environment
//! ([`Config::from_env`]), then code. Every key is documented in
//! `docs/config.md`.

use std::path::PathBuf;
use std::time::Duration;

use crate::error::OpenError;

/// Which transport a node binds its sockets on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// TCP on [`Config::tcp_host`], an ephemeral port unless an endpoint is given.
    Tcp,
    /// Unix-domain sockets in the runtime directory (same host only).
    Ipc,
    /// In-process: reachable only by nodes of the same process.
    Inproc,
}

impl std::str::FromStr for Transport {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "tcp" => Ok(Transport::Tcp),
            "ipc" => Ok(Transport::Ipc),
            "inproc" => Ok(Transport::Inproc),
            other => Err(format!(
                "unknown transport {other:?}: expected tcp, ipc or inproc"
            )),
        }
    }
}

impl Transport {
    /// `tcp`, `ipc` or `inproc`.
    pub fn name(self) -> &'static str {
        match self {
            Transport::Tcp => "tcp",
            Transport::Ipc => "ipc",
            Transport::Inproc => "inproc",
        }
    }
}

/// Configuration of a node. Build it with [`Config::new`] or
/// [`Config::from_env`], change fields, then pass it to
/// [`crate::Node::open_with`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Config {
    /// Where the domain is: `milonga:///lab` (peer-to-peer in domain `lab`).
    pub locator: String,
    /// Readable node name; `@host:pid` is appended.
    pub name: String,
    /// Transport of the sockets the node binds. Default tcp.
    pub transport: Transport,
    /// Interface the tcp sockets bind to, and the address announced.
    /// Default `127.0.0.1`; set a routable address for several hosts.
    pub tcp_host: String,
    /// Fixed data endpoint for best-effort publications (default: ephemeral).
    pub data_endpoint: Option<String>,
    /// Fixed data endpoint for reliable publications (default: ephemeral).
    pub reliable_data_endpoint: Option<String>,
    /// Fixed control endpoint, which static peers query (default: ephemeral).
    pub control_endpoint: Option<String>,
    /// Use `local` discovery (announcement files in the runtime directory). Default true.
    pub local_discovery: bool,
    /// Control endpoints of nodes on other hosts (`static` discovery).
    pub peers: Vec<String>,
    /// Directory for announcements and ipc sockets. Default
    /// `$XDG_RUNTIME_DIR/milonga`, else `/tmp/milonga-<uid>`.
    pub runtime_dir: Option<PathBuf>,
    /// How often the node looks for new or gone peers. Default 20 ms.
    pub discovery_interval_ms: u64,
    /// How often static peers are asked who they are. Default 500 ms.
    pub static_query_interval_ms: u64,
    /// How often the node sends a Milonga heartbeat to the subscribers of
    /// its publications, and the ZMTP heartbeat (PING) interval on every
    /// connection. Default 1000 ms.
    pub heartbeat_interval_ms: i32,
    /// The lease: a subscriber reports a publisher node lost
    /// (`lease_expired`) when no heartbeat came for this long, and a ZMTP
    /// connection silent this long after a PING is closed. Default 3000 ms.
    pub heartbeat_timeout_ms: i32,
    /// How long a new connection may take to complete the ZMTP handshake
    /// before it is closed (and counted in `handshakes_failed`): idle
    /// half-open connections must not hold file descriptors for long.
    /// Default 3000 ms; at least 1.
    pub handshake_timeout_ms: i32,
    /// Largest message a node sends or accepts, in bytes. Default 64 MiB.
    pub max_message_bytes: usize,
    /// Messages queued per subscriber connection by best-effort
    /// publishers; beyond it the subscriber loses samples. Default 1000.
    pub send_hwm: i32,
    /// Messages queued per subscriber connection by reliable publishers,
    /// beyond which `put` waits or samples queue up in a batch (a message is
    /// then a batch of at most 128 KiB). Small, so that samples behind a
    /// busy subscriber are batched early. Default 16.
    pub reliable_send_hwm: i32,
    /// Messages queued per publisher connection on the receiving side.
    /// Default 1000.
    pub recv_hwm: i32,
    /// Kernel socket buffer sizes in bytes (0 = the OS default). Default 0.
    pub tcp_buffer_bytes: i32,
    /// How long closing the last node of a process waits for queued
    /// samples to leave. Default 1000 ms.
    pub close_linger_ms: i32,
    /// Payloads (whole byte strings or typed arrays) of at least this many
    /// bytes travel in their own frame without a copy. Default 64 KiB.
    pub zero_copy_threshold_bytes: usize,
}

impl Config {
    /// Defaults for `locator` and `name`.
    pub fn new(locator: &str, name: &str) -> Self {
        Config {
            locator: locator.to_owned(),
            name: name.to_owned(),
            transport: Transport::Tcp,
            tcp_host: "127.0.0.1".to_owned(),
            data_endpoint: None,
            reliable_data_endpoint: None,
            control_endpoint: None,
            local_discovery: true,
            peers: Vec::new(),
            runtime_dir: None,
            discovery_interval_ms: 20,
            static_query_interval_ms: 500,
            heartbeat_interval_ms: 1000,
            heartbeat_timeout_ms: 3000,
            handshake_timeout_ms: 3000,
            max_message_bytes: 64 << 20,
            send_hwm: 1000,
            reliable_send_hwm: 16,
            recv_hwm: 1000,
            tcp_buffer_bytes: 0,
            close_linger_ms: 1000,
            zero_copy_threshold_bytes: 64 << 10,
        }
    }

    /// Defaults, then the `MILONGA_*` environment variables (see
    /// docs/config.md). `locator` is used when `MILONGA_LOCATOR` is unset.
    pub fn from_env(locator: &str, name: &str) -> Result<Self, OpenError> {
        let mut c = Config::new(locator, name);
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        if let Some(t) = var("MILONGA_TRANSPORT") {
            c.transport = t.parse().map_err(|why| OpenError::Config {
                key: "MILONGA_TRANSPORT".into(),
                why,
            })?;
        }
        if let Some(h) = var("MILONGA_TCP_HOST") {
            c.tcp_host = h;
        }
        if let Some(p) = var("MILONGA_PEERS") {
            c.peers = p.split(',').map(|s| s.trim().to_owned()).collect();
        }
        if let Some(d) = var("MILONGA_RUNTIME_DIR") {
            c.runtime_dir = Some(PathBuf::from(d));
        }
        if let Some(e) = var("MILONGA_CONTROL_ENDPOINT") {
            c.control_endpoint = Some(e);
        }
        if let Some(e) = var("MILONGA_DATA_ENDPOINT") {
            c.data_endpoint = Some(e);
        }
        if let Some(e) = var("MILONGA_RELIABLE_DATA_ENDPOINT") {
            c.reliable_data_endpoint = Some(e);
        }
        for (k, slot) in [
            ("MILONGA_SEND_HWM", &mut c.send_hwm),
            ("MILONGA_RELIABLE_SEND_HWM", &mut c.reliable_send_hwm),
            ("MILONGA_RECV_HWM", &mut c.recv_hwm),
        ] {
            if let Some(v) = var(k) {
                *slot = v.parse().map_err(|e| OpenError::Config {
                    key: k.into(),
                    why: format!("{v:?} is not a message count: {e}"),
                })?;
            }
        }
        for (k, slot) in [
            (
                "MILONGA_HEARTBEAT_INTERVAL_MS",
                &mut c.heartbeat_interval_ms,
            ),
            ("MILONGA_HEARTBEAT_TIMEOUT_MS", &mut c.heartbeat_timeout_ms),
            ("MILONGA_HANDSHAKE_TIMEOUT_MS", &mut c.handshake_timeout_ms),
        ] {
            if let Some(v) = var(k) {
                *slot = v.parse().map_err(|e| OpenError::Config {
                    key: k.into(),
                    why: format!("{v:?} is not a number of milliseconds: {e}"),
                })?;
            }
        }
        if let Some(v) = var("MILONGA_MAX_MESSAGE_BYTES") {
            c.max_message_bytes = v.parse().map_err(|e| OpenError::Config {
                key: "MILONGA_MAX_MESSAGE_BYTES".into(),
                why: format!("{v:?} is not a byte count: {e}"),
            })?;
        }
        if let Some(v) = var("MILONGA_LOCAL_DISCOVERY") {
            c.local_discovery = !matches!(v.as_str(), "0" | "false" | "off" | "no");
        }
        Ok(c)
    }

    /// The runtime directory, and whether it is the default shared
    /// location (which must then be private to this user).
    pub(crate) fn runtime_root_checked(&self) -> (PathBuf, bool) {
        (self.runtime_root(), self.runtime_dir.is_none())
    }

    pub(crate) fn runtime_root(&self) -> PathBuf {
        if let Some(d) = &self.runtime_dir {
            return d.clone();
        }
        if let Some(x) = std::env::var_os("XDG_RUNTIME_DIR").filter(|x| !x.is_empty()) {
            return PathBuf::from(x).join("milonga");
        }
        // SAFETY: getuid has no preconditions and cannot fail.
        let uid = unsafe { libc::getuid() };
        PathBuf::from(format!("/tmp/milonga-{uid}"))
    }

    pub(crate) fn discovery_interval(&self) -> Duration {
        Duration::from_millis(self.discovery_interval_ms.max(1))
    }
}

/// A parsed locator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Locator {
    pub domain: String,
}

/// The longest domain name.
pub const MAX_DOMAIN_BYTES: usize = 64;

pub(crate) fn parse_locator(s: &str) -> Result<Locator, OpenError> {
    let bad = |why: &str| OpenError::BadLocator {
        locator: s.to_owned(),
        why: why.to_owned(),
    };
    let (scheme, rest) = s
        .split_once("://")
        .ok_or_else(|| bad("expected scheme://..., such as milonga:///lab"))?;
    match scheme {
        "milonga" => {}
        "file" => {
            return Err(OpenError::Unsupported {
                what: format!("{s}: the file domain (record/replay) comes in a later version"),
            })
        }
        _ => return Err(bad("the scheme must be milonga")),
    }
    let (authority, path) = rest
        .split_once('/')
        .ok_or_else(|| bad("no domain: expected milonga:///DOMAIN"))?;
    if !authority.is_empty() {
        return Err(OpenError::Unsupported {
            what: format!("{s}: brokered domains (milonga://host:port/domain) come in a later version; use milonga:///{path} for peer-to-peer"),
        });
    }
    if path.is_empty() || path.len() > MAX_DOMAIN_BYTES {
        return Err(bad("the domain name must have 1 to 64 characters"));
    }
    if !path
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        || !path.as_bytes()[0].is_ascii_alphanumeric()
    {
        return Err(bad(
            "the domain name must start with an ASCII letter or digit and hold only letters, digits, '-', '_' and '.'",
        ));
    }
    Ok(Locator {
        domain: path.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locators() {
        assert_eq!(parse_locator("milonga:///lab").unwrap().domain, "lab");
        assert!(matches!(
            parse_locator("milonga://host:1/lab"),
            Err(OpenError::Unsupported { .. })
        ));
        assert!(matches!(
            parse_locator("file:///x.mlg"),
            Err(OpenError::Unsupported { .. })
        ));
        for bad in [
            "lab",
            "milonga:///..",
            "milonga:///.x",
            "http:///lab",
            "milonga:///",
            "milonga:///a/b",
            "milonga://",
        ] {
            assert!(
                matches!(parse_locator(bad), Err(OpenError::BadLocator { .. })),
                "{bad}"
            );
        }
    }
}
