//! The load generator and the demo report, on loopback, without a cluster: real hyper, h2
//! and tonic servers, and servers that misbehave in one specific way each, so every failure
//! reason is shown to be attributed correctly. Every run is bounded in count and time; no
//! assertion depends on timing except that loopback delivers within the (generous) timeouts.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use kubegrace_e2e::load::conn::{ConnStats, Http2Pool};
use kubegrace_e2e::load::grpc::{self, EchoRequest, EchoServer};
use kubegrace_e2e::load::outcome::RequestCtx;
use kubegrace_e2e::load::report::{self, DemoResult, DemoRun, Event};
use kubegrace_e2e::load::target::Target;
use kubegrace_e2e::load::{self, Config, Protocol, Reason, Summary};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tonic::codegen::Service as _;

type Body = tonic::body::Body;

fn text(status: StatusCode, body: &'static str) -> Response<Body> {
    let mut resp = Response::new(Body::new(Full::new(Bytes::from_static(body.as_bytes()))));
    *resp.status_mut() = status;
    resp
}

/// What a well-behaved demo app looks like: HTTP/1.1 and h2c on one port, gRPC requests
/// routed to the Echo service, `/503` and `/slow` for the failure tests.
async fn handle(echo: EchoServer, req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    if grpc::is_grpc(&req) {
        let mut echo = echo;
        return echo.call(req).await;
    }
    Ok(match req.uri().path() {
        "/503" => text(StatusCode::SERVICE_UNAVAILABLE, "unavailable\n"),
        "/slow" => {
            // Longer than any test's timeout; the server task dies with the test runtime.
            tokio::time::sleep(Duration::from_secs(30)).await;
            text(StatusCode::OK, "late\n")
        }
        // Like the demo app: the body names the pod, which the loadgen tallies.
        _ => text(StatusCode::OK, "pod=pod-a\n"),
    })
}

async fn app_server() -> Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let echo = EchoServer::new("pod-a");
                let service = service_fn(move |req| handle(echo.clone(), req));
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok(addr)
}

/// A server that drains connections the way kubegrace does: HTTP/1.1 answers with
/// `Connection: close` (every response), HTTP/2 connections get a graceful two-phase
/// GOAWAY after `per_conn` requests. A well-behaved client loses nothing to either.
async fn draining_server(per_conn: usize) -> Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut preface = [0u8; 3];
                if stream.peek(&mut preface).await.is_err() {
                    return;
                }
                let io = TokioIo::new(stream);
                if &preface != b"PRI" {
                    let service = service_fn(|_req: Request<Incoming>| async {
                        Ok::<_, Infallible>(text(StatusCode::OK, "ok\n"))
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .keep_alive(false)
                        .serve_connection(io, service)
                        .await;
                    return;
                }
                let served = Arc::new(std::sync::atomic::AtomicUsize::new(0));
                let drain = Arc::new(tokio::sync::Notify::new());
                let service = {
                    let (served, drain) = (served.clone(), drain.clone());
                    service_fn(move |req: Request<Incoming>| {
                        let n = served.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                        if n == per_conn {
                            drain.notify_one();
                        }
                        let echo = EchoServer::new("draining");
                        handle(echo, req)
                    })
                };
                let conn = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(io, service);
                tokio::pin!(conn);
                tokio::select! {
                    _ = conn.as_mut() => return,
                    _ = drain.notified() => conn.as_mut().graceful_shutdown(),
                }
                let _ = conn.await;
            });
        }
    });
    Ok(addr)
}

/// Reads one request head (up to the blank line), or fails at EOF.
async fn read_head(stream: &mut TcpStream) -> std::io::Result<()> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Ok(())
}

#[derive(Clone, Copy)]
enum Misbehave {
    /// Read the request, then close without answering (FIN): the request was written.
    CloseMidRequest,
    /// Read the request, then reset the connection (RST).
    ResetMidRequest,
    /// Answer one request as keep-alive, then close the idle connection.
    CloseWhenIdle,
    /// Answer one request as keep-alive (naming pod `p1`), then read the next one and
    /// close without answering: a pod dying with a request in flight.
    AnswerOnceThenCut,
}

