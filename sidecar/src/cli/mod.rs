//! The command line and its precedence: flags > `KUBEGRACE_*` environment >
//! YAML file > defaults.
//!
//! clap already merges a flag with its environment twin (the flag wins), so
//! what it yields is one override layer. That layer is kept for the life of
//! the process and laid over the file again on every reload: a reload never
//! undoes what the operator of the pod put on the command line.

use std::path::PathBuf;

use clap::{Parser, ValueEnum};
use kubegrace_sidecar_api::cli::env;

use crate::config::{
    AppReadiness, Config, ConfigError, DrainGrpcHealth, DrainReadiness, Endpoint, Http2GoAway,
    HumanDuration, Protocol, SocketMode, WebSocketClose,
};
use crate::error::{Error, Result};

/// `--version`: the crate version and the git revision of the build.
pub static VERSION: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    kubegrace_sidecar_api::build::version_line(
        env!("CARGO_PKG_VERSION"),
        kubegrace_sidecar_api::build::REVISION,
    )
});

/// Exit status for anything the user must fix (BSD EX_USAGE).
pub const EXIT_USAGE: i32 = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// Drain-aware inbound proxy: fronts the app, drains on evidence, exits 0
/// once every connection is done.
#[derive(Debug, Clone, Parser)]
#[command(name = "kubegrace-sidecar", version = VERSION.as_str(), about)]
pub struct Cli {
    /// Where downstream traffic arrives (the port the Service targets); port 0 picks one.
    #[arg(long, env = env::LISTEN, value_name = "ADDR")]
    pub listen: Option<Endpoint>,
    /// The app, normally on loopback (host:port or unix:/path). Repeat it
    /// (or separate with commas) for blue/green app instances: new requests
    /// go to the one that most recently came up.
    #[arg(
        long,
        env = env::UPSTREAM,
        value_name = "ADDR",
        value_delimiter = ','
    )]
    pub upstream: Vec<Endpoint>,
    /// Admin port (TCP): /live /ready /drain /metrics /config /breakers /upstreams /upgrade.
    /// Default 127.0.0.1:15180. Any other than loopback needs --drain-token
    /// (or --admin-insecure), or the start is refused (exit 64).
    #[arg(long, env = env::ADMIN, value_name = "ADDR")]
    pub admin: Option<Endpoint>,
    /// Serve the admin port on a non-loopback address without a drain token:
    /// anyone who can reach it may then drain this process.
    #[arg(long, env = env::ADMIN_INSECURE)]
    pub admin_insecure: bool,
    /// Accept loops on as many SO_REUSEPORT listeners (TCP listen only).
    #[arg(long, env = env::WORKERS, value_name = "N")]
    pub workers: Option<usize>,
    /// Permissions of a unix: listen socket, octal like chmod (0660).
    #[arg(long, env = env::LISTEN_MODE, value_name = "MODE")]
    pub listen_mode: Option<SocketMode>,
    /// YAML config file; watched and reloaded on change or SIGHUP. A missing
    /// file is waited for (defaults and flags serve meanwhile); an invalid
    /// one stops the start (exit 64).
    #[arg(long, env = env::CONFIG, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// auto (HTTP/1.1 + h2c), http1, http2 or tcp.
    #[arg(long, env = env::PROTOCOL, value_name = "PROTOCOL", value_parser = parse_protocol)]
    pub protocol: Option<Protocol>,
    /// Serve at least this long after the drain trigger.
    #[arg(long, env = env::DRAIN_MIN_DELAY, value_name = "DURATION")]
    pub drain_min_delay: Option<HumanDuration>,
    /// After the minimum delay, stop accepting once no connection arrived for this long.
    #[arg(long, env = env::DRAIN_QUIET, value_name = "DURATION")]
    pub drain_quiet: Option<HumanDuration>,
    /// Stop accepting at the latest this long after the trigger.
    #[arg(long, env = env::DRAIN_MAX_DELAY, value_name = "DURATION")]
    pub drain_max_delay: Option<HumanDuration>,
    /// Once closing, wait this long for in-flight work before force-closing.
    #[arg(long, env = env::DRAIN_TIMEOUT, value_name = "DURATION")]
    pub drain_timeout: Option<HumanDuration>,
    /// How HTTP/2 connections are closed in a drain: auto, twoPhase or finalOnly (drain.http2GoAway).
    #[arg(long, env = env::DRAIN_HTTP2_GOAWAY, value_name = "MODE", value_parser = parse_http2_go_away)]
    pub drain_http2_goaway: Option<Http2GoAway>,
    /// What /ready answers in the drain's grace phase: failFast (503 at the trigger) or
    /// stayServing (200 while the app is reachable, until the listener closes) (drain.readiness).
    #[arg(long, env = env::DRAIN_READINESS, value_name = "MODE", value_parser = parse_drain_readiness)]
    pub drain_readiness: Option<DrainReadiness>,
    /// Who answers grpc.health.v1.Health once a drain starts: notServing (the sidecar, with
    /// NOT_SERVING) or app (drain.grpcHealth).
    #[arg(long, env = env::DRAIN_GRPC_HEALTH, value_name = "WHO", value_parser = parse_drain_grpc_health)]
    pub drain_grpc_health: Option<DrainGrpcHealth>,
    /// How a WebSocket ends at the drain deadline: goingAway (Close 1001 both ways) or cut.
    #[arg(long, env = env::DRAIN_WEBSOCKET_CLOSE, value_name = "MODE", value_parser = parse_websocket_close)]
    pub drain_websocket_close: Option<WebSocketClose>,
    /// The WebSocket closes are spread over this window, which ends at the drain deadline.
    #[arg(long, env = env::DRAIN_WEBSOCKET_CLOSE_WINDOW, value_name = "DURATION")]
    pub drain_websocket_close_window: Option<HumanDuration>,
    /// How long a WebSocket close waits for the peers' Close replies before the TCP close.
    #[arg(long, env = env::DRAIN_WEBSOCKET_CLOSE_WAIT, value_name = "DURATION")]
    pub drain_websocket_close_wait: Option<HumanDuration>,
    /// Most concurrent HTTP/2 streams per downstream connection (limits.maxConcurrentStreams).
    #[arg(long, env = env::MAX_CONCURRENT_STREAMS, value_name = "N")]
    pub max_concurrent_streams: Option<u32>,
    /// HTTP/1 request bodies must arrive within this (plus 1s per limits.bodyMinRate bytes); 0s: off.
    #[arg(long, env = env::BODY_READ_TIMEOUT, value_name = "DURATION")]
    pub body_read_timeout: Option<HumanDuration>,
    /// Cut a client that takes no response byte for this long; 0s: off.
    #[arg(long, env = env::WRITE_TIMEOUT, value_name = "DURATION")]
    pub write_timeout: Option<HumanDuration>,
    /// Close upgraded tunnels and tcp-mode connections idle this long; 0s: never.
    #[arg(long, env = env::TUNNEL_IDLE_TIMEOUT, value_name = "DURATION")]
    pub tunnel_idle_timeout: Option<HumanDuration>,
    /// Most downstream connections open at once (0: no limit).
    #[arg(long, env = env::MAX_CONNECTIONS, value_name = "N")]
    pub max_connections: Option<usize>,
    /// Most admin connections open at once (probes still answered past it).
    #[arg(long, env = env::ADMIN_MAX_CONNECTIONS, value_name = "N")]
    pub admin_max_connections: Option<usize>,
    /// Upgrade protocols passed to the app, comma-separated (default: websocket).
    #[arg(
        long,
        env = env::UPGRADE_PROTOCOLS,
        value_name = "LIST",
        value_delimiter = ','
    )]
    pub upgrade_protocols: Option<Vec<String>>,
    /// Proxies in front whose X-Forwarded-Proto is kept (default 0: set from the connection).
    #[arg(long, env = env::TRUSTED_HOPS, value_name = "N")]
    pub trusted_hops: Option<u32>,
    /// Relay plain HTTP/1.1 exchanges as bytes (true, the default) or serve every request through hyper (proxy.http1FastPath).
    #[arg(long, env = env::HTTP1_FAST_PATH, value_name = "BOOL", action = clap::ArgAction::Set)]
    pub http1_fast_path: Option<bool>,
    /// Hand a TCP connection to the proxy only once the client has sent something (true, the default; proxy.deferAccept).
    #[arg(long, env = env::DEFER_ACCEPT, value_name = "BOOL", action = clap::ArgAction::Set)]
    pub defer_accept: Option<bool>,
    /// While the app refuses connections (restarting), hold a request this long for it to come back, then 503.
    #[arg(long, env = env::UPSTREAM_HOLD_TIMEOUT, value_name = "DURATION")]
    pub upstream_hold_timeout: Option<HumanDuration>,
    /// The app's HTTP readiness check behind /ready, as JSON: {"port":8080,"path":"/healthz"} (appReadiness).
    #[arg(long, env = env::APP_READINESS, value_name = "JSON", value_parser = parse_app_readiness)]
    pub app_readiness: Option<AppReadiness>,
    /// Require this value in X-Kubegrace-Drain-Token on /drain.
    #[arg(
        long,
        env = env::DRAIN_TOKEN,
        value_name = "TOKEN",
        hide_env_values = true
    )]
    pub drain_token: Option<String>,
    /// Log as text or JSON lines.
    #[arg(long, env = env::LOG_FORMAT, value_name = "FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Write {"listen","admin","pid"} here once both ports are bound (for port 0).
    #[arg(long, env = env::READY_FILE, value_name = "FILE")]
    pub ready_file: Option<PathBuf>,
    /// A directory that outlives this process's container (a pod's
    /// emptyDir): a drain under way is kept there, and a sidecar restarted
    /// in the middle of it carries it on instead of serving afresh.
    #[arg(long, env = env::STATE_DIR, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Write the final drain report (JSON) here on exit: the container's termination message. Default /dev/termination-log when it exists; empty: never.
    #[arg(long, env = env::TERMINATION_LOG, value_name = "FILE")]
    pub termination_log: Option<PathBuf>,
    /// Binary started by an upgrade (SIGUSR2 or POST /upgrade); default: this one's path.
    #[arg(long, env = env::UPGRADE_BINARY, value_name = "FILE")]
    pub upgrade_binary: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// Subcommands; without one the sidecar serves.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum Command {
    /// Ask a running sidecar to hand its sockets to a new process of itself
    /// and drain (zero-downtime upgrade); exits non-zero with the reason if
    /// the new process did not come up (the old one keeps serving).
    Upgrade {
        /// The running sidecar's admin port.
        #[arg(long, value_name = "ADDR")]
        admin: std::net::SocketAddr,
        /// Its drain token, if it has one.
        #[arg(
            long,
            env = env::DRAIN_TOKEN,
            value_name = "TOKEN",
            hide_env_values = true
        )]
        token: Option<String>,
    },
}

