//! Version skew: a config file written by a newer operator carries keys
//! this sidecar does not know. A reload applies the rest of the file,
//! names each skipped key in a warning, counts them
//! (`kubegrace_config_unknown_keys`) and lists them in `/config`; a
//! restarted sidecar starts on such a file instead of exiting 64. A wrong
//! value of a known key is still refused and the last good config stays.
//! (docs/skew.md)

use std::time::Duration;

use crate::kit::app::TestApp;
use crate::kit::sidecar::{Sidecar, SidecarSpec};
use crate::kit::wait_for;
use anyhow::{Context, Result, ensure};

const WAIT: Duration = Duration::from_secs(15);
const METRIC: &str = "kubegrace_config_unknown_keys";

/// Replaces the sidecar's file with `text` as a ConfigMap update does
/// (write elsewhere, rename), then waits until `/config` counts `n`
/// reloads of the kind `counter` names (`reloads`, `failedReloads`) and
/// returns what it says then.
async fn replace(
    sidecar: &Sidecar,
    text: &str,
    counter: &str,
    n: u64,
) -> Result<serde_json::Value> {
    let path = sidecar.config_path.as_deref().context("config file")?;
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)?;
    wait_for(&format!("{counter} = {n}"), WAIT, || async {
        let now = sidecar.config_json().await.ok()?;
        (now["source"][counter] == n).then_some(now)
    })
    .await
}

/// The sidecar warned about the file's unknown `keys`, naming each, and
/// counts them.
async fn expect_skipped(sidecar: &mut Sidecar, keys: &[&str]) -> Result<()> {
    let line = sidecar
        .wait_log("does not know", Duration::from_secs(5))
        .await?;
    ensure!(
        keys.iter().all(|key| line.contains(key)),
        "the warning names each of {keys:?}: {line}"
    );
    let count = u32::try_from(keys.len())?;
    sidecar
        .metrics()
        .await?
        .expect(METRIC, f64::from(count), "one per skipped key")?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_with_unknown_keys_applies_warns_and_counts_them() -> Result<()> {
    let app = TestApp::start("app").await?;
    let mut sidecar =
        Sidecar::start(SidecarSpec::new(app.addr).config("limits: {maxRequestBodyBytes: 100}\n"))
            .await?;
    sidecar
        .metrics()
        .await?
        .expect(METRIC, 0.0, "a file of known keys")?;

    // What a newer operator would render: a new drain key, a new route key.
    let after = replace(
        &sidecar,
        "limits: {maxRequestBodyBytes: 10}\ndrain: {quiet: 3s, surgeGuard: on}\nroutes:\n- {name: api, match: {pathPrefix: /api}, hedging: {delay: 1s}}\n",
        "reloads",
        1,
    )
    .await?;
    ensure!(after["source"]["failedReloads"] == 0, "{after}");
    ensure!(
        after["config"]["limits"]["maxRequestBodyBytes"] == 10
            && after["config"]["drain"]["quiet"] == "3s"
            && after["config"]["routes"][0]["name"] == "api",
        "the known keys applied: {after}"
    );
    ensure!(
        after["source"]["unknownKeys"]
            == serde_json::json!(["drain.surgeGuard", "routes[0].hedging"]),
        "{after}"
    );
    expect_skipped(&mut sidecar, &["drain.surgeGuard", "routes[0].hedging"]).await?;
    // The applied file is in force: a body over the new limit gets 413.
    crate::kit::http::raw_expect(
        sidecar.listen,
        b"POST /upload HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 50\r\n\r\n",
        413,
        "a body over the reloaded limit",
    )
    .await?;

    // An unknown key next to a wrong value of a known one: refused, and the
    // last good config (and its count) stays.
    let refused = replace(
        &sidecar,
        "limits: {maxRequestBodyBytes: 1000}\ndrain: {quiet: soon}\nnewer: 1\n",
        "failedReloads",
        1,
    )
    .await?;
    ensure!(
        refused["config"]["limits"]["maxRequestBodyBytes"] == 10,
        "the last good config stays: {refused}"
    );
    ensure!(
        refused["source"]["lastError"]
            .as_str()
            .is_some_and(|e| e.contains("soon")),
        "{refused}"
    );
    sidecar
        .metrics()
        .await?
        .expect(METRIC, 2.0, "the config in force did not change")?;

    // Back to known keys only: the count goes to 0.
    replace(
        &sidecar,
        "limits: {maxRequestBodyBytes: 10}\n",
        "reloads",
        2,
    )
    .await?;
    sidecar
        .metrics()
        .await?
        .expect(METRIC, 0.0, "no unknown key left")?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_starts_on_a_file_with_unknown_keys_and_counts_them() -> Result<()> {
    let app = TestApp::start("app").await?;
    let mut sidecar = Sidecar::start(
        SidecarSpec::new(app.addr)
            .config("drain: {quiet: 2s, surgeGuard: on}\nnewSection: {a: 1}\n"),
    )
    .await?;
    expect_skipped(&mut sidecar, &["drain.surgeGuard", "newSection"]).await?;
    let config = sidecar.config_json().await?;
    ensure!(config["config"]["drain"]["quiet"] == "2s", "{config}");
    let resp = crate::kit::http::get(sidecar.listen, "/work").await?;
    ensure!(resp.status.is_success(), "serves: {}", resp.status);
    Ok(())
}
