//! The request body on its way to the app: the client's body (hyper's for
//! HTTP/1, h2's for HTTP/2) under the body size and read time limits, and
//! the fault it ended with, kept for the proxy to answer with.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::body::Incoming;

/// What went wrong on the client's side of a request body, as the body
/// itself saw it. The proxy reads it when the app exchange fails: a failed
/// body is the client's fault, never the app's (see [`BodyWatch`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFault {
    /// Over `limits.maxRequestBodyBytes` (413).
    TooLarge,
    /// Slower than `limits.bodyReadTimeout` allows (408).
    Timeout,
    /// Malformed framing: an invalid chunk size, bad chunk ends (400).
    BadBody,
    /// The client closed or reset before the body was complete.
    Gone,
}

impl BodyFault {
    /// Every fault, in the order of their codes.
    const ALL: [BodyFault; 4] = [Self::TooLarge, Self::Timeout, Self::BadBody, Self::Gone];

    /// The fault's code in [`BodyWatch`]'s atomic, where 0 means none.
    fn code(self) -> u8 {
        self as u8 + 1
    }

    fn from_code(code: u8) -> Option<BodyFault> {
        let index = usize::from(code).checked_sub(1)?;
        Self::ALL.get(index).copied()
    }
}

/// The proxy's view of its request body's fate; the body keeps writing
/// into it after it was handed to the app connection's task.
pub struct BodyWatch(Arc<BodyState>);

#[derive(Default)]
struct BodyState {
    fault: AtomicU8,
    /// The app connection asked for more and the client had nothing yet.
    waiting_on_client: AtomicBool,
}

impl BodyWatch {
    /// The first client-side fault of the body, if any.
    pub fn fault(&self) -> Option<BodyFault> {
        BodyFault::from_code(self.0.fault.load(Ordering::Acquire))
    }

    /// Whether the body was, when last polled, waiting for the client's
    /// bytes (rather than the app not reading): a route timeout then is
    /// the client's slowness, not the app's.
    pub fn waiting_on_client(&self) -> bool {
        self.0.waiting_on_client.load(Ordering::Acquire)
    }
}

/// The error an [`UpstreamBody`] ends with; the app connection fails with
/// it, and the proxy tells the client's fault apart through [`BodyWatch`].
#[derive(Debug)]
pub struct BodyError {
    fault: BodyFault,
    source: Option<BoxError>,
}

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match self.fault {
            BodyFault::TooLarge => "request body over limits.maxRequestBodyBytes",
            BodyFault::Timeout => "request body slower than limits.bodyReadTimeout allows",
            BodyFault::BadBody => "malformed request body",
            BodyFault::Gone => "client went away mid-body",
        };
        match &self.source {
            Some(source) => write!(f, "{what}: {source}"),
            None => f.write_str(what),
        }
    }
}

impl BodyError {
    /// The error a superseded attempt's body ends with: a retry took the
    /// client's body over, so this copy must stop (the client did nothing
    /// wrong, so [`BodyWatch`] is not told).
    pub(super) fn superseded() -> BodyError {
        BodyError {
            fault: BodyFault::Gone,
            source: Some("request body taken over by a retry".into()),
        }
    }
}

