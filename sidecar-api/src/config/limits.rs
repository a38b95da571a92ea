//! Timers and limits: the drain protocol's timers, protection against
//! abusive downstream traffic, and the pool of connections to the app.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::bounds::{self, MAX_DRAIN_TIMER, MAX_DURATION, count_in, duration_at_most, wide};
use super::{ConfigError, HumanDuration};

/// The drain protocol's timers (see docs/how-it-works.md, "The drain
/// protocol, step by step"). Each timer is at most [`MAX_DRAIN_TIMER`]
/// (1h), the operator's budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct DrainConfig {
    /// Serve at least this long after the trigger: routers lag. 0s to 1h.
    pub min_delay: HumanDuration,
    /// After `minDelay`, leave the grace phase once no new connection has
    /// arrived for this long (the evidence that routers moved on). 0s to 1h.
    pub quiet: HumanDuration,
    /// Leave the grace phase at the latest after this long, evidence or
    /// not. `minDelay` to 1h.
    pub max_delay: HumanDuration,
    /// Once closing, wait at most this long for in-flight work, then close
    /// what is left and count it as force-closed. More than 0s, at most 1h.
    pub timeout: HumanDuration,
    /// How a downstream HTTP/2 connection is told to go (docs/http2-drain.md).
    pub http2_go_away: Http2GoAway,
    /// What `/ready` answers during the grace phase (`Draining`).
    pub readiness: DrainReadiness,
    /// Who answers the gRPC health service (`grpc.health.v1.Health`) once
    /// a drain has started.
    pub grpc_health: DrainGrpcHealth,
    /// How an upgraded WebSocket ends at the drain deadline.
    ///
    /// This key and the two below are left out of a rendered file while
    /// they hold their defaults, so sidecars older than them (still running
    /// while the operator is upgraded) keep reloading the operator's files.
    #[serde(skip_serializing_if = "WebSocketClose::is_default")]
    pub websocket_close: WebSocketClose,
    /// With `goingAway`: the closes of all WebSocket sessions are spread
    /// over this window, which ends at the drain deadline (each session
    /// picks a random point in it), so their clients do not all reconnect
    /// at once. Capped by `timeout`; 0s to 1h.
    #[serde(skip_serializing_if = "is_default_close_window")]
    pub websocket_close_window: HumanDuration,
    /// With `goingAway`: how long a session waits for the peers' Close
    /// replies (and for a frame in flight to end) before its TCP close.
    /// Capped by `timeout` (not refused: a timeout shorter than this
    /// default was valid before the key existed); 0s to 1h.
    #[serde(skip_serializing_if = "is_default_close_wait")]
    pub websocket_close_wait: HumanDuration,
}

fn is_default_close_window(d: &HumanDuration) -> bool {
    *d == DrainConfig::default().websocket_close_window
}

fn is_default_close_wait(d: &HumanDuration) -> bool {
    *d == DrainConfig::default().websocket_close_wait
}

/// How an upgraded WebSocket connection ends when a drain reaches its
/// deadline. Other upgrades and TCP mode are always cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum WebSocketClose {
    /// A Close frame with 1001 (Going Away) to the client and to the app,
    /// each at a frame boundary, then the close handshake, then the TCP
    /// close; spread over `websocketCloseWindow`.
    #[default]
    GoingAway,
    /// The TCP connection is cut at the deadline, no Close frame.
    Cut,
}

impl WebSocketClose {
    fn is_default(&self) -> bool {
        *self == Self::default()
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::GoingAway => "goingAway",
            Self::Cut => "cut",
        }
    }
}

/// Who answers `grpc.health.v1.Health/Check` and `/Watch` once a drain has
/// started. gRPC clients that balance on the client side with health checks
/// (grpc-go's `healthCheckConfig`, Envoy's gRPC health checker) leave a
/// backend that reports NOT_SERVING; without that they keep sending to the
/// pod until its GOAWAY, as late as the drain allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum DrainGrpcHealth {
    /// From the trigger on the sidecar answers Check with NOT_SERVING
    /// itself, pushes NOT_SERVING down the Watch streams the app is
    /// answering, and ends those streams (UNAVAILABLE) when the listener
    /// closes. Before a drain every health call goes to the app.
    #[default]
    NotServing,
    /// Health calls always go to the app, which answers for itself.
    App,
}

