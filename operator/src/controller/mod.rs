//! The GraceRoute controller, as a pipeline with one file per step:
//!
//! 1. [`dereference`]: read the targets (minus those an older route holds),
//!    their pods, the namespace's labels and Services, the route's ConfigMap;
//! 2. [`validate`] (pure): budget, ports, sidecar config, ConfigMap ownership;
//! 3. [`build`] (pure): the ConfigMap and an explicit `rollout` block's fields;
//! 4. [`apply`]: server-side apply as `kubegrace-operator`;
//! 5. [`status`] (pure, then one write): conditions and Events from what
//!    the earlier steps found; [`drains`] folds in the drain reports the pod
//!    watch collected (`status.lastDrains`, counters, Events when a drain
//!    cut something), and [`pause`] decides to stop a Deployment's rollout
//!    whose drains lose requests (`rollout.pauseOnDrainLoss`).
//!
//! Each step has its own error type, wrapped by [`crate::Error`]; the
//! condition types and reasons are in [`crate::reasons`].
//!
//! Level-triggered and idempotent: every pass runs the whole pipeline. An
//! invalid route is not an error, it is a status (`Accepted=False`) and
//! waits for a change; API failures are errors and are retried. A
//! [`finalizer`] restores what an explicit `rollout` block changed on the
//! targets when the route is deleted, held only while there is such a
//! change to undo; the ConfigMap goes with the route through its owner
//! reference.
//!
//! Routes are watched as dynamic objects and decoded one at a time
//! ([`crate::tolerant`]): a stored route the operator cannot decode gets
//! `Accepted=False` (reason `InvalidObject`, the field that failed), an
//! Event and a metric, and every other route goes on being reconciled. A
//! panic in a reconcile is caught ([`crate::panics`]): counted, logged with
//! the route's name, written as a `Degraded` condition, retried.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, PodTemplateSpec, Service};
use kube::core::DynamicObject;
use kube::core::SelectorExt;
use kube::runtime::controller::{self, Action};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{Controller, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use kubegrace_api::argo::Rollout;

use crate::admin::Metrics;
use crate::crd::{GraceRoute, TargetKind};
use crate::tolerant::{self, Routes};
use crate::{Error, FIELD_MANAGER, Result, keys};

pub mod apply;
pub mod balancer;
pub mod build;
pub mod cache;
pub mod context;
pub mod decisions;
pub mod dereference;
pub mod drains;
pub mod echoes;
pub mod finalizer;
pub mod invalid;
pub mod pause;
pub mod status;
pub mod validate;

pub use context::Context;
pub use dereference::{Observed, Workloads, claim_targets, deployment_target, statefulset_target};
pub use status::{PodCount, count_pods};
pub use validate::{budget_and_config, service_bypasses};

use dereference::selector_of;

/// The condition types and the reasons other modules name through the
/// controller.
pub use crate::reasons::{
    ACCEPTED, DEGRADED, DRAIN_FORCE_CLOSED, NETWORK_POLICY_BLOCKS_SIDECAR, READY,
    SERVICE_BYPASSES_SIDECAR,
};

/// One pass of the pipeline for a live route.
async fn reconcile_route(route: &GraceRoute, ctx: &Context) -> Result<Action> {
    let ns = route.namespace().unwrap_or_default();
    let api: Api<GraceRoute> = Api::namespaced(ctx.client.clone(), &ns);
    // Targets and overlaps are per namespace: the routes of this one.
    let known = ctx.routes.in_namespace(&ns);
    let others: Vec<&GraceRoute> = known.iter().map(AsRef::as_ref).collect();

    let observed = dereference::dereference(&ctx.client, &ctx.cache, route, &others).await?;
    // A route without its own maxDelay follows the balancers in front of its pods.
    let balanced = balancer::effective(ctx, route, &observed).await?;
    let route = balanced.as_ref().map_or(route, |b| &b.route);
    let valid = match validate::check(route, &observed) {
        Ok(valid) => valid,
        Err(invalid) => {
            let report = status::rejected(route, &observed, &invalid);
            status::update(ctx, &api, route, &observed, report).await?;
            finalizer::follow(&api, route, &observed).await?;
            // A foreign ConfigMap is not watched (the watch is label-selected):
            // look again now and then. Otherwise nothing changes until the
            // route or a target does; watches bring us back.
            return Ok(if invalid.reason == crate::ownership::REASON {
                Action::requeue(Duration::from_secs(60))
            } else {
                Action::await_change()
            });
        }
    };
    let desired = build::desired(route, &valid, &observed)?;
    finalizer::apply_guarded(&ctx.client, &api, route, &observed, &desired, &ctx.echoes).await?;
    let mut report = status::accepted(route, &observed, &valid, &desired);
    balancer::note(&mut report, balanced.as_ref());
    let ready = report.ready();
    status::update(ctx, &api, route, &observed, report).await?;
    // Pods and workloads are watched; the periodic pass only catches drift
    // a watch could have missed.
    Ok(Action::requeue(Duration::from_secs(if ready {
        300
    } else {
        30
    })))
}

pub async fn reconcile(obj: Arc<DynamicObject>, ctx: Arc<Context>) -> Result<Action> {
    let start = Instant::now();
    // Series of routes deleted without a reconcile (no finalizer) go here.
    ctx.metrics
        .retain_undecodable(|ns, name| ctx.routes.contains(ns, name));
    let exists = |label: &str| {
        label
            .split_once('/')
            .is_some_and(|(ns, name)| ctx.routes.contains(ns, name))
    };
    ctx.metrics.retain_routes(exists);
    ctx.drains.retain(exists);
    let result = invalid::guarded(&ctx, &obj, reconcile_object(&obj, &ctx)).await;
    ctx.metrics
        .reconciled(start.elapsed(), result.as_ref().err().map(Error::kind));
    ctx.metrics.api_requests.route_reconciled();
    result
}

/// Decodes the stored route; the pipeline for one that decodes, the report
/// for one that does not.
async fn reconcile_object(obj: &DynamicObject, ctx: &Context) -> Result<Action> {
    let ns = obj
        .namespace()
        .ok_or_else(|| Error::MissingField("GraceRoute without namespace".into()))?;
    let route = match tolerant::decode(obj) {
        Ok(route) => Arc::new(route),
        Err(why) => return invalid::report_undecodable(ctx, obj, &why).await,
    };
    ctx.metrics.route_decodes(&ns, &route.name_any(), true);
    if route.meta().deletion_timestamp.is_none() {
        return reconcile_route(&route, ctx).await;
    }
    // Deleted. Without the finalizer the API server has let it go and
    // there is nothing to undo; with it, restore the targets, then let go.
    let key = ObjectRef::from_obj(route.as_ref());
    ctx.metrics.forget_route(&drains::route_label(&key));
    ctx.drains.forget(&key);
    if !finalizer::has(&route) {
        return Ok(Action::await_change());
    }
    let api: Api<GraceRoute> = Api::namespaced(ctx.client.clone(), &ns);
    let action = apply::cleanup(&route, ctx).await?;
    finalizer::release(&api, &route).await?;
    Ok(action)
}

pub fn error_policy(obj: Arc<DynamicObject>, err: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(
        namespace = obj.namespace().unwrap_or_default(),
        route = %obj.name_any(),
        error = %err,
        kind = err.kind(),
        "reconcile failed; retrying"
    );
    Action::requeue(Duration::from_secs(10))
}

/// Maps a Deployment, StatefulSet or Rollout to the routes that may target
/// it.
fn routes_for_workload(
    store: &Routes,
    kind: TargetKind,
    ns: &str,
    name: &str,
    labels: &BTreeMap<String, String>,
) -> Vec<ObjectRef<GraceRoute>> {
    store
        .in_namespace(ns)
        .iter()
        .filter(|r| crate::route_match::covers_workload(r, kind, ns, name, labels))
        .map(|r| ObjectRef::from_obj(r.as_ref()))
        .collect()
}

/// The watch mapper of a workload kind: a changed Deployment or
/// StatefulSet to the routes that may target it (by name, or by its pod
/// template's labels).
fn workload_mapper<K: ResourceExt>(
    store: Routes,
    echoes: Arc<echoes::Echoes>,
    kind: TargetKind,
    template: fn(&K) -> Option<&PodTemplateSpec>,
) -> impl Fn(K) -> Vec<ObjectRef<DynamicObject>> {
    move |w| {
        // Our own rollout fields coming back (controller::echoes).
        if echoes.is_echo(kind.into(), w.meta()) {
            return Vec::new();
        }
        let labels = template(&w)
            .and_then(|t| t.metadata.as_ref())
            .and_then(|m| m.labels.clone())
            .unwrap_or_default();
        let ns = w.namespace().unwrap_or_default();
        routes_for_workload(&store, kind, &ns, &w.name_any(), &labels)
            .iter()
            .map(tolerant::erase)
            .collect()
    }
}

/// The routes owning a ConfigMap (its owner references of our kind).
fn owning_routes(cm: &ConfigMap) -> Vec<ObjectRef<DynamicObject>> {
    let kind = tolerant::api_resource();
    let ns = cm.namespace();
    cm.owner_references()
        .iter()
        .filter(|o| o.kind == kind.kind && o.api_version == kind.api_version)
        .map(|o| {
            let mut r = ObjectRef::new_with(&o.name, kind.clone());
            r.namespace.clone_from(&ns);
            r
        })
        .collect()
}

/// Maps a pod to the route it is pinned to, or the routes selecting it.
fn routes_for_pod(store: &Routes, pod: &Pod) -> Vec<ObjectRef<GraceRoute>> {
    let ns = pod.namespace().unwrap_or_default();
    if let Some(name) = pod.annotations().get(keys::ROUTE) {
        return vec![ObjectRef::new(name).within(&ns)];
    }
    let labels = pod.labels();
    store
        .in_namespace(&ns)
        .iter()
        .filter(|r| {
            r.spec
                .selector
                .as_ref()
                .and_then(selector_of)
                .is_some_and(|s| !s.selects_all() && s.matches(labels))
        })
        .map(|r| ObjectRef::from_obj(r.as_ref()))
        .collect()
}

/// Routes reconciled at once. Unbounded (kube-rs's default), a cold start
/// reconciles every route together, each holding its lists of pods, Services
/// and workloads: 200 routes over 2,000 pods took the operator from 55 to
/// 211 MiB, and the allocator kept it (`make bench-scale`). A route waits
/// its turn in the queue instead; it is never reconciled twice at once.
const RECONCILE_CONCURRENCY: u16 = 8;

/// Runs the route controller until `shutdown` resolves.
pub async fn run(
    client: Client,
    metrics: Arc<Metrics>,
    identity: String,
    namespace: Option<String>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    // One namespace (watch-namespaces mode, namespaced RBAC) or all.
    let ns = namespace.as_deref();
    // The reflector keeps each route without what nothing reads
    // (crate::slim); every event also feeds the per-namespace index the
    // mappers and reconciles read (tolerant::Routes).
    let store = Routes::default();
    let index = store.clone();
    let echoes = Arc::new(echoes::Echoes::default());
    let (trigger, reader) = crate::slim::reflect(
        tolerant::api(&client, ns),
        watcher::Config::default().any_semantic(),
        tolerant::api_resource(),
        crate::slim::route,
        move |e| index.apply(e),
    );
    // A route's own status write coming back queues nothing (controller::echoes).
    let route_echoes = echoes.clone();
    let trigger = trigger.try_filter(move |route| {
        std::future::ready(!route_echoes.is_echo(echoes::Kind::GraceRoute, route.meta()))
    });
    let controller = Controller::for_stream_with(trigger, reader, tolerant::api_resource())
        .with_config(controller::Config::default().concurrency(RECONCILE_CONCURRENCY));
    let (s1, s2, s3, s4) = (store.clone(), store.clone(), store.clone(), store.clone());
    let inbox = Arc::new(drains::Inbox::default());
    let pod_inbox = inbox.clone();
    let managed =
        watcher::Config::default().labels(&format!("{}={}", keys::MANAGED_BY, FIELD_MANAGER));
    // The workloads and Services a reconcile reads come from these watches'
    // stores (controller::cache). A route targeting an Argo Rollout follows
    // its changes like a Deployment's, where Argo Rollouts is installed (a
    // watch of a resource not served would fail forever).
    let (deployments, deployment_events) =
        cache::reflect::<Deployment>(crate::scope::api(&client, ns));
    let (statefulsets, statefulset_events) =
        cache::reflect::<StatefulSet>(crate::scope::api(&client, ns));
    let (services, service_events) = cache::reflect::<Service>(crate::scope::api(&client, ns));
    let rollouts = if crate::workload::argo_rollouts_served(&client).await {
        Some(cache::reflect::<Rollout>(crate::scope::api(&client, ns)))
    } else {
        None
    };
    let cache = cache::Cache {
        deployments,
        statefulsets,
        rollouts: rollouts.as_ref().map(|r| r.0.clone()),
        services,
    };
    let ctx = Arc::new(Context {
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: FIELD_MANAGER.into(),
                instance: Some(identity),
            },
        ),
        client: client.clone(),
        metrics,
        routes: store,
        drains: inbox,
        echoes: echoes.clone(),
        cache,
    });
    let controller = match rollouts {
        Some((_, events)) => controller.watches_stream(
            events,
            workload_mapper(
                s1.clone(),
                echoes.clone(),
                TargetKind::Rollout,
                |r: &Rollout| r.spec.template.as_ref(),
            ),
        ),
        None => controller,
    };
    let cm_echoes = echoes.clone();
    controller
        // The routes' own ConfigMaps, to their owner: what `owns` does, but
        // a write of ours coming back queues nothing.
        .watches(
            crate::scope::api::<ConfigMap>(&client, ns),
            managed,
            move |cm: ConfigMap| {
                if cm_echoes.is_echo(echoes::Kind::ConfigMap, cm.meta()) {
                    return Vec::new();
                }
                owning_routes(&cm)
            },
        )
        .watches_stream(
            deployment_events,
            workload_mapper(
                s1,
                echoes.clone(),
                TargetKind::Deployment,
                |d: &Deployment| d.spec.as_ref().map(|s| &s.template),
            ),
        )
        .watches_stream(
            statefulset_events,
            workload_mapper(s2, echoes, TargetKind::StatefulSet, |s: &StatefulSet| {
                s.spec.as_ref().map(|s| &s.template)
            }),
        )
        .watches(
            crate::scope::api::<Pod>(&client, ns),
            watcher::Config::default(),
            // Every version of a pod passes here, including the last one
            // with the sidecar's drain report, which a later list may miss.
            move |p| {
                let routes = routes_for_pod(&s3, &p);
                pod_inbox.offer(&p, &routes);
                routes.iter().map(tolerant::erase).collect::<Vec<_>>()
            },
        )
        // A Service created or changed after the route can bypass its
        // sidecars; every route of the namespace re-checks (cheap, pure).
        .watches_stream(service_events, move |svc: Service| {
            let ns = svc.namespace().unwrap_or_default();
            s4.in_namespace(&ns)
                .iter()
                .map(|r| tolerant::erase(&ObjectRef::from_obj(r.as_ref())))
                .collect::<Vec<_>>()
        })
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|res| async move {
            match res {
                Ok((obj, _)) => tracing::debug!(route = %obj, "reconciled"),
                Err(e) => tracing::debug!(error = %e, "reconcile error"),
            }
        })
        .await;
}

