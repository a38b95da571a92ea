//! Argo Rollouts in the cluster tests: the real controller (v1.10.1, built from source by
//! `e2e/argo/build`) installed by `e2e/argo/up`, the two Rollouts a test rolls (a canary
//! and a blue-green one), a change of pod template that starts a new revision, and a
//! bounded wait until a Rollout is Healthy at its newest revision.
//!
//! The pod template is the caller's ([`demo_pod_template`] is the demo app's), so a test
//! can put kubegrace's inject label or annotation on it; the Rollout selects on
//! `app=<name>` and adds that label to the template when it lacks it.

use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail, ensure};
use k8s_openapi::api::core::v1::Service;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use super::manifests::demo_container;
use super::{Patience, Progress};

/// The Rollout's annotation that counts its revisions (1 for the first template).
pub const REVISION_ANNOTATION: &str = "rollout.argoproj.io/revision";
/// The pod template annotation [`trigger_new_revision`] changes.
pub const RESTART_ANNOTATION: &str = "kubegrace.io/e2e-revision";
/// The label Argo Rollouts puts on a revision's pods and adds to the active/preview
/// (and stable/canary) Services' selectors.
pub const POD_TEMPLATE_HASH_LABEL: &str = "rollouts-pod-template-hash";
/// The canary's steps: half the pods on the new template, a pause, then the rest.
pub const CANARY_STEPS: usize = 2;
/// At most this many pods a Rollout here may ask for (the cluster is one node, two cores).
pub const MAX_REPLICAS: i32 = 10;

/// How long `e2e/argo/up` may take: a cold build of the controller is about 5.5 minutes
/// on two cores, and it may first wait for another build or another `up`.
const UP_TIMEOUT: Duration = Duration::from_secs(20 * 60);
/// How many lines of `e2e/argo/up`'s output an error quotes.
const UP_ERROR_LINES: usize = 40;

/// Runs `e2e/argo/up` (build or reuse the controller, import its image, apply the CRDs and
/// the controller, wait until it works) against the cluster under test
/// ([`crate::kubeconfig_path`]). Idempotent and quick when everything is in place.
/// The error quotes the end of the script's output, which says what failed.
pub async fn ensure_argo_rollouts() -> Result<()> {
    let script = crate::repo_path("e2e/argo/up");
    let kubeconfig = crate::kubeconfig_path()
        .context("no kubeconfig for e2e/argo/up (KUBEGRACE_E2E_KUBECONFIG)")?;
    let mut cmd = tokio::process::Command::new(&script);
    cmd.env("KUBEGRACE_E2E_KUBECONFIG", &kubeconfig)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let out = tokio::time::timeout(UP_TIMEOUT, cmd.output())
        .await
        .map_err(|_| anyhow!("e2e/argo/up took longer than {UP_TIMEOUT:?}"))?
        .with_context(|| format!("running {}", script.display()))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Through eprint!, so the test harness captures it with the test's own output.
    eprint!("{stderr}");
    ensure!(
        out.status.success(),
        "e2e/argo/up failed ({}); its last lines:\n{}",
        out.status,
        last_lines(&stderr, UP_ERROR_LINES)
    );
    Ok(())
}

fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Rollouts (`argoproj.io/v1alpha1`) in namespace `ns`.
pub fn rollout_api(client: &Client, ns: &str) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("argoproj.io", "v1alpha1", "Rollout"),
        "rollouts",
    );
    Api::namespaced_with(client.clone(), ns, &ar)
}

/// The demo app's pod template for a Rollout named `name`: label `app=<name>`, the demo
/// container ([`demo_container`]) with small requests, no service account token.
pub fn demo_pod_template(name: &str) -> Value {
    let mut app = demo_container();
    app["resources"] = json!({"requests": {"cpu": "20m", "memory": "16Mi"}});
    json!({
        "metadata": {"labels": {"app": name}},
        "spec": {"automountServiceAccountToken": false, "containers": [app]},
    })
}

