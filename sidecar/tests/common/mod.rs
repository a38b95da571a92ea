//! Shared harness for the sidecar's scenario tests.
//!
//! Every test drives the real `kubegrace-sidecar` binary as a subprocess,
//! against real test apps and real clients on 127.0.0.1, through the public
//! contract only: flags, config file, signals, the admin port and the data
//! port. Nothing here reaches into the sidecar's library.
//!
//! - [`sidecar`]: spawn the binary on free ports, wait for `/ready`, signal it,
//!   read its logs, admin endpoints and metrics.
//! - [`apps`]: one test app speaking HTTP/1.1, h2c, gRPC and WebSocket, with a
//!   kill switch that behaves like a naive app on SIGTERM (gone at once).
//! - [`balancer`]: a client-side stand-in for kube-proxy: new connections only
//!   to pods whose readiness answered 200, seen through a propagation lag.
//! - [`load`]: a bounded constant-rate keep-alive load loop that records the
//!   outcome of every request and why it failed.
//! - [`grpc`]: hand-written prost messages and a prost codec for tonic (no
//!   protoc, no generated code).

// Each test file uses a different part of the harness.
#![allow(dead_code)]

pub mod apps;
pub mod balancer;
pub mod grpc;
pub mod http;
pub mod load;
pub mod pod;
pub mod sidecar;

use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// Polls `check` every 20ms until it returns `Some`, or fails after `within`.
///
/// Tests wait on conditions, never on fixed sleeps; the deadline only bounds
/// how long a broken binary can hang a test.
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
pub fn free_port() -> Result<std::net::SocketAddr> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("bind 127.0.0.1:0")?;
    listener.local_addr().context("local_addr")
}

/// Bounds a whole future; the error names what hung.
pub async fn within<T>(what: &str, limit: Duration, fut: impl Future<Output = T>) -> Result<T> {
    tokio::time::timeout(limit, fut)
        .await
        .with_context(|| format!("{what} did not finish within {limit:?}"))
}
