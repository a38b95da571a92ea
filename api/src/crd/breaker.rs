//! A route's concurrency limit, queue and breaker, and the fallback
//! response served while it is open (the sidecar's `circuitBreaker` and
//! `fallback`).

use kube::KubeSchema;
use kubegrace_sidecar_api::config::{CircuitBreakerConfig, FallbackConfig};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::Duration;
use super::bounds::{
    CONTENT_TYPE_PATTERN, MAX_CONCURRENT, MAX_CONSECUTIVE_FAILURES, MAX_CONTENT_TYPE,
    MAX_FALLBACK_BODY, MAX_HALF_OPEN_PROBES, MAX_MIN_REQUESTS, MAX_QUEUE,
};
use super::duration::{durations_ok, over_cap};

sidecar_defaults!(CircuitBreakerConfig {
    cb_max_concurrent => max_concurrent: u32,
    cb_max_queue => max_queue: u32,
    cb_queue_timeout => queue_timeout: Duration,
    cb_error_ratio => error_ratio: f64,
    cb_min_requests => min_requests: u32,
    cb_window => window: Duration,
    cb_consecutive_failures => consecutive_failures: u32,
    cb_open_for => open_for: Duration,
    cb_max_open_for => max_open_for: Duration,
    cb_half_open_probes => half_open_probes: u32,
    cb_min_concurrent => min_concurrent: u32,
});

fn max_open_for_rule() -> String {
    durations_ok(
        &["openFor", "maxOpenFor"],
        &format!(
            "{} || {} || duration(self.maxOpenFor) >= duration(self.openFor)",
            over_cap("self.openFor"),
            over_cap("self.maxOpenFor")
        ),
    )
}

/// Concurrency limit, queue and breaker (the sidecar's `circuitBreaker`).
/// Durations are written like `300ms`, `15s` or `1m30s` (whole numbers of
/// at most 5 digits with h, m, s or ms) and are at most 1h.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(validation = Rule::new(max_open_for_rule()).message(Message::Expression("'maxOpenFor ' + self.maxOpenFor + ' is shorter than openFor ' + self.openFor + '; raise maxOpenFor to at least openFor'".into())).field_path(".maxOpenFor"))]
#[x_kube(validation = Rule::new("!self.adaptive || self.minConcurrent <= self.maxConcurrent").message("minConcurrent must be <= maxConcurrent when adaptive is on").field_path(".minConcurrent"))]
#[x_kube(validation = Rule::new(durations_ok(&["openFor"], "duration(self.openFor) > duration('0s')")).message("openFor must be more than 0s").field_path(".openFor"))]
#[x_kube(validation = Rule::new(durations_ok(&["queueTimeout"], "self.maxQueue == 0 || duration(self.queueTimeout) > duration('0s')")).message("queueTimeout must be more than 0s when maxQueue is above 0 (or set maxQueue to 0: no queue)").field_path(".queueTimeout"))]
#[x_kube(validation = Rule::new(durations_ok(&["window"], "self.errorRatio == 0.0 || duration(self.window) > duration('0s')")).message("window must be more than 0s when errorRatio is set (or set errorRatio to 0: off)").field_path(".window"))]
#[serde(rename_all = "camelCase")]
pub struct CircuitBreakerSpec {
    /// Requests in flight to the app at once (the ceiling when adaptive):
    /// 1 to 1000000. Default: 1024.
    #[serde(default = "cb_max_concurrent")]
    #[schemars(range(min = 1, max = MAX_CONCURRENT))]
    pub max_concurrent: u32,
    /// Requests waiting for a slot, beyond which the fallback is served: 0
    /// (no queue) to 1000000. Default: 1024.
    #[serde(default = "cb_max_queue")]
    #[schemars(range(min = 0, max = MAX_QUEUE))]
    pub max_queue: u32,
    /// How long a request may wait in the queue: more than 0s (with a
    /// queue) and at most 1h. Default: `1s`.
    #[serde(default = "cb_queue_timeout")]
    pub queue_timeout: Duration,
    /// Open when failures/requests reach this over `window`: 0 (off) to 1.
    /// Default: 0.5.
    #[serde(default = "cb_error_ratio")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub error_ratio: f64,
    /// The ratio only counts once this many requests were seen in `window`:
    /// 0 to 1000000. Default: 20.
    #[serde(default = "cb_min_requests")]
    #[schemars(range(min = 0, max = MAX_MIN_REQUESTS))]
    pub min_requests: u32,
    /// The rolling window of `errorRatio`: more than 0s (with a ratio) and
    /// at most 1h. Default: `10s`.
    #[serde(default = "cb_window")]
    pub window: Duration,
    /// Open on this many failures in a row; 0 disables. At most 100000
    /// (beyond that the breaker would in effect never open: use 0).
    /// Default: 5.
    #[serde(default = "cb_consecutive_failures")]
    #[schemars(range(min = 0, max = MAX_CONSECUTIVE_FAILURES))]
    pub consecutive_failures: u32,
    /// First open period (it grows with backoff while failures repeat):
    /// more than 0s and at most 1h. Default: `5s`.
    #[serde(default = "cb_open_for")]
    pub open_for: Duration,
    /// Longest open period the backoff reaches: at least `openFor`, at
    /// most 1h. Default: `1m`.
    #[serde(default = "cb_max_open_for")]
    pub max_open_for: Duration,
    /// Probe requests let through while half-open: 1 to 1000. Default: 1.
    #[serde(default = "cb_half_open_probes")]
    #[schemars(range(min = 1, max = MAX_HALF_OPEN_PROBES))]
    pub half_open_probes: u32,
    /// Find the app's capacity from observed latency, between
    /// `minConcurrent` and `maxConcurrent`. Default: false (a fixed
    /// `maxConcurrent`).
    #[serde(default)]
    pub adaptive: bool,
    /// The floor of the adaptive limit: 1 to 1000000, and at most
    /// `maxConcurrent` when adaptive is on. Default: 1.
    #[serde(default = "cb_min_concurrent")]
    #[schemars(range(min = 1, max = MAX_CONCURRENT))]
    pub min_concurrent: u32,
}

sidecar_defaults!(FallbackConfig {
    fb_status => status: u16,
    fb_content_type => content_type: String,
    fb_body => body: String,
});

/// The response served while the breaker is open or the queue overflows.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FallbackSpec {
    /// The response status: 200 to 599. Default: 503.
    #[serde(default = "fb_status")]
    #[schemars(range(min = 200, max = 599))]
    pub status: u16,
    /// The `Content-Type` header: at most 256 characters of printable
    /// ASCII (and tab). Default: `text/plain; charset=utf-8`.
    #[serde(default = "fb_content_type")]
    #[schemars(length(max = MAX_CONTENT_TYPE), regex(pattern = CONTENT_TYPE_PATTERN))]
    pub content_type: String,
    /// The response body: at most 32768 characters, and the bodies of all
    /// routes together at most 32768 too (they all go into one
    /// ConfigMap); for a longer page, link to it. Default: `service
    /// unavailable` and a newline.
    #[serde(default = "fb_body")]
    #[schemars(length(max = MAX_FALLBACK_BODY))]
    pub body: String,
}
