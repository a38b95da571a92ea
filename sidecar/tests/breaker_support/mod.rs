//! Harness for the circuit-breaker scenario tests (`tests/breaker_*.rs`).
//!
//! Everything is real and on 127.0.0.1: the `kubegrace-sidecar` binary as a
//! subprocess with a YAML config, a hyper app behind it whose health and
//! capacity the test switches at run time, and a pooled hyper client.
//! Nothing reaches into the sidecar's library: the tests see what a user
//! sees (responses, `/breakers`, `/metrics`).

// Each test file uses a different part of the harness.
#![allow(dead_code)]

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// Polls `check` every 20ms until it returns `Some`, or fails after
/// `within`: tests wait on conditions, the deadline only bounds a hang.
pub async fn wait_for<T, F, Fut>(what: &str, within: Duration, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(value) = check().await {
            return Ok(value);
        }
        if Instant::now() >= deadline {
            bail!("timed out after {within:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ---------------------------------------------------------------------------
// The app
// ---------------------------------------------------------------------------

/// What the app does, switchable while it runs.
pub struct AppControl {
    /// Requests whose path starts with this fail with 500 (empty: none).
    failing_prefix: std::sync::Mutex<Option<String>>,
    /// How long a failing request takes before its 500: a sick app is
    /// often slow too, which is what makes a fast fallback worth having.
    pub fail_delay_ms: AtomicU64,
    /// How long a good request takes once it holds a capacity slot.
    pub service_ms: AtomicU64,
    /// Requests served at once; the rest wait inside the app (its accept
    /// queue, thread pool...), which is what makes latency grow.
    capacity: Arc<Semaphore>,
    capacity_now: AtomicU32,
    /// Requests that reached the app, by first path segment and in total.
    pub received: AtomicU64,
    received_by_route: std::sync::Mutex<std::collections::HashMap<String, u64>>,
    /// Requests currently inside the app, and the most ever seen at once.
    pub inside: AtomicU32,
    pub peak_inside: AtomicU32,
}

impl AppControl {
    pub fn fail(&self, prefix: Option<&str>) {
        *lock(&self.failing_prefix) = prefix.map(str::to_string);
    }

    pub fn received_for(&self, first_segment: &str) -> u64 {
        lock(&self.received_by_route)
            .get(first_segment)
            .copied()
            .unwrap_or(0)
    }

    pub fn capacity(&self) -> u32 {
        self.capacity_now.load(Ordering::Relaxed)
    }

    /// Changes how many requests the app serves at once. Lowering waits
    /// for running requests to hand their slots back (in the background).
    pub fn set_capacity(&self, capacity: u32) {
        let before = self.capacity_now.swap(capacity, Ordering::AcqRel);
        if capacity > before {
            self.capacity.add_permits((capacity - before) as usize);
        } else if capacity < before {
            let semaphore = self.capacity.clone();
            let take = before - capacity;
            tokio::spawn(async move {
                if let Ok(permits) = semaphore.acquire_many(take).await {
                    permits.forget();
                }
            });
        }
    }

    pub fn reset_peak(&self) {
        self.peak_inside
            .store(self.inside.load(Ordering::Relaxed), Ordering::Relaxed);
    }
}

fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub struct App {
    pub addr: SocketAddr,
    pub control: Arc<AppControl>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for App {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Starts the app on a free loopback port.
pub async fn start_app(capacity: u32, service: Duration) -> Result<App> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let control = Arc::new(AppControl {
        failing_prefix: std::sync::Mutex::new(None),
        fail_delay_ms: AtomicU64::new(0),
        service_ms: AtomicU64::new(u64::try_from(service.as_millis()).unwrap_or(u64::MAX)),
        capacity: Arc::new(Semaphore::new(capacity as usize)),
        capacity_now: AtomicU32::new(capacity),
        received: AtomicU64::new(0),
        received_by_route: std::sync::Mutex::new(Default::default()),
        inside: AtomicU32::new(0),
        peak_inside: AtomicU32::new(0),
    });
    let serving = control.clone();
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let control = serving.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| handle(control.clone(), req));
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok(App {
        addr,
        control,
        task,
    })
}

async fn handle(
    control: Arc<AppControl>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = req.uri().path().to_string();
    let segment = path
        .trim_start_matches('/')
        .split('/')
        .next()
        .unwrap_or_default()
        .to_string();
    control.received.fetch_add(1, Ordering::Relaxed);
    *lock(&control.received_by_route).entry(segment).or_default() += 1;
    let inside = control.inside.fetch_add(1, Ordering::Relaxed) + 1;
    control.peak_inside.fetch_max(inside, Ordering::Relaxed);
    let _leave = Leave(&control.inside);

    let failing = lock(&control.failing_prefix)
        .as_deref()
        .is_some_and(|prefix| path.starts_with(prefix));
    if failing {
        let delay = control.fail_delay_ms.load(Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(delay)).await;
        let mut response = Response::new(Full::new(Bytes::from_static(b"app error\n")));
        *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
        return Ok(response);
    }
    let Ok(_slot) = control.capacity.acquire().await else {
        let mut response = Response::new(Full::new(Bytes::from_static(b"closed\n")));
        *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
        return Ok(response);
    };
    tokio::time::sleep(Duration::from_millis(
        control.service_ms.load(Ordering::Relaxed),
    ))
    .await;
    Ok(Response::new(Full::new(Bytes::from_static(b"ok\n"))))
}

struct Leave<'a>(&'a AtomicU32);

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

// ---------------------------------------------------------------------------
// The sidecar
// ---------------------------------------------------------------------------

/// The real binary, killed when dropped.
pub struct Sidecar {
    pub listen: SocketAddr,
    pub admin: SocketAddr,
    pub config_file: PathBuf,
    dir: PathBuf,
    child: Child,
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        } else {
            eprintln!("sidecar logs kept in {}", self.dir.display());
        }
    }
}

