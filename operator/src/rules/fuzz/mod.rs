//! Property tests over the GraceRoute input space (proptest): routes are
//! generated as the JSON a user writes, with values at and inside every
//! bound of [`crate::crd::bounds`]. Inside the bounds, a route goes through
//! validate -> build -> render without a panic, the sidecar's own loader
//! (`kubegrace_sidecar_api::config`: YAML parse + `validate()`) accepts the
//! file, and the file stays under [`WORST_RENDERED_CONFIG`]. The same route
//! with one value pushed past a bound is refused by the validate step with
//! a message that starts with the field's name.
//!
//! `make test-unit` runs 64 cases per property (seconds);
//! `KUBEGRACE_FUZZ_CASES` sets the count, and `make fuzz` runs it long.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PodTemplateSpec;
use kubegrace_sidecar_api::config::Config;
use proptest::prelude::*;
use serde_json::{Value, json};

use super::{Originals, Target, render, target_apply};
use crate::controller::budget_and_config;
use crate::crd::bounds::{
    MAX_CONCURRENT, MAX_CONSECUTIVE_FAILURES, MAX_CONTENT_TYPE, MAX_FAIL_ON, MAX_FALLBACK_BODIES,
    MAX_FALLBACK_BODY, MAX_GRACE_SECONDS, MAX_HALF_OPEN_PROBES, MAX_HOST, MAX_METHOD, MAX_METHODS,
    MAX_MIN_READY_SECONDS, MAX_MIN_REQUESTS, MAX_PATH, MAX_PORT_NAME, MAX_QUEUE,
    MAX_RETRY_BODY_BYTES, MAX_RETRY_MIN_PER_SECOND, MAX_ROLLOUT_PODS, MAX_ROUTE_NAME,
    MAX_ROUTE_OBJECT_NAME, MAX_ROUTES, MAX_TARGET_NAME, WORST_RENDERED_CONFIG,
};
use crate::crd::{GraceRoute, TargetKind};

mod poisons;

