//! The one app behind the sidecar: a hyper server on loopback TCP or a Unix
//! socket that speaks HTTP/1.1, h2c (prior knowledge), gRPC and WebSocket,
//! so every test uses the same upstream and switches its behaviour.
//!
//! Routes:
//! - `GET /ready`: 200 while the app lives (the naive app's readiness probe).
//! - `GET /work?ms=N`: answers "ok <app>" after N ms (default 0).
//! - `GET /stream?chunks=N&ms=M`: a body of N chunks, M ms apart.
//! - `GET /big?bytes=N`: N bytes, as fast as the connection takes them;
//!   [`AppStats::big_cut`] counts answers whose connection went away first.
//! - `POST /upload`: reads the whole body, answers with its length.
//! - `/headers`: answers with the request headers the app received.
//! - `POST /kubegrace.test.Ticker/Ticks`: gRPC server streaming of
//!   [`Tick`](super::grpc::Tick)s; `POST /kubegrace.test.Echo/Unary`: the
//!   request frames back, `grpc-status` in the trailers.
//! - `GET /ws` with `Upgrade: websocket`: echoes every message.
//! - anything else: the capacity-limited app of the breaker tests, switched
//!   at run time through [`AppControl`] (failing paths, capacity, service
//!   time).
//!
//! Every answer says which app connection served it (`x-conn`) and the
//! Host, X-Forwarded-For and HTTP version the app saw (`x-seen-*`); every
//! request head is kept ([`TestApp::last_head`]).
//!
//! [`TestApp::kill`] is what a naive app does on SIGTERM: the listener and
//! every connection vanish at once, in-flight requests included.
//! [`TestApp::start_idle_closing`] is the same app written the way Node.js
//! is, closing a keep-alive connection after it sat idle.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use anyhow::{Context, Result};
use bytes::{BufMut, Bytes, BytesMut};
use futures_util::{SinkExt, StreamExt};
use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost::Message as _;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{Semaphore, mpsc};
use tokio::task::{AbortHandle, JoinHandle};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::Role;

use super::grpc::{Tick, TicksRequest};

pub type Body = BoxBody<Bytes, Infallible>;

/// What the app has seen; shared with the test.
#[derive(Debug, Default)]
pub struct AppStats {
    /// Requests that got a complete answer from the app.
    pub served: AtomicU64,
    /// Requests the app is working on right now.
    pub inflight: AtomicI64,
    /// Connections accepted.
    pub connections: AtomicU64,
    /// WebSocket messages echoed.
    pub ws_echoed: AtomicU64,
    /// The code of every WebSocket Close frame the app received (0: none).
    pub ws_close_codes: Mutex<Vec<u16>>,
    /// Keep-alive connections the app closed because they sat idle.
    pub idle_closed: AtomicU64,
    /// `/big` answers whose connection went away before the last byte.
    pub big_cut: AtomicU64,
    /// Every request head, lowercased: "get /path http/1.1\r\nname: value\r\n...".
    heads: Mutex<Vec<String>>,
    /// The connections that carried at least one request (a probe that
    /// connects and leaves is not one).
    used_connections: Mutex<std::collections::HashSet<u64>>,
}

/// The breaker tests' knobs, switchable while the app runs; they apply to
/// the paths that are not one of the named routes.
pub struct AppControl {
    /// Requests whose path starts with this fail with 500 (None: none).
    failing_prefix: Mutex<Option<String>>,
    /// How long a failing request takes before its 500: a sick app is
    /// often slow too, which is what makes a fast fallback worth having.
    pub fail_delay_ms: AtomicU64,
    /// How long a good request takes once it holds a capacity slot.
    pub service_ms: AtomicU64,
    /// Requests served at once; the rest wait inside the app (its accept
    /// queue, thread pool...), which is what makes latency grow.
    capacity: Arc<Semaphore>,
    capacity_now: AtomicU32,
    /// Requests that reached these paths, by first path segment and in total.
    pub received: AtomicU64,
    received_by_route: Mutex<HashMap<String, u64>>,
    /// Requests currently inside the app, and the most ever seen at once.
    pub inside: AtomicU32,
    pub peak_inside: AtomicU32,
}

/// Far more than any test sends at once: "no capacity limit".
const UNLIMITED: u32 = 100_000;

