//! What every part of a running sidecar shares: the config in force, the
//! drain machine and its stop, the upgrade state, metrics and the upstream
//! pools. Nothing of it is process-wide: two sidecars in one process (the
//! integration tests start many) share nothing.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use arc_swap::ArcSwap;

use crate::app::AppWatch;
use crate::circuit::RouteTable;
use crate::config::Config;
use crate::drain::Drain;
use crate::metrics::Metrics;
use crate::stop::Stop;
use crate::upgrade::Upgrades;
use crate::upstream::retry::RetryBudget;
use crate::upstream::slots::Upstreams;

/// The config in force plus what was built from it. Swapped as a whole on
/// reload; a request loads it once (lock-free) and keeps its snapshot.
pub struct Live {
    pub config: Config,
    pub routes: RouteTable,
}

/// Where the config came from and how reloads went, for `GET /config`.
#[derive(Debug, Clone, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ConfigStatus {
    /// The YAML file, if any (flags and environment win over it).
    pub file: Option<PathBuf>,
    /// Successful reloads since start.
    pub reloads: u64,
    pub failed_reloads: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_reload: Option<String>,
    /// Why the last reload was refused; cleared by the next good one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// The file does not exist (yet): running on defaults plus flags and
    /// environment until it appears.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub file_missing: bool,
    /// Keys changed in the file that only take effect after a restart.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub needs_restart: Vec<String>,
    /// Keys of the file in force this release does not know and skipped
    /// (at most [`crate::config_keys::MAX_NAMED`] named; the metric has
    /// the count).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unknown_keys: Vec<String>,
}

impl ConfigStatus {
    pub fn stamp() -> String {
        humantime::format_rfc3339_seconds(SystemTime::now()).to_string()
    }
}

pub struct Shared {
    pub live: ArcSwap<Live>,
    pub status: Mutex<ConfigStatus>,
    pub drain: Drain,
    /// The one way to stop the process (the drain that ends it).
    pub stop: Stop,
    /// The self-upgrade: the upgrader (binary only) and the hand-over.
    pub upgrade: Upgrades,
    pub metrics: Metrics,
    /// The app instance(s); `pick()` gives a request its upstream.
    pub upstreams: Upstreams,
    /// Bounds the retries of requests the app never saw.
    pub retry_budget: RetryBudget,
}

impl Shared {
    pub fn new(config: Config, file: Option<PathBuf>) -> crate::Result<Arc<Shared>> {
        let drain = Drain::new(config.drain);
        let app = AppWatch::new(
            config.upstream.clone(),
            &config.upstream_pool,
            drain.clone(),
        );
        let upstreams = Upstreams::new(
            &config.upstream_endpoints(),
            &config.upstream_pool,
            Some(app),
        )?;
        let routes = RouteTable::new(&config.routes);
        let shared = Arc::new(Shared {
            live: ArcSwap::from_pointee(Live { config, routes }),
            status: Mutex::new(ConfigStatus {
                file,
                ..ConfigStatus::default()
            }),
            stop: Stop::new(drain.clone()),
            drain,
            upgrade: Upgrades::default(),
            metrics: Metrics::default(),
            upstreams,
            retry_budget: RetryBudget::new(),
        });
        // Weak: the drain machine lives inside `Shared`; a strong handle
        // here would keep the whole sidecar alive through its own drain.
        let weak = Arc::downgrade(&shared);
        shared.drain.count_requests_with(move || {
            weak.upgrade()
                .map(|shared| shared.metrics.request_tally())
                .unwrap_or_default()
        });
        Ok(shared)
    }

    pub fn status(&self) -> ConfigStatus {
        self.status
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub fn update_status(&self, f: impl FnOnce(&mut ConfigStatus)) {
        f(&mut self.status.lock().unwrap_or_else(PoisonError::into_inner));
    }
}
