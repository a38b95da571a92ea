//! The WebSocket relay: bytes pass as they come while their frame
//! boundaries are tracked, until the drain's close point for this session.

use std::io;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::time::{Instant, sleep_until};

use super::frames::{FrameTracker, GOING_AWAY, close_frame};
use crate::config::DrainConfig;
use crate::drain::{ConnGuard, Phase};
use crate::metrics::{ClientTimeout, WebSocketCloseOutcome};
use crate::state::Shared;

/// How a WebSocket session ended.
pub(crate) enum SessionEnd {
    /// One side closed (or failed) on its own.
    Closed(io::Result<()>),
    /// Nothing moved for `limits.tunnelIdleTimeout`.
    Idle,
    /// Closed by the drain with Close 1001 (counted by outcome).
    GoingAway(WebSocketCloseOutcome),
    /// The drain deadline came first: cut, counted as force-closed.
    Forced,
}

/// Read buffer of each direction.
const BUF_BYTES: usize = 16 * 1024;
/// Once the handshake is over, how long the FIN of each side may take.
const SHUTDOWN_WAIT: Duration = Duration::from_millis(100);

/// Relays between the client (`down`) and the app (`up`) until one side
/// closes, the tunnel idles out, or the drain closes the session.
pub(crate) async fn run<D, U>(shared: &Shared, down: D, up: U, guard: &mut ConnGuard) -> SessionEnd
where
    D: AsyncRead + AsyncWrite,
    U: AsyncRead + AsyncWrite,
{
    let (down_r, down_w) = tokio::io::split(down);
    let (up_r, up_w) = tokio::io::split(up);
    let mut session = Session {
        to_app: Pump::new(down_r, up_w, true),
        to_client: Pump::new(up_r, down_w, false),
    };
    let end = session.run(shared).await;
    match &end {
        SessionEnd::GoingAway(outcome) => shared.metrics.websocket_close(*outcome),
        SessionEnd::Forced => guard.mark_forced(),
        SessionEnd::Idle => shared.metrics.client_timeout(ClientTimeout::TunnelIdle),
        SessionEnd::Closed(_) => {}
    }
    end
}

/// When, counted from the moment `Closing` was seen, a session sends its
/// Close frames: `unit` (0..1) places it in the window, which ends at the
/// deadline less the handshake wait. Both are capped by the timeout.
pub(crate) fn close_offset(timers: &DrainConfig, unit: f64) -> Duration {
    let timeout = timers.timeout.get();
    let wait = timers.websocket_close_wait.get().min(timeout);
    let window = timers.websocket_close_window.get().min(timeout);
    let latest = timeout - wait;
    let earliest = (timeout - window).min(latest);
    earliest + (latest - earliest).mul_f64(unit.clamp(0.0, 1.0))
}

struct Session<D, U> {
    /// Client to app: injected frames are masked (we act as the client).
    to_app: Pump<D, U>,
    /// App to client: injected frames are plain (we act as the server).
    to_client: Pump<U, D>,
}

impl<D: AsyncRead + AsyncWrite, U: AsyncRead + AsyncWrite> Session<D, U> {
    async fn run(&mut self, shared: &Shared) -> SessionEnd {
        let mut drain_rx = shared.drain.subscribe();
        let idle = shared.live.load().config.limits.tunnel_idle_timeout.get();
        let mut last_moved = Instant::now();
        let mut close_at: Option<Instant> = None;
        // Set once the Close frames are on their way: the handshake's end.
        let mut handshake_until: Option<Instant> = None;
        let mut drain_alive = true;
        let mut state = *drain_rx.borrow_and_update();
        loop {
            if state.force_close {
                // With the Close frames out, the deadline only ends the
                // handshake wait (the window ends by the deadline at the
                // latest): the outcome says what the peers answered.
                if handshake_until.is_some() {
                    return self.finish().await;
                }
                return SessionEnd::Forced;
            }
            if handshake_until.is_none() {
                close_at = match (state.phase >= Phase::Closing, close_at) {
                    (true, None) => Some(
                        Instant::now()
                            + close_offset(&shared.drain.timers(), rand::random::<f64>()),
                    ),
                    (true, at) => at,
                    // A provisional drain resumed: nothing to close.
                    (false, _) => None,
                };
            }
            if handshake_until.is_some() && self.handshake_over() {
                return self.finish().await;
            }
            if handshake_until.is_none() && self.to_app.relay_over() && self.to_client.relay_over()
            {
                return SessionEnd::Closed(Ok(()));
            }
            let far = Instant::now() + Duration::from_secs(86_400);
            tokio::select! {
                res = self.to_app.io() => {
                    if let Err(e) = self.to_app.after(res, &mut last_moved, handshake_until.is_some()) {
                        return SessionEnd::Closed(Err(e));
                    }
                }
                res = self.to_client.io() => {
                    if let Err(e) = self.to_client.after(res, &mut last_moved, handshake_until.is_some()) {
                        return SessionEnd::Closed(Err(e));
                    }
                }
                changed = drain_rx.changed(), if drain_alive => {
                    drain_alive = changed.is_ok();
                    state = *drain_rx.borrow_and_update();
                }
                _ = sleep_until(close_at.unwrap_or(far)), if close_at.is_some() && handshake_until.is_none() => {
                    if self.to_app.peer_closed || self.to_client.peer_closed {
                        // A peer already started the close handshake: a
                        // second Close would break it. Left to finish, or
                        // to the deadline.
                        close_at = Some(far);
                        continue;
                    }
                    let timers = shared.drain.timers();
                    let wait = timers.websocket_close_wait.get().min(timers.timeout.get());
                    handshake_until = Some(Instant::now() + wait);
                    self.to_app.begin_close();
                    self.to_client.begin_close();
                }
                _ = sleep_until(handshake_until.unwrap_or(far)), if handshake_until.is_some() => {
                    return self.finish().await;
                }
                _ = sleep_until(last_moved + idle), if !idle.is_zero() && handshake_until.is_none() => {
                    return SessionEnd::Idle;
                }
            }
        }
    }