fn parse_protocol(s: &str) -> std::result::Result<Protocol, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "auto" => Ok(Protocol::Auto),
        "http1" | "http" => Ok(Protocol::Http1),
        "http2" | "h2c" | "grpc" => Ok(Protocol::Http2),
        "tcp" => Ok(Protocol::Tcp),
        other => Err(format!(
            "{other:?} is not a protocol; use auto, http1, http2 or tcp"
        )),
    }
}

fn parse_http2_go_away(s: &str) -> std::result::Result<Http2GoAway, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "auto" => Ok(Http2GoAway::Auto),
        "twophase" | "two-phase" => Ok(Http2GoAway::TwoPhase),
        "finalonly" | "final-only" => Ok(Http2GoAway::FinalOnly),
        other => Err(format!(
            "{other:?} is not an HTTP/2 GOAWAY mode; use auto, twoPhase or finalOnly"
        )),
    }
}

fn parse_drain_readiness(s: &str) -> std::result::Result<DrainReadiness, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "failfast" | "fail-fast" => Ok(DrainReadiness::FailFast),
        "stayserving" | "stay-serving" => Ok(DrainReadiness::StayServing),
        other => Err(format!(
            "{other:?} is not a drain readiness mode; use failFast or stayServing"
        )),
    }
}

fn parse_drain_grpc_health(s: &str) -> std::result::Result<DrainGrpcHealth, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "notserving" | "not-serving" => Ok(DrainGrpcHealth::NotServing),
        "app" => Ok(DrainGrpcHealth::App),
        other => Err(format!(
            "{other:?} is not a gRPC health mode; use notServing or app"
        )),
    }
}

