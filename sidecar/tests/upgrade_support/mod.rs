//! Helpers for the upgrade tests: a sidecar process whose pid changes across
//! upgrades (found through its ready file), and a bounded load mixing
//! keep-alive clients and one-request-per-connection clients that counts
//! refused connections apart from other failures.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

pub const BIN: &str = env!("CARGO_BIN_EXE_kubegrace-sidecar");

/// The drain token of every sidecar these tests start: `POST /upgrade`
/// is refused without one.
pub const UPGRADE_TOKEN: &str = "upgrade-test-token";

/// A sidecar started by the test; after an upgrade the serving process is
/// another one, so the current pid comes from the ready file.
pub struct Proc {
    pub dir: PathBuf,
    pub listen: SocketAddr,
    pub admin: SocketAddr,
    pub args: Vec<String>,
    /// Extra environment for every generation (e.g. NOTIFY_SOCKET).
    pub env: Vec<(String, String)>,
    first: Option<tokio::process::Child>,
}

pub fn scratch(tag: &str) -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!(
        "kubegrace-upgrade-{tag}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    ));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

pub fn free_port() -> Result<SocketAddr> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?)
}

impl Proc {
    /// Starts the binary on fixed ports (so a restart can reuse them) and
    /// waits until it serves.
    pub async fn start(upstream: SocketAddr, extra: &[&str]) -> Result<Proc> {
        Self::start_with_env(upstream, extra, &[]).await
    }

