//! Clients for the demo app's long-lived exchanges (streamed HTTP bodies, gRPC server
//! streams, WebSocket sessions), its control endpoints (`/fault`, `/stats`), and the small
//! cluster helpers the in-flight and breaker tests share.
//!
//! Every long exchange returns a [`Session`]: how far it got and why it stopped, so a test
//! can print "6/6 finished" next to "cut after 3 of 24 messages (reset)".

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http_body_util::{BodyExt, Empty};
use hyper::header::HeaderMap;
use hyper_util::rt::{TokioExecutor, TokioIo};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;
use kubegrace_sidecar_api::admin;
use kubegrace_sidecar_api::config::FALLBACK_HEADER;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use crate::load::conn::{ConnStats, Http2Pool};
use crate::load::grpc::{self, EchoRequest};
use crate::load::outcome::RequestCtx;
use crate::load::target::Target;
use crate::scenario::{Patience, Progress, Scenario, graceroute};

/// How one long exchange ended.
#[derive(Clone, Debug)]
pub struct Session {
    /// `http1 /delay`, `grpc stream`, `websocket`, ...
    pub kind: String,
    /// Units done: 1 for a plain request, chunks for a stream, echoed messages for a
    /// WebSocket session, replies for a gRPC stream.
    pub done: usize,
    pub expected: usize,
    /// The pod that answered, when the exchange named it.
    pub pod: Option<String>,
    /// Why it stopped early, `None` when it finished cleanly.
    pub error: Option<String>,
}

impl Session {
    fn new(kind: impl Into<String>, expected: usize) -> Session {
        Session {
            kind: kind.into(),
            done: 0,
            expected,
            pod: None,
            error: None,
        }
    }

    /// Finished cleanly: everything expected arrived and nothing failed.
    pub fn finished(&self) -> bool {
        self.error.is_none() && self.done == self.expected
    }

    fn fail(mut self, error: impl std::fmt::Display) -> Session {
        self.error = Some(error.to_string());
        self
    }
}

impl std::fmt::Display for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let pod = self.pod.as_deref().unwrap_or("?");
        match &self.error {
            None if self.done == self.expected => {
                write!(
                    f,
                    "{} on {pod}: finished {}/{}",
                    self.kind, self.done, self.expected
                )
            }
            None => write!(
                f,
                "{} on {pod}: ended early {}/{}",
                self.kind, self.done, self.expected
            ),
            Some(e) => write!(
                f,
                "{} on {pod}: cut at {}/{}: {e}",
                self.kind, self.done, self.expected
            ),
        }
    }
}

/// The pod named at the start of a demo-app body (`pod=<name> ...`).
fn pod_in(body: &str) -> Option<String> {
    let rest = body.strip_prefix("pod=")?;
    Some(rest.split_whitespace().next().unwrap_or("").to_owned())
}

async fn connect(addr: &str) -> Result<TcpStream> {
    let stream = TcpStream::connect(addr)
        .await
        .with_context(|| format!("connecting to {addr}"))?;
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

/// One HTTP/1.1 request on a fresh connection; returns status, headers and body.
pub async fn http1(
    addr: &str,
    method: &str,
    path: &str,
    timeout: Duration,
) -> Result<(u16, HeaderMap, String)> {
    let fut = async {
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(TokioIo::new(connect(addr).await?)).await?;
        tokio::spawn(conn);
        let req = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, addr)
            .body(Empty::<Bytes>::new())?;
        let resp = sender.send_request(req).await?;
        let (head, body) = resp.into_parts();
        let body = body.collect().await?.to_bytes();
        Ok::<_, anyhow::Error>((
            head.status.as_u16(),
            head.headers,
            String::from_utf8_lossy(&body).into_owned(),
        ))
    };
    tokio::time::timeout(timeout, fut)
        .await
        .map_err(|_| anyhow!("{method} http://{addr}{path}: no answer within {timeout:?}"))?
}

/// One HTTP/2 (h2c prior knowledge) GET on a fresh connection; returns status and body.
pub async fn h2_get(addr: &str, path: &str, timeout: Duration) -> Result<(u16, String)> {
    let fut = async {
        let (mut sender, conn) = hyper::client::conn::http2::handshake(
            TokioExecutor::new(),
            TokioIo::new(connect(addr).await?),
        )
        .await?;
        tokio::spawn(conn);
        let req = hyper::Request::get(format!("http://{addr}{path}")).body(Empty::<Bytes>::new())?;
        let resp = sender.send_request(req).await?;
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await?.to_bytes();
        Ok::<_, anyhow::Error>((status, String::from_utf8_lossy(&body).into_owned()))
    };
    tokio::time::timeout(timeout, fut)
        .await
        .map_err(|_| anyhow!("h2 GET http://{addr}{path}: no answer within {timeout:?}"))?
}

