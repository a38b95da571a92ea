//! Runs the whole benchmark: starts the upstream and every peer pinned to
//! their CPUs, drives each scenario round by round with all peers side by
//! side (so machine noise hits them alike), runs the drain tests, and
//! writes bench/results/latest.json, the README tables and the plot.
//!
//! `bench/run` installs the tools and builds the binaries first; run that.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Parser;
use kubegrace_bench::cgroup::CpuLimit;
use kubegrace_bench::parse::{self, LoadResult};
use kubegrace_bench::peers::{DrainTimers, Env, Peer};
use kubegrace_bench::proc::{
    Proc, command_output, free_base_port, loadavg, pin, run_bounded, wait_ready,
};
use kubegrace_bench::report::{
    self, Cell, IdleConnections, KUBEGRACE_STATIC, Memory, Report, Sample, ScenarioResult, Settings,
};
use kubegrace_bench::scenario::{self, Cores, KEEPALIVE_256, Load, Scenario};
use kubegrace_bench::{grpc, memtest, procfs};

#[path = "harness/drain.rs"]
mod drain;
#[path = "harness/h2mem.rs"]
mod h2mem;
#[path = "harness/probes.rs"]
mod probes;

#[derive(Parser, Debug)]
#[command(about = "kubegrace-sidecar against nginx, HAProxy and Caddy, side by side")]
struct Args {
    /// Length of one load round, whole seconds (wrk takes no fractions).
    /// Four by default keeps a full run (7 peers x 10 scenarios x 3 rounds,
    /// plus the memory and drain tests) near a quarter of an hour.
    #[arg(long, env = "BENCH_SECONDS", default_value_t = 4)]
    seconds: u32,
    /// Rounds per scenario; every figure is the median of these.
    #[arg(long, env = "BENCH_ROUNDS", default_value_t = 3)]
    rounds: u32,
    /// The fixed rate of the latency scenario, requests/s: well below what
    /// the slowest proxy saturates at on one core.
    /// 1000: Caddy, the slowest peer, saturates one core near 8k req/s.
    #[arg(long, env = "BENCH_RATE", default_value_t = 1000)]
    rate: u32,
    /// Measured length of one round of the fixed-rate latency scenario,
    /// after a one-second warm-up that is not recorded. Longer than the
    /// saturation rounds because tails need samples: 8 s at 1000 req/s is
    /// 8,000 per round, 8 beyond p99.9.
    #[arg(long, env = "BENCH_LATENCY_SECONDS", default_value_t = 8)]
    latency_seconds: u32,
    /// Peers to run, comma separated (direct is always run: it is the floor).
    #[arg(
        long,
        env = "BENCH_PEERS",
        default_value = "direct,kubegrace,kubegrace+cb,nginx,nginx-deferred,haproxy,caddy"
    )]
    peers: String,
    /// First of the loopback ports used (upstream; peers at +10, +20, ...),
    /// below the ephemeral range so client sockets never take one; moved up
    /// in steps of 100 when any of them is taken.
    #[arg(long, env = "BENCH_PORT", default_value_t = 27100)]
    base_port: u16,
    #[arg(long, env = "BENCH_PROXY_CPUS", default_value = "1")]
    proxy_cpus: String,
    #[arg(long, env = "BENCH_LOAD_CPUS", default_value = "0")]
    load_cpus: String,
    /// The CPU limit of the proxy and the app together in the shared-core
    /// scenarios, millicores (a pod's limit: a CFS quota on a cgroup of
    /// their own, on top of the shared core); 0 leaves them the whole core.
    /// 500 keeps the pair, not wrk on the other core, the bottleneck when
    /// every request opens a connection (src/cgroup.rs says why).
    #[arg(long, env = "BENCH_PAIR_CPU_LIMIT", default_value_t = 500)]
    pair_cpu_limit: u32,
    /// Skip the drain tests.
    #[arg(long, env = "BENCH_NO_DRAIN", value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::SetTrue)]
    no_drain: bool,
    /// Only these load scenarios, comma separated ids (h2-multiplexed, ...);
    /// all when empty.
    #[arg(long, env = "BENCH_SCENARIOS", default_value = "")]
    scenarios: String,
    /// Skip the load scenarios (drain tests only).
    #[arg(long, env = "BENCH_NO_LOAD", value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::SetTrue)]
    no_load: bool,
    /// Idle keep-alive connections held for the per-connection memory
    /// figure (0 skips the memory test).
    #[arg(long, env = "BENCH_MEMORY_CONNECTIONS", default_value_t = 10_000)]
    memory_connections: u32,
    /// From the end of the memory test's spike to its last RSS sample.
    #[arg(long, default_value_t = 30)]
    memory_after_seconds: u64,
    #[arg(long, default_value_t = 1000)]
    drain_idle: u32,
    #[arg(long, default_value_t = 100)]
    drain_slow: u32,
    #[arg(long, default_value_t = 1000)]
    drain_slow_ms: u64,
    /// A proxy still running this long after its stop command counts as
    /// "did not exit" and is killed.
    #[arg(long, default_value_t = 15)]
    drain_bound_seconds: u64,
    /// The images' build of kubegrace-sidecar (static glibc, stripped;
    /// bench/run builds it the way e2e/images/build-static does): the
    /// memory test measures it beside the one in --bin-dir, and the memory
    /// goals are judged on it, since it is what users run.
    #[arg(long, env = "BENCH_SIDECAR_STATIC")]
    sidecar_static: Option<PathBuf>,
    /// ghz, the gRPC load tool (bench/run builds it from the Go module
    /// proxy); the gRPC scenarios are skipped when it does not run.
    #[arg(long, env = "BENCH_GHZ", default_value = "ghz")]
    ghz: PathBuf,
    /// The .proto file ghz reads (the service bench-upstream answers).
    #[arg(long, default_value = "bench/grpc/bench.proto")]
    grpc_proto: PathBuf,
    /// Idle h2c connections held for the per-connection HTTP/2 memory
    /// figure (0 skips the HTTP/2 memory test).
    #[arg(long, env = "BENCH_H2_MEMORY_CONNECTIONS", default_value_t = 2000)]
    h2_memory_connections: u32,
    /// HTTP/2 streams held open for the per-stream memory figure, spread
    /// over `h2_memory_stream_connections` connections.
    #[arg(long, env = "BENCH_H2_MEMORY_STREAMS", default_value_t = 1000)]
    h2_memory_streams: u32,
    /// At most 100 streams each: HAProxy's default concurrent-stream limit.
    #[arg(long, default_value_t = 10)]
    h2_memory_stream_connections: u32,
    /// Where bench-upstream, bench-client and kubegrace-sidecar are.
    #[arg(long, default_value = "target/release")]
    bin_dir: PathBuf,
    #[arg(long, default_value = "bench/results/latest.json")]
    json: PathBuf,
    #[arg(long, default_value = "bench/results/latest.svg")]
    svg: PathBuf,
    #[arg(long, default_value = "bench/README.md")]
    readme: PathBuf,
    /// Re-render the README and plot from the JSON; run nothing.
    #[arg(long)]
    render_only: bool,
}

