//! The config as a whole, read from YAML the way the sidecar and the
//! operator's tests read it.

use super::*;

/// What the sidecar does with its file: parse, then validate.
fn from_yaml(text: &str) -> Result<Config, ConfigError> {
    let config: Config =
        serde_norway::from_str(text).map_err(|e| ConfigError::new("yaml", e.to_string()))?;
    config.validate()?;
    Ok(config)
}

/// `config` comes back the same after a render and a re-parse.
fn assert_round_trips(config: &Config) {
    let again = from_yaml(&serde_norway::to_string(config).expect("render")).expect("re-parse");
    assert_eq!(*config, again);
}

/// `yaml` sets a key to a value it does not take; the error names each of
/// the values it does.
fn assert_refused_naming(yaml: &str, values: &[&str]) {
    let err = from_yaml(yaml).expect_err("unknown value");
    assert!(
        values.iter().all(|value| err.message.contains(value)),
        "{yaml}: {err}"
    );
}

#[test]
fn endpoints_accept_ports_addresses_and_unix_paths() {
    assert_eq!(
        ":8080".parse::<Endpoint>().expect("valid"),
        Endpoint::Tcp("0.0.0.0:8080".parse().expect("addr"))
    );
    assert_eq!(
        "unix:/run/app.sock".parse::<Endpoint>().expect("valid"),
        Endpoint::Unix("/run/app.sock".into())
    );
    assert!("localhost".parse::<Endpoint>().is_err());
}

#[test]
fn a_full_file_round_trips() {
    let yaml = r#"
listen: 0.0.0.0:8080
upstream: 127.0.0.1:8081
drain: {minDelay: 500ms, quiet: 300ms, maxDelay: 5s, timeout: 10s}
routes:
  - name: api
    match: {pathPrefix: /api, methods: [GET, POST]}
    timeout: 5s
    circuitBreaker: {maxConcurrent: 64, maxQueue: 128, queueTimeout: 500ms, errorRatio: 0.5}
    fallback: {status: 503, contentType: application/json, body: '{"error":"busy"}'}
    failOn: [5xx, 504, connect-error]
"#;
    let config = from_yaml(yaml).expect("valid config");
    assert_eq!(config.routes[0].fail_on[1], FailureKind::Status(504));
    assert_round_trips(&config);
}

#[test]
fn errors_name_the_key_to_fix() {
    let err = from_yaml("drain: {minDelay: 20s, maxDelay: 5s}").expect_err("invalid");
    assert_eq!(err.key, "drain.minDelay");
    let err =
        from_yaml("routes: [{name: a, circuitBreaker: {errorRatio: 1.5}}]").expect_err("invalid");
    assert_eq!(err.key, "routes[0].circuitBreaker.errorRatio");
    let err = from_yaml("routes: [{name: a, failOn: [404]}]").expect_err("invalid");
    assert!(err.message.contains("4xx"), "{err}");
}

#[test]
fn unknown_keys_are_ignored_by_the_types_and_known_keys_keep_their_checks() {
    // A newer operator may write a key this release does not know; the
    // sidecar's loader names such keys (a warning and a metric), the types
    // let them pass so the rest of the file still applies.
    let config = from_yaml(
        "drain: {maxDelay: 5s, newerKey: 1}
routes: [{name: a, match: {pathPrefix: /a, headers: [x]}, newer: {a: 1}}]
newerSection: {x: y}
",
    )
    .expect("unknown keys ignored");
    assert_eq!(config.drain.max_delay, HumanDuration::from_secs(5));
    assert_eq!(config.routes[0].matcher.path_prefix.as_deref(), Some("/a"));
    // A known key keeps its type and bound next to an unknown one.
    let err = from_yaml("drain: {minDelay: 20s, maxDelay: 5s, newerKey: 1}").expect_err("bound");
    assert_eq!(err.key, "drain.minDelay");
    let err = from_yaml("drain: {maxDelay: soon, newerKey: 1}").expect_err("type");
    assert!(err.message.contains("soon"), "{err}");
    let err = from_yaml("routes: [{name: a, circuitBreaker: {errorRatio: 1.5, newer: 1}}]")
        .expect_err("bound");
    assert_eq!(err.key, "routes[0].circuitBreaker.errorRatio");
}

