//! The workload a scenario rolls: a Deployment (the default) or an Argo Rollouts `Rollout`
//! (canary or blue-green), so the same deploy, settle and roll-under-load steps prove
//! kubegrace on both. Each step asks the scenario's [`Workload`] for the three things that
//! differ: how the object is created, how it is changed, and when it is rolled out.

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::Service;
use kube::Api;
use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
use kubegrace_api::argo::Rollout;
use serde_json::{Value, json};

use super::status::rolled_out;
use super::{Scenario, argo, deployment, service};
use kubegrace_sidecar_api::keys;

/// How the scenario's app is rolled out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    Deployment,
    /// An Argo Rollouts `Rollout` with this strategy (Argo Rollouts must be installed:
    /// `e2e/argo/up`).
    Rollout(ArgoStrategy),
}

/// The two strategies of Argo Rollouts, as a user with no traffic router writes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgoStrategy {
    /// Half the pods at the new revision, a short pause, then the rest: old pods go as the
    /// canary grows, the way a Deployment's surge replaces them.
    Canary,
    /// A full preview set, promoted at once (the active Service's selector moves to the
    /// new pods), the old set scaled away a few seconds later.
    BlueGreen,
}

/// Seconds a blue-green Rollout keeps its old set after the switch: Argo's default (30)
/// would only lengthen the run; a few seconds still let kube-proxy move first, as in
/// production.
pub const SCALE_DOWN_DELAY_S: i64 = 5;

impl Workload {
    /// What a step prints: `Deployment` or `Rollout (canary)`.
    pub fn describe(self) -> &'static str {
        match self {
            Workload::Deployment => "Deployment",
            Workload::Rollout(ArgoStrategy::Canary) => "Rollout (canary)",
            Workload::Rollout(ArgoStrategy::BlueGreen) => "Rollout (blue-green)",
        }
    }

    /// The `targetRef` of a GraceRoute for workload `name`.
    pub fn target_ref(self, name: &str) -> Value {
        match self {
            Workload::Deployment => json!({"kind": "Deployment", "name": name}),
            Workload::Rollout(_) => {
                json!({"group": "argoproj.io", "kind": "Rollout", "name": name})
            }
        }
    }
}

/// Rollout `name` in `ns`: the demo app's pod template ([`argo::demo_pod_template`]),
/// `strategy` as [`argo::Strategy`] writes it; its active (and, for blue-green, preview
/// `<name>-preview`) Service is `name`'s. Annotated `kubegrace.io/inject=enabled` iff
/// `kubegrace`.
pub fn argo_rollout(
    ns: &str,
    name: &str,
    replicas: i32,
    kubegrace: bool,
    strategy: ArgoStrategy,
) -> Result<DynamicObject> {
    let spec = match strategy {
        ArgoStrategy::Canary => argo::Strategy::Canary {
            stable_service: None,
            canary_service: None,
        },
        ArgoStrategy::BlueGreen => argo::Strategy::BlueGreen {
            active_service: name.into(),
            preview_service: preview_service(name),
        },
    };
    let mut r = argo::rollout(ns, name, replicas, argo::demo_pod_template(name), &spec)?;
    if strategy == ArgoStrategy::BlueGreen {
        r.data["spec"]["strategy"]["blueGreen"]["scaleDownDelaySeconds"] =
            json!(SCALE_DOWN_DELAY_S);
    }
    if kubegrace {
        // What a user types: `kubectl annotate rollout demo-with kubegrace.io/inject=enabled`.
        r.metadata.annotations = Some([(keys::INJECT.to_string(), "enabled".to_string())].into());
    }
    Ok(r)
}

/// The blue-green preview Service of Rollout `name`.
pub fn preview_service(name: &str) -> String {
    format!("{name}-preview")
}

