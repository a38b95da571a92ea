//! The load generator behind `kubegrace-loadgen`, its loadgen Job ([`job`]), and the
//! attributed report of a rollout under load ([`report`]): one implementation for the e2e
//! tests, `make demo` and `kubectl kubegrace verify`.
//!
//! Open loop: request `i` is sent at `start + i / rate` whatever happened to the earlier
//! ones, so a stalled pod cannot slow the client down and hide its own failures (the
//! "coordinated omission" of closed-loop load tools). The count is exact:
//! `min(floor(rate * duration), max_requests)` requests are sent, every one is bounded by
//! `timeout`, so a run always ends by itself.
//!
//! Every request ends with a [`Reason`] (see [`outcome`]); no request is retried, except
//! that a request never written because its reused connection had been closed by the
//! server is sent on a new connection, as every real client does (see [`conn`]).
//!
//! Output ([`Summary`], JSON): `requests`, `failed`, `by_reason` (all six reasons,
//! zero-filled), `p50_ms`/`p90_ms`/`p99_ms`/`max_ms` (successful requests), `duration_s`,
//! `timeline` (`[{t, ok, failed, failed_by_reason}]`, one entry per second of send time),
//! plus `by_detail` (why, e.g. `"reset: h2 RST_STREAM REFUSED_STREAM"`), `by_kind`
//! (`http1`, `http2`, `grpc-unary`, `grpc-stream`), `by_pod` (who answered, or who dropped
//! it), `connects`, `stale_reconnects`, `started_at_unix_s`. Per-request records are
//! [`Outcome`]s (`--outcomes`, JSON Lines).

pub mod conn;
pub mod grpc;
pub mod job;
pub mod outcome;
pub mod report;
pub mod rollout;
pub mod summary;
pub mod target;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::Instant;

pub use outcome::{Failure, Reason};
pub use summary::{Outcome, Summary};

use conn::{ConnStats, Http1Pool, Http2Pool};
use outcome::RequestCtx;
use target::Target;

/// Errors of the load module (per-request failures are data, [`Failure`], not errors).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid target {url}: {reason}")]
    Target { url: String, reason: String },
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("parsing {path}: {source}")]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("encoding JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("{context}: {source}")]
    Kube {
        context: String,
        #[source]
        source: kube::Error,
    },
    /// The loadgen Job did not give a summary (its pod failed, or its log has none).
    #[error("{0}")]
    Job(String),
}

/// Which traffic to send.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// Keep-alive HTTP/1.1 GETs over a pool of connections.
    Http1,
    /// HTTP/2 prior knowledge (h2c) GETs multiplexed over a few connections.
    Http2,
    /// gRPC `kubegrace.demo.Echo` calls: unary, and every Nth a server stream.
    Grpc,
    /// Rotates http1, http2, grpc request by request.
    Mixed,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Http1 => "http1",
            Protocol::Http2 => "http2",
            Protocol::Grpc => "grpc",
            Protocol::Mixed => "mixed",
        }
    }
}

/// What one run does.
#[derive(Clone, Debug)]
pub struct Config {
    /// `http://host:port` (in the cluster: the Service's ClusterIP or DNS name).
    pub target: String,
    /// Where gRPC calls go, when not to `target`.
    pub grpc_target: Option<String>,
    pub protocol: Protocol,
    /// Requests per second (may be fractional).
    pub rate: f64,
    pub duration: Duration,
    /// Upper bound of the request count, whatever rate and duration say.
    pub max_requests: u64,
    /// Connections per pool (HTTP/1.1: concurrent requests; HTTP/2 and gRPC: multiplexed).
    pub connections: usize,
    /// Path (and query) of the HTTP requests.
    pub path: String,
    /// Deadline of one request, connect and queueing included.
    pub timeout: Duration,
    /// Every Nth gRPC call is a server stream (0: never).
    pub grpc_stream_every: u64,
    /// Messages per gRPC stream, and the pause between them.
    pub grpc_stream_messages: u32,
    pub grpc_stream_interval: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            target: "http://127.0.0.1:8080".into(),
            grpc_target: None,
            protocol: Protocol::Http1,
            rate: 100.0,
            duration: Duration::from_secs(10),
            max_requests: 1_000_000,
            connections: 4,
            path: "/".into(),
            timeout: Duration::from_secs(5),
            grpc_stream_every: 4,
            grpc_stream_messages: 3,
            grpc_stream_interval: Duration::from_millis(20),
        }
    }
}

