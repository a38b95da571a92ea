//! Step 1, dereference: everything the route refers to, read in one place:
//! the workloads it targets (Deployments, StatefulSets, Argo Rollouts;
//! minus those an older route holds) and the namespace's Services from the
//! controller's watch stores ([`super::cache`]); their pods, the
//! namespace's labels and NetworkPolicies, and the ConfigMap the route
//! will write from the API server. Every later step is pure over
//! [`Observed`] until apply.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};

use kubegrace_api::argo::Rollout;

use super::cache::Cache;
use super::pause::RolloutState;
use crate::crd::GraceRoute;
use crate::rules::Target;

pub use kubegrace_api::workloads::{
    Workloads, claim_targets, deployment_target, statefulset_target,
};
/// The pure reading of workloads is the API crate's (the plugin shares it).
pub(crate) use kubegrace_api::workloads::{pod_selector, selector_of};

/// What failed in the dereference step: a read from the API server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{what}: {source}")]
    Read {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error(
        "the operator's copy of the cluster's {what} has not finished its first list after {}s; \
         check that the operator may list and watch them (its ClusterRole or Roles) and that \
         the API server answers",
        waited.as_secs()
    )]
    NotSynced {
        what: &'static str,
        waited: std::time::Duration,
    },
}

impl Error {
    fn read(what: String) -> impl FnOnce(kube::Error) -> Self {
        move |source| Self::Read { what, source }
    }

