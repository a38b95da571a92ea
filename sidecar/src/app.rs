//! The app as the sidecar sees it: reachable or gone, and what happens to
//! requests while it is gone.
//!
//! An app container dies inside a pod that stays: kubelet restarts it after
//! a failed livenessProbe (its preStop runs first), after a crash (exit
//! non-zero) or an OOM kill (no preStop at all). Between the old process
//! going and the new one listening, a connect to the app is refused. This
//! module turns that into evidence, and spends as little of it as possible:
//!
//! - **Evidence.** The app is *down* once a connect to it is refused (or
//!   times out), seen by a request, by `/ready`, or by the probe below; it
//!   is *up* again once a connect succeeds. Only a connect decides: a
//!   request that fails on a connection that was already open says the app
//!   may be gone, so it wakes the probe at once, but proves nothing by itself
//!   (the app may only have closed an idle socket).
//! - **Probe.** A loop connects to the app every [`FAST_PROBE`] while the
//!   app is down (to see it come back within a blink) or while a
//!   provisional drain is under way (to see it go: a preStop hook followed by
//!   the app's exit). Otherwise it sleeps until woken: a healthy, serving
//!   pod's app gets no extra connections.
//! - **Readiness.** `/ready` answers 503 while the app is down, so the pod
//!   leaves its Service's endpoints and routers move away.
//! - **Hold.** A request that meets a refused connect waits, up to
//!   `upstreamPool.holdTimeout` (default 5 s), for the app to come back,
//!   and is then sent to it. Past the hold it gets 503 with `Retry-After`;
//!   never a reset or a refused connection. The connection to the client
//!   stays open throughout. An exit drain (SIGTERM: the pod is going away,
//!   the app will not come back) ends every hold at once with the 503.
//! - **Lost.** A request the app had already received when it died is the
//!   app's loss: nothing can tell whether it acted on it, so it is not
//!   retried. It is answered 502 (as before), counted
//!   (`kubegrace_app_lost_requests_total`) and reported in the log line that
//!   closes the episode and in `GET /upstreams`.
//! - **Resume.** Every observation also goes to the drain machine
//!   ([`Drain::app_gone`], [`Drain::resume`]): a provisional drain whose app
//!   was gone and is back returns to `Serving` (the rule is in `drain.rs`).
//!
//! With several upstream instances (blue/green outside Kubernetes) the slot
//! switch in `upstream/slots.rs` already moves requests to the instance that is
//! up, so there is no watch, no hold and no resume there.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Response, StatusCode};
use http_body_util::Full;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use crate::config::{Endpoint, UpstreamPoolConfig};
use crate::drain::{Drain, Phase};
use crate::error::Error;
use crate::metrics::Family;

/// Probe period while the app is down or a provisional drain runs. A
/// kubelet restart leaves the app's port closed for a second or more; 50 ms
/// sees every one of them and brings the pod back within a blink.
pub const FAST_PROBE: Duration = Duration::from_millis(50);
/// Longest one probe connect waits (the pool's connect timeout when shorter).
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// What the app watch knows; cheap to share.
pub struct AppWatch {
    endpoint: Endpoint,
    drain: Drain,
    hold_timeout: Duration,
    probe_timeout: Duration,
    /// `Some(true)` up, `Some(false)` down, `None` not seen yet.
    up_tx: watch::Sender<Option<bool>>,
    /// Wakes the probe: something suggests the app may be gone.
    kick: Notify,
    episode: Mutex<Episode>,
    downs: AtomicU64,
    held_now: AtomicU64,
    held_sent: AtomicU64,
    held_expired: AtomicU64,
    lost: AtomicU64,
}

/// One stretch of the app being down, for the log line that closes it.
#[derive(Default)]
struct Episode {
    since: Option<Instant>,
    held: u64,
    expired: u64,
    lost: u64,
}

