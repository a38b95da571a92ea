//! Request matching for routes: path (exact or prefix), methods, host.
//!
//! Compiled once per config so [`CompiledMatch::matches`] only compares
//! borrowed strings: no allocation on the request path.
//!
//! Paths come here normalized (proxy/path.rs: unreserved escapes decoded,
//! dot segments removed, slashes merged, escaped slashes refused), so a
//! raw comparison is a comparison of resources: `/%6cim` is `/lim`.

use crate::config::RouteMatch;

/// How the path part of a route matches.
#[derive(Debug, Clone, PartialEq, Eq)]
enum PathRule {
    Any,
    Exact(String),
    /// Gateway API semantics: the prefix matches whole path segments, so
    /// `/api` takes `/api` and `/api/users` but not `/apis`. A trailing `/`
    /// in the configured prefix is ignored for the same reason.
    Prefix(String),
}

/// How the host part of a route matches.
#[derive(Debug, Clone, PartialEq, Eq)]
enum HostRule {
    Any,
    /// Lower-cased host without port.
    Exact(String),
    /// `*.example.com` stored as `.example.com`: matches one or more labels
    /// in front of it, never the bare `example.com`.
    Wildcard(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CompiledMatch {
    path: PathRule,
    /// Upper-case method names; empty matches every method.
    methods: Vec<String>,
    host: HostRule,
}

impl CompiledMatch {
    /// Matches everything: the built-in default route.
    pub(crate) fn any() -> Self {
        Self {
            path: PathRule::Any,
            methods: Vec::new(),
            host: HostRule::Any,
        }
    }

    pub(crate) fn compile(matcher: &RouteMatch) -> Self {
        let path = if let Some(exact) = &matcher.path {
            PathRule::Exact(exact.clone())
        } else if let Some(prefix) = &matcher.path_prefix {
            let trimmed = prefix.trim_end_matches('/');
            if trimmed.is_empty() {
                PathRule::Any
            } else {
                PathRule::Prefix(trimmed.to_string())
            }
        } else {
            PathRule::Any
        };
        let host = match matcher.host.as_deref().map(str::trim) {
            None | Some("") | Some("*") => HostRule::Any,
            Some(h) => match h.strip_prefix('*') {
                Some(suffix) => HostRule::Wildcard(suffix.to_ascii_lowercase()),
                None => HostRule::Exact(h.to_ascii_lowercase()),
            },
        };
        Self {
            path,
            methods: matcher.methods.clone(),
            host,
        }
    }

    pub(crate) fn matches(&self, method: &http::Method, host: Option<&str>, path: &str) -> bool {
        self.path_matches(path) && self.method_matches(method) && self.host_matches(host)
    }

    fn path_matches(&self, path: &str) -> bool {
        // The proxy may hand us a path with its query string; routes never
        // match on the query.
        let path = path.split_once('?').map_or(path, |(p, _)| p);
        match &self.path {
            PathRule::Any => true,
            PathRule::Exact(exact) => path == exact,
            PathRule::Prefix(prefix) => match path.strip_prefix(prefix.as_str()) {
                Some(rest) => rest.is_empty() || rest.starts_with('/'),
                None => false,
            },
        }
    }

    fn method_matches(&self, method: &http::Method) -> bool {
        self.methods.is_empty() || self.methods.iter().any(|m| m == method.as_str())
    }

    /// Whether this match looks at the host at all.
    pub(crate) fn has_host_rule(&self) -> bool {
        !matches!(self.host, HostRule::Any)
    }

    fn host_matches(&self, host: Option<&str>) -> bool {
        let wanted = match &self.host {
            HostRule::Any => return true,
            other => other,
        };
        let Some(host) = host.map(strip_port) else {
            return false;
        };
        match wanted {
            HostRule::Any => true,
            HostRule::Exact(exact) => host.eq_ignore_ascii_case(exact),
            HostRule::Wildcard(suffix) => {
                host.len() > suffix.len()
                    && host.is_char_boundary(host.len() - suffix.len())
                    && host[host.len() - suffix.len()..].eq_ignore_ascii_case(suffix)
            }
        }
    }
}

/// `example.com:8080` -> `example.com`, `[::1]:80` -> `[::1]`; a trailing
/// dot (fully qualified form) is dropped too.
fn strip_port(host: &str) -> &str {
    let without_port = if host.starts_with('[') {
        match host.find(']') {
            Some(end) => &host[..=end],
            None => host,
        }
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
            _ => host,
        }
    };
    without_port.strip_suffix('.').unwrap_or(without_port)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;

    fn compiled(yaml: &str) -> CompiledMatch {
        let matcher: RouteMatch = serde_norway::from_str(yaml).expect("valid match");
        CompiledMatch::compile(&matcher)
    }

    #[test]
    fn prefixes_match_whole_segments() {
        let api = compiled("pathPrefix: /api");
        assert!(api.matches(&Method::GET, None, "/api"));
        assert!(api.matches(&Method::GET, None, "/api/users"));
        assert!(api.matches(&Method::GET, None, "/api?x=1"));
        assert!(!api.matches(&Method::GET, None, "/apis"));
        assert!(!api.matches(&Method::GET, None, "/"));
        let slash = compiled("pathPrefix: /api/");
        assert!(slash.matches(&Method::GET, None, "/api/x"));
        let root = compiled("pathPrefix: /");
        assert!(root.matches(&Method::GET, None, "/anything"));
    }

    #[test]
    fn exact_paths_ignore_the_query() {
        let exact = compiled("path: /healthz");
        assert!(exact.matches(&Method::GET, None, "/healthz"));
        assert!(exact.matches(&Method::GET, None, "/healthz?verbose"));
        assert!(!exact.matches(&Method::GET, None, "/healthz/x"));
    }

    #[test]
    fn methods_restrict_when_listed() {
        let writes = compiled("methods: [POST, PUT]");
        assert!(writes.matches(&Method::POST, None, "/"));
        assert!(!writes.matches(&Method::GET, None, "/"));
    }

    #[test]
    fn hosts_ignore_case_port_and_match_wildcards() {
        let exact = compiled("host: Example.com");
        assert!(exact.matches(&Method::GET, Some("example.COM:8080"), "/"));
        assert!(exact.matches(&Method::GET, Some("example.com."), "/"));
        assert!(!exact.matches(&Method::GET, Some("other.com"), "/"));
        assert!(!exact.matches(&Method::GET, None, "/"));
        let wild = compiled("host: '*.example.com'");
        assert!(wild.matches(&Method::GET, Some("a.example.com"), "/"));
        assert!(wild.matches(&Method::GET, Some("a.b.example.com:80"), "/"));
        assert!(!wild.matches(&Method::GET, Some("example.com"), "/"));
        assert_eq!(strip_port("[::1]:80"), "[::1]");
    }
}
