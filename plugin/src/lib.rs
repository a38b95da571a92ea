//! `kubectl kubegrace`: is kubegrace working in this cluster, and does a rollout lose
//! anything? The binary (`main.rs`) parses the command line; the work is here.
//!
//! - [`check`]: the install (operator, Lease, webhooks, certificate, CRD) and what it
//!   serves (pods without their sidecar or with a stale one, Services around the sidecar,
//!   routes not accepted). Reading the cluster ([`check::gather`]) is apart from judging
//!   it ([`check::rules`], pure), so every decision is tested without an API server.
//! - [`status`]: per pod of a route or Deployment, the sidecar's drain phase, in-flight
//!   requests, open connections, breakers and last drain, read from its admin port through
//!   the API server's pod proxy.
//! - [`resume`]: resumes the rollouts the operator paused for a lossy drain
//!   (`rollout.pauseOnDrainLoss`) and records the time on the route.
//! - [`verify`]: a loadgen Job on the workload's Service, `rollout restart`, and the
//!   attributed table of `make demo` (`kubegrace_load`, shared with the e2e tests).
//!
//! The operator's own rules are reused, not restated, from the API crate
//! (`kubegrace_api`, which the operator uses too; the plugin does not depend on the
//! operator): which pods want the sidecar (`inject::wants_injection`), which Services
//! bypass it (`bypass::service_bypasses`), the workloads a route selects
//! (`workloads::Workloads`), the sidecar version of an image (`image_ref::version_of`),
//! the CRD (`crd::GraceRoute`) and the operator's flags (`cli::RunArgs`).

pub mod check;
pub mod cluster;
pub mod install;
pub mod resume;
pub mod status;
pub mod verify;

/// Everything that stops a command from giving its answer (a problem the answer names is
/// not an error: `check` prints it and exits 1).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{context}: {source}")]
    Kube {
        context: String,
        #[source]
        source: kube::Error,
    },
    #[error("kubeconfig: {0}")]
    Kubeconfig(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Invalid(String),
    #[error("timed out after {seconds}s waiting for {what} ({last})")]
    Timeout {
        what: String,
        seconds: u64,
        last: String,
    },
    #[error(transparent)]
    Load(#[from] kubegrace_load::Error),
    #[error("encoding JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("writing {path}: {source}")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// `map_err` for a kube call, with what was being done.
    pub fn kube(context: impl Into<String>) -> impl FnOnce(kube::Error) -> Self {
        let context = context.into();
        move |source| Self::Kube { context, source }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
