//! The workloads and Services a reconcile reads, kept by the route
//! controller's own watches instead of listed from the API server on every
//! pass.
//!
//! The controller watched Deployments, StatefulSets, Rollouts and Services
//! only to know when to reconcile, then listed each kind of the route's
//! namespace again in the reconcile: five of the seven reads of a pass. At
//! 2,000 routes a cold start made about 12,500 such lists and waited for
//! them, 8 routes at a time, on an API server two cores shared with etcd
//! and the storm (`make bench-scale`, 67.8 s until every route was
//! current). The watch now fills a store first and triggers after, so a
//! reconcile a watch event queued reads at least that event's version.
//!
//! What stays a live read, and why:
//! - pods: 20,000 of them would cost the operator more memory than the
//!   goal allows, and the reconcile lists only its own selectors';
//! - the route's ConfigMap: the ConfigMap watch sees only ours (label
//!   selected), and the ownership check must see a foreign one;
//! - the namespace's labels and NetworkPolicies: a namespaced install may
//!   not list or watch them cluster-wide.
//!
//! Cleanup (a deleted route puts its targets' fields back) also reads
//! live: it runs once per route, and a stale copy there could skip a
//! restore.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::time::Duration;

use futures_util::Stream;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::Service;
use kube::runtime::reflector::{self, Store, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource, ResourceExt};
use serde::de::DeserializeOwned;

use kubegrace_api::argo::Rollout;

use super::dereference::{Error, Workloads};
use super::pause::RolloutState;

/// How long a reconcile waits for a store's first list. A cold start's
/// first reconciles wait here while the watches list; a store that never
/// fills (the operator may not list or watch the kind) fails the
/// reconcile with a message, retried like any failed read.
const SYNC_WAIT: Duration = Duration::from_secs(20);

/// The stores a route reconcile reads (see the module comment).
#[derive(Clone)]
pub struct Cache {
    pub deployments: Store<Deployment>,
    pub statefulsets: Store<StatefulSet>,
    /// None where Argo Rollouts is not installed: there are none.
    pub rollouts: Option<Store<Rollout>>,
    pub services: Store<Service>,
}

/// A watch of `api` that fills a store before it yields each object it
/// touched (deleted ones too: a deleted target must requeue its route).
pub fn reflect<K>(
    api: Api<K>,
) -> (
    Store<K>,
    impl Stream<Item = Result<K, watcher::Error>> + Send + 'static,
)
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
{
    let writer = Writer::<K>::default();
    let store = writer.as_reader();
    let events = watcher(api, watcher::Config::default()).modify(crate::slim::cached::<K>);
    (
        store,
        reflector::reflector(writer, events).touched_objects(),
    )
}

impl Cache {
    /// Waits (bounded) until every store a route reconcile reads has
    /// listed once; `rollouts` when the route can target one.
    pub async fn synced(&self, rollouts: bool) -> Result<(), Error> {
        wait(&self.deployments, "Deployments").await?;
        wait(&self.statefulsets, "StatefulSets").await?;
        wait(&self.services, "Services").await?;
        if rollouts && let Some(store) = &self.rollouts {
            wait(store, "Argo Rollouts").await?;
        }
        Ok(())
    }

    /// The namespace's workloads of the kinds a route reads (Rollouts if
    /// `rollouts`), with their rollout states.
    pub fn workloads(
        &self,
        ns: &str,
        rollouts: bool,
    ) -> (Workloads, BTreeMap<String, RolloutState>) {
        let deployments = in_namespace(&self.deployments, ns);
        let statefulsets = in_namespace(&self.statefulsets, ns);
        let rollouts = match (&self.rollouts, rollouts) {
            (Some(store), true) => in_namespace(store, ns),
            _ => Vec::new(),
        };
        (
            Workloads::from_all(&deployments, &statefulsets, &rollouts),
            super::pause::states(&deployments, &statefulsets, &rollouts),
        )
    }

    /// The namespace's Services.
    pub fn services(&self, ns: &str) -> Vec<Service> {
        in_namespace(&self.services, ns)
    }
}

