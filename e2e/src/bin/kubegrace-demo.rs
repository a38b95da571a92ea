//! kubegrace-demo: the scenario of `make demo` on the cluster in `KUBECONFIG`: install the
//! chart, deploy the demo app with and without kubegrace, roll both under the same load
//! (`kubegrace_e2e::scenario`, the same code as `e2e/tests/rollout.rs`).
//!
//! Writes `<out-dir>/with.loadgen.json`, `<out-dir>/without.loadgen.json` (loadgen
//! summaries) and `<out-dir>/report.args`, the remaining arguments of
//! `kubegrace-demo-report` (rollout times and events), one per line. Exit status 0 when
//! both runs were measured, whatever failed in them (the report judges); 1 when the
//! scenario itself could not run.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Parser;
use kubegrace_e2e::scenario::{self, Options, Progress};

#[derive(Debug, Parser)]
#[command(
    version,
    about = "Roll the demo app with and without kubegrace under the same load"
)]
struct Args {
    /// Where the loadgen summaries and report.args go.
    #[arg(long, default_value = "target/demo")]
    out_dir: PathBuf,
    /// The chart to install.
    #[arg(long, default_value = "charts/kubegrace")]
    chart: PathBuf,
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
    // The demo is run on purpose (e2e/demo sets the kubeconfig): no tier gate.
    let client = kubegrace_e2e::connect().await?;
    let mut opts = Options::new("kubegrace-demo").with_load_from_env()?;
    if let Some(release) = args.release {
        opts.release_namespace = release.clone();
        opts.release = release;
    }
    opts.chart = args.chart;
    opts.image_registry = args.image_registry;
    opts.image_tag = args.image_tag;
    opts.replicas = args.replicas;
    opts.drain = kubegrace_e2e::scenario::Drain::product_defaults();
    opts.load.rate = args.rate;
    opts.load.max_duration = Duration::from_secs(240);

    let p = Progress::default();
    let outcome = scenario::run(&client, &opts, &p, None, args.keep).await?;

    std::fs::create_dir_all(&args.out_dir)
        .with_context(|| format!("creating {}", args.out_dir.display()))?;
    let mut report_args = Vec::new();
    for (side, run) in [("with", &outcome.with), ("without", &outcome.without)] {
        let path = args.out_dir.join(format!("{side}.loadgen.json"));
        std::fs::write(&path, serde_json::to_string_pretty(&run.summary)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
        report_args.push(format!("--{side}={}", path.display()));
        report_args.extend(run.report_args(side));
        eprintln!("{side:>7} kubegrace: {}", run.describe());
    }
    let (with_s, without_s) = (outcome.with.rollout_s, outcome.without.rollout_s);
    let ratio = with_s / without_s.max(0.001);
    eprintln!(
        "rollout duration: with kubegrace {with_s:.1}s, without {without_s:.1}s ({ratio:.2}x{})",
        if ratio <= 1.5 {
            ", within 1.5x"
        } else {
            ", SLOWER than 1.5x"
        }
    );
    let path = args.out_dir.join("report.args");
    std::fs::write(&path, report_args.join("\n") + "\n")
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}
