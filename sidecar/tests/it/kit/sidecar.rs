//! The sidecar under test, started from one [`SidecarSpec`] (its command
//! line) in one of two ways:
//!
//! - [`InProcess`]: the library's `Sidecar` on the test's runtime, parsed
//!   from the same flags the binary takes. What most tests use.
//! - [`Sidecar`]: the real `kubegrace-sidecar` binary as a child process,
//!   where the subject is the process's own: signals, exit codes, logs,
//!   inherited file descriptors, upgrades.
//!
//! Both expose the admin and data ports through [`Ports`].

use std::net::SocketAddr;
use std::ops::Deref;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Parser as _;
use http::{Method, StatusCode};
use kubegrace_sidecar::cli::{self, Cli};
use kubegrace_sidecar::drain::DrainReport;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};
use tokio::task::JoinHandle;

use super::app::TestApp;
use super::http::{self as client, Response};
use super::metrics::{Metrics, parse_drain_summary, parse_ready_line};
use super::{WAIT, scratch_dir, wait_for};

pub const BIN: &str = env!("CARGO_BIN_EXE_kubegrace-sidecar");

/// The four drain timers as flags: the minimum grace, the quiet period that
/// ends it early, the longest grace, then how long in-flight work may take.
pub const fn drain_flags<'a>(
    min_delay: &'a str,
    quiet: &'a str,
    max_delay: &'a str,
    timeout: &'a str,
) -> [&'a str; 8] {
    [
        "--drain-min-delay",
        min_delay,
        "--drain-quiet",
        quiet,
        "--drain-max-delay",
        max_delay,
        "--drain-timeout",
        timeout,
    ]
}

/// How to start one sidecar: the flags the binary would get.
#[derive(Debug, Clone)]
pub struct SidecarSpec {
    /// `--upstream`: an address or `unix:PATH`.
    pub upstream: String,
    /// Extra flags, e.g. `--protocol http2`.
    pub args: Vec<String>,
    /// YAML written to a file and passed as `--config`.
    pub config_yaml: Option<String>,
    /// Extra environment for the binary.
    pub env: Vec<(String, String)>,
}

impl SidecarSpec {
    pub fn new(upstream: SocketAddr) -> Self {
        Self::upstream(upstream.to_string())
    }

    /// In front of `app`, over TCP or its Unix socket.
    pub fn to(app: &TestApp) -> Self {
        Self::upstream(app.upstream())
    }

    pub fn upstream(upstream: impl Into<String>) -> Self {
        Self {
            upstream: upstream.into(),
            args: Vec::new(),
            config_yaml: None,
            env: Vec::new(),
        }
    }

    pub fn args(mut self, args: &[&str]) -> Self {
        self.args.extend(args.iter().map(|a| a.to_string()));
        self
    }

    /// Drain timers short enough for tests, long enough to watch each
    /// phase: 300ms minimum grace, 200ms quiet, 3s at most, then `timeout`
    /// for what is still in flight.
    pub fn fast_drain(self, timeout: &str) -> Self {
        self.args(&drain_flags("300ms", "200ms", "3s", timeout))
    }

    pub fn config(mut self, yaml: &str) -> Self {
        self.config_yaml = Some(yaml.to_string());
        self
    }

    /// The full command line on port 0 for both listeners, the config file
    /// written if there is one.
    fn command_line(&self) -> Result<(Vec<String>, Option<PathBuf>)> {
        let mut args: Vec<String> = [
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            &self.upstream,
            "--admin",
            "127.0.0.1:0",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let config_path = match &self.config_yaml {
            Some(yaml) => {
                let path = scratch_dir("config")?.join("config.yaml");
                std::fs::write(&path, yaml).with_context(|| format!("write {}", path.display()))?;
                args.push("--config".into());
                args.push(path.display().to_string());
                Some(path)
            }
            None => None,
        };
        args.extend(self.args.iter().cloned());
        Ok((args, config_path))
    }
}

/// A fresh test app ("a") and the spec of a sidecar in front of it, shaped
/// by `shape` (flags, a config file).
async fn fresh_app(
    shape: impl FnOnce(SidecarSpec) -> SidecarSpec,
) -> Result<(TestApp, SidecarSpec)> {
    let app = TestApp::start("a").await?;
    let spec = shape(SidecarSpec::new(app.addr));
    Ok((app, spec))
}

/// A sidecar's two ports and what a test asks of them.
#[derive(Debug, Clone)]
pub struct Ports {
    pub listen: SocketAddr,
    pub admin: SocketAddr,
    /// The binary's output, for the errors of waits that time out.
    logs: Option<Logs>,
}

type Logs = Arc<Mutex<Vec<String>>>;

impl Ports {
    fn unknown() -> Self {
        let unbound = SocketAddr::from(([127, 0, 0, 1], 0));
        Self {
            listen: unbound,
            admin: unbound,
            logs: None,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.listen)
    }

