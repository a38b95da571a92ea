//! The sidecar's configuration: the one format that the YAML file, the
//! command line and the operator's ConfigMap all speak.
//!
//! The operator depends on this module to write the file, so the two cannot
//! drift. Every field has a default that is safe for a typical HTTP app, and
//! [`Config::validate`] names the offending key (`drain.minDelay`,
//! `routes[2].circuitBreaker.errorRatio`, ...) so a user knows what to fix.
//!
//! Precedence when the binary starts: flags > `KUBEGRACE_*` environment >
//! YAML file > defaults. On reload only the file is re-read; flags and
//! environment still win over it.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A configuration problem, always tied to the key that caused it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {message}")]
pub struct ConfigError {
    /// Dotted path of the key, in the YAML spelling (`drain.maxDelay`).
    pub key: String,
    pub message: String,
}

impl ConfigError {
    pub fn new(key: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            message: message.into(),
        }
    }
}

/// A duration written the way people write them: `300ms`, `2s`, `1m30s`.
///
/// Serialised back in the same human form, so `/config` and the operator's
/// ConfigMap stay readable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct HumanDuration(pub Duration);

impl HumanDuration {
    pub const fn from_millis(ms: u64) -> Self {
        Self(Duration::from_millis(ms))
    }
    pub const fn from_secs(s: u64) -> Self {
        Self(Duration::from_secs(s))
    }
    pub const fn get(self) -> Duration {
        self.0
    }
}

impl From<Duration> for HumanDuration {
    fn from(d: Duration) -> Self {
        Self(d)
    }
}

impl From<HumanDuration> for Duration {
    fn from(d: HumanDuration) -> Self {
        d.0
    }
}

impl FromStr for HumanDuration {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let trimmed = s.trim();
        if trimmed == "0" {
            return Ok(Self(Duration::ZERO));
        }
        humantime::parse_duration(trimmed).map(Self).map_err(|e| {
            format!("{trimmed:?} is not a duration ({e}); write it like 300ms, 2s or 1m30s")
        })
    }
}

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_zero() {
            return f.write_str("0s");
        }
        // humantime separates units with spaces ("1m 30s"); the compact form
        // is what people type into YAML and what the operator's CRD accepts.
        let text = humantime::format_duration(self.0)
            .to_string()
            .replace(' ', "");
        f.write_str(&text)
    }
}

impl Serialize for HumanDuration {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // A bare number is ambiguous (seconds? milliseconds?), so only
        // strings are accepted and the error says how to write one.
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// Where a listener or upstream lives: a TCP address or a Unix socket path
/// (`unix:/run/app.sock`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Endpoint {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

impl Endpoint {
    /// A TCP endpoint on port 0: the kernel picks the port at bind time.
    pub fn is_any_port(&self) -> bool {
        matches!(self, Self::Tcp(addr) if addr.port() == 0)
    }
}

impl FromStr for Endpoint {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if let Some(path) = s.strip_prefix("unix:") {
            if path.is_empty() {
                return Err("unix: needs a socket path, like unix:/run/app.sock".into());
            }
            return Ok(Self::Unix(PathBuf::from(path)));
        }
        // A bare port (":8080" or "8080") is what people type for "all interfaces".
        let with_host = if let Some(port) = s.strip_prefix(':') {
            format!("0.0.0.0:{port}")
        } else if s.chars().all(|c| c.is_ascii_digit()) && !s.is_empty() {
            format!("0.0.0.0:{s}")
        } else {
            s.to_string()
        };
        with_host.parse::<SocketAddr>().map(Self::Tcp).map_err(|_| {
            format!("{s:?} is not an address; write host:port (127.0.0.1:8081, [::1]:8081) or unix:/path")
        })
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Tcp(addr) => write!(f, "{addr}"),
            Self::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

impl Serialize for Endpoint {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Endpoint {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

fn is_one(n: &usize) -> bool {
    *n == 1
}

/// The most `workers` accepted: each is a listening socket and an accept
/// loop; beyond this it is a typo, not a tuning.
pub const MAX_WORKERS: usize = 64;

/// File permissions for a Unix listen socket, written in octal like chmod
/// (`"0660"`, `"660"`); serialised the same way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SocketMode(pub u32);

impl FromStr for SocketMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        match u32::from_str_radix(t, 8) {
            Ok(mode) if mode <= 0o777 => Ok(Self(mode)),
            _ => Err(format!(
                "{t:?} is not a file mode; write it in octal like chmod, e.g. 0660"
            )),
        }
    }
}

impl fmt::Display for SocketMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04o}", self.0)
    }
}

