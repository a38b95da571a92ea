//! The caches as data (fed watch events), and the webhook's rule: a cached
//! injection needs no API call; every other cached answer asks the API
//! server, whose answer stands. The API server is `crate::testing`'s
//! scripted mock: a missing or an extra call fails the test.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kube::core::admission::AdmissionReview;
use kubegrace_api::fixtures::{decodable_route as good, undecodable_route as bad};
use serde_json::{Value, json};

use super::*;
use crate::testing::{Handle, answer, mock, no_more, scripted};
use crate::webhook::{Decision, SidecarSettings, Webhook};

fn ns_meta(name: &str, labels: Value) -> PartialObjectMeta<Namespace> {
    serde_json::from_value(json!({
        "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
        "metadata": {"name": name, "labels": labels, "resourceVersion": "1",
                     "managedFields": [{"manager": "kubectl", "operation": "Update"}]},
    }))
    .expect("namespace metadata")
}

/// Routes `objects` and namespace `shop` with `labels`, both listed (synced).
fn synced(labels: Value, objects: Vec<DynamicObject>) -> WebhookCache {
    let cache = WebhookCache::new(&[None]);
    let (namespaces, routes) = cache.caches("shop").expect("every namespace");
    namespaces.apply(Event::Init, namespace_entry);
    namespaces.apply(Event::InitApply(ns_meta("shop", labels)), namespace_entry);
    namespaces.apply(Event::InitDone, namespace_entry);
    routes.apply(Event::Init, route_entry);
    for o in objects {
        routes.apply(Event::InitApply(o), route_entry);
    }
    routes.apply(Event::InitDone, route_entry);
    cache
}

fn opted_in() -> Value {
    json!({keys::INJECT: "enabled"})
}

fn not_accepted(name: &str) -> DynamicObject {
    let mut r = good(name);
    r.data["status"] = json!({"conditions": [{"type": "Accepted", "status": "False",
        "reason": "UnknownPort", "message": "no port http", "lastTransitionTime": "2026-01-01T00:00:00Z"}]});
    r
}

#[test]
fn a_list_syncs_the_cache_and_a_relist_replaces_what_it_held() {
    let cache: Cache<RouteEntry> = Cache::default();
    assert!(!cache.is_synced());
    assert!(cache.in_namespace("shop").is_none(), "unsynced: no answer");
    cache.apply(Event::Init, route_entry);
    cache.apply(Event::InitApply(good("a")), route_entry);
    assert!(!cache.is_synced() && cache.is_empty(), "a list in progress");
    cache.apply(Event::InitDone, route_entry);
    assert!(cache.is_synced());
    cache.apply(Event::Apply(good("b")), route_entry);
    cache.apply(Event::Delete(good("a")), route_entry);
    let names = |c: &Cache<RouteEntry>| -> Vec<String> {
        c.in_namespace("shop")
            .expect("synced")
            .into_iter()
            .map(|e| e.map_or_else(|u| u.name, |r| r.name_any()))
            .collect()
    };
    assert_eq!(names(&cache), ["b"]);
    // A re-list: unsynced until done, then only what it listed.
    cache.apply(Event::Init, route_entry);
    assert!(!cache.is_synced());
    cache.apply(Event::InitApply(good("c")), route_entry);
    cache.apply(Event::InitDone, route_entry);
    assert_eq!(names(&cache), ["c"]);
    // A failed watch: no answer until its next list is done.
    cache.desync();
    assert!(cache.in_namespace("shop").is_none());
}

#[test]
fn a_namespace_reads_only_its_own_routes() {
    let cache: Cache<RouteEntry> = Cache::default();
    cache.apply(Event::Init, route_entry);
    for (ns, name) in [("sho", "a"), ("shop", "b"), ("shop", "c"), ("shop2", "d")] {
        let mut r = good(name);
        r.metadata.namespace = Some(ns.into());
        cache.apply(Event::InitApply(r), route_entry);
    }
    cache.apply(Event::InitDone, route_entry);
    let shop = cache.in_namespace("shop").expect("synced");
    assert_eq!(shop.len(), 2);
    assert!(cache.in_namespace("other").expect("synced").is_empty());
}

