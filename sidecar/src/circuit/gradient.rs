//! Adaptive concurrency: find how many requests the app can take at once
//! from the latency it shows, the way Envoy's adaptive concurrency filter
//! does (gradient against a measured minimum round-trip time).
//!
//! - The baseline (`minRtt`) is measured, not guessed: for a short probe
//!   the limit drops to `minConcurrent`, so the app has no queue, and the
//!   median latency of requests admitted during the probe is the app's own
//!   service time. The probe runs every [`PROBE_EVERY`] (jittered),
//!   because the app's service time can drift.
//! - A freshly started route does not probe at once: a new pod gets its
//!   first traffic during a rolling update, exactly when shedding would
//!   hurt most. It warms up unlimited (up to `maxConcurrent`) and takes the
//!   low decile of its first latencies as the baseline, which is right
//!   unless the app is already overloaded then; the first real probe,
//!   [`FIRST_PROBE_AFTER`] later, corrects it either way.
//! - Between probes, every [`UPDATE_EVERY`] the median latency of the
//!   requests that finished is compared with the baseline:
//!   `gradient = minRtt * (1 + BUFFER) / sampleRtt`, kept in [0.5, 2].
//!   Latency above the baseline (the app is queueing) shrinks the limit,
//!   latency at the baseline lets it grow:
//!   `limit = limit * gradient + sqrt(limit * gradient)`, the square root
//!   being the headroom that lets the limit discover new capacity.
//! - The limit does not grow while fewer than half its slots are used: an
//!   idle route says nothing about how much more the app could take.
//!
//! Why not a moving-average baseline (Netflix Gradient2)? Under sustained
//! overload the average drifts up to the queued latency and the limit
//! creeps up with it; a measured minimum does not drift.
//!
//! Pure: time, latency and jitter come in as arguments.

use std::time::Duration;

use tokio::time::Instant;

/// How often the limit is recalculated.
pub(crate) const UPDATE_EVERY: Duration = Duration::from_millis(100);
/// How often the baseline is measured again.
pub(crate) const PROBE_EVERY: Duration = Duration::from_secs(30);
/// When the first real probe follows the warm-up estimate.
pub(crate) const FIRST_PROBE_AFTER: Duration = Duration::from_secs(10);
/// Latency this much above the baseline is still "not queueing".
const BUFFER: f64 = 0.25;
/// Samples that make a probe's median trustworthy.
const PROBE_SAMPLES: usize = 25;
/// A probe on a quiet route ends after this with whatever it has.
const PROBE_LONGEST: Duration = Duration::from_secs(2);
/// A recalculation waits for this many samples, or for [`SPARSE_UPDATE`].
const UPDATE_SAMPLES: usize = 3;
const SPARSE_UPDATE: Duration = Duration::from_secs(1);
/// Samples kept per recalculation; beyond it later samples are dropped
/// (the median of the first thousand is as good as that of all).
const MAX_SAMPLES: usize = 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Estimating the baseline from the first requests, unlimited.
    Warmup,
    /// Measuring the baseline at `minConcurrent`.
    Probing,
    /// Following the gradient.
    Tracking,
}

#[derive(Debug)]
pub(crate) struct GradientLimit {
    min_limit: f64,
    max_limit: f64,
    limit: f64,
    phase: Phase,
    phase_started: Instant,
    min_rtt: Option<Duration>,
    last_sample_rtt: Option<Duration>,
    samples: Vec<Duration>,
    samples_since: Instant,
    peak_inflight: u32,
    next_probe_at: Instant,
}

impl GradientLimit {
    /// Starts warming up at `maxConcurrent`.
    pub(crate) fn new(min_limit: u32, max_limit: u32, now: Instant) -> Self {
        let min_limit = f64::from(min_limit.max(1));
        let max_limit = f64::from(max_limit).max(min_limit);
        Self {
            min_limit,
            max_limit,
            limit: max_limit,
            phase: Phase::Warmup,
            phase_started: now,
            min_rtt: None,
            last_sample_rtt: None,
            samples: Vec::with_capacity(PROBE_SAMPLES),
            samples_since: now,
            peak_inflight: 0,
            next_probe_at: now + PROBE_EVERY,
        }
    }

    /// The limit in whole slots.
    pub(crate) fn limit(&self) -> u32 {
        self.limit.round() as u32
    }

    pub(crate) fn phase(&self) -> Phase {
        self.phase
    }

    pub(crate) fn min_rtt(&self) -> Option<Duration> {
        self.min_rtt
    }

