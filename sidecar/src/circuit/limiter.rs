//! A concurrency limit with a bounded, timed queue whose limit can move
//! (the adaptive controller lowers and raises it while requests run).
//!
//! Built on tokio's fair semaphore: waiters are served in arrival order and
//! a waiter that gives up (timeout, client gone) leaves the queue when its
//! future is dropped. Lowering the limit below what is in use cannot take
//! slots back from running requests, so the difference is kept as a debt:
//! slots returned while in debt are forgotten instead of handed on.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError};

use super::Rejection;

pub(crate) struct Limiter {
    semaphore: Arc<Semaphore>,
    sizing: Mutex<Sizing>,
    /// `issued - limit` when positive; read without the lock on every
    /// release so the common no-debt case stays lock-free.
    debt: AtomicU32,
    /// The limit in force, for metrics.
    limit: AtomicU32,
    queued: AtomicU32,
    max_queue: u32,
    queue_timeout: Duration,
}

struct Sizing {
    limit: u32,
    /// Permits that exist: available in the semaphore plus held by slots.
    issued: u32,
}

/// One admitted request's slot; dropping it gives the slot back.
pub(crate) struct Slot {
    permit: Option<OwnedSemaphorePermit>,
    limiter: Arc<Limiter>,
}

impl Limiter {
    pub(crate) fn new(limit: u32, max_queue: u32, queue_timeout: Duration) -> Self {
        let limit = limit.max(1);
        Self {
            semaphore: Arc::new(Semaphore::new(limit as usize)),
            sizing: Mutex::new(Sizing {
                limit,
                issued: limit,
            }),
            debt: AtomicU32::new(0),
            limit: AtomicU32::new(limit),
            queued: AtomicU32::new(0),
            max_queue,
            queue_timeout,
        }
    }

    pub(crate) fn limit(&self) -> u32 {
        self.limit.load(Ordering::Relaxed)
    }

    pub(crate) fn queued(&self) -> u32 {
        self.queued.load(Ordering::Relaxed)
    }

    /// Slots held by admitted requests right now.
    pub(crate) fn in_use(&self) -> u32 {
        let sizing = self.sizing.lock().unwrap_or_else(PoisonError::into_inner);
        let available = u32::try_from(self.semaphore.available_permits()).unwrap_or(u32::MAX);
        sizing.issued.saturating_sub(available)
    }

    /// Waits for a slot: at once if one is free, else in the queue if it
    /// has room, for at most the queue timeout.
    pub(crate) async fn acquire(self: &Arc<Self>) -> Result<Slot, Rejection> {
        match self.semaphore.clone().try_acquire_owned() {
            Ok(permit) => return Ok(self.slot(permit)),
            Err(TryAcquireError::Closed) => return Err(Rejection::QueueFull),
            Err(TryAcquireError::NoPermits) => {}
        }
        if self.queued.fetch_add(1, Ordering::AcqRel) >= self.max_queue {
            self.queued.fetch_sub(1, Ordering::AcqRel);
            return Err(Rejection::QueueFull);
        }
        // Leaves the queue count however this wait ends, cancellation too.
        let _in_queue = QueueSeat(&self.queued);
        match tokio::time::timeout(self.queue_timeout, self.semaphore.clone().acquire_owned()).await
        {
            Ok(Ok(permit)) => Ok(self.slot(permit)),
            Ok(Err(_closed)) => Err(Rejection::QueueFull),
            Err(_elapsed) => Err(Rejection::QueueTimeout),
        }
    }

    fn slot(self: &Arc<Self>, permit: OwnedSemaphorePermit) -> Slot {
        Slot {
            permit: Some(permit),
            limiter: self.clone(),
        }
    }

    /// Moves the limit. Raising it wakes queued requests at once; lowering
    /// it takes free slots away now and busy ones as they are returned.
    pub(crate) fn set_limit(&self, new_limit: u32) {
        let new_limit = new_limit.max(1);
        let mut sizing = self.sizing.lock().unwrap_or_else(PoisonError::into_inner);
        sizing.limit = new_limit;
        if new_limit > sizing.issued {
            self.semaphore
                .add_permits((new_limit - sizing.issued) as usize);
            sizing.issued = new_limit;
        } else if new_limit < sizing.issued {
            let excess = sizing.issued - new_limit;
            let forgotten = self.semaphore.forget_permits(excess as usize);
            sizing.issued -= u32::try_from(forgotten).unwrap_or(excess);
        }
        self.debt
            .store(sizing.issued.saturating_sub(new_limit), Ordering::Release);
        self.limit.store(new_limit, Ordering::Relaxed);
    }

