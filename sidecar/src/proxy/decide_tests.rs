//! The decision step on its own (each outcome, at the body limit and past
//! it), and one differential test: the same raw requests parsed by the fast
//! path's head parser and by hyper's server reach the same route.

use std::time::Duration;

use bytes::Bytes;
use http::{Method, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::io::AsyncWriteExt;

use super::*;
use crate::circuit::RouteTable;
use crate::cli::config_from_yaml;
use crate::proxy::h1::head::{Parsed, Rewrite, parse_request};

fn table(yaml: &str) -> RouteTable {
    let config = config_from_yaml(yaml).expect("valid config");
    RouteTable::new(&config.routes)
}

const ROUTES: &str = r#"
routes:
  - name: api-host
    match: {host: api.example}
  - name: wild
    match: {host: "*.wild.example", pathPrefix: /w}
  - name: lim
    match: {pathPrefix: /lim}
    circuitBreaker: {maxConcurrent: 1, maxQueue: 0}
    fallback: {status: 503, contentType: application/json, body: '{"busy":true}'}
  - name: writes
    match: {methods: [POST]}
"#;

/// Routes that never look at the host.
const NO_HOSTS: &str = r#"
routes:
  - name: lim
    match: {pathPrefix: /lim}
"#;

fn name(route: &Route) -> &str {
    route.name()
}

#[test]
fn the_route_is_chosen_by_method_host_and_path() {
    let t = table(ROUTES);
    let pick = |method: &Method, host: Option<&[u8]>, authority, path| {
        name(&route(&t, method, host, authority, path)).to_string()
    };
    assert_eq!(
        pick(&Method::GET, Some(b"api.example"), None, "/x"),
        "api-host"
    );
    assert_eq!(
        pick(&Method::GET, Some(b"API.example:80"), None, "/x"),
        "api-host"
    );
    assert_eq!(
        pick(&Method::GET, Some(b"a.wild.example"), None, "/w/1"),
        "wild"
    );
    assert_eq!(pick(&Method::GET, None, None, "/lim/x"), "lim");
    assert_eq!(pick(&Method::POST, None, None, "/x"), "writes");
    let default = pick(&Method::GET, None, None, "/x");
    assert!(!["api-host", "wild", "lim", "writes"].contains(&default.as_str()));
}

#[test]
fn the_host_is_text_by_one_rule_and_else_no_host() {
    let t = table(ROUTES);
    let pick = |host: Option<&[u8]>, authority| {
        name(&route(&t, &Method::GET, host, authority, "/x")).to_string()
    };
    // Tab and visible ASCII are text (HeaderValue::to_str's rule) ...
    assert_eq!(host_text(b"api.example\t"), Some("api.example\t"));
    // ... a byte past ASCII or a control byte is not, and matches as no host.
    assert_eq!(host_text("api.example\u{e9}".as_bytes()), None);
    assert_eq!(host_text(b"api.example\x01"), None);
    assert_ne!(pick(Some(b"api.example\x7f"), None), "api-host");
    // With no `Host` as text, an absolute-form target's authority counts.
    assert_eq!(pick(None, Some("api.example")), "api-host");
    assert_eq!(pick(Some(b"\x01"), Some("api.example")), "api-host");
    // A `Host` that is text wins over the authority.
    assert_ne!(
        pick(Some(b"other.example"), Some("api.example")),
        "api-host"
    );
}

#[test]
fn a_table_without_host_rules_never_reads_the_host() {
    let t = table(NO_HOSTS);
    assert!(!t.matches_hosts());
    let r = route(&t, &Method::GET, Some(b"\xff"), None, "/lim/1");
    assert_eq!(name(&r), "lim");
}

#[test]
fn the_declared_length_is_read_from_content_length() {
    let mut headers = HeaderMap::new();
    assert_eq!(declared_length(&headers), None);
    headers.insert(header::CONTENT_LENGTH, "12".parse().expect("a value"));
    assert_eq!(declared_length(&headers), Some(12));
    headers.insert(header::CONTENT_LENGTH, "x".parse().expect("a value"));
    assert_eq!(declared_length(&headers), None);
}

#[tokio::test]
async fn a_body_at_the_limit_is_admitted_and_one_past_it_gets_413() {
    let t = table(ROUTES);
    let metrics = Metrics::default();
    let r = route(&t, &Method::POST, None, None, "/lim/x");
    let at = admit(&r, Some(100), 100, &metrics).await;
    let permit = at.expect("a body at the limit is admitted");
    drop(permit);
    let past = admit(&r, Some(101), 100, &metrics).await.err();
    assert_eq!(past, Some(Refused::TooLarge));
    // Refused before the circuit: no slot was taken, none is held.
    assert_eq!(r.inflight(), 0);
    let answer = Refused::TooLarge.answer(&r);
    assert_eq!(answer.response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert!(answer.close, "the unread body cannot frame a next request");
    // Zero is no limit; no declared length is nothing to refuse.
    assert!(admit(&r, Some(u64::MAX), 0, &metrics).await.is_ok());
    assert!(admit(&r, None, 1, &metrics).await.is_ok());
}

/// The `lim` route (one slot, no queue) with its only slot taken by a GET:
/// the circuit would reject the next request.
async fn lim_with_its_slot_taken(metrics: &Metrics) -> (Arc<Route>, Permit) {
    let r = route(&table(ROUTES), &Method::GET, None, None, "/lim");
    let held = admit(&r, None, 0, metrics).await.expect("the only slot");
    (r, held)
}

#[tokio::test]
async fn an_oversized_body_is_refused_even_when_the_circuit_would_reject() {
    let metrics = Metrics::default();
    let (r, _held) = lim_with_its_slot_taken(&metrics).await;
    let refused = admit(&r, Some(2), 1, &metrics).await.err();
    assert_eq!(refused, Some(Refused::TooLarge), "413 comes first");
}

#[tokio::test]
async fn a_circuit_rejection_is_answered_with_the_routes_fallback() {
    let metrics = Metrics::default();
    let (r, held) = lim_with_its_slot_taken(&metrics).await;
    let refused = admit(&r, None, 0, &metrics).await.err();
    assert_eq!(refused, Some(Refused::Circuit(Rejection::QueueFull)));
    let answer = refused.expect("refused").answer(&r);
    assert_eq!(answer.response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(!answer.close, "a rejection alone keeps the connection");
    let body = answer.response.into_body().collect().await;
    let body = body.expect("a full body").to_bytes();
    assert_eq!(&body[..], br#"{"busy":true}"#);
    drop(held);
    assert!(admit(&r, None, 0, &metrics).await.is_ok(), "slot back");
}

/// What a path gives the decision for a request: the route it leads to
/// and the body length it declares (the 413's input; none counts as 0,
/// as [`admit`] reads it).
type Inputs = (String, u64);

/// The decision's inputs from the fast path's parser for `raw`; `None`:
/// not this path's head (hyper's, or refused).
fn fast_route(t: &RouteTable, raw: &[u8]) -> Option<Inputs> {
    let rewrite = Rewrite {
        peer_ip: b"10.0.0.7",
        trust_proto: false,
        keep_underscores: false,
    };
    let mut out = Vec::new();
    let Parsed::Done(head) = parse_request(raw, 100, 64 * 1024, &rewrite, &mut out) else {
        return None;
    };
    let method = Method::from_bytes(head.method.as_bytes()).ok()?;
    let declared = match head.framing {
        super::super::h1::head::Framing::Length(n) => Some(n),
        _ => None,
    };
    let chosen = name(&route(t, &method, head.host, None, &head.path)).to_string();
    Some((chosen, declared.unwrap_or(0)))
}

/// The decision's inputs from the hyper path for `raw`: hyper's server
/// parses it, the handler's normalization, [`route_of`] and
/// [`declared_length`] read it.
async fn hyper_route(t: Arc<RouteTable>, raw: &'static [u8]) -> Option<Inputs> {
    let (client, server) = tokio::io::duplex(64 * 1024);
    let (tx, rx) = tokio::sync::oneshot::channel();
    let tx = std::sync::Mutex::new(Some(tx));
    let service = service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
        let chosen = match super::super::handler::normalized_uri(req.uri()) {
            Ok(Some(uri)) => {
                *req.uri_mut() = uri;
                Some(name(&route_of(&t, &req)).to_string())
            }
            Ok(None) => Some(name(&route_of(&t, &req)).to_string()),
            Err(()) => None,
        }
        .map(|chosen| (chosen, declared_length(req.headers()).unwrap_or(0)));
        if let Some(tx) = tx.lock().ok().and_then(|mut tx| tx.take()) {
            let _ = tx.send(chosen);
        }
        async { Ok::<_, http::Error>(hyper::Response::new(Full::new(Bytes::new()))) }
    });
    tokio::spawn(
        hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(server), service),
    );
    let (_read, mut write) = tokio::io::split(client);
    write.write_all(raw).await.ok()?;
    tokio::time::timeout(Duration::from_secs(5), rx)
        .await
        .ok()?
        .ok()?
}

#[tokio::test]
async fn both_paths_give_the_decision_the_same_inputs() {
    let t = Arc::new(table(ROUTES));
    let cases: [&'static [u8]; 13] = [
        b"GET /x HTTP/1.1\r\nhost: api.example\r\n\r\n",
        b"GET /x HTTP/1.1\r\nhost: API.EXAMPLE:8080\r\n\r\n",
        b"GET /w/1 HTTP/1.1\r\nhost: a.wild.example\r\n\r\n",
        b"GET /%6cim/x HTTP/1.1\r\nhost: x\r\n\r\n",
        b"GET //lim/x HTTP/1.1\r\nhost: x\r\n\r\n",
        b"GET /x/../lim/x?q=/w HTTP/1.1\r\nhost: x\r\n\r\n",
        b"GET /./w/a HTTP/1.1\r\nhost: b.wild.example\r\n\r\n",
        b"POST /x HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n",
        b"GET /x HTTP/1.1\r\nhost: api.example\xe9\r\n\r\n",
        b"GET /lim HTTP/1.1\r\n\r\n",
        b"POST /lim HTTP/1.1\r\nhost: x\r\ncontent-length: 12\r\n\r\n",
        b"POST /lim HTTP/1.1\r\nhost: x\r\ncontent-length: 0012\r\n\r\n",
        b"POST /lim HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n",
    ];
    for raw in cases {
        let fast = fast_route(&t, raw);
        let hyper = hyper_route(t.clone(), raw).await;
        let shown = String::from_utf8_lossy(raw);
        assert!(fast.is_some(), "the fast path serves {shown:?}");
        assert_eq!(fast, hyper, "{shown:?}");
    }
}
