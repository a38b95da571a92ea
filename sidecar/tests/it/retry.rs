//! Retries of requests the app never saw (`retryBudget`, `routes[].retry`):
//! a POST whose HTTP/2 stream the app refused, or left above the last
//! stream id of its GOAWAY, goes again and succeeds, its body replayed;
//! the same with retries off fails. A request that reached the app is not
//! sent twice unless its route opts in and its method is idempotent, and
//! the app counts every request it got.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context, Result, ensure};
use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::kit::WAIT;
use crate::kit::http::{h2_connect, h2_frame as frame, h2_read_body, raw_exchange, status_line};
use crate::kit::sidecar::{InProcess, SidecarSpec};
use crate::kit::within;

const FRAME_DATA: u8 = 0x0;
const FRAME_HEADERS: u8 = 0x1;
const FRAME_RST_STREAM: u8 = 0x3;
const FRAME_SETTINGS: u8 = 0x4;
const FRAME_GOAWAY: u8 = 0x7;
const FLAG_ACK: u8 = 0x1;
const FLAG_END_STREAM: u8 = 0x1;
const REFUSED_STREAM: u32 = 0x7;
const PREFACE_LEN: usize = 24;

/// How the app turns away the first request of its first connection.
#[derive(Debug, Clone, Copy)]
enum TurnAway {
    /// RST_STREAM with REFUSED_STREAM, then a GOAWAY that keeps nothing.
    RefusedStream,
    /// A graceful GOAWAY (NO_ERROR) whose last stream id is 0: the stream
    /// is above it.
    GoAway,
}

/// An h2c app whose first client connection turns its first stream away
/// without processing it; every later connection is a hyper server that echoes
/// the request body and counts what it processed.
struct H2App {
    addr: SocketAddr,
    processed: Arc<AtomicU64>,
    turned_away: Arc<AtomicU64>,
}

impl H2App {
    async fn start(how: TurnAway) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let processed = Arc::new(AtomicU64::new(0));
        let turned_away = Arc::new(AtomicU64::new(0));
        let (p, t) = (processed.clone(), turned_away.clone());
        let first_taken = Arc::new(std::sync::atomic::AtomicBool::new(false));
        tokio::spawn(async move {
            // Bounded: a test opens a handful of connections.
            for _ in 0..64 {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let (p, t, first_taken) = (p.clone(), t.clone(), first_taken.clone());
                tokio::spawn(async move {
                    // The sidecar's reachability probe connects and sends
                    // nothing: only a connection with bytes is a client.
                    let mut byte = [0u8; 1];
                    match tokio::time::timeout(WAIT, tcp.peek(&mut byte)).await {
                        Ok(Ok(n)) if n > 0 => {}
                        _ => return,
                    }
                    if !first_taken.swap(true, Ordering::SeqCst) {
                        let _ = turn_away_first_stream(tcp, how, &t).await;
                    } else {
                        serve_echo(tcp, p).await;
                    }
                });
            }
        });
        Ok(Self {
            addr,
            processed,
            turned_away,
        })
    }
}

