//! The app's readiness check (`appReadiness`), answered inside `/ready`.
//!
//! The kubelet's rules, kept: a check passes on status 200-399; a ready app
//! turns unready after `failureThreshold` failures in a row, checked once
//! per `periodSeconds`; an unready app turns ready after `successThreshold`
//! passes in a row; a new app (started or restarted) is unready until then,
//! and not before `initialDelaySeconds`. One change, and the reason the
//! check lives here: until the app first passes, every `/ready` checks it,
//! and retries a quick failure for a moment, so the pod turns Ready as soon
//! as the app does instead of a probe period later.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::config::AppReadiness;

/// How long a `/ready` retries a check that failed fast (refused, 503)
/// before the app has passed once. Within the kubelet's probe timeout,
/// with room for the connect check that came before.
const FIRST_PASS_WAIT: Duration = Duration::from_millis(700);
/// Between those retries.
const RETRY_EVERY: Duration = Duration::from_millis(50);
/// Enough of the response to hold its status line.
const STATUS_LINE_MAX: usize = 1024;

/// What one check saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// A status from 200 to 399.
    Pass(u16),
    /// Another status.
    Status(u16),
    /// Nothing listens on the port: the app is not (or no longer) running.
    Refused,
    /// Connected, but no status line within the timeout, or not HTTP.
    Failed(String),
}

impl Outcome {
    fn passed(&self) -> bool {
        matches!(self, Outcome::Pass(_))
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Pass(s) | Outcome::Status(s) => write!(f, "status {s}"),
            Outcome::Refused => f.write_str("connection refused"),
            Outcome::Failed(why) => f.write_str(why),
        }
    }
}

#[derive(Debug, Default)]
struct State {
    /// The verdict `/ready` reports.
    ready: bool,
    passes: u32,
    failures: u32,
    last: Option<(Instant, Outcome)>,
    /// When the app was first seen listening (start of the initial delay);
    /// None again once it refuses connections (a restart starts over).
    up_since: Option<Instant>,
    /// The app passed once since it came up: no more quick retries.
    passed_since_up: bool,
}

/// The check's state across `/ready` calls; one per sidecar.
#[derive(Debug, Default)]
pub struct AppReadinessCheck {
    state: Mutex<State>,
}

impl AppReadinessCheck {
    /// Whether the app counts as ready now, and the last outcome (for the
    /// 503 text). Concurrent callers take turns: one check at a time.
    pub async fn ready(&self, probe: &AppReadiness) -> (bool, Option<Outcome>) {
        let mut state = self.state.lock().await;
        let period = Duration::from_secs(u64::from(probe.period_seconds));
        if let Some((at, _)) = &state.last
            && state.ready
            && at.elapsed() < period
        {
            return (true, state.last.as_ref().map(|(_, o)| o.clone()));
        }
        let started = Instant::now();
        loop {
            let outcome = check(probe).await;
            state.record(probe, outcome);
            // Until the app first passes, a quick failure is worth a retry:
            // the app is coming up, and the next kubelet probe is a second
            // away. A slow failure (a timeout) has used the wait up already.
            if state.ready
                || state.passes > 0
                || state.passed_since_up
                || started.elapsed() + RETRY_EVERY >= FIRST_PASS_WAIT
            {
                break;
            }
            tokio::time::sleep(RETRY_EVERY).await;
        }
        (state.ready, state.last.as_ref().map(|(_, o)| o.clone()))
    }
}

impl State {
    fn record(&mut self, probe: &AppReadiness, outcome: Outcome) {
        let now = Instant::now();
        if outcome == Outcome::Refused {
            // The app is gone: a restarted app starts unready, as the kubelet
            // resets a new container's readiness.
            *self = State::default();
            self.last = Some((now, outcome));
            return;
        }
        let up_since = *self.up_since.get_or_insert(now);
        if outcome.passed() {
            self.passed_since_up = true;
            self.passes = self.passes.saturating_add(1);
            self.failures = 0;
            let delay = Duration::from_secs(u64::from(probe.initial_delay_seconds));
            if !self.ready && self.passes >= probe.success_threshold && now >= up_since + delay {
                self.ready = true;
            }
        } else {
            self.failures = self.failures.saturating_add(1);
            self.passes = 0;
            if self.ready && self.failures >= probe.failure_threshold {
                self.ready = false;
            }
        }
        self.last = Some((now, outcome));
    }
}

/// One `GET` of the probe's path on loopback, as the kubelet sends it.
pub async fn check(probe: &AppReadiness) -> Outcome {
    let timeout = Duration::from_secs(u64::from(probe.timeout_seconds));
    match tokio::time::timeout(timeout, exchange(probe)).await {
        Ok(outcome) => outcome,
        Err(_) => Outcome::Failed(format!("no answer within {}s", probe.timeout_seconds)),
    }
}