/// Copies of the store's objects in `ns`, in name order (the order a list
/// from the API server has, which the reports keep).
fn in_namespace<K>(store: &Store<K>, ns: &str) -> Vec<K>
where
    K: Resource<DynamicType = ()> + Clone,
{
    let mut objects: Vec<K> = store
        // Borrowed, not `namespace()`: every reconcile scans the whole store.
        .state_filter(|o| o.meta().namespace.as_deref() == Some(ns))
        .iter()
        .map(|o| K::clone(o))
        .collect();
    objects.sort_by_key(|o| o.name_any());
    objects
}

async fn wait<K>(store: &Store<K>, what: &'static str) -> Result<(), Error>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    match tokio::time::timeout(SYNC_WAIT, store.wait_until_ready()).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(_)) | Err(_) => Err(Error::NotSynced {
            what,
            waited: SYNC_WAIT,
        }),
    }
}

#[cfg(test)]
impl Cache {
    /// Stores that listed `deployments` and `services` once (and no
    /// StatefulSets); the unit tests' cache.
    pub fn listed(deployments: Vec<Deployment>, services: Vec<Service>) -> Self {
        fn fill<K>(objects: Vec<K>) -> Store<K>
        where
            K: Resource<DynamicType = ()> + Clone + 'static,
        {
            let mut writer = Writer::<K>::default();
            let store = writer.as_reader();
            writer.apply_watcher_event(&watcher::Event::Init);
            for o in objects {
                writer.apply_watcher_event(&watcher::Event::InitApply(o));
            }
            writer.apply_watcher_event(&watcher::Event::InitDone);
            store
        }
        Self {
            deployments: fill(deployments),
            statefulsets: fill(Vec::new()),
            rollouts: None,
            services: fill(services),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn deployment(ns: &str, name: &str, app: &str) -> Deployment {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": ns, "uid": format!("{ns}-{name}")},
            "spec": {
                "selector": {"matchLabels": {"app": app}},
                "template": {
                    "metadata": {"labels": {"app": app}},
                    "spec": {"containers": [{"name": "app", "image": "app"}]}
                }
            }
        }))
        .expect("deployment")
    }

    fn service(ns: &str, name: &str) -> Service {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": ns},
            "spec": {"selector": {"app": name}, "ports": [{"port": 80}]}
        }))
        .expect("service")
    }

    #[tokio::test]
    async fn a_reconcile_reads_its_namespace_only_in_name_order() {
        let cache = Cache::listed(
            vec![
                deployment("shop", "web", "web"),
                deployment("shop", "api", "api"),
                deployment("blog", "web", "blog"),
            ],
            vec![service("shop", "web"), service("blog", "web")],
        );
        cache.synced(true).await.expect("synced");
        let (workloads, states) = cache.workloads("shop", true);
        let ids: Vec<String> = workloads.0.iter().map(|t| t.0.id()).collect();
        assert_eq!(ids, ["Deployment/api", "Deployment/web"]);
        assert_eq!(states.len(), 2);
        let services = cache.services("blog");
        assert_eq!(services.len(), 1);
        assert_eq!(services[0].namespace().as_deref(), Some("blog"));
        assert!(cache.workloads("none", true).0.0.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_store_that_never_lists_fails_the_reconcile_with_what_to_check() {
        let mut cache = Cache::listed(Vec::new(), Vec::new());
        // A store whose writer never saw a first list.
        let never = Writer::<Service>::default();
        cache.services = never.as_reader();
        let err = cache.synced(false).await.expect_err("not synced");
        let text = err.to_string();
        assert!(text.contains("Services"), "{text}");
        assert!(text.contains("list and watch"), "{text}");
        drop(never);
    }

    #[tokio::test(start_paused = true)]
    async fn rollouts_are_waited_for_only_by_a_route_that_can_target_one() {
        let mut cache = Cache::listed(Vec::new(), Vec::new());
        let never = Writer::<Rollout>::default();
        cache.rollouts = Some(never.as_reader());
        cache
            .synced(false)
            .await
            .expect("a Deployment route does not wait");
        assert!(cache.synced(true).await.is_err());
        drop(never);
    }
}