impl Default for AppControl {
    fn default() -> Self {
        Self {
            failing_prefix: Mutex::new(None),
            fail_delay_ms: AtomicU64::new(0),
            service_ms: AtomicU64::new(0),
            capacity: Arc::new(Semaphore::new(UNLIMITED as usize)),
            capacity_now: AtomicU32::new(UNLIMITED),
            received: AtomicU64::new(0),
            received_by_route: Mutex::new(HashMap::new()),
            inside: AtomicU32::new(0),
            peak_inside: AtomicU32::new(0),
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl AppControl {
    pub fn fail(&self, prefix: Option<&str>) {
        *lock(&self.failing_prefix) = prefix.map(str::to_string);
    }

    pub fn received_for(&self, first_segment: &str) -> u64 {
        lock(&self.received_by_route)
            .get(first_segment)
            .copied()
            .unwrap_or(0)
    }

    /// Changes how many requests the app serves at once. Lowering waits
    /// for running requests to hand their slots back (in the background).
    pub fn set_capacity(&self, capacity: u32) {
        let before = self.capacity_now.swap(capacity, Ordering::AcqRel);
        if capacity > before {
            self.capacity.add_permits((capacity - before) as usize);
        } else if capacity < before {
            let semaphore = self.capacity.clone();
            let take = before - capacity;
            tokio::spawn(async move {
                if let Ok(permits) = semaphore.acquire_many(take).await {
                    permits.forget();
                }
            });
        }
    }

    pub fn reset_peak(&self) {
        self.peak_inside
            .store(self.inside.load(Ordering::Relaxed), Ordering::Relaxed);
    }
}

type Tasks = Arc<Mutex<Vec<AbortHandle>>>;

/// What every connection handler gets.
#[derive(Clone)]
struct Ctx {
    name: String,
    stats: Arc<AppStats>,
    control: Arc<AppControl>,
    tasks: Tasks,
    /// Speaks HTTP/1.1 only: the HTTP/2 preface gets hyper's 505.
    http1_only: bool,
}

pub struct TestApp {
    pub name: String,
    /// The TCP address (`0.0.0.0:0` for an app on a Unix socket).
    pub addr: SocketAddr,
    /// The Unix socket, for an app started with [`TestApp::start_unix`].
    pub path: Option<PathBuf>,
    pub stats: Arc<AppStats>,
    pub control: Arc<AppControl>,
    accept: Mutex<Option<JoinHandle<()>>>,
    tasks: Tasks,
}

/// Leaves [`AppControl::inside`] however the request ends.
struct Leave<'a>(&'a AtomicU32);

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// `inflight` held by a spawned task (a streamed body outlives the handler).
struct InflightGuard(Arc<AppStats>);

impl InflightGuard {
    fn new(stats: &Arc<AppStats>) -> Self {
        stats.inflight.fetch_add(1, Ordering::SeqCst);
        Self(stats.clone())
    }
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        self.0.inflight.fetch_sub(1, Ordering::SeqCst);
    }
}

enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

impl TestApp {
    pub async fn start(name: &str) -> Result<Self> {
        Self::start_on(name, SocketAddr::from(([127, 0, 0, 1], 0))).await
    }

    /// Starts on a given address (a port the sidecar was already told about).
    pub async fn start_on(name: &str, addr: SocketAddr) -> Result<Self> {
        let listener = TcpListener::bind(addr)
            .await
            .with_context(|| format!("bind app on {addr}"))?;
        let addr = listener.local_addr()?;
        Ok(Self::serve(
            name,
            Listener::Tcp(listener),
            addr,
            None,
            false,
        ))
    }

    /// The same app, but an HTTP/1.1-only server (as most apps are): the
    /// HTTP/2 preface is answered `505 HTTP Version Not Supported`.
    pub async fn start_http1_only(name: &str) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await.context("bind app")?;
        let addr = listener.local_addr()?;
        Ok(Self::serve(name, Listener::Tcp(listener), addr, None, true))
    }

    /// Starts on a Unix socket at `path` (a stale file there is removed).
    pub async fn start_unix(name: &str, path: &Path) -> Result<Self> {
        let _ = std::fs::remove_file(path);
        let listener =
            UnixListener::bind(path).with_context(|| format!("bind {}", path.display()))?;
        let addr = SocketAddr::from(([0, 0, 0, 0], 0));
        Ok(Self::serve(
            name,
            Listener::Unix(listener),
            addr,
            Some(path.to_path_buf()),
            false,
        ))
    }

