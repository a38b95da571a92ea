//! The app's own readiness check, run by the sidecar behind its `/ready`.
//!
//! Why the sidecar runs it: a pod is Ready only when every container's
//! readiness probe has passed, and the kubelet runs each probe on its own
//! ticker. An injected pod with the app's probe and the sidecar's probe
//! waits for the later of two tickers (up to a period each) after the app
//! is up, once per new pod, so once per step of a rolling update. With the
//! app's HTTP check folded into the sidecar's probe, one probe decides, and
//! the sidecar answers it as soon as the app's check passes. The webhook
//! moves a plain `httpGet` readiness probe here; the kubelet's semantics
//! (period, timeout, thresholds, initial delay) are kept.

use serde::{Deserialize, Serialize};

use super::ConfigError;
use super::bounds::{self, MAX_PROBE_SECONDS, MAX_PROBE_THRESHOLD, count_in, wide};

/// An HTTP GET against the app, as a Kubernetes `httpGet` readiness probe
/// describes it. Status 200-399 passes, as the kubelet counts it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AppReadiness {
    /// The app's port on loopback (the probe's port, resolved to a number).
    pub port: u16,
    /// The path with its query, as the probe gives it.
    #[serde(default = "root_path")]
    pub path: String,
    /// Extra request headers (`httpHeaders` of the probe), at most 64.
    /// Their values are redacted in `GET /config` (they often carry a
    /// bearer token).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<ProbeHeader>,
    /// How often the app is checked once it has passed (until it first
    /// passes, it is checked every 50 ms): 1 to 86400.
    #[serde(default = "ten")]
    pub period_seconds: u32,
    /// How long one check may take: 1 to 86400.
    #[serde(default = "one")]
    pub timeout_seconds: u32,
    /// Passes in a row that make a failing app ready again: 1 to 10000.
    #[serde(default = "one")]
    pub success_threshold: u32,
    /// Failures in a row that make a ready app unready: 1 to 10000.
    #[serde(default = "three")]
    pub failure_threshold: u32,
    /// Not ready before this long after the app was first seen up (the
    /// kubelet counts from the container's start, which the sidecar cannot
    /// see; the app accepting connections comes after it, so this errs on
    /// the late side). 0 to 86400.
    #[serde(default)]
    pub initial_delay_seconds: u32,
}

/// One request header of the check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeHeader {
    pub name: String,
    pub value: String,
}

fn root_path() -> String {
    "/".into()
}
fn one() -> u32 {
    1
}
fn three() -> u32 {
    3
}
fn ten() -> u32 {
    10
}

impl AppReadiness {
    /// A check of `path` on `port` with the kubelet's defaults.
    pub fn http_get(port: u16, path: impl Into<String>) -> Self {
        Self {
            port,
            path: path.into(),
            headers: Vec::new(),
            period_seconds: 10,
            timeout_seconds: 1,
            success_threshold: 1,
            failure_threshold: 3,
            initial_delay_seconds: 0,
        }
    }

    pub fn validate(&self, key: &str) -> Result<(), ConfigError> {
        if self.port == 0 {
            return Err(ConfigError::at(
                key,
                "port",
                "0 is not a port; give the app's port (1-65535)",
            ));
        }
        if !self.path.starts_with('/')
            || self.path.bytes().any(|b| b.is_ascii_control() || b == b' ')
        {
            return Err(ConfigError::at(
                key,
                "path",
                format!(
                    "{:?} is not a request path; start it with / and leave out spaces",
                    self.path
                ),
            ));
        }
        for (name, value, min, max) in [
            ("periodSeconds", self.period_seconds, 1, MAX_PROBE_SECONDS),
            ("timeoutSeconds", self.timeout_seconds, 1, MAX_PROBE_SECONDS),
            (
                "initialDelaySeconds",
                self.initial_delay_seconds,
                0,
                MAX_PROBE_SECONDS,
            ),
            (
                "successThreshold",
                self.success_threshold,
                1,
                MAX_PROBE_THRESHOLD,
            ),
            (
                "failureThreshold",
                self.failure_threshold,
                1,
                MAX_PROBE_THRESHOLD,
            ),
        ] {
            count_in(
                key,
                name,
                u64::from(value),
                min,
                u64::from(max),
                "as in a Kubernetes probe, within a day",
            )?;
        }
        count_in(
            key,
            "headers",
            wide(self.headers.len()),
            0,
            wide(bounds::MAX_PROBE_HEADERS),
            "",
        )?;
        for (i, h) in self.headers.iter().enumerate() {
            let token = !h.name.is_empty()
                && h.name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
            if !token || h.value.bytes().any(|b| b == b'\r' || b == b'\n') {
                return Err(ConfigError::at(
                    key,
                    &format!("headers[{i}]"),
                    format!(
                        "{:?} is not a valid header; use a token name and a one-line value",
                        h.name
                    ),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_probe_in_json_takes_the_kubelet_defaults() {
        let r: AppReadiness =
            serde_norway::from_str(r#"{"port": 8080, "path": "/healthz"}"#).expect("parses");
        assert_eq!(r, AppReadiness::http_get(8080, "/healthz"));
        r.validate("appReadiness").expect("valid");
    }

    #[test]
    fn bad_values_name_the_key_to_fix() {
        let mut r = AppReadiness::http_get(8080, "healthz");
        let e = r.validate("appReadiness").expect_err("no slash");
        assert_eq!(e.key, "appReadiness.path");
        r.path = "/ok".into();
        r.failure_threshold = 0;
        let e = r.validate("appReadiness").expect_err("zero threshold");
        assert_eq!(e.key, "appReadiness.failureThreshold");
        r.failure_threshold = 1;
        r.headers.push(ProbeHeader {
            name: "X-A".into(),
            value: "a\r\nb".into(),
        });
        assert_eq!(
            r.validate("appReadiness").expect_err("crlf").key,
            "appReadiness.headers[0]"
        );
    }
}
