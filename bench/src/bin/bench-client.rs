//! The two loads wrk and h2load cannot make:
//!
//! - `rate`: a constant request rate well below saturation, for latency
//!   (wrk has no constant-rate mode; wrk2 is not packaged). Latency counts
//!   from the time a request was *due*, not when it was sent, whenever the
//!   connection was still busy with the previous one, so a stalled proxy
//!   cannot hide its stall by delaying our sends (coordinated omission).
//! - `drain`: holds idle keep-alive connections or slow in-flight requests
//!   open while the harness tells the proxy to stop, and reports what the
//!   proxy did to them.
//! - `close`: an exact number of requests, each on a connection of its own
//!   (`Connection: close`), for `bench/profile`'s per-connection count
//!   (wrk runs for a time, not a number of requests).
//! - `h2-hold`: idle HTTP/2 connections and open HTTP/2 streams held while
//!   the harness reads the proxy's memory (client/h2hold.rs).
//!
//! Each prints one JSON object on stdout for the harness.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use bytes::Bytes;
use clap::{Parser, Subcommand};
use http_body_util::{BodyExt as _, Empty};
use hyper::Request;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use kubegrace_bench::stats::percentile_sorted;
use serde::Serialize;
use tokio::io::AsyncBufReadExt as _;
use tokio::net::TcpStream;

#[path = "client/h2hold.rs"]
mod h2hold;

#[derive(Parser, Debug)]
#[command(about = "Constant-rate latency client and drain client for the kubegrace benchmark")]
struct Args {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Send requests at a fixed rate over keep-alive connections.
    Rate {
        #[arg(long)]
        target: SocketAddr,
        /// Requests per second, spread evenly over the connections.
        #[arg(long, default_value_t = 2000)]
        rate: u32,
        /// Measured time, after the warm-up.
        #[arg(long, default_value_t = 5.0)]
        seconds: f64,
        #[arg(long, default_value_t = 32)]
        connections: u32,
        /// Sent at the same rate but not recorded: the first requests pay
        /// for cold pools, page faults and the proxy's first upstream
        /// connects, which is start-up cost, not per-request latency.
        #[arg(long, default_value_t = 1.0)]
        warmup_seconds: f64,
    },
    /// Open connections, print `ready`, then wait until the proxy closes
    /// them (idle) or the slow requests finish, and report.
    Drain {
        #[arg(long)]
        target: SocketAddr,
        /// Idle keep-alive connections: one request each, then silence.
        #[arg(long, default_value_t = 0)]
        idle: u32,
        /// Slow requests in flight, one per connection.
        #[arg(long, default_value_t = 0)]
        slow: u32,
        /// How long the upstream holds each slow request.
        #[arg(long, default_value_t = 1000)]
        slow_ms: u64,
        /// Give up waiting after this long.
        #[arg(long, default_value_t = 30.0)]
        timeout_seconds: f64,
    },
    /// Send exactly `requests` requests, each on a new connection that
    /// closes after it, `connections` at a time.
    Close {
        #[arg(long)]
        target: SocketAddr,
        #[arg(long, default_value_t = 1000)]
        requests: u64,
        #[arg(long, default_value_t = 64)]
        connections: u32,
    },
    /// Hold idle h2c connections and open HTTP/2 streams (h2hold.rs), print
    /// `ready`, and keep them until stdin closes or the hold time passes.
    H2Hold {
        #[arg(long)]
        target: SocketAddr,
        /// Idle h2c connections: settings exchanged, `requests` requests
        /// answered one after another.
        #[arg(long, default_value_t = 0)]
        connections: u32,
        /// Requests each idle connection makes before it goes quiet (a
        /// connection that carried traffic may keep more than a fresh one).
        #[arg(long, default_value_t = 1)]
        requests: u32,
        /// Requests to `/slow/<slow-ms>` left open.
        #[arg(long, default_value_t = 0)]
        streams: u32,
        /// Connections the streams are spread over.
        #[arg(long, default_value_t = 10)]
        stream_connections: u32,
        #[arg(long, default_value_t = 60_000)]
        slow_ms: u64,
        /// The longest opening everything may take.
        #[arg(long, default_value_t = 60.0)]
        timeout_seconds: f64,
        /// The longest everything is held after `ready`.
        #[arg(long, default_value_t = 60.0)]
        hold_seconds: f64,
    },
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // One thread: the client shares a core with the upstream and must not
    // take more of it than it needs.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("building the tokio runtime")?;
    match args.command {
        Cmd::Rate {
            target,
            rate,
            seconds,
            connections,
            warmup_seconds,
        } => runtime.block_on(rate_run(target, rate, seconds, connections, warmup_seconds)),
        Cmd::Drain {
            target,
            idle,
            slow,
            slow_ms,
            timeout_seconds,
        } => runtime.block_on(drain_run(target, idle, slow, slow_ms, timeout_seconds)),
        Cmd::Close {
            target,
            requests,
            connections,
        } => runtime.block_on(close_run(target, requests, connections)),
        Cmd::H2Hold {
            target,
            connections,
            requests,
            streams,
            stream_connections,
            slow_ms,
            timeout_seconds,
            hold_seconds,
        } => {
            let seconds = |s: f64| Duration::try_from_secs_f64(s).context("a time in seconds");
            let plan = h2hold::Plan {
                target,
                connections,
                streams,
                stream_connections,
                slow_ms,
                open_timeout: seconds(timeout_seconds)?,
                hold: seconds(hold_seconds)?,
                requests,
            };
            runtime.block_on(h2hold::run(plan))?;
            // Whatever is still open closes with the process.
            std::process::exit(0)
        }
    }
}

