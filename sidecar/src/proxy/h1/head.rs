//! Request and response heads, parsed in place with httparse and written
//! back, rewritten, into one buffer: no `HeaderMap`, no owned names or
//! values. The rules are headers.rs's (hop-by-hop and `Connection`-listed
//! headers off, `X-Forwarded-*` on, a `Host` for a client that named none);
//! whatever this module does not handle is reported as [`Parsed::Fallback`]
//! and served by hyper instead.

use std::borrow::Cow;
use std::mem::MaybeUninit;

use super::super::path::{self, PathScan};

use super::super::rules::{drops_name, forwarded_for};

/// Headers a head may carry here; hyper's default limit too. A config
/// allowing more sends heads with more to hyper.
pub(crate) const MAX_HEADERS: usize = 100;
/// hyper's longest request target (414 beyond).
const MAX_URI_LEN: usize = (u16::MAX - 1) as usize;
/// `Connection` tokens naming other headers a head may list here.
const MAX_CONNECTION_NAMES: usize = 8;

/// How a message's body is delimited on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    /// No body.
    Empty,
    Length(u64),
    Chunked,
    /// Until the connection closes (responses only).
    Close,
}

/// An answer the proxy gives itself to a head it refuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// 400: malformed, or framing that could smuggle a request.
    BadRequest,
    /// 414.
    UriTooLong,
    /// 431: too many headers, or too many bytes of them.
    TooLarge,
}

/// A request head, its slices borrowed from the connection's buffer.
#[derive(Debug)]
pub(crate) struct RequestHead<'b> {
    pub(crate) method: &'b str,
    /// The target's path, without the query, normalized (proxy/path.rs):
    /// borrowed unless normalizing changed it, and then the head written
    /// for the app carries this one.
    pub(crate) path: Cow<'b, str>,
    /// The `Host` value's bytes (text only if a route needs it:
    /// `RouteTable::matches_hosts`).
    pub(crate) host: Option<&'b [u8]>,
    /// A `Host` header came (else the caller adds the upstream's).
    pub(crate) has_host: bool,
    pub(crate) framing: Framing,
    /// The client asked to close after this exchange.
    pub(crate) close: bool,
    /// Bytes of the head on the wire.
    pub(crate) len: usize,
}

#[derive(Debug)]
pub(crate) enum Parsed<T> {
    /// More bytes needed.
    Partial,
    Done(T),
    /// A head this path does not serve: hyper takes the connection.
    Fallback,
    Refused(Refusal),
}

/// What the request rewrite adds.
pub(crate) struct Rewrite<'a> {
    /// The client's address for `X-Forwarded-For`.
    pub(crate) peer_ip: &'a [u8],
    /// Believe the client's `X-Forwarded-Proto` (`forwarded.trustedHops`).
    pub(crate) trust_proto: bool,
    /// Pass header names with an underscore (`proxy.underscoresInHeaders`).
    pub(crate) keep_underscores: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Name {
    Host,
    ContentLength,
    TransferEncoding,
    Connection,
    KeepAlive,
    ProxyConnection,
    Te,
    Upgrade,
    Expect,
    ProxyAuthenticate,
    Http2Settings,
    XForwardedFor,
    XForwardedProto,
    Other,
    /// A line the app does not get: its name has an underscore, or
    /// `Connection` lists it (proxy/rules.rs).
    Dropped,
}

/// The headers this module treats specially, told apart by length first.
fn classify(name: &str) -> Name {
    let is = |known: &str| name.eq_ignore_ascii_case(known);
    match name.len() {
        2 if is("te") => Name::Te,
        4 if is("host") => Name::Host,
        6 if is("expect") => Name::Expect,
        7 if is("upgrade") => Name::Upgrade,
        10 if is("connection") => Name::Connection,
        10 if is("keep-alive") => Name::KeepAlive,
        14 if is("content-length") => Name::ContentLength,
        14 if is("http2-settings") => Name::Http2Settings,
        15 if is("x-forwarded-for") => Name::XForwardedFor,
        16 if is("proxy-connection") => Name::ProxyConnection,
        17 if is("transfer-encoding") => Name::TransferEncoding,
        17 if is("x-forwarded-proto") => Name::XForwardedProto,
        18 if is("proxy-authenticate") => Name::ProxyAuthenticate,
        _ => Name::Other,
    }
}