impl Serialize for SocketMode {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for SocketMode {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // YAML reads an unquoted 0660 as the decimal 660 (YAML 1.2) or as
        // 432 (1.1): only a string says what was meant.
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// How the listener treats the bytes it accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// HTTP/1.1 and HTTP/2 prior knowledge (h2c), told apart by the preface.
    /// gRPC and WebSocket ride on these.
    #[default]
    Auto,
    /// HTTP/1.1 only (Upgrade still passes through).
    Http1,
    /// HTTP/2 prior knowledge only (gRPC).
    Http2,
    /// Raw TCP pass-through for non-HTTP ports: drains by connection count.
    Tcp,
}

/// The whole sidecar configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Config {
    /// Where downstream traffic arrives (the port the Service targets).
    pub listen: Endpoint,
    /// The app, normally on loopback.
    pub upstream: Endpoint,
    /// Several instances of the app (blue/green slots during an app
    /// upgrade): new requests go to the one that most recently became
    /// reachable, requests in flight finish where they started. When set,
    /// `upstream` is its first entry (see [`Config::normalize`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub upstreams: Vec<Endpoint>,
    /// Admin port: /live, /ready, /drain, /metrics, /config, /breakers.
    /// Loopback by default; a non-loopback address needs a drain token
    /// (or `--admin-insecure`), or the sidecar refuses to start.
    pub admin: Endpoint,
    /// Accept loops on as many `SO_REUSEPORT` listeners (TCP listen only).
    #[serde(skip_serializing_if = "is_one")]
    pub workers: usize,
    /// Permissions of a `unix:` listen socket, in octal (`"0660"`); without
    /// it the process umask decides.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen_mode: Option<SocketMode>,
    pub protocol: Protocol,
    pub drain: DrainConfig,
    pub limits: LimitsConfig,
    pub upstream_pool: UpstreamPoolConfig,
    /// `Upgrade` protocols passed to the app (compared without case and
    /// version). A request offering anything else is forwarded as a plain
    /// request with `Upgrade` removed, as a server that does not speak the
    /// protocol would answer it (RFC 9110 §7.8): `h2c` never reaches the app.
    pub upgrade_protocols: Vec<String>,
    /// Which client-supplied forwarding headers to believe.
    pub forwarded: ForwardedConfig,
    /// Per-route policy; first match wins, and a built-in default route
    /// (no timeout, no breaker) catches the rest.
    pub routes: Vec<RouteConfig>,
}

/// The default admin address: loopback, so nothing off the machine (or
/// the pod) can drain the process unless it is exposed on purpose.
pub const DEFAULT_ADMIN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 15020);

/// Forwarding headers (`X-Forwarded-Proto`) from the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ForwardedConfig {
    /// Proxies in front of the sidecar whose `X-Forwarded-Proto` is
    /// believed. 0 (the default): the sidecar sets it from the connection
    /// it accepted (`http`), whatever the client sent; 1 or more: a value
    /// the client (the trusted balancer) sent is kept.
    pub trusted_hops: u32,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: Endpoint::Tcp(SocketAddr::from(([0, 0, 0, 0], 8080))),
            upstream: Endpoint::Tcp(SocketAddr::from(([127, 0, 0, 1], 8081))),
            upstreams: Vec::new(),
            admin: Endpoint::Tcp(DEFAULT_ADMIN),
            workers: 1,
            listen_mode: None,
            protocol: Protocol::Auto,
            drain: DrainConfig::default(),
            limits: LimitsConfig::default(),
            upstream_pool: UpstreamPoolConfig::default(),
            upgrade_protocols: vec!["websocket".to_string()],
            forwarded: ForwardedConfig::default(),
            routes: Vec::new(),
        }
    }
}

/// The drain protocol's timers (see DESIGN.md, "Drain protocol").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct DrainConfig {
    /// Serve at least this long after the trigger: routers lag.
    pub min_delay: HumanDuration,
    /// After `minDelay`, leave the grace phase once no new connection has
    /// arrived for this long (the evidence that routers moved on).
    pub quiet: HumanDuration,
    /// Leave the grace phase at the latest after this long, evidence or not.
    pub max_delay: HumanDuration,
    /// Once closing, wait at most this long for in-flight work, then close
    /// what is left and count it as force-closed.
    pub timeout: HumanDuration,
}