fn parse_app_readiness(s: &str) -> std::result::Result<AppReadiness, String> {
    let example = r#"e.g. {"port":8080,"path":"/healthz"}"#;
    // A flag is written by the webhook of the same release: a key it does
    // not know is a mistake, not skew.
    match crate::config_keys::parse_tolerant::<AppReadiness>(s) {
        Ok((check, unknown)) if unknown.is_empty() => Ok(check),
        Ok((_, unknown)) => Err(format!(
            "unknown key(s) {} in the app readiness check; {example}",
            crate::config_keys::named(&unknown)
        )),
        Err(e) => Err(format!("not an app readiness check ({e}); {example}")),
    }
}

fn parse_websocket_close(s: &str) -> std::result::Result<WebSocketClose, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "goingaway" | "going-away" => Ok(WebSocketClose::GoingAway),
        "cut" => Ok(WebSocketClose::Cut),
        other => Err(format!(
            "{other:?} is not a WebSocket close mode; use goingAway or cut"
        )),
    }
}

/// The flag/environment layer, laid over the file at start and on reload.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Overrides {
    pub listen: Option<Endpoint>,
    /// One endpoint sets `upstream`; several set `upstreams`.
    pub upstream: Vec<Endpoint>,
    pub admin: Option<Endpoint>,
    pub workers: Option<usize>,
    pub listen_mode: Option<SocketMode>,
    pub protocol: Option<Protocol>,
    pub drain_min_delay: Option<HumanDuration>,
    pub drain_quiet: Option<HumanDuration>,
    pub drain_max_delay: Option<HumanDuration>,
    pub drain_timeout: Option<HumanDuration>,
    pub drain_http2_goaway: Option<Http2GoAway>,
    pub drain_readiness: Option<DrainReadiness>,
    pub drain_grpc_health: Option<DrainGrpcHealth>,
    pub drain_websocket_close: Option<WebSocketClose>,
    pub drain_websocket_close_window: Option<HumanDuration>,
    pub drain_websocket_close_wait: Option<HumanDuration>,
    pub max_concurrent_streams: Option<u32>,
    pub body_read_timeout: Option<HumanDuration>,
    pub write_timeout: Option<HumanDuration>,
    pub tunnel_idle_timeout: Option<HumanDuration>,
    pub max_connections: Option<usize>,
    pub admin_max_connections: Option<usize>,
    pub upgrade_protocols: Option<Vec<String>>,
    pub trusted_hops: Option<u32>,
    pub http1_fast_path: Option<bool>,
    pub defer_accept: Option<bool>,
    pub upstream_hold_timeout: Option<HumanDuration>,
    pub app_readiness: Option<AppReadiness>,
}

