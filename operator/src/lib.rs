//! kubegrace-operator: the GraceRoute controller and the sidecar-injection
//! webhook, as a library; `main.rs` only parses the command line.
//!
//! Pipeline of the route controller (see [`controller`], one file per
//! step): dereference -> validate (pure) -> build (pure) -> apply
//! (server-side apply, field manager `kubegrace-operator`) -> status (pure,
//! then one write). The route's rules both pure steps call are in
//! [`rules`].
//! The webhook's pod mutation is pure too ([`inject`]), so both are unit
//! tested from inline YAML without an API server.

pub mod admin;
pub mod api_requests;
pub mod certs;
pub mod cli;
pub mod controller;
pub use kubegrace_api::crd;
pub mod error;
pub mod heal;
pub use kubegrace_api::image_ref;
pub mod inject;
pub mod lease;
pub use kubegrace_api::netpol;
pub mod ownership;
pub mod panics;
pub mod reasons;
pub mod route_match;
pub mod route_webhook;
pub mod rules;
pub mod run;
pub mod scope;
pub mod server;
pub mod slim;
#[cfg(test)]
pub(crate) mod testing;
pub mod tolerant;
pub mod webhook;
pub mod webhook_cache;
pub mod webhook_check;
pub mod workload;

pub use error::{Error, Result};

/// Field manager for everything the route controller applies.
pub const FIELD_MANAGER: &str = "kubegrace-operator";
/// Field manager for the inject setting copied into pod templates. Kept
/// apart from [`FIELD_MANAGER`] because the two are applied by different
/// controllers, and an apply drops every field its manager no longer sends.
pub const INJECT_FIELD_MANAGER: &str = "kubegrace-operator-inject";
/// Field manager for restoring the original values on route deletion.
pub const RESTORE_FIELD_MANAGER: &str = "kubegrace-operator-restore";
pub const FINALIZER: &str = "kubegrace.io/cleanup";

/// Annotation and label keys (documented in operator/README.md, "What the
/// webhook adds", and docs/injection.md), shared with the tests through the
/// contract crate.
pub use kubegrace_sidecar_api::keys;
