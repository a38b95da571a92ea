//! The gRPC health service (`grpc.health.v1.Health`) while the pod drains.
//!
//! gRPC clients that balance on the client side with health checks
//! (grpc-go's `healthCheckConfig`, Envoy's gRPC health checker) pick only
//! backends that report SERVING. The app cannot know the pod is going away
//! (the drain is the sidecar's), so it keeps saying SERVING and those
//! clients keep sending new calls until the GOAWAY, as late as the drain
//! allows. With `drain.grpcHealth: notServing` the sidecar tells them from
//! the trigger on:
//!
//! - `Check` while draining is answered by the sidecar: NOT_SERVING.
//! - A `Watch` stream the app is answering gets NOT_SERVING pushed into it
//!   at the next message boundary (a message is never cut), and the app's
//!   later messages are dropped: the app would say SERVING again.
//! - A `Watch` opened while draining is answered by the sidecar.
//! - Both kinds of Watch stream the sidecar took over end (UNAVAILABLE)
//!   when the listener closes, so a Watch never holds the drain to its
//!   deadline, and when a drain is called off (the app came back), so the
//!   client watches again and hears the app.
//!
//! Before a drain every health call goes to the app untouched.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Request, Response, StatusCode, Version};
use http_body::{Body, Frame};
use tokio::sync::watch;

use crate::drain::{DrainState, Phase};
use crate::metrics::HealthRpc;
use crate::state::Shared;
use crate::upstream::AppBody;

pub(super) const CHECK_PATH: &str = "/grpc.health.v1.Health/Check";
pub(super) const WATCH_PATH: &str = "/grpc.health.v1.Health/Watch";

/// `HealthCheckResponse { status: NOT_SERVING }` as one length-prefixed
/// gRPC message: not compressed, 2 bytes long, field 1 (varint) = 2.
const NOT_SERVING_MESSAGE: &[u8] = &[0, 0, 0, 0, 2, 0x08, 0x02];

/// gRPC's UNAVAILABLE: a Watch the sidecar ends is to be retried.
const GRPC_UNAVAILABLE: &str = "14";

/// The health RPC this request calls, if it is one: HTTP/2, POST, a gRPC
/// content type and one of the two paths.
pub(super) fn health_rpc<B>(req: &Request<B>) -> Option<HealthRpc> {
    if req.version() != Version::HTTP_2 || req.method() != Method::POST {
        return None;
    }
    let grpc = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("application/grpc"));
    if !grpc {
        return None;
    }
    match req.uri().path() {
        CHECK_PATH => Some(HealthRpc::Check),
        WATCH_PATH => Some(HealthRpc::Watch),
        _ => None,
    }
}

/// The sidecar's own answer while draining: NOT_SERVING, then for `Check`
/// the end of the call, for `Watch` the end once the listener closes or the
/// drain is called off.
pub(super) fn not_serving_response(rpc: HealthRpc, shared: Arc<Shared>) -> Response<HealthBody> {
    shared.metrics.grpc_health_not_serving(rpc);
    let drain = shared.drain.subscribe();
    let stage = Stage::Answer { rpc };
    let body = HealthBody {
        upstream: None,
        stage,
        boundary: MessageBoundary::default(),
        drain: drain.clone(),
        wait: (rpc == HealthRpc::Watch).then(|| watch_end(drain)),
        shared,
    };
    let mut resp = Response::new(body);
    *resp.status_mut() = StatusCode::OK;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    resp
}

/// The app's `Watch` stream, taken over once a drain starts.
pub(super) fn watching(upstream: AppBody, shared: Arc<Shared>) -> HealthBody {
    let drain = shared.drain.subscribe();
    HealthBody {
        upstream: Some(upstream),
        stage: Stage::Passing { draining: false },
        boundary: MessageBoundary::default(),
        wait: Some(drain_start(drain.clone())),
        drain,
        shared,
    }
}

type Wait = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Resolves once a drain has started (or the sidecar is going away).
fn drain_start(mut rx: watch::Receiver<DrainState>) -> Wait {
    Box::pin(async move {
        let _ = rx.wait_for(|s| s.phase != Phase::Serving).await;
    })
}

/// Resolves once a Watch the sidecar took over must end: the listener
/// closed, or the drain was called off.
fn watch_end(mut rx: watch::Receiver<DrainState>) -> Wait {
    Box::pin(async move {
        let _ = rx
            .wait_for(|s| matches!(s.phase, Phase::Serving | Phase::Closing | Phase::Drained))
            .await;
    })
}

fn grpc_trailers(status: &'static str, message: Option<&'static str>) -> HeaderMap {
    let mut t = HeaderMap::new();
    t.insert("grpc-status", HeaderValue::from_static(status));
    if let Some(m) = message {
        t.insert("grpc-message", HeaderValue::from_static(m));
    }
    t
}

