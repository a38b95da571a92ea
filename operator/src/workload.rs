//! `kubectl annotate deployment web kubegrace.io/inject=enabled`: copies a
//! workload's inject annotation into its pod template (label, which the
//! webhook's objectSelector sees, and annotation). Changing the template
//! rolls the pods, so they come back with the sidecar; removing the
//! annotation removes what we copied and rolls them back out.
//!
//! Applied with its own field manager ([`crate::INJECT_FIELD_MANAGER`]):
//! an apply that no longer sends a field removes it only if we own it, so a
//! label the user put on the template themselves is never touched.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::{Controller, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::admin::Metrics;
use crate::{Error, INJECT_FIELD_MANAGER, Result, keys};

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
    fn template_meta(&self) -> Option<&ObjectMeta>;
}

impl Workload for Deployment {
    const KIND: &'static str = "Deployment";
    fn template_meta(&self) -> Option<&ObjectMeta> {
        self.spec
            .as_ref()
            .and_then(|s| s.template.metadata.as_ref())
    }
}

impl Workload for StatefulSet {
    const KIND: &'static str = "StatefulSet";
    fn template_meta(&self) -> Option<&ObjectMeta> {
        self.spec
            .as_ref()
            .and_then(|s| s.template.metadata.as_ref())
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
        "apiVersion": "apps/v1",
        "kind": K::KIND,
        "metadata": {"name": w.name_any()},
    });
    if !tpl.is_empty() {
        body["spec"] = json!({"template": {"metadata": tpl}});
    }
    // An apply without a field releases it (and removes it if only we had it).
    Some(body)
}

pub struct Context {
    pub client: Client,
    pub metrics: Arc<Metrics>,
}

async fn reconcile<K: Workload>(w: Arc<K>, ctx: Arc<Context>) -> Result<Action> {
    let start = Instant::now();
    let result = async {
        let Some(body) = desired(w.as_ref()) else {
            return Ok(Action::await_change());
        };
        let ns = w.namespace().unwrap_or_default();
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
    }
    .await;
    ctx.metrics
        .reconciled(start.elapsed(), result.as_ref().err().map(Error::kind));
    result
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
    });
    Controller::new(
        crate::scope::api::<K>(&client, namespace.as_deref()),
        watcher::Config::default(),
    )
    .graceful_shutdown_on(shutdown)
    .run(reconcile::<K>, error_policy::<K>, ctx)
    .for_each(|_| async {})
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deploy(yaml: &str) -> Deployment {
        serde_yaml::from_str(yaml).expect("deployment")
    }

    #[test]
    fn the_annotation_is_copied_into_label_and_annotation() {
        let d = deploy(
            "metadata: {name: web, annotations: {kubegrace.io/inject: enabled}}\nspec: {selector: {}, template: {}}",
        );
        let body = desired(&d).expect("needs a write");
        assert_eq!(
            body["spec"]["template"]["metadata"]["labels"][keys::INJECT],
            "enabled"
        );
        assert_eq!(
            body["spec"]["template"]["metadata"]["annotations"][keys::INJECT],
            "enabled"
        );
    }

    #[test]
    fn a_template_annotation_set_by_the_user_gets_the_label_only() {
        let d = deploy(
            "metadata: {name: web}\nspec: {selector: {}, template: {metadata: {annotations: {kubegrace.io/inject: enabled}}}}",
        );
        let body = desired(&d).expect("needs the label");
        assert_eq!(
            body["spec"]["template"]["metadata"]["labels"][keys::INJECT],
            "enabled"
        );
        assert!(
            body["spec"]["template"]["metadata"]
                .get("annotations")
                .is_none()
        );
    }

    #[test]
    fn nothing_to_do_without_annotation_or_ownership() {
        let d = deploy(
            "metadata: {name: web}\nspec: {selector: {}, template: {metadata: {labels: {kubegrace.io/inject: enabled}}}}",
        );
        // The user labelled the template themselves: not ours to remove.
        assert!(desired(&d).is_none());
    }

    #[test]
    fn removal_sends_an_empty_apply_when_we_own_the_copy() {
        let d = deploy(
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
}
