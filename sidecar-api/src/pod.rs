//! Names the operator's webhook writes into an injected pod, and that the
//! operator, the tests and people with `kubectl` look for there.

/// The sidecar container (a native sidecar init container, or a regular
/// container on clusters without native sidecars).
pub const CONTAINER: &str = "kubegrace-sidecar";
/// The volume that mounts the route's ConfigMap into the sidecar.
pub const CONFIG_VOLUME: &str = "kubegrace-config";
/// The sidecar's state volume (an `emptyDir` in memory): it outlives a
/// restart of the sidecar container, which the drain journal needs.
pub const STATE_VOLUME: &str = "kubegrace-state";
/// Where the state volume is mounted in the sidecar.
pub const STATE_DIR: &str = "/var/run/kubegrace";
/// Where that volume is mounted.
pub const CONFIG_DIR: &str = "/etc/kubegrace";
/// The ConfigMap key, and so the file name under [`CONFIG_DIR`], of the
/// sidecar's YAML configuration.
pub const CONFIG_FILE: &str = "config.yaml";
/// The sidecar's listener port the webhook tries first (the next free one
/// above it otherwise); outside the ranges meshes use, like
/// [`crate::admin::DEFAULT_PORT`].
pub const FIRST_LISTEN_PORT: u16 = 15181;
/// Pod environment variables the sidecar gets from the downward API, so its
/// logs name the pod.
pub const POD_NAME_ENV: &str = "POD_NAME";
pub const POD_NAMESPACE_ENV: &str = "POD_NAMESPACE";

/// The path the sidecar is started with: `--config /etc/kubegrace/config.yaml`.
pub fn config_path() -> String {
    format!("{CONFIG_DIR}/{CONFIG_FILE}")
}
