//! The GraceRoute validating webhook: `POST /validate` on the webhook's
//! HTTPS server (every replica), GraceRoute CREATE and UPDATE.
//!
//! The CRD schema and its CEL rules see one object; they cannot see the
//! target's pod template. This webhook refuses what needs it, with the
//! controller's own pure functions ([`controller::claim_targets`],
//! [`controller::budget_and_config`]), so the two never disagree:
//! - a port name the target's pod template does not declare (the message
//!   lists the names it does have);
//! - a budget that cannot fit a pinned `rollout.terminationGracePeriodSeconds`
//!   (the message has every term of the sum);
//! - anything else the sidecar's own config checks refuse.
//!
//! Allowed, with an admission warning (the route's conditions say the same
//! later): a target that does not exist yet (GitOps applies objects in any
//! order), a selector that matches nothing yet, a Service that already
//! selects the target's pods by the app's port number (it would bypass the
//! sidecar; the warning carries the fix), and an overlap with an older
//! route on the same workload (the older one stays in force; refusing would
//! make the order of two `kubectl apply`s decide which one is "invalid").
//!
//! Never refused: a route being deleted, and an UPDATE that leaves the spec
//! as it was (finalizers, labels): the operator's own writes must go through
//! even when a target changed under a route, or when the stored route does
//! not decode (the operator releases its finalizer).
//!
//! Refused with reason `InvalidObject` and the field: a route whose JSON
//! does not fit the operator's types (a value the schema lets through,
//! such as `consecutiveFailures: 4294967296`). An UPDATE whose *old* object
//! does not decode (stored under an older schema) is judged like a create,
//! so the edit that fixes it goes through.
//!
//! What an answer says: only what the review itself named, plus one verdict.
//! The port is reachable by anything that can reach the pod, and the API
//! server passes on the answer to a user who may not be allowed to read
//! the namespace's Deployments or Services. So a refusal or warning never
//! carries names or values of objects the review did not name: no list of
//! the target's ports, no Service names, no other route's name; a workload
//! found by `spec.selector` is "a workload spec.selector matches". The
//! route's status (readable under the GraceRoute's own RBAC) has the
//! details. [`redact`] does this and is unit-tested.

use std::future::Future;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use kube::{Api, Client, ResourceExt};

use crate::controller::dereference::ReadWorkloads as _;
use crate::controller::{self, Workloads};
use crate::crd::GraceRoute;
use crate::reasons;
use crate::rules::Invalid;
use crate::webhook::admitted_with;
use crate::{Error, Result};

/// What the webhook answers for one route (pure).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Admitted; the warnings go back to the client (kubectl prints them).
    Allow(Vec<String>),
    /// Refused with the controller's reason and message.
    Refuse(Invalid),
}

/// Judges a route against the workloads and routes of its namespace (pure).
/// `old` is the stored object on UPDATE.
pub fn judge(
    route: &GraceRoute,
    old: Option<&GraceRoute>,
    workloads: &Workloads,
    routes: &[GraceRoute],
    services: &[Service],
) -> Verdict {
    if exempt(route, old) {
        return Verdict::Allow(Vec::new());
    }
    // A route being created has its creationTimestamp by the time validating
    // webhooks run; should one lack it, it is the newest route, not the
    // oldest (None sorts first).
    let mut route = route.clone();
    route
        .metadata
        .creation_timestamp
        .get_or_insert_with(|| Time(jiff::Timestamp::now()));
    let others: Vec<&GraceRoute> = routes.iter().collect();
    let (targets, overlaps) = controller::claim_targets(&route, workloads, &others);
    if let Err(invalid) = controller::budget_and_config(&route, &targets) {
        return Verdict::Refuse(redact(&route, invalid));
    }
    let ns = route.namespace().unwrap_or_default();
    let subject = subject(&route);
    let mut warnings: Vec<String> = overlaps
        .iter()
        .map(|_| format!("{subject} is also targeted by an older GraceRoute, which stays in force: this route does not apply to it until that one goes"))
        .collect();
    let bypasses = controller::service_bypasses(&route, &targets, &[], services).len();
    if bypasses > 0 {
        warnings.push(format!(
            "{bypasses} Service(s) in namespace {ns} select these pods by the app's port number, around the sidecar: target the port by name instead (the route's Degraded condition names them)"
        ));
    }
    if workloads.of(&route).is_empty() {
        warnings.push(match &route.spec.target_ref {
            Some(t) => format!(
                "{}/{} does not exist in namespace {ns} yet: the route applies once it is created",
                t.kind, t.name
            ),
            None => format!(
                "no Deployment, StatefulSet or Rollout in namespace {ns} matches spec.selector yet: the route applies to those that will"
            ),
        });
    }
    Verdict::Allow(warnings)
}