    pub async fn admin(&self, method: Method, path: &str) -> Result<Response> {
        client::request(self.admin, method, path, &[], Duration::from_secs(10)).await
    }

    /// `/drain` with the drain token in its header, as the injected preStop
    /// hook (GET) or the operator (POST) sends it.
    pub async fn drain_with_token(&self, method: Method, token: &str) -> Result<Response> {
        let header = [(kubegrace_sidecar_api::admin::TOKEN_HEADER, token)];
        let path = kubegrace_sidecar_api::admin::path::DRAIN;
        client::request(self.admin, method, path, &header, Duration::from_secs(10)).await
    }

    pub async fn admin_get(&self, path: &str) -> Result<Response> {
        self.admin(Method::GET, path).await
    }

    /// `POST /drain`, which must be accepted (202).
    pub async fn start_drain(&self) -> Result<()> {
        let resp = self.admin(Method::POST, "/drain").await?;
        if resp.status != StatusCode::ACCEPTED {
            bail!("/drain answered {}: {}", resp.status, resp.text());
        }
        Ok(())
    }

    /// Waits (bounded) until the drain reached `phase` (0 serving, 1
    /// draining, 2 closing, 3 drained) or beyond.
    pub async fn wait_phase(&self, phase: f64) -> Result<f64> {
        self.wait_metric("kubegrace_drain_phase", WAIT, |p| p >= phase)
            .await
    }

    /// A request through the proxy still gets a 200.
    pub async fn ensure_serving(&self) -> Result<()> {
        let resp = client::get(self.listen, "/work").await?;
        if resp.status != StatusCode::OK {
            bail!("the proxy stopped serving: {}", resp.status);
        }
        Ok(())
    }

