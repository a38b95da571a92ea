//! Per-request outcomes and the JSON summary the loadgen prints.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::outcome::Reason;

/// One request, as recorded (also the line format of `--outcomes`, JSON Lines).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    /// 0-based sequence number in schedule order.
    pub seq: u64,
    /// `http1`, `http2`, `grpc-unary` or `grpc-stream`.
    pub kind: String,
    /// When it was sent, in ms since the run started.
    pub t_ms: f64,
    /// From send to complete response (or to the failure), in ms.
    pub latency_ms: f64,
    pub reason: Reason,
    /// Why it failed (empty when ok).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
    /// The pod that answered (demo app: `pod=<name>` bodies, gRPC `EchoReply.pod`); for a
    /// failure, the pod last seen on its connection. Absent when unknown (e.g. refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
}

/// A count per reason, every reason present (zero-filled) so consumers can index any key.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReasonCounts {
    pub ok: u64,
    pub refused: u64,
    pub reset: u64,
    pub http_5xx: u64,
    pub timeout: u64,
    pub other: u64,
}

impl ReasonCounts {
    pub fn add(&mut self, reason: Reason) {
        *self.slot(reason) += 1;
    }

    pub fn get(&self, reason: Reason) -> u64 {
        match reason {
            Reason::Ok => self.ok,
            Reason::Refused => self.refused,
            Reason::Reset => self.reset,
            Reason::Http5xx => self.http_5xx,
            Reason::Timeout => self.timeout,
            Reason::Other => self.other,
        }
    }

    fn slot(&mut self, reason: Reason) -> &mut u64 {
        match reason {
            Reason::Ok => &mut self.ok,
            Reason::Refused => &mut self.refused,
            Reason::Reset => &mut self.reset,
            Reason::Http5xx => &mut self.http_5xx,
            Reason::Timeout => &mut self.timeout,
            Reason::Other => &mut self.other,
        }
    }

    pub fn failed(&self) -> u64 {
        Reason::FAILURES.iter().map(|r| self.get(*r)).sum()
    }
}

/// Failures only (the timeline's `failed_by_reason`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailedByReason {
    pub refused: u64,
    pub reset: u64,
    pub http_5xx: u64,
    pub timeout: u64,
    pub other: u64,
}

impl FailedByReason {
    pub fn add(&mut self, reason: Reason) {
        match reason {
            Reason::Ok => {}
            Reason::Refused => self.refused += 1,
            Reason::Reset => self.reset += 1,
            Reason::Http5xx => self.http_5xx += 1,
            Reason::Timeout => self.timeout += 1,
            Reason::Other => self.other += 1,
        }
    }

    pub fn get(&self, reason: Reason) -> u64 {
        match reason {
            Reason::Ok => 0,
            Reason::Refused => self.refused,
            Reason::Reset => self.reset,
            Reason::Http5xx => self.http_5xx,
            Reason::Timeout => self.timeout,
            Reason::Other => self.other,
        }
    }
}

/// One second of the run, by send time.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Second {
    /// Seconds since the run started (this bucket is `[t, t+1)`).
    pub t: u64,
    pub ok: u64,
    pub failed: u64,
    pub failed_by_reason: FailedByReason,
}

/// Requests and failures of one kind of request (`http1`, `grpc-unary`...).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct KindSummary {
    pub requests: u64,
    pub failed: u64,
    pub by_reason: ReasonCounts,
}

/// The loadgen's result. `requests`, `failed`, `by_reason`, `p50_ms`, `p99_ms`,
/// `duration_s` and `timeline` are the stable core; the rest is context for attribution.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub target: String,
    pub protocol: String,
    /// Requests per second scheduled (open loop).
    pub rate: f64,
    /// Connections per pool.
    pub connections: usize,
    /// Requests the schedule called for (`min(rate * duration, max_requests)`).
    pub scheduled: u64,
    /// Requests sent (and recorded): equals `scheduled` unless the run was interrupted.
    pub requests: u64,
    pub ok: u64,
    pub failed: u64,
    /// Every reason, `ok` included, zero-filled.
    pub by_reason: ReasonCounts,
    /// Failure details, `"<reason>: <detail>"` -> count (at most [`MAX_DETAILS`] keys).
    pub by_detail: BTreeMap<String, u64>,
    pub by_kind: BTreeMap<String, KindSummary>,
    /// Per pod (see [`Outcome::pod`]): who served the load and who dropped it. Requests
    /// with no known pod are under `"(unknown)"`; at most [`MAX_PODS`] keys.
    #[serde(default)]
    pub by_pod: BTreeMap<String, KindSummary>,
    /// Latency percentiles of the successful requests, in ms (0 when none succeeded).
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// Wall time from the first send to the last completion.
    pub duration_s: f64,
    /// When the run started (`t = 0` of the timeline), in seconds since the UNIX epoch, so
    /// events recorded elsewhere (a rollout's start) can be placed on the timeline.
    #[serde(default)]
    pub started_at_unix_s: f64,
    /// Send time of the first and last failure, seconds since start (null when none).
    pub first_failure_s: Option<f64>,
    pub last_failure_s: Option<f64>,
    /// TCP connections opened.
    pub connects: u64,
    /// Requests moved to a new connection because a reused one had been closed by the
    /// server before they were written (the normal keep-alive race; not failures).
    pub stale_reconnects: u64,
    pub timeline: Vec<Second>,
}

/// Distinct pods kept; the rest are folded into `"(other pods)"`.
pub const MAX_PODS: usize = 100;

/// Distinct failure details kept; the rest are folded into `"<reason>: (other details)"`.
pub const MAX_DETAILS: usize = 40;

