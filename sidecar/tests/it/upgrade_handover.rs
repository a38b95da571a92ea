//! Outside Kubernetes: restarts and upgrades of the sidecar itself that
//! never close the port.
//!
//! - a sidecar started with an inherited listening socket (`LISTEN_FDS=1`,
//!   fd 3) serves on it instead of binding;
//! - three upgrades in a row (`upgrade --admin`, SIGUSR2, `upgrade --admin`)
//!   under keep-alive and new-connection load lose
//!   nothing (no failed request, no refused connection), while the same
//!   load across a kill-and-restart (port closed in between) does lose;
//! - an upgrade to a binary that cannot start leaves the old process
//!   serving, and `upgrade` exits non-zero with the reason.

use std::time::Duration;

use crate::kit::WAIT;
use crate::kit::app::TestApp;
use crate::kit::free_port;
use crate::kit::load::Load;
use crate::kit::sidecar::{Sidecar, command};
use crate::kit::upgrade::Upgradable;
use anyhow::{Context, Result, ensure};
use command_fds::{CommandFdExt, FdMapping};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_on_an_inherited_listening_socket() -> Result<()> {
    let app = TestApp::start("app").await?;
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let admin = free_port()?;
    // --listen names a port nobody binds: the inherited socket wins.
    let args = [
        "--listen",
        "127.0.0.1:1",
        "--upstream",
        &app.addr.to_string(),
        "--admin",
        &admin.to_string(),
    ]
    .map(String::from);
    let mut cmd = command(&args);
    cmd.env("LISTEN_FDS", "1").fd_mappings(vec![FdMapping {
        parent_fd: listener.into(),
        child_fd: 3,
    }])?;
    let _sidecar = Sidecar::spawn_command(cmd)?;
    // (spawn_command dropped its copy of the socket: only the child holds it.)
    let resp = crate::kit::wait_for(
        "a 200 through the inherited socket",
        Duration::from_secs(30),
        || async {
            crate::kit::http::get(addr, "/work?ms=1")
                .await
                .ok()
                .filter(|r| r.status.is_success())
        },
    )
    .await?;
    ensure!(resp.status.is_success());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_upgrades_under_load_lose_nothing_a_restart_does() -> Result<()> {
    let app = TestApp::start("app").await?;

    // Upgrades: the socket is held by both processes throughout.
    let mut proc = Upgradable::start(app.addr, &[]).await?;
    let load = Load::against(proc.listen, 4, 4);
    load.wait_ok(200, WAIT).await?;
    for round in 1..=3 {
        let old = proc.pid().context("pid")?;
        if round == 2 {
            // The signal path (nginx's binary-upgrade signal).
            proc.signal(old, "USR2")?;
        } else {
            let (ok, out) = proc.upgrade_command().await?;
            ensure!(ok, "upgrade {round} failed: {out}\nlogs:\n{}", proc.logs());
        }
        let new = proc.wait_pid(|p| p != old).await?;
        proc.wait_gone(old).await?;
        load.wait_ok(200, WAIT).await?;
        eprintln!("upgrade {round}: {old} -> {new}");
    }
    let handover = load.stop().await?;
    eprintln!("hand-over x3: {}", handover.summary());

    // Kill and restart: the port is closed between the old and the new one.
    let last = proc.pid().context("pid")?;
    let load = Load::against(proc.listen, 4, 4);
    load.wait_ok(200, WAIT).await?;
    proc.signal(last, "TERM")?;
    proc.wait_gone(last).await?;
    proc.spawn().await?;
    load.wait_ok(200, WAIT).await?;
    let restart = load.stop().await?;
    eprintln!("kill-and-restart: {}", restart.summary());
    proc.stop().await?;

    handover.ensure_lost_nothing("hand-over")?;
    ensure!(handover.ok >= 800, "{}", handover.summary());
    ensure!(
        restart.failed() > 0,
        "kill-and-restart lost nothing, so the comparison shows nothing: {}",
        restart.summary()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_upgrade_keeps_the_old_process_serving() -> Result<()> {
    let app = TestApp::start("app").await?;
    let dir = crate::kit::scratch_dir("bad")?;
    let script = dir.join("bad-sidecar.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\necho 'bad binary starting' >&2\nexit 1\n",
    )?;
    std::process::Command::new("chmod")
        .arg("+x")
        .arg(&script)
        .status()?;
    for binary in ["/bin/false".to_string(), script.display().to_string()] {
        let proc = Upgradable::start(app.addr, &["--upgrade-binary", &binary]).await?;
        let pid = proc.pid().context("pid")?;
        let load = Load::against(proc.listen, 2, 2);
        load.wait_ok(50, WAIT).await?;
        let (ok, out) = proc.upgrade_command().await?;
        ensure!(!ok, "upgrade to {binary} reported success: {out}");
        ensure!(out.contains("exited before it was ready"), "{out}");
        load.wait_ok(50, WAIT).await?;
        let counts = load.stop().await?;
        ensure!(counts.failed() == 0, "{}", counts.summary());
        ensure!(proc.pid() == Some(pid) && crate::kit::alive(pid));
        ensure!(
            proc.logs().contains("upgrade failed, still serving"),
            "{}",
            proc.logs()
        );
        proc.stop().await?;
    }
    Ok(())
}
