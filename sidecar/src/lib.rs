//! kubegrace-sidecar: an inbound proxy that drains a pod on evidence rather
//! than fixed sleeps, with per-route circuit breaking.
//!
//! The binary (`main.rs`) only parses arguments; everything lives here so the
//! in-process integration tests run the real proxy:
//!
//! ```no_run
//! # async fn demo() -> kubegrace_sidecar::Result<()> {
//! use kubegrace_sidecar::{Sidecar, StartOptions, cli::Settings, config::Config};
//! let sidecar = Sidecar::start(Config::default(), Settings::default(), StartOptions::default()).await?;
//! println!("proxy on {}", sidecar.listen_addr());
//! sidecar.shutdown(); // what SIGTERM does
//! let report = sidecar.wait().await;
//! println!("{report}");
//! # Ok(()) }
//! ```
//!
//! The map, from the outside in:
//!
//! - [`server`]: the running sidecar ([`Sidecar`]), its accept loops and
//!   signals; [`admin`]: the admin port; [`cli`]: flags and the config file
//!   at start; [`reload`]: config reloads;
//! - [`proxy`] (HTTP/1.1 and the hand-over to hyper), [`http2`], [`tcp`]:
//!   the data path; [`upstream`]: the pooled connections to the app;
//!   [`circuit`]: per-route breakers and limiters;
//! - [`drain`]: the drain state machine; [`stop`]: the one way to stop the
//!   process; [`app`] and [`app_readiness`]: the evidence about the app;
//! - [`state`]: what every part of one sidecar shares ([`state::Shared`]);
//! - [`inherit`], [`upgrade`], [`notify`], [`termination`]: sockets from
//!   systemd or an upgrade, the self-upgrade, sd_notify and the kubelet's
//!   termination message.

pub mod admin;
pub mod allocator;
pub mod app;
pub mod app_readiness;
pub mod circuit;
pub mod cli;
pub mod config_keys;
pub mod drain;
pub mod error;
pub(crate) mod h2wire; // the HTTP/2 codec of our own (h2wire/mod.rs)
pub mod http2;
pub mod inherit;
pub mod listen;
mod memory;
pub mod metrics;
pub mod notify;
mod passthrough;
pub mod proxy;
pub mod reload;
pub mod server;
mod spare;
pub mod state;
pub mod stop;
pub mod tcp;
pub mod termination;
#[cfg(test)]
mod testing;
mod tunnel;
pub mod upgrade;
pub mod upstream;
mod websocket;

pub use cli::{ConfigFile, Settings};
pub use error::{Error, Result};
/// The config types live in the contract crate the operator shares.
pub use kubegrace_sidecar_api::config;
pub use server::{Sidecar, Signals, StartOptions, run};
