//! The webhook's HTTPS server (rustls): `POST /mutate` (pods, see
//! [`crate::webhook`]) and `POST /validate` (GraceRoutes, see
//! [`crate::route_webhook`]), served by every replica.
//!
//! The port is reachable by anything that can reach the pod, and nothing
//! authenticates the caller (the API server presents no client certificate
//! unless the cluster admin configures one), so the server defends itself:
//!
//! - a connection cap ([`Limits::max_connections`]): past it a new
//!   connection is closed at once, before the TLS handshake;
//! - a read timeout for the TLS handshake, the request head (hyper's header
//!   read timeout) and the body (408), each [`Limits::read_timeout`];
//! - an idle timeout: no byte in either direction for
//!   [`Limits::idle_timeout`] closes the connection (HTTP/1 keep-alive and
//!   HTTP/2 alike);
//! - a body limit, [`MAX_BODY`] (413), a cap on reviews in progress
//!   ([`Limits::max_in_flight`]) and a memory budget shared by the reviews
//!   in progress ([`REVIEW_MEMORY`]: each holds [`review_cost`] of it, its
//!   body's size times what parsing it may take), 503 after a short wait,
//!   so 32 reviews of 4 MiB cannot together outgrow the chart's limit;
//! - each review is parsed once, into an `AdmissionRequest<DynamicObject>`
//!   ([`check_review`]); the body is dropped before the review is answered,
//!   and each handler decodes the object it needs from it, so an object
//!   that does not fit our types still gets an answer with the request's
//!   uid (a body that is not an AdmissionReview at all gets one too when
//!   its `request.uid` can be read);
//! - a panic while answering is caught ([`crate::panics`]): counted, logged,
//!   and answered like a failed lookup (allowed, with a warning: the
//!   webhooks fail open for their own faults);
//! - only a well-formed AdmissionReview for the resource the path serves,
//!   in a namespace this operator serves, reaches the API lookups
//!   ([`check_review`]); anything else gets 400 and a message, so a caller
//!   cannot use the webhook to ask about namespaces it was not built for.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;

use crate::certs::CertResolver;
use crate::webhook::Webhook;
use crate::{Error, Result};

/// Largest request body read: 4 MiB. The API server refuses request bodies
/// over 3 MiB (its `MaxRequestBodyBytes`), and what it stores is capped
/// lower still by etcd (1.5 MiB per object by default), so no pod a client
/// or a controller can create is larger than 3 MiB of JSON. Our webhooks
/// see pods on CREATE (no `oldObject`) and GraceRoutes (a few KiB each, on
/// UPDATE twice); the last MiB covers the review envelope (uid, kinds,
/// userInfo with its groups and extras) and the JSON of objects that were
/// stored as protobuf.
pub const MAX_BODY: usize = 4 * 1024 * 1024;

/// How long a review waits for a free slot before 503.
const IN_FLIGHT_WAIT: Duration = Duration::from_secs(5);

/// Memory the reviews in progress may hold together, in KiB: 96 MiB, within
/// the chart's 256 MiB limit beside the caches of the controllers.
pub const REVIEW_MEMORY: u32 = 96 * 1024;

/// Bytes of memory a review may take per byte of body while it is parsed
/// and decoded. Measured (serde_json 1.0.154, a counting allocator): the
/// parsed `serde_json::Value` of a 2 MiB pod made of short env entries
/// holds 19.9 times its text, of a map of short labels 6.3 times, of one
/// long string 1.0 times; the body itself and the typed object built from
/// the tree (which consumes it) take the rest. So a review of the largest
/// body holds the whole budget, alone.
pub const PARSE_FACTOR: u64 = 24;

/// The share of [`REVIEW_MEMORY`] (KiB) a review of `body` bytes holds:
/// at least 1, at most the whole budget (so one review of [`MAX_BODY`]
/// always fits, alone).
pub fn review_cost(body: u64) -> u32 {
    let kib = body.saturating_mul(PARSE_FACTOR).div_ceil(1024);
    u32::try_from(kib)
        .unwrap_or(u32::MAX)
        .clamp(1, REVIEW_MEMORY)
}

/// The server's limits (flags `--webhook-*`).
#[derive(Debug, Clone)]
pub struct Limits {
    pub max_connections: usize,
    pub max_in_flight: usize,
    pub read_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_body: usize,
    /// Namespaces served; empty: all (`--watch-namespaces`).
    pub watch_namespaces: Vec<String>,
}