fn scratch_dir(name: &str) -> Result<PathBuf> {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "kubegrace-{name}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

/// Starts the sidecar in front of `upstream` with `routes_yaml` (the YAML
/// of the config's top-level keys other than the addresses) and waits until
/// it announced its ports.
pub async fn start_sidecar(name: &str, upstream: SocketAddr, config_yaml: &str) -> Result<Sidecar> {
    let dir = scratch_dir(name)?;
    let config_file = dir.join("config.yaml");
    std::fs::write(&config_file, config_yaml)?;
    let ready_file = dir.join("ready.json");
    let stdout = std::fs::File::create(dir.join("stdout.log"))?;
    let stderr = std::fs::File::create(dir.join("stderr.log"))?;
    let child = Command::new(env!("CARGO_BIN_EXE_kubegrace-sidecar"))
        .arg("--listen")
        .arg("127.0.0.1:0")
        .arg("--admin")
        .arg("127.0.0.1:0")
        .arg("--upstream")
        .arg(upstream.to_string())
        .arg("--config")
        .arg(&config_file)
        .arg("--ready-file")
        .arg(&ready_file)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .spawn()
        .context("spawning kubegrace-sidecar")?;
    let mut sidecar = Sidecar {
        listen: "127.0.0.1:0".parse()?,
        admin: "127.0.0.1:0".parse()?,
        config_file,
        dir: dir.clone(),
        child,
    };
    let ready: serde_json::Value =
        wait_for("the sidecar's ready file", Duration::from_secs(20), || {
            let ready_file = ready_file.clone();
            async move {
                let text = std::fs::read_to_string(&ready_file).ok()?;
                serde_json::from_str(&text).ok()
            }
        })
        .await
        .with_context(|| logs(&dir))?;
    sidecar.listen = addr_field(&ready, "listen")?;
    sidecar.admin = addr_field(&ready, "admin")?;
    Ok(sidecar)
}

fn addr_field(ready: &serde_json::Value, key: &str) -> Result<SocketAddr> {
    ready[key]
        .as_str()
        .with_context(|| format!("ready file has no {key}: {ready}"))?
        .parse()
        .with_context(|| format!("ready file {key} is not an address: {ready}"))
}

fn logs(dir: &Path) -> String {
    let read = |file: &str| std::fs::read_to_string(dir.join(file)).unwrap_or_default();
    format!(
        "stdout:\n{}\nstderr:\n{}",
        read("stdout.log"),
        read("stderr.log")
    )
}

impl Sidecar {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.listen)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn logs(&self) -> String {
        logs(&self.dir)
    }

    /// `GET /breakers`.
    pub async fn breakers(&self, client: &HttpClient) -> Result<serde_json::Value> {
        let reply = client
            .get(&format!("http://{}/breakers", self.admin))
            .await?;
        if reply.status != StatusCode::OK {
            bail!("/breakers answered {}: {}", reply.status, reply.body);
        }
        serde_json::from_str(&reply.body)
            .with_context(|| format!("/breakers is not JSON: {}", reply.body))
    }

    /// One route's entry from `/breakers`.
    pub async fn route(&self, client: &HttpClient, name: &str) -> Result<serde_json::Value> {
        let all = self.breakers(client).await?;
        all["routes"]
            .as_array()
            .and_then(|routes| routes.iter().find(|r| r["name"] == name))
            .cloned()
            .with_context(|| format!("no route {name} in /breakers: {all}"))
    }

    pub async fn metrics(&self, client: &HttpClient) -> Result<String> {
        Ok(client
            .get(&format!("http://{}/metrics", self.admin))
            .await?
            .body)
    }
}

