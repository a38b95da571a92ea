//! A load balancer nobody here wrote, in front of a rollout (issue 38, item 3): HAProxy
//! (Debian's 2.6, a host process) discovers the pods through DNS SRV records of a headless
//! Service, answered by CoreDNS's `kubernetes` plugin (built from the Go module proxy, a
//! host process on loopback), and sends to the pod IPs directly, as ingress controllers
//! and cloud balancers in IP-target mode do. It keeps sending to a pod for
//! `hold obsolete` (10s) after its record left the answers: it notices a terminating pod
//! late, on its own clock, whatever the EndpointSlice says.
//!
//! The same rollout under the same load through HAProxy: with kubegrace no request fails
//! (the sidecar serves the late connections and ends the grace phase when HAProxy's new
//! connections stop), without it requests fail (the app exits while HAProxy still sends to
//! it). Both are asserted, and that HAProxy really kept sending to the replaced pods after
//! their deletion started (the lag the test is about).
//!
//! The scenario is `kubegrace_e2e::scenario::balancer`; the configs are in `e2e/balancer/`.
//! Skipped (with a message) outside the cluster tier.

use anyhow::{Result, ensure};
use kubegrace_e2e::scenario::balancer::{
    BALANCER_MAX_DELAY_S, BalancedRun, Balancer, HOLD_OBSOLETE_S,
};
use kubegrace_e2e::scenario::{
    Drain, LoadMode, Options, Progress, WITH, WITHOUT, graceroute, keep_from_env, with_install,
};
use serde_json::json;

fn describe(name: &str, r: &BalancedRun) -> String {
    let late: Vec<String> = r
        .late
        .iter()
        .map(|(pod, l)| format!("{pod}: {} requests up to {:.1}s", l.requests, l.last_s))
        .collect();
    format!(
        "{name}: {}; answered after their deletion started: {}",
        r.run.describe(),
        late.join(", ")
    )
}

#[tokio::test]
async fn behind_haproxy_a_rollout_loses_no_request_with_kubegrace_only() -> Result<()> {
    let test = "behind_haproxy_a_rollout_loses_no_request_with_kubegrace_only";
    let client = kubegrace_e2e::cluster_or_skip!(test);
    let mut opts = Options::new("kg-e2e-lb");
    // HAProxy listens on this host's loopback: the load runs here.
    opts.load.mode = LoadMode::Host;
    // The product's timers, with a ceiling above the balancer's lag: the evidence rule (no
    // new connection for `quiet`) ends the grace phase once HAProxy has let the pod go;
    // maxDelay is only the bound, and with the default 15s a slower balancer would be
    // cut off while it still sends.
    opts.drain = Drain {
        max_delay: format!("{BALANCER_MAX_DELAY_S}s"),
        ..Drain::product_defaults()
    };
    let d = opts.drain.clone();
    let p = Progress::default();
    let (with, without) = with_install(&client, &opts, &p, keep_from_env(), async |run| {
        let sc = run.scenario("balancer").await?;
        // stayServing: the sidecar's /ready stays 200 through the grace phase, so the
        // endpoint is `serving, terminating` rather than not-serving. HAProxy's discovery
        // does not see the difference (an endpoint is `ready: false` from its deletion
        // either way, and CoreDNS publishes ready endpoints only), but whatever else routes
        // to the pod on the EndpointSlice's word while the balancer lags (kube-proxy's
        // terminating fallback, KEP-1669, behind a NodePort or `externalTrafficPolicy:
        // Local`) keeps a serving endpoint until the grace phase ends: the setting for a
        // pod behind a balancer that lags. The grace phase itself ends on the evidence.
        let drain = json!({
            "minDelay": d.min_delay, "quiet": d.quiet, "maxDelay": d.max_delay,
            "timeout": d.timeout, "readiness": "stayServing",
        });
        sc.post_route(&graceroute(WITH, &d, json!({ "drain": drain }))?)
            .await?;
        p.step(format!(
            "GraceRoute {WITH}: drain minDelay {} quiet {} maxDelay {} timeout {}, readiness stayServing",
            d.min_delay, d.quiet, d.max_delay, d.timeout
        ));
        sc.create_app(WITH, true, &p).await?;
        sc.create_app(WITHOUT, false, &p).await?;
        sc.settle(WITH, true, &p).await?;
        sc.settle(WITHOUT, false, &p).await?;
        let mut lb = Balancer::start(&sc, WITH, WITHOUT, &p).await?;
        lb.wait_serving(&sc, WITH, &p).await?;
        lb.wait_serving(&sc, WITHOUT, &p).await?;
        let with = sc.roll_through_balancer(&lb, WITH, &p).await?;
        let without = sc.roll_through_balancer(&lb, WITHOUT, &p).await?;
        Ok((with, without))
    })
    .await?;

    eprintln!("{}", describe("with kubegrace", &with));
    eprintln!("{}", describe("without kubegrace", &without));
    let (late_requests, late_s) = with.late_max();
    ensure!(
        late_requests > 0,
        "no replaced {WITH} pod answered a request sent after its deletion started: HAProxy \
         did not lag (hold obsolete {HOLD_OBSOLETE_S}s), so the run proves nothing about a \
         balancer that does: {:?}",
        with.late
    );
    eprintln!(
        "HAProxy's lag as the load saw it: a replaced pod answered up to {late_requests} \
         requests, until {late_s:.1}s after its deletion started"
    );
    let s = &with.run.summary;
    ensure!(
        s.failed == 0,
        "with kubegrace, {} of {} requests through HAProxy failed during the rollout: {:?}",
        s.failed,
        s.requests,
        s.by_detail
    );
    ensure!(
        without.run.summary.failed > 0,
        "without kubegrace no request through HAProxy failed ({} sent): the baseline shows \
         nothing, so the comparison proves nothing",
        without.run.summary.requests
    );
    Ok(())
}
