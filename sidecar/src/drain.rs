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
//!   or once `maxDelay` passed. `/ready` fails from the trigger on, or with
//!   `drain.readiness: stayServing` only once this phase is over or the app
//!   is gone (`admin.rs`): the machine itself is the same in both modes.
//! - `Closing`: listeners close, connections shut down gracefully; after
//!   `timeout` whatever is still open is told to force-close.
//! - `Drained`: nothing is left; the report is available.
//!
//! ## A drain is a pod termination only if the pod really goes away
//!
//! kubelet runs the app container's preStop (`/drain?wait=true`) whenever it
//! stops that container, and that includes a *restart* of the container
//! after a failed livenessProbe: the pod stays, no SIGTERM ever reaches the
//! sidecar, and the app comes back a second later. A sidecar that took every
//! drain for the end of the pod would stay `Drained` (unready, listener
//! closed) for good. So the machine tells the two kinds of drain apart:
//!
//! - An *exit* drain ([`Drain::trigger_exit`]: SIGTERM, SIGINT, an upgrade
//!   hand-over) ends the process once `Drained`. It never resumes.
//! - Any other drain (admin `/drain`, the preStop hook) is *provisional*.
//!   It runs exactly like an exit drain (same timers, same evidence, same
//!   listener close), and it stays `Drained`, with one way back:
//!   [`Drain::resume`] returns it to `Serving` when
//!   1. the app was seen gone (a connect to it refused, or unreachable) at or
//!      after the trigger ([`Drain::app_gone`]), and
//!   2. the app is now reachable again, and
//!   3. no SIGTERM/SIGINT came (an exit drain always wins, at any phase).
//!
//!   Gone-then-back is the signature of a container restart: kubelet never
//!   restarts a container of a pod that is being deleted, so a pod that
//!   really goes away can never show it. An operator's maintenance drain
//!   (the app stays up throughout) never shows it either and stays drained.
//!   The evidence comes from `app.rs`, which probes the app every 50 ms
//!   while a provisional drain is under way or the app is down, and from
//!   every request that meets a refused connect.
//!
//! Each drain is one *cycle*; a resume ends it wherever it is (a drain
//! whose app crashed and came back mid-grace resumes too) and a later
//! trigger starts a new one. Every state write happens under one lock and
//! names its cycle, so a resume and the driver's next step cannot
//! interleave into a phase nobody chose. Resumes are logged and counted
//! (`kubegrace_drain_resumes_total`).

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use crate::config::{DrainConfig, DrainReadiness};

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
    /// The process exits once drained (SIGTERM, SIGINT, upgrade): this
    /// drain never resumes, so a paused listener can close for good.
    pub exit: bool,
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

/// What the lock guards: the trigger of the drain under way and the cycle
/// it belongs to. Every write of `tx` happens under it.
struct Cycle {
    trigger: Option<(String, Instant)>,
    /// Bumped by every resume; the driver's writes name the cycle they
    /// belong to and are dropped once it is over.
    id: u64,
}

