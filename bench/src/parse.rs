//! Reading what the load generators print. wrk and h2load have no
//! machine-readable output, so their text is parsed here, and a line that
//! is missing is an error rather than a silent zero.

use anyhow::{Context as _, bail};

/// What one load run measured, whoever generated it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LoadResult {
    /// Completed requests (any status).
    pub requests: u64,
    /// Socket errors, timeouts and non-2xx/3xx responses.
    pub errors: u64,
    pub rps: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Only where the tool gives it (h2load's per-request log, bench-client).
    pub p999_ms: Option<f64>,
}

/// A wrk duration such as `467.89us`, `1.02ms`, `2.00s`, in milliseconds.
fn wrk_duration_ms(text: &str) -> anyhow::Result<f64> {
    let text = text.trim();
    let split = text
        .find(|c: char| c.is_ascii_alphabetic())
        .with_context(|| format!("{text:?} has no unit"))?;
    let (number, unit) = text.split_at(split);
    let value: f64 = number.parse().with_context(|| format!("{text:?}"))?;
    let factor = match unit {
        "us" => 0.001,
        "ms" => 1.0,
        "s" => 1000.0,
        "m" => 60_000.0,
        "h" => 3_600_000.0,
        other => bail!("unknown wrk unit {other:?} in {text:?}"),
    };
    Ok(value * factor)
}

/// Parses `wrk --latency` output.
pub fn wrk(output: &str) -> anyhow::Result<LoadResult> {
    let mut result = LoadResult::default();
    let (mut p50, mut p99, mut rps, mut requests) = (None, None, None, None);
    for line in output.lines() {
        let line = line.trim();
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["50%", value] => p50 = Some(wrk_duration_ms(value)?),
            ["99%", value] => p99 = Some(wrk_duration_ms(value)?),
            ["Requests/sec:", value] => rps = Some(value.parse::<f64>().context("Requests/sec")?),
            [count, "requests", "in", ..] => {
                requests = Some(count.parse::<u64>().context("requests")?)
            }
            ["Socket", "errors:", rest @ ..] => {
                // "connect 0, read 0, write 0, timeout 0"
                for pair in rest.chunks(2) {
                    if let [_, n] = pair {
                        result.errors += n.trim_end_matches(',').parse::<u64>().unwrap_or(0);
                    }
                }
            }
            ["Non-2xx", "or", "3xx", "responses:", n] => {
                result.errors += n.parse::<u64>().unwrap_or(0)
            }
            _ => {}
        }
    }
    result.p50_ms = p50.context("wrk printed no 50% latency (was --latency given?)")?;
    result.p99_ms = p99.context("wrk printed no 99% latency")?;
    result.rps = rps.context("wrk printed no Requests/sec")?;
    result.requests = requests.context("wrk printed no request count")?;
    Ok(result)
}

/// Parses h2load's summary; latency percentiles come from its per-request
/// log (see [`h2load_log_latencies_us`]) because the summary has none.
pub fn h2load_summary(output: &str) -> anyhow::Result<LoadResult> {
    let mut result = LoadResult::default();
    let (mut rps, mut done) = (None, None);
    for line in output.lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("finished in ") {
            // "finished in 5.00s, 51234.40 req/s, 6.16MB/s"
            let value = rest
                .split(", ")
                .find_map(|part| part.strip_suffix(" req/s"))
                .context("h2load: no req/s on the finished line")?;
            rps = Some(value.parse::<f64>().context("h2load req/s")?);
        } else if let Some(rest) = line.strip_prefix("requests: ") {
            // "250000 total, 250256 started, 250000 done, 249990 succeeded,
            //  10 failed, 0 errored, 0 timeout"
            for part in rest.split(", ") {
                let mut it = part.split_whitespace();
                let (Some(n), Some(what)) = (it.next(), it.next()) else {
                    continue;
                };
                let n: u64 = n.parse().unwrap_or(0);
                match what {
                    "done" => done = Some(n),
                    // "failed" already includes errored requests and
                    // non-2xx/3xx statuses; timeouts are counted apart.
                    "failed" | "timeout" => result.errors += n,
                    _ => {}
                }
            }
        }
    }
    result.rps = rps.context("h2load printed no 'finished in' line")?;
    result.requests = done.context("h2load printed no 'requests:' line")?;
    Ok(result)
}

/// Latencies in microseconds from an h2load `--log-file`: tab-separated
/// start time, status, microseconds to the end of the response.
pub fn h2load_log_latencies_us(log: &str) -> Vec<u64> {
    log.lines()
        .filter_map(|line| line.split('\t').nth(2)?.trim().parse::<u64>().ok())
        .collect()
}

