//! The drain state machine: `Serving -> Draining -> Closing -> Drained`.
//!
//! One [`watch`] channel carries the [`DrainState`]; every listener and
//! connection task selects on it. A lock-free mirror of the phase lets the
//! request path ask "are we draining?" with one atomic load.
//!
//! The driver ([`Drain::run`]) owns every transition after the trigger, so
//! the rules live in one place and can be tested with `tokio::time::pause`:
//!
//! - `Draining`: keep serving (routers lag). Leave once `minDelay` passed AND
//!   (no new connection for `quiet`, or the endpoint was reported removed),
//!   or once `maxDelay` passed.
//! - `Closing`: listeners close, connections shut down gracefully; after
//!   `timeout` whatever is still open is told to force-close.
//! - `Drained`: nothing is left; the report is available.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use crate::config::DrainConfig;

/// Where a drain stands. Ordered: later phases compare greater.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum Phase {
    Serving = 0,
    Draining = 1,
    Closing = 2,
    Drained = 3,
}

impl Phase {
    fn from_u8(v: u8) -> Phase {
        match v {
            0 => Phase::Serving,
            1 => Phase::Draining,
            2 => Phase::Closing,
            _ => Phase::Drained,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Serving => "serving",
            Phase::Draining => "draining",
            Phase::Closing => "closing",
            Phase::Drained => "drained",
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the watch channel carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DrainState {
    pub phase: Phase,
    /// Set once `drain.timeout` passed in `Closing`: whatever is still open
    /// must close now and count itself as force-closed.
    pub force_close: bool,
}

/// The outcome of a finished drain, for the exit log line and `/metrics`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrainReport {
    /// What started it (`SIGTERM`, `admin /drain`, ...).
    pub trigger: String,
    /// Connections that were open at the trigger or arrived during the drain.
    pub connections: u64,
    /// Trigger to `Drained`.
    pub duration: Duration,
    /// Time spent in the grace phase (`Draining`).
    pub grace: Duration,
    /// Connections still open at the deadline and closed by force.
    pub force_closed: u64,
    /// Why the grace phase ended.
    pub grace_end: GraceEnd,
}

impl fmt::Display for DrainReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "drained {} connections in {:.1}s, {} force-closed (trigger {}, grace {:.1}s ended by {})",
            self.connections,
            self.duration.as_secs_f64(),
            self.force_closed,
            self.trigger,
            self.grace.as_secs_f64(),
            self.grace_end.as_str(),
        )
    }
}

/// Why `Draining` ended: the evidence that traffic moved, or the ceiling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GraceEnd {
    /// No new connection for `quiet` (after `minDelay`).
    Quiet,
    /// The operator reported the endpoint removed (after `minDelay`).
    EndpointRemoved,
    /// `maxDelay` passed without evidence.
    MaxDelay,
}

impl GraceEnd {
    pub fn as_str(self) -> &'static str {
        match self {
            GraceEnd::Quiet => "quiet",
            GraceEnd::EndpointRemoved => "endpoint-removed",
            GraceEnd::MaxDelay => "max-delay",
        }
    }
}

struct Shared {
    tx: watch::Sender<DrainState>,
    /// Mirror of `tx`'s phase for the per-request path (no lock).
    phase: AtomicU8,
    timers_tx: watch::Sender<DrainConfig>,
    trigger: Mutex<Option<(String, Instant)>>,
    endpoint_removed: AtomicBool,
    endpoint_removed_notify: Notify,
    /// Reference point for `last_conn_ms`.
    epoch: Instant,
    last_conn_ms: AtomicU64,
    open: AtomicUsize,
    /// Woken whenever `open` drops to zero.
    idle_notify: Notify,
    accepted: AtomicU64,
    force_closed: AtomicU64,
    report: Mutex<Option<DrainReport>>,
}

/// Handle on the drain state machine; cheap to clone.
#[derive(Clone)]
pub struct Drain {
    shared: Arc<Shared>,
}

impl fmt::Debug for Drain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Drain")
            .field("phase", &self.phase())
            .field("open", &self.open_connections())
            .finish()
    }
}

impl Drain {
    pub fn new(timers: DrainConfig) -> Drain {
        let (tx, _) = watch::channel(DrainState {
            phase: Phase::Serving,
            force_close: false,
        });
        let (timers_tx, _) = watch::channel(timers);
        Drain {
            shared: Arc::new(Shared {
                tx,
                phase: AtomicU8::new(Phase::Serving as u8),
                timers_tx,
                trigger: Mutex::new(None),
                endpoint_removed: AtomicBool::new(false),
                endpoint_removed_notify: Notify::new(),
                epoch: Instant::now(),
                last_conn_ms: AtomicU64::new(0),
                open: AtomicUsize::new(0),
                idle_notify: Notify::new(),
                accepted: AtomicU64::new(0),
                force_closed: AtomicU64::new(0),
                report: Mutex::new(None),
            }),
        }
    }