async fn exchange(probe: &AppReadiness) -> Outcome {
    let mut stream = match TcpStream::connect(("127.0.0.1", probe.port)).await {
        Ok(s) => s,
        Err(e) if crate::app::is_gone(&e) => return Outcome::Refused,
        Err(e) => return Outcome::Failed(format!("connect: {e}")),
    };
    let request = request_head(probe);
    if let Err(e) = stream.write_all(request.as_bytes()).await {
        return Outcome::Failed(format!("write: {e}"));
    }
    let mut buf = Vec::with_capacity(256);
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut response = httparse::Response::new(&mut headers);
        match response.parse(&buf) {
            Ok(_) | Err(httparse::Error::TooManyHeaders) if response.code.is_some() => {
                let code = response.code.unwrap_or_default();
                return if (200..400).contains(&code) {
                    Outcome::Pass(code)
                } else {
                    Outcome::Status(code)
                };
            }
            Ok(_) => {}
            Err(e) => return Outcome::Failed(format!("not an HTTP answer: {e}")),
        }
        if buf.len() >= STATUS_LINE_MAX {
            return Outcome::Failed("no status line in the first 1 KiB".into());
        }
        let mut chunk = [0u8; 512];
        match stream.read(&mut chunk).await {
            Ok(0) => return Outcome::Failed("closed before a status line".into()),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) => return Outcome::Failed(format!("read: {e}")),
        }
    }
}

/// The request the kubelet would send: its Host, User-Agent and Accept
/// unless the probe sets its own.
fn request_head(probe: &AppReadiness) -> String {
    let has = |name: &str| {
        probe
            .headers
            .iter()
            .any(|h| h.name.eq_ignore_ascii_case(name))
    };
    let mut head = format!("GET {} HTTP/1.1\r\n", probe.path);
    if !has("host") {
        head.push_str(&format!("Host: 127.0.0.1:{}\r\n", probe.port));
    }
    if !has("user-agent") {
        head.push_str("User-Agent: kube-probe/kubegrace\r\n");
    }
    if !has("accept") {
        head.push_str("Accept: */*\r\n");
    }
    for h in &probe.headers {
        head.push_str(&format!("{}: {}\r\n", h.name, h.value));
    }
    head.push_str("Connection: close\r\n\r\n");
    head
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    fn probe(port: u16) -> AppReadiness {
        AppReadiness {
            period_seconds: 1,
            ..AppReadiness::http_get(port, "/healthz")
        }
    }

    /// The verdict after each outcome, in order.
    fn verdicts(p: &AppReadiness, outcomes: &[Outcome]) -> Vec<bool> {
        let mut s = State::default();
        outcomes
            .iter()
            .map(|o| {
                s.record(p, o.clone());
                s.ready
            })
            .collect()
    }

    #[test]
    fn a_ready_app_turns_unready_only_after_the_failure_threshold() {
        let p = AppReadiness {
            failure_threshold: 2,
            ..probe(1)
        };
        let (pass, fail) = (Outcome::Pass(200), Outcome::Status(503));
        // Ready; one failure of two allowed; unready; successThreshold 1.
        assert_eq!(
            verdicts(&p, &[pass.clone(), fail.clone(), fail, Outcome::Pass(204)]),
            [true, true, false, true]
        );
    }

    #[test]
    fn success_threshold_and_initial_delay_hold_a_new_app_back() {
        let two_passes = AppReadiness {
            success_threshold: 2,
            ..probe(1)
        };
        let pass = Outcome::Pass(200);
        assert_eq!(
            verdicts(&two_passes, &[pass.clone(), pass.clone()]),
            [false, true]
        );
        let delayed = AppReadiness {
            initial_delay_seconds: 3600,
            ..probe(1)
        };
        assert_eq!(
            verdicts(&delayed, &[pass]),
            [false],
            "inside the initial delay"
        );
    }

    #[test]
    fn a_refused_connection_starts_the_app_over() {
        let p = probe(1);
        let mut s = State::default();
        s.record(&p, Outcome::Pass(200));
        assert!(s.ready);
        s.record(&p, Outcome::Refused);
        assert!(!s.ready && s.up_since.is_none() && !s.passed_since_up);
    }

    /// An app on loopback answering every request with `status`.
    async fn app(status: u16) -> (u16, tokio::task::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let task = tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let mut buf = [0u8; 1024];
                let _ = conn.read(&mut buf).await;
                let head = format!("HTTP/1.1 {status} X\r\nContent-Length: 0\r\n\r\n");
                let _ = conn.write_all(head.as_bytes()).await;
            }
        });
        (port, task)
    }

    #[tokio::test]
    async fn a_check_reads_the_status_as_the_kubelet_does() {
        let (ok, a) = app(302).await;
        assert_eq!(check(&probe(ok)).await, Outcome::Pass(302));
        let (bad, b) = app(500).await;
        assert_eq!(check(&probe(bad)).await, Outcome::Status(500));
        a.abort();
        b.abort();
        // A port nobody listens on: bind, learn the port, close.
        let free = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = free.local_addr().expect("addr").port();
        drop(free);
        assert_eq!(check(&probe(port)).await, Outcome::Refused);
    }

    #[tokio::test]
    async fn an_app_that_comes_up_during_ready_passes_in_the_same_call() {
        let free = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = free.local_addr().expect("addr").port();
        drop(free);
        let late = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let listener = TcpListener::bind(("127.0.0.1", port))
                .await
                .expect("rebind");
            while let Ok((mut conn, _)) = listener.accept().await {
                let mut buf = [0u8; 1024];
                let _ = conn.read(&mut buf).await;
                let _ = conn
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                    .await;
            }
        });
        let checker = AppReadinessCheck::default();
        let (ready, last) = checker.ready(&probe(port)).await;
        late.abort();
        assert!(ready, "the app came up 200 ms into a 700 ms wait: {last:?}");
    }
}
