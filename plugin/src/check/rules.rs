//! The decisions of `check`, pure: each takes what [`super::gather`] read and returns
//! findings, a problem always with the command or change that fixes it.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{CustomResourceExt, ResourceExt};
use kubegrace_api::bypass::service_bypasses;
use kubegrace_api::crd::GraceRoute;
use kubegrace_api::inject::{is_injected, wants_injection};
use kubegrace_api::keys;
use kubegrace_api::workloads::Workloads;

use super::Finding;
use crate::install::Install;

/// A certificate closer than this to its end is a problem (the chart's alert says the same).
pub const EXPIRY_WARNING_DAYS: i64 = 14;

/// The operator Deployment has a ready replica.
pub fn operator(install: &Install, pods: &[Pod]) -> Finding {
    let (ns, name) = (&install.namespace, install.name());
    let live: Vec<&Pod> = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();
    let ready = live.iter().filter(|p| pod_ready(p)).count();
    if ready > 0 {
        Finding::ok(
            "operator",
            format!(
                "operator {ns}/{name}: {ready}/{} pods ready (sidecar {}){}",
                live.len(),
                install.args.sidecar_image,
                if install.ignored_args.is_empty() {
                    String::new()
                } else {
                    format!(
                        "; flags of another release, not read by this plugin: {}",
                        install.ignored_args.join(" ")
                    )
                }
            ),
        )
    } else {
        Finding::problem(
            "operator",
            format!("operator {ns}/{name}: no pod ready ({} exist)", live.len()),
            format!(
                "kubectl -n {ns} describe deployment {name}; kubectl -n {ns} logs deployment/{name}"
            ),
        )
    }
}

/// One running operator pod holds the Lease, and its hold has not run out.
pub fn leader(
    install: &Install,
    lease: Option<&Lease>,
    pods: &[Pod],
    now: jiff::Timestamp,
) -> Finding {
    let (ns, lease_name) = (&install.namespace, &install.args.leader_election_lease);
    let logs = format!(
        "kubectl -n {ns} logs deployment/{} | grep -i lease",
        install.name()
    );
    let Some(spec) = lease.and_then(|l| l.spec.as_ref()) else {
        return Finding::problem(
            "leader",
            format!(
                "Lease {ns}/{lease_name} does not exist: no operator replica ever led, so no route is reconciled"
            ),
            format!("{logs} (the operator needs RBAC to create Leases in {ns})"),
        );
    };
    let holder = spec.holder_identity.clone().unwrap_or_default();
    // Someone other than "" holds an unexpired lease: the operator's own rule.
    if !kubegrace_api::lease::held_by_other(spec, "", now) {
        return Finding::problem(
            "leader",
            format!(
                "Lease {ns}/{lease_name}: no current holder (last: {holder:?}); routes are not reconciled"
            ),
            logs,
        );
    }
    let running = pods.iter().any(|p| {
        holder_pod(&holder) == p.name_any()
            && p.metadata.deletion_timestamp.is_none()
            && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
    });
    if running {
        Finding::ok(
            "leader",
            format!("Lease {ns}/{lease_name} held by {holder}"),
        )
    } else {
        Finding::problem(
            "leader",
            format!(
                "Lease {ns}/{lease_name} is held by {holder}, which is not a running operator pod of {ns}/{}: another install, or one that died (it expires by itself)",
                install.name()
            ),
            format!("kubectl -n {ns} get lease {lease_name} -o yaml; {logs}"),
        )
    }
}

/// The pod of a Lease holder: the operator's identity is `<pod name>-<8 hex digits>`,
/// so a restarted process never mistakes its predecessor's hold for its own.
pub fn holder_pod(holder: &str) -> &str {
    match holder.rsplit_once('-') {
        Some((pod, suffix))
            if suffix.len() == 8 && suffix.bytes().all(|b| b.is_ascii_hexdigit()) =>
        {
            pod
        }
        _ => holder,
    }
}

/// What a server-side dry run of a pod asking for the sidecar gave. The API server calls
/// the webhook for it (through the Service, over TLS checked against the caBundle), and
/// the webhook marks every pod it judges: injected, or skipped with the reason (a probe
/// pod has no route, so it is skipped). A pod that comes back unmarked was never judged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// No namespace is in the webhook's scope: nothing would be injected anywhere.
    NoNamespace,
    /// The webhook judged the pod: `injected`, or `skipped: <why>`.
    Answered { namespace: String, verdict: String },
    /// Admitted without the webhook's mark: not called, or its failure ignored
    /// (failurePolicy Ignore).
    Unmarked { namespace: String },
    /// The API server refused the pod because the call failed (failurePolicy Fail).
    Failed { namespace: String, error: String },
}