async fn raw_server(mode: Misbehave) -> Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                if read_head(&mut stream).await.is_err() {
                    return;
                }
                match mode {
                    Misbehave::CloseMidRequest => drop(stream),
                    Misbehave::ResetMidRequest => {
                        let _ = stream.set_zero_linger();
                        drop(stream);
                    }
                    Misbehave::AnswerOnceThenCut => {
                        let _ = stream
                            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 7\r\n\r\npod=p1\n")
                            .await;
                        let _ = read_head(&mut stream).await;
                        drop(stream);
                    }
                    Misbehave::CloseWhenIdle => {
                        let _ = stream
                            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nok\n")
                            .await;
                        let _ = stream.flush().await;
                        // Close right behind the response, without `Connection: close`: the
                        // FIN is in the client's socket long before its next request (50 ms
                        // later), whatever the scheduler does, as when an app's idle timeout
                        // closes a pooled connection.
                        drop(stream);
                    }
                }
            });
        }
    });
    Ok(addr)
}

/// An h2 server that refuses every stream with RST_STREAM(REFUSED_STREAM).
async fn h2_refusing_server() -> Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Ok(mut conn) = h2::server::handshake(stream).await else {
                    return;
                };
                while let Some(Ok((_req, mut respond))) = conn.accept().await {
                    respond.send_reset(h2::Reason::REFUSED_STREAM);
                }
            });
        }
    });
    Ok(addr)
}

fn config(addr: SocketAddr, protocol: Protocol, rate: f64, duration_ms: u64) -> Config {
    Config {
        target: format!("http://{addr}"),
        protocol,
        rate,
        duration: Duration::from_millis(duration_ms),
        connections: 2,
        timeout: Duration::from_secs(5),
        ..Config::default()
    }
}

/// [`config`] on a single connection, so every request reuses (or replaces) the same one.
fn one_connection(addr: SocketAddr, protocol: Protocol, rate: f64, duration_ms: u64) -> Config {
    Config {
        connections: 1,
        ..config(addr, protocol, rate, duration_ms)
    }
}

fn only_reason(s: &Summary, reason: Reason) -> Result<()> {
    ensure!(
        s.requests == s.scheduled,
        "sent {} of {} scheduled",
        s.requests,
        s.scheduled
    );
    ensure!(
        s.by_reason.get(reason) == s.requests,
        "expected every request to be {reason}, got {:?} (details {:?})",
        s.by_reason,
        s.by_detail
    );
    Ok(())
}

#[tokio::test]
async fn http1_all_ok_sends_exactly_the_scheduled_count() -> Result<()> {
    let addr = app_server().await?;
    let s = load::run(&config(addr, Protocol::Http1, 200.0, 1_000)).await?;
    assert_eq!(s.scheduled, 200);
    assert_eq!(s.requests, 200);
    only_reason(&s, Reason::Ok)?;
    assert_eq!(s.failed, 0);
    assert_eq!(s.timeline.iter().map(|t| t.ok).sum::<u64>(), 200);
    // Keep-alive: the pool reuses its connections instead of one per request.
    assert!(
        s.connects <= 2,
        "opened {} connections with a pool of 2",
        s.connects
    );
    Ok(())
}

#[tokio::test]
async fn max_requests_caps_the_schedule() -> Result<()> {
    let addr = app_server().await?;
    let cfg = Config {
        max_requests: 25,
        ..config(addr, Protocol::Http1, 100.0, 60_000)
    };
    let s = load::run(&cfg).await?;
    assert_eq!((s.scheduled, s.requests, s.failed), (25, 25, 0));
    Ok(())
}

#[tokio::test]
async fn a_stopped_run_reports_what_it_sent() -> Result<()> {
    let addr = app_server().await?;
    let cfg = config(addr, Protocol::Http1, 100.0, 60_000);
    let stop = tokio::time::sleep(Duration::from_millis(300));
    let (outcomes, s) = load::run_outcomes_until(&cfg, stop).await?;
    assert_eq!(s.scheduled, 6_000);
    assert!(
        s.requests > 0 && s.requests < s.scheduled,
        "sent {}",
        s.requests
    );
    assert_eq!(outcomes.len() as u64, s.requests);
    assert_eq!(s.failed, 0);
    Ok(())
}

