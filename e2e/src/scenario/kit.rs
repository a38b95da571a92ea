//! Clients for the demo app's long-lived exchanges (streamed HTTP bodies, gRPC server
//! streams, WebSocket sessions), its control endpoints (`/fault`, `/stats`), and the small
//! cluster helpers the in-flight and breaker tests share.
//!
//! Every long exchange returns a [`Session`]: how far it got and why it stopped, so a test
//! can print "6/6 finished" next to "cut after 3 of 24 messages (reset)".

use std::sync::Arc;
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
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use crate::load::conn::{ConnStats, Http2Pool};
use crate::load::grpc::{self, EchoRequest};
use crate::load::outcome::RequestCtx;
use crate::load::target::Target;

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
        let containers: Vec<_> = spec
            .init_containers
            .iter()
            .flatten()
            .chain(spec.containers.iter())
            .collect();
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
            admin_port: port_named("kg-admin"),
            name,
            uid,
            ip,
            app_port,
        });
    }
    Ok(out)
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
