//! The admin port: probes, the drain trigger, metrics and the config in
//! force. It keeps answering until the process exits, drain or not: the
//! kubelet's probes and the app's preStop hook both depend on it.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use kubegrace_sidecar_api::admin::{TOKEN_HEADER, path};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

use crate::app_readiness::AppReadinessCheck;
use crate::config::DrainReadiness;
use crate::drain::Phase;
use crate::state::Shared;

/// How often the background check connects to an app that is up. While
/// it is down (or not seen yet) it connects every `app::FAST_PROBE`
/// (50 ms), so a starting app turns the pod ready within a blink of
/// listening, without any `/ready` waiting for it.
const READY_CACHE: Duration = Duration::from_secs(1);

/// What the background check last saw of the app's port.
const NOT_CHECKED: u8 = 0;
const REACHABLE: u8 = 1;
const UNREACHABLE: u8 = 2;

/// What `GET /config` shows instead of a value that may be secret.
pub(crate) const REDACTED: &str = "<redacted>";

pub(crate) struct Admin {
    shared: Arc<Shared>,
    token: Option<String>,
    /// The last background connect to the app: [`NOT_CHECKED`],
    /// [`REACHABLE`] or [`UNREACHABLE`]. `/ready` reads it and never
    /// connects itself, so probes never wait on the app.
    reachable: AtomicU8,
    /// The app's own readiness check (`appReadiness`), run in the
    /// background; `/ready` reads its verdict.
    app_check: Arc<AppReadinessCheck>,
    /// `/drain?wait=true` callers whose connection has not finished yet.
    /// The process waits for them before exiting, or a preStop hook racing
    /// SIGTERM would lose its answer.
    waiters: AtomicUsize,
    waiters_done: Notify,
    /// Admin connections open now, against `limits.adminMaxConnections`.
    open: Arc<AtomicUsize>,
}

/// How an admin connection is served.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Full,
    /// Past `limits.adminMaxConnections`: one request, a short header
    /// timeout, and only what the kubelet needs (probes, the preStop drain).
    ProbesOnly,
}

/// Decrements the open admin connection count however the task ends.
struct OpenSlot(Arc<AtomicUsize>);

impl Drop for OpenSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Admin {
    pub(crate) fn new(shared: Arc<Shared>, token: Option<String>) -> Arc<Admin> {
        Arc::new(Admin {
            shared,
            token,
            reachable: AtomicU8::new(NOT_CHECKED),
            app_check: Arc::new(AppReadinessCheck::default()),
            waiters: AtomicUsize::new(0),
            waiters_done: Notify::new(),
            open: Arc::new(AtomicUsize::new(0)),
        })
    }

