//! What one connection, its streams and its socket share.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::task::AtomicWaker;

use super::client::ClientKind;

/// State shared by the connection, its streams and its
/// [`FrameIo`](super::frame_io::FrameIo).
#[derive(Default)]
pub(super) struct Wire {
    pub(super) kind: AtomicU8,
    /// Streams whose last frame was handed to h2 and not yet seen written.
    pub(super) unwritten_ends: Mutex<HashSet<u32>>,
    /// Stream ends written so far (the quiet check watches it move).
    pub(super) ends_written: AtomicU64,
    /// Accepted streams whose last frame has not been handed to h2 yet.
    pub(super) open_streams: AtomicU32,
    /// The last-stream-id the final GOAWAY must carry, once set.
    pub(super) final_id: AtomicU32,
    pub(super) final_set: AtomicBool,
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

    pub(super) fn kind(&self) -> ClientKind {
        match self.kind.load(Ordering::Acquire) {
            1 => ClientKind::Conforming,
            2 => ClientKind::Strict,
            _ => ClientKind::Unknown,
        }
    }

    fn ends(&self) -> std::sync::MutexGuard<'_, HashSet<u32>> {
        self.unwritten_ends
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Call before handing a stream's last frame to h2.
    pub(super) fn expect_end(&self, id: u32) {
        self.ends().insert(id);
    }

    /// h2 refused the last frame (the stream is gone): nothing to wait for.
    pub(super) fn forget_end(&self, id: u32) {
        self.ends().remove(&id);
    }

    pub(super) fn end_written(&self, id: u32) {
        self.ends_written.fetch_add(1, Ordering::Relaxed);
        let mut ends = self.ends();
        if !ends.is_empty() {
            ends.remove(&id);
        }
    }

    pub(super) fn all_ends_written(&self) -> bool {
        self.ends().is_empty()
    }
}

/// One stream counted on the shared app connection until it ends.
pub(super) struct OnShared(Arc<Wire>);

impl Drop for OnShared {
    fn drop(&mut self) {
        self.0.on_shared.fetch_sub(1, Ordering::AcqRel);
    }
}
