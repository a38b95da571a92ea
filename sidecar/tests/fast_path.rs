//! The HTTP/1.1 fast path (src/proxy/h1) against hyper's path: the same
//! requests through both give the app the same requests and the client
//! the same answers; the fast path pools its app connections and refuses
//! what could smuggle a request. Self-contained: its own sidecar launcher
//! and a raw-socket app that records what it receives.

use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::{Child, Command};

const BIN: &str = env!("CARGO_BIN_EXE_kubegrace-sidecar");
const WAIT: Duration = Duration::from_secs(10);

/// The sidecar binary, killed on drop.
struct Sidecar {
    _child: Child,
    listen: SocketAddr,
}

async fn sidecar(upstream: SocketAddr, args: &[&str]) -> Result<Sidecar> {
    let mut cmd = Command::new(BIN);
    cmd.args([
        "--listen",
        "127.0.0.1:0",
        "--upstream",
        &upstream.to_string(),
        "--admin",
        "127.0.0.1:0",
    ])
    .args(args)
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::null())
    .kill_on_drop(true);
    for (key, _) in std::env::vars() {
        if key.starts_with("KUBEGRACE_") {
            cmd.env_remove(key);
        }
    }
    let mut child = cmd.spawn().context("spawn the sidecar")?;
    let stdout = child.stdout.take().context("stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let listen = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await? {
            if let Some(at) = line.find("listen=") {
                let addr = line[at + 7..].split_whitespace().next().unwrap_or("");
                return Ok::<_, anyhow::Error>(addr.parse::<SocketAddr>()?);
            }
        }
        bail!("the sidecar exited before its ready line")
    })
    .await
    .context("the sidecar's ready line")??;
    // Keep reading stdout so the child never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok(Sidecar {
        _child: child,
        listen,
    })
}

/// An app on a raw socket: records every request (head and body as
/// received) and answers by path.
struct App {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Vec<u8>>>>,
    accepted: Arc<AtomicUsize>,
}

async fn app() -> Result<App> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let accepted = Arc::new(AtomicUsize::new(0));
    let (rec, count) = (seen.clone(), accepted.clone());
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            let rec = rec.clone();
            tokio::spawn(async move {
                let mut reader = BufReader::new(stream);
                while let Ok(Some((head, body))) = read_message(&mut reader, false).await {
                    let mut raw = head.clone();
                    raw.extend_from_slice(&body);
                    if let Ok(mut seen) = rec.lock() {
                        seen.push(raw);
                    }
                    let path = String::from_utf8_lossy(&head)
                        .split(' ')
                        .nth(1)
                        .unwrap_or("")
                        .to_string();
                    let answer: Vec<u8> = match path.as_str() {
                        "/chunked" => b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-App: c\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n".to_vec(),
                        "/close" => b"HTTP/1.1 200 OK\r\nX-App: close\r\n\r\nuntil the end".to_vec(),
                        _ => {
                            let decoded = dechunk_if(&head, &body);
                            let mut a = format!(
                                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: X-Hop\r\nX-Hop: y\r\nX-App: echo\r\n\r\n",
                                decoded.len()
                            )
                            .into_bytes();
                            if !head.starts_with(b"HEAD ") {
                                a.extend_from_slice(&decoded);
                            }
                            a
                        }
                    };
                    let stream = reader.get_mut();
                    if stream.write_all(&answer).await.is_err() || path == "/close" {
                        return;
                    }
                }
            });
        }
    });
    Ok(App {
        addr,
        seen,
        accepted,
    })
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().skip(1).find_map(|l| {
        let (n, v) = l.split_once(':')?;
        n.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// Reads one message: its head, and its body by Content-Length, chunked
/// (raw, as sent), or (responses) to the end.
async fn read_message<R: tokio::io::AsyncBufRead + Unpin>(
    r: &mut R,
    response_to_head: bool,
) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
    let mut head = Vec::new();
    loop {
        let n = r.read_until(b'\n', &mut head).await?;
        if n == 0 {
            return if head.is_empty() {
                Ok(None)
            } else {
                bail!("cut head")
            };
        }
        if head.ends_with(b"\r\n\r\n") {
            break;
        }
    }
    let text = String::from_utf8_lossy(&head).into_owned();
    let is_response = text.starts_with("HTTP/");
    let mut body = Vec::new();
    let status_bodiless =
        is_response && (text.starts_with("HTTP/1.1 204") || text.starts_with("HTTP/1.1 304"));
    if response_to_head || status_bodiless {
        return Ok(Some((head, body)));
    }
    if header(&text, "transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        loop {
            let mut line = Vec::new();
            r.read_until(b'\n', &mut line).await?;
            body.extend_from_slice(&line);
            let size = usize::from_str_radix(
                String::from_utf8_lossy(&line)
                    .trim()
                    .split(';')
                    .next()
                    .unwrap_or(""),
                16,
            )?;
            if size == 0 {
                loop {
                    let mut t = Vec::new();
                    r.read_until(b'\n', &mut t).await?;
                    body.extend_from_slice(&t);
                    if t == b"\r\n" || t.is_empty() {
                        return Ok(Some((head, body)));
                    }
                }
            }
            let mut data = vec![0; size + 2];
            r.read_exact(&mut data).await?;
            body.extend_from_slice(&data);
        }
    } else if let Some(len) = header(&text, "content-length") {
        let mut data = vec![0; len.parse()?];
        r.read_exact(&mut data).await?;
        body = data;
    } else if is_response {
        r.read_to_end(&mut body).await?;
    }
    Ok(Some((head, body)))
}

