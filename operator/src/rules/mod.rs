//! The GraceRoute's rules, pure: spec (+ the target's pod template) ->
//! sidecar config, time budget and the target's rollout fields. The
//! controller's validate and build steps call them, and so does the route
//! admission webhook, so `kubectl apply` and the route's conditions agree.
//! Nothing here talks to the API server, so every rule is tested from inline
//! YAML.
//!
//! One file per output: [`budget`] (the time a drain needs and the grace
//! period it becomes), [`sidecar_config`] (the sidecar's `config.yaml`
//! in the route's ConfigMap), [`rollout`] (the target workload's rollout
//! fields and their restore) and [`bypass`] (the Services that reach the
//! app around the sidecar). [`check_bounds`] comes first: it re-checks the
//! CRD's bounds, which everything after it relies on.

pub mod balancer;
mod bounds;
mod budget;
#[cfg(test)]
mod fuzz;
mod rollout;
mod sidecar_config;
#[cfg(test)]
mod testing;

pub use bounds::check_bounds;
pub use budget::{Budget, MARGIN, budget};
pub use kubegrace_api::bypass::{Bypass, app_port, bypassing_services};
pub use rollout::{Originals, Target, restore_patch, target_apply};
pub use sidecar_config::{
    PortPlan, check_rendered_size, check_template, config_map_name, render, sidecar_config,
};

/// Why a route cannot be applied: a condition reason and a message a person
/// can act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    pub reason: &'static str,
    pub message: String,
}

impl Invalid {
    pub fn new(reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
        }
    }
}