    /// Fails unless `/ready` answers `want` now; `why` says what it means.
    pub async fn expect_ready(&self, want: StatusCode, why: &str) -> Result<()> {
        let got = self.ready_status().await;
        if got != Some(want) {
            bail!("{why}: /ready answered {got:?}, expected {want}");
        }
        Ok(())
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

    /// `name` summed over its series.
    pub async fn metric_sum(&self, name: &str) -> Result<f64> {
        let metrics = self.metrics().await?;
        metrics
            .sum(name)
            .with_context(|| format!("no {name} in {:?}", metrics.series))
    }

    /// The value of the series of `name` whose labels contain `label`.
    pub async fn metric(&self, name: &str, label: &str) -> Result<f64> {
        let metrics = self.metrics().await?;
        metrics
            .with_label(name, label)
            .with_context(|| format!("no {name}{{{label}}} in {:?}", metrics.series))
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
        .with_context(|| self.logs_so_far())
    }

    /// The drain cut nothing: `kubegrace_drain_force_closed_total` is 0.
    pub async fn expect_nothing_force_closed(&self, what: &str) -> Result<()> {
        self.metrics()
            .await?
            .expect("kubegrace_drain_force_closed_total", 0.0, what)
    }

    /// Waits (bounded) until `GET /ready` answers `want`.
    pub async fn wait_ready_status(&self, want: StatusCode) -> Result<()> {
        wait_for(&format!("/ready to answer {want}"), WAIT, || async {
            (self.ready_status().await == Some(want)).then_some(())
        })
        .await
        .with_context(|| self.logs_so_far())
    }

    fn logs_so_far(&self) -> String {
        match &self.logs {
            Some(logs) => format!("logs so far:\n{}", lock_logs(logs).join("\n")),
            None => "in-process sidecar".into(),
        }
    }

    /// `GET /breakers`.
    pub async fn breakers(&self) -> Result<serde_json::Value> {
        let resp = self.admin_get("/breakers").await?;
        if resp.status != StatusCode::OK {
            bail!("/breakers answered {}: {}", resp.status, resp.text());
        }
        serde_json::from_slice(&resp.body)
            .with_context(|| format!("/breakers is not JSON: {}", resp.text()))
    }

    /// One route's entry from `/breakers`.
    pub async fn route(&self, name: &str) -> Result<serde_json::Value> {
        let all = self.breakers().await?;
        all["routes"]
            .as_array()
            .and_then(|routes| routes.iter().find(|r| r["name"] == name))
            .cloned()
            .with_context(|| format!("no route {name} in /breakers: {all}"))
    }

    /// `GET /config` as JSON.
    pub async fn config_json(&self) -> Result<serde_json::Value> {
        let resp = self.admin_get("/config").await?;
        if resp.status != StatusCode::OK {
            bail!("/config answered {}", resp.status);
        }
        serde_json::from_slice(&resp.body)
            .with_context(|| format!("/config is not JSON: {}", resp.text()))
    }
}

/// The library's sidecar on the test's runtime. Its tasks end with the
/// test's runtime; dropping it leaves them running until then.
pub struct InProcess {
    ports: Ports,
    pub config_path: Option<PathBuf>,
    sidecar: Option<kubegrace_sidecar::Sidecar>,
}

impl Deref for InProcess {
    type Target = Ports;
    fn deref(&self) -> &Ports {
        &self.ports
    }
}

impl InProcess {
    /// Parses the spec's flags as the binary does, starts serving and waits
    /// (bounded) until `/ready` answers 200.
    pub async fn start(spec: SidecarSpec) -> Result<Self> {
        let sidecar = Self::start_unready(spec).await?;
        sidecar.wait_ready_status(StatusCode::OK).await?;
        Ok(sidecar)
    }

    /// The usual setup: this sidecar in front of a fresh test app, with `args`.
    pub async fn with_app(args: &[&str]) -> Result<(TestApp, Self)> {
        let (app, spec) = fresh_app(|spec| spec.args(args)).await?;
        Ok((app, Self::start(spec).await?))
    }

    /// The usual setup with a config file instead of flags.
    pub async fn with_app_config(yaml: &str) -> Result<(TestApp, Self)> {
        let (app, spec) = fresh_app(|spec| spec.config(yaml)).await?;
        Ok((app, Self::start(spec).await?))
    }

    /// The usual setup with `limits.headerReadTimeout: 500ms`, for the
    /// tests of a request head that never completes.
    pub async fn with_short_header_read_timeout() -> Result<(TestApp, Self)> {
        Self::with_app_config("limits: {headerReadTimeout: 500ms}\n").await
    }

    /// Starts serving without waiting for readiness (an app not up yet).
    pub async fn start_unready(spec: SidecarSpec) -> Result<Self> {
        let (args, config_path) = spec.command_line()?;
        let cli = Cli::try_parse_from(std::iter::once(BIN.to_string()).chain(args))
            .context("the spec's flags")?;
        let settings = cli.settings();
        let startup = cli::load_at_start(settings.config_file.as_deref(), &settings.overrides)?;
        let options = kubegrace_sidecar::StartOptions {
            config_file: startup.config_file,
            ..Default::default()
        };
        let sidecar = kubegrace_sidecar::Sidecar::start(startup.config, settings, options).await?;
        Ok(Self {
            ports: Ports {
                listen: sidecar.listen_addr(),
                admin: sidecar.admin_addr(),
                logs: None,
            },
            config_path,
            sidecar: Some(sidecar),
        })
    }

    /// The library's handle (drain state, counters).
    pub fn lib(&self) -> &kubegrace_sidecar::Sidecar {
        self.sidecar
            .as_ref()
            .unwrap_or_else(|| unreachable!("only `wait` takes the sidecar"))
    }

