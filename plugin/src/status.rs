//! `kubectl kubegrace status ROUTE|deploy/NAME`: per pod, what its sidecar says on its
//! admin port (read through the API server's pod proxy): drain phase, requests in flight,
//! open connections, breaker states, and the last drain report the sidecar left behind.

use std::fmt::Write as _;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::core::Selector;
use kube::{Api, Client, ResourceExt};
use kubegrace_api::argo::Rollout;
use kubegrace_api::crd::GraceRoute;
use kubegrace_api::inject::admin_port_of;
use kubegrace_api::workloads::Workloads;
use kubegrace_sidecar_api::report::DrainOutcome;
use kubegrace_sidecar_api::{admin, pod as sidecar_pod};
use serde::Serialize;

use crate::cluster::pod_get;
use crate::{Error, Result};

/// What `status` is asked about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Subject {
    Route(String),
    Deployment(String),
    /// An Argo Rollouts `Rollout`.
    Rollout(String),
}

impl Subject {
    /// `deploy/NAME` (also `deployment/`, `deployments/`), `groute/NAME` (also
    /// `graceroute/`, `graceroutes/`) or a bare route name.
    pub fn parse(s: &str) -> Result<Subject> {
        match s.split_once('/') {
            None if !s.is_empty() => Ok(Subject::Route(s.to_owned())),
            Some(("deploy" | "deployment" | "deployments" | "deployment.apps", n))
                if !n.is_empty() =>
            {
                Ok(Subject::Deployment(n.to_owned()))
            }
            Some(("groute" | "graceroute" | "graceroutes", n)) if !n.is_empty() => {
                Ok(Subject::Route(n.to_owned()))
            }
            Some(("ro" | "rollout" | "rollouts" | "rollout.argoproj.io", n)) if !n.is_empty() => {
                Ok(Subject::Rollout(n.to_owned()))
            }
            _ => Err(Error::Invalid(format!(
                "{s:?}: expected ROUTE, groute/ROUTE, deploy/NAME or rollout/NAME"
            ))),
        }
    }
}

/// One pod's line.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Row {
    pub pod: String,
    pub ready: bool,
    /// `serving`, `draining`, `closing`, `drained`; `no sidecar`; or why it could not be read.
    pub phase: String,
    pub inflight: Option<i64>,
    pub connections: Option<i64>,
    /// `route=state` per breaker (`closed`, `open`, `half_open`).
    pub breakers: Vec<String>,
    pub last_drain: Option<String>,
}

/// The drain phase of `kubegrace_drain_phase` (0 serving, 1 draining, 2 closing, 3 drained).
pub fn phase_name(v: f64) -> &'static str {
    match v as i64 {
        0 => "serving",
        1 => "draining",
        2 => "closing",
        3 => "drained",
        _ => "unknown",
    }
}

/// The value of an unlabelled series in Prometheus text (pure).
pub fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (series, value) = l.rsplit_once(' ')?;
        let series = series.trim();
        (series == name || series.strip_prefix(name)?.starts_with('{'))
            .then(|| value.trim().parse().ok())?
    })
}

/// `name=state` per route of `/breakers` (routes without a breaker left out).
pub fn breakers(json: &serde_json::Value) -> Vec<String> {
    json["routes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| {
            let state = r["breaker"]["state"].as_str()?;
            Some(format!("{}={state}", r["name"].as_str().unwrap_or("?")))
        })
        .collect()
}

/// The last drain report of the pod's sidecar container, from a previous run of it
/// (`lastState.terminated.message`), in one phrase.
pub fn last_drain(p: &Pod) -> Option<String> {
    let status = p.status.as_ref()?;
    let c = status
        .container_statuses
        .iter()
        .flatten()
        .chain(status.init_container_statuses.iter().flatten())
        .find(|c| c.name == sidecar_pod::CONTAINER)?;
    let message = c
        .last_state
        .as_ref()?
        .terminated
        .as_ref()?
        .message
        .as_ref()?;
    let d: DrainOutcome = serde_json::from_str(message).ok()?;
    Some(describe_drain(&d))
}

