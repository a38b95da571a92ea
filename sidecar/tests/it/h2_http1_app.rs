//! Protocol auto never breaks an HTTP/1.1 app (issue #35 item 5).
//!
//! A port of protocol `http` (the sidecar's `auto`) takes h2c from clients.
//! Before the fix every such request went to the app as HTTP/2; an app that
//! speaks only HTTP/1.1 answered the preface with a 505 and closed, the
//! request failed with a 502 and counted as the app failing, so a few h2c
//! requests opened the breaker for the HTTP/1.1 clients too (this test
//! failed on that code: the first h2c request got 502). Now the sidecar
//! learns from the app's answer to the preface that it speaks HTTP/1.1 and
//! sends HTTP/2 requests to it as HTTP/1.1; gRPC, which needs HTTP/2 end to
//! end, gets a clear gRPC error and no breaker failure.

use anyhow::{Context, Result, ensure};
use bytes::Bytes;
use http::{Method, Request, StatusCode};

use crate::kit::WAIT;
use crate::kit::app::TestApp;
use crate::kit::http::{Pool, h2_connect, h2_get, h2_read_body};
use crate::kit::sidecar::{InProcess, SidecarSpec};
use crate::kit::within;

const ROUNDS: usize = 12;
/// Opens after three failures in a row: the four h2c requests
/// were enough.
const CONFIG: &str = "routes:\n  - {name: root, match: {pathPrefix: /}, circuitBreaker: {consecutiveFailures: 3, errorRatio: 0.5, minRequests: 4, openFor: 30s, maxOpenFor: 30s}}\n";

struct H2Answer {
    status: StatusCode,
    headers: http::HeaderMap,
    body: String,
}

async fn h2_exchange(
    send: &mut h2::client::SendRequest<Bytes>,
    req: Request<()>,
    body: &[&'static [u8]],
) -> Result<H2Answer> {
    let exchange = async {
        let (resp, mut stream) = send.send_request(req, body.is_empty())?;
        // A server may answer before the request's body is done (the gRPC
        // error here needs none of it) and close the stream: the rest of the
        // body then has nowhere to go ("inactive stream"), and the answer
        // already there is what counts (RFC 9113, section 8.1).
        let mut unsent = None;
        for (i, chunk) in body.iter().enumerate() {
            if let Err(e) = stream.send_data(Bytes::from_static(chunk), i + 1 == body.len()) {
                unsent = Some(e);
                break;
            }
        }
        let resp = match (resp.await, unsent) {
            (Ok(resp), _) => resp,
            (Err(e), Some(unsent)) => {
                return Err(
                    anyhow::Error::new(e).context(format!("after the body failed: {unsent}"))
                );
            }
            (Err(e), None) => return Err(e.into()),
        };
        let (parts, recv) = resp.into_parts();
        let body = h2_read_body(recv).await?;
        Ok::<_, anyhow::Error>(H2Answer {
            status: parts.status,
            headers: parts.headers,
            body: String::from_utf8_lossy(&body).into_owned(),
        })
    };
    within("an h2c exchange", WAIT, exchange).await?
}

fn post(path: &str, length: Option<usize>) -> Result<Request<()>> {
    let mut req = Request::builder()
        .method(Method::POST)
        .uri(format!("http://app.test{path}"));
    if let Some(length) = length {
        req = req.header("content-length", length);
    }
    req.body(()).context("build request")
}

async fn breaker_state(sidecar: &InProcess) -> Result<String> {
    let root = sidecar.route("root").await?;
    Ok(root["breaker"]["state"]
        .as_str()
        .unwrap_or_default()
        .to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2c_and_http1_clients_both_reach_an_http1_only_app() -> Result<()> {
    let app = TestApp::start_http1_only("h1app").await?;
    let sidecar = InProcess::start(SidecarSpec::to(&app).config(CONFIG)).await?;
    let pool = Pool::new();
    let (mut send, _conn) = h2_connect(sidecar.listen).await?;

    for round in 0..ROUNDS {
        let get = h2_exchange(&mut send, h2_get("/work")?, &[]).await?;
        ensure!(
            get.status == StatusCode::OK && get.body == "ok h1app\n",
            "round {round}: h2c GET answered {} {:?}",
            get.status,
            get.body
        );
        let version = get.headers.get("x-seen-version");
        ensure!(
            version.is_some_and(|v| v == "HTTP/1.1"),
            "the app saw {version:?}"
        );
        ensure!(
            !get.headers.contains_key("connection") && !get.headers.contains_key("keep-alive"),
            "connection-specific headers came back over HTTP/2: {:?}",
            get.headers
        );

        let h1 = pool.get(&sidecar.url("/work")).await?;
        h1.expect(StatusCode::OK, "HTTP/1.1 GET")?;

        // A body of declared length, and one without (chunked to the app).
        let sized =
            h2_exchange(&mut send, post("/upload", Some(10))?, &[b"01234", b"56789"]).await?;
        ensure!(sized.body == "10\n", "sized upload: {:?}", sized.body);
        let unsized_ = h2_exchange(&mut send, post("/upload", None)?, &[b"abc", b"defg"]).await?;
        ensure!(
            unsized_.body == "7\n",
            "unsized upload: {:?}",
            unsized_.body
        );
    }

    // :authority becomes Host; split cookies are joined (RFC 9113
    // §8.2.3); TE, which HTTP/1.1 would need named in Connection, is gone.
    let req = Request::builder()
        .uri("http://app.test/headers")
        .header("cookie", "a=1")
        .header("cookie", "b=2")
        .header("te", "trailers")
        .body(())?;
    let seen = h2_exchange(&mut send, req, &[]).await?;
    ensure!(seen.status == StatusCode::OK, "{}", seen.status);
    ensure!(seen.body.contains("host: app.test\n"), "{}", seen.body);
    ensure!(seen.body.contains("cookie: a=1; b=2\n"), "{}", seen.body);
    ensure!(!seen.body.contains("te: "), "{}", seen.body);

    // The HTTP/1.1 connections to the app are pooled for h2c requests too.
    ensure!(
        app.used_connections() <= 4,
        "{} app connections for {} sequential requests",
        app.used_connections(),
        ROUNDS * 4 + 1
    );
    let state = breaker_state(&sidecar).await?;
    ensure!(state == "closed", "the breaker is {state}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_to_an_http1_only_app_gets_a_clear_error_not_a_breaker_trip() -> Result<()> {
    let app = TestApp::start_http1_only("h1app").await?;
    let sidecar = InProcess::start(SidecarSpec::to(&app).config(CONFIG)).await?;
    let (mut send, _conn) = h2_connect(sidecar.listen).await?;

    for _ in 0..6 {
        let req = Request::builder()
            .method(Method::POST)
            .uri("http://app.test/kubegrace.test.Echo/Unary")
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())?;
        let answer = h2_exchange(&mut send, req, &[b"\0\0\0\0\0"]).await?;
        let status = answer.headers.get("grpc-status");
        let message = answer
            .headers
            .get("grpc-message")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        ensure!(
            answer.status == StatusCode::OK && status.is_some_and(|s| s == "14"),
            "gRPC answered {} grpc-status {status:?}",
            answer.status
        );
        ensure!(message.contains("HTTP/1.1"), "grpc-message {message:?}");
    }
    let state = breaker_state(&sidecar).await?;
    ensure!(state == "closed", "the breaker is {state}");
    // Plain HTTP/2 requests still go through, as HTTP/1.1.
    let get = h2_exchange(&mut send, h2_get("/work")?, &[]).await?;
    ensure!(get.status == StatusCode::OK, "{}", get.status);
    Ok(())
}
