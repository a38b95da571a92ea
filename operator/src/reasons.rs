//! Every condition type and reason the operator writes on a GraceRoute, and
//! every Event reason it publishes, in one place. They are API: `kubectl
//! wait --for=condition=...`, alerts and the e2e tests match on them, so a
//! change here is a breaking change for users (docs/status.md lists them).

// Condition types.
pub const ACCEPTED: &str = "Accepted";
pub const READY: &str = "Ready";
pub const DEGRADED: &str = "Degraded";
/// Only with `rollout.pauseOnDrainLoss`; its reasons below. The plugin reads
/// them too, so they are the API crate's.
pub use kubegrace_api::pause::ROLLOUT_PAUSED;

// Accepted.
/// `Accepted=True`: the spec holds against its targets.
pub const VALID: &str = "Valid";
/// A value outside what the CRD allows (an object stored under an older,
/// looser CRD), or a sidecar config the sidecar would refuse.
pub const INVALID_SPEC: &str = "InvalidSpec";
/// `ports` names a port a target's pod template does not declare.
pub const UNKNOWN_PORT: &str = "UnknownPort";
/// A target's pod template cannot be fronted (no containers, say).
pub const TARGET_INVALID: &str = "TargetInvalid";
/// `rollout.terminationGracePeriodSeconds` pinned below the budget.
pub const BUDGET_DOES_NOT_FIT: &str = "BudgetDoesNotFit";
/// The route's ConfigMap name is taken by an object that is not ours.
pub const CONFIG_MAP_NOT_OWNED: &str = "ConfigMapNotOwned";

// Ready.
/// `Ready=True`: every running pod of the targets carries the sidecar.
pub const FRONTED: &str = "Fronted";
pub const TARGET_NOT_FOUND: &str = "TargetNotFound";
pub const NO_TARGETS: &str = "NoTargets";
/// Pods created before injection was enabled still run.
pub const ROLLING_OUT: &str = "RollingOut";
pub const INJECTION_NOT_ENABLED: &str = "InjectionNotEnabled";

// Ready and Degraded.
/// Pods asked for the sidecar and did not get it (also an Event).
pub const PODS_NOT_INJECTED: &str = "PodsNotInjected";
/// An older route holds a target (also an Event).
pub const OVERLAP: &str = "Overlap";

// Degraded.
/// `Degraded=False` on an applied route.
pub const AS_EXPECTED: &str = "AsExpected";
/// `Degraded=False` on a route that was not applied.
pub const NOT_APPLIED: &str = "NotApplied";
/// A Service selecting the route's pods reaches the app around the sidecar
/// (its targetPort is the app's number).
pub const SERVICE_BYPASSES_SIDECAR: &str = "ServiceBypassesSidecar";
/// A NetworkPolicy admits the route's pods on the app's port number, which
/// port takeover left to the app: what the Service sends to the sidecar's
/// port is dropped.
pub const NETWORK_POLICY_BLOCKS_SIDECAR: &str = "NetworkPolicyBlocksSidecar";
/// A reconcile of this route panicked (a bug); retried.
pub const RECONCILE_PANICKED: &str = "ReconcilePanicked";

// RolloutPaused: `DrainLoss` (True: the operator paused a Deployment for a
// lossy drain), `Resumed` (False: resumed after such a pause), `CannotPause`
// (False: a StatefulSet's drain lost requests; it has no `spec.paused`).
pub use kubegrace_api::pause::{CANNOT_PAUSE, DRAIN_LOSS, RESUMED};

// Events only.
/// The budget the webhook gives new pods changed.
pub const BUDGET_APPLIED: &str = "BudgetApplied";
/// The sidecar config in the route's ConfigMap changed.
pub const CONFIG_APPLIED: &str = "ConfigApplied";
/// A pod's drain reached drain.timeout and closed connections.
pub const DRAIN_FORCE_CLOSED: &str = "DrainForceClosed";
/// A deleted route put its targets' rollout fields back.
pub const RESTORED: &str = "Restored";
/// A route that cannot be decoded was deleted; its finalizer was released
/// without restoring its targets.
pub const FINALIZER_RELEASED: &str = "FinalizerReleased";