    pub(crate) fn last_sample_rtt(&self) -> Option<Duration> {
        self.last_sample_rtt
    }

    /// Feeds the latency of one request admitted at `admitted_at` that
    /// finished at `now` with `inflight` requests running. `jitter` is
    /// uniform in [0, 1). Returns the new limit when it changed.
    pub(crate) fn sample(
        &mut self,
        rtt: Duration,
        admitted_at: Instant,
        inflight: u32,
        now: Instant,
        jitter: f64,
    ) -> Option<u32> {
        let before = self.limit();
        match self.phase {
            Phase::Warmup => {
                if self.samples.len() < MAX_SAMPLES {
                    self.samples.push(rtt);
                }
                self.peak_inflight = self.peak_inflight.max(inflight);
                let long_enough =
                    now.saturating_duration_since(self.phase_started) >= PROBE_LONGEST;
                if self.samples.len() >= PROBE_SAMPLES || (long_enough && !self.samples.is_empty())
                {
                    self.min_rtt = low_decile(&mut self.samples);
                    self.last_sample_rtt = self.min_rtt;
                    // What the app demonstrably took, with room to grow.
                    self.limit =
                        (2.0 * f64::from(self.peak_inflight)).clamp(self.min_limit, self.max_limit);
                    self.start_tracking(now, FIRST_PROBE_AFTER);
                }
            }
            Phase::Probing => {
                // Requests admitted before the probe ran against the old,
                // higher limit and may have queued inside the app.
                if admitted_at >= self.phase_started && self.samples.len() < MAX_SAMPLES {
                    self.samples.push(rtt);
                }
                let long_enough =
                    now.saturating_duration_since(self.phase_started) >= PROBE_LONGEST;
                if self.samples.len() >= PROBE_SAMPLES || (long_enough && !self.samples.is_empty())
                {
                    self.min_rtt = median(&mut self.samples);
                    self.last_sample_rtt = self.min_rtt;
                    let next = PROBE_EVERY.mul_f64(0.85 + 0.3 * jitter.clamp(0.0, 1.0));
                    self.start_tracking(now, next);
                }
            }
            Phase::Tracking => {
                if self.samples.len() < MAX_SAMPLES {
                    self.samples.push(rtt);
                }
                self.peak_inflight = self.peak_inflight.max(inflight);
                let elapsed = now.saturating_duration_since(self.samples_since);
                if elapsed >= UPDATE_EVERY
                    && (self.samples.len() >= UPDATE_SAMPLES || elapsed >= SPARSE_UPDATE)
                {
                    self.update();
                    self.samples.clear();
                    self.samples_since = now;
                    self.peak_inflight = 0;
                }
                if now >= self.next_probe_at {
                    self.start_probe(now);
                }
            }
        }
        let after = self.limit();
        (after != before).then_some(after)
    }

    fn update(&mut self) {
        let (Some(min_rtt), Some(sample_rtt)) = (self.min_rtt, median(&mut self.samples)) else {
            return;
        };
        self.last_sample_rtt = Some(sample_rtt);
        let sample_secs = sample_rtt.as_secs_f64().max(1e-6);
        let gradient = (min_rtt.as_secs_f64() * (1.0 + BUFFER) / sample_secs).clamp(0.5, 2.0);
        let app_limited = f64::from(self.peak_inflight) < self.limit / 2.0;
        if gradient >= 1.0 && app_limited {
            return;
        }
        let scaled = self.limit * gradient;
        self.limit = (scaled + scaled.sqrt()).clamp(self.min_limit, self.max_limit);
    }

    fn start_tracking(&mut self, now: Instant, next_probe_in: Duration) {
        self.phase = Phase::Tracking;
        self.phase_started = now;
        self.samples.clear();
        self.samples_since = now;
        self.peak_inflight = 0;
        self.next_probe_at = now + next_probe_in;
    }

    fn start_probe(&mut self, now: Instant) {
        self.phase = Phase::Probing;
        self.phase_started = now;
        self.samples.clear();
        self.limit = self.min_limit;
    }
}

fn median(samples: &mut [Duration]) -> Option<Duration> {
    quantile(samples, 0.5)
}

/// Robust to a lucky outlier, unlike the minimum.
fn low_decile(samples: &mut [Duration]) -> Option<Duration> {
    quantile(samples, 0.1)
}

