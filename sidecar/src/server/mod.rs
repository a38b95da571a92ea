//! The running sidecar: [`Sidecar::start`] binds the proxy and admin ports
//! and starts every task (accept loops, drain driver, app watch, config
//! watcher, signals); [`Sidecar::wait`] resolves once a stop was asked for
//! and the drain is over. [`accept`] holds the accept loops and the sockets
//! they own.

mod accept;

use std::net::SocketAddr;
use std::sync::Arc;

use crate::admin;
use crate::cli::{self, ConfigFile, Settings};
use crate::config::{Config, Endpoint, Protocol};
use crate::drain::{self, DrainReport};
use crate::error::{Error, Result};
use crate::inherit;
use crate::listen::{Listener, UnixCleanup};
use crate::reload::{self, Reload};
use crate::state::Shared;
use crate::upgrade::Upgrader;
use accept::CleanupOnClose;

/// How a sidecar starts, beyond its config and settings.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StartOptions {
    pub signals: Signals,
    /// Whether the file named in the settings was there at start (a missing
    /// one is waited for).
    pub config_file: ConfigFile,
}

/// Whether the sidecar handles the process's signals.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Signals {
    /// The binary: SIGTERM/SIGINT stop (drain, then exit), SIGHUP reloads
    /// the config, SIGUSR2 upgrades the binary (and `POST /upgrade` works).
    Install,
    /// Embedded (the in-process tests): the caller stops it with
    /// [`Sidecar::shutdown`] and reloads with [`Sidecar::reload`]; no
    /// self-upgrade.
    #[default]
    Untouched,
}

