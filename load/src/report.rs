//! The demo's report: two loadgen results (a rolling update with and without kubegrace),
//! rendered as a text table, `result.json` and `rollout.svg` (hand-written SVG, no deps).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::Error;
use super::outcome::Reason;
use super::summary::Summary;

/// One run of the demo: the load result and how long the rollout took.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DemoRun {
    #[serde(flatten)]
    pub summary: Summary,
    /// Wall time of the rollout (`kubectl rollout status` returning), in seconds.
    pub rollout_s: f64,
    /// When the rollout started, in seconds since the load started (draws the window).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout_start_s: Option<f64>,
    /// Things that happened during the run (a pod deleted, an endpoint removed...), marked
    /// on the timeline so failures can be read against them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<Event>,
}

/// A labelled moment of a run, in seconds since the load started.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub t_s: f64,
    pub label: String,
}

impl Event {
    /// Parses `T=LABEL`. `T` is seconds since the load started, or a UNIX time (anything
    /// above 10^9; no run is that long), converted with the run's `started_at_unix_s`.
    pub fn parse(spec: &str, started_at_unix_s: f64) -> Result<Event, String> {
        let (t, label) = spec
            .split_once('=')
            .ok_or_else(|| format!("event {spec:?}: expected T=LABEL"))?;
        let t: f64 = t
            .trim()
            .parse()
            .map_err(|_| format!("event {spec:?}: {t:?} is not a number"))?;
        let t_s = if t > 1e9 {
            if started_at_unix_s <= 0.0 {
                return Err(format!(
                    "event {spec:?}: a UNIX time needs the run's started_at_unix_s"
                ));
            }
            t - started_at_unix_s
        } else {
            t
        };
        Ok(Event {
            t_s,
            label: label.trim().to_owned(),
        })
    }
}

/// `result.json`: `{"with": DemoRun, "without": DemoRun}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DemoResult {
    pub with: DemoRun,
    pub without: DemoRun,
}

/// Reads a loadgen result: a JSON file, or a captured log (`kubectl logs` of the loadgen
/// Job mixes stderr in) whose last line starting with `{` is the summary.
pub fn load_summary(path: &Path) -> Result<Summary, Error> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
        path: path.to_owned(),
        source,
    })?;
    match serde_json::from_str(&text) {
        Ok(summary) => Ok(summary),
        Err(whole) => text
            .lines()
            .rev()
            .find(|l| l.trim_start().starts_with('{'))
            .map(serde_json::from_str)
            .unwrap_or(Err(whole))
            .map_err(|source| Error::Parse {
                path: path.to_owned(),
                source,
            }),
    }
}

