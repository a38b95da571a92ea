//! Where kubegrace is installed and what it was told: the operator Deployment (found by
//! the chart's labels) and its command line, parsed by the operator's own parser
//! (`kubegrace_api::cli::RunArgs`, the flag struct the operator runs on), so the
//! Lease, webhook configurations, certificate Secret and sidecar image are the names the
//! operator really uses, whatever the release called them.
//!
//! The plugin and the operator may come from different releases (docs/skew.md): a flag
//! this plugin's parser does not know, or a value it would refuse, is an operator of
//! another release, not a broken install. Such flags are left out (their defaults stand
//! in) and named in [`Install::ignored_args`], so `check` still reads every name it knows.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Container, PodSpec};
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};
use kubegrace_api::cli::RunArgs;

use crate::{Error, Result};

/// The labels the chart puts on the operator Deployment.
pub const OPERATOR_SELECTOR: &str =
    "app.kubernetes.io/name=kubegrace,app.kubernetes.io/component=operator";
/// The operator's container in that Deployment.
pub const OPERATOR_CONTAINER: &str = "operator";
/// The volume the chart mounts the cert-manager certificate from.
const CERT_VOLUME: &str = "webhook-certs";

/// One kubegrace install.
#[derive(Debug, Clone)]
pub struct Install {
    pub namespace: String,
    pub deployment: Deployment,
    pub args: RunArgs,
    /// Operator flags this plugin does not know or whose value it refuses (an operator
    /// of another release), left out of [`Install::args`].
    pub ignored_args: Vec<String>,
}

impl Install {
    pub fn name(&self) -> String {
        self.deployment.name_any()
    }

    /// The operator's own release: the tag (or digest) of its container's image.
    pub fn operator_version(&self) -> Option<&str> {
        operator_container(&self.deployment)?
            .image
            .as_deref()
            .map(kubegrace_api::image_ref::version_of)
    }

    /// The version of the sidecar the webhook injects (`kubegrace.io/sidecar-version`).
    pub fn sidecar_version(&self) -> &str {
        kubegrace_api::image_ref::version_of(&self.args.sidecar_image)
    }

    /// The Secret holding the serving certificate: the operator's own, or the one
    /// cert-manager writes (the Secret behind the mounted certificate directory).
    pub fn cert_secret(&self) -> Option<String> {
        if self.args.cert_dir.is_none() {
            return Some(self.args.cert_secret.clone());
        }
        pod_spec(&self.deployment)?
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == CERT_VOLUME)?
            .secret
            .as_ref()?
            .secret_name
            .clone()
    }

    /// The label selector of the operator's pods.
    pub fn pod_selector(&self) -> Option<String> {
        let labels = self
            .deployment
            .spec
            .as_ref()?
            .selector
            .match_labels
            .as_ref()?;
        Some(
            labels
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(","),
        )
    }
}

/// The operator Deployment's pod spec.
fn pod_spec(deployment: &Deployment) -> Option<&PodSpec> {
    deployment.spec.as_ref()?.template.spec.as_ref()
}

/// The operator's container in its Deployment.
fn operator_container(deployment: &Deployment) -> Option<&Container> {
    pod_spec(deployment)?
        .containers
        .iter()
        .find(|c| c.name == OPERATOR_CONTAINER)
}

/// Reads the install from an operator Deployment (pure): its `run` arguments, with
/// `$(POD_NAMESPACE)` being the Deployment's namespace.
pub fn from_deployment(deployment: Deployment) -> Result<Install> {
    let namespace = deployment.namespace().unwrap_or_default();
    let name = deployment.name_any();
    let container = operator_container(&deployment).ok_or_else(|| {
        Error::Invalid(format!(
            "Deployment {namespace}/{name} has no container {OPERATOR_CONTAINER:?}"
        ))
    })?;
    let args: Vec<String> = container
        .args
        .iter()
        .flatten()
        .skip_while(|a| a.as_str() != "run")
        .skip(1)
        .map(|a| a.replace("$(POD_NAMESPACE)", &namespace))
        .collect();
    let (args, ignored_args) = parse_tolerant(args).map_err(|e| {
        Error::Invalid(format!(
            "the arguments of {namespace}/{name} are not the operator's: {e}"
        ))
    })?;
    Ok(Install {
        namespace,
        deployment,
        args,
        ignored_args,
    })
}

/// At most this many flags are left out: more than a release adds, and a bound on the
/// re-parses of an argument list that came from the cluster.
const MAX_IGNORED_ARGS: usize = 16;

/// Parses the operator's `run` arguments, leaving out the flags this plugin's parser
/// does not know or whose value it refuses, one at a time (see the module doc).
fn parse_tolerant(
    mut args: Vec<String>,
) -> std::result::Result<(RunArgs, Vec<String>), clap::Error> {
    let mut ignored = Vec::new();
    loop {
        let err = match RunArgs::from_args(&args) {
            Ok(parsed) => return Ok((parsed, ignored)),
            Err(e) => e,
        };
        let Some(at) = offending_arg(&err, &args).filter(|_| ignored.len() < MAX_IGNORED_ARGS)
        else {
            return Err(err);
        };
        let flag = args.remove(at);
        // `--flag value` (not the chart's style, but legal): its value goes with it.
        if !flag.contains('=') && args.get(at).is_some_and(|next| !next.starts_with('-')) {
            args.remove(at);
        }
        ignored.push(flag);
    }
}