impl Limits {
    pub fn from_args(a: &crate::cli::RunArgs) -> Result<Self> {
        let nonzero = |d: Duration, flag: &str| {
            if d.is_zero() {
                Err(Error::Config(format!(
                    "--{flag} must be more than 0 (e.g. 10s)"
                )))
            } else {
                Ok(d)
            }
        };
        Ok(Self {
            max_connections: a.webhook_max_connections as usize,
            max_in_flight: a.webhook_max_in_flight as usize,
            read_timeout: nonzero(a.webhook_read_timeout.0, "webhook-read-timeout")?,
            idle_timeout: nonzero(a.webhook_idle_timeout.0, "webhook-idle-timeout")?,
            max_body: MAX_BODY,
            watch_namespaces: a.watch_namespaces.clone(),
        })
    }
}

/// Which review a path answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `/mutate`: pods.
    Mutate,
    /// `/validate`: GraceRoutes.
    Validate,
}

impl Endpoint {
    fn resource(self) -> (&'static str, &'static str) {
        match self {
            Self::Mutate => ("", "pods"),
            Self::Validate => ("kubegrace.io", "graceroutes"),
        }
    }
}

/// Why [`check_review`] does not pass a body on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Not a review this server answers: 400 and the reason.
    Malformed(String),
    /// A review whose request uid could be read but not the rest: answered
    /// as a review (200) with that uid and the reason.
    Unreadable { uid: String, why: String },
}

/// Just the uid of a review that does not parse as a whole (unknown
/// fields are skipped without being kept).
#[derive(serde::Deserialize)]
struct UidOnly {
    request: Option<UidOnlyRequest>,
}
#[derive(serde::Deserialize)]
struct UidOnlyRequest {
    uid: String,
}

/// Parses `body` once into the request this server answers (pure); the
/// error says what is wrong, for the 400, or carries the uid to answer.
pub fn check_review(
    body: &[u8],
    endpoint: Endpoint,
    watch: &[String],
) -> std::result::Result<AdmissionRequest<DynamicObject>, Refusal> {
    let review: AdmissionReview<DynamicObject> = match serde_json::from_slice(body) {
        Ok(r) => r,
        Err(e) => {
            let why = format!("the body is not an AdmissionReview: {e}");
            // Only on this error path is the body read a second time.
            return Err(match serde_json::from_slice::<UidOnly>(body) {
                Ok(UidOnly {
                    request: Some(UidOnlyRequest { uid }),
                }) if !uid.is_empty() => Refusal::Unreadable { uid, why },
                _ => Refusal::Malformed(why),
            });
        }
    };
    check_request(review, endpoint, watch).map_err(Refusal::Malformed)
}

fn check_request(
    review: AdmissionReview<DynamicObject>,
    endpoint: Endpoint,
    watch: &[String],
) -> std::result::Result<AdmissionRequest<DynamicObject>, String> {
    if review.types.api_version != "admission.k8s.io/v1" || review.types.kind != "AdmissionReview" {
        return Err(format!(
            "expected apiVersion admission.k8s.io/v1, kind AdmissionReview; got {:?}, {:?}",
            review.types.api_version, review.types.kind
        ));
    }
    let req: AdmissionRequest<DynamicObject> = review
        .try_into()
        .map_err(|e| format!("the AdmissionReview has no usable request: {e}"))?;
    if req.uid.is_empty() {
        return Err("request.uid is empty".into());
    }
    let (group, resource) = endpoint.resource();
    if req.resource.group != group
        || req.resource.resource != resource
        || req.sub_resource.as_deref().is_some_and(|s| !s.is_empty())
    {
        return Err(format!(
            "this endpoint reviews {resource} (group {group:?}), not {}/{:?}{}",
            req.resource.resource,
            req.resource.group,
            req.sub_resource
                .as_deref()
                .map(|s| format!(" subresource {s}"))
                .unwrap_or_default()
        ));
    }
    let Some(ns) = req.namespace.as_deref().filter(|n| !n.is_empty()) else {
        return Err("request.namespace is empty (pods and GraceRoutes are namespaced)".into());
    };
    let needs_object = matches!(req.operation, Operation::Create | Operation::Update);
    match &req.object {
        None if needs_object => {
            return Err(format!("request.object is missing for {:?}", req.operation));
        }
        Some(o) if o.metadata.namespace.as_deref().is_some_and(|n| n != ns) => {
            return Err(format!(
                "request.object is in namespace {:?}, the request in {ns:?}",
                o.metadata.namespace.as_deref().unwrap_or_default()
            ));
        }
        _ => {}
    }
    if !crate::scope::serves(watch, ns) {
        return Err(format!(
            "namespace {ns} is not served by this operator (--watch-namespaces)"
        ));
    }
    Ok(req)
}

