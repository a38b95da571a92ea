//! A WebSocket in flight at the drain: it cannot be told to move (there is
//! no GOAWAY or `Connection: close` for a tunnel), so the sidecar must keep
//! it working through the whole drain, close it only
//! at the drain timeout, and count it as force-closed. This is the `cut`
//! mode (`drain.websocketClose: cut`); the default Close 1001 is in
//! drain_websocket_close.rs.

use std::time::Duration;

use crate::kit::WAIT;
use crate::kit::app::TestApp;
use crate::kit::http::echoing_websocket;
use crate::kit::sidecar::drain_flags;
use crate::kit::sidecar::{Sidecar, SidecarSpec};
use crate::kit::within;
use anyhow::{Context, Result, bail, ensure};
use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message;

const DRAIN: &[&str] = &drain_flags("300ms", "200ms", "3s", "2s");
const CUT: &[&str] = &["--drain-websocket-close", "cut"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_survives_the_grace_phase_and_is_force_closed_at_the_timeout() -> Result<()> {
    let app = TestApp::start("a").await?;
    let mut sidecar = Sidecar::start(SidecarSpec::new(app.addr).args(DRAIN).args(CUT)).await?;

    let mut ws = echoing_websocket(sidecar.listen).await?;

    // /drain rather than SIGTERM: the process stays up to show its metrics.
    sidecar.start_drain().await?;

    // Echo every 100ms and note the drain phase each echo happened in.
    let mut echoed_in_phase = [0u32; 4];
    let mut end: Option<(String, f64)> = None;
    for i in 0..300 {
        let phase = sidecar
            .metrics()
            .await?
            .sum("kubegrace_drain_phase")
            .context("no drain phase")?;
        let text = format!("message {i}");
        if let Err(e) = ws.send(Message::text(text.clone())).await {
            end = Some((format!("send failed: {e}"), phase));
            break;
        }
        match within("echo", WAIT, ws.next()).await? {
            Some(Ok(Message::Text(t))) if t.as_str() == text => {
                echoed_in_phase[(phase as usize).min(3)] += 1;
            }
            Some(Ok(Message::Close(frame))) => {
                end = Some((format!("close frame {frame:?}"), phase));
                break;
            }
            Some(Ok(other)) => bail!("unexpected message {other:?}"),
            Some(Err(e)) => {
                end = Some((format!("{e}"), phase));
                break;
            }
            None => {
                end = Some(("stream ended without a close frame".into(), phase));
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (end, ended_in) = end.context("the WebSocket was never closed (30s of echoes)")?;
    println!(
        "websocket: echoes by drain phase [serving, draining, closing, drained] = {echoed_in_phase:?}; ended by {end}"
    );

    // Force-closed, as `cut` says: the tunnel is dropped, no Close frame
    // (that is the default mode's 1001), and not before the drain
    // reached `Closing` (phase 2), where its timeout runs.
    ensure!(
        !end.starts_with("close frame"),
        "the WebSocket was closed with a Close frame, not cut: {end}"
    );
    ensure!(
        ended_in >= 2.0,
        "the WebSocket ended in drain phase {ended_in}, before the drain timeout: {end}"
    );
    ensure!(
        echoed_in_phase[1] > 0,
        "no echo while draining (grace phase): {echoed_in_phase:?}"
    );
    ensure!(
        echoed_in_phase[2] > 0,
        "no echo once closing: the tunnel was cut before the drain timeout: {echoed_in_phase:?}"
    );
    // Closed at the timeout, and counted.
    sidecar.wait_phase(3.0).await?;
    let metrics = sidecar.metrics().await?;
    metrics.expect_cut_at_least(1.0, "the WebSocket was not counted as force-closed")?;

    sidecar.signal("TERM")?;
    sidecar.exits_cleanly().await?;
    match sidecar.drain_summary() {
        Some((_, forced)) if forced >= 1 => Ok(()),
        other => bail!(
            "exit summary {other:?} does not count the WebSocket:\n{}",
            sidecar.logs_text()
        ),
    }
}
