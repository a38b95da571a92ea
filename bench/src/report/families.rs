//! The scenario families of issue #39 in the report: the proxy and the app
//! on one core, gRPC through ghz, and what HTTP/2 connections and streams
//! cost in memory; their tables and their targets.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use super::{Cell, Report, num};
use crate::peers::Peer;
use crate::scenario::{SCENARIOS, SHARED_CORE};

/// Things held open against a fresh proxy, and its memory with them, KiB.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Held {
    /// The fresh instance before anything was opened.
    pub idle_rss_kib: u64,
    pub held_rss_kib: u64,
    /// Idle connections, or open streams.
    pub count: u32,
    /// The connections they were on (equal to `count` for connections).
    pub connections: u32,
    /// (held - idle) / count.
    pub per_item_kib: f64,
}

impl Held {
    pub fn new(idle_rss_kib: u64, held_rss_kib: u64, count: u32, connections: u32) -> Held {
        Held {
            idle_rss_kib,
            held_rss_kib,
            count,
            connections,
            per_item_kib: crate::memtest::per_connection(idle_rss_kib, held_rss_kib, count),
        }
    }
}

/// What HTTP/2 costs one proxy in memory; a part that failed is absent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct H2Memory {
    /// Idle h2c connections: settings exchanged, one request answered.
    pub idle_connections: Option<Held>,
    /// Streams waiting for the upstream's answer, on a few connections.
    pub open_streams: Option<Held>,
}

/// The ratio the shared-core scenarios must reach against nginx.
const SHARED_CORE_TARGET: f64 = 1.1;
/// The ratio gRPC must reach against HAProxy per proxy CPU-second.
const GRPC_TARGET: f64 = 1.1;

fn ratio(a: f64, b: Option<f64>) -> Option<f64> {
    b.filter(|b| *b > 0.0).map(|b| a / b)
}

fn times(x: Option<f64>) -> String {
    x.map_or("–".into(), |x| format!("{x:.2}x"))
}

/// The app's share of its core over a cell's rounds, median: with the
/// proxy's, it shows whether the pair used all of its limit (it must, or
/// the load generator was the bottleneck).
fn app_share(c: &Cell) -> Option<f64> {
    let shares: Vec<f64> = c
        .samples
        .iter()
        .filter_map(|s| Some(s.app_cpu_s? / s.wall_s))
        .collect();
    crate::stats::Spread::of(&shares).map(|s| s.median)
}

