//! The peers under test and how each one is configured and started.
//!
//! Every proxy gets the configuration its own documentation recommends for
//! a reverse proxy with upstream keep-alive, one core (pinned with taskset),
//! no access log, and files in the run's temporary directory only: the
//! system services are never touched.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context as _;
use kubegrace_sidecar_api::cli::{self, flag};

/// One peer: a way of reaching the upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Peer {
    /// The upstream itself: the floor every proxy is measured against.
    Direct,
    Kubegrace,
    /// kubegrace-sidecar with a circuit breaker on every request, to show
    /// what the breaker costs on the hot path.
    KubegraceCb,
    Nginx,
    /// nginx with `listen ... deferred` (TCP_DEFER_ACCEPT), which kubegrace
    /// sets by default (`proxy.deferAccept`) and nginx leaves off: shown
    /// so the new-connection comparison is also made like for like.
    NginxDeferred,
    Haproxy,
    Caddy,
}

impl Peer {
    pub const ALL: [Peer; 7] = [
        Peer::Direct,
        Peer::Kubegrace,
        Peer::KubegraceCb,
        Peer::Nginx,
        Peer::NginxDeferred,
        Peer::Haproxy,
        Peer::Caddy,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Peer::Direct => "direct",
            Peer::Kubegrace => "kubegrace",
            Peer::KubegraceCb => "kubegrace+cb",
            Peer::Nginx => "nginx",
            Peer::NginxDeferred => "nginx-deferred",
            Peer::Haproxy => "haproxy",
            Peer::Caddy => "caddy",
        }
    }

    pub fn from_name(name: &str) -> Option<Peer> {
        Peer::ALL.into_iter().find(|p| p.name() == name)
    }

    pub fn is_proxy(self) -> bool {
        self != Peer::Direct
    }

    /// Port offset from the base port; the upstream sits on the base.
    fn offset(self) -> u16 {
        match self {
            Peer::Direct => 0,
            Peer::Kubegrace => 10,
            Peer::KubegraceCb => 20,
            Peer::Nginx => 30,
            Peer::Haproxy => 40,
            Peer::Caddy => 50,
            Peer::NginxDeferred => 70,
        }
    }
}

/// Where the run lives and what it runs.
#[derive(Debug, Clone)]
pub struct Env {
    pub dir: PathBuf,
    pub base_port: u16,
    /// taskset CPU list for proxies.
    pub proxy_cpus: String,
    pub sidecar_bin: PathBuf,
    /// The images' build of the sidecar (static glibc, stripped: what users
    /// run), measured beside `sidecar_bin` in the memory test only.
    pub sidecar_static_bin: Option<PathBuf>,
}

/// Port offset of the static sidecar (memory test only; its admin port is
/// the next one). `proc::free_base_port` checks offsets up to `proc::LAST_OFFSET`.
const STATIC_SIDECAR_OFFSET: u16 = 60;

/// How the sidecar's drain timers are set for a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrainTimers {
    /// All grace phases zero: measures the closing mechanism alone, the
    /// same thing `nginx -s quit` and HAProxy's soft stop do.
    Zero,
    /// The shipped defaults (minDelay 2s, quiet 1s): what a pod really does,
    /// waiting for routers to move traffic away first.
    Defaults,
}

impl Env {
    pub fn upstream_port(&self) -> u16 {
        self.base_port
    }

    /// The HTTP/1.1 port of a peer.
    pub fn port(&self, peer: Peer) -> u16 {
        self.base_port + peer.offset()
    }

    /// The h2c (prior knowledge) port; nginx 1.22 cannot serve HTTP/1.1 and
    /// h2c on one plaintext port, so it gets a second one.
    pub fn h2_port(&self, peer: Peer) -> u16 {
        match peer {
            Peer::Nginx | Peer::NginxDeferred => self.port(peer) + 1,
            _ => self.port(peer),
        }
    }

    /// The port gRPC clients use: nginx and HAProxy route gRPC through a
    /// server or frontend of its own (nginx's `grpc_pass`, HAProxy's
    /// `proto h2` backend); kubegrace and the upstream take it on their
    /// one port.
    pub fn grpc_port(&self, peer: Peer) -> u16 {
        match peer {
            Peer::Nginx | Peer::NginxDeferred | Peer::Haproxy => self.port(peer) + 2,
            _ => self.port(peer),
        }
    }

    pub fn admin_port(&self, peer: Peer) -> u16 {
        self.port(peer) + 1
    }