/// The value of one sample line (`name{labels} value`) in Prometheus text.
pub fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        line.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

// ---------------------------------------------------------------------------
// The client
// ---------------------------------------------------------------------------

pub struct Reply {
    pub status: StatusCode,
    pub fallback: Option<String>,
    pub retry_after: Option<u64>,
    pub body: String,
    pub latency: Duration,
}

#[derive(Clone)]
pub struct HttpClient {
    inner: Client<HttpConnector, Full<Bytes>>,
}

impl HttpClient {
    pub fn new() -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let inner = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(1024)
            .build(connector);
        Self { inner }
    }

    /// GET with a 20s ceiling, so a hang fails the test instead of stalling it.
    pub async fn get(&self, url: &str) -> Result<Reply> {
        let request = Request::get(url).body(Full::new(Bytes::new()))?;
        let started = Instant::now();
        let response = tokio::time::timeout(Duration::from_secs(20), self.inner.request(request))
            .await
            .with_context(|| format!("GET {url} hung"))?
            .with_context(|| format!("GET {url}"))?;
        let status = response.status();
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let fallback = header("x-kubegrace-fallback");
        let retry_after = header("retry-after").and_then(|v| v.parse().ok());
        let body = tokio::time::timeout(Duration::from_secs(20), response.into_body().collect())
            .await
            .with_context(|| format!("body of GET {url} hung"))?
            .with_context(|| format!("body of GET {url}"))?
            .to_bytes();
        Ok(Reply {
            status,
            fallback,
            retry_after,
            body: String::from_utf8_lossy(&body).into_owned(),
            latency: started.elapsed(),
        })
    }
}

impl Default for HttpClient {
    fn default() -> Self {
        Self::new()
    }
}

/// The `q`-quantile (0..=1) of some latencies; zero when empty.
pub fn quantile(latencies: &mut [Duration], q: f64) -> Duration {
    if latencies.is_empty() {
        return Duration::ZERO;
    }
    latencies.sort_unstable();
    let index = ((latencies.len() - 1) as f64 * q).round() as usize;
    latencies[index.min(latencies.len() - 1)]
}