#[test]
fn http2_stream_cap_defaults_to_200_and_refuses_zero() {
    assert_eq!(Config::default().limits.max_concurrent_streams, 200);
    let config = from_yaml("limits: {maxConcurrentStreams: 50}").expect("valid");
    assert_eq!(config.limits.max_concurrent_streams, 50);
    let err = from_yaml("limits: {maxConcurrentStreams: 0}").expect_err("invalid");
    assert_eq!(err.key, "limits.maxConcurrentStreams");
}

/// A drain key that takes one of a few words: unset it is the first of
/// `values`, each word sets its value and round-trips, and `unknown` is
/// refused naming every word.
fn assert_drain_choice<T: PartialEq + std::fmt::Debug>(
    key: &str,
    get: fn(&DrainConfig) -> T,
    values: &[(&str, T)],
    unknown: &str,
) {
    assert_eq!(get(&Config::default().drain), values[0].1, "{key} unset");
    for (word, value) in values {
        let config = from_yaml(&format!("drain: {{{key}: {word}}}")).expect(word);
        assert_eq!(get(&config.drain), *value, "{key}: {word}");
        assert_round_trips(&config);
    }
    let words: Vec<&str> = values.iter().map(|(word, _)| *word).collect();
    assert_refused_naming(&format!("drain: {{{key}: {unknown}}}"), &words);
}

#[test]
fn drain_readiness_defaults_to_fail_fast_and_takes_only_its_two_values() {
    let words = [
        ("failFast", DrainReadiness::FailFast),
        ("stayServing", DrainReadiness::StayServing),
    ];
    assert_drain_choice("readiness", |d| d.readiness, &words, "stay");
}

#[test]
fn grpc_health_defaults_to_not_serving_and_takes_only_its_two_values() {
    let words = [
        ("notServing", DrainGrpcHealth::NotServing),
        ("app", DrainGrpcHealth::App),
    ];
    assert_drain_choice("grpcHealth", |d| d.grpc_health, &words, "off");
}

#[test]
fn http2_go_away_defaults_to_auto_and_takes_only_its_three_values() {
    let words = [
        ("auto", Http2GoAway::Auto),
        ("twoPhase", Http2GoAway::TwoPhase),
        ("finalOnly", Http2GoAway::FinalOnly),
    ];
    assert_drain_choice("http2GoAway", |d| d.http2_go_away, &words, "once");
}

#[test]
fn websocket_close_defaults_to_going_away_and_a_short_timeout_stays_valid() {
    let drain = Config::default().drain;
    assert_eq!(drain.websocket_close, WebSocketClose::GoingAway);
    let config = from_yaml(
        "drain: {websocketClose: cut, websocketCloseWindow: 2s, websocketCloseWait: 500ms}",
    )
    .expect("valid");
    assert_eq!(config.drain.websocket_close, WebSocketClose::Cut);
    assert_eq!(
        config.drain.websocket_close_window,
        HumanDuration::from_secs(2)
    );
    assert_round_trips(&config);
    // A timeout below the default wait (1s) must not turn a file that was
    // valid before these keys existed into an invalid one: the sidecar
    // caps the wait and the window at the timeout instead.
    from_yaml("drain: {timeout: 500ms}").expect("valid");
    from_yaml("drain: {timeout: 1s, websocketCloseWait: 2s}").expect("valid");
}