    fn release(&self, permit: OwnedSemaphorePermit) {
        if self.debt.load(Ordering::Acquire) == 0 {
            drop(permit);
            return;
        }
        let mut sizing = self.sizing.lock().unwrap_or_else(PoisonError::into_inner);
        if sizing.issued > sizing.limit {
            permit.forget();
            sizing.issued -= 1;
            self.debt
                .store(sizing.issued - sizing.limit, Ordering::Release);
        } else {
            drop(permit);
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(permit) = self.permit.take() {
            self.limiter.release(permit);
        }
    }
}

struct QueueSeat<'a>(&'a AtomicU32);

impl Drop for QueueSeat<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limiter(limit: u32, queue: u32) -> Arc<Limiter> {
        Arc::new(Limiter::new(limit, queue, Duration::from_millis(100)))
    }

    /// A request waiting for a slot in its own task, once it is queued.
    async fn queued_request(
        limiter: &Arc<Limiter>,
    ) -> tokio::task::JoinHandle<Result<(), Rejection>> {
        let waiter = {
            let limiter = limiter.clone();
            tokio::spawn(async move { limiter.acquire().await.map(drop) })
        };
        tokio::task::yield_now().await;
        assert_eq!(limiter.queued(), 1);
        waiter
    }

    #[tokio::test(start_paused = true)]
    async fn admits_up_to_the_limit_then_queues_then_rejects() {
        let limiter = limiter(2, 1);
        let a = limiter.acquire().await.expect("slot 1");
        let _b = limiter.acquire().await.expect("slot 2");
        let waiter = queued_request(&limiter).await;
        assert_eq!(limiter.acquire().await.err(), Some(Rejection::QueueFull));
        drop(a);
        assert_eq!(waiter.await.expect("task"), Ok(()));
        assert_eq!(limiter.queued(), 0);
    }

    /// What a second request gets while a first holds the only slot.
    async fn second_of_one_slot(limiter: &Arc<Limiter>) -> Option<Rejection> {
        let _held = limiter.acquire().await.expect("slot");
        limiter.acquire().await.err()
    }

    #[tokio::test(start_paused = true)]
    async fn a_queued_request_times_out() {
        let limiter = limiter(1, 4);
        let second = second_of_one_slot(&limiter).await;
        assert_eq!(second, Some(Rejection::QueueTimeout));
        assert_eq!(limiter.queued(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_leaves_the_queue_frees_its_place() {
        let limiter = limiter(1, 1);
        let held = limiter.acquire().await.expect("slot");
        let leaving = queued_request(&limiter).await;
        // The downstream went away: the proxy drops the admit future.
        leaving.abort();
        let _ = leaving.await;
        assert_eq!(limiter.queued(), 0);
        drop(held);
        let _next = limiter.acquire().await.expect("the slot went to no one");
        assert_eq!(limiter.in_use(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn no_queue_means_immediate_rejection() {
        let second = second_of_one_slot(&limiter(1, 0)).await;
        assert_eq!(second, Some(Rejection::QueueFull));
    }

    #[tokio::test(start_paused = true)]
    async fn lowering_the_limit_takes_effect_as_slots_return() {
        let limiter = limiter(4, 0);
        let slots: Vec<Slot> = futures_util::future::join_all((0..4).map(|_| limiter.acquire()))
            .await
            .into_iter()
            .map(|slot| slot.expect("slot"))
            .collect();
        limiter.set_limit(2);
        assert_eq!(limiter.limit(), 2);
        drop(slots);
        assert_eq!(limiter.in_use(), 0);
        let _a = limiter.acquire().await.expect("slot 1");
        let _b = limiter.acquire().await.expect("slot 2");
        assert_eq!(limiter.acquire().await.err(), Some(Rejection::QueueFull));
        limiter.set_limit(3);
        let _c = limiter.acquire().await.expect("slot 3 after raising");
        assert_eq!(limiter.in_use(), 3);
    }
}
