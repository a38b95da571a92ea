//! One request on the fast path, from its parsed head to the end of the
//! response body: the same steps and answers as handler.rs, on bytes. The
//! route and the admission are decide.rs's, as they are handler.rs's; this
//! file carries the decision out on the socket.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::chunked::ChunkFramer;
use super::head::{self, Framing, Parsed, Refusal, ResponseHead, Rewrite};
use super::pool::AppConn;
use super::{Client, Control, Next};
use crate::circuit::{Permit, Route, UpstreamOutcome};
use crate::config::LimitsConfig;
use crate::drain::Phase;
use crate::spare::{self, ReadClass};
use crate::upstream::{BodyFault, Upstream};

use super::super::conn::activity::{ConnActivity, ConnCtx};
use super::super::decide;
use super::super::local::{LocalFraming, client_fault_response, local_response};

/// Bytes read from a socket at a time while relaying a body.
pub(super) const READ_CHUNK: usize = 16 * 1024;
/// The largest response head taken from the app (hyper's client allows
/// about this much buffered).
const MAX_RESPONSE_HEAD: usize = 400 * 1024;

/// Parses the head in the client's buffer and, if it is complete and
/// this path's, serves the whole exchange. `None`: the head is partial.
pub(super) async fn try_request<T>(
    client: &mut Client<T>,
    ctx: &Arc<ConnCtx>,
    limits: &LimitsConfig,
    ctl: &Control,
) -> Option<Next>
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    // The paths most requests never take (local answers, failures, a
    // route timeout, a new app connection, a body still coming) are boxed
    // where they are awaited: inline, their states made this future 2,072
    // bytes, all of it copied into the heap slot `exchanges` gives it per
    // request, which then came from the arena's slow path too
    // (bench/README.md, "seventh pass"; slot.rs since).
    let shared = &ctx.shared;
    let max_head = limits.max_header_bytes.max(8192);
    // The live config is borrowed (arc-swap's guard), not cloned, and only
    // until the route is chosen: the route is an `Arc` of its own, and no
    // guard is held across an await.
    let parsed = {
        let live = shared.live.load();
        let rewrite = Rewrite {
            peer_ip: ctx.peer_ip.as_bytes(),
            trust_proto: live.config.forwarded.trusted_hops != 0,
            keep_underscores: live.config.proxy.underscores_in_headers,
        };
        match head::parse_request(
            &client.buf,
            limits.max_headers,
            max_head,
            &rewrite,
            &mut client.out,
        ) {
            Parsed::Partial => return None,
            Parsed::Fallback => return Some(Next::Fallback),
            Parsed::Refused(refusal) => Err(refusal),
            Parsed::Done(head) => {
                let method = Method::from_bytes(head.method.as_bytes()).unwrap_or(Method::GET);
                // One rule for both paths (decide.rs); no absolute-form
                // target comes here, so there is no authority.
                let route = decide::route(&live.routes, &method, head.host, None, &head.path);
                // A request this route may send twice needs its body kept and
                // hyper's error detail (handler.rs retries): hyper takes it.
                if route.retries_idempotent() && crate::upstream::retry::is_idempotent(&method) {
                    return Some(Next::Fallback);
                }
                let req = Request {
                    framing: head.framing,
                    close: head.close,
                    has_host: head.has_host,
                    head_request: method == Method::HEAD,
                };
                let len = head.len;
                super::consume(&mut client.buf, len);
                Ok((route, req))
            }
        }
    };
    let (route, req) = match parsed {
        Ok(parsed) => parsed,
        Err(refusal) => return Some(refuse(client, refusal).await),
    };

    let mut scope = Scope::start(ctx, &route, req.head_request);
    let declared = match req.framing {
        Framing::Length(n) => Some(n),
        _ => None,
    };
    let max_body = limits.max_request_body_bytes;
    match decide::admit(&route, declared, max_body, &shared.metrics).await {
        Ok(permit) => scope.permit = Some(permit),
        Err(refused) => {
            let answer = refused.answer(&route);
            // Here nothing reads an unread body: it would frame the next
            // request, so any body left closes the connection.
            let close = answer.close || req.framing != Framing::Empty;
            let resp = answer.response;
            return Some(Box::pin(scope.answer(client, ctl, resp, None, close)).await);
        }
    }

    let upstream = shared.upstreams.pick();
    if !req.has_host {
        head::put_header(&mut client.out, b"host", upstream.host().as_bytes());
    }
    client.out.extend_from_slice(b"\r\n");
    let body = BodyRules {
        max: limits.max_request_body_bytes,
        timeout: limits.body_read_timeout.get(),
        min_rate: limits.body_min_rate,
    };
    let progress = Progress::default();
    let sent = send(client, ctx, ctl, &upstream, &req, &body, &progress);
    let sent = match route.timeout() {
        Some(limit) => match Box::pin(tokio::time::timeout(limit, sent)).await {
            Ok(res) => res,
            Err(_) if progress.waiting_on_client.load(Ordering::Relaxed) => {
                Err(Failure::Client(BodyFault::Timeout))
            }
            Err(_) => Err(Failure::TimedOut(
                progress.body_read.load(Ordering::Relaxed),
            )),
        },
        None => sent.await,
    };
    let (mut app, response, body_done) = match sent {
        Ok(sent) => sent,
        Err(failure) => {
            return Some(Box::pin(scope.failed(client, ctl, failure, &upstream)).await);
        }
    };

    let status = StatusCode::from_u16(response.status).unwrap_or(StatusCode::BAD_GATEWAY);
    let permit = scope.record(UpstreamOutcome::Status(status));
    if status == StatusCode::SWITCHING_PROTOCOLS {
        // Nobody asked (upgrades are hyper's): never a raw tunnel.
        shared.metrics.upstream_error();
        let resp = local_response(
            StatusCode::BAD_GATEWAY,
            "upstream switched protocols unasked\n",
        );
        return Some(Box::pin(scope.answer(client, ctl, resp, permit, true)).await);
    }
    shared.metrics.response(status, Some(scope.route));
    // The client said this is its last request, all of it is read, and
    // the answer closes: the socket closes right after the answer's last
    // byte, with nothing left unread that we know of, so that byte can go
    // out with the FIN (conn/socket.rs, `Downstream::poll_write_last`). Not when
    // the close is only ours (drain, the app's): a client may have sent
    // its next request already, and a close with unread bytes resets the
    // connection, which would take the held bytes with it.
    let last = req.close && body_done && response.close && client.buf.is_empty();
    let next = match relay_response(client, &mut app, &response, last.then_some(&ctx.act)).await {
        Ok(()) => {
            // An app that answered before it had the whole body may still
            // be waiting for the rest: never reused.
            if response.reusable && body_done {
                upstream
                    .raw_pool()
                    .push(app, shared.drain.open_connections());
            }
            if !body_done {
                // The rest of the request body is still coming.
                Next::Linger
            } else if response.close {
                Next::Close
            } else {
                Next::KeepAlive
            }
        }
        Err(()) => Next::Abort,
    };
    drop(permit);
    drop(scope);
    Some(next)
}

