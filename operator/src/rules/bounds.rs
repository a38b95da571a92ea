//! The CRD's bounds, checked again on the object the operator reads.
//!
//! The API server enforces them on every write, but an object stored under
//! an older, looser CRD (or written while the schema was being replaced)
//! still reaches the operator: everything after this step (the budget's
//! sums, the rendered ConfigMap) relies on these bounds, so a route outside
//! them is refused here, naming the field and the fix, before any of it
//! runs. The numbers are [`crate::crd::bounds`], the schema's own.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kubegrace_sidecar_api::config::HumanDuration;

use super::Invalid;
use crate::crd::bounds::{
    MAX_CONCURRENT, MAX_CONSECUTIVE_FAILURES, MAX_CONTENT_TYPE, MAX_DRAIN, MAX_DURATION,
    MAX_FAIL_ON, MAX_FALLBACK_BODIES, MAX_FALLBACK_BODY, MAX_GRACE_SECONDS, MAX_HALF_OPEN_PROBES,
    MAX_HOST, MAX_METHOD, MAX_METHODS, MAX_MIN_READY_SECONDS, MAX_MIN_REQUESTS, MAX_PATH,
    MAX_PORT_NAME, MAX_PORTS, MAX_QUEUE, MAX_RETRY_BODY_BYTES, MAX_RETRY_MIN_PER_SECOND,
    MAX_ROLLOUT_PODS, MAX_ROUTE_NAME, MAX_ROUTE_OBJECT_NAME, MAX_ROUTES, MAX_TARGET_NAME,
};
use crate::crd::{CircuitBreakerSpec, GraceRoute, GraceRouteSpec, RouteSpec};

/// The condition reason of a route outside the bounds.
pub use crate::reasons::INVALID_SPEC as REASON;

fn refuse(field: &str, message: impl std::fmt::Display) -> Invalid {
    Invalid::new(REASON, format!("{field}: {message}"))
}

/// A user's string quoted for a message, cut short: an object from an
/// older CRD may hold a megabyte where a name belongs, and a condition
/// message has at most 32768 characters.
fn shown(s: &str) -> String {
    const MAX: usize = 64;
    if chars(s) <= MAX {
        return format!("{s:?}");
    }
    let head: String = s.chars().take(MAX).collect();
    format!("{head:?}... ({} characters)", chars(s))
}

/// Characters, as the API server counts `maxLength`.
fn chars(s: &str) -> usize {
    s.chars().count()
}

fn max_len(field: &str, s: &str, max: usize) -> Result<(), Invalid> {
    let n = chars(s);
    if n > max {
        return Err(refuse(
            field,
            format!("is {n} characters long; shorten it to at most {max}"),
        ));
    }
    Ok(())
}

fn max_items(field: &str, n: usize, max: usize, what: &str) -> Result<(), Invalid> {
    if n > max {
        return Err(refuse(
            field,
            format!("has {n} entries; at most {max} are allowed ({what})"),
        ));
    }
    Ok(())
}

fn in_range<T: PartialOrd + std::fmt::Display>(
    field: &str,
    v: T,
    min: T,
    max: T,
) -> Result<(), Invalid> {
    if v < min || v > max {
        return Err(refuse(
            field,
            format!("{v} is out of range; use {min} to {max}"),
        ));
    }
    Ok(())
}

fn duration(field: &str, d: HumanDuration) -> Result<(), Invalid> {
    if d.get() > MAX_DURATION {
        return Err(refuse(
            field,
            format!(
                "{d} is longer than the {} maximum; write at most {}",
                HumanDuration(MAX_DURATION),
                HumanDuration(MAX_DURATION)
            ),
        ));
    }
    Ok(())
}

/// [`crate::crd::bounds::DNS_LABEL_PATTERN`]: a DNS label (route and port names).
pub(crate) fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    let inner = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    match (b.first(), b.last()) {
        (Some(first), Some(last)) => {
            inner(first) && inner(last) && b.iter().all(|c| inner(c) || *c == b'-')
        }
        _ => false,
    }
}

/// [`crate::crd::bounds::PATH_PATTERN`]: `/`, then printable ASCII.
pub(crate) fn is_path(s: &str) -> bool {
    s.starts_with('/') && s.bytes().all(|c| c.is_ascii_graphic())
}

