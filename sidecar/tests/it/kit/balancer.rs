//! A client-side stand-in for kube-proxy and the endpoints controller.
//!
//! - New connections go only to pods whose readiness probe answered 200, as
//!   seen `lag` ago: routers learn about a terminating pod late.
//! - A connection, once made, stays with its pod until the server closes it
//!   or answers `Connection: close` (that is [`load`](super::load)'s job).
//! - A refused connection is not retried elsewhere: the client sees it.

use std::collections::VecDeque;
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use anyhow::Result;
use http::{Method, StatusCode};

use super::http as client;
use super::wait_for;

/// How often readiness is probed (kubelet's periodSeconds, scaled down).
pub const PROBE_EVERY: Duration = Duration::from_millis(50);

/// Where a pod's traffic goes.
#[derive(Debug, Clone)]
pub enum Target {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

impl From<SocketAddr> for Target {
    fn from(addr: SocketAddr) -> Self {
        Self::Tcp(addr)
    }
}

impl From<PathBuf> for Target {
    fn from(path: PathBuf) -> Self {
        Self::Unix(path)
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Tcp(addr) => write!(f, "{addr}"),
            Self::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

struct Endpoint {
    name: String,
    serve: Target,
    /// (when observed, ready) with the newest last.
    observed: VecDeque<(Instant, bool)>,
}

struct Inner {
    lag: Duration,
    endpoints: Mutex<Vec<Endpoint>>,
    next: AtomicUsize,
}

#[derive(Clone)]
pub struct Balancer {
    inner: Arc<Inner>,
}

impl Balancer {
    pub fn new(lag: Duration) -> Self {
        Self {
            inner: Arc::new(Inner {
                lag,
                endpoints: Mutex::new(Vec::new()),
                next: AtomicUsize::new(0),
            }),
        }
    }

    /// Adds a pod: traffic goes to `serve`; readiness is `GET probe_path` on
    /// `probe`, polled until the balancer is dropped.
    pub fn add(&self, name: &str, serve: SocketAddr, probe: SocketAddr, probe_path: &'static str) {
        if let Ok(mut endpoints) = self.inner.endpoints.lock() {
            endpoints.push(Endpoint {
                name: name.to_string(),
                serve: Target::Tcp(serve),
                observed: VecDeque::new(),
            });
        }
        let weak = Arc::downgrade(&self.inner);
        let name = name.to_string();
        tokio::spawn(probe_loop(weak, name, probe, probe_path));
    }

    /// One pod at `serve`, always routable: a client that knows its
    /// server's address (outside Kubernetes, no readiness in the way).
    pub fn fixed(name: &str, serve: impl Into<Target>) -> Self {
        let balancer = Self::new(Duration::ZERO);
        if let Ok(mut endpoints) = balancer.inner.endpoints.lock() {
            endpoints.push(Endpoint {
                name: name.to_string(),
                serve: serve.into(),
                observed: VecDeque::from([(Instant::now(), true)]),
            });
        }
        balancer
    }

    /// Round robin over the pods that are routable now.
    pub fn pick(&self) -> Option<(String, Target)> {
        let routable = self.routable();
        if routable.is_empty() {
            return None;
        }
        let i = self.inner.next.fetch_add(1, Ordering::Relaxed) % routable.len();
        routable.into_iter().nth(i)
    }

    /// The pods new connections may go to, as the (lagging) router sees them.
    pub fn routable(&self) -> Vec<(String, Target)> {
        let Some(seen_at) = Instant::now().checked_sub(self.inner.lag) else {
            return Vec::new();
        };
        let Ok(endpoints) = self.inner.endpoints.lock() else {
            return Vec::new();
        };
        endpoints
            .iter()
            .filter(|e| {
                e.observed
                    .iter()
                    .rev()
                    .find(|(at, _)| *at <= seen_at)
                    .is_some_and(|(_, ready)| *ready)
            })
            .map(|e| (e.name.clone(), e.serve.clone()))
            .collect()
    }

    /// The Service's virtual IP: each new TCP connection goes to a pod the
    /// (lagging) balancer sees as ready and stays there, as kube-proxy does.
    /// For clients that cannot be handed a balancer (another process).
    pub async fn front(&self) -> Result<SocketAddr> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let balancer = self.clone();
        tokio::spawn(async move {
            while let Ok((mut down, _)) = listener.accept().await {
                let Some((_, Target::Tcp(pod))) = balancer.pick() else {
                    continue;
                };
                tokio::spawn(async move {
                    if let Ok(mut up) = tokio::net::TcpStream::connect(pod).await {
                        let _ = tokio::io::copy_bidirectional(&mut down, &mut up).await;
                    }
                });
            }
        });
        Ok(addr)
    }

    pub fn is_routable(&self, name: &str) -> bool {
        self.routable().iter().any(|(n, _)| n == name)
    }

    /// Waits (bounded) until the router's view of `name` is `routable`.
    pub async fn wait_routable(&self, name: &str, routable: bool, within: Duration) -> Result<()> {
        wait_for(
            &format!("balancer to see {name} as routable={routable}"),
            within,
            || async { (self.is_routable(name) == routable).then_some(()) },
        )
        .await
    }
}

async fn probe_loop(weak: Weak<Inner>, name: String, probe: SocketAddr, path: &'static str) {
    loop {
        let ready = client::request(probe, Method::GET, path, &[], Duration::from_millis(500))
            .await
            .is_ok_and(|r| r.status == StatusCode::OK);
        let Some(inner) = weak.upgrade() else {
            return;
        };
        let now = Instant::now();
        if let Ok(mut endpoints) = inner.endpoints.lock()
            && let Some(e) = endpoints.iter_mut().find(|e| e.name == name)
        {
            e.observed.push_back((now, ready));
            // Keep the newest observation older than the lag, drop the rest.
            if let Some(seen_at) = now.checked_sub(inner.lag) {
                while e.observed.len() > 1
                    && e.observed.get(1).is_some_and(|(at, _)| *at <= seen_at)
                {
                    e.observed.pop_front();
                }
            }
        }
        drop(inner);
        tokio::time::sleep(PROBE_EVERY).await;
    }
}
