//! The answers the proxy makes itself, the same on the hyper path
//! (handler.rs) and the HTTP/1.1 fast path (h1/exchange.rs).

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::Full;

use crate::metrics::{ClientError, ClientTimeout, Metrics};
use crate::upstream::BodyFault;

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
