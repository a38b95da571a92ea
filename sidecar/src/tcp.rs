//! Raw TCP pass-through (`protocol: tcp`) for ports that are not HTTP.
//!
//! Nothing inside the stream can be told to go away, so the drain works on
//! connections: they are served through `Draining` and `Closing` until they
//! end on their own, and whatever is still open at the deadline is closed
//! and counted as force-closed.

use std::sync::Arc;

use crate::drain::ConnGuard;
use crate::state::Shared;

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
    let mut drain_rx = shared.drain.subscribe();
    tokio::select! {
        res = tokio::io::copy_bidirectional(&mut downstream, &mut upstream) => {
            if let Err(err) = res {
                tracing::debug!(%peer, error = %err, "tcp connection ended with an error");
            }
        }
        _ = drain_rx.wait_for(|s| s.force_close) => {
            tracing::debug!(%peer, "drain deadline: force-closing tcp connection");
            guard.mark_forced();
        }
    }
}
