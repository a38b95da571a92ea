//! The fast upstream every peer proxies to: hyper 1, HTTP/1.1 and h2c on one
//! port, a fixed small body, and `/slow/<ms>` for the drain benchmark.
//!
//! It must be cheap per request so that, with the load generator on the same
//! core, the proxy under test is what limits throughput, not this server.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use clap::Parser;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{CONTENT_LENGTH, CONTENT_TYPE, HeaderValue};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;

/// The body every fast request gets: small and fixed, so the proxies move the
/// same bytes and the numbers measure per-request overhead.
const BODY: &[u8] = b"kubegrace bench upstream: a fixed small body of 64 bytes.......\n";

#[derive(Parser, Debug)]
#[command(about = "Benchmark upstream: HTTP/1.1 + h2c, fixed body, /slow/<ms>")]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:18080")]
    listen: SocketAddr,
    /// Runtime worker threads; 0 means one per CPU the process may run on
    /// (so `taskset -c 0` gives one).
    #[arg(long, default_value_t = 0)]
    threads: usize,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    if args.threads > 0 {
        builder.worker_threads(args.threads);
    }
    let runtime = builder.build().context("building the tokio runtime")?;
    runtime.block_on(serve(args.listen))
}

async fn serve(addr: SocketAddr) -> anyhow::Result<()> {
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))?;
    // The harness waits for this line before it sends load.
    println!("bench-upstream listening on {addr}");
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(conn) => conn,
            // Out of file descriptors under a connection storm: keep serving
            // the connections we have rather than exiting mid-benchmark.
            Err(e) => {
                eprintln!("bench-upstream: accept: {e}");
                tokio::time::sleep(Duration::from_millis(5)).await;
                continue;
            }
        };
        // Small responses: waiting for a full segment (Nagle) would add
        // delayed-ACK latency to every request.
        let _ = stream.set_nodelay(true);
        tokio::spawn(async move {
            let builder = auto::Builder::new(TokioExecutor::new());
            // Errors here are clients going away (Connection: close runs,
            // drain tests); they say nothing about the upstream.
            let _ = builder
                .serve_connection(TokioIo::new(stream), service_fn(handle))
                .await;
        });
    }
}

async fn handle(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    if let Some(ms) = req.uri().path().strip_prefix("/slow/")
        && let Ok(ms) = ms.parse::<u64>()
    {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    let mut response = Response::new(Full::new(Bytes::from_static(BODY)));
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    headers.insert(CONTENT_LENGTH, HeaderValue::from(BODY.len()));
    Ok(response)
}