/// A long plain request (`/delay?ms=N`) over HTTP/1.1: finished when the 200 answer arrives
/// whole.
pub async fn long_request(addr: &str, delay_ms: u64, timeout: Duration) -> Session {
    let session = Session::new(format!("http1 GET /delay?ms={delay_ms}"), 1);
    match http1(addr, "GET", &format!("/delay?ms={delay_ms}"), timeout).await {
        Ok((200, _, body)) => Session {
            done: 1,
            pod: pod_in(&body),
            ..session
        },
        Ok((status, _, body)) => session.fail(format!("status {status}: {}", body.trim())),
        Err(e) => session.fail(format!("{e:#}")),
    }
}

/// Starts a [`long_request`] on `pod` through its sidecar and waits until the app reports
/// it in flight, so a drain begun next finds it there; the task ends with the request.
pub async fn start_long_request(
    pod: &PodAddr,
    delay_ms: u64,
    timeout: Duration,
    p: &Progress,
) -> Result<tokio::task::JoinHandle<Session>> {
    if pod.admin_port.is_none() {
        bail!("pod {} has no sidecar", pod.name);
    }
    let front = pod.front();
    p.step(format!(
        "a {delay_ms} ms request on pod {} via {front}",
        pod.name
    ));
    let task = tokio::spawn(async move { long_request(&front, delay_ms, timeout).await });
    let app = pod.app();
    p.wait(
        &format!("pod {}'s app reports the long request in flight", pod.name),
        Patience::new(Duration::from_secs(20), Duration::from_millis(100)),
        || async {
            let s = app_stats(&app).await.map_err(|e| format!("{e:#}"))?;
            let n = stat(&s, "/delay", "inflight");
            if n >= 1 {
                Ok(())
            } else {
                Err(format!("/delay in flight: {n}"))
            }
        },
    )
    .await?;
    Ok(task)
}

/// The route `name` once its `status.lastDrains` counts at least `pods` drained pods.
pub async fn wait_last_drains(
    sc: &Scenario,
    name: &str,
    pods: i64,
    p: &Progress,
) -> Result<kube::core::DynamicObject> {
    let routes = crate::scenario::graceroute_api(&sc.client, &sc.namespace);
    p.wait(
        &format!("status.lastDrains counts {pods} drained pods"),
        Patience::API_CHANGE,
        || async {
            let route = routes.get(name).await.map_err(|e| format!("{e:#}"))?;
            let last = &route.data["status"]["lastDrains"];
            if last["pods"].as_i64().unwrap_or(0) >= pods {
                Ok(route)
            } else {
                Err(format!("lastDrains: {last}"))
            }
        },
    )
    .await
}

/// A streamed HTTP/1.1 response (`/stream?chunks=N&every_ms=M`), read chunk by chunk.
pub async fn http_stream(addr: &str, chunks: usize, every_ms: u64, timeout: Duration) -> Session {
    let path = format!("/stream?chunks={chunks}&every_ms={every_ms}");
    let mut session = Session::new(format!("http1 GET {path}"), chunks);
    let run = async {
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(TokioIo::new(connect(addr).await?)).await?;
        tokio::spawn(conn);
        let req = hyper::Request::get(path.as_str())
            .header(hyper::header::HOST, addr)
            .body(Empty::<Bytes>::new())?;
        let resp = sender.send_request(req).await?;
        if resp.status() != 200 {
            bail!("status {}", resp.status());
        }
        let mut body = resp.into_body();
        let mut text = String::new();
        while let Some(frame) = body.frame().await {
            if let Ok(data) = frame?.into_data() {
                text.push_str(&String::from_utf8_lossy(&data));
                session.done = text.matches('\n').count();
                if session.pod.is_none() {
                    session.pod = pod_in(&text);
                }
            }
        }
        Ok(())
    };
    match tokio::time::timeout(timeout, run).await {
        Ok(Ok(())) => session,
        Ok(Err(e)) => session.fail(format!("{e:#}")),
        Err(_) => session.fail(format!("not done within {timeout:?}")),
    }
}

