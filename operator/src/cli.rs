//! Command line: `crd`, `run` and `webhook-check`. Every flag has a
//! `KUBEGRACE_<FLAG>` environment twin (the Helm chart sets either);
//! `--namespace` reads `POD_NAMESPACE` (the downward API). `run`'s flags
//! live in the API crate ([`kubegrace_api::cli`]): the kubectl plugin reads
//! an install's Deployment with the same parser.

use clap::{Parser, Subcommand};
use kubegrace_sidecar_api::config::HumanDuration;

pub use kubegrace_api::cli::{LogFormat, RunArgs, RunAsUser, SidecarMode};

/// `--version`: the crate version and the git revision of the build.
pub static VERSION: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    kubegrace_sidecar_api::build::version_line(
        env!("CARGO_PKG_VERSION"),
        kubegrace_sidecar_api::build::REVISION,
    )
});

#[derive(Debug, Parser)]
#[command(
    name = "kubegrace-operator",
    version = VERSION.as_str(),
    about = "GraceRoute controller and sidecar-injection webhook"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the GraceRoute CustomResourceDefinition as YAML.
    Crd,
    /// Run the controller (leader only) and the webhook (every replica).
    Run(Box<RunArgs>),
    /// Exit 0 once the injection webhook answers through its Service (a
    /// server-side dry-run pod create shows its mark); 1 after --timeout.
    /// The chart's post-install/post-upgrade hook Job.
    WebhookCheck(WebhookCheckArgs),
}

#[derive(Debug, Clone, clap::Args)]
pub struct WebhookCheckArgs {
    /// Namespace of the probe pod: the release namespace (the chart's
    /// `check.inject.kubegrace.io` entry serves it for the probe only), or
    /// a watched namespace when the operator watches a list.
    #[arg(long, env = "POD_NAMESPACE", default_value = "kubegrace-system")]
    pub namespace: String,
    /// Give up after this long (1s to 1h).
    #[arg(long, env = "KUBEGRACE_WEBHOOK_CHECK_TIMEOUT", default_value = "2m")]
    pub timeout: HumanDuration,
}

/// A duration flag's value, refused outside `min..=max` with the flag's
/// name and the range.
pub fn duration_within(
    flag: &str,
    d: std::time::Duration,
    min: std::time::Duration,
    max: std::time::Duration,
) -> crate::Result<std::time::Duration> {
    if (min..=max).contains(&d) {
        Ok(d)
    } else {
        Err(crate::Error::Config(format!(
            "{flag} {d:?} is outside {min:?}..={max:?}"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_names_the_program_crate_version_and_revision() {
        use clap::CommandFactory;
        let text = Cli::command().render_version();
        let want = kubegrace_sidecar_api::build::version_text(
            "kubegrace-operator",
            env!("CARGO_PKG_VERSION"),
        );
        assert_eq!(text, want);
    }

    #[test]
    fn webhook_check_parses_its_flags() {
        let cli = Cli::try_parse_from([
            "kubegrace-operator",
            "webhook-check",
            "--namespace=kubegrace-system",
            "--timeout=90s",
        ])
        .expect("parse");
        let Command::WebhookCheck(a) = cli.command else {
            panic!("expected webhook-check");
        };
        assert_eq!(a.namespace, "kubegrace-system");
        assert_eq!(a.timeout.0, std::time::Duration::from_secs(90));
    }
}
