//! `kubectl kubegrace verify deploy/NAME` (or `rollout/NAME`, an Argo Rollouts `Rollout`):
//! proves a rollout of the workload loses nothing.
//! A loadgen Job (`kubegrace_load::job`, the Job of the e2e tests and `make demo`) sends
//! a constant open-loop load to the workload's Service; after a lead-in the workload
//! is restarted (a new pod template, as `kubectl rollout restart` writes it; a Rollout
//! rolls it by its own canary or blue-green strategy); once it is rolled out and every old pod is
//! gone the load stops, and the table of `make demo` is printed
//! (`kubegrace_load::report::columns`): requests, failed by reason and by pod, p50/p99,
//! rollout duration. Any failed request fails the command (exit 1): a CI gate.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::Selector;
use kube::{Api, Client, ResourceExt};
use kubegrace_api::argo::Rollout;
use kubegrace_api::crd::TargetKind;
use kubegrace_load::report::{DemoRun, Event};
use kubegrace_load::{Config, Protocol, job, rollout};

use crate::cluster::wait;
use crate::{Error, Result};

/// The default loadgen image: the release's, at this plugin's own version, so
/// `kubectl kubegrace verify` works on any cluster that can pull from the
/// release registry (the release workflow publishes it with the sidecar and the
/// operator). The e2e suite and `make demo` pass their locally built
/// `localhost/kubegrace/loadgen:e2e` with `--loadgen-image`.
pub const DEFAULT_LOADGEN_IMAGE: &str =
    concat!("ghcr.io/kubegrace/loadgen:", env!("CARGO_PKG_VERSION"));

/// The traffic `verify` sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Traffic {
    /// HTTP/1.1 keep-alive GETs.
    Http1,
    /// HTTP/2 prior knowledge (h2c) GETs.
    H2,
    /// gRPC calls of the demo app's `kubegrace.demo.Echo`.
    Grpc,
}

impl Traffic {
    pub fn protocol(self) -> Protocol {
        match self {
            Traffic::Http1 => Protocol::Http1,
            Traffic::H2 => Protocol::Http2,
            Traffic::Grpc => Protocol::Grpc,
        }
    }
}

/// The workload `verify` rolls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Workload {
    Deployment(String),
    /// An Argo Rollouts `Rollout`.
    Rollout(String),
}

impl Workload {
    pub fn name(&self) -> &str {
        match self {
            Workload::Deployment(n) | Workload::Rollout(n) => n,
        }
    }

