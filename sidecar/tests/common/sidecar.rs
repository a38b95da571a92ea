//! The real `kubegrace-sidecar` binary as a child process.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use http::{Method, StatusCode};
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};
use tokio::task::JoinHandle;

use super::http::{self as client, Response};
use super::wait_for;

pub const BIN: &str = env!("CARGO_BIN_EXE_kubegrace-sidecar");

/// Drain timers short enough for tests, long enough to watch each phase.
pub const FAST_DRAIN: &[&str] = &[
    "--drain-min-delay",
    "300ms",
    "--drain-quiet",
    "200ms",
    "--drain-max-delay",
    "3s",
    "--drain-timeout",
    "2s",
];

/// How to start one sidecar.
#[derive(Debug, Clone)]
pub struct SidecarSpec {
    pub upstream: SocketAddr,
    /// Extra flags, e.g. [`FAST_DRAIN`] or `--protocol http2`.
    pub args: Vec<String>,
    /// YAML written to a file and passed as `--config`.
    pub config_yaml: Option<String>,
}

impl SidecarSpec {
    pub fn new(upstream: SocketAddr) -> Self {
        Self {
            upstream,
            args: Vec::new(),
            config_yaml: None,
        }
    }

    pub fn args(mut self, args: &[&str]) -> Self {
        self.args.extend(args.iter().map(|a| a.to_string()));
        self
    }

    pub fn config(mut self, yaml: &str) -> Self {
        self.config_yaml = Some(yaml.to_string());
        self
    }
}

/// A running sidecar. Killed (SIGKILL) when dropped, so a failing test never
/// leaves one behind; its logs are printed when the test panics.
pub struct Sidecar {
    child: Child,
    pub pid: u32,
    pub listen: SocketAddr,
    pub admin: SocketAddr,
    pub config_path: Option<PathBuf>,
    logs: Arc<Mutex<Vec<String>>>,
    /// The tasks copying stdout and stderr into `logs`.
    readers: Vec<JoinHandle<()>>,
    exit: Option<ExitStatus>,
}

/// A scratch directory under cargo's per-target test tmpdir.
pub fn scratch_dir(tag: &str) -> Result<PathBuf> {
    static N: AtomicU64 = AtomicU64::new(0);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "kubegrace-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    Ok(dir)
}

/// A sidecar command with its output captured into `logs`.
fn command(args: &[String]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    // The caller's environment must not leak settings into the test.
    for (key, _) in std::env::vars() {
        if key.starts_with("KUBEGRACE_") {
            cmd.env_remove(key);
        }
    }
    cmd.env("RUST_LOG", "info");
    cmd
}

fn capture(
    stream: impl AsyncRead + Unpin + Send + 'static,
    logs: Arc<Mutex<Vec<String>>>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut lines = BufReader::new(stream).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if let Ok(mut logs) = logs.lock() {
                logs.push(line);
            }
        }
    })
}

impl Sidecar {
    /// Starts the binary on port 0 for both listeners, learns the bound
    /// ports from its ready line, and waits (bounded) until `/ready` answers
    /// 200.
    pub async fn start(spec: SidecarSpec) -> Result<Self> {
        let mut sidecar = Self::spawn(spec)?;
        sidecar.learn_ports().await?;
        sidecar.wait_ready().await
    }

    /// Starts the binary and learns its ports, without waiting for
    /// readiness (for an app that is not up yet).
    pub async fn start_unready(spec: SidecarSpec) -> Result<Self> {
        let mut sidecar = Self::spawn(spec)?;
        sidecar.learn_ports().await?;
        Ok(sidecar)
    }

    /// Starts the binary without waiting for anything; `listen` and `admin`
    /// are unknown (0) until the ready line is seen.
    pub fn spawn(spec: SidecarSpec) -> Result<Self> {
        let unbound = SocketAddr::from(([127, 0, 0, 1], 0));
        let (listen, admin) = (unbound, unbound);
        let mut args = vec![
            "--listen".to_string(),
            listen.to_string(),
            "--upstream".to_string(),
            spec.upstream.to_string(),
            "--admin".to_string(),
            admin.to_string(),
        ];
        let config_path = match &spec.config_yaml {
            Some(yaml) => {
                let path = scratch_dir("config")?.join("config.yaml");
                std::fs::write(&path, yaml).with_context(|| format!("write {}", path.display()))?;
                args.push("--config".into());
                args.push(path.display().to_string());
                Some(path)
            }
            None => None,
        };
        args.extend(spec.args.iter().cloned());
        let mut child = command(&args)
            .spawn()
            .with_context(|| format!("spawn {BIN}"))?;
        let pid = child.id().context("child pid")?;
        let logs = Arc::new(Mutex::new(Vec::new()));
        let mut readers = Vec::new();
        if let Some(out) = child.stdout.take() {
            readers.push(capture(out, logs.clone()));
        }
        if let Some(err) = child.stderr.take() {
            readers.push(capture(err, logs.clone()));
        }
        Ok(Self {
            child,
            pid,
            listen,
            admin,
            config_path,
            logs,
            readers,
            exit: None,
        })
    }

