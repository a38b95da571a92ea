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
pub mod app;
pub mod app_readiness;
pub mod circuit;
pub mod cli;
pub mod config_keys;
pub mod drain;
pub mod error;
pub mod http2;
pub mod inherit;
pub mod listen;
mod memory;
pub mod metrics;
pub mod notify;
pub mod proxy;
pub mod reload;
pub mod state;
pub mod tcp;
pub mod termination;
#[cfg(test)]
mod testing;
mod tunnel;
pub mod upgrade;
pub mod upstream;
mod websocket;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::Notify;

use crate::config::{Config, Endpoint, Protocol};
use crate::drain::{DrainReport, Phase};
use crate::listen::{Listener, Peer, UnixCleanup};
use crate::state::Shared;

pub use cli::Settings;
pub use error::{Error, Result};
/// The config types live in the contract crate the operator shares.
pub use kubegrace_sidecar_api::config;

/// A running sidecar: listener, admin port, drain driver, reload watcher.
pub struct Sidecar {
    shared: Arc<Shared>,
    /// What clients connect to (a TCP address or a Unix socket path).
    listen: Endpoint,
    listen_addr: SocketAddr,
    admin_addr: SocketAddr,
    /// Set by SIGTERM/SIGINT or [`Sidecar::shutdown`]: exit once drained.
    /// A `/drain` alone drains but keeps the process (and admin port) up.
    exit_requested: Arc<AtomicBool>,
    exit_notify: Arc<Notify>,
    hup: Arc<Notify>,
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
    /// Binds both ports and starts serving. With `signals`, SIGTERM/SIGINT
    /// start the drain (and the exit once drained) and SIGHUP reloads.
    pub async fn start(mut config: Config, settings: Settings, signals: bool) -> Result<Sidecar> {
        Self::start_with(&mut config, settings, signals, false).await
    }

