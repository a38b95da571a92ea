//! Focused in-process checks of the proxy core: HTTP/1 keep-alive through
//! the proxy, upstream pool reuse, `Connection: close` while draining, the
//! limits, and the binary's command-line contract (exit 64, env twins).
//! The big drain scenarios live in drain_*.rs.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use kubegrace_sidecar::config::{Config, Endpoint, HumanDuration};
use kubegrace_sidecar::drain::Phase;
use kubegrace_sidecar::{Settings, Sidecar};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A test app on a random port: answers 200 with the path, counts the
/// connections it accepted.
struct App {
    addr: SocketAddr,
    accepted: Arc<AtomicU64>,
}

async fn start_app() -> Result<App> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let accepted = Arc::new(AtomicU64::new(0));
    let counter = accepted.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            counter.fetch_add(1, Ordering::Relaxed);
            tokio::spawn(async move {
                let service = hyper::service::service_fn(|req: Request<Incoming>| async move {
                    let xff = req
                        .headers()
                        .get("x-forwarded-for")
                        .map(|v| v.to_str().unwrap_or("").to_string())
                        .unwrap_or_default();
                    let body = format!("{} xff={xff}", req.uri().path());
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(body))))
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok(App { addr, accepted })
}

fn config_for(app: &App) -> Config {
    let any: SocketAddr = "127.0.0.1:0".parse().expect("addr");
    let mut config = Config {
        listen: Endpoint::Tcp(any),
        upstream: Endpoint::Tcp(app.addr),
        admin: Endpoint::Tcp(any),
        ..Config::default()
    };
    config.drain.min_delay = HumanDuration::from_millis(200);
    config.drain.quiet = HumanDuration::from_millis(100);
    config.drain.max_delay = HumanDuration::from_secs(5);
    config.drain.timeout = HumanDuration::from_secs(5);
    config
}

type Sender = hyper::client::conn::http1::SendRequest<Empty<Bytes>>;

async fn connect(addr: SocketAddr) -> Result<Sender> {
    let stream = TcpStream::connect(addr).await?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    Ok(sender)
}

async fn get(sender: &mut Sender, path: &str) -> Result<(StatusCode, http::HeaderMap, String)> {
    sender.ready().await?;
    let req = Request::get(path)
        .header("host", "example.test")
        .body(Empty::<Bytes>::new())?;
    let resp = sender.send_request(req).await?;
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = resp.into_body().collect().await?.to_bytes();
    Ok((status, headers, String::from_utf8_lossy(&body).into_owned()))
}

