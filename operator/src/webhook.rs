//! The sidecar-injection webhook: `POST /mutate`, served by every replica
//! (the HTTPS server, its limits and the request checks are
//! [`crate::server`]; the same server answers `POST /validate` for
//! GraceRoutes, see [`crate::route_webhook`]). Pods only, CREATE only; the
//! decision is [`decide`] (pure), the pod edit is [`crate::inject`] (pure), the answer is a JSON patch
//! from the difference.
//!
//! Most reviews are answered from watch caches without an API call; the
//! cached answer is used only when it is to inject, anything else is asked
//! of the API server ([`crate::webhook_cache`] says why).
//!
//! The webhook never fails a pod creation for its own reasons: a pod that
//! cannot be injected is admitted bare with a warning and an annotation
//! saying why, and the route reports it. That includes a pod the webhook
//! cannot decode (allowed without a patch, with a warning: the API server
//! validates pods itself, and refusing would make a kubegrace bug stop
//! every pod of the namespace), and a pod pinned to a GraceRoute the
//! operator cannot decode (admitted bare, the warning names the field). The
//! review arrives parsed once, by [`crate::server`]; the answer always
//! carries the request's uid.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Namespace, Pod, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use kube::{Api, Client, ResourceExt};
use rand::Rng;

use crate::admin::Metrics;
use crate::crd::GraceRoute;
/// Where the operator's flags go: kept under this name for the callers.
pub use crate::inject::SidecarSettings;
use crate::inject::{self, InjectPlan, Skip};
use crate::route_match;
use crate::rules::config_map_name;
use crate::tolerant::{Listed, Undecodable};
use crate::webhook_cache::{Fallback, WebhookCache};
use crate::{Error, Result, keys};

/// The object admitted unchanged, with `warnings` (each prefixed
/// `kubegrace: `, so `kubectl` users see who says it).
pub(crate) fn admitted_with(
    resp: AdmissionResponse,
    warnings: Vec<String>,
) -> AdmissionReview<DynamicObject> {
    let mut r = resp;
    r.warnings = Some(
        warnings
            .into_iter()
            .map(|w| format!("kubegrace: {w}"))
            .collect(),
    );
    r.into_review()
}

/// Requests and limits from the flags; an empty flag leaves it out.
pub fn resources(
    cpu_req: &str,
    mem_req: &str,
    cpu_lim: &str,
    mem_lim: &str,
) -> ResourceRequirements {
    let map = |pairs: [(&str, &str); 2]| {
        let m: BTreeMap<String, Quantity> = pairs
            .iter()
            .filter(|(_, v)| !v.trim().is_empty())
            .map(|(k, v)| ((*k).to_string(), Quantity(v.trim().to_string())))
            .collect();
        (!m.is_empty()).then_some(m)
    };
    ResourceRequirements {
        requests: map([("cpu", cpu_req), ("memory", mem_req)]),
        limits: map([("cpu", cpu_lim), ("memory", mem_lim)]),
        ..Default::default()
    }
}

pub use kubegrace_api::inject::supports_native;

/// The outcome for one pod.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Not asking for the sidecar, or already has it.
    Ignore,
    /// Injected; the warnings name pod annotations that were ignored (and
    /// why), for the admission response.
    Inject(Box<Pod>, Vec<String>),
    /// Asked, but cannot be injected: admitted bare, marked with the reason.
    Skip(Box<Pod>, String),
}

