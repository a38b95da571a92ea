//! RFC 9113 §8.2 and §8.3 checks of a decoded request (server side) or
//! response (client side) for an intermediary, and the `http` parts built
//! in the same pass (one HeaderMap).

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{HeaderMap, Method, Uri, Version};

use super::hpack::{FieldRef, HeaderBlock};

/// A request head, checked.
pub(crate) struct Head {
    pub(crate) parts: http::request::Parts,
    pub(crate) content_length: Option<u64>,
}

pub(crate) type Invalid = &'static str;

/// §8.2.1: a value must not carry NUL, CR or LF (HeaderValue checks
/// controls) nor start or end with whitespace. `v` is a slice of the
/// block's one copy: no allocation per value, and a clone of the request's
/// headers (kept for a retry) shares it too.
fn value(v: Bytes) -> Result<HeaderValue, Invalid> {
    if matches!(v.first(), Some(b' ' | b'\t')) || matches!(v.last(), Some(b' ' | b'\t')) {
        return Err("field value with leading or trailing whitespace");
    }
    HeaderValue::from_maybe_shared(v).map_err(|_| "invalid field value")
}

/// Field names outside http's standard set a connection has seen, kept
/// so that each is allocated once, not once per request (gRPC's `grpc-*`
/// fields, most of all).
#[derive(Default)]
pub(crate) struct Names(Vec<HeaderName>);

impl Names {
    /// Names kept, at most: a client that sends many distinct names gets
    /// the allocation per name, never a larger cache.
    const MAX: usize = 16;

    /// `static_name`: the name came from HPACK's static table, whose
    /// names are all http's standard ones (constants, never allocated):
    /// not looked for nor kept.
    fn get(&mut self, n: &[u8], static_name: bool) -> Result<HeaderName, Invalid> {
        if !static_name && let Some(known) = self.0.iter().find(|k| k.as_str().as_bytes() == n) {
            return Ok(known.clone());
        }
        let name = HeaderName::from_bytes(n).map_err(|_| "invalid field name")?;
        if !static_name && self.0.len() < Self::MAX {
            self.0.push(name.clone());
        }
        Ok(name)
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        self.0.capacity() * size_of::<HeaderName>()
            + self.0.iter().map(|n| n.as_str().len()).sum::<usize>()
    }
}

/// A regular field's name: lowercase token, not connection-specific.
fn name(f: &FieldRef<'_>, names: &mut Names) -> Result<HeaderName, Invalid> {
    if f.name.iter().any(u8::is_ascii_uppercase) {
        return Err("uppercase field name");
    }
    let name = names.get(f.name, f.static_name != 0)?;
    if matches!(
        name.as_str(),
        "connection" | "keep-alive" | "proxy-connection" | "transfer-encoding" | "upgrade"
    ) {
        return Err("connection-specific field");
    }
    Ok(name)
}

/// Which block `fields` reads: the pseudo-headers each may carry differ.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Request,
    Response,
    Trailers,
}

fn fields(
    block: &HeaderBlock,
    kind: Kind,
    names: &mut Names,
) -> Result<(HeaderMap, Pseudo), Invalid> {
    // One copy of the block; every value is a slice of it.
    let raw = Bytes::copy_from_slice(block.buffer());
    let mut map = HeaderMap::with_capacity(block.len());
    let mut pseudo = Pseudo::default();
    let mut regular_seen = false;
    for (f, at) in block.iter_ranged() {
        if let Some(p) = f.name.strip_prefix(b":") {
            if regular_seen {
                return Err("pseudo-header after a regular field");
            }
            let slot = match (kind, p) {
                (Kind::Trailers, _) => return Err("pseudo-header in trailers"),
                (Kind::Response, b"status") => &mut pseudo.status,
                (Kind::Response, _) => {
                    return Err("request or unknown pseudo-header in a response");
                }
                (_, b"method") => &mut pseudo.method,
                (_, b"scheme") => &mut pseudo.scheme,
                (_, b"authority") => &mut pseudo.authority,
                (_, b"path") => &mut pseudo.path,
                (_, b"protocol") => {
                    return Err(":protocol without SETTINGS_ENABLE_CONNECT_PROTOCOL");
                }
                _ => return Err("unknown or response pseudo-header"),
            };
            if slot.is_some() {
                return Err("pseudo-header repeated");
            }
            *slot = Some(raw.slice(at));
            continue;
        }
        regular_seen = true;
        let n = name(&f, names)?;
        if n == http::header::TE && f.value != b"trailers" {
            return Err("te other than trailers");
        }
        let mut v = value(raw.slice(at))?;
        v.set_sensitive(f.sensitive);
        map.append(n, v);
    }
    Ok((map, pseudo))
}

