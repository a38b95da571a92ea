//! Clients: a one-shot HTTP/1.1 request (admin calls, single requests), a
//! pooled client with latencies (the breaker tests), HTTP/1.1 over a Unix
//! socket, and raw-socket exchanges where the test is in the framing.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};

use super::{WAIT, within};

#[derive(Debug, Clone)]
pub struct Response {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Response {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// True when the server asked to close the connection after this response.
    pub fn connection_close(&self) -> bool {
        connection_close(&self.headers)
    }

    /// A header's value as text ("" when absent).
    pub fn header(&self, name: &str) -> String {
        header(&self.headers, name)
    }

    /// The answer must have `status`; `what` names the request.
    pub fn expect(&self, status: StatusCode, what: &str) -> Result<&Self> {
        if self.status != status {
            bail!("{what}: {}, not {status}", self.status);
        }
        Ok(self)
    }
}

/// True when `headers` ask to close the connection.
pub fn connection_close(headers: &HeaderMap) -> bool {
    headers.get_all(http::header::CONNECTION).iter().any(|v| {
        v.to_str()
            .is_ok_and(|v| v.to_ascii_lowercase().contains("close"))
    })
}

/// A header's value as text ("" when absent).
pub fn header(headers: &HeaderMap, name: &str) -> String {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string()
}

/// An HTTP/1.1 client connection (`sender`), its driver spawned.
pub type Sender = hyper::client::conn::http1::SendRequest<Empty<Bytes>>;

/// Opens a keep-alive HTTP/1.1 connection.
pub async fn connect(addr: SocketAddr) -> Result<Sender> {
    let tcp = TcpStream::connect(addr)
        .await
        .with_context(|| format!("connect {addr}"))?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .context("http1 handshake")?;
    tokio::spawn(conn);
    Ok(sender)
}

/// One GET on a kept-alive connection (Host `app.test`), bounded.
pub async fn send(sender: &mut Sender, path: &str) -> Result<Response> {
    within(path, WAIT, async {
        sender.ready().await.context("connection ready")?;
        let req = Request::get(path)
            .header(http::header::HOST, "app.test")
            .body(Empty::<Bytes>::new())?;
        let resp = sender.send_request(req).await?;
        let (parts, body) = resp.into_parts();
        let body = body.collect().await?.to_bytes();
        Ok(Response {
            status: parts.status,
            headers: parts.headers,
            body,
        })
    })
    .await?
}

/// One request on a fresh connection, bounded by `limit`.
pub async fn request(
    addr: SocketAddr,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    limit: Duration,
) -> Result<Response> {
    let fut = async {
        let mut sender = connect(addr).await?;
        let mut builder = Request::builder()
            .method(method)
            .uri(path)
            .header(http::header::HOST, addr.to_string());
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        let req = builder
            .body(Empty::<Bytes>::new())
            .context("build request")?;
        let resp = sender
            .send_request(req)
            .await
            .with_context(|| format!("{path} on {addr}"))?;
        let (parts, body) = resp.into_parts();
        let body = body.collect().await.context("read body")?.to_bytes();
        Ok(Response {
            status: parts.status,
            headers: parts.headers,
            body,
        })
    };
    tokio::time::timeout(limit, fut)
        .await
        .with_context(|| format!("{path} on {addr}: no answer within {limit:?}"))?
}

pub async fn get(addr: SocketAddr, path: &str) -> Result<Response> {
    request(addr, Method::GET, path, &[], Duration::from_secs(10)).await
}

/// One GET in the background, given `limit` to answer: work in flight.
pub fn spawn_get(
    addr: SocketAddr,
    path: &str,
    limit: Duration,
) -> tokio::task::JoinHandle<Result<Response>> {
    let path = path.to_string();
    tokio::spawn(async move { request(addr, Method::GET, &path, &[], limit).await })
}

/// The answer of a [`spawn_get`], which must be a 200.
pub async fn finished_ok(work: tokio::task::JoinHandle<Result<Response>>) -> Result<Response> {
    let resp = within("the work in flight", WAIT, work).await???;
    if resp.status != StatusCode::OK {
        bail!("in-flight work got {}: {}", resp.status, resp.text());
    }
    Ok(resp)
}

/// One HTTP/1.1 GET over a Unix socket: (status, body).
pub async fn unix_get(path: &Path, target: &str) -> Result<(StatusCode, String)> {
    let fut = async {
        let stream = UnixStream::connect(path)
            .await
            .with_context(|| format!("connect {}", path.display()))?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(conn);
        let req = Request::get(target)
            .header(http::header::HOST, "localhost")
            .body(Empty::<Bytes>::new())?;
        let resp = sender.send_request(req).await?;
        let status = resp.status();
        let body = resp.into_body().collect().await?.to_bytes();
        Ok::<_, anyhow::Error>((status, String::from_utf8_lossy(&body).into_owned()))
    };
    tokio::time::timeout(Duration::from_secs(10), fut)
        .await
        .context("no answer within 10s")?
}

/// A WebSocket through the proxy at `addr` (`GET /ws`), handshake checked.
pub async fn websocket(addr: SocketAddr) -> Result<tokio_tungstenite::WebSocketStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    let url = format!("ws://{addr}/ws");
    let (ws, resp) = within(
        "WebSocket handshake",
        WAIT,
        tokio_tungstenite::client_async(url, tcp),
    )
    .await?
    .context("WebSocket handshake through the sidecar")?;
    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        bail!("the WebSocket handshake answered {}", resp.status());
    }
    Ok(ws)
}

