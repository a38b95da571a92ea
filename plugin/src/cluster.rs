//! The client (kubeconfig and context as kubectl takes them), reads through the API
//! server's pod proxy, and the one bounded wait every command uses.

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::DynamicObject;
use kube::{Api, Client};

use crate::{Error, Result};

/// GraceRoutes as dynamic objects, in one namespace or all, decoded one by one
/// as the operator reads them ([`kubegrace_api::tolerant`]): one route stored under
/// a looser schema fails alone, not the whole answer.
pub fn routes(client: &Client, ns: Option<&str>) -> Api<DynamicObject> {
    let ar = kubegrace_api::tolerant::api_resource();
    match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    }
}

/// `ns/name` from `api`; [`Error::NotFound`] naming its `kind` when there is none.
pub async fn get<K>(api: &Api<K>, kind: &str, ns: &str, name: &str) -> Result<K>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.get_opt(name)
        .await
        .map_err(Error::kube(format!("reading {kind} {ns}/{name}")))?
        .ok_or_else(|| Error::NotFound(format!("{kind} {ns}/{name} not found")))
}

/// Where the cluster is: `--kubeconfig` (else `KUBECONFIG`, else `~/.kube/config`, else
/// in-cluster) and `--context`, as kubectl passes them on to a plugin.
#[derive(Debug, Clone, Default)]
pub struct Target {
    pub kubeconfig: Option<PathBuf>,
    pub context: Option<String>,
}

impl Target {
    /// A client, and the namespace of the context (`default` when it names none).
    pub async fn client(&self) -> Result<(Client, String)> {
        let options = KubeConfigOptions {
            context: self.context.clone(),
            ..KubeConfigOptions::default()
        };
        let config = match &self.kubeconfig {
            Some(path) => {
                let kc = Kubeconfig::read_from(path)
                    .map_err(|e| Error::Kubeconfig(format!("{}: {e}", path.display())))?;
                kube::Config::from_custom_kubeconfig(kc, &options)
                    .await
                    .map_err(|e| e.to_string())
            }
            None if self.context.is_some() => kube::Config::from_kubeconfig(&options)
                .await
                .map_err(|e| e.to_string()),
            None => kube::Config::infer().await.map_err(|e| e.to_string()),
        }
        .map_err(Error::Kubeconfig)?;
        let namespace = config.default_namespace.clone();
        let client = Client::try_from(config).map_err(Error::kube("building the client"))?;
        Ok((client, namespace))
    }
}

/// `GET path` on a pod's `port` through the API server's pod proxy
/// (`/api/v1/namespaces/NS/pods/POD:PORT/proxy/PATH`): no port-forward, and it reaches
/// the pod wherever the API server does.
pub async fn pod_get(
    client: &Client,
    namespace: &str,
    pod: &str,
    port: u16,
    path: &str,
) -> Result<String> {
    let path = path.trim_start_matches('/');
    let url = format!("/api/v1/namespaces/{namespace}/pods/{pod}:{port}/proxy/{path}");
    let req = http::Request::get(url.as_str())
        .body(Vec::new())
        .map_err(|e| Error::Invalid(format!("{url}: {e}")))?;
    client
        .request_text(req)
        .await
        .map_err(Error::kube(format!("GET {url}")))
}

/// Polls `probe` every `interval` until it returns `Ok`, at most `timeout`; the error
/// says what was still missing at the end.
pub async fn wait<T, Fut>(
    what: &str,
    timeout: Duration,
    interval: Duration,
    mut probe: impl FnMut() -> Fut,
) -> Result<T>
where
    Fut: Future<Output = std::result::Result<T, String>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let last = match probe().await {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        if tokio::time::Instant::now() >= deadline {
            return Err(Error::Timeout {
                what: what.to_owned(),
                seconds: timeout.as_secs(),
                last,
            });
        }
        tokio::time::sleep(interval).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_wait_ends_at_its_deadline_and_says_what_was_missing() {
        let mut calls = 0;
        let got: Result<()> = wait(
            "the thing",
            Duration::from_millis(300),
            Duration::from_millis(100),
            || {
                calls += 1;
                let n = calls;
                async move { Err(format!("attempt {n}")) }
            },
        )
        .await;
        let err = got.expect_err("never ready").to_string();
        assert!(
            err.contains("the thing") && err.contains("attempt"),
            "{err}"
        );
        let ok = wait(
            "x",
            Duration::from_secs(3),
            Duration::from_secs(1),
            || async { Ok::<_, String>(7) },
        )
        .await
        .expect("ready at once");
        assert_eq!(ok, 7);
    }
}