    /// `deployment` or `rollout`, as kubectl names the resource.
    pub fn resource(&self) -> &'static str {
        match self {
            Workload::Deployment(_) => "deployment",
            Workload::Rollout(_) => "rollout",
        }
    }

    /// `Deployment` or `Rollout`.
    pub fn kind(&self) -> &'static str {
        match self {
            Workload::Deployment(_) => "Deployment",
            Workload::Rollout(_) => "Rollout",
        }
    }

    /// The pod selector and the pod template's labels.
    async fn read(
        &self,
        client: &Client,
        ns: &str,
    ) -> Result<(LabelSelector, BTreeMap<String, String>)> {
        let (kind, name) = (self.kind(), self.name());
        let (selector, template) = match self {
            Workload::Deployment(_) => {
                let api: Api<Deployment> = Api::namespaced(client.clone(), ns);
                let d = crate::cluster::get(&api, kind, ns, name).await?;
                let spec = d
                    .spec
                    .ok_or_else(|| Error::Invalid(format!("{kind} {ns}/{name} has no spec")))?;
                (Some(spec.selector), spec.template.metadata)
            }
            Workload::Rollout(_) => {
                let api: Api<Rollout> = Api::namespaced(client.clone(), ns);
                let r = crate::cluster::get(&api, kind, ns, name).await?;
                let stable = r.status_str("stableRS").map(String::from);
                let mut meta = r.spec.template.and_then(|t| t.metadata);
                // Argo narrows a blue-green Rollout's Services to one revision by its hash
                // label, which the pods carry but the template does not: the stable
                // revision's hash makes the active Service match.
                if let (Some(m), Some(stable)) = (meta.as_mut(), stable) {
                    m.labels
                        .get_or_insert_default()
                        .insert(kubegrace_api::argo::POD_TEMPLATE_HASH.into(), stable);
                }
                (r.spec.selector, meta)
            }
        };
        let selector = selector.ok_or_else(|| {
            Error::Invalid(format!("{kind} {ns}/{name} has no selector (a Rollout with workloadRef: verify its Deployment)"))
        })?;
        Ok((
            selector,
            template.and_then(|m| m.labels).unwrap_or_default(),
        ))
    }

    /// The workload's API, untyped: reading its generation and patching its template
    /// are the same for both kinds.
    fn api(&self, client: &Client, ns: &str) -> Api<DynamicObject> {
        let kind = match self {
            Workload::Deployment(_) => TargetKind::Deployment,
            Workload::Rollout(_) => TargetKind::Rollout,
        };
        Api::namespaced_with(client.clone(), ns, &kind.api_resource())
    }

    async fn generation(&self, client: &Client, ns: &str) -> std::result::Result<i64, kube::Error> {
        let w = self.api(client, ns).get(self.name()).await?;
        Ok(w.metadata.generation.unwrap_or(0))
    }

    async fn restart(
        &self,
        client: &Client,
        ns: &str,
        at: f64,
    ) -> std::result::Result<(), kube::Error> {
        let patch = Patch::Merge(rollout::restart_patch(at));
        self.api(client, ns)
            .patch(self.name(), &PatchParams::default(), &patch)
            .await
            .map(drop)
    }

    /// Ok when rolled out at a generation past `before`, else what is missing.
    async fn rolled_out(
        &self,
        client: &Client,
        ns: &str,
        before: i64,
    ) -> std::result::Result<(), String> {
        let moved = |g: Option<i64>| {
            if g.unwrap_or(0) <= before {
                Err("the restart is not in the spec yet".to_owned())
            } else {
                Ok(())
            }
        };
        let obj = self
            .api(client, ns)
            .get(self.name())
            .await
            .map_err(|e| e.to_string())?;
        moved(obj.metadata.generation)?;
        let value = serde_json::to_value(&obj).map_err(|e| e.to_string())?;
        let decode = |e: serde_json::Error| format!("{} {}: {e}", self.kind(), self.name());
        match self {
            Workload::Deployment(_) => {
                rollout::rolled_out(&serde_json::from_value(value).map_err(decode)?)
            }
            Workload::Rollout(_) => {
                kubegrace_api::argo::rolled_out(&serde_json::from_value(value).map_err(decode)?)
            }
        }
    }
}

/// What `verify` is told.
#[derive(Debug, Clone)]
pub struct Options {
    pub workload: Workload,
    pub namespace: String,
    /// Requests per second (open loop).
    pub rate: f64,
    /// Longest the load runs: lead-in, rollout and the wait for the old pods must fit.
    pub duration: Duration,
    pub traffic: Traffic,
    pub path: String,
    pub connections: usize,
    /// Deadline of one request.
    pub timeout: Duration,
    pub loadgen_image: String,
    /// Load before the restart: the steady state the rollout is read against.
    pub lead_in: Duration,
    /// Leave the Job in place (its log holds the summary).
    pub keep_job: bool,
}

/// What a verify run measured.
#[derive(Debug, Clone)]
pub struct Verdict {
    pub run: DemoRun,
    pub table: String,
}

impl Verdict {
    pub fn passed(&self) -> bool {
        self.run.summary.failed == 0 && self.run.summary.requests > 0
    }
}

