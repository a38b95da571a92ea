//! The results file (`bench/results/latest.json`) and what is generated
//! from it: the README tables and the SVG plot. Rendering is pure, so the
//! report can be re-generated from a saved JSON without re-running load.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::peers::Peer;
use crate::scenario::{FIXED_RATE, KEEPALIVE_64, KEEPALIVE_256, SCENARIOS};
use crate::stats::Spread;

/// One round of one scenario against one peer.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    pub rps: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: Option<f64>,
    pub requests: u64,
    pub errors: u64,
    /// CPU seconds the proxy used during the round (none for direct).
    pub cpu_s: Option<f64>,
    pub wall_s: f64,
    /// Proxy VmRSS sampled near the end of the round, while loaded.
    pub rss_kib: Option<u64>,
}

/// How a peer compares with a reference peer (direct or nginx), medians.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Compare {
    /// peer / reference: above 1 is more throughput.
    pub rps: f64,
    /// peer / reference: above 1 is slower.
    pub p50: f64,
    pub p99: f64,
    pub p50_added_ms: f64,
    pub p99_added_ms: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p999_added_ms: Option<f64>,
    /// peer / reference; absent against direct (no proxy, no RSS).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rss_kib: Option<f64>,
}

/// All rounds of one scenario against one peer, summarised.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cell {
    pub rounds: usize,
    pub rps: Spread,
    pub p50_ms: Spread,
    pub p99_ms: Spread,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p999_ms: Option<Spread>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rss_kib: Option<Spread>,
    /// Proxy CPU seconds per 100,000 requests.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_s_per_100k: Option<Spread>,
    /// Share of one core the proxy used (1.0 = its core was saturated).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proxy_cpu: Option<Spread>,
    /// Requests per proxy CPU-second: throughput per core, whichever side
    /// of the machine was the bottleneck.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rps_per_core: Option<Spread>,
    pub requests: u64,
    pub errors: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vs_direct: Option<Compare>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vs_nginx: Option<Compare>,
    pub samples: Vec<Sample>,
}

impl Cell {
    pub fn from_samples(samples: Vec<Sample>) -> Option<Cell> {
        let col = |f: &dyn Fn(&Sample) -> Option<f64>| -> Option<Spread> {
            Spread::of(
                &samples
                    .iter()
                    .map(|s| f(s).unwrap_or(f64::NAN))
                    .collect::<Vec<_>>(),
            )
        };
        Some(Cell {
            rounds: samples.len(),
            rps: col(&|s| Some(s.rps))?,
            p50_ms: col(&|s| Some(s.p50_ms))?,
            p99_ms: col(&|s| Some(s.p99_ms))?,
            p999_ms: col(&|s| s.p999_ms),
            rss_kib: col(&|s| s.rss_kib.map(|r| r as f64)),
            cpu_s_per_100k: col(&|s| {
                let cpu = s.cpu_s?;
                (s.requests > 0).then(|| cpu / s.requests as f64 * 100_000.0)
            }),
            proxy_cpu: col(&|s| Some(s.cpu_s? / s.wall_s)),
            rps_per_core: col(&|s| {
                let cpu = s.cpu_s?;
                (cpu > 0.0).then(|| s.requests as f64 / cpu)
            }),
            requests: samples.iter().map(|s| s.requests).sum(),
            errors: samples.iter().map(|s| s.errors).sum(),
            vs_direct: None,
            vs_nginx: None,
            samples,
        })
    }

    pub fn compare(&self, reference: &Cell) -> Compare {
        let rss = match (self.rss_kib, reference.rss_kib) {
            (Some(a), Some(b)) if b.median > 0.0 => Some(a.median / b.median),
            _ => None,
        };
        let p999 = match (self.p999_ms, reference.p999_ms) {
            (Some(a), Some(b)) => Some(
                self.paired_added(reference, |s| s.p999_ms)
                    .unwrap_or(a.median - b.median),
            ),
            _ => None,
        };
        Compare {
            rps: self.rps.median / reference.rps.median,
            p50: self.p50_ms.median / reference.p50_ms.median,
            p99: self.p99_ms.median / reference.p99_ms.median,
            p50_added_ms: self
                .paired_added(reference, |s| Some(s.p50_ms))
                .unwrap_or(self.p50_ms.median - reference.p50_ms.median),
            p99_added_ms: self
                .paired_added(reference, |s| Some(s.p99_ms))
                .unwrap_or(self.p99_ms.median - reference.p99_ms.median),
            p999_added_ms: p999,
            rss_kib: rss,
        }
    }