/// Decides and edits (pure; the token comes from the caller).
pub fn decide<R: std::borrow::Borrow<GraceRoute>>(
    pod: &Pod,
    ns_labels: &BTreeMap<String, String>,
    routes: &[R],
    s: &SidecarSettings,
    token: String,
) -> Decision {
    if inject::is_injected(pod) || !inject::wants_injection(pod, ns_labels) {
        return Decision::Ignore;
    }
    let skip =
        |why: String| Decision::Skip(Box::new(inject::mark_skipped(pod, &Skip(why.clone()))), why);
    let Some(route) = route_match::pick_route(pod, routes) else {
        return skip(match pod.annotations().get(keys::ROUTE) {
            Some(r) => format!(
                "GraceRoute {r} (from the {} annotation) does not exist",
                keys::ROUTE
            ),
            None => {
                "no GraceRoute selects this pod; create one with targetRef or selector".to_string()
            }
        });
    };
    // An invalid route has no ConfigMap and no budget: injecting would give
    // a sidecar without its config. The pod starts bare and the route says why.
    if let Some(c) = route.condition("Accepted")
        && c.status == "False"
    {
        return skip(format!(
            "GraceRoute {} is not accepted ({}): {}",
            route.name_any(),
            c.reason,
            c.message
        ));
    }
    let Some(port) = route.spec.ports.first() else {
        return skip(format!("GraceRoute {} names no port", route.name_any()));
    };
    let own = inject::overrides::read(
        pod.metadata.annotations.as_ref(),
        &s.resources,
        s.log_level.as_deref(),
    );
    let plan = InjectPlan {
        route: route.name_any(),
        config_map: config_map_name(&route.name_any()),
        port: port.name.clone(),
        sidecar: SidecarSettings {
            resources: own.resources,
            log_level: own.log_level,
            ..s.clone()
        },
        token,
        // From the spec (pure), so a pod created before the route's first
        // status write still gets the grace period its drain needs; the
        // status's when longer (a load balancer raised the route's maxDelay,
        // controller/balancer.rs).
        budget_seconds: crate::rules::budget(&route.spec)
            .ok()
            .map(|b| b.seconds)
            .max(route.status.as_ref().and_then(|st| st.budget_seconds)),
    };
    match inject::inject(pod, &plan) {
        Ok(p) => Decision::Inject(
            Box::new(p),
            own.warnings
                .into_iter()
                .map(|w| format!("kubegrace: {w}"))
                .collect(),
        ),
        Err(Skip(why)) => skip(why),
    }
}

/// A pod that wants the sidecar and is pinned to a route the operator
/// cannot decode: admitted bare, with the route's field in the reason.
fn pinned_undecodable(
    pod: &Pod,
    ns_labels: &BTreeMap<String, String>,
    undecodable: &[Undecodable],
) -> Option<Decision> {
    let pinned = pod.annotations().get(keys::ROUTE)?;
    let u = undecodable.iter().find(|u| &u.name == pinned)?;
    if inject::is_injected(pod) || !inject::wants_injection(pod, ns_labels) {
        return None;
    }
    let why = format!(
        "GraceRoute {pinned} (from the {} annotation) cannot be read by the operator: {}",
        keys::ROUTE,
        u.error
    );
    Some(Decision::Skip(
        Box::new(inject::mark_skipped(pod, &Skip(why.clone()))),
        why,
    ))
}

/// The JSON patch turning `before` into `after`.
pub fn patch_for(before: &Pod, after: &Pod) -> Result<json_patch::Patch> {
    let a = serde_json::to_value(before).map_err(Error::serde("pod"))?;
    let b = serde_json::to_value(after).map_err(Error::serde("pod"))?;
    Ok(json_patch::diff(&a, &b))
}