/// What the exchange needs of the request head after the buffer moved on.
struct Request {
    framing: Framing,
    close: bool,
    has_host: bool,
    head_request: bool,
}

/// Whether this answer ends the connection: the client asked, the drain
/// started (HTTP/1 clients move to other pods early), or the connection
/// was asked to close.
fn closing(ctx: &ConnCtx, ctl: &Control, req: &Request) -> bool {
    req.close || ctl.ending().is_some() || ctx.shared.drain.phase() != Phase::Serving
}

/// The client-side limits on a request body.
struct BodyRules {
    max: u64,
    timeout: Duration,
    min_rate: u64,
}

/// How far the request got, for an exchange cut by the route's timeout.
#[derive(Default)]
struct Progress {
    /// Waiting for the client's body bytes (rather than for the app).
    waiting_on_client: AtomicBool,
    /// The whole request was read from the client.
    body_read: AtomicBool,
}

/// Why the app gave no response.
enum Failure {
    /// The route's timeout; whether the whole request had been read.
    TimedOut(bool),
    /// The client's body failed (limit, time, framing, gone).
    Client(BodyFault),
    /// Connecting failed (the error says whether the hold ran out);
    /// whether the whole request had been read from the client.
    Connect(crate::Error, bool),
    /// The connection died under a request the app had received, or the
    /// app answered with something that is not HTTP/1.
    Lost(String),
}

