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

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use crate::kit::app::TestApp;
use crate::kit::http::unix_get;
use crate::kit::load::Load;
use crate::kit::sidecar::drain_flags;
use crate::kit::sidecar::{BIN, Sidecar, command};
use crate::kit::{WAIT, free_port, scratch_dir, scratch_file};
use anyhow::{Context, Result, ensure};
use command_fds::{CommandFdExt, FdMapping};

const FAST_DRAIN: &[&str] = &drain_flags("100ms", "100ms", "1s", "5s");

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
    let dir = scratch_dir("ul")?;
    let sock = dir.join("s.sock");
    // Stale: bound by a process that is gone, never unlinked.
    drop(std::os::unix::net::UnixListener::bind(&sock)?);

    let mut proc = Sidecar::spawn_args(&args(&sock, app.addr, &["--listen-mode", "0660"])?, &[])?;
    proc.wait_log("kubegrace-sidecar ready listen=unix:", WAIT)
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
    crate::kit::wait_for(
        "the slow request at the app",
        Duration::from_secs(10),
        || async { (app.inflight() > 0).then_some(()) },
    )
    .await?;
    proc.signal("TERM")?;
    let (status, body) = slow.await.context("join")??;
    ensure!(status.is_success(), "in-flight request: {status} {body}");
    proc.exits_cleanly().await?;
    ensure!(
        !sock.exists(),
        "the socket file is removed at exit; logs:\n{}",
        proc.logs_text()
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_or_a_live_socket_at_the_path_is_refused_and_kept() -> Result<()> {
    let (dir, file) = scratch_file("ur", "plain", "keep me")?;
    let upstream = free_port()?;
    let mut proc = Sidecar::spawn_args(&args(&file, upstream, &[])?, &[])?;
    proc.exits_with(64, "not a socket").await?;
    ensure!(std::fs::read_to_string(&file)? == "keep me");

    let live_path = dir.join("live.sock");
    let live = std::os::unix::net::UnixListener::bind(&live_path)?;
    let mut proc = Sidecar::spawn_args(&args(&live_path, upstream, &[])?, &[])?;
    proc.exits_with(64, "something is listening on it").await?;
    ensure!(live_path.exists(), "a live socket is never unlinked");
    drop(live);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inherited_unix_socket_is_served_and_left_to_its_owner() -> Result<()> {
    let app = TestApp::start("app").await?;
    let dir = scratch_dir("ui")?;
    let sock = dir.join("s.sock");
    let listener = std::os::unix::net::UnixListener::bind(&sock)?;
    // --listen names a TCP port nobody binds: the inherited socket wins.
    let mut args: Vec<String> = [
        "--listen",
        "127.0.0.1:1",
        "--upstream",
        &app.addr.to_string(),
        "--admin",
        &free_port()?.to_string(),
    ]
    .map(String::from)
    .to_vec();
    args.extend(FAST_DRAIN.iter().map(|s| s.to_string()));
    let mut cmd = command(&args);
    cmd.env("LISTEN_FDS", "1")
        .env("LISTEN_FDNAMES", "listen")
        .fd_mappings(vec![FdMapping {
            parent_fd: listener.into(),
            child_fd: 3,
        }])?;
    let mut proc = Sidecar::spawn_command(cmd)?;
    proc.wait_log("kubegrace-sidecar ready listen=unix:", WAIT)
        .await?;
    let (status, body) = unix_get(&sock, "/work").await?;
    ensure!(status.is_success(), "{status} {body}");
    proc.signal("TERM")?;
    proc.exits_cleanly().await?;
    ensure!(
        sock.exists(),
        "an inherited socket's file belongs to whoever made it; logs:\n{}",
        proc.logs_text()
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

fn ready_pid(file: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(file).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v.get("pid")?.as_u64().map(|p| p as u32)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_hands_the_unix_socket_over_under_load() -> Result<()> {
    let app = TestApp::start("app").await?;
    let dir = scratch_dir("uu")?;
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
    let mut first = Sidecar::spawn_args(&argv, &[])?;
    first
        .wait_log("kubegrace-sidecar ready listen=unix:", WAIT)
        .await?;
    let old_pid = first.pid;

    let load = Load::against(sock.clone(), 4, 0);
    load.wait_ok(100, WAIT).await?;
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
        first.logs_text()
    );
    let new_pid = crate::kit::wait_for(
        "the new process's ready file",
        Duration::from_secs(30),
        || async { ready_pid(&ready).filter(|p| *p != old_pid) },
    )
    .await?;
    let code = first.wait_exit(WAIT).await?.code();
    ensure!(code == Some(0), "old process exit {code:?}");
    ensure!(
        sock.exists(),
        "the old process must not remove the socket it handed over; logs:\n{}",
        first.logs_text()
    );
    load.wait_ok(100, WAIT).await?;
    let report = load.stop().await?;
    ensure!(
        report.failed() == 0,
        "failures across the upgrade: {}\n{}",
        report.summary(),
        report.failure_details()
    );

    crate::kit::signal(new_pid, "TERM")?;
    crate::kit::wait_for(
        "the socket file removed by the last process",
        Duration::from_secs(30),
        || async { (!sock.exists()).then_some(()) },
    )
    .await
    .with_context(|| format!("logs:\n{}", first.logs_text()))?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
