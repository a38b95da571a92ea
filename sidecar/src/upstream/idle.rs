//! The idle app connections: a LIFO stack shared by hyper's HTTP/1 client
//! (`http1::SendRequest` handles) and the fast path's raw sockets
//! (proxy/h1), under the same `upstreamPool` settings.
//!
//! The most recently used connection goes out first (warm, and the old ones
//! age out at the bottom). Up to `upstreamPool.maxIdle` wait, each for at
//! most `upstreamPool.idleTimeout`, which must stay below the app's own
//! keep-alive timeout so the proxy never reuses a socket the app is
//! closing. What goes back on the stack is the caller's decision: only a
//! connection whose last exchange ended cleanly.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

/// An app connection that can wait on the stack.
pub(crate) trait IdleConn: Send + 'static {
    /// Whether it still looks usable (the app has not closed it).
    fn looks_open(&self) -> bool;
}

struct Idle<T> {
    conn: T,
    since: Instant,
}

pub(crate) struct IdleStack<T> {
    idle: Mutex<Vec<Idle<T>>>,
    max_idle: usize,
    idle_timeout: Duration,
}

impl<T: IdleConn> IdleStack<T> {
    /// An empty stack, with a reaper task (when there is a runtime) that
    /// closes connections past the idle timeout even when no request comes
    /// to pop them.
    pub(crate) fn new(max_idle: usize, idle_timeout: Duration) -> Arc<IdleStack<T>> {
        let stack = Arc::new(IdleStack {
            idle: Mutex::new(Vec::new()),
            max_idle,
            idle_timeout,
        });
        spawn_reaper(&stack);
        stack
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Idle<T>>> {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The most recently returned connection that still looks open.
    /// Expired and closed ones met on the way are dropped (which closes
    /// them).
    pub(crate) fn pop(&self) -> Option<T> {
        let now = Instant::now();
        let mut idle = self.lock();
        while let Some(entry) = idle.pop() {
            if now.saturating_duration_since(entry.since) >= self.idle_timeout {
                // Everything below is older still.
                idle.clear();
                return None;
            }
            if entry.conn.looks_open() {
                return Some(entry.conn);
            }
        }
        None
    }

    /// Puts `conn` on top, or drops it when the stack is full.
    pub(crate) fn push(&self, conn: T) {
        if self.max_idle == 0 {
            return;
        }
        let mut idle = self.lock();
        if idle.len() < self.max_idle {
            idle.push(Idle {
                conn,
                since: Instant::now(),
            });
        }
    }

    /// Closes connections idle for longer than the timeout (the oldest sit
    /// at the bottom of the stack) and the ones the app closed.
    fn evict_expired(&self) {
        let now = Instant::now();
        let mut idle = self.lock();
        let expired = idle
            .iter()
            .take_while(|c| now.saturating_duration_since(c.since) >= self.idle_timeout)
            .count();
        idle.drain(..expired);
        idle.retain(|c| c.conn.looks_open());
        if idle.is_empty() {
            // Everything aged out: the stack a spike grew (up to maxIdle
            // entries) goes too rather than stay for the next one
            // (memory.rs trims the heap once the pool emptied).
            *idle = Vec::new();
        }
    }
}

/// Holds the stack weakly, so it ends with the upstream.
fn spawn_reaper<T: IdleConn>(stack: &Arc<IdleStack<T>>) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let weak: Weak<IdleStack<T>> = Arc::downgrade(stack);
    let period = (stack.idle_timeout / 2).max(Duration::from_millis(100));
    runtime.spawn(async move {
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            match weak.upgrade() {
                Some(stack) => stack.evict_expired(),
                None => return,
            }
        }
    });
}
