//! kubegrace-loadgen: constant-rate (open-loop) HTTP/1.1, HTTP/2 and gRPC load with every
//! request's outcome attributed to a reason. Runs as a Job in the cluster or on the host.
//!
//! stdout: the JSON summary on one line (easy to pick out of `kubectl logs`).
//! stderr: a start line and, last, `loadgen: N requests, M failed`.
//! Exit status 0 whatever failed (the numbers are the result); 2 on bad flags, 1 on errors.

use std::io::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use kubegrace_e2e::load::{self, Config, Protocol};

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
    // SIGTERM (the Job deleted) or Ctrl-C: stop sending, let in-flight requests finish,
    // and still print what was measured.
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let stop = async move {
        tokio::select! {
            _ = sigterm.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        eprintln!("loadgen: interrupted, waiting for the requests in flight");
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