/// The webhook Service has ready endpoints and the API server's call through it works.
pub fn webhook(install: &Install, ready_endpoints: usize, probe: &Probe) -> Vec<Finding> {
    let ns = &install.namespace;
    let svc = &install.args.webhook_service;
    let restart = format!(
        "kubectl -n {ns} rollout restart deployment/{}",
        install.name()
    );
    let mut out = vec![if ready_endpoints > 0 {
        Finding::ok(
            "webhook",
            format!("Service {ns}/{svc}: {ready_endpoints} ready endpoints"),
        )
    } else {
        Finding::problem(
            "webhook",
            format!(
                "Service {ns}/{svc} has no ready endpoint: the API server cannot reach the webhook, so pods are created without the sidecar (or not at all, failurePolicy Fail)"
            ),
            format!(
                "kubectl -n {ns} get endpointslices -l kubernetes.io/service-name={svc}; kubectl -n {ns} describe deployment {}",
                install.name()
            ),
        )
    }];
    out.push(match probe {
        Probe::NoNamespace => Finding::ok(
            "webhook",
            "no namespace is in the webhook's scope, so no admission call was tried".to_owned(),
        ),
        Probe::Answered { namespace, verdict } => Finding::ok(
            "webhook",
            format!("the webhook answered the API server for a dry-run pod in {namespace} ({verdict})"),
        ),
        Probe::Unmarked { namespace } => Finding::problem(
            "webhook",
            format!("a dry-run pod in {namespace} asking for the sidecar was admitted without the webhook's answer: the call failed and failurePolicy Ignore let the pod through, so pods start without the sidecar"),
            format!("kubectl get mutatingwebhookconfiguration {} -o yaml (service, caBundle); {restart}", install.args.webhook_config),
        ),
        Probe::Failed { namespace, error } => Finding::problem(
            "webhook",
            format!("the API server could not call the webhook for a dry-run pod in {namespace}: {error}"),
            restart,
        ),
    });
    out
}

/// A certificate of a PEM bundle, as the checks read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cert {
    /// DER, to verify signatures with.
    pub der: Vec<u8>,
    /// Not-after, UNIX seconds.
    pub not_after: i64,
    pub subject_text: String,
}

/// Parses every certificate of a PEM text (what does not parse is left out).
pub fn certs(pem: &[u8]) -> Vec<Cert> {
    x509_parser::pem::Pem::iter_from_buffer(pem)
        .filter_map(|p| p.ok())
        .filter_map(|p| {
            let c = p.parse_x509().ok()?;
            Some(Cert {
                not_after: c.validity().not_after.timestamp(),
                subject_text: c.subject().to_string(),
                der: p.contents.clone(),
            })
        })
        .collect()
}

/// Whether `ca` signed `leaf` (what the API server checks; two CAs of one name differ).
fn issued(ca: &Cert, leaf: &Cert) -> bool {
    use x509_parser::prelude::{FromDer, X509Certificate};
    let (Ok((_, ca)), Ok((_, leaf))) = (
        X509Certificate::from_der(&ca.der),
        X509Certificate::from_der(&leaf.der),
    ) else {
        return false;
    };
    leaf.issuer() == ca.subject() && leaf.verify_signature(Some(ca.public_key())).is_ok()
}