impl Overrides {
    pub fn apply(&self, config: &mut Config) {
        if let Some(v) = &self.listen {
            config.listen = v.clone();
        }
        match self.upstream.as_slice() {
            [] => {}
            [one] => {
                config.upstream = one.clone();
                config.upstreams.clear();
            }
            [first, ..] => {
                config.upstream = first.clone();
                config.upstreams = self.upstream.clone();
            }
        }
        if let Some(v) = &self.admin {
            config.admin = v.clone();
        }
        if let Some(v) = self.workers {
            config.workers = v;
        }
        if let Some(v) = self.listen_mode {
            config.listen_mode = Some(v);
        }
        if let Some(v) = self.protocol {
            config.protocol = v;
        }
        if let Some(v) = self.drain_min_delay {
            config.drain.min_delay = v;
        }
        if let Some(v) = self.drain_quiet {
            config.drain.quiet = v;
        }
        if let Some(v) = self.drain_max_delay {
            config.drain.max_delay = v;
        }
        if let Some(v) = self.drain_timeout {
            config.drain.timeout = v;
        }
        if let Some(v) = self.drain_http2_goaway {
            config.drain.http2_go_away = v;
        }
        if let Some(v) = self.drain_readiness {
            config.drain.readiness = v;
        }
        if let Some(v) = self.drain_grpc_health {
            config.drain.grpc_health = v;
        }
        if let Some(v) = self.drain_websocket_close {
            config.drain.websocket_close = v;
        }
        if let Some(v) = self.drain_websocket_close_window {
            config.drain.websocket_close_window = v;
        }
        if let Some(v) = self.drain_websocket_close_wait {
            config.drain.websocket_close_wait = v;
        }
        if let Some(v) = self.max_concurrent_streams {
            config.limits.max_concurrent_streams = v;
        }
        if let Some(v) = self.body_read_timeout {
            config.limits.body_read_timeout = v;
        }
        if let Some(v) = self.write_timeout {
            config.limits.write_timeout = v;
        }
        if let Some(v) = self.tunnel_idle_timeout {
            config.limits.tunnel_idle_timeout = v;
        }
        if let Some(v) = self.max_connections {
            config.limits.max_connections = v;
        }
        if let Some(v) = self.admin_max_connections {
            config.limits.admin_max_connections = v;
        }
        if let Some(v) = &self.upgrade_protocols {
            config.upgrade_protocols = v
                .iter()
                .map(|p| p.trim().to_string())
                .filter(|p| !p.is_empty())
                .collect();
        }
        if let Some(v) = self.trusted_hops {
            config.forwarded.trusted_hops = v;
        }
        if let Some(v) = self.http1_fast_path {
            config.proxy.http1_fast_path = v;
        }
        if let Some(v) = self.defer_accept {
            config.proxy.defer_accept = v;
        }
        if let Some(v) = self.upstream_hold_timeout {
            config.upstream_pool.hold_timeout = v;
        }
        if let Some(v) = &self.app_readiness {
            config.app_readiness = Some(v.clone());
        }
    }

