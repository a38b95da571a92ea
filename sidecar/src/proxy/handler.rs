//! One request, from its head to the response head handed back to the
//! connection. [`handle`] reads as the steps in the module doc; the
//! request's accounting and circuit permit live in a [`RequestScope`], and
//! every answer the proxy makes itself leaves through it.

use std::error::Error as StdError;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Request, Response, StatusCode, Uri, Version};
use http_body_util::Full;
use hyper::upgrade::OnUpgrade;

use super::body::{Finish, ProxyBody, RequestGuard};
use super::conn::activity::ConnCtx;
use super::decide::{self, Refused};
use super::grpc_health::{health_rpc, not_serving_response, watching};
use super::headers::{
    HTTP2_SETTINGS, add_forwarded, allow_upgrade, connection_has, drop_spelled_out, ensure_host,
    strip_hop_by_hop, upgrade_is_websocket,
};
use super::local::{client_fault_response, local_response};
use super::tunnel::spawn_tunnel;
use crate::circuit::{Permit, Route, UpstreamOutcome};
use crate::config::{Config, DrainGrpcHealth};
use crate::drain::Phase;
use crate::metrics::HealthRpc;
use crate::upstream::retry::{RetryDenied, retry_reason};
use crate::upstream::{
    BodyFault, BodyWatch, DownstreamBody, LimitedBody, SentRequest, Upstream, UpstreamBody,
    UpstreamResponse, unbox,
};

/// Not an `async fn`, and the request boxed: an `async fn` would keep the
/// request (264 bytes) twice in every waiting HTTP/2 stream's future, as
/// its argument and as the local it is moved into, and by value the block
/// below would still keep it for the stream's life after handing it on.
#[allow(
    clippy::manual_async_fn,
    reason = "an async fn keeps its argument twice (see above)"
)]
pub(crate) fn handle(
    ctx: Arc<ConnCtx>,
    mut req: Box<Request<DownstreamBody>>,
) -> impl Future<Output = Response<ProxyBody>> {
    async move {
        let mut scope = RequestScope::start(ctx, req.version());
        let shared = scope.ctx.shared.clone();
        let live = shared.live.load_full();
        if scope.version != Version::HTTP_2 {
            scope.ctx.act.note_message_end(req.headers());
        }

        // While draining the sidecar speaks for the app's gRPC health service.
        let health = health_rpc(&req)
            .filter(|_| live.config.drain.grpc_health == DrainGrpcHealth::NotServing);
        if let Some(rpc) = health
            && shared.drain.phase() != Phase::Serving
        {
            return scope.health_not_serving(rpc);
        }

        // Routed, and sent on, by its normalized path (proxy/path.rs), then
        // admitted as decide.rs decides for both HTTP/1 paths.
        match normalized_uri(req.uri()) {
            Ok(Some(uri)) => *req.uri_mut() = uri,
            Ok(None) => {}
            Err(()) => return scope.bad_target(),
        }
        let route = decide::route_of(&live.routes, &req);
        let declared = decide::declared_length(req.headers());
        let max_body = live.config.limits.max_request_body_bytes;
        match decide::admit(&route, declared, max_body, &shared.metrics).await {
            Ok(permit) => scope.permit = Some(permit),
            Err(refused) => return scope.refused(&route, &refused),
        }

        let wants_upgrade =
            scope.negotiate_upgrade(req.headers_mut(), &live.config.upgrade_protocols);
        let downstream_upgrade = wants_upgrade.then(|| DownstreamUpgrade {
            websocket: upgrade_is_websocket(req.headers()),
            on: hyper::upgrade::on(&mut *req),
        });
        let upstream = shared.upstreams.pick();
        let Some((upstream_req, body_watch)) = upstream_request(
            unbox(req),
            scope.ctx.peer_ip.header(),
            &live.config,
            &upstream,
            wants_upgrade,
        ) else {
            return scope.bad_target();
        };
        let h2 = scope.version == Version::HTTP_2;
        let retry = &live.config.retry_budget;
        let attempt = Attempt {
            shared: &shared,
            route: &route,
            upstream: &upstream,
            h2,
            budget: retry,
        };
        match attempt.send(Box::new(upstream_req), route.timeout()).await {
            Ok(answer) if health == Some(HealthRpc::Watch) => scope.respond_watch(answer),
            Ok(answer) => scope.respond_upstream(answer, downstream_upgrade),
            Err(failure) => scope.upstream_failed(failure, &body_watch),
        }
    }
}

