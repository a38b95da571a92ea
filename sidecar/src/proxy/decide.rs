//! What the proxy does with one HTTP/1 or HTTP/2 request, decided once for
//! both HTTP/1 paths: the hyper path (handler.rs, on `http` types) and the
//! fast path (h1/exchange.rs, on the head's bytes) call this step and only
//! carry its decision out, each in its own medium (a hyper `Response`, or
//! bytes written to the socket), so the two cannot drift.
//!
//! The decision, in this order on both paths:
//!
//! 1. The path is normalized before anything else (proxy/path.rs; each
//!    parser refuses a path it cannot normalize with 400), so the route is
//!    chosen on the path the app gets.
//! 2. [`route`]: the first route matching the method, the `Host` (as text
//!    by one rule, [`host_text`]) and the normalized path.
//! 3. [`admit`]: a declared body (`Content-Length`) over the limit is
//!    refused with 413 before the circuit is asked, so an oversized request
//!    never takes a concurrency slot or waits in the queue; then the route's
//!    circuit admits it (a [`Permit`]) or rejects it, and the rejection is
//!    answered with the route's fallback.
//!
//! (Before this step existed, the hyper path checked the 413 before it
//! normalized the path, so a request with both an escaped slash and an
//! oversized body got 413 there and 400 on the fast path; both give 400
//! now.)
//!
//! Per request this is no more than the paths did inline: no allocation,
//! no lock; the answer to a refusal is built only when there is one.

use std::sync::Arc;

use bytes::Bytes;
use http::header::{self, HeaderMap};
use http::{Method, Response, StatusCode};
use http_body_util::Full;

use super::local::local_response;
use crate::circuit::{Permit, Rejection, Route, RouteTable};
use crate::metrics::Metrics;

/// The route for a request, from its method, its `Host` header's bytes
/// (`authority`: the absolute-form target's, used when there is no `Host`
/// as text) and its normalized path.
pub(super) fn route(
    routes: &RouteTable,
    method: &Method,
    host: Option<&[u8]>,
    authority: Option<&str>,
    path: &str,
) -> Arc<Route> {
    // Made text only when a route matches on it (the fast path's reason:
    // checking the bytes costs, and no route would look).
    let host = match routes.matches_hosts() {
        true => host.and_then(host_text).or(authority),
        false => None,
    };
    routes.select(method, host, path)
}

/// The route for a request as hyper's types give it (the hyper path), by
/// the same rule as [`route`] on the fast path's bytes; its path already
/// normalized (handler.rs).
pub(super) fn route_of<B>(routes: &RouteTable, req: &http::Request<B>) -> Arc<Route> {
    route(
        routes,
        req.method(),
        req.headers().get(header::HOST).map(|h| h.as_bytes()),
        req.uri().authority().map(|a| a.as_str()),
        req.uri().path(),
    )
}

/// A `Host` value as text, by the rule hyper's types use
/// (`HeaderValue::to_str`: tab and visible ASCII; anything else is matched
/// as no host).
pub(super) fn host_text(value: &[u8]) -> Option<&str> {
    if value
        .iter()
        .all(|&b| b == b'\t' || (0x20..0x7f).contains(&b))
    {
        std::str::from_utf8(value).ok()
    } else {
        None
    }
}

/// The body length a request's headers declare (`Content-Length`), for
/// [`admit`]; the fast path has it from its own framing.
pub(super) fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
}

/// Why a request is answered by the proxy instead of the app.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Refused {
    /// The declared body is over `limits.maxRequestBodyBytes`: 413.
    TooLarge,
    /// The route's circuit rejected it: the route's fallback.
    Circuit(Rejection),
}

/// The answer to a refused request, and whether the connection must end
/// with it (an HTTP/1 client's refused body is still coming, unread).
pub(super) struct Answer {
    pub(super) response: Response<Full<Bytes>>,
    pub(super) close: bool,
}

impl Refused {
    /// The sidecar's answer, built only now that there is a refusal.
    pub(super) fn answer(&self, route: &Route) -> Answer {
        match self {
            Refused::TooLarge => Answer {
                response: local_response(StatusCode::PAYLOAD_TOO_LARGE, "request body too large\n"),
                close: true,
            },
            Refused::Circuit(rejection) => Answer {
                response: route.fallback(rejection),
                // A body hyper reads and drops; the fast path closes on
                // any unread body itself (h1/exchange.rs).
                close: false,
            },
        }
    }
}

/// Whether `route` takes a request that declares a body of `declared`
/// bytes under the body limit `max_body` (zero: no limit): the permit the
/// request carries to its end, or why not (counted and logged here, once
/// for both paths).
pub(super) async fn admit(
    route: &Arc<Route>,
    declared: Option<u64>,
    max_body: u64,
    metrics: &Metrics,
) -> Result<Permit, Refused> {
    if max_body > 0 && declared.is_some_and(|len| len > max_body) {
        metrics.body_too_large();
        return Err(Refused::TooLarge);
    }
    route.admit().await.map_err(|rejection| {
        tracing::debug!(
            route = route.name(),
            reason = rejection.reason(),
            "request rejected by the circuit"
        );
        Refused::Circuit(rejection)
    })
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
