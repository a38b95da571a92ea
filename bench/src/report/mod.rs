//! The results file (`bench/results/latest.json`) and what is generated
//! from it: the README tables and the SVG plot. Rendering is pure, so the
//! report can be re-generated from a saved JSON without re-running load.

mod families;
mod plot;
mod tables;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::peers::Peer;
use crate::scenario::{FIXED_RATE, KEEPALIVE_64, KEEPALIVE_256, NEW_CONNECTION};
use crate::stats::Spread;

pub use families::{H2Memory, Held};
pub use plot::svg;
pub use tables::{markdown, num, splice_readme};

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
    /// And the app's, where it shares the proxy's core (none elsewhere,
    /// and in runs before it was measured).
    #[serde(default)]
    pub app_cpu_s: Option<f64>,
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
    /// The memory test (memtest.rs), on a fresh instance; absent when it
    /// was not run.
    #[serde(default)]
    pub idle_connections: Option<IdleConnections>,
}

/// What idle keep-alive connections cost a proxy, and whether the memory
/// of a spike goes back (memtest.rs), KiB.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct IdleConnections {
    /// The fresh instance before any connection.
    pub idle_rss_kib: u64,
    /// With `connections` idle keep-alive connections open.
    pub held_rss_kib: u64,
    pub connections: u32,
    /// (held - idle) / connections.
    pub per_connection_kib: f64,
    /// `after_seconds` after the spike (the connections closed, then a
    /// 256-connection load burst) ended.
    pub after_spike_rss_kib: u64,
    pub after_seconds: u64,
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
    /// The CPU limit of the proxy and the app together in the shared-core
    /// scenarios, millicores; 0 (and runs before it existed): the whole core.
    #[serde(default)]
    pub pair_cpu_millicores: u32,
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
    /// What HTTP/2 connections and streams cost each proxy (absent in runs
    /// before it was measured).
    #[serde(default)]
    pub h2_memory: BTreeMap<String, H2Memory>,
    /// One line per target of the issue: met, or missed by how much.
    pub verdicts: Vec<String>,
    pub wall_seconds: f64,
}

/// The memory test's name for the images' build of the sidecar (static
/// glibc, stripped), measured beside the `kubegrace` peer's binary.
pub const KUBEGRACE_STATIC: &str = "kubegrace (static)";

/// The memory test's figures into the peers' memory; the static sidecar,
/// which is in no load scenario, gets an entry of its own.
pub fn add_memory_test(
    memory: &mut BTreeMap<String, Memory>,
    tested: BTreeMap<String, IdleConnections>,
) {
    for (name, m) in tested {
        if let Some(entry) = memory.get_mut(&name) {
            entry.idle_connections = Some(m);
        } else if name == KUBEGRACE_STATIC {
            let entry = Memory {
                idle_rss_kib: m.idle_rss_kib,
                loaded_rss_kib: None,
                peak_rss_kib: 0,
                idle_connections: Some(m),
            };
            memory.insert(name, entry);
        }
    }
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

    /// The targets, judged on the medians.
    pub fn judge(&self) -> Vec<String> {
        let r: &Report = self;
        let mut verdicts = Vec::new();
        let us = Peer::Kubegrace.name();
        let others =
            [Peer::Nginx, Peer::NginxDeferred, Peer::Haproxy, Peer::Caddy].map(|p| p.name());
        // (what, value of a peer, higher is better)
        type Metric<'a> = (
            String,
            Box<dyn Fn(&str) -> Option<f64> + 'a>,
            bool,
            &'static str,
        );
        let mut metrics: Vec<Metric> = Vec::new();
        for id in [KEEPALIVE_64, KEEPALIVE_256, NEW_CONNECTION] {
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
        verdicts.extend(r.judge_memory_goals());
        verdicts.extend(families::judge(r));
        verdicts
    }

    /// The absolute memory goals for kubegrace: idle RSS at most
    /// 5 MiB, at most 4 KiB per idle keep-alive connection, RSS back within
    /// 25% of idle 30 s after a spike.
    /// Judged on the images' static build when the run measured it (what
    /// users run), else on the `kubegrace` peer's binary; the idle line
    /// gives both.
    fn judge_memory_goals(&self) -> Vec<String> {
        let tested = |name: &str| self.memory.get(name).and_then(|m| m.idle_connections);
        let dynamic = tested(Peer::Kubegrace.name());
        let (x, build) = match (tested(KUBEGRACE_STATIC), dynamic) {
            (Some(x), _) => (x, "the images' static build"),
            (None, Some(x)) => (x, "the bench's release build"),
            (None, None) => return Vec::new(),
        };
        let also = match dynamic {
            Some(d) if d != x => format!("; the bench's release build {} KiB", d.idle_rss_kib),
            _ => String::new(),
        };
        let verdict = |met: bool| if met { "MET" } else { "MISSED" };
        let idle_goal = 5 * 1024;
        let per_goal = 4.0;
        let back_goal = x.idle_rss_kib as f64 * 1.25;
        vec![
            format!(
                "{}: idle RSS at most 5 MiB: kubegrace {} KiB ({build}, fresh instance{also})",
                verdict(x.idle_rss_kib <= idle_goal),
                x.idle_rss_kib
            ),
            format!(
                "{}: at most 4 KiB per idle keep-alive connection: kubegrace {:.2} KiB at {} connections",
                verdict(x.per_connection_kib <= per_goal),
                x.per_connection_kib,
                x.connections
            ),
            format!(
                "{}: RSS within 25% of idle {} s after a spike: kubegrace {} KiB, {:+.0}% of idle ({} KiB)",
                verdict(x.after_spike_rss_kib as f64 <= back_goal),
                x.after_seconds,
                x.after_spike_rss_kib,
                (x.after_spike_rss_kib as f64 / x.idle_rss_kib.max(1) as f64 - 1.0) * 100.0,
                x.idle_rss_kib
            ),
        ]
    }
}

