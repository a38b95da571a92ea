//! Zero-downtime upgrade of the sidecar itself, outside Kubernetes (where a
//! container restart would close the port): the running process starts a
//! new one that inherits both listening sockets, waits until it serves, and
//! only then drains itself and exits. The sockets are never closed in
//! between (both processes hold them), so no connection is refused.
//!
//! Triggers: `SIGUSR2` (nginx's binary-upgrade signal; SIGHUP already means
//! "reload the config") and `POST /upgrade` on the admin port, which is what
//! `kubegrace-sidecar upgrade --admin ADDR` sends; it answers once the new
//! process is ready (200) or failed (500, with the reason).
//!
//! Hand-over protocol (the child side is [`crate::inherit`]):
//! - the new process is the binary at `--upgrade-binary`, or the path of
//!   the running executable (so a binary replaced on disk is picked up), with
//!   the same arguments and environment;
//! - fd 3 = proxy listener, fd 4 = admin listener (`LISTEN_FDS=2`,
//!   `LISTEN_FDNAMES=listen:admin`, no `LISTEN_PID`); with `--workers N`
//!   the N proxy listeners are fds 3.. and admin follows
//!   (`LISTEN_FDS=N+1`, `listen:...:listen:admin`); the next fd is the write
//!   end of a pipe named by `KUBEGRACE_UPGRADE_NOTIFY_FD`; the child writes
//!   `ready\n` once it serves. `command-fds` clears CLOEXEC in the child
//!   only, so no `unsafe` here;
//! - EOF before `ready` (bad binary, crash, bad flags) or no answer within
//!   [`READY_TIMEOUT`] (the child is killed) leaves this process serving.
//!
//! After a successful hand-over this process drains with a short grace
//! (see [`handover_timers`]) and exits 0.

use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::time::Duration;

use command_fds::{CommandFdExt, FdMapping};
use tokio::sync::watch;

use crate::config::{DrainConfig, HumanDuration};
use crate::drain::{Drain, Phase};
use crate::listen::Listener;
use crate::stop::{Stop, UPGRADE_REASON};

/// How long a new process may take to start serving.
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// The shortest grace after a hand-over: keep-alive clients get their
/// `Connection: close`, and the answer to `POST /upgrade` leaves before the
/// process exits.
const HANDOVER_GRACE: Duration = Duration::from_millis(200);

/// Everything needed to hand the sockets over.
pub struct Upgrader {
    /// The accept loops own the listeners and drop them at `Closing`; weak
    /// handles mean an upgrade cannot keep a drained port open.
    listeners: Vec<Weak<Listener>>,
    admin: OwnedFd,
    binary: Option<PathBuf>,
    drain: Drain,
    /// This process's drain-and-exit once the new process serves.
    stop: Stop,
    handed_over: HandOver,
    busy: tokio::sync::Mutex<()>,
}

/// One sidecar's upgrade state (it lives in [`crate::state::Shared`], so
/// two sidecars in one process, as in the integration tests, never share
/// it): its upgrader, whether it handed its sockets over, and the pipe to
/// the process that started it.
#[derive(Debug, Default)]
pub struct Upgrades {
    /// Only the binary installs one ([`Upgrades::install`]); in-process
    /// sidecars answer `POST /upgrade` with 501.
    upgrader: OnceLock<Arc<Upgrader>>,
    handed_over: HandOver,
    /// Write end of the parent's notification pipe, when we are the new
    /// process of an upgrade.
    parent: Mutex<Option<std::fs::File>>,
}

/// Whether the sockets went to a new process: set once, never cleared;
/// cheap to clone.
#[derive(Clone, Debug)]
pub struct HandOver(Arc<watch::Sender<bool>>);

impl Default for HandOver {
    fn default() -> Self {
        HandOver(Arc::new(watch::channel(false).0))
    }
}

impl HandOver {
    /// The new process serves: this one stops accepting at once.
    fn mark(&self) {
        self.0.send_replace(true);
    }

    /// Whether the sockets went to a new process: a Unix socket file then
    /// belongs to the new process and stays.
    pub fn is_done(&self) -> bool {
        *self.0.borrow()
    }

