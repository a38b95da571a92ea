//! The HTTP/2 side of the client to the app: its flow-control windows,
//! which connection a stream goes on, and what the app speaks
//! (docs/http2.md).
//!
//! Isolation. Flow control goes back to the app only as a response body
//! is read (upstream::H2Body, h2wire's RecvBody), for the stream and the connection together. A client that
//! reads nothing of a large answer therefore keeps a stream window's worth
//! of the app connection's window; enough such streams stop every other
//! answer on that connection. One app connection per downstream connection
//! (issue #35) made that impossible but cost a third of the HTTP/2 speed
//! (issue #39): eight clients meant eight app connections, each written
//! and read for a few streams at a time. So streams share one app
//! connection per upstream, and a client that can hold it up is moved off:
//! - the shared connection's stream window ([`SHARED_STREAM_WINDOW`]) is a
//!   small fraction of its connection window ([`SHARED_CONN_WINDOW`]): it
//!   takes 256 unread answers at once to stop it;
//! - a downstream connection whose stream waited for the client's window
//!   (send capacity withheld while the answer has bytes left: the only way
//!   a stream can hold app-side window) is marked, and its later streams
//!   go on its own app connection ([`H2Slot`], as before issue #39);
//! - a downstream connection has at most [`SHARED_STREAMS_PER_CLIENT`]
//!   streams on the shared connection (more go on its own), so one client
//!   opening many answers at once, before any of them is seen waiting,
//!   holds at most an eighth of the shared window;
//! - while [`SHARED_STALLED_LIMIT`] streams on the shared connection wait
//!   for their clients (half its window held), every new stream goes on
//!   its downstream connection's own app connection;
//! - a downstream stream that gets no send capacity for
//!   `limits.writeTimeout` is reset (http2/stream.rs), which frees its
//!   share of the app connection.
//!
//! What is left: eight clients that each open 32 large answers in one go
//! and read nothing can stop the shared connection until
//! `limits.writeTimeout` resets their streams. Memory: the app may send at
//! most the connection window unread, [`SHARED_CONN_WINDOW`] per upstream
//! for the shared connection and [`CONN_WINDOW`] per moved client.
//!
//! The placement is carried to the upstream call as a task-local
//! ([`Affinity`], see [`with_affinity`]). `KUBEGRACE_TEST_H2_SHARE_ALL=1`
//! turns the moves off (every stream on the shared connection): the
//! isolation tests are run with it to show that they can fail.
//!
//! What the app speaks. The preface of a new app connection is answered by
//! an HTTP/2 server with its SETTINGS frame; an HTTP/1.1-only server
//! answers with an HTTP/1.x error or closes. [`Sniff`] reads that first
//! answer as the connection's task reads it; the verdict ([`AppProtocol`])
//! is remembered per app endpoint and re-checked after [`RECHECK`], so an
//! app that starts speaking HTTP/2 is noticed.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use tokio::sync::oneshot;

use super::h2conn::H2Sender;
use crate::passthrough::{ReadWatch, Watched};

/// A downstream connection's own app connection's stream window: what one
/// stream's unread answer can hold (Envoy's recommended per-stream bound
/// is 64 KiB at the edge, its per-connection buffer 1 MiB; a sidecar on
/// loopback can afford a larger stream window for throughput and still
/// keep it a fraction of the connection's).
pub(crate) const STREAM_WINDOW: u32 = 256 * 1024;
/// Its connection window: four stalled streams' worth, so siblings of a
/// stalled stream keep flowing.
pub(crate) const CONN_WINDOW: u32 = 4 * STREAM_WINDOW;
/// The shared app connection's stream window: HTTP/2's default, enough on
/// loopback; small, so that it takes many unread answers to hold the
/// connection window.
pub(crate) const SHARED_STREAM_WINDOW: u32 = 64 * 1024;
/// The shared app connection's window: 256 unread answers' worth. Also the
/// most the app can have sent on it unread (memory).
pub(crate) const SHARED_CONN_WINDOW: u32 = 256 * SHARED_STREAM_WINDOW;
/// Streams one downstream connection may have on the shared app
/// connection at once (h2load's and gRPC clients' usual concurrency fits).
pub const SHARED_STREAMS_PER_CLIENT: u32 = 32;
/// Streams waiting for their clients on the shared connection from which
/// new streams go on their own connections: half the shared window held.
pub(crate) const SHARED_STALLED_LIMIT: u32 = SHARED_CONN_WINDOW / SHARED_STREAM_WINDOW / 2;