/// The answer to a review whose uid is all that could be read: the pod
/// webhook admits (it never fails a pod for its own reasons), the route
/// webhook refuses with the reason.
pub fn unreadable_answer(
    endpoint: Endpoint,
    uid: String,
    why: &str,
) -> AdmissionReview<DynamicObject> {
    let mut r = AdmissionResponse::invalid(why);
    r.uid = uid;
    if endpoint == Endpoint::Mutate {
        r.allowed = true;
        r.result = Default::default();
        r.warnings = Some(vec![format!("kubegrace: sidecar not injected: {why}")]);
    }
    r.into_review()
}

fn respond(status: StatusCode, body: Vec<u8>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}

/// A 4xx/5xx with a message a person can act on.
fn refuse(status: StatusCode, message: &str) -> Response<Full<Bytes>> {
    let body = serde_json::json!({ "code": status.as_u16(), "message": message });
    respond(status, body.to_string().into_bytes())
}

/// What every connection of the admission server shares: the webhook, the
/// request limits and the in-flight slots.
struct AdmissionServer {
    hook: Arc<Webhook>,
    limits: Limits,
    in_flight: Semaphore,
    /// [`REVIEW_MEMORY`], in KiB.
    memory: Semaphore,
}

async fn handle(
    req: Request<Incoming>,
    server: Arc<AdmissionServer>,
) -> std::result::Result<Response<Full<Bytes>>, std::convert::Infallible> {
    let metrics = &server.hook.metrics;
    let endpoint = match (req.method(), req.uri().path()) {
        (&hyper::Method::POST, "/mutate") => Endpoint::Mutate,
        (&hyper::Method::POST, "/validate") => Endpoint::Validate,
        (_, "/mutate" | "/validate") => {
            return Ok(refuse(
                StatusCode::METHOD_NOT_ALLOWED,
                "POST an AdmissionReview",
            ));
        }
        _ => return Ok(refuse(StatusCode::NOT_FOUND, "no such path")),
    };
    let json = req
        .headers()
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"));
    if !json {
        metrics.webhook_rejected("malformed");
        return Ok(refuse(
            StatusCode::BAD_REQUEST,
            "Content-Type must be application/json (an AdmissionReview)",
        ));
    }
    // A declared length over the limit is refused before reading a byte.
    let declared = req
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let too_large = format!("the body exceeds {} bytes", server.limits.max_body);
    if declared.is_some_and(|n| n > server.limits.max_body as u64) {
        metrics.webhook_rejected("too_large");
        return Ok(refuse(StatusCode::PAYLOAD_TOO_LARGE, &too_large));
    }
    // Bounded memory: a body is read only with a slot and its share of
    // the budget (the declared length's; without one, the largest body's).
    let cost = review_cost(declared.unwrap_or(server.limits.max_body as u64));
    let slot = async {
        let slot = server.in_flight.acquire().await?;
        let share = server.memory.acquire_many(cost).await?;
        Ok::<_, tokio::sync::AcquireError>((slot, share))
    };
    let Ok(Ok(_slot)) = tokio::time::timeout(IN_FLIGHT_WAIT, slot).await else {
        metrics.webhook_rejected("busy");
        return Ok(refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            "too many reviews in progress; retry",
        ));
    };
    let start = Instant::now();
    let read = Limited::new(req.into_body(), server.limits.max_body).collect();
    let body = match tokio::time::timeout(server.limits.read_timeout, read).await {
        Ok(Ok(b)) => b.to_bytes(),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
            metrics.webhook_rejected("too_large");
            return Ok(refuse(StatusCode::PAYLOAD_TOO_LARGE, &too_large));
        }
        Ok(Err(e)) => {
            metrics.webhook_rejected("malformed");
            return Ok(refuse(
                StatusCode::BAD_REQUEST,
                &format!("reading the body: {e}"),
            ));
        }
        Err(_) => {
            metrics.webhook_rejected("read_timeout");
            return Ok(refuse(
                StatusCode::REQUEST_TIMEOUT,
                &format!(
                    "the body did not arrive within {:?}",
                    server.limits.read_timeout
                ),
            ));
        }
    };
    let parsed = check_review(&body, endpoint, &server.limits.watch_namespaces);
    // Parsed once: the text is not needed any more.
    drop(body);
    let req = match parsed {
        Ok(req) => req,
        Err(Refusal::Malformed(why)) => {
            metrics.webhook_rejected("malformed");
            return Ok(refuse(StatusCode::BAD_REQUEST, &why));
        }
        Err(Refusal::Unreadable { uid, why }) => {
            metrics.webhook_rejected("malformed");
            return Ok(answer(&unreadable_answer(endpoint, uid, &why)));
        }
    };
    let review = answer_review(&server, endpoint, req, start).await;
    Ok(answer(&review))
}

