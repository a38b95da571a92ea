//! HTTP/1.1 as bytes on the wire, for tests whose subject is the exact
//! bytes: [`WireApp`], an app on a raw socket that records every request as
//! it arrived (head and body, chunk framing included, which a hyper app
//! would hide), and a client side that reads one message by its framing.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use anyhow::{Context, Result, bail};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

use super::WAIT;

/// An app on a raw socket: records every request (head and body as
/// received) and answers by path: `/chunked` a chunked answer with a
/// trailer, `/close` a body delimited by closing the connection, a path
/// with `/fail` in it a 500, one under `/slow` never, anything else the
/// request's (decoded) body with a `Connection`-listed header.
pub struct WireApp {
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<Vec<u8>>>>,
    accepted: Arc<AtomicUsize>,
}

impl WireApp {
    pub async fn start() -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let seen = Arc::new(Mutex::new(Vec::new()));
        let accepted = Arc::new(AtomicUsize::new(0));
        let (rec, count) = (seen.clone(), accepted.clone());
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(serve(stream, rec.clone()));
            }
        });
        Ok(Self {
            addr,
            seen,
            accepted,
        })
    }

    /// Every request received so far, head and body as they came.
    pub fn seen(&self) -> Vec<Vec<u8>> {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Connections the app accepted (with a request or not).
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

async fn serve(stream: TcpStream, seen: Arc<Mutex<Vec<Vec<u8>>>>) {
    let mut reader = BufReader::new(stream);
    while let Ok(Some((head, body))) = read_message(&mut reader, false).await {
        let mut raw = head.clone();
        raw.extend_from_slice(&body);
        seen.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(raw);
        let path = String::from_utf8_lossy(&head)
            .split(' ')
            .nth(1)
            .unwrap_or("")
            .to_string();
        if path.starts_with("/slow") {
            // Never answers: the route's timeout answers instead. The
            // connection stays open until the proxy gives up on it.
            let mut rest = Vec::new();
            let _ = reader.read_to_end(&mut rest).await;
            return;
        }
        let answer: Vec<u8> = match path.as_str() {
            _ if path.contains("/fail") => {
                b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n".to_vec()
            }
            "/chunked" => b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-App: c\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n".to_vec(),
            "/close" => b"HTTP/1.1 200 OK\r\nX-App: close\r\n\r\nuntil the end".to_vec(),
            _ => {
                let decoded = dechunk_if(&head, &body);
                let mut answer = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: X-Hop\r\nX-Hop: y\r\nX-App: echo\r\n\r\n",
                    decoded.len()
                )
                .into_bytes();
                if !head.starts_with(b"HEAD ") {
                    answer.extend_from_slice(&decoded);
                }
                answer
            }
        };
        let stream = reader.get_mut();
        if stream.write_all(&answer).await.is_err() || path == "/close" {
            return;
        }
    }
}

/// The value of header `name` in a message head.
pub fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().skip(1).find_map(|l| {
        let (n, v) = l.split_once(':')?;
        n.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

fn is_chunked(head: &str) -> bool {
    header(head, "transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked"))
}

/// Reads one message: its head, and its body by Content-Length, chunked
/// (raw, as sent), or (responses) to the end. `None` at a clean end of
/// stream.
pub async fn read_message<R: AsyncBufRead + Unpin>(
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
    if is_chunked(&text) {
        read_chunked(r, &mut body).await?;
    } else if let Some(len) = header(&text, "content-length") {
        body = vec![0; len.parse()?];
        r.read_exact(&mut body).await?;
    } else if is_response {
        r.read_to_end(&mut body).await?;
    }
    Ok(Some((head, body)))
}

/// A chunked body with its framing and trailers, as sent.
async fn read_chunked<R: AsyncBufRead + Unpin>(r: &mut R, body: &mut Vec<u8>) -> Result<()> {
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
                let mut trailer = Vec::new();
                r.read_until(b'\n', &mut trailer).await?;
                body.extend_from_slice(&trailer);
                if trailer == b"\r\n" || trailer.is_empty() {
                    return Ok(());
                }
            }
        }
        let mut data = vec![0; size + 2];
        r.read_exact(&mut data).await?;
        body.extend_from_slice(&data);
    }
}

/// The body's data, chunk framing taken off if the head says chunked.
pub fn dechunk_if(head: &[u8], body: &[u8]) -> Vec<u8> {
    if !is_chunked(&String::from_utf8_lossy(head)) {
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
pub fn normalize(head: &[u8], body: &[u8]) -> String {
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

/// A recorded request (head and body in one buffer), normalized.
pub fn normalize_raw(raw: &[u8]) -> String {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(raw.len(), |p| p + 4);
    normalize(&raw[..end], &raw[end..])
}

/// Sends one request on its own connection and reads the answer (bounded).
pub async fn exchange(listen: SocketAddr, request: &[u8]) -> Result<(Vec<u8>, Vec<u8>)> {
    let mut tcp = BufReader::new(TcpStream::connect(listen).await?);
    tcp.get_mut().write_all(request).await?;
    read_answer(&mut tcp, request.starts_with(b"HEAD ")).await
}

/// Reads the next answer on a connection (bounded); `to_head`: it answers
/// a HEAD request, so it has no body.
pub async fn read_answer<R: AsyncBufRead + Unpin>(
    r: &mut R,
    to_head: bool,
) -> Result<(Vec<u8>, Vec<u8>)> {
    tokio::time::timeout(WAIT, read_message(r, to_head))
        .await
        .context("the answer")??
        .context("no answer")
}
