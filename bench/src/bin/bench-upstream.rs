//! The fast upstream every peer proxies to: hyper 1, HTTP/1.1 and h2c on one
//! port, a fixed small body, `/slow/<ms>` for the drain benchmark, and the
//! gRPC service of bench/grpc/bench.proto (any request with a gRPC content
//! type) for the ghz scenarios.
//!
//! It must be cheap per request so that, with the load generator on the same
//! core, the proxy under test is what limits throughput, not this server.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll};
use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt as _, Either, Full};
use hyper::body::{Body, Frame, Incoming};
use hyper::header::{CONTENT_LENGTH, CONTENT_TYPE, HeaderMap, HeaderValue};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use kubegrace_bench::scenario::GRPC_STREAM_MESSAGES;
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

type Answer = Response<Either<Full<Bytes>, Frames>>;

async fn handle(req: Request<Incoming>) -> Result<Answer, Infallible> {
    if is_grpc(&req) {
        return Ok(grpc(req).await);
    }
    if let Some(ms) = req.uri().path().strip_prefix("/slow/")
        && let Ok(ms) = ms.parse::<u64>()
    {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    let mut response = Response::new(Either::Left(Full::new(Bytes::from_static(BODY))));
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    headers.insert(CONTENT_LENGTH, HeaderValue::from(BODY.len()));
    Ok(response)
}

fn is_grpc(req: &Request<Incoming>) -> bool {
    req.headers()
        .get(CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// The payload of every gRPC reply: as small as the HTTP body.
const GRPC_PAYLOAD: &[u8] = b"kubegrace bench upstream: a gRPC reply.";

/// One gRPC message on the wire (uncompressed flag, big-endian length, then
/// `Msg { payload: GRPC_PAYLOAD }` in protobuf), built once.
fn grpc_message() -> Bytes {
    static MESSAGE: OnceLock<Bytes> = OnceLock::new();
    MESSAGE
        .get_or_init(|| {
            // Field 1, wire type 2 (bytes): tag 0x0a, then a one-byte length
            // (the payload is under 128 bytes).
            let mut msg = vec![0x0a, GRPC_PAYLOAD.len() as u8];
            msg.extend_from_slice(GRPC_PAYLOAD);
            let mut frame = vec![0u8];
            frame.extend_from_slice(&(msg.len() as u32).to_be_bytes());
            frame.extend_from_slice(&msg);
            Bytes::from(frame)
        })
        .clone()
}

/// `kubegrace.bench.Bench`: reads the request to its end, then answers
/// one message (`Unary`) or `GRPC_STREAM_MESSAGES` (`Stream`) and
/// `grpc-status: 0`; any other method gets `grpc-status: 12`
/// (unimplemented), as a gRPC server answers it.
async fn grpc(req: Request<Incoming>) -> Answer {
    let messages = match req.uri().path() {
        "/kubegrace.bench.Bench/Unary" => 1,
        "/kubegrace.bench.Bench/Stream" => GRPC_STREAM_MESSAGES,
        _ => 0,
    };
    // A client gone mid-request is its business; answer what was asked.
    let _ = req.into_body().collect().await;
    let mut frames: VecDeque<Frame<Bytes>> =
        (0..messages).map(|_| Frame::data(grpc_message())).collect();
    let mut trailers = HeaderMap::new();
    let status = if messages > 0 { "0" } else { "12" };
    trailers.insert("grpc-status", HeaderValue::from_static(status));
    frames.push_back(Frame::trailers(trailers));
    let mut response = Response::new(Either::Right(Frames(frames)));
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    response
}

/// A body whose frames are all known in advance: gRPC messages, then the
/// trailers.
struct Frames(VecDeque<Frame<Bytes>>);

impl Body for Frames {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.get_mut().0.pop_front().map(Ok))
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_empty()
    }
}