/// A running sidecar: listener, admin port, drain driver, reload watcher.
pub struct Sidecar {
    shared: Arc<Shared>,
    /// What clients connect to (a TCP address or a Unix socket path).
    listen: Endpoint,
    listen_addr: SocketAddr,
    admin_addr: SocketAddr,
    reload: Reload,
    settings: Settings,
    admin: Arc<admin::Admin>,
    /// The accept loops; the last one to end removes a Unix socket file we
    /// own, so the exit waits for them (see [`Sidecar::wait`]).
    accept_loops: Vec<tokio::task::JoinHandle<()>>,
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
    /// Binds both ports and starts serving.
    pub async fn start(
        mut config: Config,
        settings: Settings,
        options: StartOptions,
    ) -> Result<Sidecar> {
        config.normalize();
        config.validate()?;
        let admin = tcp_addr("admin", &config.admin)?;
        let protocol = config.protocol;
        let (listen_endpoint, workers, listen_mode) =
            (config.listen.clone(), config.workers, config.listen_mode);
        // A raw TCP port may carry a protocol in which the server speaks
        // first: its clients would wait for a greeting that never comes.
        let defer_accept = config.proxy.defer_accept && protocol != Protocol::Tcp;
        let shared = Shared::new(config, settings.config_file.clone())?;
        if options.config_file == ConfigFile::Missing {
            shared.update_status(|s| s.file_missing = true);
        }
        // Before anything serves: a drain a previous process of this
        // container left under way goes on (not ready, closing by its
        // deadline) instead of the sidecar starting afresh; an exit drain
        // carried on is a stop, and ends this process as it would have the
        // first.
        if let Some(dir) = settings.state_dir.as_deref() {
            carry_on_drain(&shared.drain, dir);
        }

        // Sockets passed by systemd, server-starter or an upgrade win over
        // binding: the port then stays open across restarts.
        let inherited = inherit::take()?;
        shared.upgrade.set_parent(inherited.notify);
        // A socket we bound (or got from our own upgrade) is ours to pause
        // in place; one from systemd or server-starter is shared with its
        // owner and is only left unaccepted (see `accept_loop`).
        let owned = inherited.listen.is_empty() || inherited.source == inherit::UPGRADE_SOURCE;
        let (listeners, cleanup) = if inherited.listen.is_empty() {
            accept::bind_listeners(&listen_endpoint, workers, listen_mode, defer_accept)?
        } else {
            let listeners = inherited
                .listen
                .into_iter()
                .map(Listener::from_socket)
                .collect::<Result<Vec<_>>>()?;
            // Our own upgrade hands over a socket the old process set up:
            // the new config's `proxy.deferAccept` applies to it, as it
            // would after a restart. systemd's or server-starter's sockets
            // keep their owner's setting.
            if inherited.source == inherit::UPGRADE_SOURCE {
                for listener in &listeners {
                    listener.set_defer_accept(defer_accept);
                }
            }
            // A Unix socket file from our own upgrade is ours to remove at
            // the end; one from systemd or server-starter is theirs.
            let cleanup = match listeners.first().map(Listener::endpoint) {
                Some(Endpoint::Unix(path)) if inherited.source == inherit::UPGRADE_SOURCE => {
                    UnixCleanup::owned(&path)
                }
                _ => UnixCleanup::none(),
            };
            (listeners, cleanup)
        };
        let admin_listener = match inherited.admin {
            Some(l) => tokio::net::TcpListener::from_std(l)?,
            None => admin::bind(admin).await?,
        };
        admin::check_exposure(admin_listener.local_addr()?, &settings)?;
        // Shared with the upgrader only weakly: the accept loop's drop at
        // Closing still closes the port.
        let listeners: Vec<Arc<Listener>> = listeners.into_iter().map(Arc::new).collect();
        let admin_fd = std::os::fd::AsFd::as_fd(&admin_listener).try_clone_to_owned()?;
        let listen = listeners
            .first()
            .map(|l| l.endpoint())
            .unwrap_or(listen_endpoint);
        let listen_addr = match &listen {
            Endpoint::Tcp(addr) => *addr,
            Endpoint::Unix(_) => SocketAddr::from(([0, 0, 0, 0], 0)),
        };
        let admin_addr = admin_listener.local_addr()?;

        if shared.upstreams.len() > 1 {
            // Know which instance is up before the first request arrives.
            shared.upstreams.probe_all().await;
            tokio::spawn(crate::upstream::slots::watch(shared.clone()));
        }
        tokio::spawn(shared.drain.clone().run());
        tokio::spawn(crate::memory::give_back_after_spikes(shared.clone()));
        if let Some(app) = shared.upstreams.app() {
            tokio::spawn(app.clone().run());
        }
        let admin_server = admin::Admin::new(shared.clone(), settings.drain_token.clone());
        tokio::spawn(admin_server.clone().serve(admin_listener));
        let weak_listeners = listeners.iter().map(Arc::downgrade).collect();
        // The socket file goes when the last accept loop ends (Unix: one).
        let cleanup = Arc::new(CleanupOnClose::new(
            cleanup,
            shared.upgrade.handed_over().clone(),
        ));
        let listener_count = listeners.len();
        let accept_loops = listeners
            .into_iter()
            .map(|listener| {
                tokio::spawn(accept::accept_loop(
                    shared.clone(),
                    listener,
                    protocol == Protocol::Tcp,
                    cleanup.clone(),
                    owned,
                ))
            })
            .collect();

        let reload = Reload::default();
        if let Some(file) = settings.config_file.clone() {
            tokio::spawn(reload::watch(
                shared.clone(),
                file,
                settings.overrides.clone(),
                reload.clone(),
            ));
        }
        let sidecar = Sidecar {
            shared,
            listen: listen.clone(),
            listen_addr,
            admin_addr,
            reload,
            settings,
            admin: admin_server,
            accept_loops,
        };
        if options.signals == Signals::Install {
            sidecar.spawn_signal_handler()?;
            let shared = &sidecar.shared;
            shared.upgrade.install(Upgrader::new(
                weak_listeners,
                admin_fd,
                sidecar.settings.upgrade_binary.clone(),
                shared.stop.clone(),
                shared.drain.clone(),
                shared.upgrade.handed_over().clone(),
            ))?;
        }
        if sidecar.shared.status().file_missing
            && let Some(file) = &sidecar.settings.config_file
        {
            tracing::warn!(file = %file.display(), "config file not found; running on defaults plus flags and environment, and loading it when it appears");
        }
        tracing::info!(listen = %listen, admin = %admin_addr, ?protocol, workers = listener_count, "listening on {listen}");
        Ok(sidecar)
    }

