//! Listening sockets handed to us by whoever started the process, so a
//! restart never closes the port: systemd socket activation (`LISTEN_FDS`,
//! `LISTEN_PID`, `LISTEN_FDNAMES`), the server-starter convention
//! (`SERVER_STARTER_PORT=host:port=fd;...`), and our own upgrade hand-over
//! (see [`crate::upgrade`]), which speaks the systemd dialect.
//!
//! Which fd is which: by name when `LISTEN_FDNAMES` says `listen` / `admin`
//! (`listen` may repeat: one per `--workers` listener, as our own upgrade
//! passes them); otherwise the first fd is the proxy listener and the
//! second, if any, the admin port. server-starter lists the proxy port
//! first, the admin second. A proxy socket may be TCP or Unix (the family
//! is read from the socket); the admin socket must be TCP.
//!
//! The one `unsafe` of the crate lives in [`adopt`]: turning a number from
//! the environment into an owned descriptor. It is only done after checking
//! that the number names an open socket (or, for the upgrade notification,
//! a pipe) in `/proc/self/fd`, at most once per process, and the adopted fd
//! gets `FD_CLOEXEC` so the app's own children never inherit it.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::FileTypeExt;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::error::{Error, Result};

/// First fd systemd passes (`SD_LISTEN_FDS_START`).
pub(crate) const FIRST_FD: RawFd = 3;

/// Environment variable naming the pipe a new process of an upgrade writes
/// `ready\n` to once it serves.
pub const NOTIFY_FD_ENV: &str = "KUBEGRACE_UPGRADE_NOTIFY_FD";

/// Listening sockets found in the environment.
#[derive(Debug, Default)]
pub struct Inherited {
    /// Proxy sockets (TCP or Unix), listening and non-blocking.
    pub listen: Vec<socket2::Socket>,
    pub admin: Option<std::net::TcpListener>,
    /// Where the upgrade hand-over expects `ready\n` (write end of a pipe).
    pub notify: Option<std::fs::File>,
    /// Which convention supplied the sockets, for the log.
    pub source: &'static str,
}

/// [`Inherited::source`] when the sockets came from our own upgrade.
pub const UPGRADE_SOURCE: &str = "upgrade";

/// The most fds `LISTEN_FDS` may pass: every worker listener plus admin.
const MAX_FDS: i32 = crate::config::MAX_WORKERS as i32 + 1;

static TAKEN: AtomicBool = AtomicBool::new(false);

/// Reads the environment once per process: a second call (another in-process
/// sidecar, a test) finds nothing, because an fd must have one owner.
pub fn take() -> Result<Inherited> {
    if TAKEN.swap(true, Ordering::AcqRel) {
        return Ok(Inherited::default());
    }
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    let mut found = match (env("LISTEN_FDS"), env("SERVER_STARTER_PORT")) {
        (Some(count), _) => from_systemd(
            &count,
            env("LISTEN_PID").as_deref(),
            env("LISTEN_FDNAMES").as_deref(),
        )?,
        (None, Some(spec)) => from_server_starter(&spec)?,
        (None, None) => Inherited::default(),
    };
    if let Some(fd) = env(NOTIFY_FD_ENV) {
        let fd = parse_fd(NOTIFY_FD_ENV, &fd)?;
        let mut taken = found
            .listen
            .iter()
            .map(|s| s.as_raw_fd())
            .chain(found.admin.as_ref().map(|a| a.as_raw_fd()));
        if taken.any(|t| t == fd) {
            return Err(unsupported(format!(
                "{NOTIFY_FD_ENV}={fd} is also a listening socket passed in; one descriptor, one use"
            )));
        }
        found.notify = Some(std::fs::File::from(adopt(fd, Kind::Pipe)?));
        // The sockets came from an older process of ourselves, not from
        // systemd: a Unix socket file is then ours to remove at the end.
        if found.source == "LISTEN_FDS" {
            found.source = UPGRADE_SOURCE;
        }
    }
    Ok(found)
}

