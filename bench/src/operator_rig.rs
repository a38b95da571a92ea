//! What the operator benchmarks share: the release operator binary started
//! on this host against the local cluster (the API server calls its webhooks
//! by URL over TLS), the committed CRD, the operator's `/metrics` read back
//! as histograms and counters, and latency series.
//!
//! `bench-operator` times one route's admission and reconcile;
//! `bench-scale` puts thousands of routes and pods (on kwok nodes) behind
//! one operator.

use std::future::Future;
use std::time::Duration;

use anyhow::{Context as _, bail};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

/// The operator's custom resource, untyped (the benches do not link the
/// operator: they run its binary).
pub type GraceRoute = DynamicObject;

pub fn route_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        "kubegrace.io",
        "v1alpha1",
        "GraceRoute",
    ))
}

/// A condition of a route's status: (status, observedGeneration).
pub fn condition(r: &GraceRoute, type_: &str) -> Option<(String, Option<i64>)> {
    r.data["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .map(|c| {
            (
                c["status"].as_str().unwrap_or_default().to_string(),
                c["observedGeneration"].as_i64(),
            )
        })
}

/// Milliseconds, sorted.
#[derive(Debug, Default)]
pub struct Series(pub Vec<f64>);

impl Series {
    pub fn push(&mut self, d: Duration) {
        self.0.push(d.as_secs_f64() * 1000.0);
    }

    pub fn pct(&self, q: f64) -> f64 {
        let mut v = self.0.clone();
        v.sort_by(f64::total_cmp);
        if v.is_empty() {
            return f64::NAN;
        }
        // Nearest rank.
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss
        )]
        let i = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
        v[i]
    }

    pub fn json(&self) -> Value {
        let round = |x: f64| (x * 1000.0).round() / 1000.0;
        json!({
            "n": self.0.len(),
            "p50_ms": round(self.pct(0.50)),
            "p90_ms": round(self.pct(0.90)),
            "p99_ms": round(self.pct(0.99)),
            "max_ms": round(self.pct(1.0)),
        })
    }
}

/// One Prometheus histogram read from the operator's /metrics.
#[derive(Debug, Default, Clone)]
pub struct Histogram {
    /// (upper bound seconds, cumulative count)
    buckets: Vec<(f64, f64)>,
    sum: f64,
    count: f64,
}