    /// The breaker tests' app: `capacity` requests at once, each taking
    /// `service` once it holds a slot.
    pub async fn with_capacity(capacity: u32, service: Duration) -> Result<Self> {
        let app = Self::start("app").await?;
        app.control.set_capacity(capacity);
        app.control.service_ms.store(
            u64::try_from(service.as_millis()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        Ok(app)
    }

    fn serve(
        name: &str,
        listener: Listener,
        addr: SocketAddr,
        path: Option<PathBuf>,
        http1_only: bool,
    ) -> Self {
        let ctx = Ctx {
            name: name.to_string(),
            stats: Arc::default(),
            control: Arc::default(),
            tasks: Arc::default(),
            http1_only,
        };
        let accept = tokio::spawn(accept_loop(listener, ctx.clone()));
        Self {
            name: ctx.name,
            addr,
            path,
            stats: ctx.stats,
            control: ctx.control,
            accept: Mutex::new(Some(accept)),
            tasks: ctx.tasks,
        }
    }

    /// The same app written the way Node.js is (`keepAliveTimeout`, 5s): a
    /// keep-alive connection idle for `idle` is closed, and a request that
    /// arrives as the app gives up on the connection is lost with it (the
    /// keep-alive idle race). HTTP/1.1 GET without a body only.
    pub async fn start_idle_closing(idle: Duration) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await.context("bind app")?;
        let addr = listener.local_addr()?;
        let stats: Arc<AppStats> = Arc::default();
        let counted = stats.clone();
        let accept = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                counted.connections.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(idle_closing_connection(tcp, idle, counted.clone()));
            }
        });
        Ok(Self {
            name: "idle-closing".into(),
            addr,
            path: None,
            stats,
            control: Arc::default(),
            accept: Mutex::new(Some(accept)),
            tasks: Arc::default(),
        })
    }

    /// The naive app's reaction to SIGTERM: stop at once. When this returns
    /// the listener is closed (new connections are refused, a Unix socket
    /// file is gone) and every open connection has been dropped, mid-request
    /// or not.
    pub async fn kill(&self) {
        let accept = lock(&self.accept).take();
        if let Some(accept) = accept {
            accept.abort();
            let _ = accept.await;
        }
        for task in std::mem::take(&mut *lock(&self.tasks)) {
            task.abort();
        }
        if let Some(path) = &self.path {
            let _ = std::fs::remove_file(path);
        }
    }

    pub fn served(&self) -> u64 {
        self.stats.served.load(Ordering::SeqCst)
    }

    pub fn inflight(&self) -> i64 {
        self.stats.inflight.load(Ordering::SeqCst)
    }

    /// Connections that carried at least one request.
    pub fn used_connections(&self) -> usize {
        lock(&self.stats.used_connections).len()
    }

    /// Connections the app closed because they sat idle.
    pub fn idle_closes(&self) -> u64 {
        self.stats.idle_closed.load(Ordering::SeqCst)
    }

    /// What to pass as `--upstream`: the address, or `unix:PATH`.
    pub fn upstream(&self) -> String {
        match &self.path {
            Some(path) => format!("unix:{}", path.display()),
            None => self.addr.to_string(),
        }
    }

    /// The newest request head for `GET path`, lowercased.
    pub fn last_head(&self, path: &str) -> Option<String> {
        let prefix = format!("get {path} ");
        lock(&self.stats.heads)
            .iter()
            .rev()
            .find(|h| h.starts_with(&prefix))
            .cloned()
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        if let Some(accept) = lock(&self.accept).take() {
            accept.abort();
        }
        for task in lock(&self.tasks).iter() {
            task.abort();
        }
    }
}

