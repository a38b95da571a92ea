//! The driver: each drain from its trigger to `Drained`, one task for the
//! life of the process.

use std::sync::PoisonError;
use std::time::Duration;

use tokio::time::Instant;

use super::{Drain, DrainReport, Phase, deadline};
use crate::config::DrainReadiness;

impl Drain {
    /// Drives the machine for the life of the process: each drain from its
    /// trigger to `Drained`, or back to `Serving` when it is resumed. Run it
    /// once, as its own task; [`Drain::drained`] gives each drain's report.
    pub async fn run(self) {
        let mut rx = self.subscribe();
        loop {
            // The sender lives in `self`, so `wait_for` only ends on a trigger.
            if rx.wait_for(|s| s.phase != Phase::Serving).await.is_err() {
                return;
            }
            let id = self.lock().id;
            tokio::select! {
                _ = self.drive(id) => {
                    // Drained: stay until resumed (a provisional drain whose
                    // app restarted) or the process exits.
                    self.cycle_over(id).await;
                }
                _ = self.cycle_over(id) => {}
            }
        }
    }

    /// Resolves once cycle `id` was resumed. Watches the cycle, not the
    /// phase: a resume followed at once by a new trigger never shows
    /// `Serving` to a watcher that wakes late.
    async fn cycle_over(&self, id: u64) {
        let mut rx = self.subscribe();
        loop {
            if self.lock().id != id {
                return;
            }
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// One drain, from the trigger to `Drained`.
    async fn drive(&self, id: u64) {
        let (trigger, t0) = self
            .lock()
            .trigger
            .clone()
            .unwrap_or_else(|| ("unknown".to_string(), Instant::now()));
        let open_at_trigger = self.open_connections() as u64;
        let accepted_at_trigger = self.connections_total();
        let force_closed_before = self.force_closed_total();
        let requests_at_trigger = self.request_tally();
        let readiness = self.timers().readiness;
        let ready_note = match readiness {
            DrainReadiness::FailFast => "readiness now fails",
            DrainReadiness::StayServing => "readiness stays up while the app does",
        };
        tracing::info!(
            trigger = %trigger,
            open = open_at_trigger,
            readiness = readiness.as_str(),
            "drain started: {ready_note}, still serving"
        );

        let grace_end = self.grace(t0).await;
        let grace = t0.elapsed();
        let timeout = self.closing_timeout(self.timers().timeout.get());
        if !self.set_state(id, Phase::Closing, false) {
            return;
        }
        tracing::info!(
            ended_by = grace_end.as_str(),
            grace_secs = grace.as_secs_f64(),
            open = self.open_connections(),
            "drain: closing listeners, waiting for in-flight work"
        );

        let closing_deadline = deadline(Instant::now(), timeout);
        let finished = tokio::select! {
            _ = self.wait_all_closed() => true,
            _ = tokio::time::sleep_until(closing_deadline) => false,
        };
        // What is still in flight at the deadline is cut by the force-close.
        let requests_cut = if finished {
            0
        } else {
            self.request_tally().inflight
        };
        if !finished {
            tracing::warn!(
                open = self.open_connections(),
                timeout = ?timeout,
                "drain timeout passed: force-closing what is left"
            );
            if !self.set_state(id, Phase::Closing, true) {
                return;
            }
            // Connection tasks close at once when told; the bound only guards
            // against a task that is stuck in a non-cancellable call.
            if tokio::time::timeout(Duration::from_secs(2), self.wait_all_closed())
                .await
                .is_err()
            {
                tracing::warn!(
                    open = self.open_connections(),
                    "connections still open after force-close"
                );
            }
        }

        let report = DrainReport {
            trigger,
            connections: open_at_trigger
                .saturating_add(self.connections_total().saturating_sub(accepted_at_trigger)),
            duration: t0.elapsed(),
            grace,
            force_closed: self
                .force_closed_total()
                .saturating_sub(force_closed_before),
            grace_end,
            inflight_at_trigger: requests_at_trigger.inflight,
            // A cut request may be counted as finished when its connection
            // task ends; it is not one.
            requests_finished: self
                .request_tally()
                .finished
                .saturating_sub(requests_at_trigger.finished)
                .saturating_sub(requests_cut),
            requests_cut,
        };
        {
            let cycle = self.lock();
            if cycle.id != id {
                return;
            }
            *self
                .machine
                .report
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = Some(report.clone());
        }
        if self.set_state(id, Phase::Drained, !finished) && !self.is_exit() {
            tracing::info!(
                "drained ({report}); staying drained until SIGTERM, unless the app turns out to be restarting"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::Instant;

    use super::super::testing::{timers, wait_phase};
    use super::super::{Drain, Phase};

    #[tokio::test(start_paused = true)]
    async fn closing_waits_for_connections_then_force_closes_at_timeout() {
        let drain = Drain::new(timers(0, 0, 0, 5000));
        let quick = drain.connection();
        let mut stuck = drain.connection();
        tokio::spawn(drain.clone().run());
        let mut rx = drain.subscribe();
        let t0 = Instant::now();
        drain.trigger("test");
        wait_phase(&mut rx, Phase::Closing).await;
        // A connection that finishes its last request closes gracefully.
        tokio::time::sleep(Duration::from_secs(1)).await;
        drop(quick);
        // The other one (a WebSocket, say) is told to go at the deadline.
        rx.wait_for(|s| s.force_close).await.expect("drain alive");
        assert_eq!(Instant::now() - t0, Duration::from_secs(5));
        stuck.mark_forced();
        drop(stuck);
        let report = drain.drained().await;
        assert_eq!(report.force_closed, 1);
        assert_eq!(report.connections, 2);
        assert_eq!(drain.phase(), Phase::Drained);
        assert_eq!(drain.drained().await, report);
    }

    #[tokio::test(start_paused = true)]
    async fn closing_ends_early_when_the_last_connection_goes() {
        let drain = Drain::new(timers(0, 0, 0, 30000));
        let conn = drain.connection();
        tokio::spawn(drain.clone().run());
        let t0 = Instant::now();
        drain.trigger("test");
        tokio::time::sleep(Duration::from_millis(800)).await;
        drop(conn);
        let report = drain.drained().await;
        assert_eq!(report.force_closed, 0);
        assert_eq!(Instant::now() - t0, Duration::from_millis(800));
    }
}