    /// [`Proc::start`] with extra environment variables.
    pub async fn start_with_env(
        upstream: SocketAddr,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Result<Proc> {
        Self::start_general(&upstream.to_string(), extra, env).await
    }

    /// [`Proc::start`] with any `--upstream` value (`unix:/path` too).
    pub async fn start_general(
        upstream: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Result<Proc> {
        let dir = scratch("proc")?;
        let (listen, admin) = (free_port()?, free_port()?);
        let mut args: Vec<String> = [
            "--listen",
            &listen.to_string(),
            "--upstream",
            upstream,
            "--admin",
            &admin.to_string(),
            "--ready-file",
            &dir.join("ready.json").display().to_string(),
            "--drain-min-delay",
            "100ms",
            "--drain-quiet",
            "100ms",
            "--drain-max-delay",
            "1s",
            "--drain-timeout",
            "5s",
            // POST /upgrade (what `upgrade` sends) always needs a token.
            "--drain-token",
            UPGRADE_TOKEN,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut proc = Proc {
            dir,
            listen,
            admin,
            args,
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            first: None,
        };
        proc.spawn().await?;
        Ok(proc)
    }

    /// (Re)starts the process with the same arguments; logs go to a file
    /// every later generation appends to as well.
    pub async fn spawn(&mut self) -> Result<()> {
        let _ = std::fs::remove_file(self.dir.join("ready.json"));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("log.txt"))?;
        let child = tokio::process::Command::new(BIN)
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(false)
            .spawn()
            .context("spawn the sidecar")?;
        self.first = Some(child);
        self.wait_pid(|_| true).await?;
        Ok(())
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(self.dir.join("log.txt")).unwrap_or_default()
    }

    pub fn pid(&self) -> Option<u32> {
        let text = std::fs::read_to_string(self.dir.join("ready.json")).ok()?;
        let v: serde_json::Value = serde_json::from_str(&text).ok()?;
        v.get("pid")?.as_u64().map(|p| p as u32)
    }

    /// Waits for a ready file whose pid satisfies `ok`.
    pub async fn wait_pid(&self, ok: impl Fn(u32) -> bool) -> Result<u32> {
        for _ in 0..1500 {
            if let Some(pid) = self.pid().filter(|p| ok(*p)) {
                return Ok(pid);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        bail!("no matching ready file within 30s; logs:\n{}", self.logs())
    }

    /// Waits until `pid` is gone (a zombie counts as gone).
    pub async fn wait_gone(&mut self, pid: u32) -> Result<()> {
        for _ in 0..1500 {
            if let Some(child) = self.first.as_mut()
                && child.id() == Some(pid)
            {
                let _ = child.try_wait();
            }
            if !alive(pid) {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        bail!(
            "process {pid} still alive after 30s; logs:\n{}",
            self.logs()
        )
    }

    pub fn signal(&self, pid: u32, name: &str) -> Result<()> {
        let status = std::process::Command::new("kill")
            .args(["-s", name, &pid.to_string()])
            .status()?;
        if !status.success() {
            bail!("kill -s {name} {pid}: {status}");
        }
        Ok(())
    }

    /// Runs `kubegrace-sidecar upgrade --admin ADDR`: (success, output).
    pub async fn upgrade_command(&self) -> Result<(bool, String)> {
        let out = tokio::process::Command::new(BIN)
            .args(["upgrade", "--admin", &self.admin.to_string()])
            .args(["--token", UPGRADE_TOKEN])
            .output()
            .await?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok((out.status.success(), text))
    }

    /// SIGTERM the serving process and wait for it to leave (test cleanup).
    pub async fn stop(mut self) -> Result<()> {
        if let Some(pid) = self.pid() {
            let _ = self.signal(pid, "TERM");
            self.wait_gone(pid).await?;
        }
        Ok(())
    }
}

pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // "pid (comm) S ...": the state follows the last ')'.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

#[derive(Debug, Default)]
pub struct Counts {
    pub ok: AtomicU64,
    pub failed: AtomicU64,
    pub refused: AtomicU64,
    pub details: std::sync::Mutex<Vec<String>>,
}

impl Counts {
    fn fail(&self, what: String) {
        self.failed.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut d) = self.details.lock()
            && d.len() < 20
        {
            d.push(what);
        }
    }
    pub fn summary(&self) -> String {
        format!(
            "ok={} failed={} refused={} first failures: {:?}",
            self.ok.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
            self.refused.load(Ordering::Relaxed),
            self.details.lock().map(|d| d.clone()).unwrap_or_default()
        )
    }
}

/// `keepalive` clients reusing their connection until the server says
/// `Connection: close` (or closed it before we wrote: not a failure, every
/// client reconnects then), plus `fresh` clients opening one connection per
/// request. Every request is bounded; no retries.
pub struct Load {
    pub counts: Arc<Counts>,
    stop: Arc<AtomicBool>,
    tasks: Vec<JoinHandle<()>>,
}

const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
const PATH: &str = "/work?ms=2";

impl Load {
    pub fn start(addr: SocketAddr, keepalive: usize, fresh: usize) -> Load {
        let counts = Arc::new(Counts::default());
        let stop = Arc::new(AtomicBool::new(false));
        let mut tasks = Vec::new();
        for _ in 0..keepalive {
            tasks.push(tokio::spawn(keepalive_client(
                addr,
                counts.clone(),
                stop.clone(),
            )));
        }
        for _ in 0..fresh {
            tasks.push(tokio::spawn(fresh_client(
                addr,
                counts.clone(),
                stop.clone(),
            )));
        }
        Load {
            counts,
            stop,
            tasks,
        }
    }

    pub fn ok(&self) -> u64 {
        self.counts.ok.load(Ordering::Relaxed)
    }

    /// Waits until `n` more requests succeeded (bounded).
    pub async fn wait_more(&self, n: u64) -> Result<()> {
        let target = self.ok() + n;
        for _ in 0..3000 {
            if self.ok() >= target {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        bail!("load stalled: {}", self.counts.summary())
    }

    pub async fn stop(self) -> Arc<Counts> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            let _ = tokio::time::timeout(REQUEST_TIMEOUT * 2, t).await;
        }
        self.counts
    }
}

async fn connect(addr: SocketAddr, counts: &Counts) -> Option<TcpStream> {
    match TcpStream::connect(addr).await {
        Ok(s) => Some(s),
        Err(e) => {
            if e.kind() == std::io::ErrorKind::ConnectionRefused {
                counts.refused.fetch_add(1, Ordering::Relaxed);
            }
            counts.fail(format!("connect: {e}"));
            // Bounded: a closed port must not turn the loop into a spin.
            tokio::time::sleep(Duration::from_millis(5)).await;
            None
        }
    }
}

fn request(addr: SocketAddr, close: bool) -> Request<Empty<Bytes>> {
    let mut b = Request::get(PATH).header(http::header::HOST, addr.to_string());
    if close {
        b = b.header(http::header::CONNECTION, "close");
    }
    b.body(Empty::new()).unwrap_or_default()
}

async fn keepalive_client(addr: SocketAddr, counts: Arc<Counts>, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Relaxed) {
        let Some(tcp) = connect(addr, &counts).await else {
            continue;
        };
        let Ok((mut sender, conn)) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await
        else {
            counts.fail("handshake".into());
            continue;
        };
        tokio::spawn(conn);
        while !stop.load(Ordering::Relaxed) {
            // Closed before we wrote: reconnect, as any pooled client does.
            if sender.ready().await.is_err() {
                break;
            }
            let sent = tokio::time::timeout(REQUEST_TIMEOUT, async {
                let resp = sender.send_request(request(addr, false)).await?;
                let close = resp
                    .headers()
                    .get(http::header::CONNECTION)
                    .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"close"));
                let status = resp.status();
                resp.into_body().collect().await?;
                Ok::<_, hyper::Error>((status, close))
            })
            .await;
            match sent {
                Ok(Ok((status, close))) => {
                    if status.is_success() {
                        counts.ok.fetch_add(1, Ordering::Relaxed);
                    } else {
                        counts.fail(format!("keep-alive status {status}"));
                    }
                    if close {
                        break;
                    }
                }
                Ok(Err(e)) => {
                    counts.fail(format!("keep-alive: {e}"));
                    break;
                }
                Err(_) => {
                    counts.fail("keep-alive: timeout".into());
                    break;
                }
            }
        }
    }
}

async fn fresh_client(addr: SocketAddr, counts: Arc<Counts>, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Relaxed) {
        let Some(tcp) = connect(addr, &counts).await else {
            continue;
        };
        let sent = tokio::time::timeout(REQUEST_TIMEOUT, async {
            let (mut sender, conn) =
                hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
            tokio::spawn(conn);
            let resp = sender.send_request(request(addr, true)).await?;
            let status = resp.status();
            resp.into_body().collect().await?;
            Ok::<_, hyper::Error>(status)
        })
        .await;
        match sent {
            Ok(Ok(status)) if status.is_success() => {
                counts.ok.fetch_add(1, Ordering::Relaxed);
            }
            Ok(Ok(status)) => counts.fail(format!("fresh status {status}")),
            Ok(Err(e)) => counts.fail(format!("fresh: {e}")),
            Err(_) => counts.fail("fresh: timeout".into()),
        }
    }
}
