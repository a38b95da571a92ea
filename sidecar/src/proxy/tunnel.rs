//! After a `101 Switching Protocols`: the client's and the app's upgraded
//! connections joined into one tunnel.

use std::sync::Arc;

use hyper_util::rt::TokioIo;

use crate::metrics::ClientTimeout;
use crate::state::Shared;

/// Joins an upgraded downstream connection (WebSocket, ...) to the app's
/// upgraded connection. The tunnel counts as an open connection for the
/// drain: it is left alone until the deadline, then closed and counted.
pub(super) fn spawn_tunnel(
    shared: Arc<Shared>,
    downstream: hyper::upgrade::OnUpgrade,
    upstream: hyper::upgrade::OnUpgrade,
) {
    let mut guard = shared.drain.track();
    shared.metrics.upgrade();
    tokio::spawn(async move {
        let (down, up) = match tokio::try_join!(downstream, upstream) {
            Ok(pair) => pair,
            Err(err) => {
                tracing::debug!(error = %err, "upgrade did not complete");
                return;
            }
        };
        let mut down = TokioIo::new(down);
        let mut up = TokioIo::new(up);
        let mut drain_rx = shared.drain.subscribe();
        let idle = shared.live.load().config.limits.tunnel_idle_timeout.get();
        tokio::select! {
            end = crate::tcp::copy_with_idle(&mut down, &mut up, idle) => match end {
                crate::tcp::TunnelEnd::Closed(Err(err)) => {
                    tracing::debug!(error = %err, "upgraded connection ended with an error");
                }
                crate::tcp::TunnelEnd::Closed(Ok(_)) => {}
                crate::tcp::TunnelEnd::Idle => {
                    shared.metrics.client_timeout(ClientTimeout::TunnelIdle);
                    tracing::debug!("upgraded connection idle past limits.tunnelIdleTimeout; closing");
                }
            },
            _ = drain_rx.wait_for(|s| s.force_close) => {
                tracing::debug!("drain deadline: closing upgraded connection");
                guard.mark_forced();
            }
        }
    });
}