/// Writes the results into `readme` (between its results markers) and the
/// plot into `svg`.
pub fn write_outputs(
    readme: &std::path::Path,
    svg_path: &std::path::Path,
    report: &Report,
) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let text =
        std::fs::read_to_string(readme).with_context(|| format!("reading {}", readme.display()))?;
    let spliced = splice_readme(&text, &markdown(report))
        .context("bench/README.md lacks the <!-- results:begin/end --> markers")?;
    std::fs::write(readme, spliced)?;
    std::fs::write(svg_path, svg(report))?;
    Ok(())
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
            app_cpu_s: None,
        }
    }

    /// A cell of one round per `(rps, p99, cpu)`.
    fn cell(rounds: &[(f64, f64, f64)]) -> Cell {
        let samples = rounds.iter().map(|&(rps, p99, cpu)| sample(rps, p99, cpu));
        Cell::from_samples(samples.collect()).expect("cell")
    }

    #[test]
    fn added_latency_is_paired_by_round() {
        // Round 2 was noisy for both; the difference of medians (40 - 2)
        // would pair direct's quiet round with the peer's noisy one.
        let direct = cell(&[(1000.0, 1.0, 0.0), (1000.0, 50.0, 0.0), (1000.0, 2.0, 0.0)]);
        let peer = cell(&[(1000.0, 3.0, 1.0), (1000.0, 52.0, 1.0), (1000.0, 40.0, 1.0)]);
        let added = peer.compare(&direct);
        assert_eq!(added.p99_added_ms, 2.0);
        assert_eq!(added.p50_added_ms, 1.0);
        // Unequal round counts cannot be paired: medians then.
        let short = cell(&[(1000.0, 10.0, 1.0)]);
        assert_eq!(short.compare(&direct).p99_added_ms, 8.0);
    }

    fn memory_tested(idle: u64, after_spike: u64) -> Memory {
        let x = IdleConnections {
            idle_rss_kib: idle,
            held_rss_kib: idle + 30_000,
            connections: 10_000,
            per_connection_kib: 3.0,
            after_spike_rss_kib: after_spike,
            after_seconds: 30,
        };
        Memory {
            idle_rss_kib: idle,
            loaded_rss_kib: None,
            peak_rss_kib: 0,
            idle_connections: Some(x),
        }
    }

    /// A report of `memory` and nothing else, for the report's tests.
    pub(super) fn report_with(memory: BTreeMap<String, Memory>) -> Report {
        Report {
            generated_at: String::new(),
            git_rev: String::new(),
            machine: BTreeMap::new(),
            settings: Settings {
                seconds: 4,
                rounds: 3,
                rate: 1000,
                proxy_cpus: "1".into(),
                load_cpus: "0".into(),
                drain_idle: 1000,
                drain_slow: 100,
                drain_slow_ms: 1000,
                pair_cpu_millicores: 0,
            },
            versions: BTreeMap::new(),
            unavailable: BTreeMap::new(),
            scenarios: Vec::new(),
            memory,
            drain: Vec::new(),
            h2_memory: BTreeMap::new(),
            verdicts: Vec::new(),
            wall_seconds: 0.0,
        }
    }

    #[test]
    fn memory_goals_are_judged_on_the_static_build_when_measured() {
        let mut memory = BTreeMap::new();
        memory.insert("kubegrace".to_string(), memory_tested(6100, 7000));
        let dynamic_only = report_with(memory.clone()).judge_memory_goals();
        assert!(dynamic_only[0].starts_with(
            "MISSED: idle RSS at most 5 MiB: kubegrace 6100 KiB (the bench's release build"
        ));

        let mut tested = BTreeMap::new();
        let static_build = memory_tested(4700, 6000);
        let figures = static_build.idle_connections.expect("tested");
        tested.insert(KUBEGRACE_STATIC.to_string(), figures);
        add_memory_test(&mut memory, tested);
        assert_eq!(memory.get(KUBEGRACE_STATIC), Some(&static_build));
        let verdicts = report_with(memory).judge_memory_goals();
        assert_eq!(
            verdicts[0],
            "MET: idle RSS at most 5 MiB: kubegrace 4700 KiB (the images' static build, fresh instance; the bench's release build 6100 KiB)"
        );
        // 6000 is more than 25% over the static build's idle 4700.
        assert!(verdicts[2].starts_with("MISSED: RSS within 25% of idle"));
    }

    #[test]
    fn cells_summarise_rounds_and_compare() {
        let ours = cell(&[(100.0, 2.0, 5.0), (120.0, 1.0, 5.0), (110.0, 3.0, 5.0)]);
        assert_eq!(ours.rps.median, 110.0);
        assert_eq!(ours.proxy_cpu.expect("cpu").median, 1.0);
        // 550 requests on 5 CPU-seconds
        assert_eq!(ours.rps_per_core.expect("per core").median, 110.0);
        let reference = cell(&[(220.0, 1.0, 5.0)]);
        let c = ours.compare(&reference);
        assert_eq!(c.rps, 0.5);
        assert_eq!(c.p99_added_ms, 1.0);
        assert_eq!(c.rss_kib, Some(1.0));
    }
}
