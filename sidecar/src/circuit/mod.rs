//! Per-route circuit breaking, overload protection and fallbacks.
//!
//! The proxy asks a [`RouteTable`] which [`Route`] a request belongs to, then
//! asks the route to [`Route::admit`] it. Admission either hands back a
//! [`Permit`] (the request may go to the app; the permit's slot is released
//! when the proxy drops it at the end of the response body) or a
//! [`Rejection`], which the proxy answers with [`Route::fallback`].
//!
//! A route without a `circuitBreaker` takes the fast path: admission is an
//! atomic increment and nothing else. A route with one has a guard: a
//! concurrency limiter with a bounded queue (fixed or adaptive) and a
//! closed/open/half-open breaker fed by the outcomes the proxy records.
//!
//! Guards are shared between the old and the new table on reload when a
//! route keeps its name and its `circuitBreaker` settings, so a reload never
//! closes an open breaker or forgets the capacity the limiter found.
//!
//! Decisions where the issue was silent:
//! - Matching: `pathPrefix` matches whole segments (Gateway API), so `/api`
//!   takes `/api/x` but not `/apis`; the query never matters; hosts compare
//!   without port and case. A configured route named `default` is the
//!   catch-all's policy (it still matches first at its own position).
//! - An open breaker answers before queueing; the breaker is asked again
//!   once a queued request gets its slot (it may have opened meanwhile).
//! - `Retry-After`: the rest of the open period while open; 1s while
//!   half-open with all probes out and for queue rejections.
//! - Failures: listed `failOn` kinds only. A fast 5xx or a refused
//!   connection is a failure but no latency sample for the adaptive limit
//!   (it says nothing about queueing); a timeout is both. A `ConnectError`
//!   or `Timeout` not listed in `failOn` counts as nothing at all.
//! - Series for breaker, limiter and rejections exist only for routes with
//!   a `circuitBreaker`; `kubegrace_route_inflight_requests` for every route. The
//!   counters of a route survive any reload that keeps its name.
//! - A reload that changes a route's breaker settings starts a fresh guard;
//!   requests still running on the old one keep their old slots, so for one
//!   request duration the app may see up to both limits together.

mod breaker;
mod gradient;
mod guard;
mod limiter;
mod matcher;
mod metrics;
mod window;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, StatusCode, header};
use http_body_util::Full;

use crate::config::{CATCH_ALL_ROUTE, CircuitBreakerConfig, FailureKind, RouteConfig};
use crate::upstream::retry::{RetryDenied, RetryReason};
use guard::{Guard, GuardTicket};
use matcher::CompiledMatch;

/// The routes in force: first match wins, the default route catches the rest.
pub struct RouteTable {
    routes: Vec<Arc<Route>>,
    default_route: Arc<Route>,
    /// Some route matches on the host: only then is a request's `Host`
    /// needed as text (the fast path skips checking its UTF-8 otherwise).
    matches_hosts: bool,
}

/// One route's policy and live state.
pub struct Route {
    name: String,
    matcher: CompiledMatch,
    timeout: Option<Duration>,
    fallback: PreparedFallback,
    failures: FailurePolicy,
    /// The breaker settings this route was built from; reload compares them.
    breaker_config: Option<CircuitBreakerConfig>,
    /// `None` is the fast path: no limit, no breaker.
    guard: Option<Arc<Guard>>,
    /// `retry.idempotent`: requests that may have reached the app are
    /// retried too when their method is idempotent.
    retry_idempotent: bool,
    stats: Arc<RouteStats>,
}

/// Counters that outlive a reload as long as the route keeps its name, so
/// Prometheus never sees a counter go backwards because of a config change.
#[derive(Default)]
pub(crate) struct RouteStats {
    pub(crate) inflight: AtomicU64,
    /// Requests not admitted, by `Rejection::REASONS` order.
    pub(crate) rejected: [AtomicU64; 3],
    /// Breaker states entered, by `BreakerState::ALL` order.
    pub(crate) transitions: [AtomicU64; 3],
    /// Retries, by `RetryReason::ALL` order.
    pub(crate) retries: [AtomicU64; 3],
    /// Retryable failures not retried, by `RetryDenied::ALL` order.
    pub(crate) retries_denied: [AtomicU64; 2],
    /// Responses sent downstream for this route, by status class: index
    /// 0 = 1xx ... 4 = 5xx (`kubegrace_requests_total`).
    pub(crate) responses: [AtomicU64; 5],
}

/// What happened to a request the route admitted, as the proxy saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamOutcome {
    /// The app answered with this status (response head received).
    Status(StatusCode),
    /// The app could not be reached: refused, reset before a response.
    ConnectError,
    /// The route's timeout passed before the app answered.
    Timeout,
    /// The downstream went away or the drain cut the request: never a
    /// failure, because it says nothing about the app's health.
    Cancelled,
    /// The client's own request failed: malformed body framing, a body
    /// over the limit or too slow, the client gone mid-body. Never a
    /// failure either, or any client could open the breaker for everyone.
    ClientFault,
}

