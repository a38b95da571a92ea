//! Against a server we did not write: the h2 crate's server answers
//! [`Connection`] over an in-memory pipe.

use std::future::poll_fn;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request};
use http_body_util::BodyExt;

use super::super::ErrorCode;
use super::{ClientSettings, Connection, SendRequest};

const T: Duration = Duration::from_secs(30);

/// The h2 crate's server: echoes the body and trailers back;
/// `x-refuse` resets the stream with REFUSED_STREAM unanswered.
async fn h2_echo(io: tokio::io::DuplexStream) {
    let Ok(mut conn) = h2::server::Builder::new()
        .max_concurrent_streams(64)
        .initial_window_size(64 << 10)
        .handshake::<_, Bytes>(io)
        .await
    else {
        return;
    };
    while let Some(Ok((req, mut respond))) = conn.accept().await {
        tokio::spawn(async move {
            if req.headers().contains_key("x-refuse") {
                respond.send_reset(h2::Reason::REFUSED_STREAM);
                return;
            }
            let mut body = req.into_body();
            let Ok(mut send) = respond.send_response(http::Response::new(()), false) else {
                return;
            };
            while let Some(Ok(chunk)) = body.data().await {
                let _ = body.flow_control().release_capacity(chunk.len());
                send.reserve_capacity(chunk.len());
                if send.send_data(chunk, false).is_err() {
                    return;
                }
            }
            let trailers = body.trailers().await.ok().flatten().unwrap_or_default();
            let _ = send.send_trailers(trailers);
        });
    }
}

fn start() -> SendRequest {
    let (a, b) = tokio::io::duplex(64 << 10);
    tokio::spawn(h2_echo(b));
    let (mut conn, send) = Connection::new(a, ClientSettings::default());
    tokio::spawn(async move { poll_fn(|cx| conn.poll(cx)).await });
    send
}

fn request(extra: Option<(&'static str, &'static str)>) -> Request<()> {
    let mut req = Request::post("http://app.test/echo")
        .body(())
        .expect("request");
    if let Some((k, v)) = extra {
        req.headers_mut()
            .insert(k, http::HeaderValue::from_static(v));
    }
    req
}

/// Sends `len` bytes in 16 KiB pieces, waiting while the stream holds a
/// frame's worth unsent, then trailers; returns what came back.
async fn round_trip(mut send: SendRequest, len: usize, tag: u8) -> (Bytes, HeaderMap) {
    poll_fn(|cx| send.poll_ready(cx)).await.expect("slot");
    let (resp, body) = send.send_request(&request(None), false).expect("send");
    let mut body = body.expect("body handle");
    let data = Bytes::from(vec![tag; len]);
    let mut rest = data.clone();
    let reader = tokio::spawn(async move {
        let resp = resp.await.expect("answer");
        assert_eq!(resp.status(), 200);
        let got = resp.into_body().collect().await.expect("body");
        let trailers = got.trailers().cloned().unwrap_or_default();
        (got.to_bytes(), trailers)
    });
    while !rest.is_empty() {
        poll_fn(|cx| body.poll_writable(cx))
            .await
            .expect("writable");
        let chunk = rest.split_to(rest.len().min(16 << 10));
        body.send_data(chunk, false).expect("data");
    }
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", http::HeaderValue::from(u32::from(tag)));
    body.send_trailers(trailers).expect("trailers");
    let (got, trailers) = reader.await.expect("reader");
    assert_eq!(got, data, "echoed body of stream tagged {tag}");
    (got, trailers)
}

/// 40 streams at once, stream `i` sending `base + i * step` bytes and
/// trailers `grpc-status: i`, each checked in its echo.
async fn concurrent_round_trips(send: SendRequest, base: usize, step: usize) {
    let tasks: Vec<_> = (0..40u8)
        .map(|i| tokio::spawn(round_trip(send.clone(), base + usize::from(i) * step, i)))
        .collect();
    for (i, t) in tasks.into_iter().enumerate() {
        let (_, trailers) = tokio::time::timeout(T, t)
            .await
            .expect("in time")
            .expect("task");
        assert_eq!(
            trailers.get("grpc-status").map(|v| v.as_bytes().to_vec()),
            Some(i.to_string().into_bytes())
        );
    }
}

#[tokio::test]
async fn many_streams_with_big_bodies_and_trailers_against_the_h2_server() {
    let send = start();
    // Bodies past every window: the stream's (64 KiB on the h2 side,
    // 256 KiB on ours) and the connection's.
    concurrent_round_trips(send, 100_000, 7_919).await;
}

#[tokio::test]
async fn a_request_without_body_gets_its_answer() {
    let mut send = start();
    poll_fn(|cx| send.poll_ready(cx)).await.expect("slot");
    let (resp, body) = send
        .send_request(
            &Request::get("http://app.test/").body(()).expect("req"),
            true,
        )
        .expect("send");
    assert!(body.is_none());
    let resp = tokio::time::timeout(T, resp)
        .await
        .expect("in time")
        .expect("answer");
    let got = resp.into_body().collect().await.expect("body");
    assert!(got.to_bytes().is_empty());
}

#[tokio::test]
async fn refused_stream_from_the_h2_server_is_never_processed() {
    let mut send = start();
    poll_fn(|cx| send.poll_ready(cx)).await.expect("slot");
    let (resp, _body) = send
        .send_request(&request(Some(("x-refuse", "1"))), true)
        .expect("send");
    let err = super::tests::failure(resp).await;
    assert!(err.never_processed(), "{err}");
    assert_eq!(err.code(), Some(ErrorCode::REFUSED_STREAM));
    // The connection still serves.
    let (got, _) = round_trip(send.clone(), 10, 7).await;
    assert_eq!(got.len(), 10);
}

