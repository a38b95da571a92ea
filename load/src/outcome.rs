//! What happened to one request, and why: the reason taxonomy every failure is attributed to.
//!
//! Reasons are deliberately few and mean one thing each, so a rollout report can say *how*
//! requests were lost, not only how many:
//!
//! | reason     | meaning                                                                        |
//! |------------|--------------------------------------------------------------------------------|
//! | `ok`       | a complete 2xx/3xx response (gRPC: status OK and every message received)       |
//! | `refused`  | the TCP connect was refused: nothing listened at the endpoint it reached       |
//! | `reset`    | the request was written, then the connection or stream died before a complete  |
//! |            | response: RST, EOF, h2 RST_STREAM, a stream above a GOAWAY's last stream id    |
//! | `http_5xx` | the server answered with a server error: HTTP 5xx, or a gRPC error status      |
//! | `timeout`  | no complete answer within `--timeout` (the phase it was stuck in is recorded)  |
//! | `other`    | anything else (4xx, unreachable host, protocol errors); see the detail         |

use std::error::Error as StdError;
use std::fmt;
use std::io;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

/// The outcome class of one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Reason {
    #[serde(rename = "ok")]
    Ok,
    #[serde(rename = "refused")]
    Refused,
    #[serde(rename = "reset")]
    Reset,
    #[serde(rename = "http_5xx")]
    Http5xx,
    #[serde(rename = "timeout")]
    Timeout,
    #[serde(rename = "other")]
    Other,
}

impl Reason {
    /// Every reason, `ok` first, in the order reports list them.
    pub const ALL: [Reason; 6] = [
        Reason::Ok,
        Reason::Refused,
        Reason::Reset,
        Reason::Http5xx,
        Reason::Timeout,
        Reason::Other,
    ];
    /// The failure reasons (everything but `ok`).
    pub const FAILURES: [Reason; 5] = [
        Reason::Refused,
        Reason::Reset,
        Reason::Http5xx,
        Reason::Timeout,
        Reason::Other,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Ok => "ok",
            Reason::Refused => "refused",
            Reason::Reset => "reset",
            Reason::Http5xx => "http_5xx",
            Reason::Timeout => "timeout",
            Reason::Other => "other",
        }
    }

    pub fn is_failure(self) -> bool {
        self != Reason::Ok
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A failed request: its reason plus a short, low-cardinality detail (for attribution:
/// "h2 RST_STREAM REFUSED_STREAM", "connection closed before response", "HTTP 503"...).
///
/// It is also an error type so the gRPC transport can hand it through tonic unchanged
/// (tonic keeps an unknown error as the `Status` source; see `grpc.rs`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{reason}: {detail}")]
pub struct Failure {
    pub reason: Reason,
    pub detail: String,
}

impl Failure {
    pub fn new(reason: Reason, detail: impl Into<String>) -> Self {
        Failure {
            reason,
            detail: detail.into(),
        }
    }
}

/// Where a request was when it ended; lets a timeout say what it was waiting for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    /// Waiting for a free connection of the pool.
    Pool = 0,
    /// Opening a TCP connection (and, for HTTP/2, the handshake).
    Connect = 1,
    /// Request handed to the connection; waiting for the response head.
    Response = 2,
    /// Reading the response body (gRPC: the messages and trailers).
    Body = 3,
}

impl Phase {
    pub fn describe(self) -> &'static str {
        match self {
            Phase::Pool => "waiting for a pooled connection",
            Phase::Connect => "connecting",
            Phase::Response => "awaiting the response",
            Phase::Body => "reading the response body",
        }
    }
}

/// What the client knows about one connection: the pod that answered on it last (through
/// a Service, the client cannot see the endpoint a connection reached, only who answers).
#[derive(Debug, Default)]
pub struct ConnInfo {
    pod: Mutex<Option<Arc<str>>>,
}

impl ConnInfo {
    pub fn pod(&self) -> Option<Arc<str>> {
        lock(&self.pod).clone()
    }
}

/// The state of one in-flight request, shared with the code that runs it: the phase it is
/// in, the connection it uses and who answered. Shared (atomics and mutexes, not locals)
/// because the timeout drops the request future and the runner reads this afterwards.
#[derive(Debug, Default)]
pub struct RequestCtx {
    phase: AtomicU8,
    conn: Mutex<Option<Arc<ConnInfo>>>,
    answered_by: Mutex<Option<Arc<str>>>,
}

impl RequestCtx {
    pub fn set(&self, phase: Phase) {
        self.phase.store(phase as u8, Ordering::Relaxed);
    }

    pub fn phase(&self) -> Phase {
        match self.phase.load(Ordering::Relaxed) {
            0 => Phase::Pool,
            1 => Phase::Connect,
            2 => Phase::Response,
            _ => Phase::Body,
        }
    }