impl Summary {
    /// Aggregates recorded outcomes. `outcomes` may be in any order.
    pub fn from_outcomes(outcomes: &[Outcome]) -> Summary {
        let mut s = Summary {
            requests: outcomes.len() as u64,
            ..Summary::default()
        };
        let mut latencies = Vec::with_capacity(outcomes.len());
        let mut end_ms: f64 = 0.0;
        for o in outcomes {
            s.by_reason.add(o.reason);
            let kind = s.by_kind.entry(o.kind.clone()).or_default();
            kind.requests += 1;
            kind.by_reason.add(o.reason);
            let kind_failed = o.reason.is_failure();
            if kind_failed {
                kind.failed += 1;
            }
            let pod_key = match &o.pod {
                Some(p) if s.by_pod.len() < MAX_PODS || s.by_pod.contains_key(p) => p.clone(),
                Some(_) => "(other pods)".to_owned(),
                None => "(unknown)".to_owned(),
            };
            let pod = s.by_pod.entry(pod_key).or_default();
            pod.requests += 1;
            pod.by_reason.add(o.reason);
            if kind_failed {
                pod.failed += 1;
            }
            end_ms = end_ms.max(o.t_ms + o.latency_ms);
            let sec = (o.t_ms.max(0.0) / 1000.0) as usize;
            if s.timeline.len() <= sec {
                s.timeline.resize_with(sec + 1, Second::default);
            }
            let bucket = &mut s.timeline[sec];
            if o.reason.is_failure() {
                bucket.failed += 1;
                bucket.failed_by_reason.add(o.reason);
                let t = round3(o.t_ms / 1000.0);
                s.first_failure_s = Some(s.first_failure_s.map_or(t, |f| f.min(t)));
                s.last_failure_s = Some(s.last_failure_s.map_or(t, |l| l.max(t)));
                let key = format!("{}: {}", o.reason, o.detail);
                if s.by_detail.len() < MAX_DETAILS || s.by_detail.contains_key(&key) {
                    *s.by_detail.entry(key).or_default() += 1;
                } else {
                    *s.by_detail
                        .entry(format!("{}: (other details)", o.reason))
                        .or_default() += 1;
                }
            } else {
                bucket.ok += 1;
                latencies.push(o.latency_ms);
            }
        }
        for (t, bucket) in s.timeline.iter_mut().enumerate() {
            bucket.t = t as u64;
        }
        s.ok = s.by_reason.ok;
        s.failed = s.by_reason.failed();
        latencies.sort_by(f64::total_cmp);
        s.p50_ms = round3(percentile(&latencies, 50.0));
        s.p90_ms = round3(percentile(&latencies, 90.0));
        s.p99_ms = round3(percentile(&latencies, 99.0));
        s.max_ms = round3(latencies.last().copied().unwrap_or(0.0));
        s.duration_s = round3(end_ms / 1000.0);
        s
    }
}

/// Nearest-rank percentile of sorted values.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

pub(crate) fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(seq: u64, t_ms: f64, latency_ms: f64, reason: Reason, detail: &str) -> Outcome {
        Outcome {
            seq,
            kind: "http1".into(),
            t_ms,
            latency_ms,
            reason,
            detail: detail.into(),
            pod: (reason != Reason::Refused).then(|| format!("web-{}", seq % 2)),
        }
    }

    #[test]
    fn aggregates_reasons_timeline_and_percentiles() {
        let mut outcomes: Vec<Outcome> = (0..100)
            .map(|i| outcome(i, i as f64 * 20.0, (i + 1) as f64, Reason::Ok, ""))
            .collect();
        outcomes.push(outcome(
            100,
            1500.0,
            3.0,
            Reason::Reset,
            "io: connection reset",
        ));
        outcomes.push(outcome(
            101,
            2100.0,
            1.0,
            Reason::Refused,
            "connection refused",
        ));
        let s = Summary::from_outcomes(&outcomes);
        assert_eq!((s.requests, s.ok, s.failed), (102, 100, 2));
        assert_eq!(s.by_reason.reset, 1);
        assert_eq!(s.by_reason.refused, 1);
        assert_eq!(s.p50_ms, 50.0);
        assert_eq!(s.p99_ms, 99.0);
        assert_eq!(s.timeline.len(), 3);
        assert_eq!(s.timeline[0].ok, 50);
        assert_eq!(
            (
                s.timeline[1].ok,
                s.timeline[1].failed,
                s.timeline[1].failed_by_reason.reset
            ),
            (50, 1, 1)
        );
        assert_eq!(s.timeline[2].failed_by_reason.refused, 1);
        assert_eq!(s.by_detail.get("reset: io: connection reset"), Some(&1));
        assert_eq!(s.first_failure_s, Some(1.5));
        assert_eq!(s.by_kind["http1"].failed, 2);
        assert_eq!(s.by_pod["web-0"].requests, 51);
        assert_eq!(s.by_pod["web-0"].failed, 1);
        assert_eq!(s.by_pod["(unknown)"].by_reason.refused, 1);
    }

    #[test]
    fn json_has_the_documented_keys() {
        let s = Summary::from_outcomes(&[outcome(0, 0.0, 1.0, Reason::Http5xx, "HTTP 503")]);
        let v = serde_json::to_value(&s).expect("serializable");
        for key in [
            "requests",
            "failed",
            "by_reason",
            "p50_ms",
            "p99_ms",
            "duration_s",
            "timeline",
        ] {
            assert!(v.get(key).is_some(), "missing {key}");
        }
        assert_eq!(v["by_reason"]["http_5xx"], 1);
        assert_eq!(v["timeline"][0]["failed_by_reason"]["http_5xx"], 1);
        let back: Summary = serde_json::from_value(v).expect("round trip");
        assert_eq!(back, s);
    }
}
