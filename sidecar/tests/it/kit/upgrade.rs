//! The binary across upgrades: after a hand-over the serving process is
//! another one, found through the ready file every generation writes.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};

use super::sidecar::BIN;
use super::{alive, free_port, scratch_dir};

/// The drain token of every sidecar these tests start: `POST /upgrade`
/// is refused without one.
pub const UPGRADE_TOKEN: &str = "upgrade-test-token";

/// A sidecar started by the test; after an upgrade the serving process is
/// another one, so the current pid comes from the ready file.
pub struct Upgradable {
    pub dir: PathBuf,
    pub listen: SocketAddr,
    pub admin: SocketAddr,
    pub args: Vec<String>,
    /// Extra environment for every generation (e.g. NOTIFY_SOCKET).
    pub env: Vec<(String, String)>,
    first: Option<tokio::process::Child>,
}

impl Upgradable {
    /// Starts the binary on fixed ports (so a restart can reuse them) and
    /// waits until it serves.
    pub async fn start(upstream: SocketAddr, extra: &[&str]) -> Result<Upgradable> {
        Self::start_with_env(upstream, extra, &[]).await
    }

    /// [`Upgradable::start`] with extra environment variables.
    pub async fn start_with_env(
        upstream: SocketAddr,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Result<Upgradable> {
        Self::start_general(&upstream.to_string(), extra, env).await
    }

    /// [`Upgradable::start`] with any `--upstream` value (`unix:/path` too).
    pub async fn start_general(
        upstream: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Result<Upgradable> {
        let dir = scratch_dir("upgrade")?;
        let (listen, admin) = (free_port()?, free_port()?);
        let mut args: Vec<String> = [
            "--listen",
            &listen.to_string(),
            "--upstream",
            upstream,
            "--admin",
            &admin.to_string(),
            "--ready-file",
            &dir.join("ready.json").display().to_string(),
            "--drain-min-delay",
            "100ms",
            "--drain-quiet",
            "100ms",
            "--drain-max-delay",
            "1s",
            "--drain-timeout",
            "5s",
            // POST /upgrade (what `upgrade` sends) always needs a token.
            "--drain-token",
            UPGRADE_TOKEN,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut proc = Upgradable {
            dir,
            listen,
            admin,
            args,
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            first: None,
        };
        proc.spawn().await?;
        Ok(proc)
    }

    /// (Re)starts the process with the same arguments; logs go to a file
    /// every later generation appends to as well.
    pub async fn spawn(&mut self) -> Result<()> {
        let _ = std::fs::remove_file(self.dir.join("ready.json"));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("log.txt"))?;
        let child = tokio::process::Command::new(BIN)
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(false)
            .spawn()
            .context("spawn the sidecar")?;
        self.first = Some(child);
        self.wait_pid(|_| true).await?;
        Ok(())
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(self.dir.join("log.txt")).unwrap_or_default()
    }

    pub fn pid(&self) -> Option<u32> {
        let text = std::fs::read_to_string(self.dir.join("ready.json")).ok()?;
        let v: serde_json::Value = serde_json::from_str(&text).ok()?;
        v.get("pid")?.as_u64().map(|p| p as u32)
    }

    /// Waits for a ready file whose pid satisfies `ok`.
    pub async fn wait_pid(&self, ok: impl Fn(u32) -> bool) -> Result<u32> {
        for _ in 0..1500 {
            if let Some(pid) = self.pid().filter(|p| ok(*p)) {
                return Ok(pid);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        bail!("no matching ready file within 30s; logs:\n{}", self.logs())
    }

    /// Waits until `pid` is gone (a zombie counts as gone).
    pub async fn wait_gone(&mut self, pid: u32) -> Result<()> {
        for _ in 0..1500 {
            if let Some(child) = self.first.as_mut()
                && child.id() == Some(pid)
            {
                let _ = child.try_wait();
            }
            if !alive(pid) {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        bail!(
            "process {pid} still alive after 30s; logs:\n{}",
            self.logs()
        )
    }

    pub fn signal(&self, pid: u32, name: &str) -> Result<()> {
        super::signal(pid, name)
    }

    /// Runs `kubegrace-sidecar upgrade --admin ADDR`: (success, output).
    pub async fn upgrade_command(&self) -> Result<(bool, String)> {
        let out = tokio::process::Command::new(BIN)
            .args(["upgrade", "--admin", &self.admin.to_string()])
            .args(["--token", UPGRADE_TOKEN])
            .output()
            .await?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok((out.status.success(), text))
    }

    /// SIGTERM the serving process and wait for it to leave (test cleanup).
    pub async fn stop(mut self) -> Result<()> {
        if let Some(pid) = self.pid() {
            let _ = self.signal(pid, "TERM");
            self.wait_gone(pid).await?;
        }
        Ok(())
    }
}