    /// Both Close frames are written and each peer answered (or is gone).
    /// A direction's reply is the Close its reading peer sends after this
    /// direction's own Close went out: the peer had its Close by then, or
    /// is closing by itself, and either way its side of the handshake is
    /// done.
    fn handshake_over(&self) -> bool {
        self.to_app.handshake_over() && self.to_client.handshake_over()
    }

    fn outcome(&self) -> WebSocketCloseOutcome {
        let pumps = [self.to_app.close_state(), self.to_client.close_state()];
        if pumps.contains(&CloseState::NotSent) {
            WebSocketCloseOutcome::MidFrame
        } else if pumps.contains(&CloseState::NoReply) {
            WebSocketCloseOutcome::NoReply
        } else {
            WebSocketCloseOutcome::Clean
        }
    }

    /// Ends the handshake: the outcome, then the TCP close (the sidecar is
    /// the server toward the client, and §7.1.1 has the server close first).
    async fn finish(&mut self) -> SessionEnd {
        let outcome = self.outcome();
        let _ = tokio::time::timeout(SHUTDOWN_WAIT, async {
            let _ = self.to_client.writer.shutdown().await;
            let _ = self.to_app.writer.shutdown().await;
        })
        .await;
        SessionEnd::GoingAway(outcome)
    }
}

/// Where one direction's Close stands once the handshake is over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CloseState {
    NotSent,
    NoReply,
    Answered,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Bytes pass as they come.
    Relay,
    /// Our Close waits for the frame being relayed to end.
    Inject,
    /// Our Close is written (or being written); the peer's later frames
    /// are dropped, but its Close is the reply we wait for.
    Injected { reply: bool },
}

/// What one [`Pump::io`] did.
enum Io {
    Read(usize),
    Wrote(usize),
    WroteClose(usize),
    Shut,
}

/// One direction: reads from one peer, writes to the other.
struct Pump<R, W> {
    reader: ReadHalf<R>,
    writer: WriteHalf<W>,
    /// Follows the frames written so far (the relayed prefix).
    frames: FrameTracker,
    toward_app: bool,
    buf: Box<[u8]>,
    /// `buf[pos..end]` is read and not yet written.
    pos: usize,
    end: usize,
    /// Our Close frame and how much of it is written.
    close: Vec<u8>,
    close_written: usize,
    stage: Stage,
    /// The sending peer relayed a Close of its own (it started a close).
    peer_closed: bool,
    eof: bool,
    shut: bool,
}

impl<R: AsyncRead, W: AsyncWrite> Pump<R, W> {
    fn new(reader: ReadHalf<R>, writer: WriteHalf<W>, toward_app: bool) -> Self {
        Self {
            reader,
            writer,
            frames: FrameTracker::new(),
            toward_app,
            buf: vec![0; BUF_BYTES].into_boxed_slice(),
            pos: 0,
            end: 0,
            close: Vec::new(),
            close_written: 0,
            stage: Stage::Relay,
            peer_closed: false,
            eof: false,
            shut: false,
        }
    }

    /// Relaying is over for this direction: its reader ended and the end
    /// was passed on.
    fn relay_over(&self) -> bool {
        self.eof && self.shut
    }

    fn handshake_over(&self) -> bool {
        match self.stage {
            Stage::Injected { reply } => {
                self.close_written == self.close.len() && (reply || self.eof)
            }
            _ => false,
        }
    }

    fn close_state(&self) -> CloseState {
        match self.stage {
            Stage::Injected { reply: true } if self.close_written == self.close.len() => {
                CloseState::Answered
            }
            Stage::Injected { .. } => CloseState::NoReply,
            _ => CloseState::NotSent,
        }
    }

