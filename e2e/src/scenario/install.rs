//! The chart, installed with `helm` for one run and uninstalled after it ([`Install`]), and
//! [`with_install`], which brackets a test's steps with the two.

use std::cell::RefCell;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, ensure};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{DeleteParams, ListParams};
use kube::{Api, Client};

use super::{Options, Patience, Progress, RUN_LABEL, Scenario, graceroute_api};

/// `helm` from the pinned tools when `e2e/cluster/env` says where they are, else from PATH.
pub fn helm_bin() -> PathBuf {
    std::env::var_os("KUBEGRACE_TOOLS_BIN")
        .map(|d| PathBuf::from(d).join("helm"))
        .filter(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from("helm"))
}

async fn helm(args: &[String], timeout: Duration) -> Result<String> {
    let kubeconfig = crate::kubeconfig_path().context("no kubeconfig for helm")?;
    let mut cmd = tokio::process::Command::new(helm_bin());
    cmd.args(args)
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .kill_on_drop(true);
    let out = tokio::time::timeout(timeout, cmd.output())
        .await
        .map_err(|_| anyhow!("helm {} took longer than {timeout:?}", args.join(" ")))?
        .with_context(|| format!("running {}", helm_bin().display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    ensure!(
        out.status.success(),
        "helm {} failed ({}): {}{}",
        args.join(" "),
        out.status,
        stdout,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(stdout)
}

/// `Ok` when a webhook configuration has entries and every one has a caBundle (`has_ca`,
/// one per entry): the operator has written its certificate, the API server can call it.
fn every_entry_has_ca(
    has_ca: impl ExactSizeIterator<Item = bool>,
) -> std::result::Result<(), String> {
    let entries = has_ca.len();
    let with_ca = has_ca.filter(|has| *has).count();
    if entries > 0 && with_ca == entries {
        Ok(())
    } else {
        Err(format!("{with_ca}/{entries} entries have a caBundle"))
    }
}

/// The chart, installed for one run.
#[derive(Debug)]
pub struct Install {
    pub release: String,
    pub namespace: String,
}

impl Install {
    /// The release `opts` names (nothing installed yet), so that cleanup can run whatever
    /// part of the install failed.
    pub fn new(opts: &Options) -> Install {
        Install {
            release: opts.release.clone(),
            namespace: opts.release_namespace.clone(),
        }
    }

    /// `helm install` with the local images, `opts.operator_replicas`, `failurePolicy: Fail`,
    /// the webhook scoped to namespaces labelled `kubegrace.io/e2e-run=<release>`; then
    /// waits for the operator's certificate in the webhook configuration.
    pub async fn helm_install(&self, client: &Client, opts: &Options, p: &Progress) -> Result<()> {
        let install = self;
        p.step(format!(
            "helm install {} {} (namespace {}, images {}/kubegrace/*:{})",
            install.release,
            opts.chart.display(),
            install.namespace,
            opts.image_registry,
            opts.image_tag
        ));
        let set = |k: &str, v: &str| ["--set".to_owned(), format!("{k}={v}")];
        let mut args: Vec<String> = vec![
            "install".into(),
            install.release.clone(),
            opts.chart.display().to_string(),
            "--namespace".into(),
            install.namespace.clone(),
            "--create-namespace".into(),
            "--wait".into(),
            "--timeout".into(),
            "180s".into(),
            // The CRD is a chart template kept on uninstall: the run before left it
            // owned by its own (gone) release, and this release adopts it.
            "--take-ownership".into(),
        ];
        args.extend(set("fullnameOverride", &install.release));
        args.extend(set("image.registry", &opts.image_registry));
        args.extend(set("image.tag", &opts.image_tag));
        args.extend(set("image.pullPolicy", "IfNotPresent"));
        args.extend(set(
            "operator.replicas",
            &opts.operator_replicas.to_string(),
        ));
        args.extend(set("webhook.failurePolicy", "Fail"));
        for (k, v) in &opts.chart_values {
            args.extend(set(k, v));
        }
        // Scoped at install (the chart ANDs this into every webhook entry): a shared
        // cluster's other tests never see this run's webhook, from its first moment.
        let key = RUN_LABEL.replace('.', "\\.");
        args.push("--set-string".into());
        args.push(format!(
            "webhook.namespaceSelector.matchLabels.{key}={}",
            install.release
        ));
        helm(&args, Duration::from_secs(200)).await?;
        p.step(format!(
            "helm install done: operator ready, webhook scoped to namespaces labelled {RUN_LABEL}={}",
            install.release
        ));

        let name = format!("{}-sidecar-injector", install.release);
        let mwcs: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
        let release = install.release.clone();
        p.wait(
            "the operator's CA in the webhook configuration",
            Patience::new(Duration::from_secs(90), Duration::from_millis(500)),
            || async {
                let m = mwcs.get(&name).await.map_err(|e| e.to_string())?;
                let hooks = m.webhooks.unwrap_or_default();
                // The scope is what keeps this run's webhook out of other tests: check the
                // chart rendered it, rather than trust it.
                // The install check's entry serves the release namespace alone, for
                // its probe pod: not a namespace of any test, so not scoped.
                let hooks: Vec<_> = hooks
                    .into_iter()
                    .filter(|w| w.name != "check.inject.kubegrace.io")
                    .collect();
                let scoped = hooks
                    .iter()
                    .filter(|w| {
                        w.namespace_selector
                            .as_ref()
                            .and_then(|s| s.match_labels.as_ref())
                            .and_then(|l| l.get(RUN_LABEL))
                            == Some(&release)
                    })
                    .count();
                if scoped != hooks.len() {
                    // Not something time fixes; the wait prints it and times out.
                    return Err(format!(
                        "only {scoped}/{} entries select {RUN_LABEL}={release}",
                        hooks.len()
                    ));
                }
                every_entry_has_ca(hooks.iter().map(|w| w.client_config.ca_bundle.is_some()))
            },
        )
        .await?;
        // The route validator too: with failurePolicy Ignore, a route applied before its
        // caBundle lands is admitted without the webhook's warnings.
        let name = format!("{}-route-validator", install.release);
        let vwcs: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
        p.wait(
            "the operator's CA in the route validator",
            Patience::new(Duration::from_secs(90), Duration::from_millis(500)),
            || async {
                let v = vwcs.get(&name).await.map_err(|e| e.to_string())?;
                let hooks = v.webhooks.unwrap_or_default();
                every_entry_has_ca(hooks.iter().map(|w| w.client_config.ca_bundle.is_some()))
            },
        )
        .await?;
        Ok(())
    }

    /// Deletes the routes of `namespaces` while the operator still runs (it removes their
    /// finalizers), then the namespaces, then the release and its namespace. Best effort:
    /// problems are printed, not returned, so cleanup never hides the test's own result.
    pub async fn uninstall(&self, client: &Client, namespaces: &[String], p: &Progress) {
        let ns_api: Api<Namespace> = Api::all(client.clone());
        for ns in namespaces {
            let routes = graceroute_api(client, ns);
            if let Err(e) = routes
                .delete_collection(&DeleteParams::default(), &ListParams::default())
                .await
            {
                eprintln!("warning: deleting GraceRoutes in {ns}: {e}");
            }
            let gone = p
                .wait(
                    &format!("GraceRoutes in {ns} deleted"),
                    Patience::API_CHANGE,
                    || async {
                        match routes.list(&ListParams::default()).await {
                            Ok(l) if l.items.is_empty() => Ok(()),
                            Ok(l) => Err(format!("{} left", l.items.len())),
                            Err(e) => Err(e.to_string()),
                        }
                    },
                )
                .await;
            if let Err(e) = gone {
                eprintln!("warning: {e:#}");
            }
            if let Err(e) = ns_api.delete(ns, &DeleteParams::background()).await {
                eprintln!("warning: deleting namespace {ns}: {e}");
            }
        }
        p.step(format!("helm uninstall {}", self.release));
        let args: Vec<String> = vec![
            "uninstall".into(),
            self.release.clone(),
            "--namespace".into(),
            self.namespace.clone(),
            "--wait".into(),
            "--timeout".into(),
            "90s".into(),
        ];
        if let Err(e) = helm(&args, Duration::from_secs(120)).await {
            eprintln!("warning: {e:#}");
        }
        if let Err(e) = ns_api
            .delete(&self.namespace, &DeleteParams::background())
            .await
        {
            eprintln!("warning: deleting namespace {}: {e}", self.namespace);
        }
    }
}

/// The chart installed for [`with_install`]'s body, and the namespaces the body made under
/// it (deleted with it).
pub struct Installed<'a> {
    pub client: &'a Client,
    pub opts: &'a Options,
    pub p: &'a Progress,
    namespaces: RefCell<Vec<String>>,
}

impl Installed<'_> {
    /// [`Scenario::named`] with the run's options; its namespace goes with the install.
    pub async fn scenario(&self, what: &str) -> Result<Scenario> {
        self.scenario_with(self.opts, what).await
    }

    /// [`Scenario::named`] with other options (replicas, drain timers) under the same
    /// install; its namespace goes with the install.
    pub async fn scenario_with(&self, opts: &Options, what: &str) -> Result<Scenario> {
        let sc = Scenario::named(self.client, opts, self.p, what).await?;
        self.namespaces.borrow_mut().push(sc.namespace.clone());
        Ok(sc)
    }
}

/// Whether a run leaves what it made behind for a person to look at
/// (`KUBEGRACE_E2E_KEEP_NAMESPACE` set).
pub fn keep_from_env() -> bool {
    std::env::var_os("KUBEGRACE_E2E_KEEP_NAMESPACE").is_some()
}

/// Installs the chart ([`Install::helm_install`]), runs `body`, then uninstalls it with the
/// namespaces `body` made ([`Install::uninstall`]) unless `keep`: also when the install or
/// a step failed, so a failed test leaves nothing behind.
pub async fn with_install<T>(
    client: &Client,
    opts: &Options,
    p: &Progress,
    keep: bool,
    body: impl AsyncFnOnce(&Installed<'_>) -> Result<T>,
) -> Result<T> {
    let install = Install::new(opts);
    let installed = Installed {
        client,
        opts,
        p,
        namespaces: RefCell::default(),
    };
    let outcome = async {
        install.helm_install(client, opts, p).await?;
        body(&installed).await
    }
    .await;
    if let Err(e) = &outcome {
        p.step(format!("scenario failed: {e:#}"));
    }
    let namespaces = installed.namespaces.into_inner();
    if keep {
        p.step(format!(
            "keeping release {} (namespace {}) and namespaces {namespaces:?}",
            install.release, install.namespace
        ));
    } else {
        install.uninstall(client, &namespaces, p).await;
    }
    outcome
}