enum Stage {
    /// The app's stream passes; `draining` once the drain started and
    /// NOT_SERVING waits for the end of the message under way.
    Passing { draining: bool },
    /// NOT_SERVING is the next frame; then the end of a Check (OK) or the
    /// wait for the end of a Watch.
    Answer { rpc: HealthRpc },
    /// These trailers are the next and last frame.
    Trailers(HeaderMap),
    /// NOT_SERVING was sent on a Watch: the app's messages are dropped
    /// until the Watch ends.
    Told,
    /// The last frame is out.
    Done,
}

/// A health response body: the sidecar's own answer, or the app's Watch
/// stream with NOT_SERVING pushed into it.
pub struct HealthBody {
    upstream: Option<AppBody>,
    stage: Stage,
    boundary: MessageBoundary,
    drain: watch::Receiver<DrainState>,
    wait: Option<Wait>,
    shared: Arc<Shared>,
}

impl HealthBody {
    fn not_serving(&mut self, then: Stage) -> Poll<Option<Result<Frame<Bytes>, crate::Error>>> {
        self.stage = then;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(
            NOT_SERVING_MESSAGE,
        )))))
    }

    fn end_watch(&mut self) -> Poll<Option<Result<Frame<Bytes>, crate::Error>>> {
        self.stage = Stage::Done;
        // The app's stream, if any, is reset by dropping it: its answer is
        // no longer wanted.
        self.upstream = None;
        let t = grpc_trailers(GRPC_UNAVAILABLE, Some("the pod is draining"));
        Poll::Ready(Some(Ok(Frame::trailers(t))))
    }

    fn poll_wait(&mut self, cx: &mut Context<'_>) -> bool {
        match self.wait.as_mut() {
            Some(wait) => wait.as_mut().poll(cx).is_ready(),
            None => false,
        }
    }
}

/// Not a `Body` of its own: it only ever goes out inside a `ProxyBody`,
/// which polls it through these.
impl HealthBody {
    pub(super) fn poll_frame(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, crate::Error>>> {
        let this = self;
        loop {
            match &mut this.stage {
                Stage::Passing { draining } => {
                    let mut draining = *draining;
                    if !draining && this.poll_wait(cx) {
                        draining = true;
                        this.stage = Stage::Passing { draining };
                        this.wait = None;
                    }
                    if draining && this.boundary.at_boundary() {
                        this.shared
                            .metrics
                            .grpc_health_not_serving(HealthRpc::Watch);
                        this.wait = Some(watch_end(this.drain.clone()));
                        return this.not_serving(Stage::Told);
                    }
                    let Some(upstream) = this.upstream.as_mut() else {
                        this.stage = Stage::Done;
                        continue;
                    };
                    match Pin::new(upstream).poll_frame(cx) {
                        Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                            Ok(mut data) => {
                                if draining {
                                    // Only the rest of the message under way
                                    // passes; NOT_SERVING follows it.
                                    let keep = this.boundary.rest_of_message(&data);
                                    data.truncate(keep);
                                }
                                this.boundary.feed(&data);
                                if data.is_empty() {
                                    continue;
                                }
                                return Poll::Ready(Some(Ok(Frame::data(data))));
                            }
                            Err(frame) => {
                                // Trailers: the app ended the call first.
                                this.stage = Stage::Done;
                                return Poll::Ready(Some(Ok(frame)));
                            }
                        },
                        Poll::Ready(None) => {
                            this.stage = Stage::Done;
                            return Poll::Ready(None);
                        }
                        Poll::Ready(Some(Err(e))) => {
                            this.stage = Stage::Done;
                            return Poll::Ready(Some(Err(e)));
                        }
                        Poll::Pending => return Poll::Pending,
                    }
                }
                Stage::Answer { rpc } => {
                    let then = match rpc {
                        HealthRpc::Check => Stage::Trailers(grpc_trailers("0", None)),
                        HealthRpc::Watch => Stage::Told,
                    };
                    return this.not_serving(then);
                }
                Stage::Trailers(t) => {
                    let t = std::mem::take(t);
                    this.stage = Stage::Done;
                    return Poll::Ready(Some(Ok(Frame::trailers(t))));
                }
                Stage::Told => {
                    if this.poll_wait(cx) {
                        return this.end_watch();
                    }
                    // Keep reading the app's stream so its end is noticed;
                    // what it says is dropped.
                    let Some(upstream) = this.upstream.as_mut() else {
                        return Poll::Pending;
                    };
                    match Pin::new(upstream).poll_frame(cx) {
                        Poll::Ready(Some(Ok(frame))) => {
                            if frame.is_trailers() {
                                this.stage = Stage::Done;
                                return Poll::Ready(Some(Ok(frame)));
                            }
                        }
                        Poll::Ready(None) | Poll::Ready(Some(Err(_))) => {
                            // The app's side ended; the sidecar still ends
                            // the call in gRPC's terms.
                            return this.end_watch();
                        }
                        Poll::Pending => return Poll::Pending,
                    }
                }
                Stage::Done => return Poll::Ready(None),
            }
        }
    }

