//! The sidecar's command line as others write it: the flags the operator's
//! webhook puts into the container's args, and every `KUBEGRACE_*`
//! environment twin of a flag (flags > environment > YAML file > defaults).
//! The sidecar's `cli` module declares its flags with these names and a test
//! there checks that each flag below exists.

/// Flags, with their dashes, as they go into a container's `args`.
pub mod flag {
    /// The YAML config file, watched and reloaded.
    pub const CONFIG: &str = "--config";
    /// Where downstream traffic arrives.
    pub const LISTEN: &str = "--listen";
    /// The app (repeatable for blue/green instances).
    pub const UPSTREAM: &str = "--upstream";
    /// The admin port's address.
    pub const ADMIN: &str = "--admin";
    /// The drain token (prefer [`super::env::DRAIN_TOKEN`]: arguments are
    /// visible in the pod spec and `ps`).
    pub const DRAIN_TOKEN: &str = "--drain-token";
    /// The app's readiness check, as JSON ([`crate::config::AppReadiness`]).
    pub const APP_READINESS: &str = "--app-readiness";
    /// Where the final drain report is written (the container's termination
    /// message; see [`crate::report`]).
    pub const TERMINATION_LOG: &str = "--termination-log";
    /// A directory that outlives the container (the pod's `emptyDir`): the
    /// drain journal, so a sidecar restarted mid-drain carries the drain on.
    /// The webhook sets it through [`super::env::STATE_DIR`], which a
    /// sidecar of an older release ignores instead of refusing.
    pub const STATE_DIR: &str = "--state-dir";
}

/// Environment variables, one per flag (`--drain-min-delay` is
/// `KUBEGRACE_DRAIN_MIN_DELAY`), plus the few that have no flag.
pub mod env {
    pub const LISTEN: &str = "KUBEGRACE_LISTEN";
    pub const UPSTREAM: &str = "KUBEGRACE_UPSTREAM";
    pub const ADMIN: &str = "KUBEGRACE_ADMIN";
    pub const ADMIN_INSECURE: &str = "KUBEGRACE_ADMIN_INSECURE";
    pub const WORKERS: &str = "KUBEGRACE_WORKERS";
    pub const LISTEN_MODE: &str = "KUBEGRACE_LISTEN_MODE";
    pub const CONFIG: &str = "KUBEGRACE_CONFIG";
    pub const PROTOCOL: &str = "KUBEGRACE_PROTOCOL";
    pub const DRAIN_MIN_DELAY: &str = "KUBEGRACE_DRAIN_MIN_DELAY";
    pub const DRAIN_QUIET: &str = "KUBEGRACE_DRAIN_QUIET";
    pub const DRAIN_MAX_DELAY: &str = "KUBEGRACE_DRAIN_MAX_DELAY";
    pub const DRAIN_TIMEOUT: &str = "KUBEGRACE_DRAIN_TIMEOUT";
    pub const DRAIN_HTTP2_GOAWAY: &str = "KUBEGRACE_DRAIN_HTTP2_GOAWAY";
    pub const DRAIN_READINESS: &str = "KUBEGRACE_DRAIN_READINESS";
    pub const DRAIN_GRPC_HEALTH: &str = "KUBEGRACE_DRAIN_GRPC_HEALTH";
    pub const DRAIN_WEBSOCKET_CLOSE: &str = "KUBEGRACE_DRAIN_WEBSOCKET_CLOSE";
    pub const DRAIN_WEBSOCKET_CLOSE_WINDOW: &str = "KUBEGRACE_DRAIN_WEBSOCKET_CLOSE_WINDOW";
    pub const DRAIN_WEBSOCKET_CLOSE_WAIT: &str = "KUBEGRACE_DRAIN_WEBSOCKET_CLOSE_WAIT";
    pub const MAX_CONCURRENT_STREAMS: &str = "KUBEGRACE_MAX_CONCURRENT_STREAMS";
    pub const BODY_READ_TIMEOUT: &str = "KUBEGRACE_BODY_READ_TIMEOUT";
    pub const WRITE_TIMEOUT: &str = "KUBEGRACE_WRITE_TIMEOUT";
    pub const TUNNEL_IDLE_TIMEOUT: &str = "KUBEGRACE_TUNNEL_IDLE_TIMEOUT";
    pub const MAX_CONNECTIONS: &str = "KUBEGRACE_MAX_CONNECTIONS";
    pub const ADMIN_MAX_CONNECTIONS: &str = "KUBEGRACE_ADMIN_MAX_CONNECTIONS";
    pub const UPGRADE_PROTOCOLS: &str = "KUBEGRACE_UPGRADE_PROTOCOLS";
    pub const TRUSTED_HOPS: &str = "KUBEGRACE_TRUSTED_HOPS";
    pub const HTTP1_FAST_PATH: &str = "KUBEGRACE_HTTP1_FAST_PATH";
    pub const DEFER_ACCEPT: &str = "KUBEGRACE_DEFER_ACCEPT";
    pub const UPSTREAM_HOLD_TIMEOUT: &str = "KUBEGRACE_UPSTREAM_HOLD_TIMEOUT";
    pub const APP_READINESS: &str = "KUBEGRACE_APP_READINESS";
    pub const DRAIN_TOKEN: &str = "KUBEGRACE_DRAIN_TOKEN";
    pub const LOG_FORMAT: &str = "KUBEGRACE_LOG_FORMAT";
    pub const READY_FILE: &str = "KUBEGRACE_READY_FILE";
    pub const TERMINATION_LOG: &str = "KUBEGRACE_TERMINATION_LOG";
    pub const UPGRADE_BINARY: &str = "KUBEGRACE_UPGRADE_BINARY";
    pub const STATE_DIR: &str = "KUBEGRACE_STATE_DIR";
    /// The `tracing` filter: a level or `target=level` directives (`info`,
    /// `info,kubegrace_sidecar::drain=debug`), no span or field filters; no flag.
    pub const LOG: &str = "KUBEGRACE_LOG";
}