    pub fn subscribe(&self) -> watch::Receiver<DrainState> {
        self.shared.tx.subscribe()
    }

    /// The current phase, one relaxed atomic load (request path).
    #[inline]
    pub fn phase(&self) -> Phase {
        Phase::from_u8(self.shared.phase.load(Ordering::Relaxed))
    }

    /// Starts the drain. Returns false when one was already under way, so
    /// a second SIGTERM or `/drain` changes nothing.
    pub fn trigger(&self, reason: &str) -> bool {
        // The reason is stored under its lock before the watch fires, and
        // the driver reads it under the same lock after waking, so the
        // report always names what started the drain.
        let mut trigger = self
            .shared
            .trigger
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let started = self.shared.tx.send_if_modified(|state| {
            if state.phase == Phase::Serving {
                state.phase = Phase::Draining;
                self.shared
                    .phase
                    .store(Phase::Draining as u8, Ordering::Release);
                true
            } else {
                false
            }
        });
        if started {
            *trigger = Some((reason.to_string(), Instant::now()));
        }
        started
    }

    /// The operator saw the pod's endpoint leave the EndpointSlice: traffic
    /// has moved, so `Draining` may end as soon as `minDelay` passed.
    pub fn endpoint_removed(&self) {
        self.shared.endpoint_removed.store(true, Ordering::Release);
        self.shared.endpoint_removed_notify.notify_waiters();
    }

    /// New drain timers from a config reload; a drain under way re-plans.
    pub fn set_timers(&self, timers: DrainConfig) {
        self.shared.timers_tx.send_if_modified(|t| {
            let changed = *t != timers;
            *t = timers;
            changed
        });
    }

    pub fn timers(&self) -> DrainConfig {
        *self.shared.timers_tx.borrow()
    }

    /// Registers an accepted connection; the guard unregisters it on drop.
    pub fn connection(&self) -> ConnGuard {
        let s = &self.shared;
        s.open.fetch_add(1, Ordering::AcqRel);
        s.accepted.fetch_add(1, Ordering::Relaxed);
        let ms = s.epoch.elapsed().as_millis() as u64;
        s.last_conn_ms.store(ms, Ordering::Relaxed);
        ConnGuard {
            drain: self.clone(),
            forced: false,
        }
    }

    /// Registers something that must be waited for like a connection but is
    /// not a new arrival (an upgraded tunnel split off its connection), so it
    /// does not reset the `quiet` clock.
    pub fn track(&self) -> ConnGuard {
        self.shared.open.fetch_add(1, Ordering::AcqRel);
        ConnGuard {
            drain: self.clone(),
            forced: false,
        }
    }

    pub fn open_connections(&self) -> usize {
        self.shared.open.load(Ordering::Acquire)
    }

    pub fn connections_total(&self) -> u64 {
        self.shared.accepted.load(Ordering::Relaxed)
    }

    pub fn force_closed_total(&self) -> u64 {
        self.shared.force_closed.load(Ordering::Relaxed)
    }

    /// Seconds since the trigger (frozen once drained); 0 while serving.
    pub fn drain_seconds(&self) -> f64 {
        if let Some(report) = self.report() {
            return report.duration.as_secs_f64();
        }
        let trigger = self
            .shared
            .trigger
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        trigger
            .as_ref()
            .map(|(_, at)| at.elapsed().as_secs_f64())
            .unwrap_or(0.0)
    }

