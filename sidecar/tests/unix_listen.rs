//! `--listen unix:/path`: the proxy on a Unix domain socket.
//!
//! - it serves HTTP over the socket, with the requested file mode and
//!   `X-Forwarded-For: unix:`; a stale socket file left by a dead process is
//!   replaced; SIGTERM drains an in-flight request to completion and the
//!   socket file is removed at exit;
//! - a path that holds a regular file, or a socket someone listens on, is
//!   refused at start (exit 64) and left alone;
//! - a Unix socket inherited through `LISTEN_FDS` is served, and left in
//!   place at exit (systemd owns it);
//! - an upgrade hands the Unix socket over under load: no failed request,
//!   the file stays while the new process serves, and goes when it exits.

mod common;
mod outside_support;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use bytes::Bytes;
use command_fds::{CommandFdExt, FdMapping};
use common::apps::TestApp;
use http::Request;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use outside_support::{BIN, Proc, free_port, short_dir, unix_get};

const FAST_DRAIN: [&str; 8] = [
    "--drain-min-delay",
    "100ms",
    "--drain-quiet",
    "100ms",
    "--drain-max-delay",
    "1s",
    "--drain-timeout",
    "5s",
];

fn args(sock: &Path, upstream: std::net::SocketAddr, extra: &[&str]) -> Result<Vec<String>> {
    let mut args: Vec<String> = vec![
        "--listen".into(),
        format!("unix:{}", sock.display()),
        "--upstream".into(),
        upstream.to_string(),
        "--admin".into(),
        free_port()?.to_string(),
    ];
    args.extend(FAST_DRAIN.iter().map(|s| s.to_string()));
    args.extend(extra.iter().map(|s| s.to_string()));
    Ok(args)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_on_a_unix_socket_drains_and_removes_it() -> Result<()> {
    let app = TestApp::start("app").await?;
    let dir = short_dir("ul")?;
    let sock = dir.join("s.sock");
    // Stale: bound by a process that is gone, never unlinked.
    drop(std::os::unix::net::UnixListener::bind(&sock)?);

    let mut proc = Proc::spawn(&args(&sock, app.addr, &["--listen-mode", "0660"])?, &[])?;
    proc.wait_log("kubegrace-sidecar ready listen=unix:")
        .await?;
    let mode = std::fs::metadata(&sock)?.permissions().mode() & 0o777;
    ensure!(mode == 0o660, "mode {mode:o}");

    let (status, body) = unix_get(&sock, "/headers").await?;
    ensure!(status.is_success(), "{status} {body}");
    ensure!(
        body.lines().any(|l| l == "x-forwarded-for: unix:"),
        "a Unix peer is forwarded as unix:\n{body}"
    );

    // In flight across SIGTERM: it must complete.
    let slow = {
        let sock = sock.clone();
        tokio::spawn(async move { unix_get(&sock, "/work?ms=1500").await })
    };
    common::wait_for(
        "the slow request at the app",
        Duration::from_secs(10),
        || async { (app.inflight() > 0).then_some(()) },
    )
    .await?;
    proc.signal("TERM")?;
    let (status, body) = slow.await.context("join")??;
    ensure!(status.is_success(), "in-flight request: {status} {body}");
    let code = proc.wait_exit().await?;
    ensure!(code == Some(0), "exit {code:?}; logs:\n{}", proc.logs());
    ensure!(
        !sock.exists(),
        "the socket file is removed at exit; logs:\n{}",
        proc.logs()
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_or_a_live_socket_at_the_path_is_refused_and_kept() -> Result<()> {
    let dir = short_dir("ur")?;
    let file = dir.join("plain");
    std::fs::write(&file, "keep me")?;
    let upstream = free_port()?;
    let mut proc = Proc::spawn(&args(&file, upstream, &[])?, &[])?;
    let code = proc.wait_exit().await?;
    ensure!(code == Some(64), "exit {code:?}: {}", proc.logs());
    ensure!(proc.logs().contains("not a socket"), "{}", proc.logs());
    ensure!(std::fs::read_to_string(&file)? == "keep me");

    let live_path = dir.join("live.sock");
    let live = std::os::unix::net::UnixListener::bind(&live_path)?;
    let mut proc = Proc::spawn(&args(&live_path, upstream, &[])?, &[])?;
    let code = proc.wait_exit().await?;
    ensure!(code == Some(64), "exit {code:?}: {}", proc.logs());
    ensure!(
        proc.logs().contains("something is listening on it"),
        "{}",
        proc.logs()
    );
    ensure!(live_path.exists(), "a live socket is never unlinked");
    drop(live);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inherited_unix_socket_is_served_and_left_to_its_owner() -> Result<()> {
    let app = TestApp::start("app").await?;
    let dir = short_dir("ui")?;
    let sock = dir.join("s.sock");
    let listener = std::os::unix::net::UnixListener::bind(&sock)?;
    let mut command = tokio::process::Command::new(BIN);
    command
        // --listen names a TCP port nobody binds: the inherited socket wins.
        .args(["--listen", "127.0.0.1:1", "--upstream"])
        .arg(app.addr.to_string())
        .args(["--admin", &free_port()?.to_string()])
        .args(FAST_DRAIN)
        .env("LISTEN_FDS", "1")
        .env("LISTEN_FDNAMES", "listen")
        .env_remove("LISTEN_PID")
        .env_remove("KUBEGRACE_UPGRADE_NOTIFY_FD")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .fd_mappings(vec![FdMapping {
            parent_fd: listener.into(),
            child_fd: 3,
        }])?;
    let mut proc = Proc::capture(command)?;
    proc.wait_log("kubegrace-sidecar ready listen=unix:")
        .await?;
    let (status, body) = unix_get(&sock, "/work").await?;
    ensure!(status.is_success(), "{status} {body}");
    proc.signal("TERM")?;
    let code = proc.wait_exit().await?;
    ensure!(code == Some(0), "exit {code:?}; logs:\n{}", proc.logs());
    ensure!(
        sock.exists(),
        "an inherited socket's file belongs to whoever made it; logs:\n{}",
        proc.logs()
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// Keep-alive clients over the Unix socket; a connection the server closes
/// before we wrote is reconnected (what every pooled client does), any
/// other error or non-2xx counts as failed.
struct UnixLoad {
    ok: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    details: Arc<std::sync::Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl UnixLoad {
    fn start(sock: PathBuf, clients: usize) -> UnixLoad {
        let load = UnixLoad {
            ok: Arc::default(),
            failed: Arc::default(),
            details: Arc::default(),
            stop: Arc::default(),
            tasks: Vec::new(),
        };
        let mut tasks = Vec::new();
        for _ in 0..clients {
            let (sock, ok, failed, details, stop) = (
                sock.clone(),
                load.ok.clone(),
                load.failed.clone(),
                load.details.clone(),
                load.stop.clone(),
            );
            tasks.push(tokio::spawn(async move {
                let fail = |what: String| {
                    failed.fetch_add(1, Ordering::Relaxed);
                    if let Ok(mut d) = details.lock()
                        && d.len() < 10
                    {
                        d.push(what);
                    }
                };
                while !stop.load(Ordering::Relaxed) {
                    let stream = match tokio::net::UnixStream::connect(&sock).await {
                        Ok(s) => s,
                        Err(e) => {
                            fail(format!("connect: {e}"));
                            tokio::time::sleep(Duration::from_millis(5)).await;
                            continue;
                        }
                    };
                    let Ok((mut sender, conn)) =
                        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await
                    else {
                        fail("handshake".into());
                        continue;
                    };
                    tokio::spawn(conn);
                    while !stop.load(Ordering::Relaxed) {
                        if sender.ready().await.is_err() {
                            break;
                        }
                        let req = Request::get("/work?ms=2")
                            .header(http::header::HOST, "localhost")
                            .body(Empty::<Bytes>::new())
                            .unwrap_or_default();
                        let sent = tokio::time::timeout(Duration::from_secs(10), async {
                            let resp = sender.send_request(req).await?;
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
                                    ok.fetch_add(1, Ordering::Relaxed);
                                } else {
                                    fail(format!("status {status}"));
                                }
                                if close {
                                    break;
                                }
                            }
                            Ok(Err(e)) => {
                                fail(format!("request: {e}"));
                                break;
                            }
                            Err(_) => {
                                fail("timeout".into());
                                break;
                            }
                        }
                    }
                }
            }));
        }
        UnixLoad { tasks, ..load }
    }

    async fn wait_more(&self, n: u64) -> Result<()> {
        let target = self.ok.load(Ordering::Relaxed) + n;
        common::wait_for(
            "more requests through the socket",
            Duration::from_secs(30),
            || async { (self.ok.load(Ordering::Relaxed) >= target).then_some(()) },
        )
        .await
    }

    async fn stop(self) -> (u64, u64, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            let _ = tokio::time::timeout(Duration::from_secs(20), t).await;
        }
        let details = self.details.lock().map(|d| d.clone()).unwrap_or_default();
        (
            self.ok.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
            details,
        )
    }
}

fn ready_pid(file: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(file).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v.get("pid")?.as_u64().map(|p| p as u32)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_hands_the_unix_socket_over_under_load() -> Result<()> {
    let app = TestApp::start("app").await?;
    let dir = short_dir("uu")?;
    let sock = dir.join("s.sock");
    let ready = dir.join("ready.json");
    let admin = free_port()?;
    let mut argv = args(
        &sock,
        app.addr,
        &["--ready-file", &ready.display().to_string()],
    )?;
    // Fixed admin port: the upgrade command needs it.
    let at = argv
        .iter()
        .position(|a| a == "--admin")
        .context("--admin")?
        + 1;
    argv[at] = admin.to_string();
    // POST /upgrade (what `upgrade` sends) always needs a token.
    argv.extend([
        "--drain-token".to_string(),
        "unix-upgrade-token".to_string(),
    ]);
    let mut first = Proc::spawn(&argv, &[])?;
    first
        .wait_log("kubegrace-sidecar ready listen=unix:")
        .await?;
    let old_pid = first.pid();

    let load = UnixLoad::start(sock.clone(), 4);
    load.wait_more(100).await?;
    let out = tokio::process::Command::new(BIN)
        .args(["upgrade", "--admin", &admin.to_string()])
        .args(["--token", "unix-upgrade-token"])
        .output()
        .await?;
    ensure!(
        out.status.success(),
        "upgrade: {}{}; logs:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        first.logs()
    );
    let new_pid = common::wait_for(
        "the new process's ready file",
        Duration::from_secs(30),
        || async { ready_pid(&ready).filter(|p| *p != old_pid) },
    )
    .await?;
    let code = first.wait_exit().await?;
    ensure!(code == Some(0), "old process exit {code:?}");
    ensure!(
        sock.exists(),
        "the old process must not remove the socket it handed over; logs:\n{}",
        first.logs()
    );
    load.wait_more(100).await?;
    let (ok, failed, details) = load.stop().await;
    ensure!(
        failed == 0,
        "{failed} failed of {} across the upgrade: {details:?}",
        ok + failed
    );

    outside_support::signal(new_pid, "TERM")?;
    common::wait_for(
        "the socket file removed by the last process",
        Duration::from_secs(30),
        || async { (!sock.exists()).then_some(()) },
    )
    .await
    .with_context(|| format!("logs:\n{}", first.logs()))?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
