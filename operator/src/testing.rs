//! What the unit tests that script the API server share: a client whose
//! API server is a `tower_test` mock, and the script's moves. Every wait
//! is bounded (one second for an answer, 100 ms to show that no further
//! call comes), so a missing or an extra API call fails the test instead
//! of hanging it.

use std::future::Future;
use std::time::Duration;

use http::{Request, Response};
use kube::Client;
use kube::client::Body;
use serde_json::Value;

pub type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

/// `check` takes `min` and `max` and refuses a millisecond past either.
pub fn assert_bounded<T, E>(
    check: impl Fn(Duration) -> Result<T, E>,
    min: Duration,
    max: Duration,
) {
    let step = Duration::from_millis(1);
    assert!(check(min).is_ok(), "{min:?}");
    assert!(check(max).is_ok(), "{max:?}");
    assert!(check(min - step).is_err(), "below {min:?}");
    assert!(check(max + step).is_err(), "above {max:?}");
}

/// An object from inline YAML (a test fixture: a typo fails the test).
pub fn yaml<T: serde::de::DeserializeOwned>(text: &str) -> T {
    serde_norway::from_str(text).expect("a fixture that parses")
}

/// A client (default namespace `shop`) and the handle that answers for its
/// API server.
pub fn mock() -> (Client, Handle) {
    let (svc, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    (Client::new(svc, "shop"), handle)
}

/// A request the script saw.
#[derive(Debug)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub query: String,
    pub content_type: String,
    /// The JSON body (`Null` when there is none).
    pub body: Value,
}

impl Seen {
    /// `(method, path)`, for one assertion.
    pub fn call(&self) -> (&str, &str) {
        (&self.method, &self.path)
    }
}

/// Answers the next request with `status` and `answer`, whatever it is;
/// returns what it was.
pub async fn answer_with(api: &mut Handle, status: u16, answer: &Value) -> Seen {
    reply(api, status, |_, _| answer.clone()).await
}

/// Answers the next request with what `pick` returns for its path and
/// body (an echo, the object the path names).
pub async fn reply(
    api: &mut Handle,
    status: u16,
    pick: impl FnOnce(&str, &Value) -> Value,
) -> Seen {
    let (req, send) = api.next_request().await.expect("a request");
    let content_type = req
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let (method, path) = (req.method().to_string(), req.uri().path().to_string());
    let query = req.uri().query().unwrap_or_default().to_string();
    let body = req.into_body().collect_bytes().await.expect("body");
    let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let answer = serde_json::to_vec(&pick(&path, &body)).expect("json");
    send.send_response(
        Response::builder()
            .status(status)
            .body(Body::from(answer))
            .expect("response"),
    );
    Seen {
        method,
        path,
        query,
        content_type,
        body,
    }
}

/// [`answer_with`] 200.
pub async fn answer(api: &mut Handle, answer: &Value) -> Seen {
    answer_with(api, 200, answer).await
}

/// No further request comes.
pub async fn no_more(api: &mut Handle) {
    assert!(
        tokio::time::timeout(Duration::from_millis(100), api.next_request())
            .await
            .is_err(),
        "an unexpected API call"
    );
}

/// Runs `call` while `script` answers for the API server: each gets one
/// second, so a missing answer or a script left waiting fails the test.
/// The script's own assertions fail the test too.
pub async fn scripted<T>(
    script: impl Future<Output = ()> + Send + 'static,
    call: impl Future<Output = T>,
) -> T {
    let server = tokio::spawn(script);
    let out = tokio::time::timeout(Duration::from_secs(1), call)
        .await
        .expect("no missing answer");
    tokio::time::timeout(Duration::from_secs(1), server)
        .await
        .expect("script done")
        .expect("script passed");
    out
}