    /// Latency added over the reference, paired by round: the median over
    /// rounds of (this peer's figure - the reference's figure in the same
    /// round). Both ran in the same round, minutes apart at most, so a
    /// noisy stretch of the machine shows in both and cancels, where the
    /// difference of two medians can pair a quiet round with a noisy one.
    fn paired_added(&self, reference: &Cell, pick: impl Fn(&Sample) -> Option<f64>) -> Option<f64> {
        if self.samples.len() != reference.samples.len() || self.samples.is_empty() {
            return None;
        }
        let diffs = self
            .samples
            .iter()
            .zip(&reference.samples)
            .map(|(a, b)| Some(pick(a)? - pick(b)?))
            .collect::<Option<Vec<f64>>>()?;
        Spread::of(&diffs).map(|s| s.median)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScenarioResult {
    pub id: String,
    pub title: String,
    /// Keyed by peer name.
    pub peers: BTreeMap<String, Cell>,
}

/// Memory of one proxy, KiB, summed over its processes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Memory {
    /// After start-up and one request, before any load.
    pub idle_rss_kib: u64,
    /// Sampled near the end of each 256-connection round (median of rounds).
    pub loaded_rss_kib: Option<Spread>,
    /// VmHWM after all load: the most it ever held.
    pub peak_rss_kib: u64,
}

/// One drain test against one peer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DrainResult {
    pub test: String,
    pub peer: String,
    /// How the stop was requested (`kill -TERM`, `nginx -s quit`, ...).
    pub how: String,
    /// From the stop command to the process exit, ms; None when it did not
    /// exit within the harness's bound (then `timed_out` rounds count it).
    pub exit_ms: Option<Spread>,
    pub timed_out: u32,
    pub rounds: u32,
    /// Median over rounds of connections the proxy closed (idle test) and
    /// slow requests answered 2xx / failed (slow test).
    pub closed_by_proxy: u32,
    pub ok: u32,
    pub failed: u32,
    pub connections: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Settings {
    pub seconds: u32,
    pub rounds: u32,
    pub rate: u32,
    pub proxy_cpus: String,
    pub load_cpus: String,
    pub drain_idle: u32,
    pub drain_slow: u32,
    pub drain_slow_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub generated_at: String,
    pub git_rev: String,
    pub machine: BTreeMap<String, String>,
    pub settings: Settings,
    pub versions: BTreeMap<String, String>,
    /// Peers that could not be measured, and why.
    pub unavailable: BTreeMap<String, String>,
    pub scenarios: Vec<ScenarioResult>,
    pub memory: BTreeMap<String, Memory>,
    pub drain: Vec<DrainResult>,
    /// One line per target of the issue: met, or missed by how much.
    pub verdicts: Vec<String>,
    pub wall_seconds: f64,
}

/// Fills `vs_direct` and `vs_nginx` in every cell.
pub fn add_comparisons(scenarios: &mut [ScenarioResult]) {
    for s in scenarios {
        let direct = s.peers.get(Peer::Direct.name()).cloned();
        let nginx = s.peers.get(Peer::Nginx.name()).cloned();
        for cell in s.peers.values_mut() {
            cell.vs_direct = direct.as_ref().map(|d| cell.compare(d));
            cell.vs_nginx = nginx.as_ref().map(|n| cell.compare(n));
        }
    }
}

impl Report {
    pub fn scenario(&self, id: &str) -> Option<&ScenarioResult> {
        self.scenarios.iter().find(|s| s.id == id)
    }

    /// Peer names in report order, only those with any result.
    pub fn peers(&self) -> Vec<&'static str> {
        Peer::ALL
            .iter()
            .map(|p| p.name())
            .filter(|n| self.scenarios.iter().any(|s| s.peers.contains_key(*n)))
            .collect()
    }

