//! The demo gRPC service `kubegrace.demo.Echo`, client and server, without protoc.
//!
//! Contract (what a `.proto` would say):
//!
//! ```proto
//! syntax = "proto3";
//! package kubegrace.demo;
//! service Echo {
//!   rpc Unary(EchoRequest) returns (EchoReply);          // /kubegrace.demo.Echo/Unary
//!   rpc Stream(EchoRequest) returns (stream EchoReply);  // /kubegrace.demo.Echo/Stream
//! }
//! message EchoRequest {
//!   string message = 1;
//!   uint32 delay_ms = 2;     // server waits this long before the (first) reply
//!   uint32 count = 3;        // Stream: number of replies (0 means 1)
//!   uint32 interval_ms = 4;  // Stream: pause between replies
//! }
//! message EchoReply {
//!   string message = 1;      // the request's message
//!   string pod = 2;          // who answered (the pod name)
//!   uint32 seq = 3;          // 0-based index of the reply within the call
//! }
//! ```
//!
//! Server: mount [`EchoServer`] (a tower `Service` + `NamedService`), either on its own
//! port with `tonic::transport::Server::builder().add_service(EchoServer::new(pod))`, or
//! next to plain HTTP on one port (what the sidecar fronts), routing by content type:
//!
//! ```text
//! let echo = EchoServer::new(pod);
//! let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
//!     let mut echo = echo.clone();
//!     async move {
//!         if grpc::is_grpc(&req) {
//!             return echo.call(req).await; // Response<tonic::body::Body>, Infallible
//!         }
//!         Ok(plain_http(req).map(tonic::body::Body::new))
//!     }
//! });
//! // HTTP/1.1 and h2c prior knowledge on the same port:
//! hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
//!     .serve_connection(TokioIo::new(stream), svc)
//! ```
//!
//! (`tests/loadgen.rs` runs exactly this.)
//! Client: [`unary`] and [`stream`] run one call over the loadgen's HTTP/2 pool, so gRPC
//! failures are classified exactly like HTTP/2 ones.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use http_body_util::BodyExt;
use http_body_util::combinators::MapErr;
use hyper::body::Incoming;
use prost::Message;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::{BoxFuture, BoxStream, StdError};
use tonic::{Code, Status};

use super::conn::Http2Pool;
use super::outcome::{Failure, Phase, Reason, RequestCtx, classify_error, pod_from_name};

/// The fully qualified service name.
pub const SERVICE: &str = "kubegrace.demo.Echo";
/// Path of the unary method.
pub const UNARY_PATH: &str = "/kubegrace.demo.Echo/Unary";
/// Path of the server-streaming method.
pub const STREAM_PATH: &str = "/kubegrace.demo.Echo/Stream";

/// Upper bounds the server enforces, so a request can't hold a pod forever.
const MAX_DELAY_MS: u32 = 60_000;
const MAX_STREAM_COUNT: u32 = 1_000;

#[derive(Clone, PartialEq, prost::Message)]
pub struct EchoRequest {
    #[prost(string, tag = "1")]
    pub message: String,
    #[prost(uint32, tag = "2")]
    pub delay_ms: u32,
    #[prost(uint32, tag = "3")]
    pub count: u32,
    #[prost(uint32, tag = "4")]
    pub interval_ms: u32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct EchoReply {
    #[prost(string, tag = "1")]
    pub message: String,
    #[prost(string, tag = "2")]
    pub pod: String,
    #[prost(uint32, tag = "3")]
    pub seq: u32,
}

/// A prost codec (tonic 0.14 moved its own to `tonic-prost`; this is the whole of it).
#[derive(Debug)]
pub struct ProstCodec<E, D>(std::marker::PhantomData<fn(E) -> D>);

impl<E, D> Default for ProstCodec<E, D> {
    fn default() -> Self {
        ProstCodec(std::marker::PhantomData)
    }
}

impl<E, D> Codec for ProstCodec<E, D>
where
    E: Message + Send + 'static,
    D: Message + Default + Send + 'static,
{
    type Encode = E;
    type Decode = D;
    type Encoder = ProstEncoder<E>;
    type Decoder = ProstDecoder<D>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder(std::marker::PhantomData)
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstDecoder(std::marker::PhantomData)
    }
}

#[derive(Debug)]
pub struct ProstEncoder<E>(std::marker::PhantomData<fn(E)>);

impl<E: Message> Encoder for ProstEncoder<E> {
    type Item = E;
    type Error = Status;

