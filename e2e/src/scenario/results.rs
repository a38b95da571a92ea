//! What a run measured ([`RunResult`]) and the whole scenario's results ([`Outcome`]).

use crate::load::report::{DemoRun, Event};
use crate::load::{self, Summary};

/// The result of one run under load.
#[derive(Clone, Debug)]
pub struct RunResult {
    pub summary: Summary,
    /// From the template change (or scale) to the Deployment rolled out, in seconds.
    pub rollout_s: f64,
    /// When the change was made, UNIX time in seconds.
    pub rollout_at_unix_s: f64,
    /// Old pods seen terminating (and operator pods killed), UNIX time in seconds.
    pub events: Vec<(f64, String)>,
    /// Where the load ran ([`super::LoadMode::describe`] and the Job's name).
    pub load_from: String,
    /// Operator pods deleted during the run ([`super::Action::RestartKillingOperator`]).
    pub operator_pods_killed: Vec<String>,
}

impl RunResult {
    /// The run as the demo report takes it.
    pub fn demo_run(&self) -> DemoRun {
        let t0 = self.summary.started_at_unix_s;
        DemoRun {
            summary: self.summary.clone(),
            rollout_s: self.rollout_s,
            rollout_start_s: Some(self.rollout_at_unix_s - t0),
            events: self
                .events
                .iter()
                .map(|(at, label)| Event {
                    t_s: at - t0,
                    label: label.clone(),
                })
                .collect(),
        }
    }

    /// `--with-rollout-s ...` style arguments of `kubegrace-demo-report` for this run
    /// (`side` is `with` or `without`); the summary itself goes in a file.
    pub fn report_args(&self, side: &str) -> Vec<String> {
        let mut args = vec![
            format!("--{side}-rollout-s={:.3}", self.rollout_s),
            format!("--{side}-rollout-at={:.3}", self.rollout_at_unix_s),
        ];
        for (at, label) in &self.events {
            args.push(format!("--{side}-event={at:.3}={label}"));
        }
        args
    }

    /// `requests`, `failed` and the failure reasons on one line.
    pub fn describe(&self) -> String {
        let s = &self.summary;
        let reasons: Vec<String> = load::Reason::FAILURES
            .iter()
            .map(|r| (r, s.by_reason.get(*r)))
            .filter(|(_, n)| *n > 0)
            .map(|(r, n)| format!("{r}={n}"))
            .collect();
        format!(
            "{} requests, {} failed [{}], rollout {:.1}s, p99 {:.1} ms, load from {}{}",
            s.requests,
            s.failed,
            if reasons.is_empty() {
                "-".to_owned()
            } else {
                reasons.join(" ")
            },
            self.rollout_s,
            s.p99_ms,
            self.load_from,
            if s.by_detail.is_empty() {
                String::new()
            } else {
                format!(", details {:?}", s.by_detail)
            }
        )
    }
}

/// The whole scenario's results.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub with: RunResult,
    pub without: RunResult,
    /// `demo-with` scaled down under load, when asked for.
    pub scale: Option<RunResult>,
}

impl Outcome {
    /// `result.json`'s shape.
    pub fn demo_result(&self) -> crate::load::report::DemoResult {
        crate::load::report::DemoResult {
            with: self.with.demo_run(),
            without: self.without.demo_run(),
        }
    }
}
