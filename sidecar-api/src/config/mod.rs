//! The sidecar's configuration: the one format that the YAML file, the
//! command line and the operator's ConfigMap all speak.
//!
//! The operator depends on this module to write the file, so the two cannot
//! drift. Only the types and their rules live here: the sidecar parses the
//! YAML (`kubegrace_sidecar::cli`), the operator renders it with its own
//! serde_norway, so this crate needs serde and nothing that parses. Every field has a default that is safe for a typical HTTP app, and
//! [`Config::validate`] names the offending key (`drain.minDelay`,
//! `routes[2].circuitBreaker.errorRatio`, ...) so a user knows what to fix.
//!
//! Precedence when the binary starts: flags > `KUBEGRACE_*` environment >
//! YAML file > defaults. On reload only the file is re-read; flags and
//! environment still win over it.

/// Serde for a value type people write as text: it is serialised as its
/// `Display` text and read back only from a string, through `FromStr`, so
/// the file and `/config` show it as it was written and a parse error says
/// how to write it.
macro_rules! serde_as_text {
    ($($ty:ty),* $(,)?) => {$(
        impl serde::Serialize for $ty {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_str(self)
            }
        }

        impl<'de> serde::Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let text = <String as serde::Deserialize>::deserialize(deserializer)?;
                text.parse().map_err(serde::de::Error::custom)
            }
        }
    )*};
}

pub mod bounds;
mod duration;
mod limits;
mod readiness;
mod retry;
mod route;
#[cfg(test)]
mod tests;
mod values;

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

pub use bounds::{
    MAX_BREAKER_COUNT, MAX_HALF_OPEN_PROBES, MAX_RETRY_BODY_BYTES, MAX_RETRY_MIN_PER_SECOND,
    MAX_WORKERS,
};
pub use duration::HumanDuration;
pub use limits::{
    DrainConfig, DrainGrpcHealth, DrainReadiness, Http2GoAway, LimitsConfig, UpstreamPoolConfig,
    WebSocketClose,
};
pub use readiness::{AppReadiness, ProbeHeader};
pub use retry::{RetryBudgetConfig, RouteRetry};
pub use route::{
    CATCH_ALL_ROUTE, CircuitBreakerConfig, FALLBACK_HEADER, FailureKind, FallbackConfig,
    RouteConfig, RouteMatch,
};
pub use values::{Endpoint, Protocol, SocketMode};

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

    /// A problem with `field` of the section at `key` (`drain` + `minDelay`
    /// is `drain.minDelay`).
    pub fn at(key: &str, field: &str, message: impl Into<String>) -> Self {
        Self::new(format!("{key}.{field}"), message)
    }
}

fn is_one(n: &usize) -> bool {
    *n == 1
}

/// The whole sidecar configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Config {
    /// Where downstream traffic arrives (the port the Service targets).
    pub listen: Endpoint,
    /// The app, normally on loopback.
    pub upstream: Endpoint,
    /// Several instances of the app (blue/green slots during an app
    /// upgrade): new requests go to the one that most recently became
    /// reachable, requests in flight finish where they started. When set,
    /// `upstream` is its first entry (see [`Config::normalize`]). At most
    /// [`bounds::MAX_UPSTREAMS`] (16).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub upstreams: Vec<Endpoint>,
    /// Admin port: /live, /ready, /drain, /metrics, /config, /breakers.
    /// Loopback by default; a non-loopback address needs a drain token
    /// (or `--admin-insecure`), or the sidecar refuses to start.
    pub admin: Endpoint,
    /// Accept loops on as many `SO_REUSEPORT` listeners (TCP listen only):
    /// 1 to [`MAX_WORKERS`] (64).
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
    /// Retries of requests the app never saw, and their budget. Left out
    /// of a rendered file at its defaults, so older sidecars still read
    /// the operator's files during an upgrade.
    #[serde(skip_serializing_if = "RetryBudgetConfig::is_default")]
    pub retry_budget: RetryBudgetConfig,
    /// `Upgrade` protocols passed to the app (compared without case and
    /// version). A request offering anything else is forwarded as a plain
    /// request with `Upgrade` removed, as a server that does not speak the
    /// protocol would answer it (RFC 9110 §7.8): `h2c` never reaches the app.
    /// At most [`bounds::MAX_UPGRADE_PROTOCOLS`] (32).
    pub upgrade_protocols: Vec<String>,
    /// Which client-supplied forwarding headers to believe.
    pub forwarded: ForwardedConfig,
    /// How the proxy itself serves requests.
    #[serde(skip_serializing_if = "ProxyConfig::is_default")]
    pub proxy: ProxyConfig,
    /// Per-route policy; first match wins, and a built-in default route
    /// (no timeout, no breaker) catches the rest. At most
    /// [`bounds::MAX_ROUTES`] (1024).
    pub routes: Vec<RouteConfig>,
    /// The app's own HTTP readiness check, run behind `/ready` (the webhook
    /// moves an app's `httpGet` readiness probe here: one probe per pod).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub app_readiness: Option<AppReadiness>,
}

/// The default admin address: loopback, so nothing off the machine (or
/// the pod) can drain the process unless it is exposed on purpose; the same
/// port the webhook tries first, outside the ports meshes use.
pub const DEFAULT_ADMIN: SocketAddr = SocketAddr::new(
    std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
    crate::admin::DEFAULT_PORT,
);