impl Histogram {
    pub fn parse(text: &str, name: &str) -> Self {
        let mut h = Histogram::default();
        for line in text.lines() {
            let Some((key, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Ok(v) = value.parse::<f64>() else {
                continue;
            };
            if let Some(rest) = key.strip_prefix(&format!("{name}_bucket{{le=\"")) {
                let le = rest.trim_end_matches("\"}");
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().unwrap_or(f64::INFINITY)
                };
                h.buckets.push((le, v));
            } else if key == format!("{name}_sum") {
                h.sum = v;
            } else if key == format!("{name}_count") {
                h.count = v;
            }
        }
        h
    }

    /// Every series of histogram `name` whose labels include each of
    /// `labels` (`key="value"`), summed: the API server's labels its
    /// histograms by webhook, operation and outcome.
    pub fn parse_matching(text: &str, name: &str, labels: &[&str]) -> Self {
        let mut h = Histogram::default();
        let (bucket, sum, count) = (
            format!("{name}_bucket"),
            format!("{name}_sum"),
            format!("{name}_count"),
        );
        for line in text.lines() {
            let Some((key, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Ok(v) = value.parse::<f64>() else {
                continue;
            };
            let (metric, set) = key.split_once('{').unwrap_or((key, ""));
            let set = set.trim_end_matches('}');
            let pairs: Vec<&str> = set.split(',').collect();
            if !labels.iter().all(|l| pairs.contains(l)) {
                continue;
            }
            if metric == bucket {
                let Some(le) = pairs.iter().find_map(|p| p.strip_prefix("le=")) else {
                    continue;
                };
                let le = match le.trim_matches('"') {
                    "+Inf" => f64::INFINITY,
                    b => b.parse().unwrap_or(f64::INFINITY),
                };
                match h.buckets.iter_mut().find(|(l, _)| *l == le) {
                    Some((_, c)) => *c += v,
                    None => h.buckets.push((le, v)),
                }
            } else if metric == sum {
                h.sum += v;
            } else if metric == count {
                h.count += v;
            }
        }
        h.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        h
    }

    /// What was observed between `before` and `self`.
    pub fn since(&self, before: &Histogram) -> Histogram {
        Histogram {
            buckets: self
                .buckets
                .iter()
                .map(|(le, c)| {
                    let b = before
                        .buckets
                        .iter()
                        .find(|(l, _)| l == le)
                        .map_or(0.0, |(_, c)| *c);
                    (*le, c - b)
                })
                .collect(),
            sum: self.sum - before.sum,
            count: self.count - before.count,
        }
    }

    /// The bucket bound the q-quantile falls under (what a Prometheus
    /// histogram can say, no interpolation).
    pub fn quantile_bound_ms(&self, q: f64) -> Option<f64> {
        let want = q * self.count;
        self.buckets
            .iter()
            .find(|(_, c)| *c >= want && self.count > 0.0)
            .map(|(le, _)| le * 1000.0)
    }

    pub fn json(&self) -> Value {
        let bound = |q| {
            self.quantile_bound_ms(q)
                .filter(|b| b.is_finite())
                .map_or(Value::String("> 10000".into()), |b| json!(b))
        };
        json!({
            "count": self.count,
            "mean_ms": if self.count > 0.0 { (self.sum / self.count * 1e6).round() / 1000.0 } else { f64::NAN },
            "p50_at_most_ms": bound(0.5),
            "p99_at_most_ms": bound(0.99),
        })
    }
}

/// The name of the pod webhook in [`create_mutating_webhook`]'s configuration.
pub const INJECT_WEBHOOK: &str = "pod.inject.kubegrace.io";

/// Webhook `webhook`'s CREATE calls as the API server times them (its
/// request out and the answer back), from the API server's own /metrics.
pub async fn apiserver_webhook_calls(client: &Client, webhook: &str) -> anyhow::Result<Histogram> {
    let req = hyper::Request::get("/metrics").body(Vec::new())?;
    let text = client
        .request_text(req)
        .await
        .context("reading the API server's /metrics")?;
    Ok(Histogram::parse_matching(
        &text,
        "apiserver_admission_webhook_admission_duration_seconds",
        &[&format!("name=\"{webhook}\""), "operation=\"CREATE\""],
    ))
}

pub async fn client() -> anyhow::Result<Client> {
    Client::try_default()
        .await
        .context("no kubeconfig: run under e2e/cluster/with-cluster")
}

pub async fn metrics(admin: u16) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", admin)).await?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
        .await?;
    let mut out = String::new();
    s.read_to_string(&mut out).await?;
    Ok(out)
}

/// Polls `check` every 100 ms until it is Some or `secs` pass.
pub async fn wait_for<T, Fut: Future<Output = Option<T>>>(
    secs: u64,
    what: &str,
    check: impl FnMut() -> Fut,
) -> anyhow::Result<T> {
    let every = Duration::from_millis(100);
    kubegrace_e2e::poll(what, Duration::from_secs(secs), every, check).await
}

/// Installs the committed CRD (generated from the Rust types by `make crds`)
/// and waits until it is Established.
pub async fn install_crd(client: &Client, path: &str) -> anyhow::Result<()> {
    let crd: CustomResourceDefinition =
        serde_norway::from_str(&std::fs::read_to_string(path).with_context(|| path.to_owned())?)
            .with_context(|| format!("parsing {path}"))?;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.patch(
        "graceroutes.kubegrace.io",
        &PatchParams::apply("kubegrace-bench").force(),
        &Patch::Apply(&crd),
    )
    .await
    .context("installing the CRD")?;
    wait_for(60, "CRD Established", || async {
        let c = crds.get("graceroutes.kubegrace.io").await.ok()?;
        c.status?
            .conditions?
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True")
            .then_some(())
    })
    .await
}

/// A webhook configuration of a bench run, named `name`, with one webhook
/// `hook` that the API server calls on the operator on this host by URL
/// (`path`), for `rules` in the namespaces `namespaces` selects.
fn webhook_configuration(
    name: &str,
    hook: &str,
    (webhook_port, path): (u16, &str),
    rules: Value,
    namespaces: &Value,
    failure_policy: &str,
) -> Value {
    json!({
        "metadata": {"name": name, "labels": {"kubegrace.io/test": "bench"}},
        "webhooks": [{
            "name": hook, "admissionReviewVersions": ["v1"],
            "clientConfig": {"url": format!("https://127.0.0.1:{webhook_port}{path}")},
            "rules": [rules], "namespaceSelector": namespaces,
            "failurePolicy": failure_policy, "sideEffects": "None", "timeoutSeconds": 10,
        }]
    })
}

/// The pod-injection webhook (as the chart's: pods that carry the inject
/// label; a pod is refused while the operator cannot be reached).
pub async fn create_mutating_webhook(
    client: &Client,
    name: &str,
    webhook_port: u16,
    namespaces: &Value,
) -> anyhow::Result<()> {
    let mut config = webhook_configuration(
        name,
        INJECT_WEBHOOK,
        (webhook_port, "/mutate"),
        json!({"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
               "resources": ["pods"], "scope": "Namespaced"}),
        namespaces,
        "Fail",
    );
    config["webhooks"][0]["objectSelector"] =
        json!({"matchLabels": { (kubegrace_sidecar_api::keys::INJECT): "enabled" }});
    config["webhooks"][0]["reinvocationPolicy"] = json!("IfNeeded");
    let config: MutatingWebhookConfiguration = serde_json::from_value(config)?;
    Api::<MutatingWebhookConfiguration>::all(client.clone())
        .create(&PostParams::default(), &config)
        .await
        .context("creating the MutatingWebhookConfiguration")?;
    Ok(())
}

/// The GraceRoute validating webhook (as the chart's default: `Ignore`, so
/// routes stay editable while the operator is down).
pub async fn create_validating_webhook(
    client: &Client,
    name: &str,
    webhook_port: u16,
    namespaces: &Value,
) -> anyhow::Result<()> {
    let config: ValidatingWebhookConfiguration = serde_json::from_value(webhook_configuration(
        name,
        "graceroutes.validate.kubegrace.io",
        (webhook_port, "/validate"),
        json!({"apiGroups": ["kubegrace.io"], "apiVersions": ["v1alpha1"],
                   "operations": ["CREATE", "UPDATE"], "resources": ["graceroutes"],
                   "scope": "Namespaced"}),
        namespaces,
        "Ignore",
    ))?;
    Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .create(&PostParams::default(), &config)
        .await
        .context("creating the ValidatingWebhookConfiguration")?;
    Ok(())
}

/// Waits until the operator has patched its caBundle into webhook
/// configuration `name` (it is serving then).
pub async fn wait_ca_bundle(client: &Client, name: &str) -> anyhow::Result<()> {
    let mwcs: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    wait_for(60, "the operator's caBundle", || async {
        let m = mwcs.get(name).await.ok()?;
        m.webhooks?
            .iter()
            .all(|w| w.client_config.ca_bundle.is_some())
            .then_some(())
    })
    .await
}

/// The operator binary: `--operator-bin`, else the static release build of
/// `e2e/cluster/with-cluster` in `$CARGO_TARGET_DIR`.
pub fn operator_bin(flag: Option<&str>) -> String {
    flag.map_or_else(
        || {
            format!(
                "{}/x86_64-unknown-linux-gnu/release/kubegrace-operator",
                std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into())
            )
        },
        str::to_owned,
    )
}

/// The operator running on this host, its log in the temp dir. Killed when
/// dropped; [`Operator::stop`] is the graceful way (SIGTERM, as kubelet).
pub struct Operator {
    child: tokio::process::Child,
    pub admin_port: u16,
    pub log: std::path::PathBuf,
}

impl Operator {
    /// Starts `bin run` with `name` as its namespace, lease and webhook
    /// configurations, serving webhooks on `webhook_port`, plus `extra` flags.
    pub fn start(
        bin: &str,
        name: &str,
        webhook_port: u16,
        admin_port: u16,
        extra: &[String],
        log_suffix: &str,
    ) -> anyhow::Result<Operator> {
        let log_path = std::env::temp_dir().join(format!("{name}-operator{log_suffix}.log"));
        let log = std::fs::File::create(&log_path)?;
        let child = tokio::process::Command::new(bin)
            .args([
                "run".to_string(),
                format!("--namespace={name}"),
                format!("--webhook-addr=127.0.0.1:{webhook_port}"),
                format!("--admin-addr=127.0.0.1:{admin_port}"),
                format!("--webhook-config={name}"),
                format!("--validating-webhook-config={name}"),
                "--webhook-extra-san=127.0.0.1".into(),
                format!("--leader-election-lease=kubegrace-bench-{name}"),
                "--sidecar-image=localhost/kubegrace/sidecar:e2e".into(),
            ])
            .args(extra)
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| {
                format!(
                    "starting {bin} (run under e2e/cluster/with-cluster, or set --operator-bin)"
                )
            })?;
        eprintln!("operator {bin}, log {}", log_path.display());
        Ok(Operator {
            child,
            admin_port,
            log: log_path,
        })
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// SIGTERM (the operator's shutdown signal), then up to 20 s for it to exit.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status();
        }
        if tokio::time::timeout(Duration::from_secs(20), self.child.wait())
            .await
            .is_err()
        {
            bail!("the operator did not exit within 20s of SIGTERM");
        }
        Ok(())
    }
}

