//! The injection webhook's watch caches: the inject label of each
//! namespace and the GraceRoutes, kept by watches so that most reviews need
//! no API call. A pod storm is when the API server is busiest, and two
//! calls per review (a namespace GET and a GraceRoute LIST) put the webhook's
//! added latency at p99 130 ms with 200 routes and 2,000 pods
//! (`make bench-scale`).
//!
//! The rule ([`crate::webhook::Webhook::review`]): the cached answer is used
//! only when it is to inject. Anything else the cache would say (the
//! namespace not opted in, no route for the pod, a route not accepted or not
//! decodable, or the caches not synced) is asked again of the API server,
//! whose answer stands. A cache that lags can then only delay a pod's
//! answer, never make it start bare or unmarked: a GraceRoute created a
//! millisecond before its Deployment still injects. The cost is a stale
//! positive answer: a route deleted or a namespace label removed in the last
//! moments of watch lag still injects, as a live lookup an instant earlier
//! would have (a route is deleted through its finalizer, so its
//! deletionTimestamp arrives first and [`crate::route_match::pick_route`]
//! already passes over it).
//!
//! Scoped like the controllers ([`crate::scope`]): one watch of each kind
//! over every namespace, or one per watched namespace (namespaced RBAC: the
//! GraceRoutes of that namespace, and that one namespace by
//! `fieldSelector=metadata.name`, the only way a `resourceNames` rule allows
//! a list or watch). Every replica runs them: every replica serves the
//! webhook, and the controllers' stores exist on the leader only.
//!
//! The caches hold what the webhook reads and nothing else: a namespace's
//! inject label (its metadata is watched, never its spec), and each route
//! decoded once per watch event (the webhook reads every route of the
//! namespace on every review) without its managedFields and annotations
//! (`kubectl apply` keeps a second copy of the spec in one). A route that
//! does not decode is kept as its [`Undecodable`] (the same tolerant
//! semantics as [`crate::tolerant::list`]). Measured
//! (`operator/tests/webhook_cache_memory.rs`, a kubectl-applied, reconciled
//! route): 2.2 KiB per route and 154 bytes per namespace, where a reflector
//! store of what the watch delivers would hold 15.7 and 3.2 KiB; 2,000
//! routes in 200 namespaces take some 4.4 MiB.
//!
//! A cache is synced from the end of its first list until its watch fails;
//! a failed watch starts over with a new list (after a backoff), so a synced
//! cache is never older than its watch connection.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::core::{DynamicObject, PartialObjectMeta};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource, ResourceExt};
use kubegrace_sidecar_api::exposition::Family;
use serde::de::DeserializeOwned;
use tokio::sync::watch;

use crate::admin::Metrics;
use crate::crd::GraceRoute;
use crate::keys;
use crate::tolerant::{Undecodable, into_typed};

/// A namespace's labels, as the webhook reads them.
pub type Labels = BTreeMap<String, String>;

/// A cached route: decoded, or why it does not decode. Behind an `Arc` so
/// the cache's B-tree nodes hold a pointer, not the 1,168-byte route in
/// each of their slots (measured: 3.1 KiB per route inline).
pub type RouteEntry = std::result::Result<Arc<GraceRoute>, Undecodable>;

/// A namespace's routes as the cache holds them: shared, not copied, per
/// review (a route may carry kilobytes of fallback bodies).
#[derive(Debug, Default)]
pub struct CachedListing {
    pub routes: Vec<Arc<GraceRoute>>,
    pub undecodable: Vec<Undecodable>,
}

/// A cached namespace: the value of its inject label, if it has one.
pub type NamespaceEntry = Option<String>;

/// `(namespace, name)`; the namespace is empty for a namespace itself.
type Key = (String, String);

/// First and last wait before a failed watch lists again.
const BACKOFF: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(30));

#[derive(Debug)]
struct Objects<V> {
    objects: BTreeMap<Key, V>,
    /// A list in progress: it replaces `objects` when complete.
    listing: Option<BTreeMap<Key, V>>,
    synced: bool,
}

impl<V> Default for Objects<V> {
    fn default() -> Self {
        Self {
            objects: BTreeMap::new(),
            listing: None,
            synced: false,
        }
    }
}