impl std::error::Error for BodyError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// The body read time limit: the deadline is `timeout` after the start,
/// plus one second per `min_rate` bytes received. The timer is only made
/// when the body first has to wait for the client.
struct BodyDeadline {
    started: tokio::time::Instant,
    timeout: Duration,
    min_rate: u64,
    received: u64,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl BodyDeadline {
    fn deadline(&self) -> tokio::time::Instant {
        let earned = if self.min_rate == 0 {
            Duration::ZERO
        } else {
            // An unlimited body (maxRequestBodyBytes 0) can earn more
            // seconds than a Duration holds: saturate rather than panic.
            Duration::try_from_secs_f64(self.received as f64 / self.min_rate as f64)
                .unwrap_or(Duration::MAX)
        };
        crate::drain::deadline(self.started, self.timeout.saturating_add(earned))
    }

    /// Ready once the deadline passed (re-armed while uploads earn time).
    fn poll_expired(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            let deadline = self.deadline();
            let sleep = self
                .sleep
                .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
            if sleep.deadline() < deadline {
                sleep.as_mut().reset(deadline);
            }
            match sleep.as_mut().poll(cx) {
                Poll::Ready(()) if self.deadline() > tokio::time::Instant::now() => continue,
                other => return other,
            }
        }
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The request body as the client sends it: hyper's for HTTP/1, the
/// sidecar's own codec's for HTTP/2 (src/h2wire/server/).
pub enum DownstreamBody {
    Http1(Incoming),
    // The codec is the crate's own; outside it this variant is never built.
    #[allow(private_interfaces)]
    Http2(crate::h2wire::server::RecvBody),
}

/// A downstream body that failed, and whether the client simply went away.
pub struct DownstreamError {
    gone: bool,
    source: BoxError,
}

impl http_body::Body for DownstreamBody {
    type Data = bytes::Bytes;
    type Error = DownstreamError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<std::result::Result<http_body::Frame<bytes::Bytes>, DownstreamError>>> {
        match self.get_mut() {
            DownstreamBody::Http1(body) => Pin::new(body).poll_frame(cx).map_err(|err| {
                // hyper calls a body cut short by EOF or a reset
                // "incomplete"/"canceled"; anything else is bad framing.
                let gone = err.is_incomplete_message() || err.is_canceled();
                DownstreamError {
                    gone,
                    source: Box::new(err),
                }
            }),
            DownstreamBody::Http2(body) => Pin::new(body).poll_frame(cx).map_err(|err| {
                // The client's RST_STREAM, a GOAWAY or a broken socket is
                // a client gone; an error found in the stream itself
                // (a length that does not add up) is a bad body.
                use crate::h2wire::server::Error as H2Error;
                let gone = matches!(
                    err,
                    H2Error::Io(_)
                        | H2Error::Closed { .. }
                        | H2Error::Connection { remote: true, .. }
                        | H2Error::Stream { remote: true, .. }
                );
                DownstreamError {
                    gone,
                    source: Box::new(err),
                }
            }),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            DownstreamBody::Http1(body) => body.is_end_stream(),
            DownstreamBody::Http2(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match self {
            DownstreamBody::Http1(body) => body.size_hint(),
            DownstreamBody::Http2(body) => body.size_hint(),
        }
    }
}

/// The downstream body with the body length limit and read time limit, and
/// the fault it ended with recorded for the proxy. Unboxed: one wrapper, no
/// allocation unless it must wait. What goes upstream is this, directly or
/// kept for a retry ([`super::replay`]).
pub struct LimitedBody {
    inner: DownstreamBody,
    /// Bytes still allowed under `limits.maxRequestBodyBytes`.
    remaining: Option<u64>,
    deadline: Option<BodyDeadline>,
    state: Arc<BodyState>,
}

impl LimitedBody {
    /// `limit`: most bytes allowed; `timeout`: (bodyReadTimeout, bodyMinRate).
    pub fn new(
        inner: DownstreamBody,
        limit: Option<u64>,
        timeout: Option<(Duration, u64)>,
    ) -> (LimitedBody, BodyWatch) {
        let state = Arc::new(BodyState::default());
        let deadline = timeout
            .filter(|_| !http_body::Body::is_end_stream(&inner))
            .map(|(timeout, min_rate)| BodyDeadline {
                started: tokio::time::Instant::now(),
                timeout,
                min_rate,
                received: 0,
                sleep: None,
            });
        let body = LimitedBody {
            inner,
            remaining: limit,
            deadline,
            state: state.clone(),
        };
        (body, BodyWatch(state))
    }

    fn fail(
        &mut self,
        fault: BodyFault,
        source: Option<BoxError>,
    ) -> Poll<Option<std::result::Result<http_body::Frame<bytes::Bytes>, BodyError>>> {
        let _ =
            self.state
                .fault
                .compare_exchange(0, fault.code(), Ordering::AcqRel, Ordering::Acquire);
        self.state.waiting_on_client.store(false, Ordering::Release);
        self.deadline = None;
        Poll::Ready(Some(Err(BodyError { fault, source })))
    }
}

impl http_body::Body for LimitedBody {
    type Data = bytes::Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<std::result::Result<http_body::Frame<bytes::Bytes>, BodyError>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        let waiting = polled.is_pending();
        if this.state.waiting_on_client.load(Ordering::Relaxed) != waiting {
            this.state
                .waiting_on_client
                .store(waiting, Ordering::Release);
        }
        match polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    let n = data.len() as u64;
                    if let Some(remaining) = this.remaining.as_mut() {
                        if n > *remaining {
                            return this.fail(BodyFault::TooLarge, None);
                        }
                        *remaining -= n;
                    }
                    if let Some(deadline) = this.deadline.as_mut() {
                        deadline.received += n;
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(err))) => {
                let fault = if err.gone {
                    BodyFault::Gone
                } else {
                    BodyFault::BadBody
                };
                this.fail(fault, Some(err.source))
            }
            Poll::Ready(None) => {
                this.deadline = None;
                Poll::Ready(None)
            }
            Poll::Pending => {
                if let Some(deadline) = this.deadline.as_mut()
                    && deadline.poll_expired(cx).is_ready()
                {
                    return this.fail(BodyFault::Timeout, None);
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::BodyFault;

    #[test]
    fn every_fault_comes_back_from_its_code_and_zero_is_none() {
        for fault in BodyFault::ALL {
            assert_eq!(BodyFault::from_code(fault.code()), Some(fault));
        }
        assert_eq!(BodyFault::from_code(0), None);
        assert_eq!(BodyFault::from_code(5), None);
    }
}
