//! The fast path's idle app connections: raw sockets with their read
//! buffers, on the same LIFO stack as hyper's (upstream/idle.rs), under the
//! same `upstreamPool` settings. A socket goes back only after a response
//! that ended cleanly and left nothing unread.

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;

use crate::upstream::UpstreamStream;
use crate::upstream::idle::{IdleConn, IdleStack};

/// An app connection and what was read from it past the last response
/// (always empty when pooled).
pub(crate) struct AppConn {
    pub(crate) io: UpstreamStream,
    pub(crate) buf: BytesMut,
    /// Came from the pool: the app may have closed it meanwhile, so a
    /// request that meets its end before any answer may go again.
    pub(crate) reused: bool,
}

impl IdleConn for AppConn {
    fn looks_open(&self) -> bool {
        self.io.looks_open()
    }
}

pub(crate) struct RawPool(Arc<IdleStack<AppConn>>);

impl RawPool {
    pub(crate) fn new(max_idle: usize, idle_timeout: Duration) -> RawPool {
        RawPool(IdleStack::new(max_idle, idle_timeout))
    }

    /// The most recently returned connection that still looks open
    /// (readable means EOF or stray bytes: the app closed it).
    pub(crate) fn pop(&self) -> Option<AppConn> {
        let mut conn = self.0.pop()?;
        conn.reused = true;
        Some(conn)
    }

    /// `open`: the client connections open now (spare.rs's bound).
    pub(crate) fn push(&self, mut conn: AppConn, open: usize) {
        if conn.buf.is_empty() {
            // An idle app connection keeps no buffer (relaying grew it to
            // 20 KiB): after a spike the pool would hold them all for the
            // idle timeout. The next exchange takes one again (a spare one,
            // most often: see spare.rs).
            let buf = std::mem::take(&mut conn.buf);
            crate::spare::give_bytes(crate::spare::ReadClass::Http1App, buf, open);
            self.0.push(conn);
        }
    }
}
