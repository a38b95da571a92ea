//! The operator's `run` flags: a contract between the operator, which runs
//! on them, and the kubectl plugin, which reads an install's operator
//! Deployment with this same parser (docs/skew.md: a flag of another
//! release is left out, not an error). Every flag has a `KUBEGRACE_<FLAG>`
//! environment twin (the Helm chart sets either); `--namespace` reads
//! `POD_NAMESPACE` (the downward API). The operator's own command line
//! (`crd`, `run`, `webhook-check`) is `kubegrace_operator::cli`.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, ValueEnum};
use kubegrace_sidecar_api::config::HumanDuration;

/// `run`'s flags alone, for [`RunArgs::from_args`].
#[derive(Debug, Parser)]
struct Run {
    #[command(flatten)]
    args: RunArgs,
}

/// A resource quantity for the sidecar (`50m`, `128Mi`), or empty for
/// none: refused at start, not in every pod the API server would refuse.
fn quantity_or_empty(raw: &str) -> Result<String, String> {
    if raw.trim().is_empty() {
        return Ok(String::new());
    }
    crate::values::parse_quantity(raw).map(|_| raw.trim().to_string())
}

fn log_level_or_empty(raw: &str) -> Result<String, String> {
    if raw.trim().is_empty() {
        return Ok(String::new());
    }
    crate::values::check_log_level(raw)
}

/// The sidecar's UID: a number, or left to the platform.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunAsUser {
    Fixed(i64),
    Platform,
}

impl RunAsUser {
    pub fn uid(self) -> Option<i64> {
        match self {
            Self::Fixed(uid) => Some(uid),
            Self::Platform => None,
        }
    }
}

fn run_as_user(raw: &str) -> Result<RunAsUser, String> {
    if raw.trim() == "platform" {
        return Ok(RunAsUser::Platform);
    }
    raw.trim()
        .parse::<i64>()
        .ok()
        .filter(|uid| (1..=i64::from(i32::MAX)).contains(uid))
        .map(RunAsUser::Fixed)
        .ok_or_else(|| format!("{raw:?}: write a UID from 1 to 2147483647, or `platform`"))
}

/// How the webhook places the sidecar in a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SidecarMode {
    /// Native where the API server is 1.33 or newer, classic below.
    Auto,
    /// An init container with `restartPolicy: Always` (Kubernetes 1.33+;
    /// 1.29 runs it, but before 1.33 a Service cannot target its port name):
    /// started before the app, stopped after it.
    Native,
    /// A regular container beside the app (clusters with the
    /// SidecarContainers feature gate off, or a policy that forbids
    /// restartable init containers); its preStop holds its own SIGTERM
    /// until the drain is done.
    Classic,
}