    /// What SIGTERM does: start the drain and end once drained.
    pub fn shutdown(&self) {
        self.lib().shutdown();
    }

    /// Waits (bounded) for the drain that [`InProcess::shutdown`] started.
    pub async fn wait(&mut self, limit: Duration) -> Result<DrainReport> {
        let sidecar = self.sidecar.take().context("already waited for")?;
        super::within("the drain", limit, sidecar.wait()).await
    }
}

/// The real binary. Killed (SIGKILL) when dropped, so a failing test never
/// leaves one behind; its logs are printed when the test panics.
pub struct Sidecar {
    ports: Ports,
    child: Child,
    pub pid: u32,
    pub config_path: Option<PathBuf>,
    logs: Logs,
    /// The tasks copying stdout and stderr into `logs`.
    readers: Vec<JoinHandle<()>>,
    exit: Option<ExitStatus>,
}

impl Deref for Sidecar {
    type Target = Ports;
    fn deref(&self) -> &Ports {
        &self.ports
    }
}

/// A sidecar command with its output captured; the caller's environment
/// must not leak settings (or sockets) into the test.
pub fn command(args: &[String]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for (key, _) in std::env::vars() {
        if key.starts_with("KUBEGRACE_")
            || key.starts_with("LISTEN_")
            || key == "SERVER_STARTER_PORT"
            || key == "NOTIFY_SOCKET"
            || key == kubegrace_sidecar::allocator::TUNABLES_ENV
        {
            cmd.env_remove(key);
        }
    }
    cmd.env("RUST_LOG", "info");
    cmd
}

fn lock_logs(logs: &Logs) -> std::sync::MutexGuard<'_, Vec<String>> {
    logs.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn capture(stream: impl AsyncRead + Unpin + Send + 'static, logs: Logs) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut lines = BufReader::new(stream).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            lock_logs(&logs).push(line);
        }
    })
}

impl Sidecar {
    /// Starts the binary on port 0 for both listeners, learns the bound
    /// ports from its ready line, and waits (bounded) until `/ready` answers
    /// 200.
    pub async fn start(spec: SidecarSpec) -> Result<Self> {
        let mut sidecar = Self::start_unready(spec).await?;
        sidecar.wait_ready().await?;
        Ok(sidecar)
    }

