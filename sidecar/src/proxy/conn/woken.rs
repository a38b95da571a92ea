//! [`PolledWhenWoken`]: the connection loop's drain watch, polled only
//! when it has news; [`WakeGate`], the same for a part of a task that is
//! not a future of its own.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

pin_project_lite::pin_project! {
    /// A future polled only when it asked to be: its waker is a flag that
    /// wakes the task. `select!` polls every branch on every wake of the
    /// connection's task, two or more per request, and a waiting watch
    /// `changed()` locks the channel's waiter list on each poll to refresh
    /// its waker: a lock and unlock per wake, 0.3-0.4% of a keep-alive
    /// request's CPU (bench/README.md, "seventh pass"). Between its own
    /// wakes a future has nothing new to say (the `Future` contract), so
    /// skipping those polls is exact whatever the inner future does,
    /// spurious wakes and tokio's budget (which wakes the waker it was
    /// given) included. Checking the channel's version instead is not: a
    /// wake-up left over from the change just handled can use up the
    /// registration, and the force close was then missed.
    pub(super) struct PolledWhenWoken<F> {
        gate: WakeGate,
        #[pin]
        inner: F,
    }
}

/// The flag behind [`PolledWhenWoken`], for a part of a task that is not a
/// future of its own (the HTTP/2 connection beside its streams, in
/// `http2/conn.rs`): poll the part with [`WakeGate::waker`] only when
/// [`WakeGate::take_wake`] says it was woken, and [`WakeGate::open`] it for
/// news that reaches it by another way than its waker.
pub(crate) struct WakeGate {
    flag: Arc<WokenFlag>,
    inner_waker: std::task::Waker,
    // The task waker the flag forwards to, to notice a new one.
    task_waker: Option<std::task::Waker>,
}

struct WokenFlag {
    woken: AtomicBool,
    task: std::sync::Mutex<Option<std::task::Waker>>,
}

impl std::task::Wake for WokenFlag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        let task = self
            .task
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        if let Some(task) = task {
            task.wake();
        }
    }
}

impl WakeGate {
    pub(crate) fn new() -> Self {
        let flag = Arc::new(WokenFlag {
            // The first poll always reaches the part.
            woken: AtomicBool::new(true),
            task: std::sync::Mutex::new(None),
        });
        WakeGate {
            inner_waker: std::task::Waker::from(flag.clone()),
            flag,
            task_waker: None,
        }
    }

    /// Whether the part was woken (or opened) since it was last let
    /// through, clearing that; a wake from now on wakes `cx`'s task.
    pub(crate) fn take_wake(&mut self, cx: &Context<'_>) -> bool {
        if !self
            .task_waker
            .as_ref()
            .is_some_and(|w| w.will_wake(cx.waker()))
        {
            // Set before the check below, so a wake from now on reaches it.
            *self
                .flag
                .task
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(cx.waker().clone());
            self.task_waker = Some(cx.waker().clone());
        }
        // A plain load first: most polls find it unset, and a wake racing
        // with it wakes the task again.
        self.flag.woken.load(Ordering::Acquire) && self.flag.woken.swap(false, Ordering::AcqRel)
    }

    /// The waker to poll the part with.
    pub(crate) fn waker(&self) -> &std::task::Waker {
        &self.inner_waker
    }

    /// The next [`WakeGate::take_wake`] says yes: the part has news that
    /// did not come through its waker.
    pub(crate) fn open(&self) {
        self.flag.woken.store(true, Ordering::Release);
    }
}

impl<F> PolledWhenWoken<F> {
    pub(super) fn new(inner: F) -> Self {
        PolledWhenWoken {
            gate: WakeGate::new(),
            inner,
        }
    }
}