impl Default for DrainConfig {
    fn default() -> Self {
        Self {
            min_delay: HumanDuration::from_secs(2),
            quiet: HumanDuration::from_secs(1),
            max_delay: HumanDuration::from_secs(15),
            timeout: HumanDuration::from_secs(30),
        }
    }
}

impl DrainConfig {
    /// The longest a drain can take from trigger to `Drained`.
    pub fn worst_case(&self) -> Duration {
        self.max_delay.get() + self.timeout.get()
    }
}

/// Protection against malformed and abusive downstream traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// Largest request head (request line + headers) in bytes; beyond it
    /// HTTP/1 gets 431.
    pub max_header_bytes: usize,
    /// Most headers in one request.
    pub max_headers: usize,
    /// A client must send its whole request head within this (slowloris).
    pub header_read_timeout: HumanDuration,
    /// Largest request body in bytes; 0 means unlimited. Beyond it: 413.
    pub max_request_body_bytes: u64,
    /// Close a downstream keep-alive connection idle for this long.
    pub downstream_idle_timeout: HumanDuration,
    /// Most concurrent HTTP/2 streams per downstream connection, announced
    /// in SETTINGS_MAX_CONCURRENT_STREAMS (hyper's default, 200). A client
    /// that opens more gets REFUSED_STREAM for the extra ones, which it may
    /// retry; conforming clients queue them.
    pub max_concurrent_streams: u32,
    /// An HTTP/1 request body must arrive within this, extended by one
    /// second per `bodyMinRate` bytes received (Apache mod_reqtimeout's
    /// rule): a trickling sender gets 408. 0s turns it off.
    pub body_read_timeout: HumanDuration,
    /// Bytes per second that earn a slow upload one more second.
    pub body_min_rate: u64,
    /// A client that takes no response byte for this long while one is
    /// waiting to be written is cut, which frees its app connection
    /// (nginx's send_timeout). 0s turns it off.
    pub write_timeout: HumanDuration,
    /// Close an upgraded tunnel (WebSocket) or a `protocol: tcp`
    /// connection after no byte moved either way for this long. 0s: never.
    pub tunnel_idle_timeout: HumanDuration,
    /// Downstream connections (tunnels included) open at once; past it new
    /// connections are closed at once. 0: no limit.
    pub max_connections: usize,
    /// Admin connections open at once. Past it a new admin connection is
    /// still served for one request with a 1s header timeout, but only
    /// `/live`, `/ready` and a token-bearing `/drain` (probes and the
    /// preStop hook must keep working); everything else gets 503.
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

/// The pooled keep-alive connections from the sidecar to the app.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct UpstreamPoolConfig {
    /// Drop a pooled connection idle for this long. Must stay below the
    /// app's own keep-alive timeout (Go's default is 90s, Node's 5s) so the
    /// proxy never reuses a socket the app is closing.
    pub idle_timeout: HumanDuration,
    /// Idle connections kept per upstream; sized for bursts so a burst never
    /// degrades into a connection per request.
    pub max_idle: usize,
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

/// Name of the catch-all route: the sidecar's built-in route for whatever no
/// configured route matched. A configured route with this name sets the
/// catch-all's policy instead of adding a second one. The operator emits its
/// route-wide breaker under this name, so both binaries share one constant.
pub const CATCH_ALL_ROUTE: &str = "default";

/// One route: a match, and the policy applied to what it matches.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RouteConfig {
    pub name: String,
    #[serde(default, rename = "match")]
    pub matcher: RouteMatch,
    /// Upstream request timeout for this route (counts as a failure).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<HumanDuration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub circuit_breaker: Option<CircuitBreakerConfig>,
    /// Served while the breaker is open, on queue overflow and on queue
    /// timeout. Without one, a plain 503 with `Retry-After`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<FallbackConfig>,
    /// What counts as a failure for the breaker.
    #[serde(default = "FailureKind::defaults")]
    pub fail_on: Vec<FailureKind>,
}

/// Which requests a route takes. Empty fields match anything.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RouteMatch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_prefix: Option<String>,
    /// Exact path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub methods: Vec<String>,
    /// Host header without port; `*.example.com` matches one or more labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
}

