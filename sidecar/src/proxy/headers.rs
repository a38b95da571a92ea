//! Header rewriting between the client and the app, free of IO: what a
//! proxy must take out (hop-by-hop headers and whatever `Connection`
//! names), what it adds (`X-Forwarded-*`, a `Host` for HTTP/1.0 clients),
//! and which upgrades may pass.

use http::Uri;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use super::rules::{drops_name, forwarded_for};

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
static PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");
static KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
pub(super) static HTTP2_SETTINGS: HeaderName = HeaderName::from_static("http2-settings");

/// Does a `Connection` header list this token?
pub(super) fn connection_has(headers: &HeaderMap, token: &str) -> bool {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case(token))
}

/// Which hop-by-hop headers a message carries, found in one pass.
#[derive(Default)]
struct HopByHop {
    connection: bool,
    keep_alive: bool,
    proxy_connection: bool,
    transfer_encoding: bool,
    proxy_authenticate: bool,
    expect: bool,
    te: bool,
    upgrade: bool,
}

impl HopByHop {
    fn scan(headers: &HeaderMap) -> HopByHop {
        let mut found = HopByHop::default();
        // Standard names compare as enum tags, so this walk is cheap; most
        // requests carry none of these and are done after it.
        for name in headers.keys() {
            if name == header::CONNECTION {
                found.connection = true;
            } else if name == header::TRANSFER_ENCODING {
                found.transfer_encoding = true;
            } else if name == header::TE {
                found.te = true;
            } else if name == header::UPGRADE {
                found.upgrade = true;
            } else if name == header::EXPECT {
                found.expect = true;
            } else if name == header::PROXY_AUTHENTICATE {
                found.proxy_authenticate = true;
            } else if name == KEEP_ALIVE {
                found.keep_alive = true;
            } else if name == PROXY_CONNECTION {
                found.proxy_connection = true;
            }
        }
        found
    }
}

/// Removes hop-by-hop headers (RFC 9110 §7.6.1) and whatever `Connection`
/// names. With `upgrade`, `Upgrade` survives and `Connection: upgrade` is
/// set again so the app sees the handshake.
pub(super) fn strip_hop_by_hop(headers: &mut HeaderMap, upgrade: bool) {
    let found = HopByHop::scan(headers);
    if found.connection {
        // Only tokens beyond the usual ones cost an allocation.
        let extra: Vec<HeaderName> = headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .filter(|t| {
                !t.is_empty()
                    && !t.eq_ignore_ascii_case("close")
                    && !t.eq_ignore_ascii_case("keep-alive")
                    && !t.eq_ignore_ascii_case("upgrade")
            })
            .filter_map(|t| HeaderName::from_bytes(t.as_bytes()).ok())
            .collect();
        for name in extra {
            // `te: trailers` is end to end for gRPC even if a client lists it.
            if name != header::TE {
                headers.remove(name);
            }
        }
        headers.remove(header::CONNECTION);
    }
    if found.keep_alive {
        headers.remove(&KEEP_ALIVE);
    }
    if found.proxy_connection {
        headers.remove(&PROXY_CONNECTION);
    }
    if found.transfer_encoding {
        headers.remove(header::TRANSFER_ENCODING);
    }
    if found.proxy_authenticate {
        headers.remove(header::PROXY_AUTHENTICATE);
    }
    if found.expect {
        // The proxy answers `Expect: 100-continue` itself when it reads the body.
        headers.remove(header::EXPECT);
    }
    if found.te
        && let Some(te) = headers.get(header::TE)
    {
        // Only "trailers" may cross (HTTP/2 forbids anything else).
        let trailers = te
            .to_str()
            .map(|v| {
                v.split(',')
                    .any(|t| t.trim().eq_ignore_ascii_case("trailers"))
            })
            .unwrap_or(false);
        if trailers {
            // gRPC's `te: trailers`, as every gRPC client sends it: already
            // what goes on, so not inserted again.
            if te.as_bytes() != b"trailers" {
                headers.insert(header::TE, HeaderValue::from_static("trailers"));
            }
        } else {
            headers.remove(header::TE);
        }
    }
    if upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    } else if found.upgrade {
        headers.remove(header::UPGRADE);
    }
}
/// Drops the header names proxy/rules.rs drops for their spelling (an
/// underscore, unless `proxy.underscoresInHeaders`): one walk over the
/// names, allocating only when one goes (the fast path decides it as it
/// parses).
pub(super) fn drop_spelled_out(headers: &mut HeaderMap, keep_underscores: bool) {
    if keep_underscores {
        return;
    }
    let dropped: Vec<HeaderName> = headers
        .keys()
        .filter(|n| drops_name(n.as_str().as_bytes(), keep_underscores))
        .cloned()
        .collect();
    for name in dropped {
        headers.remove(name);
    }
}

