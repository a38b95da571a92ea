//! Shared helpers for kubegrace's cluster tests.
//!
//! One gate decides whether a cluster test runs: [`CLUSTER_TIER_ENV`]
//! (`KUBEGRACE_E2E_CLUSTER=1`), which `e2e/run-cluster-tests` (so `make
//! test-cluster`) and CI set. Without it every cluster test prints that it
//! was skipped and passes without reading any kubeconfig, so `cargo test` on
//! a developer's machine never touches the cluster the shell's `KUBECONFIG`
//! points at. With it, a missing kubeconfig, an API server that does not
//! answer or a missing image fails the test: the tier never passes by
//! skipping. The cluster is the one in `KUBEGRACE_E2E_KUBECONFIG`
//! ([`KUBECONFIG_ENV`]), never the shell's `KUBECONFIG`. Every test works in
//! its own temporary namespace, labelled `kubegrace.io/e2e=true`, that is
//! deleted afterwards (also when the test fails).

/// The load generator and the demo's report live in `kubegrace-load`, shared with
/// `kubectl kubegrace verify`; `kubegrace_e2e::load` keeps their old path.
pub use kubegrace_load as load;
pub mod local_app;
pub mod plugin_cli;
pub mod scenario;

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::wait::{Condition, await_condition};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;

/// Label on every namespace a test creates.
pub const E2E_LABEL: &str = "kubegrace.io/e2e";

/// The tag `e2e/cluster/images` gives our images: `KG_IMAGE_TAG`, else `e2e`. Two
/// checkouts testing on one cluster keep apart by using different tags.
pub fn image_tag() -> String {
    std::env::var("KG_IMAGE_TAG")
        .ok()
        .filter(|t| !t.is_empty())
        .unwrap_or_else(|| "e2e".into())
}

/// The sidecar image (built by `e2e/cluster/images`).
pub fn sidecar_image() -> String {
    format!("localhost/kubegrace/sidecar:{}", image_tag())
}

/// The demo app image (built by `e2e/cluster/images`).
pub fn demo_image() -> String {
    std::env::var("KUBEGRACE_E2E_DEMO_IMAGE")
        .unwrap_or_else(|_| format!("localhost/kubegrace/demo-app:{}", image_tag()))
}

/// `rel` inside this checkout (e.g. `charts/kubegrace`). The directory comes from cargo's
/// `CARGO_MANIFEST_DIR` at run time (`cargo test` and `cargo run` set it), and only without
/// it from the compile-time value: a test binary another checkout left in a shared
/// `CARGO_TARGET_DIR`, and that cargo took as fresh, once installed that checkout's chart.
pub fn repo_path(rel: &str) -> PathBuf {
    let manifest_dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .filter(|d| d.join("Cargo.toml").is_file())
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    manifest_dir.join("..").join(rel)
}

/// `1` turns the cluster tier on (set by `e2e/run-cluster-tests` and CI).
pub const CLUSTER_TIER_ENV: &str = "KUBEGRACE_E2E_CLUSTER";
/// The kubeconfig of the cluster under test (set by `e2e/cluster/with-cluster`).
pub const KUBECONFIG_ENV: &str = "KUBEGRACE_E2E_KUBECONFIG";

/// Whether the cluster tier is on: [`CLUSTER_TIER_ENV`] is `1`.
pub fn cluster_tier() -> bool {
    tier_on(std::env::var(CLUSTER_TIER_ENV).ok().as_deref())
}

/// Only `1` turns the tier on: a stray `0` or `false` must not.
fn tier_on(value: Option<&str>) -> bool {
    value.is_some_and(|v| v.trim() == "1")
}

