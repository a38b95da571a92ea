//! The header rules of both HTTP/1 paths, decided in one place: the fast
//! path (h1/head.rs) applies them to bytes as it parses, the hyper path
//! (headers.rs) to its `HeaderMap`, and both ask here, so the app gets the
//! same headers whichever path served the request.
//!
//! - Hop-by-hop headers and the names `Connection` lists come off (RFC 9110
//!   §7.6.1); a client listing `X-Forwarded-For` in `Connection` loses its
//!   own value, and the sidecar's takes its place.
//! - `X-Forwarded-For` reaches the app as one line: the client's lines
//!   joined in order, then the peer ([`forwarded_for`]).
//! - Header names with an underscore are dropped unless
//!   `proxy.underscoresInHeaders` ([`drops_name`]).
//! - Trailer fields that may not be trailers never reach the app: hyper
//!   drops them (and any field the `Trailer` header did not declare); the
//!   fast path, which relays chunked bytes as they came, refuses a request
//!   body carrying one (400) rather than rewrite its trailer section
//!   ([`TrailerName`]).

/// Whether a request header named `name` is dropped before the app sees
/// it for its spelling: an underscore, unless the config keeps them
/// (`proxy.underscoresInHeaders`). Envoy rejects such names by option,
/// nginx drops them by default; dropping keeps the request going.
#[inline]
pub(super) fn drops_name(name: &[u8], keep_underscores: bool) -> bool {
    !keep_underscores && name.contains(&b'_')
}

/// Fields a sender must not put in a trailer section and a recipient must
/// not merge into the header section (RFC 9110 §6.5.1): framing, routing,
/// request modifiers, authentication, response control and content
/// metadata. The same list as Go's `net/http` (`badTrailer`), which holds
/// hyper's (`is_valid_trailer_field`) and adds the hop-by-hop names.
const FORBIDDEN_TRAILERS: &[&[u8]] = &[
    b"authorization",
    b"cache-control",
    b"connection",
    b"content-encoding",
    b"content-length",
    b"content-range",
    b"content-type",
    b"cookie",
    b"expect",
    b"host",
    b"keep-alive",
    b"max-forwards",
    b"pragma",
    b"proxy-authenticate",
    b"proxy-authorization",
    b"proxy-connection",
    b"range",
    b"set-cookie",
    b"te",
    b"trailer",
    b"transfer-encoding",
    b"upgrade",
    b"www-authenticate",
];

/// A trailer field name matched against [`FORBIDDEN_TRAILERS`] a byte at
/// a time, as the fast path's chunk framer reads it (its bytes may come
/// in several reads): one bit per list entry still matching.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct TrailerName {
    candidates: u32,
    len: u8,
}

impl TrailerName {
    pub(super) fn start() -> TrailerName {
        TrailerName {
            candidates: (1u32 << FORBIDDEN_TRAILERS.len()) - 1,
            len: 0,
        }
    }

    /// The name's next byte.
    pub(super) fn byte(&mut self, b: u8) {
        if self.candidates == 0 {
            return;
        }
        let at = usize::from(self.len);
        let b = b.to_ascii_lowercase();
        for (i, name) in FORBIDDEN_TRAILERS.iter().enumerate() {
            if name.get(at) != Some(&b) {
                self.candidates &= !(1 << i);
            }
        }
        self.len = self.len.saturating_add(1);
    }

    /// At the name's end: whether it may not be a trailer.
    pub(super) fn forbidden(&self) -> bool {
        FORBIDDEN_TRAILERS
            .iter()
            .enumerate()
            .any(|(i, name)| self.candidates & (1 << i) != 0 && name.len() == usize::from(self.len))
    }
}

/// Whether a trailer field named `name` may not be a trailer.
#[cfg(test)]
pub(super) fn forbidden_trailer(name: &[u8]) -> bool {
    let mut matcher = TrailerName::start();
    name.iter().for_each(|&b| matcher.byte(b));
    matcher.forbidden()
}

/// Writes the `X-Forwarded-For` value the app gets: every value the
/// client sent, in order, joined by `, ` into one line, then the peer.
///
/// Several lines are one list (RFC 9110 §5.3), so joining them changes
/// nothing for an app that reads them as one; one that reads only the
/// last line would otherwise take a value the client chose for the
/// rightmost hop. Envoy does the same (it keeps one `x-forwarded-for` and
/// appends the peer to it); HAProxy adds a line of its own, which leaves
/// the choice to the app.
pub(super) fn forwarded_for<'v>(
    values: impl Iterator<Item = &'v [u8]>,
    peer: &[u8],
    out: &mut Vec<u8>,
) {
    for value in values {
        let value = value.trim_ascii();
        if !value.is_empty() {
            out.extend_from_slice(value);
            out.extend_from_slice(b", ");
        }
    }
    out.extend_from_slice(peer);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn underscore_names_go_unless_kept() {
        assert!(drops_name(b"Content_Length", false));
        assert!(drops_name(b"x_real_ip", false));
        assert!(!drops_name(b"x-real-ip", false));
        assert!(!drops_name(b"Content_Length", true));
    }

    #[test]
    fn the_forbidden_trailer_list_is_matched_without_case() {
        assert!(FORBIDDEN_TRAILERS.len() <= 32, "one bit per name");
        for name in FORBIDDEN_TRAILERS {
            assert!(forbidden_trailer(&name.to_ascii_uppercase()), "{name:?}");
        }
        assert!(forbidden_trailer(b"Host"));
        assert!(!forbidden_trailer(b"Hos"));
        assert!(!forbidden_trailer(b"Hosts"));
        assert!(!forbidden_trailer(b"grpc-status"));
        assert!(!forbidden_trailer(b"x-checksum"));
        assert!(!forbidden_trailer(&[b'a'; 300]));
    }

    #[test]
    fn forwarded_for_joins_every_line_in_order_then_the_peer() {
        let mut out = Vec::new();
        forwarded_for(
            [&b"1.1.1.1"[..], b" 2.2.2.2, 3.3.3.3 "].into_iter(),
            b"10.0.0.7",
            &mut out,
        );
        assert_eq!(out, b"1.1.1.1, 2.2.2.2, 3.3.3.3, 10.0.0.7");
        let mut out = Vec::new();
        forwarded_for([&b""[..]].into_iter(), b"10.0.0.7", &mut out);
        assert_eq!(out, b"10.0.0.7");
        let mut out = Vec::new();
        forwarded_for(std::iter::empty(), b"10.0.0.7", &mut out);
        assert_eq!(out, b"10.0.0.7");
    }
}
