//! Counts the operator's requests to the API server, by client, verb and
//! resource: `kubegrace_operator_api_requests_total`.
//!
//! A tower layer on each kube client ([`counted_client`]), so every request
//! is counted where it leaves, whoever made it (a reconcile, a watch, the
//! webhook's live lookups, the Lease). The route controller gets a client
//! of its own (`client="routes"`), so the requests its reconciles make can
//! be told apart from the rest (`client="other"`: the inject controllers,
//! the webhook, the Lease, the certificates); with the route reconciles
//! counted here too (`kubegrace_operator_route_reconciles_total`),
//! `make bench-scale` divides one by the other to show that a reconcile
//! asks the same few things whatever the size of the cluster.
//!
//! The verb is read from the request the way the API server's audit log
//! names it (`list` and `watch` are GETs of a collection), and the resource
//! is the path segment after the namespace or group version: a handful of
//! values the operator's own code chooses, never anything a user controls
//! (an unknown shape is counted as `other`, so the series stay bounded).

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use kube::client::ClientBuilder;
use kube::{Client, Config};
use kubegrace_sidecar_api::exposition::Family;

use crate::{Error, Result};

/// Which client made a request.
pub const CLIENTS: [&str; 2] = ["routes", "other"];

/// Resources the operator reads or writes; anything else is `other`.
const RESOURCES: [&str; 20] = [
    "graceroutes",
    "pods",
    "deployments",
    "statefulsets",
    "rollouts",
    "replicasets",
    "services",
    "configmaps",
    "secrets",
    "namespaces",
    "networkpolicies",
    "events",
    "leases",
    "endpointslices",
    "mutatingwebhookconfigurations",
    "validatingwebhookconfigurations",
    "subjectaccessreviews",
    "selfsubjectaccessreviews",
    "version",
    "discovery",
];

const VERBS: [&str; 8] = [
    "get", "list", "watch", "create", "update", "patch", "delete", "other",
];

/// Request counts by (client, verb, resource).
#[derive(Debug, Default)]
pub struct ApiRequests {
    counts: Mutex<std::collections::BTreeMap<(&'static str, &'static str, &'static str), u64>>,
    route_reconciles: AtomicU64,
}

/// The resource a request path names (bounded to [`RESOURCES`]).
fn resource_of(path: &str) -> &'static str {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    // /api/v1/..., /apis/GROUP/VERSION/...
    let rest = match segments.as_slice() {
        ["version", ..] => return "version",
        ["api", _version, rest @ ..] | ["apis", _, _version, rest @ ..] => rest,
        ["api" | "apis", ..] => return "discovery",
        _ => return "other",
    };
    let kind = match rest {
        [] => return "discovery",
        ["namespaces", _ns, kind, ..] => kind,
        [kind, ..] => kind,
    };
    RESOURCES
        .iter()
        .find(|r| *r == kind)
        .copied()
        .unwrap_or("other")
}

/// Whether the path names one object (`.../KIND/NAME[/SUBRESOURCE]`) rather
/// than a collection.
fn names_an_object(path: &str) -> bool {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let rest = match segments.as_slice() {
        ["version"] => return true,
        ["api", _, rest @ ..] | ["apis", _, _, rest @ ..] => rest,
        _ => return false,
    };
    match rest {
        ["namespaces", _ns] => true,
        ["namespaces", _, _, rest @ ..] | [_, rest @ ..] => !rest.is_empty(),
        [] => false,
    }
}

/// The audit-log verb of a request.
pub fn verb_of(method: &http::Method, path: &str, query: Option<&str>) -> &'static str {
    let watch = query.is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"));
    match *method {
        http::Method::GET if watch => "watch",
        http::Method::GET if names_an_object(path) => "get",
        http::Method::GET => "list",
        http::Method::POST => "create",
        http::Method::PUT => "update",
        http::Method::PATCH => "patch",
        http::Method::DELETE => "delete",
        _ => "other",
    }
}

impl ApiRequests {
    /// One request of `client` ([`CLIENTS`]).
    pub fn count<B>(&self, client: &'static str, req: &http::Request<B>) {
        let uri = req.uri();
        let verb = verb_of(req.method(), uri.path(), uri.query());
        let resource = resource_of(uri.path());
        *self
            .counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry((client, verb, resource))
            .or_default() += 1;
    }

    /// One pass of the route controller's reconcile (the requests it made
    /// are counted as they leave).
    pub fn route_reconciled(&self) {
        self.route_reconciles.fetch_add(1, Ordering::Relaxed);
    }

    /// Requests of `client` with `verb` (every resource).
    pub fn total(&self, client: &str, verb: &str) -> u64 {
        self.counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .filter(|((c, v, _), _)| *c == client && *v == verb)
            .map(|(_, n)| n)
            .sum()
    }

