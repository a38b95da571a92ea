//! `bench-scale`'s admission probe: the same pod sent through admission
//! (dry run) during the storm, one at a time and interleaved, bare, through
//! the operator's webhook, and through a webhook that does nothing
//! (`bench-null-webhook`), so the report can say what kubegrace adds beyond
//! what any webhook costs on the machine.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context as _, bail};
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};
use kubegrace_sidecar_api::keys;
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt as _;

use crate::operator_rig::{GraceRoute, Series};

/// The probe pods' label: `routed` ones are selected by the probe route (the
/// webhook injects them: the path every real pod takes), the others are sent
/// to the webhook with no route for them (it answers from the API server).
pub const PROBE_ROUTED: &str = "probe";
const PROBE_UNROUTED: &str = "probe-unrouted";

/// The label that sends a pod to the null webhook (and nowhere else).
const NULL_LABEL: &str = "kubegrace.io/bench-null-webhook";

/// The null webhook's name, as the API server's metrics label it.
pub const NULL_WEBHOOK: &str = "null.bench.kubegrace.io";

/// The route that selects the routed probe pods, created before the storm.
pub fn probe_route() -> anyhow::Result<GraceRoute> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "kubegrace.io/v1alpha1", "kind": "GraceRoute",
        "metadata": {"name": PROBE_ROUTED},
        "spec": {"selector": {"matchLabels": {"app": PROBE_ROUTED}}, "ports": [{"name": "http"}]}
    }))?)
}

/// Which webhook a probe pod goes to.
#[derive(Clone, Copy)]
enum To {
    None,
    Operator,
    Null,
}

/// A probe pod `app`, with the label that sends it to the operator's
/// webhook or to the null one (or neither).
fn probe_pod(app: &str, to: To) -> anyhow::Result<Pod> {
    let mut labels = json!({"app": app});
    match to {
        To::None => {}
        To::Operator => labels[keys::INJECT] = json!("enabled"),
        To::Null => labels[NULL_LABEL] = json!("admit"),
    }
    Ok(serde_json::from_value(json!({
        "metadata": {"generateName": "probe-", "labels": labels},
        "spec": {"containers": [{"name": "app", "image": "localhost/kubegrace/pause:e2e",
                                 "ports": [{"name": "http", "containerPort": 8080}]}]}
    }))?)
}

/// Admission latency of dry-run pod creates during the storm, interleaved.
pub struct Probes {
    /// No webhook.
    pub bare: Series,
    /// Through the webhook and injected (a route selects the pod).
    pub injected: Series,
    /// Through the webhook with no route for the pod: admitted bare after a
    /// lookup at the API server.
    pub unrouted: Series,
    /// Through the null webhook only.
    pub null: Series,
}

/// Dry-run pod creates, bare, injected, unrouted and through the null
/// webhook, interleaved, until `stop` or `max` rounds.
pub async fn admission_probe(
    pods: Api<Pod>,
    stop: Arc<tokio::sync::Notify>,
    max: usize,
) -> anyhow::Result<Probes> {
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let kinds = [
        probe_pod(PROBE_ROUTED, To::None)?,
        probe_pod(PROBE_ROUTED, To::Operator)?,
        probe_pod(PROBE_UNROUTED, To::Operator)?,
        probe_pod(PROBE_ROUTED, To::Null)?,
    ];
    let mut series: [Series; 4] = Default::default();
    let stopped = stop.notified();
    tokio::pin!(stopped);
    'rounds: for _ in 0..max {
        for (p, series) in kinds.iter().zip(series.iter_mut()) {
            let t = Instant::now();
            tokio::select! {
                r = pods.create(&dry, p) => { r.context("dry-run pod create")?; }
                () = &mut stopped => break 'rounds,
            }
            series.push(t.elapsed());
        }
    }
    let [bare, injected, unrouted, null] = series;
    Ok(Probes {
        bare,
        injected,
        unrouted,
        null,
    })
}

/// `with` against `without`: both series and the differences of their
/// p50s and p99s.
pub fn added(with: &Series, without: &Series) -> Value {
    let r = |x: f64| (x * 1000.0).round() / 1000.0;
    json!({
        "with_webhook": with.json(),
        "without_webhook": without.json(),
        "added_p50_ms": r(with.pct(0.5) - without.pct(0.5)),
        "added_p99_ms": r(with.pct(0.99) - without.pct(0.99)),
    })
}

/// `bench-null-webhook` running, registered for the probe pods that carry
/// its label in the namespaces `namespaces` selects; killed on drop, its
/// configuration deleted by [`NullWebhook::remove`].
pub struct NullWebhook {
    _child: tokio::process::Child,
    name: String,
}

impl NullWebhook {
    /// Starts `bin` and registers it as `name` (`Fail`: a call that does
    /// not work fails the probe instead of passing unmeasured).
    pub async fn start(
        client: &Client,
        bin: &str,
        name: &str,
        namespaces: &Value,
    ) -> anyhow::Result<Self> {
        let mut child = tokio::process::Command::new(bin)
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {bin} (bench/scale builds it)"))?;
        let stdout = child.stdout.take().context("no stdout")?;
        let mut line = String::new();
        tokio::io::BufReader::new(stdout)
            .read_line(&mut line)
            .await
            .context("reading the null webhook's port")?;
        let hello: Value = serde_json::from_str(&line)
            .with_context(|| format!("the null webhook said {line:?}"))?;
        let (Some(port), Some(ca)) = (hello["port"].as_u64(), hello["ca_pem"].as_str()) else {
            bail!("the null webhook said {line:?}, not its port and CA");
        };
        let mut config: MutatingWebhookConfiguration = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"kubegrace.io/test": "bench"}},
            "webhooks": [{
                "name": NULL_WEBHOOK, "admissionReviewVersions": ["v1"],
                "clientConfig": {"url": format!("https://127.0.0.1:{port}/")},
                "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                           "resources": ["pods"], "scope": "Namespaced"}],
                "namespaceSelector": namespaces,
                "objectSelector": {"matchLabels": {NULL_LABEL: "admit"}},
                "failurePolicy": "Fail", "sideEffects": "None", "timeoutSeconds": 10,
            }]
        }))?;
        for w in config.webhooks.iter_mut().flatten() {
            w.client_config.ca_bundle = Some(ByteString(ca.as_bytes().to_vec()));
        }
        Api::<MutatingWebhookConfiguration>::all(client.clone())
            .create(&PostParams::default(), &config)
            .await
            .context("creating the null webhook's configuration")?;
        Ok(Self {
            _child: child,
            name: name.to_string(),
        })
    }

    /// Deletes the configuration (best effort; the process dies with this).
    pub async fn remove(self, client: &Client) {
        let _ = Api::<MutatingWebhookConfiguration>::all(client.clone())
            .delete(&self.name, &DeleteParams::default())
            .await;
    }
}