/// [`crate::crd::bounds::HOST_PATTERN`]: printable ASCII, no spaces.
pub(crate) fn is_host(s: &str) -> bool {
    s.bytes().all(|c| c.is_ascii_graphic())
}

/// [`crate::crd::bounds::CONTENT_TYPE_PATTERN`]: printable ASCII and tab.
pub(crate) fn is_content_type(s: &str) -> bool {
    s.bytes()
        .all(|c| c == b'\t' || c == b' ' || c.is_ascii_graphic())
}

/// [`crate::crd::bounds::PERCENT_PATTERN`]: `0%` to `100%`, no leading zeros.
pub(crate) fn is_percent(s: &str) -> bool {
    let Some(n) = s.strip_suffix('%') else {
        return false;
    };
    let digits = !n.is_empty() && n.bytes().all(|c| c.is_ascii_digit());
    digits
        && (n == "0" || !n.starts_with('0'))
        && n.len() <= 3
        && n.parse().is_ok_and(|v: u32| v <= 100)
}

/// Checks every bound of the CRD on `route` (pure). Relations the sidecar's
/// own validation also checks (`minDelay <= maxDelay`, `openFor <=
/// maxOpenFor`, ...) are checked here too where the schema has them, so the
/// message names the GraceRoute field rather than the rendered file's key.
pub fn check_bounds(route: &GraceRoute) -> Result<(), Invalid> {
    let name = route.metadata.name.as_deref().unwrap_or_default();
    if chars(name) > MAX_ROUTE_OBJECT_NAME {
        return Err(refuse(
            "metadata.name",
            format!(
                "is {} characters long, and it becomes the kubegrace.io/route label value on the route's ConfigMap (at most {MAX_ROUTE_OBJECT_NAME}); recreate the route under a shorter name",
                chars(name)
            ),
        ));
    }
    check_spec(&route.spec)
}

fn check_spec(spec: &GraceRouteSpec) -> Result<(), Invalid> {
    if let Some(t) = &spec.target_ref {
        if t.name.is_empty() {
            return Err(refuse("targetRef.name", "must not be empty"));
        }
        max_len("targetRef.name", &t.name, MAX_TARGET_NAME)?;
        // Stored under an older CRD without the group rule.
        if let Some(why) = t.unsupported_group() {
            return Err(refuse("targetRef.group", why));
        }
    }
    if spec.ports.is_empty() {
        return Err(refuse(
            "ports",
            "names no port; name the pod port the sidecar takes over",
        ));
    }
    max_items(
        "ports",
        spec.ports.len(),
        MAX_PORTS,
        "the sidecar has one listener: write a second route for a second port",
    )?;
    for (i, p) in spec.ports.iter().enumerate() {
        let field = format!("ports[{i}].name");
        max_len(&field, &p.name, MAX_PORT_NAME)?;
        if !is_dns_label(&p.name) {
            return Err(refuse(
                &field,
                format!(
                    "{} is not a port name; use lowercase letters, digits and dashes",
                    shown(&p.name)
                ),
            ));
        }
    }
    check_drain(spec)?;
    if let Some(cb) = &spec.circuit_breaker {
        check_breaker("circuitBreaker", cb)?;
    }
    check_routes(spec)?;
    if let Some(b) = &spec.retry_budget {
        if let Some(r) = b.ratio
            && (r.is_nan() || !(0.0..=1.0).contains(&r))
        {
            return Err(refuse(
                "retryBudget.ratio",
                format!("{r} is out of range; use 0 to 1"),
            ));
        }
        if let Some(n) = b.min_per_second {
            in_range("retryBudget.minPerSecond", n, 0, MAX_RETRY_MIN_PER_SECOND)?;
        }
        if let Some(n) = b.max_body_bytes {
            in_range("retryBudget.maxBodyBytes", n, 0, MAX_RETRY_BODY_BYTES)?;
        }
    }
    check_rollout(spec)
}