/// How a Rollout replaces its pods.
#[derive(Clone, Debug)]
pub enum Strategy {
    /// `setWeight: 50`, `pause: 5s`, then the rest ([`CANARY_STEPS`] steps). Without
    /// traffic routing the weight is the share of pods; the Services, when given, get
    /// their selectors narrowed to the stable and the canary pods.
    Canary {
        stable_service: Option<String>,
        canary_service: Option<String>,
    },
    /// New pods behind `preview_service` first; once they are all available the
    /// controller promotes them on its own (`autoPromotionEnabled: true`) by switching
    /// `active_service`'s selector to them.
    BlueGreen {
        active_service: String,
        preview_service: String,
    },
}

impl Strategy {
    fn spec(&self) -> Value {
        match self {
            Strategy::Canary {
                stable_service,
                canary_service,
            } => {
                let mut canary = json!({
                    "steps": [{"setWeight": 50}, {"pause": {"duration": "5s"}}],
                });
                if let Some(s) = stable_service {
                    canary["stableService"] = json!(s);
                }
                if let Some(s) = canary_service {
                    canary["canaryService"] = json!(s);
                }
                json!({ "canary": canary })
            }
            Strategy::BlueGreen {
                active_service,
                preview_service,
            } => json!({"blueGreen": {
                "activeService": active_service,
                "previewService": preview_service,
                "autoPromotionEnabled": true,
            }}),
        }
    }
}

/// Rollout `name` in `ns` with `replicas` pods (1 to [`MAX_REPLICAS`]) of `template` (a
/// pod template: `metadata` and `spec`), selecting `app=<name>` (added to the template's
/// labels), replaced as `strategy` says.
pub fn rollout(
    ns: &str,
    name: &str,
    replicas: i32,
    mut template: Value,
    strategy: &Strategy,
) -> Result<DynamicObject> {
    ensure!(
        (1..=MAX_REPLICAS).contains(&replicas),
        "a Rollout here has 1 to {MAX_REPLICAS} replicas, not {replicas}"
    );
    ensure!(
        template.get("spec").is_some_and(Value::is_object),
        "the pod template of Rollout {name} has no spec object"
    );
    let labels = template
        .as_object_mut()
        .ok_or_else(|| anyhow!("the pod template of Rollout {name} is not an object"))?
        .entry("metadata")
        .or_insert_with(|| json!({}))
        .as_object_mut()
        .ok_or_else(|| anyhow!("the pod template's metadata of Rollout {name} is not an object"))?
        .entry("labels")
        .or_insert_with(|| json!({}));
    let labels = labels
        .as_object_mut()
        .ok_or_else(|| anyhow!("the pod template's labels of Rollout {name} are not an object"))?;
    labels.insert("app".into(), json!(name));
    Ok(serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": name}},
        "spec": {
            "replicas": replicas,
            "revisionHistoryLimit": 2,
            "selector": {"matchLabels": {"app": name}},
            "template": template,
            "strategy": strategy.spec(),
        },
    }))?)
}

/// [`rollout`] with [`Strategy::Canary`] and no Services.
pub fn canary_rollout(
    ns: &str,
    name: &str,
    replicas: i32,
    template: Value,
) -> Result<DynamicObject> {
    let strategy = Strategy::Canary {
        stable_service: None,
        canary_service: None,
    };
    rollout(ns, name, replicas, template, &strategy)
}

/// [`rollout`] with [`Strategy::BlueGreen`]; both Services must exist (see
/// [`rollout_service`]) before the controller can roll.
pub fn blue_green_rollout(
    ns: &str,
    name: &str,
    replicas: i32,
    template: Value,
    active_service: &str,
    preview_service: &str,
) -> Result<DynamicObject> {
    let strategy = Strategy::BlueGreen {
        active_service: active_service.into(),
        preview_service: preview_service.into(),
    };
    rollout(ns, name, replicas, template, &strategy)
}

/// ClusterIP Service `name` in `ns` on port 80 in front of the pods labelled `app=<app>`
/// (port `http`); Argo Rollouts narrows its selector to one revision's pods.
pub fn rollout_service(ns: &str, name: &str, app: &str) -> Result<Service> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns},
        "spec": {"selector": {"app": app},
                 "ports": [{"name": "http", "port": 80, "targetPort": "http"}]},
    }))?)
}