    /// The static sidecar's port, when there is one.
    pub fn static_sidecar_port(&self) -> Option<u16> {
        self.sidecar_static_bin
            .as_ref()
            .map(|_| self.base_port + STATIC_SIDECAR_OFFSET)
    }

    /// The static sidecar as `kubegrace` runs (flags only, default drain
    /// timers), on ports of its own; `None` when there is none.
    pub fn static_sidecar_command(&self) -> Option<Command> {
        let bin = self.sidecar_static_bin.as_ref()?;
        let mut cmd = Command::new("taskset");
        cmd.arg("-c").arg(&self.proxy_cpus);
        self.sidecar_args(
            &mut cmd,
            bin,
            self.static_sidecar_port()?,
            DrainTimers::Defaults,
        );
        Some(cmd)
    }

    /// The sidecar binary and its flags, listening on `port` (admin on the
    /// next port).
    fn sidecar_args(&self, cmd: &mut Command, bin: &Path, port: u16, timers: DrainTimers) {
        cmd.arg(bin)
            .args([flag::LISTEN, &format!("127.0.0.1:{port}")])
            .args([
                flag::UPSTREAM,
                &format!("127.0.0.1:{}", self.upstream_port()),
            ])
            .args([flag::ADMIN, &format!("127.0.0.1:{}", port + 1)]);
        if timers == DrainTimers::Zero {
            cmd.args(["--drain-min-delay", "0s", "--drain-quiet", "0s"])
                .args(["--drain-max-delay", "0s", "--drain-timeout", "30s"]);
        }
        // Warnings only: a log line per request would measure the
        // terminal, and the peers run without access logs too.
        cmd.env(cli::env::LOG, "warn");
    }

    fn peer_dir(&self, peer: Peer) -> PathBuf {
        self.dir.join(peer.name().replace('+', "-"))
    }

    /// Writes the peer's configuration and returns the command that runs it
    /// in the foreground, pinned to the proxy CPUs. `None` for `direct`.
    pub fn command(&self, peer: Peer, timers: DrainTimers) -> anyhow::Result<Option<Command>> {
        let dir = self.peer_dir(peer);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let up = self.upstream_port();
        let mut cmd = Command::new("taskset");
        cmd.arg("-c").arg(&self.proxy_cpus);
        match peer {
            Peer::Direct => return Ok(None),
            Peer::Kubegrace | Peer::KubegraceCb => {
                self.sidecar_args(&mut cmd, &self.sidecar_bin, self.port(peer), timers);
                if peer == Peer::KubegraceCb {
                    let file = dir.join("config.yaml");
                    write(&file, &sidecar_breaker_yaml())?;
                    cmd.arg(flag::CONFIG).arg(file);
                }
            }
            Peer::Nginx | Peer::NginxDeferred => {
                let conf = dir.join("nginx.conf");
                let deferred = peer == Peer::NginxDeferred;
                let ports = NginxPorts {
                    http: self.port(peer),
                    h2c: self.h2_port(peer),
                    grpc: self.grpc_port(peer),
                };
                write(&conf, &nginx_conf(&dir, ports, up, deferred))?;
                cmd.arg("nginx")
                    .arg("-p")
                    .arg(&dir)
                    .arg("-c")
                    .arg(&conf)
                    .arg("-e")
                    .arg(dir.join("error.log"));
            }
            Peer::Haproxy => {
                let conf = dir.join("haproxy.cfg");
                let maxconn = haproxy_maxconn(crate::memtest::open_files_soft_limit());
                let ports = (self.port(peer), self.grpc_port(peer));
                write(&conf, &haproxy_cfg(ports, up, maxconn))?;
                // -db: foreground, no master process; SIGUSR1 is then the
                // soft stop documented in the management guide.
                cmd.args(["haproxy", "-db", "-f"]).arg(&conf);
            }
            Peer::Caddy => {
                let conf = dir.join("Caddyfile");
                write(&conf, &caddyfile(self.port(peer), up))?;
                cmd.args(["caddy", "run", "--adapter", "caddyfile", "--config"])
                    .arg(&conf)
                    // Caddy keeps state under $HOME / XDG dirs: keep it here.
                    .env("HOME", &dir)
                    .env("XDG_DATA_HOME", dir.join("data"))
                    .env("XDG_CONFIG_HOME", dir.join("config"));
            }
        }
        Ok(Some(cmd))
    }

