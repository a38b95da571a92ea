//! The sidecar's own answers (504 on the route's timeout, breaker
//! fallbacks, a fallback configured as 204) are framed like any response:
//! no body after a `HEAD`, none with 204 or 304, so the next answer on a
//! kept-alive connection is the next request's. A body where none may be
//! shifts every later answer by it (a desync), on both HTTP/1 paths.

use anyhow::{Context, Result, ensure};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::kit::on_both_http1_paths;
use crate::kit::sidecar::{InProcess, SidecarSpec};
use crate::kit::wire::{WireApp, header, read_answer};

const CONFIG: &str = r#"
routes:
  - name: slow
    match: {pathPrefix: /slow}
    timeout: 300ms
  - name: open
    match: {pathPrefix: /fail}
    circuitBreaker: {consecutiveFailures: 1, errorRatio: 0, openFor: 60s, maxOpenFor: 60s}
  - name: empty
    match: {pathPrefix: /nocontent}
    circuitBreaker: {consecutiveFailures: 1, errorRatio: 0, openFor: 60s, maxOpenFor: 60s}
    fallback: {status: 204, body: "never sent"}
"#;

/// One request on the connection, the status it must get, and whether the
/// answer must carry no `Content-Length` (204).
struct Step {
    request: &'static str,
    status: u16,
    no_length: bool,
}

const fn step(request: &'static str, status: u16) -> Step {
    Step {
        request,
        status,
        no_length: false,
    }
}

const STEPS: &[Step] = &[
    // The route's timeout answers a HEAD: 504, headers only.
    step("HEAD /slow/a HTTP/1.1\r\nHost: a\r\n\r\n", 504),
    step("GET /ok HTTP/1.1\r\nHost: a\r\n\r\n", 200),
    // The app's 500 opens the breaker; the fallback answers a HEAD.
    step("GET /fail/a HTTP/1.1\r\nHost: a\r\n\r\n", 500),
    step("HEAD /fail/b HTTP/1.1\r\nHost: a\r\n\r\n", 503),
    step("GET /ok HTTP/1.1\r\nHost: a\r\n\r\n", 200),
    // A fallback configured as 204 sends neither body nor length.
    step("GET /nocontent/fail HTTP/1.1\r\nHost: a\r\n\r\n", 500),
    Step {
        request: "GET /nocontent/x HTTP/1.1\r\nHost: a\r\n\r\n",
        status: 204,
        no_length: true,
    },
    Step {
        request: "HEAD /nocontent/y HTTP/1.1\r\nHost: a\r\n\r\n",
        status: 204,
        no_length: true,
    },
    step("GET /ok HTTP/1.1\r\nHost: a\r\n\r\n", 200),
];

/// All of [`STEPS`] on one connection, each request sent after the last
/// answer or (`pipelined`) all of them in one write up front.
async fn one_connection(fast_path: &str, pipelined: bool) -> Result<()> {
    let app = WireApp::start().await?;
    let sidecar = InProcess::start(
        SidecarSpec::new(app.addr)
            .args(&["--http1-fast-path", fast_path])
            .config(CONFIG),
    )
    .await?;
    let mut tcp = BufReader::new(TcpStream::connect(sidecar.listen).await?);
    if pipelined {
        let all: String = STEPS.iter().map(|s| s.request).collect();
        tcp.get_mut().write_all(all.as_bytes()).await?;
    }
    for (i, step) in STEPS.iter().enumerate() {
        if !pipelined {
            tcp.get_mut().write_all(step.request.as_bytes()).await?;
        }
        let what = format!(
            "step {i} ({:?}, fast path {fast_path}, pipelined {pipelined})",
            step.request
        );
        let (head, body) = read_answer(&mut tcp, step.request.starts_with("HEAD "))
            .await
            .with_context(|| what.clone())?;
        let head = String::from_utf8_lossy(&head).into_owned();
        ensure!(
            head.starts_with(&format!("HTTP/1.1 {} ", step.status)),
            "{what}: got {head:?} (the connection is out of step)"
        );
        ensure!(
            !step.no_length || header(&head, "content-length").is_none(),
            "{what}: a {} carries a Content-Length: {head:?}",
            step.status
        );
        ensure!(
            step.status != 200 || body.is_empty(),
            "{what}: the echo of an empty request is empty, got {body:?}"
        );
        ensure!(
            header(&head, "connection").is_none_or(|v| !v.eq_ignore_ascii_case("close")),
            "{what}: the connection was closed: {head:?}"
        );
    }
    Ok(())
}

on_both_http1_paths!(
    local_answers_keep_a_keep_alive_connection_in_step_on_the_fast_path,
    local_answers_keep_a_keep_alive_connection_in_step_on_hyper,
    |fast_path| one_connection(fast_path, false)
);

on_both_http1_paths!(
    local_answers_keep_pipelined_requests_in_step_on_the_fast_path,
    local_answers_keep_pipelined_requests_in_step_on_hyper,
    |fast_path| one_connection(fast_path, true)
);
