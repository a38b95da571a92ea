//! The healing decisions, from YAML fixtures.

use super::*;

fn settings() -> SidecarSettings {
    SidecarSettings {
        image: "sidecar:test".into(),
        pull_policy: "IfNotPresent".into(),
        resources: webhook::resources("50m", "32Mi", "", "128Mi"),
        log_level: None,
        run_as_user: Some(65532),
        native: false,
        ports: crate::inject::Ports::default(),
    }
}

const ROUTE: &str = "metadata: {name: web, namespace: shop}\nspec: {targetRef: {kind: Deployment, name: web}, ports: [{name: http}]}";

fn route(extra_meta: &str) -> GraceRoute {
    let yaml = ROUTE.replace(
        "namespace: shop}",
        &format!("namespace: shop{extra_meta}}}"),
    );
    serde_norway::from_str(&yaml).expect("route")
}

/// A pod of the Deployment `web`: `owner` is the controlling object's
/// kind, `ready` its Ready condition, `extra` extra metadata fields.
fn pod(name: &str, owner: &str, ready: bool, extra: &str) -> Pod {
    let owners = match owner {
        "" => String::new(),
        kind => format!(
            ", ownerReferences: [{{apiVersion: {}, kind: {kind}, name: web-abc, uid: uid-web, controller: true}}]",
            if kind == "Job" { "batch/v1" } else { "apps/v1" }
        ),
    };
    let yaml = format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: shop, labels: {{app: web, kubegrace.io/inject: enabled}}, annotations: {{kubegrace.io/route: web}}{owners}{extra}}}
spec:
  containers:
  - {{name: app, image: app, ports: [{{name: http, containerPort: 8080}}]}}
status:
  phase: Running
  conditions: [{{type: Ready, status: "{}"}}]
"#,
        if ready { "True" } else { "False" }
    );
    serde_norway::from_str(&yaml).expect("pod")
}

fn injected(name: &str) -> Pod {
    let mut p = pod(name, "ReplicaSet", true, "");
    p.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(keys::INJECTED.into(), "true".into());
    p
}

fn ns() -> BTreeMap<String, String> {
    BTreeMap::from([(
        "kubernetes.io/metadata.name".to_string(),
        "shop".to_string(),
    )])
}

/// The chart's two entries with the default values, release `kubegrace-system`.
fn all() -> Vec<MutatingWebhook> {
    serde_norway::from_str(
        r#"
- name: namespace.inject.kubegrace.io
  admissionReviewVersions: [v1]
  sideEffects: None
  clientConfig: {}
  namespaceSelector:
    matchExpressions:
    - {key: kubegrace.io/inject, operator: In, values: [enabled]}
    - {key: kubernetes.io/metadata.name, operator: NotIn, values: [kube-system, kubegrace-system]}
  objectSelector:
    matchExpressions: [{key: kubegrace.io/inject, operator: NotIn, values: [enabled, disabled]}]
- name: pod.inject.kubegrace.io
  admissionReviewVersions: [v1]
  sideEffects: None
  clientConfig: {}
  namespaceSelector:
    matchExpressions:
    - {key: kubernetes.io/metadata.name, operator: NotIn, values: [kube-system, kubegrace-system]}
  objectSelector:
    matchExpressions: [{key: kubegrace.io/inject, operator: In, values: [enabled]}]
- name: check.inject.kubegrace.io
  admissionReviewVersions: [v1]
  sideEffects: None
  clientConfig: {}
  namespaceSelector:
    matchExpressions: [{key: kubernetes.io/metadata.name, operator: In, values: [kube-system]}]
  objectSelector:
    matchExpressions: [{key: kubegrace.io/inject, operator: In, values: [enabled]}]
"#,
    )
    .expect("webhooks")
}

#[test]
fn only_pods_the_webhook_configuration_sends_are_candidates() {
    let pods = [pod("web-1", "ReplicaSet", true, "")];
    let excluded = BTreeMap::from([(
        "kubernetes.io/metadata.name".to_string(),
        "kube-system".to_string(),
    )]);
    // kube-system is excluded by both entries (the probe entry, which would
    // match it here, never counts): evicting would bring the pod back bare.
    assert!(!served(&all(), &excluded, pods[0].labels()));
    assert!(candidates(&pods, &excluded, &[route("")], &settings(), &all()).is_empty());
    // No webhook configuration entries at all: nothing is healed.
    assert!(candidates(&pods, &ns(), &[route("")], &settings(), &[]).is_empty());
    // A namespace-labelled pod (no pod label) is sent by the namespace entry.
    let mut by_ns = pod("web-2", "ReplicaSet", true, "");
    by_ns
        .metadata
        .labels
        .as_mut()
        .map(|l| l.remove(keys::INJECT));
    let mut labelled = ns();
    labelled.insert(keys::INJECT.into(), "enabled".into());
    assert!(served(&all(), &labelled, by_ns.labels()));
    assert!(!served(&all(), &ns(), by_ns.labels()));
}

fn names(c: &[Candidate]) -> Vec<&str> {
    c.iter().map(|c| c.pod.as_str()).collect()
}

