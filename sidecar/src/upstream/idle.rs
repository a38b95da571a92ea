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
use std::time::Duration;

/// An app connection that can wait on the stack.
pub(crate) trait IdleConn: Send + 'static {
    /// Whether it still looks usable (the app has not closed it).
    fn looks_open(&self) -> bool;
}

struct Idle<T> {
    conn: T,
    since: CoarseInstant,
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
        let now = CoarseInstant::now();
        let mut idle = self.lock();
        while let Some(entry) = idle.pop() {
            if now.age_of(entry.since) >= self.idle_timeout {
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
                since: CoarseInstant::now(),
            });
        }
    }

    /// Closes connections idle for longer than the timeout (the oldest sit
    /// at the bottom of the stack) and the ones the app closed.
    fn evict_expired(&self) {
        let now = CoarseInstant::now();
        let mut idle = self.lock();
        let expired = idle
            .iter()
            .take_while(|c| now.age_of(c.since) >= self.idle_timeout)
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

/// A reading of the kernel's coarse monotonic clock: the time of the last
/// timer tick (1-10 ms apart), read from the vDSO's data page without the
/// TSC read and scaling of `Instant::now`. A keep-alive request pops and
/// pushes an app connection once each, and these two clock reads were
/// about a fifth of the fast path's (bench/README.md, "seventh pass").
/// Idle timeouts are seconds, so a tick's precision is plenty; ages are
/// rounded up by a tick (`age_of`), so a connection is never reused past
/// its timeout, only retired up to a tick early.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct CoarseInstant(Duration);

impl CoarseInstant {
    pub(crate) fn now() -> CoarseInstant {
        CoarseInstant(coarse::now())
    }

    /// How long ago `earlier` was, at most a tick more than it really is.
    pub(crate) fn age_of(self, earlier: CoarseInstant) -> Duration {
        self.0.saturating_sub(earlier.0) + coarse::resolution()
    }
}

#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
mod coarse {
    use std::sync::OnceLock;
    use std::time::Duration;

    fn read(
        call: unsafe extern "C" fn(libc::clockid_t, *mut libc::timespec) -> libc::c_int,
    ) -> Option<Duration> {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec for the call's duration.
        let rc = unsafe { call(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
        (rc == 0).then(|| Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
    }

    /// The coarse clock's tick, or `None` where the kernel refuses it
    /// (every Linux since 2.6.32 has it). Decided once, so readings of the
    /// two clocks, which count from different origins, are never mixed.
    fn tick() -> Option<Duration> {
        static TICK: OnceLock<Option<Duration>> = OnceLock::new();
        *TICK.get_or_init(|| {
            read(libc::clock_getres).filter(|_| read(libc::clock_gettime).is_some())
        })
    }

    pub(super) fn now() -> Duration {
        match tick() {
            // It answered once; it cannot start refusing (EINVAL and
            // EFAULT are the only errors).
            Some(_) => read(libc::clock_gettime).unwrap_or_default(),
            None => super::precise_since_start(),
        }
    }

    pub(super) fn resolution() -> Duration {
        tick().unwrap_or_default()
    }
}

#[cfg(not(target_os = "linux"))]
mod coarse {
    use std::time::Duration;

    pub(super) fn now() -> Duration {
        super::precise_since_start()
    }

    pub(super) fn resolution() -> Duration {
        Duration::ZERO
    }
}

/// `Instant::now`, as time since the first call (the fallback clock).
fn precise_since_start() -> Duration {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START.get_or_init(std::time::Instant::now).elapsed()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_coarse_clock_moves_forward_and_rounds_ages_up() {
        let earlier = CoarseInstant::now();
        std::thread::sleep(Duration::from_millis(30));
        let later = CoarseInstant::now();
        assert!(later > earlier);
        // Never under the real 30 ms; at most a tick or two over it.
        let age = later.age_of(earlier);
        assert!(age >= Duration::from_millis(30), "{age:?}");
        assert!(age < Duration::from_secs(1), "{age:?}");
        // A reading's own age is a tick: fresh, but never negative.
        assert_eq!(later.age_of(later), coarse::resolution());
    }
}