    /// The command each project documents for a graceful stop.
    pub fn graceful_stop(&self, peer: Peer, pid: u32) -> Command {
        match peer {
            Peer::Nginx | Peer::NginxDeferred => {
                let dir = self.peer_dir(peer);
                let mut cmd = Command::new("nginx");
                cmd.arg("-p")
                    .arg(&dir)
                    .arg("-c")
                    .arg(dir.join("nginx.conf"));
                cmd.arg("-e")
                    .arg(dir.join("error.log"))
                    .args(["-s", "quit"]);
                cmd
            }
            Peer::Haproxy => kill("-USR1", pid),
            // kubegrace and Caddy both drain on SIGTERM.
            _ => kill("-TERM", pid),
        }
    }
}

fn kill(signal: &str, pid: u32) -> Command {
    let mut cmd = Command::new("kill");
    cmd.arg(signal).arg(pid.to_string());
    cmd
}

fn write(path: &Path, text: &str) -> anyhow::Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// The breaker route: every request passes the concurrency limiter
/// and the breaker, with limits high enough that none is ever rejected.
pub fn sidecar_breaker_yaml() -> String {
    "# Every request goes through the limiter and breaker; the limits are\n\
     # far above the benchmark's concurrency so none is rejected.\n\
     routes:\n  - name: all\n    match: {pathPrefix: /}\n    \
     circuitBreaker: {maxConcurrent: 10000, maxQueue: 0, errorRatio: 0.5, consecutiveFailures: 5}\n"
        .to_string()
}

/// The listeners of one nginx: HTTP/1.1, h2c, and h2c for `grpc_pass`.
#[derive(Debug, Clone, Copy)]
pub struct NginxPorts {
    pub http: u16,
    pub h2c: u16,
    pub grpc: u16,
}

/// nginx as its docs set up a keep-alive upstream ("upstream" module:
/// `keepalive`, `proxy_http_version 1.1`, an empty Connection header), and
/// gRPC as the grpc module's docs do (`grpc_pass` to an upstream with
/// `keepalive`); `deferred` adds the `listen` parameter of that name to
/// every server.
pub fn nginx_conf(dir: &Path, ports: NginxPorts, upstream: u16, deferred: bool) -> String {
    let d = dir.display();
    let NginxPorts {
        http: port,
        h2c: h2_port,
        grpc: grpc_port,
    } = ports;
    let deferred = if deferred { " deferred" } else { "" };
    let mut c = String::new();
    let _ = write!(
        c,
        "# Written by bench-harness.
daemon off;
master_process on;
# One worker for one core: what `auto` means under taskset. (nginx 1.22
# counts online CPUs, not the affinity mask, so auto would start two.)
worker_processes 1;
worker_rlimit_nofile 65536;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 16384; }}
http {{
    access_log off;
    client_body_temp_path {d}/client_body;
    proxy_temp_path {d}/proxy;
    upstream app {{
        server 127.0.0.1:{upstream};
        # Idle upstream connections kept per worker: as many as the largest
        # client concurrency, so a burst never turns into new connections.
        keepalive 256;
    }}
    server {{
        listen 127.0.0.1:{port} backlog=4096{deferred};
        location / {{
            proxy_pass http://app;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
        }}
    }}
    server {{
        # nginx 1.22 speaks h2c only on a port of its own.
        listen 127.0.0.1:{h2_port} http2 backlog=4096{deferred};
        # The default (1000 requests, then close) would end every h2load
        # client after 1000 requests: h2load does not reconnect. HTTP/1.1
        # keeps the default; wrk reconnects.
        keepalive_requests 1000000;
        location / {{
            proxy_pass http://app;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
        }}
    }}
    # gRPC goes to the app over h2c, on connections kept as for HTTP.
    upstream grpc_app {{
        server 127.0.0.1:{upstream};
        keepalive 256;
    }}
    server {{
        listen 127.0.0.1:{grpc_port} http2 backlog=4096{deferred};
        keepalive_requests 1000000;
        location / {{
            grpc_pass grpc://grpc_app;
        }}
    }}
}}
"
    );
    c
}

/// The most connections HAProxy can be given under an open-files limit.
/// It refuses to start unless it can raise its own limit to two
/// descriptors per connection plus a few of its own (`maxconn 20000` asked
/// for 40,014 and could not, under this machine's hard limit of 20,000),
/// and an unprivileged process cannot raise the hard limit. So the maxconn
/// follows the limit it inherits; capped where the bench never needs more.
pub fn haproxy_maxconn(open_files: u64) -> u64 {
    /// HAProxy's own descriptors (listeners, pollers, logs) with headroom.
    const OWN: u64 = 100;
    (open_files.saturating_sub(OWN) / 2).clamp(256, 20_000)
}