    /// The request now runs on this connection.
    pub fn use_conn(&self, conn: &Arc<ConnInfo>) {
        *lock(&self.conn) = Some(conn.clone());
    }

    /// A complete answer came from `pod` (when the response named one); the connection
    /// remembers it, so a later failure on that connection is attributed to that pod.
    pub fn answered(&self, pod: Option<Arc<str>>) {
        let Some(pod) = pod else { return };
        if let Some(conn) = lock(&self.conn).as_ref() {
            *lock(&conn.pod) = Some(pod.clone());
        }
        *lock(&self.answered_by) = Some(pod);
    }

    /// The pod that answered, else the pod last seen on the request's connection.
    pub fn pod(&self) -> Option<Arc<str>> {
        lock(&self.answered_by)
            .clone()
            .or_else(|| lock(&self.conn).as_ref().and_then(|c| c.pod()))
    }
}

/// A poisoned lock here only means another request panicked mid-update of a plain value;
/// the value is still usable.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The pod named by a demo-app response body (`pod=<name>...`), if any.
pub fn pod_from_body(body: &[u8]) -> Option<Arc<str>> {
    let rest = body.strip_prefix(b"pod=")?;
    let end = rest
        .iter()
        .position(|b| b.is_ascii_whitespace())
        .unwrap_or(rest.len());
    // A pod name is a DNS label (at most 253 bytes); anything else isn't one.
    let name = std::str::from_utf8(&rest[..end])
        .ok()
        .filter(|n| !n.is_empty() && n.len() <= 253)?;
    Some(Arc::from(name))
}

/// The pod named by a gRPC reply, if any.
pub fn pod_from_name(name: &str) -> Option<Arc<str>> {
    (!name.is_empty() && name.len() <= 253).then(|| Arc::from(name))
}

/// Classifies an HTTP status of a complete response.
pub fn classify_status(status: u16) -> Result<(), Failure> {
    match status {
        200..=399 => Ok(()),
        500..=599 => Err(Failure::new(Reason::Http5xx, format!("HTTP {status}"))),
        _ => Err(Failure::new(Reason::Other, format!("HTTP {status}"))),
    }
}

/// Classifies an error of a TCP connect.
pub fn classify_connect(err: &io::Error) -> Failure {
    match err.kind() {
        io::ErrorKind::ConnectionRefused => Failure::new(Reason::Refused, "connection refused"),
        io::ErrorKind::TimedOut => Failure::new(Reason::Timeout, "connect timed out (OS)"),
        // A reset during the handshake is the listener going away under us.
        io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted => {
            Failure::new(Reason::Reset, format!("connect: {}", kind_name(err.kind())))
        }
        // Rarer causes (no route, DNS lookup failed...): the OS message says which, and
        // stays low-cardinality (one text per errno).
        _ => Failure::new(
            Reason::Other,
            format!("connect: {}", truncate(&err.to_string())),
        ),
    }
}