/// Why a request was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    /// The breaker is open (or half-open with all probes taken).
    BreakerOpen { retry_after: Duration },
    /// Every slot is busy and the queue is full.
    QueueFull,
    /// Waited `queueTimeout` in the queue without getting a slot.
    QueueTimeout,
}

impl Rejection {
    /// Every `reason()`, in the order `RouteStats::rejected` counts them.
    pub(crate) const REASONS: [&'static str; 3] = ["breaker_open", "queue_full", "queue_timeout"];

    /// Metric label and `x-kubegrace-fallback` value.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::BreakerOpen { .. } => "breaker_open",
            Self::QueueFull => "queue_full",
            Self::QueueTimeout => "queue_timeout",
        }
    }

    /// How long a client should wait before trying again. Queue rejections
    /// are about momentary overload, so one second is the honest hint.
    pub fn retry_after(&self) -> Duration {
        match self {
            Self::BreakerOpen { retry_after } => *retry_after,
            Self::QueueFull | Self::QueueTimeout => Duration::from_secs(1),
        }
    }
}

/// The right to send one request to the app. Dropping it releases the slot;
/// dropping it without [`Permit::record`] counts as `Cancelled`.
pub struct Permit {
    route: Arc<Route>,
    /// `None` on the fast path or once the outcome was recorded.
    ticket: Option<GuardTicket>,
}

impl Permit {
    /// Reports what the app did. Only the first call counts, so the proxy
    /// can record at the response head and again on a body error without
    /// counting the request twice.
    pub fn record(&mut self, outcome: UpstreamOutcome) {
        let Some(ticket) = self.ticket.as_mut() else {
            return;
        };
        if let Some(guard) = &self.route.guard {
            let verdict = self.route.failures.classify(outcome);
            guard.record(ticket, verdict);
        }
    }

    /// The route this permit was issued by.
    pub fn route(&self) -> &Arc<Route> {
        &self.route
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let (Some(ticket), Some(guard)) = (self.ticket.as_mut(), &self.route.guard) {
            // A permit dropped before any outcome was recorded: the client
            // left or the drain cut the request. Release any half-open probe
            // slot it held without blaming the app.
            guard.record(ticket, Verdict::Cancelled);
        }
        // The ticket's own Drop returns the limiter slot.
        self.ticket = None;
        self.route.stats.inflight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// How an outcome counts for the breaker and the adaptive limiter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Counts as a success; the latency is a fair sample of the app.
    Success,
    /// Counts against the app; `latency_sample` says whether its latency
    /// tells the limiter anything (a timeout does, a fast refusal does not).
    Failure { latency_sample: bool },
    /// Counts as nothing.
    Cancelled,
}

/// The `failOn` list, compiled for a branch-free check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FailurePolicy {
    any_5xx: bool,
    /// Bit `n` set means status `500 + n` is a failure.
    statuses_5xx: u128,
    connect_error: bool,
    timeout: bool,
}

impl FailurePolicy {
    fn new(kinds: &[FailureKind]) -> Self {
        let mut policy = Self {
            any_5xx: false,
            statuses_5xx: 0,
            connect_error: false,
            timeout: false,
        };
        for kind in kinds {
            match *kind {
                FailureKind::Status5xx => policy.any_5xx = true,
                FailureKind::Status(code @ 500..=599) => {
                    policy.statuses_5xx |= 1u128 << (code - 500)
                }
                // Validation rejects anything else; a stray 4xx never counts.
                FailureKind::Status(_) => {}
                FailureKind::ConnectError => policy.connect_error = true,
                FailureKind::Timeout => policy.timeout = true,
            }
        }
        policy
    }

    fn classify(&self, outcome: UpstreamOutcome) -> Verdict {
        match outcome {
            UpstreamOutcome::Status(status) => {
                let code = status.as_u16();
                let failed = (500..=599).contains(&code)
                    && (self.any_5xx || self.statuses_5xx & (1u128 << (code - 500)) != 0);
                if failed {
                    // A fast 5xx says nothing about queueing in the app.
                    Verdict::Failure {
                        latency_sample: false,
                    }
                } else {
                    Verdict::Success
                }
            }
            UpstreamOutcome::ConnectError if self.connect_error => Verdict::Failure {
                latency_sample: false,
            },
            UpstreamOutcome::Timeout if self.timeout => Verdict::Failure {
                latency_sample: true,
            },
            // Not configured as failures: neither good nor bad evidence.
            UpstreamOutcome::ConnectError | UpstreamOutcome::Timeout => Verdict::Cancelled,
            UpstreamOutcome::Cancelled | UpstreamOutcome::ClientFault => Verdict::Cancelled,
        }
    }
}

