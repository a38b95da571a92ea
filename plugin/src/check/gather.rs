//! Reads what `check` judges. Only reads, except one server-side dry run of a pod (never
//! stored), which makes the API server call the webhook the way it does for real pods.

use std::collections::BTreeMap;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{ListParams, PostParams};
use kube::core::{Selector, SelectorExt};
use kube::{Api, Client, CustomResourceExt, Resource, ResourceExt};
use kubegrace_api::crd::GraceRoute;
use kubegrace_api::keys;
use serde_json::json;

use super::Snapshot;
use super::rules::Probe;
use crate::install::{self, Install};
use crate::{Error, Result};

/// Where `check` looks.
#[derive(Debug, Clone, Default)]
pub struct Scope {
    /// The operator's namespace; every namespace when `None`.
    pub operator_namespace: Option<String>,
    /// The namespace of the workloads checked; every namespace when `None`.
    pub namespace: Option<String>,
}

impl Scope {
    /// Whether the workloads of namespace `name` are checked.
    fn covers(&self, name: &str) -> bool {
        self.namespace.as_deref().is_none_or(|ns| ns == name)
    }
}

/// Reads the cluster into a [`Snapshot`].
pub async fn gather(client: &Client, scope: &Scope) -> Result<Snapshot> {
    let mut s = Snapshot {
        installs: install::find(client, scope.operator_namespace.as_deref()).await?,
        ..Snapshot::default()
    };
    s.crd = Api::<CustomResourceDefinition>::all(client.clone())
        .get_opt(GraceRoute::crd_name())
        .await
        .map_err(Error::kube("reading the GraceRoute CRD"))?;
    let namespaces = Api::<Namespace>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(Error::kube("listing namespaces"))?
        .items;
    s.ns_labels = namespaces
        .iter()
        .filter(|n| scope.covers(&n.name_any()))
        .map(|n| (n.name_any(), n.labels().clone()))
        .collect();
    s.pods = list(client, scope.namespace.as_deref(), "pods").await?;
    // Without the CRD there is no GraceRoute API to list (the crd check says so).
    // Listed as the operator reads them: one route stored under a looser schema must not
    // fail the whole check (it is reported by name instead).
    let routes: Vec<GraceRoute> = match s.crd {
        Some(_) => {
            let objects = crate::cluster::routes(client, scope.namespace.as_deref())
                .list(&ListParams::default())
                .await
                .map_err(Error::kube("listing GraceRoutes"))?
                .items;
            let listed = kubegrace_api::tolerant::split(objects);
            s.undecodable_routes = listed.undecodable;
            listed.routes
        }
        None => Vec::new(),
    };
    let deployments: Vec<Deployment> =
        list(client, scope.namespace.as_deref(), "Deployments").await?;
    let statefulsets: Vec<StatefulSet> =
        list(client, scope.namespace.as_deref(), "StatefulSets").await?;
    let services: Vec<Service> = list(client, scope.namespace.as_deref(), "Services").await?;
    // Read-only users may lack this one: say so instead of failing the whole check.
    match list::<NetworkPolicy>(client, scope.namespace.as_deref(), "NetworkPolicies").await {
        Ok(policies) => s.network_policies = policies,
        Err(e) => s.network_policies_unreadable = Some(e.to_string()),
    }
    // Only namespaces with a route matter for bypasses.
    for r in routes {
        let ns = r.namespace().unwrap_or_default();
        s.namespaced.entry(ns).or_default().routes.push(r);
    }
    for (ns, n) in s.namespaced.iter_mut() {
        let here = |o: &Option<String>| o.as_deref() == Some(ns.as_str());
        n.deployments = deployments
            .iter()
            .filter(|d| here(&d.metadata.namespace))
            .cloned()
            .collect();
        n.statefulsets = statefulsets
            .iter()
            .filter(|d| here(&d.metadata.namespace))
            .cloned()
            .collect();
        n.services = services
            .iter()
            .filter(|d| here(&d.metadata.namespace))
            .cloned()
            .collect();
    }
    if let Some(install) = s.installs.first().cloned() {
        operator_state(client, &install, &namespaces, scope, &mut s).await?;
    }
    Ok(s)
}