/// Hard ceilings, so no flag combination turns the loadgen into something unbounded.
const MAX_RATE: f64 = 50_000.0;
const MAX_TIMEOUT: Duration = Duration::from_secs(300);
const MAX_CONNECTIONS: usize = 1_000;

impl Config {
    /// The number of requests this configuration schedules.
    pub fn scheduled(&self) -> u64 {
        // Small epsilon: 0.1/s for 30 s is 3 requests, not 2.9999 -> 2.
        let by_time = (self.rate * self.duration.as_secs_f64() + 1e-9).floor();
        (by_time.max(0.0) as u64).min(self.max_requests)
    }

    fn validate(&self) -> Result<(), Error> {
        let bad = |m: &str| Err(Error::Config(m.to_owned()));
        if !(self.rate > 0.0 && self.rate <= MAX_RATE) {
            return bad("rate must be > 0 and at most 50000 per second");
        }
        if self.timeout.is_zero() || self.timeout > MAX_TIMEOUT {
            return bad("timeout must be > 0 and at most 300s");
        }
        if self.connections == 0 || self.connections > MAX_CONNECTIONS {
            return bad("connections must be between 1 and 1000");
        }
        if !self.path.starts_with('/') {
            return bad("path must start with /");
        }
        if self.scheduled() == 0 {
            return bad("rate * duration (and max requests) schedule no request");
        }
        Ok(())
    }
}

/// The kind of one scheduled request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Http1,
    Http2,
    GrpcUnary,
    GrpcStream,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Http1 => "http1",
            Kind::Http2 => "http2",
            Kind::GrpcUnary => "grpc-unary",
            Kind::GrpcStream => "grpc-stream",
        }
    }
}

struct Clients {
    cfg: Config,
    http1: Option<Http1Pool>,
    http2: Option<Http2Pool>,
    grpc: Option<Arc<Http2Pool>>,
    stats: Arc<ConnStats>,
}

impl Clients {
    fn new(cfg: &Config) -> Result<Self, Error> {
        let target = Target::parse(&cfg.target)?;
        let stats = Arc::new(ConnStats::default());
        let (h1, h2, grpc) = match cfg.protocol {
            Protocol::Http1 => (true, false, false),
            Protocol::Http2 => (false, true, false),
            Protocol::Grpc => (false, false, true),
            Protocol::Mixed => (true, true, true),
        };
        let grpc_target = match &cfg.grpc_target {
            Some(url) => Target::parse(url)?,
            None => target.clone(),
        };
        Ok(Clients {
            cfg: cfg.clone(),
            http1: h1.then(|| Http1Pool::new(target.clone(), cfg.connections, stats.clone())),
            http2: h2.then(|| Http2Pool::new(target.clone(), cfg.connections, stats.clone())),
            grpc: grpc
                .then(|| Arc::new(Http2Pool::new(grpc_target, cfg.connections, stats.clone()))),
            stats,
        })
    }

    fn kind(&self, seq: u64) -> Kind {
        let grpc_kind = |n: u64| {
            let every = self.cfg.grpc_stream_every;
            if every > 0 && n % every == every - 1 {
                Kind::GrpcStream
            } else {
                Kind::GrpcUnary
            }
        };
        match self.cfg.protocol {
            Protocol::Http1 => Kind::Http1,
            Protocol::Http2 => Kind::Http2,
            Protocol::Grpc => grpc_kind(seq),
            Protocol::Mixed => match seq % 3 {
                0 => Kind::Http1,
                1 => Kind::Http2,
                _ => grpc_kind(seq / 3),
            },
        }
    }

    async fn request(&self, kind: Kind, seq: u64, ctx: &Arc<RequestCtx>) -> Result<(), Failure> {
        let path = &self.cfg.path;
        match kind {
            Kind::Http1 => client(&self.http1)?.get(path, ctx).await,
            Kind::Http2 => client(&self.http2)?.get(path, ctx).await,
            Kind::GrpcUnary => {
                let req = grpc::EchoRequest {
                    message: format!("req-{seq}"),
                    ..Default::default()
                };
                grpc::unary(client(&self.grpc)?, ctx, req).await.map(drop)
            }
            Kind::GrpcStream => {
                let req = grpc::EchoRequest {
                    message: format!("req-{seq}"),
                    count: self.cfg.grpc_stream_messages,
                    interval_ms: u32::try_from(self.cfg.grpc_stream_interval.as_millis())
                        .unwrap_or(u32::MAX),
                    ..Default::default()
                };
                grpc::stream(client(&self.grpc)?, ctx, req).await.map(drop)
            }
        }
    }
}