pub fn describe_drain(d: &DrainOutcome) -> String {
    let verdict = if d.is_clean() {
        "clean".to_owned()
    } else {
        format!(
            "{} force-closed, {} requests cut",
            d.force_closed, d.requests_cut
        )
    };
    format!(
        "{} {:.1}s, {} conns, {} finished, {verdict}",
        d.trigger,
        d.duration_ms as f64 / 1000.0,
        d.connections,
        d.requests_finished
    )
}

/// The table (pure).
pub fn table(header: &str, rows: &[Row]) -> String {
    let cells: Vec<[String; 7]> = rows
        .iter()
        .map(|r| {
            let n = |v: Option<i64>| v.map_or("-".to_owned(), |v| v.to_string());
            [
                r.pod.clone(),
                if r.ready { "yes" } else { "no" }.to_owned(),
                r.phase.clone(),
                n(r.inflight),
                n(r.connections),
                if r.breakers.is_empty() {
                    "-".to_owned()
                } else {
                    r.breakers.join(",")
                },
                r.last_drain.clone().unwrap_or_else(|| "-".to_owned()),
            ]
        })
        .collect();
    let head = [
        "POD",
        "READY",
        "PHASE",
        "IN-FLIGHT",
        "CONNS",
        "BREAKERS",
        "LAST DRAIN",
    ]
    .map(String::from);
    // Each column as wide as its widest cell, the heading included.
    let mut widths = head.clone().map(|h| h.len());
    for row in &cells {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.len());
        }
    }
    let mut out = String::new();
    let _ = writeln!(out, "{header}");
    for r in [&head].into_iter().chain(&cells) {
        let line: Vec<String> = r
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        let _ = writeln!(out, "{}", line.join("  ").trim_end());
    }
    out
}

/// The typed route, or what the operator says about one it cannot read.
fn route_of(obj: &kube::core::DynamicObject) -> Result<GraceRoute> {
    kubegrace_api::tolerant::decode(obj).map_err(|u| Error::Invalid(u.message()))
}

