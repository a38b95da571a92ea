//! `kubegrace-operator run`: wires the parts together.
//!
//! One shutdown signal (SIGTERM/SIGINT, or the future a test passes) is
//! fanned out through a watch channel to the controllers
//! (`Controller::graceful_shutdown_on`), the webhook server, the admin
//! server and the certificate loop. Every replica serves the webhook; only
//! the Lease holder runs the controllers. A controller or the certificate
//! loop that panics is counted, logged and started again
//! ([`crate::panics::supervise`]); the process goes on.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use kube::Client;
use tokio::sync::watch;

use crate::admin::{self, Metrics};
use crate::api_requests::{ApiRequests, counted_client};
use crate::certs::{self, CertResolver, SelfManaged};
use crate::cli::{LogFormat, RunArgs};
use crate::lease::LeaderElector;
use crate::webhook::{self, SidecarSettings, Webhook};
use crate::webhook_cache::WebhookCache;
use crate::{Error, Result, controller, panics, scope, server, workload};

/// The runtime of a subcommand (`command`, for the message), built by
/// `builder`; a failure is said on stderr and becomes the exit code.
pub fn runtime(
    command: &str,
    mut builder: tokio::runtime::Builder,
) -> std::result::Result<tokio::runtime::Runtime, std::process::ExitCode> {
    builder.enable_all().build().map_err(|e| {
        eprintln!("{command}: starting the runtime: {e}");
        std::process::ExitCode::FAILURE
    })
}

/// The client, from a kubeconfig or the pod's service account.
pub async fn client() -> Result<Client> {
    Client::try_default()
        .await
        .map_err(|e| Error::Config(format!("no usable kubeconfig or in-cluster config: {e}")))
}

/// The API clients of a run: the route controller's own, and the one
/// everything else uses (inject controllers, webhook lookups and caches,
/// Lease, certificates), each counted in `requests`
/// ([`crate::api_requests`]).
pub struct Clients {
    pub controllers: Client,
    pub other: Client,
    pub requests: Arc<ApiRequests>,
}

impl Clients {
    /// Two counted clients from a kubeconfig or the pod's service account.
    pub async fn infer() -> Result<Self> {
        let config = kube::Config::infer().await.map_err(|e| {
            Error::Config(format!("no usable kubeconfig or in-cluster config: {e}"))
        })?;
        let requests = Arc::new(ApiRequests::default());
        Ok(Self {
            controllers: counted_client(config.clone(), &requests, "routes")?,
            other: counted_client(config, &requests, "other")?,
            requests,
        })
    }
}

/// One client for everything, uncounted (the in-process tests' harness).
impl From<Client> for Clients {
    fn from(client: Client) -> Self {
        Self {
            controllers: client.clone(),
            other: client,
            requests: Arc::default(),
        }
    }
}

pub fn main(args: RunArgs) -> std::process::ExitCode {
    init_tracing(args.log_format);
    let builder = tokio::runtime::Builder::new_multi_thread();
    let runtime = match runtime("kubegrace-operator", builder) {
        Ok(r) => r,
        Err(code) => return code,
    };
    let outcome = runtime.block_on(async { run(Clients::infer().await?, args, signal()).await });
    match outcome {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "kubegrace-operator stopped");
            std::process::ExitCode::FAILURE
        }
    }
}

pub(crate) fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,kube=warn"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

/// Resolves on SIGTERM or SIGINT.
async fn signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

fn identity() -> String {
    let host = std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| "kubegrace-operator".into());
    let suffix: u32 = rand::random();
    format!("{host}-{suffix:08x}")
}

/// Resolves once the shutdown flag is set.
async fn stopped(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|v| *v).await;
}