/// A gRPC server stream (`kubegrace.demo.Echo/Stream`) over its own h2c connection.
pub async fn grpc_stream(addr: &str, count: u32, interval_ms: u32, timeout: Duration) -> Session {
    let session = Session::new(
        format!("grpc Stream count={count} interval={interval_ms}ms"),
        count as usize,
    );
    let target = match Target::parse(&format!("http://{addr}")) {
        Ok(t) => t,
        Err(e) => return session.fail(e),
    };
    let pool = Arc::new(Http2Pool::new(target, 1, Arc::new(ConnStats::default())));
    let ctx = Arc::new(RequestCtx::default());
    let req = EchoRequest {
        message: "in flight".into(),
        delay_ms: 0,
        count,
        interval_ms,
    };
    let result = tokio::time::timeout(timeout, grpc::stream(&pool, &ctx, req)).await;
    let pod = ctx.pod().map(|p| p.to_string());
    match result {
        Ok(Ok(replies)) => Session {
            done: replies.len(),
            pod: replies.first().map(|r| r.pod.clone()).or(pod),
            ..session
        },
        Ok(Err(failure)) => Session { pod, ..session }.fail(format!(
            "{}: {}",
            failure.reason.as_str(),
            failure.detail
        )),
        Err(_) => Session { pod, ..session }.fail(format!("not done within {timeout:?}")),
    }
}

/// A WebSocket session on `/ws`: sends `messages` text messages, one every `every`, waits
/// for each echo, then closes (the closing handshake must complete too).
pub async fn websocket(addr: &str, messages: usize, every: Duration, timeout: Duration) -> Session {
    let mut session = Session::new(
        format!(
            "websocket {messages} messages every {}ms",
            every.as_millis()
        ),
        messages,
    );
    let run = async {
        let request = format!("ws://{addr}/ws").into_client_request()?;
        let (mut ws, resp) = tokio_tungstenite::client_async(request, connect(addr).await?).await?;
        session.pod = resp
            .headers()
            .get("x-demo-pod")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        for i in 0..messages {
            if i > 0 {
                // Pacing of the session (messages flow for its whole length), not a wait for
                // a condition.
                tokio::time::sleep(every).await;
            }
            let sent = format!("message {i}");
            ws.send(Message::text(sent.clone())).await?;
            loop {
                match ws.next().await {
                    Some(Ok(Message::Text(t))) if t.as_str() == sent => break,
                    Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
                    Some(Ok(other)) => bail!("unexpected message {other:?}"),
                    Some(Err(e)) => return Err(e.into()),
                    None => bail!("connection closed"),
                }
            }
            session.done = i + 1;
        }
        ws.close(None).await?;
        // The server's close frame ends the stream; anything else is a cut.
        loop {
            match ws.next().await {
                Some(Ok(Message::Close(_))) | None => return Ok(()),
                Some(Ok(_)) => continue,
                Some(Err(e)) => return Err(e.into()),
            }
        }
    };
    match tokio::time::timeout(timeout, run).await {
        Ok(Ok(())) => session,
        Ok(Err(e)) => session.fail(format!("{e:#}")),
        Err(_) => session.fail(format!("not done within {timeout:?}")),
    }
}

/// The app's `/stats` (JSON), read straight from the app's own port.
pub async fn app_stats(app_addr: &str) -> Result<serde_json::Value> {
    let (status, _, body) = http1(app_addr, "GET", "/stats", Duration::from_secs(3)).await?;
    if status != 200 {
        bail!(
            "GET http://{app_addr}/stats: status {status}: {}",
            body.trim()
        );
    }
    serde_json::from_str(&body).with_context(|| format!("parsing /stats of {app_addr}: {body}"))
}

/// `endpoint`'s counter `field` (`requests` or `inflight`) in a `/stats` answer.
pub fn stat(stats: &serde_json::Value, endpoint: &str, field: &str) -> u64 {
    stats["endpoints"][endpoint][field].as_u64().unwrap_or(0)
}

/// Flips the app's fault switch: `Some(status)` on (for every app path), `None` off.
pub async fn set_fault(app_addr: &str, status: Option<u16>) -> Result<()> {
    let query = match status {
        Some(s) => format!("/fault?status={s}"),
        None => "/fault?off".to_owned(),
    };
    let (code, _, body) = http1(app_addr, "POST", &query, Duration::from_secs(3)).await?;
    if code != 200 {
        bail!(
            "POST http://{app_addr}{query}: status {code}: {}",
            body.trim()
        );
    }
    Ok(())
}

