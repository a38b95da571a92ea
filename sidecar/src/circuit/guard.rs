//! One route's protection: the concurrency limiter (fixed or adaptive) and
//! the breaker, glued together with the route's counters.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::time::Instant;

use super::breaker::{Admission, Breaker, BreakerState};
use super::gradient::{GradientLimit, Phase};
use super::limiter::{Limiter, Slot};
use super::{Rejection, RouteStats, Verdict};
use crate::config::CircuitBreakerConfig;

pub(crate) struct Guard {
    /// For logs; a guard only ever serves routes of this name.
    route: Arc<str>,
    limiter: Arc<Limiter>,
    breaker: Mutex<Breaker>,
    /// Mirror of the breaker's state, so a closed breaker is checked
    /// without taking its lock.
    state: AtomicU8,
    adaptive: Option<Mutex<GradientLimit>>,
    stats: Arc<RouteStats>,
    max_queue: u32,
}

/// What an admitted request carries until its outcome is known.
pub(crate) struct GuardTicket {
    /// Held for the request's lifetime; dropping it frees the slot.
    _slot: Slot,
    epoch: u64,
    probe: bool,
    admitted_at: Instant,
    recorded: bool,
}

impl Guard {
    pub(crate) fn new(route: &str, config: &CircuitBreakerConfig, stats: Arc<RouteStats>) -> Self {
        let now = Instant::now();
        let adaptive = config
            .adaptive
            .then(|| GradientLimit::new(config.min_concurrent, config.max_concurrent, now));
        let initial_limit = adaptive
            .as_ref()
            .map_or(config.max_concurrent, GradientLimit::limit);
        Self {
            route: Arc::from(route),
            limiter: Arc::new(Limiter::new(
                initial_limit,
                config.max_queue,
                config.queue_timeout.get(),
            )),
            breaker: Mutex::new(Breaker::new(config, now)),
            state: AtomicU8::new(BreakerState::Closed as u8),
            adaptive: adaptive.map(Mutex::new),
            stats,
            max_queue: config.max_queue,
        }
    }

    fn breaker(&self) -> std::sync::MutexGuard<'_, Breaker> {
        // A panic while holding the lock cannot leave the breaker half
        // updated in a way worse than losing one outcome; keep serving.
        self.breaker.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) async fn admit(&self) -> Result<GuardTicket, Rejection> {
        if self.state() != BreakerState::Closed
            && let Err(retry_after) = self.breaker().precheck(Instant::now())
        {
            return Err(Rejection::BreakerOpen { retry_after });
        }
        let slot = self.limiter.acquire().await?;
        let now = Instant::now();
        let (admission, transition) = self.breaker().admit(now);
        self.note(transition);
        match admission {
            Admission::Admit { epoch, probe } => Ok(GuardTicket {
                _slot: slot,
                epoch,
                probe,
                admitted_at: now,
                recorded: false,
            }),
            // The breaker opened while this request was queued.
            Admission::Reject { retry_after } => Err(Rejection::BreakerOpen { retry_after }),
        }
    }

    /// Counts an outcome once per ticket; later calls are ignored.
    pub(crate) fn record(&self, ticket: &mut GuardTicket, verdict: Verdict) {
        if ticket.recorded {
            return;
        }
        ticket.recorded = true;
        let now = Instant::now();
        // Jitter only matters when the breaker opens or a probe is
        // scheduled; successes on a closed breaker skip the random source.
        let jitter: f64 = match verdict {
            Verdict::Failure { .. } => rand::random(),
            Verdict::Success if self.adaptive.is_some() => rand::random(),
            _ => 0.5,
        };
        let transition = self
            .breaker()
            .record(ticket.epoch, ticket.probe, verdict, now, jitter);
        self.note(transition);

        let latency_sample = match verdict {
            Verdict::Success => true,
            Verdict::Failure { latency_sample } => latency_sample,
            Verdict::Cancelled => false,
        };
        if let (Some(adaptive), true) = (&self.adaptive, latency_sample) {
            let rtt = now.saturating_duration_since(ticket.admitted_at);
            let inflight = self.limiter.in_use();
            let mut gradient = adaptive.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(limit) = gradient.sample(rtt, ticket.admitted_at, inflight, now, jitter) {
                self.limiter.set_limit(limit);
            }
        }
    }

    fn note(&self, transition: Option<BreakerState>) {
        let Some(to) = transition else { return };
        self.state.store(to as u8, Ordering::Release);
        let i = BreakerState::ALL.iter().position(|s| *s == to).unwrap_or(0);
        self.stats.transitions[i].fetch_add(1, Ordering::Relaxed);
        match to {
            BreakerState::Open => tracing::warn!(route = %self.route, "circuit breaker opened"),
            _ => {
                tracing::info!(route = %self.route, to = to.as_str(), "circuit breaker state changed")
            }
        }
    }

    /// The state the next request meets (an expired open period reads as
    /// half-open).
    pub(crate) fn current_state(&self) -> BreakerState {
        if self.state() == BreakerState::Closed {
            return BreakerState::Closed;
        }
        let mut breaker = self.breaker();
        let transition = breaker.refresh(Instant::now());
        let state = breaker.state();
        drop(breaker);
        self.note(transition);
        state
    }

    fn state(&self) -> BreakerState {
        BreakerState::from_u8(self.state.load(Ordering::Acquire))
    }

    pub(crate) fn limit(&self) -> u32 {
        self.limiter.limit()
    }

    pub(crate) fn queued(&self) -> u32 {
        self.limiter.queued()
    }

    pub(crate) fn snapshot(&self) -> serde_json::Value {
        let state = self.current_state();
        let now = Instant::now();
        let breaker = self.breaker();
        let totals = breaker.window_totals(now);
        let mut breaker_json = serde_json::json!({
            "state": state.as_str(),
            "inStateForMs": millis(breaker.in_state_for(now)),
            "consecutiveFailures": breaker.consecutive_failures(),
            "openStreak": breaker.open_streak(),
            "window": {
                "requests": totals.requests,
                "failures": totals.failures,
                "errorRatio": totals.error_ratio(),
            },
        });
        if let Some(remaining) = breaker.open_remaining(now) {
            breaker_json["openRemainingMs"] = millis(remaining).into();
        }
        if state == BreakerState::HalfOpen {
            breaker_json["probesInFlight"] = breaker.probes_admitted().into();
        }
        drop(breaker);

        let mut limiter_json = serde_json::json!({
            "limit": self.limiter.limit(),
            "inUse": self.limiter.in_use(),
            "queued": self.limiter.queued(),
            "maxQueue": self.max_queue,
            "adaptive": self.adaptive.is_some(),
        });
        if let Some(adaptive) = &self.adaptive {
            let gradient = adaptive.lock().unwrap_or_else(PoisonError::into_inner);
            limiter_json["phase"] = match gradient.phase() {
                Phase::Warmup => "warmup",
                Phase::Probing => "probing_min_rtt",
                Phase::Tracking => "tracking",
            }
            .into();
            limiter_json["minRttMs"] = gradient.min_rtt().map(millis_f64).into();
            limiter_json["sampleRttMs"] = gradient.last_sample_rtt().map(millis_f64).into();
        }
        serde_json::json!({ "breaker": breaker_json, "limiter": limiter_json })
    }
}

fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn millis_f64(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
