//! The answer of `bench-null-webhook`, the baseline webhook of
//! `make bench-scale`: every review allowed, unchanged, with its uid.

use bytes::Bytes;
use hyper::StatusCode;
use serde_json::{Value, json};

/// The answer to an AdmissionReview body: allowed with the request's uid,
/// or 400 and why for a body that is not a review with a uid.
pub fn answer(body: &[u8]) -> (StatusCode, Bytes) {
    let uid = serde_json::from_slice::<Value>(body).ok().and_then(|v| {
        v.pointer("/request/uid")
            .and_then(Value::as_str)
            .map(str::to_owned)
    });
    match uid {
        Some(uid) => {
            let review = json!({
                "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "response": {"uid": uid, "allowed": true}
            });
            (StatusCode::OK, Bytes::from(review.to_string()))
        }
        None => (
            StatusCode::BAD_REQUEST,
            Bytes::from_static(b"not an AdmissionReview with request.uid"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_review_is_allowed_with_its_uid_and_anything_else_is_a_400() {
        let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                            "request": {"uid": "u-1", "object": {"kind": "Pod"}}});
        let (status, body) = answer(review.to_string().as_bytes());
        assert_eq!(status, StatusCode::OK);
        let v: Value = serde_json::from_slice(&body).expect("json");
        assert_eq!(v["response"]["uid"], "u-1");
        assert_eq!(v["response"]["allowed"], true);
        assert!(v["response"].get("patch").is_none());
        for bad in [&b"{"[..], b"{}", br#"{"request": {"uid": 7}}"#] {
            assert_eq!(answer(bad).0, StatusCode::BAD_REQUEST);
        }
    }
}
