//! One accepted connection from its first byte to its end: the protocol
//! sniff picks who serves it (served.rs), and one loop runs that under the
//! connection's timers (first head, idle, write) and the drain (graceful
//! end at `Closing`, cut at the deadline). When the HTTP/1 fast path meets
//! a request it does not serve, its future ends with the socket, and this
//! loop hands it to hyper (hyper.rs): the only way from one to the other.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::BytesMut;

use super::activity::{ConnActivity, ConnCtx};
use super::hyper::hyper_http1;
use super::served::{H2Served, Outcome, Served};
use super::sniff::sniff_h2;
use super::socket::{CountingIo, Downstream, Rewind};
use super::woken::PolledWhenWoken;
use crate::config::Protocol;
use crate::drain::{ConnGuard, Phase};
use crate::http2::{Ending, H2Conn};
use crate::metrics::ClientTimeout;
use crate::state::Shared;

/// Serves one accepted downstream connection until it closes, the drain
/// closes it, or the drain deadline cuts it.
pub(crate) async fn serve_connection<S: Downstream>(
    shared: Arc<Shared>,
    stream: S,
    peer: crate::listen::Peer,
    mut guard: ConnGuard,
) {
    let live = shared.live.load();
    let protocol = live.config.protocol;
    let limits = live.config.limits;
    let go_away = live.config.drain.http2_go_away;
    let fast_path = live.config.proxy.http1_fast_path;
    drop(live);

    let peer_ip = peer.forwarded_for_text();
    let ctx = Arc::new(ConnCtx {
        shared: shared.clone(),
        act: ConnActivity::new(!fast_path && protocol != Protocol::Http2),
        peer_ip,
    });
    // The drain, idle and write checks below read the counters.
    let watched = ctx.clone();
    let act = &watched.act;
    let mut io = CountingIo::new(stream, ctx.clone());
    let mut drain_rx = shared.drain.subscribe();
    // Before the protocol is known (the first 24 bytes, the length of the
    // HTTP/2 preface) hyper's HTTP/1 header timer is not running yet, so a
    // client that connects and says nothing (or half a word) is cut here.
    let first_deadline = tokio::time::Instant::now() + limits.header_read_timeout.get();
    let (h2, pre) = match protocol {
        Protocol::Http1 => (false, BytesMut::new()),
        Protocol::Http2 => (true, BytesMut::new()),
        // Biased, the read first: bytes already there need no timer.
        Protocol::Auto | Protocol::Tcp => tokio::select! {
            biased;
            sniffed = sniff_h2(&mut io) => match sniffed {
                Ok(found) => found,
                Err(err) => {
                    tracing::debug!(%peer, error = %err, "downstream connection failed before its first request");
                    return;
                }
            },
            _ = tokio::time::sleep_until(first_deadline) => {
                shared.metrics.client_timeout(ClientTimeout::HeaderRead);
                tracing::debug!(%peer, "no request head within the header read timeout; closing");
                return;
            }
            // Nothing of a request yet: closing is the graceful path (as
            // hyper-util's auto server cancels a connection still reading
            // its version).
            _ = drain_rx.wait_for(|s| s.phase >= Phase::Closing) => {
                tracing::debug!(%peer, "closing: connection without a request closed");
                return;
            }
        },
    };
    let mut conn: Pin<Box<dyn Served<CountingIo<S>>>> = if h2 {
        let io = Rewind::new(pre.freeze(), io);
        Box::pin(H2Served::new(H2Conn::new(io, ctx, &limits, go_away)))
    } else if fast_path {
        crate::proxy::h1::serve(io, pre, ctx, limits)
    } else {
        hyper_http1(Rewind::new(pre.freeze(), io), ctx, &limits)
    };

    // The graceful end asked of the connection, if one was (passed on to
    // hyper when the fast path hands the connection over).
    let mut ending: Option<Ending> = None;
    // A connection accepted in the instant the listener closed still gets
    // the graceful path.
    if drain_rx.borrow_and_update().phase >= Phase::Closing {
        conn.as_mut().shutdown(Ending::Drain);
        ending = Some(Ending::Drain);
    }

    // Idle check: close a connection with nothing in flight that has not
    // sent a byte for `downstreamIdleTimeout` (checked in quarters, so the
    // close lands between 1x and 1.25x the timeout).
    let idle_timeout = limits.downstream_idle_timeout.get();
    let tick = (idle_timeout / 4).max(Duration::from_millis(50));
    let mut next_tick = tokio::time::Instant::now() + tick;
    let mut last_bytes = 0u64;
    let mut quiet_since = tokio::time::Instant::now();
    let mut first_checked = false;
    // An idle close that does not finish (an HTTP/2 client that never acks
    // the shutdown PING keeps hyper waiting for it) is cut after this. The
    // drain has its own bound: the deadline's force close below.
    let mut idle_close_deadline: Option<tokio::time::Instant> = None;
    // Write timeout: a client that takes no byte for `writeTimeout` while
    // a write waits on it is cut; dropping the connection drops the
    // response body and with it the app connection it streams from.
    let write_timeout = limits.write_timeout.get();
    let write_tick = (write_timeout / 4).max(Duration::from_millis(50));
    let mut next_write_tick = tokio::time::Instant::now() + write_tick;
    let mut last_written = 0u64;
    let mut write_progress_at = tokio::time::Instant::now();

    loop {
        // One timer for the four deadlines (the first head, the write and
        // idle checks, the idle close's bound), not one each: a
        // registration in tokio's timer wheel and its removal per deadline
        // were about a twentieth of a one-request connection's
        // instructions (bench/README.md). Whatever is due when it fires is
        // handled below, in the same way as before.
        let wake_at = [
            (!first_checked).then_some(first_deadline),
            (!write_timeout.is_zero()).then_some(next_write_tick),
            (ending.is_none() && !idle_timeout.is_zero()).then_some(next_tick),
            idle_close_deadline,
        ]
        .into_iter()
        .flatten()
        .min();
        tokio::select! {
            biased;
            res = conn.as_mut() => match res {
                Ok(Outcome::Done) => break,
                Ok(Outcome::ToHyper(io)) => {
                    // The fast path's hand-over (between messages): hyper
                    // serves the rest, told of an ending already asked for.
                    conn = hyper_http1(io, watched.clone(), &limits);
                    if let Some(why) = ending {
                        conn.as_mut().shutdown(why);
                    }
                }
                Err(err) => {
                    tracing::debug!(%peer, error = %err, "downstream connection ended with an error");
                    break;
                }
            },
            changed = PolledWhenWoken::new(drain_rx.changed()) => {
                if changed.is_err() {
                    break;
                }
                let state = *drain_rx.borrow_and_update();
                if state.force_close {
                    tracing::debug!(%peer, "drain deadline: force-closing connection");
                    guard.mark_forced();
                    break;
                }
                if state.phase >= Phase::Closing && ending.is_none() {
                    conn.as_mut().shutdown(Ending::Drain);
                    ending = Some(Ending::Drain);
                }
            }
            _ = sleep_until_opt(wake_at), if wake_at.is_some() => {
                // Due: every deadline at or before the one slept for.
                let due = |at: tokio::time::Instant| wake_at.is_some_and(|w| at <= w);
                let now = tokio::time::Instant::now();
                if !first_checked && due(first_deadline) {
                    first_checked = true;
                    if act.requests.load(Ordering::Relaxed) == 0 && act.bytes_read.load(Ordering::Relaxed) < 24 {
                        shared.metrics.client_timeout(ClientTimeout::HeaderRead);
                        tracing::debug!(%peer, "no request head within the header read timeout; closing");
                        break;
                    }
                }
                if !write_timeout.is_zero() && due(next_write_tick) {
                    next_write_tick = now + write_tick;
                    let written = act.bytes_written.load(Ordering::Relaxed);
                    if written != last_written || !act.write_blocked.load(Ordering::Relaxed) {
                        last_written = written;
                        write_progress_at = now;
                    } else if now - write_progress_at >= write_timeout {
                        shared.metrics.client_timeout(ClientTimeout::Write);
                        tracing::debug!(%peer, "client read nothing for limits.writeTimeout; closing");
                        break;
                    }
                }
                if ending.is_none() && !idle_timeout.is_zero() && due(next_tick) {
                    next_tick = now + tick;
                    let bytes = act.bytes_read.load(Ordering::Relaxed);
                    if bytes != last_bytes || act.inflight.load(Ordering::Relaxed) > 0 {
                        last_bytes = bytes;
                        quiet_since = now;
                    } else if now - quiet_since >= idle_timeout {
                        tracing::debug!(%peer, "closing idle downstream connection");
                        conn.as_mut().shutdown(Ending::Idle);
                        ending = Some(Ending::Idle);
                        idle_close_deadline = Some(now + limits.header_read_timeout.get());
                        continue;
                    }
                }
                if idle_close_deadline.is_some_and(due) {
                    tracing::debug!(%peer, "idle close not acknowledged in time; dropping the connection");
                    shared.metrics.idle_close_cut();
                    break;
                }
            }
        }
    }
}

/// Sleeps until `at`, or forever without one (a disabled `select!` branch
/// still builds its future).
async fn sleep_until_opt(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
