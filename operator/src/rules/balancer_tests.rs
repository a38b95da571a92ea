use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Service};
use serde_json::json;

use super::*;
use crate::testing::yaml;

const SECS: fn(u64) -> Duration = Duration::from_secs;

fn web_pod() -> Pod {
    yaml("metadata: {name: web-1, labels: {app: web, tier: front}}")
}

/// Service `name` selecting `app: web`, with `annotations` (a YAML map).
fn svc(name: &str, annotations: &str) -> Service {
    yaml(&format!(
        "metadata: {{name: {name}, annotations: {annotations}}}\nspec: {{selector: {{app: web}}}}"
    ))
}

fn aws(name: &str, attrs: &str) -> Service {
    svc(
        name,
        &format!("{{{AWS_TARGET_GROUP_ATTRIBUTES}: '{attrs}'}}"),
    )
}

fn gke(name: &str, value: &str) -> Service {
    svc(name, &format!("{{{GKE_BACKEND_CONFIG}: '{value}'}}"))
}

fn backend_config(draining: serde_json::Value) -> serde_json::Value {
    json!({"spec": {"connectionDraining": {"drainingTimeoutSec": draining}}})
}

#[test]
fn only_a_route_at_the_default_max_delay_follows_a_balancer() {
    assert!(follows_balancer(SECS(15)));
    for own in [SECS(14), SECS(16), SECS(0), SECS(3600)] {
        assert!(!follows_balancer(own), "{own:?}");
    }
}

#[test]
fn a_service_selects_a_pod_by_every_pair_of_a_non_empty_selector() {
    let pod = web_pod();
    assert!(selects(&svc("web", "{}"), &pod));
    let other: Service = yaml("metadata: {name: api}\nspec: {selector: {app: api}}");
    assert!(!selects(&other, &pod));
    let wider: Service = yaml("metadata: {name: w}\nspec: {selector: {app: web, tier: back}}");
    assert!(!selects(&wider, &pod));
    let empty: Service = yaml("metadata: {name: e}\nspec: {selector: {}}");
    assert!(!selects(&empty, &pod));
    let none: Service = yaml("metadata: {name: n}\nspec: {}");
    assert!(!selects(&none, &pod));
}

#[test]
fn the_aws_deregistration_delay_is_read_from_the_attribute_list() -> Result<(), String> {
    assert_eq!(aws_delay(&svc("web", "{}"))?, None);
    assert_eq!(aws_delay(&aws("web", "stickiness.enabled=true"))?, None);
    assert_eq!(
        aws_delay(&aws(
            "web",
            "stickiness.enabled=true, deregistration_delay.timeout_seconds = 120"
        ))?,
        Some(SECS(120))
    );
    assert_eq!(
        aws_delay(&aws("web", "deregistration_delay.timeout_seconds=0"))?,
        Some(SECS(0))
    );
    Ok(())
}

#[test]
fn the_aws_delay_is_bounded_at_what_aws_accepts() {
    let at = |v: &str| aws_delay(&aws("web", &format!("{AWS_DEREGISTRATION_DELAY}={v}")));
    assert_eq!(at("3600"), Ok(Some(SECS(3600))));
    for bad in ["3601", "-1", "1.5", "abc", "", "99999999999999999999999999"] {
        let err = at(bad).expect_err(bad);
        assert!(err.contains("Service web"), "{err}");
    }
}

