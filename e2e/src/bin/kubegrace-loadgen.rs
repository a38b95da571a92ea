//! kubegrace-loadgen: constant-rate (open-loop) HTTP/1.1, HTTP/2 and gRPC load with every
//! request's outcome attributed to a reason. Runs as a Job in the cluster or on the host.
//!
//! stdout: the JSON summary on one line (easy to pick out of `kubectl logs`).
//! stderr: a start line and, last, `loadgen: N requests, M failed`.
//! Exit status 0 whatever failed (the numbers are the result); 2 on bad flags, 1 on errors.
//!
//! `--control ADDR` (the in-cluster Job): a small HTTP/1.1 endpoint so whoever runs the
//! scenario can end the load when the rollout is done, through the API server's pod proxy
//! (`/api/v1/namespaces/NS/pods/POD:PORT/proxy/stop`), which works wherever the API server
//! reaches pods, kind included: `GET /ready` answers 200 once the load runs, `POST /stop`
//! stops sending (202; the requests in flight finish and are counted, then the summary is
//! printed and the process exits 0). Anything else gets a 404 or 405.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use bytes::Bytes;
use clap::Parser;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode};
use kubegrace_e2e::load::{self, Config, Protocol};
use tokio::sync::Notify;

#[derive(Debug, Parser)]
#[command(
    version,
    about = "Open-loop load with per-request failure reasons, for kubegrace rollouts"
)]
struct Args {
    /// Where to send the load: http://host:port (the Service's ClusterIP or DNS name).
    #[arg(long, alias = "url", env = "KUBEGRACE_LOADGEN_TARGET")]
    target: String,
    /// Where gRPC calls go, if not to --target.
    #[arg(long, env = "KUBEGRACE_LOADGEN_GRPC_TARGET")]
    grpc_target: Option<String>,
    #[arg(
        long,
        value_enum,
        env = "KUBEGRACE_LOADGEN_PROTOCOL",
        default_value = "http1"
    )]
    protocol: Protocol,
    /// Requests per second, sent on schedule whatever the responses do.
    #[arg(long, env = "KUBEGRACE_LOADGEN_RATE", default_value_t = 100.0)]
    rate: f64,
    /// How long to send (e.g. 30s, 2m).
    #[arg(long, env = "KUBEGRACE_LOADGEN_DURATION", value_parser = humantime::parse_duration, default_value = "30s")]
    duration: Duration,
    /// Never send more than this many requests.
    #[arg(
        long,
        env = "KUBEGRACE_LOADGEN_MAX_REQUESTS",
        default_value_t = 1_000_000
    )]
    max_requests: u64,
    /// Connections per protocol pool (HTTP/1.1: at most this many requests in flight).
    #[arg(long, env = "KUBEGRACE_LOADGEN_CONNECTIONS", default_value_t = 4)]
    connections: usize,
    /// Path and query of the HTTP requests.
    #[arg(long, env = "KUBEGRACE_LOADGEN_PATH", default_value = "/")]
    path: String,
    /// Deadline of one request, waiting for a connection and connecting included.
    #[arg(long, env = "KUBEGRACE_LOADGEN_TIMEOUT", value_parser = humantime::parse_duration, default_value = "5s")]
    timeout: Duration,
    /// Every Nth gRPC call is a server-streaming call (0: only unary).
    #[arg(long, default_value_t = 4)]
    grpc_stream_every: u64,
    /// Messages per gRPC stream.
    #[arg(long, default_value_t = 3)]
    grpc_stream_messages: u32,
    /// Pause between the messages of a gRPC stream.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "20ms")]
    grpc_stream_interval: Duration,
    /// Also write the summary (pretty JSON) here.
    #[arg(long, env = "KUBEGRACE_LOADGEN_OUT")]
    out: Option<PathBuf>,
    /// Write every request's outcome here, one JSON object per line.
    #[arg(long, env = "KUBEGRACE_LOADGEN_OUTCOMES")]
    outcomes: Option<PathBuf>,
    /// Serve `GET /ready` and `POST /stop` here (e.g. 0.0.0.0:9000), so the load can be
    /// ended when the rollout it measures is done.
    #[arg(long, env = "KUBEGRACE_LOADGEN_CONTROL")]
    control: Option<SocketAddr>,
}

