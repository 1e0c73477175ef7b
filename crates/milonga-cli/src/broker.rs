//! `milonga broker`: serves nodes opened on `milonga://HOST:PORT/DOMAIN`
//! (docs/broker.md) until SIGINT, SIGTERM or SIGHUP.

use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use milonga::broker::{Broker, BrokerOptions, DEFAULT_PORT, MAX_DOMAINS};

#[derive(Args, Debug)]
pub struct BrokerArgs {
    /// Where clients reach it: tcp://HOST:PORT (port 0: a free one, told
    /// on the first line of output).
    #[arg(long, default_value_t = format!("tcp://127.0.0.1:{DEFAULT_PORT}"))]
    pub listen: String,
    /// A domain to serve (repeat for several). Without any: every domain
    /// that a client, a registered node or a linked broker names, each
    /// opened when first named (at most --max-domains).
    #[arg(long = "domain")]
    pub domains: Vec<String>,
    /// Most domains served without --domain (at most 24): a request
    /// naming one more is refused, and counted (domains_refused).
    #[arg(long, default_value_t = 16,
          value_parser = clap::value_parser!(u64).range(1..=MAX_DOMAINS as u64))]
    pub max_domains: u64,
    /// Without --domain: a domain closes after this long (ms, at least
    /// --lease-ms) without a client, a registered node or a linked broker
    /// naming it, and opens again when named again.
    #[arg(long, default_value_t = 60_000,
          value_parser = clap::value_parser!(u64).range(1..=MAX_MS))]
    pub domain_idle_ms: u64,
    /// How often clients attach, in ms (10 to 60,000).
    #[arg(long, default_value_t = 250,
          value_parser = clap::value_parser!(u64).range(10..=60_000))]
    pub attach_interval_ms: u64,
    /// A client silent this long is forgotten, and a broker silent this
    /// long is lost to its clients (ms; 100 to 3,600,000, and at least
    /// twice --attach-interval-ms).
    #[arg(long, default_value_t = 3000,
          value_parser = clap::value_parser!(u64).range(100..=3_600_000))]
    pub lease_ms: u64,
    /// How long a reliable message waits for a full client before it is
    /// dropped for that client (ms); other publishers' messages do not
    /// wait (docs/broker.md).
    #[arg(long, default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(0..=86_400_000))]
    pub stall_ms: u64,
    /// MiB of reliable messages held, per domain, for clients whose queue
    /// is full before the broker stops reading the publishers until they
    /// have room (docs/broker.md).
    #[arg(long, default_value_t = 16,
          value_parser = clap::value_parser!(u64).range(1..=65_536))]
    pub hold_mib: u64,
    /// Registry mode: most endpoints of registered nodes' publishers it
    /// connects to for its clients, a domain (each a connection and a
    /// file descriptor); past it, such a node is left out of the clients'
    /// view, counted (registered_unconnected).
    #[arg(long, default_value_t = 1024,
          value_parser = clap::value_parser!(u64).range(2..=65_536))]
    pub max_registered_connected: u64,
    /// Link to the broker listening at tcp://HOST:PORT (repeat for
    /// several): brokers linked in any graph form a federation whose
    /// clients see each other (docs/broker.md). One end naming the other
    /// is enough; with security on, NAME@tcp://HOST:PORT names the peer's
    /// key (NAME.pub in the trust directory), and each end names the other
    /// (or both hold one identity).
    #[arg(long = "peer-broker", value_name = "[NAME@]tcp://HOST:PORT")]
    pub peers: Vec<String>,
    /// Print a JSON line with the broker's counters every second (and
    /// its endpoints first).
    #[arg(long)]
    pub json: bool,
    /// Stop after this many seconds (default: at SIGINT, SIGTERM or SIGHUP).
    #[arg(long, value_parser = crate::args::seconds)]
    pub duration: Option<f64>,
    /// Listen with security off on an address other hosts can reach:
    /// only on a network where every host is trusted (docs/broker.md).
    /// Without it, security is on there (the default, auto).
    #[arg(long)]
    pub insecure: bool,
}

/// The longest of the broker's times in ms: 10^9 s, as the other
/// options' (`crate::args::MAX_SECONDS`).
const MAX_MS: u64 = 1_000_000_000_000;

