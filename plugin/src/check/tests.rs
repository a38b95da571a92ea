//! Each check's decision, shown passing and failing, from inline objects.

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::CustomResourceExt;
use kubegrace_api::crd::GraceRoute;

use super::rules::{self, Namespaced, Probe};
use super::{Finding, Snapshot, judge};
use crate::install::{Install, from_deployment};

fn install() -> Install {
    from_deployment(yaml(
        r#"
metadata: {name: kubegrace-operator, namespace: kg}
spec:
  selector: {matchLabels: {app.kubernetes.io/name: kubegrace}}
  template:
    spec:
      containers:
        - name: operator
          args: [run, --namespace=$(POD_NAMESPACE), --sidecar-image=reg/kubegrace/sidecar:1.2.0]
"#,
    ))
    .expect("install")
}

/// The finding's message says `part` and its fix is exactly `fix`.
#[track_caller]
fn assert_says(finding: &Finding, part: &str, fix: &str) {
    assert!(finding.message.contains(part), "{finding:?}");
    assert_eq!(finding.fix.as_deref(), Some(fix), "{finding:?}");
}

/// An object of any type from inline YAML.
#[track_caller]
fn yaml<T: serde::de::DeserializeOwned>(text: &str) -> T {
    serde_norway::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

fn pod(text: &str) -> Pod {
    yaml(text)
}

/// [`APP_POD`] with these annotations (a YAML flow mapping's entries).
fn annotated_app_pod(annotations: &str) -> Pod {
    pod(&APP_POD.replace(
        "labels:",
        &format!("annotations: {{{annotations}}}\n  labels:"),
    ))
}

fn now() -> jiff::Timestamp {
    "2026-12-03T10:00:00Z".parse().expect("time")
}

fn problems(f: &[Finding]) -> Vec<&Finding> {
    f.iter().filter(|f| !f.ok).collect()
}

/// The one problem among the findings; fails unless there is exactly one.
#[track_caller]
fn one_problem(f: &[Finding]) -> &Finding {
    let p = problems(f);
    assert_eq!(p.len(), 1, "{f:?}");
    p[0]
}

const OPERATOR_POD: &str = r#"
metadata: {name: kubegrace-operator-abc, namespace: kg}
status: {phase: Running, conditions: [{type: Ready, status: "True"}]}
"#;

#[test]
fn the_operator_is_up_with_a_ready_pod_only() {
    let i = install();
    assert!(rules::operator(&i, &[pod(OPERATOR_POD)]).ok);
    let f = rules::operator(&i, &[pod(&OPERATOR_POD.replace("\"True\"", "\"False\""))]);
    assert!(!f.ok);
    assert!(
        f.fix
            .as_deref()
            .unwrap_or("")
            .contains("kubectl -n kg describe deployment kubegrace-operator"),
        "{f:?}"
    );
    assert!(!rules::operator(&i, &[]).ok);
}

fn lease(holder: &str, renewed: &str) -> Lease {
    yaml(&format!(
        "metadata: {{name: kubegrace-operator}}\nspec: {{holderIdentity: {holder}, leaseDurationSeconds: 15, renewTime: \"{renewed}\"}}"
    ))
}

#[test]
fn the_leader_is_a_running_operator_pod_with_an_unexpired_lease() {
    let i = install();
    let pods = [pod(OPERATOR_POD)];
    // The operator's identity is its pod's name and a random suffix.
    assert_eq!(
        rules::holder_pod("kubegrace-operator-abc-796ba9cb"),
        "kubegrace-operator-abc"
    );
    assert_eq!(
        rules::holder_pod("kubegrace-operator-abc"),
        "kubegrace-operator-abc"
    );
    let fresh = lease(
        "kubegrace-operator-abc-796ba9cb",
        "2026-12-03T09:59:55.000000Z",
    );
    assert!(rules::leader(&i, Some(&fresh), &pods, now()).ok);
    let expired = lease(
        "kubegrace-operator-abc-796ba9cb",
        "2026-12-03T09:59:00.000000Z",
    );
    let f = rules::leader(&i, Some(&expired), &pods, now());
    assert!(!f.ok && f.message.contains("no current holder"), "{f:?}");
    let stranger = lease(
        "kubegrace-operator-old-796ba9cb",
        "2026-12-03T09:59:55.000000Z",
    );
    let f = rules::leader(&i, Some(&stranger), &pods, now());
    assert!(
        !f.ok && f.message.contains("not a running operator pod"),
        "{f:?}"
    );
    let f = rules::leader(&i, None, &pods, now());
    assert!(!f.ok && f.message.contains("does not exist"), "{f:?}");
}

#[test]
fn the_webhook_needs_endpoints_and_an_answer_to_the_dry_run() {
    let i = install();
    let answered = Probe::Answered {
        namespace: "default".into(),
        verdict: "skipped: no GraceRoute selects this pod".into(),
    };
    assert!(problems(&rules::webhook(&i, 2, &answered)).is_empty());
    assert!(problems(&rules::webhook(&i, 2, &Probe::NoNamespace)).is_empty());
    let no_endpoints = rules::webhook(&i, 0, &answered);
    assert_eq!(problems(&no_endpoints).len(), 1);
    assert!(no_endpoints[0].message.contains("no ready endpoint"));
    let unmarked = rules::webhook(
        &i,
        2,
        &Probe::Unmarked {
            namespace: "default".into(),
        },
    );
    assert!(
        problems(&unmarked)[0]
            .message
            .contains("failurePolicy Ignore")
    );
    let failed = rules::webhook(
        &i,
        2,
        &Probe::Failed {
            namespace: "default".into(),
            error: "failed calling webhook: x509: certificate signed by unknown authority".into(),
        },
    );
    let p = problems(&failed);
    assert!(
        p[0].message.contains("x509")
            && p[0]
                .fix
                .as_deref()
                .unwrap_or("")
                .contains("rollout restart")
    );
}

/// A CA and a leaf it issued, PEM, with the operator's own issuing code.
fn ca_and_leaf(now: time::OffsetDateTime) -> (String, String) {
    use kubegrace_operator::certs::{issue_leaf, new_ca, service_sans};
    let sans = service_sans("kubegrace-webhook", "kg", &[]);
    let (ca, key, ca_end) = new_ca(&sans, now).expect("ca");
    let (leaf, _, _) = issue_leaf(&sans, &ca, &key, ca_end, now).expect("leaf");
    (ca, leaf)
}

#[test]
fn a_ca_bundle_matches_only_the_ca_that_issued_the_serving_certificate() {
    let i = install();
    let t = time::OffsetDateTime::now_utc();
    let (ca, leaf) = ca_and_leaf(t);
    let (other_ca, _) = ca_and_leaf(t);
    let bundles = vec![
        ("good".to_owned(), Some(ca.clone().into_bytes())),
        // During a CA rotation the bundle holds two CAs: still good.
        (
            "two".to_owned(),
            Some(format!("{other_ca}{ca}").into_bytes()),
        ),
        // Same name, another key: the API server would reject the certificate.
        ("stale".to_owned(), Some(other_ca.into_bytes())),
        ("empty".to_owned(), None),
    ];
    let f = rules::ca_bundles(&i, Some(leaf.as_bytes()), &bundles);
    let verdicts: Vec<(&str, bool)> = f
        .iter()
        .map(|f| (f.message.split(':').next().unwrap_or(""), f.ok))
        .collect();
    assert_eq!(
        verdicts,
        vec![
            ("good", true),
            ("two", true),
            ("stale", false),
            ("empty", false)
        ]
    );
    assert!(
        f[2].fix
            .as_deref()
            .unwrap_or("")
            .contains("rollout restart deployment/kubegrace-operator")
    );
    let none = rules::ca_bundles(&i, None, &bundles);
    assert_eq!(none.len(), 1);
    assert!(!none[0].ok);
}

#[test]
fn a_certificate_within_14_days_of_its_end_is_a_problem() {
    let i = install();
    let issued = time::OffsetDateTime::now_utc();
    let (_, leaf) = ca_and_leaf(issued);
    let at = |days: i64| {
        jiff::Timestamp::from_second(issued.unix_timestamp() + days * 86_400).expect("time")
    };
    // The operator's leaves last 90 days.
    let f = rules::certificate(&i, Some(leaf.as_bytes()), at(0)).expect("finding");
    assert!(f.ok, "{f:?}");
    let f = rules::certificate(&i, Some(leaf.as_bytes()), at(80)).expect("finding");
    assert!(!f.ok && f.message.contains("expires in"), "{f:?}");
    let f = rules::certificate(&i, Some(leaf.as_bytes()), at(91)).expect("finding");
    assert!(!f.ok && f.message.contains("has expired"), "{f:?}");
    assert!(rules::certificate(&i, None, at(0)).is_none());
}

#[test]
fn the_crd_must_serve_and_store_our_version_with_our_schema() {
    let ours = GraceRoute::crd();
    assert!(rules::crd(Some(&ours), None).ok);
    assert!(!rules::crd(None, None).ok);
    let mut not_served = ours.clone();
    not_served.spec.versions[0].served = false;
    assert!(!rules::crd(Some(&not_served), None).ok);
    let mut other_version = ours.clone();
    other_version.spec.versions[0].name = "v1beta9".into();
    let f = rules::crd(Some(&other_version), None);
    assert!(!f.ok && f.message.contains("no version v1alpha1"), "{f:?}");
    let mut old_schema = ours.clone();
    old_schema.spec.versions[0].schema = None;
    let f = rules::crd(Some(&old_schema), None);
    assert!(!f.ok && f.message.contains("another schema"), "{f:?}");
    // An operator of this plugin's release with another schema: a stale CRD.
    let f = rules::crd(Some(&old_schema), Some(env!("CARGO_PKG_VERSION")));
    assert!(!f.ok && f.message.contains("another schema"), "{f:?}");
    // An operator of another release: its schema, reported, not a problem (docs/skew.md);
    // what it serves and stores is still checked.
    let f = rules::crd(Some(&old_schema), Some("0.0.9"));
    assert!(
        f.ok && f.message.contains("the operator runs 0.0.9"),
        "{f:?}"
    );
    let f = rules::crd(Some(&not_served), Some("0.0.9"));
    assert!(!f.ok, "{f:?}");
}

const APP_POD: &str = r#"
metadata:
  name: web-7d9f-x1
  namespace: shop
  labels: {kubegrace.io/inject: enabled, pod-template-hash: 7d9f}
  ownerReferences: [{apiVersion: apps/v1, kind: ReplicaSet, name: web-7d9f, uid: u, controller: true}]
spec: {containers: [{name: app, image: app}]}
status: {phase: Running}
"#;

#[test]
fn a_pod_asking_for_the_sidecar_without_it_is_named_with_its_restart() {
    let ns = BTreeMap::new();
    let f = rules::injection(&[pod(APP_POD)], &ns);
    assert_eq!(problems(&f).len(), 1);
    assert_says(
        &f[0],
        "pod shop/web-7d9f-x1 asks for the sidecar and has none",
        "kubectl -n shop rollout restart deployment/web",
    );
    let skipped =
        annotated_app_pod("kubegrace.io/inject-skipped: \"no GraceRoute selects this pod\"");
    let f = rules::injection(&[skipped], &ns);
    assert_says(
        &f[0],
        "(the webhook skipped it: no GraceRoute selects this pod)",
        "no GraceRoute selects this pod; then kubectl -n shop rollout restart deployment/web",
    );
    let injected = annotated_app_pod("kubegrace.io/injected: \"true\"");
    assert!(problems(&rules::injection(&[injected], &ns)).is_empty());
    // The namespace label asks too; a pod's own `disabled` wins over it.
    let plain = pod(&APP_POD.replace("kubegrace.io/inject: enabled, ", ""));
    let labelled = BTreeMap::from([(
        "shop".to_owned(),
        BTreeMap::from([("kubegrace.io/inject".to_owned(), "enabled".to_owned())]),
    )]);
    assert!(problems(&rules::injection(std::slice::from_ref(&plain), &ns)).is_empty());
    assert_eq!(problems(&rules::injection(&[plain], &labelled)).len(), 1);
    let opted_out = pod(&APP_POD.replace("inject: enabled", "inject: disabled"));
    assert!(problems(&rules::injection(&[opted_out], &labelled)).is_empty());
    // A pod on its way out is not judged.
    let leaving = pod(&APP_POD.replace(
        "namespace: shop",
        "namespace: shop\n  deletionTimestamp: \"2026-12-03T09:00:00Z\"",
    ));
    assert!(problems(&rules::injection(&[leaving], &ns)).is_empty());
}

#[test]
fn a_pod_with_another_sidecar_version_is_stale() {
    let with = |v: &str| {
        annotated_app_pod(&format!(
            "kubegrace.io/injected: \"true\", kubegrace.io/sidecar-version: \"{v}\""
        ))
    };
    assert!(problems(&rules::versions(&[with("1.2.0")], "1.2.0")).is_empty());
    let f = rules::versions(&[with("1.1.0"), with("1.2.0")], "1.2.0");
    let p = one_problem(&f);
    assert!(
        p.message
            .contains("runs sidecar 1.1.0 but the operator injects 1.2.0"),
        "{p:?}"
    );
    // Pods without a sidecar have no version to compare.
    assert!(problems(&rules::versions(&[pod(APP_POD)], "1.2.0")).is_empty());
}

fn route(yaml_status: &str) -> GraceRoute {
    yaml(&format!(
        r#"
apiVersion: kubegrace.io/v1alpha1
kind: GraceRoute
metadata: {{name: web, namespace: shop}}
spec: {{targetRef: {{kind: Deployment, name: web}}, ports: [{{name: http}}]}}
{yaml_status}
"#
    ))
}

const ACCEPTED: &str = r#"status: {conditions: [
  {type: Accepted, status: "True", reason: Valid, message: ok, lastTransitionTime: "2026-12-03T09:00:00Z"},
  {type: Ready, status: "True", reason: Ready, message: ok, lastTransitionTime: "2026-12-03T09:00:00Z"}]}"#;

