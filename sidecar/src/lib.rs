//! kubegrace-sidecar: an inbound proxy that drains a pod on evidence rather
//! than fixed sleeps, with per-route circuit breaking.
//!
//! The binary (`main.rs`) only parses arguments; everything lives here so the
//! in-process integration tests run the real proxy:
//!
//! ```no_run
//! # async fn demo() -> kubegrace_sidecar::Result<()> {
//! use kubegrace_sidecar::{Sidecar, cli::Settings, config::Config};
//! let sidecar = Sidecar::start(Config::default(), Settings::default(), false).await?;
//! println!("proxy on {}", sidecar.listen_addr());
//! sidecar.shutdown(); // what SIGTERM does
//! let report = sidecar.wait().await;
//! println!("{report}");
//! # Ok(()) }
//! ```

pub mod admin;
pub mod circuit;
pub mod cli;
pub mod config;
pub mod drain;
pub mod error;
pub mod inherit;
pub mod metrics;
pub mod proxy;
pub mod reload;
pub mod state;
pub mod tcp;
pub mod upgrade;
pub mod upstream;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::net::TcpListener;
use tokio::sync::Notify;

use crate::config::{Config, Endpoint, Protocol};
use crate::drain::{DrainReport, Phase};
use crate::state::Shared;

pub use cli::Settings;
pub use error::{Error, Result};

/// A running sidecar: listener, admin port, drain driver, reload watcher.
pub struct Sidecar {
    shared: Arc<Shared>,
    listen_addr: SocketAddr,
    admin_addr: SocketAddr,
    /// Set by SIGTERM/SIGINT or [`Sidecar::shutdown`]: exit once drained.
    /// A `/drain` alone drains but keeps the process (and admin port) up.
    exit_requested: Arc<AtomicBool>,
    exit_notify: Arc<Notify>,
    hup: Arc<Notify>,
    settings: Settings,
    admin: Arc<admin::Admin>,
}

fn tcp_addr(what: &'static str, endpoint: &Endpoint) -> Result<SocketAddr> {
    match endpoint {
        Endpoint::Tcp(addr) => Ok(*addr),
        Endpoint::Unix(path) => Err(Error::Unsupported(format!(
            "{what}: unix sockets ({}) are not supported yet; use host:port",
            path.display()
        ))),
    }
}

impl Sidecar {
    /// Binds both ports and starts serving. With `signals`, SIGTERM/SIGINT
    /// start the drain (and the exit once drained) and SIGHUP reloads.
    pub async fn start(config: Config, settings: Settings, signals: bool) -> Result<Sidecar> {
        config.validate()?;
        let listen = tcp_addr("listen", &config.listen)?;
        let admin = tcp_addr("admin", &config.admin)?;
        let protocol = config.protocol;
        let shared = Shared::new(config, settings.config_file.clone())?;

        // Sockets passed by systemd, server-starter or an upgrade win over
        // binding: the port then stays open across restarts.
        let inherited = inherit::take()?;
        upgrade::set_notify(inherited.notify);
        let listener = match inherited.listen {
            Some(l) => TcpListener::from_std(l)?,
            None => TcpListener::bind(listen)
                .await
                .map_err(|source| Error::Bind {
                    what: "listener",
                    addr: listen.to_string(),
                    source,
                })?,
        };
        let admin_listener = match inherited.admin {
            Some(l) => TcpListener::from_std(l)?,
            None => admin::bind(admin).await?,
        };
        // Shared with the upgrader only weakly: the accept loop's drop at
        // Closing still closes the port.
        let listener = Arc::new(listener);
        let admin_fd = std::os::fd::AsFd::as_fd(&admin_listener).try_clone_to_owned()?;
        let listen_addr = listener.local_addr()?;
        let admin_addr = admin_listener.local_addr()?;

        tokio::spawn(shared.drain.clone().run());
        let admin_server = admin::Admin::new(shared.clone(), settings.drain_token.clone());
        tokio::spawn(admin_server.clone().serve(admin_listener));
        let weak_listener = Arc::downgrade(&listener);
        tokio::spawn(accept_loop(
            shared.clone(),
            listener,
            protocol == Protocol::Tcp,
        ));

        let hup = Arc::new(Notify::new());
        if let Some(file) = settings.config_file.clone() {
            tokio::spawn(reload::watch(
                shared.clone(),
                file,
                settings.overrides.clone(),
                hup.clone(),
            ));
        }
        let sidecar = Sidecar {
            shared,
            listen_addr,
            admin_addr,
            exit_requested: Arc::new(AtomicBool::new(false)),
            exit_notify: Arc::new(Notify::new()),
            hup,
            settings,
            admin: admin_server,
        };
        if signals {
            sidecar.spawn_signal_handler()?;
            let (shared, requested, notify) = (
                sidecar.shared.clone(),
                sidecar.exit_requested.clone(),
                sidecar.exit_notify.clone(),
            );
            upgrade::install(upgrade::Upgrader::new(
                weak_listener,
                admin_fd,
                sidecar.settings.upgrade_binary.clone(),
                sidecar.shared.drain.clone(),
                Box::new(move || request_exit(&shared, &requested, &notify, "upgrade")),
            ))?;
        }
        tracing::info!(listen = %listen_addr, admin = %admin_addr, ?protocol, "listening on {listen_addr}");
        Ok(sidecar)
    }