pub fn run(net: &crate::NetArgs, a: BrokerArgs) -> Result<ExitCode> {
    // A node's option a broker does not take, refused rather than
    // quietly ignored. (`--peer` is `--peer-broker` here: one argument.)
    if net.node_name.is_some() {
        bail!("--node-name is a node's, which a broker does not take (it is named by its id, and listens at --listen)");
    }
    // What the options' ranges alone cannot say, refused before anything
    // starts (the library would quietly raise a value to its least).
    if a.lease_ms < 2 * a.attach_interval_ms {
        bail!(
            "--lease-ms {} is less than twice --attach-interval-ms {}: clients would be forgotten between their attaches",
            a.lease_ms,
            a.attach_interval_ms
        );
    }
    if a.domains.is_empty() && a.domain_idle_ms < a.lease_ms {
        bail!(
            "--domain-idle-ms {} is less than --lease-ms {}: a domain would close while its clients still hold it",
            a.domain_idle_ms,
            a.lease_ms
        );
    }
    if net.acl_file.is_some() {
        bail!("a broker applies no access-control rules in this version (docs/broker.md \"Security\"): --acl is for nodes; without it every trusted key may publish, subscribe, serve and call through the broker");
    }
    crate::catch_interrupts();
    // The global security flags are the broker's (docs/broker.md
    // "Security"); --key alone turns it on, as for a node.
    let security = match (net.security, &net.key_file) {
        (Some(s), _) => s,
        (None, Some(_)) => milonga::Security::On,
        (None, None) => milonga::Security::Auto,
    };
    let broker = Broker::start(BrokerOptions {
        security,
        key_file: net.key_file.clone(),
        trust_dir: net.trust_dir.clone(),
        listen: a.listen.clone(),
        domains: a.domains.clone(),
        attach_interval_ms: a.attach_interval_ms,
        lease_ms: a.lease_ms,
        stall_ms: a.stall_ms,
        hold_mib: a.hold_mib,
        insecure: a.insecure,
        peers: a.peers.clone(),
        max_domains: a.max_domains as usize,
        max_registered_connected: a.max_registered_connected as usize,
        domain_idle_ms: a.domain_idle_ms,
        ..Default::default()
    })
    .with_context(|| format!("cannot start a broker at {}", a.listen))?;
    let locators: Vec<String> = a.domains.iter().map(|d| broker.locator(d)).collect();
    // A line on stdout; a reader gone (`| head`) stops the broker, which
    // then says nothing more.
    let say = |line: &dyn std::fmt::Display| -> std::io::Result<()> {
        let mut o = std::io::stdout().lock();
        writeln!(o, "{line}")?;
        o.flush()
    };
    let said = (|| -> std::io::Result<()> {
        if a.json {
            let line = serde_json::json!({
                "event": "listening",
                "listen": broker.listen_endpoint(),
                "broker_id": broker.id(),
                "locators": locators,
                "every_domain": broker.serves_every_domain(),
                "endpoints": broker.endpoints(),
                "key": broker.public_key().map(|k| k.to_z85()),
            });
            say(&line)?;
        } else {
            say(&format_args!(
                "broker {} listening at {}",
                broker.id(),
                broker.listen_endpoint()
            ))?;
            match broker.public_key() {
                Some(k) => say(&format_args!(
                    "  security on: key {} (clients trust its .pub and open NAME@HOST:PORT)",
                    k.fingerprint()
                ))?,
                None => say(&"  security off")?,
            }
            for p in &a.peers {
                say(&format_args!("  links to {p}"))?;
            }
            for l in &locators {
                say(&format_args!("  clients open {l}"))?;
            }
            if broker.serves_every_domain() {
                say(&format_args!(
                    "  clients open {} for any DOMAIN (at most {})",
                    broker.locator("DOMAIN"),
                    a.max_domains
                ))?;
            }
        }
        let start = Instant::now();
        let mut next = start + Duration::from_secs(1);
        while !crate::interrupted() && a.duration.is_none_or(|d| start.elapsed().as_secs_f64() < d)
        {
            std::thread::sleep(Duration::from_millis(50));
            if a.json && Instant::now() >= next {
                next += Duration::from_secs(1);
                say(&serde_json::json!({"event": "stats", "stats": broker.stats()}))?;
            }
        }
        Ok(())
    })();
    let stats = broker.stats();
    broker.stop();
    said?;
    if a.json {
        say(&serde_json::json!({"event": "stopped", "stats": stats}))?;
    } else {
        say(&"broker stopped")?;
    }
    Ok(ExitCode::SUCCESS)
}