/// How an answer names the route's target: by the name the review gave
/// (`targetRef`), never by one found through `spec.selector`.
fn subject(route: &GraceRoute) -> String {
    match &route.spec.target_ref {
        Some(t) => format!("{}/{}", t.kind, t.name),
        None => "a workload spec.selector matches".to_string(),
    }
}

/// The controller's refusal, minus what the review did not name (see the
/// module doc): the target's port names, a selected workload's name.
pub fn redact(route: &GraceRoute, invalid: Invalid) -> Invalid {
    let subject = subject(route);
    match invalid.reason {
        reasons::UNKNOWN_PORT => {
            let wanted = route.spec.port_name();
            Invalid::new(
                invalid.reason,
                format!(
                    "{subject} has no container port named {wanted:?}; set ports[0].name to the name of a port of its pod template, or name the port there"
                ),
            )
        }
        reasons::TARGET_INVALID => Invalid::new(
            invalid.reason,
            format!("{subject} has no pod template spec"),
        ),
        // The others (budget, sidecar config) quote the route's own spec.
        _ => invalid,
    }
}

/// A route being deleted, or an UPDATE that leaves the spec alone.
fn exempt(route: &GraceRoute, old: Option<&GraceRoute>) -> bool {
    route.metadata.deletion_timestamp.is_some() || old.is_some_and(|o| o.spec == route.spec)
}

/// What [`judge`] reads of a namespace.
pub type Namespace = (Workloads, Vec<GraceRoute>, Vec<Service>);

/// Reads what [`judge`] needs: the namespace's workloads, routes and Services.
pub async fn lookup(client: &Client, ns: &str) -> Result<Namespace> {
    let workloads = Workloads::list(client, ns).await?;
    // A route that does not decode claims nothing (its own status says why).
    let routes = crate::tolerant::list(client, ns).await?.routes;
    let services = Api::<Service>::namespaced(client.clone(), ns)
        .list(&kube::api::ListParams::default())
        .await
        .map_err(Error::kube(format!("listing Services in {ns}")))?
        .items;
    Ok((workloads, routes, services))
}