/// Speaks just enough HTTP/2 to read the first request whole (to the frame
/// with END_STREAM, so its body was sent) and turn its stream away, then
/// closes once the peer does (bounded).
async fn turn_away_first_stream(
    mut tcp: TcpStream,
    how: TurnAway,
    turned_away: &AtomicU64,
) -> Result<()> {
    tcp.write_all(&frame(FRAME_SETTINGS, 0, 0, &[])).await?;
    let mut buf = Vec::new();
    let mut at = PREFACE_LEN;
    loop {
        let mut chunk = [0u8; 4096];
        let n = within("the sidecar's frames", WAIT, tcp.read(&mut chunk)).await??;
        ensure!(n > 0, "the sidecar closed before sending a request");
        buf.extend_from_slice(&chunk[..n]);
        while buf.len() >= at + 9 {
            let len = usize::from(buf[at]) << 16
                | usize::from(buf[at + 1]) << 8
                | usize::from(buf[at + 2]);
            if buf.len() < at + 9 + len {
                break;
            }
            let (kind, flags) = (buf[at + 3], buf[at + 4]);
            let stream = u32::from_be_bytes([buf[at + 5], buf[at + 6], buf[at + 7], buf[at + 8]])
                & 0x7fff_ffff;
            at += 9 + len;
            if kind == FRAME_SETTINGS && flags & FLAG_ACK == 0 {
                tcp.write_all(&frame(FRAME_SETTINGS, FLAG_ACK, 0, &[]))
                    .await?;
            }
            if (kind == FRAME_HEADERS || kind == FRAME_DATA) && flags & FLAG_END_STREAM != 0 {
                let mut out = Vec::new();
                if let TurnAway::RefusedStream = how {
                    out.extend(frame(
                        FRAME_RST_STREAM,
                        0,
                        stream,
                        &REFUSED_STREAM.to_be_bytes(),
                    ));
                }
                // Last stream id 0, NO_ERROR: nothing on this connection was
                // or will be processed.
                out.extend(frame(FRAME_GOAWAY, 0, 0, &[0; 8]));
                tcp.write_all(&out).await?;
                turned_away.fetch_add(1, Ordering::SeqCst);
                // Let the sidecar read both before the socket goes.
                let mut rest = [0u8; 4096];
                let _ = tokio::time::timeout(WAIT, async {
                    while tcp.read(&mut rest).await.is_ok_and(|n| n > 0) {}
                })
                .await;
                return Ok(());
            }
        }
    }
}

async fn serve_echo(tcp: TcpStream, processed: Arc<AtomicU64>) {
    let service = service_fn(move |req: Request<Incoming>| {
        let processed = processed.clone();
        async move {
            let body = req
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            processed.fetch_add(1, Ordering::SeqCst);
            Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(body)))
        }
    });
    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
        .serve_connection(TokioIo::new(tcp), service)
        .await;
}

/// One POST with `body` over h2c through the sidecar: its status (or the
/// stream error) and the body echoed.
async fn h2_post(sidecar: SocketAddr, body: &'static [u8]) -> Result<(StatusCode, Vec<u8>)> {
    let (mut send, conn) = h2_connect(sidecar).await?;
    let req = Request::builder()
        .method(Method::POST)
        .uri("http://app.test/orders")
        .body(())?;
    let (response, mut stream) = send.send_request(req, false)?;
    stream.send_data(Bytes::from_static(body), true)?;
    let response = within("the answer", WAIT, response).await??;
    let status = response.status();
    let echoed = h2_read_body(response.into_body()).await?;
    drop(send);
    conn.abort();
    Ok((status, echoed))
}

/// What one refused-stream run showed.
#[derive(Debug)]
struct Run {
    status: StatusCode,
    echoed: Vec<u8>,
    processed: u64,
    turned_away: u64,
    retries: f64,
    denied_body: f64,
}

async fn refused_run(how: TurnAway, config: &str, body: &'static [u8]) -> Result<Run> {
    let app = H2App::start(how).await?;
    let sidecar = InProcess::start(SidecarSpec::new(app.addr).config(config)).await?;
    let (status, echoed) = h2_post(sidecar.listen, body).await?;
    let metrics = sidecar.metrics().await?;
    let reason = match how {
        TurnAway::RefusedStream => "refused_stream",
        TurnAway::GoAway => "goaway",
    };
    let run = Run {
        status,
        echoed,
        processed: app.processed.load(Ordering::SeqCst),
        turned_away: app.turned_away.load(Ordering::SeqCst),
        retries: metrics
            .with_label("kubegrace_retries_total", &format!("reason=\"{reason}\""))
            .context("kubegrace_retries_total is exported from the start")?,
        denied_body: metrics
            .with_label("kubegrace_retries_denied_total", "reason=\"body\"")
            .unwrap_or(-1.0),
    };
    println!("{how:?} with {config:?}: {run:?}");
    Ok(run)
}

