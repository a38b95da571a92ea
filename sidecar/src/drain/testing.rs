//! What the drain's unit tests share.

use tokio::sync::watch;
use tokio::time::Instant;

use super::{Drain, DrainState, Phase};
use crate::config::{DrainConfig, HumanDuration};

pub(crate) fn timers(min: u64, quiet: u64, max: u64, timeout: u64) -> DrainConfig {
    DrainConfig {
        min_delay: HumanDuration::from_millis(min),
        quiet: HumanDuration::from_millis(quiet),
        max_delay: HumanDuration::from_millis(max),
        timeout: HumanDuration::from_millis(timeout),
        ..DrainConfig::default()
    }
}

pub(super) async fn wait_phase(rx: &mut watch::Receiver<DrainState>, phase: Phase) -> Instant {
    // `>=`: with nothing open, Closing passes to Drained in one go.
    rx.wait_for(|s| s.phase >= phase)
        .await
        .expect("drain alive");
    Instant::now()
}

/// A drain with these timers and its driver running (on the test's runtime).
pub(crate) fn running(timers: DrainConfig) -> Drain {
    let drain = Drain::new(timers);
    tokio::spawn(drain.clone().run());
    drain
}

/// A drain with these timers, its driver running and its watch subscribed,
/// triggered now (returned as `t0`).
pub(super) fn started(timers: DrainConfig) -> (Drain, watch::Receiver<DrainState>, Instant) {
    let drain = running(timers);
    let rx = drain.subscribe();
    let t0 = Instant::now();
    assert!(drain.trigger("test"), "the first trigger starts the drain");
    (drain, rx, t0)
}