/// A running pod of the workload: its name, IP, and the port numbers that matter.
#[derive(Clone, Debug)]
pub struct PodAddr {
    pub name: String,
    pub uid: String,
    pub ip: String,
    /// Where the Service's `targetPort: http` lands: the sidecar's listener when injected,
    /// else the app itself.
    pub front_port: i32,
    /// The app's own port (behind the sidecar when injected).
    pub app_port: i32,
    /// The sidecar's admin port, when injected.
    pub admin_port: Option<i32>,
}

impl PodAddr {
    pub fn front(&self) -> String {
        format!("{}:{}", self.ip, self.front_port)
    }

    pub fn app(&self) -> String {
        format!("{}:{}", self.ip, self.app_port)
    }

    pub fn admin(&self) -> Option<String> {
        self.admin_port.map(|p| format!("{}:{p}", self.ip))
    }
}

/// The pods labelled `app=<app>` that are not terminating, ready or not.
pub async fn live_pods(pods: &Api<Pod>, app: &str) -> Result<Vec<Pod>> {
    let list = pods
        .list(&ListParams::default().labels(&format!("app={app}")))
        .await?;
    Ok(list
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect())
}

/// The ready, not terminating pods labelled `app=<app>`, with their ports read from the
/// pod spec: the port named `http` is the front (the sidecar takes that name), the app's
/// container port is the app, `kg-admin` the sidecar's admin.
pub async fn ready_pods(pods: &Api<Pod>, app: &str) -> Result<Vec<PodAddr>> {
    let list = pods
        .list(&ListParams::default().labels(&format!("app={app}")))
        .await?;
    let mut out = Vec::new();
    for p in list.items {
        let ready = p
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        if p.metadata.deletion_timestamp.is_some() || !ready {
            continue;
        }
        let (Some(name), Some(uid)) = (p.metadata.name.clone(), p.metadata.uid.clone()) else {
            continue;
        };
        let Some(ip) = p.status.as_ref().and_then(|s| s.pod_ip.clone()) else {
            continue;
        };
        let spec = p.spec.clone().unwrap_or_default();
        let containers = super::all_containers(&p);
        let port_named = |wanted: &str| {
            containers
                .iter()
                .flat_map(|c| c.ports.iter().flatten())
                .find(|port| port.name.as_deref() == Some(wanted))
                .map(|port| port.container_port)
        };
        let app_port = spec
            .containers
            .iter()
            .find(|c| c.name == "app")
            .and_then(|c| c.ports.as_ref()?.first().map(|p| p.container_port))
            .with_context(|| format!("pod {name}: no app container port"))?;
        out.push(PodAddr {
            front_port: port_named("http").unwrap_or(app_port),
            admin_port: port_named(admin::PORT_NAME),
            name,
            uid,
            ip,
            app_port,
        });
    }
    Ok(out)
}

/// Deploys `name` (annotated `kubegrace.io/inject=enabled`, `sc.opts.replicas` pods) with a
/// Service and a GraceRoute whose spec is the scenario's (target, port `http`, drain timers)
/// plus `route_spec` merged over it (e.g. `{"routes": [...]}`), then waits until it is
/// settled (see [`Scenario::settle`]).
pub async fn deploy_with_route(
    sc: &Scenario,
    name: &str,
    route_spec: serde_json::Value,
    p: &Progress,
) -> Result<()> {
    let route = graceroute(name, &sc.opts.drain, route_spec)?;
    sc.post_route(&route).await?;
    p.step(format!("GraceRoute {name}: {}", route.data["spec"]));
    sc.create_app(name, true, p).await?;
    sc.settle(name, true, p).await
}

/// The sidecar's `GET /breakers` entry of route `route` on this admin address.
pub async fn breaker(admin_addr: &str, route: &str) -> Result<serde_json::Value> {
    let (status, _, body) = http1(
        admin_addr,
        "GET",
        admin::path::BREAKERS,
        Duration::from_secs(3),
    )
    .await?;
    if status != 200 {
        bail!(
            "GET http://{admin_addr}/breakers: status {status}: {}",
            body.trim()
        );
    }
    let all: serde_json::Value = serde_json::from_str(&body)
        .with_context(|| format!("parsing /breakers of {admin_addr}: {body}"))?;
    all["routes"]
        .as_array()
        .and_then(|rs| rs.iter().find(|r| r["name"] == route))
        .cloned()
        .with_context(|| format!("no route {route} in /breakers of {admin_addr}: {body}"))
}