    /// The proxy's TCP address; `0.0.0.0:0` when it listens on a Unix
    /// socket (see [`Sidecar::listen_endpoint`]).
    pub fn listen_addr(&self) -> SocketAddr {
        self.listen_addr
    }

    /// What clients connect to: a TCP address or `unix:/path`.
    pub fn listen_endpoint(&self) -> &Endpoint {
        &self.listen
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
            self.listen, self.admin_addr
        )
    }

    /// Writes `{"listen","admin","pid"}` to the ready file, atomically
    /// (write then rename) so a reader never sees half a file.
    pub fn write_ready_file(&self) -> Result<()> {
        let Some(path) = &self.settings.ready_file else {
            return Ok(());
        };
        let body = serde_json::json!({
            "listen": self.listen.to_string(),
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
        self.reload.request();
    }

    /// What SIGTERM does: start the drain and exit once drained. A `/drain`
    /// alone drains but keeps the process (and admin port) up.
    pub fn shutdown(&self) {
        self.shared.stop.request("shutdown");
    }

    /// Resolves once a stop was asked for and the drain is over.
    pub async fn wait(self) -> DrainReport {
        self.shared.stop.requested().await;
        let report = self.shared.drain.drained().await;
        self.shared.drain.journal_done();
        // A preStop hook waiting on /drain?wait=true gets its answer before
        // the process goes; bounded, a stuck client must not hold the exit.
        let _ = tokio::time::timeout(EXIT_SETTLE, self.admin.settle()).await;
        // The accept loops end at Closing of an exit drain, but they are
        // tasks: the drain can be over (nothing was in flight) before they
        // ran. The process exits without running what is left of its tasks,
        // so an unfinished loop would leave its Unix socket file behind.
        let loops = futures_util::future::join_all(self.accept_loops);
        if tokio::time::timeout(EXIT_SETTLE, loops).await.is_err() {
            tracing::warn!("an accept loop was still running at exit");
        }
        report
    }

    fn spawn_signal_handler(&self) -> Result<()> {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let mut hup = signal(SignalKind::hangup())?;
        let stop = self.shared.stop.clone();
        let reload = self.reload.clone();
        tokio::spawn(async move {
            loop {
                let name = tokio::select! {
                    _ = term.recv() => "SIGTERM",
                    _ = int.recv() => "SIGINT",
                    _ = hup.recv() => {
                        tracing::info!("SIGHUP: reloading the config");
                        reload.request();
                        continue;
                    }
                };
                stop.request(name);
            }
        });
        Ok(())
    }
}

/// Opens the drain journal in `dir`, carries on the drain it holds (if its
/// deadline has not passed) and keeps every later drain in it. A journal
/// that cannot be opened is logged and left out: the sidecar runs as
/// without `--state-dir`.
fn carry_on_drain(drain: &drain::Drain, dir: &std::path::Path) {
    let journal = match drain::Journal::open(dir) {
        Ok(journal) => journal,
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot keep a drain journal there; a restart mid-drain will not carry the drain on");
            return;
        }
    };
    let live = journal.take_live(std::time::SystemTime::now());
    drain.keep_journal(journal);
    if let Some(entry) = live {
        drain.resume_after_restart(&entry);
    }
}

/// The longest the exit waits for a preStop answer to leave, and again for
/// the accept loops to close their listeners.
const EXIT_SETTLE: std::time::Duration = std::time::Duration::from_secs(2);

/// Starts the sidecar with signal handling, announces the bound ports and
/// runs until SIGTERM/SIGINT and the drain that follows are over.
pub async fn run(startup: cli::Startup, settings: Settings) -> Result<DrainReport> {
    let options = StartOptions {
        signals: Signals::Install,
        config_file: startup.config_file,
    };
    let sidecar = Sidecar::start(startup.config, settings, options).await?;
    reload::note_unknown_keys(&sidecar.shared, &startup.unknown_keys);
    sidecar.write_ready_file()?;
    println!("{}", sidecar.ready_line());
    sidecar.shared.upgrade.notify_ready();
    crate::notify::notify("READY=1");
    Ok(sidecar.wait().await)
}