    pub fn listen_addr(&self) -> SocketAddr {
        self.listen_addr
    }

    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_addr
    }

    pub fn drain(&self) -> &drain::Drain {
        &self.shared.drain
    }

    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The one line tests and scripts parse to find the bound ports.
    pub fn ready_line(&self) -> String {
        format!(
            "kubegrace-sidecar ready listen={} admin={}",
            self.listen_addr, self.admin_addr
        )
    }

    /// Writes `{"listen","admin","pid"}` to the ready file, atomically
    /// (write then rename) so a reader never sees half a file.
    pub fn write_ready_file(&self) -> Result<()> {
        let Some(path) = &self.settings.ready_file else {
            return Ok(());
        };
        let body = serde_json::json!({
            "listen": self.listen_addr.to_string(),
            "admin": self.admin_addr.to_string(),
            "pid": std::process::id(),
        });
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, body.to_string())?;
        std::fs::rename(&tmp, path)?;
        Ok(())
    }

    /// Re-reads the config file now (what SIGHUP does).
    pub fn reload(&self) {
        self.hup.notify_one();
    }

    /// What SIGTERM does: start the drain and exit once drained.
    pub fn shutdown(&self) {
        request_exit(
            &self.shared,
            &self.exit_requested,
            &self.exit_notify,
            "shutdown",
        );
    }

    /// Resolves once an exit was requested and the drain is over.
    pub async fn wait(self) -> DrainReport {
        loop {
            let notified = self.exit_notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.exit_requested.load(Ordering::Acquire) {
                break;
            }
            notified.await;
        }
        let report = self.shared.drain.drained().await;
        // A preStop hook waiting on /drain?wait=true gets its answer before
        // the process goes; bounded, a stuck client must not hold the exit.
        let _ = tokio::time::timeout(std::time::Duration::from_secs(2), self.admin.settle()).await;
        report
    }

    fn spawn_signal_handler(&self) -> Result<()> {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let mut hup = signal(SignalKind::hangup())?;
        let shared = self.shared.clone();
        let exit_requested = self.exit_requested.clone();
        let exit_notify = self.exit_notify.clone();
        let reload = self.hup.clone();
        tokio::spawn(async move {
            loop {
                let name = tokio::select! {
                    _ = term.recv() => "SIGTERM",
                    _ = int.recv() => "SIGINT",
                    _ = hup.recv() => {
                        tracing::info!("SIGHUP: reloading the config");
                        reload.notify_one();
                        continue;
                    }
                };
                request_exit(&shared, &exit_requested, &exit_notify, name);
            }
        });
        Ok(())
    }
}

fn request_exit(shared: &Shared, exit_requested: &AtomicBool, exit_notify: &Notify, reason: &str) {
    let first = !exit_requested.swap(true, Ordering::AcqRel);
    exit_notify.notify_waiters();
    if shared.drain.trigger(reason) {
        tracing::info!("{reason}: draining");
    } else if first && shared.drain.phase() == Phase::Drained {
        tracing::info!("{reason}: already drained, exiting");
    } else {
        // SIGKILL is the hard stop; a repeated TERM must not cut requests.
        tracing::warn!(phase = %shared.drain.phase(), "{reason} again: already draining, carrying on (SIGKILL is the hard stop)");
    }
}

/// Accepts until the drain reaches `Closing`, then drops the listener so
/// new connections are refused (routers have moved on by then).
async fn accept_loop(shared: Arc<Shared>, listener: Arc<TcpListener>, raw_tcp: bool) {
    let mut drain_rx = shared.drain.subscribe();
    loop {
        let accepted = tokio::select! {
            biased;
            _ = drain_rx.wait_for(|s| s.phase >= Phase::Closing) => break,
            // Outside Kubernetes: a new process took the socket over.
            _ = upgrade::handed_over() => break,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, peer)) => {
                let guard = shared.drain.connection();
                let shared = shared.clone();
                if raw_tcp {
                    tokio::spawn(tcp::serve_connection(shared, stream, peer, guard));
                } else {
                    tokio::spawn(proxy::serve_connection(shared, stream, peer, guard));
                }
            }
            Err(err) => {
                // EMFILE and friends: back off instead of spinning; the
                // pending connection stays in the backlog.
                tracing::warn!(error = %err, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        }
    }
    drop(listener);
    tracing::info!("listener closed; no new connections");
}

/// Starts the sidecar with signal handling, announces the bound ports and
/// runs until SIGTERM/SIGINT and the drain that follows are over.
pub async fn run(config: Config, settings: Settings) -> Result<DrainReport> {
    let sidecar = Sidecar::start(config, settings, true).await?;
    sidecar.write_ready_file()?;
    println!("{}", sidecar.ready_line());
    upgrade::notify_ready();
    Ok(sidecar.wait().await)
}
