//! Where kubegrace is installed and what it was told: the operator Deployment (found by
//! the chart's labels) and its command line, parsed by the operator's own parser, so the
//! Lease, webhook configurations, certificate Secret and sidecar image are the names the
//! operator really uses, whatever the release called them.

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};
use kubegrace_operator::cli::RunArgs;

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
}

impl Install {
    pub fn name(&self) -> String {
        self.deployment.name_any()
    }

    /// The version of the sidecar the webhook injects (`kubegrace.io/sidecar-version`).
    pub fn sidecar_version(&self) -> &str {
        kubegrace_operator::image_ref::version_of(&self.args.sidecar_image)
    }

    /// The Secret holding the serving certificate: the operator's own, or the one
    /// cert-manager writes (the Secret behind the mounted certificate directory).
    pub fn cert_secret(&self) -> Option<String> {
        if self.args.cert_dir.is_none() {
            return Some(self.args.cert_secret.clone());
        }
        self.deployment
            .spec
            .as_ref()?
            .template
            .spec
            .as_ref()?
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

/// Reads the install from an operator Deployment (pure): its `run` arguments, with
/// `$(POD_NAMESPACE)` being the Deployment's namespace.
pub fn from_deployment(deployment: Deployment) -> Result<Install> {
    let namespace = deployment.namespace().unwrap_or_default();
    let name = deployment.name_any();
    let container = deployment
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|s| s.containers.iter().find(|c| c.name == OPERATOR_CONTAINER))
        .ok_or_else(|| {
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
    let args = RunArgs::from_args(&args).map_err(|e| {
        Error::Invalid(format!(
            "the arguments of {namespace}/{name} are not the operator's: {e}"
        ))
    })?;
    Ok(Install {
        namespace,
        deployment,
        args,
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
        let d: Deployment =
            serde_norway::from_str(&DEPLOYMENT.replace("--leader-election-lease", "--no-such"))
                .expect("deployment");
        assert!(from_deployment(d).is_err());
    }
}
