//! The config as a whole, read from YAML the way the sidecar and the
//! operator's tests read it.

use super::*;

/// What the sidecar does with its file: parse, then validate.
fn from_yaml(text: &str) -> Result<Config, ConfigError> {
    let config: Config =
        serde_yaml::from_str(text).map_err(|e| ConfigError::new("yaml", e.to_string()))?;
    config.validate()?;
    Ok(config)
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
    let again = from_yaml(&serde_yaml::to_string(&config).expect("render")).expect("re-parse");
    assert_eq!(config, again);
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
    let err = from_yaml("drian: {}").expect_err("unknown key");
    assert!(err.message.contains("drian"), "{err}");
}

#[test]
fn http2_stream_cap_defaults_to_200_and_refuses_zero() {
    assert_eq!(Config::default().limits.max_concurrent_streams, 200);
    let config = from_yaml("limits: {maxConcurrentStreams: 50}").expect("valid");
    assert_eq!(config.limits.max_concurrent_streams, 50);
    let err = from_yaml("limits: {maxConcurrentStreams: 0}").expect_err("invalid");
    assert_eq!(err.key, "limits.maxConcurrentStreams");
}

#[test]
fn drain_readiness_defaults_to_fail_fast_and_takes_only_its_two_values() {
    assert_eq!(Config::default().drain.readiness, DrainReadiness::FailFast);
    let config = from_yaml("drain: {readiness: stayServing}").expect("valid");
    assert_eq!(config.drain.readiness, DrainReadiness::StayServing);
    let config = from_yaml("drain: {readiness: failFast}").expect("valid");
    assert_eq!(config.drain.readiness, DrainReadiness::FailFast);
    let again = from_yaml(&serde_yaml::to_string(&config).expect("render")).expect("re-parse");
    assert_eq!(config, again);
    let err = from_yaml("drain: {readiness: stay}").expect_err("unknown value");
    assert!(
        err.message.contains("failFast") && err.message.contains("stayServing"),
        "{err}"
    );
}

#[test]
fn grpc_health_defaults_to_not_serving_and_takes_only_its_two_values() {
    assert_eq!(
        Config::default().drain.grpc_health,
        DrainGrpcHealth::NotServing
    );
    let config = from_yaml("drain: {grpcHealth: app}").expect("valid");
    assert_eq!(config.drain.grpc_health, DrainGrpcHealth::App);
    let again = from_yaml(&serde_yaml::to_string(&config).expect("render")).expect("re-parse");
    assert_eq!(config, again);
    let err = from_yaml("drain: {grpcHealth: off}").expect_err("unknown value");
    assert!(
        err.message.contains("notServing") && err.message.contains("app"),
        "{err}"
    );
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
    let again = from_yaml(&serde_yaml::to_string(&config).expect("render")).expect("re-parse");
    assert_eq!(config, again);
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
    // would fail their reload (deny_unknown_fields).
    let yaml = serde_yaml::to_string(&Config::default()).expect("render");
    for key in ["websocketClose", "retryBudget"] {
        assert!(!yaml.contains(key), "{key} in a default file:\n{yaml}");
    }
    let mut config = Config::default();
    config.retry_budget.ratio = 0.5;
    let yaml = serde_yaml::to_string(&config).expect("render");
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