/// YAML fixtures for the pipeline's unit tests: a route, a target, and what
/// dereference would have observed.
#[cfg(test)]
pub(crate) mod fixtures {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
    use kubegrace_sidecar_api::report::{DrainOutcome, KIND};

    use super::drains::PodDrain;
    use super::pause::RolloutState;
    use super::*;

    pub const ROUTE: &str = r#"
apiVersion: kubegrace.io/v1alpha1
kind: GraceRoute
metadata: {name: web, namespace: shop, uid: 7e1c0000-0000-4000-8000-000000000001, generation: 2}
spec:
  targetRef: {kind: Deployment, name: web}
  ports: [{name: http}]
  drain: {minDelay: 1s, quiet: 500ms, maxDelay: 5s, timeout: 10s}
"#;

    pub const DEPLOYMENT: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: shop}
spec:
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web, kubegrace.io/inject: enabled}}
    spec:
      containers:
      - {name: app, image: app, ports: [{name: http, containerPort: 8080}]}
"#;

    /// A context whose API server is the returned script handle.
    pub fn scripted_context() -> (Context, crate::testing::Handle) {
        let (client, handle) = crate::testing::mock();
        (context(client), handle)
    }

    /// A context whose client is `client`.
    pub fn context(client: Client) -> Context {
        Context {
            recorder: Recorder::new(
                client.clone(),
                Reporter {
                    controller: "test".into(),
                    instance: None,
                },
            ),
            client,
            metrics: Arc::new(Metrics::default()),
            routes: Routes::default(),
            drains: Arc::new(drains::Inbox::default()),
            echoes: Arc::new(echoes::Echoes::default()),
            cache: cache::Cache::listed(Vec::new(), Vec::new()),
        }
    }

    /// A time, in seconds since the epoch.
    pub fn at(secs: i64) -> Time {
        Time(jiff::Timestamp::from_second(secs).expect("timestamp"))
    }

    /// The drain report of a pod of [`DEPLOYMENT`] (an old revision).
    pub fn drain(
        pod: &str,
        force_closed: u64,
        requests_cut: u64,
        finished: Option<i64>,
    ) -> PodDrain {
        PodDrain {
            uid: format!("uid-{pod}"),
            pod: pod.into(),
            labels: BTreeMap::from([
                ("app".to_string(), "web".to_string()),
                (keys::INJECT.to_string(), "enabled".to_string()),
                ("pod-template-hash".to_string(), "old".to_string()),
            ]),
            revision: Some("old".into()),
            outcome: DrainOutcome {
                kind: KIND.into(),
                trigger: "SIGTERM".into(),
                duration_ms: 4_000,
                connections: 3,
                inflight_at_trigger: 2,
                requests_finished: 7,
                force_closed,
                requests_cut,
            },
            finished_at: finished.map(at),
        }
    }

    /// The rollout state of the workload `app` (selecting `app: <app>`).
    pub fn state(kind: TargetKind, app: &str, paused: bool, progressing: bool) -> RolloutState {
        RolloutState {
            kind,
            name: app.into(),
            selector: LabelSelector {
                match_labels: Some(BTreeMap::from([("app".to_string(), app.to_string())])),
                ..Default::default()
            },
            paused,
            paused_here: false,
            progressing,
        }
    }

    /// What validate and build make of `route` against `seen` (both pass).
    pub fn checked(route: &GraceRoute, seen: &Observed) -> (validate::Valid, build::Desired) {
        let valid = validate::check(route, seen).expect("valid");
        let desired = build::desired(route, &valid, seen).expect("desired");
        (valid, desired)
    }

    /// A pass of the route `yaml` against [`DEPLOYMENT`] (no pods): the
    /// route, what was observed, what it wants written.
    pub fn pass(yaml: &str) -> (GraceRoute, Observed, build::Desired) {
        let r = route(yaml);
        let seen = observed(&r, &[DEPLOYMENT], &[]);
        let (_, desired) = checked(&r, &seen);
        (r, seen, desired)
    }

    /// The condition `type_` of `status`.
    pub fn condition_of<'a>(
        status: &'a crate::crd::GraceRouteStatus,
        type_: &str,
    ) -> &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
        status
            .conditions
            .iter()
            .find(|c| c.type_ == type_)
            .expect("condition")
    }

    pub fn route(yaml: &str) -> GraceRoute {
        serde_norway::from_str(yaml).expect("route fixture")
    }

    /// What dereference reads for `route` when the namespace holds
    /// `deployments` and `pods`.
    pub fn observed(route: &GraceRoute, deployments: &[&str], pods: &[Pod]) -> Observed {
        let deployments: Vec<Deployment> = deployments
            .iter()
            .map(|y| serde_norway::from_str(y).expect("deployment fixture"))
            .collect();
        let workloads = Workloads::from_objects(&deployments, &[]);
        let (targets, overlaps) = claim_targets(route, &workloads, &[]);
        // What listing each Deployment's selector returns.
        let mut pods_by_selector: BTreeMap<String, std::collections::BTreeSet<String>> =
            BTreeMap::new();
        for d in &deployments {
            let Some(spec) = &d.spec else { continue };
            let (Some(key), Some(selector)) = (
                dereference::pod_selector(Some(&spec.selector)),
                dereference::selector_of(&spec.selector),
            ) else {
                continue;
            };
            let names = pods
                .iter()
                .filter(|p| selector.matches(p.labels()))
                .map(|p| p.name_any());
            pods_by_selector.entry(key).or_default().extend(names);
        }
        Observed {
            targets: targets.into_iter().cloned().collect(),
            overlaps,
            pods: pods.iter().map(|p| (p.name_any(), p.clone())).collect(),
            pods_by_selector,
            ..Observed::default()
        }
    }
}

