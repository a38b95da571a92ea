//! The SVG plot of a [`Report`]: grouped bars with min–max whiskers, one panel per measure.

use std::fmt::Write as _;

use super::{Cell, Report, num};
use crate::scenario::{FIXED_RATE, KEEPALIVE_64, KEEPALIVE_256};
use crate::stats::Spread;

const COLOURS: [(&str, &str); 7] = [
    ("direct", "#9e9e9e"),
    ("kubegrace", "#1b7f3b"),
    ("kubegrace+cb", "#6cc38a"),
    ("nginx", "#2f6db5"),
    ("nginx-deferred", "#7fa7dc"),
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
    // One group per load scenario (the fixed-rate one has its own panel), a bar per peer.
    let per_scenario = |bar: fn(&Cell) -> Option<Spread>| {
        r.scenarios
            .iter()
            .filter(|s| s.id != FIXED_RATE)
            .map(|s| {
                let bars = peers
                    .iter()
                    .filter_map(|p| Some((*p, bar(s.peers.get(*p)?)?)))
                    .collect();
                (short(&s.id), bars)
            })
            .collect()
    };
    panels.push(Panel {
        title: "Throughput at saturation (median, min–max whiskers)".into(),
        unit: "requests/s",
        groups: per_scenario(|c| Some(c.rps)),
    });
    panels.push(Panel {
        title: "Throughput per proxy core (requests per proxy CPU-second)".into(),
        unit: "req/CPU-s",
        groups: per_scenario(|c| c.rps_per_core),
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

    #[test]
    fn axis_steps_are_round_numbers() {
        for (raw, step) in [
            (1800.0, 2000.0),
            (2100.0, 2500.0),
            (0.3, 0.5),
            (10_000.0, 10_000.0),
        ] {
            assert_eq!(nice_step(raw), step, "the step above {raw}");
        }
    }
}
