//! What `bench-scale` watches while it runs: the run's GraceRoutes and
//! Deployments through two watches (label-selected on the run), so that
//! "is everything current" costs the API server the changes, not a LIST of
//! every route and pod each second (at 20,000 pods a pod LIST is some
//! 80 MB of JSON, which would load the very API server being measured).
//! Pods are listed once, paginated, when the watches say the run is done,
//! to check that every one of them is injected.
//!
//! The route watch also times the work queue: for each route, the moment
//! its status first reached its generation, so a phase can report how long
//! each route waited from its change to its reconcile (max and p99: a
//! starved route shows as the max).
//!
//! And the operator's request counter (`kubegrace_operator_api_requests_total`)
//! read back from `/metrics`, per client and verb.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures_util::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};

use crate::operator_rig::{GraceRoute, Series, condition, route_resource};

type Key = (String, String);

#[derive(Default)]
struct State {
    /// Route -> (generation, whether Ready at it).
    routes: HashMap<Key, (Option<i64>, bool)>,
    /// Route -> generation -> when its status first reached it.
    current_at: HashMap<Key, BTreeMap<i64, Instant>>,
    /// Deployment -> (generation, rolled out and every replica ready).
    deployments: HashMap<Key, (Option<i64>, bool)>,
}

/// The run's routes and Deployments as two watches see them.
#[derive(Clone, Default)]
pub struct Tracker {
    state: Arc<Mutex<State>>,
}

fn key<K: ResourceExt>(o: &K) -> Key {
    (o.namespace().unwrap_or_default(), o.name_any())
}

fn deployment_done(d: &Deployment) -> bool {
    let s = d.status.clone().unwrap_or_default();
    let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    s.observed_generation == d.metadata.generation
        && s.updated_replicas.unwrap_or(0) == want
        && s.ready_replicas.unwrap_or(0) == want
        && s.replicas.unwrap_or(0) == want
}

impl Tracker {
    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        f(&mut self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    fn route_seen(&self, r: &GraceRoute, now: Instant) {
        let generation = r.metadata.generation;
        let observed = r.data["status"]["observedGeneration"].as_i64();
        let ready = condition(r, "Ready").is_some_and(|(s, g)| s == "True" && g == generation);
        self.with(|s| {
            let k = key(r);
            if let (Some(g), true) = (generation, observed == generation) {
                s.current_at
                    .entry(k.clone())
                    .or_default()
                    .entry(g)
                    .or_insert(now);
            }
            s.routes.insert(k, (generation, ready));
        });
    }

    /// Starts the two watches over the objects labelled `selector`; they
    /// run until the returned handles are aborted.
    pub fn spawn(&self, client: &Client, selector: &str) -> Vec<tokio::task::JoinHandle<()>> {
        let config = watcher::Config::default().labels(selector);
        let routes = Api::<GraceRoute>::all_with(client.clone(), &route_resource());
        let me = self.clone();
        let cfg = config.clone();
        let a = tokio::spawn(async move {
            let mut w = watcher::watcher(routes, cfg).boxed();
            while let Some(e) = w.next().await {
                match e {
                    Ok(Event::Apply(r) | Event::InitApply(r)) => me.route_seen(&r, Instant::now()),
                    Ok(Event::Delete(r)) => me.with(|s| {
                        s.routes.remove(&key(&r));
                    }),
                    Ok(_) => {}
                    // The watcher lists again after an error; a pause keeps
                    // a failing API server from being asked in a tight loop.
                    Err(_) => tokio::time::sleep(std::time::Duration::from_secs(1)).await,
                }
            }
        });
        let me = self.clone();
        let deployments = Api::<Deployment>::all(client.clone());
        let b = tokio::spawn(async move {
            let mut w = watcher::watcher(deployments, config).boxed();
            while let Some(e) = w.next().await {
                match e {
                    Ok(Event::Apply(d) | Event::InitApply(d)) => me.with(|s| {
                        s.deployments
                            .insert(key(&d), (d.metadata.generation, deployment_done(&d)));
                    }),
                    Ok(Event::Delete(d)) => me.with(|s| {
                        s.deployments.remove(&key(&d));
                    }),
                    Ok(_) => {}
                    Err(_) => tokio::time::sleep(std::time::Duration::from_secs(1)).await,
                }
            }
        });
        vec![a, b]
    }

    /// `Err` (what is missing) until `routes` routes are Ready at their
    /// generation and `deployments` Deployments are rolled out and Ready.
    pub fn all_current(&self, routes: usize, deployments: usize) -> Result<(), String> {
        self.with(|s| {
            let ready = s.routes.values().filter(|(_, r)| *r).count();
            let rolled = s.deployments.values().filter(|d| d.1).count();
            if ready == routes && s.routes.len() == routes && rolled == deployments {
                Ok(())
            } else {
                Err(format!(
                    "{ready} of {} routes Ready at their generation ({routes} wanted), {rolled} of {} Deployments rolled out and Ready",
                    s.routes.len(),
                    s.deployments.len()
                ))
            }
        })
    }

    /// How long each route waited, from `changed[route]` (or `since` for a
    /// route not in it) to the first status at a generation above
    /// `above[route]` (0 when absent): the work queue's wait plus one
    /// reconcile, as seen through the watch. Routes not yet current are
    /// counted in `not_reached`.
    pub fn waits(
        &self,
        since: Instant,
        changed: &HashMap<Key, Instant>,
        above: &HashMap<Key, i64>,
    ) -> Value {
        self.with(|s| {
            let mut series = Series::default();
            let mut not_reached = 0;
            for k in s.routes.keys() {
                let from = changed.get(k).copied().unwrap_or(since);
                let floor = above.get(k).copied().unwrap_or(0);
                let first = s
                    .current_at
                    .get(k)
                    .and_then(|m| m.range(floor + 1..).map(|(_, t)| *t).min());
                match first {
                    Some(t) => series.push(t.saturating_duration_since(from)),
                    None => not_reached += 1,
                }
            }
            let mut out = series.json();
            out["not_reached"] = json!(not_reached);
            out
        })
    }

    /// Each Deployment's generation as the watch last saw it.
    pub fn deployment_generations(&self) -> HashMap<Key, i64> {
        self.with(|s| generations_of(&s.deployments))
    }

    /// Each route's generation now (to time the next change from).
    pub fn generations(&self) -> HashMap<Key, i64> {
        self.with(|s| generations_of(&s.routes))
    }
}

/// The generation of each object that has one.
fn generations_of(objects: &HashMap<Key, (Option<i64>, bool)>) -> HashMap<Key, i64> {
    objects
        .iter()
        .filter_map(|(k, (g, _))| Some((k.clone(), (*g)?)))
        .collect()
}

/// `Err` (how many) unless every pod labelled `selector` that is not being
/// deleted carries the webhook's `injected` annotation and is Ready, and
/// there are `want` of them. Paginated: 500 pods a page.
pub async fn pods_injected(
    client: &Client,
    selector: &str,
    injected_key: &str,
    want: usize,
) -> Result<(), String> {
    let api = Api::<Pod>::all(client.clone());
    let (mut live, mut good) = (0, 0);
    let mut token: Option<String> = None;
    // Bounded: a page is 500 pods; 400 pages is 200,000.
    for _ in 0..400 {
        let mut lp = ListParams::default().labels(selector).limit(500);
        lp.continue_token = token.take();
        let page = api.list(&lp).await.map_err(|e| e.to_string())?;
        for p in &page.items {
            if p.metadata.deletion_timestamp.is_some() {
                continue;
            }
            live += 1;
            let ready = p
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            if ready && p.annotations().contains_key(injected_key) {
                good += 1;
            }
        }
        token = page.metadata.continue_.filter(|t| !t.is_empty());
        if token.is_none() {
            break;
        }
    }
    if live == want && good == want {
        Ok(())
    } else {
        Err(format!(
            "{good} injected and Ready of {live} pods ({want} wanted)"
        ))
    }
}

/// The operator's API requests by (client, verb), from `/metrics` text.
pub fn api_requests(text: &str) -> BTreeMap<(String, String), f64> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("kubegrace_operator_api_requests_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let label = |name: &str| {
            labels
                .split(',')
                .find_map(|kv| kv.strip_prefix(&format!("{name}=\"")))
                .map(|v| v.trim_end_matches('"').to_string())
        };
        if let (Some(c), Some(v), Ok(n)) = (label("client"), label("verb"), value.parse::<f64>()) {
            *out.entry((c, v)).or_default() += n;
        }
    }
    out
}