#[cfg(test)]
mod mapper_tests {
    use super::*;

    const OWNED_CM: &str = "metadata:
  name: kubegrace-web
  namespace: shop
  resourceVersion: '9'
  ownerReferences:
  - {apiVersion: kubegrace.io/v1alpha1, kind: GraceRoute, name: web, uid: u1, controller: true}
  - {apiVersion: apps/v1, kind: Deployment, name: web, uid: u2}
";

    #[test]
    fn a_config_map_maps_to_its_owning_route_only() {
        let cm: ConfigMap = serde_norway::from_str(OWNED_CM).expect("cm");
        let refs = owning_routes(&cm);
        assert_eq!(refs.len(), 1, "{refs:?}");
        assert_eq!(refs[0].name, "web");
        assert_eq!(refs[0].namespace.as_deref(), Some("shop"));
        assert_eq!(refs[0].dyntype.kind, "GraceRoute");
    }

    #[test]
    fn a_workload_event_that_is_our_own_write_queues_nothing() {
        let store = Routes::default();
        let route: DynamicObject = serde_norway::from_str(fixtures::ROUTE).expect("route");
        store.apply(&watcher::Event::Init);
        store.apply(&watcher::Event::InitApply(route));
        store.apply(&watcher::Event::InitDone);
        let echoes = Arc::new(echoes::Echoes::default());
        let map = workload_mapper(
            store,
            echoes.clone(),
            TargetKind::Deployment,
            |d: &Deployment| d.spec.as_ref().map(|s| &s.template),
        );
        let mut d: Deployment = serde_norway::from_str(fixtures::DEPLOYMENT).expect("deployment");
        d.metadata.resource_version = Some("12".into());
        assert_eq!(
            map(d.clone()).len(),
            1,
            "someone else's change queues the route"
        );
        echoes.wrote(echoes::Kind::Deployment, &d.metadata);
        assert!(map(d.clone()).is_empty(), "our own write coming back");
        assert_eq!(map(d).len(), 1, "the same version again is news once more");
    }
}