/// Where in `args` the flag that `err` is about starts: an unknown flag, or a known one
/// with a value this release refuses. `None` for any other error (a missing required
/// flag, a positional argument), which no leaving-out fixes.
fn offending_arg(err: &clap::Error, args: &[String]) -> Option<usize> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if !matches!(
        err.kind(),
        ErrorKind::UnknownArgument | ErrorKind::InvalidValue | ErrorKind::ValueValidation
    ) {
        return None;
    }
    let ContextValue::String(shown) = err.get(ContextKind::InvalidArg)? else {
        return None;
    };
    // Shown as `--flag`, `--flag=value` or `--flag <VALUE>`.
    let flag = shown.split([' ', '=']).next()?;
    if !flag.starts_with("--") {
        return None;
    }
    args.iter().position(|a| {
        a == flag
            || a.strip_prefix(flag)
                .is_some_and(|rest| rest.starts_with('='))
    })
}

/// The operator Deployments in `namespace` (every namespace when `None`), oldest first.
pub async fn find(client: &Client, namespace: Option<&str>) -> Result<Vec<Install>> {
    let api: Api<Deployment> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let mut found = api
        .list(&ListParams::default().labels(OPERATOR_SELECTOR))
        .await
        .map_err(Error::kube("listing kubegrace operator Deployments"))?
        .items;
    found.sort_by_key(|d| d.metadata.creation_timestamp.clone().map(|t| t.0));
    found.into_iter().map(from_deployment).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEPLOYMENT: &str = r#"
metadata: {name: kubegrace-operator, namespace: kg-system}
spec:
  selector: {matchLabels: {app.kubernetes.io/name: kubegrace, app.kubernetes.io/instance: r}}
  template:
    spec:
      containers:
        - name: operator
          args:
            - run
            - --namespace=$(POD_NAMESPACE)
            - --webhook-config=kg-sidecar-injector
            - --cert-secret=kg-webhook-cert
            - --sidecar-image=ghcr.io/kubegrace/sidecar:0.3.1
            - --leader-election-lease=kg-operator
"#;

    #[test]
    fn the_install_is_read_from_the_operators_own_arguments() {
        let d: Deployment = serde_norway::from_str(DEPLOYMENT).expect("deployment");
        let i = from_deployment(d).expect("install");
        assert_eq!(i.namespace, "kg-system");
        assert_eq!(i.args.namespace, "kg-system");
        assert_eq!(i.args.webhook_config, "kg-sidecar-injector");
        assert_eq!(i.args.leader_election_lease, "kg-operator");
        assert_eq!(i.sidecar_version(), "0.3.1");
        assert_eq!(i.cert_secret().as_deref(), Some("kg-webhook-cert"));
        assert_eq!(
            i.pod_selector().as_deref(),
            Some("app.kubernetes.io/instance=r,app.kubernetes.io/name=kubegrace")
        );
    }

    #[test]
    fn a_deployment_without_the_operator_container_is_not_an_install() {
        let d: Deployment =
            serde_norway::from_str(&DEPLOYMENT.replace("name: operator", "name: other"))
                .expect("deployment");
        assert!(from_deployment(d).is_err());
        let d: Deployment = serde_norway::from_str(
            &DEPLOYMENT.replace("- --namespace=$(POD_NAMESPACE)", "- stray"),
        )
        .expect("deployment");
        assert!(from_deployment(d).is_err());
    }

    /// An operator of a newer release: a flag this plugin does not know and a value it
    /// refuses are left out and named; everything else is read.
    #[test]
    fn an_operator_of_another_release_is_read_without_its_new_flags() {
        let newer = DEPLOYMENT.replace(
            "            - --leader-election-lease=kg-operator\n",
            "            - --leader-election-lease=kg-operator\n            - --sidecar-some-future-flag=on\n            - --sidecar-mode=hybrid\n            - --another-future\n            - value\n",
        );
        assert_ne!(newer, DEPLOYMENT);
        let d: Deployment = serde_norway::from_str(&newer).expect("deployment");
        let i = from_deployment(d).expect("install");
        assert_eq!(i.args.leader_election_lease, "kg-operator");
        assert_eq!(i.args.webhook_config, "kg-sidecar-injector");
        assert_eq!(
            i.ignored_args,
            [
                "--sidecar-some-future-flag=on",
                "--sidecar-mode=hybrid",
                "--another-future"
            ]
        );
    }

    #[test]
    fn leaving_out_flags_is_bounded() {
        let at_bound: Vec<String> = (0..MAX_IGNORED_ARGS)
            .map(|i| format!("--future-{i}=x"))
            .chain(["--namespace=ns".to_string()])
            .collect();
        let (_, ignored) = parse_tolerant(at_bound).expect("at the bound");
        assert_eq!(ignored.len(), MAX_IGNORED_ARGS);
        let past: Vec<String> = (0..=MAX_IGNORED_ARGS)
            .map(|i| format!("--future-{i}=x"))
            .collect();
        assert!(parse_tolerant(past).is_err());
    }
}