/// Changes Rollout `name`'s pod template (annotation [`RESTART_ANNOTATION`] set to
/// `marker`), which starts a new revision. (`kubectl argo rollouts restart` would not: it
/// re-creates the pods of the same revision.)
pub async fn trigger_new_revision(
    api: &Api<DynamicObject>,
    name: &str,
    marker: &str,
) -> Result<()> {
    let patch =
        json!({"spec": {"template": {"metadata": {"annotations": {RESTART_ANNOTATION: marker}}}}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("patching the pod template of Rollout {name}"))?;
    Ok(())
}

/// What a Rollout's status says, the fields a test waits on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RolloutState {
    pub generation: i64,
    /// A string in Argo's status (`"3"`).
    pub observed_generation: String,
    pub phase: String,
    pub message: String,
    /// [`REVISION_ANNOTATION`], 0 while the controller has not written it.
    pub revision: u64,
    /// The hash of the newest pod template, and of the ReplicaSet that is fully rolled out.
    pub current_pod_hash: String,
    pub stable_rs: String,
    /// Blue-green only: the pod hash the active Service selects (empty for a canary).
    pub active_selector: String,
    pub current_step_index: Option<i64>,
    pub replicas: i64,
    pub updated_replicas: i64,
    pub available_replicas: i64,
}

impl RolloutState {
    pub fn of(ro: &DynamicObject) -> RolloutState {
        let status = &ro.data["status"];
        let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
        let count = |v: &Value| v.as_i64().unwrap_or(0);
        RolloutState {
            generation: ro.metadata.generation.unwrap_or(0),
            observed_generation: text(&status["observedGeneration"]),
            phase: text(&status["phase"]),
            message: text(&status["message"]),
            revision: ro
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(REVISION_ANNOTATION))
                .and_then(|r| r.parse().ok())
                .unwrap_or(0),
            current_pod_hash: text(&status["currentPodHash"]),
            stable_rs: text(&status["stableRS"]),
            active_selector: text(&status["blueGreen"]["activeSelector"]),
            current_step_index: status["currentStepIndex"].as_i64(),
            replicas: count(&status["replicas"]),
            updated_replicas: count(&status["updatedReplicas"]),
            available_replicas: count(&status["availableReplicas"]),
        }
    }

    /// `Ok` when the controller has seen the newest spec (observedGeneration), calls the
    /// Rollout Healthy, the newest pod template is the stable one, it is at least at
    /// `min_revision`, and (blue-green) the active Service selects it; else what is missing.
    pub fn healthy_at_newest(&self, min_revision: u64, blue_green: bool) -> Result<(), String> {
        let seen = self.observed_generation == self.generation.to_string();
        let promoted = !self.current_pod_hash.is_empty() && self.stable_rs == self.current_pod_hash;
        let active = !blue_green || self.active_selector == self.current_pod_hash;
        if seen && self.phase == "Healthy" && promoted && active && self.revision >= min_revision {
            return Ok(());
        }
        Err(format!(
            "phase {:?} message {:?}, generation {} observed {:?}, revision {} (want >= {min_revision}), \
             pod hash {:?} stable {:?}{}, replicas {} updated {} available {}, step {:?}",
            self.phase,
            self.message,
            self.generation,
            self.observed_generation,
            self.revision,
            self.current_pod_hash,
            self.stable_rs,
            if blue_green {
                format!(" active {:?}", self.active_selector)
            } else {
                String::new()
            },
            self.replicas,
            self.updated_replicas,
            self.available_replicas,
            self.current_step_index,
        ))
    }
}

/// Waits (polling, at most `timeout`) until Rollout `name` is Healthy at its newest
/// revision and that revision is at least `min_revision`
/// ([`RolloutState::healthy_at_newest`]); on timeout the error carries the last
/// phase, message and counts seen.
pub async fn wait_healthy(
    api: &Api<DynamicObject>,
    name: &str,
    min_revision: u64,
    timeout: Duration,
    p: &Progress,
) -> Result<RolloutState> {
    let patience = Patience::new(timeout, Duration::from_millis(500));
    let what = format!("Rollout {name} Healthy at revision >= {min_revision}");
    p.wait(&what, patience, || async {
        let ro = api
            .get(name)
            .await
            .map_err(|e| format!("reading Rollout {name}: {e}"))?;
        let blue_green = ro.data["spec"]["strategy"].get("blueGreen").is_some();
        let state = RolloutState::of(&ro);
        state.healthy_at_newest(min_revision, blue_green)?;
        Ok(state)
    })
    .await
}