/// The request as the app gets it: hop-by-hop headers out, `X-Forwarded-*`
/// and `Host` in, the target in the form the app's protocol needs, the body
/// under the client-side limits. `None`: a target that cannot be rewritten.
fn upstream_request(
    req: Request<DownstreamBody>,
    peer_ip: &HeaderValue,
    config: &Config,
    upstream: &Upstream,
    wants_upgrade: bool,
) -> Option<(Request<UpstreamBody>, BodyWatch)> {
    let h2 = req.version() == Version::HTTP_2;
    let (mut parts, body) = req.into_parts();
    strip_hop_by_hop(&mut parts.headers, wants_upgrade);
    drop_spelled_out(&mut parts.headers, config.proxy.underscores_in_headers);
    add_forwarded(
        &mut parts.headers,
        peer_ip,
        config.forwarded.trusted_hops != 0,
    );
    // HTTP/2 carries the host as :authority, which upstream_uri always
    // sets; a Host beside it is one more field to encode and for the app
    // to decode (and a string copied) on every request. The HTTP/1.1
    // downgrade (upstream/downgrade.rs) sets Host from :authority itself.
    if !h2 {
        ensure_host(&mut parts.headers, &parts.uri, upstream.host());
    }
    parts.uri = upstream_uri(&parts.uri, upstream, h2)?;
    parts.version = if h2 {
        Version::HTTP_2
    } else {
        Version::HTTP_11
    };
    let limits = &config.limits;
    let max_body = limits.max_request_body_bytes;
    // HTTP/2 streams (gRPC client streaming) may idle for long by design;
    // the trickling-body guard is for HTTP/1, where a slow body holds a
    // whole connection and an app connection.
    let body_timeout = (!h2 && !wants_upgrade && !limits.body_read_timeout.get().is_zero())
        .then(|| (limits.body_read_timeout.get(), limits.body_min_rate));
    let (body, body_watch) =
        LimitedBody::new(body, (max_body > 0).then_some(max_body), body_timeout);
    // Kept for a retry unless retries are off or the body is a tunnel's.
    let keep_bytes = match config.retry_budget.enabled() && !wants_upgrade {
        true => usize::try_from(config.retry_budget.max_body_bytes).unwrap_or(usize::MAX),
        false => 0,
    };
    let body = UpstreamBody::first(body, keep_bytes);
    Some((Request::from_parts(parts, body), body_watch))
}

/// The request's URI with its path normalized (proxy/path.rs), `None`
/// when it already is; `Err`: a path refused (an escaped slash).
pub(super) fn normalized_uri(uri: &Uri) -> Result<Option<Uri>, ()> {
    let Some(path) = super::path::normalize(uri.path()).map_err(|_| ())? else {
        return Ok(None);
    };
    let path_and_query = match uri.query() {
        Some(query) => format!("{path}?{query}"),
        None => path,
    };
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(path_and_query.try_into().map_err(|_| ())?);
    Uri::from_parts(parts).map(Some).map_err(|_| ())
}

/// The request target the app gets.
fn upstream_uri(client_uri: &Uri, upstream: &Upstream, h2: bool) -> Option<Uri> {
    let path_and_query = client_uri
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/"));
    if h2 {
        // HTTP/2 needs an absolute URI (:scheme, :authority, :path).
        let mut uri_parts = http::uri::Parts::default();
        uri_parts.scheme = Some(upstream.scheme());
        uri_parts.authority = Some(
            client_uri
                .authority()
                .cloned()
                .unwrap_or_else(|| upstream.authority().clone()),
        );
        uri_parts.path_and_query = Some(path_and_query);
        Uri::from_parts(uri_parts).ok()
    } else {
        // HTTP/1.1 to the app in origin form, as a client talks to a server.
        Some(Uri::from(path_and_query))
    }
}

/// Why the app gave no response.
enum SendFailure {
    /// The route's timeout passed first.
    TimedOut,
    Failed(crate::Error),
}

/// The most attempts one request gets (the first and two retries), so an
/// app that refuses every stream is not asked again and again while a
/// generous budget lasts.
const MAX_ATTEMPTS: usize = 3;

/// One request's way to the app: sent in the client's protocol, and sent
/// again when the app cannot have seen it (`upstream::retry`).
struct Attempt<'a> {
    shared: &'a crate::state::Shared,
    route: &'a Route,
    upstream: &'a Upstream,
    h2: bool,
    budget: &'a crate::config::RetryBudgetConfig,
}