/// Comma-separated tokens of a list header, trimmed, empty ones skipped.
fn tokens(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value
        .split(|&b| b == b',')
        .map(|t| t.trim_ascii())
        .filter(|t| !t.is_empty())
}

/// A Content-Length value: 1 to 19 digits, nothing else (no sign, no list).
fn content_length(value: &[u8]) -> Option<u64> {
    if value.is_empty() || value.len() > 19 || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(
        value
            .iter()
            .fold(0u64, |n, &d| n * 10 + u64::from(d - b'0')),
    )
}

/// The `Connection` tokens of a head: close asked, and the header names it
/// lists (beyond close, keep-alive and upgrade).
#[derive(Default)]
struct ConnectionTokens<'b> {
    close: bool,
    upgrade: bool,
    names: [&'b [u8]; MAX_CONNECTION_NAMES],
    count: usize,
    overflow: bool,
}

impl<'b> ConnectionTokens<'b> {
    /// Whether it lists a header that frames or routes a request: such a
    /// request is hyper's, which re-frames what it forwards.
    fn lists_framing(&self) -> bool {
        self.names[..self.count].iter().any(|n| {
            std::str::from_utf8(n).is_ok_and(|n| {
                matches!(
                    classify(n),
                    Name::ContentLength | Name::TransferEncoding | Name::Host
                )
            })
        })
    }

    fn add(&mut self, value: &'b [u8]) {
        for token in tokens(value) {
            if token.eq_ignore_ascii_case(b"close") {
                self.close = true;
            } else if token.eq_ignore_ascii_case(b"upgrade") {
                self.upgrade = true;
            } else if token.eq_ignore_ascii_case(b"keep-alive") {
            } else if self.count < MAX_CONNECTION_NAMES {
                self.names[self.count] = token;
                self.count += 1;
            } else {
                self.overflow = true;
            }
        }
    }

    /// Whether `name` is listed. `te` never is (`te: trailers` is end to
    /// end for gRPC even if a client lists it), and neither are the
    /// headers that frame the message: the bytes relayed keep their
    /// framing, so its headers must stay with them.
    #[inline]
    fn lists(&self, name: &str, kind: Name) -> bool {
        // Most heads list nothing: no call, no loop, for each line then.
        self.count != 0
            && !matches!(
                kind,
                Name::Te | Name::ContentLength | Name::TransferEncoding
            )
            && self.names[..self.count]
                .iter()
                .any(|n| n.eq_ignore_ascii_case(name.as_bytes()))
    }
}

/// Whether an origin-form target (no fragment) holds only bytes the
/// `http` crate's URI rules take unencoded, so this path refuses (400)
/// exactly the targets the hyper path refuses. httparse alone lets through
/// some that a URI may not carry (found by fuzz.rs): `<`, `>` and `` ` `` in
/// the path, `"`, `<` and `>` in the query.
///
/// The same pass tells whether the path may need normalizing (`scan`).
fn target_is_valid(target: &[u8], scan: &mut PathScan) -> bool {
    let (path, query) = match target.iter().position(|&b| b == b'?') {
        Some(i) => (&target[..i], &target[i + 1..]),
        None => (target, &[][..]),
    };
    let in_path = |b: u8| matches!(b, b'!' | b'"' | b'$'..=b';' | b'=' | b'@'..=b'_' | b'a'..=b'~' | 0x80..=0xff);
    let in_query = |b: u8| matches!(b, b'!' | b'$'..=b';' | b'=' | b'?'..=b'~' | 0x80..=0xff);
    path.iter().all(|&b| {
        scan.byte(b);
        in_path(b)
    }) && query.iter().all(|&b| in_query(b))
}

