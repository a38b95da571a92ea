//! The breaker's state machine: closed -> open -> half-open -> closed.
//!
//! Pure: time and jitter come in as arguments, so every transition is unit
//! tested without a clock or a random source.
//!
//! - Closed: every outcome goes into a rolling window and a consecutive
//!   failure counter. It opens when the window's error ratio reaches
//!   `errorRatio` with at least `minRequests` seen, or on
//!   `consecutiveFailures` failures in a row (either check is off at 0).
//! - Open: everything is rejected until the open period ends. The first
//!   period is `openFor`; each reopen without closing in between doubles it,
//!   up to `maxOpenFor`, with +-10% jitter so a fleet of sidecars does not
//!   probe an app in lockstep (Linkerd's failure accrual does the same).
//! - Half-open: at most `halfOpenProbes` requests go through. All of them
//!   succeeding closes the breaker; any failing reopens it with the longer
//!   period; a cancelled probe frees its place for another.
//!
//! Every transition starts a new epoch. An outcome only counts in the epoch
//! its request was admitted in, so a slow request admitted before the
//! breaker opened cannot close it, and a stale probe cannot judge a later
//! half-open period.

use std::time::Duration;

use tokio::time::Instant;

use super::Verdict;
use super::window::{RollingWindow, WindowTotals};
use crate::config::CircuitBreakerConfig;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BreakerState {
    Closed = 0,
    Open = 1,
    HalfOpen = 2,
}

impl BreakerState {
    /// Every state, in the order `RouteStats::transitions` counts them.
    pub(crate) const ALL: [BreakerState; 3] = [Self::Closed, Self::Open, Self::HalfOpen];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Closed => "closed",
            Self::Open => "open",
            Self::HalfOpen => "half_open",
        }
    }

    pub(crate) fn from_u8(value: u8) -> Self {
        match value {
            1 => Self::Open,
            2 => Self::HalfOpen,
            _ => Self::Closed,
        }
    }
}

/// How long a rejected client is told to wait while half-open: the probes
/// usually settle the question within a request's duration.
const HALF_OPEN_RETRY_AFTER: Duration = Duration::from_secs(1);

/// Admission decided by the breaker once a request holds a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admission {
    Admit { epoch: u64, probe: bool },
    Reject { retry_after: Duration },
}

#[derive(Debug)]
pub(crate) struct Breaker {
    error_ratio: f64,
    min_requests: u32,
    consecutive_limit: u32,
    open_for: Duration,
    max_open_for: Duration,
    half_open_probes: u32,

    state: BreakerState,
    epoch: u64,
    window: RollingWindow,
    consecutive_failures: u32,
    /// Opens since the breaker last closed: the backoff exponent.
    open_streak: u32,
    open_until: Instant,
    probes_admitted: u32,
    probes_succeeded: u32,
    entered_state_at: Instant,
}

impl Breaker {
    pub(crate) fn new(config: &CircuitBreakerConfig, now: Instant) -> Self {
        Self {
            error_ratio: config.error_ratio,
            // A ratio over zero requests is meaningless; one is the least evidence.
            min_requests: config.min_requests.max(1),
            consecutive_limit: config.consecutive_failures,
            open_for: config.open_for.get(),
            max_open_for: config.max_open_for.get().max(config.open_for.get()),
            half_open_probes: config.half_open_probes.max(1),
            state: BreakerState::Closed,
            epoch: 0,
            window: RollingWindow::new(config.window.get(), now),
            consecutive_failures: 0,
            open_streak: 0,
            open_until: now,
            probes_admitted: 0,
            probes_succeeded: 0,
            entered_state_at: now,
        }
    }

    pub(crate) fn state(&self) -> BreakerState {
        self.state
    }

    /// Moves an expired open period to half-open, so the reported state is
    /// what the next request will meet. Returns the transition, if any.
    pub(crate) fn refresh(&mut self, now: Instant) -> Option<BreakerState> {
        if self.state == BreakerState::Open && now >= self.open_until {
            self.enter(BreakerState::HalfOpen, now);
            self.probes_admitted = 0;
            self.probes_succeeded = 0;
            return Some(BreakerState::HalfOpen);
        }
        None
    }

