//! [`Progress`]: each step printed with the seconds elapsed, and the waits on conditions
//! with a deadline that every step is made of.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Result, bail};

/// How long a [`Progress::wait`] may last, and how often it looks.
#[derive(Clone, Copy, Debug)]
pub struct Patience {
    pub timeout: Duration,
    pub interval: Duration,
}

impl Patience {
    /// For the API server to show a change (an object created, deleted or given its
    /// status): a minute, looked at twice a second.
    pub const API_CHANGE: Patience =
        Patience::new(Duration::from_secs(60), Duration::from_millis(500));

    pub const fn new(timeout: Duration, interval: Duration) -> Patience {
        Patience { timeout, interval }
    }
}

/// Prints each step with the seconds since the scenario started.
#[derive(Clone, Debug)]
pub struct Progress {
    start: Instant,
}

impl Default for Progress {
    fn default() -> Self {
        Progress {
            start: Instant::now(),
        }
    }
}

impl Progress {
    pub fn step(&self, msg: impl std::fmt::Display) {
        eprintln!("[{:6.1}s] {msg}", self.start.elapsed().as_secs_f64());
    }

    /// Polls `probe` as often as `patience` says until it returns `Ok`, for as long as it
    /// says. `Err` carries what is still missing; it is printed when it changes, so a slow
    /// step shows why.
    pub async fn wait<T, Fut>(
        &self,
        what: &str,
        patience: Patience,
        mut probe: impl FnMut() -> Fut,
    ) -> Result<T>
    where
        Fut: std::future::Future<Output = std::result::Result<T, String>>,
    {
        let Patience { timeout, interval } = patience;
        self.step(format!(
            "waiting for {what} (at most {}s)",
            timeout.as_secs()
        ));
        let started = Instant::now();
        let mut last = String::new();
        let done = crate::poll_until(timeout, interval, &mut probe, |state| {
            if state != last {
                self.step(format!("  {what}: {state}"));
                last = state;
            }
        })
        .await;
        match done {
            Some(v) => {
                self.step(format!(
                    "  {what}: done after {:.1}s",
                    started.elapsed().as_secs_f64()
                ));
                Ok(v)
            }
            None => bail!("timed out after {timeout:?} waiting for {what}; last seen: {last}"),
        }
    }
}

/// Now, UNIX time in seconds.
pub(super) fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}