#[test]
fn the_cache_keeps_only_what_the_webhook_reads() {
    let mut r = good("web");
    r.metadata.managed_fields = ns_meta("x", json!({})).metadata.managed_fields;
    r.metadata.annotations = Some(
        [(
            "kubectl.kubernetes.io/last-applied-configuration".to_string(),
            "{...}".to_string(),
        )]
        .into(),
    );
    let route = route_entry(r).expect("decodes");
    assert!(route.metadata.managed_fields.is_none() && route.metadata.annotations.is_none());
    assert_eq!(route.spec.ports[0].name, "http");
    // Tolerant: an undecodable route is kept as why, not dropped or fatal.
    let u = route_entry(bad("b")).expect_err("undecodable");
    assert!(u.error.contains("consecutiveFailures"), "{}", u.error);
    let entry = namespace_entry(ns_meta(
        "shop",
        json!({keys::INJECT: "enabled", "team": "a", "kubernetes.io/metadata.name": "shop"}),
    ));
    assert_eq!(entry.as_deref(), Some("enabled"));
    assert_eq!(namespace_entry(ns_meta("shop", json!({"team": "a"}))), None);
}

#[test]
fn a_lookup_answers_only_when_both_caches_of_its_scope_are_synced() {
    let cache = synced(opted_in(), vec![good("web"), bad("broken")]);
    let (labels, listed) = cache.lookup("shop").expect("synced");
    assert_eq!(
        labels,
        [(keys::INJECT.to_string(), "enabled".to_string())].into()
    );
    assert_eq!(listed.routes.len(), 1);
    assert_eq!(listed.undecodable[0].name, "broken");
    // A namespace the synced cache does not hold has no labels (as a GET
    // that finds nothing).
    assert_eq!(cache.lookup("other").map(|(l, _)| l), Some(Labels::new()));
    let (namespaces, routes) = cache.caches("shop").expect("covered");
    routes.desync();
    assert!(cache.lookup("shop").is_none());
    routes.apply(Event::Init, route_entry);
    routes.apply(Event::InitDone, route_entry);
    namespaces.desync();
    assert!(cache.lookup("shop").is_none());
    // Scoped: a namespace outside the list is never answered from a cache.
    let scoped = WebhookCache::new(&[Some("shop".into())]);
    assert!(scoped.caches("other").is_none() && scoped.lookup("other").is_none());
    assert!(WebhookCache::default().lookup("shop").is_none());
}

#[test]
fn the_lookup_counters_exist_at_zero_and_count_by_source() {
    let m = LookupMetrics::default();
    m.cached();
    m.live(Fallback::NotInject);
    m.live(Fallback::NotInject);
    let mut text = String::new();
    m.render(&mut text);
    for line in [
        "kubegrace_operator_webhook_lookups_total{source=\"cache\",reason=\"inject\"} 1",
        "kubegrace_operator_webhook_lookups_total{source=\"live\",reason=\"unsynced\"} 0",
        "kubegrace_operator_webhook_lookups_total{source=\"live\",reason=\"not_inject\"} 2",
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
    }
    assert!(Metrics::default().render().contains(
        "kubegrace_operator_webhook_lookups_total{source=\"cache\",reason=\"inject\"} 0"
    ));
}

/// The watch loop against a scripted API server: a list syncs the cache; a
/// watch that fails desyncs it, and it is synced again only by a new list.
#[tokio::test]
async fn a_failed_watch_desyncs_the_cache_until_a_new_list_completes() {
    let (client, mut api) = mock();
    let cache: Arc<Cache<NamespaceEntry>> = Arc::default();
    let (stop_tx, stop) = watch::channel(false);
    let task = {
        let cache = cache.clone();
        let api = Api::<PartialObjectMeta<Namespace>>::all(client);
        let config = watcher::Config::default().any_semantic();
        let quick = (Duration::from_millis(1), Duration::from_millis(2));
        tokio::spawn(async move {
            fill(api, config, &cache, namespace_entry, "test", quick, stop).await;
        })
    };
    let list = |rv: &str| {
        json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadataList",
               "metadata": {"resourceVersion": rv},
               "items": [{"metadata": {"name": "shop", "resourceVersion": rv,
                                       "labels": {keys::INJECT: "enabled"}}}]})
    };
    let script = async {
        let seen = answer(&mut api, &list("10")).await;
        assert_eq!(seen.call(), ("GET", "/api/v1/namespaces"));
        assert!(!seen.query.contains("watch=true"), "{}", seen.query);
        // The watch starts once the list is applied: synced now.
        let (watch_req, send) = api.next_request().await.expect("the watch");
        assert!(
            watch_req
                .uri()
                .query()
                .unwrap_or_default()
                .contains("watch=true")
        );
        assert!(cache.is_synced());
        assert_eq!(
            cache.cluster_scoped("shop"),
            Some(Some(Some("enabled".into())))
        );
        send.send_response(
            http::Response::builder()
                .status(500)
                .body(kube::client::Body::from(
                    serde_json::to_vec(&json!({"kind": "Status", "apiVersion": "v1",
                        "status": "Failure", "message": "etcd is sad", "code": 500}))
                    .expect("json"),
                ))
                .expect("response"),
        );
        // Next comes a new list, not a resumed watch; unsynced until it is done.
        let (relist, send) = api.next_request().await.expect("a new list");
        assert!(
            !relist
                .uri()
                .query()
                .unwrap_or_default()
                .contains("watch=true")
        );
        assert!(
            !cache.is_synced(),
            "a failed watch leaves the cache unsynced"
        );
        send.send_response(
            http::Response::builder()
                .body(kube::client::Body::from(
                    serde_json::to_vec(&list("11")).expect("json"),
                ))
                .expect("response"),
        );
        let _watch_again = api.next_request().await.expect("the second watch");
        assert!(cache.is_synced());
    };
    tokio::time::timeout(Duration::from_secs(5), script)
        .await
        .expect("the watch loop made its calls");
    let _ = stop_tx.send(true);
    tokio::time::timeout(Duration::from_secs(1), task)
        .await
        .expect("stopped")
        .expect("no panic");
}