/// Each webhook's caBundle holds the CA that issued the serving certificate.
pub fn ca_bundles(
    install: &Install,
    leaf_pem: Option<&[u8]>,
    bundles: &[(String, Option<Vec<u8>>)],
) -> Vec<Finding> {
    let ns = &install.namespace;
    let secret = install.cert_secret().unwrap_or_default();
    let Some(leaf) = leaf_pem.map(certs).and_then(|c| c.into_iter().next()) else {
        return vec![Finding::problem(
            "ca-bundle",
            format!(
                "no serving certificate in Secret {ns}/{secret} (tls.crt) to compare the caBundles with"
            ),
            format!(
                "kubectl -n {ns} logs deployment/{} (the operator writes it at start)",
                install.name()
            ),
        )];
    };
    let fix = if install.args.cert_dir.is_some() {
        format!(
            "cert-manager's cainjector writes caBundle: kubectl -n {ns} describe certificate; kubectl -n cert-manager logs deployment/cert-manager-cainjector"
        )
    } else {
        format!(
            "the operator patches caBundle at start and every 30 min: kubectl -n {ns} rollout restart deployment/{}",
            install.name()
        )
    };
    bundles
        .iter()
        .map(|(what, bundle)| match bundle.as_deref().map(certs) {
            None => Finding::problem(
                "ca-bundle",
                format!("{what}: no caBundle, so the API server cannot verify the webhook"),
                fix.clone(),
            ),
            Some(cas) if cas.iter().any(|ca| issued(ca, &leaf)) => Finding::ok(
                "ca-bundle",
                format!("{what}: caBundle holds the CA of the serving certificate"),
            ),
            Some(cas) => Finding::problem(
                "ca-bundle",
                format!(
                    "{what}: caBundle ({}) does not hold the CA that issued the serving certificate ({}): admission calls fail TLS",
                    cas.iter().map(|c| c.subject_text.clone()).collect::<Vec<_>>().join("; "),
                    leaf.subject_text
                ),
                fix.clone(),
            ),
        })
        .collect()
}

/// The serving certificate is valid for more than [`EXPIRY_WARNING_DAYS`].
pub fn certificate(
    install: &Install,
    leaf_pem: Option<&[u8]>,
    now: jiff::Timestamp,
) -> Option<Finding> {
    let leaf = leaf_pem.map(certs)?.into_iter().next()?;
    let ns = &install.namespace;
    let secret = install.cert_secret().unwrap_or_default();
    let days = (leaf.not_after - now.as_second()) / 86_400;
    let fix = if install.args.cert_dir.is_some() {
        format!("cert-manager renews it: kubectl -n {ns} describe certificate")
    } else {
        format!(
            "kubectl -n {ns} delete secret {secret}; kubectl -n {ns} rollout restart deployment/{} (the operator issues a new one)",
            install.name()
        )
    };
    Some(if leaf.not_after <= now.as_second() {
        Finding::problem(
            "certificate",
            format!("the webhook certificate in {ns}/{secret} has expired"),
            fix,
        )
    } else if days < EXPIRY_WARNING_DAYS {
        Finding::problem(
            "certificate",
            format!(
                "the webhook certificate in {ns}/{secret} expires in {days} days (renewal should have happened by now)"
            ),
            fix,
        )
    } else {
        Finding::ok(
            "certificate",
            format!("the webhook certificate in {ns}/{secret} is valid for {days} more days"),
        )
    })
}

/// The GraceRoute CRD in the cluster serves and stores the versions this kubegrace reads,
/// with the same schema. `operator_release` is the version the operator's image is tagged
/// with: when it is not this plugin's, another schema is that release's (docs/skew.md:
/// a plugin works with operators one release either side), which this plugin cannot
/// judge, so it is reported and not counted as a problem.
pub fn crd(
    installed: Option<&CustomResourceDefinition>,
    operator_release: Option<&str>,
) -> Finding {
    let ours = GraceRoute::crd();
    let name = ours.name_any();
    let apply = "kubectl apply --server-side -f crds/graceroutes.kubegrace.io.yaml (of the operator's release), or helm upgrade the chart".to_owned();
    let Some(installed) = installed else {
        return Finding::problem("crd", format!("CRD {name} is not installed"), apply);
    };
    for v in &ours.spec.versions {
        let Some(theirs) = installed.spec.versions.iter().find(|t| t.name == v.name) else {
            return Finding::problem(
                "crd",
                format!("CRD {name} has no version {}", v.name),
                apply,
            );
        };
        if !theirs.served || theirs.storage != v.storage {
            return Finding::problem(
                "crd",
                format!(
                    "CRD {name} version {}: served {}, storage {} (expected served, storage {})",
                    v.name, theirs.served, theirs.storage, v.storage
                ),
                apply,
            );
        }
        let ours_release = env!("CARGO_PKG_VERSION");
        if theirs.schema != v.schema
            && let Some(release) = operator_release.filter(|r| *r != ours_release)
        {
            return Finding::ok(
                "crd",
                format!(
                    "CRD {name} version {} has another schema than this plugin's ({ours_release}); the operator runs {release}, another release, whose schema it may be: not compared (run the plugin of {release} to check it)",
                    v.name
                ),
            );
        }
        if theirs.schema != v.schema {
            return Finding::problem(
                "crd",
                format!(
                    "CRD {name} version {} has another schema than kubegrace {} expects (installed from another release)",
                    v.name,
                    env!("CARGO_PKG_VERSION")
                ),
                apply,
            );
        }
    }
    let versions: Vec<&str> = ours.spec.versions.iter().map(|v| v.name.as_str()).collect();
    Finding::ok(
        "crd",
        format!(
            "CRD {name} serves {} with the expected schema",
            versions.join(", ")
        ),
    )
}

