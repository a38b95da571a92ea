//! Bad input is refused cleanly and never takes the
//! proxy down: malformed requests get 400, oversized heads 431, a slow
//! header sender (slowloris) is cut, bad flags and bad config files exit 64
//! naming what to fix, and a bad file on reload keeps the last good config.

use std::time::Duration;

use crate::kit::WAIT;
use crate::kit::app::TestApp;
use crate::kit::http::{get, request};
use crate::kit::http::{raw_exchange, raw_expect, read_cut_answer, status_line};
use crate::kit::scratch_dir;
use crate::kit::sidecar::{InProcess, Sidecar, SidecarSpec, run_env, run_to_exit};
use crate::kit::wait_for;
use anyhow::{Context, Result, ensure};
use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// Exit status for anything the user must fix (BSD EX_USAGE).
const EX_USAGE: i32 = 64;

#[tokio::test]
async fn malformed_requests_get_400_and_the_proxy_keeps_serving() -> Result<()> {
    let (_app, sidecar) = InProcess::with_app(&[]).await?;
    for garbage in [
        &b"THIS IS NOT HTTP\r\n\r\n"[..],
        b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: banana\r\n\r\n",
        b"GET / HTTP/1.1\r\nBad Header Name: x\r\n\r\n",
    ] {
        let answer = raw_exchange(sidecar.listen, garbage).await?;
        ensure!(
            status_line(&answer).starts_with("HTTP/1.1 400"),
            "{:?} got {:?}",
            String::from_utf8_lossy(garbage),
            status_line(&answer)
        );
    }
    sidecar.ensure_serving().await?;
    Ok(())
}

#[tokio::test]
async fn oversized_request_heads_get_431() -> Result<()> {
    let (_app, sidecar) = InProcess::with_app(&[]).await?;
    // One header far beyond limits.maxHeaderBytes (64 KiB by default).
    let big = format!(
        "GET /work HTTP/1.1\r\nHost: a\r\nX-Big: {}\r\n\r\n",
        "x".repeat(128 * 1024)
    );
    raw_expect(sidecar.listen, big.as_bytes(), 431, "a 128 KiB header").await?;
    // More headers than limits.maxHeaders (100 by default).
    let mut many = String::from("GET /work HTTP/1.1\r\nHost: a\r\n");
    for i in 0..200 {
        many.push_str(&format!("X-H{i}: v\r\n"));
    }
    many.push_str("\r\n");
    raw_expect(sidecar.listen, many.as_bytes(), 431, "200 headers").await?;
    sidecar.ensure_serving().await?;
    Ok(())
}

#[tokio::test]
async fn a_slow_header_sender_is_cut_after_the_header_read_timeout() -> Result<()> {
    let (_app, sidecar) = InProcess::with_short_header_read_timeout().await?;
    let mut tcp = TcpStream::connect(sidecar.listen).await?;
    tcp.write_all(b"GET /work HTTP/1.1\r\nHost: a\r\n").await?;
    let (mut rd, mut wr) = tcp.into_split();
    // One header line every 200ms for up to 20s: 40x the timeout. The head
    // never completes, so only the timeout can end this.
    let trickle = tokio::spawn(async move {
        for i in 0..100 {
            tokio::time::sleep(Duration::from_millis(200)).await;
            if wr
                .write_all(format!("X-Slow-{i}: v\r\n").as_bytes())
                .await
                .is_err()
            {
                return Some(i);
            }
        }
        None
    });
    let cut = "the slow sender to be cut";
    let (read, answer) = read_cut_answer(&mut rd, cut, Duration::from_secs(25)).await?;
    let lines_sent = trickle.await?;
    println!(
        "slowloris: connection ended ({}) after {:?} header lines, answer {:?}",
        read.map(|n| format!("EOF after {n} bytes"))
            .unwrap_or_else(|e| e.to_string()),
        lines_sent,
        status_line(&answer)
    );
    // Cut while still sending: the trickle ended on a failed write, not by
    // running out of lines (which would close our side and end the read).
    ensure!(
        lines_sent.is_some(),
        "the slow sender was never cut: all 100 header lines (20s) went through"
    );
    sidecar.ensure_serving().await?;
    Ok(())
}