impl DrainGrpcHealth {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NotServing => "notServing",
            Self::App => "app",
        }
    }
}

/// What `/ready` answers while a drain is in its grace phase. Only the
/// grace phase differs: once the listener closes (`Closing`, `Drained`) the
/// pod cannot take a connection and `/ready` fails in both modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum DrainReadiness {
    /// 503 from the trigger on: the endpoint turns not-serving and routers
    /// stop picking it as soon as they see that.
    #[default]
    FailFast,
    /// 200 through the grace phase while the app is reachable: the endpoint
    /// stays `serving` (and `terminating`), so routers that honour the
    /// terminating condition use it only as a last resort. For L4 load
    /// balancers with `externalTrafficPolicy: Local`, where the last pod of
    /// a node going unready blackholes the connections still sent there.
    StayServing,
}

impl DrainReadiness {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::FailFast => "failFast",
            Self::StayServing => "stayServing",
        }
    }
}

/// The frames that end a downstream HTTP/2 connection in a drain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Http2GoAway {
    /// Per connection: `finalOnly` for a client recognised by its SETTINGS
    /// as python's h2 (which fails on any frame after a GOAWAY),
    /// `twoPhase` for every other client.
    #[default]
    Auto,
    /// GOAWAY(2^31-1), PING, then GOAWAY(last stream) on the PING ack:
    /// what conforming clients (hyper, Go, gRPC) need to stop opening
    /// streams before the last stream id is fixed.
    TwoPhase,
    /// New streams are held unanswered, the streams already accepted
    /// finish, then one GOAWAY naming the last accepted stream is the last
    /// frame before the close: the held streams are above it, never seen
    /// by the app, so the client may retry them.
    FinalOnly,
}

impl Default for DrainConfig {
    fn default() -> Self {
        Self {
            min_delay: HumanDuration::from_secs(2),
            quiet: HumanDuration::from_secs(1),
            max_delay: HumanDuration::from_secs(15),
            timeout: HumanDuration::from_secs(30),
            http2_go_away: Http2GoAway::Auto,
            readiness: DrainReadiness::FailFast,
            grpc_health: DrainGrpcHealth::NotServing,
            websocket_close: WebSocketClose::GoingAway,
            websocket_close_window: HumanDuration::from_secs(5),
            websocket_close_wait: HumanDuration::from_secs(1),
        }
    }
}

impl DrainConfig {
    /// The longest a drain can take from trigger to `Drained`.
    pub fn worst_case(&self) -> Duration {
        self.max_delay.get().saturating_add(self.timeout.get())
    }
}

