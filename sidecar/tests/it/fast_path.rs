//! The HTTP/1.1 fast path (src/proxy/h1) against hyper's path: the same
//! requests through both give the app the same requests and the client
//! the same answers; the fast path pools its app connections and refuses
//! what could smuggle a request. The app is [`WireApp`]: it records the
//! bytes it receives, which a hyper app would normalize away.

use anyhow::{Context, Result, ensure};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::kit::sidecar::{InProcess, SidecarSpec};
use crate::kit::wire::{WireApp, exchange, header, normalize, normalize_raw, read_answer};

const REQUESTS: &[&str] = &[
    "GET /plain?q=1 HTTP/1.1\r\nHost: shop\r\nAccept: */*\r\nConnection: close, X-Secret\r\nX-Secret: 1\r\nKeep-Alive: timeout=5\r\n\r\n",
    "GET /xff HTTP/1.1\r\nHost: shop\r\nX-Forwarded-For: 203.0.113.9\r\nX-Forwarded-Proto: https\r\nTE: trailers\r\nConnection: close\r\n\r\n",
    "POST /echo HTTP/1.1\r\nHost: shop\r\nContent-Length: 11\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\nhello world",
    "POST /echo HTTP/1.1\r\nHost: shop\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\n\r\n",
    "GET /chunked HTTP/1.1\r\nHost: shop\r\nConnection: close\r\n\r\n",
    "GET /close HTTP/1.1\r\nHost: shop\r\nConnection: close\r\n\r\n",
    "HEAD /plain HTTP/1.1\r\nHost: shop\r\nConnection: close\r\n\r\n",
    "DELETE /plain HTTP/1.1\r\nConnection: close\r\n\r\n",
    // Header rules (proxy/rules.rs): a forwarding header `Connection` lists
    // is the client's to lose, several X-Forwarded-For lines become one,
    // underscore names never reach the app.
    "GET /plain HTTP/1.1\r\nHost: shop\r\nX-Forwarded-For: 203.0.113.9\r\nX-Forwarded-Proto: https\r\nConnection: close, X-Forwarded-For, X-Forwarded-Proto\r\n\r\n",
    "GET /plain HTTP/1.1\r\nHost: shop\r\nX-Forwarded-For: 203.0.113.9\r\nAccept: */*\r\nX-Forwarded-For: 198.51.100.1, 192.0.2.1\r\nConnection: close\r\n\r\n",
    "POST /echo HTTP/1.1\r\nHost: shop\r\nContent-Length: 5\r\nContent_Length: 0\r\nTransfer_Encoding: chunked\r\nX_Real_IP: 1.2.3.4\r\nConnection: close\r\n\r\nhello",
    // Paths (proxy/path.rs): the app gets the normalized one.
    "GET /%6cim/./x//y/../z?q=%2F HTTP/1.1\r\nHost: shop\r\nConnection: close\r\n\r\n",
];

/// A sidecar in front of a fresh [`WireApp`], with `args`.
async fn proxied_wire_app(args: &[&str]) -> Result<(WireApp, InProcess)> {
    let app = WireApp::start().await?;
    let sidecar = InProcess::start(SidecarSpec::new(app.addr).args(args)).await?;
    Ok((app, sidecar))
}

#[tokio::test]
async fn the_fast_path_and_hyper_give_the_same_bytes_to_the_app_and_the_same_answers() -> Result<()>
{
    let mut runs = Vec::new();
    for args in [
        &["--http1-fast-path", "true"][..],
        &["--http1-fast-path", "false"][..],
    ] {
        let (app, sidecar) = proxied_wire_app(args).await?;
        let mut answers = Vec::new();
        for request in REQUESTS {
            let (head, body) = exchange(sidecar.listen, request.as_bytes()).await?;
            answers.push(normalize(&head, &body));
        }
        let seen: Vec<String> = app
            .seen()
            .iter()
            // The two runs have two apps: their address is not a difference.
            .map(|raw| normalize_raw(raw).replace(&app.addr.to_string(), "APP"))
            .collect();
        runs.push((answers, seen));
    }
    let (fast, hyper) = (&runs[0], &runs[1]);
    for seen in fast.1.iter().chain(&hyper.1) {
        ensure!(
            !seen.contains("content_length") && !seen.contains("x_real_ip"),
            "an underscore header reached the app: {seen}"
        );
    }
    for (i, request) in REQUESTS.iter().enumerate() {
        ensure!(
            fast.0[i] == hyper.0[i],
            "answers differ for {request:?}:\nfast: {}\nhyper: {}",
            fast.0[i],
            hyper.0[i]
        );
        ensure!(
            fast.1[i] == hyper.1[i],
            "the app saw different requests for {request:?}:\nfast: {}\nhyper: {}",
            fast.1[i],
            hyper.1[i]
        );
    }
    Ok(())
}

