//! A panic is a bug, never the end of the process: it is caught at the
//! boundary of the task it happened in, counted
//! (`kubegrace_operator_panics_total{task}`), logged with what the task was
//! doing, and the task answers, retries or restarts:
//!
//! - a reconcile: the route gets a `Degraded` condition and the controller
//!   retries it with its error policy ([`crate::controller`]);
//! - a webhook review: the API server gets a well-formed answer with the
//!   request's uid ([`crate::server`]);
//! - a background task (a controller, the certificate loop): restarted with a
//!   backoff ([`supervise`]).
//!
//! This needs unwinding: the release profile sets no `panic = "abort"`
//! (checked when this was written), and the workspace `Cargo.toml` says
//! why it must stay so.

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures_util::FutureExt;

use crate::admin::Metrics;

/// The panic's message, when it has one (`panic!("...")` payloads are a
/// `&str` or a `String`).
pub fn message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_string()
    }
}

/// Runs `fut`; a panic inside it becomes `Err(message)`.
///
/// `AssertUnwindSafe` is sound here: what a panicking task shares with the
/// others is behind locks that tolerate poisoning (the metrics, the drain
/// inbox) or is the API server's state, which a retry reads afresh.
pub async fn catch<F: Future>(fut: F) -> Result<F::Output, String> {
    AssertUnwindSafe(fut)
        .catch_unwind()
        .await
        .map_err(|p| message(p.as_ref()))
}

/// First and last wait before a panicked background task starts again.
const RESTART_BACKOFF: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(60));

/// Runs the task `make` builds until it returns; when it panics, counts and
/// logs it and builds it again after a backoff (doubling, at most a minute),
/// unless `stop` resolved meanwhile. `stop` builds a future that resolves
/// when the task should not start again (shutdown, lost leadership).
pub async fn supervise<F, Fut, S, SFut>(task: &str, metrics: &Metrics, mut make: F, stop: S)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
    S: Fn() -> SFut,
    SFut: Future<Output = ()>,
{
    let mut backoff = RESTART_BACKOFF.0;
    loop {
        let Err(msg) = catch(make()).await else {
            return;
        };
        metrics.panicked("background");
        tracing::error!(task, panic = %msg, restart_in = ?backoff, "task panicked; restarting it");
        tokio::select! {
            () = tokio::time::sleep(backoff) => {}
            () = stop() => return,
        }
        backoff = (backoff * 2).min(RESTART_BACKOFF.1);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    #[tokio::test]
    async fn a_panic_is_caught_and_its_message_kept() {
        let out = catch(async { panic!("boom {}", 42) }).await;
        assert_eq!(out, Err::<(), _>("boom 42".to_string()));
        assert_eq!(catch(async { 7 }).await, Ok(7));
    }

    /// Supervises a task that panics on runs below `panics` (counted from
    /// 0), until it returns or `stop` resolves: how many runs there were,
    /// and the metrics.
    async fn supervised<S, SFut>(panics: u32, stop: S) -> (u32, Metrics)
    where
        S: Fn() -> SFut,
        SFut: Future<Output = ()>,
    {
        let metrics = Metrics::default();
        let runs = AtomicU32::new(0);
        let task = || {
            let n = runs.fetch_add(1, Ordering::Relaxed);
            async move { assert!(n >= panics, "run {n} panics") }
        };
        supervise("test", &metrics, task, stop).await;
        (runs.load(Ordering::Relaxed), metrics)
    }

    #[tokio::test(start_paused = true)]
    async fn a_panicking_background_task_is_counted_and_started_again() {
        let (runs, metrics) = supervised(2, std::future::pending).await;
        assert_eq!(runs, 3);
        assert!(
            metrics
                .render()
                .contains("kubegrace_operator_panics_total{task=\"background\"} 2"),
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_task_that_should_stop_is_not_started_again() {
        let (runs, _) = supervised(u32::MAX, || async {}).await;
        assert_eq!(runs, 1);
    }
}
