//! The binary executes itself again at start with glibc's malloc tuned
//! (`GLIBC_TUNABLES`, sidecar/src/allocator.rs): same pid, same flags, and
//! it serves. An operator's own `GLIBC_TUNABLES`, even empty, is kept as is.

use crate::kit::app::TestApp;
use crate::kit::http as client;
use crate::kit::sidecar::{Sidecar, SidecarSpec};
use ::http::StatusCode;
use anyhow::{Context, Result, ensure};
use kubegrace_sidecar::allocator::{TUNABLES, TUNABLES_ENV};

/// `GLIBC_TUNABLES` as the process's initial environment holds it. glibc
/// cuts the copy there at the first `:` once it has parsed it (the process
/// reads a whole copy of its own), so only the first setting is compared.
fn tunables_of(pid: u32) -> Result<Option<String>> {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).context("environ")?;
    let prefix = format!("{TUNABLES_ENV}=");
    Ok(environ
        .split(|&b| b == 0)
        .filter_map(|var| std::str::from_utf8(var).ok())
        .find_map(|var| var.strip_prefix(&prefix).map(str::to_owned)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starts_again_with_the_tunables_in_the_same_process_and_serves() -> Result<()> {
    let app = TestApp::start("app").await?;
    // kit::sidecar::command leaves the test's own GLIBC_TUNABLES out.
    let sidecar = Sidecar::start(SidecarSpec::new(app.addr)).await?;
    let first = TUNABLES.split(':').next().context("a setting")?;
    let seen = tunables_of(sidecar.pid)?;
    ensure!(
        seen.as_deref().is_some_and(|t| t.starts_with(first)),
        "pid {} runs with {TUNABLES_ENV} {seen:?}, not {TUNABLES}",
        sidecar.pid
    );
    let resp = client::get(sidecar.listen, "/").await?;
    ensure!(resp.status == StatusCode::OK, "answered {}", resp.status);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operators_tunables_even_empty_are_kept() -> Result<()> {
    let app = TestApp::start("app").await?;
    for set in ["", "glibc.malloc.arena_max=1"] {
        let mut spec = SidecarSpec::new(app.addr);
        spec.env.push((TUNABLES_ENV.to_owned(), set.to_owned()));
        let sidecar = Sidecar::start(spec).await?;
        let seen = tunables_of(sidecar.pid)?;
        ensure!(
            seen.as_deref() == Some(set),
            "set {set:?}, runs with {seen:?}"
        );
        let resp = client::get(sidecar.listen, "/").await?;
        ensure!(resp.status == StatusCode::OK, "answered {}", resp.status);
    }
    Ok(())
}