/// The load configuration for a target URL (pure).
pub fn load_config(opts: &Options, target: String) -> Config {
    Config {
        target,
        protocol: opts.traffic.protocol(),
        rate: opts.rate,
        duration: opts.duration,
        max_requests: (opts.rate * opts.duration.as_secs_f64()).ceil() as u64,
        connections: opts.connections,
        path: opts.path.clone(),
        timeout: opts.timeout,
        ..Config::default()
    }
}

/// The Service in front of the Deployment's pods: the first whose selector the pod
/// template's labels satisfy, and its first TCP port (pure).
pub fn service_for(
    services: &[Service],
    template_labels: &std::collections::BTreeMap<String, String>,
) -> Option<(String, String, i32)> {
    services.iter().find_map(|s| {
        let spec = s.spec.as_ref()?;
        let sel = spec.selector.as_ref().filter(|s| !s.is_empty())?;
        if !sel.iter().all(|(k, v)| template_labels.get(k) == Some(v)) {
            return None;
        }
        let ip = spec
            .cluster_ip
            .clone()
            .filter(|ip| !ip.is_empty() && ip != "None")?;
        let port = spec
            .ports
            .iter()
            .flatten()
            .find(|p| p.protocol.as_deref().unwrap_or("TCP") == "TCP")?
            .port;
        Some((s.name_any(), ip, port))
    })
}

/// The Job's name: `kubegrace-verify-<deployment>-<5 hex>`, within 63 characters.
pub fn job_name(deployment: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let suffix = format!("{:05x}", (nanos ^ (std::process::id() << 12)) & 0xf_ffff);
    let stem: String = format!("kubegrace-verify-{deployment}")
        .chars()
        .take(63 - 6)
        .collect();
    format!("{}-{suffix}", stem.trim_end_matches('-'))
}

/// Runs it; `say` gets each step.
pub async fn verify(client: &Client, opts: &Options, say: &dyn Fn(&str)) -> Result<Verdict> {
    let (ns, name, kind) = (&opts.namespace, opts.workload.name(), opts.workload.kind());
    let (selector, labels) = opts.workload.read(client, ns).await?;
    let selector = Selector::try_from(selector)
        .map_err(|e| Error::Invalid(format!("{kind} {ns}/{name} selector: {e}")))?
        .to_string();
    let services = Api::<Service>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .map_err(Error::kube(format!("listing Services in {ns}")))?;
    let (svc, ip, port) = service_for(&services.items, &labels).ok_or_else(|| {
        Error::NotFound(format!(
            "no Service with a ClusterIP selects the pods of {kind} {ns}/{name}; fix: kubectl -n {ns} expose {} {name} --port 80 --target-port <port name>",
            opts.workload.resource()
        ))
    })?;
    let cfg = load_config(opts, format!("http://{ip}:{port}"));
    let job_name = job_name(name);
    let manifest = job::manifest(&job_name, name, &opts.loadgen_image, &cfg)?;
    let jobs: Api<Job> = Api::namespaced(client.clone(), ns);
    jobs.create(&PostParams::default(), &manifest)
        .await
        .map_err(Error::kube(format!(
            "creating the loadgen Job {ns}/{job_name}"
        )))?;
    say(&format!(
        "load: {}/s {} ({} connections, {}) on Service {svc} ({ip}:{port}) from Job {job_name}",
        cfg.rate,
        cfg.protocol.as_str(),
        cfg.connections,
        cfg.path
    ));
    let measured = measure(client, opts, &cfg, &job_name, &selector, say).await;
    if !opts.keep_job {
        let _ = jobs.delete(&job_name, &DeleteParams::background()).await;
    }
    let run = measured?;
    let label = match opts.workload {
        Workload::Deployment(_) => format!("deploy/{name}"),
        Workload::Rollout(_) => format!("rollout/{name}"),
    };
    let table = kubegrace_load::report::columns(&[(label.as_str(), &run)]);
    Ok(Verdict { run, table })
}

