//! After a `101 Switching Protocols`: the client's and the app's upgraded
//! connections joined into one tunnel ([`crate::tunnel`], the copy loop
//! TCP mode uses too), or for a WebSocket with `drain.websocketClose:
//! goingAway`, the frame-aware relay that closes it with Close 1001 at the
//! drain deadline ([`crate::websocket`]).

use std::sync::Arc;

use hyper_util::rt::TokioIo;

use crate::config::WebSocketClose;
use crate::state::Shared;
use crate::tunnel::TunnelEnd;
use crate::websocket::SessionEnd;

/// Joins an upgraded downstream connection (WebSocket, ...) to the app's
/// upgraded connection. The tunnel counts as an open connection for the
/// drain: it is left alone until the deadline, then closed and counted.
/// `websocket`: the handshake was a WebSocket one (`Upgrade: websocket`
/// answered 101).
pub(super) fn spawn_tunnel(
    shared: Arc<Shared>,
    downstream: hyper::upgrade::OnUpgrade,
    upstream: hyper::upgrade::OnUpgrade,
    websocket: bool,
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
        if websocket && shared.drain.timers().websocket_close == WebSocketClose::GoingAway {
            match crate::websocket::run(&shared, down, up, &mut guard).await {
                SessionEnd::Closed(Err(err)) => {
                    tracing::debug!(error = %err, "WebSocket ended with an error");
                }
                SessionEnd::Closed(Ok(())) => {}
                SessionEnd::Idle => {
                    tracing::debug!("WebSocket idle past limits.tunnelIdleTimeout; closing");
                }
                SessionEnd::GoingAway(outcome) => {
                    tracing::debug!(?outcome, "drain: WebSocket closed with 1001 Going Away");
                }
                SessionEnd::Forced => {
                    tracing::debug!("drain deadline: closing WebSocket");
                }
            }
            return;
        }
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
