//! kubegrace-demo-app: a small, deliberately naive app for the e2e tests and the demo.
//!
//! One port serves HTTP/1.1 and HTTP/2 cleartext (prior knowledge), gRPC and WebSocket:
//! - `GET /`                   200, `pod=<name>` (pod name from `POD_NAME`, else the host name)
//! - `GET /delay?ms=N`         answers after N milliseconds
//! - `GET /stream?chunks=N&every_ms=M`  a streamed body: N lines `pod=<name> chunk=<i>`,
//!   the first at once, then one every M ms (a long in-flight HTTP response)
//! - `GET|POST /api/<anything>` 200 `pod=<name> path=<path>` (a route to put a breaker on)
//! - `GET /ws`                 WebSocket echo (RFC 6455, via tungstenite): every text or
//!   binary message is sent back; the 101 answer names the pod in `x-demo-pod`
//! - gRPC `kubegrace.demo.Echo` (`Unary`, `Stream`; see `kubegrace_e2e::load::grpc`)
//! - `POST /fault?status=503[&path=/api]` the fault switch of this pod: from now on every
//!   request to an app endpoint (under `path`, if given) gets `status` (gRPC calls get
//!   `UNAVAILABLE`); `POST /fault?off` switches it off; `GET /fault` shows it. The
//!   control endpoints (`/fault`, `/stats`, `/healthz`, `/livez`, `/liveness`, `/prestop*`)
//!   never fault, so probes
//!   and tests keep working.
//! - `GET /stats`              JSON: per endpoint, requests seen and requests in flight
//!   (`{"pod":..,"fault":..,"endpoints":{"/api":{"requests":3,"inflight":0},..}}`), so a
//!   test can see what reached the app
//! - `GET /prestop[?hold_ms=N]` records that the preStop hook ran, answers after N ms
//! - `GET /prestop-seen`       200 `true` once `/prestop` was called, else 200 `false`
//! - `GET /healthz`            200
//! - `GET /livez`              200, or 500 once `POST /liveness?fail` was called: the
//!   liveness path of a pod whose app should be restarted by kubelet (a deadlocked health
//!   checker: every other endpoint keeps serving); `POST /liveness?ok` heals it. A new
//!   process (the restarted container) starts healthy
//!
//! Like a naive app it exits at once on SIGTERM (in-flight requests, streams and WebSocket
//! sessions are cut), unless `--on-sigterm ignore` is given, in which case only the
//! grace-period SIGKILL stops it. Lifecycle events are logged to stdout (`prestop hook
//! ran`, `SIGTERM received`).
//!
//! `kubegrace-demo-app get http://IP:PORT/PATH` is a one-shot client for probes from inside
//! a cluster (the image has no shell or curl): it retries until a 2xx answer or `--timeout`,
//! prints the body and exits 0, else exits 1.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use clap::{Parser, Subcommand, ValueEnum};
use futures_util::{SinkExt, StreamExt};
use http_body::Frame;
use http_body_util::{BodyExt, Empty, Full, StreamBody};
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use kubegrace_e2e::load::grpc::{self, EchoServer};
use tokio::net::TcpListener;
use tokio::signal::unix::{SignalKind, signal};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;
use tonic::codegen::Service as _;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum OnSigterm {
    /// Exit immediately (status 0), like most apps that do nothing special.
    Exit,
    /// Log the signal and keep serving until SIGKILL.
    Ignore,
}

#[derive(Debug, Parser)]
#[command(
    version,
    about = "Naive demo app (HTTP/1.1, h2c, gRPC, WebSocket) for kubegrace tests"
)]
struct Args {
    /// Address to listen on.
    #[arg(long, env = "KUBEGRACE_DEMO_LISTEN", default_value = "0.0.0.0:8080")]
    listen: SocketAddr,
    /// What to do on SIGTERM.
    #[arg(
        long,
        env = "KUBEGRACE_DEMO_ON_SIGTERM",
        value_enum,
        default_value = "exit"
    )]
    on_sigterm: OnSigterm,
    /// Name reported by `GET /` (defaults to the host name, which is the pod name).
    #[arg(long, env = "POD_NAME")]
    pod_name: Option<String>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// One-shot HTTP/1.1 GET (plain http, IP or /etc/hosts name): retry until 2xx, print the body.
    Get {
        /// e.g. http://10.96.0.12:80/
        url: hyper::Uri,
        /// Give up after this many seconds.
        #[arg(long, default_value_t = 30)]
        timeout: u64,
    },
}

/// The fault switch: requests to app endpoints under `path_prefix` get `status`.
#[derive(Clone, Debug)]
struct Fault {
    status: StatusCode,
    path_prefix: String,
}

