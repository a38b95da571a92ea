//! The request path routes are matched on, and the app gets: one
//! spelling per resource, so a route's limits cannot be sidestepped by
//! writing its path another way (`/%6cim`, `//lim`, `/./lim`,
//! `/x/../lim`). Both HTTP/1 paths and HTTP/2 ask here; the request goes
//! on with the path it was routed by, or is refused (400).
//!
//! The rules are Envoy's `normalize_path: true`, `merge_slashes: true` and
//! `path_with_escaped_slashes_action: REJECT_REQUEST`:
//!
//! 1. Escapes of unreserved characters (RFC 3986 §2.3: letters, digits,
//!    `-`, `.`, `_`, `~`) are decoded (RFC 3986 §6.2.2.2); other escapes
//!    stay as they came, malformed ones too.
//! 2. An escaped `/` or `\` (`%2F`, `%5C`, any case) is refused: decoded it
//!    would change which route matches, kept it may be decoded by the app
//!    after the routing.
//! 3. Repeated slashes are merged, then dot segments removed (RFC 3986
//!    §5.2.4); a `..` above the root stays at the root.

/// Why a path is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EscapedSlash;

/// What [`scan`] found in a path, in the one pass that checks its bytes.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct PathScan {
    /// A byte that may change the path's spelling: `%`, or a `/` followed
    /// by `/` or `.`. Most paths have none and are used as they came.
    needs_work: bool,
    prev: u8,
}

impl PathScan {
    /// Looks at the next byte of the path (the fast path calls this from
    /// its validity check, so no second pass over the target).
    #[inline]
    pub(crate) fn byte(&mut self, b: u8) {
        if b == b'%' || (self.prev == b'/' && (b == b'/' || b == b'.')) {
            self.needs_work = true;
        }
        self.prev = b;
    }

    pub(crate) fn needs_work(&self) -> bool {
        self.needs_work
    }
}

/// Whether `path` may need [`normalize`] (see [`PathScan`]).
pub(crate) fn scan(path: &str) -> bool {
    let mut scan = PathScan::default();
    path.bytes().for_each(|b| scan.byte(b));
    scan.needs_work()
}

/// The normalized form of an origin-form path (no query), or `None` when
/// it is already normal.
pub(crate) fn normalize(path: &str) -> Result<Option<String>, EscapedSlash> {
    if !scan(path) {
        return Ok(None);
    }
    let decoded = decode_unreserved(path.as_bytes())?;
    let normal = remove_dot_segments(&decoded);
    Ok((normal != path).then_some(normal))
}

/// The value of one hex digit (a path escape, a chunk size).
#[inline]
pub(super) fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

fn unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// Decodes the escapes of unreserved characters; refuses escaped slashes.
fn decode_unreserved(path: &[u8]) -> Result<String, EscapedSlash> {
    let mut out = Vec::with_capacity(path.len());
    let mut i = 0;
    while i < path.len() {
        let b = path[i];
        if b == b'%'
            && let (Some(hi), Some(lo)) = (
                path.get(i + 1).copied().and_then(hex),
                path.get(i + 2).copied().and_then(hex),
            )
        {
            let c = (hi << 4) | lo;
            if c == b'/' || c == b'\\' {
                return Err(EscapedSlash);
            }
            if unreserved(c) {
                out.push(c);
            } else {
                out.extend_from_slice(&path[i..i + 3]);
            }
            i += 3;
            continue;
        }
        out.push(b);
        i += 1;
    }
    // Only ASCII was decoded, and escapes of anything else kept whole, so
    // the bytes are as valid UTF-8 as the path was.
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// RFC 3986 §5.2.4 on a path starting with `/`, with empty segments
/// (repeated slashes) merged away.
fn remove_dot_segments(path: &str) -> String {
    let mut kept: Vec<&str> = Vec::new();
    let mut trailing_slash = false;
    for segment in path.strip_prefix('/').unwrap_or(path).split('/') {
        // A path ending in `/`, `/.` or `/..` names a directory.
        trailing_slash = matches!(segment, "" | "." | "..");
        match segment {
            "" | "." => {}
            ".." => {
                kept.pop();
            }
            other => kept.push(other),
        }
    }
    let mut out = String::with_capacity(path.len());
    for segment in &kept {
        out.push('/');
        out.push_str(segment);
    }
    if trailing_slash || kept.is_empty() {
        out.push('/');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(path: &str) -> Result<String, EscapedSlash> {
        normalize(path).map(|n| n.unwrap_or_else(|| path.to_string()))
    }

    #[test]
    fn every_spelling_of_a_route_path_comes_to_one() {
        for spelling in [
            "/%6cim/x",
            "/%6Cim/x",
            "//lim/x",
            "/./lim/x",
            "/x/../lim/x",
            "/lim//x",
            "/lim/./x",
            "/%2e/lim/x",
            "/../lim/x",
            "/lim/x",
        ] {
            assert_eq!(norm(spelling), Ok("/lim/x".to_string()), "{spelling}");
        }
    }

    #[test]
    fn escaped_slashes_are_refused_in_any_case() {
        for path in ["/lim%2fx", "/lim%2Fx", "/lim%5cx", "/lim%5Cx", "/a/%2F"] {
            assert_eq!(norm(path), Err(EscapedSlash), "{path}");
        }
    }

    #[test]
    fn other_escapes_and_plain_paths_stay_as_they_came() {
        assert_eq!(normalize("/lim/x"), Ok(None));
        assert_eq!(normalize("/"), Ok(None));
        assert_eq!(normalize("/a.b/c..d/.e"), Ok(None));
        assert_eq!(norm("/a%20b/%zz/%4"), Ok("/a%20b/%zz/%4".to_string()));
        assert_eq!(normalize("/a%20b"), Ok(None));
        assert_eq!(norm("/%C3%A9"), Ok("/%C3%A9".to_string()));
    }

    #[test]
    fn directories_keep_their_slash_and_the_root_holds() {
        assert_eq!(norm("/lim/"), Ok("/lim/".to_string()));
        assert_eq!(norm("/a/b/.."), Ok("/a/".to_string()));
        assert_eq!(norm("/a/b/."), Ok("/a/b/".to_string()));
        assert_eq!(norm("/.."), Ok("/".to_string()));
        assert_eq!(norm("//"), Ok("/".to_string()));
        assert_eq!(norm("/a/../../.."), Ok("/".to_string()));
    }
}