/// Waits for the load, restarts the workload, waits for the rollout and the old pods,
/// stops the load and reads its summary.
async fn measure(
    client: &Client,
    opts: &Options,
    cfg: &Config,
    job_name: &str,
    selector: &str,
    say: &dyn Fn(&str),
) -> Result<DemoRun> {
    let ns = &opts.namespace;
    let (name, resource) = (opts.workload.name(), opts.workload.resource());
    let begun = Instant::now();
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let job_pods = ListParams::default().labels(&job::pod_selector(job_name));
    let loadgen = wait(
        &format!("Job {job_name} sending (its pod ready)"),
        Duration::from_secs(120),
        Duration::from_millis(500),
        || async {
            let list = pods.list(&job_pods).await.map_err(|e| e.to_string())?;
            job::sending(&list.items)
        },
    )
    .await?;
    tokio::time::sleep(opts.lead_in).await;

    let app_pods = ListParams::default().labels(selector);
    let before: BTreeSet<String> = pods
        .list(&app_pods)
        .await
        .map_err(Error::kube("listing the workload's pods"))?
        .items
        .iter()
        .map(|p| p.name_any())
        .collect();
    let generation_before = opts
        .workload
        .generation(client, ns)
        .await
        .map_err(Error::kube(format!("reading {resource} {ns}/{name}")))?;
    let at = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    opts.workload
        .restart(client, ns, at)
        .await
        .map_err(Error::kube(format!("restarting {resource} {ns}/{name}")))?;
    let started = Instant::now();
    say(&format!(
        "rollout restart {resource}/{name} ({} pods to replace)",
        before.len()
    ));

    // The load ends by itself at `duration`: the rollout must be done before.
    let left = opts
        .duration
        .saturating_sub(begun.elapsed() + Duration::from_secs(2));
    // Rollout duration as `make demo` reports it: restart to rolled out; the wait goes on
    // until the old pods are gone (their drains are part of what is measured).
    let rolled_at: std::cell::Cell<Option<f64>> = std::cell::Cell::new(None);
    // Each old pod's first sighting as terminating (UNIX time, label): the report's
    // timeline marks them, so a failure can be read against the pod that was draining.
    let terminating: std::cell::RefCell<Vec<(f64, String)>> = std::cell::RefCell::default();
    let rolled = wait(
        &format!("{resource}/{name} rolled out and its old pods gone"),
        left,
        Duration::from_millis(500),
        || async {
            // Pods first: old pods start terminating long before the rollout is done.
            let now = pods.list(&app_pods).await.map_err(|e| e.to_string())?;
            note_terminating(&before, &now.items, &mut terminating.borrow_mut());
            opts.workload
                .rolled_out(client, ns, generation_before)
                .await?;
            if rolled_at.get().is_none() {
                rolled_at.set(Some(started.elapsed().as_secs_f64()));
            }
            let old = now
                .items
                .iter()
                .filter(|p| before.contains(&p.name_any()))
                .count();
            if old > 0 {
                return Err(format!("rolled out; {old} old pods still terminating"));
            }
            Ok(rolled_at.get().unwrap_or_default())
        },
    )
    .await;
    say("stopping the load");
    wait(
        &format!("Job {job_name}: POST /stop accepted"),
        Duration::from_secs(30),
        Duration::from_millis(500),
        || job::stop(client, ns, &loadgen),
    )
    .await?;
    let phase = wait(
        &format!("Job {job_name}: requests in flight done"),
        cfg.timeout + Duration::from_secs(60),
        Duration::from_millis(500),
        || async {
            let p = pods.get(&loadgen).await.map_err(|e| e.to_string())?;
            job::finished(&p)
        },
    )
    .await?;
    let summary = job::summary(client, ns, &loadgen, &phase).await?;
    let rollout_s = rolled?;
    let events = terminating
        .into_inner()
        .into_iter()
        .map(|(at, label)| Event {
            t_s: at - summary.started_at_unix_s,
            label,
        })
        .collect();
    Ok(DemoRun {
        rollout_start_s: Some(at - summary.started_at_unix_s),
        summary,
        rollout_s,
        events,
    })
}