    /// The issue's targets, judged on the medians.
    pub fn judge(&self) -> Vec<String> {
        let r: &Report = self;
        let mut verdicts = Vec::new();
        let us = Peer::Kubegrace.name();
        let others = [Peer::Nginx, Peer::Haproxy, Peer::Caddy].map(|p| p.name());
        // (what, value of a peer, higher is better)
        type Metric<'a> = (
            String,
            Box<dyn Fn(&str) -> Option<f64> + 'a>,
            bool,
            &'static str,
        );
        let mut metrics: Vec<Metric> = Vec::new();
        for id in [KEEPALIVE_64, KEEPALIVE_256] {
            let Some(title) = r.scenario(id).map(|s| s.title.clone()) else {
                continue;
            };
            metrics.push((
                format!("throughput per proxy core, {title}"),
                Box::new(move |p| r.scenario(id)?.peers.get(p)?.rps_per_core.map(|s| s.median)),
                true,
                "req/CPU-s",
            ));
            metrics.push((
                format!("throughput, {title}"),
                Box::new(move |p| Some(r.scenario(id)?.peers.get(p)?.rps.median)),
                true,
                "req/s",
            ));
        }
        if r.scenario(FIXED_RATE).is_some() {
            metrics.push((
                "p99 latency added over direct at a fixed rate".into(),
                Box::new(move |p| {
                    r.scenario(FIXED_RATE)?
                        .peers
                        .get(p)?
                        .vs_direct
                        .as_ref()
                        .map(|c| c.p99_added_ms)
                }),
                false,
                "ms",
            ));
        }
        metrics.push((
            "idle memory (VmRSS)".into(),
            Box::new(move |p| Some(r.memory.get(p)?.idle_rss_kib as f64)),
            false,
            "KiB",
        ));
        metrics.push((
            "memory under 256 connections (VmRSS)".into(),
            Box::new(move |p| Some(r.memory.get(p)?.loaded_rss_kib?.median)),
            false,
            "KiB",
        ));
        for (what, value, higher_better, unit) in &metrics {
            let Some(ours) = value(us) else {
                verdicts.push(format!("{what}: kubegrace not measured"));
                continue;
            };
            let best = others
                .iter()
                .filter_map(|p| Some((*p, value(p)?)))
                .max_by(|a, b| {
                    let o = a.1.total_cmp(&b.1);
                    if *higher_better { o } else { o.reverse() }
                });
            let Some((best_name, best_value)) = best else {
                verdicts.push(format!("{what}: no other proxy measured"));
                continue;
            };
            let we_win = if *higher_better {
                ours >= best_value
            } else {
                ours <= best_value
            };
            let pct = if best_value.abs() > f64::EPSILON {
                ((ours - best_value) / best_value.abs() * 100.0).abs()
            } else {
                0.0
            };
            let cmp = if we_win { "MET" } else { "MISSED" };
            if *unit == "ms" {
                // Added latency can be near zero or negative (noise), where a
                // percentage means nothing: say it in milliseconds.
                verdicts.push(format!(
                    "{cmp}: {what}: kubegrace {ours:+.3} ms, the best other proxy ({best_name}) {best_value:+.3} ms: \
                     {:+.3} ms",
                    ours - best_value
                ));
                continue;
            }
            let dir = match (we_win, *higher_better) {
                (true, true) => "ahead of",
                (true, false) => "below",
                (false, true) => "behind",
                (false, false) => "above",
            };
            verdicts.push(format!(
                "{cmp}: {what}: kubegrace {} {unit}, {pct:.1}% {dir} the best other proxy ({best_name}, {} {unit})",
                num(ours),
                num(best_value)
            ));
        }
        verdicts
    }
}

/// A number for people: 3 significant digits-ish, no exponent.
pub fn num(x: f64) -> String {
    let a = x.abs();
    if a == 0.0 {
        "0".into()
    } else if a >= 1_000_000.0 {
        format!("{:.2}M", x / 1_000_000.0)
    } else if a >= 10_000.0 {
        format!("{:.1}k", x / 1000.0)
    } else if a >= 10.0 {
        format!("{x:.0}")
    } else if a >= 1.0 {
        format!("{x:.2}")
    } else {
        format!("{x:.3}")
    }
}