#[tokio::test]
async fn http2_and_mixed_all_ok() -> Result<()> {
    let addr = app_server().await?;
    let s = load::run(&config(addr, Protocol::Http2, 100.0, 500)).await?;
    only_reason(&s, Reason::Ok)?;
    assert_eq!(s.requests, 50);
    assert!(
        s.connects <= 2,
        "h2 multiplexes: opened {} connections",
        s.connects
    );

    let s = load::run(&config(addr, Protocol::Mixed, 90.0, 1_000)).await?;
    only_reason(&s, Reason::Ok)?;
    assert_eq!(s.requests, 90);
    assert_eq!(s.by_pod.keys().collect::<Vec<_>>(), ["pod-a"]);
    assert_eq!(s.by_pod["pod-a"].requests, 90);
    for kind in ["http1", "http2", "grpc-unary", "grpc-stream"] {
        ensure!(
            s.by_kind.get(kind).is_some_and(|k| k.requests > 0),
            "no {kind} requests: {:?}",
            s.by_kind
        );
    }
    Ok(())
}

#[tokio::test]
async fn a_connection_cut_mid_request_is_reset() -> Result<()> {
    for mode in [Misbehave::CloseMidRequest, Misbehave::ResetMidRequest] {
        let addr = raw_server(mode).await?;
        let s = load::run(&config(addr, Protocol::Http1, 50.0, 200)).await?;
        assert_eq!(s.requests, 10);
        only_reason(&s, Reason::Reset)?;
    }
    Ok(())
}

#[tokio::test]
async fn a_failure_is_attributed_to_the_pod_its_connection_talked_to() -> Result<()> {
    let addr = raw_server(Misbehave::AnswerOnceThenCut).await?;
    let s = load::run(&one_connection(addr, Protocol::Http1, 20.0, 500)).await?;
    assert_eq!((s.requests, s.ok, s.by_reason.reset), (10, 5, 5), "{s:?}");
    assert_eq!(s.by_pod.keys().collect::<Vec<_>>(), ["p1"]);
    assert_eq!(s.by_pod["p1"].failed, 5);
    assert_eq!(
        s.by_detail.get(
            "reset: connection closed before the response completed (reused keep-alive connection)"
        ),
        Some(&5),
        "{:?}",
        s.by_detail
    );
    Ok(())
}

#[tokio::test]
async fn a_keepalive_connection_closed_between_requests_is_not_a_failure() -> Result<()> {
    let addr = raw_server(Misbehave::CloseWhenIdle).await?;
    let s = load::run(&one_connection(addr, Protocol::Http1, 20.0, 500)).await?;
    only_reason(&s, Reason::Ok)?;
    assert_eq!(s.requests, 10);
    // Every request needed a new connection. Whether hyper noticed the close while the
    // connection sat in the pool or only when the next request was handed to it (counted
    // in `stale_reconnects`) depends on scheduling, so neither is asserted.
    assert_eq!(s.connects, 10);
    Ok(())
}

#[tokio::test]
async fn connection_close_loses_nothing_and_goaway_refusals_are_attributed() -> Result<()> {
    let addr = draining_server(5).await?;
    // HTTP/1.1: every response says `Connection: close`, so no request is ever written on
    // a connection the server is closing.
    let s = load::run(&config(addr, Protocol::Http1, 100.0, 500)).await?;
    only_reason(&s, Reason::Ok)?;
    assert_eq!(s.connects, 50);

    // HTTP/2 and gRPC: a two-phase GOAWAY every 5 requests. Streams already in flight
    // finish. A stream the client queued just as the GOAWAY's PING arrived can still go
    // out after the PING ack (h2 answers pings first) and be refused by the final GOAWAY;
    // whether that happens depends on scheduling, so such refusals are allowed, but they
    // must be attributed exactly, and nothing else may fail.
    for protocol in [Protocol::Http2, Protocol::Grpc] {
        let s = load::run(&config(addr, protocol, 100.0, 500)).await?;
        assert_eq!(s.requests, 50);
        assert_eq!(
            s.ok + s.by_reason.reset,
            50,
            "{protocol:?}: {:?}",
            s.by_detail
        );
        for detail in s.by_detail.keys() {
            ensure!(
                detail.starts_with("reset: h2 stream refused by GOAWAY"),
                "{protocol:?}: unexpected failure {detail}"
            );
        }
        // The server really closed connections: the pools had to open new ones.
        assert!(
            s.connects >= 5,
            "{protocol:?}: only {} connections",
            s.connects
        );
    }
    Ok(())
}

