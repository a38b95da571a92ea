//! A "pod": the test app, optionally fronted by a sidecar, and the two ways
//! kubelet terminates it.

use std::net::SocketAddr;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use anyhow::Result;
use http::StatusCode;

use super::WAIT;
use super::app::TestApp;
use super::balancer::Balancer;
use super::http::{self as client, Response};
use super::sidecar::{Sidecar, SidecarSpec};

pub struct Pod {
    pub name: String,
    pub app: TestApp,
    pub sidecar: Option<Sidecar>,
}

/// How kubelet orders a pod's termination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Termination {
    /// No sidecar: the naive app gets SIGTERM and is gone at once.
    Bare,
    /// Classic sidecar (a regular container): the sidecar's SIGTERM and the
    /// app's preStop (`/drain?wait=true`) start together; the app is killed
    /// when its preStop returns.
    RegularContainers,
    /// Native sidecar (init container, `restartPolicy: Always`): the app's
    /// preStop runs first, the app is killed when it returns, the sidecar
    /// gets SIGTERM only after the app is gone.
    NativeSidecar,
}

/// What happened while a pod terminated.
#[derive(Debug)]
pub struct Terminated {
    /// The preStop hook's answer (`Err` text if the call failed).
    pub pre_stop: Option<Result<Response, String>>,
    pub sidecar_exit: Option<ExitStatus>,
    pub took: Duration,
}

impl Pod {
    /// Starts the app and, when `sidecar_args` is `Some`, a sidecar in front.
    pub async fn start(name: &str, sidecar_args: Option<&[&str]>) -> Result<Self> {
        let app = TestApp::start(name).await?;
        let sidecar = match sidecar_args {
            Some(args) => Some(Sidecar::start(SidecarSpec::new(app.addr).args(args)).await?),
            None => None,
        };
        Ok(Self {
            name: name.to_string(),
            app,
            sidecar,
        })
    }

    /// Pods `a` and `b` (with a sidecar each when `sidecar_args` is
    /// `Some`), registered with `balancer` and routable.
    pub async fn pair(balancer: &Balancer, sidecar_args: Option<&[&str]>) -> Result<(Pod, Pod)> {
        let a = Pod::start("a", sidecar_args).await?;
        let b = Pod::start("b", sidecar_args).await?;
        for pod in [&a, &b] {
            pod.register(balancer);
            balancer.wait_routable(&pod.name, true, WAIT).await?;
        }
        Ok((a, b))
    }

    /// Registers the pod with the balancer, probing the sidecar's `/ready`
    /// or, bare, the app's own.
    pub fn register(&self, balancer: &Balancer) {
        match &self.sidecar {
            Some(s) => balancer.add(&self.name, s.listen, s.admin, "/ready"),
            None => balancer.add(&self.name, self.app.addr, self.app.addr, "/ready"),
        }
    }

    /// Terminates the pod the way kubelet does for `how`. Bounded: the
    /// preStop hook gets `hook_limit`, the sidecar `exit_limit` to exit.
    pub async fn terminate(
        &mut self,
        how: Termination,
        hook_limit: Duration,
        exit_limit: Duration,
    ) -> Result<Terminated> {
        let started = Instant::now();
        let mut out = Terminated {
            pre_stop: None,
            sidecar_exit: None,
            took: Duration::ZERO,
        };
        match (how, self.sidecar.as_mut()) {
            (Termination::Bare, _) | (_, None) => self.app.kill().await,
            (Termination::RegularContainers, Some(sidecar)) => {
                sidecar.signal("TERM")?;
                out.pre_stop = Some(pre_stop(sidecar.admin, hook_limit).await);
                self.app.kill().await;
                out.sidecar_exit = Some(sidecar.wait_exit(exit_limit).await?);
            }
            (Termination::NativeSidecar, Some(sidecar)) => {
                out.pre_stop = Some(pre_stop(sidecar.admin, hook_limit).await);
                self.app.kill().await;
                sidecar.signal("TERM")?;
                out.sidecar_exit = Some(sidecar.wait_exit(exit_limit).await?);
            }
        }
        out.took = started.elapsed();
        Ok(out)
    }
}

/// The app's preStop hook as the webhook writes it: `httpGet
/// /drain?wait=true` on the sidecar's admin port.
pub async fn pre_stop(admin: SocketAddr, limit: Duration) -> Result<Response, String> {
    client::request(admin, http::Method::GET, "/drain?wait=true", &[], limit)
        .await
        .map_err(|e| format!("{e:#}"))
}

impl Terminated {
    /// The preStop hook answered 200.
    pub fn pre_stop_ok(&self) -> bool {
        matches!(&self.pre_stop, Some(Ok(r)) if r.status == StatusCode::OK)
    }
}
