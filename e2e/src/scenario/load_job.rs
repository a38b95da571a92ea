//! The load of one run, from this host or from a `kubegrace-loadgen` Job in the cluster,
//! started and stopped ([`RunningLoad`]).

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{ListParams, LogParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use super::{LoadMode, Patience, Progress, Scenario, pod_ready, suffix};
use crate::load::{self, Summary};

/// The loadgen's control port in its Job (`GET /ready`, `POST /stop`).
pub const LOADGEN_CONTROL_PORT: u16 = 9000;

/// A load that runs until [`RunningLoad::finish`].
pub struct RunningLoad {
    /// Where it runs, for the report.
    pub from: String,
    inner: Running,
}

enum Running {
    Host {
        stop_tx: tokio::sync::oneshot::Sender<()>,
        task: tokio::task::JoinHandle<Result<Summary, load::Error>>,
    },
    Job {
        client: Client,
        namespace: String,
        job: String,
        pod: String,
        timeout: Duration,
    },
}

impl RunningLoad {
    /// Stops sending, lets the requests in flight finish and returns the summary. The Job
    /// is stopped through the API server's pod proxy (`POST /stop` on its control port),
    /// which reaches pods wherever the API server does (kind too); its summary is the last
    /// JSON line of the pod's log.
    pub async fn finish(self, p: &Progress) -> Result<Summary> {
        match self.inner {
            Running::Host { stop_tx, task } => {
                let _ = stop_tx.send(());
                Ok(task.await.context("load task")?.context("load generator")?)
            }
            Running::Job {
                client,
                namespace,
                job,
                pod,
                timeout,
            } => {
                let url = format!(
                    "/api/v1/namespaces/{namespace}/pods/{pod}:{LOADGEN_CONTROL_PORT}/proxy/stop"
                );
                p.wait(
                    &format!("Job {job}: POST /stop accepted"),
                    Patience::new(Duration::from_secs(30), Duration::from_millis(500)),
                    || async {
                        let req = http::Request::post(url.as_str())
                            .body(Vec::new())
                            .map_err(|e| e.to_string())?;
                        client
                            .request_text(req)
                            .await
                            .map(drop)
                            .map_err(|e| e.to_string())
                    },
                )
                .await?;
                let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
                let phase = p
                    .wait(
                        &format!("Job {job}: requests in flight done, pod {pod} finished"),
                        Patience::new(
                            timeout + Duration::from_secs(60),
                            Duration::from_millis(500),
                        ),
                        || async {
                            let got = pods.get(&pod).await.map_err(|e| e.to_string())?;
                            match got.status.and_then(|s| s.phase).as_deref() {
                                Some(ph @ ("Succeeded" | "Failed")) => Ok(ph.to_owned()),
                                other => Err(format!("phase {}", other.unwrap_or("-"))),
                            }
                        },
                    )
                    .await?;
                let log = pods
                    .logs(
                        &pod,
                        &LogParams {
                            container: Some("loadgen".into()),
                            ..LogParams::default()
                        },
                    )
                    .await
                    .with_context(|| format!("reading the log of {pod}"))?;
                ensure!(
                    phase == "Succeeded",
                    "loadgen pod {pod} {phase}; its log:\n{log}"
                );
                let line = log
                    .lines()
                    .rev()
                    .find(|l| l.trim_start().starts_with('{'))
                    .with_context(|| format!("no JSON summary in the log of {pod}:\n{log}"))?;
                serde_json::from_str(line)
                    .with_context(|| format!("parsing the summary in the log of {pod}"))
            }
        }
    }
}

impl Scenario {
    /// Starts the load on `name`'s Service where `opts.load.mode` says, and returns once it
    /// runs. Stop it with [`RunningLoad::finish`].
    pub async fn start_load(&self, name: &str, p: &Progress) -> Result<RunningLoad> {
        let lo = &self.opts.load;
        match lo.mode {
            LoadMode::Host => {
                let addr = self.service_addr(name).await?;
                let cfg = self.load_config(format!("http://{addr}"));
                p.step(format!(
                    "{name}: load {}/s {} keep-alive ({} connections, GET {}) on {addr} from {}",
                    lo.rate,
                    lo.protocol.as_str(),
                    lo.connections,
                    lo.path,
                    lo.mode.describe()
                ));
                let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
                let task = tokio::spawn(async move {
                    load::run_outcomes_until(&cfg, async {
                        let _ = stop_rx.await;
                    })
                    .await
                    .map(|(_, summary)| summary)
                });
                Ok(RunningLoad {
                    from: lo.mode.describe().to_owned(),
                    inner: Running::Host { stop_tx, task },
                })
            }
            LoadMode::Job => self.start_load_job(name, p).await,
        }
    }

    fn load_config(&self, target: String) -> load::Config {
        let lo = &self.opts.load;
        load::Config {
            target,
            protocol: lo.protocol,
            rate: lo.rate,
            duration: lo.max_duration,
            max_requests: (lo.rate * lo.max_duration.as_secs_f64()).ceil() as u64,
            connections: lo.connections,
            path: lo.path.clone(),
            timeout: lo.timeout,
            ..load::Config::default()
        }
    }

    /// Creates the loadgen Job on the Service's ClusterIP and waits until its pod is ready
    /// (its control endpoint answers, so the load runs).
    async fn start_load_job(&self, name: &str, p: &Progress) -> Result<RunningLoad> {
        let services: Api<Service> = Api::namespaced(self.client.clone(), &self.namespace);
        let cluster_ip = services
            .get(name)
            .await?
            .spec
            .and_then(|s| s.cluster_ip)
            .filter(|ip| !ip.is_empty() && ip != "None")
            .with_context(|| format!("Service {name} has no ClusterIP"))?;
        let cfg = self.load_config(format!("http://{cluster_ip}:80"));
        let job_name = format!("loadgen-{name}-{}", suffix());
        // The Job ends by itself even if nobody stops it: the loadgen's own schedule is
        // bounded (rate x max_duration), and the deadline bounds the pod's life.
        let deadline_s = cfg.duration.as_secs() + cfg.timeout.as_secs() + 120;
        let job: Job = serde_json::from_value(json!({
            "metadata": {"name": job_name, "labels": {"app": "loadgen", "loadgen-for": name}},
            "spec": {
                "backoffLimit": 0,
                "activeDeadlineSeconds": deadline_s,
                "template": {
                    "metadata": {"labels": {"app": "loadgen", "loadgen-for": name}},
                    "spec": {
                        "restartPolicy": "Never",
                        "automountServiceAccountToken": false,
                        "terminationGracePeriodSeconds": cfg.timeout.as_secs() + 5,
                        "containers": [{
                            "name": "loadgen",
                            "image": self.opts.loadgen_image(),
                            "imagePullPolicy": "IfNotPresent",
                            "args": [
                                format!("--target={}", cfg.target),
                                format!("--protocol={}", cfg.protocol.as_str()),
                                format!("--rate={}", cfg.rate),
                                format!("--duration={}s", cfg.duration.as_secs()),
                                format!("--max-requests={}", cfg.max_requests),
                                format!("--connections={}", cfg.connections),
                                format!("--path={}", cfg.path),
                                format!("--timeout={}ms", cfg.timeout.as_millis()),
                                format!("--control=0.0.0.0:{LOADGEN_CONTROL_PORT}"),
                            ],
                            "ports": [{"name": "control", "containerPort": LOADGEN_CONTROL_PORT}],
                            "readinessProbe": {"httpGet": {"path": "/ready", "port": "control"}, "periodSeconds": 1},
                            "resources": {"requests": {"cpu": "50m", "memory": "32Mi"}},
                            "securityContext": {"allowPrivilegeEscalation": false, "runAsNonRoot": true,
                                                "capabilities": {"drop": ["ALL"]},
                                                "seccompProfile": {"type": "RuntimeDefault"}},
                        }],
                    },
                },
            },
        }))?;
        let jobs: Api<Job> = Api::namespaced(self.client.clone(), &self.namespace);
        jobs.create(&PostParams::default(), &job)
            .await
            .with_context(|| format!("creating the loadgen Job {job_name}"))?;
        p.step(format!(
            "{name}: load {}/s {} keep-alive ({} connections, GET {}) on {cluster_ip}:80 from Job {job_name}",
            cfg.rate,
            cfg.protocol.as_str(),
            cfg.connections,
            cfg.path
        ));
        let pods = self.pods();
        let selector = format!("job-name={job_name}");
        let pod = p
            .wait(
                &format!("Job {job_name}: its pod sending (ready)"),
                Patience::new(Duration::from_secs(60), Duration::from_millis(250)),
                || async {
                    let list = pods
                        .list(&ListParams::default().labels(&selector))
                        .await
                        .map_err(|e| e.to_string())?;
                    let Some(pod) = list.items.first() else {
                        return Err("no pod yet".to_owned());
                    };
                    let phase = pod
                        .status
                        .as_ref()
                        .and_then(|s| s.phase.clone())
                        .unwrap_or_default();
                    if phase == "Failed" || phase == "Succeeded" {
                        // Not retryable: say so at once (the wait prints it and times out
                        // otherwise, which would only hide the reason).
                        return Err(format!("pod ended early ({phase})"));
                    }
                    match (pod_ready(pod), pod.metadata.name.clone()) {
                        (true, Some(n)) => Ok(n),
                        _ => Err(format!("pod {phase}, not ready")),
                    }
                },
            )
            .await?;
        Ok(RunningLoad {
            from: format!("{} ({job_name})", LoadMode::Job.describe()),
            inner: Running::Job {
                client: self.client.clone(),
                namespace: self.namespace.clone(),
                job: job_name,
                pod,
                timeout: cfg.timeout,
            },
        })
    }
}