/// Protection against malformed and abusive downstream traffic. Every
/// duration here is at most [`MAX_DURATION`] (24h); each count's range is
/// in its comment ([`bounds`] holds them all).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct LimitsConfig {
    /// Largest request head (request line + headers) in bytes; beyond it
    /// HTTP/1 gets 431. 1024 to 1048576 (1 MiB).
    pub max_header_bytes: usize,
    /// Most headers in one request: 1 to 1000.
    pub max_headers: usize,
    /// A client must send its whole request head within this (slowloris).
    pub header_read_timeout: HumanDuration,
    /// Largest request body in bytes; 0 means unlimited. Beyond it: 413.
    /// At most 1 TiB.
    pub max_request_body_bytes: u64,
    /// Close a downstream keep-alive connection idle for this long.
    pub downstream_idle_timeout: HumanDuration,
    /// Most concurrent HTTP/2 streams per downstream connection, announced
    /// in SETTINGS_MAX_CONCURRENT_STREAMS (hyper's default, 200). A client
    /// that opens more gets REFUSED_STREAM for the extra ones, which it may
    /// retry; conforming clients queue them. 1 to 65536.
    pub max_concurrent_streams: u32,
    /// An HTTP/1 request body must arrive within this, extended by one
    /// second per `bodyMinRate` bytes received (Apache mod_reqtimeout's
    /// rule): a trickling sender gets 408. 0s turns it off.
    pub body_read_timeout: HumanDuration,
    /// Bytes per second that earn a slow upload one more second; at most
    /// 1 GiB/s.
    pub body_min_rate: u64,
    /// A client that takes no response byte for this long while one is
    /// waiting to be written is cut, which frees its app connection
    /// (nginx's send_timeout). 0s turns it off.
    pub write_timeout: HumanDuration,
    /// Close an upgraded tunnel (WebSocket) or a `protocol: tcp`
    /// connection after no byte moved either way for this long. 0s: never.
    pub tunnel_idle_timeout: HumanDuration,
    /// Downstream connections (tunnels included) open at once; past it new
    /// connections are closed at once. 0: no limit; at most 1000000.
    pub max_connections: usize,
    /// Admin connections open at once. Past it a new admin connection is
    /// still served for one request with a 1s header timeout, but only
    /// `/live`, `/ready` and a token-bearing `/drain` (probes and the
    /// preStop hook must keep working); everything else gets 503. 1 to 1024.
    pub admin_max_connections: usize,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            max_header_bytes: 64 * 1024,
            max_headers: 100,
            header_read_timeout: HumanDuration::from_secs(10),
            max_request_body_bytes: 0,
            downstream_idle_timeout: HumanDuration::from_secs(120),
            max_concurrent_streams: 200,
            body_read_timeout: HumanDuration::from_secs(30),
            body_min_rate: 500,
            write_timeout: HumanDuration::from_secs(60),
            tunnel_idle_timeout: HumanDuration::from_secs(3600),
            max_connections: 10_000,
            admin_max_connections: 64,
        }
    }
}

/// The pooled keep-alive connections from the sidecar to the app. Every
/// duration here is at most 1h ([`MAX_DRAIN_TIMER`]) except `idleTimeout`
/// (24h).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct UpstreamPoolConfig {
    /// Drop a pooled connection idle for this long. Must stay below the
    /// app's own keep-alive timeout (Go's default is 90s, Node's 5s) so the
    /// proxy never reuses a socket the app is closing.
    pub idle_timeout: HumanDuration,
    /// Idle connections kept per upstream; sized for bursts so a burst never
    /// degrades into a connection per request. At most 65536.
    pub max_idle: usize,
    /// More than 0s.
    pub connect_timeout: HumanDuration,
    /// While the app refuses connections (its container is restarting:
    /// liveness kill, crash, OOM kill), a request waits up to this long for
    /// it to come back and is then sent; past it the proxy answers 503 with
    /// `Retry-After`. 0 turns holding off (502 at once). See `app.rs`.
    pub hold_timeout: HumanDuration,
}

impl Default for UpstreamPoolConfig {
    fn default() -> Self {
        Self {
            // Below Node.js' 5s keepAliveTimeout, the shortest common default.
            idle_timeout: HumanDuration::from_secs(4),
            max_idle: 512,
            connect_timeout: HumanDuration::from_secs(1),
            // A kubelet restart of a crashed or liveness-killed container
            // takes about a second; a few more cover a slow start.
            hold_timeout: HumanDuration::from_secs(5),
        }
    }
}

impl DrainConfig {
    pub fn validate(&self, key: &str) -> Result<(), ConfigError> {
        if self.min_delay > self.max_delay {
            return Err(ConfigError::at(
                key,
                "minDelay",
                format!(
                    "{} is longer than maxDelay {}; minDelay must be <= maxDelay",
                    self.min_delay, self.max_delay
                ),
            ));
        }
        if self.timeout.get().is_zero() {
            return Err(ConfigError::at(
                key,
                "timeout",
                "must be more than 0s, or every in-flight request is cut at once",
            ));
        }
        for (field, value) in self.timers() {
            duration_at_most(key, field, value, MAX_DRAIN_TIMER)?;
        }
        Ok(())
    }

