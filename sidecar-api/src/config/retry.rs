//! Retries of requests the app never saw, and the budget that bounds them
//! (the sidecar's `upstream/retry.rs` applies them).

use serde::{Deserialize, Serialize};

use super::ConfigError;
use super::bounds::{self, MAX_RETRY_BODY_BYTES};

/// How many retries the sidecar may add to the app's traffic. A request
/// is retried only when the app cannot have seen it (its HTTP/2 stream
/// refused, or above the last stream id of a GOAWAY), or, on a route with
/// `retry.idempotent`, when it failed without an answer and its method is
/// idempotent.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct RetryBudgetConfig {
    /// Retries allowed per request sent, over the last ten seconds.
    pub ratio: f64,
    /// Retries allowed per second regardless of traffic (a floor for
    /// quiet apps), over the same ten seconds. At most
    /// [`bounds::MAX_RETRY_MIN_PER_SECOND`] (10000).
    pub min_per_second: u32,
    /// The request body kept for a retry; a larger body is passed on
    /// without being kept, and its request is not retried. 0 turns
    /// retries off. At most [`MAX_RETRY_BODY_BYTES`] (16 MiB). This is
    /// what the kept body holds in memory, however the client split it:
    /// the sidecar copies it into 16 KiB buffers (`upstream/replay.rs`)
    /// instead of keeping the client's frames, so it holds at most this
    /// plus one buffer and a handle per 16 KiB (64 KiB sent as one-byte
    /// chunks held 2.4 MiB before).
    pub max_body_bytes: u64,
}

impl Default for RetryBudgetConfig {
    fn default() -> Self {
        Self {
            // Linkerd's default budget: 20% more, plus 10 per second.
            ratio: 0.2,
            min_per_second: 10,
            // A typical gRPC or JSON request; larger uploads are rarely
            // refused before the app sees them.
            max_body_bytes: 64 * 1024,
        }
    }
}

impl RetryBudgetConfig {
    pub(super) fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// Retries are off when nothing may be retried or no body is kept.
    pub fn enabled(&self) -> bool {
        self.max_body_bytes > 0 && (self.ratio > 0.0 || self.min_per_second > 0)
    }

    pub fn validate(&self, key: &str) -> Result<(), ConfigError> {
        if !(0.0..=1.0).contains(&self.ratio) {
            return Err(ConfigError::at(
                key,
                "ratio",
                format!(
                    "{} is outside 0..1; above 1 a failing app would get more retries than requests",
                    self.ratio
                ),
            ));
        }
        bounds::count_in(
            key,
            "minPerSecond",
            u64::from(self.min_per_second),
            0,
            u64::from(bounds::MAX_RETRY_MIN_PER_SECOND),
            "",
        )?;
        if self.max_body_bytes > MAX_RETRY_BODY_BYTES {
            return Err(ConfigError::at(
                key,
                "maxBodyBytes",
                format!(
                    "{} is out of range; use 0 to {MAX_RETRY_BODY_BYTES}: each request in flight may keep this much memory",
                    self.max_body_bytes
                ),
            ));
        }
        Ok(())
    }
}

/// A route's retry policy beyond the requests the app never saw.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct RouteRetry {
    /// Also retry requests that may have reached the app (the connection
    /// failed before an answer) when their method is idempotent (GET,
    /// HEAD, OPTIONS, TRACE, PUT, DELETE): only for apps where doing such
    /// a request twice is harmless.
    pub idempotent: bool,
}
