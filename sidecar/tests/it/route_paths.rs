//! A route's limits hold however its path is spelled: routes match the
//! normalized path (escapes of unreserved characters decoded, dot segments
//! removed, slashes merged), the app gets that path, and an escaped slash
//! is refused (400) before any route or app sees it. Both HTTP/1 paths,
//! and HTTP/2 (the hyper path's handler).

use anyhow::{Context, Result, ensure};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::kit::http::{h2_connect, h2_get};
use crate::kit::on_both_http1_paths;
use crate::kit::sidecar::{InProcess, SidecarSpec};
use crate::kit::wire::{WireApp, header, read_answer};

/// `lim`'s breaker opens on one failure and stays open: while it is, every
/// request the route takes gets its fallback, and none reaches the app.
const CONFIG: &str = r#"
routes:
  - name: lim
    match: {pathPrefix: /lim}
    circuitBreaker: {consecutiveFailures: 1, errorRatio: 0, openFor: 60s, maxOpenFor: 60s}
"#;

/// Spellings of `/lim/x` a raw-path match would have let past the route.
const SPELLINGS: &[&str] = &[
    "/%6cim/x",
    "//lim/x",
    "/./lim/x",
    "/x/../lim/x",
    "/lim/./x",
    "/%2e/lim/x",
];

/// Escaped slashes: refused whatever the route.
const REFUSED: &[&str] = &["/lim%2fx", "/lim%2Fx", "/lim%5Cx"];

/// The status and head of a `GET path`.
async fn ask(sidecar: &InProcess, path: &str) -> Result<(u16, String)> {
    send(sidecar, "GET", path, "").await
}

/// The status of a `POST path` that declares an 11-byte body and sends
/// none of it (nothing is left unread when the answer comes first).
async fn post_declaring_11(sidecar: &InProcess, path: &str) -> Result<(u16, String)> {
    send(sidecar, "POST", path, "Content-Length: 11\r\n").await
}

/// `method path` with `headers` (each line ending in CRLF) on a fresh
/// connection: the answer's status and head.
async fn send(
    sidecar: &InProcess,
    method: &str,
    path: &str,
    headers: &str,
) -> Result<(u16, String)> {
    let mut tcp = BufReader::new(TcpStream::connect(sidecar.listen).await?);
    let request =
        format!("{method} {path} HTTP/1.1\r\nHost: a\r\n{headers}Connection: close\r\n\r\n");
    tcp.get_mut().write_all(request.as_bytes()).await?;
    let (head, _) = read_answer(&mut tcp, false)
        .await
        .with_context(|| path.to_string())?;
    let head = String::from_utf8_lossy(&head).into_owned();
    let status = head
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("{path}: {head:?}"))?;
    Ok((status, head))
}

/// The app and a sidecar (`args`, `config`) whose route `/lim` has just
/// been opened by the app's one failure.
async fn opened_route(args: &[&str], config: &str) -> Result<(WireApp, InProcess)> {
    let app = WireApp::start().await?;
    let sidecar = InProcess::start(SidecarSpec::new(app.addr).args(args).config(config)).await?;
    let (status, _) = ask(&sidecar, "/lim/fail").await?;
    ensure!(
        status == 500,
        "the app's failure opens the breaker, got {status}"
    );
    Ok((app, sidecar))
}

/// One order of checks on both HTTP/1 paths (proxy/decide.rs): the path
/// first (an escaped slash is 400 even with a body over the limit; the
/// hyper path answered 413 to it before), then the declared body (413,
/// even on a route whose breaker is open), then the circuit.
async fn checks_come_in_one_order(fast_path: &str) -> Result<()> {
    let config = format!("limits: {{maxRequestBodyBytes: 10}}\n{CONFIG}");
    let (_app, sidecar) = opened_route(&["--http1-fast-path", fast_path], &config).await?;
    for (path, want) in [("/lim%2fx", 400), ("/lim/x", 413), ("/other", 413)] {
        let (status, head) = post_declaring_11(&sidecar, path).await?;
        ensure!(
            status == want,
            "POST {path} with a body over the limit (fast path {fast_path}) got {status}, not {want}: {head:?}"
        );
    }
    Ok(())
}

on_both_http1_paths!(
    checks_come_in_one_order_on_the_fast_path,
    checks_come_in_one_order_on_hyper,
    checks_come_in_one_order
);

async fn route_limits_hold(fast_path: &str) -> Result<()> {
    let (app, sidecar) = opened_route(&["--http1-fast-path", fast_path], CONFIG).await?;
    let reached = app.seen().len();
    for path in SPELLINGS {
        let (status, head) = ask(&sidecar, path).await?;
        ensure!(
            status == 503 && header(&head, "x-kubegrace-fallback").is_some(),
            "{path} (fast path {fast_path}) sidestepped the open route: {head:?}"
        );
    }
    for path in REFUSED {
        let (status, head) = ask(&sidecar, path).await?;
        ensure!(
            status == 400,
            "{path} (fast path {fast_path}) was not refused: {head:?}"
        );
    }
    ensure!(
        app.seen().len() == reached,
        "a request reached the app past the open route"
    );
    // Outside the route, the app gets the path the decision was made on.
    let (status, head) = ask(&sidecar, "/a/%7e/../b//c?x=%2F").await?;
    ensure!(status == 200, "{head:?}");
    let seen = app.seen();
    let last = seen.last().context("the app saw the request")?;
    ensure!(
        last.starts_with(b"GET /a/b/c?x=%2F HTTP/1.1\r\n"),
        "the app got {:?}",
        String::from_utf8_lossy(last)
    );
    Ok(())
}

on_both_http1_paths!(
    route_limits_hold_for_every_spelling_of_the_path_on_the_fast_path,
    route_limits_hold_for_every_spelling_of_the_path_on_hyper,
    route_limits_hold
);

#[tokio::test]
async fn route_limits_hold_for_every_spelling_of_the_path_on_http2() -> Result<()> {
    // HTTP/2 takes the hyper path whatever `--http1-fast-path` says.
    let (_app, sidecar) = opened_route(&[], CONFIG).await?;
    let (mut send, _conn) = h2_connect(sidecar.listen).await?;
    for (paths, want) in [(SPELLINGS, 503u16), (REFUSED, 400)] {
        for path in paths {
            send = send.ready().await.context("h2 ready")?;
            let (answer, _) = send.send_request(h2_get(path)?, true)?;
            let status = answer.await.context("h2 answer")?.status().as_u16();
            ensure!(
                status == want,
                "{path} over HTTP/2 got {status}, not {want}"
            );
        }
    }
    Ok(())
}
