//! The proxy's listening sockets: TCP (one, or `workers` of them sharing
//! the port through `SO_REUSEPORT`) or a Unix domain socket.
//!
//! A Unix socket path is a file, which raises three questions TCP does not:
//! - a file left at the path by a process that died: removed only if it is
//!   a socket and nobody answers a connect on it (a live sidecar, or any
//!   other server, is never unlinked from under its clients); anything else
//!   at the path refuses the start with a message saying what is there;
//! - who may connect: `listenMode` (`--listen-mode 0660`) sets the file's
//!   permissions right after bind; without it the umask decides;
//! - who removes it: the process that bound it (or got it through our own
//!   upgrade hand-over) unlinks it when its listener closes, unless it
//!   handed the socket to a new process, and only if the path still names
//!   the same file. Sockets inherited from systemd or server-starter are
//!   theirs: never unlinked here.
//!
//! A Unix peer has no address. `X-Forwarded-For` gets `unix:` for it, what
//! nginx writes for `$remote_addr` on a Unix listener, so an app that
//! appends or parses the header still sees one entry per hop.

use std::net::SocketAddr;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use socket2::{Domain, SockAddr, Socket, Type};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::net::UnixListener;

use crate::config::{Endpoint, SocketMode};
use crate::error::{Error, Result};

/// Pending connections per socket: the kernel caps it at `somaxconn`.
const BACKLOG: i32 = 1024;

/// One listening socket of the proxy.
#[derive(Debug)]
pub enum Listener {
    Tcp(TcpAcceptor),
    Unix(UnixListener),
}

impl Listener {
    /// What clients connect to, in the config's spelling.
    pub fn endpoint(&self) -> Endpoint {
        match self {
            Self::Tcp(l) => match l.local_addr() {
                Ok(addr) => Endpoint::Tcp(addr),
                Err(_) => Endpoint::Tcp(SocketAddr::from(([0, 0, 0, 0], 0))),
            },
            Self::Unix(l) => Endpoint::Unix(
                l.local_addr()
                    .ok()
                    .and_then(|a| a.as_pathname().map(Path::to_path_buf))
                    .unwrap_or_default(),
            ),
        }
    }

    /// Turns a listening socket from the environment (already checked to be
    /// listening, non-blocking) into a tokio listener of the right family.
    pub fn from_socket(socket: Socket) -> Result<Listener> {
        if socket.domain()? == Domain::UNIX {
            let std: std::os::unix::net::UnixListener = socket.into();
            Ok(Self::Unix(UnixListener::from_std(std)?))
        } else {
            let std: std::net::TcpListener = socket.into();
            Ok(Self::Tcp(TcpAcceptor::from_std(std)?))
        }
    }
}

impl Listener {
    /// Stops listening without closing the socket (see `accept_loop` in
    /// lib.rs): TCP only, on Linux `shutdown(SHUT_RD)` of a listening socket
    /// refuses new connections and resets the backlog, keeping the fd and
    /// its bound address. Returns whether it paused (a Unix socket cannot
    /// listen again afterwards, so it is left as it is).
    pub fn pause(&self) -> bool {
        match self {
            Self::Tcp(l) => match socket2::SockRef::from(l).shutdown(std::net::Shutdown::Read) {
                Ok(()) => true,
                Err(err) => {
                    tracing::warn!(error = %err, "cannot pause the listener; leaving it unaccepted");
                    false
                }
            },
            Self::Unix(_) => false,
        }
    }

    /// Listens again on a paused socket (same socket, same address) and
    /// returns a new handle on it to accept with. The old handle saw the
    /// shutdown as a hang-up, which tokio keeps as a sticky "read closed":
    /// accepting on it would spin. The new one (a `dup` of the fd, so the
    /// socket stays the very same) starts with a fresh registration. `None`
    /// for a Unix socket, which was never paused.
    pub fn resume(&self) -> std::io::Result<Option<Listener>> {
        match self {
            Self::Tcp(l) => {
                // Re-applied in case the kernel reset the option with the
                // listening state (Linux keeps it today).
                let deferred = defer_accept_secs(l)?;
                socket2::SockRef::from(l).listen(BACKLOG)?;
                if deferred > 0 {
                    set_defer_accept(l, deferred)?;
                }
                let fd = std::os::fd::AsFd::as_fd(l).try_clone_to_owned()?;
                let std = std::net::TcpListener::from(fd);
                std.set_nonblocking(true)?;
                Ok(Some(Self::Tcp(TcpAcceptor::from_std(std)?)))
            }
            Self::Unix(_) => Ok(None),
        }
    }
}