async fn accept_loop(listener: Listener, ctx: Ctx) {
    let mut next_conn = 0u64;
    loop {
        next_conn += 1;
        let conn = match &listener {
            Listener::Tcp(l) => match l.accept().await {
                Ok((tcp, _)) => {
                    let _ = tcp.set_nodelay(true);
                    tokio::spawn(serve_connection(tcp, next_conn, ctx.clone()))
                }
                Err(_) => {
                    // Out of file descriptors and the like: back off, don't spin.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
            Listener::Unix(l) => match l.accept().await {
                Ok((stream, _)) => tokio::spawn(serve_connection(stream, next_conn, ctx.clone())),
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        ctx.stats.connections.fetch_add(1, Ordering::SeqCst);
        let mut tasks = lock(&ctx.tasks);
        tasks.retain(|t| !t.is_finished());
        tasks.push(conn.abort_handle());
    }
}

async fn serve_connection<S>(io: S, conn_id: u64, ctx: Ctx)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let http1_only = ctx.http1_only;
    let service = service_fn(move |req| handle(req, conn_id, ctx.clone()));
    if http1_only {
        // hyper-util's auto builder ignores `http1_only` when it serves
        // upgrades (0.1.21), so hyper's HTTP/1 server directly.
        let _ = hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(io), service)
            .with_upgrades()
            .await;
        return;
    }
    let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    let _ = builder
        .serve_connection_with_upgrades(TokioIo::new(io), service)
        .await;
}

fn query_u64(req: &Request<Incoming>, key: &str) -> Option<u64> {
    req.uri().query()?.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k == key).then(|| v.parse().ok()).flatten()
    })
}

pub fn full(status: StatusCode, body: impl Into<Bytes>) -> Response<Body> {
    let mut resp = Response::new(Full::new(body.into()).boxed());
    *resp.status_mut() = status;
    resp
}

fn record_head(req: &Request<Incoming>, conn_id: u64, stats: &AppStats) {
    lock(&stats.used_connections).insert(conn_id);
    let mut head = format!("{} {} {:?}\r\n", req.method(), req.uri(), req.version());
    for (name, value) in req.headers() {
        head.push_str(&format!(
            "{name}: {}\r\n",
            String::from_utf8_lossy(value.as_bytes())
        ));
    }
    lock(&stats.heads).push(head.to_ascii_lowercase());
}

/// The `x-*` headers every answer carries: what the app saw.
fn seen_headers(req: &Request<Incoming>, conn_id: u64) -> [(&'static str, String); 4] {
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let host = header("host")
        .or_else(|| req.uri().authority().map(|a| a.to_string()))
        .unwrap_or_default();
    [
        ("x-conn", conn_id.to_string()),
        ("x-seen-host", host),
        ("x-seen-xff", header("x-forwarded-for").unwrap_or_default()),
        ("x-seen-version", format!("{:?}", req.version())),
    ]
}

async fn handle(
    req: Request<Incoming>,
    conn_id: u64,
    ctx: Ctx,
) -> Result<Response<Body>, Infallible> {
    record_head(&req, conn_id, &ctx.stats);
    let seen = seen_headers(&req, conn_id);
    let stats = &ctx.stats;
    let path = req.uri().path().to_string();
    let mut resp = match path.as_str() {
        "/ready" => full(StatusCode::OK, "ready\n"),
        "/work" => {
            let _guard = InflightGuard::new(stats);
            let ms = query_u64(&req, "ms").unwrap_or(0);
            if ms > 0 {
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            full(StatusCode::OK, format!("ok {}\n", ctx.name))
        }
        "/stream" => stream(&req, stats),
        "/big" => big(&req, stats),
        "/headers" => {
            // The request head as the app received it, one "name: value" a line.
            let mut text = String::new();
            for (name, value) in req.headers() {
                text.push_str(&format!("{name}: {}\n", value.to_str().unwrap_or("?")));
            }
            let _ = req.into_body().collect().await;
            full(StatusCode::OK, text)
        }
        "/upload" => {
            // Reads the whole body (however slowly it comes) and answers
            // with its length.
            let _guard = InflightGuard::new(stats);
            match req.into_body().collect().await {
                Ok(body) => full(StatusCode::OK, format!("{}\n", body.to_bytes().len())),
                Err(_) => full(StatusCode::BAD_REQUEST, "body cut\n"),
            }
        }
        "/kubegrace.test.Ticker/Ticks" => ticks(req, stats).await,
        "/kubegrace.test.Echo/Unary" => echo_unary(req).await,
        "/ws" => websocket(req, stats, &ctx.tasks),
        _ => controlled(&path, &ctx.control).await,
    };
    for (name, value) in seen {
        if let Ok(value) = HeaderValue::from_str(&value) {
            resp.headers_mut().insert(name, value);
        }
    }
    stats.served.fetch_add(1, Ordering::SeqCst);
    Ok(resp)
}

/// The paths [`AppControl`] switches: fail, or wait for capacity and serve.
async fn controlled(path: &str, control: &AppControl) -> Response<Body> {
    let segment = path
        .trim_start_matches('/')
        .split('/')
        .next()
        .unwrap_or_default()
        .to_string();
    control.received.fetch_add(1, Ordering::Relaxed);
    *lock(&control.received_by_route).entry(segment).or_default() += 1;
    let inside = control.inside.fetch_add(1, Ordering::Relaxed) + 1;
    control.peak_inside.fetch_max(inside, Ordering::Relaxed);
    let _leave = Leave(&control.inside);

    let failing = lock(&control.failing_prefix)
        .as_deref()
        .is_some_and(|prefix| path.starts_with(prefix));
    if failing {
        let delay = control.fail_delay_ms.load(Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(delay)).await;
        return full(StatusCode::INTERNAL_SERVER_ERROR, "app error\n");
    }
    let Ok(_slot) = control.capacity.acquire().await else {
        return full(StatusCode::INTERNAL_SERVER_ERROR, "closed\n");
    };
    tokio::time::sleep(Duration::from_millis(
        control.service_ms.load(Ordering::Relaxed),
    ))
    .await;
    full(StatusCode::OK, "ok\n")
}

/// A body that is produced by a task, frame by frame.
fn channel_body() -> (mpsc::Sender<Frame<Bytes>>, Body) {
    let (tx, rx) = mpsc::channel::<Frame<Bytes>>(4);
    let frames = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|frame| (Ok::<_, Infallible>(frame), rx))
    });
    (tx, BodyExt::boxed(StreamBody::new(frames)))
}

