//! Step 5, status: what the route's status says and which Events announce
//! it, computed from what the earlier steps found (pure), then written in
//! one place ([`update`]).
//!
//! - [`rejected`] / [`accepted`] ([`conditions`]): the `Accepted`, `Ready`
//!   and `Degraded` conditions and their Events, from a refusal or from
//!   what validate and build made of the observation; [`pods`] counts the
//!   pods they rest on.
//! - [`plan()`] ([`plan`]): the drain reports the pod watch collected
//!   folded into `status.lastDrains` ([`super::drains`]), the
//!   `rollout.pauseOnDrainLoss` decision ([`super::pause`]), the transition
//!   times carried over, and whether anything changed.
//! - [`update`] ([`write`]): the edge. Pauses a Deployment if the plan
//!   says so, writes the status (only when it changed), publishes the
//!   Events, and counts the drains.

pub mod conditions;
pub mod plan;
pub mod pods;
pub mod write;

pub use conditions::{accepted, rejected};
pub use plan::{Plan, plan};
pub use pods::{Outdated, PodCount, count_pods, outdated_pods};
pub use write::update;

use super::context::Note;
use crate::crd::GraceRouteStatus;
use crate::reasons::READY;

/// The status to write and the Events to publish.
#[derive(Debug, Clone)]
pub struct Report {
    pub status: GraceRouteStatus,
    pub events: Vec<Note>,
}

impl Report {
    /// Whether the route is Ready (the resync period depends on it).
    pub fn ready(&self) -> bool {
        self.status
            .conditions
            .iter()
            .any(|c| c.type_ == READY && c.status == "True")
    }
}

/// What failed in the status step's write.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Pausing a Deployment or Rollout whose drains lost requests (`name`
    /// is `Kind/name`).
    #[error("pausing {name} in namespace {namespace}: {source}")]
    Pause {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    /// The status patch.
    #[error("writing status of GraceRoute {namespace}/{name}: {source}")]
    Write {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
}

impl Error {
    /// The metric label: both are API calls.
    pub fn kind(&self) -> &'static str {
        "kube"
    }
}

#[cfg(test)]
mod netpol_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod write_tests;