    /// Reads "kubegrace-sidecar ready listen=ADDR admin=ADDR" (stdout).
    async fn learn_ports(&mut self) -> Result<()> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            if let Some((listen, admin)) = self.logs().iter().find_map(|l| parse_ready_line(l)) {
                self.listen = listen;
                self.admin = admin;
                return Ok(());
            }
            if let Some(status) = self.child.try_wait().context("try_wait")? {
                bail!(
                    "sidecar exited before it was ready ({status}); logs:\n{}",
                    self.logs_text()
                );
            }
            if tokio::time::Instant::now() >= deadline {
                bail!("no ready line within 30s; logs:\n{}", self.logs_text());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn wait_ready(mut self) -> Result<Self> {
        // Generous: a cold binary on a loaded 2-core machine.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().context("try_wait")? {
                bail!(
                    "sidecar exited before it was ready ({status}); logs:\n{}",
                    self.logs_text()
                );
            }
            if let Ok(resp) = client::request(
                self.admin,
                Method::GET,
                "/ready",
                &[],
                Duration::from_secs(2),
            )
            .await
                && resp.status == StatusCode::OK
            {
                return Ok(self);
            }
            if tokio::time::Instant::now() >= deadline {
                bail!(
                    "sidecar never became ready within 30s; logs:\n{}",
                    self.logs_text()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Sends a Unix signal (`TERM`, `INT`, `HUP`, ...) with kill(1): the
    /// workspace forbids `unsafe`, so no libc call.
    pub fn signal(&self, name: &str) -> Result<()> {
        let status = std::process::Command::new("kill")
            .arg("-s")
            .arg(name)
            .arg(self.pid.to_string())
            .status()
            .context("run kill")?;
        if !status.success() {
            bail!("kill -s {name} {} failed: {status}", self.pid);
        }
        Ok(())
    }

    /// Waits (bounded) for the process to exit.
    pub async fn wait_exit(&mut self, limit: Duration) -> Result<ExitStatus> {
        if let Some(status) = self.exit {
            return Ok(status);
        }
        let status = tokio::time::timeout(limit, self.child.wait())
            .await
            .with_context(|| {
                format!(
                    "sidecar still running {limit:?} later; logs:\n{}",
                    self.logs_text()
                )
            })?
            .context("wait")?;
        self.exit = Some(status);
        // The last lines (the drain summary) may still sit in the pipes.
        for reader in std::mem::take(&mut self.readers) {
            let _ = tokio::time::timeout(Duration::from_secs(5), reader).await;
        }
        Ok(status)
    }

    pub fn logs(&self) -> Vec<String> {
        self.logs.lock().map(|l| l.clone()).unwrap_or_default()
    }

    pub fn logs_text(&self) -> String {
        self.logs().join("\n")
    }

    /// Waits (bounded) until a log line contains `needle`, and returns it.
    pub async fn wait_log(&self, needle: &str, limit: Duration) -> Result<String> {
        wait_for(
            &format!("a log line containing {needle:?}"),
            limit,
            || async { self.logs().into_iter().find(|l| l.contains(needle)) },
        )
        .await
        .with_context(|| format!("logs so far:\n{}", self.logs_text()))
    }

    pub async fn admin(&self, method: Method, path: &str) -> Result<Response> {
        client::request(self.admin, method, path, &[], Duration::from_secs(10)).await
    }

    pub async fn admin_get(&self, path: &str) -> Result<Response> {
        self.admin(Method::GET, path).await
    }

    /// `GET /ready` status, or `None` when the admin port does not answer.
    pub async fn ready_status(&self) -> Option<StatusCode> {
        client::request(
            self.admin,
            Method::GET,
            "/ready",
            &[],
            Duration::from_secs(2),
        )
        .await
        .ok()
        .map(|r| r.status)
    }

    pub async fn metrics(&self) -> Result<Metrics> {
        let resp = self.admin_get("/metrics").await?;
        if resp.status != StatusCode::OK {
            bail!("/metrics answered {}", resp.status);
        }
        Ok(Metrics::parse(&resp.text()))
    }

    /// Waits (bounded) until `metric` (summed over its series) satisfies `pred`.
    pub async fn wait_metric(
        &self,
        metric: &str,
        limit: Duration,
        pred: impl Fn(f64) -> bool,
    ) -> Result<f64> {
        let pred = &pred;
        wait_for(&format!("metric {metric}"), limit, || async move {
            let value = self.metrics().await.ok()?.sum(metric)?;
            pred(value).then_some(value)
        })
        .await
        .with_context(|| format!("logs so far:\n{}", self.logs_text()))
    }

    /// The drain summary of the exit log line, e.g. "drained 12 connections
    /// in 1.2s, 1 force-closed": (connections drained, force-closed).
    pub fn drain_summary(&self) -> Option<(u64, u64)> {
        self.logs()
            .iter()
            .rev()
            .find_map(|line| parse_drain_summary(line))
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "---- kubegrace-sidecar logs (pid {}) ----\n{}",
                self.pid,
                self.logs_text()
            );
        }
        // kill_on_drop sends SIGKILL if it is still running.
        if let Some(dir) = self.config_path.as_ref().and_then(|p| p.parent()) {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Runs the binary with `args` to completion (for flag and config errors):
/// returns its exit status and its combined output.
pub async fn run_to_exit(args: &[&str], limit: Duration) -> Result<(ExitStatus, String)> {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let child = command(&args)
        .spawn()
        .with_context(|| format!("spawn {BIN}"))?;
    let out = tokio::time::timeout(limit, child.wait_with_output())
        .await
        .with_context(|| format!("{BIN} {args:?} still running after {limit:?}"))?
        .context("wait_with_output")?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok((out.status, text))
}

/// Parses "kubegrace-sidecar ready listen=ADDR admin=ADDR".
pub fn parse_ready_line(line: &str) -> Option<(SocketAddr, SocketAddr)> {
    let rest = &line[line.find("kubegrace-sidecar ready ")?..];
    let field = |key: &str| -> Option<SocketAddr> {
        let at = rest.find(key)? + key.len();
        rest[at..].split_whitespace().next()?.parse().ok()
    };
    Some((field("listen=")?, field("admin=")?))
}

/// Finds "drained N connections ... M force-closed" in one log line.
pub fn parse_drain_summary(line: &str) -> Option<(u64, u64)> {
    let lower = line.to_ascii_lowercase();
    let drained_at = lower.find("drained ")?;
    let after = &lower[drained_at + "drained ".len()..];
    let drained: u64 = after
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()?;
    let forced_at = lower.find(" force-closed")?;
    let before = lower[..forced_at].trim_end();
    let digits: String = before
        .chars()
        .rev()
        .take_while(|c| c.is_ascii_digit())
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    let forced: u64 = digits.parse().ok()?;
    Some((drained, forced))
}

/// Prometheus text format, just enough for assertions.
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    /// `name{labels}` (exactly as exposed) -> value.
    pub series: BTreeMap<String, f64>,
}

impl Metrics {
    pub fn parse(text: &str) -> Self {
        let mut series = BTreeMap::new();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            // The value follows the series; an optional timestamp follows it.
            let (key, rest) = match line.rfind('}') {
                Some(end) => (&line[..=end], line[end + 1..].trim()),
                None => match line.split_once(char::is_whitespace) {
                    Some((k, r)) => (k, r.trim()),
                    None => continue,
                },
            };
            if let Some(value) = rest
                .split_whitespace()
                .next()
                .and_then(|v| v.parse::<f64>().ok())
            {
                series.insert(key.to_string(), value);
            }
        }
        Self { series }
    }

    /// Sum over every series of the metric `name`; `None` if it is absent.
    pub fn sum(&self, name: &str) -> Option<f64> {
        let mut found = false;
        let mut total = 0.0;
        for (key, value) in &self.series {
            let base = key.split('{').next().unwrap_or(key);
            if base == name {
                found = true;
                total += value;
            }
        }
        found.then_some(total)
    }

    /// The value of the series of `name` whose labels contain `label`
    /// (e.g. `code_class="5xx"`).
    pub fn with_label(&self, name: &str, label: &str) -> Option<f64> {
        self.series
            .iter()
            .find(|(key, _)| key.split('{').next() == Some(name) && key.contains(label))
            .map(|(_, v)| *v)
    }
}

#[test]
fn ready_line_gives_both_ports() {
    assert_eq!(
        parse_ready_line("kubegrace-sidecar ready listen=127.0.0.1:4000 admin=127.0.0.1:4001"),
        Some((
            SocketAddr::from(([127, 0, 0, 1], 4000)),
            SocketAddr::from(([127, 0, 0, 1], 4001))
        ))
    );
    assert_eq!(parse_ready_line("kubegrace-sidecar ready"), None);
}

#[test]
fn drain_summary_is_found_in_plain_and_structured_lines() {
    assert_eq!(
        parse_drain_summary("INFO drained 12 connections in 1.2s, 1 force-closed"),
        Some((12, 1))
    );
    assert_eq!(
        parse_drain_summary(r#"{"msg":"drained 3 connections in 0.4s, 0 force-closed"}"#),
        Some((3, 0))
    );
    assert_eq!(parse_drain_summary("listening"), None);
}

#[test]
fn metrics_parse_sums_series() {
    let m = Metrics::parse(
        "# HELP x y\nkubegrace_requests_total{code_class=\"2xx\"} 5\nkubegrace_requests_total{code_class=\"5xx\"} 2\nkubegrace_drain_phase 1\n",
    );
    assert_eq!(m.sum("kubegrace_requests_total"), Some(7.0));
    assert_eq!(
        m.with_label("kubegrace_requests_total", "code_class=\"5xx\""),
        Some(2.0)
    );
    assert_eq!(m.sum("kubegrace_drain_phase"), Some(1.0));
    assert_eq!(m.sum("kubegrace_missing"), None);
}