pub(crate) fn put_header(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// Writes a head's kept lines to `out`. A line already in the form
/// [`put_header`] writes (`name: value` and CRLF, one space, nothing
/// trailing) is copied from the buffer as it came, and adjacent such lines
/// in one copy: the same bytes as writing each line anew, with one copy
/// for a whole run instead of four per line (writing lines one by one was
/// 6% of the sidecar's user-space instructions; bench/README.md, "eighth
/// pass").
struct LineCopier<'b> {
    buf: &'b [u8],
    /// The run of buffer bytes not yet copied.
    run: std::ops::Range<usize>,
}

impl<'b> LineCopier<'b> {
    fn new(buf: &'b [u8]) -> Self {
        LineCopier { buf, run: 0..0 }
    }

    /// Where `part` (a slice of the buffer) starts in it.
    fn offset(&self, part: &[u8]) -> usize {
        (part.as_ptr() as usize).wrapping_sub(self.buf.as_ptr() as usize)
    }

    /// Takes bytes `start..end` of the buffer into the run, copying the
    /// run out first when they do not follow it.
    #[inline]
    fn take(&mut self, out: &mut Vec<u8>, start: usize, end: usize) {
        if self.run.end != start || self.run.is_empty() {
            self.flush(out);
            self.run.start = start;
        }
        self.run.end = end;
    }

    /// Copies the run out; call before writing anything else to `out`.
    fn flush(&mut self, out: &mut Vec<u8>) {
        if !self.run.is_empty() {
            out.extend_from_slice(&self.buf[self.run.clone()]);
            self.run = 0..0;
        }
    }

    /// Keeps a header line: from the buffer when it is canonical there,
    /// else written anew.
    fn keep(&mut self, out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
        let start = self.offset(name);
        let name_end = start.wrapping_add(name.len());
        let value_start = self.offset(value);
        let end = value_start.wrapping_add(value.len()).wrapping_add(2);
        // Byte by byte, not as slices: a slice comparison is a call.
        let byte = |i: usize| self.buf.get(i).copied();
        let canonical = value_start == name_end.wrapping_add(2)
            && !value.is_empty()
            && end <= self.buf.len()
            && byte(name_end) == Some(b':')
            && byte(name_end.wrapping_add(1)) == Some(b' ')
            && byte(end.wrapping_sub(2)) == Some(b'\r')
            && byte(end.wrapping_sub(1)) == Some(b'\n');
        if canonical {
            self.take(out, start, end);
        } else {
            self.flush(out);
            put_header(out, name, value);
        }
    }
}

type Headers<'b> = [MaybeUninit<httparse::Header<'b>>; MAX_HEADERS];

fn header_storage<'b>() -> Headers<'b> {
    [const { MaybeUninit::uninit() }; MAX_HEADERS]
}