/// The pod hash Service `name`'s selector narrows to ([`POD_TEMPLATE_HASH_LABEL`]);
/// an error when it has none (the controller has not taken the Service over).
pub async fn service_pod_hash(client: &Client, ns: &str, name: &str) -> Result<String> {
    let svc = Api::<Service>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .with_context(|| format!("reading Service {name}"))?;
    match svc
        .spec
        .and_then(|s| s.selector)
        .and_then(|s| s.get(POD_TEMPLATE_HASH_LABEL).cloned())
    {
        Some(hash) => Ok(hash),
        None => bail!("Service {name} has no {POD_TEMPLATE_HASH_LABEL} in its selector"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(
        phase: &str,
        generation: i64,
        observed: &str,
        hash: &str,
        stable: &str,
    ) -> RolloutState {
        RolloutState {
            generation,
            observed_generation: observed.into(),
            phase: phase.into(),
            revision: 2,
            current_pod_hash: hash.into(),
            stable_rs: stable.into(),
            ..Default::default()
        }
    }

    #[test]
    fn healthy_needs_the_newest_generation_promoted() {
        // (phase, observed generation, current hash, stable hash, min revision, healthy)
        let cases = [
            ("Healthy", "3", "b", "b", 2, true),
            // The controller has not seen the new template yet: its phase is the old one's.
            ("Healthy", "2", "b", "b", 2, false),
            // Seen but the new ReplicaSet is not the stable one yet.
            ("Healthy", "3", "c", "b", 2, false),
            ("Paused", "3", "b", "b", 2, false),
            ("Healthy", "3", "", "", 0, false),
            // An older revision than asked for.
            ("Healthy", "3", "b", "b", 3, false),
        ];
        for (phase, seen, current, stable, min_revision, healthy) in cases {
            let got = state(phase, 3, seen, current, stable).healthy_at_newest(min_revision, false);
            assert_eq!(
                got.is_ok(),
                healthy,
                "{phase} {seen} {current} {stable} {min_revision}: {got:?}"
            );
        }
    }

    #[test]
    fn blue_green_needs_the_active_service_on_the_newest_pods() {
        let mut s = state("Healthy", 3, "3", "b", "b");
        s.active_selector = "a".into();
        let Err(err) = s.healthy_at_newest(2, true) else {
            panic!("healthy while the active Service selects the old pods");
        };
        assert!(err.contains("active \"a\""), "{err}");
        s.active_selector = "b".into();
        assert!(s.healthy_at_newest(2, true).is_ok());
    }

    #[test]
    fn a_template_gets_the_selector_label_and_bounds_hold() -> Result<()> {
        let template = json!({"metadata": {"labels": {"kubegrace.io/inject": "enabled"}},
                              "spec": {"containers": []}});
        let ro = canary_rollout("ns", "web", 2, template)?;
        let labels = &ro.data["spec"]["template"]["metadata"]["labels"];
        assert_eq!(labels["app"], "web");
        assert_eq!(labels["kubegrace.io/inject"], "enabled");
        assert_eq!(
            ro.data["spec"]["strategy"]["canary"]["steps"]
                .as_array()
                .map(Vec::len),
            Some(CANARY_STEPS)
        );
        let bg = blue_green_rollout(
            "ns",
            "web",
            MAX_REPLICAS,
            demo_pod_template("web"),
            "a",
            "p",
        )?;
        assert_eq!(
            bg.data["spec"]["strategy"]["blueGreen"]["autoPromotionEnabled"],
            true
        );
        for bad in [0, -1, MAX_REPLICAS + 1, i32::MAX] {
            assert!(
                canary_rollout("ns", "web", bad, demo_pod_template("web")).is_err(),
                "{bad}"
            );
        }
        assert!(canary_rollout("ns", "web", 1, json!({"metadata": {}})).is_err());
        assert!(
            canary_rollout(
                "ns",
                "web",
                1,
                json!({"metadata": {"labels": []}, "spec": {}})
            )
            .is_err()
        );
        Ok(())
    }
}