    /// Every timer with its key in the config file: the one list the
    /// sidecar's bound and the operator's re-check of a route both walk.
    pub fn timers(&self) -> [(&'static str, HumanDuration); 6] {
        [
            ("minDelay", self.min_delay),
            ("quiet", self.quiet),
            ("maxDelay", self.max_delay),
            ("timeout", self.timeout),
            ("websocketCloseWindow", self.websocket_close_window),
            ("websocketCloseWait", self.websocket_close_wait),
        ]
    }
}

impl LimitsConfig {
    pub fn validate(&self, key: &str) -> Result<(), ConfigError> {
        count_in(
            key,
            "maxHeaderBytes",
            wide(self.max_header_bytes),
            wide(bounds::MIN_HEADER_BYTES),
            wide(bounds::MAX_HEADER_BYTES),
            "real clients need 1 KiB; a head is buffered whole",
        )?;
        count_in(
            key,
            "maxHeaders",
            wide(self.max_headers),
            1,
            wide(bounds::MAX_HEADERS),
            "",
        )?;
        if self.header_read_timeout.get().is_zero() {
            return Err(ConfigError::at(
                key,
                "headerReadTimeout",
                "must be more than 0s; it is the slowloris guard",
            ));
        }
        if self.max_concurrent_streams == 0 {
            return Err(ConfigError::at(
                key,
                "maxConcurrentStreams",
                "must be at least 1, or no HTTP/2 request could be served",
            ));
        }
        if self.admin_max_connections == 0 {
            return Err(ConfigError::at(
                key,
                "adminMaxConnections",
                "must be at least 1; the kubelet's probes need the admin port",
            ));
        }
        for (field, value, max) in [
            (
                "maxRequestBodyBytes",
                self.max_request_body_bytes,
                bounds::MAX_REQUEST_BODY_BYTES,
            ),
            (
                "maxConcurrentStreams",
                u64::from(self.max_concurrent_streams),
                u64::from(bounds::MAX_CONCURRENT_STREAMS),
            ),
            ("bodyMinRate", self.body_min_rate, bounds::MAX_BODY_MIN_RATE),
            (
                "maxConnections",
                wide(self.max_connections),
                wide(bounds::MAX_CONNECTIONS),
            ),
            (
                "adminMaxConnections",
                wide(self.admin_max_connections),
                wide(bounds::MAX_ADMIN_CONNECTIONS),
            ),
        ] {
            count_in(key, field, value, 0, max, "")?;
        }
        for (field, value) in [
            ("headerReadTimeout", self.header_read_timeout),
            ("downstreamIdleTimeout", self.downstream_idle_timeout),
            ("bodyReadTimeout", self.body_read_timeout),
            ("writeTimeout", self.write_timeout),
            ("tunnelIdleTimeout", self.tunnel_idle_timeout),
        ] {
            duration_at_most(key, field, value, MAX_DURATION)?;
        }
        Ok(())
    }
}

impl UpstreamPoolConfig {
    pub fn validate(&self, key: &str) -> Result<(), ConfigError> {
        if self.connect_timeout.get().is_zero() {
            return Err(ConfigError::at(
                key,
                "connectTimeout",
                "must be more than 0s",
            ));
        }
        count_in(
            key,
            "maxIdle",
            wide(self.max_idle),
            0,
            wide(bounds::MAX_POOL_IDLE),
            "",
        )?;
        duration_at_most(key, "idleTimeout", self.idle_timeout, MAX_DURATION)?;
        duration_at_most(key, "connectTimeout", self.connect_timeout, MAX_DRAIN_TIMER)?;
        duration_at_most(key, "holdTimeout", self.hold_timeout, MAX_DRAIN_TIMER)?;
        Ok(())
    }
}
