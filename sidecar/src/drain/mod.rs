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

//!
//! The parts: this file holds the machine (its phases, the triggers and
//! every state write); [`grace`] is the evidence that ends `Draining`,
//! [`driver`] runs each drain from its trigger to `Drained`, [`resume`]
//! tells a container restart from the end of the pod, [`guard`] counts the
//! open connections and [`report`] is what a finished drain says.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use crate::config::DrainConfig;

mod driver;
#[cfg(test)]
mod fuzz;
mod grace;
mod guard;
mod journal;
mod report;
mod resume;
#[cfg(test)]
pub(crate) mod testing;

pub use guard::ConnGuard;
pub use journal::{Entry as JournalEntry, Journal};
pub use report::{DrainReport, GraceEnd, RequestTally};

/// Where an unrepresentable deadline goes: far beyond any drain (tokio's
/// own choice for a sleep that cannot be represented).
const FAR_FUTURE: std::time::Duration = std::time::Duration::from_secs(86_400 * 365 * 30);

/// `at + after`, never panicking: an instant the clock cannot represent
/// becomes one far in the future (a timer that never fires in the life of
/// the process, which is what so long a wait means). The loader bounds
/// every drain timer to an hour; this keeps a value past that (a future
/// bound, a test, a caller that skipped validation) from killing the drain
/// task, which would leave the listener open and the process running
/// after SIGTERM.
pub(crate) fn deadline(at: Instant, after: std::time::Duration) -> Instant {
    at.checked_add(after)
        .or_else(|| at.checked_add(FAR_FUTURE))
        .unwrap_or(at)
}

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

/// What the lock guards: the trigger of the drain under way and the cycle
/// it belongs to. Every write of `tx` happens under it.
struct Cycle {
    trigger: Option<(String, Instant)>,
    /// Bumped by every resume; the driver's writes name the cycle they
    /// belong to and are dropped once it is over.
    id: u64,
    /// When a drain carried on after a restart must be over (its journal's
    /// deadline): the closing timeout is cut to it.
    deadline: Option<Instant>,
}

/// The machine behind every clone of the [`Drain`] handle: the state, the
/// timers, the evidence and the counters.
struct Machine {
    tx: watch::Sender<DrainState>,
    /// Mirror of `tx`'s phase for the per-request path (no lock).
    phase: AtomicU8,
    timers_tx: watch::Sender<DrainConfig>,
    trigger: Mutex<Cycle>,
    /// SIGTERM/SIGINT/upgrade came: exit once drained, never resume.
    exit: AtomicBool,
    /// The app was seen unreachable during this cycle (resume evidence).
    app_gone: AtomicBool,
    /// The app is unreachable now, whatever the phase (`app.rs`).
    app_down: AtomicBool,
    /// This cycle is an exit drain that began while the app was down and
    /// the sidecar serving: its grace phase ends at once.
    close_at_once: AtomicBool,
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
    /// Reads the proxy's request counters for the report; set once by the
    /// owner of the metrics (the machine itself counts connections only).
    requests: OnceLock<Box<dyn Fn() -> RequestTally + Send + Sync>>,
    /// Where a drain under way is written for a restarted process
    /// (`--state-dir`); none outside a pod.
    journal: OnceLock<Journal>,
}

/// What [`Drain::trigger_exit`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitTrigger {
    /// Nothing was under way: an exit drain started.
    Started,
    /// A provisional drain was under way (or over): it is now the exit drain.
    Joined,
    /// An exit had already been asked for: nothing changed.
    Repeated,
}

