//! The one error type of the sidecar crate.

use crate::config::ConfigError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid configuration: {0}")]
    Config(#[from] ConfigError),
    #[error("cannot read {path}: {source}")]
    ReadConfig {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot bind {what} on {addr}: {source}")]
    Bind {
        what: &'static str,
        addr: String,
        #[source]
        source: std::io::Error,
    },
    /// A configuration the code cannot serve.
    #[error("{0}")]
    Unsupported(String),
    /// The app could not be reached (connect refused or timed out).
    #[error("cannot connect to the app at {endpoint}: {source}")]
    UpstreamConnect {
        endpoint: String,
        #[source]
        source: std::io::Error,
    },
    /// The app refused connections for the whole hold (it is restarting, or
    /// the pod is going away): answered 503 with `Retry-After` (app.rs).
    #[error("the app at {endpoint} refused connections for {waited:?}")]
    AppDown {
        endpoint: String,
        waited: std::time::Duration,
    },
    /// The app cannot take the request in the protocol it speaks (gRPC to
    /// an app that answered the HTTP/2 preface as HTTP/1.1): answered by the
    /// sidecar, and never a breaker failure (upstream/downgrade.rs).
    #[error("the app at {endpoint} cannot take this request: {reason}")]
    UpstreamProtocol {
        endpoint: String,
        reason: &'static str,
    },
    /// The exchange with the app failed (closed mid-response, protocol
    /// error, or the request body failed, e.g. over its length limit).
    #[error("upstream: {0}")]
    Upstream(#[source] hyper::Error),
    /// The same on an HTTP/2 app connection (upstream/h2conn.rs, on the
    /// crate's own client): the stream or the connection failed. Boxed:
    /// the codec's error is the crate's own, not part of its public API;
    /// [`Error::h2wire`] gives it back.
    #[error("upstream: {0}")]
    UpstreamH2(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}

impl Error {
    /// Process exit code: 64 (EX_USAGE) for anything the user must fix in
    /// flags, environment or file; 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            Self::Config(_) | Self::ReadConfig { .. } | Self::Unsupported(_) => 64,
            _ => 1,
        }
    }

    pub(crate) fn upstream_h2(err: crate::h2wire::client::Error) -> Self {
        Self::UpstreamH2(Box::new(err))
    }

    /// The HTTP/2 client's error under [`Error::UpstreamH2`].
    pub(crate) fn h2wire(&self) -> Option<&crate::h2wire::client::Error> {
        match self {
            Self::UpstreamH2(err) => err.downcast_ref(),
            _ => None,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