/// The objects of `namespace` in `objects` (keys sort by namespace first).
fn namespace_objects<V: Clone>(objects: &BTreeMap<Key, V>, namespace: &str) -> Vec<V> {
    let from = (namespace.to_string(), String::new());
    objects
        .range(from..)
        .take_while(|((ns, _), _)| ns == namespace)
        .map(|(_, v)| v.clone())
        .collect()
}

/// One watch's objects, converted by the watch's `convert` (pure data:
/// tested by feeding it watch events).
#[derive(Debug)]
pub struct Cache<V> {
    state: RwLock<Objects<V>>,
}

impl<V> Default for Cache<V> {
    fn default() -> Self {
        Self {
            state: RwLock::default(),
        }
    }
}

impl<V: Clone> Cache<V> {
    /// Applies one watch event; `convert` keeps what the webhook reads.
    pub fn apply<K: Resource>(&self, event: Event<K>, convert: impl Fn(K) -> V) {
        let key = |o: &K| (o.namespace().unwrap_or_default(), o.name_any());
        let mut s = self.state.write().unwrap_or_else(PoisonError::into_inner);
        match event {
            // A (re-)list starts: the objects held are of an older state.
            Event::Init => {
                s.listing = Some(BTreeMap::new());
                s.synced = false;
            }
            Event::InitApply(o) => {
                let k = key(&o);
                s.listing.get_or_insert_default().insert(k, convert(o));
            }
            Event::InitDone => {
                s.objects = s.listing.take().unwrap_or_default();
                s.synced = true;
            }
            Event::Apply(o) => {
                let k = key(&o);
                s.objects.insert(k, convert(o));
            }
            Event::Delete(o) => {
                s.objects.remove(&key(&o));
            }
        }
    }

    /// The watch failed: nothing is answered from here until its next list
    /// is complete.
    pub fn desync(&self) {
        self.state
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .synced = false;
    }

    pub fn is_synced(&self) -> bool {
        self.state
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .synced
    }

    /// The objects of `namespace`; `None` while not synced.
    fn in_namespace(&self, namespace: &str) -> Option<Vec<V>> {
        let s = self.state.read().unwrap_or_else(PoisonError::into_inner);
        s.synced.then(|| namespace_objects(&s.objects, namespace))
    }

    /// The objects of `namespace` held now, synced or not: during a
    /// re-list, those of the last complete list and the changes since
    /// (the route controller's reading, like kube-rs's store).
    pub fn held_in_namespace(&self, namespace: &str) -> Vec<V> {
        let s = self.state.read().unwrap_or_else(PoisonError::into_inner);
        namespace_objects(&s.objects, namespace)
    }

    /// Whether `namespace/name` is held now, synced or not.
    pub fn holds(&self, namespace: &str, name: &str) -> bool {
        let s = self.state.read().unwrap_or_else(PoisonError::into_inner);
        s.objects
            .contains_key(&(namespace.to_string(), name.to_string()))
    }

    /// The cluster-scoped object `name` (`Some(None)`: synced, not there);
    /// `None` while not synced.
    fn cluster_scoped(&self, name: &str) -> Option<Option<V>> {
        let s = self.state.read().unwrap_or_else(PoisonError::into_inner);
        s.synced
            .then(|| s.objects.get(&(String::new(), name.to_string())).cloned())
    }

