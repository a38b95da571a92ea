//! One downstream HTTP/2 connection and the way it ends.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use http::Request;
use tokio::io::{AsyncRead, AsyncWrite};

use super::client::{ClientKind, classify};
use super::stream::{OpenStream, serve_stream};
use super::wire::Wire;
use crate::config::{Http2GoAway, LimitsConfig};
use crate::h2wire::server::{Connection, Error, RecvBody, Respond, ServerSettings};
use crate::proxy::ConnCtx;
use crate::proxy::conn::woken::WakeGate;

/// The windows announced to clients for their request bodies. The stream
/// window is a quarter of the connection's, so one body the app does not
/// read leaves room for its siblings (hyper's server gives 1 MiB to both).
const STREAM_WINDOW: u32 = 256 * 1024;
const CONN_WINDOW: u32 = 1024 * 1024;
const MAX_FRAME_SIZE: u32 = 16 * 1024;
const MAX_SEND_BUF: usize = 400 * 1024;
const MAX_LOCAL_ERROR_RESETS: usize = 1024;

/// The final GOAWAY must not race the client. Two races were measured
/// with httpcore 1.x, each losing a request now and then:
/// - a request loop between getting its response and writing its next
///   HEADERS fails the request (SEND_HEADERS in state CLOSED) if the
///   GOAWAY is read meanwhile. So the GOAWAY goes out only once no new
///   stream arrived and no stream end was written for this long: every
///   loop has then sent its next request, which is held.
/// - a task whose response was read by another task, but which waits for
///   the read lock behind a task blocked reading the socket, only runs
///   once more bytes arrive; if those are the GOAWAY it fails although
///   its response is there (httpcore checks for the GOAWAY before its
///   own events). So while waiting, PINGs (which the client answers and
///   otherwise ignores) keep its readers cycling, and the GOAWAY waits
///   for one PING round trip inside the quiet period.
const FINAL_QUIET: Duration = Duration::from_millis(250);
/// Between those PINGs.
const FINAL_PING_EVERY: Duration = Duration::from_millis(25);
/// A client that never goes quiet gets the final GOAWAY this long after
/// its accepted streams are done anyway.
const FINAL_QUIET_CAP: Duration = Duration::from_secs(2);

/// Why the connection is asked to end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ending {
    /// The drain reached `Closing`.
    Drain,
    /// Idle past `limits.downstreamIdleTimeout`.
    Idle,
}

/// How far the connection's shutdown has got.
enum Shutdown {
    None,
    /// Asked for; waits for the client's SETTINGS.
    Requested,
    /// The two-phase GOAWAY is under way.
    TwoPhase,
    /// New streams held; waiting for the accepted ones to finish.
    Holding(Holding),
    /// The final GOAWAY is queued; the connection closes after it.
    Final,
}

struct Holding {
    /// Since when the accepted streams are all done and written.
    done_since: Option<tokio::time::Instant>,
    /// (held streams, stream ends written) when last looked at.
    seen: (usize, u64),
    quiet_since: tokio::time::Instant,
    /// The user PINGs (see [`FINAL_QUIET`]); false once one could not go.
    pings: bool,
    /// When the PING in flight went out.
    ping_sent: Option<tokio::time::Instant>,
    last_pong: Option<tokio::time::Instant>,
    tick: Pin<Box<tokio::time::Sleep>>,
}

