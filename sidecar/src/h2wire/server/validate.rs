//! RFC 9113 §8.2 and §8.3 checks of a decoded request for an intermediary,
//! and the `http::Request` parts built in the same pass (one HeaderMap).

use http::header::{HeaderName, HeaderValue};
use http::{HeaderMap, Method, Uri, Version};

use super::super::hpack::HeaderBlock;

/// A request head, checked.
pub(super) struct Head {
    pub(super) parts: http::request::Parts,
    pub(super) content_length: Option<u64>,
}

type Invalid = &'static str;

/// §8.2.1: a value must not carry NUL, CR or LF (HeaderValue checks
/// controls) nor start or end with whitespace.
fn value(v: &[u8]) -> Result<HeaderValue, Invalid> {
    if matches!(v.first(), Some(b' ' | b'\t')) || matches!(v.last(), Some(b' ' | b'\t')) {
        return Err("field value with leading or trailing whitespace");
    }
    HeaderValue::from_bytes(v).map_err(|_| "invalid field value")
}

/// A regular field's name: lowercase token, not connection-specific.
fn name(n: &[u8]) -> Result<HeaderName, Invalid> {
    if n.iter().any(u8::is_ascii_uppercase) {
        return Err("uppercase field name");
    }
    let name = HeaderName::from_bytes(n).map_err(|_| "invalid field name")?;
    if matches!(
        name.as_str(),
        "connection" | "keep-alive" | "proxy-connection" | "transfer-encoding" | "upgrade"
    ) {
        return Err("connection-specific field");
    }
    Ok(name)
}

fn fields(block: &HeaderBlock, trailers: bool) -> Result<(HeaderMap, Pseudo<'_>), Invalid> {
    let mut map = HeaderMap::with_capacity(block.len());
    let mut pseudo = Pseudo::default();
    let mut regular_seen = false;
    for f in block.iter() {
        if let Some(p) = f.name.strip_prefix(b":") {
            if regular_seen {
                return Err("pseudo-header after a regular field");
            }
            if trailers {
                return Err("pseudo-header in trailers");
            }
            let slot = match p {
                b"method" => &mut pseudo.method,
                b"scheme" => &mut pseudo.scheme,
                b"authority" => &mut pseudo.authority,
                b"path" => &mut pseudo.path,
                b"protocol" => return Err(":protocol without SETTINGS_ENABLE_CONNECT_PROTOCOL"),
                _ => return Err("unknown or response pseudo-header"),
            };
            if slot.is_some() {
                return Err("pseudo-header repeated");
            }
            *slot = Some(f.value);
            continue;
        }
        regular_seen = true;
        let n = name(f.name)?;
        if n == http::header::TE && f.value != b"trailers" {
            return Err("te other than trailers");
        }
        let mut v = value(f.value)?;
        v.set_sensitive(f.sensitive);
        map.append(n, v);
    }
    Ok((map, pseudo))
}

#[derive(Default)]
struct Pseudo<'a> {
    method: Option<&'a [u8]>,
    scheme: Option<&'a [u8]>,
    authority: Option<&'a [u8]>,
    path: Option<&'a [u8]>,
}

/// Checks a request's block and builds its head.
pub(super) fn request(block: &HeaderBlock) -> Result<Head, Invalid> {
    let (headers, p) = fields(block, false)?;
    let method =
        Method::from_bytes(p.method.ok_or(":method missing")?).map_err(|_| "invalid :method")?;
    let uri = if method == Method::CONNECT {
        // §8.5: :authority only.
        if p.scheme.is_some() || p.path.is_some() {
            return Err("CONNECT with :scheme or :path");
        }
        let authority = p.authority.ok_or("CONNECT without :authority")?;
        Uri::builder()
            .authority(authority)
            .build()
            .map_err(|_| "invalid :authority")?
    } else {
        let scheme = p.scheme.ok_or(":scheme missing")?;
        let path = p.path.ok_or(":path missing")?;
        if path.is_empty() {
            return Err("empty :path");
        }
        if path != b"*" && !path.starts_with(b"/") && method != Method::OPTIONS {
            return Err(":path not origin-form");
        }
        let mut b = Uri::builder().scheme(scheme);
        if let Some(a) = p.authority {
            b = b.authority(a);
        }
        b.path_and_query(path)
            .build()
            .map_err(|_| "invalid :scheme, :authority or :path")?
    };
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
pub(super) fn trailers(block: &HeaderBlock) -> Result<HeaderMap, Invalid> {
    fields(block, true).map(|(map, _)| map)
}
