//! kubegrace-sidecar-api: what the operator and the sidecar must agree on.

pub mod config;