fn lock(m: &Mutex<Episode>) -> std::sync::MutexGuard<'_, Episode> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl AppWatch {
    pub fn new(endpoint: Endpoint, pool: &UpstreamPoolConfig, drain: Drain) -> Arc<AppWatch> {
        let (up_tx, _) = watch::channel(None);
        Arc::new(AppWatch {
            endpoint,
            drain,
            hold_timeout: pool.hold_timeout.get(),
            probe_timeout: pool.connect_timeout.get().min(PROBE_TIMEOUT),
            up_tx,
            kick: Notify::new(),
            episode: Mutex::new(Episode::default()),
            downs: AtomicU64::new(0),
            held_now: AtomicU64::new(0),
            held_sent: AtomicU64::new(0),
            held_expired: AtomicU64::new(0),
            lost: AtomicU64::new(0),
        })
    }

    /// Whether the last connect to the app was refused.
    pub fn is_down(&self) -> bool {
        *self.up_tx.borrow() == Some(false)
    }

    /// Waits at most `wait` for a connect to find the app up (the probe loop
    /// connects every [`FAST_PROBE`] while it is down); whether it did.
    pub async fn wait_up(&self, wait: Duration) -> bool {
        let mut up = self.up_tx.subscribe();
        matches!(
            tokio::time::timeout(wait, up.wait_for(|v| *v == Some(true))).await,
            Ok(Ok(_))
        )
    }

    /// Records what a connect to the app found, and passes it on to the
    /// drain machine. Cheap when nothing changes (one watch read).
    pub fn observe(&self, reachable: bool) {
        if !reachable {
            self.drain.app_gone();
        }
        let before = *self.up_tx.borrow();
        if before != Some(reachable) {
            // send_if_modified settles races between two observers: only
            // one of them sees the change and logs it.
            let changed = self.up_tx.send_if_modified(|v| {
                let changed = *v != Some(reachable);
                *v = Some(reachable);
                changed
            });
            if changed {
                self.drain.app_reachable(reachable);
                if reachable {
                    self.came_back(before.is_some());
                } else {
                    self.went_away(before.is_some());
                }
            }
        }
        if reachable && self.drain.phase() != Phase::Serving {
            self.drain.resume("the app was gone and is reachable again");
        }
    }

    /// `was_seen`: the app had been up before (a native sidecar starts
    /// before its app, so the first refusals are only the app starting).
    fn went_away(&self, was_seen: bool) {
        self.downs.fetch_add(u64::from(was_seen), Ordering::Relaxed);
        let mut ep = lock(&self.episode);
        *ep = Episode {
            since: Some(Instant::now()),
            ..Episode::default()
        };
        drop(ep);
        if was_seen {
            tracing::warn!(
                upstream = %self.endpoint,
                hold = ?self.hold_timeout,
                "the app refuses connections (restarting?): /ready fails, new requests are held until it is back"
            );
        } else {
            tracing::info!(upstream = %self.endpoint, "the app does not accept connections yet; /ready fails until it does");
        }
        self.kick.notify_one();
    }

    fn came_back(&self, was_seen: bool) {
        let ep = std::mem::take(&mut *lock(&self.episode));
        if !was_seen {
            return;
        }
        if ep.since.is_some() && self.downs.load(Ordering::Relaxed) == 0 {
            tracing::info!(upstream = %self.endpoint, "the app accepts connections");
            return;
        }
        let down_for = ep.since.map(|s| s.elapsed()).unwrap_or_default();
        tracing::info!(
            upstream = %self.endpoint,
            down_secs = down_for.as_secs_f64(),
            held = ep.held,
            held_expired = ep.expired,
            lost_in_flight = ep.lost,
            "the app accepts connections again after {:.1}s: {} requests were held for it ({} waited too long and got 503), {} were lost in flight when it went away",
            down_for.as_secs_f64(),
            ep.held,
            ep.expired,
            ep.lost,
        );
    }

    /// A request the app had received failed with its connection (reset,
    /// closed before the response): the app's loss. Wakes the probe, which
    /// finds out whether the app is really gone.
    pub fn lost_in_flight(&self) {
        self.lost.fetch_add(1, Ordering::Relaxed);
        lock(&self.episode).lost += 1;
        self.kick.notify_one();
    }

    /// Waits for the app after a refused connect. `Ok(())`: it is back, try
    /// again. `Err`: the hold ran out (or the pod is going away), answer 503.
    pub async fn hold(&self, started: Instant, first: bool) -> Result<(), Error> {
        let deadline = started + self.hold_timeout;
        if first {
            self.held_now.fetch_add(1, Ordering::Relaxed);
            lock(&self.episode).held += 1;
        }
        let mut up = self.up_tx.subscribe();
        let mut drain = self.drain.subscribe();
        let back = tokio::select! {
            res = up.wait_for(|v| *v == Some(true)) => res.is_ok(),
            _ = tokio::time::sleep_until(deadline) => false,
            // The pod is going away: the app will not come back.
            _ = drain.wait_for(|s| s.exit) => false,
        };
        if back && Instant::now() < deadline {
            return Ok(());
        }
        self.held_now.fetch_sub(1, Ordering::Relaxed);
        self.held_expired.fetch_add(1, Ordering::Relaxed);
        lock(&self.episode).expired += 1;
        Err(Error::AppDown {
            endpoint: self.endpoint.to_string(),
            waited: started.elapsed(),
        })
    }

    /// A held request got its connection.
    pub fn hold_ended(&self) {
        self.held_now.fetch_sub(1, Ordering::Relaxed);
        self.held_sent.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether an exit drain (SIGTERM) is under way: then nothing is held.
    pub fn holds(&self) -> bool {
        !self.hold_timeout.is_zero() && !self.drain.is_exit()
    }

    /// Probes the app forever: fast while it is down or a provisional drain
    /// runs, not at all otherwise (until woken).
    pub async fn run(self: Arc<Self>) {
        let mut drain_rx = self.drain.subscribe();
        loop {
            let fast =
                self.is_down() || (self.drain.phase() != Phase::Serving && !self.drain.is_exit());
            if fast {
                tokio::time::sleep(FAST_PROBE).await;
            } else {
                tokio::select! {
                    _ = self.kick.notified() => {}
                    changed = drain_rx.changed() => {
                        if changed.is_err() {
                            return;
                        }
                        continue;
                    }
                }
            }
            let reachable = crate::upstream::slots::probe(&self.endpoint, self.probe_timeout).await;
            self.observe(reachable);
        }
    }

    /// `GET /upstreams`: the app's state and this process's tallies.
    pub fn status(&self) -> serde_json::Value {
        let state = match *self.up_tx.borrow() {
            Some(true) => "up",
            Some(false) => "down",
            None => "not probed",
        };
        let down_secs = lock(&self.episode).since.map(|s| s.elapsed().as_secs_f64());
        serde_json::json!({
            "state": state,
            "downSeconds": down_secs,
            "downs": self.downs.load(Ordering::Relaxed),
            "holdTimeout": humantime::format_duration(self.hold_timeout).to_string(),
            "heldNow": self.held_now.load(Ordering::Relaxed),
            "heldSent": self.held_sent.load(Ordering::Relaxed),
            "heldExpired": self.held_expired.load(Ordering::Relaxed),
            "lostInFlight": self.lost.load(Ordering::Relaxed),
            "drainResumes": self.drain.resumes_total(),
        })
    }

    /// Appended to `/metrics`.
    pub fn render_metrics(&self, out: &mut String) {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Family::new(
            out,
            "kubegrace_app_up",
            "gauge",
            "1 while the app accepts connections, 0 while it refuses them (restarting).",
        )
        .value(u64::from(!self.is_down()));
        Family::new(
            out,
            "kubegrace_app_down_total",
            "counter",
            "Times the app was seen refusing connections (container restart, crash, OOM kill).",
        )
        .value(get(&self.downs));
        Family::new(
            out,
            "kubegrace_drain_resumes_total",
            "counter",
            "Provisional drains (preStop, /drain) that returned to serving because the app was gone and came back without a SIGTERM.",
        )
        .value(self.drain.resumes_total());
        Family::new(
            out,
            "kubegrace_held_requests",
            "gauge",
            "Requests waiting now for the app to accept connections again.",
        )
        .value(get(&self.held_now));
        Family::new(
            out,
            "kubegrace_held_requests_total",
            "counter",
            "Requests held while the app was down, by outcome: sent once it was back, or 503 when the hold ran out.",
        )
        .by(
            "outcome",
            [
                ("sent", get(&self.held_sent)),
                ("expired", get(&self.held_expired)),
            ],
        );
        Family::new(
            out,
            "kubegrace_app_lost_requests_total",
            "counter",
            "Requests the app had received when its connection failed (it died with them in flight): the app's loss, answered 502.",
        )
        .value(get(&self.lost));
    }
}