    /// [`Sidecar::start`], saying whether the config file named in
    /// `settings` was missing at start (it is then waited for).
    pub async fn start_with(
        config: &mut Config,
        settings: Settings,
        signals: bool,
        file_missing: bool,
    ) -> Result<Sidecar> {
        config.normalize();
        config.validate()?;
        let config = config.clone();
        let admin = tcp_addr("admin", &config.admin)?;
        let protocol = config.protocol;
        let (listen_endpoint, workers, listen_mode) =
            (config.listen.clone(), config.workers, config.listen_mode);
        // A raw TCP port may carry a protocol in which the server speaks
        // first: its clients would wait for a greeting that never comes.
        let defer_accept = config.proxy.defer_accept && protocol != Protocol::Tcp;
        let shared = Shared::new(config, settings.config_file.clone())?;
        if file_missing {
            shared.update_status(|s| s.file_missing = true);
        }
        // Before anything serves: a drain a previous process of this
        // container left under way goes on (not ready, closing by its
        // deadline) instead of the sidecar starting afresh.
        let carried_exit = settings
            .state_dir
            .as_deref()
            .and_then(|dir| carry_on_drain(&shared.drain, dir))
            .is_some_and(|entry| entry.exit);

        // Sockets passed by systemd, server-starter or an upgrade win over
        // binding: the port then stays open across restarts.
        let inherited = inherit::take()?;
        upgrade::set_notify(inherited.notify);
        // A socket we bound (or got from our own upgrade) is ours to pause
        // in place; one from systemd or server-starter is shared with its
        // owner and is only left unaccepted (see `accept_loop`).
        let owned = inherited.listen.is_empty() || inherited.source == inherit::UPGRADE_SOURCE;
        let (listeners, cleanup) = if inherited.listen.is_empty() {
            bind_listeners(&listen_endpoint, workers, listen_mode, defer_accept)?
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
            tokio::spawn(upstream::slots::watch(shared.clone()));
        }
        tokio::spawn(shared.drain.clone().run());
        tokio::spawn(memory::give_back_after_spikes(shared.clone()));
        if let Some(app) = shared.upstreams.app() {
            tokio::spawn(app.clone().run());
        }
        let admin_server = admin::Admin::new(shared.clone(), settings.drain_token.clone());
        tokio::spawn(admin_server.clone().serve(admin_listener));
        let weak_listeners = listeners.iter().map(Arc::downgrade).collect();
        // The socket file goes when the last accept loop ends (Unix: one).
        let cleanup = Arc::new(CleanupOnClose(cleanup));
        let listener_count = listeners.len();
        let accept_loops = listeners
            .into_iter()
            .map(|listener| {
                tokio::spawn(accept_loop(
                    shared.clone(),
                    listener,
                    protocol == Protocol::Tcp,
                    cleanup.clone(),
                    owned,
                ))
            })
            .collect();

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
            listen: listen.clone(),
            listen_addr,
            admin_addr,
            // A carried-on exit drain ends the process as the first one would have.
            exit_requested: Arc::new(AtomicBool::new(carried_exit)),
            exit_notify: Arc::new(Notify::new()),
            hup,
            settings,
            admin: admin_server,
            accept_loops,
        };
        if signals {
            sidecar.spawn_signal_handler()?;
            let (shared, requested, notify) = (
                sidecar.shared.clone(),
                sidecar.exit_requested.clone(),
                sidecar.exit_notify.clone(),
            );
            upgrade::install(upgrade::Upgrader::new(
                weak_listeners,
                admin_fd,
                sidecar.settings.upgrade_binary.clone(),
                sidecar.shared.drain.clone(),
                Box::new(move || request_exit(&shared, &requested, &notify, UPGRADE_REASON)),
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

/// Opens the drain journal in `dir`, carries on the drain it holds (if its
/// deadline has not passed) and keeps every later drain in it. Returns the
/// drain carried on. A journal that cannot be opened is logged and left
/// out: the sidecar runs as without `--state-dir`.
fn carry_on_drain(drain: &drain::Drain, dir: &std::path::Path) -> Option<drain::JournalEntry> {
    let journal = match drain::Journal::open(dir) {
        Ok(journal) => journal,
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot keep a drain journal there; a restart mid-drain will not carry the drain on");
            return None;
        }
    };
    let live = journal.take_live(std::time::SystemTime::now());
    drain.keep_journal(journal);
    live.filter(|entry| drain.resume_after_restart(entry))
}

fn request_exit(shared: &Shared, exit_requested: &AtomicBool, exit_notify: &Notify, reason: &str) {
    let first = !exit_requested.swap(true, Ordering::AcqRel);
    // After an upgrade the service carries on in the new process (which
    // the upgrader announced with MAINPID=): not a stop.
    if first && reason != UPGRADE_REASON {
        notify::notify("STOPPING=1");
    }
    exit_notify.notify_waiters();
    if shared.drain.trigger_exit(reason) {
        tracing::info!("{reason}: draining");
    } else if first && shared.drain.phase() == Phase::Drained {
        tracing::info!("{reason}: already drained, exiting");
    } else {
        // SIGKILL is the hard stop; a repeated TERM must not cut requests.
        tracing::warn!(phase = %shared.drain.phase(), "{reason} again: already draining, carrying on (SIGKILL is the hard stop)");
    }
}

/// Binds the proxy socket(s) named by `--listen`.
fn bind_listeners(
    endpoint: &Endpoint,
    workers: usize,
    mode: Option<config::SocketMode>,
    defer_accept: bool,
) -> Result<(Vec<Listener>, UnixCleanup)> {
    match endpoint {
        Endpoint::Tcp(addr) => Ok((
            listen::bind_tcp(*addr, workers, defer_accept)?
                .into_iter()
                .map(Listener::Tcp)
                .collect(),
            UnixCleanup::none(),
        )),
        Endpoint::Unix(path) => {
            if workers > 1 {
                // The kernel spreads connections over SO_REUSEPORT groups
                // for TCP and UDP only.
                tracing::info!(
                    workers,
                    "workers apply to TCP listeners; a unix: socket gets one accept loop"
                );
            }
            let (listener, cleanup) = listen::bind_unix(path, mode)?;
            Ok((vec![Listener::Unix(listener)], cleanup))
        }
    }
}

/// Removes a Unix socket file once every accept loop has ended, unless the
/// sockets went to a new process.
struct CleanupOnClose(UnixCleanup);

impl Drop for CleanupOnClose {
    fn drop(&mut self) {
        if upgrade::is_handed_over() {
            self.0.disarm();
        }
        // The field's own drop removes the file if still armed.
    }
}

/// Accepts until the drain reaches `Closing`. An exit drain (SIGTERM) then
/// drops the listener: new connections are refused, routers have moved on.
/// A provisional drain (preStop, `/drain`) pauses it instead, on the same
/// socket, and accepts again if the drain resumes (the app was restarting):
///
/// - a TCP socket we own is paused with `shutdown(SHUT_RD)`, which on Linux
///   takes it out of the listening state (connects are refused, as after a
///   close, and an `SO_REUSEPORT` worker leaves its group) while the fd and
///   its bound address stay; `listen()` on the same fd resumes it. Nothing
///   is re-bound, so no other process can take the port in between and
///   every worker comes back into the same group;
/// - a socket shared with its owner (systemd, server-starter) must keep
///   listening for the owner, and a Unix socket cannot listen again after
///   that shutdown: those are only left unaccepted (connections wait in the
///   backlog, as they would for the owner once we closed our copy);
/// - once the drain is an exit drain, or the socket went to a new process,
///   the loop ends and the listener closes for good.
async fn accept_loop(
    shared: Arc<Shared>,
    listener: Arc<Listener>,
    raw_tcp: bool,
    cleanup: Arc<CleanupOnClose>,
    owned: bool,
) {
    let mut drain_rx = shared.drain.subscribe();
    // After a resume: a fresh handle on the same socket (see Listener::resume).
    let mut resumed_on: Option<Listener> = None;
    loop {
        let current = resumed_on.as_ref().unwrap_or(&listener);
        let accepted = tokio::select! {
            biased;
            _ = drain_rx.wait_for(|s| s.phase >= Phase::Closing) => None,
            // Outside Kubernetes: a new process took the socket over.
            _ = upgrade::handed_over() => break,
            accepted = accept(current) => Some(accepted),
        };
        let Some(accepted) = accepted else {
            if shared.drain.is_exit() || upgrade::is_handed_over() {
                break;
            }
            let paused = owned && listener.pause();
            tracing::info!(
                refusing = paused,
                "listener paused; accepting again only if the app turns out to be restarting"
            );
            // Below Closing again: resumed (a watcher that wakes late may
            // already see the next drain's Draining, which accepts too).
            let resumed = tokio::select! {
                res = drain_rx.wait_for(|s| s.phase < Phase::Closing || s.exit) => {
                    res.is_ok_and(|s| !s.exit)
                }
                _ = upgrade::handed_over() => false,
            };
            if !resumed {
                break;
            }
            if paused {
                match listener.resume() {
                    Ok(handle) => resumed_on = handle,
                    Err(err) => {
                        // The fd is still bound; a failed listen() would only
                        // come from a broken socket. Say so and close: the
                        // listener is gone, as after an exit drain.
                        tracing::error!(error = %err, "cannot listen again on the paused socket");
                        break;
                    }
                }
            }
            tracing::info!(listen = %listener.endpoint(), "listener accepting again");
            continue;
        };
        match accepted {
            Ok(Accepted::Tcp(stream, peer)) => {
                // The HTTP proxy turns Nagle off before its second write
                // (proxy/conn/); a raw tunnel relays as bytes come.
                if raw_tcp {
                    let _ = stream.set_nodelay(true);
                }
                // Registered with the reactor only if it has to wait.
                serve(
                    &shared,
                    proxy::LazyTcp::new(stream),
                    Peer::Tcp(peer),
                    raw_tcp,
                );
            }
            Ok(Accepted::Unix(stream)) => serve(&shared, stream, Peer::Unix, raw_tcp),
            Err(err) => {
                // EMFILE and friends: back off instead of spinning; the
                // pending connection stays in the backlog.
                tracing::warn!(error = %err, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        }
    }
    drop(resumed_on);
    drop(listener);
    drop(cleanup);
    tracing::info!("listener closed; no new connections");
}

enum Accepted {
    Tcp(std::net::TcpStream, SocketAddr),
    Unix(tokio::net::UnixStream),
}

async fn accept(listener: &Listener) -> std::io::Result<Accepted> {
    match listener {
        Listener::Tcp(l) => l.accept().await.map(|(s, p)| Accepted::Tcp(s, p)),
        Listener::Unix(l) => l.accept().await.map(|(s, _)| Accepted::Unix(s)),
    }
}

fn serve<S: proxy::Downstream>(shared: &Arc<Shared>, stream: S, peer: Peer, raw_tcp: bool) {
    if proxy::over_connection_cap(shared) {
        return;
    }
    let guard = shared.drain.connection();
    let shared = shared.clone();
    if raw_tcp {
        tokio::spawn(tcp::serve_connection(shared, stream, peer, guard));
    } else {
        tokio::spawn(proxy::serve_connection(shared, stream, peer, guard));
    }
}

/// The longest the exit waits for a preStop answer to leave, and again for
/// the accept loops to close their listeners.
const EXIT_SETTLE: std::time::Duration = std::time::Duration::from_secs(2);

/// The drain reason of an upgrade hand-over.
pub const UPGRADE_REASON: &str = "upgrade";

/// Starts the sidecar with signal handling, announces the bound ports and
/// runs until SIGTERM/SIGINT and the drain that follows are over.
pub async fn run(startup: cli::Startup, settings: Settings) -> Result<DrainReport> {
    let mut config = startup.config;
    let sidecar = Sidecar::start_with(&mut config, settings, true, startup.file_missing).await?;
    reload::note_unknown_keys(&sidecar.shared, &startup.unknown_keys);
    sidecar.write_ready_file()?;
    println!("{}", sidecar.ready_line());
    upgrade::notify_ready();
    notify::notify("READY=1");
    Ok(sidecar.wait().await)
}