/// The request body still to relay.
enum BodyLeft {
    Length(u64),
    Chunked(ChunkFramer),
}

impl BodyLeft {
    fn new(framing: Framing) -> Option<BodyLeft> {
        match framing {
            Framing::Length(n) => Some(BodyLeft::Length(n)),
            Framing::Chunked => Some(BodyLeft::Chunked(ChunkFramer::for_request())),
            Framing::Empty | Framing::Close => None,
        }
    }

    /// How many of `data`'s bytes belong to the body, and whether it is
    /// complete with them.
    fn take(&mut self, data: &[u8]) -> Result<(usize, bool), BodyFault> {
        match self {
            BodyLeft::Length(left) => {
                let n = (data.len() as u64).min(*left);
                *left -= n;
                Ok((n as usize, *left == 0))
            }
            BodyLeft::Chunked(framer) => {
                let n = framer.feed(data).map_err(|_| BodyFault::BadBody)?;
                Ok((n, framer.is_done()))
            }
        }
    }
}

/// Sends the head and body to the app (a pooled connection, or a new one)
/// and reads the response head. Returns the app connection, the head, and
/// whether the whole request body went out.
async fn send<T>(
    client: &mut Client<T>,
    ctx: &ConnCtx,
    ctl: &Control,
    upstream: &Upstream,
    req: &Request,
    rules: &BodyRules,
    progress: &Progress,
) -> Result<(AppConn, ResponseHead, bool), Failure>
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    let mut left = BodyLeft::new(req.framing);
    let mut received = 0u64;
    let mut done = left.is_none();
    // The body bytes already read go in the same write as the head.
    if let Some(body) = left.as_mut()
        && !client.buf.is_empty()
    {
        let (n, complete) = body.take(&client.buf).map_err(Failure::Client)?;
        received += n as u64;
        if rules.max > 0 && received > rules.max {
            return Err(Failure::Client(BodyFault::TooLarge));
        }
        client.out.extend_from_slice(&client.buf[..n]);
        super::consume(&mut client.buf, n);
        done = complete;
    }
    // Everything of the request in one buffer: it may go again on another
    // connection if a pooled one turns out closed before it took a byte.
    // Once written it never goes again (as in upstream/client.rs): the app may
    // have acted on it.
    let replayable = done;
    progress.body_read.store(done, Ordering::Relaxed);
    loop {
        let mut app = match upstream.raw_pool().pop() {
            Some(app) => app,
            None => AppConn {
                io: Box::pin(upstream.connect())
                    .await
                    .map_err(|err| Failure::Connect(err, done))?,
                buf: spare::take_bytes(ReadClass::Http1App),
                reused: false,
            },
        };
        if let Err(err) = app.io.write_all(&client.out).await {
            // A write fails only on a socket the app had already reset: it
            // took nothing.
            if app.reused && replayable {
                tracing::debug!(error = %err, "pooled app connection was closed; retrying on another");
                continue;
            }
            return Err(lost(upstream, &err.to_string()));
        }
        let mut sent_all = done;
        if !done {
            sent_all = Box::pin(stream_body(
                client,
                &mut app,
                &mut left,
                &mut received,
                rules,
                progress,
            ))
            .await?;
        }
        let close = !sent_all || closing(ctx, ctl, req);
        match read_response_head(&mut app, req, close, client).await {
            Ok(head) => return Ok((app, head, sent_all)),
            Err(HeadError::Eof) => return Err(lost(upstream, "app closed the connection")),
            Err(HeadError::Io(err)) => return Err(lost(upstream, &err.to_string())),
            Err(HeadError::Bad) => return Err(Failure::Lost("malformed response head".into())),
        }
    }
}

fn lost(upstream: &Upstream, why: &str) -> Failure {
    upstream.lost_in_flight();
    Failure::Lost(why.to_string())
}

