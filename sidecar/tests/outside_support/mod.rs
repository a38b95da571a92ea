//! Helpers for the outside-Kubernetes tests that `common::sidecar` does not
//! cover: a sidecar whose listen side is a Unix socket (no TCP port to read
//! from the ready line), HTTP/1.1 over a Unix socket, and counting the
//! listening sockets of a port in /proc/net.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::process::{Child, Command};
use tokio::task::AbortHandle;

pub const BIN: &str = env!("CARGO_BIN_EXE_kubegrace-sidecar");

/// A sidecar process with its output collected.
pub struct Proc {
    pub child: Child,
    pub logs: Arc<Mutex<Vec<String>>>,
}

impl Proc {
    /// Spawns the binary with `args` and `env`, output captured.
    pub fn spawn(args: &[String], env: &[(&str, &str)]) -> Result<Proc> {
        let mut cmd = Command::new(BIN);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .env("RUST_LOG", "info");
        for (key, _) in std::env::vars() {
            if key.starts_with("KUBEGRACE_") || key.starts_with("LISTEN_") {
                cmd.env_remove(key);
            }
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        Proc::capture(cmd)
    }

    pub fn capture(mut cmd: Command) -> Result<Proc> {
        let mut child = cmd.spawn().context("spawn the sidecar")?;
        let logs = Arc::new(Mutex::new(Vec::new()));
        for stream in [
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Unpin + Send>),
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Unpin + Send>),
        ]
        .into_iter()
        .flatten()
        {
            let logs = logs.clone();
            tokio::spawn(async move {
                let mut lines = BufReader::new(stream).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if let Ok(mut l) = logs.lock() {
                        l.push(line);
                    }
                }
            });
        }
        Ok(Proc { child, logs })
    }

    pub fn pid(&self) -> u32 {
        self.child.id().unwrap_or(0)
    }

    pub fn logs(&self) -> String {
        self.logs.lock().map(|l| l.join("\n")).unwrap_or_default()
    }

    /// Waits for a log line containing `needle` (bounded), failing early if
    /// the process exits.
    pub async fn wait_log(&mut self, needle: &str) -> Result<String> {
        for _ in 0..1500 {
            if let Some(line) = self
                .logs
                .lock()
                .ok()
                .and_then(|l| l.iter().find(|l| l.contains(needle)).cloned())
            {
                return Ok(line);
            }
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "exited ({status}) before {needle:?}; logs:\n{}",
                    self.logs()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        bail!("no {needle:?} within 30s; logs:\n{}", self.logs())
    }

    pub fn signal(&self, name: &str) -> Result<()> {
        signal(self.pid(), name)
    }

    /// Waits for the exit (bounded) and returns its code.
    pub async fn wait_exit(&mut self) -> Result<Option<i32>> {
        let status = tokio::time::timeout(Duration::from_secs(60), self.child.wait())
            .await
            .with_context(|| format!("still running after 60s; logs:\n{}", self.logs()))??;
        // The last lines may still be in the pipes.
        tokio::time::sleep(Duration::from_millis(50)).await;
        Ok(status.code())
    }
}

pub fn signal(pid: u32, name: &str) -> Result<()> {
    let status = std::process::Command::new("kill")
        .args(["-s", name, &pid.to_string()])
        .status()?;
    if !status.success() {
        bail!("kill -s {name} {pid}: {status}");
    }
    Ok(())
}

/// A short scratch directory (Unix socket paths are limited to 107 bytes).
pub fn short_dir(tag: &str) -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!(
        "kg-{tag}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0)
    ));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

pub fn free_port() -> Result<SocketAddr> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?)
}

