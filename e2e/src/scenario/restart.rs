//! Restarts inside a pod that stays, under load: what the `app_restart` suite (liveness,
//! the sidecar's own crash) and the `lifecycle` suite (in-place restarts and resizes,
//! a sidecar killed mid-drain) share. The victim is always a pod the load is reaching at
//! that moment, and "restarted" means the container runs again under a new container ID,
//! which holds for every way the kubelet restarts one (a restart count can be reset by
//! `RestartAllContainers`).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kubegrace_sidecar_api::admin::path as admin_path;

use super::kit::{self, PodAddr};
use super::{Options, Patience, Progress, Scenario, pod_ready};
use crate::load::Summary;

/// The restart count of container `container` of pod `pod` (app or init container).
pub async fn restarts(pods: &Api<Pod>, pod: &str, container: &str) -> Result<i32> {
    let p = pods.get(pod).await?;
    let status = p.status.unwrap_or_default();
    crate::container_statuses(&status)
        .find(|c| c.name == container)
        .map(|c| c.restart_count)
        .with_context(|| format!("pod {pod}: no status for container {container}"))
}

/// One ready pod of `app` (the first listed); an error when there is none.
pub async fn a_ready_pod(pods: &Api<Pod>, app: &str) -> Result<PodAddr> {
    kit::ready_pods(pods, app)
        .await?
        .into_iter()
        .next()
        .with_context(|| format!("{app}: no ready pod"))
}