#[test]
fn a_bare_pod_of_a_replicaset_the_webhook_would_inject_is_a_candidate() {
    let pods = [pod("web-1", "ReplicaSet", true, ""), injected("web-2")];
    let c = candidates(&pods, &ns(), &[route("")], &settings(), &all());
    assert_eq!(names(&c), ["web-1"]);
    assert_eq!(c[0].route, "web");
    assert_eq!(c[0].owner, "uid-web");
    assert_eq!(pick(&c, &pods).map(|c| c.pod.as_str()), Some("web-1"));
}

#[test]
fn statefulset_pods_count_but_bare_pods_and_jobs_never() {
    let pods = [
        pod("sts-0", "StatefulSet", true, ""),
        pod("bare", "", true, ""),
        pod("job-x", "Job", true, ""),
    ];
    let c = candidates(&pods, &ns(), &[route("")], &settings(), &all());
    assert_eq!(names(&c), ["sts-0"]);
}

#[test]
fn a_pod_the_webhook_would_not_inject_is_left_alone() {
    // Already injected, opted out, or no route selects it (the webhook
    // would skip it again: evicting it would only churn).
    let mut opted_out = pod("out", "ReplicaSet", true, "");
    opted_out
        .metadata
        .labels
        .get_or_insert_with(BTreeMap::new)
        .insert(keys::INJECT.into(), "disabled".into());
    let pods = [injected("in"), opted_out];
    assert!(candidates(&pods, &ns(), &[route("")], &settings(), &all()).is_empty());
    let lone = [pod("web-1", "ReplicaSet", true, "")];
    assert!(candidates(&lone, &ns(), &[], &settings(), &all()).is_empty());
}

#[test]
fn an_unaccepted_route_means_no_eviction() {
    let mut r = route("");
    r.status = Some(
        serde_norway::from_str(
            "conditions: [{type: Accepted, status: 'False', reason: Invalid, message: bad, lastTransitionTime: '2026-01-01T00:00:00Z'}]",
        )
        .expect("status"),
    );
    let pods = [pod("web-1", "ReplicaSet", true, "")];
    assert!(candidates(&pods, &ns(), &[r], &settings(), &all()).is_empty());
}

#[test]
fn the_heal_annotation_turns_it_off_per_route() {
    let pods = [pod("web-1", "ReplicaSet", true, "")];
    for off in ["disabled", "Disabled", " disabled "] {
        let r = route(&format!(", annotations: {{kubegrace.io/heal: '{off}'}}"));
        assert!(heal_disabled(&r), "{off:?}");
        assert!(candidates(&pods, &ns(), &[r], &settings(), &all()).is_empty());
    }
    let on = route(", annotations: {kubegrace.io/heal: enabled}");
    assert!(!heal_disabled(&on));
    assert_eq!(
        candidates(&pods, &ns(), &[on], &settings(), &all()).len(),
        1
    );
}

#[test]
fn terminating_and_finished_pods_are_not_candidates() {
    let gone = pod(
        "gone",
        "ReplicaSet",
        true,
        ", deletionTimestamp: '2026-01-01T00:00:00Z'",
    );
    let mut done = pod("done", "ReplicaSet", false, "");
    if let Some(s) = done.status.as_mut() {
        s.phase = Some("Succeeded".into());
    }
    let pods = [gone, done];
    assert!(candidates(&pods, &ns(), &[route("")], &settings(), &all()).is_empty());
}

#[test]
fn one_pod_at_a_time_per_workload_only_when_the_others_are_ready() {
    // Two bare pods: neither is picked while the other is not Ready...
    let pods = [
        pod("web-1", "ReplicaSet", false, ""),
        pod("web-2", "ReplicaSet", true, ""),
        injected("web-3"),
    ];
    let c = candidates(&pods, &ns(), &[route("")], &settings(), &all());
    assert_eq!(names(&c), ["web-1", "web-2"]);
    // web-1's siblings (web-2, web-3) are Ready: web-1 may go; web-2's
    // sibling web-1 is not Ready: web-2 must wait.
    assert!(siblings_settled(&pods, "uid-web", "web-1"));
    assert!(!siblings_settled(&pods, "uid-web", "web-2"));
    assert_eq!(pick(&c, &pods).map(|c| c.pod.as_str()), Some("web-1"));
    // A sibling terminating (the previous eviction's pod) holds everyone.
    let pods = [
        pod("web-1", "ReplicaSet", true, ""),
        pod(
            "web-0",
            "ReplicaSet",
            true,
            ", deletionTimestamp: '2026-01-01T00:00:00Z'",
        ),
    ];
    let c = candidates(&pods, &ns(), &[route("")], &settings(), &all());
    assert_eq!(names(&c), ["web-1"]);
    assert_eq!(pick(&c, &pods), None);
}

#[test]
fn the_interval_is_bounded_at_both_ends() {
    crate::testing::assert_bounded(checked_interval, MIN_INTERVAL, MAX_INTERVAL);
}

#[test]
fn the_metric_lists_every_result_and_counts() {
    let m = HealMetrics::default();
    m.count("evicted");
    m.count("evicted");
    let mut out = String::new();
    m.render(&mut out);
    assert!(out.contains("kubegrace_operator_heal_evictions_total{result=\"evicted\"} 2"));
    assert!(
        out.contains("kubegrace_operator_heal_evictions_total{result=\"disruption_budget\"} 0")
    );
}