    /// Serves admin connections until the process exits, and keeps the
    /// state `/ready` answers from current in the background.
    pub(crate) async fn serve(self: Arc<Self>, listener: TcpListener) {
        tokio::spawn(self.clone().keep_reachability());
        let check = self.app_check.clone();
        let shared = self.shared.clone();
        tokio::spawn(async move {
            check
                .run(|| shared.live.load().config.app_readiness.clone())
                .await;
        });
        loop {
            match listener.accept().await {
                Ok((stream, _peer)) => {
                    let cap = self.shared.live.load().config.limits.admin_max_connections;
                    let slot = OpenSlot(self.open.clone());
                    let mode = if self.open.fetch_add(1, Ordering::AcqRel) >= cap {
                        self.shared.metrics.connection_refused(ADMIN_LISTENER);
                        Mode::ProbesOnly
                    } else {
                        Mode::Full
                    };
                    let admin = self.clone();
                    tokio::spawn(admin.serve_connection(stream, mode, slot));
                }
                Err(err) => {
                    tracing::warn!(error = %err, "admin accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    /// Resolves once every `/drain?wait=true` answer has been written and
    /// its connection closed (bounded by the caller).
    pub(crate) async fn settle(&self) {
        loop {
            let done = self.waiters_done.notified();
            tokio::pin!(done);
            done.as_mut().enable();
            if self.waiters.load(Ordering::Acquire) == 0 {
                return;
            }
            done.await;
        }
    }

    async fn serve_connection(self: Arc<Self>, stream: TcpStream, mode: Mode, _slot: OpenSlot) {
        let io = TokioIo::new(stream);
        // Drain waiters seen on this connection; released when it ends,
        // which is after their answer was flushed (they get Connection: close).
        let conn_waiters = Arc::new(AtomicUsize::new(0));
        let admin = self.clone();
        let counter = conn_waiters.clone();
        let service = service_fn(move |req| {
            let admin = admin.clone();
            let counter = counter.clone();
            async move { Ok::<_, Infallible>(admin.handle(req, &counter, mode).await) }
        });
        let (header_timeout, keep_alive) = match mode {
            Mode::Full => (Duration::from_secs(10), true),
            Mode::ProbesOnly => (Duration::from_secs(1), false),
        };
        let result = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(header_timeout)
            .keep_alive(keep_alive)
            .serve_connection(io, service)
            .await;
        if let Err(err) = result {
            tracing::debug!(error = %err, "admin connection ended with an error");
        }
        let mine = conn_waiters.load(Ordering::Acquire);
        if mine > 0 && self.waiters.fetch_sub(mine, Ordering::AcqRel) == mine {
            self.waiters_done.notify_waiters();
        }
    }

    async fn handle(
        &self,
        req: Request<Incoming>,
        conn_waiters: &AtomicUsize,
        mode: Mode,
    ) -> Response<Full<Bytes>> {
        let requested = req.uri().path();
        let query = req.uri().query().unwrap_or("");
        let method = req.method();
        let read_only = method == Method::GET || method == Method::HEAD;
        if mode == Mode::ProbesOnly {
            let probe = matches!(requested, path::LIVE | path::HEALTHZ | path::READY);
            // The preStop hook carries the token; without one configured
            // nothing is let through beyond the probes.
            let pre_stop = requested == path::DRAIN
                && self.token.is_some()
                && self.check_token(&req).is_none();
            if !probe && !pre_stop {
                let mut resp = text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "too many admin connections (limits.adminMaxConnections); only /live, /ready and /drain with the token are served\n",
                );
                resp.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                return resp;
            }
        }
        match requested {
            path::LIVE | path::HEALTHZ if read_only => text(StatusCode::OK, "live\n"),
            path::READY if read_only => self.ready(),
            path::METRICS if read_only => self.metrics(),
            path::CONFIG if read_only => self.config(query),
            path::BREAKERS if read_only => {
                let snapshot = self.shared.live.load().routes.snapshot();
                json(StatusCode::OK, &snapshot)
            }
            // Which app instance gets new requests, and what each still has
            // in flight (the app-upgrade recipe waits for 0 on the old one).
            path::UPSTREAMS if read_only => json(StatusCode::OK, &self.shared.upstreams.status()),
            path::DRAIN if read_only || method == Method::POST => {
                if let Some(denied) = self.check_token(&req).or_else(|| self.check_origin(&req)) {
                    return denied;
                }
                let wait = query_flag(query, "wait");
                if wait {
                    conn_waiters.fetch_add(1, Ordering::AcqRel);
                    self.waiters.fetch_add(1, Ordering::AcqRel);
                }
                self.drain(wait).await
            }
            path::DRAIN_ENDPOINT_REMOVED if method == Method::POST => {
                if let Some(denied) = self.check_token(&req).or_else(|| self.check_origin(&req)) {
                    return denied;
                }
                self.shared.drain.endpoint_removed();
                tracing::info!("operator reports the endpoint removed");
                text(StatusCode::ACCEPTED, "endpoint removal noted\n")
            }
            // Outside Kubernetes: hand the sockets to a new process (upgrade.rs).
            path::UPGRADE if method == Method::POST => {
                // Starting a binary is never open, loopback or not.
                if self.token.is_none() {
                    return text(
                        StatusCode::FORBIDDEN,
                        "POST /upgrade needs a drain token: start the sidecar with --drain-token (KUBEGRACE_DRAIN_TOKEN) and send it in X-Kubegrace-Drain-Token, or send SIGUSR2\n",
                    );
                }
                if let Some(denied) = self.check_token(&req) {
                    return denied;
                }
                let (status, body) = self.shared.upgrade.admin_upgrade().await;
                text(status, &body)
            }
            path::LIVE
            | path::HEALTHZ
            | path::READY
            | path::METRICS
            | path::CONFIG
            | path::BREAKERS
            | path::UPSTREAMS
            | path::DRAIN
            | path::DRAIN_ENDPOINT_REMOVED => {
                text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n")
            }
            _ => text(
                StatusCode::NOT_FOUND,
                "not found; try /live /ready /drain /metrics /config /breakers /upstreams\n",
            ),
        }
    }

    fn check_token(&self, req: &Request<Incoming>) -> Option<Response<Full<Bytes>>> {
        let expected = self.token.as_deref()?;
        match req.headers().get(TOKEN_HEADER) {
            None => Some(text(
                StatusCode::UNAUTHORIZED,
                "missing X-Kubegrace-Drain-Token\n",
            )),
            Some(given) if constant_time_eq(given.as_bytes(), expected.as_bytes()) => None,
            Some(_) => Some(text(
                StatusCode::FORBIDDEN,
                "wrong X-Kubegrace-Drain-Token\n",
            )),
        }
    }

    /// Without a token, a state-changing request must not come from a web
    /// page: a page cannot set the token header without a CORS preflight
    /// (which this port never grants), but it can make a browser send a
    /// plain GET or a form POST to 127.0.0.1. Browsers mark such requests
    /// (`Origin` on cross-origin POSTs, `Sec-Fetch-*` on every request to a
    /// loopback address), and a DNS-rebinding page arrives under its own
    /// host name; curl, the kubelet and scripts send none of that.
    fn check_origin(&self, req: &Request<Incoming>) -> Option<Response<Full<Bytes>>> {
        if self.token.is_some() {
            return None;
        }
        let headers = req.headers();
        let browser = headers.contains_key(header::ORIGIN)
            || headers.contains_key("sec-fetch-site")
            || headers.contains_key("sec-fetch-mode");
        // Every Host given must name an address (a repeated one too).
        let host_ok = headers
            .get_all(header::HOST)
            .iter()
            .all(|h| h.to_str().is_ok_and(host_is_address));
        if browser || !host_ok {
            return Some(text(
                StatusCode::FORBIDDEN,
                "refused: this looks like a browser request (Origin, Sec-Fetch-* or a host name in Host); configure a drain token (--drain-token) and send it in X-Kubegrace-Drain-Token\n",
            ));
        }
        None
    }

    fn ready(&self) -> Response<Full<Bytes>> {
        let drain = &self.shared.drain;
        // `drain.readiness: stayServing` keeps the endpoint serving (and
        // terminating) through the grace phase only, and only on the same
        // terms as when serving: the app must be reachable below. Once the
        // listener closes (`Closing`, `Drained`) a new connection is refused,
        // so a 200 would send routers to a pod that cannot serve. An app seen
        // gone since the trigger fails it too, for the rest of the drain: in
        // a provisional drain that is an app restart (the upstream is down,
        // the resume brings readiness back), in a termination the app is
        // leaving; either way a flapping app must not flap the endpoint.
        let serves = |phase: Phase| {
            phase == Phase::Serving
                || (phase == Phase::Draining
                    && drain.timers().readiness == DrainReadiness::StayServing
                    && !drain.app_seen_gone())
        };
        let phase = drain.phase();
        if !serves(phase) {
            return text(StatusCode::SERVICE_UNAVAILABLE, &format!("{phase}\n"));
        }
        // Everything below is state the background tasks keep current:
        // no connect, no check, no lock held across an await, so a probe is
        // answered at once whatever the app does.
        let probed = match self.reachable.load(Ordering::Acquire) {
            NOT_CHECKED => {
                return text(StatusCode::SERVICE_UNAVAILABLE, "app not checked yet\n");
            }
            seen => seen == REACHABLE,
        };
        // The app watch (app.rs) also sees every request's connect: it is
        // the fresher of the two.
        let reachable = match self.shared.upstreams.app() {
            Some(app) => !app.is_down(),
            None => probed,
        };
        if !reachable {
            return text(StatusCode::SERVICE_UNAVAILABLE, "app not reachable\n");
        }
        // The app's own readiness probe, moved here by the webhook: the pod
        // is Ready when the app passes it, without a second probe's ticker.
        if let Some(probe) = &self.shared.live.load().config.app_readiness {
            let (ready, last) = self.app_check.verdict();
            if !ready {
                let seen = last.map_or_else(|| "not checked yet".to_string(), |o| o.to_string());
                return text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    &format!(
                        "app not ready: GET {} on port {}: {seen}\n",
                        probe.path, probe.port
                    ),
                );
            }
        }
        if phase == Phase::Serving {
            text(StatusCode::OK, "ready\n")
        } else {
            text(
                StatusCode::OK,
                &format!("{phase}, still serving (drain.readiness: stayServing)\n"),
            )
        }
    }

    /// Connects to the app (TCP or Unix socket) for the life of the
    /// process: once a second while it is up, every 50 ms while it is not,
    /// and stores what it saw for `/ready`. With several app instances the
    /// instance probe already runs: reachable when any is up.
    async fn keep_reachability(self: Arc<Self>) {
        loop {
            let ok = if self.shared.upstreams.len() > 1 {
                self.shared.upstreams.any_up()
            } else {
                let timeout = self
                    .shared
                    .live
                    .load()
                    .config
                    .upstream_pool
                    .connect_timeout
                    .get()
                    .min(READY_CACHE);
                let ok =
                    crate::upstream::slots::probe(self.shared.upstreams.primary(), timeout).await;
                if let Some(app) = self.shared.upstreams.app() {
                    app.observe(ok);
                }
                ok
            };
            self.reachable
                .store(if ok { REACHABLE } else { UNREACHABLE }, Ordering::Release);
            let every = if ok {
                READY_CACHE
            } else {
                crate::app::FAST_PROBE
            };
            tokio::time::sleep(every).await;
        }
    }

    async fn drain(&self, wait: bool) -> Response<Full<Bytes>> {
        let drain = &self.shared.drain;
        if drain.trigger("admin /drain") {
            tracing::info!("drain requested on the admin port");
        }
        if !wait {
            return text(StatusCode::ACCEPTED, &format!("{}\n", drain.phase()));
        }
        // The preStop hook: answer once drained. The ceiling is the longest
        // a drain can take, plus the force-close grace.
        let ceiling = drain
            .timers()
            .worst_case()
            .saturating_add(Duration::from_secs(5));
        let mut resp = match tokio::time::timeout(ceiling, drain.drained()).await {
            Ok(report) => text(StatusCode::OK, &format!("{report}\n")),
            Err(_) => text(StatusCode::OK, "drain timeout passed\n"),
        };
        // The connection ends with this answer, which tells `settle` it left.
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        resp
    }

    fn metrics(&self) -> Response<Full<Bytes>> {
        let mut out = String::with_capacity(8 * 1024);
        self.shared.metrics.render(&self.shared.drain, &mut out);
        let live = self.shared.live.load();
        self.shared.metrics.render_requests(&live.routes, &mut out);
        live.routes.render_metrics(&mut out);
        self.shared.upstreams.render_metrics(&mut out);
        if let Some(app) = self.shared.upstreams.app() {
            app.render_metrics(&mut out);
        }
        let mut resp = Response::new(Full::new(Bytes::from(out)));
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(kubegrace_sidecar_api::exposition::CONTENT_TYPE),
        );
        resp
    }

    fn config(&self, query: &str) -> Response<Full<Bytes>> {
        let live = self.shared.live.load();
        let status = self.shared.status();
        let yaml = query_value(query, "format").is_some_and(|f| f.eq_ignore_ascii_case("yaml"));
        let mut config = serde_json::to_value(&live.config).unwrap_or_default();
        redact(&mut config);
        let body = serde_json::json!({
            "source": status,
            "config": config,
        });
        if yaml {
            match serde_norway::to_string(&body) {
                Ok(text) => {
                    let mut resp = Response::new(Full::new(Bytes::from(text)));
                    resp.headers_mut().insert(
                        header::CONTENT_TYPE,
                        HeaderValue::from_static("application/yaml"),
                    );
                    resp
                }
                Err(err) => self::text(StatusCode::INTERNAL_SERVER_ERROR, &format!("{err}\n")),
            }
        } else {
            json(StatusCode::OK, &body)
        }
    }
}

/// Hides what may be secret in a config shown by `GET /config`: the header
/// values of the app's readiness check (an `Authorization: Bearer` token is
/// their usual content). Always, token or not: `/config` is open to anyone
/// who can reach the admin port, and is for reading the shape of the
/// config in force; the values are in the pod spec or the ConfigMap for
/// those allowed to read them. (The drain token is never part of the
/// config.) Header names stay, so a reader sees which headers are sent.
fn redact(config: &mut serde_json::Value) {
    if let Some(headers) = config
        .pointer_mut("/appReadiness/headers")
        .and_then(serde_json::Value::as_array_mut)
    {
        for header in headers {
            if let Some(value) = header.get_mut("value") {
                *value = serde_json::Value::from(REDACTED);
            }
        }
    }
}

fn text(status: StatusCode, body: &str) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::copy_from_slice(body.as_bytes())));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