/// Flags that name a real upstream but are otherwise fine.
fn base_args() -> Vec<&'static str> {
    vec![
        "--listen",
        "127.0.0.1:0",
        "--upstream",
        "127.0.0.1:9",
        "--admin",
        "127.0.0.1:0",
    ]
}

#[tokio::test]
async fn bad_flags_exit_64_naming_the_flag() -> Result<()> {
    let cases: &[(&[&str], &str)] = &[
        (&["--drain-timeout", "banana"], "drain-timeout"),
        (&["--drain-min-delay=3parsecs"], "drain-min-delay"),
        (&["--listen", "nowhere"], "listen"),
        (&["--protocol", "quic"], "protocol"),
        (&["--no-such-flag"], "no-such-flag"),
        (&["--drain-timeout", "forever"], "--drain-timeout"),
        // Valid one by one, invalid together: minDelay must be <= maxDelay,
        // and the message names the config key.
        (
            &["--drain-min-delay", "20s", "--drain-max-delay", "5s"],
            "minDelay",
        ),
        (
            &["--drain-min-delay", "1m", "--drain-max-delay", "10s"],
            "drain.minDelay",
        ),
    ];
    for (extra, key) in cases {
        refused_at_start(extra, key)
            .await
            .with_context(|| format!("{extra:?}"))?;
    }
    Ok(())
}

#[tokio::test]
async fn environment_twins_are_checked_too() -> Result<()> {
    let (status, output) = run_env(&[], &[("KUBEGRACE_DRAIN_MIN_DELAY", "soon")], WAIT).await?;
    ensure!(
        status.code() == Some(EX_USAGE),
        "exit {status}, output:\n{output}"
    );
    ensure!(
        output.contains("--drain-min-delay"),
        "the message does not name the flag:\n{output}"
    );
    Ok(())
}