fn check_drain(spec: &GraceRouteSpec) -> Result<(), Invalid> {
    let d = &spec.drain;
    for (key, v) in super::sidecar_config::drain(d).timers() {
        duration(&format!("drain.{key}"), v)?;
    }
    for (field, v) in [("drain.minDelay", d.min_delay), ("drain.quiet", d.quiet)] {
        if v > d.max_delay {
            return Err(refuse(
                field,
                format!(
                    "{v} is longer than drain.maxDelay {}; it must be <= maxDelay",
                    d.max_delay
                ),
            ));
        }
    }
    if d.timeout.get().is_zero() {
        return Err(refuse(
            "drain.timeout",
            "must be more than 0s, or every in-flight request is cut at once",
        ));
    }
    // Both are within MAX_DURATION (checked above): the sum cannot overflow.
    if d.max_delay.get().saturating_add(d.timeout.get()) > MAX_DRAIN {
        return Err(refuse(
            "drain.timeout",
            format!(
                "drain.maxDelay {} + drain.timeout {} is over {}: with a 5s margin that sum becomes the pods' terminationGracePeriodSeconds; shorten maxDelay or timeout",
                d.max_delay,
                d.timeout,
                HumanDuration(MAX_DRAIN)
            ),
        ));
    }
    Ok(())
}

fn check_breaker(key: &str, cb: &CircuitBreakerSpec) -> Result<(), Invalid> {
    let f = |name: &str| format!("{key}.{name}");
    in_range(&f("maxConcurrent"), cb.max_concurrent, 1, MAX_CONCURRENT)?;
    in_range(&f("maxQueue"), cb.max_queue, 0, MAX_QUEUE)?;
    in_range(&f("minRequests"), cb.min_requests, 0, MAX_MIN_REQUESTS)?;
    in_range(
        &f("consecutiveFailures"),
        cb.consecutive_failures,
        0,
        MAX_CONSECUTIVE_FAILURES,
    )?;
    in_range(
        &f("halfOpenProbes"),
        cb.half_open_probes,
        1,
        MAX_HALF_OPEN_PROBES,
    )?;
    in_range(&f("minConcurrent"), cb.min_concurrent, 1, MAX_CONCURRENT)?;
    if cb.error_ratio.is_nan() || !(0.0..=1.0).contains(&cb.error_ratio) {
        return Err(refuse(
            &f("errorRatio"),
            format!("{} is out of range; use 0 (off) to 1", cb.error_ratio),
        ));
    }
    for (name, v) in [
        ("queueTimeout", cb.queue_timeout),
        ("window", cb.window),
        ("openFor", cb.open_for),
        ("maxOpenFor", cb.max_open_for),
    ] {
        duration(&f(name), v.0)?;
    }
    if cb.open_for.get().is_zero() {
        return Err(refuse(&f("openFor"), "must be more than 0s"));
    }
    if cb.max_open_for < cb.open_for {
        return Err(refuse(
            &f("maxOpenFor"),
            format!(
                "{} is shorter than openFor {}; raise maxOpenFor to at least openFor",
                cb.max_open_for, cb.open_for
            ),
        ));
    }
    Ok(())
}

fn check_routes(spec: &GraceRouteSpec) -> Result<(), Invalid> {
    max_items(
        "routes",
        spec.routes.len(),
        MAX_ROUTES,
        "merge routes that share a policy",
    )?;
    let mut bodies = 0usize;
    for (i, r) in spec.routes.iter().enumerate() {
        check_route(&format!("routes[{i}]"), r, spec.drain.max_delay.get())?;
        if let Some(fb) = &r.fallback {
            bodies = bodies.saturating_add(chars(&fb.body));
        }
    }
    if bodies > MAX_FALLBACK_BODIES {
        return Err(refuse(
            "routes[].fallback.body",
            format!(
                "the fallback bodies of all routes add up to {bodies} characters, over the {MAX_FALLBACK_BODIES} allowed (they all go into one ConfigMap); shorten them"
            ),
        ));
    }
    Ok(())
}