/// `GET /ready`: 200 while the load runs. `POST /stop`: ends it (202).
async fn control(
    stop: Arc<Notify>,
    req: Request<hyper::body::Incoming>,
) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    let (status, body) = match (req.method(), req.uri().path()) {
        (&Method::GET, "/ready") => (StatusCode::OK, "sending\n"),
        (&Method::POST, "/stop") => {
            // notify_one stores a permit, so a stop that arrives before the run starts
            // waiting still counts.
            stop.notify_one();
            (StatusCode::ACCEPTED, "stopping\n")
        }
        (_, "/ready" | "/stop") => (StatusCode::METHOD_NOT_ALLOWED, "GET /ready, POST /stop\n"),
        _ => (StatusCode::NOT_FOUND, "try GET /ready or POST /stop\n"),
    };
    let mut resp = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *resp.status_mut() = status;
    Ok(resp)
}

/// Serves [`control`] on `addr` until the process ends.
async fn serve_control(addr: SocketAddr, stop: Arc<Notify>) -> Result<()> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding the control endpoint {addr}"))?;
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let stop = stop.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| control(stop.clone(), req));
                // A broken control connection only ends that connection.
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let cfg = Config {
        target: args.target,
        grpc_target: args.grpc_target,
        protocol: args.protocol,
        rate: args.rate,
        duration: args.duration,
        max_requests: args.max_requests,
        connections: args.connections,
        path: args.path,
        timeout: args.timeout,
        grpc_stream_every: args.grpc_stream_every,
        grpc_stream_messages: args.grpc_stream_messages,
        grpc_stream_interval: args.grpc_stream_interval,
    };
    eprintln!(
        "loadgen: {} at {}/s for {:?} ({} requests, {} connections, timeout {:?}) against {}",
        cfg.protocol.as_str(),
        cfg.rate,
        cfg.duration,
        cfg.scheduled(),
        cfg.connections,
        cfg.timeout,
        cfg.target
    );
    // SIGTERM (the Job deleted), Ctrl-C or POST /stop: stop sending, let in-flight
    // requests finish, and still print what was measured.
    let stop_requested = Arc::new(Notify::new());
    if let Some(addr) = args.control {
        serve_control(addr, stop_requested.clone()).await?;
        eprintln!("loadgen: control endpoint on {addr} (GET /ready, POST /stop)");
    }
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let stop = async move {
        let why = tokio::select! {
            _ = sigterm.recv() => "SIGTERM",
            _ = tokio::signal::ctrl_c() => "interrupt",
            _ = stop_requested.notified() => "POST /stop",
        };
        eprintln!("loadgen: {why}: stopped sending, waiting for the requests in flight");
    };
    let (mut outcomes, summary) = load::run_outcomes_until(&cfg, stop).await?;

    if let Some(path) = &args.outcomes {
        outcomes.sort_by_key(|o| o.seq);
        let mut file = std::io::BufWriter::new(
            std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?,
        );
        for o in &outcomes {
            serde_json::to_writer(&mut file, o)?;
            file.write_all(b"\n")?;
        }
        file.flush()
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.out {
        let json = serde_json::to_string_pretty(&summary)?;
        std::fs::write(path, json + "\n").with_context(|| format!("writing {}", path.display()))?;
    }
    println!("{}", serde_json::to_string(&summary)?);
    std::io::stdout().flush()?;
    eprintln!(
        "loadgen: {} requests, {} failed",
        summary.requests, summary.failed
    );
    Ok(())
}
