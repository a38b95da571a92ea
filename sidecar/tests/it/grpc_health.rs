//! gRPC health while the pod drains (drain.grpcHealth): the sidecar answers
//! `grpc.health.v1.Health` with NOT_SERVING from the drain's start, so a
//! client that balances on health checks leaves the pod before its GOAWAY,
//! and a Watch stream never holds the drain to its deadline. Each test runs
//! the same steps with `app` (health calls always reach the app) and shows
//! what that costs.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use super::kit::grpc::ProstCodec;
use super::kit::sidecar::{InProcess, SidecarSpec};
use super::kit::{WAIT, wait_for, within};
use anyhow::{Context as _, Result, bail, ensure};
use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body::{Body, Frame};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tonic::transport::Channel;

const CHECK: &str = "/grpc.health.v1.Health/Check";
const WATCH: &str = "/grpc.health.v1.Health/Watch";
const UNARY: &str = "/kubegrace.test.Echo/Unary";

const SERVING: i32 = 1;
const NOT_SERVING: i32 = 2;

#[derive(Clone, PartialEq, prost::Message)]
struct HealthCheckRequest {
    #[prost(string, tag = "1")]
    service: String,
}

#[derive(Clone, PartialEq, prost::Message)]
struct HealthCheckResponse {
    #[prost(int32, tag = "1")]
    status: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Empty {}

/// A gRPC app (h2c) with the health service, always SERVING, and one unary
/// call. Its Watch sends SERVING every 50 ms, each message in two DATA
/// frames 20 ms apart, so a drain is likely to start inside a message.
struct HealthApp {
    addr: SocketAddr,
    checks: Arc<AtomicU64>,
    watches: Arc<AtomicU64>,
    unary: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for HealthApp {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn grpc_message(msg: &impl prost::Message) -> Bytes {
    let body = msg.encode_to_vec();
    let mut out = BytesMut::with_capacity(5 + body.len());
    out.put_u8(0);
    out.put_u32(u32::try_from(body.len()).unwrap_or(u32::MAX));
    out.put_slice(&body);
    out.freeze()
}

fn ok_trailers() -> HeaderMap {
    let mut t = HeaderMap::new();
    t.insert("grpc-status", HeaderValue::from_static("0"));
    t
}

/// A response body fed from a channel (a Watch stream the app holds open).
struct Channelled(mpsc::Receiver<Frame<Bytes>>);

impl Body for Channelled {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|f| f.map(Ok))
    }
}

impl HealthApp {
    async fn start() -> Result<HealthApp> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let checks = Arc::new(AtomicU64::new(0));
        let watches = Arc::new(AtomicU64::new(0));
        let unary = Arc::new(AtomicU64::new(0));
        let counters = (checks.clone(), watches.clone(), unary.clone());
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (checks, watches, unary) = counters.clone();
                let service = service_fn(move |req: Request<Incoming>| {
                    let (checks, watches, unary) = (checks.clone(), watches.clone(), unary.clone());
                    async move {
                        Ok::<_, Infallible>(Self::answer(
                            req.uri().path(),
                            &checks,
                            &watches,
                            &unary,
                        ))
                    }
                });
                tokio::spawn(async move {
                    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tcp), service)
                        .await;
                });
            }
        });
        Ok(HealthApp {
            addr,
            checks,
            watches,
            unary,
            task,
        })
    }

    fn answer(
        path: &str,
        checks: &AtomicU64,
        watches: &AtomicU64,
        unary: &AtomicU64,
    ) -> Response<Channelled> {
        let (tx, rx) = mpsc::channel(16);
        let serving = grpc_message(&HealthCheckResponse { status: SERVING });
        match path {
            CHECK | UNARY => {
                let message = if path == CHECK {
                    checks.fetch_add(1, Ordering::Relaxed);
                    serving
                } else {
                    unary.fetch_add(1, Ordering::Relaxed);
                    grpc_message(&Empty {})
                };
                let _ = tx.try_send(Frame::data(message));
                let _ = tx.try_send(Frame::trailers(ok_trailers()));
            }
            WATCH => {
                watches.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(async move {
                    // Bounded: 20 s of messages, far past any test here.
                    for _ in 0..400 {
                        // Split mid-message: the proxy must reassemble it.
                        let (head, tail) = serving.split_at(3);
                        for (part, pause_ms) in [(head, 20), (tail, 30)] {
                            let frame = Frame::data(Bytes::copy_from_slice(part));
                            if tx.send(frame).await.is_err() {
                                return;
                            }
                            tokio::time::sleep(Duration::from_millis(pause_ms)).await;
                        }
                    }
                });
            }
            _ => {
                let mut t = HeaderMap::new();
                t.insert("grpc-status", HeaderValue::from_static("12"));
                let _ = tx.try_send(Frame::trailers(t));
            }
        }
        let mut resp = Response::new(Channelled(rx));
        resp.headers_mut()
            .insert("content-type", HeaderValue::from_static("application/grpc"));
        resp
    }
}