#[derive(Default)]
struct Pseudo {
    method: Option<Bytes>,
    scheme: Option<Bytes>,
    authority: Option<Bytes>,
    path: Option<Bytes>,
    status: Option<Bytes>,
}

/// Checks a request's block and builds its head.
pub(crate) fn request(block: &HeaderBlock, names: &mut Names) -> Result<Head, Invalid> {
    let (headers, p) = fields(block, Kind::Request, names)?;
    let method = Method::from_bytes(p.method.as_deref().ok_or(":method missing")?)
        .map_err(|_| "invalid :method")?;
    let mut parts = http::uri::Parts::default();
    if method == Method::CONNECT {
        // §8.5: :authority only.
        if p.scheme.is_some() || p.path.is_some() {
            return Err("CONNECT with :scheme or :path");
        }
        let authority = p.authority.ok_or("CONNECT without :authority")?;
        parts.authority =
            Some(Authority::from_maybe_shared(authority).map_err(|_| "invalid :authority")?);
    } else {
        let scheme = p.scheme.ok_or(":scheme missing")?;
        let path = p.path.ok_or(":path missing")?;
        if path.is_empty() {
            return Err("empty :path");
        }
        if &path[..] != b"*" && !path.starts_with(b"/") && method != Method::OPTIONS {
            return Err(":path not origin-form");
        }
        parts.scheme = Some(Scheme::try_from(&scheme[..]).map_err(|_| "invalid :scheme")?);
        if let Some(a) = p.authority {
            parts.authority =
                Some(Authority::from_maybe_shared(a).map_err(|_| "invalid :authority")?);
        }
        parts.path_and_query =
            Some(PathAndQuery::from_maybe_shared(path).map_err(|_| "invalid :path")?);
    }
    let uri = Uri::from_parts(parts).map_err(|_| "invalid :scheme, :authority or :path")?;
    let content_length = content_length(&headers)?;
    let mut req = http::Request::new(());
    *req.method_mut() = method;
    *req.uri_mut() = uri;
    *req.version_mut() = Version::HTTP_2;
    *req.headers_mut() = headers;
    let (parts, ()) = req.into_parts();
    Ok(Head {
        parts,
        content_length,
    })
}

/// Checks a response's block (§8.3.2: `:status` once, three digits, no
/// other pseudo-header) and returns its status, fields and content-length.
pub(crate) fn response(
    block: &HeaderBlock,
    names: &mut Names,
) -> Result<(http::StatusCode, HeaderMap, Option<u64>), Invalid> {
    let (headers, p) = fields(block, Kind::Response, names)?;
    let status = p.status.ok_or(":status missing")?;
    if status.len() != 3 || !status.iter().all(u8::is_ascii_digit) {
        return Err("invalid :status");
    }
    let status = http::StatusCode::from_bytes(&status).map_err(|_| "invalid :status")?;
    let content_length = content_length(&headers)?;
    Ok((status, headers, content_length))
}

/// content-length, all values equal (§8.1.1 makes a mismatch malformed).
fn content_length(headers: &HeaderMap) -> Result<Option<u64>, Invalid> {
    let mut found = None;
    for v in headers.get_all(http::header::CONTENT_LENGTH) {
        let s = v.to_str().map_err(|_| "invalid content-length")?;
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err("invalid content-length");
        }
        let n: u64 = s.parse().map_err(|_| "invalid content-length")?;
        if found.is_some_and(|f| f != n) {
            return Err("content-length values differ");
        }
        found = Some(n);
    }
    Ok(found)
}

/// Checks a trailer block (no pseudo-headers) and builds its map.
pub(crate) fn trailers(block: &HeaderBlock, names: &mut Names) -> Result<HeaderMap, Invalid> {
    fields(block, Kind::Trailers, names).map(|(map, _)| map)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cache of non-standard names is bounded: past it names are
    /// still made, only no longer kept; names from HPACK's static table are
    /// never kept.
    #[test]
    fn the_name_cache_keeps_at_most_its_bound() {
        let mut names = Names::default();
        for i in 0..Names::MAX + 4 {
            let n = format!("x-custom-{i}");
            let got = names.get(n.as_bytes(), false).expect("a valid name");
            assert_eq!(got.as_str(), n);
        }
        assert_eq!(names.0.len(), Names::MAX);
        // A kept one is found again, the same name.
        let again = names.get(b"x-custom-3", false).expect("valid");
        assert_eq!(again.as_str(), "x-custom-3");
        assert_eq!(names.0.len(), Names::MAX);
        let mut fresh = Names::default();
        assert!(fresh.get(b"content-type", true).is_ok());
        assert!(fresh.0.is_empty(), "static-table names are not kept");
        assert!(fresh.get(b"bad name", false).is_err());
        assert!(fresh.0.is_empty(), "an invalid name is not kept");
    }
}
