//! The memory test: what a proxy holds idle, what each idle keep-alive
//! connection costs it, and whether it gives memory back after a spike.
//!
//! Per proxy, on a fresh instance: the idle VmRSS; then `bench-client
//! drain` opens the connections (one request each, then silence) and the
//! RSS with them held, whose difference per connection is the
//! per-connection cost; the client is killed (every connection closes at
//! once), a short load burst follows, and the RSS 30 s after the burst
//! ended says whether the spike's memory went back. The proxies wait out
//! those 30 s side by side, so the test costs one wait, not one per proxy.

use std::collections::BTreeMap;
use std::io::{BufRead as _, BufReader};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

use crate::peers::Env;
use crate::proc::{Proc, run_bounded, spawn_piped, wait_ready};
use crate::procfs;
use crate::report::KUBEGRACE_STATIC;

/// One proxy under the memory test, started fresh for it.
pub struct Subject {
    pub name: String,
    pub proc: Proc,
    pub port: u16,
}

/// What the memory test measured on one proxy, KiB.
#[derive(Debug, Clone, Copy)]
pub struct Measured {
    pub idle_kib: u64,
    pub held_kib: u64,
    pub connections: u32,
    pub after_spike_kib: u64,
}

/// How the test is run: the commands are built by the harness (pinned to
/// the load CPUs).
pub struct Plan<'a> {
    /// `bench-client drain` against a port, printing `ready` once every
    /// connection is open.
    pub hold: &'a dyn Fn(u16) -> Command,
    /// A bounded load burst against a port.
    pub burst: &'a dyn Fn(u16) -> Command,
    pub connections: u32,
    /// From the end of the burst to the last sample.
    pub after: Duration,
    pub progress: &'a dyn Fn(&str),
}

/// Time for a proxy to settle after start-up or after its connections
/// closed, before its RSS is read.
const SETTLE: Duration = Duration::from_secs(1);
/// The longest the client may take to open its connections.
const HOLD_BOUND: Duration = Duration::from_secs(60);

/// Runs the test on every subject; a subject that fails is reported and
/// left out. The subjects are stopped at the end.
pub fn run(subjects: Vec<Subject>, plan: &Plan) -> BTreeMap<String, Measured> {
    let mut waiting = Vec::new();
    for subject in subjects {
        match spike(&subject, plan) {
            Ok((idle_kib, held_kib, spike_end)) => {
                (plan.progress)(&format!(
                    "memory {:<13} idle {idle_kib} KiB, {} idle connections {held_kib} KiB ({:.2} KiB each)",
                    subject.name,
                    plan.connections,
                    per_connection(idle_kib, held_kib, plan.connections)
                ));
                waiting.push((subject, idle_kib, held_kib, spike_end));
            }
            Err(e) => (plan.progress)(&format!("memory {}: failed: {e:#}", subject.name)),
        }
    }
    let mut out = BTreeMap::new();
    for (subject, idle_kib, held_kib, spike_end) in waiting {
        let at = spike_end + plan.after;
        if let Some(left) = at.checked_duration_since(Instant::now()) {
            thread::sleep(left);
        }
        let after_spike_kib = procfs::tree_rss_kib(subject.proc.pid());
        (plan.progress)(&format!(
            "memory {:<13} {} s after the spike {after_spike_kib} KiB ({:+.0}% of idle)",
            subject.name,
            plan.after.as_secs(),
            (after_spike_kib as f64 / idle_kib.max(1) as f64 - 1.0) * 100.0
        ));
        out.insert(
            subject.name.clone(),
            Measured {
                idle_kib,
                held_kib,
                connections: plan.connections,
                after_spike_kib,
            },
        );
    }
    out
}