// --- The rule, through `Webhook::review` ---------------------------------

/// Pinned to route `web`; asks for the sidecar by its own label unless
/// `own_label` is false (then only the namespace label can ask).
fn pod(own_label: bool) -> Pod {
    let labels = if own_label {
        json!({"app": "web", keys::INJECT: "enabled"})
    } else {
        json!({"app": "web"})
    };
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web-1", "namespace": "shop", "labels": labels,
                     "annotations": {keys::ROUTE: "web"}},
        "spec": {"containers": [{"name": "app", "image": "app",
                                 "ports": [{"name": "http", "containerPort": 8080}]}]},
    }))
    .expect("pod")
}

fn settings() -> SidecarSettings {
    SidecarSettings {
        image: "sidecar:test".into(),
        pull_policy: "IfNotPresent".into(),
        resources: crate::webhook::resources("", "", "", ""),
        log_level: None,
        run_as_user: Some(crate::inject::SIDECAR_UID),
        native: true,
        ports: crate::inject::Ports::default(),
    }
}

/// Reviews the CREATE of `pod` with `cache` while `script` answers for the
/// API server; the answer, its outcome and the metrics text.
async fn review<S, F>(
    cache: WebhookCache,
    pod: &Pod,
    script: S,
) -> (AdmissionReview<DynamicObject>, &'static str, String)
where
    S: FnOnce(Handle) -> F,
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let (client, handle) = mock();
    let hook = Webhook {
        client,
        metrics: Arc::new(Metrics::default()),
        settings: settings(),
        cache: Arc::new(cache),
    };
    let body = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "u-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "operation": "CREATE", "userInfo": {}, "object": pod,
            "namespace": "shop", "name": "web-1"
        }
    });
    let req = crate::server::check_review(
        &serde_json::to_vec(&body).expect("json"),
        crate::server::Endpoint::Mutate,
        &[],
    )
    .expect("a well-formed review");
    let (out, result) = scripted(script(handle), hook.review(req)).await;
    (out, result, hook.metrics.render())
}

/// The API server of today's live lookup: namespace `shop` with `labels`
/// (`None`: the namespace must not be read, the pod's own label decides),
/// then its GraceRoutes `routes`; nothing else.
fn live(labels: Option<Value>, routes: Vec<DynamicObject>) -> impl FnOnce(Handle) -> BoxedScript {
    move |mut api| {
        Box::pin(async move {
            if let Some(labels) = labels {
                let ns = json!({"apiVersion": "v1", "kind": "Namespace",
                                "metadata": {"name": "shop", "labels": labels}});
                let seen = answer(&mut api, &ns).await;
                assert_eq!(seen.call(), ("GET", "/api/v1/namespaces/shop"));
            }
            let list = json!({"apiVersion": "kubegrace.io/v1alpha1", "kind": "GraceRouteList",
                              "metadata": {"resourceVersion": "5"}, "items": routes});
            let seen = answer(&mut api, &list).await;
            assert_eq!(
                seen.call(),
                (
                    "GET",
                    "/apis/kubegrace.io/v1alpha1/namespaces/shop/graceroutes"
                )
            );
            no_more(&mut api).await;
        })
    }
}

type BoxedScript = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

fn no_api_call(mut api: Handle) -> BoxedScript {
    Box::pin(async move { no_more(&mut api).await })
}

fn counted(metrics: &str, source: &str, reason: &str) -> bool {
    metrics.lines().any(|l| {
        l == format!(
            "kubegrace_operator_webhook_lookups_total{{source=\"{source}\",reason=\"{reason}\"}} 1"
        )
    })
}

