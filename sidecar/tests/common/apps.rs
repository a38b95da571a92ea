//! The app behind the sidecar: one server that speaks HTTP/1.1, h2c (prior
//! knowledge), gRPC (server streaming) and WebSocket, so every scenario uses
//! the same upstream.
//!
//! Routes:
//! - `GET /ready`: 200 while the app lives (the naive app's readiness probe).
//! - `GET /work?ms=N`: answers "ok <app>" after N ms (default 0).
//! - `GET /stream?chunks=N&ms=M`: a body of N chunks, M ms apart.
//! - `POST /upload`: reads the whole body, answers with its length.
//! - `/headers`: answers with the request headers the app received.
//! - `POST /kubegrace.test.Ticker/Ticks`: gRPC server streaming of
//!   [`Tick`](super::grpc::Tick)s.
//! - `GET /ws` with `Upgrade: websocket`: echoes every message.
//!
//! [`TestApp::kill`] is what a naive app does on SIGTERM: the listener and
//! every connection vanish at once, in-flight requests included.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use bytes::{BufMut, Bytes, BytesMut};
use futures_util::{SinkExt, StreamExt};
use http::{Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost::Message as _;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
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
    /// Keep-alive connections the app closed because they sat idle.
    pub idle_closed: AtomicU64,
}

pub struct TestApp {
    pub name: String,
    pub addr: SocketAddr,
    pub stats: Arc<AppStats>,
    accept: Mutex<Option<JoinHandle<()>>>,
    tasks: Arc<Mutex<Vec<AbortHandle>>>,
}

/// Decrements `inflight` however the request ends, abort included.
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
        let stats = Arc::new(AppStats::default());
        let tasks: Arc<Mutex<Vec<AbortHandle>>> = Arc::default();
        let accept = tokio::spawn(accept_loop(
            listener,
            name.to_string(),
            stats.clone(),
            tasks.clone(),
        ));
        Ok(Self {
            name: name.to_string(),
            addr,
            stats,
            accept: Mutex::new(Some(accept)),
            tasks,
        })
    }

    /// The naive app's reaction to SIGTERM: stop at once. When this returns
    /// the listener is closed (new connections are refused) and every open
    /// connection has been dropped, mid-request or not.
    pub async fn kill(&self) {
        let accept = self.accept.lock().ok().and_then(|mut a| a.take());
        if let Some(accept) = accept {
            accept.abort();
            let _ = accept.await;
        }
        let tasks = self
            .tasks
            .lock()
            .map(|mut t| std::mem::take(&mut *t))
            .unwrap_or_default();
        for task in tasks {
            task.abort();
        }
    }

    pub fn served(&self) -> u64 {
        self.stats.served.load(Ordering::SeqCst)
    }

    pub fn inflight(&self) -> i64 {
        self.stats.inflight.load(Ordering::SeqCst)
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        if let Ok(mut accept) = self.accept.lock()
            && let Some(accept) = accept.take()
        {
            accept.abort();
        }
        if let Ok(tasks) = self.tasks.lock() {
            for task in tasks.iter() {
                task.abort();
            }
        }
    }
}

async fn accept_loop(
    listener: TcpListener,
    name: String,
    stats: Arc<AppStats>,
    tasks: Arc<Mutex<Vec<AbortHandle>>>,
) {
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            // Out of file descriptors and the like: back off, don't spin.
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let _ = tcp.set_nodelay(true);
        stats.connections.fetch_add(1, Ordering::SeqCst);
        let (name, stats2, tasks2) = (name.clone(), stats.clone(), tasks.clone());
        let conn = tokio::spawn(async move {
            let service =
                service_fn(move |req| handle(req, name.clone(), stats2.clone(), tasks2.clone()));
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            let _ = builder
                .serve_connection_with_upgrades(TokioIo::new(tcp), service)
                .await;
        });
        if let Ok(mut tasks) = tasks.lock() {
            tasks.retain(|t| !t.is_finished());
            tasks.push(conn.abort_handle());
        }
    }
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