fn check_route(key: &str, r: &RouteSpec, max_delay: Duration) -> Result<(), Invalid> {
    let f = |name: &str| format!("{key}.{name}");
    max_len(&f("name"), &r.name, MAX_ROUTE_NAME)?;
    if !is_dns_label(&r.name) {
        return Err(refuse(
            &f("name"),
            format!(
                "{} is not a route name; use lowercase letters, digits and dashes",
                shown(&r.name)
            ),
        ));
    }
    if let Some(t) = r.timeout {
        duration(&f("timeout"), t.0)?;
        if t.get().is_zero() {
            return Err(refuse(
                &f("timeout"),
                "must be more than 0s; leave it out for no timeout",
            ));
        }
        // Both within MAX_DURATION: no overflow.
        if max_delay.saturating_add(t.get()) > MAX_DRAIN {
            return Err(refuse(
                &f("timeout"),
                format!(
                    "drain.maxDelay {} + this timeout {t} is over {}: the longest route timeout takes the place of drain.timeout in the time budget; shorten it or drain.maxDelay",
                    HumanDuration(max_delay),
                    HumanDuration(MAX_DRAIN)
                ),
            ));
        }
    }
    if let Some(m) = &r.matcher {
        for (name, v) in [
            ("match.path", &m.path),
            ("match.pathPrefix", &m.path_prefix),
        ] {
            if let Some(p) = v {
                max_len(&f(name), p, MAX_PATH)?;
                if !is_path(p) {
                    return Err(refuse(
                        &f(name),
                        "must start with / and hold printable ASCII without spaces (percent-encode the rest, as requests do)",
                    ));
                }
            }
        }
        max_items(
            &f("match.methods"),
            m.methods.len(),
            MAX_METHODS,
            "list each method once",
        )?;
        for (j, method) in m.methods.iter().enumerate() {
            max_len(&f(&format!("match.methods[{j}]")), &method.0, MAX_METHOD)?;
        }
        if let Some(h) = &m.host {
            max_len(&f("match.host"), h, MAX_HOST)?;
            if !is_host(h) {
                return Err(refuse(
                    &f("match.host"),
                    "must be printable ASCII without spaces (write an IDN as punycode)",
                ));
            }
        }
    }
    if let Some(list) = &r.fail_on {
        max_items(&f("failOn"), list.len(), MAX_FAIL_ON, "list each kind once")?;
    }
    if let Some(cb) = &r.circuit_breaker {
        check_breaker(&f("circuitBreaker"), cb)?;
    }
    if let Some(fb) = &r.fallback {
        in_range(&f("fallback.status"), fb.status, 200, 599)?;
        max_len(
            &f("fallback.contentType"),
            &fb.content_type,
            MAX_CONTENT_TYPE,
        )?;
        if !is_content_type(&fb.content_type) {
            return Err(refuse(
                &f("fallback.contentType"),
                "must be printable ASCII (a header value)",
            ));
        }
        max_len(&f("fallback.body"), &fb.body, MAX_FALLBACK_BODY)?;
    }
    Ok(())
}