/// Relays the rest of the request body from the client to the app, under
/// the body limits. Ok(false): the app stopped taking it (it may have
/// answered early; the caller reads its answer).
async fn stream_body<T>(
    client: &mut Client<T>,
    app: &mut AppConn,
    left: &mut Option<BodyLeft>,
    received: &mut u64,
    rules: &BodyRules,
    progress: &Progress,
) -> Result<bool, Failure>
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    let Some(body) = left.as_mut() else {
        return Ok(true);
    };
    let started = tokio::time::Instant::now();
    loop {
        client.buf.reserve(READ_CHUNK);
        progress.waiting_on_client.store(true, Ordering::Relaxed);
        let read = client.io.read_buf(&mut client.buf);
        let read = if rules.timeout.is_zero() {
            read.await
        } else {
            let earned = if rules.min_rate == 0 {
                Duration::ZERO
            } else {
                Duration::from_secs_f64(*received as f64 / rules.min_rate as f64)
            };
            match tokio::time::timeout_at(started + rules.timeout + earned, read).await {
                Ok(read) => read,
                Err(_) => return Err(Failure::Client(BodyFault::Timeout)),
            }
        };
        progress.waiting_on_client.store(false, Ordering::Relaxed);
        match read {
            Ok(0) | Err(_) => return Err(Failure::Client(BodyFault::Gone)),
            Ok(_) => {}
        }
        let (n, complete) = body.take(&client.buf).map_err(Failure::Client)?;
        *received += n as u64;
        if rules.max > 0 && *received > rules.max {
            return Err(Failure::Client(BodyFault::TooLarge));
        }
        if complete {
            progress.body_read.store(true, Ordering::Relaxed);
        }
        if app.io.write_all(&client.buf[..n]).await.is_err() {
            super::consume(&mut client.buf, n);
            return Ok(false);
        }
        super::consume(&mut client.buf, n);
        if complete {
            return Ok(true);
        }
    }
}

enum HeadError {
    /// The app closed before any byte of an answer.
    Eof,
    Io(std::io::Error),
    Bad,
}

/// Reads the app's response head, skipping informational (1xx) ones, and
/// writes the client's version of it to the client's write buffer.
async fn read_response_head<T>(
    app: &mut AppConn,
    req: &Request,
    close: bool,
    client: &mut Client<T>,
) -> Result<ResponseHead, HeadError> {
    loop {
        if !app.buf.is_empty() {
            match head::parse_response(&app.buf, req.head_request, close, &mut client.out) {
                Parsed::Done(head) if (100..200).contains(&head.status) && head.status != 101 => {
                    super::consume(&mut app.buf, head.len);
                    continue;
                }
                Parsed::Done(head) => {
                    super::consume(&mut app.buf, head.len);
                    return Ok(head);
                }
                Parsed::Partial if app.buf.len() < MAX_RESPONSE_HEAD => {}
                Parsed::Partial | Parsed::Refused(_) | Parsed::Fallback => {
                    return Err(HeadError::Bad);
                }
            }
        }
        if app.buf.capacity() == 0 {
            // Pooled connections keep no buffer.
            app.buf = spare::take_bytes(ReadClass::Http1App);
        }
        app.buf.reserve(READ_CHUNK);
        match app.io.read_buf(&mut app.buf).await {
            Ok(0) if app.buf.is_empty() => return Err(HeadError::Eof),
            Ok(0) => return Err(HeadError::Bad),
            Ok(_) => {}
            Err(err) => return Err(HeadError::Io(err)),
        }
    }
}

/// Writes the response head (in the client's write buffer) and relays the
/// body by its framing. Err: either side broke mid-body. With `last`, the
/// write that ends the response is marked as the connection's last.
async fn relay_response<T>(
    client: &mut Client<T>,
    app: &mut AppConn,
    response: &ResponseHead,
    last: Option<&ConnActivity>,
) -> Result<(), ()>
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    let mut left = match response.framing {
        Framing::Empty => None,
        Framing::Length(n) => Some(RespLeft::Length(n)),
        Framing::Chunked => Some(RespLeft::Chunked(ChunkFramer::default())),
        Framing::Close => Some(RespLeft::Close),
    };
    let mut done = left.is_none();
    if let Some(body) = left.as_mut() {
        let (n, complete) = body.take(&app.buf)?;
        client.out.extend_from_slice(&app.buf[..n]);
        super::consume(&mut app.buf, n);
        done = complete;
    }
    let mark_last = |done: bool| {
        if let Some(act) = last.filter(|_| done) {
            act.closing_after_write.store(true, Ordering::Relaxed);
        }
    };
    mark_last(done);
    client.io.write_all(&client.out).await.map_err(|_| ())?;
    let Some(body) = left.as_mut() else {
        return Ok(());
    };
    while !done {
        app.buf.reserve(READ_CHUNK);
        match app.io.read_buf(&mut app.buf).await {
            Ok(0) if matches!(body, RespLeft::Close) => return Ok(()),
            Ok(0) | Err(_) => return Err(()),
            Ok(_) => {}
        }
        let (n, complete) = body.take(&app.buf)?;
        mark_last(complete);
        client.io.write_all(&app.buf[..n]).await.map_err(|_| ())?;
        super::consume(&mut app.buf, n);
        done = complete;
    }
    Ok(())
}

