//! The answers the proxy makes itself, the same on the hyper path
//! (handler.rs) and the HTTP/1.1 fast path (h1/exchange.rs).

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::Full;

use crate::metrics::{ClientError, ClientTimeout, Metrics};
use crate::upstream::BodyFault;

/// How an answer the proxy makes itself is framed on HTTP/1 (RFC 9112
/// §6.3): hyper's server frames the hyper path's this way, and the fast
/// path asks here, so both send the same bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LocalFraming {
    /// `Content-Length` and the body.
    Body,
    /// `Content-Length` of the body a GET would get, and no body: the
    /// answer to a `HEAD` (RFC 9110 §9.3.2).
    HeadersOnly,
    /// Neither length nor body: 204 and 304 (RFC 9110 §15.3.5, §15.4.5).
    /// A 204 with a `Content-Length` is malformed (RFC 9110 §8.6).
    Bare,
    /// An informational status is never a final answer: a client would
    /// wait for the real one. Sent as a bare 502 and the connection
    /// closes (none is built today: fallbacks are 200-599, config.rs).
    Refused,
}

impl LocalFraming {
    pub(super) fn of(status: StatusCode, head_request: bool) -> LocalFraming {
        if status.is_informational() {
            LocalFraming::Refused
        } else if status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
            LocalFraming::Bare
        } else if head_request {
            LocalFraming::HeadersOnly
        } else {
            LocalFraming::Body
        }
    }
}

/// A short plain-text answer.
pub(super) fn local_response(status: StatusCode, text: &'static str) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from_static(text.as_bytes())));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

/// The answer to a request body that failed on the client's side, counted
/// as the client's: never an upstream error, never a breaker failure.
pub(super) fn client_fault_response(metrics: &Metrics, fault: BodyFault) -> Response<Full<Bytes>> {
    let (status, text) = match fault {
        BodyFault::TooLarge => {
            metrics.body_too_large();
            (StatusCode::PAYLOAD_TOO_LARGE, "request body too large\n")
        }
        BodyFault::Timeout => {
            metrics.client_timeout(ClientTimeout::BodyRead);
            (
                StatusCode::REQUEST_TIMEOUT,
                "request body not received in time\n",
            )
        }
        BodyFault::BadBody => {
            metrics.client_error(ClientError::BadBody);
            (StatusCode::BAD_REQUEST, "malformed request body\n")
        }
        BodyFault::Gone => {
            metrics.client_error(ClientError::Gone);
            (StatusCode::BAD_REQUEST, "request body incomplete\n")
        }
    };
    local_response(status, text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_answers_carry_a_body_only_where_http_allows_one() {
        let of = LocalFraming::of;
        assert_eq!(of(StatusCode::GATEWAY_TIMEOUT, false), LocalFraming::Body);
        assert_eq!(
            of(StatusCode::GATEWAY_TIMEOUT, true),
            LocalFraming::HeadersOnly
        );
        for head in [false, true] {
            assert_eq!(of(StatusCode::NO_CONTENT, head), LocalFraming::Bare);
            assert_eq!(of(StatusCode::NOT_MODIFIED, head), LocalFraming::Bare);
            assert_eq!(of(StatusCode::CONTINUE, head), LocalFraming::Refused);
            assert_eq!(of(StatusCode::EARLY_HINTS, head), LocalFraming::Refused);
        }
        assert_eq!(of(StatusCode::OK, false), LocalFraming::Body);
        assert_eq!(
            of(StatusCode::RESET_CONTENT, true),
            LocalFraming::HeadersOnly
        );
    }
}
