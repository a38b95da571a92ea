//! Step 4, apply: the only step that writes objects other than the route's
//! status. Server-side apply as `kubegrace-operator`, forced: the ConfigMap
//! (checked to be ours in validate) and the rollout fields of an explicit
//! `rollout` block. Also the route's deletion: put back what it changed.

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ObjectMeta, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Api, Client, ResourceExt};
use kubegrace_api::argo::Rollout;
use serde_json::json;

use super::build::Desired;
use super::context::{Context, Note};
use super::dereference::{ReadWorkloads as _, Workloads, claim_targets};
use super::echoes::{self, Echoes};
use crate::crd::{GraceRoute, TargetKind};
use crate::rules::Target;
use crate::{FIELD_MANAGER, RESTORE_FIELD_MANAGER};
use crate::{reasons, rules};

/// What failed in the apply step: a write to the API server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("applying {what}: {source}")]
    Apply {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("restoring {what}: {source}")]
    Restore {
        what: String,
        #[source]
        source: kube::Error,
    },
    /// Listing the workloads a deleted route may have written to.
    #[error(transparent)]
    Read(#[from] super::dereference::Error),
}

impl Error {
    /// The metric label.
    pub fn kind(&self) -> &'static str {
        "kube"
    }
}

/// Writes what [`super::build::desired`] built.
/// Each answer is remembered in `echoes`, so that its watch event does not
/// queue the route again.
pub async fn apply(
    client: &Client,
    ns: &str,
    desired: &Desired,
    echoes: &Echoes,
) -> Result<(), Error> {
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    let cm_name = desired.config_map.name_any();
    let written = Api::<ConfigMap>::namespaced(client.clone(), ns)
        .patch(&cm_name, &pp, &Patch::Apply(&desired.config_map))
        .await
        .map_err(|source| Error::Apply {
            what: format!("ConfigMap {ns}/{cm_name}"),
            source,
        })?;
    echoes.wrote(echoes::Kind::ConfigMap, &written.metadata);
    for r in &desired.rollout {
        let written = patch_workload(client, ns, r.kind, &r.name, &pp, &Patch::Apply(&r.body))
            .await
            .map_err(|source| Error::Apply {
                what: format!("rollout fields to {}/{}", r.kind, r.name),
                source,
            })?;
        echoes.wrote(echoes::Kind::from(r.kind), &written);
    }
    Ok(())
}

/// Route deleted: put back what it changed on its targets (in one write per
/// target, so pods roll at most once), then let go of the fields.
pub async fn cleanup(route: &GraceRoute, ctx: &Context) -> Result<Action, Error> {
    let client = &ctx.client;
    let ns = route.namespace().unwrap_or_default();
    let name = route.name_any();
    let (workloads, _) = Workloads::read_for(client, &ns, route).await?;
    let known = ctx.routes.in_namespace(&ns);
    let others: Vec<&GraceRoute> = known.iter().map(AsRef::as_ref).collect();
    let (held, _) = claim_targets(route, &workloads, &others);
    for (t, _) in held {
        // Only targets this route wrote to (an explicit rollout block, or a
        // pin from an earlier version): an overlapping, newer route never
        // wrote anything, and a route without rollout block wrote nothing.
        if t.recorded.is_none() && t.pinned_route() != Some(name.as_str()) {
            continue;
        }
        match restore(client, &ns, t).await {
            Ok(()) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => continue,
            Err(source) => {
                return Err(Error::Restore {
                    what: t.id(),
                    source,
                });
            }
        }
        let note = format!(
            "{} got its original rollout fields and grace period back",
            t.id()
        );
        let restored = Note::on_route(EventType::Normal, reasons::RESTORED, "Cleanup", note);
        ctx.announce(route, &[restored]).await;
    }
    Ok(Action::await_change())
}

/// Puts the originals back (merge patch, its own field manager), then
/// releases every field `kubegrace-operator` applied (an empty apply).
async fn restore(client: &Client, ns: &str, t: &Target) -> Result<(), kube::Error> {
    if let Some(p) = rules::restore_patch(t) {
        let merge = PatchParams {
            field_manager: Some(RESTORE_FIELD_MANAGER.into()),
            ..Default::default()
        };
        patch_workload(client, ns, t.kind, &t.name, &merge, &Patch::Merge(p)).await?;
    }
    let empty = json!({
        "apiVersion": t.kind.api_version(),
        "kind": t.kind.to_string(),
        "metadata": {"name": t.name},
    });
    let apply = PatchParams::apply(FIELD_MANAGER).force();
    patch_workload(client, ns, t.kind, &t.name, &apply, &Patch::Apply(empty))
        .await
        .map(drop)
}