impl Scenario {
    /// Creates workload `name` of this scenario's kind and its Service(s), the Services
    /// first: a blue-green Rollout whose Services do not exist yet is `Degraded`
    /// (InvalidSpec) until they do.
    pub(super) async fn create_workload(&self, name: &str, kubegrace: bool) -> Result<()> {
        let post = PostParams::default();
        let services: Api<Service> = Api::namespaced(self.client.clone(), &self.namespace);
        services
            .create(&post, &service(name)?)
            .await
            .with_context(|| format!("creating Service {name}"))?;
        let replicas = self.opts.replicas;
        // Off the load's node when the cluster has several (a no-op on one node).
        let affinity = self.placement().await?.map(|pl| pl.app_affinity());
        match self.workload {
            Workload::Deployment => {
                let mut d = deployment(name, replicas, kubegrace)?;
                if let Some(pod) = d.spec.as_mut().and_then(|s| s.template.spec.as_mut()) {
                    pod.affinity.clone_from(&affinity);
                }
                self.deployments()
                    .create(&post, &d)
                    .await
                    .with_context(|| format!("creating Deployment {name}"))?;
            }
            Workload::Rollout(strategy) => {
                if strategy == ArgoStrategy::BlueGreen {
                    let mut preview = service(name)?;
                    preview.metadata.name = Some(preview_service(name));
                    services
                        .create(&post, &preview)
                        .await
                        .with_context(|| format!("creating Service {}", preview_service(name)))?;
                }
                let mut r = argo_rollout(&self.namespace, name, replicas, kubegrace, strategy)?;
                if let Some(a) = &affinity {
                    r.data["spec"]["template"]["spec"]["affinity"] = serde_json::to_value(a)?;
                }
                argo::rollout_api(&self.client, &self.namespace)
                    .create(&post, &r)
                    .await
                    .with_context(|| {
                        format!(
                            "creating Rollout {name}: is Argo Rollouts installed (e2e/argo/up)?"
                        )
                    })?;
            }
        }
        Ok(())
    }

    /// The workload's `metadata.generation`.
    pub(super) async fn workload_generation(&self, name: &str) -> Result<i64> {
        let generation = match self.workload {
            Workload::Deployment => self.deployments().get(name).await?.metadata.generation,
            Workload::Rollout(_) => self.rollouts().get(name).await?.metadata.generation,
        };
        Ok(generation.unwrap_or(0))
    }

    /// A merge patch of the workload (`kubectl patch --type merge`).
    pub(super) async fn patch_workload(&self, name: &str, patch: &Value) -> Result<()> {
        let pp = PatchParams::default();
        let kind = self.workload.describe();
        match self.workload {
            Workload::Deployment => self
                .deployments()
                .patch(name, &pp, &Patch::Merge(patch))
                .await
                .map(drop),
            Workload::Rollout(_) => argo::rollout_api(&self.client, &self.namespace)
                .patch(name, &pp, &Patch::Merge(patch))
                .await
                .map(drop),
        }
        .with_context(|| format!("patching {kind} {name}"))
    }

    /// Ok when workload `name` is rolled out at its newest spec, else what is missing (for
    /// a wait).
    pub(super) async fn workload_rolled_out(&self, name: &str) -> Result<(), String> {
        match self.workload {
            Workload::Deployment => {
                let d = self
                    .deployments()
                    .get(name)
                    .await
                    .map_err(|e| e.to_string())?;
                rolled_out(&d)
            }
            Workload::Rollout(_) => {
                let r = self.rollouts().get(name).await.map_err(|e| e.to_string())?;
                kubegrace_api::argo::rolled_out(&r)
            }
        }
    }

    fn rollouts(&self) -> Api<Rollout> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rollout_manifest_keeps_the_demo_template_and_names_its_services() {
        let r =
            argo_rollout("ns", "demo-with", 3, true, ArgoStrategy::BlueGreen).expect("manifest");
        assert_eq!(
            r.data["spec"]["strategy"]["blueGreen"]["activeService"],
            "demo-with"
        );
        assert_eq!(
            r.data["spec"]["strategy"]["blueGreen"]["previewService"],
            "demo-with-preview"
        );
        assert_eq!(
            r.data["spec"]["selector"]["matchLabels"]["app"],
            "demo-with"
        );
        assert_eq!(
            r.data["spec"]["template"]["spec"]["containers"][0]["name"],
            "app"
        );
        assert!(r.metadata.annotations.is_some(), "the inject annotation");
        assert_eq!(
            r.data["spec"]["strategy"]["blueGreen"]["scaleDownDelaySeconds"],
            SCALE_DOWN_DELAY_S
        );
        let c =
            argo_rollout("ns", "demo-without", 3, false, ArgoStrategy::Canary).expect("manifest");
        assert!(c.data["spec"]["strategy"]["canary"]["steps"].is_array());
        assert!(c.metadata.annotations.is_none());
    }
}
