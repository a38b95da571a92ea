//! Prometheus text and the `/breakers` JSON for the route table.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::Route;
use super::breaker::BreakerState;
use crate::metrics::Family;
use crate::upstream::retry::{RetryDenied, RetryReason};
use kubegrace_sidecar_api::exposition::Escaped;

/// Renders every route's series, each family with its HELP and TYPE once.
///
/// Breaker, limiter and rejection series exist only for routes with a
/// `circuitBreaker`; `kubegrace_route_inflight_requests` exists for every route.
pub(crate) fn render<'a>(routes: impl Iterator<Item = &'a Arc<Route>> + Clone, out: &mut String) {
    let guarded = || routes.clone().filter(|route| route.guard.is_some());

    let mut family = Family::new(
        out,
        "kubegrace_breaker_state",
        "gauge",
        "Circuit breaker state per route: 0 closed, 1 open, 2 half-open.",
    );
    for route in guarded() {
        if let Some(guard) = &route.guard {
            let state = guard.current_state() as u8;
            family.series(format_args!("route=\"{}\"", Escaped(&route.name)), state);
        }
    }

    let mut family = Family::new(
        out,
        "kubegrace_breaker_transitions_total",
        "counter",
        "Circuit breaker state changes per route, by the state entered.",
    );
    for route in guarded() {
        let stats = &route.stats;
        for (to, counter) in [
            (BreakerState::Closed, &stats.transitions_to_closed),
            (BreakerState::Open, &stats.transitions_to_open),
            (BreakerState::HalfOpen, &stats.transitions_to_half_open),
        ] {
            family.series(
                format_args!("route=\"{}\",to=\"{}\"", Escaped(&route.name), to.as_str()),
                counter.load(Ordering::Relaxed),
            );
        }
    }

    let mut family = Family::new(
        out,
        "kubegrace_rejected_requests_total",
        "counter",
        "Requests answered with the fallback instead of the app, by reason.",
    );
    for route in guarded() {
        let stats = &route.stats;
        for (reason, counter) in [
            ("breaker_open", &stats.rejected_breaker_open),
            ("queue_full", &stats.rejected_queue_full),
            ("queue_timeout", &stats.rejected_queue_timeout),
        ] {
            family.series(
                format_args!("route=\"{}\",reason=\"{reason}\"", Escaped(&route.name)),
                counter.load(Ordering::Relaxed),
            );
        }
    }

    let mut family = Family::new(
        out,
        "kubegrace_concurrency_limit",
        "gauge",
        "Requests a route lets through to the app at once (moves when adaptive).",
    );
    for route in guarded() {
        if let Some(guard) = &route.guard {
            family.series(
                format_args!("route=\"{}\"", Escaped(&route.name)),
                guard.limit(),
            );
        }
    }

    let mut family = Family::new(
        out,
        "kubegrace_queue_depth",
        "gauge",
        "Requests waiting for a concurrency slot.",
    );
    for route in guarded() {
        if let Some(guard) = &route.guard {
            family.series(
                format_args!("route=\"{}\"", Escaped(&route.name)),
                guard.queued(),
            );
        }
    }

    let mut family = Family::new(
        out,
        "kubegrace_route_inflight_requests",
        "gauge",
        "Requests admitted to the app and not finished, per route.",
    );
    for route in routes.clone() {
        family.series(
            format_args!("route=\"{}\"", Escaped(&route.name)),
            route.inflight(),
        );
    }

    let mut family = Family::new(
        out,
        "kubegrace_retries_total",
        "counter",
        "Requests sent to the app again, per route, by reason: refused_stream and goaway (the app never saw them), idempotent (route opt-in).",
    );
    for route in routes.clone() {
        for (reason, counter) in RetryReason::ALL.iter().zip(&route.stats.retries) {
            family.series(
                format_args!(
                    "route=\"{}\",reason=\"{}\"",
                    Escaped(&route.name),
                    reason.as_str()
                ),
                counter.load(Ordering::Relaxed),
            );
        }
    }

    let mut family = Family::new(
        out,
        "kubegrace_retries_denied_total",
        "counter",
        "Requests that could have been retried and were not, per route: budget (retryBudget spent), body (larger than retryBudget.maxBodyBytes).",
    );
    for route in routes {
        for (why, counter) in RetryDenied::ALL.iter().zip(&route.stats.retries_denied) {
            family.series(
                format_args!(
                    "route=\"{}\",reason=\"{}\"",
                    Escaped(&route.name),
                    why.as_str()
                ),
                counter.load(Ordering::Relaxed),
            );
        }
    }
}

/// One route's entry in `GET /breakers`.
pub(crate) fn route_snapshot(route: &Route) -> serde_json::Value {
    let stats = &route.stats;
    let mut value = serde_json::json!({
        "name": route.name,
        "timeoutMs": route.timeout.map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
        "inflight": route.inflight(),
        "breaker": null,
        "limiter": null,
    });
    if let Some(guard) = &route.guard {
        let live = guard.snapshot();
        value["breaker"] = live["breaker"].clone();
        value["limiter"] = live["limiter"].clone();
        value["rejections"] = serde_json::json!({
            "breaker_open": stats.rejected_breaker_open.load(Ordering::Relaxed),
            "queue_full": stats.rejected_queue_full.load(Ordering::Relaxed),
            "queue_timeout": stats.rejected_queue_timeout.load(Ordering::Relaxed),
        });
        value["transitions"] = serde_json::json!({
            "closed": stats.transitions_to_closed.load(Ordering::Relaxed),
            "open": stats.transitions_to_open.load(Ordering::Relaxed),
            "half_open": stats.transitions_to_half_open.load(Ordering::Relaxed),
        });
    }
    value
}