fn token() -> String {
    let bytes: [u8; 16] = rand::rng().random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub struct Webhook {
    pub client: Client,
    pub metrics: Arc<Metrics>,
    pub settings: SidecarSettings,
    /// The watch caches most reviews are answered from (the default has
    /// none: every review asks the API server).
    pub cache: Arc<WebhookCache>,
}

/// The decision for `pod` from the namespace's labels, routes and the
/// routes that do not decode.
fn decide_listed<R: std::borrow::Borrow<GraceRoute>>(
    pod: &Pod,
    labels: &BTreeMap<String, String>,
    (routes, undecodable): (&[R], &[Undecodable]),
    s: &SidecarSettings,
) -> Decision {
    match pinned_undecodable(pod, labels, undecodable) {
        Some(skip) => skip,
        None => decide(pod, labels, routes, s, token()),
    }
}

impl Webhook {
    /// The decision from the caches when it is to inject; otherwise why the
    /// API server must be asked. Only an injection is taken from a cache: a
    /// cache that lags behind a route or a namespace label created just
    /// before the pod must not start it bare (see [`crate::webhook_cache`]).
    fn cached_injection(&self, pod: &Pod, ns: &str) -> std::result::Result<Decision, Fallback> {
        let (labels, listed) = self.cache.lookup(ns).ok_or(Fallback::Unsynced)?;
        let listed = (listed.routes.as_slice(), listed.undecodable.as_slice());
        match decide_listed(pod, &labels, listed, &self.settings) {
            d @ Decision::Inject(..) => Ok(d),
            Decision::Ignore | Decision::Skip(..) => Err(Fallback::NotInject),
        }
    }

    /// The namespace's labels and routes from the API server. The
    /// namespace is read only when the pod leaves the answer to it (no
    /// inject label or annotation of its own), and then beside the route
    /// list, not after it: during a pod storm each API call is the
    /// webhook's largest cost, and the probe pods of `make bench-scale`
    /// that no route selects took twice the added latency of injected ones
    /// (p50 52 ms against 26) when the two calls ran in turn.
    async fn lookup(&self, pod: &Pod, ns: &str) -> Result<(BTreeMap<String, String>, Listed)> {
        let labels = async {
            if inject::own_choice(pod).is_some() {
                return Ok(BTreeMap::new());
            }
            Ok::<_, Error>(
                Api::<Namespace>::all(self.client.clone())
                    .get_opt(ns)
                    .await
                    .map_err(Error::kube(format!("reading namespace {ns}")))?
                    .map(|n| n.labels().clone())
                    .unwrap_or_default(),
            )
        };
        // One route that does not decode must not stop injection for the
        // namespace: it is left out (and named if a pod is pinned to it).
        let (labels, routes) = tokio::try_join!(labels, crate::tolerant::list(&self.client, ns))?;
        Ok((labels, routes))
    }

    /// Answers one AdmissionReview (parsed once by the server), and names
    /// the outcome for the metrics.
    pub async fn review(
        &self,
        mut req: AdmissionRequest<DynamicObject>,
    ) -> (AdmissionReview<DynamicObject>, &'static str) {
        let resp = AdmissionResponse::from(&req);
        let (Operation::Create, Some(obj)) = (&req.operation, req.object.take()) else {
            return (resp.into_review(), "ignored");
        };
        let pod: Pod = match crate::tolerant::into_typed(obj) {
            Ok(p) => p,
            Err(e) => {
                // Allowed bare (see the module doc): the API server judges
                // the pod itself.
                tracing::warn!(error = %e, "the pod does not decode; admitting it unchanged");
                let why = format!("sidecar not injected: the pod could not be read: {e}");
                return (admitted_with(resp, vec![why]), "error");
            }
        };
        let pod = &pod;
        // Cheap checks first: most pods never need the API lookups. A pod
        // that opts out itself is not injected whatever the API server says.
        if inject::is_injected(pod) || inject::own_choice(pod) == Some(false) {
            return (resp.into_review(), "ignored");
        }
        let ns = req
            .namespace
            .clone()
            .or_else(|| pod.namespace())
            .unwrap_or_default();
        let decision = match self.cached_injection(pod, &ns) {
            Ok(inject) => {
                self.metrics.lookups.cached();
                inject
            }
            Err(why) => {
                self.metrics.lookups.live(why);
                match self.lookup(pod, &ns).await {
                    Ok((labels, listed)) => {
                        let listed = (listed.routes.as_slice(), listed.undecodable.as_slice());
                        decide_listed(pod, &labels, listed, &self.settings)
                    }
                    Err(e) => {
                        // Admit bare: the route reports the pod as not injected.
                        tracing::warn!(error = %e, "webhook lookup failed; admitting the pod unchanged");
                        let why = format!("sidecar not injected: {e}");
                        return (admitted_with(resp, vec![why]), "error");
                    }
                }
            }
        };
        let (after, result, warnings) = match decision {
            Decision::Ignore => return (resp.into_review(), "ignored"),
            Decision::Inject(p, warnings) => (p, "injected", warnings),
            Decision::Skip(p, why) => (
                p,
                "skipped",
                vec![format!("kubegrace: sidecar not injected: {why}")],
            ),
        };
        let patched = patch_for(pod, &after).and_then(|p| {
            resp.clone()
                .with_patch(p)
                .map_err(|e| Error::Config(format!("serialising patch: {e}")))
        });
        match patched {
            Ok(mut r) => {
                r.warnings = (!warnings.is_empty()).then_some(warnings);
                (r.into_review(), result)
            }
            Err(e) => {
                tracing::warn!(error = %e, "building the patch; admitting the pod unchanged");
                (resp.into_review(), "error")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn settings() -> SidecarSettings {
        SidecarSettings {
            image: "sidecar:test".into(),
            pull_policy: "IfNotPresent".into(),
            resources: resources("50m", "32Mi", "", "128Mi"),
            log_level: None,
            run_as_user: Some(inject::SIDECAR_UID),
            native: true,
            ports: inject::Ports::default(),
        }
    }

    /// The pod as injected for `routes`; fails the test if it is not.
    fn injected(pod: &Pod, routes: &[GraceRoute], token: String) -> Box<Pod> {
        match decide(pod, &BTreeMap::new(), routes, &settings(), token) {
            Decision::Inject(after, _) => after,
            other => panic!("expected injection, got {other:?}"),
        }
    }

    fn grace_period(pod: &Pod) -> Option<i64> {
        pod.spec
            .as_ref()
            .and_then(|s| s.termination_grace_period_seconds)
    }

    fn route(yaml: &str) -> GraceRoute {
        serde_norway::from_str(yaml).expect("route")
    }

    const POD: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: web-1, namespace: shop, labels: {app: web, kubegrace.io/inject: enabled}, annotations: {kubegrace.io/route: web}}
spec:
  containers:
  - {name: app, image: app, ports: [{name: http, containerPort: 8080}]}
"#;

    #[test]
    fn resources_leave_out_empty_flags() {
        let r = resources("50m", "32Mi", "", "128Mi");
        assert_eq!(r.limits.as_ref().map(BTreeMap::len), Some(1));
        assert_eq!(r.requests.as_ref().map(BTreeMap::len), Some(2));
    }

    #[test]
    fn native_sidecars_from_1_33() {
        for (minor, native) in [("34", true), ("33+", true), ("32", false), ("29", false)] {
            assert_eq!(supports_native("1", minor), native, "1.{minor}");
        }
    }

    #[test]
    fn a_pinned_pod_is_injected_and_the_patch_reproduces_it() {
        let pod: Pod = serde_norway::from_str(POD).expect("pod");
        let routes = vec![route(
            "metadata: {name: web, namespace: shop}\nspec: {targetRef: {kind: Deployment, name: web}, ports: [{name: http}]}\nstatus: {budgetSeconds: 50}",
        )];
        let after = injected(&pod, &routes, "tok".into());
        assert_eq!(grace_period(&after), Some(50));
        let patch = patch_for(&pod, &after).expect("patch");
        let mut doc = serde_json::to_value(&pod).expect("json");
        json_patch::patch(&mut doc, &patch).expect("applies");
        assert_eq!(doc, serde_json::to_value(&*after).expect("json"));
        // A second call (reinvocation) changes nothing.
        assert_eq!(
            decide(
                &after,
                &BTreeMap::new(),
                &routes,
                &settings(),
                "tok2".into()
            ),
            Decision::Ignore
        );
    }

    /// A pod's own sidecar settings apply; a bad one is ignored with a
    /// warning, and the pod is still injected (never left bare for it).
    #[test]
    fn a_pods_sidecar_annotations_apply_and_bad_ones_come_back_as_warnings() {
        let pod: Pod = serde_norway::from_str(&POD.replace(
            "annotations: {kubegrace.io/route: web}",
            "annotations: {kubegrace.io/route: web, kubegrace.io/sidecar-memory-limit: 256Mi, kubegrace.io/sidecar-cpu-request: lots, kubegrace.io/sidecar-log-level: debug}",
        ))
        .expect("pod");
        let routes = vec![route(
            "metadata: {name: web, namespace: shop}\nspec: {targetRef: {kind: Deployment, name: web}, ports: [{name: http}]}",
        )];
        let Decision::Inject(after, warnings) =
            decide(&pod, &BTreeMap::new(), &routes, &settings(), "tok".into())
        else {
            panic!("expected injection");
        };
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0].contains(keys::SIDECAR_CPU_REQUEST),
            "{warnings:?}"
        );
        let sidecar = after
            .spec
            .as_ref()
            .and_then(|s| {
                s.containers
                    .iter()
                    .chain(s.init_containers.iter().flatten())
                    .find(|c| c.name == kubegrace_sidecar_api::pod::CONTAINER)
            })
            .expect("sidecar")
            .clone();
        let resources = sidecar.resources.expect("resources");
        let quantity = |m: &Option<BTreeMap<String, Quantity>>, k: &str| {
            m.as_ref().and_then(|m| m.get(k)).map(|q| q.0.clone())
        };
        assert_eq!(
            quantity(&resources.limits, "memory").as_deref(),
            Some("256Mi")
        );
        assert_eq!(quantity(&resources.requests, "cpu").as_deref(), Some("50m"));
        let log = sidecar
            .env
            .unwrap_or_default()
            .into_iter()
            .find(|e| e.name == kubegrace_sidecar_api::cli::env::LOG)
            .and_then(|e| e.value);
        assert_eq!(log.as_deref(), Some("debug"));
    }

    #[test]
    fn a_target_ref_route_finds_its_pods_by_owner_without_a_pin_in_the_template() {
        let mut pod: Pod = serde_norway::from_str(
            r#"
metadata:
  name: web-5d8f-abcde
  namespace: shop
  labels: {app: web, pod-template-hash: 5d8f, kubegrace.io/inject: enabled}
  ownerReferences: [{apiVersion: apps/v1, kind: ReplicaSet, name: web-5d8f, uid: u1}]
spec:
  terminationGracePeriodSeconds: 30
  containers:
  - {name: app, image: app, ports: [{name: http, containerPort: 8080}]}
"#,
        )
        .expect("pod");
        let routes = vec![
            route(
                "metadata: {name: other, namespace: shop}\nspec: {targetRef: {kind: Deployment, name: web-5d}, ports: [{name: http}]}",
            ),
            route(
                "metadata: {name: web, namespace: shop}\nspec: {targetRef: {kind: Deployment, name: web}, ports: [{name: http}], drain: {maxDelay: 10s, timeout: 20s}}",
            ),
        ];
        assert_eq!(
            route_match::pick_route(&pod, &routes)
                .map(ResourceExt::name_any)
                .as_deref(),
            Some("web")
        );
        // No status yet: the budget comes from the spec; 30s is raised, never lowered.
        assert_eq!(grace_period(&injected(&pod, &routes, "t".into())), Some(35));
        pod.spec
            .as_mut()
            .expect("spec")
            .termination_grace_period_seconds = Some(120);
        assert_eq!(
            grace_period(&injected(&pod, &routes, "t".into())),
            Some(120)
        );
        pod.metadata.owner_references = None;
        assert!(route_match::pick_route(&pod, &routes).is_none());
    }

    #[test]
    fn a_rollout_route_finds_its_pods_by_argos_replicaset_and_hash_label() {
        let pod = |hash_label: &str, kind: &str| -> Pod {
            serde_norway::from_str(&format!(
                r#"
metadata:
  name: web-7c9b-abcde
  namespace: shop
  labels: {{app: web, {hash_label}: 7c9b}}
  ownerReferences: [{{apiVersion: apps/v1, kind: {kind}, name: web-7c9b, uid: u1}}]
spec:
  containers:
  - {{name: app, image: app, ports: [{{name: http, containerPort: 8080}}]}}
"#
            ))
            .expect("pod")
        };
        let routes = vec![
            route(
                "metadata: {name: dep, namespace: shop}\nspec: {targetRef: {kind: Deployment, name: web}, ports: [{name: http}]}",
            ),
            route(
                "metadata: {name: argo, namespace: shop}\nspec: {targetRef: {group: argoproj.io, kind: Rollout, name: web}, ports: [{name: http}]}",
            ),
        ];
        let pick = |p: &Pod| route_match::pick_route(p, &routes).map(ResourceExt::name_any);
        // Argo's pods carry rollouts-pod-template-hash; a Deployment's
        // pod-template-hash: each goes to its own kind's route.
        assert_eq!(
            pick(&pod("rollouts-pod-template-hash", "ReplicaSet")).as_deref(),
            Some("argo")
        );
        assert_eq!(
            pick(&pod("pod-template-hash", "ReplicaSet")).as_deref(),
            Some("dep")
        );
        assert_eq!(
            pick(&pod("rollouts-pod-template-hash", "StatefulSet")),
            None
        );
    }

    #[test]
    fn a_status_budget_longer_than_the_specs_wins() {
        // The controller raised maxDelay for a load balancer (controller/balancer.rs): the
        // status carries the longer budget, and the pod must get it.
        let pod: Pod = serde_norway::from_str(POD).expect("pod");
        let status = |b: i64| {
            vec![route(&format!(
                "metadata: {{name: web, namespace: shop}}\nspec: {{targetRef: {{kind: Deployment, name: web}}, ports: [{{name: http}}]}}\nstatus: {{budgetSeconds: {b}}}"
            ))]
        };
        assert_eq!(
            grace_period(&injected(&pod, &status(155), "t".into())),
            Some(155)
        );
        // A shorter (stale) status does not lower the spec's 50s.
        assert_eq!(
            grace_period(&injected(&pod, &status(20), "t".into())),
            Some(50)
        );
    }

    #[test]
    fn without_a_route_the_pod_is_admitted_bare_and_marked() {
        let pod: Pod = serde_norway::from_str(POD).expect("pod");
        let Decision::Skip(after, why) =
            decide::<GraceRoute>(&pod, &BTreeMap::new(), &[], &settings(), "tok".into())
        else {
            panic!("expected skip");
        };
        assert!(why.contains("GraceRoute web"), "{why}");
        assert!(after.annotations().contains_key(keys::INJECT_SKIPPED));
    }

    #[test]
    fn a_route_that_is_not_accepted_injects_nothing() {
        let pod: Pod = serde_norway::from_str(POD).expect("pod");
        let routes = vec![route(
            r#"
metadata: {name: web, namespace: shop}
spec: {targetRef: {kind: Deployment, name: web}, ports: [{name: grpc}]}
status:
  conditions:
  - {type: Accepted, status: "False", reason: UnknownPort, message: no port grpc, lastTransitionTime: "2026-01-01T00:00:00Z"}
"#,
        )];
        let Decision::Skip(_, why) =
            decide(&pod, &BTreeMap::new(), &routes, &settings(), "tok".into())
        else {
            panic!("expected skip");
        };
        assert!(why.contains("not accepted (UnknownPort)"), "{why}");
    }

    #[test]
    fn selector_routes_match_by_label_oldest_first() {
        let mut pod: Pod = serde_norway::from_str(POD).expect("pod");
        pod.metadata.annotations = None;
        let routes = vec![
            route(
                "metadata: {name: b, namespace: shop, creationTimestamp: '2026-01-02T00:00:00Z'}\nspec: {selector: {matchLabels: {app: web}}, ports: [{name: http}]}",
            ),
            route(
                "metadata: {name: a, namespace: shop, creationTimestamp: '2026-01-01T00:00:00Z'}\nspec: {selector: {matchLabels: {app: web}}, ports: [{name: http}]}",
            ),
            route(
                "metadata: {name: c, namespace: shop}\nspec: {selector: {matchLabels: {app: db}}, ports: [{name: http}]}",
            ),
        ];
        assert_eq!(
            route_match::pick_route(&pod, &routes).map(ResourceExt::name_any),
            Some("a".to_string())
        );
    }

    /// Runs `review` through a webhook whose API server answers nothing:
    /// an API call times the test out.
    async fn review_without_api(
        review: &serde_json::Value,
    ) -> (AdmissionReview<DynamicObject>, &'static str) {
        let (client, _handle) = crate::testing::mock();
        let hook = Webhook {
            client,
            metrics: Arc::new(Metrics::default()),
            settings: settings(),
            cache: Arc::default(),
        };
        let req = crate::server::check_review(
            &serde_json::to_vec(review).expect("json"),
            crate::server::Endpoint::Mutate,
            &[],
        )
        .expect("a well-formed review");
        tokio::time::timeout(Duration::from_secs(1), hook.review(req))
            .await
            .expect("answered without the API server")
    }

    /// The least powerful test of "no API call for what needs none": a
    /// scripted API server that answers nothing would time the test out.
    #[tokio::test]
    async fn a_review_that_is_not_a_create_is_allowed_untouched_without_api_calls() {
        let pod: Pod = serde_norway::from_str(POD).expect("pod");
        let review = serde_json::json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "operation": "UPDATE", "userInfo": {}, "object": pod, "oldObject": pod,
                "namespace": "shop", "name": "web-1"
            }
        });
        let (out, result) = review_without_api(&review).await;
        assert_eq!(result, "ignored");
        let resp = out.response.expect("response");
        assert!(resp.allowed && resp.patch.is_none());
        assert_eq!(resp.uid, "1");
    }

    /// The pod's JSON does not fit the Rust type: admitted unchanged with
    /// the field in the warning and the request's uid, without an API call.
    #[tokio::test]
    async fn a_pod_that_does_not_decode_is_admitted_unchanged_with_its_uid() {
        let review = serde_json::json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "u-7", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "operation": "CREATE", "userInfo": {}, "namespace": "shop", "name": "p",
                "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "shop"},
                           "spec": {"containers": "not a list"}}
            }
        });
        let (out, result) = review_without_api(&review).await;
        assert_eq!(result, "error");
        let resp = out.response.expect("response");
        assert_eq!(resp.uid, "u-7");
        assert!(resp.allowed && resp.patch.is_none());
        let w = &resp.warnings.expect("warning")[0];
        assert!(w.contains("spec.containers"), "{w}");
    }

    #[test]
    fn a_pod_pinned_to_an_undecodable_route_starts_bare_with_the_field() {
        let pod: Pod = serde_norway::from_str(POD).expect("pod");
        let u = Undecodable {
            namespace: "shop".into(),
            name: "web".into(),
            error: "spec.circuitBreaker.consecutiveFailures: invalid value".into(),
        };
        let Some(Decision::Skip(after, why)) =
            pinned_undecodable(&pod, &BTreeMap::new(), std::slice::from_ref(&u))
        else {
            panic!("expected skip");
        };
        assert!(
            why.contains("GraceRoute web") && why.contains("consecutiveFailures"),
            "{why}"
        );
        assert!(after.annotations().contains_key(keys::INJECT_SKIPPED));
        // Another route's problem is not this pod's.
        let other = Undecodable {
            name: "api".into(),
            ..u
        };
        assert_eq!(pinned_undecodable(&pod, &BTreeMap::new(), &[other]), None);
    }
}
