//! `kubectl-kubegrace` as a user runs it, for the cluster tests of the plugin (`plugin`)
//! and of the workloads it verifies (`argo_rollouts`).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, ensure};

/// The plugin binary: `KUBEGRACE_PLUGIN_BIN`, else `kubectl-kubegrace` in the target
/// directory this test was built into.
pub fn plugin_bin() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("KUBEGRACE_PLUGIN_BIN") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe()?;
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .context("the test binary has no target directory")?;
    let bin = dir.join("kubectl-kubegrace");
    ensure!(
        bin.exists(),
        "{} is missing: cargo build -p kubectl-kubegrace (e2e/run-cluster-tests does)",
        bin.display()
    );
    Ok(bin)
}

/// Runs the plugin with `args` (bounded by `timeout`): exit status, stdout, stderr.
pub async fn run(args: &[&str], timeout: Duration) -> Result<(i32, String, String)> {
    let kubeconfig = crate::kubeconfig_path().context("no kubeconfig")?;
    let out = tokio::time::timeout(
        timeout,
        tokio::process::Command::new(plugin_bin()?)
            .args(args)
            .env("KUBECONFIG", kubeconfig)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .with_context(|| format!("kubectl-kubegrace {args:?} ran past {timeout:?}"))??;
    Ok((
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}