impl Listener {
    /// Turns deferred accept on or off on a TCP listener (see
    /// [`set_defer_accept`]); a Unix socket has no such option. A failure
    /// is logged: the listener still accepts, only later or sooner.
    pub fn set_defer_accept(&self, on: bool) {
        if let Self::Tcp(l) = self {
            let secs = if on { DEFER_ACCEPT_SECS } else { 0 };
            if let Err(err) = set_defer_accept(l, secs) {
                tracing::warn!(error = %err, "cannot set TCP_DEFER_ACCEPT on the listener");
            }
        }
    }
}

impl std::os::fd::AsFd for Listener {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        match self {
            Self::Tcp(l) => l.as_fd(),
            Self::Unix(l) => l.as_fd(),
        }
    }
}

/// A listening TCP socket in tokio's reactor whose accepted connections
/// are not: they are handed out as plain non-blocking sockets, which the
/// proxy registers only if one has to wait (`proxy::LazyTcp`). tokio's
/// `TcpListener::accept` registers every connection it returns.
#[derive(Debug)]
pub struct TcpAcceptor(AsyncFd<mio::net::TcpListener>);

impl TcpAcceptor {
    /// Wraps a listening, non-blocking socket.
    pub fn from_std(listener: std::net::TcpListener) -> std::io::Result<Self> {
        let listener = mio::net::TcpListener::from_std(listener);
        // tokio's safe wrappers register every accepted connection, and
        // its listener gives no readiness without accepting, so the
        // listener is registered as a raw fd.
        #[allow(unsafe_code)]
        // SAFETY: the mio listener owns its fd (taken from the std one
        // above) and moves into the `AsyncFd`, which keeps it for its whole
        // life: the fd stays open, names the same socket, and `as_raw_fd`
        // returns that same number until the `AsyncFd` drops it.
        let registered = unsafe { AsyncFd::register_with_interest(listener, Interest::READABLE) };
        Ok(Self(registered?))
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.0.get_ref().local_addr()
    }

    /// The next connection: non-blocking and close-on-exec (mio's
    /// `accept4`), not registered anywhere.
    pub async fn accept(&self) -> std::io::Result<(std::net::TcpStream, SocketAddr)> {
        loop {
            let mut ready = self.0.readable().await?;
            // `WouldBlock` clears the readiness and waits for the next edge.
            if let Ok(accepted) = ready.try_io(|listener| listener.get_ref().accept()) {
                return accepted.map(|(stream, peer)| (stream.into(), peer));
            }
        }
    }
}

impl std::os::fd::AsFd for TcpAcceptor {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.0.get_ref().as_fd()
    }
}

/// Where a downstream connection came from.
#[derive(Debug, Clone, Copy)]
pub enum Peer {
    Tcp(SocketAddr),
    Unix,
}

impl Peer {
    /// The `X-Forwarded-For` entry for this peer: its IP, or `unix:`.
    pub fn forwarded_for(&self) -> String {
        match self {
            Self::Tcp(addr) => addr.ip().to_string(),
            Self::Unix => "unix:".to_string(),
        }
    }

    /// [`Peer::forwarded_for`], rendered once per connection without an
    /// allocation: an IPv4 address digit by digit rather than through
    /// `fmt` (about 1.5% of a one-request connection's instructions,
    /// bench/README.md), into an array in the connection's context rather
    /// than a header value's own buffer (a malloc and a free per
    /// connection, which the fast path never needed).
    pub fn forwarded_for_text(&self) -> ForwardedFor {
        let mut text = [0u8; FORWARDED_FOR_MAX];
        let len = match self {
            Self::Tcp(SocketAddr::V4(addr)) => {
                let mut v4 = [0u8; 15];
                let n = ipv4_text(*addr.ip(), &mut v4);
                text[..n].copy_from_slice(&v4[..n]);
                n
            }
            other => {
                let rendered = other.forwarded_for();
                // Every IP's text fits; the fallback is for the type
                // system, not for a case that happens.
                let rendered = if rendered.len() <= FORWARDED_FOR_MAX {
                    rendered.into_bytes()
                } else {
                    b"unknown".to_vec()
                };
                text[..rendered.len()].copy_from_slice(&rendered);
                rendered.len()
            }
        };
        ForwardedFor {
            text,
            len: len as u8,
            header: std::sync::OnceLock::new(),
        }
    }
}

