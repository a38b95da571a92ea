//! The sidecar's admin API as its callers see it: the kubelet's probes and
//! the preStop hook (written into the pod by the operator's webhook), the
//! operator itself, `kubegrace-sidecar upgrade` and the tests.

/// The admin port the operator's webhook tries first for an injected
/// sidecar (the next free one above it otherwise): outside Istio's
/// 15000-15090 (15020 is its merged-metrics port) and Linkerd's 4140-4191.
pub const DEFAULT_PORT: u16 = 15180;

/// The sidecar container's port name for the admin port: whoever calls the
/// admin API of a running pod (probes, preStop, the operator, the tests)
/// finds the number under this name, whatever the webhook chose.
pub const PORT_NAME: &str = "kg-admin";

/// The header that carries the drain token (`--drain-token`,
/// `KUBEGRACE_DRAIN_TOKEN`) on `/drain`, `/drain/endpoint-removed` and
/// `/upgrade`. HTTP header names are case-insensitive; this is the spelling
/// written into pods and documentation.
pub const TOKEN_HEADER: &str = "X-Kubegrace-Drain-Token";

/// Admin paths.
pub mod path {
    /// 200 while the process is up (liveness, startup probe).
    pub const LIVE: &str = "/live";
    /// Alias of [`LIVE`] for tools that expect it.
    pub const HEALTHZ: &str = "/healthz";
    /// 200 while serving and the app is reachable; 503 while draining.
    pub const READY: &str = "/ready";
    /// Starts a drain (GET or POST); see [`DRAIN_WAIT`].
    pub const DRAIN: &str = "/drain";
    /// The query that makes `/drain` answer only once drained.
    pub const WAIT_QUERY: &str = "wait=true";
    /// `/drain?wait=true`: the preStop hook, which holds the container's
    /// SIGTERM until the sidecar is drained.
    pub const DRAIN_WAIT: &str = "/drain?wait=true";
    /// POST: the operator saw the pod leave the Service's endpoints, the
    /// evidence that ends the drain's grace phase early.
    pub const DRAIN_ENDPOINT_REMOVED: &str = "/drain/endpoint-removed";
    /// Prometheus text format.
    pub const METRICS: &str = "/metrics";
    /// The configuration in effect, as JSON (`?format=yaml` for YAML).
    pub const CONFIG: &str = "/config";
    /// Every route's breaker state, as JSON.
    pub const BREAKERS: &str = "/breakers";
    /// The app instances and what each has in flight, as JSON.
    pub const UPSTREAMS: &str = "/upstreams";
    /// POST: hand the sockets to a new process (outside Kubernetes).
    pub const UPGRADE: &str = "/upgrade";
}

#[cfg(test)]
mod tests {
    use super::path;

    #[test]
    fn the_pre_stop_path_is_drain_with_the_wait_query() {
        assert_eq!(
            path::DRAIN_WAIT,
            format!("{}?{}", path::DRAIN, path::WAIT_QUERY)
        );
        assert!(path::DRAIN_ENDPOINT_REMOVED.starts_with(path::DRAIN));
    }
}