    pub fn report(&self) -> Option<DrainReport> {
        self.shared
            .report
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Waits until the drain is over and returns its report.
    pub async fn drained(&self) -> DrainReport {
        let mut rx = self.subscribe();
        loop {
            if rx.borrow_and_update().phase == Phase::Drained
                && let Some(report) = self.report()
            {
                return report;
            }
            if rx.changed().await.is_err() {
                // The sender lives in `self`; this cannot happen while we hold it.
                std::future::pending::<()>().await;
            }
        }
    }

    fn set_state(&self, phase: Phase, force_close: bool) {
        self.shared.phase.store(phase as u8, Ordering::Release);
        self.shared
            .tx
            .send_replace(DrainState { phase, force_close });
    }

    async fn wait_all_closed(&self) {
        loop {
            let notified = self.shared.idle_notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.open_connections() == 0 {
                return;
            }
            notified.await;
        }
    }

    /// Drives the machine from the trigger to `Drained`. Run it once, as its
    /// own task, for the life of the process.
    pub async fn run(self) -> DrainReport {
        let mut rx = self.subscribe();
        // The sender lives in `self`, so `wait_for` only ends on the trigger.
        let _ = rx.wait_for(|s| s.phase != Phase::Serving).await;
        let (trigger, t0) = {
            let guard = self
                .shared
                .trigger
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            guard
                .clone()
                .unwrap_or_else(|| ("unknown".to_string(), Instant::now()))
        };
        let open_at_trigger = self.open_connections() as u64;
        let accepted_at_trigger = self.connections_total();
        let force_closed_before = self.force_closed_total();
        tracing::info!(trigger = %trigger, open = open_at_trigger, "drain started: readiness now fails, still serving");

        let grace_end = self.grace(t0).await;
        let grace = t0.elapsed();
        let timeout = self.timers().timeout.get();
        self.set_state(Phase::Closing, false);
        tracing::info!(
            ended_by = grace_end.as_str(),
            grace_secs = grace.as_secs_f64(),
            open = self.open_connections(),
            "drain: closing listeners, waiting for in-flight work"
        );

        let deadline = Instant::now() + timeout;
        let finished = tokio::select! {
            _ = self.wait_all_closed() => true,
            _ = tokio::time::sleep_until(deadline) => false,
        };
        if !finished {
            tracing::warn!(
                open = self.open_connections(),
                timeout = ?timeout,
                "drain timeout passed: force-closing what is left"
            );
            self.set_state(Phase::Closing, true);
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
            connections: open_at_trigger + (self.connections_total() - accepted_at_trigger),
            duration: t0.elapsed(),
            grace,
            force_closed: self.force_closed_total() - force_closed_before,
            grace_end,
        };
        *self
            .shared
            .report
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(report.clone());
        self.set_state(Phase::Drained, !finished);
        report
    }

    /// The grace phase: returns once the evidence (or the ceiling) says the
    /// routers have moved on. Re-plans whenever timers are reloaded.
    async fn grace(&self, t0: Instant) -> GraceEnd {
        let mut timers_rx = self.shared.timers_tx.subscribe();
        loop {
            // Armed before the flag is read, so a removal between the two
            // still wakes us.
            let removed = self.shared.endpoint_removed_notify.notified();
            tokio::pin!(removed);
            removed.as_mut().enable();
            let timers = *timers_rx.borrow_and_update();
            let now = Instant::now();
            let min_at = t0 + timers.min_delay.get();
            let max_at = t0 + timers.max_delay.get();
            if now >= max_at {
                return GraceEnd::MaxDelay;
            }
            let next = if now >= min_at {
                if self.shared.endpoint_removed.load(Ordering::Acquire) {
                    return GraceEnd::EndpointRemoved;
                }
                let last_conn = self.shared.epoch
                    + Duration::from_millis(self.shared.last_conn_ms.load(Ordering::Relaxed));
                let quiet_at = last_conn + timers.quiet.get();
                if now >= quiet_at {
                    return GraceEnd::Quiet;
                }
                quiet_at.min(max_at)
            } else {
                min_at.min(max_at)
            };
            tokio::select! {
                _ = tokio::time::sleep_until(next) => {}
                _ = timers_rx.changed() => {}
                _ = removed => {}
            }
        }
    }
}

/// One open connection (or upgraded tunnel). Dropping it unregisters it.
pub struct ConnGuard {
    drain: Drain,
    forced: bool,
}

impl ConnGuard {
    /// This connection was closed by the drain deadline, not by its peer.
    pub fn mark_forced(&mut self) {
        self.forced = true;
    }

