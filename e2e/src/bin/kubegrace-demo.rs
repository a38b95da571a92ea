//! kubegrace-demo: the scenario of `make demo` on the cluster in `KUBECONFIG`. It installs
//! the chart and deploys the demo app with and without kubegrace (`kubegrace_e2e::scenario`,
//! the same code as `e2e/tests/rollout.rs`), then proves each rollout the way a user does:
//! `kubectl kubegrace verify deploy/NAME` (the plugin binary itself, as a child process),
//! once per Deployment, under the same load. Uninstalls afterwards unless `--keep`.
//!
//! Writes `<out-dir>/with.run.json` and `<out-dir>/without.run.json` (what
//! `verify --out` writes) and `<out-dir>/report.args`, the arguments of
//! `kubegrace-demo-report`, one per line. Exit status 0 when both runs were measured,
//! whatever failed in them (the report judges); 1 when the scenario itself could not run.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Parser;
use kubegrace_e2e::load::report::DemoRun;
use kubegrace_e2e::scenario::{self, Options, Progress, WITH, WITHOUT};

#[derive(Debug, Parser)]
#[command(
    version,
    about = "Roll the demo app with and without kubegrace under the same load, through `kubectl kubegrace verify`"
)]
struct Args {
    /// Where the runs and report.args go.
    #[arg(long, default_value = "target/demo")]
    out_dir: PathBuf,
    /// The chart to install.
    #[arg(long, default_value = "charts/kubegrace")]
    chart: PathBuf,
    /// The `kubectl-kubegrace` binary (default: the one next to this binary).
    #[arg(long)]
    plugin: Option<PathBuf>,
    /// Release name (and its namespace); default `kubegrace-demo-<random>`.
    #[arg(long)]
    release: Option<String>,
    /// Registry and tag of the kubegrace images.
    #[arg(long, default_value = "localhost")]
    image_registry: String,
    #[arg(long, default_value = "e2e")]
    image_tag: String,
    /// Replicas of each demo Deployment.
    #[arg(long, default_value_t = 3)]
    replicas: i32,
    /// Requests per second of the load (open loop, HTTP/1.1 keep-alive).
    #[arg(long, default_value_t = 150.0)]
    rate: f64,
    /// Longest one run's load lasts (`verify --duration`): lead-in, rollout, old pods gone.
    #[arg(long, default_value = "4m", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Leave the release and the demo namespace in place.
    #[arg(long)]
    keep: bool,
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    if !(args.rate > 0.0 && args.rate <= 1000.0) {
        bail!("--rate must be > 0 and at most 1000 per second");
    }
    let plugin = match &args.plugin {
        Some(p) => p.clone(),
        None => std::env::current_exe()?.with_file_name("kubectl-kubegrace"),
    };
    if !plugin.exists() {
        bail!(
            "{} is missing: cargo build -p kubectl-kubegrace (e2e/demo does)",
            plugin.display()
        );
    }
    std::fs::create_dir_all(&args.out_dir)
        .with_context(|| format!("creating {}", args.out_dir.display()))?;
    // The demo is run on purpose (e2e/demo sets the kubeconfig): no tier gate.
    let client = kubegrace_e2e::connect().await?;
    let mut opts = Options::new("kubegrace-demo");
    if let Some(release) = &args.release {
        opts.release_namespace = release.clone();
        opts.release = release.clone();
    }
    opts.chart = args.chart.clone();
    opts.image_registry = args.image_registry.clone();
    opts.image_tag = args.image_tag.clone();
    opts.replicas = args.replicas;
    opts.drain = scenario::Drain::product_defaults();

    let p = Progress::default();
    let runs = scenario::with_install(&client, &opts, &p, args.keep, async |run| {
        let sc = run.scenario("demo").await?;
        sc.deploy(&p).await?;
        let mut runs = Vec::new();
        for (deployment, side) in [(WITH, "with"), (WITHOUT, "without")] {
            let out = args.out_dir.join(format!("{side}.run.json"));
            verify(&plugin, &args, &opts, &sc.namespace, deployment, &out, &p).await?;
            runs.push((side, out));
        }
        Ok(runs)
    })
    .await?;

    let mut report_args = Vec::new();
    let mut rollouts = Vec::new();
    for (flag, path) in &runs {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let run: DemoRun = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a verify run", path.display()))?;
        eprintln!(
            "{flag:>7} kubegrace: {} requests, {} failed, rollout {:.1}s",
            run.summary.requests, run.summary.failed, run.rollout_s
        );
        rollouts.push(run.rollout_s);
        report_args.push(format!("--{flag}-run={}", path.display()));
    }
    if let [with_s, without_s] = rollouts[..] {
        let ratio = with_s / f64::max(without_s, 0.001);
        eprintln!(
            "rollout duration: with kubegrace {with_s:.1}s, without {without_s:.1}s ({ratio:.2}x{})",
            if ratio <= 1.5 {
                ", within 1.5x"
            } else {
                ", SLOWER than 1.5x"
            }
        );
    }
    let path = args.out_dir.join("report.args");
    std::fs::write(&path, report_args.join("\n") + "\n")
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// `kubectl kubegrace verify deploy/<name> -n <namespace> ... --out <out>`, its output
/// passed through. Exit 0 (nothing failed) and 1 (requests failed) are both measurements;
/// anything else means the run could not be made.
async fn verify(
    plugin: &Path,
    args: &Args,
    opts: &Options,
    namespace: &str,
    name: &str,
    out: &Path,
    p: &Progress,
) -> Result<()> {
    let target = format!("deploy/{name}");
    let argv: Vec<String> = vec![
        "verify".into(),
        target.clone(),
        "--namespace".into(),
        namespace.into(),
        "--rate".into(),
        args.rate.to_string(),
        "--duration".into(),
        humantime::format_duration(args.duration).to_string(),
        // A little server time keeps requests in flight, as in real traffic, so a pod
        // that dies cuts some (the rollout test's load).
        "--path".into(),
        opts.load.path.clone(),
        "--connections".into(),
        opts.load.connections.to_string(),
        "--loadgen-image".into(),
        opts.loadgen_image(),
        "--out".into(),
        out.display().to_string(),
    ];
    p.step(format!("kubectl kubegrace {}", argv.join(" ")));
    let _ = std::fs::remove_file(out);
    // Bounded: the load's own bound, plus the Job's start and the summary read.
    let bound = args.duration + Duration::from_secs(240);
    let status = tokio::time::timeout(
        bound,
        tokio::process::Command::new(plugin)
            .args(&argv)
            .kill_on_drop(true)
            .status(),
    )
    .await
    .with_context(|| format!("kubectl kubegrace verify {target} ran over {bound:?}"))?
    .with_context(|| format!("running {}", plugin.display()))?;
    match status.code() {
        Some(0 | 1) if out.exists() => Ok(()),
        Some(0 | 1) => bail!(
            "verify {target} exited {status} without writing {}",
            out.display()
        ),
        _ => bail!("kubectl kubegrace verify {target} could not run ({status})"),
    }
}
