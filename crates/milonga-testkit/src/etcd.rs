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
}

impl Etcd {
    /// etcd on two free ports, its data under `dir`. A port found free
    /// may be taken by another process before etcd binds it, and etcd
    /// then exits: other ports are tried, five pairs in all.
    pub fn start(dir: &Path, timeout: Duration) -> Result<Etcd, String> {
        let mut last = String::new();
        for _ in 0..5 {
            match Etcd::on(dir, free_port(), free_port(), timeout) {
                Ok(e) => return Ok(e),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Starts it again on the same ports and data (after [`Etcd::kill9`]).
    pub fn restart(&mut self, timeout: Duration) -> Result<(), String> {
        *self = Etcd::on(&self.dir, self.client, self.peer, timeout)?;
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
    fn on(dir: &Path, client: u16, peer: u16, timeout: Duration) -> Result<Etcd, String> {
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
        })
    }
}

/// Whether etcd's JSON gateway on `port` answers a range.
fn answers(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let body = r#"{"key":"AA=="}"#;
    let req = format!(
        "POST /v3/kv/range HTTP/1.0\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut answer = String::new();
    s.write_all(req.as_bytes()).is_ok()
        && s.read_to_string(&mut answer).is_ok()
        && answer.starts_with("HTTP/1.0 200")
}