    /// The next byte move of this direction. Cancel-safe: one read or one
    /// write call, whose result [`Pump::after`] accounts for.
    async fn io(&mut self) -> io::Result<Io> {
        if self.close_written < self.close.len() {
            return self
                .writer
                .write(&self.close[self.close_written..])
                .await
                .map(Io::WroteClose);
        }
        if self.pos < self.end {
            let limit = self.write_limit();
            return self
                .writer
                .write(&self.buf[self.pos..limit])
                .await
                .map(Io::Wrote);
        }
        if self.eof {
            if self.stage == Stage::Relay && !self.shut {
                self.writer.shutdown().await?;
                return Ok(Io::Shut);
            }
            return std::future::pending().await;
        }
        self.reader.read(&mut self.buf).await.map(Io::Read)
    }

    /// Where the next write stops: while our Close waits, at the end of
    /// the frame being relayed, so the Close goes right after it.
    fn write_limit(&self) -> usize {
        match self.stage {
            Stage::Inject => {
                self.pos
                    + self
                        .frames
                        .clone()
                        .step(&self.buf[self.pos..self.end])
                        .consumed
            }
            _ => self.end,
        }
    }

    /// Accounts for what [`Pump::io`] did. An error while the handshake
    /// runs only ends this direction: the peer is gone.
    fn after(
        &mut self,
        res: io::Result<Io>,
        last_moved: &mut Instant,
        closing: bool,
    ) -> io::Result<()> {
        let done = match res {
            Ok(done) => done,
            Err(_) if closing => {
                self.eof = true;
                self.close_written = self.close.len();
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        match done {
            Io::Read(0) => self.eof = true,
            Io::Read(n) => {
                *last_moved = Instant::now();
                self.pos = 0;
                self.end = n;
                if let Stage::Injected { .. } = self.stage {
                    self.drop_pending();
                }
            }
            Io::Wrote(n) => {
                self.track_written(n);
                if self.stage == Stage::Inject && self.frames.at_boundary() {
                    self.inject();
                }
            }
            Io::WroteClose(n) => self.close_written += n,
            Io::Shut => self.shut = true,
        }
        Ok(())
    }

    fn track_written(&mut self, n: usize) {
        let written = self.pos..self.pos + n;
        let mut at = written.start;
        while at < written.end {
            let step = self.frames.step(&self.buf[at..written.end]);
            at += step.consumed;
            if step.ended.is_some_and(|h| h.is_close()) {
                self.peer_closed = true;
            }
        }
        self.pos = written.end;
    }

    /// The session's close point: our Close goes now if this direction is
    /// between frames, else right after the frame being relayed. A stream
    /// that stopped looking like WebSocket frames never gets one.
    fn begin_close(&mut self) {
        if self.frames.at_boundary() {
            self.inject();
        } else {
            self.stage = Stage::Inject;
        }
    }

    fn inject(&mut self) {
        // §5.3: every frame a client sends is masked with a fresh key.
        let mask = self.toward_app.then(rand::random::<[u8; 4]>);
        self.close = close_frame(GOING_AWAY, mask);
        self.close_written = 0;
        self.stage = Stage::Injected { reply: false };
        self.drop_pending();
    }

    /// After our Close, the peer's frames are not passed on (§5.5.1: no
    /// data after a Close); its own Close is the reply.
    fn drop_pending(&mut self) {
        let mut at = self.pos;
        while at < self.end {
            let step = self.frames.step(&self.buf[at..self.end]);
            at += step.consumed;
            if step.ended.is_some_and(|h| h.is_close()) {
                self.stage = Stage::Injected { reply: true };
            }
        }
        self.pos = self.end;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::HumanDuration;

    fn timers(timeout_ms: u64, window_ms: u64, wait_ms: u64) -> DrainConfig {
        DrainConfig {
            timeout: HumanDuration::from_millis(timeout_ms),
            websocket_close_window: HumanDuration::from_millis(window_ms),
            websocket_close_wait: HumanDuration::from_millis(wait_ms),
            ..DrainConfig::default()
        }
    }

    #[test]
    fn the_close_point_lies_in_the_window_before_the_handshake_wait() {
        let t = timers(30_000, 5_000, 1_000);
        assert_eq!(close_offset(&t, 0.0), Duration::from_secs(25));
        assert_eq!(close_offset(&t, 1.0), Duration::from_secs(29));
        assert_eq!(close_offset(&t, 0.5), Duration::from_secs(27));
    }

    #[test]
    fn a_window_longer_than_the_timeout_starts_when_closing_does() {
        let t = timers(2_000, 10_000, 500);
        assert_eq!(close_offset(&t, 0.0), Duration::ZERO);
        assert_eq!(close_offset(&t, 1.0), Duration::from_millis(1_500));
    }

    #[test]
    fn a_window_shorter_than_the_wait_closes_everyone_at_its_latest_point() {
        let t = timers(2_000, 100, 500);
        assert_eq!(close_offset(&t, 0.0), Duration::from_millis(1_500));
        assert_eq!(close_offset(&t, 1.0), Duration::from_millis(1_500));
    }
}
