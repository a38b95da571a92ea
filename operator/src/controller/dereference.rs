//! Step 1, dereference: everything the route refers to, read from the API
//! server in one place: the workloads it targets (minus those an older
//! route holds), their pods, the namespace's labels, Services and
//! NetworkPolicies, and the ConfigMap the route will write. Every later step is pure over
//! [`Observed`] until apply.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::ListParams;
use kube::core::{Selector, SelectorExt};
use kube::{Api, Client, ResourceExt};

use super::pause::RolloutState;
use crate::crd::{GraceRoute, TargetKind};
use crate::keys;
use crate::route_match::precedence;
use crate::rules::{Originals, Target};

/// What failed in the dereference step: a read from the API server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{what}: {source}")]
    Read {
        what: String,
        #[source]
        source: kube::Error,
    },
}

impl Error {
    fn read(what: String) -> impl FnOnce(kube::Error) -> Self {
        move |source| Self::Read { what, source }
    }

    /// The metric label.
    pub fn kind(&self) -> &'static str {
        "kube"
    }
}

/// What the route refers to, as read at the start of this pass.
#[derive(Debug, Clone, Default)]
pub struct Observed {
    /// The targets this route holds, with the selector of their pods.
    pub targets: Vec<(Target, Option<String>)>,
    /// Targets an older route holds, each as a sentence.
    pub overlaps: Vec<String>,
    pub ns_labels: BTreeMap<String, String>,
    /// The pods of the targets and of the route's selector, by name.
    pub pods: BTreeMap<String, Pod>,
    /// The names of the pods each target selector (the second half of a
    /// [`Observed::targets`] entry) matched.
    pub pods_by_selector: BTreeMap<String, BTreeSet<String>>,
    pub services: Vec<Service>,
    /// The route's ConfigMap as it is now (None: absent).
    pub config_map: Option<ConfigMap>,
    /// The targets' rollout states (paused, progressing), for
    /// `rollout.pauseOnDrainLoss`.
    pub rollouts: Vec<RolloutState>,
    /// The namespace's NetworkPolicies, for the ones port takeover breaks
    /// (empty when the operator may not read them: the check is skipped).
    pub network_policies: Vec<NetworkPolicy>,
}

impl Observed {
    /// The targets as the pure checks take them.
    pub fn target_refs(&self) -> Vec<&(Target, Option<String>)> {
        self.targets.iter().collect()
    }

    pub fn target_ids(&self) -> Vec<String> {
        self.targets.iter().map(|t| t.0.id()).collect()
    }
}

/// Reads what `route` refers to; `others` are the routes known to the
/// controller (for overlaps).
pub async fn dereference(
    client: &Client,
    route: &GraceRoute,
    others: &[&GraceRoute],
) -> Result<Observed, Error> {
    let ns = route.namespace().unwrap_or_default();
    let (workloads, states) = Workloads::read(client, &ns).await?;
    let (targets, overlaps) = claim_targets(route, &workloads, others);
    let targets: Vec<(Target, Option<String>)> = targets.into_iter().cloned().collect();
    let rollouts = targets
        .iter()
        .filter_map(|(t, _)| states.get(&t.id()).cloned())
        .collect();

    let ns_labels = Api::<Namespace>::all(client.clone())
        .get_opt(&ns)
        .await
        .map_err(Error::read(format!("reading namespace {ns}")))?
        .map(|n| n.labels().clone())
        .unwrap_or_default();
    let pods_api = Api::<Pod>::namespaced(client.clone(), &ns);
    let mut selectors: BTreeSet<String> = targets.iter().filter_map(|t| t.1.clone()).collect();
    if let Some(s) = pod_selector(route.spec.selector.as_ref()) {
        selectors.insert(s);
    }
    let mut pods = BTreeMap::new();
    let mut pods_by_selector: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for s in &selectors {
        let list = pods_api
            .list(&ListParams::default().labels(s))
            .await
            .map_err(Error::read(format!("listing pods {s} in {ns}")))?;
        let names = pods_by_selector.entry(s.clone()).or_default();
        for p in list {
            names.insert(p.name_any());
            pods.insert(p.name_any(), p);
        }
    }
    let services = Api::<Service>::namespaced(client.clone(), &ns)
        .list(&ListParams::default())
        .await
        .map_err(Error::read(format!("listing Services in {ns}")))?
        .items;
    // Only injected pods have a port takeover a policy can break: a route
    // whose pods are bare costs no list.
    let network_policies = if pods.values().any(crate::inject::is_injected) {
        network_policies(client, &ns).await?
    } else {
        Vec::new()
    };
    let cm_name = crate::rules::config_map_name(&route.name_any());
    let config_map = Api::<ConfigMap>::namespaced(client.clone(), &ns)
        .get_opt(&cm_name)
        .await
        .map_err(Error::read(format!("reading ConfigMap {ns}/{cm_name}")))?;
    Ok(Observed {
        targets,
        overlaps,
        ns_labels,
        pods,
        pods_by_selector,
        services,
        config_map,
        rollouts,
        network_policies,
    })
}