/// Whether a connect error means the app is not there (its port is closed
/// or the connect timed out), as opposed to a local failure.
pub fn is_gone(err: &io::Error) -> bool {
    matches!(
        err.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::TimedOut
            | io::ErrorKind::NotFound
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
    )
}

/// Whether a failed exchange means the connection died under a request the
/// app had received (as opposed to a protocol error or a body limit).
pub fn is_lost_in_flight(err: &crate::Error) -> bool {
    let mut source = match err {
        crate::Error::Upstream(err) => {
            if err.is_incomplete_message() || err.is_closed() {
                return true;
            }
            std::error::Error::source(err)
        }
        crate::Error::UpstreamH2(_) => {
            return match err.h2wire() {
                Some(crate::h2wire::client::Error::Io(io)) => connection_died(io),
                _ => false,
            };
        }
        _ => return false,
    };
    while let Some(e) = source {
        if let Some(io) = e.downcast_ref::<io::Error>() {
            return connection_died(io);
        }
        source = e.source();
    }
    false
}

/// The kinds of a connection that died under a request.
const DIED: [io::ErrorKind; 4] = [
    io::ErrorKind::ConnectionReset,
    io::ErrorKind::BrokenPipe,
    io::ErrorKind::UnexpectedEof,
    io::ErrorKind::ConnectionAborted,
];