/// Live pods that ask for the sidecar and do not have it.
pub fn injection(
    pods: &[Pod],
    ns_labels: &BTreeMap<String, BTreeMap<String, String>>,
) -> Vec<Finding> {
    let none = BTreeMap::new();
    let mut asking = 0;
    let mut out = Vec::new();
    for p in pods.iter().filter(|p| live(p)) {
        let ns = p.namespace().unwrap_or_default();
        if !wants_injection(p, ns_labels.get(&ns).unwrap_or(&none)) {
            continue;
        }
        asking += 1;
        if is_injected(p) {
            continue;
        }
        // The webhook's reason is what to fix first; recreating the pod applies it.
        let (why, fix) = match p.annotations().get(keys::INJECT_SKIPPED) {
            Some(w) => (
                format!(" (the webhook skipped it: {w})"),
                format!("{w}; then {}", recreate(p)),
            ),
            None => (
                " (the webhook never saw it: created while it was down, or outside its namespaceSelector)".to_owned(),
                recreate(p),
            ),
        };
        out.push(Finding::problem(
            "injection",
            format!(
                "pod {ns}/{} asks for the sidecar and has none{why}",
                p.name_any()
            ),
            fix,
        ));
    }
    or_ok(out, "injection", || {
        format!("{asking} pods ask for the sidecar; every one has it")
    })
}

/// Injected pods whose sidecar is not the version the operator injects now.
pub fn versions(pods: &[Pod], expected: &str) -> Vec<Finding> {
    let mut injected = 0;
    let mut out = Vec::new();
    for p in pods.iter().filter(|p| live(p) && is_injected(p)) {
        injected += 1;
        let got = p
            .annotations()
            .get(keys::SIDECAR_VERSION)
            .map(String::as_str);
        if got == Some(expected) {
            continue;
        }
        out.push(Finding::problem(
            "sidecar-version",
            format!(
                "pod {}/{} runs sidecar {} but the operator injects {expected}",
                p.namespace().unwrap_or_default(),
                p.name_any(),
                got.unwrap_or("(unknown: no kubegrace.io/sidecar-version)")
            ),
            recreate(p),
        ));
    }
    or_ok(out, "sidecar-version", || {
        format!("{injected} injected pods run sidecar {expected}")
    })
}

/// What a namespace holds for the bypass check.
#[derive(Debug, Clone, Default)]
pub struct Namespaced {
    pub routes: Vec<GraceRoute>,
    pub deployments: Vec<Deployment>,
    pub statefulsets: Vec<StatefulSet>,
    pub services: Vec<Service>,
}

/// Services that select a route's pods but reach the app around the sidecar (the
/// operator's own rule, `kubegrace_api::bypass::service_bypasses`).
pub fn bypasses(by_namespace: &BTreeMap<String, Namespaced>) -> Vec<Finding> {
    let mut out = Vec::new();
    let mut services = 0;
    for n in by_namespace.values() {
        let workloads = Workloads::from_objects(&n.deployments, &n.statefulsets);
        services += n.services.len();
        for route in &n.routes {
            let targets = workloads.of(route);
            for sentence in service_bypasses(route, &targets, &[], &n.services) {
                let (what, fix) = match sentence.split_once("; fix: ") {
                    Some((w, f)) => (w.to_owned(), f.to_owned()),
                    None => (
                        sentence.clone(),
                        "set the Service's targetPort to the port's name".to_owned(),
                    ),
                };
                out.push(Finding::problem(
                    "service-bypass",
                    format!(
                        "{}/{}: {what}",
                        route.namespace().unwrap_or_default(),
                        route.name_any()
                    ),
                    fix,
                ));
            }
        }
    }
    or_ok(out, "service-bypass", || {
        format!("no Service of {services} reaches a route's app around the sidecar")
    })
}