async fn handle(
    req: Request<Incoming>,
    name: String,
    stats: Arc<AppStats>,
    tasks: Arc<Mutex<Vec<AbortHandle>>>,
) -> Result<Response<Body>, Infallible> {
    let path = req.uri().path().to_string();
    let resp = match path.as_str() {
        "/ready" => full(StatusCode::OK, "ready\n"),
        "/work" => {
            let _guard = InflightGuard::new(&stats);
            let ms = query_u64(&req, "ms").unwrap_or(0);
            if ms > 0 {
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            full(StatusCode::OK, format!("ok {name}\n"))
        }
        "/stream" => stream(&req, &stats),
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
            let _guard = InflightGuard::new(&stats);
            match req.into_body().collect().await {
                Ok(body) => full(StatusCode::OK, format!("{}\n", body.to_bytes().len())),
                Err(_) => full(StatusCode::BAD_REQUEST, "body cut\n"),
            }
        }
        "/kubegrace.test.Ticker/Ticks" => ticks(req, &stats).await,
        "/ws" => websocket(req, &stats, &tasks),
        _ => full(StatusCode::NOT_FOUND, "no such route\n"),
    };
    stats.served.fetch_add(1, Ordering::SeqCst);
    Ok(resp)
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

/// gRPC length-prefixed message framing (uncompressed).
pub fn grpc_frame(msg: &impl prost::Message) -> Bytes {
    let mut buf = BytesMut::with_capacity(5 + msg.encoded_len());
    buf.put_u8(0);
    buf.put_u32(msg.encoded_len() as u32);
    // Encoding into a BytesMut grows it as needed and cannot fail.
    let _ = msg.encode(&mut buf);
    buf.freeze()
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
        let mut trailers = http::HeaderMap::new();
        trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
        let _ = tx.send(Frame::trailers(trailers)).await;
    });
    let mut resp = Response::new(body);
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    resp
}

fn websocket(
    mut req: Request<Incoming>,
    stats: &Arc<AppStats>,
    tasks: &Arc<Mutex<Vec<AbortHandle>>>,
) -> Response<Body> {
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
                Message::Close(_) => return,
                _ => {}
            }
        }
    });
    if let Ok(mut tasks) = tasks.lock() {
        tasks.push(echo.abort_handle());
    }
    switching_to_websocket(&accept)
}

/// The server's half of the WebSocket handshake (RFC 6455 4.2.2): 101 with
/// the `Sec-WebSocket-Accept` derived from the client's key.
pub fn switching_to_websocket(accept: &str) -> Response<Body> {
    let mut resp = full(StatusCode::SWITCHING_PROTOCOLS, Bytes::new());
    let headers = resp.headers_mut();
    headers.insert(
        http::header::UPGRADE,
        http::HeaderValue::from_static("websocket"),
    );
    headers.insert(
        http::header::CONNECTION,
        http::HeaderValue::from_static("Upgrade"),
    );
    if let Ok(value) = http::HeaderValue::from_str(accept) {
        headers.insert("sec-websocket-accept", value);
    }
    resp
}

/// A bare-bones HTTP/1.1 app that closes a keep-alive connection after it
/// sat idle for `idle`, the way Node.js (`keepAliveTimeout`, 5s) does: a
/// request that arrives as the app gives up on the connection is lost with
/// it (the keep-alive idle race). Only what the test needs: GET without a body.
pub struct IdleClosingApp {
    pub addr: SocketAddr,
    pub stats: Arc<AppStats>,
    accept: JoinHandle<()>,
}

impl IdleClosingApp {
    pub async fn start(idle: Duration) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await.context("bind app")?;
        let addr = listener.local_addr()?;
        let stats = Arc::new(AppStats::default());
        let stats2 = stats.clone();
        let accept = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                stats2.connections.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(idle_closing_connection(tcp, idle, stats2.clone()));
            }
        });
        Ok(Self {
            addr,
            stats,
            accept,
        })
    }

    /// Connections the app closed because they sat idle.
    pub fn idle_closes(&self) -> u64 {
        self.stats.idle_closed.load(Ordering::SeqCst)
    }
}

impl Drop for IdleClosingApp {
    fn drop(&mut self) {
        self.accept.abort();
    }
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