fn connection_died(io: &io::Error) -> bool {
    DIED.contains(&io.kind())
}

/// Seconds a client should wait before retrying after a hold ran out.
const RETRY_AFTER: &str = "1";

/// The proxy's answer to a request whose hold ran out: 503, `Retry-After`.
/// Also the answer to a request the app cannot take in its protocol
/// (upstream/downgrade.rs): neither is the app failing, so the caller
/// counts no breaker failure. `None` for any other error.
pub fn hold_expired_response(err: &Error) -> Option<Response<Full<Bytes>>> {
    let Error::AppDown { waited, .. } = err else {
        return crate::upstream::protocol_mismatch_response(err);
    };
    let mut resp = Response::new(Full::new(Bytes::from(format!(
        "the app is restarting; held {:.1}s, retry shortly\n",
        waited.as_secs_f64()
    ))));
    *resp.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    let headers = resp.headers_mut();
    headers.insert(header::RETRY_AFTER, HeaderValue::from_static(RETRY_AFTER));
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    Some(resp)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{DrainConfig, HumanDuration};

    fn watch_with(hold_ms: u64) -> (Arc<AppWatch>, Drain) {
        let drain = Drain::new(DrainConfig {
            min_delay: HumanDuration::from_millis(100),
            quiet: HumanDuration::from_millis(50),
            max_delay: HumanDuration::from_millis(1000),
            timeout: HumanDuration::from_millis(1000),
            ..DrainConfig::default()
        });
        let pool = UpstreamPoolConfig {
            hold_timeout: HumanDuration::from_millis(hold_ms),
            ..UpstreamPoolConfig::default()
        };
        let endpoint = Endpoint::Tcp(std::net::SocketAddr::from(([127, 0, 0, 1], 9)));
        (AppWatch::new(endpoint, &pool, drain.clone()), drain)
    }

    #[tokio::test(start_paused = true)]
    async fn a_held_request_goes_on_when_the_app_is_back() {
        let (app, _) = watch_with(5000);
        app.observe(false);
        assert!(app.is_down());
        let t0 = Instant::now();
        let held = {
            let app = app.clone();
            tokio::spawn(async move { app.hold(t0, true).await })
        };
        tokio::time::sleep(Duration::from_millis(800)).await;
        app.observe(true);
        assert!(held.await.expect("task").is_ok());
        app.hold_ended();
        let status = app.status();
        assert_eq!(status["heldSent"], 1, "{status}");
        assert_eq!(status["heldNow"], 0, "{status}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_hold_that_runs_out_is_a_503_with_retry_after() {
        let (app, _) = watch_with(2000);
        app.observe(false);
        let t0 = Instant::now();
        let err = app.hold(t0, true).await.expect_err("app never came back");
        assert_eq!(Instant::now() - t0, Duration::from_secs(2));
        let resp = hold_expired_response(&err).expect("a 503");
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(resp.headers()[header::RETRY_AFTER], "1");
        assert_eq!(app.status()["heldExpired"], 1);
    }

    #[tokio::test(start_paused = true)]
    async fn sigterm_ends_every_hold_at_once() {
        let (app, drain) = watch_with(60_000);
        tokio::spawn(drain.clone().run());
        app.observe(false);
        let t0 = Instant::now();
        let held = {
            let app = app.clone();
            tokio::spawn(async move { app.hold(t0, true).await })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        drain.trigger_exit("SIGTERM");
        assert!(held.await.expect("task").is_err());
        assert!(Instant::now() - t0 < Duration::from_secs(1));
        assert!(!app.holds());
    }

    #[tokio::test(start_paused = true)]
    async fn observations_drive_the_resume() {
        let (app, drain) = watch_with(5000);
        tokio::spawn(drain.clone().run());
        app.observe(false); // the app starting after its native sidecar
        app.observe(true);
        assert_eq!(app.status()["downs"], 0);
        drain.trigger("admin /drain");
        drain.drained().await;
        app.observe(true);
        assert_eq!(drain.phase(), Phase::Drained, "the app never went away");
        app.observe(false);
        assert_eq!(drain.phase(), Phase::Drained);
        app.observe(true);
        assert_eq!(drain.phase(), Phase::Serving);
        assert_eq!(app.status()["drainResumes"], 1);
        let mut out = String::new();
        app.render_metrics(&mut out);
        assert!(out.contains("kubegrace_drain_resumes_total 1\n"), "{out}");
        assert!(out.contains("kubegrace_app_down_total 1\n"), "{out}");
        assert!(out.contains("kubegrace_app_up 1\n"), "{out}");
    }
}
