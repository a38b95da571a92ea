//! Routes: what a route matches and the policy applied to it (timeout,
//! concurrency limit and breaker, fallback response).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::bounds::{self, MAX_BREAKER_COUNT, MAX_DURATION, count_in, duration_at_most, wide};
use super::{ConfigError, HumanDuration};

/// Name of the catch-all route: the sidecar's built-in route for whatever no
/// configured route matched. A configured route with this name sets the
/// catch-all's policy instead of adding a second one. The operator emits its
/// route-wide breaker under this name, so both binaries share one constant.
pub const CATCH_ALL_ROUTE: &str = "default";

/// One route: a match, and the policy applied to what it matches.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteConfig {
    pub name: String,
    #[serde(default, rename = "match")]
    pub matcher: RouteMatch,
    /// Upstream request timeout for this route (counts as a failure):
    /// more than 0s, at most 24h.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<HumanDuration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub circuit_breaker: Option<CircuitBreakerConfig>,
    /// Served while the breaker is open, on queue overflow and on queue
    /// timeout. Without one, a plain 503 with `Retry-After`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<FallbackConfig>,
    /// What counts as a failure for the breaker.
    #[serde(default = "FailureKind::defaults")]
    pub fail_on: Vec<FailureKind>,
    /// Retries beyond the requests the app never saw (those always may go
    /// again, within `retryBudget`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<super::RouteRetry>,
}

/// Which requests a route takes. Empty fields match anything.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteMatch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_prefix: Option<String>,
    /// Exact path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub methods: Vec<String>,
    /// Host header without port; `*.example.com` matches one or more labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
}

/// What counts against the breaker. 4xx never does: it is the client's fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureKind {
    /// Any 5xx from the app.
    Status5xx,
    /// One specific 5xx status.
    Status(u16),
    /// The app refused or reset the connection.
    ConnectError,
    /// The route's timeout passed.
    Timeout,
}

impl FailureKind {
    pub fn defaults() -> Vec<Self> {
        vec![Self::Status5xx, Self::ConnectError, Self::Timeout]
    }
}

impl FromStr for FailureKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "5xx" => Ok(Self::Status5xx),
            "connect-error" => Ok(Self::ConnectError),
            "timeout" => Ok(Self::Timeout),
            other => match other.parse::<u16>() {
                Ok(code @ 500..=599) => Ok(Self::Status(code)),
                Ok(code @ 400..=499) => Err(format!(
                    "{code} is a client error; 4xx responses never count as failures"
                )),
                _ => Err(format!(
                    "{other:?} is not a failure kind; use 5xx, a 5xx status such as 503, connect-error or timeout"
                )),
            },
        }
    }
}

impl fmt::Display for FailureKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Status5xx => f.write_str("5xx"),
            Self::Status(code) => write!(f, "{code}"),
            Self::ConnectError => f.write_str("connect-error"),
            Self::Timeout => f.write_str("timeout"),
        }
    }
}

impl Serialize for FailureKind {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for FailureKind {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // YAML users write `503` unquoted; accept numbers as well as strings.
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Text(String),
            Code(u16),
        }
        let text = match Raw::deserialize(deserializer)? {
            Raw::Text(t) => t,
            Raw::Code(c) => c.to_string(),
        };
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// Concurrency limit, queue and breaker for one route. Every duration is
/// at most 24h ([`MAX_DURATION`]); every count at most 1000000
/// ([`MAX_BREAKER_COUNT`]), `halfOpenProbes` at most 1000.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct CircuitBreakerConfig {
    /// Requests in flight to the app at once (the ceiling when adaptive).
    pub max_concurrent: u32,
    /// Requests waiting for a slot; beyond it the fallback is served.
    pub max_queue: u32,
    pub queue_timeout: HumanDuration,
    /// Open when failures / requests >= this over `window`; 0 disables.
    pub error_ratio: f64,
    /// The ratio only counts once this many requests were seen in `window`.
    pub min_requests: u32,
    pub window: HumanDuration,
    /// Open on this many failures in a row; 0 disables.
    pub consecutive_failures: u32,
    /// First open period; grows with backoff and jitter while failures repeat.
    pub open_for: HumanDuration,
    /// Longest open period the backoff reaches.
    pub max_open_for: HumanDuration,
    /// Probe requests let through while half-open.
    pub half_open_probes: u32,
    /// Find the app's capacity from observed latency (gradient style),
    /// between `minConcurrent` and `maxConcurrent`.
    pub adaptive: bool,
    pub min_concurrent: u32,
}

impl Default for CircuitBreakerConfig {
    fn default() -> Self {
        Self {
            max_concurrent: 1024,
            max_queue: 1024,
            queue_timeout: HumanDuration::from_secs(1),
            error_ratio: 0.5,
            min_requests: 20,
            window: HumanDuration::from_secs(10),
            consecutive_failures: 5,
            open_for: HumanDuration::from_secs(5),
            max_open_for: HumanDuration::from_secs(60),
            half_open_probes: 1,
            adaptive: false,
            min_concurrent: 1,
        }
    }
}

/// The response header that marks a fallback (the sidecar answered, not the
/// app); its value is the reason: `breaker_open`, `queue_full`, ...
pub const FALLBACK_HEADER: &str = "x-kubegrace-fallback";

/// The response served instead of the app's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct FallbackConfig {
    pub status: u16,
    pub content_type: String,
    /// At most 1 MiB.
    pub body: String,
}

impl Default for FallbackConfig {
    fn default() -> Self {
        Self {
            status: 503,
            content_type: "text/plain; charset=utf-8".into(),
            body: "service unavailable\n".into(),
        }
    }
}