fn spread(s: &Spread) -> String {
    format!("{} [{}–{}]", num(s.median), num(s.min), num(s.max))
}

fn ms(x: f64) -> String {
    format!("{x:.3}")
}

/// The generated part of bench/README.md.
pub fn markdown(r: &Report) -> String {
    let mut m = String::new();
    let peers = r.peers();
    let st = &r.settings;
    let _ = writeln!(
        m,
        "Generated by `make bench` at {} (git {}), {:.0} s wall clock. Each figure is the median of {} rounds of {} s, \
         [min–max] after it. Proxies pinned to CPU {}, load generator and upstream to CPU {}. \
         Load average at start / end: {} / {}.\n",
        r.generated_at,
        r.git_rev,
        r.wall_seconds,
        st.rounds,
        st.seconds,
        st.proxy_cpus,
        st.load_cpus,
        r.machine.get("loadavg_start").map_or("?", String::as_str),
        r.machine.get("loadavg_end").map_or("?", String::as_str),
    );
    if !r.unavailable.is_empty() {
        let _ = writeln!(m, "Not measured in this run:\n");
        for (p, why) in &r.unavailable {
            let _ = writeln!(m, "- {p}: {why}");
        }
        let _ = writeln!(m);
    }
    if !r.verdicts.is_empty() {
        let _ = writeln!(m, "### Targets\n");
        for v in &r.verdicts {
            let _ = writeln!(m, "- {v}");
        }
        let _ = writeln!(m);
    }

    let header = |m: &mut String, first: &str, cols: &[&str]| {
        let _ = writeln!(m, "| {first} | {} |", cols.join(" | "));
        let _ = writeln!(m, "|---|{}", "---:|".repeat(cols.len()));
    };
    let saturation: Vec<&ScenarioResult> = r
        .scenarios
        .iter()
        .filter(|s| SCENARIOS.iter().any(|d| d.id == s.id && d.is_saturation()))
        .collect();

    let _ = writeln!(m, "### Throughput at saturation, requests/s\n");
    header(&mut m, "scenario", &peers);
    for s in &saturation {
        let cells: Vec<String> = peers
            .iter()
            .map(|p| s.peers.get(*p).map_or("–".into(), |c| spread(&c.rps)))
            .collect();
        let _ = writeln!(m, "| {} | {} |", s.title, cells.join(" | "));
    }
    let _ = writeln!(
        m,
        "\n### Throughput relative to direct / to nginx (medians)\n"
    );
    header(&mut m, "scenario", &peers);
    for s in &saturation {
        let cells: Vec<String> = peers
            .iter()
            .map(|p| {
                let Some(c) = s.peers.get(*p) else {
                    return "–".into();
                };
                let d = c
                    .vs_direct
                    .as_ref()
                    .map_or("–".into(), |x| format!("{:.2}", x.rps));
                let n = c
                    .vs_nginx
                    .as_ref()
                    .map_or("–".into(), |x| format!("{:.2}", x.rps));
                format!("{d} / {n}")
            })
            .collect();
        let _ = writeln!(m, "| {} | {} |", s.title, cells.join(" | "));
    }
    let proxies: Vec<&str> = peers
        .iter()
        .copied()
        .filter(|p| *p != Peer::Direct.name())
        .collect();
    let _ = writeln!(
        m,
        "\n### Throughput per proxy core: requests per CPU-second of the proxy (share of its core used)\n"
    );
    header(&mut m, "scenario", &proxies);
    for s in &saturation {
        let cells: Vec<String> = proxies
            .iter()
            .map(|p| {
                let Some(c) = s.peers.get(*p) else {
                    return "–".into();
                };
                match (c.rps_per_core, c.proxy_cpu) {
                    (Some(r), Some(u)) => format!("{} ({:.0}%)", spread(&r), u.median * 100.0),
                    _ => "–".into(),
                }
            })
            .collect();
        let _ = writeln!(m, "| {} | {} |", s.title, cells.join(" | "));
    }
    let _ = writeln!(m, "\n### Proxy CPU seconds per 100,000 requests\n");
    header(&mut m, "scenario", &proxies);
    for s in &r.scenarios {
        let cells: Vec<String> = proxies
            .iter()
            .map(|p| {
                s.peers
                    .get(*p)
                    .and_then(|c| c.cpu_s_per_100k)
                    .map_or("–".into(), |x| spread(&x))
            })
            .collect();
        let _ = writeln!(m, "| {} | {} |", s.title, cells.join(" | "));
    }
    let _ = writeln!(
        m,
        "\n### Latency at saturation (closed loop), p50 / p99 ms\n"
    );
    header(&mut m, "scenario", &peers);
    for s in &saturation {
        let cells: Vec<String> = peers
            .iter()
            .map(|p| {
                s.peers.get(*p).map_or("–".into(), |c| {
                    format!("{} / {}", ms(c.p50_ms.median), ms(c.p99_ms.median))
                })
            })
            .collect();
        let _ = writeln!(m, "| {} | {} |", s.title, cells.join(" | "));
    }
    if let Some(s) = r.scenario(FIXED_RATE) {
        let _ = writeln!(
            m,
            "\n### Latency at a fixed {} requests/s (well below saturation), ms\n",
            st.rate
        );
        let _ = writeln!(
            m,
            "| peer | p50 | p99 | p99.9 | added p50 | added p99 | added p99.9 | errors |\n|---|---:|---:|---:|---:|---:|---:|---:|"
        );
        for p in &peers {
            let Some(c) = s.peers.get(*p) else { continue };
            let (a50, a99, a999) =
                c.vs_direct
                    .as_ref()
                    .map_or(("–".into(), "–".into(), "–".into()), |d| {
                        (
                            format!("{:+.3}", d.p50_added_ms),
                            format!("{:+.3}", d.p99_added_ms),
                            d.p999_added_ms.map_or("–".into(), |x| format!("{x:+.3}")),
                        )
                    });
            let _ = writeln!(
                m,
                "| {p} | {} | {} | {} | {a50} | {a99} | {a999} | {} |",
                spread3(&c.p50_ms),
                spread3(&c.p99_ms),
                c.p999_ms.as_ref().map_or("–".into(), spread3),
                c.errors
            );
        }
    }
    let _ = writeln!(
        m,
        "\n### Memory, VmRSS summed over the proxy's processes, KiB\n"
    );
    let _ = writeln!(
        m,
        "| proxy | idle | loaded (256 connections) | peak (VmHWM) | loaded vs nginx |\n|---|---:|---:|---:|---:|"
    );
    let nginx_loaded = r
        .memory
        .get(Peer::Nginx.name())
        .and_then(|x| x.loaded_rss_kib)
        .map(|s| s.median);
    for p in &proxies {
        let Some(mem) = r.memory.get(*p) else {
            continue;
        };
        let loaded = mem.loaded_rss_kib;
        let ratio = match (loaded, nginx_loaded) {
            (Some(l), Some(n)) if n > 0.0 => format!("{:.2}", l.median / n),
            _ => "–".into(),
        };
        let _ = writeln!(
            m,
            "| {p} | {} | {} | {} | {ratio} |",
            mem.idle_rss_kib,
            loaded.map_or("–".into(), |s| format!(
                "{:.0} [{:.0}–{:.0}]",
                s.median, s.min, s.max
            )),
            mem.peak_rss_kib
        );
    }
    if !r.drain.is_empty() {
        let _ = writeln!(
            m,
            "\n### Drain: time from the stop command to process exit, ms\n\n\
             {} idle keep-alive connections; {} in-flight requests the upstream holds for {} ms.\n",
            st.drain_idle, st.drain_slow, st.drain_slow_ms
        );
        let _ = writeln!(
            m,
            "| test | proxy | stop command | exit ms | did not exit | closed by proxy | answered | failed |\n|---|---|---|---:|---:|---:|---:|---:|"
        );
        for d in &r.drain {
            let _ = writeln!(
                m,
                "| {} | {} | `{}` | {} | {}/{} | {} | {} | {} |",
                d.test,
                d.peer,
                d.how,
                d.exit_ms.as_ref().map_or("–".into(), spread),
                d.timed_out,
                d.rounds,
                d.closed_by_proxy,
                d.ok,
                d.failed
            );
        }
    }
    m
}