/// The longest IP address text: an IPv6 address with an embedded IPv4
/// one (`ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255`).
const FORWARDED_FOR_MAX: usize = 45;

/// A client's `X-Forwarded-For` entry ([`Peer::forwarded_for_text`]).
#[derive(Debug)]
pub struct ForwardedFor {
    text: [u8; FORWARDED_FOR_MAX],
    len: u8,
    /// hyper's path (HTTP/2, upgrades, the fast path off) wants a header
    /// value; made on its first request and shared by the rest.
    header: std::sync::OnceLock<http::HeaderValue>,
}

impl ForwardedFor {
    /// The entry's bytes, as the fast path writes them into a head.
    pub fn as_bytes(&self) -> &[u8] {
        &self.text[..usize::from(self.len)]
    }

    /// The entry as a header value.
    pub fn header(&self) -> &http::HeaderValue {
        self.header.get_or_init(|| {
            http::HeaderValue::from_bytes(self.as_bytes())
                .unwrap_or_else(|_| http::HeaderValue::from_static("unknown"))
        })
    }
}

/// Writes `ip` in dotted decimal (as its `Display` does) into `out`;
/// returns the length.
fn ipv4_text(ip: std::net::Ipv4Addr, out: &mut [u8; 15]) -> usize {
    let mut n = 0;
    for (i, octet) in ip.octets().into_iter().enumerate() {
        if i > 0 {
            out[n] = b'.';
            n += 1;
        }
        if octet >= 100 {
            out[n] = b'0' + octet / 100;
            n += 1;
        }
        if octet >= 10 {
            out[n] = b'0' + octet / 10 % 10;
            n += 1;
        }
        out[n] = b'0' + octet % 10;
        n += 1;
    }
    n
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Tcp(addr) => write!(f, "{addr}"),
            Self::Unix => f.write_str("unix:"),
        }
    }
}

/// How long the kernel holds a connection whose client has sent nothing
/// before handing it over anyway (`proxy.deferAccept`). Linux counts it in
/// SYN-ACK retransmissions: one second is one, the shortest wait there is.
pub const DEFER_ACCEPT_SECS: i32 = 1;

/// Sets `TCP_DEFER_ACCEPT` on a listening socket: `accept` returns a
/// connection once data arrived on it (or after `secs` of silence).
pub fn set_defer_accept(socket: &impl std::os::fd::AsFd, secs: i32) -> std::io::Result<()> {
    let fd = std::os::fd::AsRawFd::as_raw_fd(&socket.as_fd());
    #[allow(unsafe_code)]
    // SAFETY: `fd` is borrowed from a live socket for the call; the option
    // value is a C int read by the kernel from a pointer that outlives the
    // call, with its exact size.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_DEFER_ACCEPT,
            std::ptr::from_ref(&secs).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The socket's `TCP_DEFER_ACCEPT` in seconds (0: off).
pub fn defer_accept_secs(socket: &impl std::os::fd::AsFd) -> std::io::Result<i32> {
    let fd = std::os::fd::AsRawFd::as_raw_fd(&socket.as_fd());
    let mut secs: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    #[allow(unsafe_code)]
    // SAFETY: `fd` is borrowed from a live socket for the call; the kernel
    // writes at most `len` bytes (a C int) into `secs` and the written
    // length into `len`, both live locals.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_DEFER_ACCEPT,
            std::ptr::from_mut(&mut secs).cast(),
            &mut len,
        )
    };
    if rc == 0 {
        Ok(secs)
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Binds `workers` TCP listeners on `addr`. With more than one, each gets
/// `SO_REUSEPORT` and the kernel spreads new connections over them; port 0
/// is resolved by the first, the others join it. `defer_accept`: see
/// [`set_defer_accept`].
pub fn bind_tcp(addr: SocketAddr, workers: usize, defer_accept: bool) -> Result<Vec<TcpAcceptor>> {
    let mut listeners = Vec::with_capacity(workers);
    let mut target = addr;
    // Port 0 is resolved on a placeholder socket first and every listener
    // binds the number explicitly: the kernel drops an automatically
    // chosen port on `shutdown()`, and a paused listener (lib.rs) must keep
    // its address. The placeholder holds the port until the first binds.
    let _placeholder = if addr.port() == 0 {
        let (placeholder, port) = reserve_port(addr).map_err(|source| Error::Bind {
            what: "listener",
            addr: addr.to_string(),
            source,
        })?;
        target.set_port(port);
        Some(placeholder)
    } else {
        None
    };
    for _ in 0..workers.max(1) {
        let listener =
            bind_one_tcp(target, workers > 1, defer_accept).map_err(|source| Error::Bind {
                what: "listener",
                addr: target.to_string(),
                source,
            })?;
        target = listener.local_addr()?;
        listeners.push(listener);
    }
    Ok(listeners)
}

/// A bound, never listening socket on a free port of `addr`'s address.
fn reserve_port(addr: SocketAddr) -> std::io::Result<(Socket, u16)> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    let port = socket
        .local_addr()?
        .as_socket()
        .map(|a| a.port())
        .unwrap_or(0);
    Ok((socket, port))
}

