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
}

impl fmt::Display for DrainReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "drained {} connections in {:.1}s, {} force-closed (trigger {}, grace {:.1}s ended by {})",
            self.connections,
            self.duration.as_secs_f64(),
            self.force_closed,
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
}

impl GraceEnd {
    pub fn as_str(self) -> &'static str {
        match self {
            GraceEnd::Quiet => "quiet",
            GraceEnd::EndpointRemoved => "endpoint-removed",
            GraceEnd::MaxDelay => "max-delay",
        }
    }
}