impl RouteConfig {
    pub fn validate(&self, key: &str) -> Result<(), ConfigError> {
        if self.name.is_empty() {
            return Err(ConfigError::at(key, "name", "must not be empty"));
        }
        if self.name.len() > bounds::MAX_ROUTE_NAME_BYTES {
            return Err(ConfigError::at(
                key,
                "name",
                format!(
                    "is {} bytes long; at most {} (it labels the route's metrics)",
                    self.name.len(),
                    bounds::MAX_ROUTE_NAME_BYTES
                ),
            ));
        }
        let m = &self.matcher;
        if m.path.is_some() && m.path_prefix.is_some() {
            return Err(ConfigError::at(
                key,
                "match",
                "set path (exact) or pathPrefix, not both",
            ));
        }
        for (field, value) in [("path", &m.path), ("pathPrefix", &m.path_prefix)] {
            if let Some(p) = value
                && !p.starts_with('/')
            {
                return Err(ConfigError::new(
                    format!("{key}.match.{field}"),
                    format!("{p:?} must start with /"),
                ));
            }
        }
        for (j, method) in m.methods.iter().enumerate() {
            if method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()) {
                return Err(ConfigError::new(
                    format!("{key}.match.methods[{j}]"),
                    format!("{method:?} is not an HTTP method; write it in capitals, like GET"),
                ));
            }
        }
        if let Some(t) = self.timeout {
            if t.get().is_zero() {
                return Err(ConfigError::at(
                    key,
                    "timeout",
                    "must be more than 0s; leave it out for no timeout",
                ));
            }
            duration_at_most(key, "timeout", t, MAX_DURATION)?;
        }
        if let Some(cb) = &self.circuit_breaker {
            cb.validate(&format!("{key}.circuitBreaker"))?;
        }
        if let Some(fb) = &self.fallback {
            fb.validate(&format!("{key}.fallback"))?;
        }
        Ok(())
    }
}

impl CircuitBreakerConfig {
    pub fn validate(&self, key: &str) -> Result<(), ConfigError> {
        if self.max_concurrent == 0 {
            return Err(ConfigError::at(key, "maxConcurrent", "must be at least 1"));
        }
        if !(0.0..=1.0).contains(&self.error_ratio) || self.error_ratio.is_nan() {
            return Err(ConfigError::at(
                key,
                "errorRatio",
                format!(
                    "{} is not a ratio; use a number from 0 (off) to 1",
                    self.error_ratio
                ),
            ));
        }
        if self.error_ratio > 0.0 && self.window.get().is_zero() {
            return Err(ConfigError::at(
                key,
                "window",
                "must be more than 0s when errorRatio is set",
            ));
        }
        if self.open_for.get().is_zero() {
            return Err(ConfigError::at(key, "openFor", "must be more than 0s"));
        }
        if self.max_open_for < self.open_for {
            return Err(ConfigError::at(
                key,
                "maxOpenFor",
                format!(
                    "{} is shorter than openFor {}",
                    self.max_open_for, self.open_for
                ),
            ));
        }
        if self.half_open_probes == 0 {
            return Err(ConfigError::at(
                key,
                "halfOpenProbes",
                "must be at least 1, or the breaker could never close again",
            ));
        }
        if self.adaptive && (self.min_concurrent == 0 || self.min_concurrent > self.max_concurrent)
        {
            return Err(ConfigError::at(
                key,
                "minConcurrent",
                format!(
                    "{} must be between 1 and maxConcurrent {} when adaptive is on",
                    self.min_concurrent, self.max_concurrent
                ),
            ));
        }
        if self.max_queue > 0 && self.queue_timeout.get().is_zero() {
            return Err(ConfigError::at(
                key,
                "queueTimeout",
                "must be more than 0s when maxQueue is above 0",
            ));
        }
        for (field, value, max) in [
            ("maxConcurrent", self.max_concurrent, MAX_BREAKER_COUNT),
            ("maxQueue", self.max_queue, MAX_BREAKER_COUNT),
            ("minRequests", self.min_requests, MAX_BREAKER_COUNT),
            (
                "consecutiveFailures",
                self.consecutive_failures,
                MAX_BREAKER_COUNT,
            ),
            (
                "halfOpenProbes",
                self.half_open_probes,
                bounds::MAX_HALF_OPEN_PROBES,
            ),
            ("minConcurrent", self.min_concurrent, MAX_BREAKER_COUNT),
        ] {
            count_in(key, field, u64::from(value), 0, u64::from(max), "")?;
        }
        for (field, value) in [
            ("queueTimeout", self.queue_timeout),
            ("window", self.window),
            ("openFor", self.open_for),
            ("maxOpenFor", self.max_open_for),
        ] {
            duration_at_most(key, field, value, MAX_DURATION)?;
        }
        Ok(())
    }
}

impl FallbackConfig {
    pub fn validate(&self, key: &str) -> Result<(), ConfigError> {
        if !(200..=599).contains(&self.status) {
            return Err(ConfigError::at(
                key,
                "status",
                format!("{} is not a response status; use 200-599", self.status),
            ));
        }
        // What the http crate accepts in a header value: no control
        // characters but tab, no DEL (it would refuse to send it).
        if self
            .content_type
            .bytes()
            .any(|b| (b < 0x20 && b != b'\t') || b == 0x7f)
        {
            return Err(ConfigError::at(
                key,
                "contentType",
                "is not a valid header value",
            ));
        }
        count_in(
            key,
            "body",
            wide(self.body.len()),
            0,
            wide(bounds::MAX_FALLBACK_BODY_BYTES),
            "bytes",
        )?;
        Ok(())
    }
}