/// Milliseconds rounded to microseconds, for the JSON reports.
pub fn round_ms(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// The end of a run bounded by `deadline` seconds: its report printed and
/// written to `out` as JSON, or why there is none.
pub fn write_report(
    outcome: Result<anyhow::Result<Value>, tokio::time::error::Elapsed>,
    deadline: u64,
    out: &str,
) -> anyhow::Result<()> {
    let report = match outcome {
        Ok(r) => r?,
        Err(_) => bail!("the run took longer than --deadline {deadline}s"),
    };
    let text = serde_json::to_string_pretty(&report)?;
    std::fs::write(out, format!("{text}\n")).with_context(|| out.to_owned())?;
    println!("{text}");
    eprintln!("wrote {out}");
    Ok(())
}

pub fn rand_suffix() -> u32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    (nanos ^ std::process::id()) & 0xff_ffff
}

/// Sum of a counter over its labels.
pub fn counter(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::Histogram;

    const APISERVER: &str = r#"# HELP apiserver_admission_webhook_admission_duration_seconds x
apiserver_admission_webhook_admission_duration_seconds_bucket{name="pod.inject.kubegrace.io",operation="CREATE",rejected="false",type="admit",le="0.005"} 2
apiserver_admission_webhook_admission_duration_seconds_bucket{name="pod.inject.kubegrace.io",operation="CREATE",rejected="false",type="admit",le="0.025"} 8
apiserver_admission_webhook_admission_duration_seconds_bucket{name="pod.inject.kubegrace.io",operation="CREATE",rejected="false",type="admit",le="+Inf"} 10
apiserver_admission_webhook_admission_duration_seconds_sum{name="pod.inject.kubegrace.io",operation="CREATE",rejected="false",type="admit"} 0.2
apiserver_admission_webhook_admission_duration_seconds_count{name="pod.inject.kubegrace.io",operation="CREATE",rejected="false",type="admit"} 10
apiserver_admission_webhook_admission_duration_seconds_bucket{name="pod.inject.kubegrace.io",operation="CREATE",rejected="true",type="admit",le="0.005"} 0
apiserver_admission_webhook_admission_duration_seconds_bucket{name="pod.inject.kubegrace.io",operation="CREATE",rejected="true",type="admit",le="0.025"} 0
apiserver_admission_webhook_admission_duration_seconds_bucket{name="pod.inject.kubegrace.io",operation="CREATE",rejected="true",type="admit",le="+Inf"} 2
apiserver_admission_webhook_admission_duration_seconds_sum{name="pod.inject.kubegrace.io",operation="CREATE",rejected="true",type="admit"} 1.0
apiserver_admission_webhook_admission_duration_seconds_count{name="pod.inject.kubegrace.io",operation="CREATE",rejected="true",type="admit"} 2
apiserver_admission_webhook_admission_duration_seconds_bucket{name="other.example.com",operation="CREATE",rejected="false",type="admit",le="0.005"} 99
apiserver_admission_webhook_admission_duration_seconds_count{name="other.example.com",operation="CREATE",rejected="false",type="admit"} 99
"#;
    const NAME: &str = "apiserver_admission_webhook_admission_duration_seconds";

    #[test]
    fn matching_series_are_summed_and_others_left_out() {
        let ours =
            Histogram::parse_matching(APISERVER, NAME, &["name=\"pod.inject.kubegrace.io\""]);
        assert_eq!(ours.count, 12.0);
        assert!((ours.sum - 1.2).abs() < 1e-9);
        assert_eq!(
            ours.buckets,
            vec![(0.005, 2.0), (0.025, 8.0), (f64::INFINITY, 12.0)]
        );
        assert_eq!(ours.quantile_bound_ms(0.5), Some(25.0));
        let admitted = Histogram::parse_matching(
            APISERVER,
            NAME,
            &["name=\"pod.inject.kubegrace.io\"", "rejected=\"false\""],
        );
        assert_eq!(admitted.count, 10.0);
        assert_eq!(
            Histogram::parse_matching(APISERVER, NAME, &["name=\"nobody\""]).count,
            0.0
        );
    }
}
