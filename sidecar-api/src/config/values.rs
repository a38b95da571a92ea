//! The value types of the config: where to listen and send, socket modes
//! and protocols, each parsed from and printed as the text people write.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Where a listener or upstream lives: a TCP address or a Unix socket path
/// (`unix:/run/app.sock`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Endpoint {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

impl Endpoint {
    /// A TCP endpoint on port 0: the kernel picks the port at bind time.
    pub fn is_any_port(&self) -> bool {
        matches!(self, Self::Tcp(addr) if addr.port() == 0)
    }
}

impl FromStr for Endpoint {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if let Some(path) = s.strip_prefix("unix:") {
            if path.is_empty() {
                return Err("unix: needs a socket path, like unix:/run/app.sock".into());
            }
            return Ok(Self::Unix(PathBuf::from(path)));
        }
        // A bare port (":8080" or "8080") is what people type for "all interfaces".
        let with_host = if let Some(port) = s.strip_prefix(':') {
            format!("0.0.0.0:{port}")
        } else if s.chars().all(|c| c.is_ascii_digit()) && !s.is_empty() {
            format!("0.0.0.0:{s}")
        } else {
            s.to_string()
        };
        with_host.parse::<SocketAddr>().map(Self::Tcp).map_err(|_| {
            format!("{s:?} is not an address; write host:port (127.0.0.1:8081, [::1]:8081) or unix:/path")
        })
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Tcp(addr) => write!(f, "{addr}"),
            Self::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

/// File permissions for a Unix listen socket, written in octal like chmod
/// (`"0660"`, `"660"`); serialised the same way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SocketMode(pub u32);

impl FromStr for SocketMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        match u32::from_str_radix(t, 8) {
            Ok(mode) if mode <= 0o777 => Ok(Self(mode)),
            _ => Err(format!(
                "{t:?} is not a file mode; write it in octal like chmod, e.g. 0660"
            )),
        }
    }
}

impl fmt::Display for SocketMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04o}", self.0)
    }
}

// Both only from strings. For a socket mode it matters most: YAML reads an
// unquoted 0660 as the decimal 660 (YAML 1.2) or as 432 (1.1), and only a
// string says what was meant.
serde_as_text!(Endpoint, SocketMode);

/// How the listener treats the bytes it accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// HTTP/1.1 and HTTP/2 prior knowledge (h2c), told apart by the preface.
    /// gRPC and WebSocket ride on these.
    #[default]
    Auto,
    /// HTTP/1.1 only (Upgrade still passes through).
    Http1,
    /// HTTP/2 prior knowledge only (gRPC).
    Http2,
    /// Raw TCP pass-through for non-HTTP ports: drains by connection count.
    Tcp,
}