/// One accepted stream's future ([`serve_stream`]), boxed: it is pushed
/// once and never moved again.
type StreamFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// One downstream HTTP/2 connection: a future that ends when the
/// connection does, and [`H2Conn::shutdown`] to start its end.
///
/// Its streams run inside it, not as tasks of their own (as HAProxy and
/// nginx serve a connection's streams in its one event handler): a spawn
/// per stream cost a task's allocation, its scheduling and a cross-task
/// wake-up for every frame handed between the connection and the stream.
/// [`FuturesUnordered`] polls only the streams that were woken, so a stream
/// waiting on the app or on its client's window holds up no other; the
/// streams of one connection share its thread, as they share its socket.
pub(crate) struct H2Conn<T> {
    conn: Box<Connection<T>>,
    ctx: Arc<ConnCtx>,
    wire: Arc<Wire>,
    mode: Http2GoAway,
    kind: ClientKind,
    shutdown: Shutdown,
    /// The highest stream id handed to the app.
    last_accepted: u32,
    /// Streams opened after the shutdown began: never dispatched, kept
    /// (unanswered) until the final GOAWAY, which names a lower id.
    held: Vec<(Request<RecvBody>, Respond)>,
    /// The accepted streams being served.
    streams: FuturesUnordered<StreamFuture>,
    /// The connection's own part is polled only when woken: its socket,
    /// a stream that queued output, its timers. A lone request used to
    /// run the codec's read-and-write pass twice on every wake of the
    /// task, each stream's wakes included: 11 passes a gRPC call at 200
    /// calls a second (bench/README.md, #39).
    gate: WakeGate,
}