fn check_rollout(spec: &GraceRouteSpec) -> Result<(), Invalid> {
    let Some(r) = &spec.rollout else {
        return Ok(());
    };
    for (field, v) in [
        ("rollout.maxSurge", &r.max_surge),
        ("rollout.maxUnavailable", &r.max_unavailable),
    ] {
        match v {
            None => {}
            Some(IntOrString::Int(n)) => in_range(field, *n, 0, MAX_ROLLOUT_PODS)?,
            Some(IntOrString::String(s)) if is_percent(s) => {}
            Some(IntOrString::String(s)) => {
                return Err(refuse(
                    field,
                    format!(
                        "{} is not a percentage from 0% to 100%; write it without leading zeros, like 25%",
                        shown(s)
                    ),
                ));
            }
        }
    }
    if let Some(m) = r.min_ready_seconds {
        in_range("rollout.minReadySeconds", m, 0, MAX_MIN_READY_SECONDS)?;
    }
    match &r.termination_grace_period_seconds {
        IntOrString::Int(n) => in_range(
            "rollout.terminationGracePeriodSeconds",
            *n,
            1,
            MAX_GRACE_SECONDS,
        ),
        IntOrString::String(s) if s == "auto" => Ok(()),
        IntOrString::String(s) => Err(refuse(
            "rollout.terminationGracePeriodSeconds",
            format!("{} is neither auto nor a number of seconds", shown(s)),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{BASE, route};
    use super::*;
    use crate::controller::budget_and_config;
    use crate::rules::{budget, check_rendered_size};

    /// `check_bounds` refuses `yaml` (a route) naming `field`.
    fn refused(yaml: &str, field: &str) -> String {
        let r = route(yaml);
        let err = check_bounds(&r).expect_err(field);
        assert_eq!(err.reason, REASON);
        assert!(err.message.starts_with(field), "{field}: {}", err.message);
        // The whole validate step refuses it the same way, and never panics.
        assert_eq!(budget_and_config(&r, &[]).expect_err(field), err);
        err.message
    }

    #[test]
    fn the_poison_routes_of_issue_34_are_refused_naming_the_field() {
        // Passed the old pattern and length, and panicked the budget's sum.
        let m = refused(
            &format!("{BASE}  routes: [{{name: slow, timeout: 5124095576030431h}}]\n"),
            "routes[0].timeout",
        );
        assert!(m.contains("write at most 1h"), "{m}");
        // Stored (no maximum) and decodable as u32.
        for (spec, field) in [
            (
                "circuitBreaker: {consecutiveFailures: 4294967295}",
                "circuitBreaker.consecutiveFailures",
            ),
            ("drain: {quiet: 99999h}", "drain.quiet"),
            ("drain: {timeout: 99999h}", "drain.timeout"),
            (
                "rollout: {maxUnavailable: \"101%\"}",
                "rollout.maxUnavailable",
            ),
        ] {
            refused(&format!("{BASE}  {spec}\n"), field);
        }
        let m = refused(
            &format!("{BASE}  rollout: {{maxSurge: \"00%\"}}\n"),
            "rollout.maxSurge",
        );
        assert!(m.contains("without leading zeros"), "{m}");
        let long = "a".repeat(MAX_ROUTE_OBJECT_NAME + 1);
        let m = refused(
            &BASE.replace("name: web,", &format!("name: {long},")),
            "metadata.name",
        );
        assert!(m.contains("shorter name"), "{m}");
    }

    #[test]
    fn a_target_group_other_than_the_kinds_is_refused_and_the_kinds_or_none_passes() {
        let m = refused(
            &BASE.replace(
                "targetRef: {kind: Deployment,",
                "targetRef: {group: argoproj.io, kind: Deployment,",
            ),
            "targetRef.group",
        );
        assert!(m.contains("Deployment and StatefulSet"), "{m}");
        check_bounds(&route(&BASE.replace(
            "targetRef: {kind: Deployment,",
            "targetRef: {group: apps, kind: Deployment,",
        )))
        .expect("apps");
        let r = route(BASE);
        assert_eq!(
            r.spec.target_ref.as_ref().map(|t| t.group.as_str()),
            Some("apps")
        );
        check_bounds(&r).expect("no group: apps");
        check_bounds(&route(&BASE.replace(
            "targetRef: {kind: Deployment,",
            "targetRef: {group: argoproj.io, kind: Rollout,",
        )))
        .expect("an Argo Rollout in argoproj.io");
        let m = refused(
            &BASE.replace(
                "targetRef: {kind: Deployment,",
                "targetRef: {kind: Rollout,",
            ),
            "targetRef.group",
        );
        assert!(
            m.contains("argoproj.io for an Argo Rollouts Rollout"),
            "{m}"
        );
    }

    #[test]
    fn values_at_each_bound_pass() {
        let name = "a".repeat(MAX_ROUTE_OBJECT_NAME);
        let r = route(&format!(
            "{}  drain: {{minDelay: 30m, quiet: 30m, maxDelay: 30m, timeout: 30m, websocketCloseWindow: 1h, websocketCloseWait: 1h}}\n  routes: [{{name: slow, timeout: 30m, circuitBreaker: {{consecutiveFailures: {MAX_CONSECUTIVE_FAILURES}, minRequests: {MAX_MIN_REQUESTS}, maxConcurrent: {MAX_CONCURRENT}, minConcurrent: {MAX_CONCURRENT}, maxQueue: {MAX_QUEUE}, halfOpenProbes: {MAX_HALF_OPEN_PROBES}, openFor: 1h, maxOpenFor: 1h, window: 1h, queueTimeout: 1h}}}}]\n  rollout: {{maxSurge: \"100%\", maxUnavailable: {MAX_ROLLOUT_PODS}, minReadySeconds: {MAX_MIN_READY_SECONDS}, terminationGracePeriodSeconds: {MAX_GRACE_SECONDS}}}\n",
            BASE.replace("name: web,", &format!("name: {name},"))
        ));
        check_bounds(&r).expect("every value at its bound");
        let (b, _) = budget_and_config(&r, &[]).expect("valid");
        assert_eq!(b.required_seconds, 3600 + 5);
        assert_eq!(b.seconds, i64::from(MAX_GRACE_SECONDS));
    }

    #[test]
    fn drain_sums_over_the_cap_are_refused_even_with_each_part_within_it() {
        let m = refused(
            &format!("{BASE}  drain: {{maxDelay: 40m, timeout: 30m}}\n"),
            "drain.timeout",
        );
        assert!(
            m.contains("drain.maxDelay 40m + drain.timeout 30m is over 1h"),
            "{m}"
        );
        let m = refused(
            &format!(
                "{BASE}  drain: {{maxDelay: 40m}}\n  routes: [{{name: slow, timeout: 21m}}]\n"
            ),
            "routes[0].timeout",
        );
        assert!(
            m.contains("drain.maxDelay 40m + this timeout 21m is over 1h"),
            "{m}"
        );
        refused(
            &format!("{BASE}  drain: {{quiet: 20s, maxDelay: 10s}}\n"),
            "drain.quiet",
        );
    }

    #[test]
    fn the_budget_refuses_a_huge_drain_instead_of_overflowing() {
        // budget() also runs in the injection webhook, without this step.
        for drain in [
            "{maxDelay: 5124095576030431h}",
            "{timeout: 5124095576030431h}",
            "{maxDelay: 40m, timeout: 30m}",
        ] {
            let r = route(&format!("{BASE}  drain: {drain}\n"));
            let err = budget(&r.spec).expect_err(drain);
            assert!(err.message.contains("is over 1h"), "{}", err.message);
        }
        let r = route(&format!(
            "{BASE}  routes: [{{name: slow, timeout: 5124095576030431h}}]\n"
        ));
        let err = budget(&r.spec).expect_err("route timeout");
        assert!(
            err.message.contains("route \"slow\" timeout"),
            "{}",
            err.message
        );
    }

    #[test]
    fn fallback_bodies_are_bounded_each_and_together() {
        let body = |n: usize| "x".repeat(n);
        let two = |a: usize, b: usize| {
            format!(
                "{BASE}  routes:\n  - {{name: a, fallback: {{body: {}}}}}\n  - {{name: b, fallback: {{body: {}}}}}\n",
                body(a),
                body(b)
            )
        };
        check_bounds(&route(&two(MAX_FALLBACK_BODIES - 1, 1))).expect("at the total");
        let m = refused(&two(MAX_FALLBACK_BODIES, 1), "routes[].fallback.body");
        assert!(m.contains("add up to 32769 characters"), "{m}");
        refused(
            &format!(
                "{BASE}  routes: [{{name: a, fallback: {{body: {}}}}}]\n",
                body(MAX_FALLBACK_BODY + 1)
            ),
            "routes[0].fallback.body",
        );
    }

    #[test]
    fn strings_the_sidecar_could_never_match_or_send_are_refused() {
        refused(
            &format!("{BASE}  routes: [{{name: a, match: {{pathPrefix: /caf\u{e9}}}}}]\n"),
            "routes[0].match.pathPrefix",
        );
        refused(
            &format!("{BASE}  routes: [{{name: a, match: {{host: \"a b\"}}}}]\n"),
            "routes[0].match.host",
        );
        refused(
            &format!(
                "{BASE}  routes: [{{name: a, fallback: {{contentType: \"text/plain\\u0001\"}}}}]\n"
            ),
            "routes[0].fallback.contentType",
        );
        refused(
            &format!(
                "{BASE}  routes: [{{name: a, match: {{path: /{}}}}}]\n",
                "p".repeat(MAX_PATH)
            ),
            "routes[0].match.path",
        );
    }

    #[test]
    fn a_rendered_config_over_the_configmap_limit_is_refused() {
        let at = "x".repeat(crate::crd::bounds::CONFIG_MAP_LIMIT - "config.yaml".len());
        check_rendered_size(&at).expect("at the limit");
        let err = check_rendered_size(&format!("{at}x")).expect_err("past it");
        assert!(err.message.contains("over the 1048576"), "{}", err.message);
    }

    #[test]
    fn the_pattern_helpers_agree_with_their_patterns() {
        for (s, want) in [
            ("0%", true),
            ("5%", true),
            ("100%", true),
            ("00%", false),
            ("05%", false),
            ("101%", false),
            ("%", false),
            ("1000%", false),
            ("5", false),
        ] {
            assert_eq!(is_percent(s), want, "{s}");
        }
        for (s, want) in [
            ("a", true),
            ("a-1", true),
            ("-a", false),
            ("a-", false),
            ("A", false),
            ("", false),
        ] {
            assert_eq!(is_dns_label(s), want, "{s}");
        }
        assert!(is_path("/a/b?c=%20"));
        assert!(!is_path("a"));
        assert!(!is_path("/a b"));
        assert!(is_content_type("text/plain; charset=utf-8\t"));
        assert!(!is_content_type("caf\u{e9}"));
    }
}