/// Whether an `Upgrade` request asks for WebSocket (RFC 6455 §4.1:
/// `Upgrade: websocket`, case-insensitive; other tokens may come along).
pub(super) fn upgrade_is_websocket(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::UPGRADE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|p| p.trim().eq_ignore_ascii_case("websocket"))
}

/// Keeps only the `Upgrade` protocols in `allowed` (names compared
/// without case and without `/version`); false when none is left.
pub(super) fn allow_upgrade(headers: &mut HeaderMap, allowed: &[String]) -> bool {
    let offered: Vec<&str> = headers
        .get_all(header::UPGRADE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect();
    let kept: Vec<&str> = offered
        .iter()
        .copied()
        .filter(|p| {
            let name = p.split('/').next().unwrap_or(p).trim();
            allowed.iter().any(|a| a.eq_ignore_ascii_case(name))
        })
        .collect();
    if kept.is_empty() {
        return false;
    }
    if kept.len() != offered.len() {
        match HeaderValue::from_str(&kept.join(", ")) {
            Ok(value) => {
                headers.insert(header::UPGRADE, value);
            }
            Err(_) => return false,
        }
    }
    true
}

/// Appends the client to `X-Forwarded-For` and sets `X-Forwarded-Proto`.
/// The sidecar itself only ever speaks cleartext. A client's own "https"
/// is believed only with `forwarded.trustedHops` (a TLS-terminating
/// balancer in front, `trust_client_proto`), or any client could claim it.
pub(super) fn add_forwarded(
    headers: &mut HeaderMap,
    peer_ip: &HeaderValue,
    trust_client_proto: bool,
) {
    if headers.contains_key(&X_FORWARDED_FOR) {
        // All the client's lines, in order, and the peer: one line.
        let mut joined = Vec::new();
        forwarded_for(
            headers
                .get_all(&X_FORWARDED_FOR)
                .iter()
                .map(HeaderValue::as_bytes),
            peer_ip.as_bytes(),
            &mut joined,
        );
        // The values came from valid header values joined by ", ".
        let value = HeaderValue::from_bytes(&joined).unwrap_or_else(|_| peer_ip.clone());
        headers.insert(X_FORWARDED_FOR.clone(), value);
    } else {
        headers.insert(X_FORWARDED_FOR.clone(), peer_ip.clone());
    }
    if !trust_client_proto || !headers.contains_key(&X_FORWARDED_PROTO) {
        headers.insert(X_FORWARDED_PROTO.clone(), HeaderValue::from_static("http"));
    }
}

/// The app sees the host the client asked for (HTTP/2 carries it as
/// :authority, an HTTP/1 app needs Host); only a client that named none
/// (HTTP/1.0) gets the upstream's, as hyper's client would set.
pub(super) fn ensure_host(headers: &mut HeaderMap, uri: &Uri, upstream_host: &HeaderValue) {
    if !headers.contains_key(header::HOST) {
        let host = uri
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
            .unwrap_or_else(|| upstream_host.clone());
        headers.insert(header::HOST, host);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(h: &HeaderMap, name: impl header::AsHeaderName) -> Option<&str> {
        h.get(name).and_then(|v| v.to_str().ok())
    }

    #[test]
    fn hop_by_hop_headers_go_and_connection_tokens_with_them() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-secret"),
        );
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert(header::TE, HeaderValue::from_static("trailers, deflate"));
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        h.insert("x-end-to-end", HeaderValue::from_static("yes"));
        strip_hop_by_hop(&mut h, false);
        assert!(h.get("x-secret").is_none());
        assert!(h.get(header::CONNECTION).is_none());
        assert!(h.get("keep-alive").is_none());
        assert!(h.get(header::UPGRADE).is_none());
        assert_eq!(
            h.get(header::TE).map(|v| v.as_bytes()),
            Some(&b"trailers"[..])
        );
        assert!(h.get("x-end-to-end").is_some());
    }

    #[test]
    fn upgrade_handshake_survives_stripping() {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        assert!(connection_has(&h, "upgrade"));
        strip_hop_by_hop(&mut h, true);
        assert_eq!(
            h.get(header::UPGRADE).map(|v| v.as_bytes()),
            Some(&b"websocket"[..])
        );
        assert_eq!(
            h.get(header::CONNECTION).map(|v| v.as_bytes()),
            Some(&b"upgrade"[..])
        );
    }

    #[test]
    fn connection_tokens_are_case_and_space_insensitive() {
        let mut h = HeaderMap::new();
        h.append(header::CONNECTION, HeaderValue::from_static("close"));
        h.append(
            header::CONNECTION,
            HeaderValue::from_static(" X-Trace ,Keep-Alive"),
        );
        h.insert("x-trace", HeaderValue::from_static("abc"));
        h.insert("proxy-connection", HeaderValue::from_static("keep-alive"));
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        h.insert(header::EXPECT, HeaderValue::from_static("100-continue"));
        h.insert(
            header::PROXY_AUTHENTICATE,
            HeaderValue::from_static("Basic"),
        );
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        assert!(connection_has(&h, "x-trace"));
        assert!(connection_has(&h, "KEEP-ALIVE"));
        assert!(!connection_has(&h, "upgrade"));
        strip_hop_by_hop(&mut h, false);
        let left: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        assert_eq!(left, ["content-type"]);
    }

    #[test]
    fn te_without_trailers_goes_even_when_connection_lists_it() {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, HeaderValue::from_static("te"));
        h.insert(header::TE, HeaderValue::from_static("gzip"));
        strip_hop_by_hop(&mut h, false);
        assert!(h.get(header::TE).is_none());

        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, HeaderValue::from_static("te"));
        h.insert(header::TE, HeaderValue::from_static("trailers"));
        strip_hop_by_hop(&mut h, false);
        assert_eq!(
            h.get(header::TE).map(|v| v.as_bytes()),
            Some(&b"trailers"[..])
        );
    }

    #[test]
    fn forwarded_for_is_set_or_appended() {
        let peer = HeaderValue::from_static("10.0.0.7");
        let mut h = HeaderMap::new();
        add_forwarded(&mut h, &peer, false);
        assert_eq!(value(&h, "x-forwarded-for"), Some("10.0.0.7"));

        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", HeaderValue::from_static("203.0.113.1"));
        add_forwarded(&mut h, &peer, false);
        assert_eq!(value(&h, "x-forwarded-for"), Some("203.0.113.1, 10.0.0.7"));

        // Two lines are one list: joined in order, the peer last, one line.
        let mut h = HeaderMap::new();
        h.append("x-forwarded-for", HeaderValue::from_static("203.0.113.1"));
        h.append("x-forwarded-for", HeaderValue::from_static("198.51.100.2"));
        add_forwarded(&mut h, &peer, false);
        let all: Vec<_> = h.get_all("x-forwarded-for").iter().collect();
        assert_eq!(all, ["203.0.113.1, 198.51.100.2, 10.0.0.7"]);
    }

    #[test]
    fn underscore_names_are_dropped_unless_kept() {
        let mut h = HeaderMap::new();
        h.insert("content_length", HeaderValue::from_static("5"));
        h.insert("x-ok", HeaderValue::from_static("1"));
        drop_spelled_out(&mut h, true);
        assert_eq!(h.len(), 2);
        drop_spelled_out(&mut h, false);
        let left: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        assert_eq!(left, ["x-ok"]);
    }

    #[test]
    fn forwarded_proto_is_believed_only_from_trusted_hops() {
        let peer = HeaderValue::from_static("10.0.0.7");
        let claimed = || {
            let mut h = HeaderMap::new();
            h.insert("x-forwarded-proto", HeaderValue::from_static("https"));
            h
        };
        let mut h = claimed();
        add_forwarded(&mut h, &peer, false);
        assert_eq!(value(&h, "x-forwarded-proto"), Some("http"));

        let mut h = claimed();
        add_forwarded(&mut h, &peer, true);
        assert_eq!(value(&h, "x-forwarded-proto"), Some("https"));

        let mut h = HeaderMap::new();
        add_forwarded(&mut h, &peer, true);
        assert_eq!(value(&h, "x-forwarded-proto"), Some("http"));
    }

    #[test]
    fn host_comes_from_the_client_then_the_upstream() {
        let upstream = HeaderValue::from_static("127.0.0.1:8080");
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("shop.example"));
        ensure_host(&mut h, &Uri::from_static("/"), &upstream);
        assert_eq!(value(&h, header::HOST), Some("shop.example"));

        let mut h = HeaderMap::new();
        ensure_host(&mut h, &Uri::from_static("http://api.example/x"), &upstream);
        assert_eq!(value(&h, header::HOST), Some("api.example"));

        let mut h = HeaderMap::new();
        ensure_host(&mut h, &Uri::from_static("/x"), &upstream);
        assert_eq!(value(&h, header::HOST), Some("127.0.0.1:8080"));
    }

    #[test]
    fn only_allowed_upgrades_are_offered() {
        let allowed = ["websocket".to_string()];
        let mut h = HeaderMap::new();
        h.insert(
            header::UPGRADE,
            HeaderValue::from_static("h2c, WebSocket/13"),
        );
        assert!(allow_upgrade(&mut h, &allowed));
        assert_eq!(value(&h, header::UPGRADE), Some("WebSocket/13"));

        let mut h = HeaderMap::new();
        h.insert(header::UPGRADE, HeaderValue::from_static("h2c"));
        assert!(!allow_upgrade(&mut h, &allowed));
    }
}
