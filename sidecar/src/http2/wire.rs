//! What one connection, its streams and its socket share.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use futures_util::task::AtomicWaker;

/// State shared by the connection and its streams.
#[derive(Default)]
pub(super) struct Wire {
    /// Accepted streams whose last frame has not been queued yet.
    pub(super) open_streams: AtomicU32,
    /// Wakes the connection when a stream ends.
    pub(super) waker: AtomicWaker,
    /// This connection's own app connection (upstream/h2.rs), used once it
    /// was seen withholding its window: one client cannot stall another's
    /// answers.
    pub(super) upstream: Arc<crate::upstream::H2Slot>,
    /// A stream of this connection waited for the client's window: its
    /// later streams go on its own app connection.
    pub(super) withheld: AtomicBool,
    /// Streams of this connection on the upstream's shared app connection.
    pub(super) on_shared: AtomicU32,
    /// `limits.writeTimeout`: a stream that gets no send capacity for this
    /// long is reset (zero: never).
    pub(super) write_timeout: Duration,
}

impl Wire {
    /// Where a new stream goes: the shared app connection (with the guard
    /// that counts it there), or `None`: this connection's own.
    pub(super) fn share(self: &Arc<Self>) -> Option<OnShared> {
        use crate::upstream::{SHARED_STREAMS_PER_CLIENT, share_all};
        if !share_all()
            && (self.withheld.load(Ordering::Acquire)
                || self.on_shared.load(Ordering::Acquire) >= SHARED_STREAMS_PER_CLIENT)
        {
            return None;
        }
        self.on_shared.fetch_add(1, Ordering::AcqRel);
        Some(OnShared(self.clone()))
    }

    /// A stream waits for the client's window.
    pub(super) fn window_withheld(&self) {
        if !self.withheld.swap(true, Ordering::AcqRel) {
            tracing::debug!(
                "an HTTP/2 client withholds its window: its next streams go on an app connection of its own"
            );
        }
    }
}

/// One stream counted on the shared app connection until it ends.
pub(super) struct OnShared(Arc<Wire>);

impl Drop for OnShared {
    fn drop(&mut self) {
        self.0.on_shared.fetch_sub(1, Ordering::AcqRel);
    }
}