    /// The usual setup: the binary in front of a fresh test app, with `args`.
    pub async fn with_app(args: &[&str]) -> Result<(TestApp, Self)> {
        let (app, spec) = fresh_app(|spec| spec.args(args)).await?;
        Ok((app, Self::start(spec).await?))
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
        let (args, config_path) = spec.command_line()?;
        let mut cmd = command(&args);
        cmd.envs(spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        let mut sidecar = Self::spawn_command(cmd)?;
        sidecar.config_path = config_path;
        Ok(sidecar)
    }

    /// The binary with exactly `args` (a Unix listen socket, flags under
    /// test), plus `env`.
    pub fn spawn_args(args: &[String], env: &[(&str, &str)]) -> Result<Self> {
        let mut cmd = command(args);
        cmd.envs(env.iter().copied());
        Self::spawn_command(cmd)
    }

    /// Spawns a prepared [`command`] (extra file descriptors and the like).
    pub fn spawn_command(mut cmd: Command) -> Result<Self> {
        let mut child = cmd.spawn().with_context(|| format!("spawn {BIN}"))?;
        let pid = child.id().context("child pid")?;
        let logs: Logs = Arc::default();
        let mut readers = Vec::new();
        if let Some(out) = child.stdout.take() {
            readers.push(capture(out, logs.clone()));
        }
        if let Some(err) = child.stderr.take() {
            readers.push(capture(err, logs.clone()));
        }
        Ok(Self {
            ports: Ports {
                logs: Some(logs.clone()),
                ..Ports::unknown()
            },
            child,
            pid,
            config_path: None,
            logs,
            readers,
            exit: None,
        })
    }

    /// Reads "kubegrace-sidecar ready listen=ADDR admin=ADDR" (stdout).
    pub async fn learn_ports(&mut self) -> Result<()> {
        let line = self.wait_log("kubegrace-sidecar ready ", WAIT).await?;
        let (listen, admin) = parse_ready_line(&line).context("a TCP ready line")?;
        self.ports.listen = listen;
        self.ports.admin = admin;
        Ok(())
    }

    async fn wait_ready(&mut self) -> Result<()> {
        // Generous: a cold binary on a loaded 2-core machine.
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            self.check_running("it was ready").await?;
            if self.ready_status().await == Some(StatusCode::OK) {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                bail!(
                    "sidecar never became ready within {WAIT:?}; logs:\n{}",
                    self.logs_text()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn check_running(&mut self, before: &str) -> Result<()> {
        if let Some(status) = self.child.try_wait().context("try_wait")? {
            self.exit = Some(status);
            // The process's last lines (its error) can still be in the
            // pipes when it is seen gone: read them before reporting.
            self.collect_remaining_logs().await;
            bail!(
                "sidecar exited before {before} ({status}); logs:\n{}",
                self.logs_text()
            );
        }
        Ok(())
    }

    /// Sends a Unix signal (`TERM`, `INT`, `HUP`, ...).
    pub fn signal(&self, name: &str) -> Result<()> {
        super::signal(self.pid, name)
    }

    /// SIGKILL, now.
    pub fn kill(&mut self) -> Result<()> {
        self.child.start_kill().context("SIGKILL")
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
        self.collect_remaining_logs().await;
        Ok(status)
    }

    /// Waits (bounded) for the log readers of an exited process to reach
    /// the end of its output.
    async fn collect_remaining_logs(&mut self) {
        for reader in std::mem::take(&mut self.readers) {
            let _ = tokio::time::timeout(Duration::from_secs(5), reader).await;
        }
    }

    /// Waits (bounded) for the exit, which must be status `code` with a
    /// log line that `says` why.
    pub async fn exits_with(&mut self, code: i32, says: &str) -> Result<()> {
        let status = self.wait_exit(WAIT).await?;
        if status.code() != Some(code) || !self.logs_text().contains(says) {
            bail!(
                "expected exit {code} saying {says:?}, got {status}; logs:\n{}",
                self.logs_text()
            );
        }
        Ok(())
    }

    /// Waits (bounded) for the exit, which must be status 0.
    pub async fn exits_cleanly(&mut self) -> Result<()> {
        let status = self.wait_exit(WAIT).await?;
        if !status.success() {
            bail!("exit {status}; logs:\n{}", self.logs_text());
        }
        Ok(())
    }

    pub fn logs(&self) -> Vec<String> {
        lock_logs(&self.logs).clone()
    }

    pub fn logs_text(&self) -> String {
        self.logs().join("\n")
    }

    /// Waits (bounded) until a log line contains `needle`, and returns it;
    /// fails early if the process exits first.
    pub async fn wait_log(&mut self, needle: &str, limit: Duration) -> Result<String> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if let Some(line) = self.logs().into_iter().find(|l| l.contains(needle)) {
                return Ok(line);
            }
            if self.exit.is_none()
                && let Err(exited) = self
                    .check_running(&format!("a log line containing {needle:?}"))
                    .await
            {
                // Its last lines, read after it was seen gone, may hold it.
                if let Some(line) = self.logs().into_iter().find(|l| l.contains(needle)) {
                    return Ok(line);
                }
                return Err(exited);
            }
            if tokio::time::Instant::now() >= deadline {
                bail!(
                    "no log line containing {needle:?} within {limit:?}; logs so far:\n{}",
                    self.logs_text()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
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
    run_env(args, &[], limit).await
}

/// [`run_to_exit`] with extra environment.
pub async fn run_env(
    args: &[&str],
    env: &[(&str, &str)],
    limit: Duration,
) -> Result<(ExitStatus, String)> {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let mut cmd = command(&args);
    cmd.envs(env.iter().copied());
    let child = cmd.spawn().with_context(|| format!("spawn {BIN}"))?;
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
