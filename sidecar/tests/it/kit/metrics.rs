//! What the sidecar says about itself: its ready line, the drain summary
//! of its exit line, and its Prometheus metrics, parsed just enough for
//! assertions.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use anyhow::{Result, bail};

/// Parses "kubegrace-sidecar ready listen=ADDR admin=ADDR".
pub fn parse_ready_line(line: &str) -> Option<(SocketAddr, SocketAddr)> {
    let rest = &line[line.find("kubegrace-sidecar ready ")?..];
    let field = |key: &str| -> Option<SocketAddr> {
        let at = rest.find(key)? + key.len();
        rest[at..].split_whitespace().next()?.parse().ok()
    };
    Some((field("listen=")?, field("admin=")?))
}

/// Finds "drained N connections ... M force-closed" in one log line.
pub fn parse_drain_summary(line: &str) -> Option<(u64, u64)> {
    let lower = line.to_ascii_lowercase();
    let drained_at = lower.find("drained ")?;
    let after = &lower[drained_at + "drained ".len()..];
    let drained: u64 = after
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()?;
    let forced_at = lower.find(" force-closed")?;
    let before = lower[..forced_at].trim_end();
    let digits: String = before
        .chars()
        .rev()
        .take_while(|c| c.is_ascii_digit())
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    let forced: u64 = digits.parse().ok()?;
    Some((drained, forced))
}

/// Prometheus text format, just enough for assertions.
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    /// `name{labels}` (exactly as exposed) -> value.
    pub series: BTreeMap<String, f64>,
}

impl Metrics {
    pub fn parse(text: &str) -> Self {
        let mut series = BTreeMap::new();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            // The value follows the series; an optional timestamp follows it.
            let (key, rest) = match line.rfind('}') {
                Some(end) => (&line[..=end], line[end + 1..].trim()),
                None => match line.split_once(char::is_whitespace) {
                    Some((k, r)) => (k, r.trim()),
                    None => continue,
                },
            };
            if let Some(value) = rest
                .split_whitespace()
                .next()
                .and_then(|v| v.parse::<f64>().ok())
            {
                series.insert(key.to_string(), value);
            }
        }
        Self { series }
    }

    /// The metric `name` (summed over its series) is `value`; `what` says
    /// what it means when it is not.
    pub fn expect(&self, name: &str, value: f64, what: &str) -> Result<()> {
        if self.sum(name) != Some(value) {
            bail!(
                "{what}: {name} is {:?}, not {value}; {:?}",
                self.sum(name),
                self.series
            );
        }
        Ok(())
    }

    /// No connection is left open (after a drain).
    pub fn expect_no_open_connections(&self) -> Result<()> {
        self.expect(
            "kubegrace_open_connections",
            0.0,
            "connections still open after the drain",
        )
    }

    /// A drain that had to cut: at least `min` connections were closed by
    /// force at the deadline, and none is left open. Returns the count.
    pub fn expect_cut_at_least(&self, min: f64, what: &str) -> Result<f64> {
        let forced = self.expect_at_least("kubegrace_drain_force_closed_total", min, what)?;
        self.expect_no_open_connections()?;
        Ok(forced)
    }

    /// The metric `name` (summed over its series) is at least `min`.
    pub fn expect_at_least(&self, name: &str, min: f64, what: &str) -> Result<f64> {
        match self.sum(name) {
            Some(value) if value >= min => Ok(value),
            other => bail!(
                "{what}: {name} is {other:?}, below {min}; {:?}",
                self.series
            ),
        }
    }

    /// One series, exactly as exposed (`name{labels}`).
    pub fn get(&self, series: &str) -> Option<f64> {
        self.series.get(series).copied()
    }

    /// Sum over every series of the metric `name`; `None` if it is absent.
    pub fn sum(&self, name: &str) -> Option<f64> {
        let mut found = false;
        let mut total = 0.0;
        for (key, value) in &self.series {
            let base = key.split('{').next().unwrap_or(key);
            if base == name {
                found = true;
                total += value;
            }
        }
        found.then_some(total)
    }

    /// The value of the series of `name` whose labels contain `label`
    /// (e.g. `code_class="5xx"`).
    pub fn with_label(&self, name: &str, label: &str) -> Option<f64> {
        self.series
            .iter()
            .find(|(key, _)| key.split('{').next() == Some(name) && key.contains(label))
            .map(|(_, v)| *v)
    }

    /// `kubegrace_rejected_requests_total` of one route, for one reason
    /// (`breaker_open`, `queue_full`, `queue_timeout`).
    pub fn rejected(&self, route: &str, reason: &str) -> Option<f64> {
        self.get(&format!(
            "kubegrace_rejected_requests_total{{route=\"{route}\",reason=\"{reason}\"}}"
        ))
    }

    /// [`Self::sum`] of a counter, 0 while it has no series.
    pub fn counted(&self, name: &str) -> f64 {
        self.sum(name).unwrap_or(0.0)
    }

    /// [`Self::with_label`] of a counter, 0 while that series is absent.
    pub fn counted_with(&self, name: &str, label: &str) -> f64 {
        self.with_label(name, label).unwrap_or(0.0)
    }
}

#[test]
fn ready_line_gives_both_ports() {
    assert_eq!(
        parse_ready_line("kubegrace-sidecar ready listen=127.0.0.1:4000 admin=127.0.0.1:4001"),
        Some((
            SocketAddr::from(([127, 0, 0, 1], 4000)),
            SocketAddr::from(([127, 0, 0, 1], 4001))
        ))
    );
    assert_eq!(parse_ready_line("kubegrace-sidecar ready"), None);
}

#[test]
fn drain_summary_is_found_in_plain_and_structured_lines() {
    assert_eq!(
        parse_drain_summary("INFO drained 12 connections in 1.2s, 1 force-closed"),
        Some((12, 1))
    );
    assert_eq!(
        parse_drain_summary(r#"{"msg":"drained 3 connections in 0.4s, 0 force-closed"}"#),
        Some((3, 0))
    );
    assert_eq!(parse_drain_summary("listening"), None);
}

#[test]
fn metrics_parse_sums_series() {
    let m = Metrics::parse(
        "# HELP x y\nkubegrace_requests_total{code_class=\"2xx\"} 5\nkubegrace_requests_total{code_class=\"5xx\"} 2\nkubegrace_drain_phase 1\n",
    );
    assert_eq!(m.sum("kubegrace_requests_total"), Some(7.0));
    assert_eq!(
        m.with_label("kubegrace_requests_total", "code_class=\"5xx\""),
        Some(2.0)
    );
    assert_eq!(m.sum("kubegrace_drain_phase"), Some(1.0));
    assert_eq!(m.sum("kubegrace_missing"), None);
}