#[test]
fn a_service_targeting_the_apps_number_bypasses_the_sidecar() {
    let deployment: k8s_openapi::api::apps::v1::Deployment = yaml(
        r#"
metadata: {name: web, namespace: shop}
spec:
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec: {containers: [{name: app, image: app, ports: [{name: http, containerPort: 8080}]}]}
"#,
    );
    let service = |target: &str| {
        yaml(&format!(
            "metadata: {{name: web, namespace: shop}}\nspec: {{selector: {{app: web}}, ports: [{{port: 80, targetPort: {target}}}]}}"
        ))
    };
    let ns = |target: &str| {
        BTreeMap::from([(
            "shop".to_owned(),
            Namespaced {
                routes: vec![route(ACCEPTED)],
                deployments: vec![deployment.clone()],
                statefulsets: vec![],
                services: vec![service(target)],
            },
        )])
    };
    assert!(problems(&rules::bypasses(&ns("http"))).is_empty());
    let f = rules::bypasses(&ns("8080"));
    let p = one_problem(&f);
    assert!(
        p.message
            .contains("Service web port 80 targets 8080 by number"),
        "{p:?}"
    );
    assert!(
        p.fix
            .as_deref()
            .unwrap_or("")
            .starts_with("set targetPort: http"),
        "{p:?}"
    );
}