/// The targets of these families, judged on the medians.
pub fn judge(r: &Report) -> Vec<String> {
    let us = Peer::Kubegrace.name();
    let (nginx, haproxy) = (Peer::Nginx.name(), Peer::Haproxy.name());
    let mut verdicts = Vec::new();
    let verdict = |met: bool| if met { "MET" } else { "MISSED" };
    for id in SHARED_CORE {
        let Some(s) = r.scenario(id) else { continue };
        let rps = |p: &str| s.peers.get(p).map(|c| c.rps.median);
        let Some(ours) = rps(us) else {
            verdicts.push(format!("{}: kubegrace not measured", s.title));
            continue;
        };
        let (vs_nginx, vs_haproxy) = (ratio(ours, rps(nginx)), ratio(ours, rps(haproxy)));
        let cell = s.peers.get(us);
        let share = cell.and_then(|c| c.proxy_cpu).map(|u| u.median);
        let app_share = cell.and_then(app_share);
        let limit = match r.settings.pair_cpu_millicores {
            0 => "no limit but the core".to_string(),
            m => format!("the pair limited to {m}m"),
        };
        verdicts.push(format!(
            "{}: the pair's throughput at least {SHARED_CORE_TARGET}x nginx, {}: kubegrace {} req/s, {} nginx, {} HAProxy (kubegrace {} and the app {} of the core, {limit})",
            verdict(vs_nginx.is_some_and(|x| x >= SHARED_CORE_TARGET)),
            s.title,
            num(ours),
            times(vs_nginx),
            times(vs_haproxy),
            share.map_or("–".into(), |u| format!("{:.0}%", u * 100.0)),
            app_share.map_or("–".into(), |u| format!("{:.0}%", u * 100.0)),
        ));
    }
    for d in SCENARIOS.iter().filter(|d| d.is_grpc()) {
        let Some(s) = r.scenario(d.id) else { continue };
        let (Some(ours), Some(theirs)) = (s.peers.get(us), s.peers.get(haproxy)) else {
            verdicts.push(format!("{}: kubegrace or HAProxy not measured", s.title));
            continue;
        };
        if d.is_saturation() {
            let per_core = |c: &Cell| c.rps_per_core.map(|x| x.median);
            let x = per_core(ours).and_then(|o| ratio(o, per_core(theirs)));
            verdicts.push(format!(
                "{}: at least {GRPC_TARGET}x HAProxy per proxy CPU-second, {}: kubegrace {} calls/CPU-s, {} HAProxy",
                verdict(x.is_some_and(|x| x >= GRPC_TARGET)),
                s.title,
                per_core(ours).map_or("–".into(), num),
                times(x),
            ));
        } else if let (Some(o), Some(t)) = (&ours.vs_direct, &theirs.vs_direct) {
            verdicts.push(format!(
                "{}: added p50 and p99 no worse than HAProxy's, {}: kubegrace +{:.3} / +{:.3} ms, HAProxy +{:.3} / +{:.3} ms",
                verdict(o.p50_added_ms <= t.p50_added_ms && o.p99_added_ms <= t.p99_added_ms),
                s.title,
                o.p50_added_ms,
                o.p99_added_ms,
                t.p50_added_ms,
                t.p99_added_ms
            ));
        }
    }
    let part = |p: &str, pick: fn(&H2Memory) -> Option<Held>| {
        r.h2_memory.get(p).and_then(pick).map(|h| h.per_item_kib)
    };
    type Pick = fn(&H2Memory) -> Option<Held>;
    let parts: [(&str, Pick); 2] = [
        ("per idle h2c connection", |m| m.idle_connections),
        ("per open HTTP/2 stream", |m| m.open_streams),
    ];
    for (what, pick) in parts {
        let Some(ours) = part(us, pick) else { continue };
        let theirs: Vec<(&str, f64)> = [nginx, haproxy]
            .into_iter()
            .filter_map(|p| Some((p, part(p, pick)?)))
            .collect();
        let Some(least) = theirs.iter().map(|(_, x)| *x).min_by(f64::total_cmp) else {
            continue;
        };
        let listed: Vec<String> = theirs
            .iter()
            .map(|(p, x)| format!("{p} {x:.2} KiB"))
            .collect();
        verdicts.push(format!(
            "{}: memory {what} at most nginx's and HAProxy's: kubegrace {ours:.2} KiB, {}",
            verdict(ours <= least),
            listed.join(", ")
        ));
    }
    verdicts
}