/// A WebSocket through the proxy at `addr` that has echoed one message:
/// the tunnel is up end to end before a test starts its drain.
pub async fn echoing_websocket(
    addr: SocketAddr,
) -> Result<tokio_tungstenite::WebSocketStream<TcpStream>> {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    let mut ws = websocket(addr).await?;
    ws.send(Message::text("before")).await?;
    let echo = within("echo before the drain", WAIT, ws.next())
        .await?
        .context("closed")??;
    anyhow::ensure!(echo == Message::text("before"), "unexpected echo {echo:?}");
    Ok(ws)
}

/// The first line of a raw answer.
pub fn status_line(answer: &str) -> &str {
    answer.lines().next().unwrap_or("")
}

/// Reads what the sidecar sends a client it cuts, to the end (for at most
/// `limit`): nothing, or a 408, is all it may send. Returns how the read
/// ended and what arrived.
pub async fn read_cut_answer(
    conn: &mut (impl tokio::io::AsyncRead + Unpin),
    what: &str,
    limit: Duration,
) -> Result<(std::io::Result<usize>, String)> {
    let mut answer = Vec::new();
    let read = within(what, limit, conn.read_to_end(&mut answer)).await?;
    let answer = String::from_utf8_lossy(&answer).into_owned();
    anyhow::ensure!(
        answer.is_empty() || status_line(&answer).starts_with("HTTP/1.1 408"),
        "{what}: the cut client got {:?}",
        status_line(&answer)
    );
    Ok((read, answer))
}

/// Writes `bytes` on a fresh connection and reads until the server closes
/// it (bounded); returns what came back. The server may answer and close
/// before it read everything: a failed write is fine as long as the answer
/// arrived.
pub async fn raw_exchange(addr: SocketAddr, bytes: &[u8]) -> Result<String> {
    let mut tcp = TcpStream::connect(addr).await?;
    let _ = tcp.write_all(bytes).await;
    let mut out = Vec::new();
    let _ = within(
        "the server to answer and close",
        WAIT,
        tcp.read_to_end(&mut out),
    )
    .await?;
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// [`raw_exchange`], which must be answered with `status`; `what` names
/// the request in the error. Returns the whole answer.
pub async fn raw_expect(addr: SocketAddr, bytes: &[u8], status: u16, what: &str) -> Result<String> {
    let answer = raw_exchange(addr, bytes).await?;
    if !status_line(&answer).starts_with(&format!("HTTP/1.1 {status}")) {
        bail!("{what} got {:?}, not {status}", status_line(&answer));
    }
    Ok(answer)
}

/// Reads one HTTP/1.1 response with a Content-Length body off `reader`;
/// returns its head.
pub async fn read_response<R: AsyncBufRead + Unpin>(reader: &mut R) -> Result<String> {
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).await? == 0 {
            bail!("connection closed mid-response; got {head:?}");
        }
        head.push_str(&line);
        if line == "\r\n" {
            break;
        }
    }
    let length = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0);
    let mut body = vec![0; length];
    reader.read_exact(&mut body).await?;
    Ok(head)
}

