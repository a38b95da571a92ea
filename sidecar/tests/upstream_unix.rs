//! The app listens on a Unix socket (`--upstream unix:/path`).
//!
//! A real app (hyper, HTTP/1.1 + h2c + WebSocket) on a Unix socket, the real
//! sidecar binary in front of it on loopback TCP, real clients: keep-alive
//! requests reuse one pooled app connection and keep the client's Host;
//! an h2c gRPC-style call keeps its trailers; a WebSocket upgrade passes
//! through; a drain lets in-flight requests finish, where killing the proxy
//! outright (the baseline) loses them.

mod common;

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use bytes::Bytes;
use common::apps::{Body, full, switching_to_websocket};
use common::sidecar::{BIN, FAST_DRAIN, parse_ready_line, scratch_dir};
use common::{wait_for, within};
use futures_util::{SinkExt, StreamExt};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::{TcpStream, UnixListener};
use tokio::process::{Child, Command};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::Role;

const WAIT: Duration = Duration::from_secs(30);

/// The app on a Unix socket. Every response says which app connection
/// served it (`x-conn`), the Host and X-Forwarded-For the app saw, and the
/// HTTP version.
struct UnixApp {
    path: PathBuf,
    served: Arc<AtomicU64>,
    /// Requests the app is working on right now.
    inflight: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for UnixApp {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl UnixApp {
    async fn start(dir: &Path) -> Result<Self> {
        let path = dir.join("app.sock");
        let listener =
            UnixListener::bind(&path).with_context(|| format!("bind {}", path.display()))?;
        let served = Arc::new(AtomicU64::new(0));
        let inflight = Arc::new(AtomicU64::new(0));
        let (counter, busy) = (served.clone(), inflight.clone());
        let task = tokio::spawn(async move {
            let mut next_conn = 0u64;
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                next_conn += 1;
                let conn_id = next_conn;
                let (served, busy) = (counter.clone(), busy.clone());
                tokio::spawn(async move {
                    let service = service_fn(move |req| {
                        let (served, busy) = (served.clone(), busy.clone());
                        async move {
                            let _busy = Busy::enter(busy);
                            let resp = app(req, conn_id).await;
                            served.fetch_add(1, Ordering::SeqCst);
                            Ok::<_, Infallible>(resp)
                        }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection_with_upgrades(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Self {
            path,
            served,
            inflight,
            task,
        })
    }

    fn served(&self) -> u64 {
        self.served.load(Ordering::SeqCst)
    }

    fn inflight(&self) -> u64 {
        self.inflight.load(Ordering::SeqCst)
    }
}

/// Counts a request in flight at the app; hyper drops the request's future
/// when the client connection goes away, so the count falls then too.
struct Busy(Arc<AtomicU64>);

impl Busy {
    fn enter(counter: Arc<AtomicU64>) -> Busy {
        counter.fetch_add(1, Ordering::SeqCst);
        Busy(counter)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn app(mut req: Request<Incoming>, conn_id: u64) -> Response<Body> {
    let seen = |name: http::header::HeaderName| {
        req.headers()
            .get(&name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let host = seen(http::header::HOST)
        .or_else(|| req.uri().authority().map(|a| a.to_string()))
        .unwrap_or_default();
    let xff = seen(http::header::HeaderName::from_static("x-forwarded-for")).unwrap_or_default();
    let version = format!("{:?}", req.version());
    let mut resp = match req.uri().path() {
        "/ws" => websocket(&mut req),
        "/slow" => {
            let ms = req
                .uri()
                .query()
                .and_then(|q| q.strip_prefix("ms="))
                .and_then(|v| v.parse().ok())
                .unwrap_or(500);
            tokio::time::sleep(Duration::from_millis(ms)).await;
            full(StatusCode::OK, "slow done\n")
        }
        "/kubegrace.test.Echo/Unary" => {
            // gRPC-style: echo the request frames, then the status in
            // trailers (the part an HTTP/1-minded proxy loses).
            let body = match req.into_body().collect().await {
                Ok(body) => body.to_bytes(),
                Err(_) => return full(StatusCode::BAD_REQUEST, "body\n"),
            };
            let mut trailers = http::HeaderMap::new();
            trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
            let frames = futures_util::stream::iter([
                Ok::<_, Infallible>(Frame::data(body)),
                Ok(Frame::trailers(trailers)),
            ]);
            let mut resp = Response::new(BodyExt::boxed(StreamBody::new(frames)));
            resp.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/grpc"),
            );
            resp
        }
        _ => full(StatusCode::OK, "hello from the unix socket\n"),
    };
    let headers = resp.headers_mut();
    for (name, value) in [
        ("x-conn", conn_id.to_string()),
        ("x-seen-host", host),
        ("x-seen-xff", xff),
        ("x-seen-version", version),
    ] {
        if let Ok(value) = http::HeaderValue::from_str(&value) {
            headers.insert(name, value);
        }
    }
    resp
}

fn websocket(req: &mut Request<Incoming>) -> Response<Body> {
    let Some(key) = req.headers().get("sec-websocket-key").cloned() else {
        return full(StatusCode::BAD_REQUEST, "not a websocket handshake\n");
    };
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
    let on_upgrade = hyper::upgrade::on(req);
    tokio::spawn(async move {
        let Ok(upgraded) = on_upgrade.await else {
            return;
        };
        let mut ws =
            WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await;
        while let Some(Ok(msg)) = ws.next().await {
            if (msg.is_text() || msg.is_binary()) && ws.send(msg).await.is_err() {
                return;
            }
        }
    });
    switching_to_websocket(&accept)
}

/// The sidecar binary with `--upstream unix:PATH`. Killed when dropped; its
/// logs are printed if the test fails.
struct UnixSidecar {
    child: Child,
    listen: SocketAddr,
    logs: Arc<Mutex<Vec<String>>>,
}

impl UnixSidecar {
    async fn start(socket: &Path) -> Result<Self> {
        let mut cmd = Command::new(BIN);
        cmd.arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--upstream")
            .arg(format!("unix:{}", socket.display()))
            .arg("--admin")
            .arg("127.0.0.1:0")
            .args(FAST_DRAIN)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .env("RUST_LOG", "info");
        for (key, _) in std::env::vars() {
            if key.starts_with("KUBEGRACE_") {
                cmd.env_remove(key);
            }
        }
        let mut child = cmd.spawn().with_context(|| format!("spawn {BIN}"))?;
        let logs = Arc::new(Mutex::new(Vec::new()));
        for stream in [
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Unpin + Send>),
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Unpin + Send>),
        ]
        .into_iter()
        .flatten()
        {
            let logs = logs.clone();
            tokio::spawn(async move {
                let mut lines = BufReader::new(stream).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if let Ok(mut logs) = logs.lock() {
                        logs.push(line);
                    }
                }
            });
        }
        let logs2 = logs.clone();
        let (listen, _admin) = wait_for("the sidecar's ready line", WAIT, || {
            let found = logs2
                .lock()
                .ok()
                .and_then(|l| l.iter().find_map(|line| parse_ready_line(line)));
            async move { found }
        })
        .await?;
        Ok(Self {
            child,
            listen,
            logs,
        })
    }

    fn logs_text(&self) -> String {
        self.logs.lock().map(|l| l.join("\n")).unwrap_or_default()
    }
}

impl Drop for UnixSidecar {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("sidecar logs:\n{}", self.logs_text());
        }
    }
}

/// An HTTP/1.1 keep-alive connection to the sidecar.
async fn h1_connection(
    addr: SocketAddr,
) -> Result<hyper::client::conn::http1::SendRequest<Empty<Bytes>>> {
    let tcp = TcpStream::connect(addr).await.context("connect")?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
    tokio::spawn(conn);
    Ok(sender)
}

async fn get(
    sender: &mut hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
    path: &str,
) -> Result<(Response<()>, Bytes)> {
    sender.ready().await.context("connection ready")?;
    let req = Request::get(path)
        .header(http::header::HOST, "app.test")
        .body(Empty::new())?;
    let resp = within(path, WAIT, sender.send_request(req)).await??;
    let (parts, body) = resp.into_parts();
    let body = body.collect().await?.to_bytes();
    Ok((Response::from_parts(parts, ()), body))
}

fn header(resp: &Response<()>, name: &str) -> String {
    resp.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_keep_alive_reuses_one_app_connection_and_keeps_the_host() -> Result<()> {
    let dir = scratch_dir("unix-h1")?;
    let app = UnixApp::start(&dir).await?;
    let sidecar = UnixSidecar::start(&app.path).await?;

    let mut client = h1_connection(sidecar.listen).await?;
    let mut conns = BTreeSet::new();
    for i in 0..20 {
        let (resp, body) = get(&mut client, "/hello").await?;
        ensure!(
            resp.status() == StatusCode::OK,
            "request {i}: {}",
            resp.status()
        );
        ensure!(
            body == "hello from the unix socket\n",
            "request {i}: body {body:?}"
        );
        ensure!(
            header(&resp, "x-seen-host") == "app.test",
            "the app saw Host {:?}, not the client's",
            header(&resp, "x-seen-host")
        );
        ensure!(
            header(&resp, "x-seen-xff") == "127.0.0.1",
            "the app saw X-Forwarded-For {:?}",
            header(&resp, "x-seen-xff")
        );
        ensure!(header(&resp, "x-seen-version") == "HTTP/1.1");
        conns.insert(header(&resp, "x-conn"));
    }
    // Sequential requests ride one warm app connection, not one each.
    ensure!(
        conns.len() == 1,
        "20 sequential requests used {} app connections: {conns:?}",
        conns.len()
    );
    ensure!(app.served() == 20, "app served {}", app.served());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2c_grpc_style_call_keeps_its_trailers() -> Result<()> {
    let dir = scratch_dir("unix-h2")?;
    let app = UnixApp::start(&dir).await?;
    let sidecar = UnixSidecar::start(&app.path).await?;

    let tcp = TcpStream::connect(sidecar.listen).await?;
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp)).await?;
    tokio::spawn(conn);
    // A gRPC message frame: uncompressed flag, 4-byte length, payload.
    let message = Bytes::from_static(b"\x00\x00\x00\x00\x05hello");
    let req = Request::post(format!(
        "http://{}/kubegrace.test.Echo/Unary",
        sidecar.listen
    ))
    .header(http::header::CONTENT_TYPE, "application/grpc")
    .header(http::header::TE, "trailers")
    .body(Full::new(message.clone()))?;
    let resp = within("gRPC call", WAIT, sender.send_request(req)).await??;
    ensure!(resp.status() == StatusCode::OK, "status {}", resp.status());
    ensure!(
        header_of(resp.headers(), "x-seen-version") == "HTTP/2.0",
        "the app saw {:?}; HTTP/2 must stay HTTP/2 end to end",
        header_of(resp.headers(), "x-seen-version")
    );
    ensure!(
        header_of(resp.headers(), "x-seen-host") == sidecar.listen.to_string(),
        "the app saw :authority {:?}",
        header_of(resp.headers(), "x-seen-host")
    );
    let collected = within("gRPC body", WAIT, resp.into_body().collect()).await??;
    let trailers = collected.trailers().cloned().context("no trailers")?;
    ensure!(
        trailers.get("grpc-status").map(|v| v.as_bytes()) == Some(&b"0"[..]),
        "trailers {trailers:?}"
    );
    ensure!(collected.to_bytes() == message, "echo differs");
    Ok(())
}

fn header_of(headers: &http::HeaderMap, name: &str) -> String {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_upgrade_passes_through() -> Result<()> {
    let dir = scratch_dir("unix-ws")?;
    let app = UnixApp::start(&dir).await?;
    let sidecar = UnixSidecar::start(&app.path).await?;

    let tcp = TcpStream::connect(sidecar.listen).await?;
    let url = format!("ws://{}/ws", sidecar.listen);
    let (mut ws, resp) = within(
        "WebSocket handshake",
        WAIT,
        tokio_tungstenite::client_async(url, tcp),
    )
    .await?
    .context("WebSocket handshake through the sidecar")?;
    ensure!(resp.status() == StatusCode::SWITCHING_PROTOCOLS);
    for i in 0..5 {
        let text = format!("message {i}");
        ws.send(Message::text(text.clone())).await?;
        let echo = within("echo", WAIT, ws.next()).await?.context("closed")??;
        ensure!(echo == Message::text(text), "unexpected echo {echo:?}");
    }
    ws.close(None).await?;
    // The tunnel's app connection is not pooled: a plain request afterwards
    // still works on its own connection.
    let mut client = h1_connection(sidecar.listen).await?;
    let (resp, _) = get(&mut client, "/after").await?;
    ensure!(resp.status() == StatusCode::OK);
    Ok(())
}

/// Sends `n` slow requests on separate keep-alive connections and returns
/// their tasks once the app has all of them in hand.
async fn slow_requests(
    listen: SocketAddr,
    app: &UnixApp,
    n: usize,
) -> Result<Vec<tokio::task::JoinHandle<Result<StatusCode>>>> {
    let mut tasks = Vec::new();
    for _ in 0..n {
        let mut client = h1_connection(listen).await?;
        tasks.push(tokio::spawn(async move {
            let (resp, _) = get(&mut client, "/slow?ms=1500").await?;
            Ok(resp.status())
        }));
    }
    // All of them reached the app and are in its hands now.
    wait_for("the slow requests to reach the app", WAIT, || {
        let all_there = app.inflight() >= n as u64;
        async move { all_there.then_some(()) }
    })
    .await?;
    Ok(tasks)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_lets_in_flight_requests_finish_where_a_kill_loses_them() -> Result<()> {
    const N: usize = 8;
    let dir = scratch_dir("unix-drain")?;
    let app = UnixApp::start(&dir).await?;

    // Baseline: the proxy killed outright loses every request in flight.
    let mut killed = UnixSidecar::start(&app.path).await?;
    let tasks = slow_requests(killed.listen, &app, N).await?;
    killed.child.start_kill()?;
    let mut lost = 0;
    for task in tasks {
        if !matches!(task.await?, Ok(StatusCode::OK)) {
            lost += 1;
        }
    }
    ensure!(
        lost == N,
        "baseline: a killed proxy lost {lost} of {N}, expected all"
    );
    // The app is done with the orphaned requests before the second round.
    wait_for("the app to let go of the orphaned requests", WAIT, || {
        let idle = app.inflight() == 0;
        async move { idle.then_some(()) }
    })
    .await?;

    // With the drain: SIGTERM while the same requests are in flight.
    let mut sidecar = UnixSidecar::start(&app.path).await?;
    let tasks = slow_requests(sidecar.listen, &app, N).await?;
    let pid = sidecar.child.id().context("sidecar pid")?;
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()?;
    ensure!(status.success(), "kill -TERM failed");
    let mut ok = 0;
    for task in tasks {
        match within("in-flight request", WAIT, task).await?? {
            Ok(StatusCode::OK) => ok += 1,
            other => eprintln!("in-flight request ended with {other:?}"),
        }
    }
    ensure!(ok == N, "drain: {ok} of {N} in-flight requests succeeded");
    let exit = within("sidecar exit", WAIT, sidecar.child.wait()).await??;
    if !exit.success() {
        bail!("sidecar exited with {exit}; logs:\n{}", sidecar.logs_text());
    }
    Ok(())
}