fn from_systemd(count: &str, pid: Option<&str>, names: Option<&str>) -> Result<Inherited> {
    // systemd sets LISTEN_PID to the pid it started; a variable left over
    // from a parent is not ours. Our own hand-over cannot know the child's
    // pid in advance and leaves it unset, which we accept.
    if let Some(pid) = pid
        && pid.trim() != std::process::id().to_string()
    {
        tracing::info!(
            listen_pid = pid,
            "LISTEN_FDS is meant for another process; binding instead"
        );
        return Ok(Inherited::default());
    }
    let count: i32 = count
        .trim()
        .parse()
        .map_err(|_| unsupported(format!("LISTEN_FDS={count:?} is not a number")))?;
    let names: Vec<&str> = names.map(|n| n.split(':').collect()).unwrap_or_default();
    let named = names.iter().any(|n| *n == "listen" || *n == "admin");
    if !(1..=MAX_FDS).contains(&count) || (count > 2 && !named) {
        return Err(unsupported(format!(
            "LISTEN_FDS={count}: expected 1 (proxy) or 2 (proxy, admin) sockets, or up to \
             {MAX_FDS} named listen/admin in LISTEN_FDNAMES"
        )));
    }
    let mut found = Inherited {
        source: "LISTEN_FDS",
        ..Inherited::default()
    };
    for i in 0..count {
        let fd = FIRST_FD + i;
        let role = match names.get(i as usize).copied() {
            Some("admin") => "admin",
            Some("listen") => "listen",
            _ if i == 0 => "listen",
            _ => "admin",
        };
        let socket = listener(fd, role)?;
        if role == "listen" {
            found.listen.push(socket);
        } else if found.admin.replace(admin(fd, socket)?).is_some() {
            return Err(unsupported("LISTEN_FDNAMES names two admin sockets".into()));
        }
    }
    if found.listen.is_empty() {
        return Err(unsupported(
            "LISTEN_FDS passes an admin socket but no proxy (listen) socket".into(),
        ));
    }
    Ok(found)
}

/// `SERVER_STARTER_PORT`: `host:port=fd` or `port=fd`, `;`-separated.
fn from_server_starter(spec: &str) -> Result<Inherited> {
    let mut found = Inherited {
        source: "SERVER_STARTER_PORT",
        ..Inherited::default()
    };
    // Every entry is checked before any descriptor is adopted: an fd named
    // twice would get two owners and be closed twice (the second close
    // could hit whatever reused the number).
    let mut fds: Vec<RawFd> = Vec::new();
    for entry in spec.split(';').filter(|e| !e.trim().is_empty()) {
        let (_, fd) = entry.rsplit_once('=').ok_or_else(|| {
            unsupported(format!(
                "SERVER_STARTER_PORT entry {entry:?} is not addr=fd"
            ))
        })?;
        let fd = parse_fd("SERVER_STARTER_PORT", fd)?;
        if fds.contains(&fd) {
            return Err(unsupported(format!(
                "SERVER_STARTER_PORT={spec:?} names fd {fd} twice; give the proxy and the admin port one socket each"
            )));
        }
        fds.push(fd);
    }
    for (i, fd) in fds.into_iter().enumerate() {
        match i {
            0 => found.listen.push(listener(fd, "listen")?),
            1 => found.admin = Some(admin(fd, listener(fd, "admin")?)?),
            _ => {
                return Err(unsupported(format!(
                    "SERVER_STARTER_PORT={spec:?}: at most two ports (proxy, admin)"
                )));
            }
        }
    }
    Ok(found)
}

fn parse_fd(var: &str, text: &str) -> Result<RawFd> {
    match text.trim().parse::<RawFd>() {
        Ok(fd) if fd > 2 => Ok(fd),
        _ => Err(unsupported(format!(
            "{var}: {text:?} is not a file descriptor above 2"
        ))),
    }
}