struct Harness {
    args: Args,
    env: Env,
    clk_tck: f64,
    started: Instant,
    proxies: BTreeMap<Peer, Proc>,
}

impl Harness {
    fn bin(&self, name: &str) -> PathBuf {
        self.args.bin_dir.join(name)
    }

    fn pinned_load(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new("taskset");
        cmd.arg("-c").arg(&self.args.load_cpus).arg(program);
        cmd
    }

    fn progress(&self, text: &str) {
        eprintln!("[{:>4.0}s] {text}", self.started.elapsed().as_secs_f64());
    }

    fn start_peer(&self, peer: Peer, timers: DrainTimers, label: &str) -> anyhow::Result<Proc> {
        let cmd = self
            .env
            .command(peer, timers)?
            .context("direct has no process")?;
        let log = self
            .env
            .dir
            .join(format!("{}.log", label.replace(['+', ' ', '(', ')'], "-")));
        let mut proc = Proc::spawn(label, cmd, log)?;
        wait_ready(&mut proc, self.env.port(peer))?;
        Ok(proc)
    }

    /// One load run against one peer.
    fn run_load(&self, scenario: &Scenario, peer: Peer, app_pid: u32) -> anyhow::Result<Sample> {
        let secs = self.args.seconds;
        let port = if scenario.is_h2() {
            self.env.h2_port(peer)
        } else if scenario.is_grpc() {
            self.env.grpc_port(peer)
        } else {
            self.env.port(peer)
        };
        let url = format!("http://127.0.0.1:{port}/");
        let h2_log = self.env.dir.join("h2load.log");
        let cmd = match scenario.load {
            Load::Wrk { connections, close } => {
                let mut c = self.pinned_load("wrk");
                c.args(["-t1", "--latency", "--timeout", "2s"])
                    .arg(format!("-c{connections}"))
                    .arg(format!("-d{secs}s"));
                if close {
                    c.args(["-H", "Connection: close"]);
                }
                c.arg(&url);
                c
            }
            Load::H2load { clients, streams } => {
                let mut c = self.pinned_load("h2load");
                c.args(["-t1", &format!("-c{clients}"), &format!("-m{streams}")])
                    .arg(format!("-D{secs}"))
                    .arg(format!("--log-file={}", h2_log.display()))
                    .arg(&url);
                c
            }
            Load::Rate { connections } => {
                let mut c = self.pinned_load(self.bin("bench-client"));
                c.args(["rate", "--target", &format!("127.0.0.1:{port}")])
                    .args(["--rate", &self.args.rate.to_string()])
                    .args(["--seconds", &self.args.latency_seconds.to_string()])
                    .args(["--warmup-seconds", "1"])
                    .args(["--connections", &connections.to_string()]);
                c
            }
            Load::Ghz {
                call,
                connections,
                concurrency,
                rate,
            } => {
                let run = grpc::Run {
                    call,
                    connections,
                    concurrency,
                    rate: rate.then_some(self.args.rate),
                    seconds: if rate {
                        self.args.latency_seconds
                    } else {
                        secs
                    },
                };
                let mut c = self.pinned_load(&self.args.ghz);
                c.args(grpc::ghz_args(&run, &self.args.grpc_proto, port));
                c
            }
        };
        let proxy_pid = self.proxies.get(&peer).map(Proc::pid);
        let shared = scenario.cores == Cores::SharedWithApp;
        // The pair's CPU limit, for this round only: the proxy's every
        // process and the app, back where they were after it.
        let mut limit = match self.args.pair_cpu_limit {
            m if shared && m > 0 => {
                let mut limit = CpuLimit::new(m)?;
                for pid in proxy_pid.map(procfs::process_tree).unwrap_or_default() {
                    limit.add(pid)?;
                }
                limit.add(app_pid)?;
                Some(limit)
            }
            _ => None,
        };
        let app_ticks_before = shared.then(|| procfs::tree_cpu_ticks(app_pid));
        let ticks_before = proxy_pid.map(procfs::tree_cpu_ticks);
        let start = Instant::now();
        let mut rss = None;
        let bound = u64::from(secs.max(self.args.latency_seconds + 1)) + 20;
        let (out, err) = run_bounded(cmd, Duration::from_secs(bound), || {
            // Loaded memory: near the end of the round, connections open.
            thread::sleep(Duration::from_secs_f64(f64::from(secs) * 0.8));
            rss = proxy_pid.map(procfs::tree_rss_kib);
        })?;
        let wall = start.elapsed().as_secs_f64();
        let cpu_s = match (proxy_pid, ticks_before) {
            (Some(pid), Some(before)) => {
                Some(procfs::tree_cpu_ticks(pid).saturating_sub(before) as f64 / self.clk_tck)
            }
            _ => None,
        };
        let app_cpu_s = app_ticks_before.map(|before| {
            procfs::tree_cpu_ticks(app_pid).saturating_sub(before) as f64 / self.clk_tck
        });
        if let Some(limit) = limit.as_mut() {
            limit.release_all()?;
        }
        drop(limit);
        let result: LoadResult = match scenario.load {
            Load::Wrk { .. } => {
                parse::wrk(&out).with_context(|| format!("wrk said: {out}{err}"))?
            }
            Load::H2load { .. } => {
                let mut r = parse::h2load_summary(&out)
                    .with_context(|| format!("h2load said: {out}{err}"))?;
                let log = std::fs::read_to_string(&h2_log).unwrap_or_default();
                let mut lat = parse::h2load_log_latencies_us(&log);
                let _ = std::fs::remove_file(&h2_log);
                lat.sort_unstable();
                let ms = |q| {
                    kubegrace_bench::stats::percentile_sorted(&lat, q).map(|us| us as f64 / 1000.0)
                };
                r.p50_ms = ms(50.0).context("h2load logged no requests")?;
                r.p99_ms = ms(99.0).unwrap_or(f64::NAN);
                r.p999_ms = ms(99.9);
                r
            }
            Load::Ghz { .. } => {
                parse::ghz(&out).with_context(|| format!("ghz said: {out}{err}"))?
            }
            Load::Rate { .. } => {
                let v: serde_json::Value = serde_json::from_str(out.trim())
                    .with_context(|| format!("bench-client said: {out}{err}"))?;
                let f = |k: &str| {
                    v.get(k)
                        .and_then(serde_json::Value::as_f64)
                        .unwrap_or(f64::NAN)
                };
                LoadResult {
                    requests: f("requests") as u64,
                    errors: f("errors") as u64,
                    rps: f("rps"),
                    p50_ms: f("p50_ms"),
                    p99_ms: f("p99_ms"),
                    p999_ms: Some(f("p999_ms")),
                }
            }
        };
        Ok(Sample {
            rps: result.rps,
            p50_ms: result.p50_ms,
            p99_ms: result.p99_ms,
            p999_ms: result.p999_ms,
            requests: result.requests,
            errors: result.errors,
            cpu_s,
            // The tool's own run time, not our spawn overhead.
            wall_s: if result.rps > 0.0 {
                result.requests as f64 / result.rps
            } else {
                wall
            },
            rss_kib: rss,
            app_cpu_s,
        })
    }