/// The families' tables, for the scenarios and tests the run had.
pub fn tables(m: &mut String, r: &Report, peers: &[&str]) {
    let shared: Vec<_> = SHARED_CORE.iter().filter_map(|id| r.scenario(id)).collect();
    if !shared.is_empty() {
        let _ = writeln!(
            m,
            "\n### The proxy and the app on one core\n\n\
             The proxy and bench-upstream both on CPU {} (a pod with one CPU){}, the load \
             generator alone on CPU {}; `direct` is the app alone on that core. The figure \
             is the pair's throughput; the proxy's share of the core beside it.{}\n",
            r.settings.proxy_cpus,
            match r.settings.pair_cpu_millicores {
                0 => String::new(),
                m => format!(
                    " and limited together to {m}m of it (a CFS quota, as a pod's CPU limit)"
                ),
            },
            r.settings.load_cpus,
            if r.settings.pair_cpu_millicores > 0 {
                " The quota throttles every peer alike, so the p99 columns here show the 100 ms \
                 period rather than the proxies."
            } else {
                ""
            },
        );
        for s in shared {
            family_table(m, &s.title, s, peers);
        }
    }
    let grpc: Vec<_> = SCENARIOS
        .iter()
        .filter(|d| d.is_grpc())
        .filter_map(|d| r.scenario(d.id))
        .collect();
    if !grpc.is_empty() {
        let _ = writeln!(
            m,
            "\n### gRPC (ghz), calls\n\n\
             nginx through `grpc_pass`, HAProxy through a `proto h2` backend, kubegrace on its \
             one port; the app answers bench/grpc/bench.proto. Added latency is over direct, \
             paired by round.\n"
        );
        for s in grpc {
            family_table(m, &s.title, s, peers);
        }
    }
    if r.h2_memory.is_empty() {
        return;
    }
    let _ = writeln!(
        m,
        "\n### HTTP/2 memory, VmRSS, KiB\n\n\
         A fresh instance for each part: idle, then with the connections or streams held.\n"
    );
    let _ = writeln!(
        m,
        "| proxy | idle | idle h2c connections | held | per connection | idle | open streams (connections) | held | per stream |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    // Every peer measured here, in report order: runs without load
    // scenarios have no other list of peers.
    for p in Peer::ALL.map(Peer::name) {
        let Some(x) = r.h2_memory.get(p) else {
            continue;
        };
        let cols = |h: Option<Held>, with_connections: bool| {
            h.map_or("– | – | – | –".into(), |h| {
                let count = if with_connections {
                    format!("{} ({})", h.count, h.connections)
                } else {
                    h.count.to_string()
                };
                format!(
                    "{} | {count} | {} | {:.2}",
                    h.idle_rss_kib, h.held_rss_kib, h.per_item_kib
                )
            })
        };
        let _ = writeln!(
            m,
            "| {p} | {} | {} |",
            cols(x.idle_connections, false),
            cols(x.open_streams, true)
        );
    }
}

/// One scenario of a family: a row per peer.
fn family_table(m: &mut String, title: &str, s: &super::ScenarioResult, peers: &[&str]) {
    let median = |p: &str, f: fn(&Cell) -> Option<f64>| s.peers.get(p).and_then(f);
    let rps = |c: &Cell| Some(c.rps.median);
    let per_core = |c: &Cell| c.rps_per_core.map(|x| x.median);
    let _ = writeln!(
        m,
        "**{title}**\n\n\
         | peer | req/s | vs nginx | vs HAProxy | per proxy CPU-s | vs HAProxy | proxy's share of its core | added p50 ms | added p99 ms | errors |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for p in peers {
        let Some(c) = s.peers.get(*p) else { continue };
        let added = |f: fn(&super::Compare) -> f64| {
            c.vs_direct
                .as_ref()
                .map_or("–".into(), |d| format!("{:+.3}", f(d)))
        };
        let _ = writeln!(
            m,
            "| {p} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            num(c.rps.median),
            times(ratio(c.rps.median, median(Peer::Nginx.name(), rps))),
            times(ratio(c.rps.median, median(Peer::Haproxy.name(), rps))),
            per_core(c).map_or("–".into(), num),
            per_core(c).map_or("–".into(), |x| times(ratio(
                x,
                median(Peer::Haproxy.name(), per_core)
            ))),
            c.proxy_cpu
                .map_or("–".into(), |u| format!("{:.0}%", u.median * 100.0)),
            added(|d| d.p50_added_ms),
            added(|d| d.p99_added_ms),
            c.errors
        );
    }
    let _ = writeln!(m);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{Sample, ScenarioResult};
    use crate::scenario::{GRPC_UNARY, SHARED_KEEPALIVE, SHARED_NEW_CONNECTION};
    use std::collections::BTreeMap;

    fn cell(rps: f64, cpu_s: f64) -> Cell {
        let sample = Sample {
            rps,
            p50_ms: 1.0,
            p99_ms: 2.0,
            p999_ms: None,
            requests: (rps * 4.0) as u64,
            errors: 0,
            cpu_s: Some(cpu_s),
            wall_s: 4.0,
            rss_kib: None,
            app_cpu_s: None,
        };
        Cell::from_samples(vec![sample]).expect("a cell")
    }

    fn report(id: &str, cells: &[(&str, f64, f64)]) -> Report {
        let title = SCENARIOS
            .iter()
            .find(|d| d.id == id)
            .map_or(id, |d| d.title);
        let peers = cells
            .iter()
            .map(|(p, rps, cpu)| (p.to_string(), cell(*rps, *cpu)))
            .collect();
        let mut r = crate::report::tests::report_with(BTreeMap::new());
        r.scenarios = vec![ScenarioResult {
            id: id.to_string(),
            title: title.to_string(),
            peers,
        }];
        r
    }

    #[test]
    fn shared_core_is_judged_on_the_pairs_throughput_at_1_1x_nginx() {
        // At the bound: 1.1x nginx is met, whatever the CPU per request.
        let at = report(
            SHARED_KEEPALIVE,
            &[
                ("kubegrace", 11_000.0, 4.0),
                ("nginx", 10_000.0, 1.0),
                ("haproxy", 12_000.0, 1.0),
            ],
        );
        let v = judge(&at);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(
            v[0].starts_with("MET: the pair's throughput at least 1.1x nginx"),
            "{}",
            v[0]
        );
        assert!(v[0].contains("1.10x nginx, 0.92x HAProxy"), "{}", v[0]);
        // Just past it.
        let below = report(
            SHARED_KEEPALIVE,
            &[("kubegrace", 10_999.0, 1.0), ("nginx", 10_000.0, 1.0)],
        );
        assert!(
            judge(&below)[0].starts_with("MISSED"),
            "{:?}",
            judge(&below)
        );
    }

    #[test]
    fn the_shared_core_verdict_shows_whether_the_pair_used_its_limit() {
        let mut r = report(
            SHARED_NEW_CONNECTION,
            &[("kubegrace", 28_000.0, 1.44), ("nginx", 21_000.0, 1.56)],
        );
        // Without a limit, and with no app CPU recorded (older runs).
        assert!(
            judge(&r)[0]
                .ends_with("(kubegrace 36% and the app – of the core, no limit but the core)"),
            "{:?}",
            judge(&r)
        );
        r.settings.pair_cpu_millicores = 500;
        let cell = r.scenarios[0]
            .peers
            .get_mut("kubegrace")
            .expect("kubegrace");
        cell.samples[0].app_cpu_s = Some(0.56);
        assert!(
            judge(&r)[0]
                .ends_with("(kubegrace 36% and the app 14% of the core, the pair limited to 500m)"),
            "{:?}",
            judge(&r)
        );
    }

    #[test]
    fn grpc_is_judged_per_proxy_cpu_second_against_haproxy() {
        // Fewer calls/s but far less CPU: per CPU-second is what counts.
        let r = report(
            GRPC_UNARY,
            &[("kubegrace", 5_000.0, 1.0), ("haproxy", 9_000.0, 2.0)],
        );
        let v = judge(&r);
        assert!(
            v[0].starts_with("MET: at least 1.1x HAProxy per proxy CPU-second"),
            "{v:?}"
        );
        let r = report(
            GRPC_UNARY,
            &[("kubegrace", 9_000.0, 2.0), ("haproxy", 9_000.0, 2.0)],
        );
        assert!(judge(&r)[0].starts_with("MISSED"), "1.0x is short of 1.1x");
    }

    #[test]
    fn h2_memory_is_judged_against_the_least_of_nginx_and_haproxy() {
        let mut r = report(SHARED_KEEPALIVE, &[]);
        r.scenarios.clear();
        let m = |conn: f64, stream: f64| H2Memory {
            idle_connections: Some(Held::new(1000, 1000 + (conn * 100.0) as u64, 100, 100)),
            open_streams: Some(Held::new(1000, 1000 + (stream * 100.0) as u64, 100, 2)),
        };
        r.h2_memory.insert("kubegrace".into(), m(10.0, 8.0));
        r.h2_memory.insert("nginx".into(), m(12.0, 9.0));
        r.h2_memory.insert("haproxy".into(), m(10.0, 7.0));
        let v = judge(&r);
        assert!(
            v[0].starts_with("MET: memory per idle h2c connection"),
            "equal is at most: {v:?}"
        );
        assert!(
            v[1].starts_with("MISSED: memory per open HTTP/2 stream"),
            "{v:?}"
        );
        let mut table = String::new();
        tables(&mut table, &r, &[]);
        assert!(
            table.contains(
                "| kubegrace | 1000 | 100 | 2000 | 10.00 | 1000 | 100 (2) | 1800 | 8.00 |"
            ),
            "{table}"
        );
    }
}