/// An unlabelled counter's value from `/metrics` text (0 when absent).
pub fn plain_counter(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

/// The route controller's requests per reconcile between two scrapes, by
/// verb (watches are left out: they are long-lived, not per reconcile),
/// and the requests of the rest of the operator.
pub fn per_reconcile(before: &str, after: &str) -> Value {
    let (a, b) = (api_requests(before), api_requests(after));
    let reconciles = plain_counter(after, "kubegrace_operator_route_reconciles_total")
        - plain_counter(before, "kubegrace_operator_route_reconciles_total");
    let mut by_verb = serde_json::Map::new();
    let mut other = serde_json::Map::new();
    let mut total = 0.0;
    for ((client, verb), n) in &b {
        let d = n - a
            .get(&(client.clone(), verb.clone()))
            .copied()
            .unwrap_or(0.0);
        if d == 0.0 {
            continue;
        }
        if client == "routes" {
            if verb != "watch" {
                total += d;
            }
            by_verb.insert(verb.clone(), json!(d));
        } else {
            other.insert(verb.clone(), json!(d));
        }
    }
    let r = |x: f64| (x * 100.0).round() / 100.0;
    json!({
        "route_reconciles": reconciles,
        "route_controller_requests": by_verb,
        "requests_per_reconcile": if reconciles > 0.0 { json!(r(total / reconciles)) } else { json!(null) },
        "other_requests": other,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_per_reconcile_leave_watches_and_other_clients_out() {
        let before = "kubegrace_operator_api_requests_total{client=\"routes\",verb=\"list\",resource=\"pods\"} 10\n\
                      kubegrace_operator_route_reconciles_total 2\n";
        let after = "kubegrace_operator_api_requests_total{client=\"routes\",verb=\"list\",resource=\"pods\"} 30\n\
                     kubegrace_operator_api_requests_total{client=\"routes\",verb=\"get\",resource=\"namespaces\"} 10\n\
                     kubegrace_operator_api_requests_total{client=\"routes\",verb=\"watch\",resource=\"pods\"} 3\n\
                     kubegrace_operator_api_requests_total{client=\"other\",verb=\"list\",resource=\"graceroutes\"} 7\n\
                     kubegrace_operator_route_reconciles_total 12\n";
        let v = per_reconcile(before, after);
        assert_eq!(v["route_reconciles"], 10.0);
        assert_eq!(v["requests_per_reconcile"], 3.0);
        assert_eq!(v["route_controller_requests"]["watch"], 3.0);
        assert_eq!(v["other_requests"]["list"], 7.0);
    }
}
