//! A `--config` file that does not exist at start (an optional ConfigMap
//! volume racing the pod start): the sidecar starts on defaults plus flags,
//! says so in its log and in `/config`, and loads the file when it appears,
//! even when its directory appears only later. A file that exists but is
//! invalid still stops the start (exit 64): a typo fails loudly.

use std::time::Duration;

use crate::kit::app::TestApp;
use crate::kit::sidecar::{Sidecar, SidecarSpec, run_to_exit};
use crate::kit::{scratch_dir, scratch_file};
use anyhow::{Context, Result, ensure};

/// Sends a request head declaring a `len`-byte body and returns the status
/// line (the sidecar answers 413 before reading a body above its limit).
async fn declared_body_status(addr: std::net::SocketAddr, len: usize) -> Result<String> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let head = format!("POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: {len}\r\n\r\n");
    stream.write_all(head.as_bytes()).await?;
    let mut line = String::new();
    tokio::time::timeout(
        Duration::from_secs(10),
        BufReader::new(stream).read_line(&mut line),
    )
    .await
    .context("no status line within 10s")??;
    Ok(line.trim_end().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starts_without_its_config_file_and_loads_it_when_it_appears() -> Result<()> {
    let app = TestApp::start("app").await?;
    let root = scratch_dir("missing")?;
    let dir = root.join("kubegrace");
    let file = dir.join("config.yaml");
    let file_arg = file.display().to_string();
    let mut sidecar = Sidecar::start(SidecarSpec::new(app.addr).args(&[
        "--config",
        &file_arg,
        "--drain-quiet",
        "250ms",
    ]))
    .await?;
    sidecar
        .wait_log("config file not found", Duration::from_secs(5))
        .await?;
    let before = sidecar.config_json().await?;
    ensure!(before["source"]["fileMissing"] == true, "{before}");
    let resp = crate::kit::http::get(sidecar.listen, "/work").await?;
    ensure!(
        resp.status.is_success(),
        "serves meanwhile: {}",
        resp.status
    );
    ensure!(
        before["config"]["limits"]["maxRequestBodyBytes"] == 0,
        "defaults meanwhile: {before}"
    );

    // The directory and the file appear later, ConfigMap style (the file
    // is written elsewhere and renamed into place).
    std::fs::create_dir_all(&dir)?;
    let tmp = dir.join(".config.yaml.tmp");
    std::fs::write(
        &tmp,
        "limits: {maxRequestBodyBytes: 10}\ndrain: {quiet: 3s}\n",
    )?;
    std::fs::rename(&tmp, &file)?;
    let after = crate::kit::wait_for("the file to be loaded", Duration::from_secs(15), || async {
        let now = sidecar.config_json().await.ok()?;
        (now["source"]["reloads"] == 1).then_some(now)
    })
    .await?;
    ensure!(after["source"].get("fileMissing").is_none(), "{after}");
    ensure!(
        after["config"]["limits"]["maxRequestBodyBytes"] == 10,
        "{after}"
    );
    ensure!(
        after["config"]["drain"]["quiet"] == "250ms",
        "flags still win over the file: {after}"
    );
    // The new limit is in force: a declared body above it gets 413.
    let status = declared_body_status(sidecar.listen, 100).await?;
    ensure!(status.starts_with("HTTP/1.1 413"), "{status}");
    let _ = std::fs::remove_dir_all(&root);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_file_at_start_still_exits_64() -> Result<()> {
    let (dir, file) = scratch_file("invalid", "config.yaml", "drain: {quiet: soon}\n")?;
    let (status, output) = run_to_exit(
        &[
            "--config",
            &file.display().to_string(),
            "--listen",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
        ],
        Duration::from_secs(30),
    )
    .await?;
    ensure!(status.code() == Some(64), "exit {status}: {output}");
    ensure!(output.contains("soon"), "{output}");
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