    /// Flag spelling of a config key, so a validation error can name what
    /// the user typed when the value came from the command line.
    fn flag_for(&self, key: &str) -> Option<&'static str> {
        match key {
            "drain.minDelay" if self.drain_min_delay.is_some() => Some("--drain-min-delay"),
            "drain.quiet" if self.drain_quiet.is_some() => Some("--drain-quiet"),
            "drain.maxDelay" if self.drain_max_delay.is_some() => Some("--drain-max-delay"),
            "drain.timeout" if self.drain_timeout.is_some() => Some("--drain-timeout"),
            "limits.maxConcurrentStreams" if self.max_concurrent_streams.is_some() => {
                Some("--max-concurrent-streams")
            }
            "drain.websocketCloseWindow" if self.drain_websocket_close_window.is_some() => {
                Some("--drain-websocket-close-window")
            }
            "drain.websocketCloseWait" if self.drain_websocket_close_wait.is_some() => {
                Some("--drain-websocket-close-wait")
            }
            "limits.bodyReadTimeout" if self.body_read_timeout.is_some() => {
                Some("--body-read-timeout")
            }
            "limits.writeTimeout" if self.write_timeout.is_some() => Some("--write-timeout"),
            "limits.tunnelIdleTimeout" if self.tunnel_idle_timeout.is_some() => {
                Some("--tunnel-idle-timeout")
            }
            "limits.maxConnections" if self.max_connections.is_some() => Some("--max-connections"),
            "forwarded.trustedHops" if self.trusted_hops.is_some() => Some("--trusted-hops"),
            "upstreamPool.holdTimeout" if self.upstream_hold_timeout.is_some() => {
                Some("--upstream-hold-timeout")
            }
            "upstream" if !self.upstream.is_empty() => Some("--upstream"),
            k if k.starts_with("upstreams[") && !self.upstream.is_empty() => Some("--upstream"),
            "workers" if self.workers.is_some() => Some("--workers"),
            "listenMode" if self.listen_mode.is_some() => Some("--listen-mode"),
            "admin" if self.admin.is_some() => Some("--admin"),
            "listen" if self.listen.is_some() => Some("--listen"),
            k if k.starts_with("appReadiness.") && self.app_readiness.is_some() => {
                Some("--app-readiness")
            }
            "limits.adminMaxConnections" if self.admin_max_connections.is_some() => {
                Some("--admin-max-connections")
            }
            k if k.starts_with("upgradeProtocols[") && self.upgrade_protocols.is_some() => {
                Some("--upgrade-protocols")
            }
            _ => None,
        }
    }
}

