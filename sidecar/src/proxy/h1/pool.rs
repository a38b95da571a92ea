//! The fast path's idle app connections: raw sockets with their read
//! buffers, on a LIFO stack beside hyper's (upstream.rs), under the same
//! `upstreamPool` settings. A socket goes back only after a response that
//! ended cleanly and left nothing unread.

use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::BytesMut;

use crate::upstream::UpstreamStream;

/// An app connection and what was read from it past the last response
/// (always empty when pooled).
pub(crate) struct AppConn {
    pub(crate) io: UpstreamStream,
    pub(crate) buf: BytesMut,
    /// Came from the pool: the app may have closed it meanwhile, so a
    /// request that meets its end before any answer may go again.
    pub(crate) reused: bool,
}

struct Idle {
    conn: AppConn,
    since: Instant,
}

pub(crate) struct RawPool {
    idle: Mutex<Vec<Idle>>,
    max_idle: usize,
    idle_timeout: Duration,
}

impl RawPool {
    pub(crate) fn new(max_idle: usize, idle_timeout: Duration) -> Arc<RawPool> {
        let pool = Arc::new(RawPool {
            idle: Mutex::new(Vec::new()),
            max_idle,
            idle_timeout,
        });
        spawn_reaper(&pool);
        pool
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Idle>> {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The most recently returned connection that still looks open.
    /// Expired ones, and ones the app closed (readable: EOF or stray
    /// bytes), are dropped on the way.
    pub(crate) fn pop(&self) -> Option<AppConn> {
        let now = Instant::now();
        let mut idle = self.lock();
        while let Some(entry) = idle.pop() {
            if now.saturating_duration_since(entry.since) >= self.idle_timeout {
                // Everything below is older still.
                idle.clear();
                return None;
            }
            if still_open(&entry.conn.io) {
                let mut conn = entry.conn;
                conn.reused = true;
                return Some(conn);
            }
        }
        None
    }

    pub(crate) fn push(&self, conn: AppConn) {
        if self.max_idle == 0 || !conn.buf.is_empty() {
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

    fn evict_expired(&self) {
        let now = Instant::now();
        let mut idle = self.lock();
        let expired = idle
            .iter()
            .take_while(|c| now.saturating_duration_since(c.since) >= self.idle_timeout)
            .count();
        idle.drain(..expired);
        idle.retain(|c| still_open(&c.conn.io));
    }
}

/// An idle socket has nothing to read; EOF or bytes mean the app closed
/// it or broke the protocol. The reactor's readiness answers without a
/// syscall in the usual case (nothing happened since the last response was
/// read); only a socket marked readable is read to find out.
fn still_open(io: &UpstreamStream) -> bool {
    let mut cx = Context::from_waker(Waker::noop());
    let ready = match io {
        UpstreamStream::Tcp(s) => s.poll_read_ready(&mut cx),
        UpstreamStream::Unix(s) => s.poll_read_ready(&mut cx),
    };
    match ready {
        Poll::Pending => return true,
        Poll::Ready(Err(_)) => return false,
        Poll::Ready(Ok(())) => {}
    }
    let mut probe = [0u8; 1];
    let res = match io {
        UpstreamStream::Tcp(s) => s.try_read(&mut probe),
        UpstreamStream::Unix(s) => s.try_read(&mut probe),
    };
    matches!(res, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
}

/// Closes idle connections past their timeout even when no request comes
/// to pop them; ends with the pool.
fn spawn_reaper(pool: &Arc<RawPool>) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let weak: Weak<RawPool> = Arc::downgrade(pool);
    let period = (pool.idle_timeout / 2).max(Duration::from_millis(100));
    runtime.spawn(async move {
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            match weak.upgrade() {
                Some(pool) => pool.evict_expired(),
                None => return,
            }
        }
    });
}