#[test]
fn routes_not_accepted_or_without_target_are_problems() {
    assert!(problems(&rules::routes(&[route(ACCEPTED)])).is_empty());
    let rejected = route(
        r#"status: {conditions: [{type: Accepted, status: "False", reason: UnknownPort, message: "port http is not declared", lastTransitionTime: "2026-12-03T09:00:00Z"}]}"#,
    );
    let f = rules::routes(&[rejected]);
    assert_says(
        &f[0],
        "is not Accepted (UnknownPort): port http is not declared",
        "kubectl -n shop describe groute web",
    );
    let missing = route(
        r#"status: {conditions: [
  {type: Accepted, status: "True", reason: Valid, message: ok, lastTransitionTime: "2026-12-03T09:00:00Z"},
  {type: Ready, status: "False", reason: TargetNotFound, message: "Deployment/web does not exist in namespace shop; create it or fix spec.targetRef", lastTransitionTime: "2026-12-03T09:00:00Z"}]}"#,
    );
    let f = rules::routes(&[missing]);
    assert_eq!(problems(&f).len(), 1);
    assert_says(
        &f[0],
        "(TargetNotFound): Deployment/web does not exist",
        "create it or fix spec.targetRef",
    );
    let unreconciled = rules::routes(&[route("")]);
    assert!(
        unreconciled[0]
            .message
            .contains("has no Accepted condition")
    );
}