/// Parses ghz's `-O json` report. Its percentiles are in nanoseconds. Every
/// call that did not end `OK` is an error except those ghz cut off itself
/// at the end of a `--duration` run: it closes its connections with calls
/// in flight (about one per worker), and reports them `Unavailable` with
/// "use of closed network connection" (or `Canceled`), whoever answers.
pub fn ghz(json: &str) -> anyhow::Result<LoadResult> {
    let v: serde_json::Value =
        serde_json::from_str(json.trim()).context("ghz printed no JSON report")?;
    let count = v
        .get("count")
        .and_then(serde_json::Value::as_u64)
        .context("ghz: no count")?;
    let rps = v
        .get("rps")
        .and_then(serde_json::Value::as_f64)
        .context("ghz: no rps")?;
    let ok = v
        .pointer("/statusCodeDistribution/OK")
        .and_then(serde_json::Value::as_u64)
        .unwrap_or(0);
    let percentile_ms = |q: u64| {
        v.get("latencyDistribution")?
            .as_array()?
            .iter()
            .find(|p| p.get("percentage").and_then(serde_json::Value::as_u64) == Some(q))?
            .get("latency")?
            .as_u64()
            .map(|ns| ns as f64 / 1e6)
    };
    let not_ok = count.saturating_sub(ok);
    let errors = match v.get("errorDistribution").and_then(|d| d.as_object()) {
        Some(by_message) => by_message
            .iter()
            .filter(|(message, _)| {
                !message.contains("use of closed network connection")
                    && !message.contains("code = Canceled")
            })
            .filter_map(|(_, n)| n.as_u64())
            .sum::<u64>()
            .min(not_ok),
        None => not_ok,
    };
    Ok(LoadResult {
        requests: count,
        errors,
        rps,
        p50_ms: percentile_ms(50).context("ghz: no 50% latency (no call succeeded?)")?,
        p99_ms: percentile_ms(99).context("ghz: no 99% latency")?,
        p999_ms: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const WRK: &str = "Running 5s test @ http://127.0.0.1:18080/
  1 threads and 64 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   467.89us  123.45us   5.00ms   90.00%
    Req/Sec    70.00k     2.00k   75.00k    80.00%
  Latency Distribution
     50%  450.00us
     75%  500.00us
     90%  600.00us
     99%    1.20ms
  350123 requests in 5.00s, 40.00MB read
  Socket errors: connect 0, read 3, write 0, timeout 2
  Non-2xx or 3xx responses: 10
Requests/sec:  70024.60
Transfer/sec:      8.00MB
";

    #[test]
    fn wrk_output_is_read_with_units() {
        let r = wrk(WRK).expect("parses");
        assert_eq!(r.requests, 350_123);
        assert_eq!(r.errors, 15);
        assert!((r.p50_ms - 0.45).abs() < 1e-9);
        assert!((r.p99_ms - 1.2).abs() < 1e-9);
        assert!((r.rps - 70_024.6).abs() < 1e-6);
        assert!(
            wrk("Requests/sec: 1\n").is_err(),
            "missing latency must fail"
        );
    }

    const H2LOAD: &str = "finished in 5.00s, 51234.40 req/s, 6.16MB/s
requests: 256172 total, 256428 started, 256172 done, 256170 succeeded, 2 failed, 0 errored, 0 timeout
status codes: 256170 2xx, 0 3xx, 0 4xx, 2 5xx
traffic: 30.81MB (32306042) total, 2.44MB (2562480) headers (space savings 93.33%), 16.13MB (16906944) data
";

    #[test]
    fn h2load_summary_and_log_are_read() {
        let r = h2load_summary(H2LOAD).expect("parses");
        assert_eq!(r.requests, 256_172);
        assert_eq!(r.errors, 2, "failed includes the non-2xx");
        assert!((r.rps - 51_234.4).abs() < 1e-6);
        let log = "1700000000000000\t200\t512\n1700000000000100\t200\t1024\nbad line\n";
        assert_eq!(h2load_log_latencies_us(log), vec![512, 1024]);
    }

    #[test]
    fn ghz_report_is_read_in_milliseconds() {
        let json = r#"{"count": 1000, "total": 500000000, "rps": 2000.5,
            "statusCodeDistribution": {"OK": 990, "Unavailable": 10},
            "errorDistribution": {
                "rpc error: code = Unavailable desc = error reading from server: read tcp 127.0.0.1:1->127.0.0.1:2: use of closed network connection": 6,
                "rpc error: code = Unavailable desc = upstream connect error": 4},
            "latencyDistribution": [{"percentage": 10, "latency": 100000},
                {"percentage": 50, "latency": 250000}, {"percentage": 99, "latency": 1500000}]}"#;
        let r = ghz(json).expect("parses");
        assert_eq!(
            (r.requests, r.errors),
            (1000, 4),
            "the calls ghz cut off itself are not the proxy's errors"
        );
        assert!((r.rps - 2000.5).abs() < 1e-9);
        assert!((r.p50_ms - 0.25).abs() < 1e-12);
        assert!((r.p99_ms - 1.5).abs() < 1e-12);
        // Every call failed: ghz gives no distribution, and that is an error.
        let failed = r#"{"count": 5, "rps": 1.0, "statusCodeDistribution": {"Unavailable": 5},
            "latencyDistribution": null}"#;
        assert!(ghz(failed).is_err());
        assert!(ghz("Summary: ...").is_err());
    }
}