/// The fallback response, prepared once per config.
struct PreparedFallback {
    status: StatusCode,
    content_type: HeaderValue,
    body: Bytes,
    /// Without a configured fallback the body names the reason.
    configured: bool,
}

impl PreparedFallback {
    fn new(route: &RouteConfig) -> Self {
        let configured = route.fallback.as_ref().and_then(|fallback| {
            let status = StatusCode::from_u16(fallback.status).ok()?;
            let content_type = HeaderValue::from_str(&fallback.content_type).ok()?;
            Some(Self {
                status,
                content_type,
                body: Bytes::from(fallback.body.clone()),
                configured: true,
            })
        });
        configured.unwrap_or_else(|| Self {
            status: StatusCode::SERVICE_UNAVAILABLE,
            content_type: HeaderValue::from_static("text/plain; charset=utf-8"),
            body: Bytes::new(),
            configured: false,
        })
    }
}

impl Route {
    fn build(config: &RouteConfig, previous: Option<&Arc<Route>>) -> Route {
        let stats = previous.map(|p| p.stats.clone()).unwrap_or_default();
        let keep_guard = previous.filter(|p| p.breaker_config == config.circuit_breaker);
        let guard = match (keep_guard, &config.circuit_breaker) {
            (Some(previous), _) => previous.guard.clone(),
            (None, Some(breaker)) => {
                Some(Arc::new(Guard::new(&config.name, breaker, stats.clone())))
            }
            (None, None) => None,
        };
        Route {
            name: config.name.clone(),
            matcher: CompiledMatch::compile(&config.matcher),
            timeout: config.timeout.map(|t| t.get()),
            fallback: PreparedFallback::new(config),
            failures: FailurePolicy::new(&config.fail_on),
            breaker_config: config.circuit_breaker.clone(),
            guard,
            retry_idempotent: config.retry.is_some_and(|r| r.idempotent),
            stats,
        }
    }