/// The client of a protocol the run was set up for.
fn client<P>(pool: &Option<P>) -> Result<&P, Failure> {
    pool.as_ref()
        .ok_or_else(|| Failure::new(Reason::Other, "no client for this protocol"))
}

/// Runs the schedule to the end and returns every outcome (in completion order) and the
/// summary.
pub async fn run_outcomes(cfg: &Config) -> Result<(Vec<Outcome>, Summary), Error> {
    run_outcomes_until(cfg, std::future::pending()).await
}

/// Like [`run_outcomes`], but stops sending when `stop` completes (e.g. on SIGTERM): the
/// requests in flight still finish (each within the timeout) and are counted, and the
/// summary's `requests` is then less than `scheduled`.
pub async fn run_outcomes_until(
    cfg: &Config,
    stop: impl std::future::Future<Output = ()>,
) -> Result<(Vec<Outcome>, Summary), Error> {
    cfg.validate()?;
    let clients = Arc::new(Clients::new(cfg)?);
    let scheduled = cfg.scheduled();
    let interval = Duration::from_secs_f64(1.0 / cfg.rate);
    // Reserve for a typical run only; a capped-but-huge schedule grows as it goes.
    let mut outcomes = Vec::with_capacity(scheduled.min(100_000) as usize);
    let mut tasks = JoinSet::new();
    let start = Instant::now();
    let started_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());

    tokio::pin!(stop);
    let mut stopped = false;
    for seq in 0..scheduled {
        // Absolute deadlines (not sleep(interval)), so scheduling delays don't accumulate;
        // if the process falls behind it sends the overdue requests at once (open loop).
        let due = start + interval.mul_f64(seq as f64);
        loop {
            tokio::select! {
                biased;
                _ = &mut stop, if !stopped => {
                    stopped = true;
                    break;
                }
                _ = tokio::time::sleep_until(due) => break,
                Some(done) = tasks.join_next() => collect(done, &mut outcomes),
            }
        }
        if stopped {
            break;
        }
        let clients = clients.clone();
        let timeout = cfg.timeout;
        tasks.spawn(async move {
            let kind = clients.kind(seq);
            let sent = Instant::now();
            let ctx = Arc::new(RequestCtx::default());
            let result = match tokio::time::timeout(timeout, clients.request(kind, seq, &ctx)).await
            {
                Ok(result) => result,
                Err(_) => Err(Failure::new(
                    Reason::Timeout,
                    format!("no answer in time ({})", ctx.phase().describe()),
                )),
            };
            let (reason, detail) = match result {
                Ok(()) => (Reason::Ok, String::new()),
                Err(f) => (f.reason, f.detail),
            };
            Outcome {
                seq,
                kind: kind.as_str().to_owned(),
                t_ms: summary::round3((sent - start).as_secs_f64() * 1000.0),
                latency_ms: summary::round3(sent.elapsed().as_secs_f64() * 1000.0),
                reason,
                detail,
                pod: ctx.pod().map(|p| p.to_string()),
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        collect(done, &mut outcomes);
    }

    let mut summary = Summary::from_outcomes(&outcomes);
    summary.target = cfg.target.clone();
    summary.protocol = cfg.protocol.as_str().to_owned();
    summary.rate = cfg.rate;
    summary.connections = cfg.connections;
    summary.scheduled = scheduled;
    summary.started_at_unix_s = summary::round3(started_at);
    summary.connects = clients.stats.connects.load(Ordering::Relaxed);
    summary.stale_reconnects = clients.stats.stale_reconnects.load(Ordering::Relaxed);
    Ok((outcomes, summary))
}

/// Runs the schedule and returns the summary.
pub async fn run(cfg: &Config) -> Result<Summary, Error> {
    Ok(run_outcomes(cfg).await?.1)
}

fn collect(done: Result<Outcome, tokio::task::JoinError>, outcomes: &mut Vec<Outcome>) {
    match done {
        Ok(outcome) => outcomes.push(outcome),
        // A request task cannot panic by design; if one does anyway, it still counts as a
        // request that failed, so the totals stay honest.
        Err(e) => outcomes.push(Outcome {
            seq: u64::MAX,
            kind: "unknown".into(),
            t_ms: 0.0,
            latency_ms: 0.0,
            reason: Reason::Other,
            detail: format!("request task failed: {e}"),
            pod: None,
        }),
    }
}
