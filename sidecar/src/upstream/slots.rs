//! One or several instances of the app behind the sidecar, and which one a
//! new request goes to.
//!
//! With one upstream (the Kubernetes case) this is a thin wrapper: every
//! request goes to it and nothing is probed.
//!
//! With several (`--upstream A --upstream B`, or `upstreams: [A, B]`), the
//! sidecar supports an app upgrade outside Kubernetes, blue/green style:
//! v1 serves in slot A, v2 starts in the free slot B, and once B accepts
//! connections new requests go to B while requests in flight on A finish
//! there. `GET /upstreams` on the admin port shows each slot's in-flight
//! count, so the operator stops v1 once A reaches 0.
//!
//! Rules:
//! - every slot is probed with a connect every [`PROBE_INTERVAL`]; the
//!   ACTIVE slot is the reachable one that most recently became reachable
//!   (at start, when several are up, the first listed);
//! - a request keeps the instance it was sent to (the guard holds its
//!   client), so switching never cuts anything;
//! - when a slot stops being active (or goes down), its client is replaced
//!   by a fresh one: the idle keep-alive connections to the old instance
//!   close as soon as the requests still on them finish, so the old
//!   instance's shutdown never races the proxy reusing one of them;
//! - when the active slot stops accepting connections, new requests go to
//!   the most recently reachable other slot (up to one probe interval
//!   later); with none reachable they keep going to the active one and
//!   fail like they would with a single upstream (502).

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;

use crate::app::AppWatch;
use crate::config::{Endpoint, UpstreamPoolConfig};
use crate::error::Result;
use crate::metrics::Family;
use crate::state::Shared;
use crate::upstream::Upstream;

/// How often each slot is probed when there are several.
pub const PROBE_INTERVAL: Duration = Duration::from_millis(200);
/// Longest a probe waits for a connect (the pool's connect timeout when it
/// is shorter).
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

const UNKNOWN: u8 = 0;
const UP: u8 = 1;
const DOWN: u8 = 2;

/// One app instance.
pub struct Slot {
    pub endpoint: Endpoint,
    client: ArcSwap<Upstream>,
    reach: AtomicU8,
    /// When it last became reachable, as a sequence number (0: never).
    up_since: AtomicU64,
    /// Requests sent to it whose response head has not arrived yet (raw TCP
    /// mode: open connections).
    in_flight: AtomicI64,
    requests: AtomicU64,
}

impl Slot {
    fn state(&self) -> &'static str {
        match self.reach.load(Ordering::Acquire) {
            UP => "up",
            DOWN => "down",
            _ => "unknown",
        }
    }
}

/// The instances and the choice between them.
pub struct Upstreams {
    slots: Vec<Arc<Slot>>,
    active: AtomicUsize,
    pool: UpstreamPoolConfig,
    sequence: AtomicU64,
    /// The app's reachability, with one upstream (app.rs); `None` with
    /// several, where the slot switch covers an instance that is down.
    app: Option<Arc<AppWatch>>,
}

/// The instance a request goes to; counts as in flight there until dropped.
pub struct Picked {
    slot: Arc<Slot>,
    upstream: Arc<Upstream>,
}

impl std::ops::Deref for Picked {
    type Target = Upstream;
    fn deref(&self) -> &Upstream {
        &self.upstream
    }
}

impl Picked {
    pub fn endpoint(&self) -> &Endpoint {
        &self.slot.endpoint
    }
}

