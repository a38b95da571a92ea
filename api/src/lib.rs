//! kubegrace-api: the GraceRoute API and the pure rules around it that the
//! operator and the kubectl plugin share, so the plugin never compiles the
//! operator's controller and the two cannot drift.
//!
//! What lives here reads objects already fetched and talks to no API
//! server: the `GraceRoute` types with their bounds and CEL rules
//! ([`crd`]), decoding routes stored by another release ([`tolerant`]),
//! the workloads a route fronts ([`workloads`], Argo Rollouts' [`argo`]), Services and
//! NetworkPolicies that get around the sidecar ([`bypass`], [`netpol`]),
//! what a pod says about the sidecar ([`inject`]), the pause-on-drain-loss
//! names ([`pause`]), the leader Lease ([`lease`]), the grammar of
//! quantities and log filters ([`values`]), and, with the `cli` feature,
//! the operator's `run` flags ([`cli`]). Names both binaries of the data
//! path agree on (annotation keys, ports) are `kubegrace-sidecar-api`'s,
//! re-exported as [`keys`].

pub mod argo;
pub mod bypass;
#[cfg(feature = "cli")]
pub mod cli;
pub mod crd;
#[cfg(any(test, feature = "testing"))]
pub mod fixtures;
pub mod image_ref;
pub mod inject;
pub mod lease;
pub mod netpol;
pub mod pause;
pub mod tolerant;
pub mod values;
pub mod workloads;

/// Annotation and label keys (docs/injection.md), from the contract crate.
pub use kubegrace_sidecar_api::keys;