/// The kubeconfig the cluster tests use: [`KUBECONFIG_ENV`]. The shell's
/// `KUBECONFIG` is deliberately ignored.
pub fn kubeconfig_path() -> Option<PathBuf> {
    std::env::var_os(KUBECONFIG_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// The gate of every cluster test: `Ok(None)` outside the cluster tier (the
/// test prints that it was skipped and returns), a client for the cluster
/// under test inside it, or an error that fails the test when the tier is on
/// but the cluster is not there.
pub async fn cluster_client(test: &str) -> Result<Option<Client>> {
    if !cluster_tier() {
        eprintln!(
            "SKIPPED {test}: cluster tier off ({CLUSTER_TIER_ENV}=1 turns it on; `make test-cluster` sets it)"
        );
        return Ok(None);
    }
    connect()
        .await
        .with_context(|| format!("{test}: {CLUSTER_TIER_ENV}=1 but no usable cluster"))
        .map(Some)
}

/// [`cluster_client`] as one statement in a test returning `Result<()>`:
/// the client, or `return Ok(())` outside the cluster tier (skipped, said
/// on stderr), or the error that fails the test inside it.
#[macro_export]
macro_rules! cluster_or_skip {
    ($test:expr) => {
        match $crate::cluster_client($test).await? {
            Some(client) => client,
            None => return Ok(()),
        }
    };
}

/// A client for the cluster in [`KUBECONFIG_ENV`], once its API server has
/// answered; an error names what is missing.
pub async fn connect() -> Result<Client> {
    let path = kubeconfig_path().with_context(|| {
        format!("{KUBECONFIG_ENV} is not set (e2e/cluster/with-cluster sets it)")
    })?;
    let kubeconfig = Kubeconfig::read_from(&path)
        .with_context(|| format!("reading kubeconfig {}", path.display()))?;
    let config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    let client = Client::try_from(config)?;
    client
        .apiserver_version()
        .await
        .with_context(|| format!("the API server of {} does not answer", path.display()))?;
    Ok(client)
}

/// Fails unless every node-local image in `images` (`localhost/kubegrace/...:tag`, as
/// `e2e/cluster/images` imports them) is on at least one node: with
/// `imagePullPolicy: Never` a missing one would only show as a pod that
/// never starts.
pub async fn require_images(client: &Client, images: &[String]) -> Result<()> {
    let nodes = Api::<Node>::all(client.clone())
        .list(&Default::default())
        .await
        .context("listing nodes")?;
    let present = |image: &str| {
        nodes.items.iter().any(|n| {
            n.status
                .as_ref()
                .and_then(|s| s.images.as_ref())
                .is_some_and(|imgs| {
                    imgs.iter()
                        .any(|i| i.names.iter().flatten().any(|x| x.ends_with(image)))
                })
        })
    };
    let missing: Vec<&str> = images
        .iter()
        .map(|i| i.trim_start_matches("localhost/"))
        .filter(|i| !present(i))
        .collect();
    if !missing.is_empty() {
        bail!(
            "images not on any node: {} (e2e/cluster/images builds and imports them)",
            missing.join(", ")
        );
    }
    Ok(())
}

/// Runs `body` in a fresh namespace `kg-e2e-<prefix>-xxxxx` and deletes the namespace
/// afterwards, whether `body` succeeded, failed or panicked.
pub async fn with_namespace<F, Fut>(client: &Client, prefix: &str, body: F) -> Result<()>
where
    F: FnOnce(Client, String) -> Fut,
    Fut: Future<Output = Result<()>> + Send + 'static,
{
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let mut ns = Namespace::default();
    ns.metadata.generate_name = Some(format!("kg-e2e-{prefix}-"));
    ns.metadata.labels = Some([(E2E_LABEL.to_owned(), "true".to_owned())].into());
    let ns = namespaces
        .create(&PostParams::default(), &ns)
        .await
        .context("creating test namespace")?;
    let name = ns
        .metadata
        .name
        .clone()
        .ok_or_else(|| anyhow!("namespace without a name"))?;
    eprintln!("test namespace {name}");

    let outcome = tokio::spawn(body(client.clone(), name.clone())).await;

    if scenario::keep_from_env() {
        eprintln!("keeping namespace {name} (KUBEGRACE_E2E_KEEP_NAMESPACE)");
    } else if let Err(e) = namespaces.delete(&name, &DeleteParams::background()).await {
        eprintln!("warning: could not delete namespace {name}: {e}");
    }
    match outcome {
        Ok(result) => result,
        Err(join) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
        Err(join) => Err(anyhow!("test task failed: {join}")),
    }
}

/// A cluster test in a namespace of its own: skipped outside the cluster tier
/// ([`cluster_client`]), else `body` runs in a fresh namespace `kg-e2e-<prefix>-xxxxx`
/// ([`with_namespace`]).
pub async fn in_test_namespace<F, Fut>(test: &str, prefix: &str, body: F) -> Result<()>
where
    F: FnOnce(Client, String) -> Fut,
    Fut: Future<Output = Result<()>> + Send + 'static,
{
    let Some(client) = cluster_client(test).await? else {
        return Ok(());
    };
    with_namespace(&client, prefix, body).await
}

/// Removes what an operator-in-process test made for namespace `ns`, once its operator has
/// stopped: the webhook configurations named after the namespace, the finalizers of its
/// GraceRoutes (nobody is left to remove them, and the namespace would wait for them
/// forever), then the namespace. Best effort: what is already gone is no error.
pub async fn delete_test_namespace(client: &Client, ns: &str) {
    let dp = DeleteParams::default();
    let _ = Api::<MutatingWebhookConfiguration>::all(client.clone())
        .delete(ns, &dp)
        .await;
    let _ = Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .delete(ns, &dp)
        .await;
    let routes = scenario::graceroute_api(client, ns);
    if let Ok(list) = routes.list(&ListParams::default()).await {
        for r in list {
            let _ = routes
                .patch(
                    &r.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
                )
                .await;
        }
    }
    let _ = Api::<Namespace>::all(client.clone()).delete(ns, &dp).await;
}

/// Waits until `cond` holds for the named object, at most `timeout`.
pub async fn wait_for<K>(
    api: &Api<K>,
    name: &str,
    what: &str,
    timeout: Duration,
    cond: impl Condition<K>,
) -> Result<K>
where
    K: Clone + std::fmt::Debug + Send + DeserializeOwned + Resource + 'static,
{
    match tokio::time::timeout(timeout, await_condition(api.clone(), name, cond)).await {
        Ok(Ok(Some(obj))) => Ok(obj),
        Ok(Ok(None)) => bail!("{what}: {name} does not exist"),
        Ok(Err(e)) => Err(e).context(format!("waiting for {what}")),
        Err(_) => bail!("timed out after {timeout:?} waiting for {what} ({name})"),
    }
}

/// Waits until the object with this `uid` is gone (deleted, finalizers done), at most `timeout`.
pub async fn wait_deleted<K>(api: &Api<K>, name: &str, uid: &str, timeout: Duration) -> Result<()>
where
    K: Clone + std::fmt::Debug + Send + DeserializeOwned + Resource + 'static,
{
    match tokio::time::timeout(
        timeout,
        await_condition(
            api.clone(),
            name,
            kube::runtime::conditions::is_deleted(uid),
        ),
    )
    .await
    {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(e).context(format!("waiting for {name} to be deleted")),
        Err(_) => bail!("timed out after {timeout:?} waiting for {name} to be deleted"),
    }
}

/// The name of one pod labelled `app=<app>`, if there is any.
pub async fn a_pod_of(
    pods: &Api<k8s_openapi::api::core::v1::Pod>,
    app: &str,
) -> Result<Option<String>> {
    let list = pods
        .list(&ListParams::default().labels(&format!("app={app}")))
        .await
        .with_context(|| format!("listing the pods of {app}"))?;
    Ok(list.items.into_iter().find_map(|p| p.metadata.name))
}

/// Every container status of a pod: its init containers' (a native sidecar is one), then
/// its containers'. Names are unique across both lists in a pod.
pub fn container_statuses(
    status: &k8s_openapi::api::core::v1::PodStatus,
) -> impl Iterator<Item = &k8s_openapi::api::core::v1::ContainerStatus> {
    status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten())
}

/// Polls `probe` every `interval` until it returns `Some`, at most `timeout`.
pub async fn poll<T, Fut>(
    what: &str,
    timeout: Duration,
    interval: Duration,
    mut probe: impl FnMut() -> Fut,
) -> Result<T>
where
    Fut: Future<Output = Option<T>>,
{
    let found = poll_until(
        timeout,
        interval,
        || {
            let probed = probe();
            async { probed.await.ok_or(()) }
        },
        |()| {},
    )
    .await;
    found.with_context(|| format!("timed out after {timeout:?} waiting for {what}"))
}

/// The loop under every wait: polls `probe` every `interval` until it returns `Ok`, at
/// most `timeout`, and hands each `Err` to `missed` (to say what is still missing).
/// `None` when the time ran out.
pub async fn poll_until<T, E, Fut>(
    timeout: Duration,
    interval: Duration,
    mut probe: impl FnMut() -> Fut,
    mut missed: impl FnMut(E),
) -> Option<T>
where
    Fut: Future<Output = std::result::Result<T, E>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        match probe().await {
            Ok(v) => return Some(v),
            Err(e) => missed(e),
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(interval).await;
    }
}