fn pct(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

/// The side-by-side table printed by `make demo`.
pub fn table(result: &DemoResult) -> String {
    columns(&[
        ("without kubegrace", &result.without),
        ("with kubegrace", &result.with),
    ])
}

/// The same table for any runs, one column each (`kubectl kubegrace verify` prints one):
/// requests, failed by reason, p50/p99, rollout duration; under it, per run, the failure
/// details and the pods that failed requests (the attribution).
pub fn columns(runs: &[(&str, &DemoRun)]) -> String {
    let mut rows: Vec<Vec<String>> = Vec::new();
    let mut row = |label: &str, cell: &dyn Fn(&DemoRun) -> String| {
        let mut r = vec![label.to_owned()];
        r.extend(runs.iter().map(|(_, run)| cell(run)));
        rows.push(r);
    };
    row("requests", &|r| r.summary.requests.to_string());
    row("failed", &|r| {
        format!(
            "{} ({:.2}%)",
            r.summary.failed,
            pct(r.summary.failed, r.summary.requests)
        )
    });
    for reason in Reason::FAILURES {
        row(&format!("  {reason}"), &|r| {
            r.summary.by_reason.get(reason).to_string()
        });
    }
    row("p50 latency", &|r| format!("{:.1} ms", r.summary.p50_ms));
    row("p99 latency", &|r| format!("{:.1} ms", r.summary.p99_ms));
    row("rollout duration", &|r| format!("{:.1} s", r.rollout_s));

    let mut head = vec![String::new()];
    head.extend(runs.iter().map(|(label, _)| (*label).to_owned()));
    let widths: Vec<usize> = (0..head.len())
        .map(|i| {
            rows.iter()
                .chain([&head])
                .map(|r| r[i].len())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    let mut line = |r: &[String]| {
        let cells: Vec<String> = r
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(i, (c, w))| {
                if i == 0 {
                    format!("{c:<w$}")
                } else {
                    format!("{c:>w$}")
                }
            })
            .collect();
        let _ = writeln!(out, "{}", cells.join("  "));
    };
    line(&head);
    line(&widths.iter().map(|w| "-".repeat(*w)).collect::<Vec<_>>());
    for r in &rows {
        line(r);
    }
    // Failure details tell *why*; list them under the table (the few that exist).
    for (label, run) in runs {
        let label = label.trim_end_matches(" kubegrace");
        for (detail, n) in &run.summary.by_detail {
            let _ = writeln!(out, "{label}: {n} x {detail}");
        }
        let pods: Vec<String> = run
            .summary
            .by_pod
            .iter()
            .filter(|(_, p)| p.failed > 0)
            .map(|(pod, p)| format!("{pod} {}", p.failed))
            .collect();
        if !pods.is_empty() {
            let _ = writeln!(out, "{label}: failed by pod: {}", pods.join(", "));
        }
        // Mixed-protocol runs: which kind of traffic lost requests.
        if run.summary.by_kind.len() > 1 {
            let kinds: Vec<String> = run
                .summary
                .by_kind
                .iter()
                .filter(|(_, k)| k.failed > 0)
                .map(|(kind, k)| format!("{kind} {}/{}", k.failed, k.requests))
                .collect();
            if !kinds.is_empty() {
                let _ = writeln!(out, "{label}: failed by kind: {}", kinds.join(", "));
            }
        }
    }
    out
}

/// Colors per reason (ok green; failures warm and distinct).
fn color(reason: Reason) -> &'static str {
    match reason {
        Reason::Ok => "#43a047",
        Reason::Refused => "#e53935",
        Reason::Reset => "#fb8c00",
        Reason::Http5xx => "#8e24aa",
        Reason::Timeout => "#6d4c41",
        Reason::Other => "#757575",
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// 1, 2, 5 x 10^k at or above `v` (axis maximum).
fn nice_ceil(v: f64) -> f64 {
    if v <= 1.0 {
        return 1.0;
    }
    let mag = 10f64.powf(v.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|c| *c >= v)
        .unwrap_or(10.0 * mag)
}

const WIDTH: f64 = 960.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 24.0;
const PLOT_H: f64 = 170.0;
/// Panel title above the plot, axis labels and the failure strip below it.
const PANEL_H: f64 = PLOT_H + 110.0;
const TOP: f64 = 76.0;

/// `rollout.svg`: per-second outcomes of both runs, stacked bars, one panel each, on the
/// same axes so the two are comparable. Failures are a thin share of a second's requests,
/// so every second with a failure is also marked in a red strip under the axis.
pub fn svg(result: &DemoResult) -> String {
    let runs = [
        ("without kubegrace", &result.without),
        ("with kubegrace", &result.with),
    ];
    let seconds = runs
        .iter()
        .map(|(_, r)| r.summary.timeline.len())
        .max()
        .unwrap_or(0)
        .max(1);
    let peak = runs
        .iter()
        .flat_map(|(_, r)| r.summary.timeline.iter().map(|s| s.ok + s.failed))
        .max()
        .unwrap_or(0);
    let y_max = nice_ceil(peak as f64);
    let height = TOP + 2.0 * PANEL_H + 8.0;
    let plot_w = WIDTH - LEFT - RIGHT;
    let bar_w = plot_w / seconds as f64;

    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="Helvetica, Arial, sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        s,
        r##"<rect x="0" y="0" width="{WIDTH}" height="{height}" fill="#ffffff"/>"##
    );
    let _ = writeln!(
        s,
        r##"<text x="{LEFT}" y="26" font-size="17" font-weight="bold" fill="#212121">Requests per second during a rolling update, by outcome</text>"##
    );
    // Legend.
    let mut x = LEFT;
    for reason in Reason::ALL {
        let _ = writeln!(
            s,
            r#"<rect x="{x}" y="42" width="12" height="12" fill="{}"/>"#,
            color(reason)
        );
        let _ = writeln!(
            s,
            r##"<text x="{}" y="52" fill="#212121">{}</text>"##,
            x + 16.0,
            reason
        );
        x += 24.0 + 8.0 * reason.as_str().len() as f64 + 16.0;
    }
    let _ = writeln!(
        s,
        r##"<rect x="{x}" y="42" width="12" height="12" fill="#1e88e5" fill-opacity="0.25"/>"##
    );
    let _ = writeln!(
        s,
        r##"<rect x="{x}" y="42" width="12" height="4" fill="#1e88e5"/>"##
    );
    let _ = writeln!(
        s,
        r##"<text x="{}" y="52" fill="#212121">rollout</text>"##,
        x + 16.0
    );

    for (i, (label, run)) in runs.iter().enumerate() {
        let top = TOP + i as f64 * PANEL_H;
        let plot_top = top + 50.0;
        let base = plot_top + PLOT_H;
        let sm = &run.summary;
        let mut reasons = String::new();
        for reason in Reason::FAILURES {
            let n = sm.by_reason.get(reason);
            if n > 0 {
                let _ = write!(
                    reasons,
                    "{}{reason} {n}",
                    if reasons.is_empty() { "" } else { ", " }
                );
            }
        }
        // Two lines, so a run that failed for every reason still fits the width.
        let title = format!("{label}: {} of {} requests failed", sm.failed, sm.requests);
        let mut facts = Vec::new();
        if !reasons.is_empty() {
            facts.push(reasons);
        }
        facts.push(format!("rollout {:.1} s", run.rollout_s));
        facts.push(format!("p50 {:.1} ms, p99 {:.1} ms", sm.p50_ms, sm.p99_ms));
        let title_color = if sm.failed > 0 { "#c62828" } else { "#2e7d32" };
        let _ = writeln!(
            s,
            r#"<text x="{LEFT}" y="{}" font-size="14" font-weight="bold" fill="{title_color}">{}</text>"#,
            top + 16.0,
            esc(&title)
        );
        let _ = writeln!(
            s,
            r##"<text x="{LEFT}" y="{}" font-size="12" fill="#424242">{}</text>"##,
            top + 32.0,
            esc(&facts.join("  ·  "))
        );
        // Grid and y labels.
        let y_step = nice_ceil(y_max / 5.0);
        let ticks = (y_max / y_step).round().max(1.0) as usize;
        for k in 0..=ticks {
            let v = y_step * k as f64;
            let y = base - PLOT_H * v / y_max;
            let _ = writeln!(
                s,
                r##"<line x1="{LEFT}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#e0e0e0"/>"##,
                LEFT + plot_w
            );
            let _ = writeln!(
                s,
                r##"<text x="{}" y="{:.1}" text-anchor="end" fill="#616161" font-size="11">{v}</text>"##,
                LEFT - 6.0,
                y + 4.0
            );
        }
        let _ = writeln!(
            s,
            r##"<text x="14" y="{:.1}" fill="#616161" font-size="11" transform="rotate(-90 14 {:.1})" text-anchor="middle">requests/s</text>"##,
            plot_top + PLOT_H / 2.0,
            plot_top + PLOT_H / 2.0
        );
        // Bars: ok at the bottom, failures stacked on top, each at least 2 px tall so a
        // single failure stays visible next to hundreds of successes.
        let gap = if bar_w > 4.0 { 1.0 } else { 0.0 };
        for sec in &sm.timeline {
            let x = LEFT + sec.t as f64 * bar_w;
            let mut y = base;
            let ok_h = PLOT_H * sec.ok as f64 / y_max;
            if sec.ok > 0 {
                y -= ok_h;
                let _ = writeln!(
                    s,
                    r#"<rect x="{x:.1}" y="{y:.1}" width="{:.1}" height="{ok_h:.1}" fill="{}"><title>t={}s ok {}</title></rect>"#,
                    (bar_w - gap).max(0.5),
                    color(Reason::Ok),
                    sec.t,
                    sec.ok
                );
            }
            for reason in Reason::FAILURES {
                let n = sec.failed_by_reason.get(reason);
                if n == 0 {
                    continue;
                }
                let h = (PLOT_H * n as f64 / y_max).max(2.0);
                y -= h;
                let _ = writeln!(
                    s,
                    r#"<rect x="{x:.1}" y="{y:.1}" width="{:.1}" height="{h:.1}" fill="{}"><title>t={}s {reason} {n}</title></rect>"#,
                    (bar_w - gap).max(0.5),
                    color(reason),
                    sec.t
                );
            }
            if sec.failed > 0 {
                let _ = writeln!(
                    s,
                    r##"<rect x="{x:.1}" y="{:.1}" width="{:.1}" height="6" fill="#e53935"/>"##,
                    base + 3.0,
                    bar_w.max(1.0)
                );
            }
        }
        // Rollout window, drawn over the bars (a constant rate fills the plot, so anything
        // behind them would be hidden): a tint, dashed edges, and a band above the plot.
        if let Some(start) = run.rollout_start_s {
            let x0 = LEFT + (start.max(0.0) * bar_w).min(plot_w);
            let x1 = LEFT + ((start + run.rollout_s).max(0.0) * bar_w).min(plot_w);
            let w = (x1 - x0).max(1.0);
            let _ = writeln!(
                s,
                r##"<rect x="{x0:.1}" y="{plot_top}" width="{w:.1}" height="{PLOT_H}" fill="#1e88e5" fill-opacity="0.12"/>"##
            );
            for x in [x0, x0 + w] {
                let _ = writeln!(
                    s,
                    r##"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{base}" stroke="#1565c0" stroke-width="2" stroke-dasharray="6 4"/>"##,
                    plot_top - 10.0
                );
            }
            let _ = writeln!(
                s,
                r##"<rect x="{x0:.1}" y="{:.1}" width="{w:.1}" height="6" fill="#1e88e5"/>"##,
                plot_top - 10.0
            );
            let _ = writeln!(
                s,
                r##"<text x="{:.1}" y="{:.1}" fill="#1565c0" font-size="11">rollout {:.1} s</text>"##,
                x0 + w + 4.0,
                plot_top - 3.0,
                run.rollout_s
            );
        }
        // Events: thin dark lines across the plot, labels staggered over three rows so
        // events close together (several pods deleted in a second) stay readable.
        for (k, event) in run.events.iter().enumerate() {
            if !(0.0..=seconds as f64).contains(&event.t_s) {
                continue;
            }
            let x = LEFT + event.t_s * bar_w;
            let _ = writeln!(
                s,
                r##"<line x1="{x:.1}" y1="{plot_top}" x2="{x:.1}" y2="{base}" stroke="#212121" stroke-width="1.2" stroke-opacity="0.8"/>"##
            );
            // Near the bottom: the top of the bars is where failures show.
            let y = base - 10.0 - 14.0 * (k % 3) as f64;
            // Labels right of the line, or left of it in the right third of the plot.
            let (tx, anchor) = if x > LEFT + plot_w * 0.66 {
                (x - 3.0, "end")
            } else {
                (x + 3.0, "start")
            };
            let _ = writeln!(
                s,
                r##"<text x="{tx:.1}" y="{y:.1}" text-anchor="{anchor}" fill="#212121" font-size="11" stroke="#ffffff" stroke-width="3" paint-order="stroke">{}</text>"##,
                esc(&event.label)
            );
        }
        // Axes and x labels (about ten ticks whatever the length).
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{base}" x2="{}" y2="{base}" stroke="#424242"/>"##,
            LEFT + plot_w
        );
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{plot_top}" x2="{LEFT}" y2="{base}" stroke="#424242"/>"##
        );
        let step = nice_ceil(seconds as f64 / 10.0).max(1.0) as usize;
        for t in (0..=seconds).step_by(step) {
            let x = LEFT + t as f64 * bar_w;
            let _ = writeln!(
                s,
                r##"<line x1="{x:.1}" y1="{base}" x2="{x:.1}" y2="{}" stroke="#424242"/>"##,
                base + 3.0
            );
            let _ = writeln!(
                s,
                r##"<text x="{x:.1}" y="{}" text-anchor="middle" fill="#616161" font-size="11">{t}s</text>"##,
                base + 22.0
            );
        }
        let _ = writeln!(
            s,
            r##"<text x="{}" y="{}" text-anchor="end" fill="#616161" font-size="11">seconds since the load started (red strip: seconds with failures)</text>"##,
            LEFT + plot_w,
            base + 38.0
        );
    }
    s.push_str("</svg>\n");
    s
}