#[tokio::test]
async fn bad_config_files_exit_64_naming_the_key() -> Result<()> {
    let dir = scratch_dir("bad-config")?;
    let cases = [
        ("drain: {minDelay: 20s, maxDelay: 5s}\n", "drain.minDelay"),
        (
            "limits: {headerReadTimeout: 0s}\n",
            "limits.headerReadTimeout",
        ),
        ("drain: {timeout: soon}\n", "soon"),
        (
            "routes: [{name: a, circuitBreaker: {errorRatio: 1.5}}]\n",
            "routes[0].circuitBreaker.errorRatio",
        ),
        ("drain: [not, a, map\n", "line"),
    ];
    for (i, (yaml, key)) in cases.iter().enumerate() {
        let path = dir.join(format!("bad-{i}.yaml"));
        std::fs::write(&path, yaml)?;
        refused_at_start(&["--config", &path.display().to_string()], key)
            .await
            .with_context(|| format!("{yaml:?}"))?;
    }
    // A file that does not exist is waited for (config_missing.rs);
    // one that exists but cannot be read (here: a directory) stops the start.
    let unreadable = dir.join("unreadable.yaml");
    std::fs::create_dir_all(&unreadable)?;
    refused_at_start(
        &["--config", &unreadable.display().to_string()],
        "unreadable.yaml",
    )
    .await
    .context("an unreadable file")?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// Starting with `extra` flags exits 64 with a message that names `key`.
async fn refused_at_start(extra: &[&str], key: &str) -> Result<()> {
    let mut args = base_args();
    args.extend_from_slice(extra);
    let (status, output) = run_to_exit(&args, WAIT).await?;
    ensure!(
        status.code() == Some(EX_USAGE),
        "exit {status}, output:\n{output}"
    );
    ensure!(
        output.contains(key),
        "the message does not name {key:?}:\n{output}"
    );
    Ok(())
}

/// One request on the connection kept open across reloads.
async fn keep_alive_request(conn: &mut SendRequest<Empty<Bytes>>) -> Result<()> {
    conn.ready()
        .await
        .context("the kept connection was closed")?;
    let req = Request::get("/work")
        .header("host", "a")
        .body(Empty::<Bytes>::new())?;
    let resp = conn
        .send_request(req)
        .await
        .context("request on the kept connection")?;
    ensure!(
        resp.status() == StatusCode::OK,
        "kept connection got {}",
        resp.status()
    );
    resp.into_body().collect().await?;
    Ok(())
}

fn drain_timeout(config: &serde_json::Value) -> Option<String> {
    config
        .pointer("/config/drain/timeout")?
        .as_str()
        .map(str::to_string)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_file_on_reload_keeps_the_last_good_config_and_traffic_flows() -> Result<()> {
    // The binary: SIGHUP is one of the two reload triggers under test.
    let app = TestApp::start("a").await?;
    let sidecar =
        Sidecar::start(SidecarSpec::new(app.addr).config("drain: {timeout: 7s}\n")).await?;
    let path = sidecar.config_path.clone().context("config path")?;
    ensure!(drain_timeout(&sidecar.config_json().await?).as_deref() == Some("7s"));

    // One keep-alive connection kept across every reload.
    let tcp = TcpStream::connect(sidecar.listen).await?;
    let (mut conn, driver) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
    tokio::spawn(driver);
    keep_alive_request(&mut conn).await?;

    // A broken file, then SIGHUP (the file watcher may also see it first).
    std::fs::write(&path, "drain: {minDelay: 20s, maxDelay: 5s}\n")?;
    sidecar.signal("HUP")?;
    let shown = wait_for("/config to report the bad file", WAIT, || async {
        let resp = sidecar.admin_get("/config").await.ok()?;
        resp.text().contains("drain.minDelay").then(|| resp.text())
    })
    .await
    .with_context(|| sidecar.logs_text())?;
    let config = sidecar.config_json().await?;
    ensure!(
        drain_timeout(&config).as_deref() == Some("7s"),
        "the last good config is no longer in force: {shown}"
    );
    let metrics = sidecar.metrics().await?;
    ensure!(
        metrics.counted_with("kubegrace_config_reloads_total", "result=\"error\"") >= 1.0,
        "failed reload not counted: {:?}",
        metrics.series
    );
    keep_alive_request(&mut conn).await?;
    let fresh = get(sidecar.listen, "/work").await?;
    fresh.expect(StatusCode::OK, "new connection")?;
    sidecar
        .expect_ready(StatusCode::OK, "a bad reload made the pod unready")
        .await?;

    // A good file again is taken (the watcher alone, no SIGHUP this time).
    std::fs::write(&path, "drain: {timeout: 9s}\n")?;
    wait_for("the fixed file to be in force", WAIT, || async {
        let config = sidecar.config_json().await.ok()?;
        (drain_timeout(&config).as_deref() == Some("9s")).then_some(())
    })
    .await
    .with_context(|| sidecar.logs_text())?;
    let shown = sidecar.admin_get("/config").await?.text();
    ensure!(
        !shown.contains("drain.minDelay"),
        "the old error is still reported: {shown}"
    );
    keep_alive_request(&mut conn).await?;
    Ok(())
}

#[tokio::test]
async fn drain_requires_the_token_when_one_is_configured() -> Result<()> {
    let (_app, sidecar) = Sidecar::with_app(&["--drain-token", "s3cret-t0ken"]).await?;
    let limit = Duration::from_secs(10);
    for (path, headers) in [
        ("/drain", &[][..]),
        ("/drain?wait=true", &[][..]),
        ("/drain", &[("X-Kubegrace-Drain-Token", "wrong")][..]),
    ] {
        let resp = request(sidecar.admin, Method::POST, path, headers, limit).await?;
        ensure!(
            resp.status == StatusCode::UNAUTHORIZED || resp.status == StatusCode::FORBIDDEN,
            "{path} with {headers:?} answered {}",
            resp.status
        );
    }
    sidecar
        .expect_ready(
            StatusCode::OK,
            "an unauthorized /drain took the pod out of rotation",
        )
        .await?;
    // Read-only endpoints stay open, and never show the token.
    for path in ["/live", "/ready", "/metrics", "/config"] {
        let resp = sidecar.admin_get(path).await?;
        ensure!(
            resp.status == StatusCode::OK,
            "{path} answered {}",
            resp.status
        );
        ensure!(
            !resp.text().contains("s3cret-t0ken"),
            "{path} shows the drain token"
        );
    }
    ensure!(
        !sidecar.logs_text().contains("s3cret-t0ken"),
        "the logs show the drain token"
    );
    let resp = sidecar
        .drain_with_token(Method::POST, "s3cret-t0ken")
        .await?;
    resp.expect(StatusCode::ACCEPTED, "/drain with the token")?;
    sidecar
        .expect_ready(
            StatusCode::SERVICE_UNAVAILABLE,
            "draining, yet /ready does not fail",
        )
        .await?;
    Ok(())
}

#[tokio::test]
async fn a_body_over_the_limit_gets_413_and_smaller_ones_pass() -> Result<()> {
    let (_app, sidecar) =
        InProcess::with_app_config("limits: {maxRequestBodyBytes: 1024}\n").await?;
    let small = format!(
        "POST /upload HTTP/1.1\r\nHost: a\r\nContent-Length: 512\r\nConnection: close\r\n\r\n{}",
        "x".repeat(512)
    );
    raw_expect(sidecar.listen, small.as_bytes(), 200, "512 bytes").await?;
    let big = format!(
        "POST /upload HTTP/1.1\r\nHost: a\r\nContent-Length: 4096\r\nConnection: close\r\n\r\n{}",
        "x".repeat(4096)
    );
    raw_expect(
        sidecar.listen,
        big.as_bytes(),
        413,
        "4096 bytes over a 1024 limit",
    )
    .await?;
    // Chunked, so the size is only known while streaming.
    let mut chunked = String::from(
        "POST /upload HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
    );
    for _ in 0..4 {
        chunked.push_str(&format!("400\r\n{}\r\n", "y".repeat(1024)));
    }
    chunked.push_str("0\r\n\r\n");
    raw_expect(
        sidecar.listen,
        chunked.as_bytes(),
        413,
        "4 KiB chunked over a 1024 limit",
    )
    .await?;
    Ok(())
}

/// RFC 9112 §6.3: a message with both Transfer-Encoding and Content-Length
/// is a smuggling attempt; an intermediary either rejects it or removes
/// Content-Length before forwarding. The app must never see both.
#[tokio::test]
async fn content_length_with_transfer_encoding_is_never_forwarded_as_is() -> Result<()> {
    let (_app, sidecar) = InProcess::with_app(&[]).await?;
    let smuggle = b"POST /headers HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n0\r\n\r\n";
    let answer = raw_exchange(sidecar.listen, smuggle).await?;
    let status = status_line(&answer);
    if status.starts_with("HTTP/1.1 400") {
        return Ok(());
    }
    ensure!(status.starts_with("HTTP/1.1 200"), "got {status:?}");
    let seen = answer.to_ascii_lowercase();
    // The body is the app's view of the head (proves what we check is it).
    ensure!(
        seen.contains("host: a"),
        "no header echo from the app:\n{answer}"
    );
    ensure!(
        !(seen.contains("content-length: 5") && seen.contains("transfer-encoding")),
        "the app received both Content-Length and Transfer-Encoding:\n{answer}"
    );
    Ok(())
}