/// What counts against the breaker. 4xx never does: it is the client's fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureKind {
    /// Any 5xx from the app.
    Status5xx,
    /// One specific 5xx status.
    Status(u16),
    /// The app refused or reset the connection.
    ConnectError,
    /// The route's timeout passed.
    Timeout,
}

impl FailureKind {
    pub fn defaults() -> Vec<Self> {
        vec![Self::Status5xx, Self::ConnectError, Self::Timeout]
    }
}

impl FromStr for FailureKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "5xx" => Ok(Self::Status5xx),
            "connect-error" => Ok(Self::ConnectError),
            "timeout" => Ok(Self::Timeout),
            other => match other.parse::<u16>() {
                Ok(code @ 500..=599) => Ok(Self::Status(code)),
                Ok(code @ 400..=499) => Err(format!(
                    "{code} is a client error; 4xx responses never count as failures"
                )),
                _ => Err(format!(
                    "{other:?} is not a failure kind; use 5xx, a 5xx status such as 503, connect-error or timeout"
                )),
            },
        }
    }
}

impl fmt::Display for FailureKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Status5xx => f.write_str("5xx"),
            Self::Status(code) => write!(f, "{code}"),
            Self::ConnectError => f.write_str("connect-error"),
            Self::Timeout => f.write_str("timeout"),
        }
    }
}

impl Serialize for FailureKind {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for FailureKind {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // YAML users write `503` unquoted; accept numbers as well as strings.
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Text(String),
            Code(u16),
        }
        let text = match Raw::deserialize(deserializer)? {
            Raw::Text(t) => t,
            Raw::Code(c) => c.to_string(),
        };
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// Concurrency limit, queue and breaker for one route.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct CircuitBreakerConfig {
    /// Requests in flight to the app at once (the ceiling when adaptive).
    pub max_concurrent: u32,
    /// Requests waiting for a slot; beyond it the fallback is served.
    pub max_queue: u32,
    pub queue_timeout: HumanDuration,
    /// Open when failures / requests >= this over `window`; 0 disables.
    pub error_ratio: f64,
    /// The ratio only counts once this many requests were seen in `window`.
    pub min_requests: u32,
    pub window: HumanDuration,
    /// Open on this many failures in a row; 0 disables.
    pub consecutive_failures: u32,
    /// First open period; grows with backoff and jitter while failures repeat.
    pub open_for: HumanDuration,
    /// Longest open period the backoff reaches.
    pub max_open_for: HumanDuration,
    /// Probe requests let through while half-open.
    pub half_open_probes: u32,
    /// Find the app's capacity from observed latency (gradient style),
    /// between `minConcurrent` and `maxConcurrent`.
    pub adaptive: bool,
    pub min_concurrent: u32,
}

impl Default for CircuitBreakerConfig {
    fn default() -> Self {
        Self {
            max_concurrent: 1024,
            max_queue: 1024,
            queue_timeout: HumanDuration::from_secs(1),
            error_ratio: 0.5,
            min_requests: 20,
            window: HumanDuration::from_secs(10),
            consecutive_failures: 5,
            open_for: HumanDuration::from_secs(5),
            max_open_for: HumanDuration::from_secs(60),
            half_open_probes: 1,
            adaptive: false,
            min_concurrent: 1,
        }
    }
}

/// The response served instead of the app's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct FallbackConfig {
    pub status: u16,
    pub content_type: String,
    pub body: String,
}

impl Default for FallbackConfig {
    fn default() -> Self {
        Self {
            status: 503,
            content_type: "text/plain; charset=utf-8".into(),
            body: "service unavailable\n".into(),
        }
    }
}

impl Config {
    /// Parses a YAML document and validates it.
    pub fn from_yaml(text: &str) -> Result<Self, ConfigError> {
        let config: Config = serde_yaml::from_str(text).map_err(|e| {
            // serde_yaml's message already names the field and position.
            let key = e
                .location()
                .map(|l| format!("line {} column {}", l.line(), l.column()))
                .unwrap_or_else(|| "config".into());
            ConfigError::new(key, e.to_string())
        })?;
        config.validate()?;
        Ok(config)
    }