    /// Objects held (for the memory test and the logs).
    pub fn len(&self) -> usize {
        self.state
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .objects
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What the webhook keeps of a namespace: its inject label, the only one
/// [`kubegrace_api::inject::wants_injection`] reads (a one-entry label map
/// would cost a whole B-tree node, some 550 bytes).
pub fn namespace_entry(ns: PartialObjectMeta<Namespace>) -> NamespaceEntry {
    ns.metadata.labels.and_then(|mut l| l.remove(keys::INJECT))
}

/// The namespace's labels as the webhook reads them.
fn labels_of(entry: NamespaceEntry) -> Labels {
    entry
        .map(|v| Labels::from([(keys::INJECT.to_string(), v)]))
        .unwrap_or_default()
}

/// What the webhook keeps of a route: decoded once, without the metadata
/// the webhook never reads (managedFields; annotations, where `kubectl
/// apply` keeps a copy of the whole object).
pub fn route_entry(mut obj: DynamicObject) -> RouteEntry {
    obj.metadata.managed_fields = None;
    obj.metadata.annotations = None;
    let (namespace, name) = (obj.namespace().unwrap_or_default(), obj.name_any());
    into_typed(obj).map(Arc::new).map_err(|error| {
        tracing::warn!(%namespace, route = %name, %error, "GraceRoute does not decode; left out of the webhook's cache");
        Undecodable {
            namespace,
            name,
            error,
        }
    })
}

/// The caches of one scope: every namespace (`None`) or one.
struct Scoped {
    scope: Option<String>,
    namespaces: Arc<Cache<NamespaceEntry>>,
    routes: Arc<Cache<RouteEntry>>,
}

/// The webhook's caches, one pair per scope of [`crate::scope::namespaces`].
/// The default has none: every lookup is a miss (tests, and the webhook
/// before [`WebhookCache::spawn`]).
#[derive(Default)]
pub struct WebhookCache {
    scopes: Vec<Scoped>,
}

impl WebhookCache {
    /// Empty, unsynced caches for `namespaces` (as [`crate::scope::namespaces`]
    /// gives them).
    pub fn new(namespaces: &[Option<String>]) -> Self {
        Self {
            scopes: namespaces
                .iter()
                .map(|scope| Scoped {
                    scope: scope.clone(),
                    namespaces: Arc::default(),
                    routes: Arc::default(),
                })
                .collect(),
        }
    }

    fn scope(&self, namespace: &str) -> Option<&Scoped> {
        self.scopes
            .iter()
            .find(|s| s.scope.as_deref().is_none_or(|w| w == namespace))
    }

    /// The namespace's labels and routes, as the live lookup would return
    /// them; `None` when a cache covering `namespace` is not synced (or
    /// none covers it).
    pub fn lookup(&self, namespace: &str) -> Option<(Labels, CachedListing)> {
        let scoped = self.scope(namespace)?;
        // A namespace missing from a synced cache has no labels, as a live
        // GET that finds nothing.
        let labels = labels_of(scoped.namespaces.cluster_scoped(namespace)?.flatten());
        let mut listed = CachedListing::default();
        for entry in scoped.routes.in_namespace(namespace)? {
            match entry {
                Ok(r) => listed.routes.push(r),
                Err(u) => listed.undecodable.push(u),
            }
        }
        Some((labels, listed))
    }

    /// The caches of `namespace` (tests fill them with watch events).
    pub fn caches(&self, namespace: &str) -> Option<(&Cache<NamespaceEntry>, &Cache<RouteEntry>)> {
        self.scope(namespace)
            .map(|s| (s.namespaces.as_ref(), s.routes.as_ref()))
    }

    /// Starts the watches that fill the caches, each supervised (a panic
    /// restarts it), until `stop` is set.
    pub fn spawn(
        &self,
        client: &Client,
        metrics: &Arc<Metrics>,
        stop: &watch::Receiver<bool>,
        tasks: &mut tokio::task::JoinSet<()>,
    ) {
        for s in &self.scopes {
            let ns_config = match &s.scope {
                None => watcher::Config::default(),
                Some(ns) => watcher::Config::default().fields(&format!("metadata.name={ns}")),
            };
            let what = |kind: &str| format!("{kind} ({})", s.scope.as_deref().unwrap_or("all"));
            spawn_watch(
                Api::<PartialObjectMeta<Namespace>>::all(client.clone()),
                ns_config.any_semantic(),
                s.namespaces.clone(),
                namespace_entry,
                Watch {
                    what: what("namespaces"),
                    metrics: metrics.clone(),
                    stop: stop.clone(),
                },
                tasks,
            );
            spawn_watch(
                crate::tolerant::api(client, s.scope.as_deref()),
                watcher::Config::default().any_semantic(),
                s.routes.clone(),
                route_entry,
                Watch {
                    what: what("graceroutes"),
                    metrics: metrics.clone(),
                    stop: stop.clone(),
                },
                tasks,
            );
        }
    }
}

/// What a watch task needs besides its API and cache.
#[derive(Clone)]
struct Watch {
    what: String,
    metrics: Arc<Metrics>,
    stop: watch::Receiver<bool>,
}

fn spawn_watch<K, V>(
    api: Api<K>,
    config: watcher::Config,
    cache: Arc<Cache<V>>,
    convert: fn(K) -> V,
    w: Watch,
    tasks: &mut tokio::task::JoinSet<()>,
) where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    V: Clone + Send + Sync + 'static,
{
    tasks.spawn(async move {
        let make = || {
            let (api, config, cache, w) = (api.clone(), config.clone(), cache.clone(), w.clone());
            async move { fill(api, config, &cache, convert, &w.what, BACKOFF, w.stop).await }
        };
        let stop = || {
            let mut rx = w.stop.clone();
            async move {
                let _ = rx.wait_for(|v| *v).await;
            }
        };
        crate::panics::supervise(&w.what, &w.metrics, make, stop).await;
    });
}

/// Fills `cache` from a watch until `stop` is set. A failed watch desyncs
/// the cache and starts over with a list after a wait between `backoff.0`
/// and `backoff.1` (kube's watcher would resume it from its last
/// resourceVersion without a word, so the cache could not tell when it is
/// current again).
async fn fill<K, V>(
    api: Api<K>,
    config: watcher::Config,
    cache: &Cache<V>,
    convert: fn(K) -> V,
    what: &str,
    backoff_range: (Duration, Duration),
    mut stop: watch::Receiver<bool>,
) where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    V: Clone,
{
    let mut backoff = backoff_range.0;
    loop {
        let mut events = std::pin::pin!(watcher::watcher(api.clone(), config.clone()));
        loop {
            let next = tokio::select! {
                next = events.next() => next,
                _ = stop.wait_for(|v| *v) => return,
            };
            match next {
                Some(Ok(event)) => {
                    if matches!(event, Event::InitDone) {
                        backoff = backoff_range.0;
                        tracing::debug!(what, "webhook cache synced");
                    }
                    cache.apply(event, convert);
                }
                Some(Err(e)) => {
                    cache.desync();
                    tracing::warn!(what, error = %e, retry_in = ?backoff, "webhook cache watch failed; reviews go to the API server until it lists again");
                    break;
                }
                None => {
                    cache.desync();
                    break;
                }
            }
        }
        tokio::select! {
            () = tokio::time::sleep(backoff) => {}
            _ = stop.wait_for(|v| *v) => return,
        }
        backoff = backoff.saturating_mul(2).min(backoff_range.1);
    }
}

/// Why a review's answer came from the API server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fallback {
    /// No synced cache covers the namespace.
    Unsynced,
    /// The cached answer was not to inject: the API server decides.
    NotInject,
}

/// How the webhook's reviews were answered: from the caches or the API
/// server, and why (`kubegrace_operator_webhook_lookups_total`).
#[derive(Default)]
pub struct LookupMetrics {
    cache: AtomicU64,
    unsynced: AtomicU64,
    not_inject: AtomicU64,
}

impl LookupMetrics {
    /// One review answered from the caches.
    pub fn cached(&self) {
        self.cache.fetch_add(1, Ordering::Relaxed);
    }

    /// One review answered by the API server, and why.
    pub fn live(&self, why: Fallback) {
        match why {
            Fallback::Unsynced => &self.unsynced,
            Fallback::NotInject => &self.not_inject,
        }
        .fetch_add(1, Ordering::Relaxed);
    }

    /// Prometheus text, every series present from the start.
    pub fn render(&self, out: &mut String) {
        let mut family = Family::new(
            out,
            "kubegrace_operator_webhook_lookups_total",
            "counter",
            "Pod reviews that needed a lookup, by where the answer came from: the watch caches (only ever to inject), \
             or the API server (the caches not synced, or their answer was not to inject).",
        );
        for (source, reason, n) in [
            ("cache", "inject", &self.cache),
            ("live", "unsynced", &self.unsynced),
            ("live", "not_inject", &self.not_inject),
        ] {
            family.series(
                format_args!("source=\"{source}\",reason=\"{reason}\""),
                n.load(Ordering::Relaxed),
            );
        }
    }
}

#[cfg(test)]
#[path = "webhook_cache_tests.rs"]
mod tests;