impl Attempt<'_> {
    /// Sends within the route's timeout, which covers every attempt. Not
    /// an `async fn` with one `.await` per arm: that lays out the retry
    /// future twice, and this future is part of every HTTP/2 stream's.
    fn send(
        &self,
        req: SentRequest,
        timeout: Option<Duration>,
    ) -> impl Future<Output = Result<UpstreamResponse, SendFailure>> + '_ {
        use futures_util::future::{Either, FutureExt};
        let sent = self.send_with_retries(req);
        match timeout {
            Some(limit) => Either::Left(tokio::time::timeout(limit, sent).map(|r| match r {
                Ok(r) => r.map_err(SendFailure::Failed),
                Err(_) => Err(SendFailure::TimedOut),
            })),
            None => Either::Right(sent.map(|r| r.map_err(SendFailure::Failed))),
        }
    }

    /// One `send_once` await point for the first attempt and the retries
    /// (two would be laid out side by side). Not an `async fn`: that keeps
    /// its argument and the local it is moved into apart, two dead copies
    /// of the request (344 bytes each) in every waiting stream's future.
    fn send_with_retries(
        &self,
        mut req: SentRequest,
    ) -> impl Future<Output = Result<UpstreamResponse, crate::Error>> + '_ {
        // Boxed: kept beside every waiting stream's future and read only
        // when the app failed it (248 bytes inline; one allocation beside
        // the header map's clone).
        let again = req.body().retry_handle().map(|body| {
            self.shared.retry_budget.deposit();
            let (method, uri) = (req.method().clone(), req.uri().clone());
            Box::new((body, method, uri, req.version(), req.headers().clone()))
        });
        async move {
            let mut attempt = 1;
            loop {
                let err = match self.send_once(req).await {
                    Ok(answer) => return Ok(answer),
                    Err(err) => err,
                };
                let Some((retry_body, method, uri, version, headers)) = again.as_deref() else {
                    return Err(err);
                };
                let Some(reason) = retry_reason(&err, method, self.route.retries_idempotent())
                else {
                    return Err(err);
                };
                if attempt >= MAX_ATTEMPTS {
                    return Err(err);
                }
                let Some(body) = retry_body.next_attempt() else {
                    self.route.count_retry_denied(RetryDenied::Body);
                    return Err(err);
                };
                if !self.shared.retry_budget.withdraw(self.budget) {
                    self.route.count_retry_denied(RetryDenied::Budget);
                    return Err(err);
                }
                self.route.count_retry(reason);
                tracing::debug!(error = %err, reason = reason.as_str(), attempt, "retrying a request the app did not process");
                let mut next = Box::new(Request::new(body));
                *next.method_mut() = method.clone();
                *next.uri_mut() = uri.clone();
                *next.version_mut() = *version;
                *next.headers_mut() = headers.clone();
                req = next;
                attempt += 1;
            }
        }
    }

    /// Not an `async fn`: one would keep the request's bytes (344) in its
    /// own state for the whole wait, after handing it on; this way the
    /// request goes straight into the send's future.
    fn send_once(
        &self,
        req: SentRequest,
    ) -> impl Future<Output = Result<UpstreamResponse, crate::Error>> + '_ {
        use futures_util::future::{Either, FutureExt};
        if self.h2 {
            Either::Left(self.upstream.send_h2(req).map(|sent| {
                sent.map(|response| UpstreamResponse {
                    response,
                    pool_return: None,
                })
            }))
        } else {
            Either::Right(self.upstream.send_h1(unbox(req)))
        }
    }
}

/// What one request holds from its start to its answer: the accounting
/// and, once admitted, the circuit permit. The answer's body takes both
/// (see [`Finish`]); a request dropped before it has one (client gone,
/// drain deadline) releases them here.
struct RequestScope {
    ctx: Arc<ConnCtx>,
    /// The client's HTTP version: the answer is in it.
    version: Version,
    // Fields drop in this order: on cancellation the permit goes first
    // (its own `Drop` records `Cancelled`: a drain never counts as a
    // breaker failure), then the accounting, as when both were locals.
    permit: Option<Permit>,
    request: RequestGuard,
}

impl RequestScope {
    fn start(ctx: Arc<ConnCtx>, version: Version) -> RequestScope {
        RequestScope {
            request: RequestGuard::start(ctx.clone()),
            permit: None,
            ctx,
            version,
        }
    }