/// Runs everything until `shutdown` resolves (tests call this in-process).
pub async fn run(
    clients: impl Into<Clients>,
    args: RunArgs,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let Clients {
        controllers,
        other: client,
        requests,
    } = clients.into();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let limits = server::Limits::from_args(&args)?;
    let heal_interval = crate::heal::checked_interval(args.heal_interval.get())?;
    let namespaces = scope::namespaces(&args.watch_namespaces);
    tracing::info!(?namespaces, "watching (None: every namespace)");
    let metrics = Arc::new(Metrics::counting(requests));
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = tx.send(true);
    });

    let version = client
        .apiserver_version()
        .await
        .map_err(Error::kube("reading the API server version"))?;
    let native = args.sidecar_mode.native(&version.major, &version.minor);
    if native && !webhook::supports_native(&version.major, &version.minor) {
        tracing::warn!(version = %version.git_version, "--sidecar-mode=native on an API server older than 1.33: before 1.29 pods may be refused, before 1.33 Services that target the port by name get no endpoints");
    }
    tracing::info!(version = %version.git_version, native_sidecars = native, mode = ?args.sidecar_mode, "connected");

    // Serving certificate first: the webhook cannot answer without it.
    let resolver = Arc::new(CertResolver::default());
    metrics.watch_certificate(resolver.clone());
    let mut tasks = tokio::task::JoinSet::new();
    match &args.cert_dir {
        Some(dir) => {
            certs::load_dir(dir, &resolver)?;
            let (dir, resolver, rx, metrics) =
                (dir.clone(), resolver.clone(), rx.clone(), metrics.clone());
            tasks.spawn(async move {
                let stop = || stopped(rx.clone());
                let watch = || certs::watch_dir(dir.clone(), resolver.clone(), rx.clone());
                panics::supervise("certificate watch", &metrics, watch, stop).await;
            });
        }
        None => {
            let self_managed = || SelfManaged {
                client: client.clone(),
                namespace: args.namespace.clone(),
                secret: args.cert_secret.clone(),
                webhook_config: args.webhook_config.clone(),
                validating_webhook_config: Some(args.validating_webhook_config.clone())
                    .filter(|n| !n.is_empty()),
                sans: certs::service_sans(
                    &args.webhook_service,
                    &args.namespace,
                    &args.webhook_extra_san,
                ),
                resolver: resolver.clone(),
            };
            if let Err(e) = self_managed().round().await {
                // Keep going if we at least have a certificate (the
                // MutatingWebhookConfiguration may come later).
                if !resolver.is_loaded() {
                    return Err(e);
                }
                tracing::warn!(error = %e, "webhook certificate");
            }
            let (task_rx, metrics) = (rx.clone(), metrics.clone());
            let stop_rx = rx.clone();
            let m = self_managed();
            let make = move || {
                let m = SelfManaged {
                    client: m.client.clone(),
                    namespace: m.namespace.clone(),
                    secret: m.secret.clone(),
                    webhook_config: m.webhook_config.clone(),
                    validating_webhook_config: m.validating_webhook_config.clone(),
                    sans: m.sans.clone(),
                    resolver: m.resolver.clone(),
                };
                m.maintain(task_rx.clone())
            };
            tasks.spawn(async move {
                let stop = || stopped(stop_rx.clone());
                panics::supervise("certificate maintenance", &metrics, make, stop).await;
            });
        }
    }

    let settings = SidecarSettings {
        image: args.sidecar_image.clone(),
        pull_policy: args.sidecar_image_pull_policy.clone(),
        resources: webhook::resources(
            &args.sidecar_cpu_request,
            &args.sidecar_memory_request,
            &args.sidecar_cpu_limit,
            &args.sidecar_memory_limit,
        ),
        log_level: Some(args.sidecar_log_level.clone()).filter(|l| !l.is_empty()),
        run_as_user: args.sidecar_run_as_user.uid(),
        native,
        ports: crate::inject::Ports {
            admin: args.sidecar_admin_port,
            first_listen: args.sidecar_listen_port,
        },
    };
    // Every replica serves the webhook, so every replica keeps its caches
    // (the controllers' stores live on the leader only).
    let cache = WebhookCache::new(&namespaces);
    cache.spawn(&client, &metrics, &rx, &mut tasks);
    let hook = Arc::new(Webhook {
        client: client.clone(),
        metrics: metrics.clone(),
        settings: settings.clone(),
        cache: Arc::new(cache),
    });
    let heal_metrics = metrics.heal.clone();
    let webhook_task = tokio::spawn(server::serve(
        args.webhook_addr,
        resolver.clone(),
        hook,
        limits,
        rx.clone(),
    ));
    let admin_task = tokio::spawn(admin::serve(
        args.admin_addr,
        metrics.clone(),
        stopped(rx.clone()),
    ));

    // Controllers: leader only. Losing the lease stops them; we then stand
    // in line again.
    let elector = LeaderElector::new(
        client.clone(),
        &args.namespace,
        &args.leader_election_lease,
        &identity(),
    );
    loop {
        tokio::select! {
            () = elector.acquire() => {}
            () = stopped(rx.clone()) => break,
        }
        tracing::info!(identity = elector.identity(), "leading: controllers start");
        metrics.leader.store(true, Ordering::Relaxed);
        let (lead_tx, lead_rx) = watch::channel(false);
        let stop = {
            let (rx, lead_rx) = (rx.clone(), lead_rx.clone());
            move || {
                let (a, b) = (rx.clone(), lead_rx.clone());
                async move {
                    tokio::select! {
                        () = stopped(a) => {}
                        () = stopped(b) => {}
                    }
                }
            }
        };
        // One set of controllers per watched namespace (namespaced RBAC
        // allows no cluster-wide watch), or one set for all namespaces.
        let mut all: Vec<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>> =
            Vec::new();
        let argo = crate::workload::argo_rollouts_served(&client).await;
        // Each under supervision: a panic restarts that controller alone.
        for ns in &namespaces {
            let (c, m, id, n, st) = (
                controllers.clone(),
                metrics.clone(),
                elector.identity().to_string(),
                ns.clone(),
                stop.clone(),
            );
            all.push(Box::pin(async move {
                let run = || controller::run(c.clone(), m.clone(), id.clone(), n.clone(), st());
                panics::supervise("route controller", &m, run, &st).await;
            }));
            let (c, m, n, st) = (client.clone(), metrics.clone(), ns.clone(), stop.clone());
            all.push(Box::pin(async move {
                let run = || workload::run::<Deployment>(c.clone(), m.clone(), n.clone(), st());
                panics::supervise("deployment inject controller", &m, run, &st).await;
            }));
            let (c, m, n, st) = (client.clone(), metrics.clone(), ns.clone(), stop.clone());
            all.push(Box::pin(async move {
                let run = || workload::run::<StatefulSet>(c.clone(), m.clone(), n.clone(), st());
                panics::supervise("statefulset inject controller", &m, run, &st).await;
            }));
            if argo {
                let (c, m, n, st) = (client.clone(), metrics.clone(), ns.clone(), stop.clone());
                all.push(Box::pin(async move {
                    let run = || {
                        workload::run::<kubegrace_api::argo::Rollout>(
                            c.clone(),
                            m.clone(),
                            n.clone(),
                            st(),
                        )
                    };
                    panics::supervise("rollout inject controller", &m, run, &st).await;
                }));
            }
        }
        if args.heal {
            let healer = crate::heal::Healer::new(
                client.clone(),
                settings.clone(),
                crate::heal::HealSettings {
                    interval: heal_interval,
                    probe_namespace: Some(args.heal_probe_namespace.clone())
                        .filter(|n| !n.is_empty()),
                    webhook_config: args.webhook_config.clone(),
                },
                namespaces.clone(),
                heal_metrics.clone(),
            );
            let (a, b) = (rx.clone(), lead_rx.clone());
            all.push(Box::pin(async move {
                let (tx, stop) = watch::channel(false);
                tokio::select! {
                    () = healer.run(stop) => {}
                    () = async { tokio::select! { () = stopped(a) => {}, () = stopped(b) => {} } } => {
                        let _ = tx.send(true);
                    }
                }
            }));
        }
        let controllers = futures_util::future::join_all(all);
        tokio::pin!(controllers);
        let finished = tokio::select! {
            _ = &mut controllers => true,
            () = elector.hold() => false,
        };
        if !finished {
            tracing::warn!("lost leadership: controllers stop");
            let _ = lead_tx.send(true);
            controllers.await;
        }
        metrics.leader.store(false, Ordering::Relaxed);
        // What the controllers last saw is the new leader's to report now.
        metrics.stopped_leading();
        if *rx.borrow() {
            elector.release().await;
            break;
        }
    }
    let (w, a) = tokio::join!(webhook_task, admin_task);
    tasks.shutdown().await;
    w.map_err(|e| Error::Config(format!("webhook task: {e}")))??;
    a.map_err(|e| Error::Config(format!("admin task: {e}")))??;
    tracing::info!("stopped");
    Ok(())
}
