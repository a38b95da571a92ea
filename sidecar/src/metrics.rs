//! Prometheus metrics, hand-rolled on atomics.
//!
//! The proxy is benchmarked against nginx and HAProxy, so recording a
//! request costs a handful of relaxed atomic adds: no lock, no allocation,
//! no label lookup. Connection and drain numbers are read from the drain
//! tracker at scrape time rather than kept twice.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use crate::circuit::{Route, RouteTable};
use crate::config::DrainReadiness;
use crate::drain::Drain;

use kubegrace_sidecar_api::exposition::Escaped;
/// Every `/metrics` part (the proxy, the route table, the app watch) writes
/// through the contract's one exposition writer.
pub(crate) use kubegrace_sidecar_api::exposition::Family;

/// Upper bounds of the request duration histogram, in seconds.
const BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
/// The same bounds in microseconds, for an integer compare on the hot path.
const BUCKETS_US: [u64; 14] = [
    500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000,
    2_500_000, 5_000_000, 10_000_000,
];

#[derive(Default)]
pub struct Metrics {
    inflight: AtomicI64,
    /// Responses given before any route was chosen, by status class:
    /// index 0 = 1xx ... 4 = 5xx. A routed response counts on its route
    /// (`RouteStats::responses`).
    unrouted_by_class: [AtomicU64; 5],
    /// Non-cumulative bucket counts; the last slot is +Inf.
    duration_buckets: [AtomicU64; BUCKETS.len() + 1],
    duration_sum_us: AtomicU64,
    duration_count: AtomicU64,
    reloads_ok: AtomicU64,
    reloads_error: AtomicU64,
    /// Keys of the config file in force that this release skipped.
    config_unknown_keys: AtomicU64,
    upstream_errors: AtomicU64,
    upstream_timeouts: AtomicU64,
    /// Requests refused with 413 (a client error: declared or sent too much).
    client_body_too_large: AtomicU64,
    upgrades: AtomicU64,
    tcp_connect_errors: AtomicU64,
    idle_close_cuts: AtomicU64,
    /// HTTP/2 connections sent away, by GOAWAY sequence (http2.rs).
    http2_goaway_two_phase: AtomicU64,
    http2_goaway_final_only: AtomicU64,
    /// Streams held unanswered and left above a final GOAWAY's id.
    http2_held_streams: AtomicU64,
    /// HTTP/2 streams reset because the client gave no window for
    /// `limits.writeTimeout`.
    http2_stream_write_timeouts: AtomicU64,
    /// Requests whose body failed on the client's side: bad framing.
    client_bad_body: AtomicU64,
    /// ... or the client went away mid-body.
    client_gone: AtomicU64,
    timeout_header_read: AtomicU64,
    timeout_body_read: AtomicU64,
    timeout_write: AtomicU64,
    timeout_tunnel_idle: AtomicU64,
    refused_proxy: AtomicU64,
    refused_admin: AtomicU64,
    upgrades_ignored: AtomicU64,
    /// NOT_SERVING answers the sidecar gave for the app while draining
    /// (drain.grpcHealth: notServing), by health RPC.
    grpc_health_check: AtomicU64,
    grpc_health_watch: AtomicU64,
    /// WebSocket sessions closed with Close 1001 at the drain deadline
    /// (drain.websocketClose: goingAway), by outcome (websocket/).
    websocket_close_clean: AtomicU64,
    websocket_close_no_reply: AtomicU64,
    websocket_close_mid_frame: AtomicU64,
}

/// How a WebSocket close at the drain deadline went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WebSocketCloseOutcome {
    /// Both peers answered with their Close within the wait.
    Clean,
    /// Both Close frames were sent; a peer did not answer within the wait.
    NoReply,
    /// A direction stayed inside a frame for the whole wait (or stopped
    /// looking like WebSocket frames): no Close could be sent there.
    MidFrame,
}