    /// Would a request be turned away right now? Checked before queueing so
    /// an open breaker answers at once instead of after a queue wait.
    pub(crate) fn precheck(&self, now: Instant) -> Result<(), Duration> {
        match self.state {
            BreakerState::Closed => Ok(()),
            BreakerState::Open if now < self.open_until => Err(self.open_until - now),
            BreakerState::Open => Ok(()),
            BreakerState::HalfOpen if self.probes_admitted >= self.half_open_probes => {
                Err(HALF_OPEN_RETRY_AFTER)
            }
            BreakerState::HalfOpen => Ok(()),
        }
    }

    /// Decides for a request that holds a slot; while half-open this takes
    /// one of the probe places.
    pub(crate) fn admit(&mut self, now: Instant) -> (Admission, Option<BreakerState>) {
        let transition = self.refresh(now);
        let admission = match self.state {
            BreakerState::Closed => Admission::Admit {
                epoch: self.epoch,
                probe: false,
            },
            BreakerState::Open => Admission::Reject {
                retry_after: self.open_until.saturating_duration_since(now),
            },
            BreakerState::HalfOpen if self.probes_admitted < self.half_open_probes => {
                self.probes_admitted += 1;
                Admission::Admit {
                    epoch: self.epoch,
                    probe: true,
                }
            }
            BreakerState::HalfOpen => Admission::Reject {
                retry_after: HALF_OPEN_RETRY_AFTER,
            },
        };
        (admission, transition)
    }

    /// Feeds one outcome. `jitter` is uniform in [0, 1) and only used when
    /// the breaker opens. Returns the transition, if any.
    pub(crate) fn record(
        &mut self,
        epoch: u64,
        probe: bool,
        verdict: Verdict,
        now: Instant,
        jitter: f64,
    ) -> Option<BreakerState> {
        if epoch != self.epoch {
            return None;
        }
        match (self.state, verdict) {
            (_, Verdict::Cancelled) => {
                if self.state == BreakerState::HalfOpen && probe {
                    self.probes_admitted = self.probes_admitted.saturating_sub(1);
                }
                None
            }
            (BreakerState::Closed, Verdict::Success) => {
                self.consecutive_failures = 0;
                self.window.record(false, now);
                None
            }
            (BreakerState::Closed, Verdict::Failure { .. }) => {
                self.consecutive_failures = self.consecutive_failures.saturating_add(1);
                self.window.record(true, now);
                self.should_trip(now).then(|| self.open(now, jitter))
            }
            (BreakerState::HalfOpen, Verdict::Success) if probe => {
                self.probes_succeeded += 1;
                (self.probes_succeeded >= self.half_open_probes).then(|| self.close(now))
            }
            (BreakerState::HalfOpen, Verdict::Failure { .. }) if probe => {
                Some(self.open(now, jitter))
            }
            // Open admits nothing in its own epoch; a non-probe cannot exist
            // in a half-open epoch. Nothing to count.
            _ => None,
        }
    }

    fn should_trip(&self, now: Instant) -> bool {
        if self.consecutive_limit > 0 && self.consecutive_failures >= self.consecutive_limit {
            return true;
        }
        if self.error_ratio > 0.0 {
            let totals = self.window.totals(now);
            return totals.requests >= self.min_requests
                && totals.error_ratio() >= self.error_ratio;
        }
        false
    }

    /// The open period for the current streak: doubling per reopen, capped,
    /// jittered by +-10% and kept within [openFor, maxOpenFor].
    pub(crate) fn open_period(&self, jitter: f64) -> Duration {
        let doubling = 1u32 << self.open_streak.min(20);
        let base = self
            .open_for
            .saturating_mul(doubling)
            .min(self.max_open_for);
        let factor = 0.9 + 0.2 * jitter.clamp(0.0, 1.0);
        base.mul_f64(factor).clamp(self.open_for, self.max_open_for)
    }

