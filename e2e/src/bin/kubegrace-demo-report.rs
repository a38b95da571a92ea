//! kubegrace-demo-report: the demo's verdict from two loadgen results (a rolling update
//! with and without kubegrace). Prints the table, writes `result.json` and `rollout.svg`.
//!
//! Each side is either a whole run as `kubectl kubegrace verify --out FILE` writes it
//! (`--with-run`, `--without-run`: what `make demo` passes), or a loadgen summary with the
//! rollout's timing and events given apart (`--with`, `--with-rollout-s`, ...: a load run
//! by hand).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::Parser;
use kubegrace_e2e::load::report::{self, DemoResult, DemoRun, Event};

#[derive(Debug, Parser)]
#[command(
    version,
    about = "Render the kubegrace demo result (table, result.json, rollout.svg)"
)]
struct Args {
    /// The rollout with kubegrace as `kubectl kubegrace verify --out` wrote it.
    #[arg(long, conflicts_with_all = ["with", "with_rollout_s"])]
    with_run: Option<PathBuf>,
    /// The rollout without kubegrace as `kubectl kubegrace verify --out` wrote it.
    #[arg(long, conflicts_with_all = ["without", "without_rollout_s"])]
    without_run: Option<PathBuf>,
    /// Loadgen summary of the rollout with kubegrace (JSON file or captured Job log).
    #[arg(
        long = "with",
        required_unless_present = "with_run",
        requires = "with_rollout_s"
    )]
    with: Option<PathBuf>,
    /// Loadgen summary of the rollout without kubegrace.
    #[arg(
        long,
        required_unless_present = "without_run",
        requires = "without_rollout_s"
    )]
    without: Option<PathBuf>,
    /// How long the rollout with kubegrace took, in seconds.
    #[arg(long)]
    with_rollout_s: Option<f64>,
    /// How long the rollout without kubegrace took, in seconds.
    #[arg(long)]
    without_rollout_s: Option<f64>,
    /// When the rollout with kubegrace started, seconds after the load started.
    #[arg(long)]
    with_rollout_start_s: Option<f64>,
    /// When the rollout without kubegrace started, seconds after the load started.
    #[arg(long)]
    without_rollout_start_s: Option<f64>,
    /// When the rollout with kubegrace started, as UNIX time in seconds (`date +%s.%N`);
    /// placed on the timeline with the loadgen's `started_at_unix_s`.
    #[arg(long, conflicts_with = "with_rollout_start_s")]
    with_rollout_at: Option<f64>,
    /// When the rollout without kubegrace started, as UNIX time in seconds.
    #[arg(long, conflicts_with = "without_rollout_start_s")]
    without_rollout_at: Option<f64>,
    /// Mark an event on the run with kubegrace: T=LABEL, T in seconds since the load started
    /// or a UNIX time (e.g. "1764460000.5=pod web-1 deleted"). Repeatable.
    #[arg(long = "with-event")]
    with_events: Vec<String>,
    /// Mark an event on the run without kubegrace (like --with-event).
    #[arg(long = "without-event")]
    without_events: Vec<String>,
    /// Where result.json and rollout.svg go.
    #[arg(long, default_value = "target/demo")]
    out_dir: PathBuf,
    /// Exit 1 when the run with kubegrace lost any request.
    #[arg(long)]
    fail_if_with_failed: bool,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let with = match (&args.with_run, &args.with) {
        (Some(path), _) => whole_run(path)?,
        (None, Some(path)) => run(
            path,
            args.with_rollout_s.unwrap_or_default(),
            args.with_rollout_start_s,
            args.with_rollout_at,
            &args.with_events,
        )?,
        (None, None) => bail!("--with-run or --with is required"),
    };
    let without = match (&args.without_run, &args.without) {
        (Some(path), _) => whole_run(path)?,
        (None, Some(path)) => run(
            path,
            args.without_rollout_s.unwrap_or_default(),
            args.without_rollout_start_s,
            args.without_rollout_at,
            &args.without_events,
        )?,
        (None, None) => bail!("--without-run or --without is required"),
    };
    let result = DemoResult { with, without };
    print!("{}", report::table(&result));
    let (json, svg) = report::write(&args.out_dir, &result)?;
    eprintln!("wrote {} and {}", json.display(), svg.display());
    if args.fail_if_with_failed && result.with.summary.failed > 0 {
        bail!(
            "{} requests failed with kubegrace",
            result.with.summary.failed
        );
    }
    Ok(())
}

/// One run as `kubectl kubegrace verify --out` wrote it.
fn whole_run(path: &Path) -> Result<DemoRun> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| {
        format!(
            "{} is not a run written by `kubectl kubegrace verify --out`",
            path.display()
        )
    })
}

/// One run: the loadgen summary, the rollout's duration and where it starts on the timeline
/// (given in seconds since the load started, or as UNIX time), and its events.
fn run(
    path: &Path,
    rollout_s: f64,
    start_s: Option<f64>,
    at_unix_s: Option<f64>,
    events: &[String],
) -> Result<DemoRun> {
    let summary =
        report::load_summary(path).with_context(|| format!("loading {}", path.display()))?;
    let rollout_start_s = match at_unix_s {
        Some(at) if summary.started_at_unix_s > 0.0 => Some(at - summary.started_at_unix_s),
        Some(_) => bail!(
            "{} has no started_at_unix_s; give the rollout start in seconds instead",
            path.display()
        ),
        None => start_s,
    };
    let events = events
        .iter()
        .map(|spec| Event::parse(spec, summary.started_at_unix_s).map_err(anyhow::Error::msg))
        .collect::<Result<Vec<_>>>()?;
    Ok(DemoRun {
        summary,
        rollout_s,
        rollout_start_s,
        events,
    })
}