    /// The metric label.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Read { .. } => "kube",
            Self::NotSynced { .. } => "cache",
        }
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
    cache: &Cache,
    route: &GraceRoute,
    others: &[&GraceRoute],
) -> Result<Observed, Error> {
    let ns = route.namespace().unwrap_or_default();
    let cm_name = crate::rules::config_map_name(&route.name_any());
    let rollouts = can_target_rollouts(route);
    cache.synced(rollouts).await?;
    let (workloads, states) = cache.workloads(&ns, rollouts);
    let services = cache.services(&ns);
    let (targets, overlaps) = claim_targets(route, &workloads, others);
    let targets: Vec<(Target, Option<String>)> = targets.into_iter().cloned().collect();
    let rollouts = targets
        .iter()
        .filter_map(|(t, _)| states.get(&t.id()).cloned())
        .collect();

    let pods_api = Api::<Pod>::namespaced(client.clone(), &ns);
    let mut selectors: BTreeSet<String> = targets.iter().filter_map(|t| t.1.clone()).collect();
    if let Some(s) = pod_selector(route.spec.selector.as_ref()) {
        selectors.insert(s);
    }
    // The reads left go out together, in one round trip: with the
    // workloads in the cache, the pods' selectors are known before any
    // read. NetworkPolicies are listed alongside and kept only when a pod
    // is injected (a route of bare pods has no port takeover a policy can
    // break): a round trip less for the routes that have sidecars.
    //
    // Both lists are served from the API server's watch cache as it is
    // (resourceVersion=0, [`ListParams::match_any`]). A list without a
    // version is a consistent read: since Kubernetes 1.31 the cache first
    // waits until it has caught up with etcd, and for a kind with no recent
    // event that takes a progress notification, requested every 100 ms. With
    // the controller's own writes moving etcd along, every reconcile waited
    // for one (measured here: a namespace's NetworkPolicies listed in 100 ms
    // at p50 against 57 ms at resourceVersion=0, kubectl's own 55 ms
    // included; 200 routes came current 10 a second in a cold start). The
    // cache may lag the latest write by that much; a reconcile the pod watch
    // queued reads at least what that watch delivered (same cache), and any
    // later change queues the route again.
    let (lists, ns_labels, config_map, policies) = tokio::try_join!(
        futures_util::future::try_join_all(selectors.iter().map(|s| {
            let pods_api = &pods_api;
            let ns = &ns;
            async move {
                pods_api
                    .list(&ListParams::default().labels(s).match_any())
                    .await
                    .map(|list| (s.clone(), list.items))
                    .map_err(Error::read(format!("listing pods {s} in {ns}")))
            }
        })),
        namespace_labels(client, &ns),
        async {
            Api::<ConfigMap>::namespaced(client.clone(), &ns)
                .get_opt(&cm_name)
                .await
                .map_err(Error::read(format!("reading ConfigMap {ns}/{cm_name}")))
        },
        async {
            if selectors.is_empty() {
                Ok(Vec::new())
            } else {
                network_policies(client, &ns).await
            }
        },
    )?;
    let mut pods = BTreeMap::new();
    let mut pods_by_selector: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (s, list) in lists {
        let names = pods_by_selector.entry(s).or_default();
        for p in list {
            names.insert(p.name_any());
            pods.insert(p.name_any(), p);
        }
    }
    let network_policies = if pods.values().any(crate::inject::is_injected) {
        policies
    } else {
        Vec::new()
    };
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

/// Whether `route` can target an Argo Rollout (it names one, or selects
/// workloads by label).
fn can_target_rollouts(route: &GraceRoute) -> bool {
    route
        .spec
        .target_ref
        .as_ref()
        .is_none_or(|t| t.kind == crate::crd::TargetKind::Rollout)
}

/// The namespace's labels (none when it is gone).
async fn namespace_labels(client: &Client, ns: &str) -> Result<BTreeMap<String, String>, Error> {
    Ok(Api::<Namespace>::all(client.clone())
        .get_opt(ns)
        .await
        .map_err(Error::read(format!("reading namespace {ns}")))?
        .map(|n| n.labels().clone())
        .unwrap_or_default())
}

/// The namespace's NetworkPolicies. A chart of an earlier release grants no
/// read of them: that skips the check (said at debug), it does not stop
/// the reconcile.
async fn network_policies(client: &Client, ns: &str) -> Result<Vec<NetworkPolicy>, Error> {
    match Api::<NetworkPolicy>::namespaced(client.clone(), ns)
        // From the watch cache as it is: see `dereference`.
        .list(&ListParams::default().match_any())
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

/// Reads the workloads of a namespace from the API server (their pure
/// reading is [`Workloads::from_objects`], in the API crate).
pub trait ReadWorkloads: Sized {
    fn list(client: &Client, ns: &str) -> impl Future<Output = Result<Self, Error>> + Send;

    /// [`ReadWorkloads::list`], with the rollout state of each (by target id).
    fn read(
        client: &Client,
        ns: &str,
    ) -> impl Future<Output = Result<(Self, BTreeMap<String, RolloutState>), Error>> + Send;

    /// [`ReadWorkloads::read`] of the kinds `route` can target: its reconcile
    /// costs no Rollout list when it names a Deployment or StatefulSet.
    fn read_for(
        client: &Client,
        ns: &str,
        route: &GraceRoute,
    ) -> impl Future<Output = Result<(Self, BTreeMap<String, RolloutState>), Error>> + Send;
}

impl ReadWorkloads for Workloads {
    async fn list(client: &Client, ns: &str) -> Result<Self, Error> {
        Ok(Self::read(client, ns).await?.0)
    }

    async fn read(
        client: &Client,
        ns: &str,
    ) -> Result<(Self, BTreeMap<String, RolloutState>), Error> {
        read_kinds(client, ns, true).await
    }

    async fn read_for(
        client: &Client,
        ns: &str,
        route: &GraceRoute,
    ) -> Result<(Self, BTreeMap<String, RolloutState>), Error> {
        read_kinds(client, ns, can_target_rollouts(route)).await
    }
}

/// The namespace's Deployments and StatefulSets, and its Rollouts if
/// `rollouts`, with their rollout states.
async fn read_kinds(
    client: &Client,
    ns: &str,
    rollouts: bool,
) -> Result<(Workloads, BTreeMap<String, RolloutState>), Error> {
    let lp = ListParams::default();
    let (deployments, statefulsets, rollouts) = tokio::try_join!(
        async {
            Api::<Deployment>::namespaced(client.clone(), ns)
                .list(&lp)
                .await
                .map_err(Error::read(format!("listing Deployments in {ns}")))
        },
        async {
            Api::<StatefulSet>::namespaced(client.clone(), ns)
                .list(&lp)
                .await
                .map_err(Error::read(format!("listing StatefulSets in {ns}")))
        },
        async {
            if rollouts {
                self::rollouts(client, ns).await
            } else {
                Ok(Vec::new())
            }
        },
    )?;
    Ok((
        Workloads::from_all(&deployments.items, &statefulsets.items, &rollouts),
        super::pause::states(&deployments.items, &statefulsets.items, &rollouts),
    ))
}

/// The namespace's Argo Rollouts. Where Argo Rollouts is not installed (the
/// API answers 404) there are none, and a route targeting one says its
/// Rollout does not exist; a chart of an earlier release grants no read
/// (403): the same, said at debug. Neither stops the reconcile of routes
/// that target Deployments.
pub async fn rollouts(client: &Client, ns: &str) -> Result<Vec<Rollout>, Error> {
    match Api::<Rollout>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
    {
        Ok(list) => Ok(list.items),
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 403 => {
            tracing::debug!(namespace = %ns, code = e.code, "no Argo Rollouts to read (not installed, or not allowed)");
            Ok(Vec::new())
        }
        Err(e) => Err(Error::read(format!("listing Argo Rollouts in {ns}"))(e)),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::fixtures::{DEPLOYMENT, ROUTE, route};
    use super::*;
    use kubegrace_sidecar_api::pod::CONTAINER;

    use crate::testing::{Seen, mock, no_more, reply, scripted};

    /// What the API server holds for the script: a pod of the route's
    /// Deployment with the sidecar, the namespace and the route's ConfigMap.
    fn answer_for(path: &str) -> serde_json::Value {
        let list =
            |items| json!({"apiVersion": "v1", "kind": "List", "metadata": {}, "items": items});
        match path {
            "/api/v1/namespaces/shop/pods" => list(json!([{
                "metadata": {"name": "web-1", "namespace": "shop", "labels": {"app": "web"}},
                "spec": {"containers": [{"name": "app", "image": "app"}],
                         "initContainers": [{"name": CONTAINER, "image": "sidecar"}]}
            }])),
            "/api/v1/namespaces/shop" => {
                json!({"metadata": {"name": "shop", "labels": {"team": "a"}}})
            }
            "/api/v1/namespaces/shop/configmaps/kubegrace-web" => {
                json!({"metadata": {"name": "kubegrace-web", "namespace": "shop"}})
            }
            _ => list(json!([])),
        }
    }

    #[tokio::test]
    async fn one_round_trip_reads_the_rest_and_the_lists_take_the_watch_cache_as_it_is() {
        let (client, mut api) = mock();
        let cache = Cache::listed(vec![crate::testing::yaml(DEPLOYMENT)], Vec::new());
        let route = route(ROUTE);
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<Seen>::new()));
        let log = seen.clone();
        let observed = scripted(
            async move {
                for _ in 0..4 {
                    let s = reply(&mut api, 200, |path, _| answer_for(path)).await;
                    log.lock().expect("log").push(s);
                }
                no_more(&mut api).await;
            },
            dereference(&client, &cache, &route, &[]),
        )
        .await
        .expect("observed");
        // The workloads came from the cache: the target and its pod are there.
        assert_eq!(observed.target_ids(), ["Deployment/web"]);
        assert_eq!(observed.pods.keys().collect::<Vec<_>>(), ["web-1"]);
        assert_eq!(
            observed.ns_labels.get("team").map(String::as_str),
            Some("a")
        );
        assert!(observed.config_map.is_some());
        let seen = seen.lock().expect("log");
        let mut calls: Vec<(String, String)> = seen
            .iter()
            .map(|s| (s.path.clone(), s.query.clone()))
            .collect();
        calls.sort();
        // No Deployment, StatefulSet or Service list: those are the cache's.
        assert_eq!(
            calls.iter().map(|c| c.0.as_str()).collect::<Vec<_>>(),
            [
                "/api/v1/namespaces/shop",
                "/api/v1/namespaces/shop/configmaps/kubegrace-web",
                "/api/v1/namespaces/shop/pods",
                "/apis/networking.k8s.io/v1/namespaces/shop/networkpolicies",
            ]
        );
        for (path, query) in &calls {
            if path.ends_with("/pods") || path.ends_with("/networkpolicies") {
                assert!(query.contains("resourceVersion=0"), "{path}?{query}");
            }
        }
        assert!(
            calls[2].1.contains("labelSelector=app%3Dweb"),
            "{:?}",
            calls[2]
        );
    }
}