    fn open(&mut self, now: Instant, jitter: f64) -> BreakerState {
        let period = self.open_period(jitter);
        self.open_streak = self.open_streak.saturating_add(1);
        self.open_until = now + period;
        self.enter(BreakerState::Open, now);
        BreakerState::Open
    }

    fn close(&mut self, now: Instant) -> BreakerState {
        self.open_streak = 0;
        self.consecutive_failures = 0;
        self.window.clear();
        self.enter(BreakerState::Closed, now);
        BreakerState::Closed
    }

    fn enter(&mut self, state: BreakerState, now: Instant) {
        self.state = state;
        self.epoch += 1;
        self.entered_state_at = now;
    }

    pub(crate) fn window_totals(&self, now: Instant) -> WindowTotals {
        self.window.totals(now)
    }

    pub(crate) fn consecutive_failures(&self) -> u32 {
        self.consecutive_failures
    }

    pub(crate) fn open_streak(&self) -> u32 {
        self.open_streak
    }

    /// Time left in the open period, when open.
    pub(crate) fn open_remaining(&self, now: Instant) -> Option<Duration> {
        (self.state == BreakerState::Open).then(|| self.open_until.saturating_duration_since(now))
    }

    pub(crate) fn in_state_for(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.entered_state_at)
    }

    pub(crate) fn probes_admitted(&self) -> u32 {
        self.probes_admitted
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::HumanDuration;

    const FAIL: Verdict = Verdict::Failure {
        latency_sample: false,
    };

    fn config() -> CircuitBreakerConfig {
        CircuitBreakerConfig {
            error_ratio: 0.5,
            min_requests: 10,
            window: HumanDuration::from_secs(10),
            consecutive_failures: 0,
            open_for: HumanDuration::from_secs(1),
            max_open_for: HumanDuration::from_secs(8),
            half_open_probes: 2,
            ..CircuitBreakerConfig::default()
        }
    }

    fn admit(breaker: &mut Breaker, now: Instant) -> (u64, bool) {
        match breaker.admit(now).0 {
            Admission::Admit { epoch, probe } => (epoch, probe),
            Admission::Reject { retry_after } => panic!("rejected, retry after {retry_after:?}"),
        }
    }

    /// Runs `n` requests with the given verdict through a closed breaker.
    fn run(
        breaker: &mut Breaker,
        n: usize,
        verdict: Verdict,
        now: Instant,
    ) -> Option<BreakerState> {
        let mut last = None;
        for _ in 0..n {
            let (epoch, probe) = admit(breaker, now);
            last = breaker.record(epoch, probe, verdict, now, 0.5).or(last);
        }
        last
    }

    #[test]
    fn the_ratio_needs_the_minimum_request_count() {
        let now = Instant::now();
        let mut breaker = Breaker::new(&config(), now);
        assert_eq!(run(&mut breaker, 9, FAIL, now), None, "9 < minRequests");
        assert_eq!(breaker.state(), BreakerState::Closed);
        assert_eq!(run(&mut breaker, 1, FAIL, now), Some(BreakerState::Open));
    }

    #[test]
    fn the_ratio_below_threshold_keeps_it_closed() {
        let now = Instant::now();
        let mut breaker = Breaker::new(&config(), now);
        for _ in 0..20 {
            run(&mut breaker, 2, Verdict::Success, now);
            run(&mut breaker, 1, FAIL, now);
        }
        assert_eq!(breaker.state(), BreakerState::Closed, "33% < 50%");
    }

    #[test]
    fn consecutive_failures_trip_without_the_ratio() {
        let now = Instant::now();
        let mut breaker = Breaker::new(
            &CircuitBreakerConfig {
                error_ratio: 0.0,
                consecutive_failures: 3,
                ..config()
            },
            now,
        );
        run(&mut breaker, 2, FAIL, now);
        run(&mut breaker, 1, Verdict::Success, now);
        assert_eq!(
            run(&mut breaker, 2, FAIL, now),
            None,
            "the success reset the run"
        );
        assert_eq!(run(&mut breaker, 1, FAIL, now), Some(BreakerState::Open));
    }

    #[test]
    fn open_rejects_then_half_open_probes_close_it() {
        let start = Instant::now();
        let mut breaker = Breaker::new(&config(), start);
        run(&mut breaker, 10, FAIL, start);
        let Admission::Reject { retry_after } = breaker.admit(start + Duration::from_millis(300)).0
        else {
            panic!("open must reject");
        };
        assert!(
            retry_after <= Duration::from_millis(800) && retry_after >= Duration::from_millis(500)
        );

        let later = start + Duration::from_secs(2);
        assert_eq!(breaker.precheck(later), Ok(()), "the open period is over");
        let (admission, transition) = breaker.admit(later);
        assert_eq!(transition, Some(BreakerState::HalfOpen));
        let Admission::Admit { epoch, probe: true } = admission else {
            panic!("first request after the open period is a probe");
        };
        let (epoch2, probe2) = admit(&mut breaker, later);
        assert!(probe2);
        assert_eq!(
            breaker.admit(later).0,
            Admission::Reject {
                retry_after: HALF_OPEN_RETRY_AFTER
            }
        );
        assert!(breaker.precheck(later).is_err(), "all probe places taken");
        assert_eq!(
            breaker.record(epoch, true, Verdict::Success, later, 0.5),
            None
        );
        assert_eq!(
            breaker.record(epoch2, true, Verdict::Success, later, 0.5),
            Some(BreakerState::Closed)
        );
        assert_eq!(
            breaker.window_totals(later),
            WindowTotals::default(),
            "closing forgets"
        );
    }

    #[test]
    fn a_failed_probe_reopens_for_longer_up_to_the_cap() {
        let mut now = Instant::now();
        let mut breaker = Breaker::new(&config(), now);
        run(&mut breaker, 10, FAIL, now);
        let mut periods = Vec::new();
        for _ in 0..6 {
            let remaining = breaker.open_remaining(now).expect("open");
            periods.push(remaining);
            now += remaining;
            let (epoch, probe) = admit(&mut breaker, now);
            assert!(probe);
            assert_eq!(
                breaker.record(epoch, probe, FAIL, now, 0.5),
                Some(BreakerState::Open)
            );
        }
        let secs: Vec<u64> = periods.iter().map(Duration::as_secs).collect();
        assert_eq!(
            secs,
            vec![1, 2, 4, 8, 8, 8],
            "doubling, capped at maxOpenFor"
        );
    }

    #[test]
    fn jitter_stays_within_bounds() {
        let now = Instant::now();
        let breaker = Breaker::new(&config(), now);
        assert_eq!(
            breaker.open_period(0.0),
            Duration::from_secs(1),
            "never below openFor"
        );
        assert_eq!(breaker.open_period(0.99).as_millis(), 1098);
    }

    #[test]
    fn stale_and_cancelled_outcomes_count_for_nothing() {
        let start = Instant::now();
        let mut breaker = Breaker::new(&config(), start);
        let (slow_epoch, _) = admit(&mut breaker, start);
        run(&mut breaker, 10, FAIL, start);
        let later = start + Duration::from_secs(2);
        let (probe_epoch, probe) = admit(&mut breaker, later);
        // The slow request from before the opening succeeds now: no effect.
        assert_eq!(
            breaker.record(slow_epoch, false, Verdict::Success, later, 0.5),
            None
        );
        assert_eq!(breaker.state(), BreakerState::HalfOpen);
        // A cancelled probe frees its place without judging the app.
        assert_eq!(
            breaker.record(probe_epoch, probe, Verdict::Cancelled, later, 0.5),
            None
        );
        assert_eq!(breaker.probes_admitted(), 0);
        assert_eq!(breaker.state(), BreakerState::HalfOpen);
    }
}