const RETRIES_ON: &str = "retryBudget: {ratio: 0.2, minPerSecond: 10}\n";
const RETRIES_OFF: &str = "retryBudget: {maxBodyBytes: 0}\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_the_app_refused_or_left_above_goaway_is_retried_with_its_body() -> Result<()> {
    for how in [TurnAway::RefusedStream, TurnAway::GoAway] {
        // Baseline: without retries the client gets the failure.
        let off = refused_run(how, RETRIES_OFF, b"order-42").await?;
        ensure!(off.turned_away == 1, "baseline {how:?}: {off:?}");
        ensure!(
            off.status.is_server_error() && off.processed == 0,
            "baseline {how:?}: the failure should reach the client: {off:?}"
        );

        let on = refused_run(how, RETRIES_ON, b"order-42").await?;
        ensure!(on.turned_away == 1, "{how:?}: {on:?}");
        ensure!(on.status == StatusCode::OK, "{how:?}: not retried: {on:?}");
        ensure!(
            on.echoed == b"order-42",
            "{how:?}: the body was not replayed: {on:?}"
        );
        ensure!(on.processed == 1 && on.retries == 1.0, "{how:?}: {on:?}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_larger_than_what_is_kept_is_not_retried_and_counted() -> Result<()> {
    let run = refused_run(
        TurnAway::RefusedStream,
        "retryBudget: {maxBodyBytes: 4}\n",
        b"order-42",
    )
    .await?;
    ensure!(
        run.status.is_server_error() && run.processed == 0 && run.retries == 0.0,
        "{run:?}"
    );
    ensure!(run.denied_body == 1.0, "{run:?}");
    Ok(())
}

/// An HTTP/1.1 app that reads each request whole, counts it, and drops the
/// connection without an answer for the first one: the request reached the
/// app, which may have acted on it.
async fn drop_first_app() -> Result<(SocketAddr, Arc<AtomicU64>)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let seen = Arc::new(AtomicU64::new(0));
    let counter = seen.clone();
    tokio::spawn(async move {
        for _ in 0..64 {
            let Ok((mut tcp, _)) = listener.accept().await else {
                return;
            };
            let counter = counter.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                // Bounded: one request per connection here.
                for _ in 0..64 {
                    let mut chunk = [0u8; 4096];
                    match tcp.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                    let length: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0);
                    if buf.len() < end + 4 + length {
                        continue;
                    }
                    if counter.fetch_add(1, Ordering::SeqCst) == 0 {
                        return; // dropped: no answer
                    }
                    let _ = tcp
                        .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n")
                        .await;
                    return;
                }
            });
        }
    });
    Ok((addr, seen))
}

/// Sends `method` through a sidecar with `config` in front of a
/// drop-first app: the client's status line and how often the app got it.
async fn reached_app_run(config: &str, method: &str) -> Result<(String, u64)> {
    let (addr, seen) = drop_first_app().await?;
    let sidecar = InProcess::start(SidecarSpec::new(addr).config(config)).await?;
    let body = if method == "POST" { "x=1" } else { "" };
    let request = format!(
        "{method} /items/7 HTTP/1.1\r\nHost: app.test\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let answer = raw_exchange(sidecar.listen, request.as_bytes()).await?;
    let status = status_line(&answer).to_string();
    Ok((status, seen.load(Ordering::SeqCst)))
}

const IDEMPOTENT_ROUTE: &str =
    "routes:\n- name: items\n  match: {pathPrefix: /items}\n  retry: {idempotent: true}\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_reached_the_app_is_retried_only_when_idempotent_and_opted_in() -> Result<()>
{
    // No opt-in: the GET reached the app, so it is not sent again.
    let (status, seen) = reached_app_run("", "GET").await?;
    ensure!(
        status.contains(" 502") && seen == 1,
        "no opt-in: {status} seen {seen}"
    );
    // Opted in: the GET goes again and the app answers the second.
    let (status, seen) = reached_app_run(IDEMPOTENT_ROUTE, "GET").await?;
    ensure!(
        status.contains(" 200") && seen == 2,
        "opt-in GET: {status} seen {seen}"
    );
    // Opted in, but POST is not idempotent: the app got it exactly once.
    let (status, seen) = reached_app_run(IDEMPOTENT_ROUTE, "POST").await?;
    ensure!(
        status.contains(" 502") && seen == 1,
        "opt-in POST: {status} seen {seen}"
    );
    Ok(())
}