    /// Whether the request may switch protocols: an HTTP/1.1 `Upgrade`
    /// with a protocol in `allowed` (the others are taken off the list).
    fn negotiate_upgrade(&self, headers: &mut HeaderMap, allowed: &[String]) -> bool {
        let asks_upgrade = self.version == Version::HTTP_11
            && headers.contains_key(header::UPGRADE)
            && connection_has(headers, "upgrade");
        let wants_upgrade = asks_upgrade && allow_upgrade(headers, allowed);
        if asks_upgrade && !wants_upgrade {
            // Answered as a server that does not speak the protocol would:
            // the request goes on as a plain one, without Upgrade.
            self.ctx.shared.metrics.upgrade_ignored();
            headers.remove(&HTTP2_SETTINGS);
        }
        wants_upgrade
    }

    /// Records what the app did on the permit, which the answer carries.
    fn record(&mut self, outcome: UpstreamOutcome) -> Option<Permit> {
        let mut permit = self.permit.take()?;
        permit.record(outcome);
        Some(permit)
    }

    /// Carries out a refusal decide.rs made: its answer, in hyper's medium.
    fn refused(self, route: &Route, refused: &Refused) -> Response<ProxyBody> {
        let mut answer = refused.answer(route);
        if answer.close {
            // The unread body would otherwise be drained by hyper first.
            self.close_http1(&mut answer.response);
        }
        let mut resp = answer.response;
        finish_response(&self.ctx, self.version, Some(route), &mut resp);
        let finish = Finish::new(self.request, None);
        resp.map(|body| ProxyBody::local(body, Some(finish)))
    }

    fn bad_target(mut self) -> Response<ProxyBody> {
        let resp = local_response(StatusCode::BAD_REQUEST, "bad request target\n");
        self.record(UpstreamOutcome::Cancelled);
        self.respond_local(resp, None)
    }

    fn upstream_failed(
        mut self,
        failure: SendFailure,
        body_watch: &BodyWatch,
    ) -> Response<ProxyBody> {
        let err = match failure {
            SendFailure::TimedOut => {
                // Still waiting for the client's body: its slowness, not the app's.
                if let Some(fault) = body_watch
                    .fault()
                    .or_else(|| body_watch.waiting_on_client().then_some(BodyFault::Timeout))
                {
                    return self.client_fault(fault);
                }
                self.ctx.shared.metrics.upstream_timeout();
                let permit = self.record(UpstreamOutcome::Timeout);
                let resp = local_response(StatusCode::GATEWAY_TIMEOUT, "upstream timed out\n");
                return self.respond_local(resp, permit);
            }
            SendFailure::Failed(err) => err,
        };
        // The request body failed on the client's side (limit, time,
        // framing, client gone): the app did nothing wrong.
        if let Some(fault) = body_watch.fault() {
            tracing::debug!(error = %err, source = ?err.source(), "request body failed on the client's side");
            return self.client_fault(fault);
        }
        // The app is restarting and did not come back within the hold
        // (app.rs): 503 + Retry-After, and no breaker failure.
        if let Some(resp) = crate::app::hold_expired_response(&err) {
            let permit = self.record(UpstreamOutcome::Cancelled);
            return self.respond_local(resp, permit);
        }
        self.ctx.shared.metrics.upstream_error();
        tracing::debug!(error = %err, source = ?err.source(), "upstream request failed");
        let permit = self.record(UpstreamOutcome::ConnectError);
        let resp = local_response(StatusCode::BAD_GATEWAY, "upstream unavailable\n");
        self.respond_local(resp, permit)
    }

    /// The answer to a request whose body failed on the client's side. It is
    /// counted as the client's (never an upstream error, never a breaker
    /// failure); a client that left gets nothing, as there is nobody to read it.
    fn client_fault(mut self, fault: BodyFault) -> Response<ProxyBody> {
        let mut resp = client_fault_response(&self.ctx.shared.metrics, fault);
        let permit = self.record(UpstreamOutcome::ClientFault);
        // The rest of the body cannot be trusted to frame the next request.
        self.close_http1(&mut resp);
        self.respond_local(resp, permit)
    }