/// The body's data, chunk framing taken off if the head says chunked.
fn dechunk_if(head: &[u8], body: &[u8]) -> Vec<u8> {
    let text = String::from_utf8_lossy(head);
    if !header(&text, "transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        return body.to_vec();
    }
    let mut out = Vec::new();
    let mut rest = body;
    loop {
        let Some(eol) = rest.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let line = String::from_utf8_lossy(&rest[..eol]);
        let size =
            usize::from_str_radix(line.split(';').next().unwrap_or("").trim(), 16).unwrap_or(0);
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&rest[eol + 2..eol + 2 + size]);
        rest = &rest[eol + 2 + size + 2..];
    }
}

/// A message as the other side sees it, whatever the proxy's own choices:
/// the first line, the end-to-end headers (lower-cased, sorted; framing
/// and `date` left out) and the decoded body.
fn normalize(head: &[u8], body: &[u8]) -> String {
    let text = String::from_utf8_lossy(head);
    let mut lines = text.lines();
    let first = lines.next().unwrap_or("").to_string();
    let mut headers: Vec<String> = lines
        .filter_map(|l| {
            let (n, v) = l.split_once(':')?;
            let n = n.trim().to_ascii_lowercase();
            let skip = ["date", "content-length", "transfer-encoding", "connection"];
            (!skip.contains(&n.as_str())).then(|| format!("{n}: {}", v.trim()))
        })
        .collect();
    headers.sort();
    format!(
        "{first}\n{}\n\n{}",
        headers.join("\n"),
        String::from_utf8_lossy(&dechunk_if(head, body))
    )
}

/// Sends one request on its own connection and reads the answer.
async fn exchange(listen: SocketAddr, request: &[u8]) -> Result<(Vec<u8>, Vec<u8>)> {
    let mut tcp = BufReader::new(TcpStream::connect(listen).await?);
    tcp.get_mut().write_all(request).await?;
    let head_request = request.starts_with(b"HEAD ");
    tokio::time::timeout(WAIT, read_message(&mut tcp, head_request))
        .await
        .context("the answer")??
        .context("no answer")
}