    /// The memory test (memtest.rs) on fresh instances of the proxies.
    fn memory_test(&self, live: &[Peer]) -> BTreeMap<String, IdleConnections> {
        let wanted = self.args.memory_connections;
        let limit = memtest::raise_open_files();
        // The proxy takes a descriptor per client connection, the client
        // one per connection too (each its own process); some headroom for
        // upstream connections and the proxy's own files.
        if limit < u64::from(wanted) + 1024 {
            self.progress(&format!(
                "memory test skipped: {wanted} connections need more than the open-files limit ({limit}); raise ulimit -n"
            ));
            return BTreeMap::new();
        }
        let mut subjects = Vec::new();
        for &peer in live {
            if !matches!(
                peer,
                Peer::Kubegrace | Peer::Nginx | Peer::Haproxy | Peer::Caddy
            ) {
                continue;
            }
            // HAProxy past its maxconn stops accepting, and its maxconn
            // follows the open-files limit (peers.rs): say so rather than
            // wait out the client's bound.
            let haproxy_max = kubegrace_bench::peers::haproxy_maxconn(limit);
            if peer == Peer::Haproxy && haproxy_max < u64::from(wanted) {
                self.progress(&format!(
                    "memory haproxy: not in this test: {wanted} connections need maxconn {wanted}, and the open-files limit ({limit}) allows {haproxy_max}"
                ));
                continue;
            }
            let label = format!("{} (memory)", peer.name());
            match self.start_peer(peer, DrainTimers::Defaults, &label) {
                Ok(proc) => subjects.push(memtest::Subject {
                    name: peer.name().to_string(),
                    proc,
                    port: self.env.port(peer),
                }),
                Err(e) => self.progress(&format!("memory {}: not started: {e:#}", peer.name())),
            }
        }
        let with_static = live.contains(&Peer::Kubegrace);
        match with_static.then(|| memtest::start_static_sidecar(&self.env)) {
            Some(Some(Ok(subject))) => subjects.push(subject),
            Some(Some(Err(e))) => self.progress(&format!("memory {KUBEGRACE_STATIC}: {e:#}")),
            _ => {}
        }
        let hold = |port: u16| {
            let mut c = self.pinned_load(self.bin("bench-client"));
            c.args(["drain", "--target", &format!("127.0.0.1:{port}")])
                .args(["--idle", &wanted.to_string()])
                .args(["--timeout-seconds", "1"]);
            c
        };
        let burst = |port: u16| {
            let mut c = self.pinned_load("wrk");
            c.args(["-t1", "-c256", "-d3s"])
                .arg(format!("http://127.0.0.1:{port}/"));
            c
        };
        let progress = |text: &str| self.progress(text);
        let plan = memtest::Plan {
            hold: &hold,
            burst: &burst,
            connections: wanted,
            after: Duration::from_secs(self.args.memory_after_seconds),
            progress: &progress,
        };
        memtest::run(subjects, &plan)
            .into_iter()
            .map(|(name, m)| {
                let per = memtest::per_connection(m.idle_kib, m.held_kib, m.connections);
                let figures = IdleConnections {
                    idle_rss_kib: m.idle_kib,
                    held_rss_kib: m.held_kib,
                    connections: m.connections,
                    per_connection_kib: per,
                    after_spike_rss_kib: m.after_spike_kib,
                    after_seconds: self.args.memory_after_seconds,
                };
                (name, figures)
            })
            .collect()
    }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.render_only {
        let text = std::fs::read_to_string(&args.json)
            .with_context(|| format!("reading {}", args.json.display()))?;
        let report: Report = serde_json::from_str(&text)?;
        report::write_outputs(&args.readme, &args.svg, &report)?;
        eprintln!(
            "rendered {} and {}",
            args.readme.display(),
            args.svg.display()
        );
        return Ok(());
    }
    anyhow::ensure!(
        args.seconds >= 1 && args.rounds >= 1,
        "BENCH_SECONDS and BENCH_ROUNDS must be at least 1"
    );
    let mut peers: Vec<Peer> = vec![Peer::Direct];
    for name in args
        .peers
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        let peer = Peer::from_name(name)
            .with_context(|| format!("unknown peer {name:?} in BENCH_PEERS"))?;
        if !peers.contains(&peer) {
            peers.push(peer);
        }
    }
    let dir = std::env::temp_dir().join(format!("kubegrace-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let env = Env {
        dir: dir.clone(),
        base_port: free_base_port(args.base_port)?,
        proxy_cpus: args.proxy_cpus.clone(),
        sidecar_bin: args.bin_dir.join("kubegrace-sidecar"),
        sidecar_static_bin: args.sidecar_static.clone().filter(|p| p.exists()),
    };
    let mut h = Harness {
        env,
        clk_tck: procfs::clock_ticks_per_second(),
        started: Instant::now(),
        proxies: BTreeMap::new(),
        args,
    };
    let result = run(&mut h, &peers);
    // Stop everything before reporting, then remove the scratch directory.
    h.proxies.clear();
    if result.is_ok() {
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        eprintln!("logs kept in {}", dir.display());
    }
    result
}