/// Drain timers: a grace phase of 1.5 s (min delay) and a timeout short
/// enough that a Watch held to the deadline shows as a force-close.
fn sidecar_args(grpc_health: &str) -> Vec<&str> {
    vec![
        "--drain-min-delay",
        "1500ms",
        "--drain-quiet",
        "300ms",
        "--drain-max-delay",
        "2s",
        "--drain-timeout",
        "2s",
        "--drain-grpc-health",
        grpc_health,
    ]
}

async fn start(grpc_health: &str) -> Result<(HealthApp, InProcess)> {
    let app = HealthApp::start().await?;
    let sidecar =
        InProcess::start(SidecarSpec::new(app.addr).args(&sidecar_args(grpc_health))).await?;
    Ok((app, sidecar))
}

async fn channel(sidecar: &InProcess) -> Result<tonic::client::Grpc<Channel>> {
    let channel = Channel::from_shared(format!("http://{}", sidecar.listen))?
        .connect()
        .await
        .context("connect through the sidecar")?;
    Ok(tonic::client::Grpc::new(channel))
}

type HealthCodec = ProstCodec<HealthCheckRequest, HealthCheckResponse>;

/// A health request for the whole server (no service name) to `path`.
fn health_call(
    path: &'static str,
) -> (
    tonic::Request<HealthCheckRequest>,
    http::uri::PathAndQuery,
    HealthCodec,
) {
    let request = tonic::Request::new(HealthCheckRequest::default());
    let path = http::uri::PathAndQuery::from_static(path);
    (request, path, HealthCodec::default())
}

async fn check(grpc: &mut tonic::client::Grpc<Channel>) -> Result<i32> {
    grpc.ready().await.context("channel ready")?;
    let (request, path, codec) = health_call(CHECK);
    let resp = grpc.unary(request, path, codec).await.context("Check")?;
    Ok(resp.into_inner().status)
}

async fn watch(
    grpc: &mut tonic::client::Grpc<Channel>,
) -> Result<tonic::Streaming<HealthCheckResponse>> {
    grpc.ready().await.context("channel ready")?;
    let (request, path, codec) = health_call(WATCH);
    let resp = grpc
        .server_streaming(request, path, codec)
        .await
        .context("Watch")?;
    Ok(resp.into_inner())
}

