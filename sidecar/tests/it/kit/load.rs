//! The one load generator: bounded HTTP/1.1 load through a [`Balancer`]
//! (kube-proxy's stand-in, or [`Balancer::fixed`] for one known address),
//! at a constant rate or as fast as the server answers, recording every
//! request's outcome and, for failures, why.
//!
//! Each keep-alive worker behaves like one client behind kube-proxy: it
//! asks the balancer for a pod only when it needs a new connection, keeps
//! that connection until the server closes it or answers
//! `Connection: close`, and never retries a failed request (a retry would
//! hide exactly the loss we count). A pooled connection found closed
//! *before* a request is written is replaced without counting a failure, as
//! every HTTP client does.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::io::ErrorKind;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpStream, UnixStream};
use tokio::task::JoinHandle;

use super::balancer::{Balancer, Target};
use super::wait_for;

#[derive(Debug, Clone)]
pub struct LoadSpec {
    /// Requests per second over all workers (0: as fast as answers come).
    pub rate: u32,
    /// Concurrent keep-alive clients.
    pub workers: usize,
    /// Concurrent clients that open a connection per request.
    pub fresh_workers: usize,
    /// Hard cap on requests sent; the loop stops by itself there.
    pub max_requests: u64,
    /// Hard cap on the loop's duration.
    pub max_duration: Duration,
    pub path: String,
    pub request_timeout: Duration,
    /// A client closes its connection after this many requests and asks the
    /// balancer again (0: keep it as long as the server does). This is the
    /// steady trickle of new connections real traffic has, independent of
    /// any drain: the thing routers keep sending to a terminating pod.
    pub requests_per_connection: u32,
}

impl Default for LoadSpec {
    fn default() -> Self {
        Self {
            rate: 300,
            workers: 8,
            fresh_workers: 0,
            max_requests: 6_000,
            max_duration: Duration::from_secs(40),
            path: "/work?ms=20".into(),
            request_timeout: Duration::from_secs(10),
            requests_per_connection: 0,
        }
    }
}