/// How long a verdict of HTTP/1.1 stands before the next HTTP/2 request
/// tries the preface again (one extra connection per endpoint this often).
pub(crate) const RECHECK: Duration = Duration::from_secs(10);
/// How long a new app connection waits for the app's first frame. An
/// HTTP/2 server sends its SETTINGS at once; an app silent this long is
/// used as before (HTTP/2), with no verdict.
pub(crate) const SNIFF_TIMEOUT: Duration = Duration::from_secs(1);

/// The app connection in use for a set of streams: the upstream's shared
/// one, or one downstream connection's own.
#[derive(Default)]
pub struct H2Slot {
    current: Mutex<Option<H2Current>>,
    /// Held while a new connection is made, so a burst of streams after a
    /// GOAWAY opens one connection, not one each.
    pub(crate) connecting: tokio::sync::Mutex<()>,
    /// The upstream's shared connection (its windows differ).
    shared: bool,
    /// Streams on this connection now waiting for their client's window
    /// (shared connection only).
    pub(crate) stalled: Arc<AtomicU32>,
}

struct H2Current {
    /// Which [`Upstream`](super::Upstream) it goes to (the app instance
    /// behind a downstream connection can change, see slots.rs).
    upstream: u64,
    id: u64,
    sender: H2Sender,
}

impl H2Slot {
    /// The slot of an upstream's shared connection.
    pub(crate) fn shared() -> H2Slot {
        H2Slot {
            shared: true,
            ..H2Slot::default()
        }
    }

    /// The (stream, connection) windows of a new connection in this slot.
    pub(crate) fn windows(&self) -> (u32, u32) {
        if self.shared {
            (SHARED_STREAM_WINDOW, SHARED_CONN_WINDOW)
        } else {
            (STREAM_WINDOW, CONN_WINDOW)
        }
    }

    /// The open connection to `upstream`, if any.
    pub(crate) fn current(&self, upstream: u64) -> Option<(u64, H2Sender)> {
        let slot = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        slot.as_ref()
            .filter(|c| c.upstream == upstream && !c.sender.is_closed())
            .map(|c| (c.id, c.sender.clone()))
    }

    pub(crate) fn install(&self, upstream: u64, id: u64, sender: H2Sender) {
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) = Some(H2Current {
            upstream,
            id,
            sender,
        });
    }

    /// Forgets connection `id` unless another request already replaced it.
    pub(crate) fn retire(&self, id: u64) {
        let mut slot = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        if slot.as_ref().is_some_and(|c| c.id == id) {
            *slot = None;
        }
    }
}

/// Where one downstream stream's request goes: its downstream connection's
/// own app connection, or, if it may, the upstream's shared one, and then
/// which shared connection's stall count it adds to while its client
/// withholds the window.
pub struct Affinity {
    own: Arc<H2Slot>,
    may_share: bool,
    shared_on: OnceLock<Arc<AtomicU32>>,
}

impl Affinity {
    pub fn new(own: Arc<H2Slot>, may_share: bool) -> Arc<Affinity> {
        Arc::new(Affinity {
            own,
            may_share,
            shared_on: OnceLock::new(),
        })
    }

    /// The slot for this stream's request to an upstream whose shared slot
    /// is `shared`.
    pub(crate) fn slot<'a>(&'a self, shared: &'a H2Slot) -> &'a H2Slot {
        if !self.may_share
            || (!share_all() && shared.stalled.load(Ordering::Acquire) >= SHARED_STALLED_LIMIT)
        {
            return &self.own;
        }
        let _ = self.shared_on.set(shared.stalled.clone());
        shared
    }

