//! `proxy.underscoresInHeaders`: header names with an underscore are
//! dropped by default (fast_path.rs's differential test shows it) and
//! reach the app, on both HTTP/1 paths, when the config keeps them.

use anyhow::{Result, ensure};

use crate::kit::sidecar::{InProcess, SidecarSpec};
use crate::kit::wire::{WireApp, exchange};

const REQUEST: &[u8] =
    b"GET /plain HTTP/1.1\r\nHost: a\r\nX_Real_IP: 192.0.2.1\r\nX-Ok: 1\r\nConnection: close\r\n\r\n";

async fn app_sees(fast_path: &str, config: &str) -> Result<String> {
    let app = WireApp::start().await?;
    let mut spec = SidecarSpec::new(app.addr).args(&["--http1-fast-path", fast_path]);
    if !config.is_empty() {
        spec = spec.config(config);
    }
    let sidecar = InProcess::start(spec).await?;
    exchange(sidecar.listen, REQUEST).await?;
    let seen = app.seen();
    Ok(seen
        .first()
        .map(|raw| String::from_utf8_lossy(raw).into_owned())
        .unwrap_or_default())
}

#[tokio::test]
async fn underscore_names_reach_the_app_only_when_the_config_keeps_them() -> Result<()> {
    for fast_path in ["true", "false"] {
        let dropped = app_sees(fast_path, "").await?;
        ensure!(
            dropped.contains("X-Ok: 1") || dropped.contains("x-ok: 1"),
            "fast path {fast_path}: {dropped:?}"
        );
        ensure!(
            !dropped.to_ascii_lowercase().contains("x_real_ip"),
            "fast path {fast_path}, default: {dropped:?}"
        );
        let kept = app_sees(fast_path, "proxy: {underscoresInHeaders: true}\n").await?;
        ensure!(
            kept.to_ascii_lowercase().contains("x_real_ip: 192.0.2.1"),
            "fast path {fast_path}, underscoresInHeaders: {kept:?}"
        );
    }
    Ok(())
}