    /// Renders the config as YAML (what the operator writes into ConfigMaps).
    pub fn to_yaml(&self) -> Result<String, ConfigError> {
        serde_yaml::to_string(self).map_err(|e| ConfigError::new("config", e.to_string()))
    }

    /// Checks everything serde cannot: ranges and relations between keys.
    /// The app instances to send to: `upstreams` when given, otherwise the
    /// one `upstream`.
    pub fn upstream_endpoints(&self) -> Vec<Endpoint> {
        if self.upstreams.is_empty() {
            vec![self.upstream.clone()]
        } else {
            self.upstreams.clone()
        }
    }

    /// Makes `upstream` the first of `upstreams` when a list is given, so
    /// everything that reads the single `upstream` (the operator, `/config`)
    /// sees a real instance. Call before [`Config::validate`].
    pub fn normalize(&mut self) {
        if let Some(first) = self.upstreams.first()
            && self.upstream == Config::default().upstream
        {
            self.upstream = first.clone();
        }
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        self.drain.validate("drain")?;
        self.limits.validate("limits")?;
        self.upstream_pool.validate("upstreamPool")?;
        for (i, protocol) in self.upgrade_protocols.iter().enumerate() {
            let token_ok = !protocol.is_empty()
                && protocol
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
            if !token_ok {
                return Err(ConfigError::new(
                    format!("upgradeProtocols[{i}]"),
                    format!(
                        "{protocol:?} is not a protocol name; write it as in the Upgrade header, e.g. websocket"
                    ),
                ));
            }
        }
        // Port 0 means "pick a free port" (tests run many sidecars side by
        // side), so two port-0 endpoints never collide.
        if self.listen == self.upstream && !self.listen.is_any_port() {
            return Err(ConfigError::new(
                "upstream",
                format!(
                    "{} is also the listen address; the proxy would call itself",
                    self.upstream
                ),
            ));
        }
        for (i, endpoint) in self.upstreams.iter().enumerate() {
            if *endpoint == self.listen && !self.listen.is_any_port() {
                return Err(ConfigError::new(
                    format!("upstreams[{i}]"),
                    format!("{endpoint} is also the listen address; the proxy would call itself"),
                ));
            }
            if self.upstreams[..i].contains(endpoint) {
                return Err(ConfigError::new(
                    format!("upstreams[{i}]"),
                    format!("{endpoint} is listed twice"),
                ));
            }
        }
        if !self.upstreams.is_empty() && !self.upstreams.contains(&self.upstream) {
            return Err(ConfigError::new(
                "upstream",
                format!(
                    "{} is not one of upstreams; give the instances as one list (upstreams, or --upstream repeated)",
                    self.upstream
                ),
            ));
        }
        if !(1..=MAX_WORKERS).contains(&self.workers) {
            return Err(ConfigError::new(
                "workers",
                format!("{} is out of range; use 1 to {MAX_WORKERS}", self.workers),
            ));
        }
        if self.listen_mode.is_some() && !matches!(self.listen, Endpoint::Unix(_)) {
            return Err(ConfigError::new(
                "listenMode",
                format!(
                    "only applies to a unix: listen socket, and listen is {}",
                    self.listen
                ),
            ));
        }
        if self.admin == self.listen && !self.admin.is_any_port() {
            return Err(ConfigError::new(
                "admin",
                format!(
                    "{} is also the listen address; give the admin port its own",
                    self.admin
                ),
            ));
        }
        let mut names = std::collections::HashSet::new();
        for (i, route) in self.routes.iter().enumerate() {
            let key = format!("routes[{i}]");
            if !names.insert(route.name.as_str()) {
                return Err(ConfigError::new(
                    format!("{key}.name"),
                    format!(
                        "{:?} is used by an earlier route; route names must be unique",
                        route.name
                    ),
                ));
            }
            route.validate(&key)?;
        }
        Ok(())
    }
}

impl DrainConfig {
    pub fn validate(&self, key: &str) -> Result<(), ConfigError> {
        if self.min_delay > self.max_delay {
            return Err(ConfigError::new(
                format!("{key}.minDelay"),
                format!(
                    "{} is longer than maxDelay {}; minDelay must be <= maxDelay",
                    self.min_delay, self.max_delay
                ),
            ));
        }
        if self.timeout.get().is_zero() {
            return Err(ConfigError::new(
                format!("{key}.timeout"),
                "must be more than 0s, or every in-flight request is cut at once",
            ));
        }
        Ok(())
    }
}

