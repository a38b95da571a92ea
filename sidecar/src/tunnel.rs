//! A byte tunnel between two streams: the one copy loop for TCP mode
//! (tcp.rs) and for upgraded HTTP/1.1 connections (proxy/tunnel.rs).
//!
//! Nothing inside the stream can be told to go away, so the drain works on
//! the tunnel as a whole: it is left alone until the drain deadline, then
//! cut and counted as force-closed. A tunnel on which no byte moved either
//! way for `limits.tunnelIdleTimeout` is closed and counted
//! (`kubegrace_client_timeouts_total{kind="tunnel_idle"}`).

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};

use crate::passthrough::{ReadWatch, Watched};

use crate::drain::ConnGuard;
use crate::metrics::ClientTimeout;
use crate::state::Shared;

/// How a tunnel ended.
pub(crate) enum TunnelEnd {
    /// One side closed (or failed).
    Closed(io::Result<(u64, u64)>),
    /// Nothing moved for the idle timeout.
    Idle,
    /// The drain deadline cut it.
    Forced,
}

/// Joins `a` and `b` until one side closes, nothing moves for
/// `limits.tunnelIdleTimeout` (counted as a client timeout), or the drain
/// deadline (`guard` marked force-closed). The caller logs the end in its
/// own words.
pub(crate) async fn run<A, B>(
    shared: &Shared,
    a: &mut A,
    b: &mut B,
    guard: &mut ConnGuard,
) -> TunnelEnd
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let mut drain_rx = shared.drain.subscribe();
    let idle = shared.live.load().config.limits.tunnel_idle_timeout.get();
    tokio::select! {
        end = copy_with_idle(a, b, idle) => {
            if let TunnelEnd::Idle = end {
                shared.metrics.client_timeout(ClientTimeout::TunnelIdle);
            }
            end
        }
        _ = drain_rx.wait_for(|s| s.force_close) => {
            guard.mark_forced();
            TunnelEnd::Forced
        }
    }
}

/// Counts the bytes read from a stream into a counter both directions share.
struct Moved<'a>(&'a AtomicU64);

impl ReadWatch for Moved<'_> {
    fn saw(&mut self, _: &io::Result<()>, new: &[u8]) {
        if !new.is_empty() {
            self.0.fetch_add(new.len() as u64, Ordering::Relaxed);
        }
    }
}

/// `copy_bidirectional` that gives up once no byte was read from either
/// side for `idle` (zero: never). A peer that stops reading stalls the
/// other direction too, so this also ends tunnels nobody drains.
async fn copy_with_idle<A, B>(a: &mut A, b: &mut B, idle: Duration) -> TunnelEnd
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    if idle.is_zero() {
        return TunnelEnd::Closed(tokio::io::copy_bidirectional(a, b).await);
    }
    let moved = AtomicU64::new(0);
    let mut a = Watched {
        inner: a,
        watch: Moved(&moved),
    };
    let mut b = Watched {
        inner: b,
        watch: Moved(&moved),
    };
    let copy = tokio::io::copy_bidirectional(&mut a, &mut b);
    tokio::pin!(copy);
    // Checked in quarters: the close lands between 1x and 1.25x the timeout.
    let tick = (idle / 4).max(Duration::from_millis(50));
    let mut last = 0;
    let mut quiet_since = tokio::time::Instant::now();
    loop {
        tokio::select! {
            res = copy.as_mut() => return TunnelEnd::Closed(res),
            _ = tokio::time::sleep(tick) => {
                let now = tokio::time::Instant::now();
                let seen = moved.load(Ordering::Relaxed);
                if seen != last {
                    last = seen;
                    quiet_since = now;
                } else if now - quiet_since >= idle {
                    return TunnelEnd::Idle;
                }
            }
        }
    }
}