fn spread3(s: &Spread) -> String {
    format!("{} [{}–{}]", ms(s.median), ms(s.min), ms(s.max))
}

/// Replaces what lies between the markers in `readme` with `generated`.
pub fn splice_readme(readme: &str, generated: &str) -> Option<String> {
    const BEGIN: &str = "<!-- results:begin -->";
    const END: &str = "<!-- results:end -->";
    let start = readme.find(BEGIN)? + BEGIN.len();
    let end = readme.find(END)?;
    (start <= end).then(|| {
        format!(
            "{}\n{}\n{}",
            &readme[..start],
            generated.trim_end(),
            &readme[end..]
        )
    })
}

const COLOURS: [(&str, &str); 6] = [
    ("direct", "#9e9e9e"),
    ("kubegrace", "#1b7f3b"),
    ("kubegrace+cb", "#6cc38a"),
    ("nginx", "#2f6db5"),
    ("haproxy", "#c0392b"),
    ("caddy", "#e69f00"),
];

fn colour(peer: &str) -> &'static str {
    COLOURS
        .iter()
        .find(|(p, _)| *p == peer)
        .map_or("#444", |(_, c)| c)
}

/// One panel of grouped bars with min–max whiskers.
struct Panel<'a> {
    title: String,
    unit: &'a str,
    groups: Vec<(String, Vec<(&'a str, Spread)>)>,
}

/// The smallest 1, 2, 2.5 or 5 times a power of ten at or above `raw`:
/// axis ticks people can read.
fn nice_step(raw: f64) -> f64 {
    let exp = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0]
        .into_iter()
        .map(|m| m * exp)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * exp)
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn draw_panel(svg: &mut String, panel: &Panel, x0: f64, y0: f64, w: f64, h: f64) {
    let _ = writeln!(
        svg,
        r#"<text x="{x0}" y="{}" font-size="14" font-weight="bold">{}</text>"#,
        y0 - 8.0,
        esc(&panel.title)
    );
    let top = panel
        .groups
        .iter()
        .flat_map(|(_, bars)| bars.iter().map(|(_, s)| s.max.max(s.median)))
        .fold(0.0_f64, f64::max)
        .max(1e-9);
    let step = nice_step(top / 4.0);
    let ticks = (top / step).ceil().max(1.0) as u32;
    let max = step * f64::from(ticks);
    let _ = writeln!(
        svg,
        r##"<rect x="{x0}" y="{y0}" width="{w}" height="{h}" fill="none" stroke="#ccc"/>"##
    );
    for i in 0..=ticks {
        let v = step * f64::from(i);
        let y = y0 + h - h * v / max;
        let _ = writeln!(
            svg,
            r##"<line x1="{x0}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="#eee"/><text x="{}" y="{:.1}" font-size="10" text-anchor="end">{}</text>"##,
            x0 + w,
            x0 - 4.0,
            y + 3.0,
            num(v)
        );
    }
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="{}" font-size="10" transform="rotate(-90 {} {})" text-anchor="middle">{}</text>"#,
        x0 - 42.0,
        y0 + h / 2.0,
        x0 - 42.0,
        y0 + h / 2.0,
        esc(panel.unit)
    );
    let n = panel.groups.len().max(1) as f64;
    let gw = w / n;
    for (gi, (label, bars)) in panel.groups.iter().enumerate() {
        let gx = x0 + gw * gi as f64;
        let bw = (gw * 0.8) / bars.len().max(1) as f64;
        for (bi, (peer, s)) in bars.iter().enumerate() {
            let x = gx + gw * 0.1 + bw * bi as f64;
            let bh = h * s.median / max;
            let _ = writeln!(
                svg,
                r#"<rect x="{x:.1}" y="{:.1}" width="{:.1}" height="{bh:.1}" fill="{}"><title>{} {}: {}</title></rect>"#,
                y0 + h - bh,
                bw * 0.9,
                colour(peer),
                esc(label),
                peer,
                num(s.median)
            );
            let cx = x + bw * 0.45;
            let (ylo, yhi) = (y0 + h - h * s.min / max, y0 + h - h * s.max / max);
            let _ = writeln!(
                svg,
                r##"<line x1="{cx:.1}" x2="{cx:.1}" y1="{ylo:.1}" y2="{yhi:.1}" stroke="#000" stroke-width="1"/>"##
            );
        }
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{}" font-size="10" text-anchor="middle">{}</text>"#,
            gx + gw / 2.0,
            y0 + h + 14.0,
            esc(label)
        );
    }
}