impl<T> H2Conn<T>
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    pub(crate) fn new(io: T, ctx: Arc<ConnCtx>, limits: &LimitsConfig, mode: Http2GoAway) -> Self {
        let wire = Arc::new(Wire {
            write_timeout: limits.write_timeout.get(),
            ..Wire::default()
        });
        let settings = ServerSettings {
            // Announced in SETTINGS; past it a stream is refused
            // (REFUSED_STREAM: the app never saw it, the client may retry).
            max_concurrent_streams: limits.max_concurrent_streams,
            initial_window_size: STREAM_WINDOW,
            connection_window_size: CONN_WINDOW,
            max_frame_size: MAX_FRAME_SIZE,
            max_header_list_size: u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX),
            max_send_buffer: MAX_SEND_BUF,
            max_local_error_resets: MAX_LOCAL_ERROR_RESETS,
        };
        H2Conn {
            conn: Box::new(Connection::new(io, settings)),
            ctx,
            wire,
            mode,
            kind: ClientKind::Unknown,
            shutdown: Shutdown::None,
            last_accepted: 0,
            held: Vec::new(),
            streams: FuturesUnordered::new(),
            gate: WakeGate::new(),
        }
    }

    /// Starts the end of the connection (idempotent): the two-phase
    /// GOAWAY or the held streams and final GOAWAY, per client kind.
    pub(crate) fn shutdown(&mut self, why: Ending) {
        if matches!(self.shutdown, Shutdown::None) {
            tracing::trace!(?why, "HTTP/2 connection shutdown requested");
            self.shutdown = Shutdown::Requested;
            self.gate.open();
        }
    }

    /// The client's kind, once its first SETTINGS frame was read.
    fn kind(&mut self) -> ClientKind {
        if self.kind == ClientKind::Unknown
            && let Some(settings) = self.conn.client_settings()
        {
            self.kind = classify(settings);
        }
        self.kind
    }

    /// Turns a requested shutdown into frames once the kind is known.
    fn start_shutdown(&mut self) {
        if !matches!(self.shutdown, Shutdown::Requested) {
            return;
        }
        let final_only = match (self.mode, self.kind()) {
            (Http2GoAway::TwoPhase, _) => false,
            (Http2GoAway::FinalOnly, _) => true,
            (Http2GoAway::Auto, ClientKind::Strict) => true,
            (Http2GoAway::Auto, ClientKind::Conforming) => false,
            // The first frame of the client must be SETTINGS; until it is
            // read, neither sequence is known to be safe. The drain's
            // deadline bounds a client that never sends it.
            (Http2GoAway::Auto, ClientKind::Unknown) => return,
        };
        self.ctx.shared.metrics.http2_goaway(final_only);
        if final_only {
            let now = tokio::time::Instant::now();
            self.shutdown = Shutdown::Holding(Holding {
                done_since: None,
                seen: self.activity(),
                quiet_since: now,
                pings: true,
                ping_sent: None,
                last_pong: None,
                tick: Box::pin(tokio::time::sleep(FINAL_QUIET)),
            });
        } else {
            self.conn.graceful_shutdown();
            self.shutdown = Shutdown::TwoPhase;
        }
    }

    fn activity(&self) -> (usize, u64) {
        (self.held.len(), self.conn.ends_written())
    }

    fn accept(&mut self, request: Request<RecvBody>, respond: Respond) {
        let id = respond.stream_id();
        self.last_accepted = self.last_accepted.max(id);
        self.wire.open_streams.fetch_add(1, Ordering::AcqRel);
        let open = OpenStream(Some(self.wire.clone()));
        self.streams.push(Box::pin(serve_stream(
            self.ctx.clone(),
            open,
            request,
            respond,
        )));
    }

    /// Holding: is it time for the final GOAWAY? Registers the wake-ups
    /// that will tell otherwise.
    fn poll_final_due(&mut self, cx: &mut Context<'_>) -> bool {
        self.wire.waker.register(cx.waker());
        let activity = self.activity();
        let streams_done =
            self.wire.open_streams.load(Ordering::Acquire) == 0 && self.conn.all_ends_written();
        let Shutdown::Holding(hold) = &mut self.shutdown else {
            return false;
        };
        let conn = &mut self.conn;
        let now = tokio::time::Instant::now();
        if activity != hold.seen {
            hold.seen = activity;
            hold.quiet_since = now;
        }
        if hold.ping_sent.is_some() && conn.poll_pong(cx).is_ready() {
            hold.ping_sent = None;
            hold.last_pong = Some(now);
        }
        let mut wake_at = (hold.quiet_since + FINAL_QUIET).max(now + Duration::from_millis(1));
        if !streams_done {
            hold.done_since = None;
        } else {
            let done_since = *hold.done_since.get_or_insert(now);
            let round_trip_in_quiet = match (hold.pings, hold.last_pong) {
                (false, _) => true,
                (true, Some(pong)) => pong >= hold.quiet_since && hold.ping_sent.is_none(),
                (true, None) => false,
            };
            if (now - hold.quiet_since >= FINAL_QUIET && round_trip_in_quiet)
                || now - done_since >= FINAL_QUIET_CAP
            {
                return true;
            }
            wake_at = wake_at.min(done_since + FINAL_QUIET_CAP);
            if hold.ping_sent.is_none() && hold.pings {
                let due = hold.last_pong.map_or(now, |pong| pong + FINAL_PING_EVERY);
                if due <= now {
                    if conn.send_ping() {
                        hold.ping_sent = Some(now);
                        // Registers this task for the PONG.
                        if conn.poll_pong(cx).is_ready() {
                            hold.ping_sent = None;
                            hold.last_pong = Some(now);
                        }
                    } else {
                        // No more PINGs; the quiet period alone decides.
                        hold.pings = false;
                    }
                } else {
                    wake_at = wake_at.min(due);
                }
            }
        }
        // Check again then (the streams and the PONG wake this task
        // earlier).
        hold.tick.as_mut().reset(wake_at);
        let _ = hold.tick.as_mut().poll(cx);
        false
    }
}

impl<T> Future for H2Conn<T>
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Output = Result<(), Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        // The connection first (it reads frames, wakes streams and accepts
        // new ones), then the woken streams, then the connection again so
        // that what they queued is written in this turn, not the next.
        if let Poll::Ready(done) = this.poll_conn_if_woken(cx) {
            return Poll::Ready(done);
        }
        if this.streams.is_empty() {
            return Poll::Pending;
        }
        let mut ended = false;
        while let Poll::Ready(Some(())) = this.streams.poll_next_unpin(cx) {
            ended = true;
        }
        if ended {
            // A stream's end is news to the connection (a hold on the
            // final GOAWAY counts them) whether or not it woke it.
            this.gate.open();
        }
        this.poll_conn_if_woken(cx)
    }
}