/// Parses a request head at the start of `buf` and, when this path serves
/// it, writes the head the app gets to `out` (cleared first), all but the
/// final CRLF: the caller adds `Host` if the client sent none, then ends it.
/// `max_headers` and `max_head` are `limits.maxHeaders` and the head size
/// allowed (431 past either, as hyper answers).
pub(crate) fn parse_request<'b>(
    buf: &'b [u8],
    max_headers: usize,
    max_head: usize,
    rewrite: &Rewrite<'_>,
    out: &mut Vec<u8>,
) -> Parsed<RequestHead<'b>> {
    let mut storage = header_storage();
    let slots = &mut storage[..max_headers.min(MAX_HEADERS)];
    let mut req = httparse::Request::new(&mut []);
    let len = match req.parse_with_uninit_headers(buf, slots) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if buf.len() >= max_head => {
            return Parsed::Refused(Refusal::TooLarge);
        }
        Ok(httparse::Status::Partial) => return Parsed::Partial,
        Err(httparse::Error::TooManyHeaders) if max_headers > MAX_HEADERS => {
            return Parsed::Fallback;
        }
        Err(httparse::Error::TooManyHeaders) => return Parsed::Refused(Refusal::TooLarge),
        Err(_) => return Parsed::Refused(Refusal::BadRequest),
    };
    if len > max_head {
        return Parsed::Refused(Refusal::TooLarge);
    }
    let (Some(method), Some(target), Some(version)) = (req.method, req.path, req.version) else {
        return Parsed::Refused(Refusal::BadRequest);
    };
    if target.len() > MAX_URI_LEN {
        return Parsed::Refused(Refusal::UriTooLong);
    }
    // HTTP/1.0 (keep-alive rules, no Host), CONNECT, and targets in
    // absolute or asterisk form are hyper's.
    if version != 1 || method == "CONNECT" || !target.starts_with('/') {
        return Parsed::Fallback;
    }
    // A fragment is hyper's too: it drops it before the app sees the target.
    if target.contains('#') {
        return Parsed::Fallback;
    }
    let mut scan = PathScan::default();
    if !target_is_valid(target.as_bytes(), &mut scan) {
        return Parsed::Refused(Refusal::BadRequest);
    }
    let raw_path = target.split_once('?').map_or(target, |(p, _)| p);
    let path = if scan.needs_work() {
        match path::normalize(raw_path) {
            Ok(Some(normal)) => Cow::Owned(normal),
            Ok(None) => Cow::Borrowed(raw_path),
            Err(path::EscapedSlash) => return Parsed::Refused(Refusal::BadRequest),
        }
    } else {
        Cow::Borrowed(raw_path)
    };

    let mut host = None;
    let mut length = None;
    let mut chunked = false;
    let mut conn = ConnectionTokens::default();
    let mut xff_lines = 0usize;
    let mut has_xfp = false;
    // Each name is classified once, for both passes.
    let mut kinds = [Name::Other; MAX_HEADERS];
    for (h, kind) in req.headers.iter().zip(kinds.iter_mut()) {
        *kind = classify(h.name);
        match *kind {
            Name::Host => {
                if host.is_some() {
                    return Parsed::Refused(Refusal::BadRequest);
                }
                host = Some(h.value);
            }
            Name::ContentLength => {
                // A second Content-Length, even an equal one, is refused:
                // stricter than hyper, and no client needs it.
                if length.is_some() {
                    return Parsed::Refused(Refusal::BadRequest);
                }
                match content_length(h.value) {
                    Some(n) => length = Some(n),
                    None => return Parsed::Refused(Refusal::BadRequest),
                }
            }
            Name::TransferEncoding => {
                // Only exactly `chunked`, once; any other coding, a list, or
                // Content-Length beside it goes to hyper's rules.
                if chunked || !h.value.eq_ignore_ascii_case(b"chunked") {
                    return Parsed::Fallback;
                }
                chunked = true;
            }
            Name::Connection => conn.add(h.value),
            Name::Upgrade | Name::Expect => return Parsed::Fallback,
            Name::XForwardedFor => xff_lines += 1,
            Name::XForwardedProto => has_xfp = true,
            // One look for `_` per name no other rule knows.
            Name::Other if drops_name(h.name.as_bytes(), rewrite.keep_underscores) => {
                *kind = Name::Dropped;
            }
            _ => {}
        }
    }
    if conn.count != 0 {
        // What `Connection` lists comes off, the forwarding headers too
        // (the sidecar's own then take their place, as on the hyper path).
        // Decided here, once, for heads that list anything (few do).
        for (h, kind) in req.headers.iter().zip(kinds.iter_mut()) {
            if *kind != Name::Dropped && conn.lists(h.name, *kind) {
                match *kind {
                    Name::XForwardedFor => xff_lines = xff_lines.saturating_sub(1),
                    Name::XForwardedProto => has_xfp = false,
                    _ => {}
                }
                *kind = Name::Dropped;
            }
        }
    }
    if conn.upgrade || conn.overflow || conn.lists_framing() || (chunked && length.is_some()) {
        return Parsed::Fallback;
    }
    let framing = match (chunked, length) {
        (true, _) => Framing::Chunked,
        (false, Some(0) | None) => Framing::Empty,
        (false, Some(n)) => Framing::Length(n),
    };

    out.clear();
    let mut lines = LineCopier::new(buf);
    // The request line as it came when it is already `METHOD SP target SP
    // HTTP/1.1` and CRLF (then the lines after it join its copy).
    let line_end = method.len() + 1 + target.len() + 11;
    if let Cow::Owned(normal) = &path {
        // The app gets the path the route was chosen by, the query as it came.
        out.extend_from_slice(method.as_bytes());
        out.push(b' ');
        out.extend_from_slice(normal.as_bytes());
        out.extend_from_slice(&target.as_bytes()[raw_path.len()..]);
        out.extend_from_slice(b" HTTP/1.1\r\n");
    } else if lines.offset(method.as_bytes()) == 0
        && buf.get(method.len()) == Some(&b' ')
        && lines.offset(target.as_bytes()) == method.len() + 1
        && buf.get(line_end - 11..line_end) == Some(b" HTTP/1.1\r\n".as_slice())
    {
        lines.take(out, 0, line_end);
    } else {
        out.extend_from_slice(method.as_bytes());
        out.push(b' ');
        out.extend_from_slice(target.as_bytes());
        out.extend_from_slice(b" HTTP/1.1\r\n");
    }
    let keep_proto = rewrite.trust_proto && has_xfp;
    let mut xff_done = false;
    for (h, &kind) in req.headers.iter().zip(kinds.iter()) {
        match kind {
            Name::Connection
            | Name::KeepAlive
            | Name::ProxyConnection
            | Name::ProxyAuthenticate
            | Name::Http2Settings
            | Name::Dropped => continue,
            Name::Te => {
                // Only "trailers" may cross.
                if tokens(h.value).any(|t| t.eq_ignore_ascii_case(b"trailers")) {
                    lines.flush(out);
                    put_header(out, b"te", b"trailers");
                }
                continue;
            }
            Name::XForwardedFor if xff_done => continue,
            Name::XForwardedFor => {
                // Every line joined into this one (proxy/rules.rs).
                xff_done = true;
                lines.flush(out);
                out.extend_from_slice(h.name.as_bytes());
                out.extend_from_slice(b": ");
                if xff_lines == 1 {
                    forwarded_for(std::iter::once(h.value), rewrite.peer_ip, out);
                } else {
                    let values = req
                        .headers
                        .iter()
                        .zip(kinds.iter())
                        .filter(|(_, k)| **k == Name::XForwardedFor)
                        .map(|(h, _)| h.value);
                    forwarded_for(values, rewrite.peer_ip, out);
                }
                out.extend_from_slice(b"\r\n");
                continue;
            }
            Name::XForwardedProto if !keep_proto => continue,
            _ => {}
        }
        lines.keep(out, h.name.as_bytes(), h.value);
    }
    lines.flush(out);
    if xff_lines == 0 {
        put_header(out, b"x-forwarded-for", rewrite.peer_ip);
    }
    if !keep_proto {
        put_header(out, b"x-forwarded-proto", b"http");
    }

    Parsed::Done(RequestHead {
        method,
        path,
        has_host: host.is_some(),
        host,
        framing,
        close: conn.close,
        len,
    })
}