/// Requests seen and in flight for one endpoint.
#[derive(Clone, Copy, Debug, Default)]
struct EndpointStats {
    requests: u64,
    inflight: u64,
}

struct State {
    pod_name: String,
    prestop_seen: AtomicBool,
    /// `POST /liveness?fail` was called: `/livez` answers 500.
    liveness_failing: AtomicBool,
    fault: Mutex<Option<Fault>>,
    /// Keyed by endpoint (`/api`, `/delay`, `grpc /kubegrace.demo.Echo/Stream`, ...), never by
    /// the raw path, so arbitrary paths cannot grow the map.
    stats: Mutex<BTreeMap<&'static str, EndpointStats>>,
    echo: EchoServer,
}

/// A poisoned lock only means a handler panicked mid-update of plain counters; they are
/// still usable.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl State {
    /// Counts a request to `endpoint`; it stays in flight until the guard drops (for
    /// streamed answers, when the body ends or the connection is cut).
    fn track(self: &Arc<Self>, endpoint: &'static str) -> InflightGuard {
        let mut stats = lock(&self.stats);
        let e = stats.entry(endpoint).or_default();
        e.requests += 1;
        e.inflight += 1;
        InflightGuard {
            state: self.clone(),
            endpoint,
        }
    }

    fn fault_for(&self, path: &str) -> Option<StatusCode> {
        lock(&self.fault)
            .as_ref()
            .filter(|f| path.starts_with(&f.path_prefix))
            .map(|f| f.status)
    }
}

struct InflightGuard {
    state: Arc<State>,
    endpoint: &'static str,
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        if let Some(e) = lock(&self.state.stats).get_mut(self.endpoint) {
            e.inflight = e.inflight.saturating_sub(1);
        }
    }
}

/// A response body that keeps its request counted as in flight until it is done.
struct Tracked {
    body: tonic::body::Body,
    _guard: InflightGuard,
}

impl http_body::Body for Tracked {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

type Body = tonic::body::Body;

const MAX_DELAY_MS: u64 = 600_000;
const MAX_CHUNKS: u64 = 100_000;

/// The value of `key` in the query string: `None` when absent, `Some("")` for a bare `key`.
fn query_value<'a>(req: &'a Request<Incoming>, key: &str) -> Option<&'a str> {
    req.uri().query()?.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (k == key).then_some(v)
    })
}

/// A number of milliseconds (or a count) from the query, 0 when absent, at most `max`.
fn query_num(req: &Request<Incoming>, key: &str, max: u64) -> Result<u64, String> {
    match query_value(req, key) {
        None => Ok(0),
        Some(v) => v
            .parse::<u64>()
            .map(|n| n.min(max))
            .map_err(|_| format!("{key} must be a non-negative integer, got {v:?}")),
    }
}

fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Body> {
    let mut resp = Response::new(Body::new(Full::new(body.into())));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

fn json(status: StatusCode, value: &serde_json::Value) -> Response<Body> {
    let mut resp = text(status, format!("{value}\n"));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

fn with_guard(resp: Response<Body>, guard: InflightGuard) -> Response<Body> {
    resp.map(|body| {
        Body::new(Tracked {
            body,
            _guard: guard,
        })
    })
}

/// The endpoint a path belongs to (the key of `/stats`), or `None` for an unknown path.
fn endpoint_of(path: &str) -> Option<&'static str> {
    Some(match path {
        "/" => "/",
        "/delay" => "/delay",
        "/stream" => "/stream",
        "/ws" => "/ws",
        p if p == "/api" || p.starts_with("/api/") => "/api",
        _ => return None,
    })
}

async fn handle(state: Arc<State>, req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    if grpc::is_grpc(&req) {
        return Ok(handle_grpc(state, req).await);
    }
    let path = req.uri().path().to_owned();
    // Control endpoints: never counted as app traffic, never faulted.
    match path.as_str() {
        "/healthz" => return Ok(only_get(&req).unwrap_or_else(|| text(StatusCode::OK, "ok\n"))),
        "/stats" => return Ok(only_get(&req).unwrap_or_else(|| stats(&state))),
        "/livez" => {
            return Ok(only_get(&req).unwrap_or_else(|| {
                if state.liveness_failing.load(Ordering::SeqCst) {
                    text(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "liveness failing (POST /liveness?fail)\n",
                    )
                } else {
                    text(StatusCode::OK, "live\n")
                }
            }));
        }
        "/liveness" => return Ok(liveness(&state, &req)),
        "/fault" => return Ok(fault(&state, &req)),
        "/prestop" => {
            return Ok(match only_get(&req) {
                Some(denied) => denied,
                None => prestop(&state, &req).await,
            });
        }
        "/prestop-seen" => {
            return Ok(only_get(&req).unwrap_or_else(|| {
                text(
                    StatusCode::OK,
                    format!("{}\n", state.prestop_seen.load(Ordering::SeqCst)),
                )
            }));
        }
        _ => {}
    }
    let Some(endpoint) = endpoint_of(&path) else {
        return Ok(text(StatusCode::NOT_FOUND, "not found\n"));
    };
    let guard = state.track(endpoint);
    if let Some(status) = state.fault_for(&path) {
        return Ok(with_guard(
            text(
                status,
                format!("pod={} fault={}\n", state.pod_name, status.as_u16()),
            ),
            guard,
        ));
    }
    let allowed = match endpoint {
        "/api" => matches!(*req.method(), Method::GET | Method::HEAD | Method::POST),
        _ => matches!(*req.method(), Method::GET | Method::HEAD),
    };
    if !allowed {
        return Ok(with_guard(
            text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n"),
            guard,
        ));
    }
    let resp = match endpoint {
        "/" => text(StatusCode::OK, format!("pod={}\n", state.pod_name)),
        "/api" => text(
            StatusCode::OK,
            format!("pod={} path={path}\n", state.pod_name),
        ),
        "/delay" => match query_num(&req, "ms", MAX_DELAY_MS) {
            Ok(ms) => {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                text(
                    StatusCode::OK,
                    format!("pod={} delayed_ms={ms}\n", state.pod_name),
                )
            }
            Err(e) => text(StatusCode::BAD_REQUEST, e + "\n"),
        },
        "/stream" => stream(&state, &req),
        "/ws" => websocket(&state, req),
        _ => text(StatusCode::NOT_FOUND, "not found\n"),
    };
    Ok(with_guard(resp, guard))
}

/// `Some(405)` unless the request is a GET or HEAD.
fn only_get(req: &Request<Incoming>) -> Option<Response<Body>> {
    (!matches!(*req.method(), Method::GET | Method::HEAD))
        .then(|| text(StatusCode::METHOD_NOT_ALLOWED, "only GET\n"))
}

async fn prestop(state: &State, req: &Request<Incoming>) -> Response<Body> {
    match query_num(req, "hold_ms", MAX_DELAY_MS) {
        Ok(ms) => {
            state.prestop_seen.store(true, Ordering::SeqCst);
            println!("prestop hook ran (holding {ms} ms)");
            // The kubelet's hook ends with the response headers, so the hold comes first.
            tokio::time::sleep(Duration::from_millis(ms)).await;
            text(StatusCode::OK, "prestop recorded\n")
        }
        Err(e) => text(StatusCode::BAD_REQUEST, e + "\n"),
    }
}

/// `POST /liveness?fail` makes `/livez` fail (kubelet then restarts the container);
/// `POST /liveness?ok` heals it.
fn liveness(state: &State, req: &Request<Incoming>) -> Response<Body> {
    if *req.method() != Method::POST {
        return text(
            StatusCode::METHOD_NOT_ALLOWED,
            "POST /liveness?fail or POST /liveness?ok\n",
        );
    }
    let fail = match (query_value(req, "fail"), query_value(req, "ok")) {
        (Some(_), None) => true,
        (None, Some(_)) => false,
        _ => {
            return text(
                StatusCode::BAD_REQUEST,
                "POST /liveness?fail or POST /liveness?ok\n",
            );
        }
    };
    state.liveness_failing.store(fail, Ordering::SeqCst);
    let msg = if fail {
        "liveness now fails: /livez answers 500\n"
    } else {
        "liveness healed: /livez answers 200\n"
    };
    print!("{msg}");
    text(StatusCode::OK, msg)
}

fn stats(state: &State) -> Response<Body> {
    let endpoints: serde_json::Map<String, serde_json::Value> = lock(&state.stats)
        .iter()
        .map(|(k, v)| {
            (
                (*k).to_owned(),
                serde_json::json!({"requests": v.requests, "inflight": v.inflight}),
            )
        })
        .collect();
    let fault = lock(&state.fault)
        .as_ref()
        .map(|f| serde_json::json!({"status": f.status.as_u16(), "path": f.path_prefix}));
    json(
        StatusCode::OK,
        &serde_json::json!({"pod": state.pod_name, "fault": fault, "endpoints": endpoints}),
    )
}

fn fault(state: &State, req: &Request<Incoming>) -> Response<Body> {
    let show = |f: &Option<Fault>| match f {
        Some(f) => format!(
            "fault on: status {} for paths under {}\n",
            f.status.as_u16(),
            f.path_prefix
        ),
        None => "fault off\n".to_owned(),
    };
    match *req.method() {
        Method::GET | Method::HEAD => return text(StatusCode::OK, show(&lock(&state.fault))),
        Method::POST => {}
        _ => return text(StatusCode::METHOD_NOT_ALLOWED, "GET or POST /fault\n"),
    }
    if query_value(req, "off").is_some() {
        *lock(&state.fault) = None;
        println!("fault switched off");
        return text(StatusCode::OK, "fault off\n");
    }
    let status = match query_value(req, "status").map(str::parse::<u16>) {
        Some(Ok(code)) if (400..=599).contains(&code) => StatusCode::from_u16(code),
        _ => {
            return text(
                StatusCode::BAD_REQUEST,
                "POST /fault?status=<400..599>[&path=/prefix] or POST /fault?off\n",
            );
        }
    };
    let Ok(status) = status else {
        return text(StatusCode::BAD_REQUEST, "not an HTTP status\n");
    };
    let path_prefix = query_value(req, "path").unwrap_or("/");
    if !path_prefix.starts_with('/') {
        return text(StatusCode::BAD_REQUEST, "path must start with /\n");
    }
    let f = Fault {
        status,
        path_prefix: path_prefix.to_owned(),
    };
    let mut current = lock(&state.fault);
    *current = Some(f);
    let msg = show(&current);
    print!("{msg}");
    text(StatusCode::OK, msg)
}

fn stream(state: &Arc<State>, req: &Request<Incoming>) -> Response<Body> {
    let (chunks, every_ms) = match (
        query_num(req, "chunks", MAX_CHUNKS),
        query_num(req, "every_ms", MAX_DELAY_MS),
    ) {
        (Ok(c), Ok(e)) => (c.max(1), e),
        (Err(e), _) | (_, Err(e)) => return text(StatusCode::BAD_REQUEST, e + "\n"),
    };
    let pod = state.pod_name.clone();
    let body = futures_util::stream::iter(0..chunks).then(move |i| {
        let line = format!("pod={pod} chunk={i}\n");
        async move {
            if i > 0 {
                tokio::time::sleep(Duration::from_millis(every_ms)).await;
            }
            Ok::<_, tonic::Status>(Frame::data(Bytes::from(line)))
        }
    });
    let mut resp = Response::new(Body::new(StreamBody::new(body)));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

/// Answers the WebSocket handshake (RFC 6455 4.2) and echoes messages on the upgraded
/// connection until the client closes it.
fn websocket(state: &Arc<State>, mut req: Request<Incoming>) -> Response<Body> {
    let header_has = |name: header::HeaderName, token: &str| {
        req.headers().get_all(name).iter().any(|v| {
            v.to_str()
                .is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
        })
    };
    if !header_has(header::UPGRADE, "websocket") || !header_has(header::CONNECTION, "upgrade") {
        return text(
            StatusCode::BAD_REQUEST,
            "/ws needs a WebSocket upgrade (Connection: Upgrade, Upgrade: websocket)\n",
        );
    }
    if req
        .headers()
        .get(header::SEC_WEBSOCKET_VERSION)
        .map(|v| v.as_bytes())
        != Some(b"13")
    {
        let mut resp = text(
            StatusCode::BAD_REQUEST,
            "Sec-WebSocket-Version must be 13\n",
        );
        resp.headers_mut().insert(
            header::SEC_WEBSOCKET_VERSION,
            HeaderValue::from_static("13"),
        );
        return resp;
    }
    let Some(key) = req.headers().get(header::SEC_WEBSOCKET_KEY).cloned() else {
        return text(StatusCode::BAD_REQUEST, "missing Sec-WebSocket-Key\n");
    };
    let accept = derive_accept_key(key.as_bytes());
    let on_upgrade = hyper::upgrade::on(&mut req);
    // The session counts as in flight (`/ws`) for as long as it lasts.
    let session = state.track("/ws");
    tokio::spawn(async move {
        let _session = session;
        let upgraded = match on_upgrade.await {
            Ok(u) => u,
            Err(e) => {
                eprintln!("websocket upgrade failed: {e}");
                return;
            }
        };
        let mut ws =
            WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await;
        while let Some(msg) = ws.next().await {
            let reply = match msg {
                Ok(m @ (Message::Text(_) | Message::Binary(_))) => m,
                // tungstenite answers pings and the closing handshake itself.
                Ok(_) => continue,
                Err(e) => {
                    eprintln!("websocket session ended: {e}");
                    return;
                }
            };
            if let Err(e) = ws.send(reply).await {
                eprintln!("websocket send failed: {e}");
                return;
            }
        }
    });
    let mut resp = Response::new(Body::empty());
    *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = resp.headers_mut();
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    if let Ok(accept) = HeaderValue::from_str(&accept) {
        h.insert(header::SEC_WEBSOCKET_ACCEPT, accept);
    }
    if let Ok(pod) = HeaderValue::from_str(&state.pod_name) {
        h.insert("x-demo-pod", pod);
    }
    resp
}

async fn handle_grpc(state: Arc<State>, req: Request<Incoming>) -> Response<Body> {
    let endpoint = match req.uri().path() {
        grpc::UNARY_PATH => "grpc /kubegrace.demo.Echo/Unary",
        grpc::STREAM_PATH => "grpc /kubegrace.demo.Echo/Stream",
        _ => "grpc (unknown method)",
    };
    let guard = state.track(endpoint);
    if state.fault_for(req.uri().path()).is_some() {
        let status = tonic::Status::unavailable(format!("pod={} fault switch on", state.pod_name));
        return with_guard(status.into_http(), guard);
    }
    let mut echo = state.echo.clone();
    match echo.call(req).await {
        Ok(resp) => with_guard(resp, guard),
        Err(never) => match never {},
    }
}

async fn serve(listener: TcpListener, state: Arc<State>) {
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(conn) => conn,
            Err(e) => {
                eprintln!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let state = state.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| handle(state.clone(), req));
            // HTTP/1.1 (with upgrades, for WebSocket) and HTTP/2 prior knowledge on one port.
            if let Err(e) = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection_with_upgrades(TokioIo::new(stream), service)
                .await
            {
                eprintln!("connection error: {e}");
            }
        });
    }
}

