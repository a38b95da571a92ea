//! `NOTIFY_SOCKET` (systemd `Type=notify`): the sidecar reports READY=1
//! once it serves, MAINPID=<new pid> when an upgrade handed its sockets
//! over (and no STOPPING=1 from the old process then), and STOPPING=1 when
//! SIGTERM starts the drain. Received on a real Unix datagram socket.

use std::time::Duration;

use crate::kit::app::TestApp;
use crate::kit::upgrade::Upgradable;
use anyhow::{Context, Result, ensure};
use tokio::net::UnixDatagram;

async fn next(socket: &UnixDatagram, seen: &mut Vec<String>) -> Result<String> {
    let mut buf = [0u8; 512];
    let n = tokio::time::timeout(Duration::from_secs(30), socket.recv(&mut buf))
        .await
        .with_context(|| format!("no notification within 30s after {seen:?}"))??;
    let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
    seen.push(msg.clone());
    Ok(msg)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_ready_mainpid_on_upgrade_and_stopping() -> Result<()> {
    let app = TestApp::start("app").await?;
    let dir = std::env::temp_dir().join(format!("kg-notify-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("notify.sock");
    let _ = std::fs::remove_file(&path);
    let socket = UnixDatagram::bind(&path)?;
    // The upgrade passes its environment on: the successor reports too.
    let notify_socket = path.display().to_string();
    let mut proc =
        Upgradable::start_with_env(app.addr, &[], &[("NOTIFY_SOCKET", notify_socket.as_str())])
            .await?;
    let mut seen = Vec::new();
    ensure!(next(&socket, &mut seen).await? == "READY=1", "{seen:?}");

    let old = proc.pid().context("pid")?;
    let (ok, out) = proc.upgrade_command().await?;
    ensure!(ok, "{out}");
    let new = proc.wait_pid(|p| p != old).await?;
    // The new process says READY=1 (its own start), the old one MAINPID.
    let mut mainpid = None;
    while mainpid.is_none() {
        let msg = next(&socket, &mut seen).await?;
        ensure!(msg != "STOPPING=1", "an upgrade is not a stop: {seen:?}");
        if let Some(pid) = msg.strip_prefix("MAINPID=") {
            mainpid = Some(pid.to_string());
        }
    }
    ensure!(mainpid == Some(new.to_string()), "{seen:?}, new pid {new}");
    proc.wait_gone(old).await?;

    proc.signal(new, "TERM")?;
    loop {
        if next(&socket, &mut seen).await? == "STOPPING=1" {
            break;
        }
    }
    proc.wait_gone(new).await?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