/// The namespace's NetworkPolicies. A chart of an earlier release grants no
/// read of them: that skips the check (said at debug), it does not stop
/// the reconcile.
async fn network_policies(client: &Client, ns: &str) -> Result<Vec<NetworkPolicy>, Error> {
    match Api::<NetworkPolicy>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
    {
        Ok(list) => Ok(list.items),
        Err(kube::Error::Api(e)) if e.code == 403 => {
            tracing::debug!(namespace = %ns, "may not list NetworkPolicies; the port-takeover check is skipped");
            Ok(Vec::new())
        }
        Err(e) => Err(Error::read(format!("listing NetworkPolicies in {ns}"))(e)),
    }
}

pub(crate) fn selector_of(ls: &LabelSelector) -> Option<Selector> {
    Selector::try_from(ls.clone()).ok()
}

pub(crate) fn template_labels(t: &Target) -> BTreeMap<String, String> {
    t.template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default()
}

/// A workload's selector as a label-selector string for listing its pods.
pub(crate) fn pod_selector(ls: Option<&LabelSelector>) -> Option<String> {
    let s = selector_of(ls?)?;
    // An empty selector would select every pod in the namespace.
    (!s.selects_all()).then(|| s.to_string())
}

pub fn deployment_target(d: &Deployment) -> Option<(Target, Option<String>)> {
    let spec = d.spec.as_ref()?;
    let strategy = spec.strategy.as_ref();
    let ru = strategy.and_then(|s| s.rolling_update.as_ref());
    let current = Originals {
        // The API server defaults these; None only for Recreate.
        max_surge: ru.and_then(|r| r.max_surge.clone()),
        max_unavailable: ru.and_then(|r| r.max_unavailable.clone()),
        min_ready_seconds: Some(spec.min_ready_seconds.unwrap_or(0)),
        termination_grace_period_seconds: Some(grace_period(&spec.template)),
    };
    Some((
        target(
            TargetKind::Deployment,
            d,
            &spec.template,
            strategy.and_then(|s| s.type_.clone()),
            current,
        ),
        pod_selector(Some(&spec.selector)),
    ))
}

/// The pod template's grace period, with the API server's default.
fn grace_period(template: &k8s_openapi::api::core::v1::PodTemplateSpec) -> i64 {
    template
        .spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
        .unwrap_or(30)
}

pub fn statefulset_target(s: &StatefulSet) -> Option<(Target, Option<String>)> {
    let spec = s.spec.as_ref()?;
    let current = Originals {
        max_surge: None,
        max_unavailable: None,
        min_ready_seconds: Some(spec.min_ready_seconds.unwrap_or(0)),
        termination_grace_period_seconds: Some(grace_period(&spec.template)),
    };
    Some((
        target(
            TargetKind::StatefulSet,
            s,
            &spec.template,
            spec.update_strategy.as_ref().and_then(|u| u.type_.clone()),
            current,
        ),
        pod_selector(Some(&spec.selector)),
    ))
}