#[test]
fn keys_newer_than_running_sidecars_stay_out_of_a_file_at_their_defaults() {
    // An operator upgrade renders files that sidecars of the previous
    // release still read until their pods roll: a key they do not know
    // would fail their reload where they refuse unknown keys (sidecars
    // built before they were tolerated; docs/skew.md).
    let yaml = serde_norway::to_string(&Config::default()).expect("render");
    for key in ["websocketClose", "retryBudget"] {
        assert!(!yaml.contains(key), "{key} in a default file:\n{yaml}");
    }
    let mut config = Config::default();
    config.retry_budget.ratio = 0.5;
    let yaml = serde_norway::to_string(&config).expect("render");
    let again = from_yaml(&yaml).expect("re-parse");
    assert_eq!(again.retry_budget.ratio, 0.5, "{yaml}");
}

#[test]
fn retry_budget_ranges_name_the_key() {
    let err = from_yaml("retryBudget: {ratio: 1.5}").expect_err("above 1");
    assert_eq!(err.key, "retryBudget.ratio", "{err}");
    let err = from_yaml("retryBudget: {maxBodyBytes: 99999999999}").expect_err("too large");
    assert_eq!(err.key, "retryBudget.maxBodyBytes", "{err}");
    let config = from_yaml("routes: [{name: reads, retry: {idempotent: true}}]").expect("valid");
    assert!(config.routes[0].retry.is_some_and(|r| r.idempotent));
}

