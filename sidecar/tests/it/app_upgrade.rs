//! Upgrading the app behind the sidecar outside Kubernetes: the blue/green
//! recipe of docs/outside-kubernetes.md, under constant load.
//!
//! Recipe: the sidecar gets two upstream slots (`--upstream BLUE --upstream
//! GREEN`); v1 serves in BLUE. v2 starts in GREEN; the sidecar sends new
//! requests to it as soon as it accepts connections; `GET /upstreams`
//! shows BLUE's in-flight count reach 0; v1 is stopped. Nothing fails,
//! even though v1 is stopped the naive way (every connection dropped at
//! once).
//!
//! Baseline: one upstream, v1 stopped the same way and v2 started on the
//! same address at once: requests fail (in flight at v1, or sent while
//! nothing listened). In both runs one extra request keeps v1 busy for
//! 1.5 s: the recipe lets it finish on v1, the in-place restart loses it.

use std::net::SocketAddr;
use std::time::Duration;

use crate::kit::WAIT;
use crate::kit::app::TestApp;
use crate::kit::free_port;
use crate::kit::load::Load;
use crate::kit::upgrade::Upgradable;
use anyhow::{Context, Result, ensure};

async fn upstreams(admin: SocketAddr) -> Result<serde_json::Value> {
    let resp = crate::kit::http::get(admin, "/upstreams").await?;
    ensure!(resp.status.is_success(), "/upstreams: {}", resp.status);
    serde_json::from_slice(&resp.body).context("/upstreams is JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blue_green_app_upgrade_loses_nothing_an_in_place_restart_does() -> Result<()> {
    // The recipe.
    let blue = TestApp::start("v1").await?;
    let green_addr = free_port()?;
    let proc = Upgradable::start(blue.addr, &["--upstream", &green_addr.to_string()]).await?;
    let before = upstreams(proc.admin).await?;
    ensure!(
        before["active"] == blue.addr.to_string(),
        "v1 is the only one up: {before}"
    );
    let load = Load::against(proc.listen, 4, 4);
    load.wait_ok(200, WAIT).await?;
    let long = long_request(proc.listen, &load).await?;

    let green = TestApp::start_on("v2", green_addr).await?;
    crate::kit::wait_for(
        "new requests to go to v2",
        Duration::from_secs(10),
        || async {
            let now = upstreams(proc.admin).await.ok()?;
            (now["active"] == green_addr.to_string()).then_some(())
        },
    )
    .await?;
    let drained = crate::kit::wait_for(
        "nothing in flight on v1",
        Duration::from_secs(10),
        || async {
            let now = upstreams(proc.admin).await.ok()?;
            (now["upstreams"][0]["inFlight"] == 0).then_some(now)
        },
    )
    .await?;
    eprintln!("before stopping v1: {drained}");
    let v1_served = blue.served();
    blue.kill().await;
    load.wait_ok(300, WAIT).await?;
    let recipe = load.stop().await?;
    let long_recipe = long.await.context("join")?;
    let v2_served = green.served();
    eprintln!(
        "blue/green: {} (v1 served {v1_served}, v2 {v2_served})",
        recipe.summary()
    );
    let metrics = crate::kit::http::get(proc.admin, "/metrics").await?.text();
    ensure!(
        metrics.contains(&format!(
            "kubegrace_upstream_active{{upstream=\"{green_addr}\"}} 1"
        )),
        "{metrics}"
    );
    proc.stop().await?;

    // Baseline: the same stop, v2 started in place on the one upstream.
    let v1 = TestApp::start("v1").await?;
    let addr = v1.addr;
    let proc = Upgradable::start(addr, &[]).await?;
    let load = Load::against(proc.listen, 4, 4);
    load.wait_ok(200, WAIT).await?;
    let long = long_request(proc.listen, &load).await?;
    v1.kill().await;
    drop(v1);
    let _v2 = TestApp::start_on("v2", addr).await?;
    load.wait_ok(300, WAIT).await?;
    let in_place = load.stop().await?;
    let long_in_place = long.await.context("join")?;
    eprintln!("in-place restart: {}", in_place.summary());
    proc.stop().await?;

    recipe.ensure_lost_nothing("the blue/green recipe")?;
    ensure!(long_recipe, "the long request on v1 finished there");
    ensure!(v2_served >= 300, "v2 took over: served {v2_served}");
    ensure!(
        !long_in_place || in_place.failed() > 0,
        "the in-place restart lost nothing, so the comparison shows nothing: {}",
        in_place.summary()
    );
    Ok(())
}

/// Besides the load, one request v1 works on for 1.5 s: it is in flight
/// when v2 comes up (the recipe must let it finish on v1) or when v1 is
/// killed (the baseline loses it). Resolves to whether it got a 200.
async fn long_request(listen: SocketAddr, load: &Load) -> Result<tokio::task::JoinHandle<bool>> {
    let handle = tokio::spawn(async move {
        crate::kit::http::get(listen, "/work?ms=1500")
            .await
            .is_ok_and(|r| r.status.is_success())
    });
    // It reaches the app long before the load completes 100 more requests
    // (a few ms against tens of ms).
    load.wait_ok(100, WAIT).await?;
    Ok(handle)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_the_active_instance_goes_away_new_requests_go_to_the_other() -> Result<()> {
    // Both up at start: the first listed is active.
    let a = TestApp::start("a").await?;
    let b = TestApp::start("b").await?;
    let proc = Upgradable::start(a.addr, &["--upstream", &b.addr.to_string()]).await?;
    let now = upstreams(proc.admin).await?;
    ensure!(now["active"] == a.addr.to_string(), "{now}");
    ensure!(now["upstreams"][1]["state"] == "up", "{now}");
    a.kill().await;
    crate::kit::wait_for("b to take over", Duration::from_secs(10), || async {
        let now = upstreams(proc.admin).await.ok()?;
        (now["active"] == b.addr.to_string()).then_some(())
    })
    .await?;
    let resp = crate::kit::http::get(proc.listen, "/work").await?;
    ensure!(
        resp.status.is_success() && resp.text().contains("ok b"),
        "{} {}",
        resp.status,
        resp.text()
    );
    // Ready while any instance is up.
    let ready = crate::kit::http::get(proc.admin, "/ready").await?;
    ensure!(ready.status.is_success(), "{}", ready.status);
    proc.stop().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blue_green_over_unix_sockets_loses_nothing_an_in_place_restart_does() -> Result<()> {
    let dir = crate::kit::scratch_dir("bg")?;
    let (blue_path, green_path) = (dir.join("blue.sock"), dir.join("green.sock"));
    let (blue_ep, green_ep) = (
        format!("unix:{}", blue_path.display()),
        format!("unix:{}", green_path.display()),
    );
    let blue = TestApp::start_unix("v1", &blue_path).await?;
    let proc = Upgradable::start_general(&blue_ep, &["--upstream", &green_ep], &[]).await?;
    let load = Load::against(proc.listen, 4, 4);
    load.wait_ok(200, WAIT).await?;
    let long = long_request(proc.listen, &load).await?;
    let green = TestApp::start_unix("v2", &green_path).await?;
    crate::kit::wait_for("v2 active", Duration::from_secs(10), || async {
        let now = upstreams(proc.admin).await.ok()?;
        (now["active"] == green_ep.as_str()).then_some(())
    })
    .await?;
    crate::kit::wait_for(
        "nothing in flight on v1",
        Duration::from_secs(10),
        || async {
            let now = upstreams(proc.admin).await.ok()?;
            (now["upstreams"][0]["inFlight"] == 0).then_some(())
        },
    )
    .await?;
    blue.kill().await;
    load.wait_ok(300, WAIT).await?;
    let recipe = load.stop().await?;
    let long_recipe = long.await.context("join")?;
    eprintln!(
        "blue/green over unix: {} (v2 served {})",
        recipe.summary(),
        green.served()
    );
    proc.stop().await?;
    drop(green);

    // Baseline: one Unix upstream, v1 killed and v2 started on its path.
    let v1 = TestApp::start_unix("v1", &blue_path).await?;
    let proc = Upgradable::start_general(&blue_ep, &[], &[]).await?;
    let load = Load::against(proc.listen, 4, 4);
    load.wait_ok(200, WAIT).await?;
    let long = long_request(proc.listen, &load).await?;
    v1.kill().await;
    let _v2 = TestApp::start_unix("v2", &blue_path).await?;
    load.wait_ok(300, WAIT).await?;
    let in_place = load.stop().await?;
    let long_in_place = long.await.context("join")?;
    eprintln!("in-place restart over unix: {}", in_place.summary());
    proc.stop().await?;
    let _ = std::fs::remove_dir_all(&dir);

    recipe.ensure_lost_nothing("the blue/green recipe over unix sockets")?;
    ensure!(long_recipe, "the long request on v1 finished there");
    ensure!(
        !long_in_place || in_place.failed() > 0,
        "the in-place restart lost nothing, so the comparison shows nothing: {}",
        in_place.summary()
    );
    Ok(())
}