#[tokio::test]
async fn a_closed_port_is_refused() -> Result<()> {
    // A port bound but never listened on, and held for the whole test: a
    // connect is refused, and no other test (or outgoing connection) can be
    // given the port meanwhile. (A listener bound and dropped freed the port,
    // and once another test's server got it: 10 resets instead of refusals.)
    let closed = tokio::net::TcpSocket::new_v4()?;
    closed.bind("127.0.0.1:0".parse()?)?;
    let addr = closed.local_addr()?;
    for protocol in [Protocol::Http1, Protocol::Http2, Protocol::Grpc] {
        let s = load::run(&config(addr, protocol, 50.0, 200)).await?;
        only_reason(&s, Reason::Refused)?;
    }
    drop(closed);
    Ok(())
}

#[tokio::test]
async fn a_503_is_http_5xx() -> Result<()> {
    let addr = app_server().await?;
    for protocol in [Protocol::Http1, Protocol::Http2] {
        let cfg = Config {
            path: "/503".into(),
            ..config(addr, protocol, 50.0, 200)
        };
        let s = load::run(&cfg).await?;
        only_reason(&s, Reason::Http5xx)?;
        assert_eq!(s.by_detail.get("http_5xx: HTTP 503"), Some(&10));
    }
    Ok(())
}

#[tokio::test]
async fn a_slow_server_is_timeout() -> Result<()> {
    let addr = app_server().await?;
    let cfg = Config {
        path: "/slow".into(),
        timeout: Duration::from_millis(300),
        ..config(addr, Protocol::Http1, 20.0, 250)
    };
    let s = load::run(&cfg).await?;
    only_reason(&s, Reason::Timeout)?;
    assert_eq!(s.requests, 5);
    // Two connections, five requests: the other three timed out waiting for a connection.
    assert!(
        s.by_detail
            .keys()
            .any(|d| d.contains("awaiting the response")),
        "{:?}",
        s.by_detail
    );
    Ok(())
}

#[tokio::test]
async fn an_h2_refused_stream_is_reset() -> Result<()> {
    let addr = h2_refusing_server().await?;
    let s = load::run(&config(addr, Protocol::Http2, 50.0, 200)).await?;
    only_reason(&s, Reason::Reset)?;
    assert_eq!(
        s.by_detail.get("reset: h2 RST_STREAM REFUSED_STREAM"),
        Some(&10),
        "{:?}",
        s.by_detail
    );
    let s = load::run(&config(addr, Protocol::Grpc, 50.0, 200)).await?;
    only_reason(&s, Reason::Reset)?;
    Ok(())
}

#[tokio::test]
async fn grpc_unary_and_stream_against_the_echo_server() -> Result<()> {
    let addr = app_server().await?;
    let pool = Arc::new(Http2Pool::new(
        Target::parse(&format!("http://{addr}"))?,
        1,
        Arc::new(ConnStats::default()),
    ));
    let ctx = Arc::new(RequestCtx::default());

    let reply = grpc::unary(
        &pool,
        &ctx,
        EchoRequest {
            message: "hi".into(),
            ..Default::default()
        },
    )
    .await
    .context("unary")?;
    assert_eq!(
        (reply.message.as_str(), reply.pod.as_str(), reply.seq),
        ("hi", "pod-a", 0)
    );

    let req = EchoRequest {
        message: "s".into(),
        count: 4,
        interval_ms: 1,
        ..Default::default()
    };
    let replies = grpc::stream(&pool, &ctx, req).await.context("stream")?;
    assert_eq!(
        replies.iter().map(|r| r.seq).collect::<Vec<_>>(),
        [0, 1, 2, 3]
    );
    assert!(replies.iter().all(|r| r.pod == "pod-a" && r.message == "s"));

    // Through the runner: unary and streams, all ok, one connection reused.
    let s = load::run(&one_connection(addr, Protocol::Grpc, 80.0, 500)).await?;
    only_reason(&s, Reason::Ok)?;
    assert_eq!(s.by_kind["grpc-stream"].requests, 10);
    assert_eq!(s.by_kind["grpc-unary"].requests, 30);
    assert_eq!(s.connects, 1);
    Ok(())
}

#[tokio::test]
async fn the_echo_server_mounts_on_a_tonic_server() -> Result<()> {
    // How the demo app can serve it: tonic's own server, no routing code.
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(EchoServer::new("pod-t"))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );
    let s = load::run(&one_connection(addr, Protocol::Grpc, 40.0, 500)).await?;
    only_reason(&s, Reason::Ok)?;
    assert_eq!(s.requests, 20);
    Ok(())
}

