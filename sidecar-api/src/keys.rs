//! Annotation and label keys (documented in operator/README.md, "How a
//! workload gets the sidecar" and "What the webhook adds", and in
//! docs/injection.md): written by the operator and its webhook, set by
//! users and the Helm chart, read by the tests.

/// `enabled` or `disabled`, on a pod, a workload or a namespace: whether
/// the webhook injects the sidecar.
pub const INJECT: &str = "kubegrace.io/inject";
/// Set by the webhook on a pod it injected.
pub const INJECTED: &str = "kubegrace.io/injected";
/// The GraceRoute a pod or workload belongs to (annotation).
pub const ROUTE: &str = "kubegrace.io/route";
/// Why the webhook left a pod that asked for the sidecar alone.
pub const INJECT_SKIPPED: &str = "kubegrace.io/inject-skipped";
/// The values of the target's rollout fields before a route changed them.
pub const ORIGINAL: &str = "kubegrace.io/original-rollout";
/// The hash of the sidecar config a pod template was rendered with: a
/// config change rolls the pods.
pub const CONFIG_HASH: &str = "kubegrace.io/config-hash";
/// `native` (init container with restartPolicy Always) or `container`: how
/// the sidecar was injected.
pub const SIDECAR_MODE: &str = "kubegrace.io/sidecar-mode";
/// Pod annotation: the sidecar's admin port for this pod (else the first
/// free one from the chart's `sidecar.adminPort` up).
pub const ADMIN_PORT: &str = "kubegrace.io/admin-port";
/// Pod annotation: where the app's readiness probe runs. The webhook sets
/// `sidecar` when it moved an `httpGet` probe into the sidecar's `/ready`
/// (one probe per pod); a user sets `app` to keep it on the app container.
pub const APP_READINESS: &str = "kubegrace.io/app-readiness";
/// `kubegrace.io/app-readiness` value: the app's probe runs in the sidecar.
pub const APP_READINESS_IN_SIDECAR: &str = "sidecar";
/// `kubegrace.io/app-readiness` value a user sets to keep the app's probe
/// on the app container.
pub const APP_READINESS_ON_APP: &str = "app";
/// The route that owns an object the operator created (label).
pub const ROUTE_LABEL: &str = "kubegrace.io/route";
/// The well-known label naming who manages an object.
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// Pod annotation set by the webhook: the version of the sidecar image it
/// injected (the image tag, or its digest when pinned by digest only), so
/// pods running a stale sidecar can be listed after an upgrade.
pub const SIDECAR_VERSION: &str = "kubegrace.io/sidecar-version";
/// Pod label of the chart's install check (`kubegrace-operator
/// webhook-check`): only the webhook entry `check.inject.kubegrace.io`
/// selects it, in the release namespace every other entry excludes.
pub const WEBHOOK_CHECK: &str = "kubegrace.io/webhook-check";
/// GraceRoute annotation: `disabled` stops the operator from evicting the
/// route's pods that were admitted without the sidecar (healing is on
/// otherwise, unless the operator's `--heal=false`).
pub const HEAL: &str = "kubegrace.io/heal";
/// Pod annotation: the sidecar's CPU request for this pod (a quantity,
/// `100m`), instead of the chart's `sidecar.resources`.
pub const SIDECAR_CPU_REQUEST: &str = "kubegrace.io/sidecar-cpu-request";
/// Pod annotation: the sidecar's CPU limit for this pod.
pub const SIDECAR_CPU_LIMIT: &str = "kubegrace.io/sidecar-cpu-limit";
/// Pod annotation: the sidecar's memory request for this pod (`64Mi`).
pub const SIDECAR_MEMORY_REQUEST: &str = "kubegrace.io/sidecar-memory-request";
/// Pod annotation: the sidecar's memory limit for this pod.
pub const SIDECAR_MEMORY_LIMIT: &str = "kubegrace.io/sidecar-memory-limit";
/// Pod annotation: the sidecar's log filter for this pod (`debug`, or
/// `info,kubegrace_sidecar::drain=debug`), instead of the chart's
/// `sidecar.logLevel`.
pub const SIDECAR_LOG_LEVEL: &str = "kubegrace.io/sidecar-log-level";
