//! The load of one run, from this host or from a `kubegrace-loadgen` Job in the cluster,
//! started and stopped ([`RunningLoad`]).

use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{ListParams, PostParams};
use kube::{Api, Client};

use super::{LoadMode, Patience, Progress, Scenario, suffix};
use crate::load::{self, Summary};

/// The loadgen's control port in its Job (`GET /ready`, `POST /stop`).
pub const LOADGEN_CONTROL_PORT: u16 = load::job::CONTROL_PORT;

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
                p.wait(
                    &format!("Job {job}: POST /stop accepted"),
                    Patience::new(Duration::from_secs(30), Duration::from_millis(500)),
                    || load::job::stop(&client, &namespace, &pod),
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
                            load::job::finished(&got)
                        },
                    )
                    .await?;
                Ok(load::job::summary(&client, &namespace, &pod, &phase).await?)
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
                p.step(self.load_line(name, &format!("{addr} from {}", lo.mode.describe())));
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

    /// The step that says what load runs on `name`'s `target`.
    pub(super) fn load_line(&self, name: &str, target: &str) -> String {
        let lo = &self.opts.load;
        format!(
            "{name}: load {}/s {} keep-alive ({} connections, GET {}) on {target}",
            lo.rate,
            lo.protocol.as_str(),
            lo.connections,
            lo.path
        )
    }

    pub(super) fn load_config(&self, target: String) -> load::Config {
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
        let mut job = load::job::manifest(&job_name, name, &self.opts.loadgen_image(), &cfg)?;
        // On a node of its own when the cluster has several: the app's pods keep off it.
        let placement = self.placement().await?;
        let on_node = match &placement {
            Some(pl) => {
                if let Some(pod) = job.spec.as_mut().and_then(|s| s.template.spec.as_mut()) {
                    pod.affinity = Some(pl.load_affinity());
                }
                format!(" on node {} ({})", pl.load_node, pl.describe())
            }
            None => String::new(),
        };
        let jobs: Api<Job> = Api::namespaced(self.client.clone(), &self.namespace);
        jobs.create(&PostParams::default(), &job)
            .await
            .with_context(|| format!("creating the loadgen Job {job_name}"))?;
        p.step(self.load_line(
            name,
            &format!("{cluster_ip}:80 from Job {job_name}{on_node}"),
        ));
        let pods = self.pods();
        let selector = load::job::pod_selector(&job_name);
        let pod = p
            .wait(
                &format!("Job {job_name}: its pod sending (ready)"),
                Patience::new(Duration::from_secs(60), Duration::from_millis(250)),
                || async {
                    let list = pods
                        .list(&ListParams::default().labels(&selector))
                        .await
                        .map_err(|e| e.to_string())?;
                    load::job::sending(&list.items)
                },
            )
            .await?;
        Ok(RunningLoad {
            from: match &placement {
                Some(pl) => format!(
                    "{} ({job_name}, node {})",
                    LoadMode::Job.describe(),
                    pl.load_node
                ),
                None => format!("{} ({job_name})", LoadMode::Job.describe()),
            },
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