    /// Prometheus text: each client's verbs present from the start (at 0),
    /// the resources as they are used.
    pub fn render(&self, out: &mut String) {
        let mut counts = self
            .counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        for client in CLIENTS {
            for verb in VERBS {
                counts.entry((client, verb, "any")).or_default();
            }
        }
        let mut family = Family::new(
            out,
            "kubegrace_operator_api_requests_total",
            "counter",
            "Requests sent to the API server, by client (routes: the route controller; other), verb and resource (resource=\"any\" is 0: it makes every verb's series exist from the start).",
        );
        for ((client, verb, resource), n) in counts {
            family.series(
                format_args!("client=\"{client}\",verb=\"{verb}\",resource=\"{resource}\""),
                n,
            );
        }
        Family::new(
            out,
            "kubegrace_operator_route_reconciles_total",
            "counter",
            "Passes of the route controller's reconcile (kubegrace_operator_reconcile_total also counts the inject controllers').",
        )
        .value(self.route_reconciles.load(Ordering::Relaxed));
    }
}

/// The tower layer that counts a client's requests.
#[derive(Clone)]
pub struct CountLayer {
    counts: Arc<ApiRequests>,
    client: &'static str,
}

impl<S> tower::Layer<S> for CountLayer {
    type Service = Counted<S>;
    fn layer(&self, inner: S) -> Counted<S> {
        Counted {
            inner,
            counts: self.counts.clone(),
            client: self.client,
        }
    }
}

#[derive(Clone)]
pub struct Counted<S> {
    inner: S,
    counts: Arc<ApiRequests>,
    client: &'static str,
}

impl<S, B> tower::Service<http::Request<B>> for Counted<S>
where
    S: tower::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<std::result::Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> S::Future {
        self.counts.count(self.client, &req);
        self.inner.call(req)
    }
}

/// A client from `config` whose requests are counted in `counts` as
/// `client`'s ([`CLIENTS`]).
pub fn counted_client(
    config: Config,
    counts: &Arc<ApiRequests>,
    client: &'static str,
) -> Result<Client> {
    let layer = CountLayer {
        counts: counts.clone(),
        client,
    };
    Ok(ClientBuilder::try_from(config)
        .map_err(|e| Error::Config(format!("building the API client: {e}")))?
        .with_layer(&layer)
        .build())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(method: &str, uri: &str) -> http::Request<()> {
        http::Request::builder()
            .method(method)
            .uri(uri)
            .body(())
            .expect("request")
    }

    #[test]
    fn verbs_and_resources_are_read_as_the_audit_log_names_them() {
        // "METHOD URI VERB RESOURCE"
        let cases = [
            "GET /api/v1/namespaces/shop/pods?labelSelector=app%3Dweb list pods",
            "GET /api/v1/pods?watch=true&resourceVersion=5 watch pods",
            "GET /api/v1/namespaces/shop get namespaces",
            "GET /api/v1/namespaces list namespaces",
            "GET /apis/apps/v1/namespaces/shop/deployments list deployments",
            "GET /api/v1/namespaces/shop/configmaps/web-kubegrace get configmaps",
            "PATCH /apis/kubegrace.io/v1alpha1/namespaces/shop/graceroutes/web/status patch graceroutes",
            "POST /apis/events.k8s.io/v1/namespaces/shop/events create events",
            "PUT /apis/coordination.k8s.io/v1/namespaces/kg/leases/kg update leases",
            "GET /version get version",
            "GET /apis/argoproj.io/v1alpha1 list discovery",
            "GET /apis/example.com/v1/namespaces/x/widgets list other",
        ];
        let counts = ApiRequests::default();
        for case in cases {
            let [method, uri, verb, resource] = case.split(' ').collect::<Vec<_>>()[..] else {
                panic!("a case is four words: {case}");
            };
            let r = req(method, uri);
            assert_eq!(
                (
                    verb_of(r.method(), r.uri().path(), r.uri().query()),
                    resource_of(r.uri().path())
                ),
                (verb, resource),
                "{method} {uri}"
            );
            counts.count("routes", &r);
        }
        assert_eq!(counts.total("routes", "list"), 5);
        assert_eq!(counts.total("other", "list"), 0);
        let mut text = String::new();
        counts.render(&mut text);
        assert!(
            text.contains(
                "kubegrace_operator_api_requests_total{client=\"routes\",verb=\"list\",resource=\"pods\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "kubegrace_operator_api_requests_total{client=\"other\",verb=\"watch\",resource=\"any\"} 0"
            ),
            "{text}"
        );
    }

    /// The layer counts each request once, as it passes to the service it
    /// wraps.
    #[tokio::test]
    async fn the_layer_counts_what_passes_through() {
        use tower::{Layer, ServiceExt};
        let counts = Arc::new(ApiRequests::default());
        let layer = CountLayer {
            counts: counts.clone(),
            client: "other",
        };
        let svc = layer.layer(tower::service_fn(|_: http::Request<()>| async {
            Ok::<_, std::convert::Infallible>(())
        }));
        svc.clone()
            .oneshot(req("GET", "/api/v1/namespaces/a/pods"))
            .await
            .expect("call");
        svc.oneshot(req("GET", "/api/v1/namespaces/a/pods?watch=1"))
            .await
            .expect("call");
        assert_eq!(counts.total("other", "list"), 1);
        assert_eq!(counts.total("other", "watch"), 1);
        assert_eq!(counts.total("routes", "list"), 0);
    }
}
