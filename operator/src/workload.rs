//! `kubectl annotate deployment web kubegrace.io/inject=enabled`: copies a
//! workload's inject annotation into its pod template (label, which the
//! webhook's objectSelector sees, and annotation). Changing the template
//! rolls the pods, so they come back with the sidecar; removing the
//! annotation removes what we copied and rolls them back out.
//!
//! Applied with its own field manager ([`crate::INJECT_FIELD_MANAGER`]):
//! an apply that no longer sends a field removes it only if we own it, so a
//! label the user put on the template themselves is never touched.
//!
//! Turning injection on waits for an accepted GraceRoute that covers the
//! workload. Rolling earlier would be a wasted rollout: the webhook admits
//! pods without a route bare, and creating the route later does not roll
//! them again (the operator never writes the pod template for a route). So
//! "annotate, then create the route" and "create the route, then annotate"
//! both end in one rollout with the sidecar; while it waits the workload
//! gets a `WaitingForGraceRoute` Event. The route watch below brings the
//! workload back when a route appears or is accepted.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{Controller, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::admin::Metrics;
use crate::crd::{GraceRoute, TargetKind};
use crate::route_match;
use crate::{Error, INJECT_FIELD_MANAGER, Result, keys};
use kubegrace_api::argo::Rollout;

/// A workload with a pod template.
pub trait Workload:
    Resource<DynamicType = (), Scope = NamespaceResourceScope>
    + Clone
    + DeserializeOwned
    + Serialize
    + Debug
    + Send
    + Sync
    + 'static
{
    const KIND: &'static str;
    const TARGET: TargetKind;
    fn template_meta(&self) -> Option<&ObjectMeta>;
    /// Drops the pod template's spec and the status, which the inject
    /// controller never reads ([`crate::slim::workload`]).
    fn slim_template(&mut self);
    fn template_labels(&self) -> std::collections::BTreeMap<String, String> {
        self.template_meta()
            .and_then(|m| m.labels.clone())
            .unwrap_or_default()
    }
}

/// Deployments and StatefulSets keep their pod template at the same place
/// and are named alike in the API and in [`TargetKind`].
macro_rules! workload {
    ($($kind:ident),+) => {$(
        impl Workload for $kind {
            const KIND: &'static str = stringify!($kind);
            const TARGET: TargetKind = TargetKind::$kind;
            fn template_meta(&self) -> Option<&ObjectMeta> {
                self.spec
                    .as_ref()
                    .and_then(|s| s.template.metadata.as_ref())
            }
            fn slim_template(&mut self) {
                self.status = None;
                if let Some(s) = self.spec.as_mut() {
                    s.template.spec = None;
                }
            }
        }
    )+};
}

workload!(Deployment, StatefulSet);

impl Workload for Rollout {
    const KIND: &'static str = "Rollout";
    const TARGET: TargetKind = TargetKind::Rollout;
    fn template_meta(&self) -> Option<&ObjectMeta> {
        self.spec
            .template
            .as_ref()
            .and_then(|t| t.metadata.as_ref())
    }
    fn slim_template(&mut self) {
        self.status = None;
        if let Some(t) = self.spec.template.as_mut() {
            t.spec = None;
        }
    }
}

/// Whether the API server serves Argo Rollouts' `rollouts` (asked once at
/// start). Where it does not, no Rollout controller runs: a watch of a
/// resource that is not served fails and retries forever. Installing Argo
/// Rollouts later takes an operator restart for injection by annotation;
/// routes that target a Rollout find it on their next reconcile anyway.
pub async fn argo_rollouts_served(client: &Client) -> bool {
    match client
        .list_api_group_resources(&TargetKind::Rollout.api_version())
        .await
    {
        Ok(list) => list.resources.iter().any(|r| r.name == "rollouts"),
        Err(e) => {
            tracing::info!(error = %e, "Argo Rollouts is not served here: Rollouts are not watched");
            false
        }
    }
}

/// Which of the template's inject label / annotation our manager owns
/// (from managedFields).
fn owned<K: Workload>(w: &K) -> (bool, bool) {
    let mut owns = (false, false);
    for m in w.meta().managed_fields.iter().flatten() {
        if m.manager.as_deref() != Some(INJECT_FIELD_MANAGER) {
            continue;
        }
        let Some(meta) = m.fields_v1.as_ref().and_then(|f| {
            f.0.get("f:spec")?
                .get("f:template")?
                .get("f:metadata")
                .cloned()
        }) else {
            continue;
        };
        let key = format!("f:{}", keys::INJECT);
        owns.0 |= meta.get("f:labels").and_then(|l| l.get(&key)).is_some();
        owns.1 |= meta
            .get("f:annotations")
            .and_then(|a| a.get(&key))
            .is_some();
    }
    owns
}