/// One HTTP/1.1 GET over a Unix socket: (status, body).
pub async fn unix_get(path: &Path, target: &str) -> Result<(StatusCode, String)> {
    let fut = async {
        let stream = UnixStream::connect(path)
            .await
            .with_context(|| format!("connect {}", path.display()))?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(conn);
        let req = Request::get(target)
            .header(http::header::HOST, "localhost")
            .body(Empty::<Bytes>::new())?;
        let resp = sender.send_request(req).await?;
        let status = resp.status();
        let body = resp.into_body().collect().await?.to_bytes();
        Ok::<_, anyhow::Error>((status, String::from_utf8_lossy(&body).into_owned()))
    };
    tokio::time::timeout(Duration::from_secs(10), fut)
        .await
        .context("no answer within 10s")?
}

/// How many sockets listen on TCP `port` (all namespaces' view of this
/// host: /proc/net/tcp and tcp6). `SO_REUSEPORT` listeners show once each.
pub fn listening_sockets(port: u16) -> usize {
    let hex = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .map(|text| {
            text.lines()
                .skip(1)
                .filter(|line| {
                    let cols: Vec<&str> = line.split_whitespace().collect();
                    // local_address is column 1, st is column 3; 0A = LISTEN.
                    cols.len() > 3 && cols[1].ends_with(&hex) && cols[3] == "0A"
                })
                .count()
        })
        .sum()
}

/// A minimal app on a Unix socket: `/work?ms=N` sleeps N ms and answers
/// `ok <name>`. `kill` is the naive stop: the listener and every open
/// connection dropped at once.
pub struct UnixApp {
    pub path: PathBuf,
    served: Arc<std::sync::atomic::AtomicU64>,
    inflight: Arc<std::sync::atomic::AtomicI64>,
    tasks: Arc<Mutex<Vec<AbortHandle>>>,
}

impl UnixApp {
    pub async fn start(name: &str, path: &Path) -> Result<UnixApp> {
        let _ = std::fs::remove_file(path);
        let listener =
            UnixListener::bind(path).with_context(|| format!("bind {}", path.display()))?;
        let served = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let inflight = Arc::new(std::sync::atomic::AtomicI64::new(0));
        let tasks: Arc<Mutex<Vec<AbortHandle>>> = Arc::default();
        let (name, served2, inflight2, tasks2) = (
            name.to_string(),
            served.clone(),
            inflight.clone(),
            tasks.clone(),
        );
        let accept = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (name, served, inflight) = (name.clone(), served2.clone(), inflight2.clone());
                let conn = tokio::spawn(async move {
                    let service =
                        hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                            let (name, served, inflight) =
                                (name.clone(), served.clone(), inflight.clone());
                            async move {
                                // A kill aborts the task mid-sleep: the count
                                // then stays up, which only matters to a test
                                // waiting for "something in flight" before it.
                                inflight.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                                let ms = req
                                    .uri()
                                    .query()
                                    .and_then(|q| q.strip_prefix("ms="))
                                    .and_then(|v| v.parse::<u64>().ok())
                                    .unwrap_or(0);
                                if ms > 0 {
                                    tokio::time::sleep(Duration::from_millis(ms)).await;
                                }
                                served.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                                inflight.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                                Ok::<_, std::convert::Infallible>(http::Response::new(
                                    http_body_util::Full::new(Bytes::from(format!("ok {name}\n"))),
                                ))
                            }
                        });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
                if let Ok(mut t) = tasks2.lock() {
                    t.push(conn.abort_handle());
                }
            }
        });
        if let Ok(mut t) = tasks.lock() {
            t.push(accept.abort_handle());
        }
        Ok(UnixApp {
            path: path.to_path_buf(),
            served,
            inflight,
            tasks,
        })
    }

    pub fn served(&self) -> u64 {
        self.served.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Requests being worked on right now.
    pub fn inflight(&self) -> i64 {
        self.inflight.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Stops at once: listener closed, socket file removed, every
    /// connection dropped mid-request or not.
    pub fn kill(&self) {
        let tasks = self
            .tasks
            .lock()
            .map(|mut t| std::mem::take(&mut *t))
            .unwrap_or_default();
        for task in tasks {
            task.abort();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Drop for UnixApp {
    fn drop(&mut self) {
        self.kill();
    }
}