/// The pods `subject` covers, and a line about it.
async fn pods_of(client: &Client, ns: &str, subject: &Subject) -> Result<(String, Vec<Pod>)> {
    let (header, selectors) = match subject {
        Subject::Deployment(name) => {
            let deployments = Api::<Deployment>::namespaced(client.clone(), ns);
            let d = crate::cluster::get(&deployments, "Deployment", ns, name).await?;
            let sel = d
                .spec
                .as_ref()
                .and_then(|s| Selector::try_from(s.selector.clone()).ok())
                .map(|s| s.to_string())
                .ok_or_else(|| Error::Invalid(format!("Deployment {ns}/{name} has no selector")))?;
            (format!("deployment {ns}/{name}"), vec![sel])
        }
        Subject::Rollout(name) => {
            let rollouts = Api::<Rollout>::namespaced(client.clone(), ns);
            let r = crate::cluster::get(&rollouts, "Rollout", ns, name).await?;
            let sel = r
                .spec
                .selector
                .clone()
                .and_then(|s| Selector::try_from(s).ok())
                .map(|s| s.to_string())
                .ok_or_else(|| Error::Invalid(format!("Rollout {ns}/{name} has no selector")))?;
            (format!("rollout {ns}/{name}"), vec![sel])
        }
        Subject::Route(name) => {
            // Read as a dynamic object: a route the operator's types refuse
            // is reported with the field that fails, not as a bare decode
            // error of the whole response.
            let routes = crate::cluster::routes(client, Some(ns));
            let obj = crate::cluster::get(&routes, "GraceRoute", ns, name).await?;
            let route = route_of(&obj)?;
            let lp = ListParams::default();
            let deployments = Api::<Deployment>::namespaced(client.clone(), ns)
                .list(&lp)
                .await
                .map_err(Error::kube("listing Deployments"))?;
            let statefulsets = Api::<StatefulSet>::namespaced(client.clone(), ns)
                .list(&lp)
                .await
                .map_err(Error::kube("listing StatefulSets"))?;
            let rollouts = crate::resume::rollouts(client, ns, &route).await?;
            let workloads = Workloads::from_all(&deployments.items, &statefulsets.items, &rollouts);
            let selectors = workloads
                .of(&route)
                .into_iter()
                .filter_map(|(_, s)| s.clone())
                .collect();
            let drains = route
                .status
                .as_ref()
                .and_then(|s| s.last_drains.as_ref())
                .map_or("none counted yet".to_owned(), |d| d.summary.clone());
            let accepted = route
                .condition("Accepted")
                .map_or("-".to_owned(), |c| c.status.clone());
            let mut header = format!(
                "graceroute {ns}/{name}: Accepted {accepted}, last rollout's drains: {drains}"
            );
            if let Some(line) = crate::resume::pause_line(&route) {
                header.push('\n');
                header.push_str(&line);
            }
            (header, selectors)
        }
    };
    let api = Api::<Pod>::namespaced(client.clone(), ns);
    let mut pods = Vec::new();
    for sel in selectors {
        let got = api
            .list(&ListParams::default().labels(&sel))
            .await
            .map_err(Error::kube(format!("listing pods {sel}")))?;
        pods.extend(got.items);
    }
    pods.sort_by_key(|p| p.name_any());
    pods.dedup_by_key(|p| p.name_any());
    Ok((header, pods))
}

/// Reads every pod's sidecar.
pub async fn status(client: &Client, ns: &str, subject: &Subject) -> Result<(String, Vec<Row>)> {
    let (header, pods) = pods_of(client, ns, subject).await?;
    let mut rows = Vec::new();
    for p in &pods {
        rows.push(row(client, ns, p).await);
    }
    Ok((header, rows))
}

