//! Prometheus text and the `/breakers` JSON for the route table.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::breaker::BreakerState;
use super::{Rejection, Route, RouteStats};
use crate::metrics::Family;
use crate::upstream::retry::{RetryDenied, RetryReason};
use kubegrace_sidecar_api::exposition::Escaped;

/// Renders every route's series, each family with its HELP and TYPE once.
///
/// Breaker, limiter and rejection series exist only for routes with a
/// `circuitBreaker`; `kubegrace_route_inflight_requests` exists for every route.
pub(crate) fn render<'a>(routes: impl Iterator<Item = &'a Arc<Route>> + Clone, out: &mut String) {
    let guarded = || routes.clone().filter(|route| route.guard.is_some());

    per_route(
        Family::new(
            out,
            "kubegrace_breaker_state",
            "gauge",
            "Circuit breaker state per route: 0 closed, 1 open, 2 half-open.",
        ),
        guarded(),
        |route| Some(route.guard.as_ref()?.current_state() as u8),
    );
    per_route_by(
        Family::new(
            out,
            "kubegrace_breaker_transitions_total",
            "counter",
            "Circuit breaker state changes per route, by the state entered.",
        ),
        guarded(),
        "to",
        BreakerState::ALL.map(BreakerState::as_str),
        |stats| stats.transitions.each_ref(),
    );
    per_route_by(
        Family::new(
            out,
            "kubegrace_rejected_requests_total",
            "counter",
            "Requests answered with the fallback instead of the app, by reason.",
        ),
        guarded(),
        "reason",
        Rejection::REASONS,
        |stats| stats.rejected.each_ref(),
    );
    per_route(
        Family::new(
            out,
            "kubegrace_concurrency_limit",
            "gauge",
            "Requests a route lets through to the app at once (moves when adaptive).",
        ),
        guarded(),
        |route| Some(route.guard.as_ref()?.limit()),
    );
    per_route(
        Family::new(
            out,
            "kubegrace_queue_depth",
            "gauge",
            "Requests waiting for a concurrency slot.",
        ),
        guarded(),
        |route| Some(route.guard.as_ref()?.queued()),
    );
    per_route(
        Family::new(
            out,
            "kubegrace_route_inflight_requests",
            "gauge",
            "Requests admitted to the app and not finished, per route.",
        ),
        routes.clone(),
        |route| Some(route.inflight()),
    );
    per_route_by(
        Family::new(
            out,
            "kubegrace_retries_total",
            "counter",
            "Requests sent to the app again, per route, by reason: refused_stream and goaway (the app never saw them), idempotent (route opt-in).",
        ),
        routes.clone(),
        "reason",
        RetryReason::ALL.map(RetryReason::as_str),
        |stats| stats.retries.each_ref(),
    );
    per_route_by(
        Family::new(
            out,
            "kubegrace_retries_denied_total",
            "counter",
            "Requests that could have been retried and were not, per route: budget (retryBudget spent), body (larger than retryBudget.maxBodyBytes).",
        ),
        routes,
        "reason",
        RetryDenied::ALL.map(RetryDenied::as_str),
        |stats| stats.retries_denied.each_ref(),
    );
}

/// A series per route (`route="name"`) for the routes `value` has one for.
fn per_route<'a, V: std::fmt::Display>(
    mut family: Family<'_>,
    routes: impl Iterator<Item = &'a Arc<Route>>,
    value: impl Fn(&Route) -> Option<V>,
) {
    for route in routes {
        if let Some(value) = value(route) {
            family.series(format_args!("route=\"{}\"", Escaped(&route.name)), value);
        }
    }
}

/// A series per route and value of `label` (`route="name",label="value"`):
/// `values[i]` is what `counters(stats)[i]` counts.
fn per_route_by<'a, const N: usize>(
    mut family: Family<'_>,
    routes: impl Iterator<Item = &'a Arc<Route>>,
    label: &str,
    values: [&str; N],
    counters: impl Fn(&RouteStats) -> [&AtomicU64; N],
) {
    for route in routes {
        for (value, counter) in values.iter().zip(counters(&route.stats)) {
            family.series(
                format_args!("route=\"{}\",{label}=\"{value}\"", Escaped(&route.name)),
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
        value["rejections"] = counts(Rejection::REASONS, &stats.rejected);
        value["transitions"] = counts(
            BreakerState::ALL.map(BreakerState::as_str),
            &stats.transitions,
        );
    }
    value
}

/// `{label: count}` for the `/breakers` JSON, the labels in counting order.
fn counts<const N: usize>(labels: [&str; N], counters: &[AtomicU64; N]) -> serde_json::Value {
    labels
        .into_iter()
        .zip(counters)
        .map(|(label, counter)| (label.to_owned(), counter.load(Ordering::Relaxed).into()))
        .collect::<serde_json::Map<_, _>>()
        .into()
}
