//! Which failed requests may go to the app again, and how many may.
//!
//! A request is retried, whatever its method, only when the app cannot have
//! seen it: its HTTP/2 stream was refused (`REFUSED_STREAM`, RFC 9113
//! §8.7), or it was above the last stream id of the app's graceful GOAWAY
//! (§6.8), or the connection handed it back unsent. A request that may
//! have reached the app is retried only on a route that opts in
//! (`retry.idempotent`) and only for a method RFC 9110 §9.2.2 calls
//! idempotent. Connect failures are not retried here: a refused connect is
//! already held until the app is back (`upstreamPool.holdTimeout`).
//!
//! Retries are bounded by a budget, as Linkerd's: within the last ten
//! seconds, at most `ratio` retries per request plus `minPerSecond` per
//! second, so a failing app gets a little more traffic, never a multiple.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use http::Method;

use crate::config::RetryBudgetConfig;
use crate::error::Error;
use crate::h2wire::client::{ABOVE_GOAWAY, Error as H2Error};

/// Why a request went to the app again (the `reason` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryReason {
    /// The app refused the stream: `REFUSED_STREAM`.
    RefusedStream,
    /// The stream was above the last stream id of the app's GOAWAY.
    GoAway,
    /// May have reached the app; the route allows idempotent retries.
    Idempotent,
}

impl RetryReason {
    pub const ALL: [RetryReason; 3] = [Self::RefusedStream, Self::GoAway, Self::Idempotent];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::RefusedStream => "refused_stream",
            Self::GoAway => "goaway",
            Self::Idempotent => "idempotent",
        }
    }
}

/// Why a retryable request was not retried (the `reason` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryDenied {
    /// The retry budget was spent.
    Budget,
    /// The body was larger than `retryBudget.maxBodyBytes` (not kept).
    Body,
}

impl RetryDenied {
    pub const ALL: [RetryDenied; 2] = [Self::Budget, Self::Body];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Budget => "budget",
            Self::Body => "body",
        }
    }
}

/// Whether a failed attempt may go again, and why.
pub fn retry_reason(err: &Error, method: &Method, idempotent_route: bool) -> Option<RetryReason> {
    // Connect errors were held already; AppDown and the rest are final.
    let user_error = match err {
        // hyper's HTTP/1 client: a user error is ours (the request body).
        Error::Upstream(err) => err.is_user(),
        // The HTTP/2 client (h2conn.rs): never processed, or not retried
        // unless the route allows it.
        Error::UpstreamH2(_) => {
            if let Some(reason) = err.h2wire().and_then(never_reached_app) {
                return Some(reason);
            }
            false
        }
        _ => return None,
    };
    (idempotent_route && is_idempotent(method) && !user_error).then_some(RetryReason::Idempotent)
}

/// The app provably never processed the request (RFC 9113 §8.7): it
/// refused the stream, or the stream was above the last-stream-id of its
/// GOAWAY (§6.8; the client reports those as refused, and a GOAWAY with
/// an error code fails the streams below it too, as connection errors,
/// which are no proof).
fn never_reached_app(err: &H2Error) -> Option<RetryReason> {
    if !err.never_processed() {
        return None;
    }
    match err {
        H2Error::Stream { reason, .. } if *reason == ABOVE_GOAWAY => Some(RetryReason::GoAway),
        _ => Some(RetryReason::RefusedStream),
    }
}

/// RFC 9110 §9.2.2: GET, HEAD, OPTIONS, TRACE, PUT and DELETE.
pub fn is_idempotent(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    )
}

/// The window the budget looks back over.
const WINDOW: Duration = Duration::from_secs(10);
/// Buckets in the window (one per second).
const BUCKETS: usize = 10;

/// Retries allowed: `ratio` per request in the last ten seconds, plus
/// `minPerSecond` per second of that window.
pub struct RetryBudget {
    window: Mutex<Window>,
}

struct Window {
    started: Instant,
    /// Index of the newest bucket, in seconds since `started`.
    newest: u64,
    requests: [u64; BUCKETS],
    retries: [u64; BUCKETS],
}

impl RetryBudget {
    pub fn new() -> RetryBudget {
        RetryBudget {
            window: Mutex::new(Window {
                started: Instant::now(),
                newest: 0,
                requests: [0; BUCKETS],
                retries: [0; BUCKETS],
            }),
        }
    }

    /// A request (first attempt) was sent: it earns `ratio` retries.
    pub fn deposit(&self) {
        let mut w = self.lock();
        let i = w.advance(Instant::now());
        w.requests[i] += 1;
    }