/// Handle on the drain state machine; cheap to clone.
#[derive(Clone)]
pub struct Drain {
    machine: Arc<Machine>,
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
            machine: Arc::new(Machine {
                tx,
                phase: AtomicU8::new(Phase::Serving as u8),
                timers_tx,
                trigger: Mutex::new(Cycle {
                    trigger: None,
                    id: 0,
                    deadline: None,
                }),
                exit: AtomicBool::new(false),
                app_gone: AtomicBool::new(false),
                app_down: AtomicBool::new(false),
                close_at_once: AtomicBool::new(false),
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
                requests: OnceLock::new(),
                journal: OnceLock::new(),
            }),
        }
    }

    pub fn subscribe(&self) -> watch::Receiver<DrainState> {
        self.machine.tx.subscribe()
    }

    /// The current phase, one relaxed atomic load (request path).
    #[inline]
    pub fn phase(&self) -> Phase {
        Phase::from_u8(self.machine.phase.load(Ordering::Relaxed))
    }

    /// Starts a provisional drain (admin `/drain`, the preStop hook): it may
    /// [`resume`](Drain::resume) if the app turns out to be restarting.
    /// Returns false when one was already under way, so a second SIGTERM or
    /// `/drain` changes nothing.
    pub fn trigger(&self, reason: &str) -> bool {
        self.start(reason, false).0
    }

    /// Starts (or joins) the drain that ends the process: SIGTERM, SIGINT,
    /// an upgrade. A drain already under way becomes an exit drain, so it
    /// can no longer resume. The process's one way to say "stop" is
    /// [`crate::stop::Stop::request`], which calls this.
    pub fn trigger_exit(&self, reason: &str) -> ExitTrigger {
        match self.start(reason, true) {
            (true, _) => ExitTrigger::Started,
            (false, false) => ExitTrigger::Joined,
            (false, true) => ExitTrigger::Repeated,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Cycle> {
        self.machine
            .trigger
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Returns whether a drain started, and whether an exit had already
    /// been asked for (told apart under the lock, so of two signals at once
    /// exactly one is the first).
    fn start(&self, reason: &str, exit: bool) -> (bool, bool) {
        // The reason is stored under its lock before the watch fires, and
        // the driver reads it under the same lock after waking, so the
        // report always names what started the drain.
        let mut cycle = self.lock();
        let was_exit = exit && self.machine.exit.swap(true, Ordering::AcqRel);
        let mut started = false;
        let mut became_exit = false;
        self.machine.tx.send_if_modified(|state| {
            let mut changed = false;
            if exit && !state.exit {
                state.exit = true;
                became_exit = true;
                changed = true;
            }
            if state.phase == Phase::Serving {
                state.phase = Phase::Draining;
                self.machine
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
            self.machine.app_gone.store(false, Ordering::Release);
            // A SIGTERM with no preStop before it, while the app is down: in
            // a pod that is the kubelet restarting every container in place
            // (`RestartAllContainers`), which kills this process two seconds
            // later whatever it does. Holding the listener open would only
            // answer 503 for the app and delay the restart; closing at once
            // lets the next process bind sooner and hold requests for the
            // app that comes back with it.
            let at_once = exit && self.machine.app_down.load(Ordering::Acquire);
            self.machine.close_at_once.store(at_once, Ordering::Release);
            cycle.trigger = Some((reason.to_string(), Instant::now()));
            cycle.deadline = None;
            // Only a drain that began provisionally (the preStop hook,
            // `/drain`) is journaled. The kubelet ends a pod with preStop
            // first, so a pod's real end always starts that way; a SIGTERM
            // that finds the sidecar serving is the kubelet killing every
            // container in place with no preStop and no grace
            // (`RestartAllContainers`, KEP-5532), or a stop outside
            // Kubernetes. There the process that starts next must serve the
            // same pod again, not carry a drain on and exit.
            if !exit && let Some(journal) = self.machine.journal.get() {
                let now = std::time::SystemTime::now();
                journal.record(JournalEntry::new(reason, exit, now, &self.timers()));
            }
        } else if became_exit && let Some(journal) = self.machine.journal.get() {
            journal.update(|e| e.exit = true);
        }
        (started, was_exit)
    }

    /// Evidence from `app.rs`, on every change: whether a connect to the app
    /// succeeds now. Read when an exit drain starts (see `close_at_once`).
    pub fn app_reachable(&self, reachable: bool) {
        self.machine.app_down.store(!reachable, Ordering::Release);
    }

    /// The process is about to exit after its drain: nothing is left for a
    /// restarted process to carry on. Without this, a container restarted
    /// after a clean exit that is not the end of the pod (an in-place
    /// restart, a `kill` by hand) would drain and exit again until the
    /// journal's deadline.
    pub fn journal_done(&self) {
        if let Some(journal) = self.machine.journal.get() {
            journal.clear();
        }
    }

    /// Keeps every drain of this process in `journal` from now on, for a
    /// process that restarts mid-drain (see [`journal`]).
    pub fn keep_journal(&self, journal: Journal) {
        let _ = self.machine.journal.set(journal);
    }

    /// Carries on the drain an earlier process of this container left in
    /// its journal: timed from its original trigger (the phases it already
    /// went through are not waited for again), over by its deadline, an
    /// exit drain if it was one, with the app-gone evidence it had seen.
    /// Returns false when a drain is already under way.
    pub fn resume_after_restart(&self, entry: &JournalEntry) -> bool {
        let now = std::time::SystemTime::now();
        let Some((elapsed, left)) = entry.live(now) else {
            return false;
        };
        let mut cycle = self.lock();
        if self.phase() != Phase::Serving {
            return false;
        }
        if entry.exit {
            self.machine.exit.store(true, Ordering::Release);
        }
        self.machine
            .phase
            .store(Phase::Draining as u8, Ordering::Release);
        let now = Instant::now();
        // Backdated as far as the clock allows (a monotonic clock cannot
        // reach before the machine booted); never later than now.
        let t0 = now.checked_sub(elapsed).unwrap_or(now);
        cycle.trigger = Some((
            format!("{} (carried on after a sidecar restart)", entry.reason),
            t0,
        ));
        cycle.deadline = Some(deadline(now, left));
        self.machine
            .app_gone
            .store(entry.app_gone, Ordering::Release);
        if let Some(journal) = self.machine.journal.get() {
            journal.record(entry.clone());
        }
        self.machine.tx.send_replace(DrainState {
            phase: Phase::Draining,
            force_close: false,
            exit: entry.exit,
        });
        drop(cycle);
        tracing::warn!(
            trigger = %entry.reason,
            exit = entry.exit,
            elapsed_secs = elapsed.as_secs_f64(),
            left_secs = left.as_secs_f64(),
            "a drain was under way when this sidecar's previous process ended; carrying it on (not ready, closing by its deadline)"
        );
        true
    }

    /// The time a drain's closing phase may take from now: `drain.timeout`,
    /// cut to the deadline of a drain carried on after a restart.
    fn closing_timeout(&self, timeout: std::time::Duration) -> std::time::Duration {
        match self.lock().deadline {
            Some(by) => timeout.min(by.saturating_duration_since(Instant::now())),
            None => timeout,
        }
    }

    /// Whether this drain ends the process (SIGTERM, SIGINT, upgrade).
    pub fn is_exit(&self) -> bool {
        self.machine.exit.load(Ordering::Acquire)
    }

    /// New drain timers from a config reload; a drain under way re-plans.
    pub fn set_timers(&self, timers: DrainConfig) {
        self.machine.timers_tx.send_if_modified(|t| {
            let changed = *t != timers;
            *t = timers;
            changed
        });
    }

    pub fn timers(&self) -> DrainConfig {
        *self.machine.timers_tx.borrow()
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

    /// Where the drain report reads request numbers from (in flight now,
    /// finished so far). Without it the report's request fields stay 0.
    pub fn count_requests_with(&self, tally: impl Fn() -> RequestTally + Send + Sync + 'static) {
        let _ = self.machine.requests.set(Box::new(tally));
    }

    fn request_tally(&self) -> RequestTally {
        self.machine
            .requests
            .get()
            .map(|tally| tally())
            .unwrap_or_default()
    }

    pub fn report(&self) -> Option<DrainReport> {
        self.machine
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
        self.machine.phase.store(phase as u8, Ordering::Release);
        let exit = self.is_exit();
        self.machine.tx.send_replace(DrainState {
            phase,
            force_close,
            exit,
        });
        true
    }
}