/// Each bounded key: a file at its bound loads, one step past it is
/// refused naming the key and the allowed range.
#[test]
fn every_bound_holds_at_the_bound_and_refuses_past_it() {
    let r = "routes: [{name: r, ";
    let cases: &[(&str, &str, &str)] = &[
        (
            "drain: {minDelay: 1h, maxDelay: 1h}",
            "drain: {minDelay: 1h1ns, maxDelay: 1h1ns}",
            "drain.minDelay",
        ),
        ("drain: {quiet: 1h}", "drain: {quiet: 3601s}", "drain.quiet"),
        (
            "drain: {maxDelay: 1h}",
            "drain: {maxDelay: 1h1ms}",
            "drain.maxDelay",
        ),
        (
            "drain: {timeout: 1h}",
            "drain: {timeout: 1h1ns}",
            "drain.timeout",
        ),
        (
            "drain: {websocketCloseWindow: 1h}",
            "drain: {websocketCloseWindow: 2h}",
            "drain.websocketCloseWindow",
        ),
        (
            "drain: {websocketCloseWait: 1h}",
            "drain: {websocketCloseWait: 2h}",
            "drain.websocketCloseWait",
        ),
        (
            "limits: {maxHeaderBytes: 1048576}",
            "limits: {maxHeaderBytes: 1048577}",
            "limits.maxHeaderBytes",
        ),
        (
            "limits: {maxHeaders: 1000}",
            "limits: {maxHeaders: 1001}",
            "limits.maxHeaders",
        ),
        (
            "limits: {headerReadTimeout: 24h}",
            "limits: {headerReadTimeout: 24h1ns}",
            "limits.headerReadTimeout",
        ),
        (
            "limits: {maxRequestBodyBytes: 1099511627776}",
            "limits: {maxRequestBodyBytes: 1099511627777}",
            "limits.maxRequestBodyBytes",
        ),
        (
            "limits: {downstreamIdleTimeout: 1d}",
            "limits: {downstreamIdleTimeout: 2d}",
            "limits.downstreamIdleTimeout",
        ),
        (
            "limits: {maxConcurrentStreams: 65536}",
            "limits: {maxConcurrentStreams: 65537}",
            "limits.maxConcurrentStreams",
        ),
        (
            "limits: {bodyReadTimeout: 24h}",
            "limits: {bodyReadTimeout: 25h}",
            "limits.bodyReadTimeout",
        ),
        (
            "limits: {bodyMinRate: 1073741824}",
            "limits: {bodyMinRate: 1073741825}",
            "limits.bodyMinRate",
        ),
        (
            "limits: {writeTimeout: 24h}",
            "limits: {writeTimeout: 5124095576030431h}",
            "limits.writeTimeout",
        ),
        (
            "limits: {tunnelIdleTimeout: 24h}",
            "limits: {tunnelIdleTimeout: 1y}",
            "limits.tunnelIdleTimeout",
        ),
        (
            "limits: {maxConnections: 1000000}",
            "limits: {maxConnections: 1000001}",
            "limits.maxConnections",
        ),
        (
            "limits: {adminMaxConnections: 1024}",
            "limits: {adminMaxConnections: 1025}",
            "limits.adminMaxConnections",
        ),
        (
            "upstreamPool: {idleTimeout: 24h}",
            "upstreamPool: {idleTimeout: 24h1s}",
            "upstreamPool.idleTimeout",
        ),
        (
            "upstreamPool: {maxIdle: 65536}",
            "upstreamPool: {maxIdle: 65537}",
            "upstreamPool.maxIdle",
        ),
        (
            "upstreamPool: {connectTimeout: 1h}",
            "upstreamPool: {connectTimeout: 61m}",
            "upstreamPool.connectTimeout",
        ),
        (
            "upstreamPool: {holdTimeout: 1h}",
            "upstreamPool: {holdTimeout: 61m}",
            "upstreamPool.holdTimeout",
        ),
        (
            "retryBudget: {minPerSecond: 10000}",
            "retryBudget: {minPerSecond: 10001}",
            "retryBudget.minPerSecond",
        ),
        (
            "retryBudget: {maxBodyBytes: 16777216}",
            "retryBudget: {maxBodyBytes: 16777217}",
            "retryBudget.maxBodyBytes",
        ),
        (
            "forwarded: {trustedHops: 64}",
            "forwarded: {trustedHops: 65}",
            "forwarded.trustedHops",
        ),
        ("workers: 64", "workers: 65", "workers"),
        (
            "appReadiness: {port: 1, periodSeconds: 86400}",
            "appReadiness: {port: 1, periodSeconds: 86401}",
            "appReadiness.periodSeconds",
        ),
        (
            "appReadiness: {port: 1, timeoutSeconds: 86400}",
            "appReadiness: {port: 1, timeoutSeconds: 86401}",
            "appReadiness.timeoutSeconds",
        ),
        (
            "appReadiness: {port: 1, initialDelaySeconds: 86400}",
            "appReadiness: {port: 1, initialDelaySeconds: 4294967295}",
            "appReadiness.initialDelaySeconds",
        ),
        (
            "appReadiness: {port: 1, successThreshold: 10000}",
            "appReadiness: {port: 1, successThreshold: 10001}",
            "appReadiness.successThreshold",
        ),
        (
            "appReadiness: {port: 1, failureThreshold: 10000}",
            "appReadiness: {port: 1, failureThreshold: 10001}",
            "appReadiness.failureThreshold",
        ),
    ];
    for (at, past, key) in cases {
        from_yaml(at).unwrap_or_else(|e| panic!("{at}: {e}"));
        let err = from_yaml(past).expect_err(past);
        assert_eq!(&err.key, key, "{past}: {err}");
        assert!(
            err.message.contains(" to "),
            "{past}: the range is named: {err}"
        );
    }
    let breaker = [
        (
            "maxConcurrent: 1000000",
            "maxConcurrent: 1000001",
            "maxConcurrent",
        ),
        ("maxQueue: 1000000", "maxQueue: 1000001", "maxQueue"),
        (
            "minRequests: 1000000",
            "minRequests: 1000001",
            "minRequests",
        ),
        (
            "consecutiveFailures: 1000000",
            "consecutiveFailures: 4294967295",
            "consecutiveFailures",
        ),
        (
            "halfOpenProbes: 1000",
            "halfOpenProbes: 1001",
            "halfOpenProbes",
        ),
        ("queueTimeout: 24h", "queueTimeout: 25h", "queueTimeout"),
        ("window: 24h", "window: 25h", "window"),
        (
            "openFor: 24h, maxOpenFor: 24h",
            "openFor: 24h1s, maxOpenFor: 24h1s",
            "openFor",
        ),
        ("maxOpenFor: 24h", "maxOpenFor: 25h", "maxOpenFor"),
    ];
    for (at, past, field) in breaker {
        let at = format!("{r}circuitBreaker: {{{at}}}}}]");
        let past = format!("{r}circuitBreaker: {{{past}}}}}]");
        from_yaml(&at).unwrap_or_else(|e| panic!("{at}: {e}"));
        let err = from_yaml(&past).expect_err(&past);
        assert_eq!(
            err.key,
            format!("routes[0].circuitBreaker.{field}"),
            "{err}"
        );
    }
    from_yaml(&format!("{r}timeout: 24h}}]")).expect("route timeout at the bound");
    let err = from_yaml(&format!("{r}timeout: 5124095576030431h}}]")).expect_err("too long");
    assert_eq!(err.key, "routes[0].timeout", "{err}");
    let body = "x".repeat(bounds::MAX_FALLBACK_BODY_BYTES);
    from_yaml(&format!("{r}fallback: {{body: {body}}}}}]")).expect("body at the bound");
    let err = from_yaml(&format!("{r}fallback: {{body: {body}x}}}}]")).expect_err("body");
    assert_eq!(err.key, "routes[0].fallback.body", "{err}");
}

