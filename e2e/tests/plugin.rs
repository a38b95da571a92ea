//! `kubectl kubegrace` on the real cluster, as a user runs it: the `kubectl-kubegrace`
//! binary (built next to this test: `cargo build -p kubectl-kubegrace`, which
//! `e2e/run-cluster-tests` does first; `KUBEGRACE_PLUGIN_BIN` points elsewhere), with the
//! cluster's kubeconfig.
//!
//! - `check` passes on a healthy install (the chart with the local images, an injected
//!   Deployment behind its GraceRoute); then it is shown four problems and names each,
//!   with exit status 1: a route whose target does not exist, a Service that targets the
//!   app's port by number, a pod that asks for the sidecar and has none, a pod whose
//!   sidecar version is not the operator's. `status` reads every sidecar through the
//!   API server's pod proxy.
//! - `verify` rolls an injected Deployment under load from a loadgen Job and passes
//!   (exit 0, no request failed); on a plain Deployment of the same app it fails
//!   (exit 1) and the table attributes the failures (by reason and by pod).
//!
//! Skipped (with a message) outside the cluster tier; see `kubegrace_e2e::cluster_client`.

use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use kubegrace_e2e::plugin_cli::run as plugin;
use kubegrace_e2e::scenario::{
    APP_PORT, Drain, Options, Patience, Progress, graceroute, keep_from_env, kit, suffix,
    with_install,
};
use kubegrace_sidecar_api::keys;
use serde_json::json;

const APP: &str = "web";

/// `check -o json` scoped to the test's namespace and this run's operator.
async fn check(ns: &str, operator_ns: &str) -> Result<(i32, serde_json::Value)> {
    let (code, out, err) = plugin(
        &[
            "check",
            "-o",
            "json",
            "-n",
            ns,
            "--operator-namespace",
            operator_ns,
        ],
        Duration::from_secs(60),
    )
    .await?;
    let json = serde_json::from_str(&out)
        .with_context(|| format!("check gave no JSON (exit {code}): {out}{err}"))?;
    Ok((code, json))
}

/// The problems of a `check -o json` answer, `check: message (fix: ...)` each.
fn problems(report: &serde_json::Value) -> Vec<String> {
    report["findings"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|f| f["ok"] == false)
        .map(|f| {
            format!(
                "{}: {} (fix: {})",
                f["check"].as_str().unwrap_or(""),
                f["message"].as_str().unwrap_or(""),
                f["fix"].as_str().unwrap_or("")
            )
        })
        .collect()
}

