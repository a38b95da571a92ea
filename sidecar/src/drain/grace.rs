//! The grace phase (`Draining`): the evidence that the routers have moved
//! on. A new connection restarts the `quiet` clock ([`Drain::connection`]),
//! the operator reports the endpoint removed, or `maxDelay` ends it anyway.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use super::{Drain, GraceEnd, deadline};

impl Drain {
    /// The operator saw the pod's endpoint leave the EndpointSlice: traffic
    /// has moved, so `Draining` may end as soon as `minDelay` passed.
    pub fn endpoint_removed(&self) {
        self.machine.endpoint_removed.store(true, Ordering::Release);
        self.machine.endpoint_removed_notify.notify_waiters();
    }

    /// The grace phase: returns once the evidence (or the ceiling) says the
    /// routers have moved on. Re-plans whenever timers are reloaded.
    pub(super) async fn grace(&self, t0: Instant) -> GraceEnd {
        if self.machine.close_at_once.load(Ordering::Acquire) {
            return GraceEnd::AppDown;
        }
        let mut timers_rx = self.machine.timers_tx.subscribe();
        loop {
            // Armed before the flag is read, so a removal between the two
            // still wakes us.
            let removed = self.machine.endpoint_removed_notify.notified();
            tokio::pin!(removed);
            removed.as_mut().enable();
            let timers = *timers_rx.borrow_and_update();
            let now = Instant::now();
            let min_at = deadline(t0, timers.min_delay.get());
            let max_at = deadline(t0, timers.max_delay.get());
            if now >= max_at {
                return GraceEnd::MaxDelay;
            }
            let next = if now >= min_at {
                if self.machine.endpoint_removed.load(Ordering::Acquire) {
                    return GraceEnd::EndpointRemoved;
                }
                let last_conn = deadline(
                    self.machine.epoch,
                    Duration::from_millis(self.machine.last_conn_ms.load(Ordering::Relaxed)),
                );
                let quiet_at = deadline(last_conn, timers.quiet.get());
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::task::JoinHandle;

    use super::super::testing::{started, timers, wait_phase};
    use super::super::{Drain, GraceEnd, Phase};

    /// A router that still sends: a new connection every `every`.
    fn new_connections_every(drain: &Drain, every: Duration, count: usize) -> JoinHandle<()> {
        let drain = drain.clone();
        tokio::spawn(async move {
            for _ in 0..count {
                drop(drain.connection());
                tokio::time::sleep(every).await;
            }
        })
    }

    #[tokio::test(start_paused = true)]
    async fn idle_pod_drains_after_min_delay_when_quiet() {
        let (drain, mut rx, t0) = started(timers(2000, 1000, 15000, 30000));
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
        let (drain, mut rx, t0) = started(timers(1000, 500, 3000, 30000));
        let feeder = new_connections_every(&drain, Duration::from_millis(300), 20);
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
        let (drain, mut rx, t0) = started(timers(1000, 500, 10000, 30000));
        // Before minDelay: quiet then counts from this connection.
        tokio::time::sleep(Duration::from_millis(800)).await;
        drop(drain.connection());
        let closing = wait_phase(&mut rx, Phase::Closing).await;
        assert_eq!(closing - t0, Duration::from_millis(1300));
        assert_eq!(drain.drained().await.connections, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn endpoint_removal_ends_grace_after_min_delay() {
        let (drain, mut rx, t0) = started(timers(1000, 500, 10000, 30000));
        let feeder = new_connections_every(&drain, Duration::from_millis(100), 100);
        tokio::time::sleep(Duration::from_millis(300)).await;
        drain.endpoint_removed();
        let closing = wait_phase(&mut rx, Phase::Closing).await;
        assert_eq!(closing - t0, Duration::from_secs(1), "minDelay still holds");
        assert_eq!(drain.drained().await.grace_end, GraceEnd::EndpointRemoved);
        feeder.abort();
    }

    /// `RestartAllContainers`: SIGTERM while serving, the app already down.
    /// Only that closes at once; a preStop drain, or an app that is up, keep
    /// the whole grace phase.
    #[tokio::test(start_paused = true)]
    async fn an_exit_drain_that_finds_the_app_down_closes_at_once() {
        let t = timers(2000, 1000, 15000, 30000);
        let drain = super::super::testing::running(t);
        let mut rx = drain.subscribe();
        drain.app_reachable(false);
        let t0 = tokio::time::Instant::now();
        drain.trigger_exit("SIGTERM");
        let closing = wait_phase(&mut rx, Phase::Closing).await;
        assert_eq!(closing - t0, Duration::ZERO);
        assert_eq!(drain.drained().await.grace_end, GraceEnd::AppDown);

        // The app was down but came back before the SIGTERM.
        let drain = super::super::testing::running(t);
        let mut rx = drain.subscribe();
        drain.app_reachable(false);
        drain.app_reachable(true);
        let t0 = tokio::time::Instant::now();
        drain.trigger_exit("SIGTERM");
        let closing = wait_phase(&mut rx, Phase::Closing).await;
        assert_eq!(closing - t0, Duration::from_secs(2));
        assert_eq!(drain.drained().await.grace_end, GraceEnd::Quiet);

        // A preStop drain with the app down (a liveness restart under way),
        // then SIGTERM: the pod's end, the grace phase as usual.
        let (drain, mut rx, t0) = started(t);
        drain.app_reachable(false);
        drain.trigger_exit("SIGTERM");
        let closing = wait_phase(&mut rx, Phase::Closing).await;
        assert_eq!(closing - t0, Duration::from_secs(2));
    }

    #[tokio::test(start_paused = true)]
    async fn reloaded_timers_apply_to_a_drain_under_way() {
        let (drain, mut rx, t0) = started(timers(10000, 1000, 20000, 30000));
        tokio::time::sleep(Duration::from_secs(1)).await;
        drain.set_timers(timers(2000, 500, 5000, 30000));
        let closing = wait_phase(&mut rx, Phase::Closing).await;
        assert_eq!(closing - t0, Duration::from_secs(2));
        drain.drained().await;
    }
}
