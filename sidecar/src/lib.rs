//! kubegrace-sidecar: an inbound proxy that drains a pod on evidence rather
//! than fixed sleeps, with per-route circuit breaking.
//!
//! The binary (`main.rs`) only parses arguments; everything lives here so the
//! in-process integration tests run the real proxy.

pub mod circuit;
pub mod config;
pub mod error;

pub use error::{Error, Result};