    /// Resolves once the sockets went to a new process (never for an
    /// in-process sidecar); the accept loop stops on it.
    pub async fn done(&self) {
        // The sender is `self`: the wait ends only with a hand-over.
        let _ = self.0.subscribe().wait_for(|done| *done).await;
    }
}

impl std::fmt::Debug for Upgrader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upgrader")
            .field("listeners", &self.listeners.len())
            .field("binary", &self.binary)
            .finish()
    }
}

impl Upgrader {
    /// `stop` and `handed_over` are those of the sidecar whose sockets
    /// these are.
    pub fn new(
        listeners: Vec<Weak<Listener>>,
        admin: OwnedFd,
        binary: Option<PathBuf>,
        stop: Stop,
        drain: Drain,
        handed_over: HandOver,
    ) -> Arc<Upgrader> {
        Arc::new(Upgrader {
            listeners,
            admin,
            binary,
            drain,
            stop,
            handed_over,
            busy: tokio::sync::Mutex::new(()),
        })
    }

    /// Starts the new process and waits for it; returns its pid. On error
    /// this process carries on serving, untouched.
    pub async fn upgrade(&self) -> Result<u32, String> {
        let Ok(_busy) = self.busy.try_lock() else {
            return Err("an upgrade is already under way".into());
        };
        if self.drain.phase() != Phase::Serving {
            return Err(format!(
                "already {}: nothing left to hand over",
                self.drain.phase()
            ));
        }
        let dup = |fd: std::os::fd::BorrowedFd<'_>, what: &str| {
            fd.try_clone_to_owned()
                .map_err(|e| format!("cannot duplicate the {what} socket: {e}"))
        };
        let mut mappings = Vec::with_capacity(self.listeners.len() + 2);
        let mut next_fd = crate::inherit::FIRST_FD;
        for weak in &self.listeners {
            let listener = weak.upgrade().ok_or("the listener is already closed")?;
            mappings.push(FdMapping {
                parent_fd: dup(listener.as_fd(), "listener")?,
                child_fd: next_fd,
            });
            next_fd += 1;
        }
        mappings.push(FdMapping {
            parent_fd: dup(self.admin.as_fd(), "admin")?,
            child_fd: next_fd,
        });
        let notify_fd = next_fd + 1;
        let mut names = vec!["listen"; self.listeners.len()];
        names.push("admin");
        let (reader, writer) =
            std::io::pipe().map_err(|e| format!("cannot create the ready pipe: {e}"))?;

        let binary = match &self.binary {
            Some(path) => path.clone(),
            None => current_exe()?,
        };
        let mut command = tokio::process::Command::new(&binary);
        command
            .args(std::env::args_os().skip(1))
            .env("LISTEN_FDS", names.len().to_string())
            .env("LISTEN_FDNAMES", names.join(":"))
            .env_remove("LISTEN_PID")
            .env_remove("SERVER_STARTER_PORT")
            .env(crate::inherit::NOTIFY_FD_ENV, notify_fd.to_string())
            .fd_mappings(
                mappings
                    .into_iter()
                    .chain([FdMapping {
                        parent_fd: OwnedFd::from(writer),
                        child_fd: notify_fd,
                    }])
                    .collect(),
            )
            .map_err(|e| format!("fd mapping: {e}"))?;
        tracing::info!(binary = %binary.display(), "upgrade: starting the new process");
        let spawned = command.spawn();
        // The command holds our copy of the pipe's write end: drop it, or
        // the child's exit would never show as EOF.
        drop(command);
        let mut child = spawned.map_err(|e| format!("cannot start {}: {e}", binary.display()))?;
        let pid = child.id().unwrap_or(0);