/// What `close` counted.
#[derive(Serialize)]
struct CloseReport {
    requests: u64,
    /// Not answered 200, or the connection failed.
    errors: u64,
}

async fn close_run(target: SocketAddr, requests: u64, connections: u32) -> anyhow::Result<()> {
    let next = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let head = format!("GET / HTTP/1.1\r\nHost: {target}\r\nConnection: close\r\n\r\n");
    let mut workers = Vec::new();
    for _ in 0..connections.max(1) {
        let (next, errors, head) = (next.clone(), errors.clone(), head.clone());
        workers.push(tokio::spawn(async move {
            // Bounded by the shared count: each worker takes the next
            // request number until all are taken.
            while next.fetch_add(1, Ordering::Relaxed) < requests {
                if !one_closed_request(target, head.as_bytes()).await {
                    errors.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for worker in workers {
        worker.await?;
    }
    let report = CloseReport {
        requests,
        errors: errors.load(Ordering::Relaxed),
    };
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

/// Connects, sends `head`, reads to the end; true on a 200.
async fn one_closed_request(target: SocketAddr, head: &[u8]) -> bool {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let attempt = async {
        let mut stream = TcpStream::connect(target).await?;
        stream.write_all(head).await?;
        let mut answer = Vec::with_capacity(256);
        stream.read_to_end(&mut answer).await?;
        Ok::<_, std::io::Error>(answer.starts_with(b"HTTP/1.1 200"))
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(30), attempt).await,
        Ok(Ok(true))
    )
}

async fn connect(target: SocketAddr) -> anyhow::Result<SendRequest<Empty<Bytes>>> {
    let stream = TcpStream::connect(target)
        .await
        .with_context(|| format!("connecting to {target}"))?;
    stream.set_nodelay(true)?;
    let (sender, conn) = http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        // Ends when either side closes; errors are seen on the next send.
        let _ = conn.await;
    });
    Ok(sender)
}

fn get(target: SocketAddr, path: &str) -> anyhow::Result<Request<Empty<Bytes>>> {
    Ok(Request::get(path)
        .header("host", target.to_string())
        .body(Empty::new())?)
}

/// Sends one request and reads the whole body; true on a 2xx.
async fn exchange(
    sender: &mut SendRequest<Empty<Bytes>>,
    req: Request<Empty<Bytes>>,
) -> anyhow::Result<bool> {
    sender.ready().await?;
    let response = sender.send_request(req).await?;
    let ok = response.status().is_success();
    response.into_body().collect().await?;
    Ok(ok)
}

#[derive(Serialize)]
struct RateReport {
    requests: u64,
    errors: u64,
    /// Requests whose due time passed while their connection was busy: their
    /// latency includes the wait.
    late: u64,
    rps: f64,
    p50_ms: f64,
    p99_ms: f64,
    p999_ms: f64,
    max_ms: f64,
}

async fn rate_run(
    target: SocketAddr,
    rate: u32,
    seconds: f64,
    connections: u32,
    warmup_seconds: f64,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        rate > 0 && connections > 0,
        "rate and connections must be above 0"
    );
    let errors = Arc::new(AtomicU64::new(0));
    let late = Arc::new(AtomicU64::new(0));
    let warmup_ok = Arc::new(AtomicU64::new(0));
    let mut senders = Vec::new();
    for _ in 0..connections {
        senders.push(connect(target).await?);
    }
    let start = Instant::now() + Duration::from_millis(50);
    let measured_from = start + Duration::from_secs_f64(warmup_seconds.max(0.0));
    let end = measured_from + Duration::from_secs_f64(seconds);
    // Each connection owns every `connections`-th slot of one global
    // schedule, so the whole client sends at `rate` with even spacing.
    let slot = Duration::from_secs_f64(1.0 / f64::from(rate));
    let period = slot * connections;
    let mut tasks = Vec::new();
    for (i, mut sender) in senders.into_iter().enumerate() {
        let (errors, late, warmup_ok) = (errors.clone(), late.clone(), warmup_ok.clone());
        tasks.push(tokio::spawn(async move {
            let mut latencies_us: Vec<u64> = Vec::new();
            let mut due = start + slot * i as u32;
            let mut free_at = Instant::now();
            while due < end {
                tokio::time::sleep_until(due.into()).await;
                let sent = Instant::now();
                // Busy past the due time: the wait is the server's doing and
                // counts. Free at the due time: any gap is our timer's
                // millisecond granularity and does not.
                let from = if free_at > due {
                    late.fetch_add(1, Ordering::Relaxed);
                    due
                } else {
                    sent
                };
                let outcome = match get(target, "/") {
                    Ok(req) => exchange(&mut sender, req).await,
                    Err(e) => Err(e),
                };
                match outcome {
                    Ok(true) if due >= measured_from => {
                        latencies_us.push(from.elapsed().as_micros() as u64)
                    }
                    Ok(true) => {
                        warmup_ok.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(false) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(_) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                        // The proxy closed the connection: open another so
                        // the rate holds.
                        if let Ok(fresh) = connect(target).await {
                            sender = fresh;
                        }
                    }
                }
                free_at = Instant::now();
                due += period;
            }
            latencies_us
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await?);
    }
    all.sort_unstable();
    let ms = |q: f64| percentile_sorted(&all, q).map_or(f64::NAN, |us| us as f64 / 1000.0);
    // Requests and rate over the whole run, warm-up included, so the
    // harness's CPU seconds (which cover the whole run) divide correctly;
    // the percentiles are over the measured part only.
    let requests = all.len() as u64 + warmup_ok.load(Ordering::Relaxed);
    let report = RateReport {
        requests,
        errors: errors.load(Ordering::Relaxed),
        late: late.load(Ordering::Relaxed),
        rps: requests as f64 / (seconds + warmup_seconds.max(0.0)),
        p50_ms: ms(50.0),
        p99_ms: ms(99.0),
        p999_ms: ms(99.9),
        max_ms: ms(100.0),
    };
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

#[derive(Serialize, Default)]
struct DrainReport {
    connections: u32,
    /// Idle connections the proxy closed (EOF or reset) before we gave up.
    closed_by_proxy: u32,
    /// Slow requests answered 2xx with their whole body.
    ok: u32,
    failed: u32,
    /// From `go` on stdin to the last close or answer, in milliseconds.
    last_event_ms: f64,
}

async fn drain_run(
    target: SocketAddr,
    idle: u32,
    slow: u32,
    slow_ms: u64,
    timeout_seconds: f64,
) -> anyhow::Result<()> {
    let timeout = Duration::from_secs_f64(timeout_seconds);
    let mut report = DrainReport {
        connections: idle + slow,
        ..DrainReport::default()
    };
    let mut waits = tokio::task::JoinSet::new();
    // Idle: one request each so the connection is a real HTTP keep-alive
    // connection, then keep it open and watch for the proxy's close.
    // Opened in batches: a thousand SYNs at once overflow small backlogs
    // and turn into one-second SYN retries that have nothing to do with drain.
    for batch in 0..idle.div_ceil(50) {
        let mut opening = tokio::task::JoinSet::new();
        for _ in 0..50.min(idle - batch * 50) {
            opening.spawn(async move {
                let stream = TcpStream::connect(target).await?;
                let (mut sender, conn) =
                    http1::handshake::<_, Empty<Bytes>>(TokioIo::new(stream)).await?;
                let conn = tokio::spawn(conn);
                exchange(&mut sender, get(target, "/")?).await?;
                anyhow::Ok((sender, conn))
            });
        }
        while let Some(opened) = opening.join_next().await {
            let (sender, conn) = opened??;
            waits.spawn(async move {
                // Keep the sender alive, or hyper closes the connection itself.
                let _sender = sender;
                let _ = conn.await;
                Outcome::Closed
            });
        }
    }
    // Slow: one request per connection, held by the upstream for slow_ms.
    for _ in 0..slow {
        let mut sender = connect(target).await?;
        let req = get(target, &format!("/slow/{slow_ms}"))?;
        waits.spawn(async move {
            match exchange(&mut sender, req).await {
                Ok(true) => Outcome::Answered,
                _ => Outcome::Failed,
            }
        });
    }
    if slow > 0 {
        // Let the requests reach the upstream before the proxy is told to stop.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!("ready");
    let mut stdin = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    stdin.next_line().await?;
    let go = Instant::now();
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            next = waits.join_next() => match next {
                None => break,
                Some(outcome) => {
                    match outcome.unwrap_or(Outcome::Failed) {
                        Outcome::Closed => report.closed_by_proxy += 1,
                        Outcome::Answered => report.ok += 1,
                        Outcome::Failed => report.failed += 1,
                    }
                    report.last_event_ms = go.elapsed().as_secs_f64() * 1000.0;
                }
            },
            () = &mut deadline => break,
        }
    }
    println!("{}", serde_json::to_string(&report)?);
    // Connections still open are dropped with the runtime.
    std::process::exit(0)
}

enum Outcome {
    Closed,
    Answered,
    Failed,
}