fn bind_one_tcp(
    addr: SocketAddr,
    reuse_port: bool,
    defer_accept: bool,
) -> std::io::Result<TcpAcceptor> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    // What tokio's own bind does: a restart must not wait out TIME_WAIT.
    socket.set_reuse_address(true)?;
    if reuse_port {
        socket.set_reuse_port(true)?;
    }
    if defer_accept {
        set_defer_accept(&socket, DEFER_ACCEPT_SECS)?;
    }
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(BACKLOG)?;
    TcpAcceptor::from_std(socket.into())
}

/// Binds a Unix listener at `path`, clearing a stale socket file first,
/// and applies `mode`.
pub fn bind_unix(path: &Path, mode: Option<SocketMode>) -> Result<(UnixListener, UnixCleanup)> {
    let bind_err = |source: std::io::Error| Error::Bind {
        what: "listener",
        addr: format!("unix:{}", path.display()),
        source,
    };
    clear_stale(path)?;
    let socket = Socket::new(Domain::UNIX, Type::STREAM, None).map_err(bind_err)?;
    socket.set_nonblocking(true).map_err(bind_err)?;
    socket.set_cloexec(true).map_err(bind_err)?;
    socket
        .bind(&SockAddr::unix(path).map_err(bind_err)?)
        .map_err(bind_err)?;
    // From here the file is ours: a failure below removes it again.
    let mut cleanup = UnixCleanup::owned(path);
    if let Some(SocketMode(mode)) = mode {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(|e| {
            Error::Unsupported(format!(
                "listen: cannot set mode {:04o} on {}: {e}",
                mode,
                path.display()
            ))
        })?;
        // chmod changed the file's change time.
        cleanup.refresh();
    }
    socket.listen(BACKLOG).map_err(bind_err)?;
    let std: std::os::unix::net::UnixListener = socket.into();
    Ok((UnixListener::from_std(std).map_err(bind_err)?, cleanup))
}

/// Removes a socket file nobody listens on; refuses anything else.
fn clear_stale(path: &Path) -> Result<()> {
    let refuse =
        |why: String| Error::Unsupported(format!("listen: unix:{}: {why}", path.display()));
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(refuse(format!("cannot look at it: {e}"))),
    };
    if !meta.file_type().is_socket() {
        return Err(refuse(
            "exists and is not a socket; not removing it (move it away or pick another path)"
                .into(),
        ));
    }
    match std::os::unix::net::UnixStream::connect(path) {
        Ok(_) => Err(refuse(
            "something is listening on it (another sidecar?); stop it or pick another path".into(),
        )),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            std::fs::remove_file(path)
                .map_err(|e| refuse(format!("cannot remove the stale socket file: {e}")))?;
            tracing::info!(path = %path.display(), "removed a stale socket file nobody listened on");
            Ok(())
        }
        Err(e) => Err(refuse(format!(
            "cannot tell whether it is in use ({e}); not removing it"
        ))),
    }
}

/// Unlinks a Unix socket path when dropped, if this process owns it and
/// the path still names the file it bound.
#[derive(Debug, Default)]
pub struct UnixCleanup {
    owned: Option<(PathBuf, FileId)>,
}

/// Which file a path names: device, inode and change time (an inode number
/// freed by an unlink is often reused at once by the next bind).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileId(u64, u64, i64, i64);

impl FileId {
    fn of(meta: &std::fs::Metadata) -> Self {
        Self(meta.dev(), meta.ino(), meta.ctime(), meta.ctime_nsec())
    }
}

impl UnixCleanup {
    /// Nothing to clean up (TCP, or a socket systemd owns).
    pub fn none() -> Self {
        Self::default()
    }