impl SidecarMode {
    /// Whether to inject a native sidecar on an API server of this version.
    pub fn native(self, major: &str, minor: &str) -> bool {
        match self {
            Self::Auto => crate::inject::supports_native(major, minor),
            Self::Native => true,
            Self::Classic => false,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// The operator's own namespace (Lease, cert Secret, webhook Service).
    #[arg(long, env = "POD_NAMESPACE", default_value = "kubegrace-system")]
    pub namespace: String,
    #[arg(long, env = "KUBEGRACE_WEBHOOK_ADDR", default_value = "0.0.0.0:9443")]
    pub webhook_addr: SocketAddr,
    /// /healthz, /readyz, /metrics.
    #[arg(long, env = "KUBEGRACE_ADMIN_ADDR", default_value = "0.0.0.0:8080")]
    pub admin_addr: SocketAddr,
    /// Service in front of the webhook; its DNS names go into the certificate.
    #[arg(
        long,
        env = "KUBEGRACE_WEBHOOK_SERVICE",
        default_value = "kubegrace-webhook"
    )]
    pub webhook_service: String,
    /// MutatingWebhookConfiguration whose caBundle the operator keeps current.
    #[arg(
        long,
        env = "KUBEGRACE_WEBHOOK_CONFIG",
        default_value = "kubegrace-sidecar-injector"
    )]
    pub webhook_config: String,
    /// ValidatingWebhookConfiguration (GraceRoutes) whose caBundle the
    /// operator keeps current too; empty: none is installed.
    #[arg(
        long,
        env = "KUBEGRACE_VALIDATING_WEBHOOK_CONFIG",
        default_value = "kubegrace-route-validator"
    )]
    pub validating_webhook_config: String,
    /// Secret (in --namespace) holding the self-managed CA and serving cert.
    #[arg(
        long,
        env = "KUBEGRACE_CERT_SECRET",
        default_value = "kubegrace-webhook-cert"
    )]
    pub cert_secret: String,
    /// Use tls.crt/tls.key from this directory (cert-manager), re-read when
    /// they change; no self-management, no caBundle patching.
    #[arg(long, env = "KUBEGRACE_CERT_DIR")]
    pub cert_dir: Option<PathBuf>,
    /// Extra subject alternative names (DNS names or IPs) for the
    /// self-managed certificate, e.g. when the API server reaches the
    /// webhook by URL (development, tests).
    #[arg(long, env = "KUBEGRACE_WEBHOOK_EXTRA_SAN", value_delimiter = ',')]
    pub webhook_extra_san: Vec<String>,
    #[arg(
        long,
        env = "KUBEGRACE_SIDECAR_IMAGE",
        default_value = "localhost/kubegrace/sidecar:e2e"
    )]
    pub sidecar_image: String,
    #[arg(
        long,
        env = "KUBEGRACE_SIDECAR_IMAGE_PULL_POLICY",
        default_value = "IfNotPresent"
    )]
    pub sidecar_image_pull_policy: String,
    #[arg(long, env = "KUBEGRACE_SIDECAR_CPU_REQUEST", default_value = "50m", value_parser = quantity_or_empty)]
    pub sidecar_cpu_request: String,
    #[arg(long, env = "KUBEGRACE_SIDECAR_MEMORY_REQUEST", default_value = "32Mi", value_parser = quantity_or_empty)]
    pub sidecar_memory_request: String,
    /// Empty: no CPU limit (throttling a proxy adds latency to every request).
    #[arg(long, env = "KUBEGRACE_SIDECAR_CPU_LIMIT", default_value = "", value_parser = quantity_or_empty)]
    pub sidecar_cpu_limit: String,
    #[arg(long, env = "KUBEGRACE_SIDECAR_MEMORY_LIMIT", default_value = "128Mi", value_parser = quantity_or_empty)]
    pub sidecar_memory_limit: String,
    /// The sidecar's log filter in every injected pod (`KUBEGRACE_LOG`): a
    /// level or `target=level` directives. Empty: the sidecar's default
    /// (info). A pod's `kubegrace.io/sidecar-log-level` annotation wins.
    #[arg(long, env = "KUBEGRACE_SIDECAR_LOG_LEVEL", default_value = "", value_parser = log_level_or_empty)]
    pub sidecar_log_level: String,
    /// The sidecar's runAsUser and runAsGroup (1 to 2147483647), or
    /// `platform` to leave them unset so the platform assigns them
    /// (OpenShift's restricted SCC refuses a fixed UID outside the
    /// namespace's range). `runAsNonRoot` is set either way.
    #[arg(long, env = "KUBEGRACE_SIDECAR_RUN_AS_USER", default_value = "65532", value_parser = run_as_user)]
    pub sidecar_run_as_user: RunAsUser,
    /// The sidecar's admin port tried first in each pod (the next free one
    /// above it when a container uses it). Keep it outside the ranges meshes
    /// use (Istio 15000-15090, Linkerd 4140-4191).
    #[arg(long, env = "KUBEGRACE_SIDECAR_ADMIN_PORT", default_value_t = kubegrace_sidecar_api::admin::DEFAULT_PORT, value_parser = clap::value_parser!(u16).range(1..))]
    pub sidecar_admin_port: u16,
    /// The sidecar's listener port tried first in each pod.
    #[arg(long, env = "KUBEGRACE_SIDECAR_LISTEN_PORT", default_value_t = kubegrace_sidecar_api::pod::FIRST_LISTEN_PORT, value_parser = clap::value_parser!(u16).range(1..))]
    pub sidecar_listen_port: u16,
    /// Where the sidecar goes in the pod: `classic` (a regular container
    /// beside the app, the default), `native` (an init container with
    /// `restartPolicy: Always`, 1.33+) or `auto` (native on 1.33+). Classic is
    /// the default because the kubelet starts the app of a pod with a native
    /// sidecar one sync (~1 s) after the sidecar, which slows every rollout by
    /// about a second per new pod; the drain holds in both.
    #[arg(long, env = "KUBEGRACE_SIDECAR_MODE", value_enum, default_value_t = SidecarMode::Classic)]
    pub sidecar_mode: SidecarMode,
    /// Lease (in --namespace) for controller leader election.
    #[arg(
        long,
        env = "KUBEGRACE_LEADER_ELECTION_LEASE",
        default_value = "kubegrace-operator"
    )]
    pub leader_election_lease: String,
    #[arg(long, env = "KUBEGRACE_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// Watch and serve only these namespaces (comma-separated); empty: all.
    /// Pairs with the chart's `watchNamespaces` (Roles in those namespaces
    /// instead of a cluster-wide ClusterRole): routes elsewhere are not
    /// reconciled and the webhook answers no review for another namespace.
    #[arg(long, env = "KUBEGRACE_WATCH_NAMESPACES", value_delimiter = ',')]
    pub watch_namespaces: Vec<String>,
    /// Open webhook connections at most; past it a new connection is closed
    /// at once (API servers keep a few long-lived connections each).
    #[arg(long, env = "KUBEGRACE_WEBHOOK_MAX_CONNECTIONS", default_value_t = 128,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub webhook_max_connections: u32,
    /// Admission reviews in progress at most (each may hold a body of up to
    /// the body limit in memory); past it a review waits up to 5s, then 503.
    #[arg(long, env = "KUBEGRACE_WEBHOOK_MAX_IN_FLIGHT", default_value_t = 32,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub webhook_max_in_flight: u32,
    /// Time to read one request: TLS handshake, head, and body each get it
    /// (slow head: connection closed; slow body: 408).
    #[arg(long, env = "KUBEGRACE_WEBHOOK_READ_TIMEOUT", default_value = "10s")]
    pub webhook_read_timeout: HumanDuration,
    /// A connection with no byte in either direction for this long is
    /// closed. Longer than the longest admission timeout (30s), so a review
    /// waiting on the API is never cut.
    #[arg(long, env = "KUBEGRACE_WEBHOOK_IDLE_TIMEOUT", default_value = "60s")]
    pub webhook_idle_timeout: HumanDuration,
    /// Evict pods that asked for the sidecar but were admitted without it
    /// (webhook unreachable, `failurePolicy: Ignore`), one at a time per
    /// workload, through the Eviction API; see `heal.rs`. A route opts out
    /// with the annotation `kubegrace.io/heal: disabled`.
    #[arg(long, env = "KUBEGRACE_HEAL", default_value_t = true, action = clap::ArgAction::Set)]
    pub heal: bool,
    /// Time between two healing rounds; at most one eviction per round
    /// cluster-wide (1s to 1h).
    #[arg(long, env = "KUBEGRACE_HEAL_INTERVAL", default_value = "10s")]
    pub heal_interval: HumanDuration,
    /// Namespace of the dry-run probe that must show the webhook answering
    /// before each eviction (the chart's webhook-check namespace); empty:
    /// evict without probing.
    #[arg(long, env = "KUBEGRACE_HEAL_PROBE_NAMESPACE", default_value = "")]
    pub heal_probe_namespace: String,
}