fn run(h: &mut Harness, peers: &[Peer]) -> anyhow::Result<()> {
    let loadavg_start = loadavg();
    let scenarios: Vec<Scenario> = if h.args.no_load {
        Vec::new()
    } else {
        scenario::select(&h.args.scenarios).map_err(|e| anyhow::anyhow!(e))?
    };
    let load_runs = scenarios.len() * peers.len() * h.args.rounds as usize;
    h.progress(&format!(
        "{} peers x {} scenarios x {} rounds of {} s: about {:.0} s of load, then the drain tests",
        peers.len(),
        scenarios.len(),
        h.args.rounds,
        h.args.seconds,
        load_runs as f64 * (f64::from(h.args.seconds) + 0.4)
    ));

    // The upstream lives for the whole run, on the load generator's CPU.
    let mut up = h.pinned_load(h.bin("bench-upstream"));
    up.args(["--listen", &format!("127.0.0.1:{}", h.env.upstream_port())]);
    let mut upstream = Proc::spawn("bench-upstream", up, h.env.dir.join("upstream.log"))?;
    wait_ready(&mut upstream, h.env.upstream_port()).context("bench-upstream")?;

    let mut unavailable = BTreeMap::new();
    let mut memory = BTreeMap::new();
    let mut live: Vec<Peer> = vec![Peer::Direct];
    for &peer in peers.iter().filter(|p| p.is_proxy()) {
        if matches!(peer, Peer::Kubegrace | Peer::KubegraceCb) && !h.env.sidecar_bin.exists() {
            unavailable.insert(
                peer.name().to_string(),
                format!("{} is not built", h.env.sidecar_bin.display()),
            );
            continue;
        }
        match h.start_peer(peer, DrainTimers::Defaults, peer.name()) {
            Ok(proc) => {
                thread::sleep(Duration::from_millis(300));
                memory.insert(peer.name().to_string(), procfs::tree_rss_kib(proc.pid()));
                h.proxies.insert(peer, proc);
                live.push(peer);
            }
            Err(e) => {
                h.progress(&format!("{}: not measured: {e:#}", peer.name()));
                unavailable.insert(peer.name().to_string(), format!("{e:#}"));
            }
        }
    }
    let no_h2 = probes::no_h2(h, &live);
    let no_grpc = if scenarios.iter().any(Scenario::is_grpc) {
        probes::no_grpc(h, &live)
    } else {
        Vec::new()
    };
    let mut versions = BTreeMap::new();
    versions.insert("nginx".into(), command_output("nginx", &["-v"]));
    versions.insert("haproxy".into(), command_output("haproxy", &["-v"]));
    versions.insert("caddy".into(), command_output("caddy", &["version"]));
    versions.insert("wrk".into(), command_output("wrk", &["-v"]));
    versions.insert("h2load".into(), command_output("h2load", &["--version"]));
    let ghz = h.args.ghz.display().to_string();
    versions.insert("ghz".into(), command_output(&ghz, &["--version"]));
    versions.insert(
        "kubegrace".into(),
        command_output(&h.env.sidecar_bin.display().to_string(), &["--version"]),
    );

    // Warm-up: fills every upstream pool and pages in the code paths.
    if !scenarios.is_empty() {
        for &peer in &live {
            let mut c = h.pinned_load("wrk");
            c.args(["-t1", "-c64", "-d1s", "--latency"])
                .arg(format!("http://127.0.0.1:{}/", h.env.port(peer)));
            let _ = run_bounded(c, Duration::from_secs(10), || {});
        }
    }

    let mut samples: BTreeMap<(usize, Peer), Vec<Sample>> = BTreeMap::new();
    // Where the upstream runs now: it moves to the proxy's CPUs for the
    // shared-core scenarios (every thread, `taskset -a`), and back.
    let mut upstream_on = Cores::ProxyAlone;
    let place_upstream = |cores: Cores| {
        let cpus = match cores {
            Cores::ProxyAlone => &h.args.load_cpus,
            Cores::SharedWithApp => &h.args.proxy_cpus,
        };
        pin(upstream.pid(), cpus).context("moving bench-upstream to other CPUs")
    };
    for round in 0..h.args.rounds {
        for (si, scenario) in scenarios.iter().enumerate() {
            if scenario.cores != upstream_on {
                place_upstream(scenario.cores)?;
                upstream_on = scenario.cores;
            }
            // Rotate the order each round so no peer always runs first
            // (or always right after the heaviest one).
            let mut order = live.clone();
            let shift = round as usize % order.len().max(1);
            order.rotate_left(shift);
            for peer in order {
                if (scenario.is_h2() && no_h2.contains(&peer))
                    || (scenario.is_grpc() && no_grpc.contains(&peer))
                {
                    continue;
                }
                match h.run_load(scenario, peer, upstream.pid()) {
                    Ok(s) => {
                        h.progress(&format!(
                            "round {}/{} {:<18} {:<13} {:>9.0} req/s  p50 {:.3} ms  p99 {:.3} ms{}{}{}",
                            round + 1,
                            h.args.rounds,
                            scenario.id,
                            peer.name(),
                            s.rps,
                            s.p50_ms,
                            s.p99_ms,
                            s.cpu_s.map_or(String::new(), |c| format!(
                                "  proxy cpu {:.0}%",
                                c / s.wall_s * 100.0
                            )),
                            s.app_cpu_s.map_or(String::new(), |a| format!(
                                "  app cpu {:.0}%",
                                a / s.wall_s * 100.0
                            )),
                            if s.errors > 0 { format!("  {} errors", s.errors) } else { String::new() },
                        ));
                        samples.entry((si, peer)).or_default().push(s);
                    }
                    Err(e) => {
                        h.progress(&format!("{} {}: failed: {e:#}", scenario.id, peer.name()))
                    }
                }
                thread::sleep(Duration::from_millis(200));
            }
        }
    }
    if upstream_on != Cores::ProxyAlone {
        place_upstream(Cores::ProxyAlone)?;
    }
    let mut peaks = BTreeMap::new();
    for (peer, proc) in &h.proxies {
        peaks.insert(
            peer.name().to_string(),
            procfs::tree_peak_rss_kib(proc.pid()),
        );
    }
    h.proxies.clear();

    let mut results: Vec<ScenarioResult> = Vec::new();
    for (si, scenario) in scenarios.iter().enumerate() {
        let mut cells = BTreeMap::new();
        for &peer in &live {
            if let Some(cell) = samples.remove(&(si, peer)).and_then(Cell::from_samples) {
                cells.insert(peer.name().to_string(), cell);
            }
        }
        results.push(ScenarioResult {
            id: scenario.id.to_string(),
            title: scenario.title.to_string(),
            peers: cells,
        });
    }
    report::add_comparisons(&mut results);
    let loaded = |name: &str| {
        results
            .iter()
            .find(|s| s.id == KEEPALIVE_256)
            .and_then(|s| s.peers.get(name)?.rss_kib)
    };
    let memory: BTreeMap<String, Memory> = memory
        .into_iter()
        .map(|(name, idle)| {
            let m = Memory {
                idle_rss_kib: idle,
                loaded_rss_kib: loaded(&name),
                peak_rss_kib: peaks.get(&name).copied().unwrap_or(0),
                idle_connections: None,
            };
            (name, m)
        })
        .collect();
    let mut memory = memory;
    if h.args.memory_connections > 0 {
        report::add_memory_test(&mut memory, h.memory_test(&live));
    }
    let h2_memory = if h.args.h2_memory_connections > 0 || h.args.h2_memory_streams > 0 {
        h2mem::run(h, &live)
    } else {
        BTreeMap::new()
    };

    let drain = if h.args.no_drain {
        Vec::new()
    } else {
        drain::run(h, &live)
    };
    drop(upstream);

    let mut machine = BTreeMap::new();
    machine.insert("cpus".into(), command_output("nproc", &[]));
    machine.insert("kernel".into(), command_output("uname", &["-r"]));
    machine.insert(
        "cpu_model".into(),
        std::fs::read_to_string("/proc/cpuinfo")
            .unwrap_or_default()
            .lines()
            .find_map(|l| {
                l.strip_prefix("model name")
                    .map(|r| r.trim_start_matches([' ', '\t', ':']).to_string())
            })
            .unwrap_or_default(),
    );
    machine.insert("loadavg_start".into(), loadavg_start);
    machine.insert("loadavg_end".into(), loadavg());
    let mut report = Report {
        generated_at: command_output("date", &["-u", "+%Y-%m-%dT%H:%M:%SZ"]),
        git_rev: command_output("git", &["rev-parse", "--short", "HEAD"]),
        machine,
        settings: Settings {
            seconds: h.args.seconds,
            rounds: h.args.rounds,
            rate: h.args.rate,
            proxy_cpus: h.args.proxy_cpus.clone(),
            load_cpus: h.args.load_cpus.clone(),
            drain_idle: h.args.drain_idle,
            drain_slow: h.args.drain_slow,
            drain_slow_ms: h.args.drain_slow_ms,
            pair_cpu_millicores: h.args.pair_cpu_limit,
        },
        versions,
        unavailable,
        scenarios: results,
        memory,
        drain,
        h2_memory,
        verdicts: Vec::new(),
        wall_seconds: h.started.elapsed().as_secs_f64(),
    };
    report.verdicts = report.judge();
    if let Some(parent) = h.args.json.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(&h.args.json, serde_json::to_string_pretty(&report)? + "\n")?;
    report::write_outputs(&h.args.readme, &h.args.svg, &report)?;
    for v in &report.verdicts {
        eprintln!("  {v}");
    }
    h.progress(&format!(
        "wrote {}, {} and {}",
        h.args.json.display(),
        h.args.readme.display(),
        h.args.svg.display()
    ));
    Ok(())
}
