//! kubegrace-sidecar-api: what the operator and the sidecar must agree on,
//! apart from both (the way linkerd2-proxy-api sits between its proxy and
//! its control plane).
//!
//! - [`config`]: the sidecar's configuration, which the operator renders
//!   into a ConfigMap and the sidecar reads.
//! - [`admin`]: the admin port, its paths and the drain-token header.
//! - [`cli`]: the sidecar's flags and `KUBEGRACE_*` environment names.
//! - [`pod`]: container, volume and file names in an injected pod.
//! - [`keys`]: annotation and label keys.
//! - [`exposition`]: the Prometheus text format both `/metrics` write.
//! - [`report`]: the drain report a sidecar leaves as its termination
//!   message, and the operator collects.
//! - [`build`]: the version and git revision a binary was built from.
//!
//! The tests of both binaries and the cluster tests use these names too, so
//! a rename is one change here that the compiler carries everywhere. The
//! crate depends on serde, thiserror and humantime (no dependencies of its
//! own; the durations) only: YAML parsing stays with the
//! sidecar, rendering with the operator.

pub mod admin;
pub mod build;
pub mod cli;
pub mod config;
pub mod exposition;
pub mod keys;
pub mod pod;
pub mod report;