/// The admin port speaks HTTP over TCP only.
fn admin(fd: RawFd, socket: socket2::Socket) -> Result<std::net::TcpListener> {
    if socket.domain()? == socket2::Domain::UNIX {
        return Err(unsupported(format!(
            "inherited fd {fd} (admin) is a Unix socket; the admin port must be TCP"
        )));
    }
    Ok(socket.into())
}

fn listener(fd: RawFd, role: &str) -> Result<socket2::Socket> {
    let socket = socket2::Socket::from(adopt(fd, Kind::Socket)?);
    if !socket.is_listener()? {
        return Err(unsupported(format!(
            "inherited fd {fd} ({role}) is a socket but not a listening one"
        )));
    }
    // tokio needs it non-blocking; nothing else sets it for us.
    socket.set_nonblocking(true)?;
    let addr = socket
        .local_addr()
        .ok()
        .map(|a| match (a.as_socket(), a.as_pathname()) {
            (Some(ip), _) => ip.to_string(),
            (None, Some(path)) => format!("unix:{}", path.display()),
            (None, None) => "unix:(unnamed)".to_string(),
        });
    tracing::info!(fd, role, addr = ?addr, "using an inherited listening socket");
    Ok(socket)
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Socket,
    Pipe,
}

/// Takes ownership of an inherited descriptor after checking it is open
/// and of the expected kind.
fn adopt(fd: RawFd, kind: Kind) -> Result<OwnedFd> {
    let proc_path = format!("/proc/self/fd/{fd}");
    // symlink_metadata would describe the link; metadata follows it to the
    // open file itself (socket:[inode] / pipe:[inode] resolve fine).
    let meta = std::fs::metadata(&proc_path)
        .map_err(|e| unsupported(format!("inherited fd {fd} is not open: {e}")))?;
    let ok = match kind {
        Kind::Socket => meta.file_type().is_socket(),
        Kind::Pipe => meta.file_type().is_fifo(),
    };
    if !ok {
        return Err(unsupported(format!(
            "inherited fd {fd} is not a {}",
            if kind == Kind::Socket {
                "socket"
            } else {
                "pipe"
            }
        )));
    }
    #[allow(unsafe_code)]
    // SAFETY: `fd` is open (just checked through /proc/self/fd) and was
    // handed to this process by its parent for exactly this purpose; `take`
    // runs once per process (TAKEN), the range 0..=2 is refused, and each
    // number appears once per convention, so nothing else owns or closes it.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    // The app this process may spawn (none today) or a later upgrade must
    // not inherit it implicitly; the upgrade passes fds explicitly.
    if kind == Kind::Socket {
        socket2::SockRef::from(&owned).set_cloexec(true)?;
        Ok(owned)
    } else {
        // try_clone duplicates with F_DUPFD_CLOEXEC; the original goes.
        let file = std::fs::File::from(owned);
        Ok(OwnedFd::from(file.try_clone()?))
    }
}

fn unsupported(msg: String) -> Error {
    Error::Unsupported(msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn foreign_listen_pid_is_ignored() {
        let got = from_systemd("1", Some("1"), None).expect("ignored");
        assert!(got.listen.is_empty());
    }

    #[test]
    fn bad_values_are_refused() {
        assert!(from_systemd("x", None, None).is_err());
        assert!(from_systemd("3", None, None).is_err(), "3 unnamed fds");
        assert!(
            from_systemd("70", None, Some("listen")).is_err(),
            "too many"
        );
        assert!(from_server_starter("8080").is_err());
        // Refused before adopting anything: fd 900 is not even open.
        let err = from_server_starter("127.0.0.1:8080=900;127.0.0.1:15020=900")
            .expect_err("one fd twice");
        assert!(err.to_string().contains("names fd 900 twice"), "{err}");
        assert_eq!(err.exit_code(), 64);
        assert!(parse_fd("X", "1").is_err());
    }

    #[test]
    fn a_closed_fd_is_refused_not_adopted() {
        // 1000 is not open in the test process.
        assert!(adopt(1000, Kind::Socket).is_err());
    }
}
