//! Admin port: `/healthz` (process up), `/readyz` (serving certificate
//! loaded and webhook listening), `/metrics` (Prometheus text).
//!
//! Metrics are a handful of counters and histograms, written through the
//! contract's exposition writer (`kubegrace_sidecar_api::exposition`),
//! which the sidecar's `/metrics` uses too.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use kubegrace_sidecar_api::exposition::{Escaped, Family};
use tokio::net::TcpListener;

use crate::{Error, Result};

const BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];

#[derive(Default)]
pub struct Histogram {
    counts: [AtomicU64; 12],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        for (i, b) in BUCKETS.iter().enumerate() {
            if secs <= *b {
                self.counts[i].fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_micros.fetch_add(
            u64::try_from(d.as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    fn render(&self, name: &str, help: &str, out: &mut String) {
        let mut family = Family::new(out, name, "histogram", help);
        for (i, b) in BUCKETS.iter().enumerate() {
            let n = self.counts[i].load(Ordering::Relaxed);
            family.part("_bucket", Some(format_args!("le=\"{b}\"")), n);
        }
        let count = self.count.load(Ordering::Relaxed);
        family.part("_bucket", Some(format_args!("le=\"+Inf\"")), count);
        #[allow(clippy::cast_precision_loss)] // a sum of microseconds fits f64 for centuries
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        family.part("_sum", None, sum);
        family.part("_count", None, count);
    }
}

/// The label values each counter family starts with, at 0, so a dashboard or
/// an alert's `rate()` sees the series from the first scrape, not from the
/// first event (Prometheus cannot tell a missing series from a quiet one).
const RECONCILE_RESULTS: [&str; 2] = ["ok", "error"];
const RECONCILE_ERROR_KINDS: [&str; 11] = [
    "kube",
    "finalizer",
    "missing_field",
    "serde",
    "sidecar_config",
    "cert",
    "tls",
    "io",
    "config",
    "timeout",
    "panic",
];
/// Where a caught panic happened (see [`crate::panics`]).
pub const PANIC_TASKS: [&str; 3] = ["reconcile", "webhook", "background"];
const WEBHOOK_RESULTS: [&str; 4] = ["injected", "skipped", "ignored", "error"];
const ROUTE_VALIDATION_RESULTS: [&str; 4] = ["allowed", "warned", "refused", "error"];
/// Why the webhook server refused a connection or request (see
/// [`crate::server`]).
const WEBHOOK_REJECTIONS: [&str; 5] = [
    "connection_cap",
    "read_timeout",
    "too_large",
    "malformed",
    "busy",
];
/// Open admin connections at most; /healthz and /metrics need a handful.
const ADMIN_MAX_CONNECTIONS: usize = 32;
/// Time to send a request head on the admin port.
const ADMIN_HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// The Prometheus text exposition format, version 0.0.4: Prometheus 3 refuses
/// a scrape without a Content-Type unless told a fallback.
pub const METRICS_CONTENT_TYPE: &str = kubegrace_sidecar_api::exposition::CONTENT_TYPE;

pub struct Metrics {
    reconciles: Mutex<BTreeMap<&'static str, u64>>,
    reconcile_errors: Mutex<BTreeMap<&'static str, u64>>,
    pub reconcile_duration: Histogram,
    webhook: Mutex<BTreeMap<&'static str, u64>>,
    pub webhook_duration: Histogram,
    route_validations: Mutex<BTreeMap<&'static str, u64>>,
    pub route_validation_duration: Histogram,
    webhook_rejections: Mutex<BTreeMap<&'static str, u64>>,
    /// Pod drains counted from sidecar termination messages, by route
    /// (`namespace/name`) and outcome.
    pod_drains: Mutex<BTreeMap<String, DrainCounts>>,
    /// Pods that should carry the sidecar and don't, by route.
    pods_not_injected: Mutex<BTreeMap<String, i64>>,
    /// Panics caught at a task boundary, by task (see [`PANIC_TASKS`]).
    panics: Mutex<BTreeMap<&'static str, u64>>,
    /// Stored GraceRoutes the operator cannot decode, as (namespace, name):
    /// one series per such route, gone when it is fixed or deleted.
    undecodable: Mutex<std::collections::BTreeSet<(String, String)>>,
    /// Where the webhook's answers came from (see [`crate::webhook_cache`]).
    pub lookups: crate::webhook_cache::LookupMetrics,
    /// The healing loop's evictions (see [`crate::heal`]).
    pub heal: Arc<crate::heal::HealMetrics>,
    /// Requests sent to the API server (see [`crate::api_requests`]).
    pub api_requests: Arc<crate::api_requests::ApiRequests>,
    /// The webhook's serving certificate, for its expiry.
    certificate: std::sync::OnceLock<Arc<crate::certs::CertResolver>>,
    pub leader: AtomicBool,
    /// Serving certificate loaded and webhook listening.
    pub ready: AtomicBool,
}

fn zeros(keys: &[&'static str]) -> Mutex<BTreeMap<&'static str, u64>> {
    Mutex::new(keys.iter().map(|k| (*k, 0)).collect())
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics {
            reconciles: zeros(&RECONCILE_RESULTS),
            reconcile_errors: zeros(&RECONCILE_ERROR_KINDS),
            reconcile_duration: Histogram::default(),
            webhook: zeros(&WEBHOOK_RESULTS),
            webhook_duration: Histogram::default(),
            route_validations: zeros(&ROUTE_VALIDATION_RESULTS),
            route_validation_duration: Histogram::default(),
            webhook_rejections: zeros(&WEBHOOK_REJECTIONS),
            pod_drains: Mutex::new(BTreeMap::new()),
            pods_not_injected: Mutex::new(BTreeMap::new()),
            panics: zeros(&PANIC_TASKS),
            undecodable: Mutex::new(std::collections::BTreeSet::new()),
            lookups: crate::webhook_cache::LookupMetrics::default(),
            heal: Arc::default(),
            api_requests: Arc::default(),
            certificate: std::sync::OnceLock::new(),
            leader: AtomicBool::new(false),
            ready: AtomicBool::new(false),
        }
    }
}

/// One route's drain counters.
#[derive(Default, Clone, Copy)]
struct DrainCounts {
    clean: u64,
    force_closed: u64,
    requests_cut: u64,
}

fn bump(map: &Mutex<BTreeMap<&'static str, u64>>, key: &'static str) {
    // A poisoned lock only means another thread panicked mid-increment; the
    // counts are still usable.
    let mut m = map
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    *m.entry(key).or_default() += 1;
}

impl Metrics {
    /// Metrics whose API request counts are `requests`, the counter the
    /// clients' layers write to ([`crate::api_requests::counted_client`]).
    pub fn counting(requests: Arc<crate::api_requests::ApiRequests>) -> Self {
        Self {
            api_requests: requests,
            ..Self::default()
        }
    }

    pub fn reconciled(&self, took: Duration, error: Option<&'static str>) {
        self.reconcile_duration.observe(took);
        bump(
            &self.reconciles,
            if error.is_some() { "error" } else { "ok" },
        );
        if let Some(kind) = error {
            bump(&self.reconcile_errors, kind);
        }
    }

    /// `result`: injected, skipped, ignored, error.
    pub fn webhook(&self, took: Duration, result: &'static str) {
        self.webhook_duration.observe(took);
        bump(&self.webhook, result);
    }

    /// `result`: allowed, warned, refused, error.
    pub fn route_validation(&self, took: Duration, result: &'static str) {
        self.route_validation_duration.observe(took);
        bump(&self.route_validations, result);
    }

    /// `reason`: connection_cap, read_timeout, too_large, malformed, busy.
    pub fn webhook_rejected(&self, reason: &'static str) {
        bump(&self.webhook_rejections, reason);
    }

    /// Makes `route`'s drain series exist at 0 (a route the operator
    /// reconciles has them before its first drain).
    pub fn route_seen(&self, route: &str) {
        self.drain_counts(|counts| {
            counts.entry(route.to_string()).or_default();
        });
    }

    /// One pod's drain, counted once: clean or force-closed, and the
    /// requests it cut.
    pub fn pod_drained(&self, route: &str, clean: bool, requests_cut: u64) {
        self.drain_counts(|counts| {
            let c = counts.entry(route.to_string()).or_default();
            if clean {
                c.clean += 1;
            } else {
                c.force_closed += 1;
            }
            c.requests_cut += requests_cut;
        });
    }

    /// The route's pods that should carry the sidecar and don't, as its
    /// last status said.
    pub fn pods_not_injected(&self, route: &str, missing: i64) {
        self.pods_not_injected
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(route.to_string(), missing);
    }

    /// The route is deleted: its series go.
    pub fn forget_route(&self, route: &str) {
        self.pods_not_injected
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(route);
        self.drain_counts(|counts| {
            counts.remove(route);
        });
    }

    /// Drops the per-route series (`namespace/name`) of routes that no
    /// longer exist: a route without a finalizer is deleted without a
    /// reconcile that could [`Metrics::forget_route`] it.
    pub fn retain_routes(&self, exists: impl Fn(&str) -> bool) {
        self.pods_not_injected
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .retain(|route, _| exists(route));
        self.drain_counts(|counts| counts.retain(|route, _| exists(route)));
    }

    /// The controllers stopped here: the per-route gauges would go stale
    /// (and double an alert's count beside the new leader's).
    pub fn stopped_leading(&self) {
        self.pods_not_injected
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clear();
        self.undecodable
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clear();
    }

    /// A panic caught at a task boundary; `task` is one of [`PANIC_TASKS`].
    pub fn panicked(&self, task: &'static str) {
        bump(&self.panics, task);
    }

    /// Whether the stored route `namespace/name` decodes (its series exists
    /// while it does not).
    pub fn route_decodes(&self, namespace: &str, name: &str, decodes: bool) {
        let mut set = self
            .undecodable
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let key = (namespace.to_string(), name.to_string());
        if decodes {
            set.remove(&key);
        } else {
            set.insert(key);
        }
    }

    /// Drops the undecodable-route series of routes that no longer exist
    /// (deleted without a finalizer, so no reconcile saw them go).
    pub fn retain_undecodable(&self, exists: impl Fn(&str, &str) -> bool) {
        self.undecodable
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .retain(|(ns, name)| exists(ns, name));
    }

    /// Exposes the expiry of the certificate `resolver` serves.
    pub fn watch_certificate(&self, resolver: Arc<crate::certs::CertResolver>) {
        let _ = self.certificate.set(resolver);
    }

    fn drain_counts(&self, f: impl FnOnce(&mut BTreeMap<String, DrainCounts>)) {
        f(&mut self
            .pod_drains
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner));
    }

    fn render_drains(&self, out: &mut String) {
        let counts = self
            .pod_drains
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let mut family = Family::new(
            out,
            "kubegrace_operator_pod_drains_total",
            "counter",
            "Pod drains read from sidecar termination messages, by route and outcome (clean, force_closed).",
        );
        for (route, c) in &counts {
            for (outcome, n) in [("clean", c.clean), ("force_closed", c.force_closed)] {
                family.series(
                    format_args!("route=\"{}\",outcome=\"{outcome}\"", Escaped(route)),
                    n,
                );
            }
        }
        Family::new(
            out,
            "kubegrace_operator_requests_cut_total",
            "counter",
            "Requests cut by drains that reached drain.timeout, by route.",
        )
        .by(
            "route",
            counts.iter().map(|(route, c)| (route, c.requests_cut)),
        );
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        Family::new(
            &mut out,
            "kubegrace_operator_build_info",
            "gauge",
            "The operator's version and git revision.",
        )
        .series(
            format_args!(
                "version=\"{}\",revision=\"{}\"",
                env!("CARGO_PKG_VERSION"),
                kubegrace_sidecar_api::build::REVISION
            ),
            1,
        );
        let counters = |out: &mut String,
                        name: &str,
                        help: &str,
                        label: &str,
                        map: &Mutex<BTreeMap<&'static str, u64>>| {
            let m = map
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            Family::new(out, name, "counter", help).by(label, m.iter());
        };
        counters(
            &mut out,
            "kubegrace_operator_reconcile_total",
            "Reconciles by result.",
            "result",
            &self.reconciles,
        );
        counters(
            &mut out,
            "kubegrace_operator_reconcile_errors_total",
            "Failed reconciles by error kind.",
            "kind",
            &self.reconcile_errors,
        );
        self.reconcile_duration.render(
            "kubegrace_operator_reconcile_duration_seconds",
            "Time per reconcile.",
            &mut out,
        );
        counters(
            &mut out,
            "kubegrace_operator_webhook_requests_total",
            "Admission requests by outcome.",
            "result",
            &self.webhook,
        );
        self.webhook_duration.render(
            "kubegrace_operator_webhook_duration_seconds",
            "Time to answer an admission request.",
            &mut out,
        );
        counters(
            &mut out,
            "kubegrace_operator_route_validation_total",
            "GraceRoute admission reviews by outcome.",
            "result",
            &self.route_validations,
        );
        self.route_validation_duration.render(
            "kubegrace_operator_route_validation_duration_seconds",
            "Time to answer a GraceRoute admission review.",
            &mut out,
        );
        counters(
            &mut out,
            "kubegrace_operator_webhook_rejected_total",
            "Webhook connections or requests refused by the server's limits, by reason.",
            "reason",
            &self.webhook_rejections,
        );
        counters(
            &mut out,
            "kubegrace_operator_panics_total",
            "Panics caught at a task boundary (the task was answered, retried or restarted), by task.",
            "task",
            &self.panics,
        );
        let mut family = Family::new(
            &mut out,
            "kubegrace_operator_route_undecodable",
            "gauge",
            "1 for each stored GraceRoute the operator cannot decode (its Accepted condition says which field).",
        );
        for (ns, name) in self
            .undecodable
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
        {
            family.series(
                format_args!("namespace=\"{}\",name=\"{}\"", Escaped(ns), Escaped(name)),
                1,
            );
        }
        self.render_drains(&mut out);
        self.lookups.render(&mut out);
        self.heal.render(&mut out);
        self.api_requests.render(&mut out);
        Family::new(
            &mut out,
            "kubegrace_operator_pods_not_injected",
            "gauge",
            "Pods that should carry the sidecar and don't, by route (the route's last status).",
        )
        .by(
            "route",
            self.pods_not_injected
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .iter(),
        );
        // No sample until a certificate is loaded: a 0 would read as
        // "expired in 1970" to an expiry alert.
        let expiry = Family::new(
            &mut out,
            "kubegrace_operator_certificate_expiry_timestamp_seconds",
            "gauge",
            "When the webhook's serving certificate expires (Unix seconds).",
        );
        if let Some(at) = self.certificate.get().and_then(|r| r.not_after()) {
            expiry.value(at);
        }
        Family::new(
            &mut out,
            "kubegrace_operator_leader",
            "gauge",
            "1 if this replica runs the controllers.",
        )
        .value(u8::from(self.leader.load(Ordering::Relaxed)));
        out
    }
}

fn respond(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r
}

async fn handle(
    req: Request<Incoming>,
    metrics: Arc<Metrics>,
) -> std::result::Result<Response<Full<Bytes>>, std::convert::Infallible> {
    Ok(match req.uri().path() {
        "/healthz" => respond(StatusCode::OK, "ok\n".into()),
        "/readyz" if metrics.ready.load(Ordering::Relaxed) => {
            respond(StatusCode::OK, "ok\n".into())
        }
        "/readyz" => respond(
            StatusCode::SERVICE_UNAVAILABLE,
            "webhook not serving yet\n".into(),
        ),
        "/metrics" => {
            let mut r = respond(StatusCode::OK, metrics.render());
            r.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static(METRICS_CONTENT_TYPE),
            );
            r
        }
        _ => respond(StatusCode::NOT_FOUND, "not found\n".into()),
    })
}

/// Binds the admin port; serves until `shutdown` resolves.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<()> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(Error::io(format!("binding admin port {addr}")))?;
    tracing::info!(%addr, "admin port listening");
    tokio::pin!(shutdown);
    // Bounded like the webhook port: a capped number of connections, and a
    // head must arrive in time (hyper closes the connection otherwise).
    let connections = Arc::new(tokio::sync::Semaphore::new(ADMIN_MAX_CONNECTIONS));
    loop {
        tokio::select! {
            () = &mut shutdown => return Ok(()),
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let Ok(permit) = connections.clone().try_acquire_owned() else {
                    drop(stream);
                    continue;
                };
                let metrics = metrics.clone();
                tokio::spawn(async move {
                    let _permit = permit;
                    let svc = hyper::service::service_fn(move |req| handle(req, metrics.clone()));
                    let builder = crate::server::connection_builder(ADMIN_HEADER_TIMEOUT);
                    let _ = builder.serve_connection(TokioIo::new(stream), svc).await;
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_exist_at_zero_before_any_event() {
        let text = Metrics::default().render();
        for line in [
            "kubegrace_operator_reconcile_total{result=\"error\"} 0",
            "kubegrace_operator_reconcile_errors_total{kind=\"kube\"} 0",
            "kubegrace_operator_webhook_requests_total{result=\"injected\"} 0",
            "kubegrace_operator_route_validation_total{result=\"refused\"} 0",
            "kubegrace_operator_webhook_rejected_total{reason=\"too_large\"} 0",
            "kubegrace_operator_leader 0",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
        let build_info = format!(
            "kubegrace_operator_build_info{{version=\"{}\",revision=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION"),
            kubegrace_sidecar_api::build::REVISION
        );
        assert!(text.lines().any(|l| l == build_info), "{text}");
    }

    #[tokio::test]
    async fn metrics_are_served_with_the_exposition_content_type() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        drop(listener);
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(addr, Arc::new(Metrics::default()), async {
            let _ = stop_rx.await;
        }));
        let mut answer = String::new();
        for _ in 0..100 {
            if let Ok(mut s) = tokio::net::TcpStream::connect(addr).await {
                use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
                s.write_all(b"GET /metrics HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
                    .await
                    .expect("write");
                s.read_to_string(&mut answer).await.expect("read");
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = stop_tx.send(());
        let _ = server.await;
        let head = answer
            .split("\r\n\r\n")
            .next()
            .unwrap_or_default()
            .to_ascii_lowercase();
        assert!(
            head.contains(&format!("content-type: {METRICS_CONTENT_TYPE}")),
            "{answer}"
        );
    }

    #[test]
    fn metrics_render_as_prometheus_text() {
        let m = Metrics::default();
        m.reconciled(Duration::from_millis(3), None);
        m.reconciled(Duration::from_millis(30), Some("kube"));
        m.webhook(Duration::from_micros(800), "injected");
        m.route_validation(Duration::from_millis(4), "refused");
        let text = m.render();
        assert!(
            text.contains("kubegrace_operator_route_validation_total{result=\"refused\"} 1"),
            "{text}"
        );
        assert!(
            text.contains(
                "kubegrace_operator_route_validation_duration_seconds_bucket{le=\"0.005\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains("kubegrace_operator_reconcile_total{result=\"ok\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("kubegrace_operator_reconcile_errors_total{kind=\"kube\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("kubegrace_operator_webhook_duration_seconds_bucket{le=\"0.001\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("kubegrace_operator_reconcile_duration_seconds_count 2"),
            "{text}"
        );
    }
}