/// Waits (bounded) for a condition instead of sleeping a fixed time.
async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) -> Result<()> {
    for _ in 0..500 {
        if cond() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    bail!("timed out waiting for {what}")
}

async fn admin_get(admin: SocketAddr, path: &str) -> Result<(StatusCode, String)> {
    let mut sender = connect(admin).await?;
    sender.ready().await?;
    // The address as Host, as curl or the kubelet send it: a tokenless
    // admin port refuses a host name (DNS rebinding) on /drain.
    let req = Request::get(path)
        .header("host", admin.to_string())
        .body(Empty::<Bytes>::new())?;
    let resp = sender.send_request(req).await?;
    let status = resp.status();
    let body = resp.into_body().collect().await?.to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

#[tokio::test]
async fn keep_alive_connections_carry_many_requests() -> Result<()> {
    let app = start_app().await?;
    let sidecar = Sidecar::start(config_for(&app), Settings::default(), false).await?;
    let mut sender = connect(sidecar.listen_addr()).await?;
    for i in 0..20 {
        let (status, headers, body) = get(&mut sender, &format!("/item/{i}")).await?;
        assert_eq!(status, StatusCode::OK);
        assert!(
            body.starts_with(&format!("/item/{i} xff=127.0.0.1")),
            "{body}"
        );
        assert!(
            headers.get("connection").is_none(),
            "no close while serving"
        );
    }
    assert_eq!(
        sidecar.drain().connections_total(),
        1,
        "one downstream connection for 20 requests"
    );
    assert_eq!(
        app.accepted.load(Ordering::Relaxed),
        1,
        "one upstream connection reused"
    );
    Ok(())
}

#[tokio::test]
async fn a_burst_reuses_pooled_upstream_connections() -> Result<()> {
    let app = start_app().await?;
    let sidecar = Sidecar::start(config_for(&app), Settings::default(), false).await?;
    const CLIENTS: usize = 8;
    const PER_CLIENT: usize = 50;
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let addr = sidecar.listen_addr();
        tasks.push(tokio::spawn(async move {
            let mut sender = connect(addr).await?;
            for i in 0..PER_CLIENT {
                let (status, _, _) = get(&mut sender, &format!("/c{c}/{i}")).await?;
                anyhow::ensure!(status == StatusCode::OK, "status {status}");
            }
            Ok::<_, anyhow::Error>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let upstream = app.accepted.load(Ordering::Relaxed);
    // 400 requests, at most 8 at a time: the pool must stay near 8
    // connections, nowhere near one per request.
    assert!(
        upstream <= 2 * CLIENTS as u64,
        "{upstream} upstream connections for {} requests",
        CLIENTS * PER_CLIENT
    );
    Ok(())
}

#[tokio::test]
async fn draining_closes_http1_keep_alive_and_fails_readiness() -> Result<()> {
    let app = start_app().await?;
    let mut config = config_for(&app);
    // A long grace, so the test sees the Draining phase for sure.
    config.drain.min_delay = HumanDuration::from_secs(30);
    config.drain.max_delay = HumanDuration::from_secs(60);
    let sidecar = Sidecar::start(config, Settings::default(), false).await?;
    let (status, _) = admin_get(sidecar.admin_addr(), "/ready").await?;
    assert_eq!(status, StatusCode::OK);

    let mut sender = connect(sidecar.listen_addr()).await?;
    let (_, headers, _) = get(&mut sender, "/before").await?;
    assert!(headers.get("connection").is_none());

    let (status, _) = admin_get(sidecar.admin_addr(), "/drain").await?;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_eq!(sidecar.drain().phase(), Phase::Draining);
    let (status, _) = admin_get(sidecar.admin_addr(), "/ready").await?;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);

    // The kept-alive connection still works once more, and is told to go.
    let (status, headers, _) = get(&mut sender, "/during").await?;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        headers.get("connection").map(|v| v.as_bytes()),
        Some(&b"close"[..])
    );
    // New connections are still served while draining (routers lag).
    let mut fresh = connect(sidecar.listen_addr()).await?;
    let (status, headers, _) = get(&mut fresh, "/new").await?;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        headers.get("connection").map(|v| v.as_bytes()),
        Some(&b"close"[..])
    );
    Ok(())
}

#[tokio::test]
async fn shutdown_drains_and_reports() -> Result<()> {
    let app = start_app().await?;
    let sidecar = Sidecar::start(config_for(&app), Settings::default(), false).await?;
    let mut sender = connect(sidecar.listen_addr()).await?;
    get(&mut sender, "/one").await?;
    sidecar.shutdown();
    let drain = sidecar.drain().clone();
    let report = tokio::time::timeout(Duration::from_secs(20), sidecar.wait())
        .await
        .context("drain did not finish")?;
    assert_eq!(report.force_closed, 0, "{report}");
    assert_eq!(drain.phase(), Phase::Drained);
    assert_eq!(drain.open_connections(), 0);
    Ok(())
}

/// Writes raw bytes and reads the answer until the proxy closes.
async fn raw(addr: SocketAddr, request: &[u8]) -> Result<String> {
    let mut stream = TcpStream::connect(addr).await?;
    stream.write_all(request).await?;
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut out)).await;
    Ok(String::from_utf8_lossy(&out).into_owned())
}

#[tokio::test]
async fn bad_input_gets_4xx_not_a_crash() -> Result<()> {
    let app = start_app().await?;
    let mut config = config_for(&app);
    config.limits.max_header_bytes = 8192;
    config.limits.max_request_body_bytes = 16;
    let sidecar = Sidecar::start(config, Settings::default(), false).await?;
    let addr = sidecar.listen_addr();

    let answer = raw(addr, b"GARBAGE\r\n\r\n").await?;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");

    let big = format!(
        "GET / HTTP/1.1\r\nhost: x\r\nx-big: {}\r\n\r\n",
        "a".repeat(20_000)
    );
    let answer = raw(addr, big.as_bytes()).await?;
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");

    let answer = raw(
        addr,
        b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\nconnection: close\r\n\r\n0123456789",
    )
    .await?;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");

    let answer = raw(
        addr,
        b"POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n20\r\n0123456789abcdef0123456789abcdef\r\n0\r\n\r\n",
    )
    .await?;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");

    // Still alive and serving.
    let mut sender = connect(addr).await?;
    let (status, _, _) = get(&mut sender, "/after").await?;
    assert_eq!(status, StatusCode::OK);
    Ok(())
}