/// A fresh instance of the images' static build of the sidecar, on its own
/// ports, when the run has one (`--sidecar-static`).
pub fn start_static_sidecar(env: &Env) -> Option<anyhow::Result<Subject>> {
    let cmd = env.static_sidecar_command()?;
    let port = env.static_sidecar_port()?;
    let log = env.dir.join("kubegrace-static-memory.log");
    Some((|| {
        let mut proc = Proc::spawn(&format!("{KUBEGRACE_STATIC} (memory)"), cmd, log)?;
        wait_ready(&mut proc, port)?;
        Ok(Subject {
            name: KUBEGRACE_STATIC.to_string(),
            proc,
            port,
        })
    })())
}

/// KiB per held connection over the idle RSS.
pub fn per_connection(idle_kib: u64, held_kib: u64, connections: u32) -> f64 {
    if connections == 0 {
        return 0.0;
    }
    held_kib.saturating_sub(idle_kib) as f64 / f64::from(connections)
}

/// Idle RSS, RSS with the connections held, and when the spike ended.
fn spike(subject: &Subject, plan: &Plan) -> anyhow::Result<(u64, u64, Instant)> {
    let what = format!("{} connections", plan.connections);
    let (idle, held) = idle_and_held(subject.proc.pid(), (plan.hold)(subject.port), &what)?;
    run_bounded((plan.burst)(subject.port), Duration::from_secs(30), || {})
        .context("the load burst")?;
    Ok((idle, held, Instant::now()))
}

/// The RSS of process tree `pid` settled and idle, then with what `client`
/// opens held (it prints `ready` once all is open); the client is killed
/// after, and everything it held closes at once. `what` names what it
/// holds, for the error when it does not get there.
pub fn idle_and_held(pid: u32, mut client: Command, what: &str) -> anyhow::Result<(u64, u64)> {
    thread::sleep(SETTLE);
    let idle = procfs::tree_rss_kib(pid);
    let mut client = spawn_piped(&mut client)?;
    // Bounded: a proxy that stops accepting (HAProxy past `maxconn`)
    // leaves the client's last connections waiting for ever.
    let (tx, rx) = std::sync::mpsc::channel();
    if let Some(out) = client.stdout.take() {
        thread::spawn(move || {
            let line = BufReader::new(out).lines().next();
            let _ = tx.send(line.and_then(Result::ok).unwrap_or_default());
        });
    }
    let ready = rx.recv_timeout(HOLD_BOUND).unwrap_or_default();
    if ready.trim() != "ready" {
        let _ = client.kill();
        let _ = client.wait();
        bail!("the client did not hold {what} (it said {ready:?})");
    }
    thread::sleep(SETTLE);
    let held = procfs::tree_rss_kib(pid);
    let _ = client.kill();
    let _ = client.wait();
    Ok((idle, held))
}

/// The soft limit of open files raised to the hard one for this process
/// and its children (the proxies and the client inherit it): 10,000 idle
/// connections through a proxy take two descriptors each. Returns the
/// limit in force.
pub fn raise_open_files() -> u64 {
    let hard = open_files_limit("Max open files", 2);
    if let Some(hard) = hard {
        let _ = Command::new("prlimit")
            .arg("--pid")
            .arg(std::process::id().to_string())
            .arg(format!("--nofile={hard}:{hard}"))
            .status();
    }
    open_files_limit("Max open files", 1).unwrap_or(0)
}

/// The soft open-files limit this process (and so every proxy it starts)
/// has now.
pub fn open_files_soft_limit() -> u64 {
    open_files_limit("Max open files", 1).unwrap_or(1024)
}

/// A column (1: soft, 2: hard) of a /proc/self/limits row.
fn open_files_limit(row: &str, column: usize) -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let rest = limits.lines().find_map(|l| l.strip_prefix(row))?;
    let value = rest.split_whitespace().nth(column - 1)?;
    if value == "unlimited" {
        return Some(1 << 20);
    }
    value.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_connection_is_the_growth_over_idle() {
        assert_eq!(per_connection(5000, 45_000, 10_000), 4.0);
        // Less than idle (the allocator gave back start-up memory): zero,
        // never negative.
        assert_eq!(per_connection(5000, 4000, 10_000), 0.0);
        assert_eq!(per_connection(5000, 6000, 0), 0.0);
    }
}