/// The plot: throughput, added latency and memory, one colour per peer.
pub fn svg(r: &Report) -> String {
    let peers = r.peers();
    let mut panels = Vec::new();
    let short = |id: &str| match id {
        KEEPALIVE_64 => "keep-alive 64".to_string(),
        KEEPALIVE_256 => "keep-alive 256".to_string(),
        "h1-new-connection" => "new conn/request".to_string(),
        "h2-multiplexed" => "HTTP/2".to_string(),
        other => other.to_string(),
    };
    panels.push(Panel {
        title: "Throughput at saturation (median, min–max whiskers)".into(),
        unit: "requests/s",
        groups: r
            .scenarios
            .iter()
            .filter(|s| s.id != FIXED_RATE)
            .map(|s| {
                let bars = peers
                    .iter()
                    .filter_map(|p| Some((*p, s.peers.get(*p)?.rps)))
                    .collect();
                (short(&s.id), bars)
            })
            .collect(),
    });
    panels.push(Panel {
        title: "Throughput per proxy core (requests per proxy CPU-second)".into(),
        unit: "req/CPU-s",
        groups: r
            .scenarios
            .iter()
            .filter(|s| s.id != FIXED_RATE)
            .map(|s| {
                let bars = peers
                    .iter()
                    .filter_map(|p| Some((*p, s.peers.get(*p)?.rps_per_core?)))
                    .collect();
                (short(&s.id), bars)
            })
            .collect(),
    });
    if let Some(s) = r.scenario(FIXED_RATE) {
        let mut groups = Vec::new();
        for (label, pick) in [("p50", 0usize), ("p99", 1), ("p99.9", 2)] {
            let bars = peers
                .iter()
                .filter_map(|p| {
                    let c = s.peers.get(*p)?;
                    let spread = match pick {
                        0 => c.p50_ms,
                        1 => c.p99_ms,
                        _ => c.p999_ms?,
                    };
                    Some((*p, spread))
                })
                .collect();
            groups.push((label.to_string(), bars));
        }
        panels.push(Panel {
            title: format!("Latency at a fixed {} requests/s", r.settings.rate),
            unit: "ms",
            groups,
        });
    }
    let mem_groups = vec![
        (
            "idle".to_string(),
            peers
                .iter()
                .filter_map(|p| {
                    let v = r.memory.get(*p)?.idle_rss_kib as f64 / 1024.0;
                    Some((
                        *p,
                        Spread {
                            median: v,
                            min: v,
                            max: v,
                        },
                    ))
                })
                .collect(),
        ),
        (
            "256 connections".to_string(),
            peers
                .iter()
                .filter_map(|p| {
                    let s = r.memory.get(*p)?.loaded_rss_kib?;
                    Some((
                        *p,
                        Spread {
                            median: s.median / 1024.0,
                            min: s.min / 1024.0,
                            max: s.max / 1024.0,
                        },
                    ))
                })
                .collect(),
        ),
    ];
    panels.push(Panel {
        title: "Memory (VmRSS, summed over processes)".into(),
        unit: "MiB",
        groups: mem_groups,
    });

    let (pw, ph, left, top, gap) = (760.0, 200.0, 70.0, 70.0, 70.0);
    let height = top + (ph + gap) * panels.len() as f64;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{height}" font-family="sans-serif">"#,
        pw + left + 20.0
    );
    let _ = writeln!(
        svg,
        r#"<rect width="100%" height="100%" fill="white"/><text x="{left}" y="22" font-size="16" font-weight="bold">kubegrace bench: {} ({} rounds x {} s; proxy on CPU {})</text>"#,
        esc(&r.generated_at),
        r.settings.rounds,
        r.settings.seconds,
        esc(&r.settings.proxy_cpus)
    );
    for (i, p) in peers.iter().enumerate() {
        let x = left + 120.0 * i as f64;
        let _ = writeln!(
            svg,
            r#"<rect x="{x}" y="34" width="12" height="12" fill="{}"/><text x="{}" y="44" font-size="12">{p}</text>"#,
            colour(p),
            x + 16.0
        );
    }
    for (i, panel) in panels.iter().enumerate() {
        draw_panel(
            &mut svg,
            panel,
            left,
            top + 20.0 + (ph + gap) * i as f64,
            pw,
            ph,
        );
    }
    svg.push_str("</svg>\n");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(rps: f64, p99: f64, cpu: f64) -> Sample {
        Sample {
            rps,
            p50_ms: p99 / 2.0,
            p99_ms: p99,
            p999_ms: Some(p99 * 2.0),
            requests: (rps * 5.0) as u64,
            errors: 0,
            cpu_s: Some(cpu),
            wall_s: 5.0,
            rss_kib: Some(10_000),
        }
    }

    #[test]
    fn added_latency_is_paired_by_round() {
        // Round 2 was noisy for both; the difference of medians (40 - 2)
        // would pair direct's quiet round with the peer's noisy one.
        let direct = Cell::from_samples(vec![
            sample(1000.0, 1.0, 0.0),
            sample(1000.0, 50.0, 0.0),
            sample(1000.0, 2.0, 0.0),
        ])
        .expect("direct");
        let peer = Cell::from_samples(vec![
            sample(1000.0, 3.0, 1.0),
            sample(1000.0, 52.0, 1.0),
            sample(1000.0, 40.0, 1.0),
        ])
        .expect("peer");
        let added = peer.compare(&direct);
        assert_eq!(added.p99_added_ms, 2.0);
        assert_eq!(added.p50_added_ms, 1.0);
        // Unequal round counts cannot be paired: medians then.
        let short = Cell::from_samples(vec![sample(1000.0, 10.0, 1.0)]).expect("short");
        assert_eq!(short.compare(&direct).p99_added_ms, 8.0);
    }

    #[test]
    fn cells_summarise_rounds_and_compare() {
        let ours = Cell::from_samples(vec![
            sample(100.0, 2.0, 5.0),
            sample(120.0, 1.0, 5.0),
            sample(110.0, 3.0, 5.0),
        ])
        .expect("cell");
        assert_eq!(ours.rps.median, 110.0);
        assert_eq!(ours.proxy_cpu.expect("cpu").median, 1.0);
        // 550 requests on 5 CPU-seconds
        assert_eq!(ours.rps_per_core.expect("per core").median, 110.0);
        let reference = Cell::from_samples(vec![sample(220.0, 1.0, 5.0)]).expect("cell");
        let c = ours.compare(&reference);
        assert_eq!(c.rps, 0.5);
        assert_eq!(c.p99_added_ms, 1.0);
        assert_eq!(c.rss_kib, Some(1.0));
    }

    #[test]
    fn axis_steps_are_round_numbers() {
        assert_eq!(nice_step(1800.0), 2000.0);
        assert_eq!(nice_step(2100.0), 2500.0);
        assert_eq!(nice_step(0.3), 0.5);
        assert_eq!(nice_step(10_000.0), 10_000.0);
    }

    #[test]
    fn readme_is_spliced_between_markers_only() {
        let readme = "# Bench\nintro\n<!-- results:begin -->\nold\n<!-- results:end -->\ntail\n";
        let out = splice_readme(readme, "new table\n").expect("markers");
        assert_eq!(
            out,
            "# Bench\nintro\n<!-- results:begin -->\nnew table\n<!-- results:end -->\ntail\n"
        );
        assert!(splice_readme("no markers", "x").is_none());
    }
}