impl LimitsConfig {
    pub fn validate(&self, key: &str) -> Result<(), ConfigError> {
        if self.max_header_bytes < 1024 {
            return Err(ConfigError::new(
                format!("{key}.maxHeaderBytes"),
                format!(
                    "{} is too small for real clients; use at least 1024",
                    self.max_header_bytes
                ),
            ));
        }
        if self.max_headers == 0 {
            return Err(ConfigError::new(
                format!("{key}.maxHeaders"),
                "must be at least 1",
            ));
        }
        if self.header_read_timeout.get().is_zero() {
            return Err(ConfigError::new(
                format!("{key}.headerReadTimeout"),
                "must be more than 0s; it is the slowloris guard",
            ));
        }
        if self.max_concurrent_streams == 0 {
            return Err(ConfigError::new(
                format!("{key}.maxConcurrentStreams"),
                "must be at least 1, or no HTTP/2 request could be served",
            ));
        }
        if self.admin_max_connections == 0 {
            return Err(ConfigError::new(
                format!("{key}.adminMaxConnections"),
                "must be at least 1; the kubelet's probes need the admin port",
            ));
        }
        Ok(())
    }
}

impl UpstreamPoolConfig {
    pub fn validate(&self, key: &str) -> Result<(), ConfigError> {
        if self.connect_timeout.get().is_zero() {
            return Err(ConfigError::new(
                format!("{key}.connectTimeout"),
                "must be more than 0s",
            ));
        }
        Ok(())
    }
}

impl RouteConfig {
    pub fn validate(&self, key: &str) -> Result<(), ConfigError> {
        if self.name.is_empty() {
            return Err(ConfigError::new(format!("{key}.name"), "must not be empty"));
        }
        let m = &self.matcher;
        if m.path.is_some() && m.path_prefix.is_some() {
            return Err(ConfigError::new(
                format!("{key}.match"),
                "set path (exact) or pathPrefix, not both",
            ));
        }
        for (field, value) in [("path", &m.path), ("pathPrefix", &m.path_prefix)] {
            if let Some(p) = value
                && !p.starts_with('/')
            {
                return Err(ConfigError::new(
                    format!("{key}.match.{field}"),
                    format!("{p:?} must start with /"),
                ));
            }
        }
        for (j, method) in m.methods.iter().enumerate() {
            if method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()) {
                return Err(ConfigError::new(
                    format!("{key}.match.methods[{j}]"),
                    format!("{method:?} is not an HTTP method; write it in capitals, like GET"),
                ));
            }
        }
        if let Some(t) = self.timeout
            && t.get().is_zero()
        {
            return Err(ConfigError::new(
                format!("{key}.timeout"),
                "must be more than 0s; leave it out for no timeout",
            ));
        }
        if let Some(cb) = &self.circuit_breaker {
            cb.validate(&format!("{key}.circuitBreaker"))?;
        }
        if let Some(fb) = &self.fallback {
            fb.validate(&format!("{key}.fallback"))?;
        }
        Ok(())
    }
}

impl CircuitBreakerConfig {
    pub fn validate(&self, key: &str) -> Result<(), ConfigError> {
        if self.max_concurrent == 0 {
            return Err(ConfigError::new(
                format!("{key}.maxConcurrent"),
                "must be at least 1",
            ));
        }
        if !(0.0..=1.0).contains(&self.error_ratio) || self.error_ratio.is_nan() {
            return Err(ConfigError::new(
                format!("{key}.errorRatio"),
                format!(
                    "{} is not a ratio; use a number from 0 (off) to 1",
                    self.error_ratio
                ),
            ));
        }
        if self.error_ratio > 0.0 && self.window.get().is_zero() {
            return Err(ConfigError::new(
                format!("{key}.window"),
                "must be more than 0s when errorRatio is set",
            ));
        }
        if self.open_for.get().is_zero() {
            return Err(ConfigError::new(
                format!("{key}.openFor"),
                "must be more than 0s",
            ));
        }
        if self.max_open_for < self.open_for {
            return Err(ConfigError::new(
                format!("{key}.maxOpenFor"),
                format!(
                    "{} is shorter than openFor {}",
                    self.max_open_for, self.open_for
                ),
            ));
        }
        if self.half_open_probes == 0 {
            return Err(ConfigError::new(
                format!("{key}.halfOpenProbes"),
                "must be at least 1, or the breaker could never close again",
            ));
        }
        if self.adaptive && (self.min_concurrent == 0 || self.min_concurrent > self.max_concurrent)
        {
            return Err(ConfigError::new(
                format!("{key}.minConcurrent"),
                format!(
                    "{} must be between 1 and maxConcurrent {} when adaptive is on",
                    self.min_concurrent, self.max_concurrent
                ),
            ));
        }
        if self.max_queue > 0 && self.queue_timeout.get().is_zero() {
            return Err(ConfigError::new(
                format!("{key}.queueTimeout"),
                "must be more than 0s when maxQueue is above 0",
            ));
        }
        Ok(())
    }
}