/// A response head from the app.
#[derive(Debug)]
pub(crate) struct ResponseHead {
    pub(crate) status: u16,
    pub(crate) framing: Framing,
    /// The app keeps the connection open after this response.
    pub(crate) reusable: bool,
    /// The client's connection closes after this response (and the head
    /// written says so).
    pub(crate) close: bool,
    /// Bytes of the head on the wire.
    pub(crate) len: usize,
}

/// Parses the app's response head at the start of `buf` and writes the one
/// the client gets to `out` (cleared first). `head_request`: the request
/// was a HEAD (no body follows whatever the head says); `close`: tell the
/// client the connection closes after this response. A response without
/// framing closes the client's connection too (see the return value's
/// `framing`). Informational answers (1xx) come back as `Done` with their
/// status and nothing written; the caller skips them.
pub(crate) fn parse_response(
    buf: &[u8],
    head_request: bool,
    close: bool,
    out: &mut Vec<u8>,
) -> Parsed<ResponseHead> {
    let mut storage = header_storage();
    let mut res = httparse::Response::new(&mut []);
    let len = match httparse::ParserConfig::default().parse_response_with_uninit_headers(
        &mut res,
        buf,
        &mut storage,
    ) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Parsed::Partial,
        Err(httparse::Error::TooManyHeaders) => return Parsed::Refused(Refusal::TooLarge),
        Err(_) => return Parsed::Refused(Refusal::BadRequest),
    };
    let (Some(version), Some(status)) = (res.version, res.code) else {
        return Parsed::Refused(Refusal::BadRequest);
    };
    if (100..200).contains(&status) {
        return Parsed::Done(ResponseHead {
            status,
            framing: Framing::Empty,
            reusable: true,
            close,
            len,
        });
    }
    let mut length = None;
    let mut te: Option<bool> = None;
    let mut conn = ConnectionTokens::default();
    let mut keep_alive_10 = false;
    let mut kinds = [Name::Other; MAX_HEADERS];
    for (h, kind) in res.headers.iter().zip(kinds.iter_mut()) {
        *kind = classify(h.name);
        match *kind {
            Name::ContentLength => match (content_length(h.value), length) {
                (None, _) => return Parsed::Refused(Refusal::BadRequest),
                (Some(n), Some(prev)) if n != prev => return Parsed::Refused(Refusal::BadRequest),
                (Some(n), _) => length = Some(n),
            },
            Name::TransferEncoding => {
                // The last coding decides; several lines are one list.
                let last_chunked = tokens(h.value)
                    .last()
                    .is_some_and(|t| t.eq_ignore_ascii_case(b"chunked"));
                te = Some(last_chunked);
            }
            Name::Connection => {
                if tokens(h.value).any(|t| t.eq_ignore_ascii_case(b"keep-alive")) {
                    keep_alive_10 = true;
                }
                conn.add(h.value);
            }
            _ => {}
        }
    }
    let bodiless = head_request || status == 204 || status == 304;
    let framing = match (bodiless, te, length) {
        (true, _, _) => Framing::Empty,
        (false, Some(true), _) => Framing::Chunked,
        (false, Some(false), _) => Framing::Close,
        (false, None, Some(0)) => Framing::Empty,
        (false, None, Some(n)) => Framing::Length(n),
        (false, None, None) => Framing::Close,
    };
    // Both Transfer-Encoding and Content-Length: relayed by the former,
    // but the connection is not trusted after it.
    let framed_twice = te.is_some() && length.is_some();
    let reusable = !conn.close
        && !conn.overflow
        && !framed_twice
        && framing != Framing::Close
        && (version == 1 || keep_alive_10);
    let close = close || framing == Framing::Close;

    out.clear();
    let mut lines = LineCopier::new(buf);
    let digits = status_digits(status);
    let reason = res.reason.unwrap_or("");
    // The status line as it came when it is already what would be written.
    let line_end = 13 + reason.len() + 2;
    let as_written = buf.get(..9) == Some(b"HTTP/1.1 ".as_slice())
        && buf.get(9..12) == Some(digits.as_slice())
        && buf.get(12) == Some(&b' ')
        && lines.offset(reason.as_bytes()) == 13
        && buf.get(line_end - 2..line_end) == Some(b"\r\n".as_slice());
    if as_written {
        lines.take(out, 0, line_end);
    } else {
        out.extend_from_slice(b"HTTP/1.1 ");
        out.extend_from_slice(digits.as_slice());
        out.push(b' ');
        out.extend_from_slice(reason.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    for (h, &kind) in res.headers.iter().zip(kinds.iter()) {
        match kind {
            Name::Connection
            | Name::KeepAlive
            | Name::ProxyConnection
            | Name::Te
            | Name::Upgrade
            | Name::ProxyAuthenticate => continue,
            Name::ContentLength if te.is_some() => continue,
            _ => {}
        }
        if conn.lists(h.name, kind) {
            continue;
        }
        lines.keep(out, h.name.as_bytes(), h.value);
    }
    lines.flush(out);
    if close {
        put_header(out, b"connection", b"close");
    }
    out.extend_from_slice(b"\r\n");
    Parsed::Done(ResponseHead {
        status,
        framing,
        reusable,
        close,
        len,
    })
}

fn status_digits(status: u16) -> [u8; 3] {
    let s = status.min(999);
    [
        b'0' + (s / 100) as u8,
        b'0' + (s / 10 % 10) as u8,
        b'0' + (s % 10) as u8,
    ]
}

#[cfg(test)]
#[path = "head_tests.rs"]
mod tests;