    /// The stream waits for its client's window: counted as holding the
    /// shared connection (if it is on it) until the guard drops.
    pub fn stalled(&self) -> Option<Stalled> {
        let count = self.shared_on.get()?.clone();
        count.fetch_add(1, Ordering::AcqRel);
        Some(Stalled(count))
    }
}

/// One stream counted as waiting on the shared connection.
pub struct Stalled(Arc<AtomicU32>);

impl Drop for Stalled {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// `KUBEGRACE_TEST_H2_SHARE_ALL=1`: every stream on the shared connection,
/// nobody moved (a test switch: the isolation tests fail with it).
pub fn share_all() -> bool {
    static SHARE_ALL: OnceLock<bool> = OnceLock::new();
    *SHARE_ALL
        .get_or_init(|| std::env::var_os("KUBEGRACE_TEST_H2_SHARE_ALL").is_some_and(|v| v == "1"))
}

tokio::task_local! {
    /// The placement of the downstream stream this task serves.
    static AFFINITY: Arc<Affinity>;
}

/// Runs `fut` (one downstream stream's request) with its placement, which
/// the upstream call reads. Not an `async fn`: that would hold `fut` twice
/// (as its argument and inside the scope), and this future is moved into
/// every stream's box when the stream is accepted.
pub fn with_affinity<F: std::future::Future>(
    affinity: Arc<Affinity>,
    fut: F,
) -> tokio::task::futures::TaskLocalFuture<Arc<Affinity>, F> {
    AFFINITY.scope(affinity, fut)
}

/// The placement of the downstream stream this task serves, if any.
pub(crate) fn affinity() -> Option<Arc<Affinity>> {
    AFFINITY.try_with(Arc::clone).ok()
}

const UNKNOWN: u8 = 0;
const HTTP2: u8 = 1;
const HTTP1: u8 = 2;

/// What one app endpoint speaks, as last learnt from a preface.
pub(crate) struct AppProtocol {
    verdict: AtomicU8,
    /// When the verdict was learnt, in ms since `epoch`.
    learnt_ms: AtomicU64,
    epoch: tokio::time::Instant,
    /// One re-check at a time.
    rechecking: AtomicBool,
}

/// What to do with an HTTP/2 request when no app connection is open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// Connect with the preface (and learn from the answer).
    Connect,
    /// The app speaks HTTP/1.1: send it as HTTP/1.1.
    Http1,
}

impl Default for AppProtocol {
    fn default() -> Self {
        AppProtocol {
            verdict: AtomicU8::new(UNKNOWN),
            learnt_ms: AtomicU64::new(0),
            epoch: tokio::time::Instant::now(),
            rechecking: AtomicBool::new(false),
        }
    }
}

impl AppProtocol {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// The way for a request that finds no open app connection. A stale
    /// HTTP/1.1 verdict sends one request (the first to ask) through the
    /// preface again; the others keep to HTTP/1.1 meanwhile.
    pub(crate) fn route(&self) -> Route {
        if self.verdict.load(Ordering::Acquire) != HTTP1 {
            return Route::Connect;
        }
        let age = self
            .now_ms()
            .saturating_sub(self.learnt_ms.load(Ordering::Acquire));
        if u128::from(age) < RECHECK.as_millis() {
            return Route::Http1;
        }
        match self
            .rechecking
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => Route::Connect,
            Err(_) => Route::Http1,
        }
    }

    /// A preface was answered (`None`: not within [`SNIFF_TIMEOUT`]).
    /// Returns whether the app speaks HTTP/2 (an unanswered preface is
    /// taken as HTTP/2, the behaviour before the app was asked).
    pub(crate) fn learn(&self, heard: Option<Heard>) -> bool {
        let verdict = match heard {
            Some(Heard::Http2) => HTTP2,
            Some(Heard::Other | Heard::Closed) => HTTP1,
            // Silent: an app known to speak HTTP/1.1 stays so until the
            // next re-check; otherwise it is used as before.
            None if self.verdict.load(Ordering::Acquire) == HTTP1 => {
                self.learnt_ms.store(self.now_ms(), Ordering::Release);
                return false;
            }
            None => return true,
        };
        self.learnt_ms.store(self.now_ms(), Ordering::Release);
        let before = self.verdict.swap(verdict, Ordering::AcqRel);
        if before != verdict {
            if verdict == HTTP1 {
                tracing::info!(
                    ?heard,
                    "the app does not speak HTTP/2: HTTP/2 requests go to it as HTTP/1.1 (gRPC cannot)"
                );
            } else if before == HTTP1 {
                tracing::info!("the app speaks HTTP/2 now: HTTP/2 requests go to it as HTTP/2");
            }
        }
        verdict == HTTP2
    }
}