/// An HTTP/2 (prior knowledge) connection; its driver spawned.
pub async fn h2_connect(
    addr: std::net::SocketAddr,
) -> Result<(
    h2::client::SendRequest<Bytes>,
    tokio::task::JoinHandle<Result<(), h2::Error>>,
)> {
    let tcp = TcpStream::connect(addr)
        .await
        .with_context(|| format!("connect {addr}"))?;
    let (send, conn) = h2::client::handshake(tcp).await.context("h2 handshake")?;
    Ok((send, tokio::spawn(conn)))
}

/// An HTTP/2 frame header (RFC 9113 §4.1) followed by its payload, for
/// peers that speak raw frames.
pub fn h2_frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len();
    let mut out = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// A GET for `path` on an HTTP/2 connection.
pub fn h2_get(path: &str) -> Result<Request<()>> {
    Request::builder()
        .method(Method::GET)
        .uri(format!("http://app.test{path}"))
        .body(())
        .context("build request")
}

/// Reads a whole response body; fails on any stream error (RST_STREAM).
pub async fn h2_read_body(mut body: h2::RecvStream) -> Result<Vec<u8>, h2::Error> {
    let mut out = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk?;
        let _ = body.flow_control().release_capacity(chunk.len());
        out.extend_from_slice(&chunk);
    }
    // Trailers (if any) also end the stream; an error here is a reset.
    body.trailers().await?;
    Ok(out)
}

/// What [`Pool::get`] saw of one answer.
pub struct Reply {
    pub status: StatusCode,
    pub fallback: Option<String>,
    pub retry_after: Option<u64>,
    pub body: String,
    pub latency: Duration,
}

impl Reply {
    /// The answer must have `status`; `what` names the request.
    pub fn expect(&self, status: StatusCode, what: &str) -> Result<&Self> {
        if self.status != status {
            bail!("{what}: {}, not {status} ({})", self.status, self.body);
        }
        Ok(self)
    }
}

/// A pooled client (many keep-alive connections per host), as a service
/// calling another would use.
#[derive(Clone)]
pub struct Pool {
    inner: Client<HttpConnector, Full<Bytes>>,
}

impl Pool {
    pub fn new() -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let inner = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(1024)
            .build(connector);
        Self { inner }
    }

    /// GET with a 20s ceiling, so a hang fails the test instead of stalling it.
    pub async fn get(&self, url: &str) -> Result<Reply> {
        let request = Request::get(url).body(Full::new(Bytes::new()))?;
        let started = Instant::now();
        let response = tokio::time::timeout(Duration::from_secs(20), self.inner.request(request))
            .await
            .with_context(|| format!("GET {url} hung"))?
            .with_context(|| format!("GET {url}"))?;
        let status = response.status();
        let fallback =
            Some(header(response.headers(), "x-kubegrace-fallback")).filter(|v| !v.is_empty());
        let retry_after = header(response.headers(), "retry-after").parse().ok();
        let body = tokio::time::timeout(Duration::from_secs(20), response.into_body().collect())
            .await
            .with_context(|| format!("body of GET {url} hung"))?
            .with_context(|| format!("body of GET {url}"))?
            .to_bytes();
        Ok(Reply {
            status,
            fallback,
            retry_after,
            body: String::from_utf8_lossy(&body).into_owned(),
            latency: started.elapsed(),
        })
    }
}

impl Default for Pool {
    fn default() -> Self {
        Self::new()
    }
}

/// The `q`-quantile (0..=1) of some latencies; zero when empty.
pub fn quantile(latencies: &mut [Duration], q: f64) -> Duration {
    if latencies.is_empty() {
        return Duration::ZERO;
    }
    latencies.sort_unstable();
    let index = ((latencies.len() - 1) as f64 * q).round() as usize;
    latencies[index.min(latencies.len() - 1)]
}

#[test]
fn status_line_is_the_first_line() {
    assert_eq!(
        status_line("HTTP/1.1 400 Bad Request\r\nx: y\r\n"),
        "HTTP/1.1 400 Bad Request"
    );
    assert_eq!(status_line(""), "");
}