enum RespLeft {
    Length(u64),
    Chunked(ChunkFramer),
    Close,
}

impl RespLeft {
    fn take(&mut self, data: &[u8]) -> Result<(usize, bool), ()> {
        match self {
            RespLeft::Length(left) => {
                let n = (data.len() as u64).min(*left);
                *left -= n;
                Ok((n as usize, *left == 0))
            }
            RespLeft::Chunked(framer) => {
                let n = framer.feed(data).map_err(|_| ())?;
                Ok((n, framer.is_done()))
            }
            RespLeft::Close => Ok((data.len(), false)),
        }
    }
}

/// The answer to a head the proxy refuses, as hyper gives it: a bare
/// status, then the connection closes.
async fn refuse<T>(client: &mut Client<T>, refusal: Refusal) -> Next
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    let status = match refusal {
        Refusal::BadRequest => StatusCode::BAD_REQUEST,
        Refusal::UriTooLong => StatusCode::URI_TOO_LONG,
        Refusal::TooLarge => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
    };
    tracing::debug!(%status, "refused a request head");
    client.out.clear();
    write_status_line(&mut client.out, status);
    client
        .out
        .extend_from_slice(b"connection: close\r\ncontent-length: 0\r\n\r\n");
    let _ = client.io.write_all(&client.out).await;
    Next::Linger
}

/// Writes an answer the proxy made itself, framed as `framing` says (the
/// status already replaced for `LocalFraming::Refused`), to `out`.
pub(super) fn write_local(
    out: &mut Vec<u8>,
    parts: &http::response::Parts,
    body: &[u8],
    framing: LocalFraming,
    close: bool,
) {
    out.clear();
    write_status_line(out, parts.status);
    for (name, value) in &parts.headers {
        if name == http::header::CONNECTION || name == http::header::CONTENT_LENGTH {
            continue;
        }
        head::put_header(out, name.as_str().as_bytes(), value.as_bytes());
    }
    match framing {
        LocalFraming::Body | LocalFraming::HeadersOnly => {
            head::put_header(out, b"content-length", body.len().to_string().as_bytes());
        }
        LocalFraming::Refused => head::put_header(out, b"content-length", b"0"),
        LocalFraming::Bare => {}
    }
    if close {
        head::put_header(out, b"connection", b"close");
    }
    out.extend_from_slice(b"\r\n");
    if framing == LocalFraming::Body {
        out.extend_from_slice(body);
    }
}

fn write_status_line(out: &mut Vec<u8>, status: StatusCode) {
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// One request's accounting and circuit permit (handler.rs's
/// `RequestScope`, counted by the same `ConnCtx::request_started` and
/// `request_ended`): a request dropped before its answer (client gone,
/// drain deadline) drops its permit (which records `Cancelled`) and ends
/// its accounting here.
struct Scope<'c> {
    /// Borrowed: a clone would be two locked instructions per request.
    ctx: &'c ConnCtx,
    /// The route that matched, for the response's `route` label.
    route: &'c Route,
    started: Instant,
    permit: Option<Permit>,
    /// The request is a `HEAD`: the answer has no body.
    head_request: bool,
}