/// Answers a parsed review; a panic while doing so is caught and answered
/// (allowed, with a warning naming the fault), with the request's uid.
async fn answer_review(
    server: &AdmissionServer,
    endpoint: Endpoint,
    req: AdmissionRequest<DynamicObject>,
    start: Instant,
) -> AdmissionReview<DynamicObject> {
    let metrics = &server.hook.metrics;
    let resp = AdmissionResponse::from(&req);
    let (ns, name) = (req.namespace.clone().unwrap_or_default(), req.name.clone());
    let answered = crate::panics::catch(async {
        match endpoint {
            Endpoint::Mutate => {
                let (review, result) = server.hook.review(req).await;
                metrics.webhook(start.elapsed(), result);
                review
            }
            Endpoint::Validate => {
                let (review, result) =
                    crate::route_webhook::review_with_client(&server.hook.client, req).await;
                metrics.route_validation(start.elapsed(), result);
                review
            }
        }
    })
    .await;
    answered.unwrap_or_else(|msg| {
        metrics.panicked("webhook");
        tracing::error!(?endpoint, namespace = %ns, name = %name, panic = %msg, "answering a review panicked; allowed with a warning");
        panicked_answer(resp, &msg)
    })
}

/// What a review gets when answering it panicked: allowed (the webhooks
/// fail open for their own faults, like a failed lookup), with a warning.
pub fn panicked_answer(resp: AdmissionResponse, msg: &str) -> AdmissionReview<DynamicObject> {
    let mut r = resp;
    r.warnings = Some(vec![format!(
        "kubegrace: not checked: the operator hit a bug answering this review ({msg})"
    )]);
    r.into_review()
}

fn answer(review: &AdmissionReview<DynamicObject>) -> Response<Full<Bytes>> {
    match serde_json::to_vec(review) {
        Ok(b) => respond(StatusCode::OK, b),
        Err(_) => refuse(StatusCode::INTERNAL_SERVER_ERROR, "serialising the answer"),
    }
}

/// Records the last time a byte moved in either direction, for the idle
/// timeout (the same clock for HTTP/1 keep-alive and HTTP/2).
struct Activity<T> {
    io: T,
    epoch: Instant,
    last_ms: Arc<AtomicU64>,
}

impl<T> Activity<T> {
    fn touch(&self) {
        let ms = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Activity<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.io).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.touch();
        }
        r
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Activity<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.touch();
        }
        r
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Runs `conn` until it ends or nothing moved for `idle`.
async fn until_idle<F: Future>(conn: F, epoch: Instant, last_ms: &AtomicU64, idle: Duration) {
    tokio::pin!(conn);
    loop {
        let last = epoch + Duration::from_millis(last_ms.load(Ordering::Relaxed));
        tokio::select! {
            _ = &mut conn => return,
            () = tokio::time::sleep_until((last + idle).into()) => {
                let now_last = epoch + Duration::from_millis(last_ms.load(Ordering::Relaxed));
                if now_last + idle <= Instant::now() {
                    return; // dropping the connection closes it
                }
            }
        }
    }
}

