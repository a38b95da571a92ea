//! The operator's error type. Each step of the route controller has its own
//! error enum (`controller::{dereference, build, apply, finalizer,
//! status}::Error`, as Stackable's operators have one per step), wrapped
//! here. [`Error::kind`] is the metric label
//! (`kubegrace_operator_reconcile_errors_total{kind="..."}`): what kind of
//! thing failed (an API call, the finalizer, a panic), not which line.

use std::time::Duration;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A call to the API server failed (network, RBAC, conflict, ...).
    #[error("{context}: {source}")]
    Kube {
        context: String,
        #[source]
        source: kube::Error,
    },
    /// The route controller's steps, each with its own error (the metric
    /// label is the step error's).
    #[error(transparent)]
    Dereference(#[from] crate::controller::dereference::Error),
    #[error(transparent)]
    Build(#[from] crate::controller::build::Error),
    #[error(transparent)]
    Apply(#[from] crate::controller::apply::Error),
    #[error(transparent)]
    Finalizer(#[from] crate::controller::finalizer::Error),
    /// An object we read did not have the shape we rely on.
    #[error("{0}")]
    MissingField(String),
    /// (De)serialising JSON/YAML we produce.
    #[error("serialising {context}: {source}")]
    Serde {
        context: &'static str,
        #[source]
        source: serde_json::Error,
    },
    /// The sidecar config we built does not pass the sidecar's own checks.
    #[error("sidecar config: {0}")]
    SidecarConfig(#[from] kubegrace_sidecar_api::config::ConfigError),
    /// Certificate generation or loading.
    #[error("certificate: {0}")]
    Cert(String),
    /// TLS setup for the webhook server.
    #[error("tls: {0}")]
    Tls(String),
    /// Binding or serving a socket.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// The command line or environment is not usable.
    #[error("config: {0}")]
    Config(String),
    #[error(transparent)]
    Status(#[from] crate::controller::status::Error),
    /// A task panicked; the panic was caught at its boundary (the message
    /// is the panic's).
    #[error("panicked: {0}")]
    Panic(String),
    /// A wait in a test helper or the lease loop ran out of time.
    #[error("timed out after {0:?}: {1}")]
    Timeout(Duration, String),
}

impl Error {
    /// The metric label for this error.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Kube { .. } => "kube",
            Self::Dereference(e) => e.kind(),
            Self::Build(e) => e.kind(),
            Self::Apply(e) => e.kind(),
            Self::Finalizer(e) => e.kind(),
            Self::MissingField(_) => "missing_field",
            Self::Serde { .. } => "serde",
            Self::SidecarConfig(_) => "sidecar_config",
            Self::Cert(_) => "cert",
            Self::Tls(_) => "tls",
            Self::Io { .. } => "io",
            Self::Config(_) => "config",
            Self::Timeout(..) => "timeout",
            Self::Panic(_) => "panic",
            Self::Status(e) => e.kind(),
        }
    }

    /// Wraps a kube error with what we were doing.
    pub fn kube(context: impl Into<String>) -> impl FnOnce(kube::Error) -> Self {
        let context = context.into();
        move |source| Self::Kube { context, source }
    }

    pub fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let context = context.into();
        move |source| Self::Io { context, source }
    }

    pub fn serde(context: &'static str) -> impl FnOnce(serde_json::Error) -> Self {
        move |source| Self::Serde { context, source }
    }
}

impl From<kube::Error> for Error {
    fn from(source: kube::Error) -> Self {
        Self::Kube {
            context: "API call".into(),
            source,
        }
    }
}