    pub(super) fn is_end_stream(&self) -> bool {
        matches!(self.stage, Stage::Done)
    }
}

/// Where the app's stream stands in gRPC's framing: each message is a
/// 1-byte compression flag, a 4-byte big-endian length, then the message.
#[derive(Debug, Default, Clone)]
struct MessageBoundary {
    /// Prefix bytes of the next message seen so far (0..5).
    prefix: [u8; 5],
    prefix_len: usize,
    /// Message bytes still to come after a complete prefix.
    remaining: u64,
}

impl MessageBoundary {
    fn at_boundary(&self) -> bool {
        self.prefix_len == 0 && self.remaining == 0
    }

    fn feed(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            if self.remaining > 0 {
                let n = usize::try_from(self.remaining)
                    .unwrap_or(usize::MAX)
                    .min(data.len());
                self.remaining -= n as u64;
                data.advance(n);
                continue;
            }
            let n = (5 - self.prefix_len).min(data.len());
            self.prefix[self.prefix_len..self.prefix_len + n].copy_from_slice(&data[..n]);
            self.prefix_len += n;
            data.advance(n);
            if self.prefix_len == 5 {
                let len = u32::from_be_bytes([
                    self.prefix[1],
                    self.prefix[2],
                    self.prefix[3],
                    self.prefix[4],
                ]);
                self.prefix_len = 0;
                self.remaining = u64::from(len);
            }
        }
    }

    /// How many bytes at the front of `data` belong to the message under
    /// way (its prefix included): all of them when it does not end in them,
    /// none at a boundary.
    fn rest_of_message(&self, data: &[u8]) -> usize {
        let mut probe = self.clone();
        let mut taken = 0;
        while taken < data.len() && !probe.at_boundary() {
            let step = if probe.remaining > 0 {
                usize::try_from(probe.remaining)
                    .unwrap_or(usize::MAX)
                    .min(data.len() - taken)
            } else {
                (5 - probe.prefix_len).min(data.len() - taken)
            };
            probe.feed(&data[taken..taken + step]);
            taken += step;
        }
        taken
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(body: &[u8]) -> Vec<u8> {
        let mut m = vec![0];
        m.extend_from_slice(&u32::try_from(body.len()).expect("small").to_be_bytes());
        m.extend_from_slice(body);
        m
    }

    #[test]
    fn not_serving_is_one_health_response_message() {
        // HealthCheckResponse.status is field 1; NOT_SERVING is 2.
        assert_eq!(NOT_SERVING_MESSAGE, message(&[0x08, 0x02]).as_slice());
    }

    #[test]
    fn boundaries_are_found_across_any_split_of_the_stream() {
        let stream = [message(&[0x08, 0x01]), message(&[]), message(&[7; 300])].concat();
        for split in 0..stream.len() {
            let mut b = MessageBoundary::default();
            b.feed(&stream[..split]);
            let rest = b.rest_of_message(&stream[split..]);
            let end = split + rest;
            // The cut lands on a message end (or the stream's end), never inside.
            assert!(
                [0, 7, 12, stream.len()].contains(&end) && (rest > 0 || b.at_boundary()),
                "split {split}: rest {rest} ends at {end}"
            );
            b.feed(&stream[split..end]);
            assert!(b.at_boundary() || end == stream.len(), "split {split}");
        }
    }

    #[test]
    fn only_health_calls_over_grpc_are_recognised() {
        let call = |method: Method, path: &str, ct: &str, version: Version| {
            let req = Request::builder()
                .method(method)
                .uri(format!("http://app{path}"))
                .version(version)
                .header(header::CONTENT_TYPE, ct)
                .body(())
                .expect("request");
            health_rpc(&req)
        };
        let grpc = "application/grpc+proto";
        assert_eq!(
            call(Method::POST, CHECK_PATH, grpc, Version::HTTP_2),
            Some(HealthRpc::Check)
        );
        assert_eq!(
            call(
                Method::POST,
                WATCH_PATH,
                "application/grpc",
                Version::HTTP_2
            ),
            Some(HealthRpc::Watch)
        );
        assert_eq!(call(Method::GET, CHECK_PATH, grpc, Version::HTTP_2), None);
        assert_eq!(
            call(Method::POST, CHECK_PATH, "text/plain", Version::HTTP_2),
            None
        );
        assert_eq!(call(Method::POST, CHECK_PATH, grpc, Version::HTTP_11), None);
        assert_eq!(
            call(
                Method::POST,
                "/grpc.health.v1.Health/List",
                grpc,
                Version::HTTP_2
            ),
            None
        );
    }
}
