//! The endpoint the load goes to, and how a fresh connection to it is opened.

use std::sync::atomic::{AtomicU64, Ordering};

use http::Uri;
use tokio::net::TcpStream;

use super::Error;
use super::outcome::{Failure, classify_connect};

/// An `http://host:port` target (h2c and gRPC use prior knowledge on the same scheme).
#[derive(Clone, Debug)]
pub struct Target {
    /// `host:port`, used for the TCP connect (resolved on every connect, like a real client).
    pub authority: String,
    /// `http://host:port`, the origin of absolute request URIs (HTTP/2 needs `:authority`).
    pub origin: Uri,
}

impl Target {
    pub fn parse(url: &str) -> Result<Self, Error> {
        let bad = |reason: &str| Error::Target {
            url: url.to_owned(),
            reason: reason.to_owned(),
        };
        let uri: Uri = url.parse().map_err(|_| bad("not a URL"))?;
        if uri.scheme_str() != Some("http") {
            return Err(bad(
                "only http:// is supported (h2c and gRPC use prior knowledge)",
            ));
        }
        let authority = uri.authority().ok_or_else(|| bad("no host"))?;
        let port = authority.port_u16().unwrap_or(80);
        let authority = format!("{}:{port}", authority.host());
        let origin = format!("http://{authority}")
            .parse()
            .map_err(|_| bad("not a URL"))?;
        Ok(Target { authority, origin })
    }

    /// Opens a new TCP connection. Every new connection goes through the Service address
    /// again, so kube-proxy picks an endpoint for it: that is how clients move off a pod.
    pub async fn connect(&self, connects: &AtomicU64) -> Result<TcpStream, Failure> {
        connects.fetch_add(1, Ordering::Relaxed);
        let stream = TcpStream::connect(self.authority.as_str())
            .await
            .map_err(|e| classify_connect(&e))?;
        // Small requests; don't let Nagle delay them behind an unacknowledged segment.
        let _ = stream.set_nodelay(true);
        Ok(stream)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_http_targets_only() {
        let t = Target::parse("http://10.0.0.1:8080/ignored").expect("valid");
        assert_eq!(t.authority, "10.0.0.1:8080");
        assert_eq!(t.origin.to_string(), "http://10.0.0.1:8080/");
        assert_eq!(
            Target::parse("http://web").expect("valid").authority,
            "web:80"
        );
        assert!(Target::parse("https://web").is_err());
        assert!(Target::parse("web:80").is_err());
    }
}