    /// Takes one retry from the budget, if there is one left under
    /// `settings` (read live, so a reload applies at once).
    pub fn withdraw(&self, settings: &RetryBudgetConfig) -> bool {
        let mut w = self.lock();
        let i = w.advance(Instant::now());
        let requests: u64 = w.requests.iter().sum();
        let retries: u64 = w.retries.iter().sum();
        let allowed = settings.ratio * requests as f64
            + f64::from(settings.min_per_second) * WINDOW.as_secs_f64();
        if (retries + 1) as f64 > allowed {
            return false;
        }
        w.retries[i] += 1;
        true
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Window> {
        self.window
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Default for RetryBudget {
    fn default() -> Self {
        Self::new()
    }
}

impl Window {
    /// Moves the window to `now`, emptying the buckets it passed; returns
    /// the current bucket.
    fn advance(&mut self, now: Instant) -> usize {
        let second = now.saturating_duration_since(self.started).as_secs();
        let passed = second.saturating_sub(self.newest);
        for step in 1..=passed.min(BUCKETS as u64) {
            let i = ((self.newest + step) % BUCKETS as u64) as usize;
            self.requests[i] = 0;
            self.retries[i] = 0;
        }
        self.newest = self.newest.max(second);
        (self.newest % BUCKETS as u64) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::h2wire::ErrorCode;

    fn settings(ratio: f64, min_per_second: u32) -> RetryBudgetConfig {
        RetryBudgetConfig {
            ratio,
            min_per_second,
            ..RetryBudgetConfig::default()
        }
    }

    /// How many of 100 retries in a row `budget` grants under `settings`.
    fn granted_of_100(budget: &RetryBudget, settings: &RetryBudgetConfig) -> usize {
        (0..100).filter(|_| budget.withdraw(settings)).count()
    }

    #[test]
    fn the_floor_allows_min_per_second_over_the_window_without_traffic() {
        let granted = granted_of_100(&RetryBudget::new(), &settings(0.0, 2));
        assert_eq!(granted, 20, "2/s over a 10 s window");
    }

    #[test]
    fn the_ratio_adds_retries_per_request() {
        let budget = RetryBudget::new();
        for _ in 0..50 {
            budget.deposit();
        }
        let granted = granted_of_100(&budget, &settings(0.2, 0));
        assert_eq!(granted, 10, "20% of 50 requests");
    }

    #[test]
    fn zero_settings_allow_nothing() {
        let budget = RetryBudget::new();
        budget.deposit();
        assert!(!settings(0.0, 0).enabled());
        assert!(!budget.withdraw(&settings(0.0, 0)));
    }

    #[test]
    fn old_buckets_are_emptied_as_the_window_moves() {
        let budget = RetryBudget::new();
        let mut w = budget.lock();
        let start = w.started;
        let i = w.advance(start);
        w.requests[i] = 5;
        w.retries[i] = 5;
        // Eleven seconds later all of it is outside the window.
        w.advance(start + Duration::from_secs(11));
        assert_eq!(w.requests.iter().sum::<u64>(), 0);
        assert_eq!(w.retries.iter().sum::<u64>(), 0);
    }

    fn stream_error(code: ErrorCode, remote: bool, reason: &'static str) -> Error {
        Error::upstream_h2(H2Error::Stream {
            id: 3,
            code,
            reason,
            remote,
        })
    }

    /// Only the two proofs of §8.7 retry a POST; a reset of ours, another
    /// code or a lost connection do not (unless the route allows
    /// idempotent retries and the method is one).
    #[test]
    fn the_h2_clients_never_processed_errors_are_retried() {
        let post = Method::POST;
        let refused = stream_error(ErrorCode::REFUSED_STREAM, true, "refused by the app");
        let above = stream_error(ErrorCode::REFUSED_STREAM, true, ABOVE_GOAWAY);
        assert_eq!(
            retry_reason(&refused, &post, false),
            Some(RetryReason::RefusedStream)
        );
        assert_eq!(
            retry_reason(&above, &post, false),
            Some(RetryReason::GoAway)
        );
        for err in [
            stream_error(ErrorCode::REFUSED_STREAM, false, "refused by us"),
            stream_error(ErrorCode::CANCEL, true, "reset by the app"),
            stream_error(ErrorCode::INTERNAL_ERROR, true, "reset by the app"),
            Error::upstream_h2(H2Error::Connection {
                code: ErrorCode::NO_ERROR,
                reason: "GOAWAY from the app",
                remote: true,
            }),
            Error::upstream_h2(H2Error::Io(std::io::ErrorKind::ConnectionReset.into())),
        ] {
            assert_eq!(retry_reason(&err, &post, true), None, "{err}");
            assert_eq!(
                retry_reason(&err, &Method::GET, true),
                Some(RetryReason::Idempotent),
                "{err}"
            );
            assert_eq!(retry_reason(&err, &Method::GET, false), None, "{err}");
        }
    }

    #[test]
    fn only_rfc_idempotent_methods_are_idempotent() {
        for m in [Method::GET, Method::HEAD, Method::PUT, Method::DELETE] {
            assert!(is_idempotent(&m), "{m}");
        }
        for m in [Method::POST, Method::PATCH, Method::CONNECT] {
            assert!(!is_idempotent(&m), "{m}");
        }
    }
}
