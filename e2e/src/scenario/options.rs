//! What a run is told: the release, images, replicas, drain timers and load ([`Options`]).

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Result, bail};

use crate::load::Protocol;

/// Drain timers of the GraceRoute (sidecar durations, e.g. `500ms`).
#[derive(Clone, Debug)]
pub struct Drain {
    pub min_delay: String,
    pub quiet: String,
    pub max_delay: String,
    pub timeout: String,
}

impl Drain {
    /// The sidecar's own defaults (what a GraceRoute without `drain` gets),
    /// for the runs that show what a user gets: the demo and the rollout
    /// test. The faster [`Drain::default`] made an old pod's listener close
    /// while kube-proxy on a busy node still sent it new connections: 1 or 2
    /// refused of ~1,400 in 2 of 7 demo runs.
    pub fn product_defaults() -> Self {
        let d = kubegrace_sidecar_api::config::DrainConfig::default();
        Drain {
            min_delay: d.min_delay.to_string(),
            quiet: d.quiet.to_string(),
            max_delay: d.max_delay.to_string(),
            timeout: d.timeout.to_string(),
        }
    }
}

/// The product's router-lag timers (`minDelay`, `quiet`) with a shorter ceiling and
/// timeout, for the suite's other scenarios. Every scenario asserts that the constant load
/// lost nothing, so none may end the grace phase sooner than a user's pod would: with
/// `minDelay: 1s, quiet: 500ms` a keep-alive client pool opened no new connection to a
/// draining pod for half a second while kube-proxy on the busy CI node still routed to
/// it, and the next reconnect was refused (1 of 1,914 in `drain_reports`, CI of stop 44).
impl Default for Drain {
    fn default() -> Self {
        let d = Drain::product_defaults();
        Drain {
            max_delay: "5s".into(),
            timeout: "10s".into(),
            ..d
        }
    }
}

/// Where the load generator runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoadMode {
    /// `kubegrace-loadgen` as a Job in the test namespace, on the Service's ClusterIP: the
    /// traffic takes the path a client pod's does (kube-proxy on the node), on kind too.
    Job,
    /// In this process, on the ClusterIP (hosts that route it, the local cluster) or the
    /// NodePort (kind). A fallback for clusters without the loadgen image.
    Host,
}

impl LoadMode {
    /// `KUBEGRACE_E2E_LOAD_FROM` unset or `job` is [`LoadMode::Job`] (the load comes from
    /// inside the cluster, as a real client's would); `host` is [`LoadMode::Host`];
    /// anything else is an error, so a typo cannot change what is measured.
    pub fn from_env() -> Result<LoadMode> {
        match std::env::var("KUBEGRACE_E2E_LOAD_FROM").as_deref() {
            Err(_) | Ok("" | "job") => Ok(LoadMode::Job),
            Ok("host") => Ok(LoadMode::Host),
            Ok(other) => bail!("KUBEGRACE_E2E_LOAD_FROM={other:?}: expected job or host"),
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            LoadMode::Job => "a loadgen Job in the cluster",
            LoadMode::Host => "this host",
        }
    }
}

/// The load of one run.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Where the load generator runs.
    pub mode: LoadMode,
    /// HTTP/1.1 keep-alive until the demo app serves h2c and gRPC too.
    pub protocol: Protocol,
    /// Requests per second (open loop).
    pub rate: f64,
    /// Keep-alive connections (at most this many requests in flight).
    pub connections: usize,
    /// Path of every request; a little server time keeps requests in flight, as in real
    /// traffic, so a pod that dies cuts some.
    pub path: String,
    /// Deadline of one request.
    pub timeout: Duration,
    /// Load before the rollout starts: the steady state the rollout is read against.
    pub lead_in: Duration,
    /// Upper bound of one run's load; the run normally stops earlier, when the rollout is
    /// done and the old pods are gone.
    pub max_duration: Duration,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            mode: LoadMode::Host,
            protocol: Protocol::Http1,
            rate: 150.0,
            connections: 32,
            path: "/delay?ms=50".into(),
            timeout: Duration::from_secs(5),
            lead_in: Duration::from_secs(3),
            max_duration: Duration::from_secs(240),
        }
    }
}

/// Everything the scenario needs to know.
#[derive(Clone, Debug)]
pub struct Options {
    pub chart: PathBuf,
    pub release: String,
    pub release_namespace: String,
    pub image_registry: String,
    pub image_tag: String,
    /// Operator replicas (the chart's default is 2; one is enough where no test kills one).
    pub operator_replicas: u32,
    pub replicas: i32,
    pub drain: Drain,
    pub load: LoadOptions,
    /// Bound of one rollout (template change to every pod replaced and ready).
    pub rollout_timeout: Duration,
    /// Extra chart values (`--set key=value`), e.g. `sidecar.mode=classic`.
    pub chart_values: Vec<(String, String)>,
}

impl Options {
    /// Defaults for the local images (`e2e/cluster/images`), with a release name unique to
    /// this process; the load from this process ([`Options::with_load_from_env`] reads
    /// `KUBEGRACE_E2E_LOAD_FROM`).
    pub fn new(release_prefix: &str) -> Options {
        let release = format!("{release_prefix}-{}", suffix());
        Options {
            chart: crate::repo_path("charts/kubegrace"),
            release_namespace: release.clone(),
            release,
            image_registry: "localhost".into(),
            image_tag: crate::image_tag(),
            operator_replicas: 1,
            replicas: 3,
            drain: Drain::default(),
            load: LoadOptions::default(),
            rollout_timeout: Duration::from_secs(180),
            chart_values: Vec::new(),
        }
    }

    /// The load runs where `KUBEGRACE_E2E_LOAD_FROM` says ([`LoadMode::from_env`]).
    pub fn with_load_from_env(mut self) -> Result<Options> {
        self.load.mode = LoadMode::from_env()?;
        Ok(self)
    }

    /// A lossy drain on purpose, for the tests that need one: three replicas whose
    /// `drain.timeout` (4s) a request of a minute outlasts, and the load from
    /// [`Options::with_load_from_env`].
    pub fn lossy_drain(release_prefix: &str) -> Result<Options> {
        let mut opts = Options::new(release_prefix).with_load_from_env()?;
        opts.replicas = 3;
        opts.drain.timeout = "4s".into();
        Ok(opts)
    }

    /// The loadgen image: `KUBEGRACE_E2E_LOADGEN_IMAGE`, else the one `e2e/cluster/images`
    /// builds next to the chart's images.
    pub fn loadgen_image(&self) -> String {
        std::env::var("KUBEGRACE_E2E_LOADGEN_IMAGE").unwrap_or_else(|_| {
            format!(
                "{}/kubegrace/loadgen:{}",
                self.image_registry, self.image_tag
            )
        })
    }
}

/// Five lowercase hex digits, different per process and call.
pub fn suffix() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{:05x}", (nanos ^ (std::process::id() << 12)) & 0xf_ffff)
}
