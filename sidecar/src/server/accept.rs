//! The accept loops: one per proxy listener (`--workers`), each handing
//! every connection to the HTTP proxy or the raw TCP relay, pausing at
//! `Closing` of a provisional drain and closing for good at an exit drain
//! or a hand-over to a new process.

use std::net::SocketAddr;
use std::sync::Arc;

use crate::config::{self, Endpoint};
use crate::drain::Phase;
use crate::error::Result;
use crate::listen::{self, Listener, Peer, UnixCleanup};
use crate::state::Shared;
use crate::upgrade::HandOver;
use crate::{proxy, tcp};

/// Binds the proxy socket(s) named by `--listen`.
pub(super) fn bind_listeners(
    endpoint: &Endpoint,
    workers: usize,
    mode: Option<config::SocketMode>,
    defer_accept: bool,
) -> Result<(Vec<Listener>, UnixCleanup)> {
    match endpoint {
        Endpoint::Tcp(addr) => Ok((
            listen::bind_tcp(*addr, workers, defer_accept)?
                .into_iter()
                .map(Listener::Tcp)
                .collect(),
            UnixCleanup::none(),
        )),
        Endpoint::Unix(path) => {
            if workers > 1 {
                // The kernel spreads connections over SO_REUSEPORT groups
                // for TCP and UDP only.
                tracing::info!(
                    workers,
                    "workers apply to TCP listeners; a unix: socket gets one accept loop"
                );
            }
            let (listener, cleanup) = listen::bind_unix(path, mode)?;
            Ok((vec![Listener::Unix(listener)], cleanup))
        }
    }
}

/// Removes a Unix socket file once every accept loop has ended, unless the
/// sockets went to a new process.
pub(super) struct CleanupOnClose {
    cleanup: UnixCleanup,
    handed_over: HandOver,
}

impl CleanupOnClose {
    pub(super) fn new(cleanup: UnixCleanup, handed_over: HandOver) -> Self {
        CleanupOnClose {
            cleanup,
            handed_over,
        }
    }
}

impl Drop for CleanupOnClose {
    fn drop(&mut self) {
        if self.handed_over.is_done() {
            self.cleanup.disarm();
        }
        // The field's own drop removes the file if still armed.
    }
}

/// Accepts until the drain reaches `Closing`. An exit drain (SIGTERM) then
/// drops the listener: new connections are refused, routers have moved on.
/// A provisional drain (preStop, `/drain`) pauses it instead, on the same
/// socket, and accepts again if the drain resumes (the app was restarting):
///
/// - a TCP socket we own is paused with `shutdown(SHUT_RD)`, which on Linux
///   takes it out of the listening state (connects are refused, as after a
///   close, and an `SO_REUSEPORT` worker leaves its group) while the fd and
///   its bound address stay; `listen()` on the same fd resumes it. Nothing
///   is re-bound, so no other process can take the port in between and
///   every worker comes back into the same group;
/// - a socket shared with its owner (systemd, server-starter) must keep
///   listening for the owner, and a Unix socket cannot listen again after
///   that shutdown: those are only left unaccepted (connections wait in the
///   backlog, as they would for the owner once we closed our copy);
/// - once the drain is an exit drain, or the socket went to a new process,
///   the loop ends and the listener closes for good.
pub(super) async fn accept_loop(
    shared: Arc<Shared>,
    listener: Arc<Listener>,
    raw_tcp: bool,
    cleanup: Arc<CleanupOnClose>,
    owned: bool,
) {
    let mut drain_rx = shared.drain.subscribe();
    let handed_over = shared.upgrade.handed_over();
    // After a resume: a fresh handle on the same socket (see Listener::resume).
    let mut resumed_on: Option<Listener> = None;
    loop {
        let current = resumed_on.as_ref().unwrap_or(&listener);
        let accepted = tokio::select! {
            biased;
            _ = drain_rx.wait_for(|s| s.phase >= Phase::Closing) => None,
            // Outside Kubernetes: a new process took the socket over.
            _ = handed_over.done() => break,
            accepted = accept(current) => Some(accepted),
        };
        let Some(accepted) = accepted else {
            if shared.stop.is_requested() || handed_over.is_done() {
                break;
            }
            let paused = owned && listener.pause();
            tracing::info!(
                refusing = paused,
                "listener paused; accepting again only if the app turns out to be restarting"
            );
            // Below Closing again: resumed (a watcher that wakes late may
            // already see the next drain's Draining, which accepts too).
            let resumed = tokio::select! {
                res = drain_rx.wait_for(|s| s.phase < Phase::Closing || s.exit) => {
                    res.is_ok_and(|s| !s.exit)
                }
                _ = handed_over.done() => false,
            };
            if !resumed {
                break;
            }
            if paused {
                match listener.resume() {
                    Ok(handle) => resumed_on = handle,
                    Err(err) => {
                        // The fd is still bound; a failed listen() would only
                        // come from a broken socket. Say so and close: the
                        // listener is gone, as after an exit drain.
                        tracing::error!(error = %err, "cannot listen again on the paused socket");
                        break;
                    }
                }
            }
            tracing::info!(listen = %listener.endpoint(), "listener accepting again");
            continue;
        };
        match accepted {
            Ok(Accepted::Tcp(stream, peer)) => {
                // The HTTP proxy turns Nagle off before its second write
                // (proxy/conn/); a raw tunnel relays as bytes come.
                if raw_tcp {
                    let _ = stream.set_nodelay(true);
                }
                // Registered with the reactor only if it has to wait.
                serve(
                    &shared,
                    proxy::LazyTcp::new(stream),
                    Peer::Tcp(peer),
                    raw_tcp,
                );
            }
            Ok(Accepted::Unix(stream)) => serve(&shared, stream, Peer::Unix, raw_tcp),
            Err(err) => {
                // EMFILE and friends: back off instead of spinning; the
                // pending connection stays in the backlog.
                tracing::warn!(error = %err, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        }
    }
    drop(resumed_on);
    drop(listener);
    drop(cleanup);
    tracing::info!("listener closed; no new connections");
}

enum Accepted {
    Tcp(std::net::TcpStream, SocketAddr),
    Unix(tokio::net::UnixStream),
}

async fn accept(listener: &Listener) -> std::io::Result<Accepted> {
    match listener {
        Listener::Tcp(l) => l.accept().await.map(|(s, p)| Accepted::Tcp(s, p)),
        Listener::Unix(l) => l.accept().await.map(|(s, _)| Accepted::Unix(s)),
    }
}

fn serve<S: proxy::Downstream>(shared: &Arc<Shared>, stream: S, peer: Peer, raw_tcp: bool) {
    if proxy::over_connection_cap(shared) {
        return;
    }
    let guard = shared.drain.connection();
    let shared = shared.clone();
    if raw_tcp {
        tokio::spawn(tcp::serve_connection(shared, stream, peer, guard));
    } else {
        tokio::spawn(proxy::serve_connection(shared, stream, peer, guard));
    }
}