/// The two RPCs of `grpc.health.v1.Health`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HealthRpc {
    Check,
    Watch,
}

/// Why a request failed on the client's side (never the app's fault).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientError {
    /// Malformed body framing (invalid chunk size, ...).
    BadBody,
    /// The client closed or reset before its body was complete.
    Gone,
}

/// Which time limit cut a client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientTimeout {
    HeaderRead,
    BodyRead,
    Write,
    TunnelIdle,
}

impl Metrics {
    #[inline]
    pub fn request_started(&self) {
        self.inflight.fetch_add(1, Ordering::Relaxed);
    }

    #[inline]
    pub fn request_finished(&self, elapsed: Duration) {
        self.inflight.fetch_sub(1, Ordering::Relaxed);
        let us = elapsed.as_micros().min(u64::MAX as u128) as u64;
        let idx = BUCKETS_US
            .iter()
            .position(|&b| us <= b)
            .unwrap_or(BUCKETS_US.len());
        self.duration_buckets[idx].fetch_add(1, Ordering::Relaxed);
        self.duration_sum_us.fetch_add(us, Ordering::Relaxed);
        self.duration_count.fetch_add(1, Ordering::Relaxed);
    }

    /// One response sent downstream, counted on `route` (the config's
    /// route that matched) or, answered before routing, on none.
    #[inline]
    pub fn response(&self, status: http::StatusCode, route: Option<&Route>) {
        let class = usize::from((status.as_u16() / 100).clamp(1, 5)) - 1;
        match route {
            Some(route) => route.count_response(class),
            None => {
                self.unrouted_by_class[class].fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    pub fn reload(&self, ok: bool) {
        if ok {
            self.reloads_ok.fetch_add(1, Ordering::Relaxed);
        } else {
            self.reloads_error.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The config file now in force has `n` keys this release skipped
    /// (set at start and by each good reload; a refused one changes
    /// nothing, as the config in force does not change).
    pub fn config_unknown_keys(&self, n: usize) {
        self.config_unknown_keys
            .store(u64::try_from(n).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    pub fn upstream_error(&self) {
        self.upstream_errors.fetch_add(1, Ordering::Relaxed);
    }

    pub fn upstream_timeout(&self) {
        self.upstream_timeouts.fetch_add(1, Ordering::Relaxed);
    }

    /// An idle connection's graceful close was not acknowledged in time
    /// (an HTTP/2 client that never answers the shutdown PING).
    pub fn idle_close_cut(&self) {
        self.idle_close_cuts.fetch_add(1, Ordering::Relaxed);
    }

    /// An HTTP/2 connection starts its GOAWAY sequence.
    pub fn http2_goaway(&self, final_only: bool) {
        let counter = if final_only {
            &self.http2_goaway_final_only
        } else {
            &self.http2_goaway_two_phase
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// The sidecar told a health client NOT_SERVING: answered a Check, or
    /// pushed the status down (or answered) a Watch stream.
    pub fn grpc_health_not_serving(&self, rpc: HealthRpc) {
        let counter = match rpc {
            HealthRpc::Check => &self.grpc_health_check,
            HealthRpc::Watch => &self.grpc_health_watch,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub fn websocket_close(&self, outcome: WebSocketCloseOutcome) {
        let counter = match outcome {
            WebSocketCloseOutcome::Clean => &self.websocket_close_clean,
            WebSocketCloseOutcome::NoReply => &self.websocket_close_no_reply,
            WebSocketCloseOutcome::MidFrame => &self.websocket_close_mid_frame,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Streams a final GOAWAY left above its last-stream-id: the app never
    /// saw them, the client retries them on another connection.
    pub fn http2_held_streams(&self, n: u64) {
        self.http2_held_streams.fetch_add(n, Ordering::Relaxed);
    }

    /// An HTTP/2 stream was reset (CANCEL): its client gave no window for
    /// `limits.writeTimeout`.
    pub fn http2_stream_write_timeout(&self) {
        self.http2_stream_write_timeouts
            .fetch_add(1, Ordering::Relaxed);
    }

    pub fn body_too_large(&self) {
        self.client_body_too_large.fetch_add(1, Ordering::Relaxed);
    }

    pub fn upgrade(&self) {
        self.upgrades.fetch_add(1, Ordering::Relaxed);
    }

    pub fn tcp_connect_error(&self) {
        self.tcp_connect_errors.fetch_add(1, Ordering::Relaxed);
    }

    pub fn client_error(&self, kind: ClientError) {
        let counter = match kind {
            ClientError::BadBody => &self.client_bad_body,
            ClientError::Gone => &self.client_gone,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub fn client_timeout(&self, kind: ClientTimeout) {
        let counter = match kind {
            ClientTimeout::HeaderRead => &self.timeout_header_read,
            ClientTimeout::BodyRead => &self.timeout_body_read,
            ClientTimeout::Write => &self.timeout_write,
            ClientTimeout::TunnelIdle => &self.timeout_tunnel_idle,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// A connection closed at once (or, on the admin port, served probes
    /// only) because its listener was at its connection limit.
    pub fn connection_refused(&self, listener: &str) {
        let counter = if listener == "admin" {
            &self.refused_admin
        } else {
            &self.refused_proxy
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub fn upgrade_ignored(&self) {
        self.upgrades_ignored.fetch_add(1, Ordering::Relaxed);
    }

    pub fn inflight(&self) -> i64 {
        self.inflight.load(Ordering::Relaxed)
    }

    /// In flight now and finished so far, for the drain report.
    pub fn request_tally(&self) -> crate::drain::RequestTally {
        crate::drain::RequestTally {
            inflight: u64::try_from(self.inflight()).unwrap_or(0),
            finished: self.duration_count.load(Ordering::Relaxed),
        }
    }

    /// `kubegrace_requests_total`: one series per route of `routes` and
    /// status class, and the unrouted ones under `route=""`. Cardinality is
    /// bounded by the config (at most `MAX_ROUTES` routes, each name
    /// unique and not empty, so `""` is no route's name) times five.
    pub fn render_requests(&self, routes: &RouteTable, out: &mut String) {
        let mut family = Family::new(
            out,
            "kubegrace_requests_total",
            "counter",
            "Responses sent downstream, by route (the config's route that matched; empty for answers given before routing: a bad target, a health answer while draining) and status class.",
        );
        let unrouted = self
            .unrouted_by_class
            .each_ref()
            .map(|c| c.load(Ordering::Relaxed));
        for (route, counts) in routes.response_counts().chain([("", unrouted)]) {
            for (class, n) in (1..).zip(counts) {
                family.series(
                    format_args!("route=\"{}\",code_class=\"{class}xx\"", Escaped(route)),
                    n,
                );
            }
        }
    }

    /// Prometheus text exposition format 0.0.4.
    pub fn render(&self, drain: &Drain, out: &mut String) {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        // An info metric: a dashboard joins on it to tell which pods still
        // run an old sidecar after an upgrade.
        Family::new(
            out,
            "kubegrace_build_info",
            "gauge",
            "The sidecar's version and the git revision it was built from.",
        )
        .series(
            format_args!(
                "version=\"{}\",revision=\"{}\"",
                env!("CARGO_PKG_VERSION"),
                kubegrace_sidecar_api::build::REVISION
            ),
            1,
        );
        Family::new(
            out,
            "kubegrace_inflight_requests",
            "gauge",
            "Requests between arrival and the end of the response body.",
        )
        .value(self.inflight().max(0));
        Family::new(
            out,
            "kubegrace_open_connections",
            "gauge",
            "Downstream connections (and upgraded tunnels) open now.",
        )
        .value(drain.open_connections());
        Family::new(
            out,
            "kubegrace_connections_total",
            "counter",
            "Downstream connections accepted.",
        )
        .value(drain.connections_total());
        Family::new(
            out,
            "kubegrace_drain_phase",
            "gauge",
            "0 serving, 1 draining, 2 closing, 3 drained.",
        )
        .value(drain.phase() as u8);

        // A state set (one series per mode, 1 on the one in force) rather
        // than an info label, so a dashboard can sum pods per mode and the
        // series exist before the first drain.
        let readiness = drain.timers().readiness;
        Family::new(
            out,
            "kubegrace_drain_readiness",
            "gauge",
            "The drain.readiness mode in force: fail_fast (/ready fails at the trigger) or stay_serving (/ready stays 200 through the grace phase while the app is reachable).",
        )
        .by(
            "mode",
            [
                ("fail_fast", DrainReadiness::FailFast),
                ("stay_serving", DrainReadiness::StayServing),
            ]
            .map(|(mode, value)| (mode, u8::from(readiness == value))),
        );

        Family::new(
            out,
            "kubegrace_grpc_health_not_serving_total",
            "counter",
            "NOT_SERVING answers the sidecar gave to grpc.health.v1.Health calls while draining (drain.grpcHealth: notServing), by rpc: check (answered) or watch (pushed down an open stream or answered).",
        )
        .by(
            "rpc",
            [
                ("check", get(&self.grpc_health_check)),
                ("watch", get(&self.grpc_health_watch)),
            ],
        );

        Family::new(
            out,
            "kubegrace_websocket_closes_total",
            "counter",
            "WebSocket sessions sent Close 1001 (Going Away) both ways at the drain deadline (drain.websocketClose: goingAway), by outcome: clean (both peers answered), no_reply (a peer did not answer within drain.websocketCloseWait), mid_frame (a direction stayed inside a frame; no Close there).",
        )
        .by(
            "outcome",
            [
                ("clean", get(&self.websocket_close_clean)),
                ("no_reply", get(&self.websocket_close_no_reply)),
                ("mid_frame", get(&self.websocket_close_mid_frame)),
            ],
        );

        Family::new(
            out,
            "kubegrace_drain_seconds",
            "gauge",
            "Seconds since the drain was triggered (final value once drained).",
        )
        .value(drain.drain_seconds());
        Family::new(
            out,
            "kubegrace_drain_force_closed_total",
            "counter",
            "Connections still open at the drain deadline and closed by force.",
        )
        .value(drain.force_closed_total());
        Family::new(
            out,
            "kubegrace_idle_close_cut_total",
            "counter",
            "Idle downstream connections whose graceful close (HTTP/2: GOAWAY and PING) went unanswered and were dropped.",
        )
        .value(get(&self.idle_close_cuts));
        Family::new(
            out,
            "kubegrace_http2_goaway_total",
            "counter",
            "HTTP/2 connections sent away, by GOAWAY sequence: two_phase (GOAWAY, PING, GOAWAY) or final_only (held streams, then one GOAWAY as the last frame; drain.http2GoAway).",
        )
        .by(
            "sequence",
            [
                ("two_phase", get(&self.http2_goaway_two_phase)),
                ("final_only", get(&self.http2_goaway_final_only)),
            ],
        );
        Family::new(
            out,
            "kubegrace_http2_held_streams_total",
            "counter",
            "HTTP/2 streams held unanswered during a final-only GOAWAY and left above its last stream id (never sent to the app; the client retries them).",
        )
        .value(get(&self.http2_held_streams));
        Family::new(
            out,
            "kubegrace_http2_stream_write_timeouts_total",
            "counter",
            "HTTP/2 streams reset (RST_STREAM CANCEL) because the client gave no flow-control window for limits.writeTimeout while their answer waited.",
        )
        .value(get(&self.http2_stream_write_timeouts));
        let mut histogram = Family::new(
            out,
            "kubegrace_request_duration_seconds",
            "histogram",
            "Arrival to the end of the response body.",
        );
        let mut cumulative = 0;
        for (i, bound) in BUCKETS.iter().enumerate() {
            cumulative += get(&self.duration_buckets[i]);
            histogram.part("_bucket", Some(format_args!("le=\"{bound}\"")), cumulative);
        }
        cumulative += get(&self.duration_buckets[BUCKETS.len()]);
        histogram.part("_bucket", Some(format_args!("le=\"+Inf\"")), cumulative);
        histogram.part("_sum", None, get(&self.duration_sum_us) as f64 / 1e6);
        histogram.part("_count", None, get(&self.duration_count));

        Family::new(
            out,
            "kubegrace_config_reloads_total",
            "counter",
            "Configuration reloads by result.",
        )
        .by(
            "result",
            [
                ("success", get(&self.reloads_ok)),
                ("error", get(&self.reloads_error)),
            ],
        );
        Family::new(
            out,
            "kubegrace_config_unknown_keys",
            "gauge",
            "Keys of the config file in force that this sidecar does not know and skipped (written by a newer operator during an upgrade; the log names them).",
        )
        .value(get(&self.config_unknown_keys));
        Family::new(
            out,
            "kubegrace_upstream_errors_total",
            "counter",
            "Requests the app could not answer, by kind.",
        )
        .by(
            "kind",
            [
                ("connect", get(&self.upstream_errors)),
                ("timeout", get(&self.upstream_timeouts)),
                ("tcp_connect", get(&self.tcp_connect_errors)),
            ],
        );
        // One family for every Upgrade request: tunneled (101 from the app,
        // bytes passed through) or ignored (a protocol not in
        // upgradeProtocols, forwarded without Upgrade).
        Family::new(
            out,
            "kubegrace_upgrades_total",
            "counter",
            "HTTP/1.1 Upgrade requests (WebSocket and others), by result: tunneled (passed through) or ignored (protocol not in upgradeProtocols, forwarded without Upgrade).",
        )
        .by(
            "result",
            [
                ("tunneled", get(&self.upgrades)),
                ("ignored", get(&self.upgrades_ignored)),
            ],
        );
        Family::new(
            out,
            "kubegrace_client_errors_total",
            "counter",
            "Requests that failed on the client's side, by kind; never counted against the app.",
        )
        .by(
            "kind",
            [
                ("bad_body", get(&self.client_bad_body)),
                ("gone", get(&self.client_gone)),
                ("body_too_large", get(&self.client_body_too_large)),
            ],
        );
        Family::new(
            out,
            "kubegrace_client_timeouts_total",
            "counter",
            "Clients cut by a time limit, by limit.",
        )
        .by(
            "kind",
            [
                ("header_read", get(&self.timeout_header_read)),
                ("body_read", get(&self.timeout_body_read)),
                ("write", get(&self.timeout_write)),
                ("tunnel_idle", get(&self.timeout_tunnel_idle)),
            ],
        );
        Family::new(
            out,
            "kubegrace_connections_refused_total",
            "counter",
            "Connections past limits.maxConnections (closed at once) or limits.adminMaxConnections (probes only).",
        )
        .by(
            "listener",
            [
                ("proxy", get(&self.refused_proxy)),
                ("admin", get(&self.refused_admin)),
            ],
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::DrainConfig;

    #[test]
    fn renders_counters_and_a_cumulative_histogram() {
        let m = Metrics::default();
        m.request_started();
        m.request_finished(Duration::from_micros(700));
        m.request_started();
        m.request_finished(Duration::from_secs(20));
        m.reload(false);
        let drain = Drain::new(DrainConfig::default());
        let mut out = String::new();
        m.render(&drain, &mut out);
        assert!(
            out.contains("kubegrace_request_duration_seconds_bucket{le=\"0.0005\"} 0\n"),
            "{out}"
        );
        assert!(
            out.contains("kubegrace_request_duration_seconds_bucket{le=\"0.001\"} 1\n"),
            "{out}"
        );
        assert!(
            out.contains("kubegrace_request_duration_seconds_bucket{le=\"10\"} 1\n"),
            "{out}"
        );
        assert!(
            out.contains("kubegrace_request_duration_seconds_bucket{le=\"+Inf\"} 2\n"),
            "{out}"
        );
        assert!(
            out.contains("kubegrace_request_duration_seconds_count 2\n"),
            "{out}"
        );
        assert!(
            out.contains("kubegrace_config_reloads_total{result=\"error\"} 1\n"),
            "{out}"
        );
        assert!(out.contains("kubegrace_inflight_requests 0\n"), "{out}");
        let build_info = format!(
            "kubegrace_build_info{{version=\"{}\",revision=\"{}\"}} 1\n",
            env!("CARGO_PKG_VERSION"),
            kubegrace_sidecar_api::build::REVISION
        );
        assert!(out.contains(&build_info), "{out}");
        assert!(out.contains("kubegrace_drain_phase 0\n"), "{out}");
        assert!(
            out.contains("kubegrace_drain_readiness{mode=\"fail_fast\"} 1\n"),
            "{out}"
        );
        assert!(
            out.contains("kubegrace_drain_readiness{mode=\"stay_serving\"} 0\n"),
            "{out}"
        );
    }

    #[test]
    fn requests_are_counted_per_route_and_unrouted_ones_under_an_empty_route() {
        let config = crate::cli::config_from_yaml(
            "routes:\n  - name: api\n    match: {pathPrefix: /api}\n  - name: 'we\"ird'\n    match: {pathPrefix: /w}\n",
        )
        .expect("valid config");
        let table = RouteTable::new(&config.routes);
        let m = Metrics::default();
        let get = http::Method::GET;
        m.response(
            http::StatusCode::OK,
            Some(&table.select(&get, None, "/api/x")),
        );
        m.response(
            http::StatusCode::OK,
            Some(&table.select(&get, None, "/api/y")),
        );
        m.response(
            http::StatusCode::NOT_FOUND,
            Some(&table.select(&get, None, "/w")),
        );
        m.response(
            http::StatusCode::OK,
            Some(&table.select(&get, None, "/other")),
        );
        m.response(http::StatusCode::BAD_REQUEST, None);
        // A status outside 100..=599 is counted in the nearest class.
        m.response(http::StatusCode::from_u16(999).expect("three digits"), None);
        let mut out = String::new();
        m.render_requests(&table, &mut out);
        for line in [
            "kubegrace_requests_total{route=\"api\",code_class=\"2xx\"} 2\n",
            "kubegrace_requests_total{route=\"api\",code_class=\"5xx\"} 0\n",
            "kubegrace_requests_total{route=\"we\\\"ird\",code_class=\"4xx\"} 1\n",
            "kubegrace_requests_total{route=\"default\",code_class=\"2xx\"} 1\n",
            "kubegrace_requests_total{route=\"\",code_class=\"4xx\"} 1\n",
            "kubegrace_requests_total{route=\"\",code_class=\"5xx\"} 1\n",
        ] {
            assert!(out.contains(line), "{line} missing from:\n{out}");
        }
        // Three routes and the unrouted ones, five classes each.
        assert_eq!(
            out.lines().filter(|l| !l.starts_with('#')).count(),
            4 * 5,
            "{out}"
        );
    }

    #[test]
    fn the_readiness_mode_in_force_is_the_one_set_to_1() {
        let drain = Drain::new(DrainConfig {
            readiness: DrainReadiness::StayServing,
            ..DrainConfig::default()
        });
        let mut out = String::new();
        Metrics::default().render(&drain, &mut out);
        assert!(
            out.contains("kubegrace_drain_readiness{mode=\"fail_fast\"} 0\n"),
            "{out}"
        );
        assert!(
            out.contains("kubegrace_drain_readiness{mode=\"stay_serving\"} 1\n"),
            "{out}"
        );
    }
}