impl<T> H2Conn<T>
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    fn poll_conn_if_woken(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        if !self.gate.take_wake(cx) {
            return Poll::Pending;
        }
        let waker = self.gate.waker().clone();
        self.poll_conn(&mut Context::from_waker(&waker))
    }

    /// The connection's own work: accepting streams (or holding them) and
    /// its end. Ready when the connection is over; the streams still
    /// running then are dropped with it (nothing of theirs can go out).
    fn poll_conn(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        let this = self;
        loop {
            this.start_shutdown();
            match this.shutdown {
                Shutdown::None | Shutdown::Requested | Shutdown::TwoPhase => {
                    match this.conn.poll_accept(cx) {
                        Poll::Ready(Some(Ok((request, respond)))) => {
                            this.accept(request, respond);
                        }
                        Poll::Ready(Some(Err(err))) => return Poll::Ready(Err(err)),
                        Poll::Ready(None) => return Poll::Ready(Ok(())),
                        Poll::Pending => {
                            // Reading the client's SETTINGS may have made
                            // a requested shutdown startable.
                            if matches!(this.shutdown, Shutdown::Requested)
                                && this.kind() != ClientKind::Unknown
                            {
                                continue;
                            }
                            return Poll::Pending;
                        }
                    }
                }
                Shutdown::Holding(_) => {
                    // New streams are taken but never dispatched.
                    match this.conn.poll_accept(cx) {
                        // httpcore retries a stream above the GOAWAY's
                        // last-stream-id only when that id is not 0, so a
                        // connection that never had a stream serves its
                        // first one.
                        Poll::Ready(Some(Ok((request, respond)))) if this.last_accepted == 0 => {
                            this.accept(request, respond);
                            continue;
                        }
                        Poll::Ready(Some(Ok(stream))) => {
                            this.held.push(stream);
                            continue;
                        }
                        Poll::Ready(Some(Err(err))) => return Poll::Ready(Err(err)),
                        Poll::Ready(None) => return Poll::Ready(Ok(())),
                        Poll::Pending => {}
                    }
                    if !this.poll_final_due(cx) {
                        return Poll::Pending;
                    }
                    tracing::debug!(
                        last_stream = this.last_accepted,
                        held = this.held.len(),
                        kind = ?this.kind,
                        "HTTP/2: accepted streams done; final GOAWAY"
                    );
                    this.ctx
                        .shared
                        .metrics
                        .http2_held_streams(this.held.len() as u64);
                    this.conn.final_goaway(this.last_accepted);
                    this.shutdown = Shutdown::Final;
                }
                Shutdown::Final => return this.conn.poll_closed(cx),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The size of the future `f` returns, without making one.
    fn future_size<A, F: Future>(_f: impl FnOnce(A) -> F) -> usize {
        std::mem::size_of::<F>()
    }

    /// What an idle HTTP/2 connection holds of the proxy's own beside the
    /// codec's state: its task (the connection loop of
    /// proxy/conn/serve.rs, the same for every protocol) and this struct,
    /// in a box of its own. The codec's connection is boxed apart and
    /// holds no buffer while idle (h2wire/server: `heap_bytes`, tested
    /// there; bench/h2heap gives 3.4 KiB of heap a connection in all). The
    /// bounds are over today's sizes in a debug build, as here: a future
    /// that grows past them is a cost every idle connection pays.
    #[test]
    fn a_connection_holds_little_of_its_own() {
        let task = future_size(|(s, st, p, g)| {
            crate::proxy::serve_connection::<crate::proxy::LazyTcp>(s, st, p, g)
        });
        let conn = std::mem::size_of::<H2Conn<tokio::net::TcpStream>>();
        assert!(task <= 1280, "the connection's task future is {task} bytes");
        assert!(conn <= 256, "H2Conn is {conn} bytes");
    }
}