    fn encode(&mut self, item: E, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        // EncodeBuf grows on demand, so encoding can only fail on a broken message.
        item.encode(dst)
            .map_err(|e| Status::internal(format!("encoding: {e}")))
    }
}

#[derive(Debug)]
pub struct ProstDecoder<D>(std::marker::PhantomData<fn() -> D>);

impl<D: Message + Default> Decoder for ProstDecoder<D> {
    type Item = D;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<D>, Status> {
        D::decode(src)
            .map(Some)
            .map_err(|e| Status::internal(format!("decoding: {e}")))
    }
}

// ---------------------------------------------------------------------------------------
// Client

/// The tower service tonic's client drives: one HTTP/2 exchange on the loadgen's pool.
/// Errors are already-classified [`Failure`]s (response-body errors too, through `MapErr`),
/// which tonic keeps as the `Status` source, so the runner can read them back unchanged.
#[derive(Clone)]
struct PoolTransport {
    pool: Arc<Http2Pool>,
    ctx: Arc<RequestCtx>,
}

type MappedBody = MapErr<Incoming, fn(hyper::Error) -> Failure>;

fn body_failure(e: hyper::Error) -> Failure {
    classify_error(&e)
}

impl tonic::codegen::Service<http::Request<tonic::body::Body>> for PoolTransport {
    type Response = http::Response<MappedBody>;
    type Error = Failure;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let (pool, ctx) = (self.pool.clone(), self.ctx.clone());
        Box::pin(async move {
            let resp = pool.send(req, &ctx).await?;
            ctx.set(Phase::Body);
            Ok(resp.map(|body| body.map_err(body_failure as fn(hyper::Error) -> Failure)))
        })
    }
}

/// One call on the loadgen's pool: a client, ready, hands itself to `send`; a failed call
/// is classified ([`classify_status`]).
async fn call<T, Fut>(
    pool: &Arc<Http2Pool>,
    ctx: &Arc<RequestCtx>,
    send: impl FnOnce(tonic::client::Grpc<PoolTransport>) -> Fut,
) -> Result<T, Failure>
where
    Fut: Future<Output = Result<tonic::Response<T>, Status>>,
{
    let transport = PoolTransport {
        pool: pool.clone(),
        ctx: ctx.clone(),
    };
    let mut grpc = tonic::client::Grpc::with_origin(transport, pool.target().origin.clone());
    grpc.ready().await?;
    match send(grpc).await {
        Ok(resp) => Ok(resp.into_inner()),
        Err(status) => Err(classify_status(&status)),
    }
}

/// Classifies a failed call: our transport's own classification when the error came from
/// the connection, else the gRPC status the server (or a proxy) answered with.
pub fn classify_status(status: &Status) -> Failure {
    let mut source = std::error::Error::source(status);
    while let Some(e) = source {
        if let Some(f) = e.downcast_ref::<Failure>() {
            return f.clone();
        }
        source = e.source();
    }
    let detail = format!("grpc {:?}", status.code());
    match status.code() {
        // Server-side failures: the gRPC twin of HTTP 5xx (an HTTP 503 without grpc-status
        // also arrives here, as UNAVAILABLE).
        Code::Unavailable
        | Code::Internal
        | Code::Unknown
        | Code::DataLoss
        | Code::ResourceExhausted
        | Code::Aborted
        | Code::Cancelled
        | Code::DeadlineExceeded => Failure::new(Reason::Http5xx, detail),
        _ => Failure::new(Reason::Other, detail),
    }
}

/// One unary call.
pub async fn unary(
    pool: &Arc<Http2Pool>,
    ctx: &Arc<RequestCtx>,
    req: EchoRequest,
) -> Result<EchoReply, Failure> {
    let path = http::uri::PathAndQuery::from_static(UNARY_PATH);
    let reply: EchoReply = call(pool, ctx, |mut grpc| async move {
        let codec = ProstCodec::<EchoRequest, EchoReply>::default();
        grpc.unary(tonic::Request::new(req), path, codec).await
    })
    .await?;
    ctx.answered(pod_from_name(&reply.pod));
    Ok(reply)
}