#[test]
fn backend_config_names_come_from_default_and_ports() -> Result<(), String> {
    assert!(backend_config_names(&svc("web", "{}"))?.is_empty());
    assert_eq!(
        backend_config_names(&gke("web", r#"{"default": "slow"}"#))?,
        ["slow"]
    );
    assert_eq!(
        backend_config_names(&gke(
            "web",
            r#"{"default": "b", "ports": {"80": "a", "http": "b"}}"#
        ))?,
        ["a", "b"]
    );
    let beta = svc(
        "web",
        &format!("{{{GKE_BACKEND_CONFIG_BETA}: '{{\"default\": \"old\"}}'}}"),
    );
    assert_eq!(backend_config_names(&beta)?, ["old"]);
    for bad in [
        "not json",
        r#"{"default": 3}"#,
        r#"{"ports": ["a"]}"#,
        r#"{"ports": {"80": {}}}"#,
    ] {
        let err = backend_config_names(&gke("web", bad)).expect_err(bad);
        assert!(err.contains(GKE_BACKEND_CONFIG), "{err}");
    }
    Ok(())
}

#[test]
fn the_gke_draining_timeout_is_bounded_at_what_gcp_accepts() {
    assert_eq!(gke_delay(&json!({"spec": {}})), Ok(None));
    assert_eq!(gke_delay(&backend_config(json!(null))), Ok(None));
    assert_eq!(gke_delay(&backend_config(json!(60))), Ok(Some(SECS(60))));
    assert_eq!(
        gke_delay(&backend_config(json!(3600))),
        Ok(Some(SECS(3600)))
    );
    for bad in [
        json!(3601),
        json!(-5),
        json!("60"),
        json!(1.5),
        json!(u64::MAX),
    ] {
        assert!(gke_delay(&backend_config(bad.clone())).is_err(), "{bad}");
    }
}

#[test]
fn the_longest_balancer_setting_of_a_selecting_service_raises_max_delay() {
    let pods = [web_pod()];
    let other: Service = yaml(&format!(
        "metadata: {{name: api, annotations: {{{AWS_TARGET_GROUP_ATTRIBUTES}: '{AWS_DEREGISTRATION_DELAY}=900'}}}}\nspec: {{selector: {{app: api}}}}"
    ));
    let services = [
        aws("web-nlb", "deregistration_delay.timeout_seconds=120"),
        gke("web-neg", r#"{"default": "drain"}"#),
        // Selects other pods: its 900s is not this route's.
        other,
    ];
    let configs = BTreeMap::from([("drain".to_owned(), backend_config(json!(200)))]);
    let found = balancer_max_delay(&services, &pods, &configs, SECS(15), SECS(30));
    assert!(found.unreadable.is_empty(), "{:?}", found.unreadable);
    let got = found.max_delay.expect("a delay");
    assert_eq!(got.delay, SECS(200));
    assert_eq!(
        got.source,
        "Service web-neg -> BackendConfig drain: connectionDraining.drainingTimeoutSec=200"
    );

    // The AWS one alone.
    let found = balancer_max_delay(&services[..1], &pods, &configs, SECS(15), SECS(30));
    let got = found.max_delay.expect("a delay");
    assert_eq!(got.delay, SECS(120));
    let source = &got.source;
    assert!(source.starts_with("Service web-nlb: "), "{source}");
}

/// What one Service of the web pods with this AWS attribute list raises a
/// route (maxDelay 15s, timeout `timeout_s`) to.
fn aws_alone(attrs: &str, timeout_s: u64) -> Found {
    let services = [aws("web", attrs)];
    balancer_max_delay(
        &services,
        &[web_pod()],
        &BTreeMap::new(),
        SECS(15),
        SECS(timeout_s),
    )
}

#[test]
fn a_balancer_setting_never_lowers_the_routes_max_delay() {
    let found = aws_alone("deregistration_delay.timeout_seconds=10", 30);
    assert_eq!(found, Found::default());
    // Equal is not longer either.
    let found = aws_alone("deregistration_delay.timeout_seconds=15", 30);
    assert_eq!(found.max_delay, None);
}

#[test]
fn the_delay_is_capped_so_that_the_drain_fits_the_crds_bound() {
    let hour = "deregistration_delay.timeout_seconds=3600";
    // 3600s + a 30s timeout is past 1h: capped at 3570s.
    let got = aws_alone(hour, 30).max_delay.expect("a delay");
    assert_eq!(got.delay, MAX_DRAIN - SECS(30));
    assert!(got.source.contains("capped at 3570s"), "{}", got.source);
    // A timeout that leaves no more than the route's own maxDelay: nothing to raise.
    let leaves_15s = (MAX_DRAIN - SECS(15)).as_secs();
    assert_eq!(aws_alone(hour, leaves_15s).max_delay, None);
    // A timeout past the bound (rejected elsewhere) does not underflow.
    let past = (MAX_DRAIN + SECS(1)).as_secs();
    assert_eq!(aws_alone(hour, past).max_delay, None);
}

#[test]
fn unreadable_settings_are_listed_not_guessed() {
    let pods = [web_pod()];
    let services = [
        aws("web-a", "deregistration_delay.timeout_seconds=soon"),
        gke("web-b", r#"{"default": "missing"}"#),
        gke("web-c", r#"{"default": "bad"}"#),
        gke("web-d", "{"),
    ];
    let configs = BTreeMap::from([("bad".to_owned(), backend_config(json!("60")))]);
    let found = balancer_max_delay(&services, &pods, &configs, SECS(15), SECS(30));
    assert_eq!(found.max_delay, None);
    assert_eq!(found.unreadable.len(), 4, "{:?}", found.unreadable);
    assert!(found.unreadable[0].starts_with("Service web-a: "));
    assert_eq!(
        found.unreadable[1],
        "Service web-b names BackendConfig missing, which was not found"
    );
    assert!(found.unreadable[2].starts_with("Service web-c -> BackendConfig bad: "));
    assert!(
        found.unreadable[3].contains("not JSON"),
        "{}",
        found.unreadable[3]
    );
}
