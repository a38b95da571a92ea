//! What `make bench-scale` holds the operator to, read off its own report
//! (`bench/results/scale.json`), so that a claim made once about the
//! operator at scale stays true after the next change.
//!
//! Two kinds. A *kept* check is something the operator was changed to do
//! (one admission review per pod, no reconcile of a route by its own status
//! write, a fixed number of API requests per reconcile): bench-scale fails
//! when one breaks. A *goal* is issue #38's target, which a two-core shared
//! machine may not reach: reported beside the kept ones, never failing.

use serde_json::{Value, json};

/// One check: its value against its bound (`value <= bound` passes).
#[derive(Debug, Clone, PartialEq)]
pub struct Check {
    pub name: &'static str,
    pub kept: bool,
    pub value: Option<f64>,
    pub bound: f64,
}

impl Check {
    /// A value the report lacks fails: a check that cannot read its number
    /// must not pass.
    pub fn ok(&self) -> bool {
        self.value.is_some_and(|v| v <= self.bound)
    }
}

fn at(report: &Value, path: &str) -> Option<f64> {
    report.pointer(path)?.as_f64()
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

/// Every check of one report.
pub fn checks(report: &Value) -> Vec<Check> {
    let routes = at(report, "/routes");
    let admitted = [
        at(report, "/pods"),
        at(report, "/storm/admission_during_storm/with_webhook/n"),
        at(
            report,
            "/storm/admission_during_storm_unrouted/with_webhook/n",
        ),
    ]
    .into_iter()
    .sum::<Option<f64>>();
    let worst = |paths: &[&str]| paths.iter().filter_map(|p| at(report, p)).reduce(f64::max);
    let peak_rss = worst(&[
        "/storm/operator/rss_peak_mib",
        "/steady/operator/rss_peak_mib",
        "/cold_start/operator_catching_up/rss_peak_mib",
        "/cold_start/operator_steady_after/rss_peak_mib",
        "/rolling_restart/operator/rss_peak_mib",
    ]);
    let per_reconcile = worst(&[
        "/storm/api_requests/requests_per_reconcile",
        "/cold_start/api_requests/requests_per_reconcile",
        "/rolling_restart/api_requests/requests_per_reconcile",
    ]);
    let check = |name, kept, value, bound| Check {
        name,
        kept,
        value,
        bound,
    };
    vec![
        // Admission reviews per pod admitted in the storm, at most. The API server
        // reviews a pod twice when something changes it after the webhook
        // (`reinvocationPolicy: IfNeeded`): the ServiceAccount token mount did,
        // for every injected pod, until the webhook added it itself.
        check(
            "storm: admission reviews per admitted pod",
            true,
            ratio(
                at(report, "/storm/operator_webhook_histogram/count"),
                admitted,
            ),
            1.05,
        ),
        // Route reconciles per route in the cold start, at most: one for the edit,
        // plus a few the pod watch's first list queues again while a route's
        // reconcile runs. 2.03 and 2.09 at 200 routes while the controller's own
        // writes queued their route again; 1.22 to 1.44 at 200 and 2,000 routes
        // since they do not (operator/src/controller/echoes.rs).
        check(
            "cold start: route reconciles per route",
            true,
            ratio(
                at(report, "/cold_start/api_requests/route_reconciles"),
                routes,
            ),
            1.6,
        ),
        // Reconciles in 30 s of steady state per route, at most. What it guards
        // against was 0.91 (182 for 200 routes, before the stores were
        // slimmed). A Ready route is also reconciled every 300 s on its own
        // (controller/mod.rs), 0.1 per route in 30 s once the storm is older
        // than that: at 20,000 pods the storm took 800 s and steady state
        // measured 0.089 and 0.118, at 2,000 pods (a 125 s storm) 0.005.
        check(
            "steady: reconciles in 30 s per route",
            true,
            ratio(at(report, "/steady/reconciles_in_30s"), routes),
            0.2,
        ),
        // API requests per route reconcile, at most: a fixed number per target,
        // none cluster-wide, so it must not grow with the cluster. 8.2 to 9.7
        // while every reconcile listed its namespace's workloads and Services;
        // 5.5 to 6.7 since it reads them from the watches' stores
        // (operator/src/controller/cache.rs, 20,000 pods).
        check(
            "API requests per route reconcile (worst phase)",
            true,
            per_reconcile,
            8.0,
        ),
        // Issue #38's goals: reported, never failing.
        check("goal: operator peak RSS, MiB", false, peak_rss, 256.0),
        check(
            "goal: cold start, every route current, s",
            false,
            every_route_current(report),
            60.0,
        ),
        check(
            "goal: webhook added p99 in the storm, ms",
            false,
            at(report, "/storm/admission_during_storm/added_p99_ms"),
            20.0,
        ),
        // The same bound on what kubegrace adds beyond a webhook that admits
        // every pod unchanged, called in the same storm: the webhook call
        // itself (the API server's TLS, encoding and queueing on a busy
        // machine) is every webhook's cost, and on two shared cores a null
        // webhook's alone is above 20 ms at p99 (122 ms at 20,000 pods).
        check(
            "goal, restated: kubegrace's added p99 over a null webhook in the storm, ms",
            false,
            at(report, "/storm/kubegrace_over_null_webhook/added_p99_ms"),
            20.0,
        ),
    ]
}

/// Seconds from the operator's cold start until the last route's status was
/// at its new generation, as the route watch saw it (`route_wait.max_ms`),
/// and only if every route got there. Not `all_current_seconds`: that also
/// waits for a pods LIST, polled every 10 s, confirming every pod injected,
/// which nothing in a cold start changes (20,000 pods: 5 s after the last
/// route).
fn every_route_current(report: &Value) -> Option<f64> {
    let reached = at(report, "/cold_start/route_wait/not_reached") == Some(0.0);
    let last_ms = at(report, "/cold_start/route_wait/max_ms")?;
    reached.then_some(last_ms / 1000.0)
}

/// The checks as the report's `checks` entry.
pub fn to_json(checks: &[Check]) -> Value {
    Value::Array(
        checks
            .iter()
            .map(|c| {
                json!({
                    "name": c.name, "kind": if c.kept { "kept" } else { "goal" },
                    "value": c.value.map(|v| (v * 1000.0).round() / 1000.0),
                    "at_most": c.bound, "ok": c.ok(),
                })
            })
            .collect(),
    )
}

/// The kept checks that failed.
pub fn broken(checks: &[Check]) -> Vec<&Check> {
    checks.iter().filter(|c| c.kept && !c.ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(reviews: f64, cold_reconciles: f64, steady: f64, rss: f64) -> Value {
        json!({
            "routes": 200, "pods": 2000,
            "storm": {
                "operator": {"rss_peak_mib": rss},
                "operator_webhook_histogram": {"count": reviews},
                "admission_during_storm": {"with_webhook": {"n": 676}, "added_p99_ms": 101.7},
                "kubegrace_over_null_webhook": {"added_p99_ms": -10.8},
                "admission_during_storm_unrouted": {"with_webhook": {"n": 675}},
                "api_requests": {"requests_per_reconcile": 5.52},
            },
            "steady": {"reconciles_in_30s": steady},
            "cold_start": {
                "all_current_seconds": 11.6,
                "route_wait": {"max_ms": 9_800.0, "not_reached": 0},
                "api_requests": {"route_reconciles": cold_reconciles, "requests_per_reconcile": 6.7},
            },
            "rolling_restart": null,
        })
    }

    fn find<'a>(c: &'a [Check], prefix: &str) -> &'a Check {
        c.iter()
            .find(|c| c.name.starts_with(prefix))
            .unwrap_or_else(|| panic!("no check {prefix}"))
    }

    #[test]
    fn one_review_per_pod_passes_and_two_fail() {
        // 2,000 pods + 1,351 probes through the webhook.
        let c = checks(&report(3352.0, 244.0, 1.0, 44.0));
        assert!(broken(&c).is_empty(), "{c:?}");
        let c = checks(&report(2.0 * 2000.0 + 1351.0, 200.0, 1.0, 44.0));
        let b = broken(&c);
        assert_eq!(b.len(), 1, "{b:?}");
        assert!(b[0].name.starts_with("storm: admission reviews"));
    }

    #[test]
    fn a_second_reconcile_of_every_route_and_a_busy_steady_state_fail() {
        // 417: the status write's echo queueing every route again.
        let c = checks(&report(3352.0, 417.0, 182.0, 44.0));
        let names: Vec<_> = broken(&c).iter().map(|c| c.name).collect();
        assert_eq!(
            names,
            [
                "cold start: route reconciles per route",
                "steady: reconciles in 30 s per route"
            ]
        );
    }

    #[test]
    fn the_periodic_pass_passes_and_listing_per_reconcile_again_fails() {
        // 2,000 routes' 300 s passes in a 30 s window: 0.1 per route, plus events.
        let c = checks(&report(3352.0, 244.0, 0.118 * 200.0, 44.0));
        assert!(broken(&c).is_empty(), "{c:?}");
        // A reconcile that lists its workloads and Services again (9.7 at 20,000 pods).
        let mut r = report(3352.0, 244.0, 1.0, 44.0);
        r["cold_start"]["api_requests"]["requests_per_reconcile"] = json!(9.7);
        let c = checks(&r);
        assert_eq!(
            broken(&c).iter().map(|c| c.name).collect::<Vec<_>>(),
            ["API requests per route reconcile (worst phase)"]
        );
    }

    #[test]
    fn goals_are_reported_and_never_fail_the_run() {
        let c = checks(&report(3352.0, 200.0, 1.0, 300.0));
        assert!(!find(&c, "goal: operator peak RSS").ok());
        assert!(!find(&c, "goal: webhook added p99").ok());
        assert!(find(&c, "goal: cold start").ok());
        assert!(broken(&c).is_empty());
    }

    #[test]
    fn the_restated_webhook_goal_is_what_kubegrace_adds_over_a_null_webhook() {
        let name = "goal, restated: kubegrace's added p99 over a null webhook";
        let mut r = report(3352.0, 200.0, 1.0, 44.0);
        // Below a null webhook's own p99 in the same storm: noise, and met.
        assert!(find(&checks(&r), name).ok());
        r["storm"]["kubegrace_over_null_webhook"]["added_p99_ms"] = json!(20.0);
        assert!(find(&checks(&r), name).ok());
        r["storm"]["kubegrace_over_null_webhook"]["added_p99_ms"] = json!(20.1);
        assert!(!find(&checks(&r), name).ok());
        // Runs without a null webhook cannot meet it.
        r["storm"]["kubegrace_over_null_webhook"] = json!(null);
        let c = checks(&r);
        assert_eq!(find(&c, name).value, None);
        assert!(broken(&c).is_empty(), "a goal never fails the run");
    }

    #[test]
    fn the_cold_start_is_the_last_routes_wait_and_a_route_never_current_fails_it() {
        let mut r = report(3352.0, 200.0, 1.0, 44.0);
        assert_eq!(find(&checks(&r), "goal: cold start").value, Some(9.8));
        r["cold_start"]["route_wait"]["max_ms"] = json!(61_000.0);
        assert!(!find(&checks(&r), "goal: cold start").ok());
        r["cold_start"]["route_wait"] = json!({"max_ms": 1_000.0, "not_reached": 3});
        let c = checks(&r);
        assert_eq!(find(&c, "goal: cold start").value, None);
        assert!(!find(&c, "goal: cold start").ok());
    }

    #[test]
    fn a_missing_number_fails_its_check() {
        let mut r = report(3352.0, 200.0, 1.0, 44.0);
        r["steady"] = json!({});
        let c = checks(&r);
        assert_eq!(
            broken(&c).iter().map(|c| c.name).collect::<Vec<_>>(),
            ["steady: reconciles in 30 s per route"]
        );
        assert_eq!(to_json(&c)[2]["ok"], json!(false));
    }
}