/// Distinct free loopback ports: the listeners are held until all are chosen (the kernel
/// happily hands the same port to consecutive binds otherwise).
pub fn free_ports<const N: usize>() -> std::io::Result<[u16; N]> {
    let listeners = (0..N)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<std::io::Result<Vec<_>>>()?;
    let mut ports = [0u16; N];
    for (port, listener) in ports.iter_mut().zip(&listeners) {
        *port = listener.local_addr()?.port();
    }
    Ok(ports)
}

/// A plain HTTP/1.1 GET (one connection, no proxy); returns status and body.
pub async fn http_get(addr: &str, path: &str, timeout: Duration) -> Result<(u16, String)> {
    let (status, _, body) = scenario::kit::http1(addr, "GET", path, timeout).await?;
    Ok((status, body))
}

#[cfg(test)]
mod tests {
    use super::{repo_path, tier_on};

    #[test]
    fn only_1_turns_the_cluster_tier_on() {
        assert!(tier_on(Some("1")));
        for off in [None, Some(""), Some("0"), Some("false"), Some("yes")] {
            assert!(!tier_on(off), "{off:?}");
        }
    }

    #[test]
    fn repo_path_finds_this_checkouts_chart() {
        assert!(repo_path("charts/kubegrace/Chart.yaml").is_file());
        assert!(!repo_path("charts/no-such-chart/Chart.yaml").exists());
    }
}