/// One patch of a target workload, whichever its kind; the metadata the
/// API server answered with.
async fn patch_workload<P: serde::Serialize + std::fmt::Debug>(
    client: &Client,
    ns: &str,
    kind: TargetKind,
    name: &str,
    params: &PatchParams,
    patch: &Patch<P>,
) -> Result<ObjectMeta, kube::Error> {
    match kind {
        TargetKind::Deployment => Api::<Deployment>::namespaced(client.clone(), ns)
            .patch(name, params, patch)
            .await
            .map(|w| w.metadata),
        TargetKind::StatefulSet => Api::<StatefulSet>::namespaced(client.clone(), ns)
            .patch(name, params, patch)
            .await
            .map(|w| w.metadata),
        TargetKind::Rollout => Api::<Rollout>::namespaced(client.clone(), ns)
            .patch(name, params, patch)
            .await
            .map(|w| w.metadata),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::fixtures::{DEPLOYMENT, ROUTE};
    use crate::testing::{self, Handle, mock, no_more, scripted};

    const CM_PATH: &str = "/api/v1/namespaces/shop/configmaps/kubegrace-web";

    fn desired_for(route_yaml: &str) -> Desired {
        crate::controller::fixtures::pass(route_yaml).2
    }

    /// Answers the next request, which must be a forced server-side apply
    /// by `kubegrace-operator` on `path`, with `answer`; returns its body.
    async fn expect_apply(
        api: &mut Handle,
        path: &str,
        answer: serde_json::Value,
    ) -> serde_json::Value {
        let seen = testing::answer(api, &answer).await;
        assert_eq!(seen.call(), ("PATCH", path));
        assert!(
            seen.query.contains("fieldManager=kubegrace-operator")
                && seen.query.contains("force=true"),
            "{}",
            seen.query
        );
        assert_eq!(seen.content_type, "application/apply-patch+yaml");
        seen.body
    }

    #[tokio::test]
    async fn without_a_rollout_block_apply_writes_the_config_map_and_nothing_else() {
        let (client, mut api) = mock();
        let d = desired_for(ROUTE);
        let cm = serde_json::to_value(&d.config_map).expect("cm");
        let script = async move {
            let sent = expect_apply(&mut api, CM_PATH, cm.clone()).await;
            assert_eq!(sent["data"], cm["data"]);
            // No further call: the Deployment is not touched.
            no_more(&mut api).await;
        };
        scripted(script, apply(&client, "shop", &d, &Echoes::default()))
            .await
            .expect("apply succeeds");
    }

    #[tokio::test]
    async fn an_explicit_rollout_block_is_applied_to_the_target_after_the_config_map() {
        let (client, mut api) = mock();
        let d = desired_for(&format!("{ROUTE}  rollout: {{minReadySeconds: 3}}\n"));
        let mut cm = serde_json::to_value(&d.config_map).expect("cm");
        cm["metadata"]["resourceVersion"] = "41".into();
        let mut deployment: serde_json::Value =
            serde_norway::from_str(DEPLOYMENT).expect("deployment");
        deployment["metadata"]["resourceVersion"] = "42".into();
        let script = async move {
            expect_apply(&mut api, CM_PATH, cm).await;
            let path = "/apis/apps/v1/namespaces/shop/deployments/web";
            let sent = expect_apply(&mut api, path, deployment).await;
            assert_eq!(sent["spec"]["minReadySeconds"], 3);
        };
        let echoes = Echoes::default();
        scripted(script, apply(&client, "shop", &d, &echoes))
            .await
            .expect("apply succeeds");
        // Both answers are remembered, so their watch events queue nothing.
        let at = |name: &str, version: &str| ObjectMeta {
            namespace: Some("shop".into()),
            name: Some(name.into()),
            resource_version: Some(version.into()),
            ..ObjectMeta::default()
        };
        assert!(echoes.is_echo(echoes::Kind::ConfigMap, &at("kubegrace-web", "41")));
        assert!(echoes.is_echo(echoes::Kind::Deployment, &at("web", "42")));
    }
}