#[tokio::test]
async fn check_passes_on_a_healthy_install_and_names_each_problem_it_is_shown() -> Result<()> {
    let test = "check_passes_on_a_healthy_install_and_names_each_problem_it_is_shown";
    let client = kubegrace_e2e::cluster_or_skip!(test);
    let mut opts = Options::new("kg-plugin-check");
    opts.replicas = 2;
    let p = Progress::default();
    with_install(&client, &opts, &p, keep_from_env(), async |run| {
        let sc = run.scenario("plugin-check").await?;
        let ns = sc.namespace.clone();
        let operator_ns = opts.release_namespace.clone();
        kit::deploy_with_route(&sc, APP, json!({}), &p).await?;

        // Healthy: exit 0, no problem. The install is fresh, so give the Lease and the
        // route's status a moment.
        let healthy = p
            .wait(
                "check: no problem on the healthy install",
                Patience::new(Duration::from_secs(60), Duration::from_secs(2)),
                || async {
                    let (code, report) = check(&ns, &operator_ns).await.map_err(|e| format!("{e:#}"))?;
                    match (code, problems(&report)) {
                        (0, found) if found.is_empty() => Ok(report),
                        (code, found) => Err(format!("exit {code}: {found:?}")),
                    }
                },
            )
            .await?;
        let checks: Vec<&str> = healthy["findings"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|f| f["check"].as_str())
            .collect();
        for expected in [
            "operator", "leader", "webhook", "ca-bundle", "certificate", "crd", "injection",
            "sidecar-version", "service-bypass", "route",
        ] {
            ensure!(checks.contains(&expected), "check {expected} missing from {checks:?}");
        }
        p.step(format!("healthy: {} findings, all ok", checks.len()));

        // status reads each sidecar through the pod proxy.
        let (code, out, err) = plugin(&["status", &format!("groute/{APP}"), "-n", &ns], Duration::from_secs(60)).await?;
        p.step(format!("status groute/{APP}:\n{out}"));
        ensure!(code == 0, "status exit {code}: {out}{err}");
        ensure!(
            out.lines().filter(|l| l.starts_with(APP) && l.contains("serving")).count() == 2,
            "status should show both pods serving:\n{out}"
        );

        // Four problems.
        sc.post_route(&graceroute("ghost", &opts.drain, json!({}))?).await?;
        let services: Api<Service> = Api::namespaced(client.clone(), &ns);
        services
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "metadata": {"name": "web-direct"},
                    "spec": {"selector": {"app": APP}, "ports": [{"port": 80, "targetPort": APP_PORT}]},
                }))?,
            )
            .await
            .context("creating Service web-direct")?;
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let mut bare = kubegrace_e2e::scenario::demo_container();
        bare["resources"] = json!({"requests": {"cpu": "10m", "memory": "16Mi"}});
        pods.create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "uninjected", "labels": {"app": "lonely", (keys::INJECT): "enabled"}},
                "spec": {"automountServiceAccountToken": false, "containers": [bare]},
            }))?,
        )
        .await
        .context("creating pod uninjected")?;
        let stale = kubegrace_e2e::a_pod_of(&pods, APP)
            .await?
            .context("no pod of web")?;
        pods.patch(
            &stale,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {(keys::SIDECAR_VERSION): "0.0.0-stale"}}})),
        )
        .await
        .context("marking a pod stale")?;

        let expected = [
            ("route", "GraceRoute ".to_owned() + &ns + "/ghost"),
            ("service-bypass", "Service web-direct port 80 targets 8080 by number".to_owned()),
            ("injection", format!("pod {ns}/uninjected asks for the sidecar and has none")),
            ("sidecar-version", format!("pod {ns}/{stale} runs sidecar 0.0.0-stale")),
        ];
        let (code, found) = p
            .wait(
                "check: each of the four problems named",
                Patience::new(Duration::from_secs(60), Duration::from_secs(2)),
                || async {
                    let (code, report) = check(&ns, &operator_ns).await.map_err(|e| format!("{e:#}"))?;
                    let found = problems(&report);
                    let missing: Vec<&str> = expected
                        .iter()
                        .filter(|(check, what)| {
                            !found.iter().any(|f| f.starts_with(check) && f.contains(what.as_str()))
                        })
                        .map(|(check, _)| *check)
                        .collect();
                    if missing.is_empty() {
                        Ok((code, found))
                    } else {
                        Err(format!("not named yet: {missing:?}; found {found:?}"))
                    }
                },
            )
            .await?;
        for f in &found {
            p.step(format!("  problem: {f}"));
        }
        ensure!(code == 1, "check exit {code} with {} problems", found.len());
        ensure!(
            found.iter().all(|f| !f.ends_with("(fix: )")),
            "a problem without its fix: {found:?}"
        );
        ensure!(
            found.len() == expected.len(),
            "problems beyond the four shown: {found:?}"
        );
        // The text form exits 1 too, a fix under each problem.
        let (code, text, _) = plugin(
            &["check", "-n", &ns, "--operator-namespace", &operator_ns],
            Duration::from_secs(60),
        )
        .await?;
        ensure!(code == 1 && text.contains("kubegrace: 4 problems"), "text check exit {code}:\n{text}");
        ensure!(text.matches("fix: ").count() == 4, "one fix per problem:\n{text}");
        Ok(())
    })
    .await
}

