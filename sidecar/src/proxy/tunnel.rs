//! After a `101 Switching Protocols`: the client's and the app's upgraded
//! connections joined into one tunnel ([`crate::tunnel`], the copy loop
//! TCP mode uses too).

use std::sync::Arc;

use hyper_util::rt::TokioIo;

use crate::state::Shared;
use crate::tunnel::TunnelEnd;

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
        match crate::tunnel::run(&shared, &mut down, &mut up, &mut guard).await {
            TunnelEnd::Closed(Err(err)) => {
                tracing::debug!(error = %err, "upgraded connection ended with an error");
            }
            TunnelEnd::Closed(Ok(_)) => {}
            TunnelEnd::Idle => {
                tracing::debug!("upgraded connection idle past limits.tunnelIdleTimeout; closing");
            }
            TunnelEnd::Forced => {
                tracing::debug!("drain deadline: closing upgraded connection");
            }
        }
    });
}