/// Everything `run` needs besides the config itself.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    pub config_file: Option<PathBuf>,
    pub overrides: Overrides,
    pub drain_token: Option<String>,
    /// `--admin-insecure`: a non-loopback admin port without a token is meant.
    pub admin_insecure: bool,
    pub ready_file: Option<PathBuf>,
    /// Where the drain journal lives (see `drain/journal.rs`).
    pub state_dir: Option<PathBuf>,
    /// `--termination-log` as given (see [`crate::termination::target`]).
    pub termination_log: Option<PathBuf>,
    pub log_format: LogFormat,
    /// What an upgrade starts (None: the running executable's path).
    pub upgrade_binary: Option<PathBuf>,
}

impl Cli {
    pub fn settings(&self) -> Settings {
        Settings {
            config_file: self.config.clone(),
            overrides: Overrides {
                listen: self.listen.clone(),
                upstream: self.upstream.clone(),
                admin: self.admin.clone(),
                workers: self.workers,
                listen_mode: self.listen_mode,
                protocol: self.protocol,
                drain_min_delay: self.drain_min_delay,
                drain_quiet: self.drain_quiet,
                drain_max_delay: self.drain_max_delay,
                drain_timeout: self.drain_timeout,
                drain_http2_goaway: self.drain_http2_goaway,
                drain_readiness: self.drain_readiness,
                drain_grpc_health: self.drain_grpc_health,
                drain_websocket_close: self.drain_websocket_close,
                drain_websocket_close_window: self.drain_websocket_close_window,
                drain_websocket_close_wait: self.drain_websocket_close_wait,
                max_concurrent_streams: self.max_concurrent_streams,
                body_read_timeout: self.body_read_timeout,
                write_timeout: self.write_timeout,
                tunnel_idle_timeout: self.tunnel_idle_timeout,
                max_connections: self.max_connections,
                admin_max_connections: self.admin_max_connections,
                upgrade_protocols: self.upgrade_protocols.clone(),
                trusted_hops: self.trusted_hops,
                http1_fast_path: self.http1_fast_path,
                defer_accept: self.defer_accept,
                upstream_hold_timeout: self.upstream_hold_timeout,
                app_readiness: self.app_readiness.clone(),
            },
            drain_token: self.drain_token.clone().filter(|t| !t.is_empty()),
            admin_insecure: self.admin_insecure,
            ready_file: self.ready_file.clone(),
            state_dir: self.state_dir.clone(),
            termination_log: self.termination_log.clone(),
            log_format: self.log_format,
            upgrade_binary: self.upgrade_binary.clone(),
        }
    }
}

/// Builds the config in force: defaults, then the file, then the overrides,
/// then validation of the result.
pub fn load(file: Option<&std::path::Path>, overrides: &Overrides) -> Result<Config> {
    load_file(file, overrides).map(|loaded| loaded.config)
}

/// A config as [`load_file`] built it, with the keys of the file it skipped.
#[derive(Debug)]
pub struct Loaded {
    pub config: Config,
    /// Keys of the file this release does not know (skipped, not refused:
    /// see [`crate::config_keys`]), as `drain.newKey`.
    pub unknown_keys: Vec<String>,
}

/// [`load`], also naming the keys of the file it skipped.
pub fn load_file(file: Option<&std::path::Path>, overrides: &Overrides) -> Result<Loaded> {
    let (mut config, unknown_keys) = match file {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|source| Error::ReadConfig {
                path: path.display().to_string(),
                source,
            })?;
            parse_file(&text, path)?
        }
        None => (Config::default(), Vec::new()),
    };
    overrides.apply(&mut config);
    config.normalize();
    config.validate().map_err(|mut e| {
        if let Some(flag) = overrides.flag_for(&e.key) {
            e.key = format!("{} ({flag})", e.key);
        }
        Error::Config(e)
    })?;
    Ok(Loaded {
        config,
        unknown_keys,
    })
}