const REQUESTS: &[&str] = &[
    "GET /plain?q=1 HTTP/1.1\r\nHost: shop\r\nAccept: */*\r\nConnection: close, X-Secret\r\nX-Secret: 1\r\nKeep-Alive: timeout=5\r\n\r\n",
    "GET /xff HTTP/1.1\r\nHost: shop\r\nX-Forwarded-For: 203.0.113.9\r\nX-Forwarded-Proto: https\r\nTE: trailers\r\nConnection: close\r\n\r\n",
    "POST /echo HTTP/1.1\r\nHost: shop\r\nContent-Length: 11\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\nhello world",
    "POST /echo HTTP/1.1\r\nHost: shop\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\n\r\n",
    "GET /chunked HTTP/1.1\r\nHost: shop\r\nConnection: close\r\n\r\n",
    "GET /close HTTP/1.1\r\nHost: shop\r\nConnection: close\r\n\r\n",
    "HEAD /plain HTTP/1.1\r\nHost: shop\r\nConnection: close\r\n\r\n",
    "DELETE /plain HTTP/1.1\r\nConnection: close\r\n\r\n",
];

#[tokio::test]
async fn the_fast_path_and_hyper_give_the_same_bytes_to_the_app_and_the_same_answers() -> Result<()>
{
    let mut runs = Vec::new();
    for args in [
        &["--http1-fast-path", "true"][..],
        &["--http1-fast-path", "false"][..],
    ] {
        let app = app().await?;
        let sidecar = sidecar(app.addr, args).await?;
        let mut answers = Vec::new();
        for request in REQUESTS {
            let (head, body) = exchange(sidecar.listen, request.as_bytes()).await?;
            answers.push(normalize(&head, &body));
        }
        let seen: Vec<String> = app
            .seen
            .lock()
            .map_err(|_| anyhow::anyhow!("poisoned"))?
            .iter()
            .map(|raw| {
                let end = raw
                    .windows(4)
                    .position(|w| w == b"\r\n\r\n")
                    .map_or(raw.len(), |p| p + 4);
                // The two runs have two apps: their address is not a difference.
                normalize(&raw[..end], &raw[end..]).replace(&app.addr.to_string(), "APP")
            })
            .collect();
        runs.push((answers, seen));
    }
    let (fast, hyper) = (&runs[0], &runs[1]);
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
    let app = app().await?;
    let sidecar = sidecar(app.addr, &[]).await?;
    let mut tcp = BufReader::new(TcpStream::connect(sidecar.listen).await?);
    for i in 0..20 {
        let body = format!("request {i}");
        let req = format!(
            "POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        tcp.get_mut().write_all(req.as_bytes()).await?;
        let (head, answer) = tokio::time::timeout(WAIT, read_message(&mut tcp, false))
            .await??
            .context("no answer")?;
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
        let (_, answer) = tokio::time::timeout(WAIT, read_message(&mut tcp, false))
            .await??
            .context("no answer")?;
        ensure!(answer == want, "pipelined answer {answer:?}");
    }
    // The /ready probes open connections without a request; requests use one.
    let with_requests = app.seen.lock().map(|s| s.len()).unwrap_or(0);
    ensure!(with_requests == 22, "the app saw {with_requests} requests");
    ensure!(
        app.accepted.load(Ordering::SeqCst) <= 3,
        "{} app connections for 22 sequential requests",
        app.accepted.load(Ordering::SeqCst)
    );
    Ok(())
}

#[tokio::test]
async fn smuggling_shapes_are_refused_before_the_app_sees_them() -> Result<()> {
    let app = app().await?;
    let sidecar = sidecar(app.addr, &[]).await?;
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
    let seen = app.seen.lock().map(|s| s.len()).unwrap_or(0);
    ensure!(seen == 0, "the app saw {seen} refused requests");
    // Chunk framing the app would read differently: 400, the app gets no
    // complete request out of it.
    let (head, _) = exchange(
        sidecar.listen,
        b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\nhello\r\n0\r\n\r\n",
    )
    .await?;
    ensure!(String::from_utf8_lossy(&head).starts_with("HTTP/1.1 400"));
    Ok(())
}
