//! The app's readiness check (`appReadiness`), run in the background and
//! read by `/ready`.
//!
//! The kubelet's rules, kept: a check passes on status 200-399; a ready app
//! turns unready after `failureThreshold` failures in a row, checked once
//! per `periodSeconds`; an unready app turns ready after `successThreshold`
//! passes in a row; a new app (started or restarted) is unready until then,
//! and not before `initialDelaySeconds`.
//!
//! `/ready` never runs the check: it reads the verdict [`AppReadinessCheck::run`]
//! keeps current, so a probe is answered at once whatever the app does (a
//! slow check used to hold every probe behind it, and the kubelet gives up
//! after its timeout, a second by default). To keep the one advantage of
//! checking inside `/ready` (the pod turns Ready as soon as the app does,
//! not a period later), an app that is not ready is checked often: every
//! 50 ms at first, slowing to once a second (or the period, if shorter)
//! over its first ten seconds up.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::config::AppReadiness;

/// How often an app that is not ready is checked at first.
const RETRY_EVERY: Duration = Duration::from_millis(50);
/// The slowest an app that is not ready is checked (or its period).
const UNREADY_EVERY: Duration = Duration::from_secs(1);
/// How often the loop looks for a reloaded `appReadiness` while it waits.
const CONFIG_POLL: Duration = Duration::from_secs(1);
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
    /// The app passed once since it came up.
    passed_since_up: bool,
}

/// The check's verdict, kept current by [`AppReadinessCheck::run`]; one
/// per sidecar.
#[derive(Debug)]
pub struct AppReadinessCheck {
    state: Mutex<State>,
    /// The verdict, for readers that wait for a change (tests, logs).
    ready_tx: watch::Sender<bool>,
}

impl Default for AppReadinessCheck {
    fn default() -> Self {
        Self {
            state: Mutex::new(State::default()),
            ready_tx: watch::channel(false).0,
        }
    }
}

impl AppReadinessCheck {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the app counts as ready now, and the last outcome (for the
    /// 503 text). Never waits: the lock is only held to copy the verdict.
    pub fn verdict(&self) -> (bool, Option<Outcome>) {
        let state = self.state();
        (state.ready, state.last.as_ref().map(|(_, o)| o.clone()))
    }

    /// Watches the verdict.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.ready_tx.subscribe()
    }

    /// Checks the app for the life of the process, one check at a time, on
    /// the schedule in the module doc. `probe` gives the check in force (a
    /// reload may add, change or remove it; a change starts over).
    pub async fn run(&self, probe: impl Fn() -> Option<AppReadiness>) {
        let mut current: Option<AppReadiness> = None;
        loop {
            let next = probe();
            if next != current {
                *self.state() = State::default();
                self.ready_tx.send_replace(false);
                current = next;
            }
            let Some(checking) = current.clone() else {
                tokio::time::sleep(CONFIG_POLL).await;
                continue;
            };
            let outcome = check(&checking).await;
            let wait = {
                let mut state = self.state();
                state.record(&checking, outcome);
                self.ready_tx.send_if_modified(|r| {
                    let changed = *r != state.ready;
                    *r = state.ready;
                    changed
                });
                state.next_check_in(&checking)
            };
            // Sleep in steps, so a reload is picked up within CONFIG_POLL
            // even with a period of hours.
            let due = crate::drain::deadline(Instant::now(), wait);
            loop {
                let now = Instant::now();
                if now >= due || probe() != current {
                    break;
                }
                tokio::time::sleep(due.saturating_duration_since(now).min(CONFIG_POLL)).await;
            }
        }
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
            if !self.ready
                && self.passes >= probe.success_threshold
                && now >= crate::drain::deadline(up_since, delay)
            {
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

impl State {
    /// When to check next: a ready app once a period (the kubelet's
    /// ticker); one that is not ready often, every 50 ms at first and
    /// slower the longer it has been up (a tenth of that time), to at most
    /// a second or the period.
    fn next_check_in(&self, probe: &AppReadiness) -> Duration {
        let period = Duration::from_secs(u64::from(probe.period_seconds));
        if self.ready {
            return period;
        }
        let up_for = self.up_since.map_or(Duration::ZERO, |at| at.elapsed());
        (up_for / 10).clamp(RETRY_EVERY, UNREADY_EVERY.min(period).max(RETRY_EVERY))
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
    async fn the_background_check_sees_a_late_app_and_verdicts_never_wait() {
        let free = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = free.local_addr().expect("addr").port();
        drop(free);
        let checker = std::sync::Arc::new(AppReadinessCheck::default());
        let mut ready = checker.subscribe();
        let runner = {
            let checker = checker.clone();
            tokio::spawn(async move { checker.run(|| Some(probe(port))).await })
        };
        // No app yet: the verdict is there at once, and it is "not ready".
        assert!(!checker.verdict().0);
        let listener = TcpListener::bind(("127.0.0.1", port))
            .await
            .expect("rebind");
        let late = tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let mut buf = [0u8; 1024];
                let _ = conn.read(&mut buf).await;
                let _ = conn
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                    .await;
            }
        });
        ready.wait_for(|r| *r).await.expect("checker alive");
        assert!(checker.verdict().0);
        runner.abort();
        late.abort();
    }

    #[test]
    fn an_app_that_is_not_ready_is_checked_often_and_a_ready_one_once_a_period() {
        let p = AppReadiness {
            period_seconds: 10,
            ..probe(1)
        };
        let mut s = State::default();
        assert_eq!(s.next_check_in(&p), RETRY_EVERY);
        s.record(&p, Outcome::Pass(200));
        assert_eq!(s.next_check_in(&p), Duration::from_secs(10));
        let huge = AppReadiness {
            period_seconds: u32::MAX,
            initial_delay_seconds: u32::MAX,
            ..probe(1)
        };
        let mut s = State::default();
        s.record(&huge, Outcome::Pass(200));
        assert!(!s.ready, "inside a huge initial delay, and no panic");
        assert!(s.next_check_in(&huge) <= UNREADY_EVERY);
    }
}