fn quantile(samples: &mut [Duration], q: f64) -> Option<Duration> {
    if samples.is_empty() {
        return None;
    }
    let index = ((samples.len() - 1) as f64 * q).round() as usize;
    let (_, value, _) = samples.select_nth_unstable(index.min(samples.len() - 1));
    Some(*value)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A simulated app: `capacity` requests served at once in `service`
    /// each; beyond capacity requests wait their turn, so with `limit`
    /// requests offered the latency is service * limit / capacity.
    fn app_latency(limit: u32, capacity: u32, service: Duration) -> Duration {
        if limit <= capacity {
            service
        } else {
            service.mul_f64(f64::from(limit) / f64::from(capacity))
        }
    }

    /// Drives the controller for `duration` under saturating load and
    /// returns the limit at the end.
    fn drive(
        limiter: &mut GradientLimit,
        now: &mut Instant,
        duration: Duration,
        capacity: u32,
    ) -> u32 {
        let service = Duration::from_millis(20);
        let end = *now + duration;
        while *now < end {
            let limit = limiter.limit();
            let latency = app_latency(limit, capacity, service);
            // Every slot completes one request per latency period; a batch
            // admitted now finishes one step later.
            let admitted = *now;
            *now += latency.min(UPDATE_EVERY);
            for _ in 0..limit.min(50) {
                limiter.sample(latency, admitted, limit, *now, 0.5);
            }
        }
        limiter.limit()
    }

    #[test]
    fn a_new_route_warms_up_unlimited_and_estimates_the_baseline() {
        let mut now = Instant::now();
        let mut limiter = GradientLimit::new(2, 500, now);
        assert_eq!(limiter.phase(), Phase::Warmup);
        assert_eq!(limiter.limit(), 500, "no shedding while a new pod warms up");
        for i in 0..PROBE_SAMPLES {
            now += Duration::from_millis(2);
            // Mostly 20ms, a few slower: the low decile ignores the tail.
            let rtt = Duration::from_millis(if i % 5 == 0 { 60 } else { 20 });
            limiter.sample(rtt, now - rtt, 10, now, 0.5);
        }
        assert_eq!(limiter.phase(), Phase::Tracking);
        assert_eq!(limiter.min_rtt(), Some(Duration::from_millis(20)));
        assert_eq!(limiter.limit(), 20, "twice the concurrency seen");
    }

    #[test]
    fn an_overloaded_start_is_corrected_by_the_first_probe() {
        let mut now = Instant::now();
        let mut limiter = GradientLimit::new(2, 500, now);
        // Saturating from the first request: the warm-up sees queueing.
        drive(&mut limiter, &mut now, FIRST_PROBE_AFTER / 2, 40);
        assert!(
            limiter.min_rtt() > Some(Duration::from_millis(100)),
            "an overestimate"
        );
        let limit = drive(&mut limiter, &mut now, FIRST_PROBE_AFTER, 40);
        assert_eq!(
            limiter.min_rtt(),
            Some(Duration::from_millis(20)),
            "the probe measured it"
        );
        assert!(
            (40..=70).contains(&limit),
            "limit {limit} should settle a little above capacity 40"
        );
    }

    #[test]
    fn the_limit_follows_when_capacity_halves() {
        let mut now = Instant::now();
        let mut limiter = GradientLimit::new(2, 500, now);
        let before = drive(&mut limiter, &mut now, FIRST_PROBE_AFTER * 2, 40);
        let after = drive(&mut limiter, &mut now, Duration::from_secs(3), 20);
        assert!(
            (20..=36).contains(&after),
            "limit went {before} -> {after}, capacity is now 20"
        );
    }

    #[test]
    fn an_idle_route_does_not_grow_its_limit() {
        let mut now = Instant::now();
        let mut limiter = GradientLimit::new(4, 500, now);
        for _ in 0..PROBE_SAMPLES {
            limiter.sample(Duration::from_millis(10), now, 1, now, 0.5);
        }
        assert_eq!(limiter.phase(), Phase::Tracking);
        for _ in 0..100 {
            now += Duration::from_millis(50);
            limiter.sample(Duration::from_millis(10), now, 1, now, 0.5);
        }
        assert_eq!(
            limiter.limit(),
            4,
            "one request in flight says nothing about capacity"
        );
    }

    #[test]
    fn the_baseline_is_measured_again_periodically() {
        let mut now = Instant::now();
        let mut limiter = GradientLimit::new(2, 500, now);
        drive(
            &mut limiter,
            &mut now,
            FIRST_PROBE_AFTER + PROBE_EVERY + Duration::from_secs(5),
            40,
        );
        // By now a second probe ran (and has finished under this load).
        assert!(limiter.next_probe_at > now, "a later probe is scheduled");
        assert_eq!(limiter.min_rtt(), Some(Duration::from_millis(20)));
    }
}