/// The ID of container `container` of `pod` while it runs; `None` while it does not.
pub fn running_container_id(pod: &Pod, container: &str) -> Option<String> {
    let status = pod.status.as_ref()?;
    crate::container_statuses(status)
        .find(|c| c.name == container)
        .filter(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
        .and_then(|c| c.container_id.clone())
}

/// A metric's value from a sidecar's `/metrics`, read from this host on the pod IP.
pub async fn sidecar_metric(admin: &str, name: &str) -> Result<f64> {
    let (status, _, body) =
        kit::http1(admin, "GET", admin_path::METRICS, Duration::from_secs(3)).await?;
    ensure!(status == 200, "GET http://{admin}/metrics: {status}");
    body.lines()
        .find_map(|l| {
            let (k, v) = l.split_once(' ')?;
            (k == name).then(|| v.trim().parse::<f64>().ok()).flatten()
        })
        .with_context(|| format!("no {name} on {admin}"))
}

/// `/delay` requests each pod's app has seen so far (its `/stats`), in `pods` order.
async fn delay_requests(pods: &[PodAddr]) -> Result<Vec<u64>> {
    let mut seen = Vec::with_capacity(pods.len());
    for pod in pods {
        let stats = kit::app_stats(&pod.app()).await?;
        seen.push(kit::stat(&stats, "/delay", "requests"));
    }
    Ok(seen)
}

/// The pod whose app served the most load requests over the last two seconds; an error
/// when none served any (the load is not reaching the pods, so nothing could be shown).
pub async fn busiest_pod(pods: &[PodAddr], p: &Progress) -> Result<PodAddr> {
    let before = delay_requests(pods).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = delay_requests(pods).await?;
    let served: Vec<u64> = after
        .iter()
        .zip(&before)
        .map(|(a, b)| a.saturating_sub(*b))
        .collect();
    let (busiest, most) = served
        .iter()
        .enumerate()
        .max_by_key(|(_, n)| **n)
        .map(|(i, n)| (i, *n))
        .context("no pods")?;
    let shares: Vec<String> = pods
        .iter()
        .zip(&served)
        .map(|(pod, n)| format!("{} {n}", pod.name))
        .collect();
    p.step(format!(
        "load requests served in 2s per pod: {}",
        shares.join(", ")
    ));
    ensure!(
        most > 0,
        "no pod's app served a load request in 2s: the load does not reach the pods"
    );
    Ok(pods[busiest].clone())
}

/// The local cluster's crictl (on PATH after `eval "$(e2e/cluster/env)"`).
fn crictl() -> PathBuf {
    std::env::var_os("KUBEGRACE_TOOLS_BIN")
        .map(|d| PathBuf::from(d).join("crictl"))
        .filter(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from("crictl"))
}

/// Runs crictl with `args` (at most 30 s) and returns its standard output.
pub async fn run_crictl(args: &[&str]) -> Result<String> {
    let out = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::process::Command::new(crictl())
            .args(args)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .context("crictl took longer than 30s")?
    .with_context(|| {
        format!(
            "running {} (on PATH after eval \"$(e2e/cluster/env)\")",
            crictl().display()
        )
    })?;
    if !out.status.success() {
        bail!(
            "crictl {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Stops the running container `container` of pod `pod` with SIGKILL, as a crash or an OOM
/// kill does (exit code 137), through the node's container runtime.
pub async fn kill_container(namespace: &str, pod: &str, container: &str) -> Result<()> {
    let ids = run_crictl(&[
        "ps",
        "-q",
        "--name",
        container,
        "--label",
        &format!("io.kubernetes.pod.name={pod}"),
        "--label",
        &format!("io.kubernetes.pod.namespace={namespace}"),
    ])
    .await?;
    let id = ids
        .lines()
        .map(str::trim)
        .find(|s| !s.is_empty())
        .with_context(|| format!("crictl finds no running {container} container in pod {pod}"))?
        .to_owned();
    run_crictl(&["stop", "--timeout", "0", &id]).await?;
    Ok(())
}

/// The options of a restart under load: the chart's `sidecar.mode` = `mode`, three
/// replicas, a constant load of 200 ms requests.
pub fn restart_options(release: &str, mode: &str) -> Result<Options> {
    let mut opts = Options::new(release).with_load_from_env()?;
    opts.chart_values.push(("sidecar.mode".into(), mode.into()));
    opts.replicas = 3;
    // minDelay covers the sidecar's readiness period (2 s) plus endpoint propagation:
    // here the pod is not terminating, so only its readiness takes it out of the Service.
    opts.drain.min_delay = "3s".into();
    opts.drain.max_delay = "8s".into();
    opts.load.lead_in = Duration::from_secs(2);
    // Requests that stay in the app for 200 ms: at 100/s about seven are in flight on the
    // victim when kubelet kills its app, so the baseline's loss does not hang on the
    // chance that none was (at 50 ms about two were, and CI once saw none lost).
    opts.load.path = "/delay?ms=200".into();
    opts.load.rate = 100.0;
    opts.load.max_duration = Duration::from_secs(120);
    Ok(opts)
}

/// What a restart under load showed.
pub struct Restarted {
    pub summary: Summary,
    pub victim: PodAddr,
    /// From the trigger until the pod was Ready again.
    pub ready_after: Duration,
}

/// Under load on the Service of `name`: picks the busiest pod, runs `trigger` on it, waits
/// until its container `container` runs again under a new ID and the pod is Ready again
/// (`patience` for each), lets the pod take its share for 4 s, and stops the load.
pub async fn restart_under_load<F, Fut>(
    sc: &Scenario,
    name: &str,
    container: &str,
    patience: Duration,
    p: &Progress,
    trigger: F,
) -> Result<Restarted>
where
    F: FnOnce(PodAddr) -> Fut,
    Fut: Future<Output = Result<()>>,
{
    let pods: Api<Pod> = Api::namespaced(sc.client.clone(), &sc.namespace);
    let candidates = kit::ready_pods(&pods, name).await?;
    ensure!(!candidates.is_empty(), "{name}: no ready pod");
    let load = sc.start_load(name, p).await?;
    let outcome = async {
        // The victim is a pod the load is reaching now: a keep-alive pool reuses its most
        // recent connections, so a pod picked blindly may carry none of them, and its
        // restart would then prove nothing either way.
        let victim = busiest_pod(&candidates, p).await?;
        let before = running_container_id(&pods.get(&victim.name).await?, container)
            .with_context(|| format!("pod {}: {container} is not running", victim.name))?;
        let started = Instant::now();
        trigger(victim.clone()).await?;
        p.wait(
            &format!("{name}: pod {}'s {container} runs again", victim.name),
            Patience::new(patience, Duration::from_millis(200)),
            || async {
                let pod = pods.get(&victim.name).await.map_err(|e| e.to_string())?;
                match running_container_id(&pod, container) {
                    Some(id) if id != before => Ok(()),
                    Some(_) => Err("still the same container".to_owned()),
                    None => Err("not running".to_owned()),
                }
            },
        )
        .await?;
        p.wait(
            &format!("{name}: pod {} Ready again", victim.name),
            Patience::new(patience, Duration::from_millis(100)),
            || async {
                let pod = pods.get(&victim.name).await.map_err(|e| e.to_string())?;
                if pod_ready(&pod) {
                    Ok(())
                } else {
                    Err("not ready".to_owned())
                }
            },
        )
        .await?;
        let ready_after = started.elapsed();
        p.step(format!(
            "{name}: pod {} Ready {:.1}s after the trigger",
            victim.name,
            ready_after.as_secs_f64()
        ));
        // The pod takes its share again before the load stops.
        tokio::time::sleep(Duration::from_secs(4)).await;
        Ok::<_, anyhow::Error>((victim, ready_after))
    }
    .await;
    let summary = load.finish(p).await?;
    let (victim, ready_after) = outcome?;
    Ok(Restarted {
        summary,
        victim,
        ready_after,
    })
}