        let wait_ready = tokio::task::spawn_blocking(move || {
            let mut reader = reader;
            let mut got = Vec::new();
            let mut buf = [0u8; 64];
            loop {
                match reader.read(&mut buf) {
                    Ok(0) => return false,
                    Ok(n) => {
                        got.extend_from_slice(&buf[..n]);
                        if got.windows(6).any(|w| w == b"ready\n") {
                            return true;
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => return false,
                }
            }
        });
        let outcome = tokio::time::timeout(READY_TIMEOUT, wait_ready).await;
        match outcome {
            Ok(Ok(true)) => {
                tracing::info!(pid, "upgrade: the new process serves; draining this one");
                // systemd (Type=notify) follows the new process from here.
                crate::notify::notify(&format!("MAINPID={pid}"));
                self.hand_over();
                Ok(pid)
            }
            Ok(_) => {
                // EOF: the child closed the pipe without a word, almost
                // always by exiting. Its status says why.
                let status = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
                let why = match status {
                    Ok(Ok(s)) => format!("the new process exited before it was ready ({s})"),
                    _ => {
                        let _ = child.start_kill();
                        "the new process closed its ready pipe without being ready; killed it"
                            .to_string()
                    }
                };
                tracing::error!(pid, "upgrade failed, still serving: {why}");
                Err(why)
            }
            Err(_) => {
                let _ = child.start_kill();
                let _ = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
                let why =
                    format!("the new process was not ready within {READY_TIMEOUT:?}; killed it");
                tracing::error!(pid, "upgrade failed, still serving: {why}");
                Err(why)
            }
        }
    }

    fn hand_over(&self) {
        // The accept loop stops now: every new connection goes to the new
        // process, so none can be accepted here and then caught by Closing
        // before its request is read.
        self.handed_over.mark();
        self.drain.set_timers(handover_timers(self.drain.timers()));
        self.stop.request(UPGRADE_REASON);
    }
}

/// Drain timers after a hand-over. The port stays open in the new process,
/// so there is no router to wait for, and this process no longer accepts.
/// A short grace (200 ms, then `quiet` capped at 200 ms after the last
/// accepted connection, 1 s at most) still lets every HTTP/1 keep-alive client get a
/// `Connection: close` answer and reconnect (to the new process) instead of
/// racing the close of an idle connection, and lets a connection accepted
/// just before the hand-over deliver its request. The in-flight timeout is
/// kept.
pub fn handover_timers(current: DrainConfig) -> DrainConfig {
    let cap = |d: HumanDuration, max: Duration| HumanDuration(d.0.min(max));
    DrainConfig {
        min_delay: HumanDuration(HANDOVER_GRACE),
        quiet: cap(current.quiet, HANDOVER_GRACE),
        max_delay: HumanDuration(
            cap(current.max_delay, Duration::from_secs(1))
                .0
                .max(HANDOVER_GRACE),
        ),
        // The in-flight timeout and every per-protocol setting are kept.
        ..current
    }
}

/// The running executable's path. After a package upgrade replaced the
/// file, /proc/self/exe reads "PATH (deleted)": the path is what we want,
/// since it now holds the new binary.
fn current_exe() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find my own binary: {e}"))?;
    let text = exe.to_string_lossy();
    Ok(match text.strip_suffix(" (deleted)") {
        Some(path) => PathBuf::from(path),
        None => exe,
    })
}

impl Upgrades {
    /// Makes `upgrader` this sidecar's upgrader (the binary's; in-process
    /// sidecars do not install one) and upgrades on SIGUSR2.
    pub fn install(&self, upgrader: Arc<Upgrader>) -> std::io::Result<()> {
        use tokio::signal::unix::{SignalKind, signal};
        let mut usr2 = signal(SignalKind::user_defined2())?;
        if self.upgrader.set(upgrader.clone()).is_err() {
            tracing::warn!("an upgrader is already installed; keeping the first");
            return Ok(());
        }
        tokio::spawn(async move {
            while usr2.recv().await.is_some() {
                tracing::info!("SIGUSR2: upgrading");
                // Errors are logged inside; the process keeps serving.
                let _ = upgrader.upgrade().await;
            }
        });
        Ok(())
    }

    /// `POST /upgrade` on the admin port: (status, body).
    pub async fn admin_upgrade(&self) -> (http::StatusCode, String) {
        let Some(upgrader) = self.upgrader.get() else {
            return (
                http::StatusCode::NOT_IMPLEMENTED,
                "this sidecar cannot upgrade itself (not started as the binary)\n".into(),
            );
        };
        match upgrader.upgrade().await {
            Ok(pid) => (
                http::StatusCode::OK,
                format!("upgraded: new process {pid} serves; this one drains\n"),
            ),
            Err(why) => (
                http::StatusCode::INTERNAL_SERVER_ERROR,
                format!("upgrade failed, still serving: {why}\n"),
            ),
        }
    }