/// Binds and serves until `shutdown`; in-flight reviews get up to 5s.
pub async fn serve(
    addr: SocketAddr,
    resolver: Arc<CertResolver>,
    hook: Arc<Webhook>,
    limits: Limits,
    shutdown: tokio::sync::watch::Receiver<bool>,
) -> Result<()> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(Error::io(format!("binding webhook port {addr}")))?;
    serve_on(listener, resolver, hook, limits, shutdown).await
}

/// [`serve`] on a bound listener (tests bind port 0).
pub async fn serve_on(
    listener: TcpListener,
    resolver: Arc<CertResolver>,
    hook: Arc<Webhook>,
    limits: Limits,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) -> Result<()> {
    let mut tls = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| Error::Tls(e.to_string()))?
    .with_no_client_auth()
    .with_cert_resolver(resolver);
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = TlsAcceptor::from(Arc::new(tls));
    let addr = listener
        .local_addr()
        .map_err(Error::io("reading the webhook address"))?;
    tracing::info!(%addr, ?limits, "webhook listening");
    let metrics = hook.metrics.clone();
    metrics.ready.store(true, Ordering::Relaxed);
    let connections = Arc::new(Semaphore::new(limits.max_connections));
    let server = Arc::new(AdmissionServer {
        hook,
        in_flight: Semaphore::new(limits.max_in_flight),
        memory: Semaphore::new(REVIEW_MEMORY as usize),
        limits,
    });
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    loop {
        tokio::select! {
            _ = shutdown.changed() => break,
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                // Past the cap: closed before any TLS work.
                let Ok(permit) = connections.clone().try_acquire_owned() else {
                    metrics.webhook_rejected("connection_cap");
                    drop(stream);
                    continue;
                };
                let acceptor = acceptor.clone();
                let server = server.clone();
                let watcher = graceful.watcher();
                tokio::spawn(async move {
                    let _permit = permit;
                    let read_timeout = server.limits.read_timeout;
                    let idle = server.limits.idle_timeout;
                    let Ok(Ok(tls)) = tokio::time::timeout(read_timeout, acceptor.accept(stream)).await else {
                        server.hook.metrics.webhook_rejected("read_timeout");
                        return;
                    };
                    let epoch = Instant::now();
                    let last_ms = Arc::new(AtomicU64::new(0));
                    let io = Activity { io: tls, epoch, last_ms: last_ms.clone() };
                    let svc_server = server.clone();
                    let svc = hyper::service::service_fn(move |req| handle(req, svc_server.clone()));
                    let mut builder = connection_builder(read_timeout);
                    builder
                        .http2()
                        .timer(TokioTimer::new())
                        .max_concurrent_streams(u32::try_from(server.limits.max_in_flight).unwrap_or(u32::MAX));
                    let conn = builder.serve_connection(TokioIo::new(io), svc);
                    until_idle(watcher.watch(conn.into_owned()), epoch, &last_ms, idle).await;
                });
            }
        }
    }
    metrics.ready.store(false, Ordering::Relaxed);
    let _ = tokio::time::timeout(Duration::from_secs(5), graceful.shutdown()).await;
    Ok(())
}

/// How the webhook and the admin port serve a connection: HTTP/1 or
/// HTTP/2, and an HTTP/1 head that has not arrived within `header_timeout`
/// closes the connection (a slow client cannot hold a connection slot).
pub(crate) fn connection_builder(
    header_timeout: Duration,
) -> hyper_util::server::conn::auto::Builder<TokioExecutor> {
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout);
    builder
}

#[cfg(test)]
mod tests {
    use super::*;