/// Ends a re-check however the connect went (it may fail before the app
/// answers anything).
pub(crate) struct Asking<'a>(&'a AppProtocol);

impl AppProtocol {
    pub(crate) fn asking(&self) -> Asking<'_> {
        Asking(self)
    }
}

impl Drop for Asking<'_> {
    fn drop(&mut self) {
        self.0.rechecking.store(false, Ordering::Release);
    }
}

/// The app's first answer to the HTTP/2 preface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Heard {
    /// A SETTINGS frame: an HTTP/2 server.
    Http2,
    /// Anything else (`HTTP/1.1 505 ...`, `HTTP/1.1 400 ...`).
    Other,
    /// The app closed (or reset) before 9 bytes.
    Closed,
}

/// The first 9 bytes the app sends: an HTTP/2 server's first frame must be
/// SETTINGS without ACK on stream 0 (RFC 9113 §3.4).
fn judge(first: &[u8; 9]) -> Heard {
    const FRAME_SETTINGS: u8 = 0x4;
    const FLAG_ACK: u8 = 0x1;
    let stream = u32::from_be_bytes([first[5], first[6], first[7], first[8]]) & 0x7fff_ffff;
    if first[3] == FRAME_SETTINGS && first[4] & FLAG_ACK == 0 && stream == 0 {
        Heard::Http2
    } else {
        Heard::Other
    }
}

/// An app socket that reports the app's first 9 bytes (or its close) once;
/// after that, one branch per read.
pub(crate) type Sniff<T> = Watched<T, Sniffer>;

/// What [`Sniff`] has seen of the app's first bytes, until it told.
pub(crate) struct Sniffer {
    seen: [u8; 9],
    len: u8,
    tell: Option<oneshot::Sender<Heard>>,
}

impl<T> Sniff<T> {
    pub(crate) fn new(inner: T) -> (Self, oneshot::Receiver<Heard>) {
        let (tx, rx) = oneshot::channel();
        let watch = Sniffer {
            seen: [0; 9],
            len: 0,
            tell: Some(tx),
        };
        (Watched { inner, watch }, rx)
    }
}

impl Sniffer {
    fn tell(&mut self, heard: Heard) {
        if let Some(tx) = self.tell.take() {
            let _ = tx.send(heard);
        }
    }

    fn note(&mut self, new: &[u8]) {
        let have = usize::from(self.len);
        let take = new.len().min(self.seen.len() - have);
        self.seen[have..have + take].copy_from_slice(&new[..take]);
        // At most 9: fits.
        self.len = (have + take) as u8;
        if usize::from(self.len) == self.seen.len() {
            let heard = judge(&self.seen);
            self.tell(heard);
        }
    }
}