async fn phase(sidecar: &InProcess) -> Result<f64> {
    sidecar.metric_sum("kubegrace_drain_phase").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_answers_not_serving_while_draining_unless_the_app_answers() -> Result<()> {
    for mode in ["notServing", "app"] {
        let (app, sidecar) = start(mode).await?;
        let mut grpc = channel(&sidecar).await?;
        ensure!(
            check(&mut grpc).await? == SERVING,
            "{mode}: SERVING before the drain"
        );
        ensure!(
            app.checks.load(Ordering::Relaxed) == 1,
            "{mode}: the app answered"
        );

        sidecar.start_drain().await?;
        let status = check(&mut grpc).await?;
        let app_checks = app.checks.load(Ordering::Relaxed);
        let answered = sidecar
            .metric("kubegrace_grpc_health_not_serving_total", "rpc=\"check\"")
            .await?;
        // notServing: the sidecar answers NOT_SERVING itself, once, counted;
        // app: the app's own answer, and the sidecar counts nothing.
        let want = if mode == "notServing" {
            (NOT_SERVING, 1, 1.0)
        } else {
            (SERVING, 2, 0.0)
        };
        ensure!(
            (status, app_checks, answered) == want,
            "{mode} while draining: (status, checks the app answered, answers the sidecar counted) \
             is {:?}, want {want:?}",
            (status, app_checks, answered)
        );
        // Other calls still reach the app while draining.
        grpc.ready().await?;
        grpc.unary(
            tonic::Request::new(Empty {}),
            http::uri::PathAndQuery::from_static(UNARY),
            ProstCodec::<Empty, Empty>::default(),
        )
        .await
        .with_context(|| format!("{mode}: a unary call while draining"))?;
        ensure!(
            app.unary.load(Ordering::Relaxed) == 1,
            "{mode}: unary reached the app"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_gets_not_serving_pushed_and_never_holds_the_drain() -> Result<()> {
    for mode in ["notServing", "app"] {
        let (app, sidecar) = start(mode).await?;
        let mut grpc = channel(&sidecar).await?;
        let mut stream = watch(&mut grpc).await?;
        for _ in 0..3 {
            let msg = within("SERVING before the drain", WAIT, stream.message())
                .await?
                .with_context(|| format!("{mode}: watch"))?
                .context("watch ended early")?;
            ensure!(msg.status == SERVING, "{mode}: {}", msg.status);
        }
        let triggered = Instant::now();
        sidecar.start_drain().await?;

        if mode == "notServing" {
            // Every message decodes (none was cut), and NOT_SERVING arrives
            // while the pod still serves (phase 1, before any GOAWAY).
            let told = loop {
                let msg = within("NOT_SERVING", WAIT, stream.message())
                    .await?
                    .context("watch failed before NOT_SERVING")?
                    .context("watch ended before NOT_SERVING")?;
                if msg.status == NOT_SERVING {
                    break triggered.elapsed();
                }
                ensure!(msg.status == SERVING, "unexpected status {}", msg.status);
            };
            ensure!(
                phase(&sidecar).await? == 1.0,
                "NOT_SERVING came after the grace phase"
            );
            ensure!(
                told < Duration::from_millis(1000),
                "NOT_SERVING took {told:?}"
            );
            // A Watch opened while draining is answered by the sidecar.
            let watches_before = app.watches.load(Ordering::Relaxed);
            let mut late = channel(&sidecar).await?;
            let mut late_stream = watch(&mut late).await?;
            let msg = within("late watch", WAIT, late_stream.message())
                .await?
                .context("late watch failed")?
                .context("late watch ended at once")?;
            ensure!(msg.status == NOT_SERVING, "late watch said {}", msg.status);
            ensure!(
                app.watches.load(Ordering::Relaxed) == watches_before,
                "the app saw the late watch"
            );
            // Nothing after it but the end of the call, when the listener closes.
            let end = within("the watch's end", WAIT, stream.message()).await?;
            let status = match end {
                Err(status) => status,
                Ok(msg) => bail!("after NOT_SERVING the watch went on: {msg:?}"),
            };
            ensure!(
                status.code() == tonic::Code::Unavailable,
                "ended with {status:?}"
            );
        }
        sidecar.wait_phase(3.0).await?;
        let forced = sidecar
            .metric_sum("kubegrace_drain_force_closed_total")
            .await?;
        if mode == "notServing" {
            ensure!(
                forced == 0.0,
                "the watch held the drain: {forced} force-closed"
            );
        } else {
            // The app keeps saying SERVING; the stream stays open to the deadline.
            ensure!(
                forced >= 1.0,
                "app mode: the watch should be cut at the deadline, {forced}"
            );
        }
        drop(stream);
    }
    Ok(())
}

/// One client per pod, Watch-driven: calls go round-robin to the pods whose
/// last health status is SERVING, one every 25 ms for 5 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_health_checking_client_leaves_the_pod_before_its_goaway() -> Result<()> {
    for mode in ["notServing", "app"] {
        let (app_a, a) = start(mode).await?;
        let (app_b, b) = start(mode).await?;
        let mut clients = Vec::new();
        let mut healthy = Vec::new();
        for pod in [&a, &b] {
            let mut grpc = channel(pod).await?;
            let mut stream = watch(&mut grpc).await?;
            let flag = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let f = flag.clone();
            tokio::spawn(async move {
                while let Ok(Some(msg)) = stream.message().await {
                    f.store(msg.status == SERVING, Ordering::Relaxed);
                }
                f.store(false, Ordering::Relaxed);
            });
            clients.push(grpc);
            healthy.push(flag);
        }
        wait_for("both pods healthy", WAIT, || async {
            healthy
                .iter()
                .all(|h| h.load(Ordering::Relaxed))
                .then_some(())
        })
        .await?;

        // Closing (the GOAWAY and the listener's close) as pod a's sidecar reports it.
        let mut closing_at: Option<Instant> = None;
        let t0 = Instant::now();
        let mut calls: Vec<(usize, Duration, bool)> = Vec::new();
        let mut drained = false;
        for (i, next) in (0..200).zip(0usize..) {
            if i == 40 {
                a.start_drain().await?;
                drained = true;
            }
            if drained && closing_at.is_none() && phase(&a).await? >= 2.0 {
                closing_at = Some(Instant::now());
            }
            let pick = (0..2)
                .map(|k| (next + k) % 2)
                .find(|&k| healthy[k].load(Ordering::Relaxed));
            let Some(k) = pick else { continue };
            let grpc = &mut clients[k];
            let ok = async {
                grpc.ready().await.ok()?;
                grpc.unary(
                    tonic::Request::new(Empty {}),
                    http::uri::PathAndQuery::from_static(UNARY),
                    ProstCodec::<Empty, Empty>::default(),
                )
                .await
                .ok()
            };
            let ok = tokio::time::timeout(Duration::from_secs(2), ok)
                .await
                .ok()
                .flatten()
                .is_some();
            calls.push((k, t0.elapsed(), ok));
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        let closing = closing_at
            .context("pod a never reached its closing phase")?
            .duration_since(t0);
        let to_a_after_goaway = calls
            .iter()
            .filter(|(k, at, _)| *k == 0 && *at >= closing)
            .count();
        let failed = calls.iter().filter(|(_, _, ok)| !ok).count();
        eprintln!(
            "{mode}: {} calls, {failed} failed, {to_a_after_goaway} sent to the draining pod after its GOAWAY (a served {}, b served {})",
            calls.len(),
            app_a.unary.load(Ordering::Relaxed),
            app_b.unary.load(Ordering::Relaxed)
        );
        if mode == "notServing" {
            ensure!(
                to_a_after_goaway == 0,
                "calls still went to pod a after its GOAWAY"
            );
            ensure!(failed == 0, "{failed} calls failed");
        } else {
            ensure!(
                to_a_after_goaway > 0,
                "app mode: the client should not know before the GOAWAY"
            );
        }
    }
    Ok(())
}
