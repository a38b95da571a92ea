//! Every bound of the sidecar's config, in one place.
//!
//! Each duration and count a user (or the operator) writes has a maximum,
//! enforced by [`super::Config::validate`] when the config is loaded (file,
//! flags, environment, reload): past it the config is refused with the key
//! and the allowed range, and a reload keeps the config in force. The
//! bounds are far above any real deployment and low enough that no
//! arithmetic on an accepted value can overflow: the sum of every
//! duration below is a few days, and `Instant + Duration` overflows only
//! after centuries.
//!
//! The operator renders these configs from a `GraceRoute`, so every bound
//! here must hold for whatever its CRD accepts (drain sums within the 1h
//! termination budget, route timeouts within the same hour, the breaker's
//! counts within the schema's maxima).

use std::time::Duration;

use super::{ConfigError, HumanDuration};

/// The longest drain timer: `drain.minDelay`, `quiet`, `maxDelay`,
/// `timeout`, `websocketCloseWindow`, `websocketCloseWait`. The operator
/// allows at most 1h for `maxDelay + timeout` (it becomes the pod's
/// terminationGracePeriodSeconds), so one hour per timer never refuses a
/// rendered route.
pub const MAX_DRAIN_TIMER: Duration = Duration::from_secs(3_600);

/// The longest of every other duration (header, body, write and idle
/// timeouts, the breaker's windows and backoff, route timeouts, the pool's
/// timeouts): a day. Longer is a typo, and a day keeps every deadline far
/// from overflowing.
pub const MAX_DURATION: Duration = Duration::from_secs(86_400);

/// `limits.maxHeaderBytes`: at least 1 KiB (real clients' cookies), at
/// most 1 MiB (a read buffer of this size can be held per connection).
pub const MIN_HEADER_BYTES: usize = 1024;
pub const MAX_HEADER_BYTES: usize = 1024 * 1024;
/// `limits.maxHeaders`: each is a parsed slot per request.
pub const MAX_HEADERS: usize = 1_000;
/// `limits.maxRequestBodyBytes` (0: unlimited): 1 TiB.
pub const MAX_REQUEST_BODY_BYTES: u64 = 1 << 40;
/// `limits.maxConcurrentStreams`: HTTP/2 streams per connection.
pub const MAX_CONCURRENT_STREAMS: u32 = 65_536;
/// `limits.bodyMinRate`: bytes per second (1 GiB/s).
pub const MAX_BODY_MIN_RATE: u64 = 1 << 30;
/// `limits.maxConnections` (0: unlimited).
pub const MAX_CONNECTIONS: usize = 1_000_000;
/// `limits.adminMaxConnections`: at least 1 (the kubelet's probes).
pub const MAX_ADMIN_CONNECTIONS: usize = 1_024;
/// `upstreamPool.maxIdle`: idle connections kept per upstream.
pub const MAX_POOL_IDLE: usize = 65_536;
/// `workers`: each is a listening socket and an accept loop.
pub const MAX_WORKERS: usize = 64;
/// `upstreams`: app instances (blue/green slots).
pub const MAX_UPSTREAMS: usize = 16;
/// `routes`: matched in order on every request. The operator renders at
/// most 64 plus the catch-all.
pub const MAX_ROUTES: usize = 1_024;
/// `routes[].name`, in bytes: a label value of every route's metrics,
/// written on every scrape (a Kubernetes DNS subdomain's length; the
/// operator renders at most 63).
pub const MAX_ROUTE_NAME_BYTES: usize = 253;
/// `upgradeProtocols`.
pub const MAX_UPGRADE_PROTOCOLS: usize = 32;
/// `forwarded.trustedHops`.
pub const MAX_TRUSTED_HOPS: u32 = 64;
/// `retryBudget.minPerSecond` (the CRD's maximum too).
pub const MAX_RETRY_MIN_PER_SECOND: u32 = 10_000;
/// `retryBudget.maxBodyBytes`: kept per request in flight.
pub const MAX_RETRY_BODY_BYTES: u64 = 16 * 1024 * 1024;
/// `circuitBreaker.maxConcurrent`, `maxQueue`, `minRequests`,
/// `consecutiveFailures`, `minConcurrent` (the CRD's maximum of
/// `maxConcurrent` and `maxQueue`).
pub const MAX_BREAKER_COUNT: u32 = 1_000_000;
/// `circuitBreaker.halfOpenProbes` (the CRD's maximum too).
pub const MAX_HALF_OPEN_PROBES: u32 = 1_000;
/// `fallback.body`, in bytes; served from memory on every fallback.
pub const MAX_FALLBACK_BODY_BYTES: usize = 1024 * 1024;
/// `appReadiness.periodSeconds`, `timeoutSeconds`,
/// `initialDelaySeconds`: a day. (Kubernetes sets no maximum; the
/// webhook should clamp a probe it moves here.)
pub const MAX_PROBE_SECONDS: u32 = 86_400;
/// `appReadiness.successThreshold`, `failureThreshold`.
pub const MAX_PROBE_THRESHOLD: u32 = 10_000;
/// `appReadiness.headers`.
pub const MAX_PROBE_HEADERS: usize = 64;

/// `key.field` must be at most `max`.
pub(super) fn duration_at_most(
    key: &str,
    field: &str,
    value: HumanDuration,
    max: Duration,
) -> Result<(), ConfigError> {
    if value.get() > max {
        return Err(ConfigError::at(
            key,
            field,
            format!(
                "{value} is too long; use 0s to {}",
                HumanDuration::from(max)
            ),
        ));
    }
    Ok(())
}

/// `key.field` must lie in `min..=max`; `hint` says why the bounds.
pub(super) fn count_in(
    key: &str,
    field: &str,
    value: u64,
    min: u64,
    max: u64,
    hint: &str,
) -> Result<(), ConfigError> {
    if !(min..=max).contains(&value) {
        let hint = if hint.is_empty() {
            String::new()
        } else {
            format!(" ({hint})")
        };
        return Err(ConfigError::at(
            key,
            field,
            format!("{value} is out of range; use {min} to {max}{hint}"),
        ));
    }
    Ok(())
}

/// A `usize` as the `u64` the checks compare (lossless on every target
/// Rust supports today; saturates otherwise, which still fails the bound).
pub(super) fn wide(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}
