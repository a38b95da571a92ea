//! systemd's readiness protocol (`sd_notify`), for `Type=notify` units:
//! when `NOTIFY_SOCKET` is set, the sidecar sends
//! - `READY=1` once its listeners and admin port serve;
//! - `STOPPING=1` when a drain-and-exit starts (SIGTERM, SIGINT);
//! - `MAINPID=<pid>` when an upgrade handed the sockets to a new process,
//!   so systemd follows the new process instead of treating the old one's
//!   exit as the service stopping (no `STOPPING=1` then). The new process
//!   is a child of the old one, so the unit needs `NotifyAccess=all` for
//!   its own messages to count.
//!
//! Without `NOTIFY_SOCKET` every call is a no-op. A failed send is logged
//! and otherwise ignored: readiness reporting must never stop the proxy.

use std::os::unix::net::UnixDatagram;

/// Sends `state` (e.g. `READY=1`) to the socket named by `NOTIFY_SOCKET`.
/// Returns whether a message was sent.
pub fn notify(state: &str) -> bool {
    let Some(target) = std::env::var_os("NOTIFY_SOCKET").filter(|v| !v.is_empty()) else {
        return false;
    };
    match send(&target, state) {
        Ok(()) => {
            tracing::debug!(state, "sd_notify sent");
            true
        }
        Err(e) => {
            tracing::warn!(state, socket = ?target, error = %e, "sd_notify failed");
            false
        }
    }
}

fn send(target: &std::ffi::OsStr, state: &str) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let socket = UnixDatagram::unbound()?;
    let bytes = target.as_bytes();
    // "@name" is a socket in Linux's abstract namespace (no file).
    if let Some(name) = bytes.strip_prefix(b"@") {
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
        socket.send_to_addr(state.as_bytes(), &addr)?;
    } else {
        socket.send_to(state.as_bytes(), target)?;
    }
    Ok(())
}