/// One server-streaming call, read to the end; returns the replies. Fewer replies than
/// asked for with an OK status is still a failure (the stream was cut short).
pub async fn stream(
    pool: &Arc<Http2Pool>,
    ctx: &Arc<RequestCtx>,
    req: EchoRequest,
) -> Result<Vec<EchoReply>, Failure> {
    let expected = req.count.max(1) as usize;
    let path = http::uri::PathAndQuery::from_static(STREAM_PATH);
    let mut messages = call(pool, ctx, |mut grpc| async move {
        let codec = ProstCodec::<EchoRequest, EchoReply>::default();
        grpc.server_streaming(tonic::Request::new(req), path, codec)
            .await
    })
    .await?;
    let mut replies = Vec::with_capacity(expected);
    while let Some(reply) = messages.message().await.map_err(|s| classify_status(&s))? {
        if replies.is_empty() {
            // Remember the pod as soon as it answers, so a stream cut later is attributed.
            ctx.answered(pod_from_name(&reply.pod));
        }
        replies.push(reply);
    }
    if replies.len() < expected {
        // Status OK but messages missing: not a transport failure (that would have
        // surfaced as an error), so not attributed to one.
        return Err(Failure::new(
            Reason::Other,
            format!("grpc stream ended early ({}/{expected})", replies.len()),
        ));
    }
    Ok(replies)
}

// ---------------------------------------------------------------------------------------
// Server

/// The server side of `kubegrace.demo.Echo`: a tower service of HTTP/2 requests to gRPC
/// responses. Cheap to clone. Unknown methods get `UNIMPLEMENTED`.
#[derive(Clone, Debug)]
pub struct EchoServer {
    pod: Arc<str>,
}

impl EchoServer {
    /// `pod` is reported in every reply (`EchoReply.pod`).
    pub fn new(pod: impl Into<String>) -> Self {
        EchoServer {
            pod: Arc::from(pod.into()),
        }
    }
}

impl tonic::server::NamedService for EchoServer {
    const NAME: &'static str = SERVICE;
}

/// One method of the service, for the pod `pod`: `answer` turns the request into what it
/// replies (one message, or a stream of them); the tower plumbing is the same for both.
struct Method<F> {
    pod: Arc<str>,
    answer: F,
}

impl<F> Method<F> {
    fn new(pod: Arc<str>, answer: F) -> Self {
        Method { pod, answer }
    }
}

impl<F, Fut, T> tonic::codegen::Service<tonic::Request<EchoRequest>> for Method<F>
where
    F: Fn(String, EchoRequest) -> Fut,
    Fut: Future<Output = T> + Send + 'static,
{
    type Response = tonic::Response<T>;
    type Error = Status;
    type Future = BoxFuture<Self::Response, Status>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: tonic::Request<EchoRequest>) -> Self::Future {
        let answer = (self.answer)(self.pod.to_string(), req.into_inner());
        Box::pin(async move { Ok(tonic::Response::new(answer.await)) })
    }
}

async fn unary_reply(pod: String, req: EchoRequest) -> EchoReply {
    sleep_ms(req.delay_ms).await;
    EchoReply {
        message: req.message,
        pod,
        seq: 0,
    }
}

async fn stream_replies(pod: String, req: EchoRequest) -> BoxStream<EchoReply> {
    let count = req.count.clamp(1, MAX_STREAM_COUNT);
    let replies = futures_util::stream::iter(0..count).then(move |seq| {
        let (message, pod) = (req.message.clone(), pod.clone());
        async move {
            sleep_ms(if seq == 0 {
                req.delay_ms
            } else {
                req.interval_ms
            })
            .await;
            Ok(EchoReply { message, pod, seq })
        }
    });
    Box::pin(replies)
}

async fn sleep_ms(ms: u32) {
    if ms > 0 {
        tokio::time::sleep(Duration::from_millis(u64::from(ms.min(MAX_DELAY_MS)))).await;
    }
}

impl<B> tonic::codegen::Service<http::Request<B>> for EchoServer
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let pod = self.pod.clone();
        let mut grpc = tonic::server::Grpc::new(ProstCodec::<EchoReply, EchoRequest>::default());
        match req.uri().path() {
            UNARY_PATH => {
                Box::pin(async move { Ok(grpc.unary(Method::new(pod, unary_reply), req).await) })
            }
            STREAM_PATH => Box::pin(async move {
                let method = Method::new(pod, stream_replies);
                Ok(grpc.server_streaming(method, req).await)
            }),
            other => {
                let status = Status::unimplemented(format!("no method {other}"));
                Box::pin(async move { Ok(status.into_http()) })
            }
        }
    }
}

/// Whether a request is gRPC (by content type), for servers that route gRPC and plain HTTP
/// on one port.
pub fn is_grpc<B>(req: &http::Request<B>) -> bool {
    req.headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("application/grpc"))
}