    /// Asks an HTTP/1 client to close the connection after this answer.
    fn close_http1<B>(&self, resp: &mut Response<B>) {
        if self.version != Version::HTTP_2 {
            resp.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
    }

    /// An answer the proxy made itself.
    fn respond_local(
        self,
        mut resp: Response<Full<Bytes>>,
        permit: Option<Permit>,
    ) -> Response<ProxyBody> {
        finish_response(&self.ctx, self.version, routed(&permit), &mut resp);
        let finish = Finish::new(self.request, permit);
        resp.map(|body| ProxyBody::local(body, Some(finish)))
    }

    /// The sidecar's NOT_SERVING for a health call while draining.
    fn health_not_serving(self, rpc: HealthRpc) -> Response<ProxyBody> {
        let mut resp = not_serving_response(rpc, self.ctx.shared.clone());
        // Answered before any route is chosen.
        finish_response(&self.ctx, self.version, None, &mut resp);
        let finish = Finish::new(self.request, None);
        resp.map(|body| ProxyBody::health(body, Some(finish)))
    }

    /// The app's answer to a health Watch: streamed as it is until a drain
    /// starts, then taken over (grpc_health.rs).
    fn respond_watch(mut self, answer: UpstreamResponse) -> Response<ProxyBody> {
        let mut resp = answer.response;
        let permit = self.record(UpstreamOutcome::Status(resp.status()));
        strip_hop_by_hop(resp.headers_mut(), false);
        *resp.version_mut() = self.version;
        finish_response(&self.ctx, self.version, routed(&permit), &mut resp);
        let finish = Finish::new(self.request, permit);
        let shared = self.ctx.shared.clone();
        resp.map(|body| ProxyBody::health(watching(body, shared), Some(finish)))
    }

    /// The app's answer, its body streamed to the client. A `101` joins
    /// the two upgraded connections; one nobody asked for is refused.
    fn respond_upstream(
        mut self,
        answer: UpstreamResponse,
        downstream_upgrade: Option<DownstreamUpgrade>,
    ) -> Response<ProxyBody> {
        let UpstreamResponse {
            response: mut resp,
            pool_return,
        } = answer;
        let permit = self.record(UpstreamOutcome::Status(resp.status()));

        let upgraded =
            resp.status() == StatusCode::SWITCHING_PROTOCOLS && downstream_upgrade.is_some();
        if resp.status() == StatusCode::SWITCHING_PROTOCOLS && !upgraded {
            // The app switched protocols nobody asked it to (or one not
            // allowed): never hand the client a raw tunnel past the proxy.
            self.ctx.shared.metrics.upstream_error();
            let resp = local_response(
                StatusCode::BAD_GATEWAY,
                "upstream switched protocols unasked\n",
            );
            return self.respond_local(resp, permit);
        }
        if let (true, Some(downstream)) = (upgraded, downstream_upgrade) {
            let upstream = hyper::upgrade::on(&mut resp);
            // A WebSocket is the request's `Upgrade: websocket` answered
            // 101 with the same protocol.
            let websocket = downstream.websocket && upgrade_is_websocket(resp.headers());
            spawn_tunnel(self.ctx.shared.clone(), downstream.on, upstream, websocket);
        }
        strip_hop_by_hop(resp.headers_mut(), upgraded);
        // Answer in the client's HTTP version, not the app's (an HTTP/1.0 app
        // must not turn off keep-alive for HTTP/1.1 clients).
        *resp.version_mut() = self.version;
        finish_response(&self.ctx, self.version, routed(&permit), &mut resp);
        let finish = Finish::new(self.request, permit);
        resp.map(|body| ProxyBody::upstream(body, finish, pool_return))
    }
}

/// The client's side of an upgrade the app may accept.
struct DownstreamUpgrade {
    on: OnUpgrade,
    /// The client asked for `Upgrade: websocket`.
    websocket: bool,
}

/// The route a permit was issued by: every admitted request has one.
fn routed(permit: &Option<Permit>) -> Option<&Route> {
    permit.as_ref().map(|p| &**p.route())
}

/// Adds `Connection: close` to HTTP/1 responses while draining, so
/// keep-alive clients move to other pods before the listener closes.
/// `route` labels the response's count (`None`: answered before routing).
fn finish_response<B>(
    ctx: &ConnCtx,
    version: Version,
    route: Option<&Route>,
    resp: &mut Response<B>,
) {
    ctx.shared.metrics.response(resp.status(), route);
    if version != Version::HTTP_2
        && resp.status() != StatusCode::SWITCHING_PROTOCOLS
        && ctx.shared.drain.phase() != Phase::Serving
    {
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
}
