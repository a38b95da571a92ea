//! The processes the harness starts (the upstream, each proxy, the load tools): spawned
//! with their output in a log, checked to proxy bench-upstream, bounded in time, and
//! stopped with their whole tree; and the one-line outputs of system commands.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

use crate::procfs;

/// A process this harness started; dropping it stops it and its children.
pub struct Proc {
    name: String,
    child: Child,
    log: PathBuf,
}

impl Proc {
    pub fn spawn(name: &str, mut cmd: Command, log: PathBuf) -> anyhow::Result<Proc> {
        let out =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("starting {name}: {cmd:?}"))?;
        Ok(Proc {
            name: name.to_string(),
            child,
            log,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(5)..].join(" | ")
    }

    /// Polls until the process exits or `bound` passes.
    pub fn wait_exit(&mut self, bound: Duration) -> Option<Duration> {
        let start = Instant::now();
        while start.elapsed() < bound {
            if let Ok(Some(_)) = self.child.try_wait() {
                return Some(start.elapsed());
            }
            thread::sleep(Duration::from_millis(1));
        }
        None
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        // TERM the whole tree (nginx workers too), then KILL what is left.
        let tree = procfs::process_tree(self.pid());
        signal(&tree, "-TERM");
        if self.wait_exit(Duration::from_secs(3)).is_none() {
            eprintln!("  {} did not stop on SIGTERM in 3 s; killing it", self.name);
        }
        signal(&tree, "-KILL");
        let _ = self.child.wait();
    }
}

/// Signals processes by id (only ones this harness started).
pub fn signal(pids: &[u32], sig: &str) {
    let alive: Vec<String> = pids
        .iter()
        .filter(|p| procfs::read_stat(**p).is_ok_and(|s| s.state != 'Z'))
        .map(u32::to_string)
        .collect();
    if !alive.is_empty() {
        let _ = Command::new("kill")
            .arg(sig)
            .args(&alive)
            .stderr(Stdio::null())
            .status();
    }
}

/// The start of bench-upstream's body: a 200 that lacks it came from
/// somebody else's server on a port we thought was ours.
pub const UPSTREAM_SIGNATURE: &str = "kubegrace bench upstream";

/// One plain HTTP/1.1 request; Ok when bench-upstream answered 200, through
/// whatever proxy listens on `port`.
pub fn http_ok(port: u16, path: &str) -> anyhow::Result<()> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )?;
    let mut answer = String::new();
    s.read_to_string(&mut answer)?;
    if !answer.starts_with("HTTP/1.1 200") {
        bail!("answered {:?}", answer.lines().next().unwrap_or(""));
    }
    if !answer.contains(UPSTREAM_SIGNATURE) {
        bail!("a 200 that is not from bench-upstream: another server holds port {port}");
    }
    Ok(())
}

/// True when nothing listens on the port now (we can bind it ourselves).
pub fn port_free(port: u16) -> bool {
    std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
}

/// The highest port offset from the base any listener of a run takes
/// (nginx-deferred's gRPC port, `peers::Env::grpc_port`).
pub const LAST_OFFSET: u16 = 72;

/// The first base port, from `wanted` in steps of 100, whose every port
/// (upstream, peers, admin and h2 ports) is free: other people's tests
/// share this loopback.
pub fn free_base_port(wanted: u16) -> anyhow::Result<u16> {
    for attempt in 0..20u16 {
        let Some(base) = wanted.checked_add(attempt * 100) else {
            break;
        };
        if (0..=LAST_OFFSET).all(|offset| base.checked_add(offset).is_some_and(port_free)) {
            return Ok(base);
        }
    }
    bail!(
        "no free block of {} ports from {wanted} upwards; set BENCH_PORT",
        LAST_OFFSET + 1
    )
}

/// Waits up to 10 s until `proc` proxies bench-upstream on `port`; fails at once when it
/// exits, with the end of its log.
pub fn wait_ready(proc: &mut Proc, port: u16) -> anyhow::Result<()> {
    let start = Instant::now();
    let mut last = anyhow::anyhow!("no attempt");
    while start.elapsed() < Duration::from_secs(10) {
        if let Ok(Some(status)) = proc.child.try_wait() {
            bail!("exited with {status} at start-up: {}", proc.log_tail());
        }
        match http_ok(port, "/") {
            Ok(()) => return Ok(()),
            Err(e) => last = e,
        }
        thread::sleep(Duration::from_millis(50));
    }
    bail!("not proxying after 10 s ({last}); log: {}", proc.log_tail())
}

/// Starts a client the harness talks to (bench-client's drain and hold
/// modes): stdin and stdout piped, its errors on ours.
pub fn spawn_piped(cmd: &mut Command) -> anyhow::Result<Child> {
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("starting {cmd:?}"))
}

/// Moves every thread of process `pid` onto `cpus` (a taskset CPU list);
/// threads it starts later inherit that.
pub fn pin(pid: u32, cpus: &str) -> anyhow::Result<()> {
    let status = Command::new("taskset")
        .args(["-a", "-p", "-c", cpus])
        .arg(pid.to_string())
        .stdout(Stdio::null())
        .status()
        .context("running taskset")?;
    if !status.success() {
        bail!("taskset -a -p -c {cpus} {pid}: {status}");
    }
    Ok(())
}

/// Output of a bounded child process.
pub fn run_bounded(
    mut cmd: Command,
    bound: Duration,
    during: impl FnOnce(),
) -> anyhow::Result<(String, String)> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {cmd:?}"))?;
    let mut out = child.stdout.take().context("stdout")?;
    let mut err = child.stderr.take().context("stderr")?;
    let out_reader = thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let err_reader = thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let start = Instant::now();
    during();
    loop {
        if child.try_wait()?.is_some() {
            break;
        }
        if start.elapsed() > bound {
            let _ = child.kill();
            let _ = child.wait();
            bail!("{cmd:?} ran past {bound:?}; killed");
        }
        thread::sleep(Duration::from_millis(10));
    }
    let out = out_reader.join().unwrap_or_default();
    let err = err_reader.join().unwrap_or_default();
    Ok((out, err))
}

/// The first line of what `program args` prints (stdout, then stderr), for the report's
/// versions and machine; `not available (...)` when it does not run.
pub fn command_output(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .map(|o| {
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
            text.lines().next().unwrap_or("").trim().to_string()
        })
        .unwrap_or_else(|e| format!("not available ({e})"))
}

/// The 1, 5 and 15 minute load averages.
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}