/// Forwarding headers (`X-Forwarded-Proto`) from the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ForwardedConfig {
    /// Proxies in front of the sidecar whose `X-Forwarded-Proto` is
    /// believed. 0 (the default): the sidecar sets it from the connection
    /// it accepted (`http`), whatever the client sent; 1 or more: a value
    /// the client (the trusted balancer) sent is kept. At most
    /// [`bounds::MAX_TRUSTED_HOPS`] (64).
    pub trusted_hops: u32,
}

/// How the proxy serves requests (`proxy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ProxyConfig {
    /// Plain HTTP/1.1 exchanges (no upgrade, no `Expect`, origin-form
    /// target) are relayed as bytes: heads parsed in place and rewritten in
    /// one buffer, bodies passed through by their framing. Everything else
    /// (HTTP/2, h2c, upgrades, HTTP/1.0) is served by hyper, as is every
    /// request with this off. New connections pick up a reload.
    pub http1_fast_path: bool,
    /// A TCP connection is handed to the proxy only once its client has
    /// sent something (`TCP_DEFER_ACCEPT`; nginx's `listen ... deferred`,
    /// HAProxy's `defer-accept`): the proxy then finds the request already
    /// there and serves it without waiting in epoll. A client that connects
    /// and stays silent is handed over after about a second, when the
    /// kernel stops waiting for it; its header read timeout starts then.
    /// Never applied with `protocol: tcp` (the app may speak first) nor to
    /// a socket inherited from systemd or server-starter (theirs to set:
    /// systemd's `DeferAcceptSec=`). Takes a restart (or an upgrade
    /// hand-over, whose new process applies its own value).
    pub defer_accept: bool,
    /// Request headers whose names hold an underscore (`X_Real_IP`,
    /// `Content_Length`) reach the app. Off (the default), they are
    /// dropped, as nginx does (`underscores_in_headers off`): many app
    /// stacks (CGI, WSGI, Rack) map `-` to `_`, so `Content_Length` could
    /// stand in for the real framing header or a header a front proxy set.
    /// A boolean: nothing to bound.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub underscores_in_headers: bool,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            http1_fast_path: true,
            defer_accept: true,
            underscores_in_headers: false,
        }
    }
}

impl ProxyConfig {
    fn is_default(&self) -> bool {
        *self == ProxyConfig::default()
    }
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
            retry_budget: RetryBudgetConfig::default(),
            upgrade_protocols: vec!["websocket".to_string()],
            forwarded: ForwardedConfig::default(),
            proxy: ProxyConfig::default(),
            routes: Vec::new(),
            app_readiness: None,
        }
    }
}

impl Config {
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

    /// Checks everything serde cannot: ranges and relations between keys.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.drain.validate("drain")?;
        self.limits.validate("limits")?;
        self.upstream_pool.validate("upstreamPool")?;
        self.retry_budget.validate("retryBudget")?;
        if let Some(readiness) = &self.app_readiness {
            readiness.validate("appReadiness")?;
        }
        self.validate_sizes()?;
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
        self.apart_from_listen("upstream", &self.upstream, "the proxy would call itself")?;
        for (i, endpoint) in self.upstreams.iter().enumerate() {
            self.apart_from_listen(
                format!("upstreams[{i}]"),
                endpoint,
                "the proxy would call itself",
            )?;
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
        self.apart_from_listen("admin", &self.admin, "give the admin port its own")?;
        let mut names = std::collections::HashSet::new();
        for (i, route) in self.routes.iter().enumerate() {
            let key = format!("routes[{i}]");
            if !names.insert(route.name.as_str()) {
                return Err(ConfigError::at(
                    &key,
                    "name",
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

    /// The lists and counts at the top level, within [`bounds`].
    fn validate_sizes(&self) -> Result<(), ConfigError> {
        for (key, len, max) in [
            ("upstreams", self.upstreams.len(), bounds::MAX_UPSTREAMS),
            ("routes", self.routes.len(), bounds::MAX_ROUTES),
            (
                "upgradeProtocols",
                self.upgrade_protocols.len(),
                bounds::MAX_UPGRADE_PROTOCOLS,
            ),
        ] {
            if len > max {
                return Err(ConfigError::new(
                    key,
                    format!("{len} entries are too many; use at most {max}"),
                ));
            }
        }
        bounds::count_in(
            "forwarded",
            "trustedHops",
            u64::from(self.forwarded.trusted_hops),
            0,
            u64::from(bounds::MAX_TRUSTED_HOPS),
            "",
        )
    }

    /// `endpoint` (the key `key`) must not be the listen address. Port 0
    /// means "pick a free port" (tests run many sidecars side by side), so
    /// two port-0 endpoints never collide.
    fn apart_from_listen(
        &self,
        key: impl Into<String>,
        endpoint: &Endpoint,
        why: &str,
    ) -> Result<(), ConfigError> {
        if *endpoint == self.listen && !self.listen.is_any_port() {
            return Err(ConfigError::new(
                key,
                format!("{endpoint} is also the listen address; {why}"),
            ));
        }
        Ok(())
    }
}