/// Whether the file named by `--config` was there at start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ConfigFile {
    /// Read at start, or none named.
    #[default]
    Read,
    /// Named but not there (yet): the sidecar runs on defaults plus flags
    /// and picks the file up when it appears.
    Missing,
}

/// The config to start with, and whether the file was missing.
#[derive(Debug)]
pub struct Startup {
    pub config: Config,
    pub config_file: ConfigFile,
    /// Keys of the file this release does not know (already warned about).
    pub unknown_keys: Vec<String>,
}

/// [`load`] for the start of the process. A file that does not exist is
/// not an error here: an optional ConfigMap volume can appear after the
/// container started, and a sidecar that refused to start would hold the
/// pod back for nothing (flags carry what it needs to serve). A file that
/// exists but cannot be read or is invalid still stops the start (exit 64):
/// a wrong value must fail loudly, not run on defaults. A key this release
/// does not know is not invalid: it is named in a warning and skipped
/// ([`crate::config_keys`]), so a sidecar of the previous release restarts
/// on a file a newer operator wrote.
pub fn load_at_start(file: Option<&std::path::Path>, overrides: &Overrides) -> Result<Startup> {
    match load_file(file, overrides) {
        Ok(loaded) => {
            if let Some(path) = file {
                warn_unknown(path, &loaded.unknown_keys);
            }
            Ok(Startup {
                config: loaded.config,
                config_file: ConfigFile::Read,
                unknown_keys: loaded.unknown_keys,
            })
        }
        Err(Error::ReadConfig { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            Ok(Startup {
                config: load(None, overrides)?,
                config_file: ConfigFile::Missing,
                unknown_keys: Vec::new(),
            })
        }
        Err(err) => Err(err),
    }
}

/// The warning for the keys of `file` this release skipped, if any.
pub fn warn_unknown(file: &std::path::Path, keys: &[String]) {
    if keys.is_empty() {
        return;
    }
    tracing::warn!(
        file = %file.display(),
        count = keys.len(),
        keys = %crate::config_keys::named(keys),
        "config keys this sidecar does not know were skipped (written by a newer operator?); the rest of the file applies"
    );
}

/// Parses the file without validating: a relation between keys (minDelay <=
/// maxDelay) may only hold once the flags are laid over it.
fn parse_file(text: &str, path: &std::path::Path) -> Result<(Config, Vec<String>)> {
    parse_yaml(text, Some(path)).map_err(Error::Config)
}

/// A YAML config as the sidecar reads it from its file, without flags:
/// parsed and validated. For tests and tools that hold the text (the
/// operator's rendering, the bench's breaker config), which must speak
/// this release's keys: an unknown key is an error here.
pub fn config_from_yaml(text: &str) -> std::result::Result<Config, ConfigError> {
    let (config, unknown) = parse_yaml(text, None)?;
    if !unknown.is_empty() {
        return Err(ConfigError::new(
            crate::config_keys::named(&unknown),
            "unknown key(s) for this release of the sidecar",
        ));
    }
    config.validate()?;
    Ok(config)
}

fn parse_yaml(
    text: &str,
    path: Option<&std::path::Path>,
) -> std::result::Result<(Config, Vec<String>), ConfigError> {
    crate::config_keys::parse_tolerant::<Config>(text).map_err(|e| {
        // serde_norway's message already names the field; the key says where.
        let file = path.map(|p| p.display().to_string());
        let key = match (file, e.location()) {
            (Some(file), Some(l)) => format!("{file} line {} column {}", l.line(), l.column()),
            (None, Some(l)) => format!("line {} column {}", l.line(), l.column()),
            (Some(file), None) => file,
            (None, None) => "config".into(),
        };
        ConfigError::new(key, e.to_string())
    })
}

#[cfg(test)]
mod tests;