fn stream(req: &Request<Incoming>, stats: &Arc<AppStats>) -> Response<Body> {
    let chunks = query_u64(req, "chunks").unwrap_or(10);
    let ms = query_u64(req, "ms").unwrap_or(100);
    let (tx, body) = channel_body();
    let guard = InflightGuard::new(stats);
    tokio::spawn(async move {
        let _guard = guard;
        for i in 0..chunks {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            if tx
                .send(Frame::data(Bytes::from(format!("chunk {i}\n"))))
                .await
                .is_err()
            {
                return;
            }
        }
    });
    Response::new(body)
}

fn big(req: &Request<Incoming>, stats: &Arc<AppStats>) -> Response<Body> {
    let size = query_u64(req, "bytes").unwrap_or(1 << 20) as usize;
    let (tx, body) = channel_body();
    let stats = stats.clone();
    tokio::spawn(async move {
        let chunk = Bytes::from(vec![b'b'; 64 * 1024]);
        let mut sent = 0;
        while sent < size {
            let n = chunk.len().min(size - sent);
            if tx.send(Frame::data(chunk.slice(..n))).await.is_err() {
                // hyper dropped the body: the connection to the app is gone.
                stats.big_cut.fetch_add(1, Ordering::SeqCst);
                return;
            }
            sent += n;
        }
    });
    let mut resp = Response::new(body);
    if let Ok(len) = HeaderValue::from_str(&size.to_string()) {
        resp.headers_mut().insert(http::header::CONTENT_LENGTH, len);
    }
    resp
}

/// gRPC length-prefixed message framing (uncompressed).
pub fn grpc_frame(msg: &impl prost::Message) -> Bytes {
    let mut buf = BytesMut::with_capacity(5 + msg.encoded_len());
    buf.put_u8(0);
    buf.put_u32(msg.encoded_len() as u32);
    // Encoding into a BytesMut grows it as needed and cannot fail.
    let _ = msg.encode(&mut buf);
    buf.freeze()
}

fn grpc_response(body: Body) -> Response<Body> {
    let mut resp = Response::new(body);
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    resp
}

fn grpc_ok() -> http::HeaderMap {
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static("0"));
    trailers
}

