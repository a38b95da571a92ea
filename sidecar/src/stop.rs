//! Stopping the sidecar: the one way to say "stop" and to ask "stopping?".
//!
//! A stop is the drain that ends the process (an *exit* drain, see
//! [`crate::drain`]): SIGTERM, SIGINT, [`crate::Sidecar::shutdown`] and an
//! upgrade hand-over all go through [`Stop::request`]. There is no second
//! flag beside the drain machine's own, so "stop was asked" and "this drain
//! ends the process" can never disagree (a drain carried on after a restart
//! that was an exit drain is a stop too, with nobody asking again).
//!
//! Reloading the config (SIGHUP) is not a stop: see [`crate::reload`].

use crate::drain::{Drain, ExitTrigger, Phase};

/// The drain reason of an upgrade hand-over: the service carries on in the
/// new process, so this stop is not announced to systemd and leaves the
/// termination message to the new process.
pub const UPGRADE_REASON: &str = "upgrade";

/// Handle on a sidecar's stop; cheap to clone (it is a drain handle).
#[derive(Clone, Debug)]
pub struct Stop {
    drain: Drain,
}

impl Stop {
    pub fn new(drain: Drain) -> Stop {
        Stop { drain }
    }

    /// Starts the drain that ends the process, or turns the drain under way
    /// into it. Asking again changes nothing: SIGKILL is the hard stop, and
    /// a repeated SIGTERM must not cut requests.
    pub fn request(&self, reason: &str) {
        let outcome = self.drain.trigger_exit(reason);
        // After an upgrade the service carries on in the new process (which
        // the upgrader announced with MAINPID=): not a stop for systemd.
        if outcome != ExitTrigger::Repeated && reason != UPGRADE_REASON {
            crate::notify::notify("STOPPING=1");
        }
        match outcome {
            ExitTrigger::Started => tracing::info!("{reason}: draining"),
            ExitTrigger::Joined if self.drain.phase() == Phase::Drained => {
                tracing::info!("{reason}: already drained, exiting");
            }
            ExitTrigger::Joined => {
                tracing::info!(phase = %self.drain.phase(), "{reason}: the drain under way now ends the process");
            }
            ExitTrigger::Repeated => {
                tracing::warn!(phase = %self.drain.phase(), "{reason} again: already draining, carrying on (SIGKILL is the hard stop)");
            }
        }
    }

    /// Whether a stop was asked for (or carried on after a restart).
    pub fn is_requested(&self) -> bool {
        self.drain.is_exit()
    }

    /// Resolves once a stop was asked for.
    pub async fn requested(&self) {
        // The sender lives in the drain machine this handle keeps alive,
        // so the wait ends only with a stop.
        let _ = self.drain.subscribe().wait_for(|state| state.exit).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drain::testing::{running, timers};

    #[tokio::test(start_paused = true)]
    async fn a_stop_is_the_exit_drain_and_asking_twice_changes_nothing() {
        let drain = running(timers(100, 50, 1000, 1000));
        let stop = Stop::new(drain.clone());
        assert!(!stop.is_requested());
        let waiter = tokio::spawn({
            let stop = stop.clone();
            async move { stop.requested().await }
        });
        stop.request("SIGTERM");
        waiter.await.expect("the waiter sees the stop");
        assert!(stop.is_requested());
        assert!(drain.is_exit());
        stop.request("SIGTERM");
        let report = drain.drained().await;
        assert_eq!(report.trigger, "SIGTERM");
    }

    #[tokio::test(start_paused = true)]
    async fn a_stop_during_a_provisional_drain_ends_the_process() {
        let drain = running(timers(100, 50, 1000, 1000));
        let stop = Stop::new(drain.clone());
        drain.trigger("admin /drain");
        drain.drained().await;
        assert!(!stop.is_requested(), "a /drain alone is no stop");
        stop.request("SIGTERM");
        assert!(stop.is_requested());
        stop.requested().await;
    }
}
