//! What a finished drain says: the exit log line and `/metrics`.

use std::fmt;
use std::time::Duration;

/// The outcome of a finished drain, for the exit log line and `/metrics`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrainReport {
    /// What started it (`SIGTERM`, `admin /drain`, ...).
    pub trigger: String,
    /// Connections that were open at the trigger or arrived during the drain.
    pub connections: u64,
    /// Trigger to `Drained`.
    pub duration: Duration,
    /// Time spent in the grace phase (`Draining`).
    pub grace: Duration,
    /// Connections still open at the deadline and closed by force.
    pub force_closed: u64,
    /// Why the grace phase ended.
    pub grace_end: GraceEnd,
    /// Requests in flight at the trigger.
    pub inflight_at_trigger: u64,
    /// Requests that ended with their whole response during the drain.
    pub requests_finished: u64,
    /// Requests still in flight at the deadline: cut with their connection.
    pub requests_cut: u64,
}

/// The proxy's request counters at one moment, as the drain report reads
/// them: in flight now, and finished (whole response sent) so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RequestTally {
    pub inflight: u64,
    pub finished: u64,
}

impl fmt::Display for DrainReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "drained {} connections in {:.1}s, {} force-closed, {} requests cut (trigger {}, grace {:.1}s ended by {})",
            self.connections,
            self.duration.as_secs_f64(),
            self.force_closed,
            self.requests_cut,
            self.trigger,
            self.grace.as_secs_f64(),
            self.grace_end.as_str(),
        )
    }
}

/// Why `Draining` ended: the evidence that traffic moved, or the ceiling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GraceEnd {
    /// No new connection for `quiet` (after `minDelay`).
    Quiet,
    /// The operator reported the endpoint removed (after `minDelay`).
    EndpointRemoved,
    /// `maxDelay` passed without evidence.
    MaxDelay,
    /// The exit drain began while the app was down and no drain was under
    /// way (see [`super::Drain::app_reachable`]): nothing is left to serve.
    AppDown,
}

impl DrainReport {
    /// The report as the container's termination message (the contract the
    /// operator reads, [`kubegrace_sidecar_api::report`]).
    pub fn outcome(&self) -> kubegrace_sidecar_api::report::DrainOutcome {
        kubegrace_sidecar_api::report::DrainOutcome {
            kind: kubegrace_sidecar_api::report::KIND.to_string(),
            trigger: self.trigger.chars().take(64).collect(),
            duration_ms: u64::try_from(self.duration.as_millis()).unwrap_or(u64::MAX),
            connections: self.connections,
            inflight_at_trigger: self.inflight_at_trigger,
            requests_finished: self.requests_finished,
            force_closed: self.force_closed,
            requests_cut: self.requests_cut,
        }
    }
}

impl GraceEnd {
    pub fn as_str(self) -> &'static str {
        match self {
            GraceEnd::Quiet => "quiet",
            GraceEnd::EndpointRemoved => "endpoint-removed",
            GraceEnd::MaxDelay => "max-delay",
            GraceEnd::AppDown => "app-down",
        }
    }
}