impl Drop for Picked {
    fn drop(&mut self) {
        self.slot.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Upstreams {
    /// `app` is used only with a single endpoint (see the field).
    pub fn new(
        endpoints: &[Endpoint],
        pool: &UpstreamPoolConfig,
        app: Option<Arc<AppWatch>>,
    ) -> Result<Upstreams> {
        let app = app.filter(|_| endpoints.len() == 1);
        let slots = endpoints
            .iter()
            .map(|endpoint| {
                Ok(Arc::new(Slot {
                    endpoint: endpoint.clone(),
                    client: ArcSwap::from_pointee(Upstream::new(endpoint, pool, app.clone())?),
                    reach: AtomicU8::new(UNKNOWN),
                    up_since: AtomicU64::new(0),
                    in_flight: AtomicI64::new(0),
                    requests: AtomicU64::new(0),
                }))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Upstreams {
            slots,
            active: AtomicUsize::new(0),
            pool: *pool,
            sequence: AtomicU64::new(0),
            app,
        })
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The instance for a new request (or raw TCP connection).
    pub fn pick(&self) -> Picked {
        let index = if self.slots.len() == 1 {
            0
        } else {
            self.choose()
        };
        let slot = &self.slots[index];
        slot.in_flight.fetch_add(1, Ordering::Relaxed);
        slot.requests.fetch_add(1, Ordering::Relaxed);
        Picked {
            slot: slot.clone(),
            upstream: slot.client.load_full(),
        }
    }

    fn choose(&self) -> usize {
        let active = self.active.load(Ordering::Acquire);
        if self.slots[active].reach.load(Ordering::Acquire) != DOWN {
            return active;
        }
        // The active one refuses: the most recently reachable other one.
        self.most_recent_up().unwrap_or(active)
    }

    fn most_recent_up(&self) -> Option<usize> {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.reach.load(Ordering::Acquire) == UP)
            .max_by_key(|(_, s)| s.up_since.load(Ordering::Acquire))
            .map(|(i, _)| i)
    }

    /// Whether any instance accepted the last probe (several upstreams).
    pub fn any_up(&self) -> bool {
        self.slots
            .iter()
            .any(|s| s.reach.load(Ordering::Acquire) == UP)
    }

    /// The app watch (one upstream only).
    pub fn app(&self) -> Option<&Arc<AppWatch>> {
        self.app.as_ref()
    }

    /// The single (or first) endpoint.
    pub fn primary(&self) -> &Endpoint {
        &self.slots[0].endpoint
    }

    /// Probes every slot once and applies what it found. At start (no slot
    /// seen yet) several reachable ones rank in list order: the first wins.
    pub async fn probe_all(&self) {
        let timeout = self.pool.connect_timeout.get().min(PROBE_TIMEOUT);
        // Side by side: one round stays within one timeout.
        let results =
            futures_util::future::join_all(self.slots.iter().map(|s| probe(&s.endpoint, timeout)))
                .await;
        let first_round = self
            .slots
            .iter()
            .all(|s| s.reach.load(Ordering::Acquire) == UNKNOWN);
        let order: Vec<usize> = if first_round {
            (0..self.slots.len()).rev().collect()
        } else {
            (0..self.slots.len()).collect()
        };
        for i in order {
            let slot = &self.slots[i];
            let now = if results[i] { UP } else { DOWN };
            let before = slot.reach.swap(now, Ordering::AcqRel);
            if before == now {
                continue;
            }
            if now == UP {
                let seq = self.sequence.fetch_add(1, Ordering::AcqRel) + 1;
                slot.up_since.store(seq, Ordering::Release);
                tracing::info!(upstream = %slot.endpoint, "upstream accepts connections");
            } else {
                if before == UP {
                    tracing::warn!(upstream = %slot.endpoint, "upstream stopped accepting connections");
                }
                self.refresh(slot);
            }
        }
        let current = self.active.load(Ordering::Acquire);
        if let Some(next) = self.most_recent_up()
            && next != current
        {
            self.active.store(next, Ordering::Release);
            let old = &self.slots[current];
            tracing::info!(
                upstream = %self.slots[next].endpoint,
                previous = %old.endpoint,
                previous_in_flight = old.in_flight.load(Ordering::Relaxed),
                "new requests go to {}; {} finishes what it has",
                self.slots[next].endpoint,
                old.endpoint
            );
            self.refresh(old);
        }
    }

    /// A fresh client for `slot`: the old one's idle connections close once
    /// the requests still using it are done.
    fn refresh(&self, slot: &Slot) {
        match Upstream::new(&slot.endpoint, &self.pool, self.app.clone()) {
            Ok(fresh) => {
                slot.client.store(Arc::new(fresh));
            }
            Err(err) => {
                tracing::warn!(upstream = %slot.endpoint, error = %err, "cannot renew the upstream client; keeping the old one");
            }
        }
    }

    /// `GET /upstreams`.
    pub fn status(&self) -> serde_json::Value {
        let active = self.active.load(Ordering::Acquire);
        let list: Vec<serde_json::Value> = self
            .slots
            .iter()
            .enumerate()
            .map(|(i, s)| {
                serde_json::json!({
                    "endpoint": s.endpoint.to_string(),
                    "state": if self.slots.len() == 1 { "not probed" } else { s.state() },
                    "active": i == active,
                    "inFlight": s.in_flight.load(Ordering::Relaxed),
                    "requests": s.requests.load(Ordering::Relaxed),
                })
            })
            .collect();
        let mut status = serde_json::json!({
            "active": self.slots[active].endpoint.to_string(),
            "upstreams": list,
        });
        if let Some(app) = &self.app {
            status["app"] = app.status();
        }
        status
    }

    /// Per-instance metrics, appended to `/metrics`.
    pub fn render_metrics(&self, out: &mut String) {
        let active = self.active.load(Ordering::Acquire);
        Family::new(
            out,
            "kubegrace_upstream_requests_total",
            "counter",
            "Requests (raw TCP: connections) sent to each app instance.",
        )
        .by(
            "upstream",
            self.per_slot(|_, s| s.requests.load(Ordering::Relaxed)),
        );
        Family::new(
            out,
            "kubegrace_upstream_inflight_requests",
            "gauge",
            "Requests waiting for each app instance's answer (raw TCP: open connections).",
        )
        .by(
            "upstream",
            self.per_slot(|_, s| s.in_flight.load(Ordering::Relaxed)),
        );
        Family::new(
            out,
            "kubegrace_upstream_active",
            "gauge",
            "1 for the app instance new requests go to.",
        )
        .by("upstream", self.per_slot(|i, _| u8::from(i == active)));
        if self.slots.len() > 1 {
            Family::new(
                out,
                "kubegrace_upstream_up",
                "gauge",
                "1 when the app instance accepted the last connect probe.",
            )
            .by(
                "upstream",
                self.per_slot(|_, s| u8::from(s.reach.load(Ordering::Acquire) == UP)),
            );
        }
    }

    /// One series per instance: its endpoint as the label value, and
    /// `value` of (its index, itself).
    fn per_slot<V>(&self, value: impl Fn(usize, &Slot) -> V) -> impl Iterator<Item = (String, V)> {
        self.slots
            .iter()
            .enumerate()
            .map(move |(i, s)| (s.endpoint.to_string(), value(i, s)))
    }
}

/// Whether `endpoint` accepts a connection within `timeout`.
pub async fn probe(endpoint: &Endpoint, timeout: Duration) -> bool {
    match endpoint {
        Endpoint::Tcp(addr) => matches!(
            tokio::time::timeout(timeout, tokio::net::TcpStream::connect(addr)).await,
            Ok(Ok(_))
        ),
        Endpoint::Unix(path) => matches!(
            tokio::time::timeout(timeout, tokio::net::UnixStream::connect(path)).await,
            Ok(Ok(_))
        ),
    }
}

/// Probes the instances forever (only started when there are several).
pub(crate) async fn watch(shared: Arc<Shared>) {
    let mut tick = tokio::time::interval(PROBE_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        shared.upstreams.probe_all().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint(l: &std::net::TcpListener) -> Endpoint {
        Endpoint::Tcp(l.local_addr().expect("addr"))
    }

    #[tokio::test]
    async fn new_requests_follow_the_instance_that_came_up_last() {
        let blue = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let green_addr = std::net::TcpListener::bind("127.0.0.1:0")
            .expect("bind")
            .local_addr()
            .expect("addr");
        let ups = Upstreams::new(
            &[endpoint(&blue), Endpoint::Tcp(green_addr)],
            &UpstreamPoolConfig::default(),
            None,
        )
        .expect("upstreams");
        ups.probe_all().await;
        let on_blue = ups.pick();
        assert_eq!(on_blue.endpoint(), &endpoint(&blue));

        let green = std::net::TcpListener::bind(green_addr).expect("green up");
        ups.probe_all().await;
        let on_green = ups.pick();
        assert_eq!(on_green.endpoint(), &endpoint(&green), "the newest wins");
        let status = ups.status();
        assert_eq!(status["upstreams"][0]["inFlight"], 1, "{status}");
        drop(on_blue);
        assert_eq!(ups.status()["upstreams"][0]["inFlight"], 0);

        // Green goes away: back to blue, which is still up.
        drop(green);
        ups.probe_all().await;
        assert_eq!(ups.pick().endpoint(), &endpoint(&blue));
    }

    #[tokio::test]
    async fn at_start_the_first_listed_of_several_up_wins() {
        let a = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let b = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let ups = Upstreams::new(
            &[endpoint(&a), endpoint(&b)],
            &UpstreamPoolConfig::default(),
            None,
        )
        .expect("upstreams");
        ups.probe_all().await;
        assert_eq!(ups.pick().endpoint(), &endpoint(&a));
        let mut out = String::new();
        ups.render_metrics(&mut out);
        assert!(out.contains(&format!(
            "kubegrace_upstream_active{{upstream=\"{}\"}} 1",
            endpoint(&a)
        )));
    }
}