/// Classifies an error that ended a request after it was handed to a connection, by walking
/// the error's source chain (hyper wraps h2 and io errors; tonic wraps ours).
pub fn classify_error(err: &(dyn StdError + 'static)) -> Failure {
    let mut hyper_flags: Option<Failure> = None;
    let mut current: Option<&(dyn StdError + 'static)> = Some(err);
    while let Some(e) = current {
        if let Some(f) = e.downcast_ref::<Failure>() {
            return f.clone();
        }
        if let Some(h2) = e.downcast_ref::<h2::Error>() {
            return classify_h2(h2);
        }
        if let Some(io) = e.downcast_ref::<io::Error>() {
            return classify_io(io);
        }
        if let Some(h) = e.downcast_ref::<hyper::Error>() {
            // Keep looking: a deeper io or h2 error says more than hyper's flags.
            hyper_flags.get_or_insert_with(|| classify_hyper_flags(h));
        }
        current = e.source();
    }
    hyper_flags.unwrap_or_else(|| Failure::new(Reason::Other, truncate(&err.to_string())))
}

fn classify_hyper_flags(h: &hyper::Error) -> Failure {
    if h.is_incomplete_message() {
        Failure::new(
            Reason::Reset,
            "connection closed before the response completed",
        )
    } else if h.is_canceled() {
        Failure::new(Reason::Reset, "request canceled: connection closed")
    } else if h.is_body_write_aborted() {
        Failure::new(Reason::Reset, "request body write aborted")
    } else if h.is_closed() {
        Failure::new(Reason::Reset, "connection closed")
    } else if h.is_timeout() {
        Failure::new(Reason::Timeout, "hyper timeout")
    } else if h.is_parse() {
        Failure::new(Reason::Other, "malformed response")
    } else {
        Failure::new(Reason::Other, truncate(&h.to_string()))
    }
}

fn classify_h2(h2: &h2::Error) -> Failure {
    if let Some(io) = h2.get_io() {
        return classify_io(io);
    }
    let reason = h2
        .reason()
        .map(|r| format!("{r:?}"))
        .unwrap_or_else(|| "unknown".into());
    if h2.is_reset() {
        Failure::new(Reason::Reset, format!("h2 RST_STREAM {reason}"))
    } else if h2.is_go_away() && h2.is_remote() {
        // h2 fails a stream with the peer's GOAWAY only when its id is above the GOAWAY's
        // last-stream-id: the server never processed it (RFC 9113 6.8; safe to retry, but
        // this loadgen retries nothing that was sent).
        Failure::new(
            Reason::Reset,
            format!("h2 stream refused by GOAWAY ({reason})"),
        )
    } else if h2.is_go_away() {
        // Our side tore the connection down (a protocol error), taking the stream with it.
        Failure::new(
            Reason::Reset,
            format!("h2 connection error ({reason}, local)"),
        )
    } else {
        Failure::new(Reason::Other, format!("h2 error {reason}"))
    }
}

fn classify_io(io: &io::Error) -> Failure {
    use io::ErrorKind::*;
    match io.kind() {
        ConnectionRefused => Failure::new(Reason::Refused, "connection refused"),
        ConnectionReset | ConnectionAborted | BrokenPipe | UnexpectedEof | NotConnected => {
            Failure::new(Reason::Reset, format!("io: {}", kind_name(io.kind())))
        }
        TimedOut => Failure::new(Reason::Timeout, "io: timed out"),
        _ => Failure::new(Reason::Other, format!("io: {}", truncate(&io.to_string()))),
    }
}

/// A stable name for an io error kind (the Display text of an io::Error carries the OS
/// message and errno, which would split one cause over many detail keys).
fn kind_name(kind: io::ErrorKind) -> String {
    let debug = format!("{kind:?}");
    // "ConnectionReset" -> "connection reset"
    let mut out = String::with_capacity(debug.len() + 4);
    for (i, c) in debug.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push(' ');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// Details become JSON map keys; keep them short.
pub(crate) fn truncate(s: &str) -> String {
    const MAX: usize = 120;
    if s.len() <= MAX {
        return s.to_owned();
    }
    let mut end = MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_kinds_map_to_reasons() {
        let refused = io::Error::from(io::ErrorKind::ConnectionRefused);
        assert_eq!(classify_connect(&refused).reason, Reason::Refused);
        let reset = io::Error::from(io::ErrorKind::ConnectionReset);
        let f = classify_error(&reset);
        assert_eq!(f, Failure::new(Reason::Reset, "io: connection reset"));
        let unreachable = io::Error::from(io::ErrorKind::HostUnreachable);
        assert_eq!(classify_connect(&unreachable).reason, Reason::Other);
    }

    #[test]
    fn a_failure_in_the_chain_wins() {
        #[derive(Debug, thiserror::Error)]
        #[error("wrapper")]
        struct Wrapper(#[source] Failure);
        let f = Failure::new(Reason::Timeout, "x");
        assert_eq!(classify_error(&Wrapper(f.clone())), f);
    }

    #[test]
    fn pods_are_read_from_demo_app_bodies() {
        assert_eq!(pod_from_body(b"pod=web-1\n").as_deref(), Some("web-1"));
        assert_eq!(
            pod_from_body(b"pod=web-2 delayed_ms=5\n").as_deref(),
            Some("web-2")
        );
        assert_eq!(pod_from_body(b"ok\n"), None);
        assert_eq!(pod_from_body(b"pod=\n"), None);
    }

    #[test]
    fn a_failure_is_attributed_to_the_pod_last_seen_on_its_connection() {
        let conn = Arc::new(ConnInfo::default());
        let first = RequestCtx::default();
        first.use_conn(&conn);
        first.answered(pod_from_body(b"pod=web-1\n"));
        let second = RequestCtx::default();
        assert_eq!(second.pod(), None);
        second.use_conn(&conn);
        assert_eq!(second.pod().as_deref(), Some("web-1"));
    }

    #[test]
    fn status_classes() {
        assert!(classify_status(204).is_ok());
        assert_eq!(
            classify_status(503).map_err(|f| f.reason),
            Err(Reason::Http5xx)
        );
        assert_eq!(
            classify_status(404).map_err(|f| f.reason),
            Err(Reason::Other)
        );
    }

    #[test]
    fn reason_names_are_the_json_names() {
        for r in Reason::ALL {
            assert_eq!(
                serde_json::to_value(r).ok(),
                Some(serde_json::Value::String(r.as_str().into()))
            );
        }
    }
}