#[tokio::test]
async fn keep_alive_requests_share_one_pooled_app_connection() -> Result<()> {
    let (app, sidecar) = proxied_wire_app(&[]).await?;
    let mut tcp = BufReader::new(TcpStream::connect(sidecar.listen).await?);
    for i in 0..20 {
        let body = format!("request {i}");
        let req = format!(
            "POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        tcp.get_mut().write_all(req.as_bytes()).await?;
        let (head, answer) = read_answer(&mut tcp, false).await?;
        let head = String::from_utf8_lossy(&head);
        ensure!(head.starts_with("HTTP/1.1 200"), "{head}");
        ensure!(
            header(&head, "x-hop").is_none(),
            "a Connection-listed header passed: {head}"
        );
        ensure!(answer == body.as_bytes(), "answer {i}: {answer:?}");
    }
    // Pipelined: two requests in one write, answered in order.
    tcp.get_mut()
        .write_all(b"GET /one HTTP/1.1\r\nHost: a\r\n\r\nPOST /two HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\ntwo")
        .await?;
    for want in [&b""[..], b"two"] {
        let (_, answer) = read_answer(&mut tcp, false).await?;
        ensure!(answer == want, "pipelined answer {answer:?}");
    }
    // The /ready probes open connections without a request; requests use one.
    let with_requests = app.seen().len();
    ensure!(with_requests == 22, "the app saw {with_requests} requests");
    ensure!(
        app.accepted() <= 3,
        "{} app connections for 22 sequential requests",
        app.accepted()
    );
    Ok(())
}

#[tokio::test]
async fn smuggling_shapes_are_refused_before_the_app_sees_them() -> Result<()> {
    let (app, sidecar) = proxied_wire_app(&[]).await?;
    let bad: &[&[u8]] = &[
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5, 5\r\n\r\nhello",
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -5\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a\r\nX-A: 1\r\n folded: x\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a\r\nX-Bad\x01: 1\r\n\r\n",
    ];
    for request in bad {
        let (head, _) = exchange(sidecar.listen, request).await?;
        let head = String::from_utf8_lossy(&head);
        ensure!(
            head.starts_with("HTTP/1.1 400"),
            "{:?} got {head}",
            String::from_utf8_lossy(request)
        );
    }
    let seen = app.seen().len();
    ensure!(seen == 0, "the app saw {seen} refused requests");
    // Chunk framing the app would read differently: 400, the app gets no
    // complete request out of it.
    let (head, _) = exchange(
        sidecar.listen,
        b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\nhello\r\n0\r\n\r\n",
    )
    .await
    .context("the bad chunk framing's answer")?;
    ensure!(String::from_utf8_lossy(&head).starts_with("HTTP/1.1 400"));
    Ok(())
}

/// A `Connection: close` answer goes out held back and leaves with the
/// FIN (src/proxy/conn.rs, `Downstream::poll_write_last`): whether it fits
/// in one write or is relayed in many, the client reads all of it and then
/// a clean end of stream, not a reset and not a wait.
#[tokio::test]
async fn a_closing_answer_arrives_whole_and_then_the_end_of_stream() -> Result<()> {
    use tokio::io::AsyncReadExt;
    let (_app, sidecar) = proxied_wire_app(&[]).await?;
    for size in [5usize, 64, 300 * 1024] {
        let body: Vec<u8> = (0..size).map(|i| b'a' + (i % 26) as u8).collect();
        let mut req = format!(
            "POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: {size}\r\nConnection: close\r\n\r\n"
        )
        .into_bytes();
        req.extend_from_slice(&body);
        let mut tcp = TcpStream::connect(sidecar.listen).await?;
        tcp.write_all(&req).await?;
        let mut all = Vec::new();
        tokio::time::timeout(
            std::time::Duration::from_secs(10),
            tcp.read_to_end(&mut all),
        )
        .await
        .context("the answer and its end of stream")?
        .context("a clean end of stream")?;
        let end = all
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .context("a head")?
            + 4;
        let head = String::from_utf8_lossy(&all[..end]);
        ensure!(head.starts_with("HTTP/1.1 200"), "{head}");
        ensure!(
            header(&head, "connection").is_some_and(|v| v.eq_ignore_ascii_case("close")),
            "{head}"
        );
        ensure!(
            all[end..] == body[..],
            "body of {size} bytes: got {}",
            all.len() - end
        );
    }
    Ok(())
}

/// Routes that match on the host take the same requests on both paths:
/// the fast path makes the `Host` value text only when a route looks at
/// it, by hyper's rule (a value that is not visible ASCII is no host).
#[tokio::test]
async fn host_routes_take_the_same_requests_on_both_paths() -> Result<()> {
    const BREAKER: &str = "{consecutiveFailures: 50, minRequests: 100}";
    let config = format!(
        "routes:\n  - {{name: api, match: {{host: api.example}}, circuitBreaker: {BREAKER}}}\n  - {{name: root, match: {{pathPrefix: /}}, circuitBreaker: {BREAKER}}}\n"
    );
    let hosts: &[&[u8]] = &[
        b"api.example",
        b"API.Example:8080",
        b"shop",
        b"api.example\xc3\xa9",
        b"api.example",
    ];
    let mut counts = Vec::new();
    for fast in ["true", "false"] {
        let app = WireApp::start().await?;
        let sidecar = InProcess::start(
            SidecarSpec::new(app.addr)
                .args(&["--http1-fast-path", fast])
                .config(&config),
        )
        .await?;
        for host in hosts {
            let mut request = b"GET /plain HTTP/1.1\r\nHost: ".to_vec();
            request.extend_from_slice(host);
            request.extend_from_slice(b"\r\nConnection: close\r\n\r\n");
            let (head, _) = exchange(sidecar.listen, &request).await?;
            ensure!(
                head.starts_with(b"HTTP/1.1 200"),
                "{}",
                String::from_utf8_lossy(&head)
            );
        }
        let requests = |route: serde_json::Value| route["breaker"]["window"]["requests"].clone();
        counts.push((
            requests(sidecar.route("api").await?),
            requests(sidecar.route("root").await?),
        ));
    }
    ensure!(
        counts[0] == (3.into(), 2.into()),
        "fast path: api and root took {:?}, want 3 and 2",
        counts[0]
    );
    ensure!(counts[0] == counts[1], "hyper's path: {:?}", counts[1]);
    Ok(())
}
