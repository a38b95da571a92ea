//! `kubectl kubegrace check`: one line per finding, each problem with its fix; exit 1 on
//! any problem. [`gather`] reads the cluster into a [`Snapshot`], [`judge`] turns it
//! into findings with the pure [`rules`].

pub mod gather;
pub mod rules;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::fmt::Write as _;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde::Serialize;

pub use gather::gather;

use crate::install::Install;

/// One thing `check` looked at.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// Which check: `operator`, `leader`, `webhook`, `ca-bundle`, `certificate`, `crd`,
    /// `injection`, `sidecar-version`, `service-bypass`, `route`.
    pub check: &'static str,
    pub ok: bool,
    pub message: String,
    /// The command or change that fixes a problem.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl Finding {
    pub fn ok(check: &'static str, message: String) -> Self {
        Self {
            check,
            ok: true,
            message,
            fix: None,
        }
    }

    pub fn problem(check: &'static str, message: String, fix: String) -> Self {
        Self {
            check,
            ok: false,
            message,
            fix: Some(fix),
        }
    }
}

/// Everything `check` read, as data.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// The operator installs found (the first is checked; more is a problem).
    pub installs: Vec<Install>,
    pub operator_pods: Vec<Pod>,
    pub lease: Option<Lease>,
    pub webhook_endpoints: usize,
    pub probe: Option<rules::Probe>,
    /// `tls.crt` of the certificate Secret.
    pub serving_cert: Option<Vec<u8>>,
    /// Each webhook (configuration/webhook) and its caBundle.
    pub ca_bundles: Vec<(String, Option<Vec<u8>>)>,
    pub crd: Option<CustomResourceDefinition>,
    /// Labels of the namespaces checked.
    pub ns_labels: BTreeMap<String, BTreeMap<String, String>>,
    pub pods: Vec<Pod>,
    pub namespaced: BTreeMap<String, rules::Namespaced>,
    /// The NetworkPolicies of the namespaces checked.
    pub network_policies: Vec<NetworkPolicy>,
    /// Why they could not be read, if so (the user's RBAC).
    pub network_policies_unreadable: Option<String>,
    /// GraceRoutes stored with values the types refuse (an older, looser CRD).
    pub undecodable_routes: Vec<kubegrace_api::tolerant::Undecodable>,
}

/// The findings of a snapshot at `now` (pure).
pub fn judge(s: &Snapshot, now: jiff::Timestamp) -> Vec<Finding> {
    let mut out = Vec::new();
    match s.installs.as_slice() {
        [] => out.push(Finding::problem(
            "operator",
            format!(
                "no kubegrace operator Deployment ({}) in the cluster",
                crate::install::OPERATOR_SELECTOR
            ),
            "helm install kubegrace charts/kubegrace --namespace kubegrace-system --create-namespace".to_owned(),
        )),
        [install, others @ ..] => {
            if !others.is_empty() {
                let names: Vec<String> = others
                    .iter()
                    .map(|i| format!("{}/{}", i.namespace, i.name()))
                    .collect();
                out.push(Finding::problem(
                    "operator",
                    format!(
                        "{} more operator installs ({}) besides {}/{}: the webhook configurations and the CRD are cluster-wide, so they fight",
                        others.len(),
                        names.join(", "),
                        install.namespace,
                        install.name()
                    ),
                    "helm uninstall all but one (or pass --operator-namespace to check one)".to_owned(),
                ));
            }
            out.push(rules::operator(install, &s.operator_pods));
            out.push(rules::leader(
                install,
                s.lease.as_ref(),
                &s.operator_pods,
                now,
            ));
            if let Some(probe) = &s.probe {
                out.extend(rules::webhook(install, s.webhook_endpoints, probe));
            }
            out.extend(rules::ca_bundles(
                install,
                s.serving_cert.as_deref(),
                &s.ca_bundles,
            ));
            out.extend(rules::certificate(install, s.serving_cert.as_deref(), now));
            out.extend(rules::versions(&s.pods, install.sidecar_version()));
        }
    }
    let operator_release = s.installs.first().and_then(Install::operator_version);
    out.push(rules::crd(s.crd.as_ref(), operator_release));
    out.extend(rules::injection(&s.pods, &s.ns_labels));
    out.extend(rules::bypasses(&s.namespaced));
    out.extend(rules::network_policies(
        &s.pods,
        match &s.network_policies_unreadable {
            None => Ok(&s.network_policies),
            Some(why) => Err(why),
        },
    ));
    let routes: Vec<_> = s
        .namespaced
        .values()
        .flat_map(|n| n.routes.iter().cloned())
        .collect();
    out.extend(rules::routes(&routes));
    out.extend(s.undecodable_routes.iter().map(|u| {
        Finding::problem(
            "route",
            format!("GraceRoute {}/{}: {}", u.namespace, u.name, u.message()),
            format!("kubectl edit graceroute {} -n {}", u.name, u.namespace),
        )
    }));
    out
}

/// The text report: `ok` or `FAIL` per line, the fix on the line under a problem.
pub fn text(findings: &[Finding]) -> String {
    let mut out = String::new();
    for f in findings {
        let mark = if f.ok { "ok  " } else { "FAIL" };
        let _ = writeln!(out, "[{mark}] {:<15} {}", f.check, f.message);
        if let Some(fix) = &f.fix {
            let _ = writeln!(out, "       {:<15} fix: {fix}", "");
        }
    }
    let problems = findings.iter().filter(|f| !f.ok).count();
    if problems == 0 {
        let _ = writeln!(out, "kubegrace: all {} checks passed", findings.len());
    } else {
        let noun = if problems == 1 { "problem" } else { "problems" };
        let _ = writeln!(out, "kubegrace: {problems} {noun}");
    }
    out
}

/// `--output json`: `{"ok": bool, "problems": n, "findings": [...]}`.
pub fn json(findings: &[Finding]) -> serde_json::Value {
    let problems = findings.iter().filter(|f| !f.ok).count();
    serde_json::json!({
        "ok": problems == 0,
        "problems": problems,
        "findings": findings,
    })
}