    pub fn drain(&self) -> &Drain {
        &self.drain
    }
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        let s = &self.drain.shared;
        if self.forced {
            s.force_closed.fetch_add(1, Ordering::Relaxed);
        }
        if s.open.fetch_sub(1, Ordering::AcqRel) == 1 {
            s.idle_notify.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::HumanDuration;

    fn timers(min: u64, quiet: u64, max: u64, timeout: u64) -> DrainConfig {
        DrainConfig {
            min_delay: HumanDuration::from_millis(min),
            quiet: HumanDuration::from_millis(quiet),
            max_delay: HumanDuration::from_millis(max),
            timeout: HumanDuration::from_millis(timeout),
        }
    }

    async fn wait_phase(rx: &mut watch::Receiver<DrainState>, phase: Phase) -> Instant {
        // `>=`: with nothing open, Closing passes to Drained in one go.
        rx.wait_for(|s| s.phase >= phase)
            .await
            .expect("drain alive");
        Instant::now()
    }

    #[tokio::test(start_paused = true)]
    async fn idle_pod_drains_after_min_delay_when_quiet() {
        let drain = Drain::new(timers(2000, 1000, 15000, 30000));
        let driver = tokio::spawn(drain.clone().run());
        let mut rx = drain.subscribe();
        let t0 = Instant::now();
        assert!(drain.trigger("test"));
        assert!(!drain.trigger("again"), "a second trigger changes nothing");
        assert_eq!(drain.phase(), Phase::Draining);
        let closing = wait_phase(&mut rx, Phase::Closing).await;
        assert_eq!(closing - t0, Duration::from_secs(2));
        let report = driver.await.expect("driver");
        assert_eq!(report.grace_end, GraceEnd::Quiet);
        assert_eq!(report.connections, 0);
        assert_eq!(drain.phase(), Phase::Drained);
    }

    #[tokio::test(start_paused = true)]
    async fn new_connections_extend_the_grace_until_max_delay() {
        let drain = Drain::new(timers(1000, 500, 3000, 30000));
        let driver = tokio::spawn(drain.clone().run());
        let mut rx = drain.subscribe();
        let t0 = Instant::now();
        drain.trigger("test");
        // A router that still sends: a new connection every 300ms.
        let feeder = {
            let drain = drain.clone();
            tokio::spawn(async move {
                for _ in 0..20 {
                    drop(drain.connection());
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
            })
        };
        let closing = wait_phase(&mut rx, Phase::Closing).await;
        assert_eq!(
            closing - t0,
            Duration::from_secs(3),
            "maxDelay is the ceiling"
        );
        let report = driver.await.expect("driver");
        assert_eq!(report.grace_end, GraceEnd::MaxDelay);
        feeder.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn quiet_is_measured_from_the_last_new_connection() {
        let drain = Drain::new(timers(1000, 500, 10000, 30000));
        let driver = tokio::spawn(drain.clone().run());
        let mut rx = drain.subscribe();
        let t0 = Instant::now();
        drain.trigger("test");
        // Before minDelay: quiet then counts from this connection.
        tokio::time::sleep(Duration::from_millis(800)).await;
        drop(drain.connection());
        let closing = wait_phase(&mut rx, Phase::Closing).await;
        assert_eq!(closing - t0, Duration::from_millis(1300));
        assert_eq!(driver.await.expect("driver").connections, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn endpoint_removal_ends_grace_after_min_delay() {
        let drain = Drain::new(timers(1000, 500, 10000, 30000));
        let driver = tokio::spawn(drain.clone().run());
        let mut rx = drain.subscribe();
        let t0 = Instant::now();
        drain.trigger("test");
        let feeder = {
            let drain = drain.clone();
            tokio::spawn(async move {
                for _ in 0..100 {
                    drop(drain.connection());
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        drain.endpoint_removed();
        let closing = wait_phase(&mut rx, Phase::Closing).await;
        assert_eq!(closing - t0, Duration::from_secs(1), "minDelay still holds");
        assert_eq!(
            driver.await.expect("driver").grace_end,
            GraceEnd::EndpointRemoved
        );
        feeder.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn closing_waits_for_connections_then_force_closes_at_timeout() {
        let drain = Drain::new(timers(0, 0, 0, 5000));
        let quick = drain.connection();
        let mut stuck = drain.connection();
        let driver = tokio::spawn(drain.clone().run());
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
        let report = driver.await.expect("driver");
        assert_eq!(report.force_closed, 1);
        assert_eq!(report.connections, 2);
        assert_eq!(drain.phase(), Phase::Drained);
        assert_eq!(drain.drained().await, report);
    }

    #[tokio::test(start_paused = true)]
    async fn closing_ends_early_when_the_last_connection_goes() {
        let drain = Drain::new(timers(0, 0, 0, 30000));
        let conn = drain.connection();
        let driver = tokio::spawn(drain.clone().run());
        let t0 = Instant::now();
        drain.trigger("test");
        tokio::time::sleep(Duration::from_millis(800)).await;
        drop(conn);
        let report = driver.await.expect("driver");
        assert_eq!(report.force_closed, 0);
        assert_eq!(Instant::now() - t0, Duration::from_millis(800));
    }

    #[tokio::test(start_paused = true)]
    async fn reloaded_timers_apply_to_a_drain_under_way() {
        let drain = Drain::new(timers(10000, 1000, 20000, 30000));
        let driver = tokio::spawn(drain.clone().run());
        let mut rx = drain.subscribe();
        let t0 = Instant::now();
        drain.trigger("test");
        tokio::time::sleep(Duration::from_secs(1)).await;
        drain.set_timers(timers(2000, 500, 5000, 30000));
        let closing = wait_phase(&mut rx, Phase::Closing).await;
        assert_eq!(closing - t0, Duration::from_secs(2));
        driver.await.expect("driver");
    }
}