async fn get_once(url: &hyper::Uri) -> anyhow::Result<(StatusCode, Bytes)> {
    let authority = url
        .authority()
        .ok_or_else(|| anyhow::anyhow!("URL needs host:port"))?;
    anyhow::ensure!(url.scheme_str() == Some("http"), "only http:// URLs");
    let addr = format!(
        "{}:{}",
        authority.host(),
        authority.port_u16().unwrap_or(80)
    );
    let stream = tokio::net::TcpStream::connect(&addr).await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let path = url.path_and_query().map_or("/", |p| p.as_str());
    let req = Request::get(path)
        .header(header::HOST, authority.as_str())
        .body(Empty::<Bytes>::new())?;
    let resp = sender.send_request(req).await?;
    let status = resp.status();
    Ok((status, resp.into_body().collect().await?.to_bytes()))
}

async fn get(url: hyper::Uri, timeout: u64) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(timeout);
    loop {
        let attempt = tokio::time::timeout(Duration::from_secs(5), get_once(&url)).await;
        let failure = match attempt {
            Ok(Ok((status, body))) if status.is_success() => {
                print!("{}", String::from_utf8_lossy(&body));
                return Ok(());
            }
            Ok(Ok((status, _))) => format!("status {status}"),
            Ok(Err(e)) => e.to_string(),
            Err(_) => "no answer within 5s".to_owned(),
        };
        if tokio::time::Instant::now() >= deadline {
            anyhow::bail!("GET {url} failed for {timeout}s, last: {failure}");
        }
        eprintln!("GET {url}: {failure}; retrying");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(Command::Get { url, timeout }) = args.command {
        return get(url, timeout).await;
    }
    let pod_name = args
        .pod_name
        .filter(|n| !n.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".to_owned());
    let state = Arc::new(State {
        echo: EchoServer::new(pod_name.clone()),
        pod_name,
        prestop_seen: AtomicBool::new(false),
        liveness_failing: AtomicBool::new(false),
        fault: Mutex::new(None),
        stats: Mutex::new(BTreeMap::new()),
    });
    let listener = TcpListener::bind(args.listen).await?;
    println!(
        "kubegrace-demo-app listening on {} as {}",
        listener.local_addr()?,
        state.pod_name
    );

    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigint = signal(SignalKind::interrupt())?;
    let server = tokio::spawn(serve(listener, state));
    loop {
        tokio::select! {
            _ = sigterm.recv() => {
                println!("SIGTERM received");
                if args.on_sigterm == OnSigterm::Exit {
                    break;
                }
                println!("ignoring SIGTERM (--on-sigterm ignore)");
            }
            _ = sigint.recv() => {
                println!("SIGINT received");
                break;
            }
        }
    }
    server.abort();
    println!("exiting");
    // Like a naive app: whatever is still in flight is cut by the process exit.
    std::process::exit(0);
}
