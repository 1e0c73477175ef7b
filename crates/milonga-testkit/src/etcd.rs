//! A real etcd (Debian's `etcd-server`, installed by `make setup`) on
//! loopback, for the test and the benchmark of `discovery = etcd`: one
//! member, its data in a directory of the caller's, killed when dropped.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::{free_port, Proc};

/// One etcd member.
#[derive(Debug)]
pub struct Etcd {
    proc: Proc,
    dir: PathBuf,
    /// Its client URL (`http://127.0.0.1:PORT`).
    pub url: String,
    client: u16,
    peer: u16,
    /// Options given to every start.
    args: Vec<String>,
}

impl Etcd {
    /// etcd on two free ports, its data under `dir`. A port found free
    /// may be taken by another process before etcd binds it, and etcd
    /// then exits: other ports are tried, five pairs in all.
    pub fn start(dir: &Path, timeout: Duration) -> Result<Etcd, String> {
        Etcd::start_with(dir, timeout, &[])
    }

    /// The same, with more of etcd's options (`--max-request-bytes`, ...).
    pub fn start_with(dir: &Path, timeout: Duration, args: &[&str]) -> Result<Etcd, String> {
        let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        let mut last = String::new();
        for _ in 0..5 {
            match Etcd::on(dir, free_port(), free_port(), timeout, &args) {
                Ok(e) => return Ok(e),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Starts it again on the same ports and data (after [`Etcd::kill9`]).
    pub fn restart(&mut self, timeout: Duration) -> Result<(), String> {
        *self = Etcd::on(&self.dir, self.client, self.peer, timeout, &self.args)?;
        Ok(())
    }

    /// Starts it again on the same ports with no data (as etcd restored
    /// from an old snapshot: its revision behind what its watchers saw).
    pub fn restart_empty(&mut self, timeout: Duration) -> Result<(), String> {
        let _ = std::fs::remove_dir_all(self.dir.join(format!("etcd-{}", self.client)));
        self.restart(timeout)
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }

    /// Kills it with SIGKILL.
    pub fn kill9(&mut self) {
        self.proc.kill9();
    }

    /// etcd on `client` and `peer`, once it answers a range (its port opens
    /// before it has elected itself leader).
    fn on(
        dir: &Path,
        client: u16,
        peer: u16,
        timeout: Duration,
        args: &[String],
    ) -> Result<Etcd, String> {
        let url = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let mut cmd = std::process::Command::new("etcd");
        // A data directory per client port: an attempt that failed leaves
        // nothing for the next, and a restart finds its data again.
        cmd.arg("--data-dir")
            .arg(dir.join(format!("etcd-{client}")))
            .args([
                "--listen-client-urls",
                &url,
                "--advertise-client-urls",
                &url,
            ])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("default={peer_url}")])
            .args(args)
            .stderr(std::process::Stdio::null());
        let mut proc = Proc::spawn(cmd);
        let end = Instant::now() + timeout;
        while !answers(client) {
            if let Some(status) = proc.wait_exit(Duration::ZERO) {
                return Err(format!("etcd on port {client} exited: {status}"));
            }
            if Instant::now() > end {
                return Err(format!(
                    "etcd on port {client} did not answer in {timeout:?}"
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(Etcd {
            proc,
            dir: dir.to_path_buf(),
            url,
            client,
            peer,
            args: args.to_vec(),
        })
    }

    /// POSTs the JSON `body` to `path` of its gateway (`/v3/kv/put`, ...):
    /// the answer's status line and body.
    pub fn post(&self, path: &str, body: &str) -> Result<String, String> {
        post(self.client, path, body)
    }
}

/// Base64, as the gateway's JSON carries keys and values.
pub fn b64(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn post(port: u16, path: &str, body: &str) -> Result<String, String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    let req = format!(
        "POST {path} HTTP/1.0\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut answer = String::new();
    s.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
    s.read_to_string(&mut answer).map_err(|e| e.to_string())?;
    Ok(answer)
}

/// Whether etcd's JSON gateway on `port` answers a range.
fn answers(port: u16) -> bool {
    post(port, "/v3/kv/range", r#"{"key":"AA=="}"#).is_ok_and(|a| a.starts_with("HTTP/1.0 200"))
}