/// What came back for the requests sent in one phase of a [`ConstantLoad`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    pub sent: u64,
    /// 2xx from the app (no `x-kubegrace-fallback` header).
    pub ok: u64,
    /// Served by the sidecar instead of the app, with `x-kubegrace-fallback: breaker_open`.
    pub fallback_breaker_open: u64,
    /// Served by the sidecar with another `x-kubegrace-fallback` reason (queue full/timeout).
    pub fallback_other: u64,
    /// A non-2xx answer without the fallback header: the app's own (or the proxy's) error.
    pub error_status: u64,
    /// No answer: refused, reset, timed out.
    pub transport_error: u64,
}

impl Tally {
    pub fn answered(&self) -> u64 {
        self.ok + self.fallback_breaker_open + self.fallback_other + self.error_status
    }

    pub fn done(&self) -> u64 {
        self.answered() + self.transport_error
    }
}

const PHASES: usize = 8;

/// A constant rate of HTTP/1.1 GETs on one path, each on a new connection (so kube-proxy
/// spreads them over every pod behind a Service), tallied per phase: the phase a request
/// counts in is the one set when it was sent, so a phase's tally never mixes in answers
/// to requests sent before it. Bounded by `max_duration` (and so in count).
pub struct ConstantLoad {
    phase: Arc<AtomicUsize>,
    tallies: Arc<Mutex<[Tally; PHASES]>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl ConstantLoad {
    pub fn start(addr: String, path: String, rate: f64, max_duration: Duration) -> ConstantLoad {
        let phase = Arc::new(AtomicUsize::new(0));
        let tallies = Arc::new(Mutex::new([Tally::default(); PHASES]));
        let (stop_tx, mut stop_rx) = tokio::sync::oneshot::channel::<()>();
        let (ph, ta) = (phase.clone(), tallies.clone());
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate.max(0.1)));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let end = tokio::time::Instant::now() + max_duration;
            let mut requests = tokio::task::JoinSet::new();
            loop {
                tokio::select! {
                    _ = &mut stop_rx => break,
                    _ = tokio::time::sleep_until(end) => break,
                    _ = tick.tick() => {}
                }
                let at = ph.load(Ordering::SeqCst).min(PHASES - 1);
                lock(&ta)[at].sent += 1;
                let (addr, path, ta) = (addr.clone(), path.clone(), ta.clone());
                requests.spawn(async move {
                    let result = http1(&addr, "GET", &path, Duration::from_secs(5)).await;
                    let mut tallies = lock(&ta);
                    let t = &mut tallies[at];
                    match result {
                        Ok((status, headers, _)) => {
                            match headers.get(FALLBACK_HEADER).map(|v| v.as_bytes()) {
                                Some(b"breaker_open") => t.fallback_breaker_open += 1,
                                Some(_) => t.fallback_other += 1,
                                None if (200..300).contains(&status) => t.ok += 1,
                                None => t.error_status += 1,
                            }
                        }
                        Err(_) => t.transport_error += 1,
                    }
                });
                // Reap finished requests so the set stays small.
                while requests.try_join_next().is_some() {}
            }
            while requests.join_next().await.is_some() {}
        });
        ConstantLoad {
            phase,
            tallies,
            stop: Some(stop_tx),
            task,
        }
    }

    /// Requests sent from now on count in phase `phase` (below 8).
    pub fn set_phase(&self, phase: usize) {
        self.phase.store(phase.min(PHASES - 1), Ordering::SeqCst);
    }

    pub fn tally(&self, phase: usize) -> Tally {
        lock(&self.tallies)[phase.min(PHASES - 1)]
    }

    /// Stops sending, waits for the answers still due, and returns every phase's tally.
    pub async fn stop(mut self) -> [Tally; PHASES] {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.task).await;
        *lock(&self.tallies)
    }
}

impl Drop for ConstantLoad {
    fn drop(&mut self) {
        // A test that fails midway must not leave load running.
        self.task.abort();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_is_finished_only_when_complete_and_clean() {
        let mut s = Session::new("x", 3);
        s.done = 3;
        assert!(s.finished());
        s.done = 2;
        assert!(!s.finished());
        s.done = 3;
        assert!(!s.fail("reset").finished());
    }

    #[test]
    fn reads_the_pod_from_a_demo_body() {
        assert_eq!(pod_in("pod=web-1 delayed_ms=5\n").as_deref(), Some("web-1"));
        assert_eq!(pod_in("nope"), None);
    }
}