/// What the two workload kinds have in common as a [`Target`]: the name,
/// the annotations (with the originals a route recorded there) and the pod
/// template; the kind-specific parts are passed in.
fn target(
    kind: TargetKind,
    workload: &impl ResourceExt,
    template: &k8s_openapi::api::core::v1::PodTemplateSpec,
    strategy_type: Option<String>,
    current: Originals,
) -> Target {
    let annotations = workload.annotations().clone();
    Target {
        kind,
        name: workload.name_any(),
        template: template.clone(),
        strategy_type,
        current,
        recorded: annotations.get(keys::ORIGINAL).cloned(),
        annotations,
    }
}

/// The workloads of one namespace, with the selectors of their pods.
pub struct Workloads(pub Vec<(Target, Option<String>)>);

impl Workloads {
    /// From objects already read (pure; the admission tests use it).
    pub fn from_objects(deployments: &[Deployment], statefulsets: &[StatefulSet]) -> Self {
        Self(
            deployments
                .iter()
                .filter_map(deployment_target)
                .chain(statefulsets.iter().filter_map(statefulset_target))
                .collect(),
        )
    }

    pub async fn list(client: &Client, ns: &str) -> Result<Self, Error> {
        Ok(Self::read(client, ns).await?.0)
    }

    /// [`Workloads::list`], with the rollout state of each (by target id).
    pub async fn read(
        client: &Client,
        ns: &str,
    ) -> Result<(Self, BTreeMap<String, RolloutState>), Error> {
        let lp = ListParams::default();
        let deployments = Api::<Deployment>::namespaced(client.clone(), ns)
            .list(&lp)
            .await
            .map_err(Error::read(format!("listing Deployments in {ns}")))?;
        let statefulsets = Api::<StatefulSet>::namespaced(client.clone(), ns)
            .list(&lp)
            .await
            .map_err(Error::read(format!("listing StatefulSets in {ns}")))?;
        Ok((
            Self::from_objects(&deployments.items, &statefulsets.items),
            super::pause::states(&deployments.items, &statefulsets.items),
        ))
    }

    /// The targets a route selects.
    pub fn of(&self, route: &GraceRoute) -> Vec<&(Target, Option<String>)> {
        if let Some(r) = &route.spec.target_ref {
            return self
                .0
                .iter()
                .filter(|(t, _)| t.kind == r.kind && t.name == r.name)
                .collect();
        }
        let Some(sel) = route.spec.selector.as_ref().and_then(selector_of) else {
            return Vec::new();
        };
        if sel.selects_all() {
            return Vec::new();
        }
        self.0
            .iter()
            .filter(|(t, _)| sel.matches(&template_labels(t)))
            .collect()
    }
}

/// The targets a route selects, split into those it holds and the overlaps:
/// targets an older route ([`precedence`]) of the same namespace holds
/// already, each with a sentence saying so (pure; the controller and the admission webhook share
/// it, so both report the same overlaps).
pub fn claim_targets<'w>(
    route: &GraceRoute,
    workloads: &'w Workloads,
    others: &[&GraceRoute],
) -> (Vec<&'w (Target, Option<String>)>, Vec<String>) {
    let name = route.name_any();
    let ns = route.namespace();
    let mut overlaps = Vec::new();
    let mut targets = Vec::new();
    for t in workloads.of(route) {
        let holder = others.iter().find(|other| {
            other.name_any() != name
                && other.namespace() == ns
                && other.metadata.deletion_timestamp.is_none()
                && precedence(other) < precedence(route)
                && workloads.of(other).iter().any(|o| o.0.id() == t.0.id())
        });
        match holder {
            Some(other) => overlaps.push(format!(
                "{} is also targeted by GraceRoute {} (older, in force)",
                t.0.id(),
                other.name_any()
            )),
            None => targets.push(t),
        }
    }
    (targets, overlaps)
}
