//! A minimal one-shot HTTP/1.1 client for admin calls and single requests.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result};
use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

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
        self.headers
            .get_all(http::header::CONNECTION)
            .iter()
            .any(|v| {
                v.to_str()
                    .is_ok_and(|v| v.to_ascii_lowercase().contains("close"))
            })
    }
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
        let tcp = TcpStream::connect(addr)
            .await
            .with_context(|| format!("connect {addr}"))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .context("http1 handshake")?;
        tokio::spawn(conn);
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