struct Shared {
    tx: watch::Sender<DrainState>,
    /// Mirror of `tx`'s phase for the per-request path (no lock).
    phase: AtomicU8,
    timers_tx: watch::Sender<DrainConfig>,
    trigger: Mutex<Cycle>,
    /// SIGTERM/SIGINT/upgrade came: exit once drained, never resume.
    exit: AtomicBool,
    /// The app was seen unreachable during this cycle (resume evidence).
    app_gone: AtomicBool,
    resumes: AtomicU64,
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
            exit: false,
        });
        let (timers_tx, _) = watch::channel(timers);
        Drain {
            shared: Arc::new(Shared {
                tx,
                phase: AtomicU8::new(Phase::Serving as u8),
                timers_tx,
                trigger: Mutex::new(Cycle {
                    trigger: None,
                    id: 0,
                }),
                exit: AtomicBool::new(false),
                app_gone: AtomicBool::new(false),
                resumes: AtomicU64::new(0),
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

    /// Starts a provisional drain (admin `/drain`, the preStop hook): it may
    /// [`resume`](Drain::resume) if the app turns out to be restarting.
    /// Returns false when one was already under way, so a second SIGTERM or
    /// `/drain` changes nothing.
    pub fn trigger(&self, reason: &str) -> bool {
        self.start(reason, false)
    }

    /// Starts (or joins) the drain that ends the process: SIGTERM, SIGINT,
    /// an upgrade. A drain already under way becomes an exit drain, so it
    /// can no longer resume. Returns false when one was already under way.
    pub fn trigger_exit(&self, reason: &str) -> bool {
        self.start(reason, true)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Cycle> {
        self.shared
            .trigger
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn start(&self, reason: &str, exit: bool) -> bool {
        // The reason is stored under its lock before the watch fires, and
        // the driver reads it under the same lock after waking, so the
        // report always names what started the drain.
        let mut cycle = self.lock();
        if exit {
            self.shared.exit.store(true, Ordering::Release);
        }
        let mut started = false;
        self.shared.tx.send_if_modified(|state| {
            let mut changed = false;
            if exit && !state.exit {
                state.exit = true;
                changed = true;
            }
            if state.phase == Phase::Serving {
                state.phase = Phase::Draining;
                self.shared
                    .phase
                    .store(Phase::Draining as u8, Ordering::Release);
                started = true;
                changed = true;
            }
            changed
        });
        if started {
            // Evidence counts from the trigger on (app.rs re-reports a
            // down app on every probe, so one that is down now still counts).
            self.shared.app_gone.store(false, Ordering::Release);
            cycle.trigger = Some((reason.to_string(), Instant::now()));
        }
        started
    }

    /// Whether this drain ends the process (SIGTERM, SIGINT, upgrade).
    pub fn is_exit(&self) -> bool {
        self.shared.exit.load(Ordering::Acquire)
    }

    /// Evidence from `app.rs`: a connect to the app was refused (or timed
    /// out). Only counts while a drain is under way.
    pub fn app_gone(&self) {
        if self.phase() != Phase::Serving && !self.shared.app_gone.swap(true, Ordering::AcqRel) {
            tracing::info!(phase = %self.phase(), "drain: the app is gone; if it comes back without a SIGTERM, this was a container restart and the sidecar resumes");
        }
    }

    /// Whether the app was seen gone since this drain's trigger. It stays
    /// set until the cycle ends (a resume clears it), so a `stayServing`
    /// drain never turns ready again on an app that flaps mid-drain.
    pub fn app_seen_gone(&self) -> bool {
        self.phase() != Phase::Serving && self.shared.app_gone.load(Ordering::Acquire)
    }

    /// Evidence from `app.rs`: the app accepts connections. Returns to
    /// `Serving` if the rule allows it (see the module doc): a provisional
    /// drain, the app seen gone since its trigger, no SIGTERM. Returns
    /// whether it resumed.
    pub fn resume(&self, why: &str) -> bool {
        let mut cycle = self.lock();
        let phase = self.phase();
        if phase == Phase::Serving
            || self.is_exit()
            || !self.shared.app_gone.load(Ordering::Acquire)
        {
            return false;
        }
        let drained_for = cycle
            .trigger
            .as_ref()
            .map(|(_, at)| at.elapsed())
            .unwrap_or_default();
        let trigger = cycle
            .trigger
            .take()
            .map(|(reason, _)| reason)
            .unwrap_or_else(|| "unknown".to_string());
        cycle.id += 1;
        self.shared.app_gone.store(false, Ordering::Release);
        self.shared.endpoint_removed.store(false, Ordering::Release);
        *self
            .shared
            .report
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = None;
        self.shared
            .phase
            .store(Phase::Serving as u8, Ordering::Release);
        self.shared.tx.send_replace(DrainState {
            phase: Phase::Serving,
            force_close: false,
            exit: false,
        });
        let total = self.shared.resumes.fetch_add(1, Ordering::Relaxed) + 1;
        drop(cycle);
        tracing::warn!(
            from = %phase,
            trigger = %trigger,
            drained_secs = drained_for.as_secs_f64(),
            resumes = total,
            "{why} and no SIGTERM came: that drain was an app container restart, not the end of the pod; serving again"
        );
        true
    }

    /// Drains that returned to `Serving` because the app came back.
    pub fn resumes_total(&self) -> u64 {
        self.shared.resumes.load(Ordering::Relaxed)
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
        self.lock()
            .trigger
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

    /// The driver's transitions: dropped when cycle `id` was resumed in the
    /// meantime (the resume already chose the phase).
    fn set_state(&self, id: u64, phase: Phase, force_close: bool) -> bool {
        let cycle = self.lock();
        if cycle.id != id {
            return false;
        }
        self.shared.phase.store(phase as u8, Ordering::Release);
        let exit = self.is_exit();
        self.shared.tx.send_replace(DrainState {
            phase,
            force_close,
            exit,
        });
        true
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
        let timeout = self.timers().timeout.get();
        if !self.set_state(id, Phase::Closing, false) {
            return;
        }
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
            connections: open_at_trigger + (self.connections_total() - accepted_at_trigger),
            duration: t0.elapsed(),
            grace,
            force_closed: self.force_closed_total() - force_closed_before,
            grace_end,
        };
        {
            let cycle = self.lock();
            if cycle.id != id {
                return;
            }
            *self
                .shared
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
            ..DrainConfig::default()
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
        tokio::spawn(drain.clone().run());
        let mut rx = drain.subscribe();
        let t0 = Instant::now();
        assert!(drain.trigger("test"));
        assert!(!drain.trigger("again"), "a second trigger changes nothing");
        assert_eq!(drain.phase(), Phase::Draining);
        let closing = wait_phase(&mut rx, Phase::Closing).await;
        assert_eq!(closing - t0, Duration::from_secs(2));
        let report = drain.drained().await;
        assert_eq!(report.grace_end, GraceEnd::Quiet);
        assert_eq!(report.connections, 0);
        assert_eq!(drain.phase(), Phase::Drained);
    }

    #[tokio::test(start_paused = true)]
    async fn new_connections_extend_the_grace_until_max_delay() {
        let drain = Drain::new(timers(1000, 500, 3000, 30000));
        tokio::spawn(drain.clone().run());
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
        let report = drain.drained().await;
        assert_eq!(report.grace_end, GraceEnd::MaxDelay);
        feeder.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn quiet_is_measured_from_the_last_new_connection() {
        let drain = Drain::new(timers(1000, 500, 10000, 30000));
        tokio::spawn(drain.clone().run());
        let mut rx = drain.subscribe();
        let t0 = Instant::now();
        drain.trigger("test");
        // Before minDelay: quiet then counts from this connection.
        tokio::time::sleep(Duration::from_millis(800)).await;
        drop(drain.connection());
        let closing = wait_phase(&mut rx, Phase::Closing).await;
        assert_eq!(closing - t0, Duration::from_millis(1300));
        assert_eq!(drain.drained().await.connections, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn endpoint_removal_ends_grace_after_min_delay() {
        let drain = Drain::new(timers(1000, 500, 10000, 30000));
        tokio::spawn(drain.clone().run());
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
        assert_eq!(drain.drained().await.grace_end, GraceEnd::EndpointRemoved);
        feeder.abort();
    }

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

    #[tokio::test(start_paused = true)]
    async fn reloaded_timers_apply_to_a_drain_under_way() {
        let drain = Drain::new(timers(10000, 1000, 20000, 30000));
        tokio::spawn(drain.clone().run());
        let mut rx = drain.subscribe();
        let t0 = Instant::now();
        drain.trigger("test");
        tokio::time::sleep(Duration::from_secs(1)).await;
        drain.set_timers(timers(2000, 500, 5000, 30000));
        let closing = wait_phase(&mut rx, Phase::Closing).await;
        assert_eq!(closing - t0, Duration::from_secs(2));
        drain.drained().await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_provisional_drain_resumes_once_the_app_was_gone_and_is_back() {
        let drain = Drain::new(timers(100, 50, 1000, 1000));
        tokio::spawn(drain.clone().run());
        drain.trigger("admin /drain");
        drain.drained().await;
        assert!(
            !drain.resume("back"),
            "no evidence yet: the app never went away"
        );
        assert_eq!(drain.phase(), Phase::Drained);
        drain.app_gone();
        assert!(drain.resume("the app is reachable again"));
        assert_eq!(drain.phase(), Phase::Serving);
        assert_eq!(drain.resumes_total(), 1);
        assert_eq!(drain.report(), None);
        // The next drain is a full new cycle with its own report.
        let t0 = Instant::now();
        assert!(drain.trigger("admin /drain"));
        let report = drain.drained().await;
        assert_eq!(Instant::now() - t0, Duration::from_millis(100));
        assert_eq!(report.trigger, "admin /drain");
    }

    #[tokio::test(start_paused = true)]
    async fn evidence_from_before_the_trigger_does_not_count() {
        let drain = Drain::new(timers(100, 50, 1000, 1000));
        tokio::spawn(drain.clone().run());
        drain.app_gone(); // while serving: not evidence
        drain.trigger("admin /drain");
        drain.drained().await;
        assert!(!drain.resume("back"));
        assert_eq!(drain.phase(), Phase::Drained);
    }

    #[tokio::test(start_paused = true)]
    async fn sigterm_always_wins() {
        // SIGTERM first: the app going and coming back changes nothing.
        let drain = Drain::new(timers(100, 50, 1000, 1000));
        tokio::spawn(drain.clone().run());
        assert!(drain.trigger_exit("SIGTERM"));
        assert!(drain.subscribe().borrow().exit);
        drain.app_gone();
        assert!(!drain.resume("back"));
        drain.drained().await;
        assert!(!drain.resume("back"));
        assert_eq!(drain.phase(), Phase::Drained);

        // SIGTERM after a provisional drain: that drain can no longer resume.
        let drain = Drain::new(timers(100, 50, 1000, 1000));
        tokio::spawn(drain.clone().run());
        drain.trigger("admin /drain");
        drain.app_gone();
        assert!(!drain.trigger_exit("SIGTERM"), "joins the drain under way");
        assert!(drain.is_exit());
        assert!(!drain.resume("back"));
        drain.drained().await;
        assert_eq!(drain.phase(), Phase::Drained);
    }

    #[tokio::test(start_paused = true)]
    async fn a_resume_mid_grace_ends_that_cycle_for_good() {
        let drain = Drain::new(timers(1000, 500, 5000, 5000));
        tokio::spawn(drain.clone().run());
        let mut rx = drain.subscribe();
        drain.trigger("admin /drain");
        tokio::time::sleep(Duration::from_millis(300)).await;
        drain.app_gone();
        assert!(drain.resume("back"));
        // The old cycle's timers pass: nothing moves.
        tokio::time::sleep(Duration::from_secs(20)).await;
        assert_eq!(drain.phase(), Phase::Serving);
        assert!(!rx.borrow_and_update().force_close);
        // And the driver takes the next trigger.
        drain.trigger("admin /drain");
        drain.drained().await;
    }
}