#[test]
fn list_sizes_are_bounded() {
    let protocols = |n: usize| format!("upgradeProtocols: [{}]", vec!["ws"; n].join(", "));
    from_yaml(&protocols(bounds::MAX_UPGRADE_PROTOCOLS)).expect("at the bound");
    assert_eq!(
        from_yaml(&protocols(bounds::MAX_UPGRADE_PROTOCOLS + 1))
            .expect_err("past")
            .key,
        "upgradeProtocols"
    );
    let routes = |n: usize| {
        let list: Vec<String> = (0..n).map(|i| format!("{{name: r{i}}}")).collect();
        format!("routes: [{}]", list.join(", "))
    };
    from_yaml(&routes(bounds::MAX_ROUTES)).expect("at the bound");
    let named = |n: usize| format!("routes: [{{name: {}}}]", "r".repeat(n));
    from_yaml(&named(bounds::MAX_ROUTE_NAME_BYTES)).expect("a name at the bound");
    let err = from_yaml(&named(bounds::MAX_ROUTE_NAME_BYTES + 1)).expect_err("past");
    assert_eq!(err.key, "routes[0].name", "{err}");
    assert_eq!(
        from_yaml(&routes(bounds::MAX_ROUTES + 1))
            .expect_err("past")
            .key,
        "routes"
    );
    let upstreams = |n: usize| {
        let list: Vec<String> = (0..n).map(|i| format!("127.0.0.1:{}", 9000 + i)).collect();
        format!("upstream: 127.0.0.1:9000\nupstreams: [{}]", list.join(", "))
    };
    from_yaml(&upstreams(bounds::MAX_UPSTREAMS)).expect("at the bound");
    assert_eq!(
        from_yaml(&upstreams(bounds::MAX_UPSTREAMS + 1))
            .expect_err("past")
            .key,
        "upstreams"
    );
    let headers = |n: usize| {
        let list: Vec<String> = (0..n)
            .map(|i| format!("{{name: X-{i}, value: v}}"))
            .collect();
        format!("appReadiness: {{port: 1, headers: [{}]}}", list.join(", "))
    };
    from_yaml(&headers(bounds::MAX_PROBE_HEADERS)).expect("at the bound");
    assert_eq!(
        from_yaml(&headers(bounds::MAX_PROBE_HEADERS + 1))
            .expect_err("past")
            .key,
        "appReadiness.headers"
    );
}

#[test]
fn the_worst_case_drain_sums_without_overflow() {
    let drain = DrainConfig {
        max_delay: HumanDuration(std::time::Duration::MAX),
        timeout: HumanDuration(std::time::Duration::MAX),
        ..DrainConfig::default()
    };
    assert_eq!(drain.worst_case(), std::time::Duration::MAX);
}
