//! An HTTP/2 request from a client, sent to an app that speaks only
//! HTTP/1.1 (docs/http2.md): hyper writes it as HTTP/1.1 once its version,
//! target and headers are those of HTTP/1.1. The answer needs nothing: the
//! proxy answers in the client's version and HTTP/2's stream guard strips
//! the connection-specific headers an HTTP/1.1 answer carries.

use bytes::{BufMut, Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderValue};
use http::{Request, Response, StatusCode, Uri, Version};
use http_body_util::Full;

use crate::error::Error;

/// gRPC's UNAVAILABLE: what a gRPC client makes of an upstream it cannot
/// use (Envoy maps its 502 and 503 to it too).
const GRPC_UNAVAILABLE: &str = "14";

/// gRPC needs HTTP/2 end to end (trailers, full duplex streams): such a
/// request is not sent to an HTTP/1.1 app. `application/grpc`, `+proto`
/// and the like; not gRPC-Web (`application/grpc-web`), made for HTTP/1.1.
pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    headers.get(header::CONTENT_TYPE).is_some_and(|v| {
        v.as_bytes()
            .strip_prefix(b"application/grpc")
            .is_some_and(|rest| matches!(rest.first(), None | Some(b'+' | b';')))
    })
}

/// The request as HTTP/1.1: origin-form target, `Host` from `:authority`
/// (or `host` when the client gave neither), cookies joined, and no `TE`
/// (HTTP/2 allows only `TE: trailers`, which in HTTP/1.1 would have to be
/// named in `Connection`; the sidecar relays trailers either way).
pub(crate) fn to_http1<B>(req: Request<B>, host: &HeaderValue) -> Request<B> {
    let (mut parts, body) = req.into_parts();
    if !parts.headers.contains_key(header::HOST) {
        let from_authority = parts
            .uri
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok());
        parts
            .headers
            .insert(header::HOST, from_authority.unwrap_or_else(|| host.clone()));
    }
    parts.uri = parts
        .uri
        .path_and_query()
        .map_or_else(|| Uri::from_static("/"), |pq| Uri::from(pq.clone()));
    parts.version = Version::HTTP_11;
    parts.headers.remove(header::TE);
    join_cookies(&mut parts.headers);
    Request::from_parts(parts, body)
}

/// HTTP/2 may split `cookie` into one field per pair (RFC 9113 §8.2.3);
/// HTTP/1.1 wants one, joined with "; ".
fn join_cookies(headers: &mut HeaderMap) {
    let mut cookies = headers.get_all(header::COOKIE).iter();
    let (Some(first), Some(_)) = (cookies.next(), cookies.next()) else {
        return;
    };
    let mut joined = BytesMut::with_capacity(first.len() * 2);
    for (i, value) in headers.get_all(header::COOKIE).iter().enumerate() {
        if i > 0 {
            joined.put_slice(b"; ");
        }
        joined.put_slice(value.as_bytes());
    }
    // Joined valid values with "; " are a valid value.
    if let Ok(value) = HeaderValue::from_maybe_shared(joined.freeze()) {
        headers.insert(header::COOKIE, value);
    }
}

/// The sidecar's answer to a request the app cannot take in its protocol
/// ([`Error::UpstreamProtocol`]): a trailers-only gRPC error that says why.
/// The app did nothing wrong, so the caller counts no breaker failure.
pub fn protocol_mismatch_response(err: &Error) -> Option<Response<Full<Bytes>>> {
    let Error::UpstreamProtocol { reason, .. } = err else {
        return None;
    };
    let mut resp = Response::new(Full::new(Bytes::new()));
    *resp.status_mut() = StatusCode::OK;
    let headers = resp.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    headers.insert("grpc-status", HeaderValue::from_static(GRPC_UNAVAILABLE));
    // Percent-encoding (gRPC's grpc-message) leaves these characters alone.
    headers.insert("grpc-message", HeaderValue::from_static(reason));
    Some(resp)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h2_request(uri: &str, headers: &[(&str, &str)]) -> Request<()> {
        let mut req = Request::builder().uri(uri).version(Version::HTTP_2);
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        req.body(()).expect("a valid test request")
    }

    #[test]
    fn an_http2_request_becomes_an_http1_request() {
        let host = HeaderValue::from_static("127.0.0.1:8081");
        let req = h2_request(
            "http://app.test/a/b?c=d",
            &[("cookie", "a=1"), ("cookie", "b=2"), ("te", "trailers")],
        );
        let req = to_http1(req, &host);
        assert_eq!(req.version(), Version::HTTP_11);
        assert_eq!(req.uri(), "/a/b?c=d");
        assert_eq!(req.headers()[header::HOST], "app.test");
        assert_eq!(req.headers()[header::COOKIE], "a=1; b=2");
        assert_eq!(req.headers().get_all(header::COOKIE).iter().count(), 1);
        assert!(!req.headers().contains_key(header::TE));

        // A Host the client sent wins; no authority at all: the upstream's.
        let req = to_http1(h2_request("/x", &[("host", "h.test")]), &host);
        assert_eq!(req.headers()[header::HOST], "h.test");
        let req = to_http1(h2_request("/x", &[]), &host);
        assert_eq!(req.headers()[header::HOST], "127.0.0.1:8081");
        assert_eq!(req.uri(), "/x");
    }

    #[test]
    fn grpc_is_told_apart_and_answered_with_a_grpc_error() {
        let grpc = h2_request("/s/M", &[("content-type", "application/grpc+proto")]);
        assert!(is_grpc(grpc.headers()));
        let grpc = h2_request("/s/M", &[("content-type", "application/grpc")]);
        assert!(is_grpc(grpc.headers()));
        let json = h2_request("/s/M", &[("content-type", "application/json")]);
        assert!(!is_grpc(json.headers()));
        let web = h2_request("/s/M", &[("content-type", "application/grpc-web+proto")]);
        assert!(!is_grpc(web.headers()), "gRPC-Web works over HTTP/1.1");

        let err = Error::UpstreamProtocol {
            endpoint: "127.0.0.1:8081".into(),
            reason: "the app speaks HTTP/1.1 only",
        };
        let resp = protocol_mismatch_response(&err).expect("a mismatch answer");
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(resp.headers()["grpc-status"], "14");
        assert!(
            protocol_mismatch_response(&Error::Unsupported("x".into())).is_none(),
            "other errors are not mismatches"
        );
    }
}