fn json(status: StatusCode, value: &serde_json::Value) -> Response<Full<Bytes>> {
    let body = serde_json::to_vec_pretty(value).unwrap_or_default();
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

fn query_value<'a>(query: &'a str, key: &str) -> Option<&'a str> {
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (k == key).then_some(v)
    })
}

/// `wait`, `wait=true`, `wait=1` and `wait=yes` all mean yes.
fn query_flag(query: &str, key: &str) -> bool {
    query_value(query, key)
        .is_some_and(|v| matches!(v.to_ascii_lowercase().as_str(), "" | "true" | "1" | "yes"))
}

/// The metric label of the admin listener.
const ADMIN_LISTENER: &str = "admin";

/// A `Host` that names an address (`127.0.0.1:15020`, `[::1]:15020`) or
/// `localhost`, not a DNS name a rebinding page could point here.
fn host_is_address(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(h, _)| h),
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::IpAddr>().is_ok()
}

/// Refuses to start with an admin port reachable from other machines and
/// no drain token: anyone who can reach it could take the pod out of
/// rotation. `--admin-insecure` says it is meant.
pub(crate) fn check_exposure(
    addr: SocketAddr,
    settings: &crate::cli::Settings,
) -> crate::Result<()> {
    if addr.ip().is_loopback() || settings.drain_token.is_some() {
        return Ok(());
    }
    if settings.admin_insecure {
        tracing::warn!(admin = %addr, "admin port exposed without a drain token (--admin-insecure): anyone who can reach it can drain this process");
        return Ok(());
    }
    Err(crate::Error::Config(crate::config::ConfigError::new(
        "admin",
        format!(
            "{addr} is not a loopback address and no drain token is set, so anyone who can reach it \
             could drain this process; set --drain-token (KUBEGRACE_DRAIN_TOKEN), bind the admin \
             port to 127.0.0.1, or pass --admin-insecure (KUBEGRACE_ADMIN_INSECURE=true) if this is intended"
        ),
    )))
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Binds the admin listener; the caller reports the bound address.
pub(crate) async fn bind(addr: SocketAddr) -> crate::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| crate::Error::Bind {
            what: "admin",
            addr: addr.to_string(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_flags() {
        assert!(query_flag("wait=true", "wait"));
        assert!(query_flag("a=b&wait", "wait"));
        assert!(!query_flag("wait=false", "wait"));
        assert!(!query_flag("", "wait"));
        assert_eq!(query_value("format=yaml", "format"), Some("yaml"));
    }

    #[test]
    fn hosts_that_name_an_address() {
        assert!(host_is_address("127.0.0.1:15020"));
        assert!(host_is_address("[::1]:15020"));
        assert!(host_is_address("localhost:15020"));
        assert!(host_is_address("10.1.2.3"));
        assert!(!host_is_address("evil.example:15020"));
        assert!(!host_is_address("localhost.evil.example"));
    }

    #[test]
    fn exposure_needs_a_token_or_the_explicit_flag() {
        let mut settings = crate::cli::Settings::default();
        let public: SocketAddr = "0.0.0.0:15020".parse().expect("addr");
        let err = check_exposure(public, &settings).expect_err("refused");
        assert_eq!(err.exit_code(), 64);
        assert!(err.to_string().contains("--admin-insecure"), "{err}");
        assert!(check_exposure("127.0.0.1:15020".parse().expect("addr"), &settings).is_ok());
        assert!(check_exposure("[::1]:15020".parse().expect("addr"), &settings).is_ok());
        settings.admin_insecure = true;
        assert!(check_exposure(public, &settings).is_ok());
        settings.admin_insecure = false;
        settings.drain_token = Some("t".into());
        assert!(check_exposure(public, &settings).is_ok());
    }

    #[test]
    fn token_compare() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
    }
}