    fn builtin_default(previous: Option<&Arc<Route>>) -> Route {
        let config = RouteConfig {
            name: CATCH_ALL_ROUTE.to_string(),
            matcher: Default::default(),
            timeout: None,
            circuit_breaker: None,
            fallback: None,
            fail_on: FailureKind::defaults(),
            retry: None,
        };
        let mut route = Route::build(&config, previous);
        route.matcher = CompiledMatch::any();
        route
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The upstream timeout for this route; `None` waits as long as the app.
    pub fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// Whether requests that may have reached the app are retried when
    /// their method is idempotent (`retry.idempotent`).
    pub fn retries_idempotent(&self) -> bool {
        self.retry_idempotent
    }

    /// A response to a request of this route went downstream; `class` is
    /// its status class less one (0 = 1xx ... 4 = 5xx).
    #[inline]
    pub(crate) fn count_response(&self, class: usize) {
        if let Some(counter) = self.stats.responses.get(class) {
            counter.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A request of this route went to the app again.
    pub fn count_retry(&self, reason: RetryReason) {
        let i = RetryReason::ALL
            .iter()
            .position(|r| *r == reason)
            .unwrap_or(0);
        self.stats.retries[i].fetch_add(1, Ordering::Relaxed);
    }

    /// A request of this route could have gone again and did not.
    pub fn count_retry_denied(&self, why: RetryDenied) {
        let i = RetryDenied::ALL.iter().position(|r| *r == why).unwrap_or(0);
        self.stats.retries_denied[i].fetch_add(1, Ordering::Relaxed);
    }

    /// Requests of this route currently admitted and not yet finished.
    pub fn inflight(&self) -> u64 {
        self.stats.inflight.load(Ordering::Relaxed)
    }

    /// Admits a request or says why not.
    ///
    /// Without a breaker this is immediate and lock-free. With one: a
    /// request is rejected at once while the breaker is open, otherwise it
    /// waits for a concurrency slot (at most `maxQueue` wait, each at most
    /// `queueTimeout`), and the breaker is consulted again once it has one,
    /// because its state may have changed while the request was queued.
    pub async fn admit(self: &Arc<Self>) -> Result<Permit, Rejection> {
        let ticket = match &self.guard {
            None => None,
            Some(guard) => match guard.admit().await {
                Ok(ticket) => Some(ticket),
                Err(rejection) => {
                    self.count_rejection(&rejection);
                    return Err(rejection);
                }
            },
        };
        self.stats.inflight.fetch_add(1, Ordering::Relaxed);
        Ok(Permit {
            route: self.clone(),
            ticket,
        })
    }

    fn count_rejection(&self, rejection: &Rejection) {
        let reason = rejection.reason();
        let i = Rejection::REASONS
            .iter()
            .position(|r| *r == reason)
            .unwrap_or(0);
        self.stats.rejected[i].fetch_add(1, Ordering::Relaxed);
    }

    /// The response served instead of the app's: the configured fallback or
    /// a plain 503, always with `Retry-After` (whole seconds, rounded up,
    /// at least 1) and `x-kubegrace-fallback: <reason>`.
    pub fn fallback(&self, rejection: &Rejection) -> http::Response<Full<Bytes>> {
        let body = if self.fallback.configured {
            self.fallback.body.clone()
        } else {
            Bytes::from_static(match rejection {
                Rejection::BreakerOpen { .. } => b"service unavailable: circuit breaker open\n",
                Rejection::QueueFull => b"service unavailable: overloaded, queue full\n",
                Rejection::QueueTimeout => b"service unavailable: overloaded, queue timeout\n",
            })
        };
        let mut response = http::Response::new(Full::new(body));
        *response.status_mut() = self.fallback.status;
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, self.fallback.content_type.clone());
        headers.insert(
            header::RETRY_AFTER,
            HeaderValue::from(retry_after_secs(rejection.retry_after())),
        );
        headers.insert(
            crate::config::FALLBACK_HEADER,
            HeaderValue::from_static(rejection.reason()),
        );
        // A fallback must never be cached as if it were the app's answer.
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        response
    }
}

/// Whole seconds, rounded up, never below 1: `Retry-After: 0` invites a
/// retry storm.
fn retry_after_secs(wait: Duration) -> u64 {
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    secs.max(1)
}

impl RouteTable {
    pub fn new(routes: &[RouteConfig]) -> RouteTable {
        Self::build(routes, &HashMap::new())
    }

    /// A table for new settings that keeps the live state of every route
    /// whose name and `circuitBreaker` settings did not change.
    pub fn reconfigure(&self, routes: &[RouteConfig]) -> RouteTable {
        let previous: HashMap<&str, &Arc<Route>> = self
            .routes
            .iter()
            .chain(std::iter::once(&self.default_route))
            .map(|route| (route.name.as_str(), route))
            .collect();
        Self::build(routes, &previous)
    }

    fn build(configs: &[RouteConfig], previous: &HashMap<&str, &Arc<Route>>) -> RouteTable {
        let routes: Vec<Arc<Route>> = configs
            .iter()
            .map(|config| {
                Arc::new(Route::build(
                    config,
                    previous.get(config.name.as_str()).copied(),
                ))
            })
            .collect();
        // A configured route named "default" is the catch-all's policy; it
        // still matches at its own position with its own match first.
        let default_route = routes
            .iter()
            .find(|route| route.name == CATCH_ALL_ROUTE)
            .cloned()
            .unwrap_or_else(|| {
                Arc::new(Route::builtin_default(
                    previous.get(CATCH_ALL_ROUTE).copied(),
                ))
            });
        let matches_hosts = routes.iter().any(|route| route.matcher.has_host_rule());
        RouteTable {
            routes,
            default_route,
            matches_hosts,
        }
    }

    /// Whether any route matches on the host (else `select` ignores it).
    pub fn matches_hosts(&self) -> bool {
        self.matches_hosts
    }

    /// The route for a request: first match wins, the default route catches
    /// the rest.
    pub fn select(&self, method: &http::Method, host: Option<&str>, path: &str) -> Arc<Route> {
        self.routes
            .iter()
            .find(|route| route.matcher.matches(method, host, path))
            .unwrap_or(&self.default_route)
            .clone()
    }

    /// Every route in match order, the catch-all last (once).
    fn all_routes(&self) -> impl Iterator<Item = &Arc<Route>> + Clone {
        let builtin = (!self
            .routes
            .iter()
            .any(|r| Arc::ptr_eq(r, &self.default_route)))
        .then_some(&self.default_route);
        self.routes.iter().chain(builtin)
    }

    /// Each route's name and its response counts by status class
    /// (1xx ... 5xx), for `kubegrace_requests_total`.
    pub fn response_counts(&self) -> impl Iterator<Item = (&str, [u64; 5])> {
        self.all_routes().map(|route| {
            let counts = route
                .stats
                .responses
                .each_ref()
                .map(|c| c.load(Ordering::Relaxed));
            (route.name.as_str(), counts)
        })
    }

    /// Prometheus text exposition of every route's breaker and limiter.
    pub fn render_metrics(&self, out: &mut String) {
        metrics::render(self.all_routes(), out);
    }

    /// The live state of every route, for `GET /breakers`.
    pub fn snapshot(&self) -> serde_json::Value {
        let routes: Vec<serde_json::Value> = self
            .all_routes()
            .map(|route| metrics::route_snapshot(route))
            .collect();
        serde_json::json!({ "routes": routes })
    }
}

#[cfg(test)]
mod tests;