fn config() -> ProptestConfig {
    let cases = std::env::var("KUBEGRACE_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64);
    ProptestConfig {
        cases,
        // A failure prints its minimal input; no regression files in the tree.
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

const HOUR_MS: u64 = 3_600_000;

/// `lo..=hi` with both ends (where bugs live) far more likely than uniform.
fn edgy(lo: u64, hi: u64) -> BoxedStrategy<u64> {
    prop_oneof![1 => Just(lo), 1 => Just(hi), 3 => lo..=hi].boxed()
}

/// A duration of `ms` milliseconds as people write it, in one of the
/// spellings the CRD's pattern accepts (`90s`, `1m30s`, `90000ms`, ...).
fn text(ms: u64, style: u8) -> String {
    if style % 3 == 1 && ms <= 99_999 {
        return format!("{ms}ms");
    }
    if style % 3 == 2 && ms.is_multiple_of(1000) && ms / 1000 <= 99_999 {
        return format!("{}s", ms / 1000);
    }
    let (h, m, s, rest) = (ms / HOUR_MS, ms / 60_000 % 60, ms / 1000 % 60, ms % 1000);
    let mut out = String::new();
    for (v, unit) in [(h, "h"), (m, "m"), (s, "s"), (rest, "ms")] {
        if v > 0 {
            out.push_str(&format!("{v}{unit}"));
        }
    }
    if out.is_empty() {
        out.push_str("0s");
    }
    out
}

/// Strings matching `pattern`.
fn re(pattern: &str) -> BoxedStrategy<String> {
    proptest::string::string_regex(pattern)
        .unwrap_or_else(|e| panic!("{pattern}: {e}"))
        .boxed()
}

fn duration(lo: u64, hi: u64) -> BoxedStrategy<String> {
    (edgy(lo, hi), any::<u8>())
        .prop_map(|(ms, style)| text(ms, style))
        .boxed()
}

fn breaker() -> impl Strategy<Value = Value> {
    let counts = (
        edgy(1, MAX_CONCURRENT.into()),
        any::<bool>(),
        edgy(0, MAX_QUEUE.into()),
        edgy(0, MAX_MIN_REQUESTS.into()),
        edgy(0, MAX_CONSECUTIVE_FAILURES.into()),
        edgy(1, MAX_HALF_OPEN_PROBES.into()),
        prop_oneof![Just(0.0), Just(1.0), 0.0..=1.0f64],
    );
    let times = (edgy(1, HOUR_MS), edgy(0, HOUR_MS), any::<[u8; 4]>());
    (
        counts,
        times,
        edgy(1, MAX_CONCURRENT.into()),
        edgy(1, HOUR_MS),
    )
        .prop_map(
            |(
                (max_c, adaptive, queue, min_req, consec, probes, ratio),
                (open, extra, st),
                min_c,
                q,
            )| {
                let max_open = open + extra.min(HOUR_MS - open);
                json!({
                    "maxConcurrent": max_c,
                    "adaptive": adaptive,
                    "minConcurrent": if adaptive { min_c.min(max_c) } else { min_c },
                    "maxQueue": queue,
                    // Above 0 when there is a queue, as the schema asks.
                    "queueTimeout": text(if queue > 0 { q } else { q - 1 }, st[0]),
                    "errorRatio": ratio,
                    "window": text(if ratio > 0.0 { q } else { q - 1 }, st[1]),
                    "minRequests": min_req,
                    "consecutiveFailures": consec,
                    "openFor": text(open, st[2]),
                    "maxOpenFor": text(max_open, st[3]),
                    "halfOpenProbes": probes,
                })
            },
        )
}

/// The JSON of one route, named `name`; its timeout within `max_timeout`.
fn one_route(max_timeout: u64) -> impl Strategy<Value = Value> {
    let matcher = (
        any::<bool>(),
        proptest::option::of(re(&format!("/[!-~]{{0,{}}}", MAX_PATH - 1))),
        proptest::collection::vec(re(&format!("[A-Z]{{1,{MAX_METHOD}}}")), 0..=MAX_METHODS),
        proptest::option::of(re(&format!("[!-~]{{0,{MAX_HOST}}}"))),
    );
    let policy = (
        proptest::option::of(duration(1, max_timeout.max(1))),
        proptest::option::of(breaker()),
        proptest::option::of((
            200u16..=599,
            re(&format!("[\t -~]{{0,{MAX_CONTENT_TYPE}}}")),
            // Any characters, YAML's most expensive ones included; the
            // total is cut to the shared maximum when the route is built.
            prop_oneof![
                3 => proptest::collection::vec(any::<char>(), 0..64),
                1 => proptest::collection::vec(any::<char>(), MAX_FALLBACK_BODY..=MAX_FALLBACK_BODY),
            ],
        )),
        proptest::option::of(proptest::collection::vec(
            "(5xx|connect-error|timeout|5[0-9][0-9])",
            0..=MAX_FAIL_ON,
        )),
        proptest::option::of(any::<bool>()),
    );
    (matcher, policy).prop_map(
        move |((exact, path, mut methods, host), (timeout, cb, fallback, fail_on, retry))| {
            let mut r = serde_json::Map::new();
            let mut m = serde_json::Map::new();
            if let Some(p) = path {
                m.insert(if exact { "path" } else { "pathPrefix" }.into(), json!(p));
            }
            if let Some(idempotent) = retry {
                // The schema refuses idempotent retries on a route that
                // matches no idempotent method.
                if idempotent && !methods.is_empty() && !methods.iter().any(|x| x == "GET") {
                    methods[0] = "GET".into();
                }
                r.insert("retry".into(), json!({"idempotent": idempotent}));
            }
            if !methods.is_empty() {
                m.insert("methods".into(), json!(methods));
            }
            if let Some(h) = host {
                m.insert("host".into(), json!(h));
            }
            r.insert("match".into(), Value::Object(m));
            if let Some(t) = timeout {
                r.insert("timeout".into(), json!(t));
            }
            if let Some(cb) = cb {
                r.insert("circuitBreaker".into(), cb);
            }
            if let Some((status, content_type, body)) = fallback {
                let body: String = body.into_iter().collect();
                r.insert(
                    "fallback".into(),
                    json!({"status": status, "contentType": content_type, "body": body}),
                );
            }
            if let Some(f) = fail_on {
                r.insert("failOn".into(), json!(f));
            }
            Value::Object(r)
        },
    )
}

/// A whole GraceRoute (JSON) inside every bound, and the seconds its
/// budget needs.
fn route() -> impl Strategy<Value = Value> {
    // drain.timeout is above 0, so maxDelay stays under the cap of the sum.
    let drain = (
        edgy(0, HOUR_MS - 1),
        any::<u8>(),
        duration(0, HOUR_MS),
        duration(0, HOUR_MS),
    );
    drain.prop_flat_map(|(max_delay, style, ws_window, ws_wait)| {
        let rest = HOUR_MS - max_delay;
        let drain = (
            duration(0, max_delay),
            duration(0, max_delay),
            duration(1, rest),
        )
            .prop_map(move |(min_delay, quiet, timeout)| {
                json!({
                    "minDelay": min_delay,
                    "quiet": quiet,
                    "maxDelay": text(max_delay, style),
                    "timeout": timeout,
                    "websocketCloseWindow": ws_window,
                    "websocketCloseWait": ws_wait,
                })
            });
        let names = (
            re(&format!(
                "[a-z0-9]([-a-z0-9]{{0,{}}}[a-z0-9])?",
                MAX_ROUTE_OBJECT_NAME - 2
            )),
            re(&format!("[a-z0-9]{{1,{MAX_TARGET_NAME}}}")),
            re(&format!(
                "[a-z0-9]([-a-z0-9]{{0,{}}}[a-z0-9])?",
                MAX_PORT_NAME - 2
            )),
            prop_oneof![Just("http"), Just("http2"), Just("grpc"), Just("tcp")],
            re(&format!("[a-z0-9]{{0,{}}}", MAX_ROUTE_NAME - 4)),
        );
        let routes = prop_oneof![
            3 => proptest::collection::vec(one_route(rest), 0..8),
            1 => proptest::collection::vec(one_route(rest), MAX_ROUTES..=MAX_ROUTES),
        ];
        let rollout = proptest::option::of((
            proptest::option::of(int_or_percent()),
            proptest::option::of(int_or_percent()),
            proptest::option::of(0..=MAX_MIN_READY_SECONDS),
            proptest::option::of(0..=MAX_GRACE_SECONDS),
        ));
        let retry = proptest::option::of((
            proptest::option::of(0.0..=1.0f64),
            proptest::option::of(edgy(0, MAX_RETRY_MIN_PER_SECOND.into())),
            proptest::option::of(edgy(0, MAX_RETRY_BODY_BYTES)),
        ));
        (
            drain,
            names,
            routes,
            proptest::option::of(breaker()),
            rollout,
            retry,
        )
            .prop_map(|(drain, names, routes, cb, rollout, retry)| {
                assemble(drain, names, routes, cb, rollout, retry)
            })
    })
}

fn int_or_percent() -> impl Strategy<Value = Value> {
    prop_oneof![
        edgy(0, MAX_ROLLOUT_PODS as u64).prop_map(|n| json!(n)),
        edgy(0, 100).prop_map(|n| json!(format!("{n}%"))),
    ]
}

type Names = (String, String, String, &'static str, String);
type Rollout = Option<(Option<Value>, Option<Value>, Option<i32>, Option<i32>)>;
type Retry = Option<(Option<f64>, Option<u64>, Option<u64>)>;

fn assemble(
    drain: Value,
    (name, target, port, protocol, route_prefix): Names,
    mut routes: Vec<Value>,
    cb: Option<Value>,
    rollout: Rollout,
    retry: Retry,
) -> Value {
    // Unique names, the fallback bodies within their shared maximum.
    let mut left = MAX_FALLBACK_BODIES;
    for (i, r) in routes.iter_mut().enumerate() {
        let mut n = format!("r{i}{route_prefix}");
        n.truncate(MAX_ROUTE_NAME);
        r["name"] = json!(n);
        if let Some(body) = r.pointer_mut("/fallback/body") {
            let text: String = body
                .as_str()
                .unwrap_or_default()
                .chars()
                .take(left)
                .collect();
            left -= text.chars().count();
            *body = json!(text);
        }
    }
    let mut spec = json!({
        "targetRef": {"kind": "Deployment", "name": target},
        "ports": [{"name": port, "protocol": protocol}],
        "drain": drain,
        "routes": routes,
    });
    if let Some(cb) = cb {
        spec["circuitBreaker"] = cb;
    }
    if let Some((ratio, per_second, body)) = retry {
        spec["retryBudget"] = json!({});
        for (k, v) in [
            ("ratio", ratio.map(|r| json!(r))),
            ("minPerSecond", per_second.map(|n| json!(n))),
            ("maxBodyBytes", body.map(|n| json!(n))),
        ] {
            if let Some(v) = v {
                spec["retryBudget"][k] = v;
            }
        }
    }
    if let Some((surge, unavailable, min_ready, grace)) = rollout {
        let zero = |v: &Option<Value>| matches!(v, Some(v) if *v == json!(0) || *v == json!("0%"));
        let mut r = json!({});
        if let Some(s) = &surge {
            r["maxSurge"] = s.clone();
        }
        // Both 0 is refused by the schema: the rollout could not progress.
        if let Some(u) = &unavailable
            && !(zero(&surge) && zero(&unavailable))
        {
            r["maxUnavailable"] = u.clone();
        }
        if let Some(m) = min_ready {
            r["minReadySeconds"] = json!(m);
        }
        // A pinned grace period at least the budget (the rest is refused
        // with BudgetDoesNotFit, a different property): raised below.
        if let Some(g) = grace {
            r["terminationGracePeriodSeconds"] = json!(g);
        }
        spec["rollout"] = r;
    }
    json!({
        "apiVersion": "kubegrace.io/v1alpha1",
        "kind": "GraceRoute",
        "metadata": {"name": name, "namespace": "shop", "uid": "u1"},
        "spec": spec,
    })
}

/// The route as the operator decodes it.
fn decode(v: &Value) -> GraceRoute {
    serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("decodes: {e}\n{v}"))
}

/// A target whose pod template declares the route's port.
fn target(v: &Value) -> (Target, Option<String>) {
    let port = v["spec"]["ports"][0]["name"].clone();
    let template: PodTemplateSpec = serde_json::from_value(json!({
        "spec": {"containers": [{"name": "app", "ports": [{"name": port, "containerPort": 8080}]}]}
    }))
    .expect("template");
    let t = Target {
        kind: TargetKind::Deployment,
        name: "web".into(),
        template,
        strategy_type: Some("RollingUpdate".into()),
        current: Originals::default(),
        recorded: None,
        annotations: BTreeMap::new(),
    };
    (t, None)
}

/// Raises a pinned grace period to the budget the route needs.
fn fit_grace(v: &mut Value) {
    let spec = crate::crd::GraceRouteSpec {
        rollout: None,
        ..decode(v).spec
    };
    if let (Ok(b), Some(g)) = (
        super::budget(&spec),
        v.pointer_mut("/spec/rollout/terminationGracePeriodSeconds"),
    ) && g.as_i64().is_some_and(|n| n < b.required_seconds)
    {
        *g = json!(b.required_seconds);
    }
}

/// Everything a route inside the bounds must get through.
fn accepted(v: &Value) -> Result<(), TestCaseError> {
    let r = decode(v);
    let t = target(v);
    let (budget, config) = budget_and_config(&r, &[&t])
        .map_err(|e| TestCaseError::fail(format!("refused: {}: {}", e.reason, e.message)))?;
    prop_assert!(budget.required_seconds <= 3600 + 5, "{budget:?}");
    prop_assert!(budget.seconds <= i64::from(MAX_GRACE_SECONDS));
    let (yaml, _) = render(&config).map_err(|e| TestCaseError::fail(e.message))?;
    prop_assert!(
        yaml.len() <= WORST_RENDERED_CONFIG,
        "{} bytes rendered",
        yaml.len()
    );
    // The sidecar's loader: its YAML, then its own checks.
    let back: Config = serde_norway::from_str(&yaml)
        .map_err(|e| TestCaseError::fail(format!("the sidecar cannot parse it: {e}")))?;
    back.validate()
        .map_err(|e| TestCaseError::fail(format!("the sidecar refuses it: {e}")))?;
    prop_assert_eq!(&back, &config);
    let _ = target_apply(r.spec.rollout.as_ref(), &t.0);
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn routes_inside_the_bounds_render_a_config_the_sidecar_accepts(mut v in route()) {
        fit_grace(&mut v);
        accepted(&v)?;
    }
}

/// Of `chars`, the one YAML takes the most bytes to write.
fn costliest(chars: impl IntoIterator<Item = char>) -> char {
    chars
        .into_iter()
        .max_by_key(|c| {
            serde_norway::to_string(&json!({"k": c.to_string().repeat(100)})).map_or(0, |y| y.len())
        })
        .unwrap_or('x')
}

#[test]
fn the_worst_case_route_renders_well_under_1_mib() {
    let graphic = (0x21u8..=0x7e).map(char::from);
    let path_char = costliest(graphic.clone());
    let type_char = costliest(graphic.clone().chain(['\t', ' ']));
    // Free text: every ASCII character and the classes YAML escapes
    // (C0/C1 controls, BOM, noncharacters, line separators, astral).
    let body_char = costliest((0u8..=0x7f).map(char::from).chain([
        '\u{85}',
        '\u{9f}',
        '\u{a0}',
        '\u{2028}',
        '\u{feff}',
        '\u{fffe}',
        '\u{ffff}',
        '\u{1f600}',
        '\u{10ffff}',
    ]));
    let long = "59m59s999ms";
    let cb = json!({
        "maxConcurrent": MAX_CONCURRENT, "minConcurrent": MAX_CONCURRENT, "adaptive": true,
        "maxQueue": MAX_QUEUE, "queueTimeout": long, "errorRatio": 0.123_456_789_012_345_67,
        "window": long, "minRequests": MAX_MIN_REQUESTS, "consecutiveFailures": MAX_CONSECUTIVE_FAILURES,
        "openFor": long, "maxOpenFor": long, "halfOpenProbes": MAX_HALF_OPEN_PROBES,
    });
    let routes: Vec<Value> = (0..MAX_ROUTES)
        .map(|i| {
            json!({
                "name": format!("r{i:02}{}", "x".repeat(MAX_ROUTE_NAME - 3)),
                "match": {
                    "pathPrefix": format!("/{}", path_char.to_string().repeat(MAX_PATH - 1)),
                    "methods": vec!["M".repeat(MAX_METHOD); MAX_METHODS],
                    "host": path_char.to_string().repeat(MAX_HOST),
                },
                "timeout": long,
                "circuitBreaker": cb,
                "fallback": {
                    "status": 599,
                    "contentType": type_char.to_string().repeat(MAX_CONTENT_TYPE),
                    "body": if i == 0 { body_char.to_string().repeat(MAX_FALLBACK_BODIES) } else { String::new() },
                },
                "failOn": vec!["connect-error"; MAX_FAIL_ON],
                "retry": {"idempotent": false},
            })
        })
        .collect();
    let v = json!({
        "apiVersion": "kubegrace.io/v1alpha1",
        "kind": "GraceRoute",
        "metadata": {"name": "n".repeat(MAX_ROUTE_OBJECT_NAME), "namespace": "shop", "uid": "u1"},
        "spec": {
            "targetRef": {"kind": "Deployment", "name": "web"},
            "ports": [{"name": "http"}],
            "drain": {"minDelay": "0s", "quiet": "0s", "maxDelay": "0s", "timeout": long,
                      "websocketCloseWindow": long, "websocketCloseWait": long},
            "circuitBreaker": cb,
            "routes": routes,
            "retryBudget": {"ratio": 0.123_456_789_012_345_67, "minPerSecond": MAX_RETRY_MIN_PER_SECOND, "maxBodyBytes": MAX_RETRY_BODY_BYTES - 1},
        },
    });
    let r = decode(&v);
    let (_, config) =
        budget_and_config(&r, &[&target(&v)]).expect("the worst case is inside the bounds");
    let (yaml, _) = render(&config).expect("render");
    println!(
        "worst case: {} bytes rendered (path/host {path_char:?}, content type {type_char:?}, body {body_char:?})",
        yaml.len()
    );
    assert!(yaml.len() <= WORST_RENDERED_CONFIG, "{}", yaml.len());
    const { assert!(WORST_RENDERED_CONFIG <= crate::crd::bounds::CONFIG_MAP_LIMIT / 2) };
    accepted(&v).expect("the sidecar reads it");
}