#[test]
fn no_install_or_two_installs_are_problems_and_the_report_says_so() {
    let none = judge(&Snapshot::default(), now());
    assert!(
        none.iter()
            .any(|f| !f.ok && f.message.contains("no kubegrace operator Deployment"))
    );
    let two = Snapshot {
        installs: vec![install(), install()],
        ..Snapshot::default()
    };
    assert!(
        judge(&two, now())
            .iter()
            .any(|f| !f.ok && f.message.contains("1 more operator installs"))
    );
    let text = super::text(&none);
    assert!(
        text.contains("[FAIL] operator") && text.contains("fix: helm install"),
        "{text}"
    );
    let json = super::json(&none);
    assert_eq!(json["ok"], false);
    assert!(json["problems"].as_u64().unwrap_or(0) >= 1);
    assert!(super::text(&[Finding::ok("crd", "fine".into())]).contains("all 1 checks passed"));
}

#[test]
fn a_network_policy_admitting_the_app_number_only_fails_with_the_fix() {
    let injected = pod(r#"
metadata:
  name: web-1
  namespace: shop
  labels: {app: web}
  annotations: {kubegrace.io/injected: "true"}
  ownerReferences: [{apiVersion: apps/v1, kind: ReplicaSet, name: web-5d4f, uid: u}]
spec:
  initContainers:
  - {name: kubegrace-sidecar, image: s, ports: [{name: http, containerPort: 15181}, {name: kg-admin, containerPort: 15180}]}
  containers:
  - {name: app, image: a, ports: [{name: kg-http, containerPort: 8080}]}
"#);
    let policy = |port: &str| -> k8s_openapi::api::networking::v1::NetworkPolicy {
        yaml(&format!(
            "metadata: {{name: allow-web, namespace: shop}}\nspec: {{podSelector: {{}}, ingress: [{{ports: [{{port: {port}}}]}}]}}"
        ))
    };
    let by_number = rules::network_policies(std::slice::from_ref(&injected), Ok(&[policy("8080")]));
    let found = problems(&by_number);
    assert_eq!(found.len(), 1, "{by_number:?}");
    assert!(
        found[0].message.contains("shop: NetworkPolicy allow-web admits the pods of ReplicaSet/web-5d4f on port 8080 by number"),
        "{}",
        found[0].message
    );
    assert!(
        found[0]
            .fix
            .as_deref()
            .unwrap_or("")
            .contains("`port: http`")
    );
    // By name: fine. Unreadable: said, not failed.
    let by_name = rules::network_policies(std::slice::from_ref(&injected), Ok(&[policy("http")]));
    assert!(problems(&by_name).is_empty(), "{by_name:?}");
    let unreadable = rules::network_policies(&[injected], Err("forbidden"));
    assert!(problems(&unreadable).is_empty());
    assert!(unreadable[0].message.contains("not checked: forbidden"));
}

#[test]
fn a_route_the_operator_cannot_read_fails_the_check_by_name() {
    let snapshot = Snapshot {
        undecodable_routes: vec![kubegrace_api::tolerant::Undecodable {
            namespace: "shop".into(),
            name: "web".into(),
            error: "spec.circuitBreaker.consecutiveFailures: invalid value: integer 4294967296, expected u32".into(),
        }],
        ..Snapshot::default()
    };
    let findings = judge(&snapshot, now());
    let bad: Vec<&Finding> = findings
        .iter()
        .filter(|f| !f.ok && f.check == "route")
        .collect();
    assert_eq!(bad.len(), 1, "{findings:?}");
    assert_says(
        bad[0],
        "GraceRoute shop/web: the operator cannot read this GraceRoute: spec.circuitBreaker.consecutiveFailures",
        "kubectl edit graceroute web -n shop",
    );
}
