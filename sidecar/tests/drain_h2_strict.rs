//! HTTP/2 clients that do not play along with the drain (issue 12 item 4,
//! issue 12 item 10, issue 19): a client that never acks PING and never
//! lets its stream finish is force-closed at the drain deadline and
//! counted; the per-connection stream cap is announced and the stream past
//! it waits (a conforming client queues it) instead of breaking anything.

mod common;

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use bytes::Bytes;
use common::apps::TestApp;
use common::sidecar::{Sidecar, SidecarSpec};
use common::{wait_for, within};
use http::{Method, Request, StatusCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const WAIT: Duration = Duration::from_secs(30);

/// A short drain so the deadline is reached in seconds.
const DRAIN: &[&str] = &[
    "--drain-min-delay",
    "200ms",
    "--drain-quiet",
    "200ms",
    "--drain-max-delay",
    "1s",
    "--drain-timeout",
    "2s",
];

/// An HTTP/2 frame header (RFC 9113 §4.1) followed by its payload.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len();
    let mut out = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// A HEADERS block for `GET path` in HPACK without the dynamic table:
/// indexed `:method GET` (2) and `:scheme http` (6), literal `:path` (name 4)
/// and `:authority` (name 1) without indexing.
fn get_headers_block(path: &str) -> Vec<u8> {
    let mut block = vec![0x82, 0x86];
    for (name_index, value) in [(0x04u8, path), (0x01u8, "app.test")] {
        block.push(name_index);
        block.push(u8::try_from(value.len()).expect("short header value"));
        block.extend_from_slice(value.as_bytes());
    }
    block
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_that_ignores_ping_and_holds_its_stream_is_force_closed_at_the_deadline()
-> Result<()> {
    let app = TestApp::start("a").await?;
    let sidecar = Sidecar::start(SidecarSpec::new(app.addr).args(DRAIN)).await?;

    // Raw bytes so nothing answers for the client: the preface, empty
    // SETTINGS (never acked), and one GET whose body outlives the drain.
    let mut tcp = TcpStream::connect(sidecar.listen).await?;
    let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    hello.extend(frame(0x4, 0, 0, &[]));
    // END_STREAM | END_HEADERS
    hello.extend(frame(
        0x1,
        0x1 | 0x4,
        1,
        &get_headers_block("/stream?chunks=600&ms=100"),
    ));
    tcp.write_all(&hello).await?;
    wait_for("the app to see the held stream", WAIT, || async {
        (app.inflight() == 1).then_some(())
    })
    .await?;

    let started = std::time::Instant::now();
    let resp = sidecar.admin(Method::POST, "/drain").await?;
    ensure!(
        resp.status == StatusCode::ACCEPTED,
        "/drain: {}",
        resp.status
    );

    // The client reads nothing (no PING ack, no WINDOW_UPDATE); the sidecar
    // must close it at the deadline (max delay 1s + timeout 2s) and count it.
    sidecar
        .wait_metric("kubegrace_drain_force_closed_total", WAIT, |v| v >= 1.0)
        .await?;
    let forced_after = started.elapsed();
    ensure!(
        forced_after < Duration::from_secs(15),
        "force close took {forced_after:?}, far past max delay + timeout (3s)"
    );

    // Now the socket is closed: reading what was buffered ends in EOF or a
    // reset within a few seconds, never hangs.
    let mut sink = vec![0u8; 64 * 1024];
    within(
        "the held connection to close",
        Duration::from_secs(10),
        async {
            loop {
                match tcp.read(&mut sink).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => continue,
                }
            }
        },
    )
    .await?;

    let report = sidecar.admin_get("/metrics").await?.text();
    ensure!(
        report.contains("kubegrace_drain_force_closed_total 1"),
        "exactly one connection was force-closed:\n{report}"
    );
    Ok(())
}

async fn h2_connect(
    addr: std::net::SocketAddr,
) -> Result<(
    h2::client::SendRequest<Bytes>,
    tokio::task::JoinHandle<Result<(), h2::Error>>,
)> {
    let tcp = TcpStream::connect(addr)
        .await
        .with_context(|| format!("connect {addr}"))?;
    let (send, conn) = h2::client::handshake(tcp).await.context("h2 handshake")?;
    Ok((send, tokio::spawn(conn)))
}

fn get(path: &str) -> Result<Request<()>> {
    Request::builder()
        .method(Method::GET)
        .uri(format!("http://app.test{path}"))
        .body(())
        .context("build request")
}

/// The announced cap as the client sees it, once the server's SETTINGS
/// arrived.
async fn announced_cap(send: &mut h2::client::SendRequest<Bytes>, expect: usize) -> Result<usize> {
    wait_for("the server's SETTINGS", WAIT, || {
        let cap = send.current_max_send_streams();
        async move { (cap == expect).then_some(cap) }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_cap_is_announced_and_the_stream_past_it_waits_its_turn() -> Result<()> {
    let app = TestApp::start("a").await?;

    // The default is hyper's 200.
    let default = Sidecar::start(SidecarSpec::new(app.addr)).await?;
    let (mut send, _conn) = h2_connect(default.listen).await?;
    let (resp, _) = send.send_request(get("/ready")?, true)?;
    ensure!(resp.await?.status() == StatusCode::OK);
    announced_cap(&mut send, 200).await?;
    drop(default);

    // A cap of 4: five slow streams at once. The client holds the fifth
    // until one of the first four ends; all five succeed and the app never
    // has more than four of this connection's streams at a time.
    let capped =
        Sidecar::start(SidecarSpec::new(app.addr).args(&["--max-concurrent-streams", "4"])).await?;
    let (mut send, conn) = h2_connect(capped.listen).await?;
    let (resp, _) = send.send_request(get("/ready")?, true)?;
    ensure!(resp.await?.status() == StatusCode::OK);
    announced_cap(&mut send, 4).await?;

    let mut pending = Vec::new();
    for _ in 0..5 {
        send = send.ready().await.context("stream slot")?;
        let (resp, _) = send.send_request(get("/stream?chunks=10&ms=100")?, true)?;
        pending.push(resp);
    }
    // Sample the app's in-flight count while the streams run.
    let sample = async {
        let mut peak = 0i64;
        for _ in 0..30 {
            peak = peak.max(app.inflight());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        peak
    };
    let finish = async {
        for resp in pending {
            let resp = within("a capped stream's response", WAIT, resp).await??;
            ensure!(resp.status() == StatusCode::OK, "status {}", resp.status());
            let mut body = resp.into_body();
            while let Some(chunk) = body.data().await {
                let chunk = chunk?;
                let _ = body.flow_control().release_capacity(chunk.len());
            }
        }
        Ok::<_, anyhow::Error>(())
    };
    let (peak, finished) = tokio::join!(sample, finish);
    finished?;
    ensure!(
        (1..=4).contains(&peak),
        "app saw {peak} streams at once through a cap of 4"
    );
    ensure!(!conn.is_finished(), "the connection survived the cap");

    // A client that ignores the cap (raw frames: six streams at once) gets
    // REFUSED_STREAM (0x7) for the ones past it, and the connection and the
    // sidecar stay up.
    let mut tcp = TcpStream::connect(capped.listen).await?;
    let mut burst = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    burst.extend(frame(0x4, 0, 0, &[]));
    // Ack the server's SETTINGS up front, so the cap is in force.
    burst.extend(frame(0x4, 0x1, 0, &[]));
    tcp.write_all(&burst).await?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut streams = Vec::new();
    for id in [1u32, 3, 5, 7, 9, 11] {
        streams.extend(frame(
            0x1,
            0x1 | 0x4,
            id,
            &get_headers_block("/stream?chunks=20&ms=100"),
        ));
    }
    tcp.write_all(&streams).await?;
    let refused = within("REFUSED_STREAM for the streams past the cap", WAIT, async {
        let mut buf = Vec::new();
        let mut chunk = vec![0u8; 16 * 1024];
        let mut refused = Vec::new();
        loop {
            let n = tcp.read(&mut chunk).await?;
            ensure!(n > 0, "connection closed; frames so far: {refused:?}");
            buf.extend_from_slice(&chunk[..n]);
            // Walk whole frames; RST_STREAM is type 3 with a 4-byte code.
            while buf.len() >= 9 {
                let len =
                    usize::from(buf[0]) << 16 | usize::from(buf[1]) << 8 | usize::from(buf[2]);
                if buf.len() < 9 + len {
                    break;
                }
                let kind = buf[3];
                let id = u32::from_be_bytes([buf[5], buf[6], buf[7], buf[8]]) & 0x7fff_ffff;
                if kind == 0x3 && len == 4 {
                    let code = u32::from_be_bytes([buf[9], buf[10], buf[11], buf[12]]);
                    refused.push((id, code));
                }
                buf.drain(..9 + len);
            }
            if refused.len() >= 2 {
                return Ok::<_, anyhow::Error>(refused);
            }
        }
    })
    .await??;
    ensure!(
        refused.iter().all(|&(id, code)| code == 0x7 && id > 7),
        "expected REFUSED_STREAM on streams 9 and 11, got {refused:?}"
    );
    let (resp, _) = send.send_request(get("/ready")?, true)?;
    ensure!(
        resp.await?.status() == StatusCode::OK,
        "the sidecar still serves"
    );
    Ok(())
}

/// Routers learn about a terminating pod this late.
const LAG: Duration = Duration::from_millis(300);

/// The drain of drain_rolling.rs.
const ROLLING_DRAIN: &[&str] = &[
    "--drain-min-delay",
    "1s",
    "--drain-quiet",
    "200ms",
    "--drain-max-delay",
    "5s",
    "--drain-timeout",
    "3s",
];

/// The Service's virtual IP: each new TCP connection goes to a pod the
/// (lagging) balancer sees as ready and stays there, as kube-proxy does.
async fn service_front(balancer: common::balancer::Balancer) -> Result<std::net::SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((mut down, _)) = listener.accept().await {
            let Some((_, pod)) = balancer.pick() else {
                continue;
            };
            tokio::spawn(async move {
                if let Ok(mut up) = TcpStream::connect(pod).await {
                    let _ = tokio::io::copy_bidirectional(&mut down, &mut up).await;
                }
            });
        }
    });
    Ok(addr)
}

/// What the python load reported.
#[derive(Debug)]
struct PyReport {
    sent: u64,
    failed: u64,
    line: String,
}

/// The interpreter that has httpx with HTTP/2 (Debian: python3-httpx,
/// python3-h2). KUBEGRACE_TEST_PYTHON names another one.
fn python() -> Result<String> {
    let python =
        std::env::var("KUBEGRACE_TEST_PYTHON").unwrap_or_else(|_| "/usr/bin/python3".into());
    let check = std::process::Command::new(&python)
        .args(["-c", "import httpx, h2"])
        .output()
        .with_context(|| format!("run {python}"))?;
    ensure!(
        check.status.success(),
        "{python} cannot import httpx and h2 (Debian: apt-get install python3-httpx python3-h2, \
         or set KUBEGRACE_TEST_PYTHON): {}",
        String::from_utf8_lossy(&check.stderr)
    );
    Ok(python)
}

/// A rolling replacement under the python h2 client's load: pods a and b
/// serve, surge pod c comes up, a terminates as a native sidecar pod does.
async fn python_rolling_replacement(sidecar_args: &[&str]) -> Result<PyReport> {
    use common::pod::{Pod, Termination};
    let python = python()?;
    let balancer = common::balancer::Balancer::new(LAG);
    let mut a = Pod::start("a", Some(sidecar_args)).await?;
    let b = Pod::start("b", Some(sidecar_args)).await?;
    a.register(&balancer);
    b.register(&balancer);
    balancer.wait_routable("a", true, WAIT).await?;
    balancer.wait_routable("b", true, WAIT).await?;
    let front = service_front(balancer.clone()).await?;

    let dir = common::sidecar::scratch_dir("h2-strict")?;
    let stop = dir.join("stop");
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/h2_strict_support/httpx_load.py"
    );
    let load = tokio::process::Command::new(&python)
        .arg(script)
        .arg(format!("http://{front}/work?ms=30"))
        .args([
            "--clients",
            "6",
            "--streams",
            "6",
            "--max-requests",
            "30000",
        ])
        .args(["--max-seconds", "60", "--stop"])
        .arg(&stop)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("start the python load")?;

    wait_for("pod a to carry python load", WAIT, || async {
        (a.app.served() >= 200).then_some(())
    })
    .await?;
    let c = Pod::start("c", Some(sidecar_args)).await?;
    c.register(&balancer);
    balancer.wait_routable("c", true, WAIT).await?;
    a.terminate(Termination::NativeSidecar, WAIT, WAIT).await?;
    balancer.wait_routable("a", false, WAIT).await?;
    // The rollout goes on: b and c carry the load a while after a is gone.
    let served = b.app.served() + c.app.served();
    wait_for("b and c to carry the load", WAIT, || async {
        (b.app.served() + c.app.served() >= served + 300).then_some(())
    })
    .await?;
    std::fs::write(&stop, b"stop")?;
    let out = within(
        "the python load to end",
        Duration::from_secs(90),
        load.wait_with_output(),
    )
    .await??;
    let _ = std::fs::remove_dir_all(&dir);
    let line = String::from_utf8_lossy(&out.stdout).trim().to_string();
    ensure!(
        out.status.success(),
        "python load failed: {line}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value =
        serde_json::from_str(&line).with_context(|| format!("parse {line:?}"))?;
    let field = |k: &str| json.get(k).and_then(serde_json::Value::as_u64).unwrap_or(0);
    Ok(PyReport {
        sent: field("sent"),
        failed: field("failed"),
        line,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_h2_client_still_loses_requests_to_the_two_phase_goaway_drain() -> Result<()> {
    let old = python_rolling_replacement(ROLLING_DRAIN).await?;
    println!("python h2 (httpx), two-phase GOAWAY drain: {}", old.line);
    // The known gap (docs/http2-drain.md), measured so the fix can flip it:
    // hyper's GOAWAY, PING, GOAWAY loses requests with a
    // client that closes its side on the first GOAWAY.
    ensure!(
        old.sent > 0 && old.failed > 0,
        "the two-phase GOAWAY baseline lost nothing: {}",
        old.line
    );
    Ok(())
}