    /// The file at `path` is ours: remember which file it is, so a path
    /// reused by someone else later is left alone.
    pub fn owned(path: &Path) -> Self {
        match std::fs::symlink_metadata(path) {
            Ok(meta) if meta.file_type().is_socket() => Self {
                owned: Some((path.to_path_buf(), FileId::of(&meta))),
            },
            _ => Self::none(),
        }
    }

    /// Re-reads the identity after we changed the file ourselves (chmod).
    fn refresh(&mut self) {
        if let Some((path, id)) = &mut self.owned
            && let Ok(meta) = std::fs::symlink_metadata(&*path)
        {
            *id = FileId::of(&meta);
        }
    }

    /// Keeps the file: the socket now belongs to another process.
    pub fn disarm(&mut self) {
        self.owned = None;
    }
}

impl Drop for UnixCleanup {
    fn drop(&mut self) {
        let Some((path, id)) = self.owned.take() else {
            return;
        };
        match std::fs::symlink_metadata(&path) {
            Ok(meta) if FileId::of(&meta) == id => {
                if let Err(e) = std::fs::remove_file(&path) {
                    tracing::warn!(path = %path.display(), error = %e, "cannot remove the socket file");
                } else {
                    tracing::info!(path = %path.display(), "socket file removed");
                }
            }
            _ => {
                tracing::debug!(path = %path.display(), "socket file replaced or gone; leaving it")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::temp_dir;

    #[tokio::test]
    async fn a_stale_socket_is_replaced_a_live_one_and_a_file_are_not() {
        let dir = temp_dir("listen", "stale");
        let path = dir.join("s.sock");
        // Stale: bound, then the listener closed without unlinking.
        drop(std::os::unix::net::UnixListener::bind(&path).expect("bind"));
        let (live, cleanup) = bind_unix(&path, Some(SocketMode(0o660))).expect("stale replaced");
        let mode = std::fs::metadata(&path).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode, 0o660);

        let err = bind_unix(&path, None).expect_err("in use");
        assert!(err.to_string().contains("listening"), "{err}");
        assert!(path.exists(), "a live socket is never unlinked");

        drop(live);
        drop(cleanup);
        assert!(!path.exists(), "the owner unlinks on close");

        std::fs::write(&path, "not a socket").expect("write");
        let err = bind_unix(&path, None).expect_err("a plain file");
        assert!(err.to_string().contains("not a socket"), "{err}");
        assert!(path.exists(), "a plain file is never removed");
    }

    #[tokio::test]
    async fn a_disarmed_or_replaced_path_is_left_alone() {
        let dir = temp_dir("listen", "disarm");
        let path = dir.join("s.sock");
        let (listener, mut cleanup) = bind_unix(&path, None).expect("bind");
        cleanup.disarm();
        drop(cleanup);
        assert!(path.exists(), "handed over: kept");
        drop(listener);

        let cleanup = UnixCleanup::owned(&path);
        std::fs::remove_file(&path).expect("rm");
        // A change time the old file cannot share, even at coarse clocks.
        std::thread::sleep(std::time::Duration::from_millis(20));
        let _other = std::os::unix::net::UnixListener::bind(&path).expect("someone else");
        drop(cleanup);
        assert!(path.exists(), "another process's socket at the path stays");
    }

    #[tokio::test]
    async fn reuse_port_listeners_share_one_port() {
        let listeners = bind_tcp("127.0.0.1:0".parse().expect("addr"), 3, true).expect("bind");
        assert_eq!(listeners.len(), 3);
        let port = listeners[0].local_addr().expect("addr").port();
        assert!(
            listeners
                .iter()
                .all(|l| l.local_addr().expect("addr").port() == port)
        );
    }

    /// Accepts within `wait`, or `None`.
    async fn accept_within(
        listener: &TcpAcceptor,
        wait: std::time::Duration,
    ) -> Option<std::net::TcpStream> {
        tokio::time::timeout(wait, listener.accept())
            .await
            .ok()
            .map(|accepted| accepted.expect("accept").0)
    }

    #[tokio::test]
    async fn a_deferred_listener_hands_over_a_connection_once_its_client_speaks() {
        use std::io::{Read, Write};
        use std::time::{Duration, Instant};

        let addr: SocketAddr = "127.0.0.1:0".parse().expect("addr");
        let mut deferred = bind_tcp(addr, 1, true).expect("bind");
        let deferred = deferred.pop().expect("one listener");
        assert_eq!(
            defer_accept_secs(&deferred).expect("getsockopt"),
            DEFER_ACCEPT_SECS
        );
        let target = deferred.local_addr().expect("addr");

        // Connected (the handshake is the kernel's), but not handed over
        // while the client says nothing...
        let mut speaker = std::net::TcpStream::connect(target).expect("connect");
        assert!(
            accept_within(&deferred, Duration::from_millis(300))
                .await
                .is_none(),
            "a silent connection is held by the kernel"
        );
        // ...and handed over with its first bytes already readable.
        speaker.write_all(b"GET / HTTP/1.1\r\n\r\n").expect("write");
        let mut accepted = accept_within(&deferred, Duration::from_secs(5))
            .await
            .expect("handed over once it spoke");
        accepted.set_nonblocking(true).expect("nonblocking");
        let mut buf = [0u8; 64];
        let n = accepted
            .read(&mut buf)
            .expect("the request is already there");
        assert_eq!(&buf[..n], b"GET / HTTP/1.1\r\n\r\n");

        // A client that stays silent is handed over anyway, after about
        // DEFER_ACCEPT_SECS (a SYN-ACK retransmission and its ACK), so the
        // header read timeout still reaches it.
        let started = Instant::now();
        let _silent = std::net::TcpStream::connect(target).expect("connect");
        let accepted = accept_within(&deferred, Duration::from_secs(10)).await;
        assert!(
            accepted.is_some(),
            "a silent client is handed over in the end"
        );
        assert!(
            started.elapsed() >= Duration::from_millis(500),
            "held first: {:?}",
            started.elapsed()
        );
    }

    #[tokio::test]
    async fn deferral_is_off_unless_asked_and_survives_a_pause() {
        let addr: SocketAddr = "127.0.0.1:0".parse().expect("addr");
        let plain = bind_tcp(addr, 1, false).expect("bind").pop().expect("one");
        assert_eq!(defer_accept_secs(&plain).expect("getsockopt"), 0);
        let _client =
            std::net::TcpStream::connect(plain.local_addr().expect("addr")).expect("connect");
        assert!(
            accept_within(&plain, std::time::Duration::from_secs(5))
                .await
                .is_some(),
            "handed over at the handshake"
        );

        let deferred = Listener::Tcp(bind_tcp(addr, 1, true).expect("bind").pop().expect("one"));
        assert!(deferred.pause());
        let resumed = deferred.resume().expect("listen again").expect("tcp");
        assert_eq!(
            defer_accept_secs(&resumed).expect("getsockopt"),
            DEFER_ACCEPT_SECS
        );

        // A socket handed over by our own upgrade takes the new config's value.
        resumed.set_defer_accept(false);
        assert_eq!(defer_accept_secs(&resumed).expect("getsockopt"), 0);
        resumed.set_defer_accept(true);
        assert_eq!(
            defer_accept_secs(&resumed).expect("getsockopt"),
            DEFER_ACCEPT_SECS
        );
    }

    #[test]
    fn the_forwarded_for_text_is_what_display_writes() {
        for ip in [
            [0, 0, 0, 0],
            [127, 0, 0, 1],
            [10, 9, 99, 100],
            [255, 255, 255, 255],
            [1, 20, 203, 4],
        ] {
            let peer = Peer::Tcp(SocketAddr::from((ip, 8080)));
            let text = peer.forwarded_for_text();
            assert_eq!(text.as_bytes(), peer.forwarded_for().as_bytes());
            assert_eq!(text.header().as_bytes(), peer.forwarded_for().as_bytes());
        }
        let v6 = Peer::Tcp("[::1]:80".parse().expect("addr"));
        assert_eq!(v6.forwarded_for_text().header(), "::1");
        let longest = Peer::Tcp(
            "[ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.254]:80"
                .parse()
                .expect("addr"),
        );
        assert_eq!(
            longest.forwarded_for_text().as_bytes(),
            longest.forwarded_for().as_bytes()
        );
        assert_eq!(Peer::Unix.forwarded_for_text().as_bytes(), b"unix:");
    }

    #[test]
    fn peers_forward_an_ip_or_unix() {
        assert_eq!(
            Peer::Tcp("10.0.0.1:5".parse().expect("addr")).forwarded_for(),
            "10.0.0.1"
        );
        assert_eq!(Peer::Unix.forwarded_for(), "unix:");
    }
}