    fn review(resource: &str, group: &str, ns: &str, obj_ns: &str) -> Vec<u8> {
        serde_json::json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "u-1",
                "kind": {"group": group, "version": "v1", "kind": "X"},
                "resource": {"group": group, "version": "v1", "resource": resource},
                "requestKind": {"group": group, "version": "v1", "kind": "X"},
                "requestResource": {"group": group, "version": "v1", "resource": resource},
                "namespace": ns,
                "operation": "CREATE",
                "userInfo": {"username": "u"},
                "object": {"apiVersion": "v1", "kind": "X", "metadata": {"name": "a", "namespace": obj_ns}},
                "oldObject": null,
                "dryRun": false,
                "options": null
            }
        })
        .to_string()
        .into_bytes()
    }

    #[test]
    fn a_well_formed_review_for_the_endpoints_resource_passes() {
        let req = check_review(&review("pods", "", "shop", "shop"), Endpoint::Mutate, &[])
            .expect("passes");
        assert_eq!(req.uid, "u-1");
        assert!(
            check_review(
                &review("graceroutes", "kubegrace.io", "shop", "shop"),
                Endpoint::Validate,
                &[]
            )
            .is_ok()
        );
    }

    #[test]
    fn malformed_or_foreign_reviews_are_refused_with_the_reason() {
        let cases: [(Vec<u8>, Endpoint, Vec<String>, &str); 7] = [
            (
                b"{".to_vec(),
                Endpoint::Mutate,
                vec![],
                "not an AdmissionReview",
            ),
            (
                br#"{"apiVersion":"v1","kind":"Pod"}"#.to_vec(),
                Endpoint::Mutate,
                vec![],
                "expected apiVersion",
            ),
            (
                br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#.to_vec(),
                Endpoint::Mutate,
                vec![],
                "no usable request",
            ),
            (
                review("secrets", "", "shop", "shop"),
                Endpoint::Mutate,
                vec![],
                "reviews pods",
            ),
            (
                review("pods", "", "shop", "shop"),
                Endpoint::Validate,
                vec![],
                "reviews graceroutes",
            ),
            (
                review("pods", "", "shop", "bank"),
                Endpoint::Mutate,
                vec![],
                "namespace \"bank\"",
            ),
            (
                review("pods", "", "bank", "bank"),
                Endpoint::Mutate,
                vec!["shop".into()],
                "not served",
            ),
        ];
        for (body, ep, watch, want) in cases {
            let Err(Refusal::Malformed(err)) = check_review(&body, ep, &watch) else {
                panic!("{want}: expected a 400");
            };
            assert!(err.contains(want), "{want:?} not in {err:?}");
        }
    }

    #[test]
    fn the_memory_share_of_a_review_is_bounded_at_both_ends() {
        assert_eq!(review_cost(0), 1);
        assert_eq!(review_cost(1), 1);
        assert_eq!(review_cost(MAX_BODY as u64), REVIEW_MEMORY);
        assert_eq!(review_cost(10 * 1024), 240);
        assert_eq!(review_cost(u64::MAX), REVIEW_MEMORY);
        // One review of the largest body fits; 32 of them cannot hold
        // their shares at once (the budget, not the count, bounds them).
        assert!(review_cost(MAX_BODY as u64) <= REVIEW_MEMORY);
        assert!(u64::from(review_cost(MAX_BODY as u64)) * 32 > u64::from(REVIEW_MEMORY));
    }

    #[test]
    fn a_review_whose_object_cannot_be_read_is_answered_with_its_uid() {
        let mut body: serde_json::Value =
            serde_json::from_slice(&review("pods", "", "shop", "shop")).expect("json");
        body["request"]["object"]["metadata"]["name"] = serde_json::json!(5);
        let body = serde_json::to_vec(&body).expect("json");
        let Err(Refusal::Unreadable { uid, why }) = check_review(&body, Endpoint::Mutate, &[])
        else {
            panic!("expected an answer with the uid");
        };
        assert_eq!(uid, "u-1");
        let pod = unreadable_answer(Endpoint::Mutate, uid.clone(), &why)
            .response
            .expect("response");
        assert_eq!(pod.uid, "u-1");
        assert!(pod.allowed && pod.patch.is_none());
        assert!(pod.warnings.expect("warning")[0].contains("not an AdmissionReview"));
        let route = unreadable_answer(Endpoint::Validate, uid, &why)
            .response
            .expect("response");
        assert_eq!(route.uid, "u-1");
        assert!(!route.allowed);
        // Without a readable uid there is nothing to answer: a 400.
        assert!(matches!(
            check_review(br#"{"request": {"uid": 7}}"#, Endpoint::Mutate, &[]),
            Err(Refusal::Malformed(_))
        ));
    }

    #[test]
    fn a_panicked_review_is_allowed_with_a_warning_and_its_uid() {
        let req = check_review(&review("pods", "", "shop", "shop"), Endpoint::Mutate, &[])
            .expect("passes");
        let out = panicked_answer(AdmissionResponse::from(&req), "boom")
            .response
            .expect("response");
        assert_eq!(out.uid, "u-1");
        assert!(out.allowed);
        assert!(out.warnings.expect("warning")[0].contains("boom"));
    }
}