/// The Lease, the operator's pods, the webhook's endpoints, certificate and caBundles,
/// and the dry-run probe.
async fn operator_state(
    client: &Client,
    install: &Install,
    namespaces: &[Namespace],
    scope: &Scope,
    s: &mut Snapshot,
) -> Result<()> {
    let ns = &install.namespace;
    if let Some(selector) = install.pod_selector() {
        s.operator_pods = Api::<Pod>::namespaced(client.clone(), ns)
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(Error::kube(format!("listing operator pods in {ns}")))?
            .items;
    }
    s.lease = Api::<Lease>::namespaced(client.clone(), ns)
        .get_opt(&install.args.leader_election_lease)
        .await
        .map_err(Error::kube("reading the leader Lease"))?;
    let slices = Api::<EndpointSlice>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(&format!(
            "kubernetes.io/service-name={}",
            install.args.webhook_service
        )))
        .await
        .map_err(Error::kube("listing the webhook Service's EndpointSlices"))?;
    s.webhook_endpoints = slices
        .items
        .iter()
        .flat_map(|sl| sl.endpoints.iter())
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) != Some(false))
        .count();
    if let Some(secret) = install.cert_secret() {
        s.serving_cert = Api::<Secret>::namespaced(client.clone(), ns)
            .get_opt(&secret)
            .await
            .map_err(Error::kube(format!("reading Secret {ns}/{secret}")))?
            .and_then(|sec| sec.data?.get("tls.crt").map(|b| b.0.clone()));
    }
    let mutating = Api::<MutatingWebhookConfiguration>::all(client.clone())
        .get_opt(&install.args.webhook_config)
        .await
        .map_err(Error::kube("reading the MutatingWebhookConfiguration"))?;
    match &mutating {
        Some(m) => {
            for w in m.webhooks.iter().flatten() {
                s.ca_bundles.push((
                    format!(
                        "MutatingWebhookConfiguration {} webhook {}",
                        m.name_any(),
                        w.name
                    ),
                    w.client_config.ca_bundle.as_ref().map(|b| b.0.clone()),
                ));
            }
        }
        None => s.ca_bundles.push((
            format!(
                "MutatingWebhookConfiguration {} (missing)",
                install.args.webhook_config
            ),
            None,
        )),
    }
    if !install.args.validating_webhook_config.is_empty() {
        let validating = Api::<ValidatingWebhookConfiguration>::all(client.clone())
            .get_opt(&install.args.validating_webhook_config)
            .await
            .map_err(Error::kube("reading the ValidatingWebhookConfiguration"))?;
        for w in validating.iter().flat_map(|v| v.webhooks.iter().flatten()) {
            s.ca_bundles.push((
                format!(
                    "ValidatingWebhookConfiguration {} webhook {}",
                    install.args.validating_webhook_config, w.name
                ),
                w.client_config.ca_bundle.as_ref().map(|b| b.0.clone()),
            ));
        }
    }
    let candidates: Vec<&Namespace> = namespaces
        .iter()
        .filter(|n| scope.covers(&n.name_any()))
        .collect();
    s.probe = Some(
        match mutating
            .as_ref()
            .and_then(|m| probe_namespace(m, &candidates))
        {
            None => Probe::NoNamespace,
            Some(ns) => dry_run(client, &ns).await,
        },
    );
    Ok(())
}

/// The labels of the probe pod: it asks for the sidecar itself.
fn probe_labels() -> BTreeMap<String, String> {
    BTreeMap::from([(keys::INJECT.to_owned(), "enabled".to_owned())])
}

/// The first namespace where a pod asking for the sidecar is sent to the webhook (pure).
pub fn probe_namespace(
    m: &MutatingWebhookConfiguration,
    namespaces: &[&Namespace],
) -> Option<String> {
    let matches = |sel: Option<&LabelSelector>, labels: &BTreeMap<String, String>| match sel {
        None => true,
        Some(ls) => Selector::try_from(ls.clone()).is_ok_and(|s| s.matches(labels)),
    };
    let pod = probe_labels();
    namespaces
        .iter()
        .find(|n| {
            m.webhooks.iter().flatten().any(|w| {
                matches(w.namespace_selector.as_ref(), n.labels())
                    && matches(w.object_selector.as_ref(), &pod)
            })
        })
        .map(|n| n.name_any())
}

/// Creates a pod asking for the sidecar as a server-side dry run (nothing is stored) and
/// reads the webhook's mark on what comes back.
async fn dry_run(client: &Client, namespace: &str) -> Probe {
    let pod: Pod = match serde_json::from_value(json!({
        "metadata": {"generateName": "kubegrace-check-", "labels": probe_labels()},
        // Restricted (Pod Security) and with requests, so that no admission plugin after
        // the webhook refuses the probe for reasons of its own.
        "spec": {
            "automountServiceAccountToken": false,
            "securityContext": {"runAsNonRoot": true, "runAsUser": 65532,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "app",
                "image": "registry.k8s.io/pause:3.10",
                "ports": [{"name": "http", "containerPort": 8080}],
                "resources": {"requests": {"cpu": "1m", "memory": "1Mi"},
                              "limits": {"cpu": "10m", "memory": "8Mi"}},
                "securityContext": {"allowPrivilegeEscalation": false,
                                    "capabilities": {"drop": ["ALL"]}},
            }],
        },
    })) {
        Ok(p) => p,
        Err(e) => {
            return Probe::Failed {
                namespace: namespace.to_owned(),
                error: e.to_string(),
            };
        }
    };
    let pp = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    match Api::<Pod>::namespaced(client.clone(), namespace)
        .create(&pp, &pod)
        .await
    {
        Ok(back) => verdict(&back, namespace),
        Err(e) => Probe::Failed {
            namespace: namespace.to_owned(),
            error: e.to_string(),
        },
    }
}

/// The webhook's mark on a pod it judged (pure).
pub fn verdict(pod: &Pod, namespace: &str) -> Probe {
    let namespace = namespace.to_owned();
    if kubegrace_api::inject::is_injected(pod) {
        return Probe::Answered {
            namespace,
            verdict: "injected".to_owned(),
        };
    }
    match pod.annotations().get(keys::INJECT_SKIPPED) {
        Some(why) => Probe::Answered {
            namespace,
            verdict: format!("skipped: {why}"),
        },
        None => Probe::Unmarked { namespace },
    }
}

async fn list<K>(client: &Client, namespace: Option<&str>, what: &str) -> Result<Vec<K>>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let api: Api<K> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    Ok(api
        .list(&ListParams::default())
        .await
        .map_err(Error::kube(format!("listing {what}")))?
        .items)
}
