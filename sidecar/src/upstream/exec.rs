//! One tokio task per HTTP/2 app connection: the h2 connection, and the
//! request bodies still being sent when their answer came (h2conn.rs), all
//! run inside it.
//!
//! A task each would cost an aligned allocation, a scheduling and the
//! future moved into the task. Here a wake-up between them is an entry in
//! [`FuturesUnordered`]'s ready queue, polled in the same turn. A future waiting (on the app, or on a body the client is
//! slow to send) is simply not polled, so it holds up none of the others,
//! as with separate tasks; all of them share the connection's thread, as
//! they share its socket.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use futures_util::stream::{FuturesUnordered, StreamExt};
use futures_util::task::AtomicWaker;

type BoxFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The futures of one app connection.
#[derive(Clone, Default)]
pub(crate) struct ConnExec(Arc<Shared>);

#[derive(Default)]
struct Shared {
    queue: Mutex<Queue>,
    /// The driver's task, woken when a future is queued from elsewhere.
    waker: AtomicWaker,
}

#[derive(Default)]
struct Queue {
    new: Vec<BoxFuture>,
    /// A driver task is running (it ends when it has nothing left, and the
    /// next future queued starts another).
    driving: bool,
}

impl ConnExec {
    /// Runs `fut` in this connection's task.
    pub(crate) fn run(&self, fut: BoxFuture) {
        let start = {
            let mut queue = self.0.queue.lock().unwrap_or_else(PoisonError::into_inner);
            queue.new.push(fut);
            !std::mem::replace(&mut queue.driving, true)
        };
        if start {
            tokio::spawn(Driver {
                shared: self.0.clone(),
                running: FuturesUnordered::new(),
            });
        } else {
            self.0.waker.wake();
        }
    }
}

/// The connection's task.
struct Driver {
    shared: Arc<Shared>,
    running: FuturesUnordered<BoxFuture>,
}

impl Driver {
    /// Moves the queued futures into the running set; false when there
    /// were none.
    fn take_new(&mut self) -> bool {
        let mut queue = self
            .shared
            .queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if queue.new.is_empty() {
            return false;
        }
        for fut in queue.new.drain(..) {
            self.running.push(fut);
        }
        true
    }

    /// Nothing runs and nothing is queued: the task ends, and the next
    /// future queued starts a new one.
    fn try_finish(&self) -> bool {
        let mut queue = self
            .shared
            .queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if queue.new.is_empty() && self.running.is_empty() {
            queue.driving = false;
            return true;
        }
        false
    }
}

impl Future for Driver {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        // Registered before the queue is looked at, so a future queued
        // after the look wakes this task.
        this.shared.waker.register(cx.waker());
        loop {
            this.take_new();
            match this.running.poll_next_unpin(cx) {
                Poll::Ready(Some(())) => continue,
                Poll::Ready(None) | Poll::Pending => {
                    // The futures just polled may have queued others.
                    if this.take_new() {
                        continue;
                    }
                    if this.try_finish() {
                        return Poll::Ready(());
                    }
                    return Poll::Pending;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::sync::oneshot;

    #[tokio::test]
    async fn futures_run_side_by_side_and_a_waiting_one_holds_up_none() {
        let exec = ConnExec::default();
        let done = Arc::new(AtomicUsize::new(0));
        // One future waits for a signal that comes only after the others
        // finished: were they run one after another, this would hang.
        let (release, wait) = oneshot::channel::<()>();
        let (finished_tx, finished_rx) = oneshot::channel::<()>();
        {
            let done = done.clone();
            exec.run(Box::pin(async move {
                let _ = wait.await;
                done.fetch_add(1, Ordering::AcqRel);
                let _ = finished_tx.send(());
            }));
        }
        let mut others = Vec::new();
        for _ in 0..10 {
            let done = done.clone();
            let (tx, rx) = oneshot::channel::<()>();
            others.push(rx);
            exec.run(Box::pin(async move {
                tokio::task::yield_now().await;
                done.fetch_add(1, Ordering::AcqRel);
                let _ = tx.send(());
            }));
        }
        for rx in others {
            tokio::time::timeout(std::time::Duration::from_secs(5), rx)
                .await
                .expect("a waiting future held the others up")
                .expect("the future was dropped");
        }
        assert_eq!(done.load(Ordering::Acquire), 10);
        let _ = release.send(());
        tokio::time::timeout(std::time::Duration::from_secs(5), finished_rx)
            .await
            .expect("the waiting future never ran on")
            .expect("the future was dropped");
        assert_eq!(done.load(Ordering::Acquire), 11);
    }

    #[tokio::test]
    async fn the_task_ends_when_idle_and_a_later_future_starts_another() {
        let exec = ConnExec::default();
        let (tx, rx) = oneshot::channel::<()>();
        exec.run(Box::pin(async move {
            let _ = tx.send(());
        }));
        rx.await.expect("first future ran");
        // Let the driver see that it has nothing left.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(
            !exec
                .0
                .queue
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .driving,
            "the driver ended"
        );
        let (tx, rx) = oneshot::channel::<()>();
        exec.run(Box::pin(async move {
            let _ = tx.send(());
        }));
        tokio::time::timeout(std::time::Duration::from_secs(5), rx)
            .await
            .expect("a new driver started")
            .expect("the future was dropped");
    }
}
