//! A HEAD over HTTP/2 is answered with its head, whatever the app sends.
//!
//! hyper's HTTP/2 server (the test app's, and many Rust apps') sends the
//! body of a HEAD response as DATA frames. The sidecar's client to the app
//! rightly refuses that against `content-length` (RFC 9110 9.3.2: a HEAD
//! answer has no content), and the sidecar used to pass the failure on as
//! RST_STREAM(INTERNAL_ERROR) after the head: h2spec's "generic 4.2 Sends a
//! HEAD request" failed, and so did `curl -I --http2-prior-knowledge`. Now
//! the head goes out as the end of the stream and the body is never read.

use anyhow::{Context, Result, ensure};
use http::{Method, Request, StatusCode};

use crate::kit::WAIT;
use crate::kit::app::TestApp;
use crate::kit::http::{h2_connect, h2_read_body};
use crate::kit::sidecar::{InProcess, SidecarSpec};
use crate::kit::within;

fn head(path: &str) -> Result<Request<()>> {
    Request::builder()
        .method(Method::HEAD)
        .uri(format!("http://app.test{path}"))
        .body(())
        .context("build request")
}

/// A HEAD on a fresh h2c connection to `addr`: its status and
/// content-length, or the stream's error.
async fn h2_head(addr: std::net::SocketAddr) -> Result<(StatusCode, Option<String>)> {
    let (mut send, _conn) = h2_connect(addr).await?;
    let exchange = async {
        let (resp, _) = send.send_request(head("/work")?, true)?;
        let resp = resp.await?;
        let (parts, recv) = resp.into_parts();
        let body = h2_read_body(recv).await?;
        ensure!(body.is_empty(), "{} body bytes after a HEAD", body.len());
        let length = parts
            .headers
            .get(http::header::CONTENT_LENGTH)
            .map(|v| v.to_str().unwrap_or("?").to_string());
        Ok::<_, anyhow::Error>((parts.status, length))
    };
    within("an h2c HEAD", WAIT, exchange).await?
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2_head_gets_its_head_even_from_an_app_that_sends_a_body() -> Result<()> {
    let app = TestApp::start("app").await?;
    // The baseline: the app itself breaks the HEAD over HTTP/2 (DATA on a
    // HEAD answer), so the case below is the one that failed.
    let direct = h2_head(app.addr).await;
    ensure!(
        direct.is_err(),
        "the test app answered an h2 HEAD correctly ({direct:?}): this test no longer shows the case"
    );

    let sidecar = InProcess::start(SidecarSpec::to(&app)).await?;
    for round in 0..3 {
        let (status, length) = h2_head(sidecar.listen)
            .await
            .with_context(|| format!("round {round}: HEAD through the sidecar"))?;
        ensure!(status == StatusCode::OK, "round {round}: {status}");
        // The head is the app's, content-length included (what a GET would carry).
        ensure!(
            length.as_deref().is_some_and(|l| l != "0"),
            "round {round}: content-length {length:?}"
        );
    }
    Ok(())
}
