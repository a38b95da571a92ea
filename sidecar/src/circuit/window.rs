//! A rolling count of requests and failures over a time window, kept in a
//! ring of buckets so old evidence ages out in steps of `window / BUCKETS`
//! instead of all at once (a fixed window forgets everything at its edge).

use std::time::Duration;

use tokio::time::Instant;

/// Ten buckets: the window slides in 10% steps, precise enough for a
/// ratio threshold and small enough to sum on every recorded outcome.
const BUCKETS: usize = 10;

#[derive(Debug, Clone, Copy, Default)]
struct Bucket {
    /// Which bucket-width tick since `origin` this bucket holds; a bucket
    /// holding an older tick is stale and counts as empty.
    tick: u64,
    requests: u32,
    failures: u32,
}

#[derive(Debug, Clone)]
pub(crate) struct RollingWindow {
    origin: Instant,
    bucket_width: Duration,
    buckets: [Bucket; BUCKETS],
}

/// What the window holds right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct WindowTotals {
    pub(crate) requests: u32,
    pub(crate) failures: u32,
}

impl WindowTotals {
    pub(crate) fn error_ratio(&self) -> f64 {
        if self.requests == 0 {
            0.0
        } else {
            f64::from(self.failures) / f64::from(self.requests)
        }
    }
}

impl RollingWindow {
    pub(crate) fn new(window: Duration, now: Instant) -> Self {
        // A zero window (errorRatio off) still needs a non-zero width.
        let bucket_width = (window / BUCKETS as u32).max(Duration::from_millis(1));
        Self {
            origin: now,
            bucket_width,
            buckets: [Bucket::default(); BUCKETS],
        }
    }

    fn tick(&self, now: Instant) -> u64 {
        let elapsed = now.saturating_duration_since(self.origin);
        u64::try_from(elapsed.as_nanos() / self.bucket_width.as_nanos()).unwrap_or(u64::MAX)
    }

    pub(crate) fn record(&mut self, failed: bool, now: Instant) {
        let tick = self.tick(now);
        let bucket = &mut self.buckets[(tick % BUCKETS as u64) as usize];
        if bucket.tick != tick {
            *bucket = Bucket {
                tick,
                requests: 0,
                failures: 0,
            };
        }
        bucket.requests = bucket.requests.saturating_add(1);
        if failed {
            bucket.failures = bucket.failures.saturating_add(1);
        }
    }

    pub(crate) fn totals(&self, now: Instant) -> WindowTotals {
        let tick = self.tick(now);
        let oldest = tick.saturating_sub(BUCKETS as u64 - 1);
        self.buckets
            .iter()
            .filter(|bucket| bucket.tick >= oldest && bucket.tick <= tick && bucket.requests > 0)
            .fold(WindowTotals::default(), |sum, bucket| WindowTotals {
                requests: sum.requests.saturating_add(bucket.requests),
                failures: sum.failures.saturating_add(bucket.failures),
            })
    }

    pub(crate) fn clear(&mut self) {
        self.buckets = [Bucket::default(); BUCKETS];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn old_evidence_ages_out_bucket_by_bucket() {
        let start = Instant::now();
        let mut window = RollingWindow::new(Duration::from_secs(10), start);
        for _ in 0..4 {
            window.record(true, start);
        }
        window.record(false, start + Duration::from_secs(5));
        let mid = window.totals(start + Duration::from_secs(5));
        assert_eq!(
            mid,
            WindowTotals {
                requests: 5,
                failures: 4
            }
        );
        assert!((mid.error_ratio() - 0.8).abs() < 1e-9);
        // Ten seconds after the first failures they are gone; the success at 5s stays.
        let later = window.totals(start + Duration::from_secs(10));
        assert_eq!(
            later,
            WindowTotals {
                requests: 1,
                failures: 0
            }
        );
        assert_eq!(
            window.totals(start + Duration::from_secs(30)),
            WindowTotals::default()
        );
    }

    #[test]
    fn a_reused_bucket_starts_empty() {
        let start = Instant::now();
        let mut window = RollingWindow::new(Duration::from_secs(1), start);
        window.record(true, start);
        window.record(false, start + Duration::from_secs(1));
        assert_eq!(
            window.totals(start + Duration::from_secs(1)),
            WindowTotals {
                requests: 1,
                failures: 0
            }
        );
        window.clear();
        assert_eq!(
            window.totals(start + Duration::from_secs(1)),
            WindowTotals::default()
        );
    }
}
