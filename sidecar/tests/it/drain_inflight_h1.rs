//! HTTP/1 work in flight when the drain starts finishes, even while the
//! sidecar is already `Closing`: a slow upload and a slow download both
//! complete, nothing is force-closed, and the upload's answer tells the
//! client to move (`Connection: close`).

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::kit::WAIT;
use crate::kit::sidecar::InProcess;
use crate::kit::sidecar::drain_flags;
use crate::kit::{app_busy, within};
use anyhow::{Context, Result, ensure};
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

const CHUNKS: usize = 30;
const CHUNK: usize = 1024;

const DRAIN: &[&str] = &drain_flags("300ms", "200ms", "3s", "20s");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_uploads_and_downloads_in_flight_complete_across_closing() -> Result<()> {
    let (app, sidecar) = InProcess::with_app(DRAIN).await?;

    // A 3s upload: 30 chunks of 1 KiB, 100ms apart.
    let tcp = TcpStream::connect(sidecar.listen).await?;
    let (mut up, up_conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
    tokio::spawn(up_conn);
    let chunks = futures_util::stream::unfold(0usize, |i| async move {
        if i == CHUNKS {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        Some((
            Ok::<_, Infallible>(Frame::data(Bytes::from(vec![b'x'; CHUNK]))),
            i + 1,
        ))
    });
    let req = Request::post("/upload")
        .header("host", "a")
        .body(StreamBody::new(chunks))?;
    let upload = tokio::spawn(async move {
        let resp = up.send_request(req).await?;
        let (parts, body) = resp.into_parts();
        let body = body.collect().await?.to_bytes();
        Ok::<_, hyper::Error>((parts, body))
    });

    // A 3s download: 30 chunks, 100ms apart.
    let tcp = TcpStream::connect(sidecar.listen).await?;
    let (mut down, down_conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
    tokio::spawn(down_conn);
    let req = Request::get("/stream?chunks=30&ms=100")
        .header("host", "a")
        .body(Empty::<Bytes>::new())?;
    let download = tokio::spawn(async move {
        let resp = down.send_request(req).await?;
        let status = resp.status();
        let body = resp.into_body().collect().await?.to_bytes();
        Ok::<_, hyper::Error>((status, body))
    });

    app_busy(&app, 2).await?;
    sidecar.start_drain().await?;
    sidecar.wait_phase(2.0).await?;
    let in_flight_while_closing = app.stats.inflight.load(Ordering::SeqCst);

    let (parts, body) = within("the upload", WAIT, upload)
        .await??
        .context("the upload was cut")?;
    ensure!(parts.status == StatusCode::OK, "upload {}", parts.status);
    ensure!(
        body == format!("{}\n", CHUNKS * CHUNK),
        "the app got a partial upload: {body:?}"
    );
    let close = parts
        .headers
        .get(http::header::CONNECTION)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("close"));
    ensure!(
        close,
        "the upload's answer during the drain lacks Connection: close"
    );
    let (status, body) = within("the download", WAIT, download)
        .await??
        .context("the download was cut")?;
    ensure!(status == StatusCode::OK, "download answered {status}");
    ensure!(
        String::from_utf8_lossy(&body).lines().count() == 30,
        "the download was cut short: {} bytes",
        body.len()
    );

    sidecar.wait_phase(3.0).await?;
    sidecar
        .expect_nothing_force_closed("work was force-closed")
        .await?;
    println!(
        "h1 in flight: {in_flight_while_closing} transfers still running when Closing began; both completed"
    );
    ensure!(
        in_flight_while_closing >= 1,
        "the transfers finished before Closing, so this proved nothing about Closing"
    );
    Ok(())
}