/// Writes `result.json` and `rollout.svg` into `dir` (created if needed).
pub fn write(dir: &Path, result: &DemoResult) -> Result<(PathBuf, PathBuf), Error> {
    std::fs::create_dir_all(dir).map_err(|source| Error::Write {
        path: dir.to_owned(),
        source,
    })?;
    let json_path = dir.join("result.json");
    let json = serde_json::to_string_pretty(result)?;
    std::fs::write(&json_path, json + "\n").map_err(|source| Error::Write {
        path: json_path.clone(),
        source,
    })?;
    let svg_path = dir.join("rollout.svg");
    std::fs::write(&svg_path, svg(result)).map_err(|source| Error::Write {
        path: svg_path.clone(),
        source,
    })?;
    Ok((json_path, svg_path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_axis_maxima() {
        assert_eq!(nice_ceil(0.0), 1.0);
        assert_eq!(nice_ceil(87.0), 100.0);
        assert_eq!(nice_ceil(101.0), 200.0);
        assert_eq!(nice_ceil(3.0), 5.0);
    }

    #[test]
    fn events_parse_offsets_and_unix_times() {
        assert_eq!(
            Event::parse("12.5=pod web-1 deleted", 0.0),
            Ok(Event {
                t_s: 12.5,
                label: "pod web-1 deleted".into()
            })
        );
        let e = Event::parse("1764460010.5 = endpoint removed", 1_764_460_000.0).expect("valid");
        assert_eq!((e.t_s, e.label.as_str()), (10.5, "endpoint removed"));
        assert!(Event::parse("1764460010=x", 0.0).is_err());
        assert!(Event::parse("soon=x", 0.0).is_err());
        assert!(Event::parse("no label", 0.0).is_err());
    }

    fn run(failed_on: &[(&str, u64)]) -> DemoRun {
        let mut summary = Summary {
            requests: 100,
            ..Summary::default()
        };
        for (pod, n) in failed_on {
            summary.failed += n;
            summary.by_reason.reset += n;
            let p = summary.by_pod.entry((*pod).to_owned()).or_default();
            p.failed = *n;
        }
        DemoRun {
            summary,
            rollout_s: 4.2,
            rollout_start_s: None,
            events: Vec::new(),
        }
    }

    #[test]
    fn one_column_per_run_and_the_failures_under_it_by_pod() {
        let plain = run(&[("web-a", 2), ("web-b", 1)]);
        let out = columns(&[("deploy/web", &plain)]);
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines[0].trim_end().ends_with("deploy/web"), "{out}");
        let cell = |label: &str| {
            lines
                .iter()
                .find_map(|l| l.strip_prefix(label))
                .map(str::trim)
                .unwrap_or("")
                .to_owned()
        };
        assert_eq!(cell("failed "), "3 (3.00%)", "{out}");
        assert_eq!(cell("  reset "), "3", "{out}");
        assert_eq!(cell("rollout duration "), "4.2 s", "{out}");
        assert!(
            out.contains("deploy/web: failed by pod: web-a 2, web-b 1"),
            "{out}"
        );
        assert!(!columns(&[("x", &run(&[]))]).contains("failed by pod"));
        // The demo's two columns keep their labels.
        let both = table(&DemoResult {
            with: run(&[]),
            without: plain,
        });
        assert!(
            both.lines()
                .next()
                .unwrap_or("")
                .contains("without kubegrace  with kubegrace"),
            "{both}"
        );
        assert!(
            both.contains("without: failed by pod: web-a 2, web-b 1"),
            "{both}"
        );
    }

    #[test]
    fn escapes_text() {
        assert_eq!(esc(r#"a<b & "c">"#), "a&lt;b &amp; &quot;c&quot;&gt;");
    }
}