impl<F: Future> Future for PolledWhenWoken<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        if !this.gate.take_wake(cx) {
            return Poll::Pending;
        }
        this.inner.poll(&mut Context::from_waker(this.gate.waker()))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;
    use std::task::Wake;

    use tokio::sync::watch;

    use std::time::Duration;

    use super::*;
    use crate::drain::{DrainState, Phase};

    struct CountWakes(AtomicUsize);

    impl Wake for CountWakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    pin_project_lite::pin_project! {
        /// The inner future, counting its polls.
        struct CountPolls<'a, F> {
            polls: &'a AtomicUsize,
            #[pin]
            inner: F,
        }
    }

    impl<F: Future> Future for CountPolls<'_, F> {
        type Output = F::Output;
        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
            let this = self.project();
            this.polls.fetch_add(1, Ordering::SeqCst);
            this.inner.poll(cx)
        }
    }

    fn state(phase: Phase) -> DrainState {
        DrainState {
            phase,
            force_close: false,
            exit: false,
        }
    }

    #[test]
    fn a_waiting_drain_watch_is_polled_again_only_for_news() {
        let (tx, mut rx) = watch::channel(state(Phase::Serving));
        let polls = AtomicUsize::new(0);
        let gated = PolledWhenWoken::new(CountPolls {
            polls: &polls,
            inner: rx.changed(),
        });
        let mut gated = std::pin::pin!(gated);
        let wakes = Arc::new(CountWakes(AtomicUsize::new(0)));
        let waker = std::task::Waker::from(wakes.clone());
        let mut cx = Context::from_waker(&waker);

        assert!(gated.as_mut().poll(&mut cx).is_pending());
        assert_eq!(polls.load(Ordering::SeqCst), 1, "the first poll registers");
        // The connection's other branches woke the task: no news here.
        for _ in 0..3 {
            assert!(gated.as_mut().poll(&mut cx).is_pending());
        }
        assert_eq!(polls.load(Ordering::SeqCst), 1, "not woken, not polled");

        // The future moved to another task: the change wakes that one.
        let other = Arc::new(CountWakes(AtomicUsize::new(0)));
        let other_waker = std::task::Waker::from(other.clone());
        assert!(
            gated
                .as_mut()
                .poll(&mut Context::from_waker(&other_waker))
                .is_pending()
        );
        tx.send_replace(state(Phase::Closing));
        assert_eq!(
            other.0.load(Ordering::SeqCst),
            1,
            "the change woke the task"
        );
        assert_eq!(wakes.0.load(Ordering::SeqCst), 0, "not the old one");
        let done = gated.as_mut().poll(&mut Context::from_waker(&other_waker));
        assert!(matches!(done, Poll::Ready(Ok(()))), "{done:?}");
        assert_eq!(polls.load(Ordering::SeqCst), 2);
    }

    /// A future woken with nothing to report (a wake-up left over from the
    /// change just handled, as a watch's waiter list can give) must still
    /// be polled, to register again: the force close a connection missed
    /// when the gate checked the channel's version instead.
    #[test]
    fn a_spurious_wake_still_reaches_the_inner_future() {
        struct Manual {
            waker: Arc<std::sync::Mutex<Option<std::task::Waker>>>,
            ready: Arc<AtomicBool>,
        }
        impl Future for Manual {
            type Output = ();
            fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
                if self.ready.load(Ordering::SeqCst) {
                    return Poll::Ready(());
                }
                // Registers anew on every poll, and a wake uses it up.
                *self
                    .waker
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(cx.waker().clone());
                Poll::Pending
            }
        }
        let registered = Arc::new(std::sync::Mutex::new(None::<std::task::Waker>));
        let ready = Arc::new(AtomicBool::new(false));
        let take = |r: &Arc<std::sync::Mutex<Option<std::task::Waker>>>| {
            r.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take()
        };
        let mut gated = std::pin::pin!(PolledWhenWoken::new(Manual {
            waker: registered.clone(),
            ready: ready.clone(),
        }));
        let wakes = Arc::new(CountWakes(AtomicUsize::new(0)));
        let waker = std::task::Waker::from(wakes.clone());
        let mut cx = Context::from_waker(&waker);
        assert!(gated.as_mut().poll(&mut cx).is_pending());

        // A spurious wake, with nothing new.
        take(&registered).expect("registered").wake();
        assert_eq!(wakes.0.load(Ordering::SeqCst), 1);
        assert!(gated.as_mut().poll(&mut cx).is_pending());
        // It registered again, so the real news still wakes the task.
        ready.store(true, Ordering::SeqCst);
        take(&registered)
            .expect("the spurious wake's poll registered again")
            .wake();
        assert_eq!(wakes.0.load(Ordering::SeqCst), 2);
        assert!(gated.as_mut().poll(&mut cx).is_ready());
    }

    /// Out of tokio's budget, `changed()` answers `Pending` without joining
    /// the channel's waiters, and wakes the waker it was given: the flag,
    /// so the task comes back and the next poll (in budget) joins them.
    #[tokio::test(flavor = "current_thread")]
    async fn a_watch_first_polled_out_of_budget_still_hears_the_change() {
        let (tx, mut rx) = watch::channel(state(Phase::Serving));
        let wakes = Arc::new(CountWakes(AtomicUsize::new(0)));
        let waker = std::task::Waker::from(wakes.clone());
        let mut gated = std::pin::pin!(PolledWhenWoken::new(rx.changed()));
        std::future::poll_fn(|cx| {
            // Spend the task's budget, as a connection's I/O can.
            loop {
                let spend = std::pin::pin!(tokio::task::coop::consume_budget());
                if spend.poll(cx).is_pending() {
                    break;
                }
            }
            assert!(!tokio::task::coop::has_budget_remaining());
            assert!(
                gated
                    .as_mut()
                    .poll(&mut Context::from_waker(&waker))
                    .is_pending()
            );
            Poll::Ready(())
        })
        .await;
        // tokio defers a budget wake to the scheduler's next turn.
        tokio::task::yield_now().await;
        assert_eq!(wakes.0.load(Ordering::SeqCst), 1, "told to come back");
        let mut cx = Context::from_waker(&waker);
        assert!(gated.as_mut().poll(&mut cx).is_pending());
        tx.send_replace(state(Phase::Closing));
        assert_eq!(
            wakes.0.load(Ordering::SeqCst),
            2,
            "the change must wake the task"
        );
        let done = gated.as_mut().poll(&mut cx);
        assert!(matches!(done, Poll::Ready(Ok(()))), "{done:?}");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_connection_loop_sees_every_change() {
        let (tx, mut rx) = watch::channel(state(Phase::Serving));
        // Each change the loop handled, so the next is sent only after it:
        // every change then takes a select of its own, as in a connection.
        let (seen_tx, mut seen_rx) = tokio::sync::mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    biased;
                    _ = std::future::pending::<()>() => {}
                    changed = PolledWhenWoken::new(rx.changed()) => {
                        if changed.is_err() {
                            return;
                        }
                        let s = *rx.borrow_and_update();
                        let _ = seen_tx.send((s.phase, s.force_close));
                        if s.force_close {
                            return;
                        }
                    }
                }
            }
        });
        let sends = [
            (Phase::Draining, false),
            (Phase::Closing, false),
            (Phase::Closing, true),
        ];
        for (phase, force_close) in sends {
            tx.send_replace(DrainState {
                phase,
                force_close,
                exit: false,
            });
            let seen = tokio::time::timeout(Duration::from_secs(5), seen_rx.recv()).await;
            assert_eq!(
                seen,
                Ok(Some((phase, force_close))),
                "the loop missed a change"
            );
        }
        assert!(
            tokio::time::timeout(Duration::from_secs(5), task)
                .await
                .is_ok()
        );
    }

    #[test]
    fn a_closed_drain_watch_is_news_too() {
        let (tx, mut rx) = watch::channel(state(Phase::Serving));
        let mut gated = std::pin::pin!(PolledWhenWoken::new(rx.changed()));
        let waker = std::task::Waker::from(Arc::new(CountWakes(AtomicUsize::new(0))));
        let mut cx = Context::from_waker(&waker);
        assert!(gated.as_mut().poll(&mut cx).is_pending());
        drop(tx);
        assert!(matches!(gated.as_mut().poll(&mut cx), Poll::Ready(Err(_))));
    }
}