#[tokio::test]
async fn a_cached_injection_is_answered_without_an_api_call() {
    let (out, result, metrics) = review(
        synced(json!({}), vec![good("web")]),
        &pod(true),
        no_api_call,
    )
    .await;
    assert_eq!(result, "injected");
    let resp = out.response.expect("response");
    assert!(resp.allowed && resp.patch.is_some());
    assert_eq!(resp.uid, "u-1");
    assert!(counted(&metrics, "cache", "inject"), "{metrics}");
    // The namespace label alone asks for it too.
    let (_, result, _) = review(
        synced(opted_in(), vec![good("web")]),
        &pod(false),
        no_api_call,
    )
    .await;
    assert_eq!(result, "injected");
}

/// Each cached answer that is not to inject, against an API server that
/// says inject: the pod is injected every time. With the fallback removed
/// (the cached answer used whatever it is) this test fails: the API server
/// is never asked and the pod is admitted bare.
#[tokio::test]
async fn every_other_cached_answer_asks_the_api_server_and_its_answer_stands() {
    let cases: [(&str, WebhookCache, Pod, &str); 6] = [
        // Stale: the route was created just before the pod, the watch has
        // not delivered it yet.
        (
            "route not cached yet",
            synced(json!({}), vec![]),
            pod(true),
            "not_inject",
        ),
        (
            "cached route not accepted",
            synced(json!({}), vec![not_accepted("web")]),
            pod(true),
            "not_inject",
        ),
        (
            "cached route undecodable",
            synced(json!({}), vec![bad("web")]),
            pod(true),
            "not_inject",
        ),
        // The namespace was labelled just before the pod.
        (
            "cached namespace not opted in",
            synced(json!({}), vec![good("web")]),
            pod(false),
            "not_inject",
        ),
        (
            "caches not synced",
            WebhookCache::new(&[None]),
            pod(true),
            "unsynced",
        ),
        ("no caches", WebhookCache::default(), pod(true), "unsynced"),
    ];
    for (case, cache, pod, reason) in cases {
        // The namespace is read only for a pod that leaves it the choice.
        let own = crate::inject::own_choice(&pod).is_some();
        let ns = (!own).then(opted_in);
        let (out, result, metrics) = review(cache, &pod, live(ns, vec![good("web")])).await;
        assert_eq!(result, "injected", "{case}");
        assert!(out.response.expect("response").patch.is_some(), "{case}");
        assert!(counted(&metrics, "live", reason), "{case}: {metrics}");
    }
}

#[tokio::test]
async fn a_failed_watch_sends_reviews_to_the_api_server_until_it_lists_again() {
    let cache = synced(json!({}), vec![good("web")]);
    cache.caches("shop").expect("covered").1.desync();
    let (_, result, metrics) = review(cache, &pod(true), live(None, vec![good("web")])).await;
    assert_eq!(result, "injected");
    assert!(counted(&metrics, "live", "unsynced"), "{metrics}");
}

/// The live answer stands when it is not to inject either: skipped with the
/// reason, never the cache's word.
#[tokio::test]
async fn the_api_servers_skip_stands_when_the_cache_has_no_route() {
    let (out, result, _) = review(synced(json!({}), vec![]), &pod(true), live(None, vec![])).await;
    assert_eq!(result, "skipped");
    let warnings = out.response.expect("response").warnings.unwrap_or_default();
    assert!(
        warnings.iter().any(|w| w.contains("GraceRoute web")),
        "{warnings:?}"
    );
}

/// An injected pod is answered before any lookup, cached or live.
#[tokio::test]
async fn an_injected_pod_needs_no_lookup() {
    let Decision::Inject(injected, _) = crate::webhook::decide(
        &pod(true),
        &Labels::new(),
        &[GraceRoute::clone(
            &route_entry(good("web")).expect("decodes"),
        )],
        &settings(),
        "tok".into(),
    ) else {
        panic!("expected injection");
    };
    let (_, result, metrics) = review(WebhookCache::default(), &injected, no_api_call).await;
    assert_eq!(result, "ignored");
    assert!(
        metrics.contains("lookups_total{source=\"live\",reason=\"unsynced\"} 0"),
        "{metrics}"
    );
}

/// A pod that opts out by its own label is answered at once: no lookup,
/// cached or live, whatever the namespace says.
#[tokio::test]
async fn a_pod_that_opts_out_itself_needs_no_lookup() {
    let mut opted_out = pod(true);
    opted_out
        .metadata
        .labels
        .get_or_insert_default()
        .insert(keys::INJECT.into(), "disabled".into());
    let (out, result, metrics) = review(WebhookCache::default(), &opted_out, no_api_call).await;
    assert_eq!(result, "ignored");
    assert!(out.response.expect("response").patch.is_none());
    assert!(
        metrics.contains("lookups_total{source=\"live\",reason=\"unsynced\"} 0"),
        "{metrics}"
    );
}