#[tokio::test]
async fn pings_are_answered_by_the_h2_server() {
    let send = start();
    assert!(send.send_ping());
    let pong = tokio::time::timeout(T, poll_fn(|cx| send.poll_pong(cx))).await;
    assert_eq!(pong.ok(), Some(true));
}

/// hyper's HTTP/2 server: echoes the body and trailers back (the body is
/// streamed through as it comes).
fn start_hyper() -> SendRequest {
    let (a, b) = tokio::io::duplex(64 << 10);
    tokio::spawn(async move {
        let service =
            hyper::service::service_fn(|req: Request<hyper::body::Incoming>| async move {
                Ok::<_, std::convert::Infallible>(http::Response::new(req.into_body()))
            });
        let _ = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
            .serve_connection(hyper_util::rt::TokioIo::new(b), service)
            .await;
    });
    let (mut conn, send) = Connection::new(a, ClientSettings::default());
    tokio::spawn(async move { poll_fn(|cx| conn.poll(cx)).await });
    send
}

#[tokio::test]
async fn many_streams_with_big_bodies_and_trailers_against_hyper() {
    concurrent_round_trips(start_hyper(), 150_000, 3_331).await;
}

/// The h2 server's graceful shutdown (GOAWAY 2^31-1, PING, GOAWAY with
/// the last stream): the streams it took finish, the connection then
/// ends cleanly and opens nothing more.
#[tokio::test]
async fn the_h2_servers_graceful_shutdown_lets_open_streams_finish() {
    let (a, b) = tokio::io::duplex(64 << 10);
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let Ok(mut conn) = h2::server::Builder::new().handshake::<_, Bytes>(b).await else {
            return;
        };
        let Some(Ok((_req, mut respond))) = conn.accept().await else {
            return;
        };
        conn.graceful_shutdown();
        let answer = async move {
            let _ = rx.await;
            let _ = respond.send_response(http::Response::new(()), true);
        };
        tokio::spawn(answer);
        while let Some(Ok(_)) = conn.accept().await {}
    });
    let (mut conn, mut send) = Connection::new(a, ClientSettings::default());
    let task = tokio::spawn(async move { poll_fn(|cx| conn.poll(cx)).await });
    poll_fn(|cx| send.poll_ready(cx)).await.expect("slot");
    let (resp, _) = send.send_request(&request(None), true).expect("send");
    // Once the final GOAWAY came, no stream opens.
    tokio::time::timeout(T, async {
        while poll_fn(|cx| send.poll_ready(cx)).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("GOAWAY in time");
    let _ = tx.send(());
    super::tests::last_answer_then_clean_end(resp, 200, task).await;
}

/// For an informal instruction count, not a test: `KG_LOOP_CLIENT=own`
/// (this client) or `h2` (the h2 crate's) sends `KG_LOOP_N` unary
/// requests, one at a time, to this crate's server in the same process;
/// run under callgrind and compare the totals (the server's share is the
/// same in both).
#[tokio::test]
#[ignore]
async fn callgrind_unary_loop() {
    let n: usize = std::env::var("KG_LOOP_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let own = std::env::var("KG_LOOP_CLIENT").as_deref() != Ok("h2");
    let (a, b) = tokio::io::duplex(64 << 10);
    tokio::spawn(async move {
        use super::super::server;
        let mut conn = server::Connection::new(b, server::ServerSettings::default());
        while let Some(Ok((req, mut respond))) = poll_fn(|cx| conn.poll_accept(cx)).await {
            tokio::spawn(async move {
                let Ok(body) = req.into_body().collect().await else {
                    return;
                };
                let Ok(mut send) = respond.send_response(http::Response::new(()), false) else {
                    return;
                };
                let _ = send.send_data(body.to_bytes(), false);
                let mut t = HeaderMap::new();
                t.insert("grpc-status", http::HeaderValue::from_static("0"));
                let _ = send.send_trailers(t);
            });
        }
    });
    let payload = Bytes::from_static(&[7u8; 100]);
    if own {
        let (mut conn, mut send) = Connection::new(a, ClientSettings::default());
        tokio::spawn(async move { poll_fn(|cx| conn.poll(cx)).await });
        for _ in 0..n {
            poll_fn(|cx| send.poll_ready(cx)).await.expect("slot");
            let (resp, body) = send.send_request(&request(None), false).expect("send");
            body.expect("body")
                .send_data(payload.clone(), true)
                .expect("data");
            let got = resp.await.expect("answer").into_body().collect().await;
            assert_eq!(got.expect("body").to_bytes().len(), 100);
        }
    } else {
        let (mut send, conn) = h2::client::handshake(a).await.expect("handshake");
        tokio::spawn(conn);
        for _ in 0..n {
            send = send.ready().await.expect("ready");
            let (resp, mut body) = send.send_request(request(None), false).expect("send");
            body.send_data(payload.clone(), true).expect("data");
            let mut got = resp.await.expect("answer").into_body();
            let mut len = 0;
            while let Some(chunk) = got.data().await {
                let chunk = chunk.expect("chunk");
                let _ = got.flow_control().release_capacity(chunk.len());
                len += chunk.len();
            }
            let _ = got.trailers().await;
            assert_eq!(len, 100);
        }
    }
}
