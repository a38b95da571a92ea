//! Raw TCP pass-through (`protocol: tcp`) for ports that are not HTTP.
//!
//! Nothing inside the stream can be told to go away, so the drain works on
//! connections: they are served through `Draining` and `Closing` until they
//! end on their own, and whatever is still open at the deadline is closed
//! and counted as force-closed. A connection (or upgraded tunnel) on which
//! no byte moved either way for `limits.tunnelIdleTimeout` is closed and
//! counted (`kubegrace_client_timeouts_total{kind="tunnel_idle"}`). The
//! copy loop, its idle timeout and the deadline cut are `crate::tunnel`,
//! shared with upgraded HTTP/1.1 connections.

use std::sync::Arc;

use crate::drain::ConnGuard;
use crate::state::Shared;
use crate::tunnel::TunnelEnd;

pub(crate) async fn serve_connection<S>(
    shared: Arc<Shared>,
    mut downstream: S,
    peer: crate::listen::Peer,
    mut guard: ConnGuard,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    // Held for the connection's life: it counts as in flight on this app
    // instance, and stays with it if new connections move elsewhere.
    let picked = shared.upstreams.pick();
    let endpoint = picked.endpoint();
    // The upstream's connect is bounded by `upstreamPool.connectTimeout`.
    let mut upstream = match picked.connect().await {
        Ok(stream) => stream,
        Err(err) => {
            shared.metrics.tcp_connect_error();
            tracing::warn!(%peer, upstream = %endpoint, error = %err, "cannot reach the app; closing the client connection");
            return;
        }
    };
    match crate::tunnel::run(&shared, &mut downstream, &mut upstream, &mut guard).await {
        TunnelEnd::Closed(Err(err)) => {
            tracing::debug!(%peer, error = %err, "tcp connection ended with an error");
        }
        TunnelEnd::Closed(Ok(_)) => {}
        TunnelEnd::Idle => {
            tracing::debug!(%peer, "tcp connection idle past limits.tunnelIdleTimeout; closing");
        }
        TunnelEnd::Forced => {
            tracing::debug!(%peer, "drain deadline: force-closing tcp connection");
        }
    }
}