impl<'c> Scope<'c> {
    fn start(ctx: &'c ConnCtx, route: &'c Route, head_request: bool) -> Scope<'c> {
        Scope {
            ctx,
            route,
            started: ctx.request_started(),
            permit: None,
            head_request,
        }
    }

    fn record(&mut self, outcome: UpstreamOutcome) -> Option<Permit> {
        let mut permit = self.permit.take()?;
        permit.record(outcome);
        Some(permit)
    }

    /// The answer to a request whose app exchange failed, as handler.rs
    /// gives it.
    async fn failed<T>(
        mut self,
        client: &mut Client<T>,
        ctl: &Control,
        failure: Failure,
        upstream: &Upstream,
    ) -> Next
    where
        T: AsyncRead + AsyncWrite + Unpin,
    {
        let metrics = &self.ctx.shared.metrics;
        match failure {
            Failure::Client(fault) => self.client_fault(client, ctl, fault).await,
            Failure::TimedOut(body_read) => {
                metrics.upstream_timeout();
                let permit = self.record(UpstreamOutcome::Timeout);
                let resp = local_response(StatusCode::GATEWAY_TIMEOUT, "upstream timed out\n");
                // With part of the body unread the connection cannot go on.
                self.answer(client, ctl, resp, permit, !body_read).await
            }
            Failure::Connect(err, body_read) => {
                // Nothing was sent: the connection goes on if nothing of
                // the request is left unread.
                let close = !body_read;
                // The app is restarting and did not come back within the
                // hold (app.rs): 503 + Retry-After, no breaker failure.
                if let Some(resp) = crate::app::hold_expired_response(&err) {
                    let permit = self.record(UpstreamOutcome::Cancelled);
                    return self.answer(client, ctl, resp, permit, close).await;
                }
                metrics.upstream_error();
                tracing::debug!(error = %err, endpoint = %upstream.endpoint(), "upstream request failed");
                let permit = self.record(UpstreamOutcome::ConnectError);
                let resp = local_response(StatusCode::BAD_GATEWAY, "upstream unavailable\n");
                self.answer(client, ctl, resp, permit, close).await
            }
            Failure::Lost(why) => {
                metrics.upstream_error();
                tracing::debug!(error = %why, "upstream request failed");
                let permit = self.record(UpstreamOutcome::ConnectError);
                let resp = local_response(StatusCode::BAD_GATEWAY, "upstream unavailable\n");
                self.answer(client, ctl, resp, permit, true).await
            }
        }
    }

    /// A request body that failed on the client's side: the client's
    /// fault, never the app's; the connection closes after the answer.
    async fn client_fault<T>(
        mut self,
        client: &mut Client<T>,
        ctl: &Control,
        fault: BodyFault,
    ) -> Next
    where
        T: AsyncRead + AsyncWrite + Unpin,
    {
        let resp = client_fault_response(&self.ctx.shared.metrics, fault);
        let permit = self.record(UpstreamOutcome::ClientFault);
        self.answer(client, ctl, resp, permit, true).await
    }

    /// Writes an answer the proxy made itself; the request ends with it.
    async fn answer<T>(
        self,
        client: &mut Client<T>,
        ctl: &Control,
        resp: Response<Full<Bytes>>,
        permit: Option<Permit>,
        close: bool,
    ) -> Next
    where
        T: AsyncRead + AsyncWrite + Unpin,
    {
        let ctx = &self.ctx;
        let framing = LocalFraming::of(resp.status(), self.head_request);
        let (mut parts, body) = resp.into_parts();
        if framing == LocalFraming::Refused {
            parts.status = StatusCode::BAD_GATEWAY;
            parts.headers.clear();
        }
        ctx.shared.metrics.response(parts.status, Some(self.route));
        let close = close
            || framing == LocalFraming::Refused
            || ctl.ending().is_some()
            || ctx.shared.drain.phase() != Phase::Serving;
        let body = match body.collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(never) => match never {},
        };
        write_local(&mut client.out, &parts, &body, framing, close);
        let written = client.io.write_all(&client.out).await;
        drop(permit);
        drop(self);
        match (written, close) {
            (Err(_), _) => Next::Abort,
            // Part of the request may still be on its way.
            (Ok(()), true) => Next::Linger,
            (Ok(()), false) => Next::KeepAlive,
        }
    }
}

impl Drop for Scope<'_> {
    fn drop(&mut self) {
        // The permit goes before the accounting ends; its own `Drop`
        // records `Cancelled` if no outcome was.
        self.permit = None;
        self.ctx.request_ended(self.started);
    }
}
