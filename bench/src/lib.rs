//! kubegrace benchmark harness: kubegrace-sidecar against nginx, HAProxy
//! and Caddy, side by side, on loopback (see bench/README.md).
//!
//! The binaries are thin: `bench-upstream` (the app), `bench-client`
//! (fixed-rate and drain loads) and `bench-harness` (runs everything and
//! writes the report). The parts worth testing without load live here.

pub mod cgroup;
pub mod grpc;
pub mod memtest;
pub mod null_webhook;
#[cfg(feature = "operator")]
pub mod operator_rig;
pub mod parse;
pub mod peers;
pub mod proc;
pub mod procfs;
pub mod report;
pub mod scale_checks;
#[cfg(feature = "operator")]
pub mod scale_probe;
#[cfg(feature = "operator")]
pub mod scale_watch;
pub mod scenario;
pub mod stats;