/// HAProxy in HTTP mode with its defaults for keep-alive on both sides
/// (`http-reuse safe`); threads default to the CPUs in the affinity mask.
/// gRPC comes in on a frontend of its own (`ports.1`), whose backend speaks
/// HTTP/2 to the app (`proto h2`), as HAProxy's gRPC guide sets it up.
pub fn haproxy_cfg(ports: (u16, u16), upstream: u16, maxconn: u64) -> String {
    let (port, grpc_port) = ports;
    format!(
        "# Written by bench-harness.
global
    maxconn {maxconn}

defaults
    mode http
    timeout connect 5s
    timeout client 60s
    timeout server 60s
    timeout http-keep-alive 60s

frontend fe
    # A clear-text bind detects the HTTP/2 preface itself (h2c).
    bind 127.0.0.1:{port}
    default_backend app

backend app
    http-reuse safe
    server app 127.0.0.1:{upstream}

frontend fe_grpc
    bind 127.0.0.1:{grpc_port} proto h2
    default_backend grpc_app

backend grpc_app
    http-reuse safe
    server app 127.0.0.1:{upstream} proto h2
"
    )
}

/// Caddy's reverse_proxy with h2c enabled and an idle pool as large as the
/// other proxies' (its default keeps only 32 idle connections per host).
pub fn caddyfile(port: u16, upstream: u16) -> String {
    format!(
        "# Written by bench-harness.
{{
	admin off
	auto_https off
	grace_period 30s
	servers {{
		protocols h1 h2 h2c
	}}
}}

http://127.0.0.1:{port} {{
	reverse_proxy 127.0.0.1:{upstream} {{
		transport http {{
			keepalive 60s
			keepalive_idle_conns 1024
			keepalive_idle_conns_per_host 256
		}}
	}}
}}
"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_ports_do_not_collide() {
        let env = Env {
            dir: "/tmp/x".into(),
            base_port: 18080,
            proxy_cpus: "1".into(),
            sidecar_bin: "kubegrace-sidecar".into(),
            sidecar_static_bin: Some("static/kubegrace-sidecar".into()),
        };
        let mut ports = vec![env.upstream_port()];
        let static_port = env.static_sidecar_port().expect("a static binary is set");
        ports.extend([static_port, static_port + 1]);
        assert!(
            static_port + 1 - env.base_port <= 61,
            "inside what free_base_port checks"
        );
        for p in Peer::ALL {
            assert_eq!(Peer::from_name(p.name()), Some(p));
            if p.is_proxy() {
                ports.push(env.port(p));
            }
            if env.h2_port(p) != env.port(p) {
                ports.push(env.h2_port(p));
            }
            if env.grpc_port(p) != env.port(p) {
                ports.push(env.grpc_port(p));
            }
            if matches!(p, Peer::Kubegrace | Peer::KubegraceCb) {
                ports.push(env.admin_port(p));
            }
        }
        let n = ports.len();
        ports.sort_unstable();
        let highest = ports.last().copied().unwrap_or(0);
        assert!(
            highest - env.base_port <= crate::proc::LAST_OFFSET,
            "free_base_port checks every listener's port"
        );
        ports.dedup();
        assert_eq!(ports.len(), n, "every listener has its own port");
    }

    #[test]
    fn haproxy_fits_the_open_files_limit() {
        // This machine: a hard limit of 20,000; HAProxy needs 2 per
        // connection plus its own.
        let maxconn = haproxy_maxconn(20_000);
        assert!(maxconn * 2 + 100 <= 20_000, "{maxconn}");
        assert_eq!(maxconn, 9950);
        assert!(haproxy_cfg((1, 3), 2, maxconn).contains("maxconn 9950\n"));
        // A default limit of 1024 still starts it; a huge one is capped.
        assert_eq!(haproxy_maxconn(1024), 462);
        assert_eq!(haproxy_maxconn(1 << 20), 20_000);
    }

    #[test]
    fn breaker_config_is_valid_sidecar_config() {
        let config =
            kubegrace_sidecar::cli::config_from_yaml(&sidecar_breaker_yaml()).expect("valid");
        let cb = config.routes[0].circuit_breaker.as_ref().expect("breaker");
        assert_eq!((cb.max_concurrent, cb.max_queue), (10_000, 0));
    }
}
