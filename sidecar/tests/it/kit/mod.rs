//! The one harness of the sidecar's integration tests.
//!
//! Everything is real and on 127.0.0.1: the sidecar (in-process through the
//! library, or the `kubegrace-sidecar` binary where the subject needs a
//! process), real test apps and real clients, seen through the public
//! contract only: flags, config file, signals, the admin port and the data
//! port.
//!
//! - [`sidecar`]: start the sidecar in-process ([`sidecar::InProcess`]) or
//!   as the binary ([`sidecar::Sidecar`], [`sidecar::Process`]); admin
//!   calls and metrics; the binary across upgrades ([`upgrade`]).
//! - [`app`]: the one test app (HTTP/1.1, h2c, gRPC, WebSocket, over TCP or
//!   a Unix socket) with switchable behaviours and a kill switch that
//!   behaves like a naive app on SIGTERM (gone at once).
//! - [`balancer`]: a client-side stand-in for kube-proxy: new connections only
//!   to pods whose readiness answered 200, seen through a propagation lag.
//! - [`load`]: the one load generator: keep-alive or one-request-per-
//!   connection clients that record the outcome of every request and why it
//!   failed.
//! - [`http`]: one-shot and pooled clients, raw-socket exchanges.
//! - [`metrics`]: the ready line, the exit line and `/metrics`, parsed.
//! - [`wire`]: HTTP/1.1 as bytes: an app that records requests as they
//!   arrived, and a client that reads one message by its framing.
//! - [`grpc`]: hand-written prost messages and a prost codec for tonic (no
//!   protoc, no generated code).

/// One HTTP/1 subject as two tests, named as the docs name them: `$fast`
/// runs `$subject("true")` (`--http1-fast-path true`), `$hyper` runs
/// `$subject("false")` (hyper's server), so each path passes or fails on
/// its own.
macro_rules! on_both_http1_paths {
    ($fast:ident, $hyper:ident, $subject:expr) => {
        #[tokio::test]
        async fn $fast() -> anyhow::Result<()> {
            ($subject)("true").await
        }

        #[tokio::test]
        async fn $hyper() -> anyhow::Result<()> {
            ($subject)("false").await
        }
    };
}
pub(crate) use on_both_http1_paths;

pub mod app;
pub mod balancer;
pub mod grpc;
pub mod http;
pub mod load;
pub mod metrics;
pub mod pod;
pub mod sidecar;
pub mod upgrade;
pub mod wire;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// How long a test waits for anything before it calls it hung.
pub const WAIT: Duration = Duration::from_secs(30);

/// Polls `check` every 20ms until it returns `Some`, or fails after `within`.
///
/// Tests wait on conditions, never on fixed sleeps; the deadline only bounds
/// how long a broken sidecar can hang a test.
pub async fn wait_for<T, F, Fut>(what: &str, within: Duration, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(value) = check().await {
            return Ok(value);
        }
        if Instant::now() >= deadline {
            bail!("timed out after {within:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A loopback port that was free a moment ago.
///
/// Used when the sidecar needs its addresses up front; the small window
/// between releasing and re-binding is acceptable on a test machine.
pub fn free_port() -> Result<SocketAddr> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("bind 127.0.0.1:0")?;
    listener.local_addr().context("local_addr")
}

/// Waits (bounded) until the app is working on `n` requests: the work a
/// drain test needs in flight before it starts the drain.
pub async fn app_busy(app: &app::TestApp, n: i64) -> Result<()> {
    let what = format!("the app to have {n} requests in flight");
    wait_for(&what, WAIT, || async {
        (app.stats.inflight.load(Ordering::SeqCst) >= n).then_some(())
    })
    .await
}

/// A race tried `rounds` times: `round(i)` says what went wrong in round
/// `i` (`None`: nothing did); an error ends the test at once. Fails unless
/// every round won, saying how often `lost` happened and what each said.
pub async fn race_rounds<Fut>(
    rounds: usize,
    lost: &str,
    mut round: impl FnMut(usize) -> Fut,
) -> Result<()>
where
    Fut: Future<Output = Result<Option<String>>>,
{
    let mut complaints = Vec::new();
    for i in 0..rounds {
        if let Some(what) = round(i).await? {
            complaints.push(what);
        }
    }
    anyhow::ensure!(
        complaints.is_empty(),
        "{lost} in {} of {rounds} rounds: {complaints:#?}",
        complaints.len()
    );
    Ok(())
}

/// Bounds a whole future; the error names what hung.
pub async fn within<T>(what: &str, limit: Duration, fut: impl Future<Output = T>) -> Result<T> {
    tokio::time::timeout(limit, fut)
        .await
        .with_context(|| format!("{what} did not finish within {limit:?}"))
}

/// A fresh scratch directory, short enough for Unix socket paths (107 bytes).
pub fn scratch_dir(tag: &str) -> Result<PathBuf> {
    static N: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "kg-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    Ok(dir)
}

/// A fresh [`scratch_dir`] holding one file, `name`, with `text`:
/// (the directory, the file).
pub fn scratch_file(tag: &str, name: &str, text: &str) -> Result<(PathBuf, PathBuf)> {
    let dir = scratch_dir(tag)?;
    let file = dir.join(name);
    std::fs::write(&file, text).with_context(|| format!("write {}", file.display()))?;
    Ok((dir, file))
}

/// Sends a Unix signal (`TERM`, `INT`, `HUP`, ...) with kill(1): the
/// workspace forbids `unsafe`, so no libc call.
pub fn signal(pid: u32, name: &str) -> Result<()> {
    let status = std::process::Command::new("kill")
        .args(["-s", name, &pid.to_string()])
        .status()
        .context("run kill")?;
    if !status.success() {
        bail!("kill -s {name} {pid}: {status}");
    }
    Ok(())
}

/// Whether `pid` runs (a zombie counts as gone).
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // "pid (comm) S ...": the state follows the last ')'.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// How many sockets listen on TCP `port` (all namespaces' view of this
/// host: /proc/net/tcp and tcp6). `SO_REUSEPORT` listeners show once each.
pub fn listening_sockets(port: u16) -> usize {
    let hex = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .map(|text| {
            text.lines()
                .skip(1)
                .filter(|line| {
                    let cols: Vec<&str> = line.split_whitespace().collect();
                    // local_address is column 1, st is column 3; 0A = LISTEN.
                    cols.len() > 3 && cols[1].ends_with(&hex) && cols[3] == "0A"
                })
                .count()
        })
        .sum()
}

/// Tests whose verdict rests on latency or timer ratios take this first, so
/// they never share the two cores with each other (the suite is one
/// process; every other test still runs beside them).
pub async fn timing_sensitive() -> tokio::sync::MutexGuard<'static, ()> {
    static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    LOCK.lock().await
}
