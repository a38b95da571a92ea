//! Step 3, build (pure): the objects the route wants, from what was
//! validated. The sidecar ConfigMap (owned by the route, hot-reloaded by the
//! sidecars) and, only for an explicit `rollout` block, the rollout fields of
//! each target. The pod template is never among them: the grace period
//! reaches pods through the webhook, so a GitOps re-apply changes nothing.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::ObjectMeta;
use kube::{Resource, ResourceExt};
use serde_json::Value;

use super::dereference::Observed;
use super::validate::Valid;
use crate::crd::{GraceRoute, TargetKind};
use crate::rules;
use crate::{FIELD_MANAGER, keys};

/// What failed in the build step. Validate rendered the same config, so
/// either is a bug or an object without the metadata the API server sets.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("rendering the sidecar config: {0}")]
    Render(String),
    #[error("GraceRoute {0} has no uid")]
    MissingUid(String),
}

impl Error {
    /// The metric label (the values the crate's error had for these).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Render(_) => "config",
            Self::MissingUid(_) => "missing_field",
        }
    }
}

/// What apply writes.
#[derive(Debug, Clone)]
pub struct Desired {
    pub config_map: ConfigMap,
    /// Server-side apply bodies for the targets' rollout fields.
    pub rollout: Vec<RolloutFields>,
    /// Sentences for the Accepted condition (fields left alone and why).
    pub notes: Vec<String>,
    /// The rendered config's hash (status and Events).
    pub hash: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RolloutFields {
    pub kind: TargetKind,
    pub name: String,
    pub body: Value,
}

/// Builds what the route wants (pure).
pub fn desired(route: &GraceRoute, valid: &Valid, observed: &Observed) -> Result<Desired, Error> {
    let (yaml, hash) = rules::render(&valid.config).map_err(|i| Error::Render(i.message))?;
    let name = route.name_any();
    let owner = route
        .controller_owner_ref(&())
        .ok_or_else(|| Error::MissingUid(name.clone()))?;
    let config_map = ConfigMap {
        metadata: ObjectMeta {
            name: Some(rules::config_map_name(&name)),
            namespace: route.namespace(),
            labels: Some(BTreeMap::from([
                (keys::MANAGED_BY.to_string(), FIELD_MANAGER.to_string()),
                (keys::ROUTE_LABEL.to_string(), name.clone()),
            ])),
            annotations: Some(BTreeMap::from([(
                keys::CONFIG_HASH.to_string(),
                hash.clone(),
            )])),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            kubegrace_sidecar_api::pod::CONFIG_FILE.to_string(),
            yaml,
        )])),
        ..Default::default()
    };
    let mut rollout = Vec::new();
    let mut notes = Vec::new();
    for (t, _) in &observed.targets {
        let (body, n) = rules::target_apply(route.spec.rollout.as_ref(), t);
        notes.extend(n);
        if let Some(body) = body {
            rollout.push(RolloutFields {
                kind: t.kind,
                name: t.name.clone(),
                body,
            });
        }
    }
    Ok(Desired {
        config_map,
        rollout,
        notes,
        hash,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::fixtures::{ROUTE, pass};

    #[test]
    fn without_a_rollout_block_only_the_owned_labelled_config_map_is_wanted() {
        let (_, _, d) = pass(ROUTE);
        assert!(d.rollout.is_empty(), "{:?}", d.rollout);
        let cm = &d.config_map;
        assert_eq!(cm.name_any(), "kubegrace-web");
        assert_eq!(cm.namespace().as_deref(), Some("shop"));
        assert_eq!(
            cm.labels().get(keys::ROUTE_LABEL).map(String::as_str),
            Some("web")
        );
        assert_eq!(cm.annotations().get(keys::CONFIG_HASH), Some(&d.hash));
        let owner = &cm.owner_references()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.controller),
            ("GraceRoute", Some(true))
        );
        let yaml = &cm.data.as_ref().expect("data")[kubegrace_sidecar_api::pod::CONFIG_FILE];
        assert!(yaml.contains("maxDelay: 5s"), "{yaml}");
    }

    #[test]
    fn pause_on_drain_loss_alone_writes_nothing_into_the_target() {
        // Nor takes the finalizer: that is held only for what apply wrote.
        let (r, seen, d) = pass(&format!("{ROUTE}  rollout: {{pauseOnDrainLoss: true}}\n"));
        assert!(d.rollout.is_empty(), "{:?}", d.rollout);
        assert!(!crate::controller::finalizer::wanted(&r, &seen, Some(&d)));
    }

    #[test]
    fn an_explicit_rollout_block_writes_only_its_fields_to_the_target() {
        let (_, _, d) = pass(&format!("{ROUTE}  rollout: {{minReadySeconds: 3}}\n"));
        assert_eq!(d.rollout.len(), 1);
        let body = &d.rollout[0].body;
        assert_eq!(body["spec"]["minReadySeconds"], 3);
        assert!(body["spec"].get("strategy").is_none(), "{body}");
        assert!(body["spec"].get("template").is_none(), "{body}");
    }
}