#[tokio::test]
async fn verify_passes_on_an_injected_deployment_and_fails_on_a_plain_one() -> Result<()> {
    let test = "verify_passes_on_an_injected_deployment_and_fails_on_a_plain_one";
    let client = kubegrace_e2e::cluster_or_skip!(test);
    let mut opts = Options::new("kg-plugin-verify");
    opts.replicas = 2;
    // What a user gets: the sidecar's default drain timers (as `make demo`).
    opts.drain = Drain::product_defaults();
    let p = Progress::default();
    let loadgen = opts.loadgen_image();
    kubegrace_e2e::require_images(&client, std::slice::from_ref(&loadgen)).await?;
    with_install(&client, &opts, &p, keep_from_env(), async |run| {
        let sc = run.scenario("plugin-verify").await?;
        let ns = sc.namespace.clone();
        kit::deploy_with_route(&sc, APP, json!({}), &p).await?;
        sc.create_app("plain", false, &p).await?;
        sc.settle("plain", false, &p).await?;

        let runs = std::env::temp_dir().join(format!("kg-plugin-verify-{}", suffix()));
        std::fs::create_dir_all(&runs)?;
        let verify = |name: &'static str| {
            let ns = ns.clone();
            let loadgen = loadgen.clone();
            let out = runs.join(format!("{name}.json")).display().to_string();
            async move {
                plugin(
                    &[
                        "verify",
                        &format!("deploy/{name}"),
                        "-n",
                        &ns,
                        "--rate",
                        "100",
                        "--duration",
                        "200s",
                        "--path",
                        "/delay?ms=50",
                        "--loadgen-image",
                        &loadgen,
                        "--out",
                        &out,
                    ],
                    Duration::from_secs(300),
                )
                .await
            }
        };
        let (code, out, err) = verify(APP).await?;
        p.step(format!("verify deploy/{APP} (exit {code}):\n{out}"));
        if code != 0 {
            bail!("verify on the injected Deployment: exit {code}\n{out}{err}");
        }
        ensure!(out.contains("PASS") && out.contains("deploy/web"), "{out}");
        // `--out` (what `make demo` reads): the same run, with each old pod's termination
        // on the timeline, after the restart.
        let path = runs.join(format!("{APP}.json"));
        let run: kubegrace_e2e::load::report::DemoRun =
            serde_json::from_str(&std::fs::read_to_string(&path)?)
                .with_context(|| format!("{} is not a run", path.display()))?;
        ensure!(
            run.summary.failed == 0
                && out.contains(&format!("PASS: {} requests", run.summary.requests)),
            "--out disagrees with the table: {run:?}\n{out}"
        );
        let restart = run.rollout_start_s.context("no rollout start in --out")?;
        ensure!(
            run.events.len() == 2
                && run
                    .events
                    .iter()
                    .all(|e| e.label.ends_with(" terminating") && e.t_s >= restart),
            "expected both old pods marked terminating after the restart at {restart:.1}s: {:?}",
            run.events
        );

        let (code, out, err) = verify("plain").await?;
        let _ = std::fs::remove_dir_all(&runs);
        p.step(format!("verify deploy/plain (exit {code}):\n{out}"));
        ensure!(
            code == 1,
            "verify on the plain Deployment: exit {code}, expected 1\n{out}{err}"
        );
        ensure!(out.contains("FAIL:"), "{out}");
        // Attributed: by reason in the table, and to the pods that dropped them (a
        // refused connection never reached one: `(unknown)`).
        let by_pod = out
            .lines()
            .find(|l| l.starts_with("deploy/plain: failed by pod:"))
            .with_context(|| format!("the failures are not attributed to pods:\n{out}"))?;
        ensure!(
            by_pod.contains(" plain-"),
            "no pod of plain named: {by_pod}"
        );
        Ok(())
    })
    .await
}