impl LoadSpec {
    /// The load of a pod-replacement test: `rate` requests/s from `workers`
    /// keep-alive clients that reconnect every 10 requests (the steady
    /// trickle of new connections routers keep sending to a terminating
    /// pod), up to 8,000 requests or 60 s.
    pub fn churning(rate: u32, workers: usize) -> Self {
        LoadSpec {
            rate,
            workers,
            max_requests: 8_000,
            max_duration: Duration::from_secs(60),
            requests_per_connection: 10,
            ..LoadSpec::default()
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Failure {
    /// Connection refused: the pod's listener was gone.
    Refused,
    /// The connection died under a request (RST, EOF before the response).
    Reset,
    /// A 5xx answer (e.g. the proxy's 502/503).
    Status5xx,
    /// No answer within the request timeout.
    Timeout,
    /// The balancer had no routable pod.
    NoEndpoint,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = match self {
            Self::Refused => "refused",
            Self::Reset => "reset",
            Self::Status5xx => "5xx",
            Self::Timeout => "timeout",
            Self::NoEndpoint => "no-endpoint",
        };
        f.write_str(text)
    }
}

#[derive(Debug, Clone)]
pub struct FailureRecord {
    pub pod: String,
    pub kind: Failure,
    pub detail: String,
}

#[derive(Debug, Clone, Default)]
pub struct LoadReport {
    pub sent: u64,
    pub ok: u64,
    pub ok_by_pod: BTreeMap<String, u64>,
    /// Successful responses that carried `Connection: close`, by pod.
    pub closes_by_pod: BTreeMap<String, u64>,
    pub failures: Vec<FailureRecord>,
}

impl LoadReport {
    pub fn failed(&self) -> usize {
        self.failures.len()
    }

    pub fn by_kind(&self) -> BTreeMap<String, usize> {
        let mut kinds = BTreeMap::new();
        for f in &self.failures {
            *kinds.entry(format!("{}@{}", f.kind, f.pod)).or_default() += 1;
        }
        kinds
    }

    fn merge(&mut self, other: LoadReport) {
        self.sent += other.sent;
        self.ok += other.ok;
        for (pod, n) in other.ok_by_pod {
            *self.ok_by_pod.entry(pod).or_default() += n;
        }
        for (pod, n) in other.closes_by_pod {
            *self.closes_by_pod.entry(pod).or_default() += n;
        }
        self.failures.extend(other.failures);
    }

    /// One line for the test output.
    pub fn summary(&self) -> String {
        format!(
            "{} of {} requests failed {:?}; ok by pod {:?}; Connection: close by pod {:?}",
            self.failed(),
            self.sent,
            self.by_kind(),
            self.ok_by_pod,
            self.closes_by_pod
        )
    }

    /// Fails, naming `what`, unless every request succeeded.
    pub fn ensure_lost_nothing(&self, what: &str) -> Result<()> {
        anyhow::ensure!(
            self.failures.is_empty(),
            "{what} lost requests: {}\n{}",
            self.summary(),
            self.failure_details()
        );
        Ok(())
    }

    /// The first few failures with their details, for assertion messages.
    pub fn failure_details(&self) -> String {
        self.failures
            .iter()
            .take(10)
            .map(|f| format!("{}@{}: {}", f.kind, f.pod, f.detail))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

struct Shared {
    spec: LoadSpec,
    balancer: Balancer,
    sent: AtomicU64,
    done: AtomicU64,
    ok: AtomicU64,
    stop: AtomicBool,
    started: Instant,
}

pub struct Load {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<LoadReport>>,
}

impl Load {
    pub fn start(balancer: Balancer, spec: LoadSpec) -> Self {
        let shared = Arc::new(Shared {
            spec,
            balancer,
            sent: AtomicU64::new(0),
            done: AtomicU64::new(0),
            ok: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            started: Instant::now(),
        });
        let keepalive = (0..shared.spec.workers).map(|_| false);
        let fresh = (0..shared.spec.fresh_workers).map(|_| true);
        let workers = keepalive
            .chain(fresh)
            .map(|fresh| tokio::spawn(worker(shared.clone(), fresh)))
            .collect();
        Self { shared, workers }
    }

    /// `keepalive` keep-alive clients and `fresh` one-request-per-connection
    /// clients against `target` (an address or a Unix socket), as fast as it answers, until stopped.
    pub fn against(target: impl Into<Target>, keepalive: usize, fresh: usize) -> Self {
        Self::start(
            Balancer::fixed("sidecar", target),
            LoadSpec {
                rate: 0,
                workers: keepalive,
                fresh_workers: fresh,
                max_requests: u64::MAX,
                max_duration: Duration::from_secs(600),
                path: "/work?ms=2".into(),
                ..LoadSpec::default()
            },
        )
    }

    /// Requests answered well so far.
    pub fn ok(&self) -> u64 {
        self.shared.ok.load(Ordering::SeqCst)
    }

    /// Waits (bounded) until `n` more requests succeeded than now.
    pub async fn wait_ok(&self, n: u64, within: Duration) -> Result<()> {
        self.wait_count("answered", Self::ok, n, within).await
    }

    /// Requests finished so far (any outcome).
    pub fn done(&self) -> u64 {
        self.shared.done.load(Ordering::SeqCst)
    }

    /// Waits (bounded) until `n` more requests have finished than now.
    pub async fn wait_more(&self, n: u64, within: Duration) -> Result<()> {
        self.wait_count("done", Self::done, n, within).await
    }

    async fn wait_count(
        &self,
        what: &str,
        count: fn(&Self) -> u64,
        n: u64,
        within: Duration,
    ) -> Result<()> {
        let target = count(self) + n;
        wait_for(&format!("{target} requests {what}"), within, || async {
            (count(self) >= target).then_some(())
        })
        .await
        .with_context(|| {
            format!(
                "load stalled at {} answered, {} done",
                self.ok(),
                self.done()
            )
        })
    }

    /// Stops the loop and collects every worker's report.
    pub async fn stop(mut self) -> Result<LoadReport> {
        self.shared.stop.store(true, Ordering::SeqCst);
        let mut report = LoadReport::default();
        for worker in std::mem::take(&mut self.workers) {
            let part = tokio::time::timeout(self.shared.spec.request_timeout * 2, worker)
                .await
                .context("load worker did not stop")?
                .context("load worker panicked")?;
            report.merge(part);
        }
        Ok(report)
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
    }
}

struct Conn {
    pod: String,
    sender: SendRequest<Empty<Bytes>>,
    used: u32,
}

enum Connect {
    Ok(Conn),
    Failed(FailureRecord),
}

async fn connect(balancer: &Balancer, limit: Duration) -> Connect {
    let Some((pod, target)) = balancer.pick() else {
        return Connect::Failed(FailureRecord {
            pod: "-".into(),
            kind: Failure::NoEndpoint,
            detail: "no routable pod".into(),
        });
    };
    let fail = |kind, detail: String| {
        Connect::Failed(FailureRecord {
            pod: pod.clone(),
            kind,
            detail,
        })
    };
    let handshake = match tokio::time::timeout(limit, open(&target)).await {
        Err(_) => return fail(Failure::Timeout, format!("connect {target} timed out")),
        Ok(Err(e)) if e.kind() == ErrorKind::ConnectionRefused => {
            return fail(Failure::Refused, format!("connect {target}: {e}"));
        }
        Ok(Err(e)) => return fail(Failure::Reset, format!("connect {target}: {e}")),
        Ok(Ok(handshake)) => handshake,
    };
    match handshake.await {
        Ok(sender) => Connect::Ok(Conn {
            pod: pod.clone(),
            sender,
            used: 0,
        }),
        Err(e) => fail(Failure::Reset, format!("handshake {target}: {e}")),
    }
}

type Handshake =
    std::pin::Pin<Box<dyn Future<Output = Result<SendRequest<Empty<Bytes>>, hyper::Error>> + Send>>;

/// Connects to `target`; the HTTP/1.1 handshake is left to the caller.
async fn open(target: &Target) -> std::io::Result<Handshake> {
    fn handshake<I>(io: I) -> Handshake
    where
        I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        Box::pin(async move {
            let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await?;
            tokio::spawn(conn);
            Ok(sender)
        })
    }
    Ok(match target {
        Target::Tcp(addr) => {
            let tcp = TcpStream::connect(addr).await?;
            let _ = tcp.set_nodelay(true);
            handshake(tcp)
        }
        Target::Unix(path) => handshake(UnixStream::connect(path).await?),
    })
}

fn classify(e: &hyper::Error) -> Failure {
    if e.is_timeout() {
        Failure::Timeout
    } else {
        Failure::Reset
    }
}

async fn worker(shared: Arc<Shared>, fresh: bool) -> LoadReport {
    let spec = &shared.spec;
    let mut report = LoadReport::default();
    let workers = (spec.workers + spec.fresh_workers).max(1);
    let mut tick = (spec.rate > 0).then(|| {
        let per_worker = f64::from(spec.rate) / workers as f64;
        let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / per_worker));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick
    });
    let mut conn: Option<Conn> = None;
    loop {
        if let Some(tick) = tick.as_mut() {
            tick.tick().await;
        }
        if shared.stop.load(Ordering::SeqCst) || shared.started.elapsed() >= spec.max_duration {
            break;
        }
        if shared.sent.fetch_add(1, Ordering::SeqCst) >= spec.max_requests {
            break;
        }
        report.sent += 1;
        let outcome = one_request(&shared, &mut conn, fresh).await;
        shared.done.fetch_add(1, Ordering::SeqCst);
        match outcome {
            Ok((pod, close)) => {
                shared.ok.fetch_add(1, Ordering::SeqCst);
                report.ok += 1;
                *report.ok_by_pod.entry(pod.clone()).or_default() += 1;
                if close {
                    *report.closes_by_pod.entry(pod).or_default() += 1;
                }
            }
            Err(record) => {
                if tick.is_none() && conn.is_none() {
                    // Unthrottled: a closed port must not turn the loop
                    // into a spin.
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                report.failures.push(record);
            }
        }
    }
    report
}

/// Sends one request, reusing the worker's connection when it is still open.
/// Ok((pod, server asked to close)).
async fn one_request(
    shared: &Shared,
    conn: &mut Option<Conn>,
    fresh: bool,
) -> Result<(String, bool), FailureRecord> {
    let spec = &shared.spec;
    // A pooled connection the server closed while it was idle is replaced
    // before anything is written: no request was lost.
    if let Some(c) = conn.as_mut()
        && (c.sender.is_closed() || !c.sender.is_ready())
    {
        let ready = tokio::time::timeout(Duration::from_millis(100), c.sender.ready()).await;
        if !matches!(ready, Ok(Ok(()))) {
            *conn = None;
        }
    }
    if conn.is_none() {
        match connect(&shared.balancer, spec.request_timeout).await {
            Connect::Ok(c) => *conn = Some(c),
            Connect::Failed(record) => return Err(record),
        }
    }
    let Some(c) = conn.as_mut() else {
        return Err(FailureRecord {
            pod: "-".into(),
            kind: Failure::NoEndpoint,
            detail: "no connection".into(),
        });
    };
    c.used += 1;
    let retire =
        fresh || (spec.requests_per_connection > 0 && c.used >= spec.requests_per_connection);
    let pod = c.pod.clone();
    let fail = |kind, detail: String| FailureRecord {
        pod: pod.clone(),
        kind,
        detail,
    };
    let mut req = Request::get(spec.path.as_str()).header(http::header::HOST, "app.test");
    if fresh {
        req = req.header(http::header::CONNECTION, "close");
    }
    let req = req
        .body(Empty::<Bytes>::new())
        .map_err(|e| fail(Failure::Reset, format!("build request: {e}")))?;
    let exchange = async {
        let resp = c.sender.send_request(req).await?;
        let (parts, body) = resp.into_parts();
        let body = body.collect().await?.to_bytes();
        Ok::<_, hyper::Error>((parts, body))
    };
    let result = tokio::time::timeout(spec.request_timeout, exchange).await;
    let (parts, _body) = match result {
        Err(_) => {
            *conn = None;
            return Err(fail(
                Failure::Timeout,
                format!("no answer within {:?}", spec.request_timeout),
            ));
        }
        Ok(Err(e)) => {
            *conn = None;
            return Err(fail(classify(&e), format!("{e} ({e:?})")));
        }
        Ok(Ok(answer)) => answer,
    };
    let close = super::http::connection_close(&parts.headers);
    if close || retire {
        // The client moves: its next request goes through the balancer.
        *conn = None;
    }
    if parts.status.is_server_error() {
        return Err(fail(Failure::Status5xx, format!("status {}", parts.status)));
    }
    Ok((pod, close))
}