/// Routes the operator did not accept, or whose target is missing.
pub fn routes(routes: &[GraceRoute]) -> Vec<Finding> {
    let mut out = Vec::new();
    for r in routes {
        let id = format!("{}/{}", r.namespace().unwrap_or_default(), r.name_any());
        let describe = format!(
            "kubectl -n {} describe groute {}",
            r.namespace().unwrap_or_default(),
            r.name_any()
        );
        match r.condition("Accepted") {
            None => out.push(Finding::problem(
                "route",
                format!(
                    "GraceRoute {id} has no Accepted condition: the operator has not reconciled it"
                ),
                "check the leader finding above; kubectl logs of the leading operator pod"
                    .to_owned(),
            )),
            Some(c) if c.status != "True" => out.push(Finding::problem(
                "route",
                format!(
                    "GraceRoute {id} is not Accepted ({}): {}",
                    c.reason, c.message
                ),
                describe.clone(),
            )),
            Some(_) => {}
        }
        if let Some(c) = r.condition("Ready").filter(|c| {
            c.status != "True"
                && matches!(
                    c.reason.as_str(),
                    "TargetNotFound" | "NoTargets" | "Overlap"
                )
        }) {
            let fix = match c.message.split_once("; ") {
                Some((_, fix)) if c.reason == "TargetNotFound" => fix.to_owned(),
                _ => describe,
            };
            out.push(Finding::problem(
                "route",
                format!("GraceRoute {id} ({}): {}", c.reason, c.message),
                fix,
            ));
        }
    }
    or_ok(out, "route", || {
        format!(
            "{} GraceRoutes accepted, each with its target",
            routes.len()
        )
    })
}

fn live(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_none()
        && !matches!(
            p.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        )
}

pub(crate) fn pod_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// How to get a pod recreated through the webhook: restart its workload, or delete it
/// when nothing owns it (then it must be created again by whoever made it).
fn recreate(p: &Pod) -> String {
    let ns = p.namespace().unwrap_or_default();
    let owner = p
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true));
    match owner {
        Some(o) if o.kind == "ReplicaSet" => {
            let hash = p
                .labels()
                .get("pod-template-hash")
                .map(String::as_str)
                .unwrap_or("");
            let deployment = o.name.strip_suffix(&format!("-{hash}")).unwrap_or(&o.name);
            format!("kubectl -n {ns} rollout restart deployment/{deployment}")
        }
        Some(o) if matches!(o.kind.as_str(), "StatefulSet" | "DaemonSet") => {
            format!(
                "kubectl -n {ns} rollout restart {}/{}",
                o.kind.to_lowercase(),
                o.name
            )
        }
        _ => format!(
            "kubectl -n {ns} delete pod {} and create it again (nothing owns it)",
            p.name_any()
        ),
    }
}

/// NetworkPolicies that admit an injected pod's app port by number but not the sidecar's
/// listener, so port takeover drops the Service's traffic (the operator's own rule,
/// `netpol::blocked`). `policies` is `Err` when they could not be read (RBAC): said, not
/// judged.
pub fn network_policies(pods: &[Pod], policies: Result<&[NetworkPolicy], &str>) -> Vec<Finding> {
    let policies = match policies {
        Ok(p) => p,
        Err(why) => {
            return vec![Finding::ok(
                "network-policy",
                format!("NetworkPolicies not checked: {why}"),
            )];
        }
    };
    let injected: Vec<Pod> = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none() && is_injected(p))
        .cloned()
        .collect();
    let blocked = kubegrace_api::netpol::blocked(&injected, policies);
    if blocked.is_empty() {
        return vec![Finding::ok(
            "network-policy",
            format!(
                "no NetworkPolicy of {} admits an injected pod's app port by number only",
                policies.len()
            ),
        )];
    }
    blocked
        .iter()
        .map(|b| {
            let (what, fix) = b.explain();
            let ns = injected
                .iter()
                .find_map(|p| p.metadata.namespace.clone())
                .unwrap_or_default();
            Finding::problem("network-policy", format!("{ns}: {what}"), fix)
        })
        .collect()
}

/// `out`, or when it holds no problem, the one finding that says all is well.
fn or_ok(
    mut out: Vec<Finding>,
    topic: &'static str,
    all_well: impl FnOnce() -> String,
) -> Vec<Finding> {
    if out.is_empty() {
        out.push(Finding::ok(topic, all_well()));
    }
    out
}
