//! The demo app as a real process on a free loopback port, for the tests that drive it
//! without a cluster (the binary path comes from the test: `env!("CARGO_BIN_EXE_...")`
//! only exists there).

use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// How long the app may take to say where it listens.
const LISTEN_WITHIN: Duration = Duration::from_secs(10);

/// A running demo app; killed when dropped.
pub struct LocalApp {
    child: Child,
    /// `127.0.0.1:PORT`, where it listens.
    pub addr: String,
}

impl LocalApp {
    /// Starts `binary --listen 127.0.0.1:0 --pod-name POD EXTRA...` and reads the port it
    /// took from its first line.
    pub async fn start(binary: &str, pod_name: &str, extra: &[&str]) -> Result<LocalApp> {
        let mut child = Command::new(binary)
            .args(["--listen", "127.0.0.1:0", "--pod-name", pod_name])
            .args(extra)
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {binary}"))?;
        let stdout = child.stdout.take().context("no stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let first = tokio::time::timeout(LISTEN_WITHIN, lines.next_line())
            .await
            .context("the app did not say where it listens")??
            .context("the app exited before listening")?;
        // "kubegrace-demo-app listening on 127.0.0.1:PORT as POD"
        let addr = first
            .split_whitespace()
            .nth(3)
            .with_context(|| format!("unexpected first line {first:?}"))?
            .to_owned();
        // Keep reading stdout so the app never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(LocalApp { child, addr })
    }

    /// Sends SIGTERM, as the kubelet does.
    pub fn sigterm(&self) -> Result<()> {
        let pid = self.child.id().context("the app already exited")?;
        let status = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()?;
        ensure!(status.success(), "kill -TERM {pid} failed");
        Ok(())
    }

    /// The process, to wait for its exit.
    pub fn child(&mut self) -> &mut Child {
        &mut self.child
    }
}
