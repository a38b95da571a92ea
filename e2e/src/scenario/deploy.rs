//! [`Scenario`]: the demo app in one namespace, deployed and settled, and the reads a test
//! makes of its pods (admin port, pod proxy).

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use kube::api::{DynamicObject, ListParams, PostParams};
use kube::{Api, Client};
use kubegrace_api::workloads::pod_grace_period;
use kubegrace_sidecar_api::admin;
use serde_json::json;

use super::{
    LoadMode, Options, Patience, Placement, Progress, RUN_LABEL, WITH, WITHOUT, Workload,
    graceroute, graceroute_api, has_sidecar, pod_ready, route_condition, suffix,
};
use crate::{E2E_LABEL, http_get};

/// The demo app, deployed in one namespace, with and without kubegrace.
#[derive(Clone)]
pub struct Scenario {
    pub client: Client,
    pub namespace: String,
    pub opts: Options,
    /// What rolls: a Deployment unless [`Scenario::with_workload`] says otherwise.
    pub workload: Workload,
}

impl Scenario {
    /// Creates the namespace `kg-e2e-<what>-xxxxx` (labelled for cleanup and for this run's
    /// webhook). Under [`super::with_install`], [`super::Installed::scenario`] does this and
    /// deletes the namespace with the install.
    pub async fn named(
        client: &Client,
        opts: &Options,
        p: &Progress,
        what: &str,
    ) -> Result<Scenario> {
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let name = format!("kg-e2e-{what}-{}", suffix());
        let ns: Namespace = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {E2E_LABEL: "true", RUN_LABEL: opts.release}},
        }))?;
        namespaces
            .create(&PostParams::default(), &ns)
            .await
            .with_context(|| format!("creating namespace {name}"))?;
        p.step(format!("namespace {name}"));
        Ok(Scenario {
            client: client.clone(),
            namespace: name,
            opts: opts.clone(),
            workload: Workload::Deployment,
        })
    }

    /// The same scenario rolling `workload` instead (before [`Scenario::deploy`]).
    pub fn with_workload(mut self, workload: Workload) -> Scenario {
        self.workload = workload;
        self
    }

    /// Where the load and the app's pods go ([`Placement`]): `None` on a cluster with one
    /// node that takes pods, and for a load from this host (no loadgen pod to keep apart).
    pub async fn placement(&self) -> Result<Option<Placement>> {
        match self.opts.load.mode {
            LoadMode::Host => Ok(None),
            LoadMode::Job => Placement::of(&self.client).await,
        }
    }

    pub(super) fn deployments(&self) -> Api<Deployment> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    pub(super) fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// Creates both Deployments, their Services and the GraceRoute, and waits until both
    /// are settled and answer through their ClusterIPs.
    pub async fn deploy(&self, p: &Progress) -> Result<()> {
        self.create_route(WITH, p).await?;
        self.create_app(WITH, true, p).await?;
        self.create_app(WITHOUT, false, p).await?;
        self.settle(WITH, true, p).await?;
        self.settle(WITHOUT, false, p).await?;
        Ok(())
    }

    /// Creates GraceRoute `name` targeting workload `name` (port `http`, `opts.drain`).
    pub async fn create_route(&self, name: &str, p: &Progress) -> Result<()> {
        let d = &self.opts.drain;
        let target = json!({"targetRef": self.workload.target_ref(name)});
        self.post_route(&graceroute(name, d, target)?).await?;
        p.step(format!(
            "GraceRoute {name}: drain minDelay {} quiet {} maxDelay {} timeout {}",
            d.min_delay, d.quiet, d.max_delay, d.timeout
        ));
        Ok(())
    }

    /// Creates GraceRoute `route` in the namespace.
    pub async fn post_route(&self, route: &DynamicObject) -> Result<()> {
        let name = route.metadata.name.as_deref().unwrap_or_default();
        graceroute_api(&self.client, &self.namespace)
            .create(&PostParams::default(), route)
            .await
            .with_context(|| format!("creating GraceRoute {name}"))?;
        Ok(())
    }

    /// Creates workload `name` (the demo app, `opts.replicas`; annotated
    /// `kubegrace.io/inject=enabled` iff `kubegrace`) and a Service in front of it.
    pub async fn create_app(&self, name: &str, kubegrace: bool, p: &Progress) -> Result<()> {
        self.create_workload(name, kubegrace).await?;
        p.step(format!(
            "{} {name} ({} replicas{}) and its Service",
            self.workload.describe(),
            self.opts.replicas,
            if kubegrace {
                ", annotated kubegrace.io/inject=enabled"
            } else {
                ", plain"
            }
        ));
        Ok(())
    }

    /// Waits until GraceRoute `name` has computed its time budget, and checks that the
    /// operator left Deployment `name` alone: the budget reaches pods through the webhook
    /// (terminationGracePeriodSeconds raised on each pod it injects), never through the pod
    /// template, so nothing rolls and a GitOps re-apply of the manifest changes nothing.
    pub async fn wait_budget_applied(&self, name: &str, p: &Progress) -> Result<i64> {
        let routes = graceroute_api(&self.client, &self.namespace);
        let budget = p
            .wait(
                &format!("GraceRoute {name}: time budget computed"),
                Patience::API_CHANGE,
                || async {
                    let r = routes.get(name).await.map_err(|e| e.to_string())?;
                    r.data["status"]["budgetSeconds"]
                        .as_i64()
                        .ok_or_else(|| "no budget in the route's status yet".to_string())
                },
            )
            .await?;
        let d = self.deployments().get(name).await?;
        let tgp = d
            .spec
            .and_then(|s| s.template.spec)
            .and_then(|s| s.termination_grace_period_seconds);
        ensure!(
            tgp != Some(budget),
            "Deployment {name}'s pod template carries the budget {budget}s: the operator edited it"
        );
        Ok(budget)
    }

    /// The sidecar's admin port in pod `pod`: its `kg-admin` container port (chosen per
    /// pod by the webhook, against the pod's own ports).
    pub async fn admin_port(&self, pod: &str) -> Result<u16> {
        let pod = self.pods().get(pod).await?;
        let spec = pod.spec.context("pod without spec")?;
        spec.containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
            .flat_map(|c| c.ports.iter().flatten())
            .find(|p| p.name.as_deref() == Some(admin::PORT_NAME))
            .and_then(|p| u16::try_from(p.container_port).ok())
            .context("no kg-admin port: the pod has no sidecar")
    }

    /// `GET path` on the sidecar's admin port of pod `pod`.
    pub async fn admin_get(&self, pod: &str, path: &str) -> Result<String> {
        let port = self.admin_port(pod).await?;
        self.pod_get(pod, port, path).await
    }

    /// The live pods of Deployment `name`.
    pub async fn app_pods(&self, name: &str) -> Result<Vec<Pod>> {
        Ok(self
            .pods()
            .list(&ListParams::default().labels(&format!("app={name}")))
            .await?
            .items)
    }

    /// `GET path` on port `port` of pod `pod`, through the API server's pod proxy (it
    /// reaches the pod IP wherever the API server does, kind included). Returns the body.
    pub async fn pod_get(&self, pod: &str, port: u16, path: &str) -> Result<String> {
        let url = format!(
            "/api/v1/namespaces/{}/pods/{pod}:{port}/proxy/{}",
            self.namespace,
            path.trim_start_matches('/')
        );
        let req = http::Request::get(url.as_str()).body(Vec::new())?;
        self.client
            .request_text(req)
            .await
            .with_context(|| format!("GET {url}"))
    }

    /// Waits until `name` is rolled out with exactly its replicas, all ready, none
    /// terminating, with the sidecar in every pod iff `kubegrace` (and the route Ready),
    /// and its Service answers from this host.
    pub async fn settle(&self, name: &str, kubegrace: bool, p: &Progress) -> Result<()> {
        let pods = self.pods();
        let routes = graceroute_api(&self.client, &self.namespace);
        let want = usize::try_from(self.opts.replicas).unwrap_or(0);
        p.wait(
            &format!(
                "{name}: {want} ready pods{}",
                if kubegrace {
                    " with the sidecar, route Ready"
                } else {
                    ""
                }
            ),
            Patience::new(self.opts.rollout_timeout, Duration::from_millis(500)),
            || async {
                self.workload_rolled_out(name).await?;
                let list = pods
                    .list(&ListParams::default().labels(&format!("app={name}")))
                    .await
                    .map_err(|e| e.to_string())?;
                let live: Vec<&Pod> = list.items.iter().collect();
                let terminating = live
                    .iter()
                    .filter(|p| p.metadata.deletion_timestamp.is_some())
                    .count();
                let ready = live.iter().filter(|p| pod_ready(p)).count();
                let sidecars = live.iter().filter(|p| has_sidecar(p)).count();
                let sidecar_ok = if kubegrace {
                    sidecars == live.len()
                } else {
                    sidecars == 0
                };
                if live.len() != want || terminating > 0 || ready != want || !sidecar_ok {
                    return Err(format!(
                        "{} pods, {ready} ready, {terminating} terminating, {sidecars} with the sidecar",
                        live.len()
                    ));
                }
                if kubegrace {
                    let r = routes.get(name).await.map_err(|e| e.to_string())?;
                    let (status, reason, message) = route_condition(&r, "Ready");
                    if status != "True" {
                        let reason = if reason.is_empty() { "-" } else { &reason };
                        return Err(format!("route not Ready: {reason} {message}"));
                    }
                    // The budget reaches each pod through the webhook, not the template.
                    let budget = r.data["status"]["budgetSeconds"].as_i64().unwrap_or(0);
                    let short: Vec<String> = live
                        .iter()
                        .filter(|p| pod_grace_period(p.spec.as_ref()) < budget)
                        .filter_map(|p| p.metadata.name.clone())
                        .collect();
                    if !short.is_empty() {
                        return Err(format!(
                            "pods with a grace period below the budget {budget}s: {}",
                            short.join(", ")
                        ));
                    }
                }
                Ok(())
            },
        )
        .await?;
        let addr = self.service_addr(name).await?;
        p.wait(
            &format!("{name}: an answer through {addr} from this host"),
            Patience::new(Duration::from_secs(60), Duration::from_millis(250)),
            || async {
                match http_get(&addr, "/", Duration::from_secs(2)).await {
                    Ok((200, body)) if body.starts_with("pod=") => Ok(()),
                    Ok((status, body)) => Err(format!("{status} {}", body.trim())),
                    Err(e) => Err(format!("{e:#}")),
                }
            },
        )
        .await
    }

    /// Where this host sends the load for the Service `name`: `ClusterIP:80` when the host
    /// routes ClusterIPs (`KUBEGRACE_E2E_HOST_REACHES_SERVICES`, the local cluster), else
    /// `<node InternalIP>:<nodePort>` (kind: the node is a container on the host's network).
    pub async fn service_addr(&self, name: &str) -> Result<String> {
        let services: Api<Service> = Api::namespaced(self.client.clone(), &self.namespace);
        let spec = services
            .get(name)
            .await?
            .spec
            .with_context(|| format!("Service {name} has no spec"))?;
        if std::env::var_os("KUBEGRACE_E2E_HOST_REACHES_SERVICES").is_some() {
            let ip = spec
                .cluster_ip
                .filter(|ip| !ip.is_empty() && ip != "None")
                .with_context(|| format!("Service {name} has no ClusterIP"))?;
            return Ok(format!("{ip}:80"));
        }
        let node_port = spec
            .ports
            .iter()
            .flatten()
            .find_map(|p| p.node_port)
            .with_context(|| format!("Service {name} has no nodePort"))?;
        let nodes: Api<Node> = Api::all(self.client.clone());
        let ip = nodes
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .flat_map(|n| n.status.and_then(|s| s.addresses).unwrap_or_default())
            .find(|a| a.type_ == "InternalIP")
            .map(|a| a.address)
            .context("no node with an InternalIP")?;
        Ok(format!("{ip}:{node_port}"))
    }

    pub(super) async fn pod_names(&self, name: &str) -> Result<BTreeMap<String, bool>> {
        Ok(self
            .pods()
            .list(&ListParams::default().labels(&format!("app={name}")))
            .await?
            .items
            .into_iter()
            .filter_map(|p| {
                let terminating = p.metadata.deletion_timestamp.is_some();
                p.metadata.name.map(|n| (n, terminating))
            })
            .collect())
    }
}