/// The apply body we want, or None if nothing needs writing (pure).
///
/// The source of truth is the workload's annotation; failing that, a
/// template annotation the user set (not our copy), which only needs the
/// label the webhook's objectSelector sees.
pub fn desired<K: Workload>(w: &K) -> Option<Value> {
    let meta = w.template_meta();
    let label = meta
        .and_then(|m| m.labels.as_ref())
        .and_then(|l| l.get(keys::INJECT))
        .cloned();
    let ann = meta
        .and_then(|m| m.annotations.as_ref())
        .and_then(|a| a.get(keys::INJECT))
        .cloned();
    let (own_label, own_ann) = owned(w);
    let (want_label, want_ann) = match w.annotations().get(keys::INJECT) {
        Some(v) => (Some(v.clone()), Some(v.clone())),
        None => match &ann {
            Some(v) if !own_ann => (Some(v.clone()), None),
            _ => (None, None),
        },
    };
    // Up to date: every field we want is there and ours, and we own nothing else.
    let label_ok = match &want_label {
        Some(v) => label.as_ref() == Some(v) && own_label,
        None => !own_label,
    };
    let ann_ok = match &want_ann {
        Some(v) => ann.as_ref() == Some(v) && own_ann,
        None => !own_ann,
    };
    if label_ok && ann_ok {
        return None;
    }
    let mut tpl = serde_json::Map::new();
    if let Some(v) = want_label {
        tpl.insert("labels".into(), json!({keys::INJECT: v}));
    }
    if let Some(v) = want_ann {
        tpl.insert("annotations".into(), json!({keys::INJECT: v}));
    }
    let mut body = json!({
        "apiVersion": K::TARGET.api_version(),
        "kind": K::KIND,
        "metadata": {"name": w.name_any()},
    });
    if !tpl.is_empty() {
        body["spec"] = json!({"template": {"metadata": tpl}});
    }
    // An apply without a field releases it (and removes it if only we had it).
    Some(body)
}

/// Whether applying `body` would turn injection on for pods that do not
/// have it yet (the template's inject label becomes `enabled`): that write
/// rolls the pods to get the sidecar, so it waits for a route (pure).
pub fn turns_injection_on<K: Workload>(w: &K, body: &Value) -> bool {
    let now = w
        .template_meta()
        .and_then(|m| m.labels.as_ref())
        .and_then(|l| l.get(keys::INJECT))
        .map(String::as_str);
    let after = body["spec"]["template"]["metadata"]["labels"][keys::INJECT].as_str();
    after == Some("enabled") && now != Some("enabled")
}

/// The accepted route that covers `w`, if any (pure).
pub fn accepted_route<'a, K: Workload>(w: &K, routes: &'a [GraceRoute]) -> Option<&'a GraceRoute> {
    let ns = w.namespace().unwrap_or_default();
    let labels = w.template_labels();
    routes.iter().find(|r| {
        route_match::accepted(r)
            && route_match::covers_workload(r, K::TARGET, &ns, &w.name_any(), &labels)
    })
}

pub struct Context {
    pub client: Client,
    pub metrics: Arc<Metrics>,
    pub recorder: Recorder,
}