impl FallbackConfig {
    pub fn validate(&self, key: &str) -> Result<(), ConfigError> {
        if !(200..=599).contains(&self.status) {
            return Err(ConfigError::new(
                format!("{key}.status"),
                format!("{} is not a response status; use 200-599", self.status),
            ));
        }
        if http::HeaderValue::from_str(&self.content_type).is_err() {
            return Err(ConfigError::new(
                format!("{key}.contentType"),
                "is not a valid header value",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_and_print_in_human_form() {
        let d: HumanDuration = "1m30s".parse().expect("valid");
        assert_eq!(d.get(), Duration::from_secs(90));
        assert_eq!(d.to_string(), "1m30s");
        assert_eq!(
            "300ms".parse::<HumanDuration>().expect("valid").to_string(),
            "300ms"
        );
        assert!("3 parsecs".parse::<HumanDuration>().is_err());
    }

    #[test]
    fn endpoints_accept_ports_addresses_and_unix_paths() {
        assert_eq!(
            ":8080".parse::<Endpoint>().expect("valid"),
            Endpoint::Tcp("0.0.0.0:8080".parse().expect("addr"))
        );
        assert_eq!(
            "unix:/run/app.sock".parse::<Endpoint>().expect("valid"),
            Endpoint::Unix("/run/app.sock".into())
        );
        assert!("localhost".parse::<Endpoint>().is_err());
    }

    #[test]
    fn a_full_file_round_trips() {
        let yaml = r#"
listen: 0.0.0.0:8080
upstream: 127.0.0.1:8081
drain: {minDelay: 500ms, quiet: 300ms, maxDelay: 5s, timeout: 10s}
routes:
  - name: api
    match: {pathPrefix: /api, methods: [GET, POST]}
    timeout: 5s
    circuitBreaker: {maxConcurrent: 64, maxQueue: 128, queueTimeout: 500ms, errorRatio: 0.5}
    fallback: {status: 503, contentType: application/json, body: '{"error":"busy"}'}
    failOn: [5xx, 504, connect-error]
"#;
        let config = Config::from_yaml(yaml).expect("valid config");
        assert_eq!(config.routes[0].fail_on[1], FailureKind::Status(504));
        let again = Config::from_yaml(&config.to_yaml().expect("render")).expect("re-parse");
        assert_eq!(config, again);
    }

    #[test]
    fn errors_name_the_key_to_fix() {
        let err = Config::from_yaml("drain: {minDelay: 20s, maxDelay: 5s}").expect_err("invalid");
        assert_eq!(err.key, "drain.minDelay");
        let err = Config::from_yaml("routes: [{name: a, circuitBreaker: {errorRatio: 1.5}}]")
            .expect_err("invalid");
        assert_eq!(err.key, "routes[0].circuitBreaker.errorRatio");
        let err = Config::from_yaml("routes: [{name: a, failOn: [404]}]").expect_err("invalid");
        assert!(err.message.contains("4xx"), "{err}");
        let err = Config::from_yaml("drian: {}").expect_err("unknown key");
        assert!(err.message.contains("drian"), "{err}");
    }

    #[test]
    fn http2_stream_cap_defaults_to_200_and_refuses_zero() {
        assert_eq!(Config::default().limits.max_concurrent_streams, 200);
        let config = Config::from_yaml("limits: {maxConcurrentStreams: 50}").expect("valid");
        assert_eq!(config.limits.max_concurrent_streams, 50);
        let err = Config::from_yaml("limits: {maxConcurrentStreams: 0}").expect_err("invalid");
        assert_eq!(err.key, "limits.maxConcurrentStreams");
    }
}