async fn row(client: &Client, ns: &str, p: &Pod) -> Row {
    let mut row = Row {
        pod: p.name_any(),
        ready: crate::check::rules::pod_ready(p),
        last_drain: last_drain(p),
        ..Row::default()
    };
    let Some(port) = admin_port_of(p) else {
        row.phase = "no sidecar".to_owned();
        return row;
    };
    match pod_get(client, ns, &row.pod, port, admin::path::METRICS).await {
        Ok(text) => {
            row.phase = metric(&text, "kubegrace_drain_phase")
                .map_or("unknown", phase_name)
                .to_owned();
            row.inflight = metric(&text, "kubegrace_inflight_requests").map(|v| v as i64);
            row.connections = metric(&text, "kubegrace_open_connections").map(|v| v as i64);
        }
        Err(e) => row.phase = format!("unreadable ({e})"),
    }
    if let Ok(text) = pod_get(client, ns, &row.pod, port, admin::path::BREAKERS).await
        && let Ok(json) = serde_json::from_str::<serde_json::Value>(&text)
    {
        row.breakers = breakers(&json);
    }
    row
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_parse_like_kubectl() {
        let route = Subject::Route("web".into());
        let deployment = Subject::Deployment("web".into());
        let rollout = Subject::Rollout("web".into());
        for (arg, want) in [
            ("web", &route),
            ("groute/web", &route),
            ("deploy/web", &deployment),
            ("deployment/web", &deployment),
            ("rollout/web", &rollout),
            ("rollout.argoproj.io/web", &rollout),
        ] {
            assert_eq!(Subject::parse(arg).ok().as_ref(), Some(want), "{arg}");
        }
        assert!(Subject::parse("svc/web").is_err());
        assert!(Subject::parse("deploy/").is_err());
        assert!(Subject::parse("rollout/").is_err());
    }

    #[test]
    fn the_table_aligns_each_column_to_its_widest_cell() {
        let rows = [
            Row {
                pod: "web-7d9f-abcdef".into(),
                ready: true,
                phase: "serving".into(),
                inflight: Some(12),
                ..Row::default()
            },
            Row {
                pod: "web-1".into(),
                phase: "no sidecar".into(),
                breakers: vec!["api=open".into()],
                ..Row::default()
            },
        ];
        let text = table("route shop/web", &rows);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "route shop/web");
        assert_eq!(
            lines[1],
            "POD              READY  PHASE       IN-FLIGHT  CONNS  BREAKERS  LAST DRAIN"
        );
        assert_eq!(
            lines[2],
            "web-7d9f-abcdef  yes    serving     12         -      -         -"
        );
        assert_eq!(
            lines[3],
            "web-1            no     no sidecar  -          -      api=open  -"
        );
    }

    #[test]
    fn metrics_are_read_by_exact_name() {
        let text = "# HELP kubegrace_drain_phase x\nkubegrace_drain_phase 1\nkubegrace_drain_phase_extra 9\nkubegrace_inflight_requests 4\nkubegrace_open_connections{listener=\"a\"} 2\n";
        assert_eq!(metric(text, "kubegrace_drain_phase"), Some(1.0));
        assert_eq!(metric(text, "kubegrace_inflight_requests"), Some(4.0));
        assert_eq!(metric(text, "kubegrace_open_connections"), Some(2.0));
        assert_eq!(metric(text, "kubegrace_missing"), None);
        assert_eq!(phase_name(1.0), "draining");
        assert_eq!(phase_name(3.0), "drained");
    }

    #[test]
    fn breakers_list_routes_that_have_one() {
        let j = serde_json::json!({"routes": [
            {"name": "api", "breaker": {"state": "open"}},
            {"name": "static", "breaker": null},
        ]});
        assert_eq!(breakers(&j), vec!["api=open".to_owned()]);
    }

    #[test]
    fn the_last_drain_comes_from_the_sidecars_previous_termination() {
        let report = DrainOutcome {
            kind: kubegrace_sidecar_api::report::KIND.into(),
            trigger: "SIGTERM".into(),
            duration_ms: 2100,
            connections: 3,
            inflight_at_trigger: 1,
            requests_finished: 5,
            force_closed: 1,
            requests_cut: 1,
        };
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "status": {"containerStatuses": [{
                "name": sidecar_pod::CONTAINER, "image": "i", "imageID": "", "ready": true,
                "restartCount": 1,
                "lastState": {"terminated": {"exitCode": 0,
                    "message": serde_json::to_string(&report).expect("json")}},
            }]},
        }))
        .expect("pod");
        assert_eq!(
            last_drain(&pod).as_deref(),
            Some("SIGTERM 2.1s, 3 conns, 5 finished, 1 force-closed, 1 requests cut")
        );
        let fresh: Pod =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "q"}})).expect("pod");
        assert_eq!(last_drain(&fresh), None);
        assert_eq!(admin_port_of(&fresh), None);
    }

    #[test]
    fn a_route_the_operator_cannot_read_is_reported_with_its_field() {
        let obj: kube::core::DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "kubegrace.io/v1alpha1", "kind": "GraceRoute",
            "metadata": {"name": "web", "namespace": "shop"},
            "spec": {"targetRef": {"kind": "Deployment", "name": "web"}, "ports": [{"name": "http"}],
                     "circuitBreaker": {"consecutiveFailures": 4_294_967_296_u64}}
        }))
        .expect("object");
        let err = route_of(&obj).expect_err("undecodable").to_string();
        assert!(
            err.contains("spec.circuitBreaker.consecutiveFailures"),
            "{err}"
        );
        assert!(err.contains("kubectl edit graceroute web -n shop"), "{err}");
    }
}