async fn reconcile<K: Workload>(w: Arc<K>, ctx: Arc<Context>) -> Result<Action> {
    let start = Instant::now();
    let pass = async {
        let Some(body) = desired(w.as_ref()) else {
            return Ok(Action::await_change());
        };
        let ns = w.namespace().unwrap_or_default();
        if turns_injection_on(w.as_ref(), &body) {
            // One route that does not decode must not hold up the others.
            let routes = crate::tolerant::list(&ctx.client, &ns).await?.routes;
            if accepted_route(w.as_ref(), &routes).is_none() {
                wait_for_route(w.as_ref(), &ctx).await;
                return Ok(Action::await_change());
            }
        }
        let api: Api<K> = Api::namespaced(ctx.client.clone(), &ns);
        api.patch(
            &w.name_any(),
            &PatchParams::apply(INJECT_FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await
        .map_err(Error::kube(format!(
            "copying {} into the pod template of {}/{}",
            keys::INJECT,
            K::KIND,
            w.name_any()
        )))?;
        tracing::info!(
            kind = K::KIND,
            namespace = %ns,
            name = %w.name_any(),
            inject = ?w.annotations().get(keys::INJECT),
            "pod template inject setting changed; pods roll"
        );
        Ok(Action::await_change())
    };
    // A panic is a bug in this pass, not the end of the operator: counted,
    // logged with the workload's name, retried by the error policy.
    let result = crate::panics::catch(pass).await.unwrap_or_else(|msg| {
        ctx.metrics.panicked("reconcile");
        tracing::error!(kind = K::KIND, namespace = w.namespace().unwrap_or_default(), name = %w.name_any(), panic = %msg, "inject propagation panicked; retried");
        Err(Error::Panic(msg))
    });
    ctx.metrics
        .reconciled(start.elapsed(), result.as_ref().err().map(Error::kind));
    result
}

/// Says on the workload why its pods do not roll yet (an Event; the route
/// watch brings the workload back).
async fn wait_for_route<K: Workload>(w: &K, ctx: &Context) {
    let note = format!(
        "{}=enabled is set, but no accepted GraceRoute targets {} {}: the pods roll to get the sidecar once one is accepted (kubectl get graceroutes -n {})",
        keys::INJECT,
        K::KIND,
        w.name_any(),
        w.namespace().unwrap_or_default(),
    );
    tracing::info!(kind = K::KIND, name = %w.name_any(), "inject waits for an accepted GraceRoute");
    let event = Event {
        type_: EventType::Normal,
        reason: "WaitingForGraceRoute".into(),
        note: Some(note),
        action: "Inject".into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, &w.object_ref(&())).await {
        // Events are for people; a failed one must not fail the reconcile.
        tracing::debug!(error = %e, "publishing event");
    }
}

fn error_policy<K: Workload>(_w: Arc<K>, err: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(error = %err, "inject propagation failed; retrying");
    Action::requeue(Duration::from_secs(10))
}

/// Runs the propagation for one workload kind until `shutdown` resolves.
pub async fn run<K: Workload>(
    client: Client,
    metrics: Arc<Metrics>,
    namespace: Option<String>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let ctx = Arc::new(Context {
        client: client.clone(),
        metrics,
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: INJECT_FIELD_MANAGER.into(),
                instance: None,
            },
        ),
    });
    // The store keeps what this controller reads of each workload, not
    // the whole object (crate::slim).
    let (trigger, workloads) = crate::slim::reflect(
        crate::scope::api::<K>(&client, namespace.as_deref()),
        watcher::Config::default(),
        (),
        crate::slim::workload::<K>,
        |_| {},
    );
    let controller = Controller::for_stream(trigger, workloads.clone());
    controller
        // A route that appears or is accepted releases the workloads it covers.
        // Watched as dynamic objects: a typed watch fails as a whole on
        // one route that does not decode. That one releases nothing (its
        // own reconcile reports it).
        .watches_with(
            crate::tolerant::api(&client, namespace.as_deref()),
            crate::tolerant::api_resource(),
            watcher::Config::default(),
            move |obj| {
                let Ok(route) = crate::tolerant::decode(&obj) else {
                    return Vec::new();
                };
                let ns = route.namespace().unwrap_or_default();
                workloads
                    .state()
                    .iter()
                    .filter(|w| {
                        route_match::covers_workload(
                            &route,
                            K::TARGET,
                            &ns,
                            &w.name_any(),
                            &w.template_labels(),
                        )
                    })
                    .map(|w| ObjectRef::from_obj(w.as_ref()))
                    .collect::<Vec<_>>()
            },
        )
        .graceful_shutdown_on(shutdown)
        .run(reconcile::<K>, error_policy::<K>, ctx)
        .for_each(|_| async {})
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::yaml;

    /// The pod template's metadata in an apply body.
    fn template_meta(body: &serde_json::Value) -> &serde_json::Value {
        &body["spec"]["template"]["metadata"]
    }

    #[test]
    fn the_annotation_is_copied_into_label_and_annotation() {
        let d = yaml::<Deployment>(
            "metadata: {name: web, annotations: {kubegrace.io/inject: enabled}}\nspec: {selector: {}, template: {}}",
        );
        let body = desired(&d).expect("needs a write");
        assert_eq!(template_meta(&body)["labels"][keys::INJECT], "enabled");
        assert_eq!(template_meta(&body)["annotations"][keys::INJECT], "enabled");
    }

    #[test]
    fn a_template_annotation_set_by_the_user_gets_the_label_only() {
        let d = yaml::<Deployment>(
            "metadata: {name: web}\nspec: {selector: {}, template: {metadata: {annotations: {kubegrace.io/inject: enabled}}}}",
        );
        let body = desired(&d).expect("needs the label");
        assert_eq!(template_meta(&body)["labels"][keys::INJECT], "enabled");
        assert!(template_meta(&body).get("annotations").is_none());
    }

    #[test]
    fn nothing_to_do_without_annotation_or_ownership() {
        let d = yaml::<Deployment>(
            "metadata: {name: web}\nspec: {selector: {}, template: {metadata: {labels: {kubegrace.io/inject: enabled}}}}",
        );
        // The user labelled the template themselves: not ours to remove.
        assert!(desired(&d).is_none());
    }

    #[test]
    fn removal_sends_an_empty_apply_when_we_own_the_copy() {
        let d = yaml::<Deployment>(
            r#"
metadata:
  name: web
  managedFields:
  - manager: kubegrace-operator-inject
    operation: Apply
    fieldsType: FieldsV1
    fieldsV1: {"f:spec": {"f:template": {"f:metadata": {"f:labels": {"f:kubegrace.io/inject": {}}}}}}
spec: {selector: {}, template: {metadata: {labels: {kubegrace.io/inject: enabled}}}}
"#,
        );
        let body = desired(&d).expect("release");
        assert!(body.get("spec").is_none());
    }

    fn route(yaml: &str) -> GraceRoute {
        serde_norway::from_str(yaml).expect("route")
    }

    const ACCEPTED_WEB: &str = r#"
apiVersion: kubegrace.io/v1alpha1
kind: GraceRoute
metadata: {name: web, namespace: shop}
spec: {targetRef: {kind: Deployment, name: web}, ports: [{name: http}]}
status: {conditions: [{type: Accepted, status: "True", reason: Valid, message: "", lastTransitionTime: "2026-01-01T00:00:00Z"}]}
"#;

    #[test]
    fn turning_injection_on_waits_for_an_accepted_route_covering_the_workload() {
        let d = yaml::<Deployment>(
            "metadata: {name: web, namespace: shop, annotations: {kubegrace.io/inject: enabled}}\nspec: {selector: {}, template: {}}",
        );
        let body = desired(&d).expect("needs a write");
        assert!(turns_injection_on(&d, &body));
        // No route, a route for another workload, a route not yet accepted: wait.
        assert!(accepted_route(&d, &[]).is_none());
        let other = route(&ACCEPTED_WEB.replace("name: web}, ports", "name: api}, ports"));
        assert!(accepted_route(&d, &[other]).is_none());
        let pending = route(&ACCEPTED_WEB.replace("status: \"True\"", "status: \"False\""));
        assert!(accepted_route(&d, &[pending]).is_none());
        let elsewhere = route(&ACCEPTED_WEB.replace("namespace: shop", "namespace: other"));
        assert!(accepted_route(&d, &[elsewhere]).is_none());
        // The accepted route for it releases the write.
        let ok = route(ACCEPTED_WEB);
        assert_eq!(
            accepted_route(&d, std::slice::from_ref(&ok)).map(ResourceExt::name_any),
            Some("web".to_string())
        );
        // A selector route matching the template's labels counts too.
        let by_labels = route(&ACCEPTED_WEB.replace(
            "targetRef: {kind: Deployment, name: web}",
            "selector: {matchLabels: {app: web}}",
        ));
        let labelled = yaml::<Deployment>(
            "metadata: {name: web, namespace: shop, annotations: {kubegrace.io/inject: enabled}}\nspec: {selector: {}, template: {metadata: {labels: {app: web}}}}",
        );
        assert!(accepted_route(&labelled, &[by_labels]).is_some());
    }

    #[test]
    fn turning_injection_off_or_adopting_a_users_label_does_not_wait() {
        // Disabling rolls the sidecar out: never gated on a route.
        let off = yaml::<Deployment>(
            "metadata: {name: web, annotations: {kubegrace.io/inject: disabled}}\nspec: {selector: {}, template: {}}",
        );
        let body = desired(&off).expect("needs a write");
        assert!(!turns_injection_on(&off, &body));
        // The template already asks for the sidecar: the pods have what they asked for.
        let on = yaml::<Deployment>(
            "metadata: {name: web, annotations: {kubegrace.io/inject: enabled}}\nspec: {selector: {}, template: {metadata: {labels: {kubegrace.io/inject: enabled}}}}",
        );
        let body = desired(&on).expect("needs ownership");
        assert!(!turns_injection_on(&on, &body));
    }
}