impl RunArgs {
    /// Parses `run` flags from an argument list (tests start the operator
    /// in-process with these).
    pub fn from_args<I, T>(args: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        Run::try_parse_from(
            ["kubegrace-operator run"]
                .into_iter()
                .map(std::ffi::OsString::from)
                .chain(args.into_iter().map(Into::into)),
        )
        .map(|r| r.args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Helm chart's argument style, including an empty limit.
    #[test]
    fn the_charts_flags_parse() {
        let a = RunArgs::from_args([
            "--namespace=kubegrace-system",
            "--webhook-addr=0.0.0.0:9443",
            "--admin-addr=0.0.0.0:8080",
            "--webhook-service=kubegrace-webhook",
            "--webhook-config=kubegrace-sidecar-injector",
            "--validating-webhook-config=",
            "--cert-secret=kubegrace-webhook-cert",
            "--sidecar-image=localhost/kubegrace/sidecar:e2e",
            "--sidecar-image-pull-policy=IfNotPresent",
            "--sidecar-cpu-request=50m",
            "--sidecar-memory-request=32Mi",
            "--sidecar-cpu-limit=",
            "--sidecar-memory-limit=128Mi",
            "--sidecar-log-level=",
            "--sidecar-run-as-user=platform",
            "--leader-election-lease=kubegrace-operator",
            "--log-format=json",
        ])
        .expect("the chart's flags parse");
        assert_eq!(a.sidecar_cpu_limit, "");
        assert_eq!(a.sidecar_run_as_user, RunAsUser::Platform);
        assert_eq!(a.sidecar_log_level, "");
        assert_eq!(a.validating_webhook_config, "");
        assert_eq!(a.log_format, LogFormat::Json);
        assert!(a.cert_dir.is_none());
        assert!(a.watch_namespaces.is_empty());
        assert_eq!(a.webhook_read_timeout.0, std::time::Duration::from_secs(10));
        assert!(a.heal, "healing is on by default");
        assert_eq!(a.heal_probe_namespace, "");
    }

    #[test]
    fn heal_flags_parse() {
        let a = RunArgs::from_args([
            "--heal=false",
            "--heal-interval=30s",
            "--heal-probe-namespace=kubegrace-system",
        ])
        .expect("parse");
        assert!(!a.heal);
        assert_eq!(a.heal_interval.0, std::time::Duration::from_secs(30));
        assert_eq!(a.heal_probe_namespace, "kubegrace-system");
        assert!(RunArgs::from_args(["--heal=maybe"]).is_err());
    }

    #[test]
    fn watch_namespaces_and_webhook_limits_parse_and_bad_values_are_refused() {
        let a = RunArgs::from_args([
            "--watch-namespaces=shop,api",
            "--webhook-max-connections=8",
            "--webhook-read-timeout=2s",
            "--webhook-idle-timeout=1m",
        ])
        .expect("parse");
        assert_eq!(a.watch_namespaces, ["shop", "api"]);
        assert_eq!(a.webhook_max_connections, 8);
        assert_eq!(a.webhook_idle_timeout.0, std::time::Duration::from_secs(60));
        for bad in [
            "--webhook-max-connections=0",
            "--webhook-read-timeout=soon",
            "--webhook-max-in-flight=-1",
        ] {
            assert!(RunArgs::from_args([bad]).is_err(), "{bad} must be refused");
        }
    }

    /// Values the API server would refuse in every pod are refused at
    /// start instead, with what to write.
    #[test]
    fn bad_sidecar_flags_are_refused_at_start() {
        let base = ["--namespace=kubegrace-system"];
        for bad in [
            "--sidecar-memory-limit=lots",
            "--sidecar-cpu-request=5Xi",
            "--sidecar-run-as-user=0",
            "--sidecar-run-as-user=2147483648",
            "--sidecar-run-as-user=root",
            "--sidecar-log-level=loud",
        ] {
            let err = RunArgs::from_args(base.iter().copied().chain([bad]))
                .expect_err(bad)
                .to_string();
            assert!(err.contains("write"), "{bad}: {err}");
        }
        let ok = RunArgs::from_args(base.iter().copied().chain([
            "--sidecar-run-as-user=2147483647",
            "--sidecar-log-level=debug",
        ]))
        .expect("at the bounds");
        assert_eq!(ok.sidecar_run_as_user, RunAsUser::Fixed(2147483647));
    }
}