/// Answers one AdmissionReview (parsed once by the server); `lookup`
/// reads the namespace (the server passes the API call, tests pass
/// fixtures). Returns the review, with the request's uid, and the outcome
/// for the metrics: allowed, warned, refused, error.
pub async fn review<F, Fut>(
    mut req: AdmissionRequest<DynamicObject>,
    lookup: F,
) -> (AdmissionReview<DynamicObject>, &'static str)
where
    F: FnOnce(String) -> Fut,
    Fut: Future<Output = Result<Namespace>>,
{
    let resp = AdmissionResponse::from(&req);
    let (Operation::Create | Operation::Update, Some(obj)) = (&req.operation, req.object.take())
    else {
        return (resp.into_review(), "allowed");
    };
    let old_obj = req.old_object.take();
    // Judged on the raw JSON, so it holds for routes that do not decode.
    if obj.metadata.deletion_timestamp.is_some()
        || old_obj
            .as_ref()
            .is_some_and(|o| o.data.get("spec") == obj.data.get("spec"))
    {
        return (resp.into_review(), "allowed");
    }
    let route: GraceRoute = match crate::tolerant::into_typed(obj) {
        Ok(r) => r,
        Err(e) => {
            let invalid = Invalid::new(
                crate::tolerant::INVALID_OBJECT,
                format!("the GraceRoute cannot be read by the operator: {e}"),
            );
            return (refuse(resp, &invalid).into_review(), "refused");
        }
    };
    let route = &route;
    // An old object stored under a looser schema: judged like a create.
    let old: Option<GraceRoute> = old_obj.and_then(|o| crate::tolerant::into_typed(o).ok());
    let old = old.as_ref();
    // Cheap and API-free first: a deletion, an unchanged spec, a budget that
    // cannot fit whatever the target looks like.
    if exempt(route, old) {
        return (resp.into_review(), "allowed");
    }
    if let Verdict::Refuse(invalid) = judge(route, old, &Workloads(Vec::new()), &[], &[]) {
        return (refuse(resp, &invalid).into_review(), "refused");
    }
    let ns = req
        .namespace
        .clone()
        .or_else(|| route.namespace())
        .unwrap_or_default();
    let (workloads, routes, services) = match lookup(ns).await {
        Ok(v) => v,
        Err(e) => {
            // The API server is what failed, not the route: admit it, say the
            // port was not checked; the controller's condition will tell.
            tracing::warn!(error = %e, "route validation lookup failed; admitting the route");
            let why = format!(
                "the route's ports were not checked against its target ({e}); see its Accepted condition"
            );
            return (admitted_with(resp, vec![why]), "error");
        }
    };
    match judge(route, old, &workloads, &routes, &services) {
        Verdict::Refuse(invalid) => (refuse(resp, &invalid).into_review(), "refused"),
        Verdict::Allow(w) if w.is_empty() => (resp.into_review(), "allowed"),
        Verdict::Allow(w) => (admitted_with(resp, w), "warned"),
    }
}

/// A refusal the API server shows as `admission webhook "..." denied the
/// request: <reason>: <message>`, with HTTP 422 like a schema error.
fn refuse(resp: AdmissionResponse, invalid: &Invalid) -> AdmissionResponse {
    let mut r = resp.deny(format!("{}: {}", invalid.reason, invalid.message));
    r.result.code = 422;
    r.result.reason = "Invalid".into();
    r
}

/// The server side: the namespace lookup through the API.
pub async fn review_with_client(
    client: &Client,
    req: AdmissionRequest<DynamicObject>,
) -> (AdmissionReview<DynamicObject>, &'static str) {
    review(req, |ns| async move { lookup(client, &ns).await }).await
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::apps::v1::Deployment;

    use super::*;

    const WEB: &str = r#"
metadata: {name: web, namespace: shop}
spec:
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
      - {name: app, image: app, ports: [{name: http, containerPort: 8080}, {name: metrics, containerPort: 9090}]}
"#;

    fn workloads() -> Workloads {
        let d: Deployment = serde_norway::from_str(WEB).expect("deployment");
        Workloads::from_objects(&[d], &[])
    }

    fn route(name: &str, created: &str, spec: &str) -> GraceRoute {
        serde_norway::from_str(&format!(
            "apiVersion: kubegrace.io/v1alpha1\nkind: GraceRoute\nmetadata: {{name: {name}, namespace: shop, uid: u-{name}, creationTimestamp: '{created}'}}\nspec: {spec}\n"
        ))
        .expect("route")
    }

    fn review_of(op: &str, route: &GraceRoute, old: Option<&GraceRoute>) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "req-1",
                "kind": {"group": "kubegrace.io", "version": "v1alpha1", "kind": "GraceRoute"},
                "resource": {"group": "kubegrace.io", "version": "v1alpha1", "resource": "graceroutes"},
                "operation": op, "userInfo": {"username": "alice"},
                "namespace": "shop", "name": route.name_any(),
                "object": route, "oldObject": old,
            }
        }))
        .expect("json")
    }

    /// The request as the server parses it (once).
    fn req(body: &[u8]) -> AdmissionRequest<DynamicObject> {
        crate::server::check_review(body, crate::server::Endpoint::Validate, &[])
            .expect("a well-formed review")
    }

    /// Runs the handler with fixtures for the namespace; returns the JSON
    /// the API server would read and the metric outcome.
    async fn answer(body: &[u8], routes: Vec<GraceRoute>) -> (serde_json::Value, &'static str) {
        let (review, outcome) = review(req(body), |ns| async move {
            assert_eq!(ns, "shop");
            Ok((workloads(), routes, Vec::new()))
        })
        .await;
        (serde_json::to_value(&review).expect("json"), outcome)
    }

    const T0: &str = "2026-01-01T00:00:00Z";
    const T1: &str = "2026-01-02T00:00:00Z";

    #[tokio::test]
    async fn an_unknown_port_is_refused_without_naming_the_ports_the_target_has() {
        let r = route(
            "web",
            T1,
            "{targetRef: {kind: Deployment, name: web}, ports: [{name: grpc}]}",
        );
        let (out, outcome) = answer(&review_of("CREATE", &r, None), vec![]).await;
        assert_eq!(outcome, "refused");
        let resp = &out["response"];
        assert_eq!(resp["uid"], "req-1");
        assert_eq!(resp["allowed"], false);
        assert_eq!(resp["status"]["code"], 422);
        let msg = resp["status"]["message"].as_str().expect("message");
        assert!(
            msg.starts_with("UnknownPort: Deployment/web has no container port named \"grpc\";"),
            "{msg}"
        );
        // The caller named the Deployment and "grpc", nothing else.
        assert!(!msg.contains("http") && !msg.contains("metrics"), "{msg}");
    }

    #[tokio::test]
    async fn a_budget_that_cannot_fit_the_pinned_grace_period_is_refused_with_the_numbers() {
        let r = route(
            "web",
            T1,
            "{targetRef: {kind: Deployment, name: web}, ports: [{name: http}], drain: {maxDelay: 10s, timeout: 20s}, \
             routes: [{name: slow, timeout: 40s}], rollout: {terminationGracePeriodSeconds: 30}}",
        );
        // Refused before any lookup: the budget does not depend on the target.
        let (review, outcome) = review(req(&review_of("CREATE", &r, None)), |_| async {
            Err::<Namespace, _>(Error::Config("no lookup expected".into()))
        })
        .await;
        assert_eq!(outcome, "refused");
        let resp = review.response.expect("response");
        assert!(!resp.allowed);
        assert!(
            resp.result.message.contains(
                "drain.maxDelay 10s + route \"slow\" timeout 40s (longer than drain.timeout 20s) + 5s margin = 55s > 30s"
            ),
            "{}",
            resp.result.message
        );
        assert!(resp.result.message.starts_with("BudgetDoesNotFit: "));
    }

    #[tokio::test]
    async fn a_target_that_does_not_exist_yet_is_allowed_with_a_warning() {
        let r = route(
            "api",
            T1,
            "{targetRef: {kind: StatefulSet, name: api}, ports: [{name: whatever}]}",
        );
        let (out, outcome) = answer(&review_of("CREATE", &r, None), vec![]).await;
        assert_eq!(outcome, "warned");
        assert_eq!(out["response"]["allowed"], true);
        let w = out["response"]["warnings"][0].as_str().expect("warning");
        assert!(
            w.contains("StatefulSet/api does not exist in namespace shop yet"),
            "{w}"
        );
    }

    #[tokio::test]
    async fn an_overlap_with_an_older_route_is_allowed_with_a_warning_and_its_port_is_not_checked()
    {
        let older = route(
            "first",
            T0,
            "{targetRef: {kind: Deployment, name: web}, ports: [{name: http}]}",
        );
        // The newer route does not hold the target, so its (wrong) port
        // cannot hurt it: the controller would not check it either.
        let newer = route(
            "second",
            T1,
            "{selector: {matchLabels: {app: web}}, ports: [{name: grpc}]}",
        );
        let (out, outcome) = answer(&review_of("CREATE", &newer, None), vec![older]).await;
        assert_eq!(outcome, "warned", "{out}");
        let w = out["response"]["warnings"][0].as_str().expect("warning");
        // The workload was found by the selector, the older route by the
        // lookup: the review named neither.
        assert!(
            w.contains("a workload spec.selector matches is also targeted by an older GraceRoute"),
            "{w}"
        );
        assert!(!w.contains("first") && !w.contains("Deployment/web"), "{w}");
    }

    #[tokio::test]
    async fn a_valid_route_is_allowed_without_warnings() {
        let r = route(
            "web",
            T1,
            "{targetRef: {kind: Deployment, name: web}, ports: [{name: metrics}]}",
        );
        let (out, outcome) = answer(&review_of("CREATE", &r, None), vec![r.clone()]).await;
        assert_eq!(outcome, "allowed");
        assert_eq!(out["response"]["allowed"], true);
        assert!(out["response"].get("warnings").is_none(), "{out}");
    }

    #[tokio::test]
    async fn an_update_that_keeps_the_spec_or_deletes_is_never_refused() {
        // Invalid against its target (the port was renamed under it), but the
        // operator must still be able to add or drop its finalizer.
        let old = route(
            "web",
            T1,
            "{targetRef: {kind: Deployment, name: web}, ports: [{name: grpc}]}",
        );
        let mut new = old.clone();
        new.metadata.finalizers = Some(vec![crate::FINALIZER.into()]);
        let (out, outcome) = answer(&review_of("UPDATE", &new, Some(&old)), vec![]).await;
        assert_eq!(
            (outcome, &out["response"]["allowed"]),
            ("allowed", &serde_json::json!(true))
        );
        new.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::now()));
        new.spec.ports[0].name = "other".into();
        let (out, outcome) = answer(&review_of("UPDATE", &new, Some(&old)), vec![]).await;
        assert_eq!(
            (outcome, &out["response"]["allowed"]),
            ("allowed", &serde_json::json!(true))
        );
        // A spec change is judged like a create.
        let mut edited = old.clone();
        edited.spec.ports[0].name = "admin".into();
        let (out, outcome) = answer(&review_of("UPDATE", &edited, Some(&old)), vec![]).await;
        assert_eq!(outcome, "refused", "{out}");
    }

    /// A route the Rust type refuses (the schema has no bound yet) is
    /// refused with the field, and the answer carries the request's uid.
    #[tokio::test]
    async fn an_undecodable_route_is_refused_with_the_field_and_the_uid() {
        let r = route(
            "web",
            T1,
            "{targetRef: {kind: Deployment, name: web}, ports: [{name: http}]}",
        );
        let mut body: serde_json::Value =
            serde_json::from_slice(&review_of("CREATE", &r, None)).expect("json");
        body["request"]["object"]["spec"]["circuitBreaker"] =
            serde_json::json!({"consecutiveFailures": 4_294_967_296_u64});
        let body = serde_json::to_vec(&body).expect("json");
        let (out, outcome) = answer(&body, vec![]).await;
        assert_eq!(outcome, "refused");
        assert_eq!(out["response"]["uid"], "req-1");
        assert_eq!(out["response"]["allowed"], false);
        let msg = out["response"]["status"]["message"]
            .as_str()
            .expect("message");
        assert!(
            msg.starts_with("InvalidObject: the GraceRoute cannot be read by the operator: spec.circuitBreaker.consecutiveFailures: "),
            "{msg}"
        );
    }

    /// The stored (old) object does not decode: the fix must go through,
    /// and the operator's own metadata writes (finalizer release) too.
    #[tokio::test]
    async fn an_update_of_an_undecodable_stored_route_is_judged_like_a_create() {
        let good = route(
            "web",
            T1,
            "{targetRef: {kind: Deployment, name: web}, ports: [{name: http}]}",
        );
        let mut body: serde_json::Value =
            serde_json::from_slice(&review_of("UPDATE", &good, Some(&good))).expect("json");
        body["request"]["oldObject"]["spec"]["circuitBreaker"] =
            serde_json::json!({"consecutiveFailures": -1});
        let fix = serde_json::to_vec(&body).expect("json");
        let (out, outcome) = answer(&fix, vec![]).await;
        assert_eq!(
            (outcome, &out["response"]["allowed"]),
            ("allowed", &serde_json::json!(true)),
            "{out}"
        );
        // Both undecodable, same spec (a finalizer removed): allowed.
        body["request"]["object"]["spec"] = body["request"]["oldObject"]["spec"].clone();
        let release = serde_json::to_vec(&body).expect("json");
        let (out, outcome) = answer(&release, vec![]).await;
        assert_eq!(
            (outcome, &out["response"]["allowed"]),
            ("allowed", &serde_json::json!(true)),
            "{out}"
        );
    }

    #[tokio::test]
    async fn a_failed_lookup_admits_with_a_warning() {
        let r = route(
            "web",
            T1,
            "{targetRef: {kind: Deployment, name: web}, ports: [{name: grpc}]}",
        );
        let (review, outcome) = review(req(&review_of("CREATE", &r, None)), |_| async {
            Err::<Namespace, _>(Error::Config("apiserver away".into()))
        })
        .await;
        assert_eq!(outcome, "error");
        let resp = review.response.expect("response");
        assert!(resp.allowed);
        assert!(resp.warnings.expect("warning")[0].contains("apiserver away"),);
    }
}