impl ReadWatch for Sniffer {
    fn saw(&mut self, res: &io::Result<()>, new: &[u8]) {
        if self.tell.is_some() {
            match res {
                Ok(()) if new.is_empty() => self.tell(Heard::Closed),
                Ok(()) => self.note(new),
                Err(_) => self.tell(Heard::Closed),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn heard_from(answer: &'static [u8], close: bool) -> Option<Heard> {
        let (mut app, ours) = tokio::io::duplex(64);
        let (mut sniff, rx) = Sniff::new(ours);
        app.write_all(answer).await.ok()?;
        if close {
            drop(app);
        } else {
            // Kept open: the reader must decide on the bytes alone.
            std::mem::forget(app);
        }
        let mut buf = [0u8; 64];
        let mut got = 0;
        while got < answer.len() {
            match sniff.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got += n,
            }
        }
        if close {
            let _ = sniff.read(&mut buf).await;
        }
        rx.await.ok()
    }

    #[tokio::test]
    async fn the_first_answer_to_the_preface_tells_what_the_app_speaks() {
        // An empty SETTINGS frame.
        let settings: &[u8] = &[0, 0, 0, 4, 0, 0, 0, 0, 0];
        assert_eq!(heard_from(settings, false).await, Some(Heard::Http2));
        assert_eq!(
            heard_from(b"HTTP/1.1 505 HTTP Version Not Supported\r\n", false).await,
            Some(Heard::Other)
        );
        // A SETTINGS ack first is not a server preface.
        assert_eq!(
            heard_from(&[0, 0, 0, 4, 1, 0, 0, 0, 0], false).await,
            Some(Heard::Other)
        );
        assert_eq!(heard_from(b"", true).await, Some(Heard::Closed));
        assert_eq!(heard_from(b"HTTP", true).await, Some(Heard::Closed));
    }

    #[test]
    fn streams_go_on_their_own_connection_while_the_shared_one_is_half_held() {
        let shared = H2Slot::shared();
        let own = Arc::new(H2Slot::default());
        let on = |s: &H2Slot| std::ptr::eq(s, &shared);

        // A stream that may share goes on the shared connection, and while
        // it waits for its client it counts as holding it.
        let first = Affinity::new(own.clone(), true);
        assert!(on(first.slot(&shared)));
        let mut waiting: Vec<Stalled> = Vec::new();
        waiting.extend(first.stalled());
        assert_eq!(shared.stalled.load(Ordering::Acquire), 1);
        // One that may not (its client was moved) never does.
        let moved = Affinity::new(own.clone(), false);
        assert!(!on(moved.slot(&shared)));
        assert!(moved.stalled().is_none(), "not on the shared connection");

        // Up to the limit of waiting streams, new streams still share.
        while shared.stalled.load(Ordering::Acquire) < SHARED_STALLED_LIMIT {
            let a = Affinity::new(own.clone(), true);
            assert!(on(a.slot(&shared)));
            waiting.extend(a.stalled());
        }
        // At it, they go on their own connection; below it again, they share.
        let late = Affinity::new(own.clone(), true);
        assert!(!on(late.slot(&shared)));
        waiting.pop();
        assert!(on(late.slot(&shared)));
        drop(waiting);
        assert_eq!(shared.stalled.load(Ordering::Acquire), 0);
        assert_eq!(shared.windows(), (SHARED_STREAM_WINDOW, SHARED_CONN_WINDOW));
        assert_eq!(own.windows(), (STREAM_WINDOW, CONN_WINDOW));
    }

    #[tokio::test(start_paused = true)]
    async fn an_http1_verdict_is_rechecked_once_after_a_while() {
        let proto = AppProtocol::default();
        assert_eq!(proto.route(), Route::Connect, "unknown: ask");
        assert!(!proto.learn(Some(Heard::Other)));
        assert_eq!(proto.route(), Route::Http1);
        tokio::time::advance(RECHECK - Duration::from_millis(1)).await;
        assert_eq!(proto.route(), Route::Http1);
        tokio::time::advance(Duration::from_millis(2)).await;
        assert_eq!(proto.route(), Route::Connect, "stale: one request asks");
        assert_eq!(proto.route(), Route::Http1, "the others meanwhile do not");
        // The app was upgraded.
        drop(proto.asking());
        assert!(proto.learn(Some(Heard::Http2)));
        assert_eq!(proto.route(), Route::Connect);
        // A silent app leaves the verdict alone and is used as HTTP/2.
        assert!(proto.learn(None));
        assert!(!proto.learn(Some(Heard::Closed)));
        assert_eq!(proto.route(), Route::Http1);
        // Silent at the re-check: still HTTP/1.1, asked again only later.
        tokio::time::advance(RECHECK).await;
        assert_eq!(proto.route(), Route::Connect);
        drop(proto.asking());
        assert!(!proto.learn(None));
        assert_eq!(proto.route(), Route::Http1);
    }
}