async fn ticks(req: Request<Incoming>, stats: &Arc<AppStats>) -> Response<Body> {
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => return full(StatusCode::BAD_REQUEST, "unreadable body\n"),
    };
    let request = body
        .get(5..)
        .and_then(|msg| TicksRequest::decode(msg).ok())
        .unwrap_or_default();
    let (tx, body) = channel_body();
    let guard = InflightGuard::new(stats);
    tokio::spawn(async move {
        let _guard = guard;
        for seq in 0..request.count {
            tokio::time::sleep(Duration::from_millis(u64::from(request.interval_ms))).await;
            if tx
                .send(Frame::data(grpc_frame(&Tick { seq })))
                .await
                .is_err()
            {
                return;
            }
        }
        let _ = tx.send(Frame::trailers(grpc_ok())).await;
    });
    grpc_response(body)
}

/// The request frames back, then the status in trailers (the part an
/// HTTP/1-minded proxy loses).
async fn echo_unary(req: Request<Incoming>) -> Response<Body> {
    let body = match req.into_body().collect().await {
        Ok(body) => body.to_bytes(),
        Err(_) => return full(StatusCode::BAD_REQUEST, "body\n"),
    };
    let frames = futures_util::stream::iter([
        Ok::<_, Infallible>(Frame::data(body)),
        Ok(Frame::trailers(grpc_ok())),
    ]);
    grpc_response(BodyExt::boxed(StreamBody::new(frames)))
}

fn websocket(mut req: Request<Incoming>, stats: &Arc<AppStats>, tasks: &Tasks) -> Response<Body> {
    let Some(key) = req.headers().get("sec-websocket-key").cloned() else {
        return full(StatusCode::BAD_REQUEST, "not a websocket handshake\n");
    };
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
    let on_upgrade = hyper::upgrade::on(&mut req);
    let stats = stats.clone();
    let echo = tokio::spawn(async move {
        let Ok(upgraded) = on_upgrade.await else {
            return;
        };
        let mut ws =
            WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await;
        while let Some(Ok(msg)) = ws.next().await {
            match msg {
                Message::Text(_) | Message::Binary(_) => {
                    if ws.send(msg).await.is_err() {
                        return;
                    }
                    stats.ws_echoed.fetch_add(1, Ordering::SeqCst);
                }
                Message::Close(frame) => {
                    let code = frame.map_or(0, |f| u16::from(f.code));
                    lock(&stats.ws_close_codes).push(code);
                    // Polled on, the stream sends the Close reply and ends.
                }
                _ => {}
            }
        }
    });
    lock(tasks).push(echo.abort_handle());
    switching_to_websocket(&accept)
}

/// The server's half of the WebSocket handshake (RFC 6455 4.2.2): 101 with
/// the `Sec-WebSocket-Accept` derived from the client's key.
pub fn switching_to_websocket(accept: &str) -> Response<Body> {
    let mut resp = full(StatusCode::SWITCHING_PROTOCOLS, Bytes::new());
    let headers = resp.headers_mut();
    headers.insert(http::header::UPGRADE, HeaderValue::from_static("websocket"));
    headers.insert(
        http::header::CONNECTION,
        HeaderValue::from_static("Upgrade"),
    );
    if let Ok(value) = HeaderValue::from_str(accept) {
        headers.insert("sec-websocket-accept", value);
    }
    resp
}

async fn idle_closing_connection(
    mut tcp: tokio::net::TcpStream,
    idle: Duration,
    stats: Arc<AppStats>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let _ = tcp.set_nodelay(true);
    let mut buf = Vec::with_capacity(4096);
    loop {
        // Wait for the next request head; the idle clock runs only while
        // nothing has arrived.
        let head_end = loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break end + 4;
            }
            let mut chunk = [0u8; 4096];
            let read = if buf.is_empty() {
                match tokio::time::timeout(idle, tcp.read(&mut chunk)).await {
                    Ok(read) => read,
                    Err(_) => {
                        // Idle too long: close, as Node does.
                        stats.idle_closed.fetch_add(1, Ordering::SeqCst);
                        return;
                    }
                }
            } else {
                tcp.read(&mut chunk).await
            };
            match read {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        buf.drain(..head_end);
        stats.served.fetch_add(1, Ordering::SeqCst);
        let answer =
            b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\ncontent-type: text/plain\r\n\r\nok\n";
        if tcp.write_all(answer).await.is_err() {
            return;
        }
    }
}