#[tokio::test]
async fn a_silent_client_is_cut_at_the_header_read_timeout() -> Result<()> {
    let app = start_app().await?;
    let mut config = config_for(&app);
    config.limits.header_read_timeout = HumanDuration::from_millis(300);
    let sidecar = Sidecar::start(config, Settings::default(), false).await?;
    let mut stream = TcpStream::connect(sidecar.listen_addr()).await?;
    stream.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n").await?;
    let mut buf = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut buf)).await;
    assert!(read.is_ok(), "the proxy must close a slow head");
    wait_until("connection closed", || {
        sidecar.drain().open_connections() == 0
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn a_client_that_never_speaks_is_cut_at_the_header_read_timeout() -> Result<()> {
    let app = start_app().await?;
    let mut config = config_for(&app);
    config.limits.header_read_timeout = HumanDuration::from_millis(300);
    let sidecar = Sidecar::start(config, Settings::default(), false).await?;
    for opening in [&b""[..], &b"GE"[..]] {
        let mut stream = TcpStream::connect(sidecar.listen_addr()).await?;
        stream.write_all(opening).await?;
        let mut buf = Vec::new();
        let read =
            tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut buf)).await;
        assert!(
            read.is_ok(),
            "the proxy must close a silent client ({opening:?})"
        );
    }
    wait_until("connections closed", || {
        sidecar.drain().open_connections() == 0
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn an_idle_keep_alive_connection_outlives_the_header_timeout() -> Result<()> {
    let app = start_app().await?;
    let mut config = config_for(&app);
    config.limits.header_read_timeout = HumanDuration::from_millis(100);
    let sidecar = Sidecar::start(config, Settings::default(), false).await?;
    let mut sender = connect(sidecar.listen_addr()).await?;
    get(&mut sender, "/one").await?;
    // Idle for several header timeouts: an idle connection is not a slow head.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (status, _, _) = get(&mut sender, "/two").await?;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(sidecar.drain().connections_total(), 1);
    Ok(())
}

#[tokio::test]
async fn app_down_means_502_and_not_ready() -> Result<()> {
    // Bind then drop: a port nothing listens on.
    let dead = TcpListener::bind("127.0.0.1:0").await?.local_addr()?;
    let app = App {
        addr: dead,
        accepted: Arc::new(AtomicU64::new(0)),
    };
    let mut config = config_for(&app);
    // Holding off (the default holds for the app to come back, then 503:
    // tests/app_restart.rs).
    config.upstream_pool.hold_timeout = HumanDuration::from_millis(0);
    let sidecar = Sidecar::start(config, Settings::default(), false).await?;
    let mut sender = connect(sidecar.listen_addr()).await?;
    let (status, _, _) = get(&mut sender, "/").await?;
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    let (status, body) = admin_get(sidecar.admin_addr(), "/ready").await?;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    Ok(())
}

mod binary {
    use std::process::Command;

    const BIN: &str = env!("CARGO_BIN_EXE_kubegrace-sidecar");

    fn clean() -> Command {
        let mut cmd = Command::new(BIN);
        for (key, _) in std::env::vars() {
            if key.starts_with("KUBEGRACE_") {
                cmd.env_remove(key);
            }
        }
        cmd
    }

    #[test]
    fn bad_flag_values_exit_64_naming_the_flag() {
        let out = clean()
            .args(["--drain-timeout", "forever"])
            .output()
            .expect("run the binary");
        assert_eq!(out.status.code(), Some(64));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("--drain-timeout"), "{stderr}");
    }

    #[test]
    fn environment_twins_are_checked_too() {
        let out = clean()
            .env("KUBEGRACE_DRAIN_MIN_DELAY", "soon")
            .output()
            .expect("run the binary");
        assert_eq!(out.status.code(), Some(64));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("--drain-min-delay"), "{stderr}");
    }

    #[test]
    fn relations_between_keys_exit_64_naming_the_key() {
        let out = clean()
            .args(["--drain-min-delay", "1m", "--drain-max-delay", "10s"])
            .output()
            .expect("run the binary");
        assert_eq!(out.status.code(), Some(64));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("drain.minDelay"), "{stderr}");
    }
}