/// Appends `<pod suffix> terminating` for each pod of `before` that `now` shows with a
/// deletion timestamp and `seen` does not name yet (pure but for the clock).
fn note_terminating(before: &BTreeSet<String>, now: &[Pod], seen: &mut Vec<(f64, String)>) {
    let at = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    for pod in now {
        let name = pod.name_any();
        if pod.metadata.deletion_timestamp.is_none() || !before.contains(&name) {
            continue;
        }
        let label = format!("{} terminating", name.rsplit('-').next().unwrap_or(&name));
        if !seen.iter().any(|(_, l)| *l == label) {
            seen.push((at, label));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(name: &str, selector: &str, ip: &str) -> Service {
        serde_json::from_str(&format!(
            r#"{{"metadata":{{"name":"{name}"}},"spec":{{"selector":{selector},"clusterIP":"{ip}","ports":[{{"port":80}}]}}}}"#
        ))
        .expect("service")
    }

    #[test]
    fn the_service_is_the_one_selecting_the_template() {
        let labels = [
            ("app".to_owned(), "web".to_owned()),
            ("tier".to_owned(), "a".to_owned()),
        ]
        .into();
        let services = [
            svc("other", r#"{"app":"db"}"#, "10.0.0.1"),
            svc("headless", r#"{"app":"web"}"#, "None"),
            svc("web", r#"{"app":"web"}"#, "10.0.0.3"),
        ];
        assert_eq!(
            service_for(&services, &labels),
            Some(("web".to_owned(), "10.0.0.3".to_owned(), 80))
        );
        assert_eq!(service_for(&services[..2], &labels), None);
    }

    fn pod(name: &str, deleting: bool) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some(name.to_owned());
        if deleting {
            p.metadata.deletion_timestamp = Some(
                k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::now()),
            );
        }
        p
    }

    #[test]
    fn old_pods_are_marked_once_when_first_seen_terminating() {
        let before: BTreeSet<String> = ["web-abc-1".to_owned(), "web-abc-2".to_owned()].into();
        let mut seen = Vec::new();
        note_terminating(
            &before,
            &[pod("web-abc-1", false), pod("web-new-9", true)],
            &mut seen,
        );
        assert!(seen.is_empty(), "{seen:?}");
        note_terminating(
            &before,
            &[pod("web-abc-1", true), pod("web-abc-2", false)],
            &mut seen,
        );
        note_terminating(
            &before,
            &[pod("web-abc-1", true), pod("web-abc-2", true)],
            &mut seen,
        );
        let labels: Vec<&str> = seen.iter().map(|(_, l)| l.as_str()).collect();
        assert_eq!(labels, ["1 terminating", "2 terminating"]);
        assert!(seen[0].0 <= seen[1].0);
    }

    #[test]
    fn the_load_is_bounded_by_rate_and_duration() {
        let opts = Options {
            workload: Workload::Deployment("web".into()),
            namespace: "ns".into(),
            rate: 20.0,
            duration: Duration::from_secs(90),
            traffic: Traffic::H2,
            path: "/".into(),
            connections: 8,
            timeout: Duration::from_secs(5),
            loadgen_image: DEFAULT_LOADGEN_IMAGE.into(),
            lead_in: Duration::from_secs(3),
            keep_job: false,
        };
        let cfg = load_config(&opts, "http://10.0.0.3:80".into());
        assert_eq!(cfg.max_requests, 1800);
        assert_eq!(cfg.protocol, Protocol::Http2);
        let name = job_name(&"x".repeat(80));
        assert!(
            name.len() <= 63 && name.starts_with("kubegrace-verify-xxx"),
            "{name}"
        );
    }
}
