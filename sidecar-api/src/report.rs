//! The drain report a sidecar leaves behind as its container's termination
//! message, so the outcome of a drain outlives the pod: the kubelet copies
//! the file into `status.containerStatuses[].state.terminated.message`,
//! where the operator reads it after the process (and soon the pod) is gone.
//!
//! JSON, camelCase, one small object: the kubelet keeps at most
//! [`MAX_BYTES`] of the file.

use serde::{Deserialize, Serialize};

/// Where the kubelet reads a container's termination message unless the
/// pod spec says otherwise.
pub const DEFAULT_PATH: &str = "/dev/termination-log";

/// The kubelet truncates a termination message to this many bytes.
pub const MAX_BYTES: usize = 4096;

/// The value of [`DrainOutcome::kind`], so a reader can tell a kubegrace
/// report from any other text a container may leave in the file.
pub const KIND: &str = "kubegrace.io/drain-report";

/// One finished drain, as the sidecar saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DrainOutcome {
    /// Always [`KIND`].
    pub kind: String,
    /// What started the drain: `SIGTERM`, `admin /drain`, `upgrade`, ...
    pub trigger: String,
    /// Trigger to `Drained`, in milliseconds.
    pub duration_ms: u64,
    /// Downstream connections open at the trigger or accepted during it.
    pub connections: u64,
    /// Requests in flight when the drain was triggered.
    pub inflight_at_trigger: u64,
    /// Requests that ended with their full response during the drain
    /// (those in flight at the trigger and those that arrived after it).
    pub requests_finished: u64,
    /// Connections still open at `drain.timeout` and closed by force.
    pub force_closed: u64,
    /// Requests in flight on those connections: cut, their clients saw an
    /// error.
    pub requests_cut: u64,
}

impl DrainOutcome {
    /// Clean: nothing was closed by force and no request was cut.
    pub fn is_clean(&self) -> bool {
        self.force_closed == 0 && self.requests_cut == 0
    }
}