#[tokio::test]
async fn an_unknown_grpc_method_is_unimplemented() -> Result<()> {
    let mut server = EchoServer::new("p");
    let req = http::Request::post("/kubegrace.demo.Echo/Nope")
        .header("content-type", "application/grpc")
        .body(Body::default())?;
    let resp = server.call(req).await?;
    assert_eq!(
        resp.headers().get("grpc-status").map(|v| v.as_bytes()),
        Some(&b"12"[..])
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Report

fn fixture(failures: &[(u64, &str)]) -> Result<Summary> {
    let mut timeline = Vec::new();
    let mut requests = 0;
    let mut failed = 0;
    for t in 0..20u64 {
        let mut second = serde_json::json!({"t": t, "ok": 50, "failed": 0,
            "failed_by_reason": {"refused": 0, "reset": 0, "http_5xx": 0, "timeout": 0, "other": 0}});
        for (at, reason) in failures {
            if *at == t {
                second["ok"] = serde_json::json!(47);
                second["failed"] = serde_json::json!(3);
                second["failed_by_reason"][*reason] = serde_json::json!(3);
                failed += 3;
            }
        }
        requests += 50;
        timeline.push(second);
    }
    let mut by_reason = serde_json::json!({"ok": requests - failed, "refused": 0, "reset": 0, "http_5xx": 0, "timeout": 0, "other": 0});
    for (_, reason) in failures {
        by_reason[*reason] = serde_json::json!(by_reason[*reason].as_u64().unwrap_or(0) + 3);
    }
    let v = serde_json::json!({
        "target": "http://10.96.0.10:80", "protocol": "http1", "rate": 50.0, "connections": 4,
        "scheduled": requests, "requests": requests, "ok": requests - failed, "failed": failed,
        "by_reason": by_reason, "by_detail": {}, "by_kind": {},
        "by_pod": {"web-old": {"requests": requests, "failed": failed, "by_reason": by_reason}},
        "p50_ms": 1.25, "p90_ms": 2.0, "p99_ms": 7.5, "max_ms": 12.0, "duration_s": 20.0,
        "first_failure_s": null, "last_failure_s": null, "connects": 4, "stale_reconnects": 0,
        "timeline": timeline,
    });
    Ok(serde_json::from_value(v)?)
}

/// A small XML well-formedness check: tags nest and close, attributes are quoted, text
/// and attribute values contain no raw `<` or stray `&`. Returns the element count.
fn check_xml(doc: &str) -> Result<usize> {
    fn check_text(t: &str) -> Result<()> {
        let mut rest = t;
        while let Some(i) = rest.find('&') {
            let after = &rest[i + 1..];
            let Some(end) = after.find(';') else {
                bail!("bare & in {t:?}")
            };
            ensure!(
                ["amp", "lt", "gt", "quot", "apos"].contains(&&after[..end]),
                "unknown entity in {t:?}"
            );
            rest = &after[end + 1..];
        }
        ensure!(!t.contains('<'), "raw < in {t:?}");
        Ok(())
    }
    let mut stack: Vec<&str> = Vec::new();
    let mut elements = 0;
    let mut rest = doc;
    while let Some(lt) = rest.find('<') {
        check_text(&rest[..lt])?;
        let gt = rest[lt..]
            .find('>')
            .map(|i| lt + i)
            .context("unclosed tag")?;
        let tag = &rest[lt + 1..gt];
        rest = &rest[gt + 1..];
        if let Some(name) = tag.strip_prefix('/') {
            let open = stack.pop().context("close without open")?;
            ensure!(open == name.trim(), "</{name}> closes <{open}>");
            continue;
        }
        let (body, self_closing) = match tag.strip_suffix('/') {
            Some(b) => (b, true),
            None => (tag, false),
        };
        let name_end = body.find(char::is_whitespace).unwrap_or(body.len());
        let name = &body[..name_end];
        ensure!(
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == ':'),
            "bad tag {tag:?}"
        );
        // Attributes: name="value" pairs.
        let mut attrs = body[name_end..].trim();
        while !attrs.is_empty() {
            let eq = attrs
                .find('=')
                .with_context(|| format!("attribute without value in {tag:?}"))?;
            let attr = attrs[..eq].trim();
            ensure!(
                !attr.is_empty() && !attr.contains(char::is_whitespace),
                "bad attribute name in {tag:?}"
            );
            let value = attrs[eq + 1..]
                .strip_prefix('"')
                .with_context(|| format!("unquoted attribute in {tag:?}"))?;
            let close = value
                .find('"')
                .with_context(|| format!("unterminated attribute in {tag:?}"))?;
            check_text(&value[..close])?;
            attrs = value[close + 1..].trim_start();
        }
        elements += 1;
        if !self_closing {
            stack.push(name);
        }
    }
    check_text(rest)?;
    ensure!(stack.is_empty(), "unclosed elements {stack:?}");
    Ok(elements)
}

#[test]
fn xml_checker_rejects_broken_documents() {
    assert!(check_xml(r#"<svg a="1"><g><rect/></g></svg>"#).is_ok());
    for bad in [
        r#"<svg><g></svg>"#,
        r#"<svg a=1/>"#,
        "<svg>a & b</svg>",
        "<svg>",
        r#"<svg a="x"></g>"#,
    ] {
        assert!(check_xml(bad).is_err(), "accepted {bad}");
    }
}

#[test]
fn report_renders_table_json_and_svg() -> Result<()> {
    let result = DemoResult {
        with: DemoRun {
            summary: fixture(&[])?,
            rollout_s: 24.5,
            rollout_start_s: Some(3.0),
            events: Vec::new(),
        },
        without: DemoRun {
            summary: fixture(&[(6, "refused"), (7, "reset"), (9, "reset")])?,
            rollout_s: 11.2,
            rollout_start_s: Some(3.0),
            events: vec![
                Event {
                    t_s: 5.5,
                    label: "pod web-1 <deleted> & gone".into(),
                },
                Event {
                    t_s: 5.9,
                    label: "endpoint removed".into(),
                },
            ],
        },
    };
    let table = report::table(&result);
    let lines: Vec<&str> = table.lines().collect();
    assert!(
        lines[0].contains("without kubegrace") && lines[0].contains("with kubegrace"),
        "{table}"
    );
    let row = |name: &str| {
        lines
            .iter()
            .find(|l| l.starts_with(name))
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
    };
    assert_eq!(row("requests"), Some(vec!["requests", "1000", "1000"]));
    assert_eq!(
        row("failed"),
        Some(vec!["failed", "9", "(0.90%)", "0", "(0.00%)"])
    );
    assert_eq!(row("  reset"), Some(vec!["reset", "6", "0"]));
    assert_eq!(
        row("rollout duration"),
        Some(vec!["rollout", "duration", "11.2", "s", "24.5", "s"])
    );
    assert!(table.contains("p99 latency"));
    assert!(
        table.contains("without: failed by pod: web-old 9"),
        "{table}"
    );
    assert!(!table.contains("with: failed by pod"), "{table}");

    let svg = report::svg(&result);
    let elements = check_xml(&svg)?;
    assert!(elements > 40, "only {elements} elements");
    assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
    assert!(
        svg.contains("without kubegrace: 9 of 1000 requests failed<"),
        "{svg}"
    );
    assert!(svg.contains("with kubegrace: 0 of 1000 requests failed"));
    assert!(
        svg.contains(">pod web-1 &lt;deleted&gt; &amp; gone</text>"),
        "{svg}"
    );
    assert!(
        svg.contains(">refused 3, reset 6  ·  rollout 11.2 s"),
        "{svg}"
    );

    let dir = std::env::temp_dir().join(format!("kubegrace-report-test-{}", std::process::id()));
    let (json_path, svg_path) = report::write(&dir, &result)?;
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json_path)?)?;
    assert_eq!(json["with"]["requests"], 1000);
    assert_eq!(json["with"]["failed"], 0);
    assert_eq!(json["without"]["failed"], 9);
    assert_eq!(json["without"]["rollout_s"], 11.2);
    assert_eq!(json["without"]["by_reason"]["reset"], 6);
    let back: DemoResult = serde_json::from_value(json)?;
    assert_eq!(back, result);
    check_xml(&std::fs::read_to_string(&svg_path)?)?;
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

#[test]
fn report_reads_a_summary_out_of_a_job_log() -> Result<()> {
    let summary = fixture(&[(2, "timeout")])?;
    let log = format!(
        "loadgen: http1 at 50/s for 20s\n{}\nloadgen: {} requests, {} failed\n",
        serde_json::to_string(&summary)?,
        summary.requests,
        summary.failed
    );
    let path =
        std::env::temp_dir().join(format!("kubegrace-loadgen-log-{}.txt", std::process::id()));
    std::fs::write(&path, log)?;
    let parsed = report::load_summary(&path)?;
    std::fs::remove_file(&path)?;
    assert_eq!(parsed, summary);
    Ok(())
}
