//! The way back from a provisional drain: a container restart, told from
//! the end of the pod by the app going away and coming back (see the
//! module doc of [`super`]).

use std::sync::PoisonError;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{Drain, DrainState, Phase};

impl Drain {
    /// Evidence from `app.rs`: a connect to the app was refused (or timed
    /// out). Only counts while a drain is under way.
    pub fn app_gone(&self) {
        if self.phase() != Phase::Serving && !self.machine.app_gone.swap(true, Ordering::AcqRel) {
            if let Some(journal) = self.machine.journal.get() {
                journal.update(|e| e.app_gone = true);
            }
            tracing::info!(phase = %self.phase(), "drain: the app is gone; if it comes back without a SIGTERM, this was a container restart and the sidecar resumes");
        }
    }

    /// Whether the app was seen gone since this drain's trigger. It stays
    /// set until the cycle ends (a resume clears it), so a `stayServing`
    /// drain never turns ready again on an app that flaps mid-drain.
    pub fn app_seen_gone(&self) -> bool {
        self.phase() != Phase::Serving && self.machine.app_gone.load(Ordering::Acquire)
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
            || !self.machine.app_gone.load(Ordering::Acquire)
        {
            return false;
        }
        let (trigger, drained_for) = cycle.trigger.take().map_or_else(
            || ("unknown".to_string(), Duration::ZERO),
            |(reason, at)| (reason, at.elapsed()),
        );
        cycle.id += 1;
        cycle.deadline = None;
        if let Some(journal) = self.machine.journal.get() {
            journal.clear();
        }
        self.machine.app_gone.store(false, Ordering::Release);
        self.machine
            .endpoint_removed
            .store(false, Ordering::Release);
        *self
            .machine
            .report
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = None;
        self.machine
            .phase
            .store(Phase::Serving as u8, Ordering::Release);
        self.machine.tx.send_replace(DrainState {
            phase: Phase::Serving,
            force_close: false,
            exit: false,
        });
        let total = self
            .machine
            .resumes
            .fetch_add(1, Ordering::Relaxed)
            .saturating_add(1);
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
        self.machine.resumes.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::Instant;

    use super::super::testing::{running, timers};
    use super::super::{Drain, ExitTrigger, Phase};

    #[tokio::test(start_paused = true)]
    async fn a_provisional_drain_resumes_once_the_app_was_gone_and_is_back() {
        let drain = running(timers(100, 50, 1000, 1000));
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
        let drain = running(timers(100, 50, 1000, 1000));
        drain.app_gone(); // while serving: not evidence
        drain.trigger("admin /drain");
        drain.drained().await;
        assert!(!drain.resume("back"));
        assert_eq!(drain.phase(), Phase::Drained);
    }

    #[tokio::test(start_paused = true)]
    async fn sigterm_always_wins() {
        // SIGTERM first: the app going and coming back changes nothing.
        let drain = running(timers(100, 50, 1000, 1000));
        assert_eq!(drain.trigger_exit("SIGTERM"), ExitTrigger::Started);
        assert!(drain.subscribe().borrow().exit);
        drain.app_gone();
        assert!(!drain.resume("back"));
        drain.drained().await;
        assert!(!drain.resume("back"));
        assert_eq!(drain.phase(), Phase::Drained);

        // SIGTERM after a provisional drain: that drain can no longer resume.
        let drain = running(timers(100, 50, 1000, 1000));
        drain.trigger("admin /drain");
        drain.app_gone();
        assert_eq!(
            drain.trigger_exit("SIGTERM"),
            ExitTrigger::Joined,
            "joins the drain under way"
        );
        assert!(drain.is_exit());
        assert_eq!(drain.trigger_exit("SIGINT"), ExitTrigger::Repeated);
        assert!(!drain.resume("back"));
        drain.drained().await;
        assert_eq!(drain.phase(), Phase::Drained);
    }

    #[tokio::test(start_paused = true)]
    async fn a_resume_mid_grace_ends_that_cycle_for_good() {
        let drain = running(timers(1000, 500, 5000, 5000));
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

    /// What a sidecar restarted mid-drain left in its journal: a drain
    /// triggered `ago` with `timers`.
    fn journal_entry(
        exit: bool,
        ago: Duration,
        timers: &crate::config::DrainConfig,
    ) -> super::super::JournalEntry {
        let then = std::time::SystemTime::now() - ago;
        super::super::JournalEntry::new("SIGTERM", exit, then, timers)
    }

    #[tokio::test(start_paused = true)]
    async fn a_drain_carried_on_after_a_restart_closes_by_its_first_deadline() {
        // Deadline: 10 s + 20 s + 5 s after a trigger 30 s ago: 5 s left,
        // where drain.timeout alone would wait 20.
        let t = timers(1000, 0, 10_000, 20_000);
        let entry = journal_entry(true, Duration::from_secs(30), &t);
        let drain = Drain::new(t);
        let mut stuck = drain.connection();
        tokio::spawn(drain.clone().run());
        let t0 = Instant::now();
        assert!(drain.resume_after_restart(&entry));
        assert!(drain.is_exit());
        assert_ne!(drain.phase(), Phase::Serving);
        let mut rx = drain.subscribe();
        rx.wait_for(|s| s.force_close).await.expect("drain alive");
        let waited = Instant::now() - t0;
        assert!(
            waited > Duration::from_secs(4) && waited <= Duration::from_secs(5),
            "{waited:?}"
        );
        stuck.mark_forced();
        drop(stuck);
        let report = drain.drained().await;
        assert!(
            report
                .trigger
                .contains("carried on after a sidecar restart"),
            "{}",
            report.trigger
        );
        // A second carry-on (or trigger) changes nothing.
        assert!(!drain.resume_after_restart(&entry));
    }

    #[tokio::test(start_paused = true)]
    async fn a_carried_on_drain_keeps_the_app_gone_evidence_it_had() {
        let t = timers(0, 0, 0, 1000);
        let mut gone = journal_entry(false, Duration::from_secs(1), &t);
        gone.app_gone = true;
        let drain = running(t);
        assert!(drain.resume_after_restart(&gone));
        drain.drained().await;
        assert!(drain.resume("the app is reachable again"));
        assert_eq!(drain.phase(), Phase::Serving);

        let not_gone = journal_entry(false, Duration::from_secs(1), &t);
        let drain = running(t);
        assert!(drain.resume_after_restart(&not_gone));
        drain.drained().await;
        assert!(
            !drain.resume("the app is reachable"),
            "no evidence: stays drained"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_journal_past_its_deadline_is_not_carried_on() {
        let t = timers(0, 0, 1000, 1000);
        let stale = journal_entry(true, Duration::from_secs(8), &t);
        let drain = Drain::new(t);
        assert!(!drain.resume_after_restart(&stale));
        assert_eq!(drain.phase(), Phase::Serving);
        assert!(!drain.is_exit());
    }
}