    /// Whether the sockets went to a new process, and the wait for it.
    pub fn handed_over(&self) -> &HandOver {
        &self.handed_over
    }

    /// Keeps the parent's notification pipe until [`Upgrades::notify_ready`].
    pub fn set_parent(&self, file: Option<std::fs::File>) {
        if file.is_some() {
            *self.parent.lock().unwrap_or_else(PoisonError::into_inner) = file;
        }
    }

    /// Tells the process that started us (an upgrade) that we serve.
    pub fn notify_ready(&self) {
        use std::io::Write;
        let file = self
            .parent
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(mut file) = file
            && let Err(e) = file.write_all(b"ready\n")
        {
            tracing::warn!(error = %e, "cannot tell the old process we are ready");
        }
    }
}

/// The `upgrade` subcommand: asks the sidecar on `admin` to upgrade and
/// returns its answer; an error carries the reason it failed.
pub fn request(admin: std::net::SocketAddr, token: Option<&str>) -> Result<String, String> {
    use std::io::Write;
    let mut stream = std::net::TcpStream::connect_timeout(&admin, Duration::from_secs(5))
        .map_err(|e| format!("cannot reach the admin port {admin}: {e}"))?;
    // The sidecar answers once the new process is ready or has failed.
    let _ = stream.set_read_timeout(Some(READY_TIMEOUT + Duration::from_secs(30)));
    let token = token
        .map(|t| format!("{}: {t}\r\n", kubegrace_sidecar_api::admin::TOKEN_HEADER))
        .unwrap_or_default();
    let req = format!(
        "POST {} HTTP/1.1\r\nHost: {admin}\r\nContent-Length: 0\r\nConnection: close\r\n{token}\r\n",
        kubegrace_sidecar_api::admin::path::UPGRADE
    );
    stream
        .write_all(req.as_bytes())
        .map_err(|e| format!("cannot send the request: {e}"))?;
    let mut answer = String::new();
    stream
        .read_to_string(&mut answer)
        .map_err(|e| format!("no answer from {admin}: {e}"))?;
    let status = answer.split_whitespace().nth(1).unwrap_or("");
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.trim().to_string())
        .unwrap_or_default();
    if status == "200" {
        Ok(body)
    } else if status.is_empty() {
        Err(format!("no HTTP answer from {admin}"))
    } else {
        Err(format!("{status}: {body}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upgrader_of(upgrades: &Upgrades, drain: &Drain) -> Arc<Upgrader> {
        let admin = OwnedFd::from(std::fs::File::open("/dev/null").expect("/dev/null"));
        Upgrader::new(
            Vec::new(),
            admin,
            None,
            Stop::new(drain.clone()),
            drain.clone(),
            upgrades.handed_over().clone(),
        )
    }

    #[test]
    fn a_hand_over_is_one_sidecars_own() {
        // Two sidecars in one process, as in the integration tests.
        let (ours, theirs) = (Upgrades::default(), Upgrades::default());
        let (our_drain, their_drain) = (
            Drain::new(DrainConfig::default()),
            Drain::new(DrainConfig::default()),
        );
        let _their_upgrader = upgrader_of(&theirs, &their_drain);
        upgrader_of(&ours, &our_drain).hand_over();

        assert!(ours.handed_over().is_done());
        assert!(our_drain.is_exit(), "the hand-over stops this sidecar");
        assert_eq!(our_drain.timers().min_delay.0, HANDOVER_GRACE);
        assert!(!theirs.handed_over().is_done());
        assert!(!their_drain.is_exit());
    }

    #[tokio::test]
    async fn only_an_installed_upgrader_answers_post_upgrade() {
        let (status, _) = Upgrades::default().admin_upgrade().await;
        assert_eq!(status, http::StatusCode::NOT_IMPLEMENTED);
    }
}
