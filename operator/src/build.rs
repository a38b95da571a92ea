//! The pure middle of the pipeline: GraceRoute spec (+ the target's pod
//! template) -> sidecar config, time budget and the target's rollout fields.
//! Nothing here talks to the API server, so every rule is tested from inline
//! YAML.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::time::Duration;

use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kubegrace_sidecar_api::config::{
    CATCH_ALL_ROUTE, CircuitBreakerConfig, Config, DrainConfig, DrainGrpcHealth, DrainReadiness, Endpoint,
    FailureKind, FallbackConfig, Http2GoAway, HumanDuration, Protocol, RouteConfig, RouteMatch,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::crd::{
    CircuitBreakerSpec, FallbackSpec, GraceRouteSpec, GrpcHealthSpec, Http2GoAwaySpec, PortProtocol, Readiness,
    RolloutSpec, TargetKind,
};
use crate::keys;

/// Time after the drain for the app to exit on SIGTERM and the sidecar to
/// follow. With native sidecars the kubelet sends the sidecar SIGTERM only
/// after the app exited, and only 2s remain for it if the app used up the
/// grace period; the margin keeps us clear of that cliff.
pub const MARGIN: Duration = Duration::from_secs(5);

/// Why a route cannot be applied: a condition reason and a message a person
/// can act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    pub reason: &'static str,
    pub message: String,
}

impl Invalid {
    pub fn new(reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
        }
    }
}

/// The terminationGracePeriodSeconds a route needs, and how it was derived.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budget {
    pub max_delay: Duration,
    /// drain.timeout as written.
    pub drain_timeout: Duration,
    /// The longest route timeout and its route, if longer than drain.timeout.
    pub longest_route: Option<(String, Duration)>,
    pub margin: Duration,
    /// max_delay + max(drain timeout, longest route timeout) + margin, rounded up.
    pub required_seconds: i64,
    /// What goes into the pod template: the user's number or the required one.
    pub seconds: i64,
}

impl Budget {
    /// The effective drain timeout: in-flight requests get as long as the
    /// longest route allows them.
    pub fn effective_timeout(&self) -> Duration {
        match &self.longest_route {
            Some((_, t)) => *t,
            None => self.drain_timeout,
        }
    }

    /// `drain.maxDelay 15s + drain.timeout 30s + 5s margin = 50s`.
    pub fn explain(&self) -> String {
        let mut s = format!("drain.maxDelay {} + ", HumanDuration(self.max_delay));
        match &self.longest_route {
            Some((name, t)) => {
                let _ = write!(
                    s,
                    "route {name:?} timeout {} (longer than drain.timeout {})",
                    HumanDuration(*t),
                    HumanDuration(self.drain_timeout)
                );
            }
            None => {
                let _ = write!(s, "drain.timeout {}", HumanDuration(self.drain_timeout));
            }
        }
        let _ = write!(
            s,
            " + {} margin = {}s",
            HumanDuration(self.margin),
            self.required_seconds
        );
        s
    }
}

fn ceil_secs(d: Duration) -> i64 {
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    i64::try_from(secs).unwrap_or(i64::MAX)
}

/// Derives the time budget; rejects a user-pinned grace period that is too
/// short, with the numbers.
pub fn budget(spec: &GraceRouteSpec) -> Result<Budget, Invalid> {
    let max_delay = spec.drain.max_delay.get();
    let drain_timeout = spec.drain.timeout.get();
    let longest_route = spec
        .routes
        .iter()
        .filter_map(|r| r.timeout.map(|t| (r.name.clone(), t.get())))
        .max_by_key(|(_, t)| *t)
        .filter(|(_, t)| *t > drain_timeout);
    let effective = longest_route.as_ref().map_or(drain_timeout, |(_, t)| *t);
    let required_seconds = ceil_secs(max_delay + effective + MARGIN);
    let mut b = Budget {
        max_delay,
        drain_timeout,
        longest_route,
        margin: MARGIN,
        required_seconds,
        seconds: required_seconds,
    };
    match &spec.grace() {
        IntOrString::String(s) if s == "auto" => {}
        IntOrString::Int(n) => {
            let n = i64::from(*n);
            if n < required_seconds {
                return Err(Invalid::new(
                    "BudgetDoesNotFit",
                    format!(
                        "rollout.terminationGracePeriodSeconds is {n} but a drain needs {required_seconds}s ({} > {n}s); \
                         raise it to at least {required_seconds}, set it to auto, or shorten drain.maxDelay, drain.timeout or the route timeouts",
                        b.explain()
                    ),
                ));
            }
            b.seconds = n;
        }
        IntOrString::String(other) => {
            return Err(Invalid::new(
                "InvalidSpec",
                format!(
                    "rollout.terminationGracePeriodSeconds {other:?} is neither auto nor a number of seconds"
                ),
            ));
        }
    }
    Ok(b)
}

/// Where the sidecar listens and where the app is, for one pod shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortPlan {
    pub listen: u16,
    pub upstream: u16,
}

/// Checks the route against the target's pod template: the named port must
/// exist. Returns the port plan the webhook will use for such pods.
pub fn check_template(
    spec: &GraceRouteSpec,
    target: &str,
    template: &PodTemplateSpec,
) -> Result<PortPlan, Invalid> {
    let Some(pod) = template.spec.as_ref() else {
        return Err(Invalid::new(
            "TargetInvalid",
            format!("{target} has no pod template spec"),
        ));
    };
    let wanted = spec
        .ports
        .first()
        .map(|p| p.name.as_str())
        .unwrap_or_default();
    let mut names = Vec::new();
    for c in &pod.containers {
        for p in c.ports.iter().flatten() {
            if let Some(n) = &p.name {
                if n == wanted {
                    let upstream = u16::try_from(p.container_port).unwrap_or(0);
                    let ports = crate::inject::Ports::default();
                    let admin = ports
                        .admin_port(pod, template.metadata.as_ref())
                        .unwrap_or(0);
                    let listen = ports.listen_port(pod, admin);
                    return Ok(PortPlan { listen, upstream });
                }
                names.push(n.clone());
            }
        }
    }
    let have = if names.is_empty() {
        "it names none of its container ports".to_string()
    } else {
        format!("it has: {}", names.join(", "))
    };
    Err(Invalid::new(
        "UnknownPort",
        format!(
            "{target} has no container port named {wanted:?} ({have}); set ports[0].name to one of them, or name the port in the pod template"
        ),
    ))
}

fn protocol(p: PortProtocol) -> Protocol {
    match p {
        // Auto speaks HTTP/1.1 and tells h2c prior knowledge apart by the
        // preface, so an "http" port never breaks an HTTP/2 client.
        PortProtocol::Http => Protocol::Auto,
        PortProtocol::Http2 | PortProtocol::Grpc => Protocol::Http2,
        PortProtocol::Tcp => Protocol::Tcp,
    }
}

fn readiness(r: Readiness) -> DrainReadiness {
    match r {
        Readiness::FailFast => DrainReadiness::FailFast,
        Readiness::StayServing => DrainReadiness::StayServing,
    }
}

fn grpc_health(g: GrpcHealthSpec) -> DrainGrpcHealth {
    match g {
        GrpcHealthSpec::NotServing => DrainGrpcHealth::NotServing,
        GrpcHealthSpec::App => DrainGrpcHealth::App,
    }
}

fn http2_go_away(g: Http2GoAwaySpec) -> Http2GoAway {
    match g {
        Http2GoAwaySpec::Auto => Http2GoAway::Auto,
        Http2GoAwaySpec::TwoPhase => Http2GoAway::TwoPhase,
        Http2GoAwaySpec::FinalOnly => Http2GoAway::FinalOnly,
    }
}

fn breaker(cb: &CircuitBreakerSpec) -> CircuitBreakerConfig {
    CircuitBreakerConfig {
        max_concurrent: cb.max_concurrent,
        max_queue: cb.max_queue,
        queue_timeout: cb.queue_timeout.0,
        error_ratio: cb.error_ratio,
        min_requests: cb.min_requests,
        window: cb.window.0,
        consecutive_failures: cb.consecutive_failures,
        open_for: cb.open_for.0,
        max_open_for: cb.max_open_for.0,
        half_open_probes: cb.half_open_probes,
        adaptive: cb.adaptive,
        min_concurrent: cb.min_concurrent,
    }
}

fn fallback(fb: &FallbackSpec) -> FallbackConfig {
    FallbackConfig {
        status: fb.status,
        content_type: fb.content_type.clone(),
        body: fb.body.clone(),
    }
}

/// The sidecar configuration for a route. `ports` is what the webhook will
/// pass on the command line for the target's pods (flags win over the file,
/// so this only keeps `/config` truthful); without it the sidecar defaults
/// stay in the file.
pub fn sidecar_config(
    spec: &GraceRouteSpec,
    budget: &Budget,
    ports: Option<PortPlan>,
) -> Result<Config, Invalid> {
    let mut config = Config {
        protocol: spec
            .ports
            .first()
            .map_or(Protocol::Auto, |p| protocol(p.protocol)),
        drain: DrainConfig {
            min_delay: spec.drain.min_delay.0,
            quiet: spec.drain.quiet.0,
            max_delay: spec.drain.max_delay.0,
            timeout: HumanDuration(budget.effective_timeout()),
            readiness: readiness(spec.drain.readiness),
            http2_go_away: http2_go_away(spec.drain.http2_go_away),
            grpc_health: grpc_health(spec.drain.grpc_health),
        },
        ..Config::default()
    };
    if let Some(p) = ports {
        config.listen = Endpoint::Tcp(SocketAddr::from(([0, 0, 0, 0], p.listen)));
        config.upstream = Endpoint::Tcp(SocketAddr::from(([127, 0, 0, 1], p.upstream)));
    }
    // The admin address is per pod (chosen at injection against the pod's
    // ports) and always passed as a flag; the file keeps the sidecar default.
    let shared_cb = spec.circuit_breaker.as_ref().map(breaker);
    for (i, r) in spec.routes.iter().enumerate() {
        let fail_on = match &r.fail_on {
            None => FailureKind::defaults(),
            Some(list) => list
                .iter()
                .enumerate()
                .map(|(j, f)| {
                    f.0.parse::<FailureKind>().map_err(|e| {
                        Invalid::new("InvalidSpec", format!("routes[{i}].failOn[{j}]: {e}"))
                    })
                })
                .collect::<Result<Vec<_>, _>>()?,
        };
        let m = r.matcher.clone().unwrap_or_default();
        config.routes.push(RouteConfig {
            name: r.name.clone(),
            matcher: RouteMatch {
                path_prefix: m.path_prefix,
                path: m.path,
                methods: m.methods.into_iter().map(|x| x.0).collect(),
                host: m.host,
            },
            timeout: r.timeout.map(|t| t.0),
            circuit_breaker: r
                .circuit_breaker
                .as_ref()
                .map(breaker)
                .or_else(|| shared_cb.clone()),
            fallback: r.fallback.as_ref().map(fallback),
            fail_on,
        });
    }
    // A user route with the catch-all's name already is the catch-all's
    // policy in the sidecar; a second one would be unreachable.
    let has_catch_all = config.routes.iter().any(|r| r.name == CATCH_ALL_ROUTE);
    if let Some(cb) = shared_cb.filter(|_| !has_catch_all) {
        // The route-wide breaker also guards traffic no route matches.
        config.routes.push(RouteConfig {
            name: CATCH_ALL_ROUTE.into(),
            matcher: RouteMatch::default(),
            timeout: None,
            circuit_breaker: Some(cb),
            fallback: None,
            fail_on: FailureKind::defaults(),
        });
    }
    // The sidecar's keys are the CRD's (same vocabulary), so its message
    // points at the field to fix.
    config
        .validate()
        .map_err(|e| Invalid::new("InvalidSpec", format!("{}: {}", e.key, e.message)))?;
    Ok(config)
}

/// `config.yaml` and its hash (sha256, first 16 hex digits).
pub fn render(config: &Config) -> Result<(String, String), Invalid> {
    let yaml = serde_yaml::to_string(config)
        .map_err(|e| Invalid::new("InvalidSpec", format!("rendering the sidecar config: {e}")))?;
    let digest = Sha256::digest(yaml.as_bytes());
    let mut hash = String::with_capacity(16);
    for b in digest.iter().take(8) {
        let _ = write!(hash, "{b:02x}");
    }
    Ok((yaml, hash))
}

/// The name of the ConfigMap holding a route's sidecar config.
pub fn config_map_name(route: &str) -> String {
    format!("kubegrace-{route}")
}

/// The target's rollout values before the first route touched them; written
/// once into an annotation on the target and restored on route deletion.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Originals {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_surge: Option<IntOrString>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<IntOrString>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_ready_seconds: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub termination_grace_period_seconds: Option<i64>,
}

/// What the route controller needs to know of a Deployment or StatefulSet.
#[derive(Debug, Clone)]
pub struct Target {
    pub kind: TargetKind,
    pub name: String,
    pub template: PodTemplateSpec,
    /// `RollingUpdate`, `Recreate` (Deployment) or `OnDelete` (StatefulSet).
    pub strategy_type: Option<String>,
    pub current: Originals,
    /// The annotation [`keys::ORIGINAL`] if a route already wrote it.
    pub recorded: Option<String>,
    pub annotations: BTreeMap<String, String>,
}

impl Target {
    pub fn id(&self) -> String {
        format!("{}/{}", self.kind, self.name)
    }

    /// The route this target's pod template is pinned to.
    pub fn pinned_route(&self) -> Option<&str> {
        self.template
            .metadata
            .as_ref()
            .and_then(|m| m.annotations.as_ref())
            .and_then(|a| a.get(keys::ROUTE))
            .map(String::as_str)
    }
}

/// The server-side apply body for the target: only the rollout fields the
/// route's explicit `rollout` block sets, nothing else (fields left out are
/// not ours, and stay what the user's manifest says). Never the pod
/// template: the grace period is raised per pod by the webhook, so neither
/// a budget change nor a GitOps re-apply rolls the pods. `None` when there
/// is nothing to write. Also returns notes on what could not be applied.
pub fn target_apply(
    rollout: Option<&RolloutSpec>,
    target: &Target,
) -> (Option<Value>, Vec<String>) {
    let mut notes = Vec::new();
    let mut spec = serde_json::Map::new();
    // What we are about to own, with the value it has before we do.
    let mut record: Originals = target
        .recorded
        .as_deref()
        .and_then(|r| serde_json::from_str(r).ok())
        .unwrap_or_default();
    let fresh = target.recorded.is_none();
    if let Some(r) = rollout {
        if let Some(m) = r.min_ready_seconds {
            spec.insert("minReadySeconds".into(), json!(m));
            if fresh || record.min_ready_seconds.is_none() {
                record.min_ready_seconds = target.current.min_ready_seconds;
            }
        }
        let surge_fields = r.max_surge.is_some() || r.max_unavailable.is_some();
        match (target.kind, target.strategy_type.as_deref()) {
            (_, _) if !surge_fields => {}
            (TargetKind::Deployment, Some("Recreate")) => {
                notes.push(format!(
                    "{} uses the Recreate strategy: maxSurge and maxUnavailable not applied",
                    target.id()
                ));
            }
            (TargetKind::Deployment, _) => {
                let mut ru = serde_json::Map::new();
                if let Some(v) = &r.max_surge {
                    ru.insert("maxSurge".into(), json!(v));
                    if fresh || record.max_surge.is_none() {
                        record.max_surge = target.current.max_surge.clone();
                    }
                }
                if let Some(v) = &r.max_unavailable {
                    ru.insert("maxUnavailable".into(), json!(v));
                    if fresh || record.max_unavailable.is_none() {
                        record.max_unavailable = target.current.max_unavailable.clone();
                    }
                }
                spec.insert("strategy".into(), json!({"rollingUpdate": ru}));
            }
            (TargetKind::StatefulSet, _) => {
                // StatefulSets roll one pod at a time; maxUnavailable there is
                // still behind a feature gate.
                notes.push(format!(
                    "{} is a StatefulSet: maxSurge/maxUnavailable do not apply",
                    target.id()
                ));
            }
        }
    }
    if record == Originals::default() && spec.is_empty() {
        return (None, notes);
    }
    let original = serde_json::to_string(&record).unwrap_or_else(|_| "{}".into());
    let mut body = json!({
        "apiVersion": "apps/v1",
        "kind": target.kind.to_string(),
        "metadata": {
            "name": target.name,
            "annotations": {keys::ORIGINAL: original},
        },
    });
    if !spec.is_empty() {
        body["spec"] = Value::Object(spec);
    }
    (Some(body), notes)
}

/// The number of the container port named `name` in a pod template.
pub fn app_port(template: &PodTemplateSpec, name: &str) -> Option<i32> {
    template
        .spec
        .as_ref()?
        .containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .find(|p| p.name.as_deref() == Some(name))
        .map(|p| p.container_port)
}

/// A Service port that reaches the app directly instead of the sidecar.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bypass {
    pub service: String,
    /// Index in `spec.ports` (for the JSON patch in the fix).
    pub index: usize,
    pub port: i32,
    /// The targetPort as written (`8080`, or empty when it defaults to `port`).
    pub target: String,
}

impl Bypass {
    /// The sentence for conditions, Events and admission warnings: what is
    /// wrong, and the exact command that fixes it.
    pub fn explain(&self, port_name: &str) -> String {
        let how = if self.target.is_empty() {
            format!("{} (targetPort unset means the port number)", self.port)
        } else if self.target.parse::<i32>().is_ok() {
            format!("{} by number", self.target)
        } else {
            format!("{} (the app's renamed port)", self.target)
        };
        format!(
            "Service {svc} port {port} targets {how}, which reaches the app directly: its traffic skips the sidecar and is not drained; fix: set targetPort: {port_name} in the Service (kubectl patch service {svc} --type=json -p '[{{\"op\":\"replace\",\"path\":\"/spec/ports/{i}/targetPort\",\"value\":\"{port_name}\"}}]')",
            svc = self.service,
            port = self.port,
            i = self.index,
        )
    }
}

/// The Service ports that select the route's pods and resolve to the app's
/// port instead of the sidecar's listener (pure). Port takeover moves the
/// *name* to the sidecar and keeps the app's *number*, so a `targetPort`
/// that is the number (or unset, which means the number) bypasses the
/// sidecar, as does one naming the app's renamed port (`kg-<name>`).
/// `pods` are the label sets of the route's pods (its targets' templates).
pub fn bypassing_services(
    services: &[k8s_openapi::api::core::v1::Service],
    pods: &[BTreeMap<String, String>],
    port_name: &str,
    app_port: i32,
) -> Vec<Bypass> {
    let renamed = crate::inject::app_port_name(port_name, &Default::default());
    let mut out = Vec::new();
    for svc in services {
        let Some(spec) = svc.spec.as_ref() else {
            continue;
        };
        // A Service without a selector has hand-made endpoints: not ours to judge.
        let Some(sel) = spec.selector.as_ref().filter(|s| !s.is_empty()) else {
            continue;
        };
        let selects = pods
            .iter()
            .any(|labels| sel.iter().all(|(k, v)| labels.get(k) == Some(v)));
        if !selects {
            continue;
        }
        for (index, p) in spec.ports.iter().flatten().enumerate() {
            if p.protocol.as_deref().is_some_and(|pr| pr != "TCP") {
                continue;
            }
            let (bypasses, target) = match &p.target_port {
                None => (p.port == app_port, String::new()),
                Some(IntOrString::Int(n)) => (*n == app_port, n.to_string()),
                Some(IntOrString::String(s)) => (*s == renamed, s.clone()),
            };
            if bypasses {
                out.push(Bypass {
                    service: svc.metadata.name.clone().unwrap_or_default(),
                    index,
                    port: p.port,
                    target,
                });
            }
        }
    }
    out
}

/// The merge patch restoring what a route changed: the recorded originals,
/// in one write so the pods roll at most once. The pod template is only
/// touched where an earlier operator version wrote into it (a route pin or
/// a grace period in the record); otherwise it is left exactly as it is.
pub fn restore_patch(target: &Target) -> Option<Value> {
    let recorded = target.recorded.as_deref()?;
    let original: Originals = serde_json::from_str(recorded).unwrap_or_default();
    let mut template = serde_json::Map::new();
    if let Some(t) = original.termination_grace_period_seconds {
        template.insert("spec".into(), json!({"terminationGracePeriodSeconds": t}));
    }
    if target.pinned_route().is_some() {
        template.insert(
            "metadata".into(),
            json!({"annotations": {keys::ROUTE: null}}),
        );
    }
    let mut spec = serde_json::Map::new();
    if !template.is_empty() {
        spec.insert("template".into(), Value::Object(template));
    }
    if let Some(m) = original.min_ready_seconds {
        spec.insert("minReadySeconds".into(), json!(m));
    }
    if target.kind == TargetKind::Deployment && target.strategy_type.as_deref() != Some("Recreate")
    {
        let mut ru = serde_json::Map::new();
        if let Some(v) = &original.max_surge {
            ru.insert("maxSurge".into(), json!(v));
        }
        if let Some(v) = &original.max_unavailable {
            ru.insert("maxUnavailable".into(), json!(v));
        }
        if !ru.is_empty() {
            spec.insert("strategy".into(), json!({"rollingUpdate": ru}));
        }
    }
    Some(json!({"metadata": {"annotations": {keys::ORIGINAL: null}}, "spec": spec}))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::GraceRoute;

    fn route(yaml: &str) -> GraceRoute {
        serde_yaml::from_str(yaml).expect("valid route yaml")
    }

    /// Reads a rendered config back the way the sidecar reads its file.
    fn sidecar_reads(yaml: &str) -> Config {
        let config: Config = serde_yaml::from_str(yaml).expect("the sidecar parses it");
        config.validate().expect("the sidecar accepts it");
        config
    }

    const BASE: &str = r#"
apiVersion: kubegrace.io/v1alpha1
kind: GraceRoute
metadata: {name: web, namespace: shop}
spec:
  targetRef: {kind: Deployment, name: web}
  ports: [{name: http}]
"#;

    fn template(yaml: &str) -> PodTemplateSpec {
        serde_yaml::from_str(yaml).expect("valid template")
    }

    #[test]
    fn defaults_give_the_sidecar_defaults_and_a_50s_budget() {
        let r = route(BASE);
        let b = budget(&r.spec).expect("valid");
        assert_eq!(b.required_seconds, 15 + 30 + 5);
        assert_eq!(b.seconds, 50);
        let c = sidecar_config(&r.spec, &b, None).expect("valid");
        assert_eq!(c.drain, DrainConfig::default());
        assert!(c.routes.is_empty());
        assert!(r.spec.rollout.is_none(), "no rollout block unless written");
    }

    #[test]
    fn the_longest_route_timeout_raises_budget_and_drain_timeout() {
        let r = route(&format!(
            "{BASE}  drain: {{maxDelay: 5s, timeout: 10s}}\n  routes:\n  - {{name: slow, timeout: 1m}}\n  - {{name: fast, timeout: 2s}}\n"
        ));
        let b = budget(&r.spec).expect("valid");
        assert_eq!(b.required_seconds, 5 + 60 + 5);
        assert_eq!(
            b.longest_route,
            Some(("slow".into(), Duration::from_secs(60)))
        );
        assert!(
            b.explain().contains("route \"slow\" timeout 1m"),
            "{}",
            b.explain()
        );
        let c = sidecar_config(&r.spec, &b, None).expect("valid");
        assert_eq!(c.drain.timeout, HumanDuration::from_secs(60));
        assert_eq!(c.routes.len(), 2);
    }

    #[test]
    fn drain_readiness_is_carried_into_the_sidecar_config() {
        let b = budget(&route(BASE).spec).expect("valid");
        let c = sidecar_config(&route(BASE).spec, &b, None).expect("valid");
        assert_eq!(
            c.drain.readiness,
            DrainReadiness::FailFast,
            "unset: the sidecar default"
        );
        let r = route(&format!(
            "{BASE}  drain: {{maxDelay: 5s, readiness: stayServing}}\n"
        ));
        assert_eq!(r.spec.drain.readiness, Readiness::StayServing);
        let b = budget(&r.spec).expect("valid");
        let c = sidecar_config(&r.spec, &b, None).expect("valid");
        assert_eq!(c.drain.readiness, DrainReadiness::StayServing);
        assert_eq!(c.drain.max_delay, HumanDuration::from_secs(5));
        // The file the sidecar reads back says the same.
        let (yaml, _) = render(&c).expect("render");
        assert!(yaml.contains("readiness: stayServing"), "{yaml}");
        assert_eq!(
            sidecar_reads(&yaml).drain.readiness,
            DrainReadiness::StayServing
        );
        // The budget does not depend on it.
        assert_eq!(b.required_seconds, 5 + 30 + 5);
        let err =
            serde_yaml::from_str::<GraceRoute>(&format!("{BASE}  drain: {{readiness: stay}}\n"))
                .expect_err("unknown value");
        assert!(err.to_string().contains("stayServing"), "{err}");
    }

    #[test]
    fn drain_grpc_health_is_carried_into_the_sidecar_config() {
        let b = budget(&route(BASE).spec).expect("valid");
        let c = sidecar_config(&route(BASE).spec, &b, None).expect("valid");
        assert_eq!(
            c.drain.grpc_health,
            DrainGrpcHealth::NotServing,
            "unset: the sidecar default"
        );
        let r = route(&format!("{BASE}  drain: {{grpcHealth: app}}\n"));
        let b = budget(&r.spec).expect("valid");
        let c = sidecar_config(&r.spec, &b, None).expect("valid");
        assert_eq!(c.drain.grpc_health, DrainGrpcHealth::App);
        let (yaml, _) = render(&c).expect("render");
        assert_eq!(
            sidecar_reads(&yaml).drain.grpc_health,
            DrainGrpcHealth::App,
            "{yaml}"
        );
        let err = serde_yaml::from_str::<GraceRoute>(&format!("{BASE}  drain: {{grpcHealth: off}}\n"))
            .expect_err("unknown value");
        assert!(err.to_string().contains("notServing"), "{err}");
    }

    #[test]
    fn drain_http2_go_away_is_carried_into_the_sidecar_config() {
        let b = budget(&route(BASE).spec).expect("valid");
        let c = sidecar_config(&route(BASE).spec, &b, None).expect("valid");
        assert_eq!(
            c.drain.http2_go_away,
            Http2GoAway::Auto,
            "unset: the sidecar default"
        );
        for (given, want) in [
            ("auto", Http2GoAway::Auto),
            ("twoPhase", Http2GoAway::TwoPhase),
            ("finalOnly", Http2GoAway::FinalOnly),
        ] {
            let r = route(&format!("{BASE}  drain: {{http2GoAway: {given}}}\n"));
            let b = budget(&r.spec).expect("valid");
            let c = sidecar_config(&r.spec, &b, None).expect("valid");
            assert_eq!(c.drain.http2_go_away, want, "{given}");
            let (yaml, _) = render(&c).expect("render");
            assert_eq!(sidecar_reads(&yaml).drain.http2_go_away, want, "{yaml}");
        }
        let err =
            serde_yaml::from_str::<GraceRoute>(&format!("{BASE}  drain: {{http2GoAway: two}}\n"))
                .expect_err("unknown value");
        assert!(err.to_string().contains("twoPhase"), "{err}");
    }

    #[test]
    fn sub_second_parts_round_up() {
        let r = route(&format!(
            "{BASE}  drain: {{minDelay: 100ms, maxDelay: 1500ms, timeout: 1s}}\n"
        ));
        assert_eq!(budget(&r.spec).expect("valid").required_seconds, 8);
    }

    #[test]
    fn a_pinned_grace_period_too_short_is_rejected_with_the_numbers() {
        let r = route(&format!(
            "{BASE}  drain: {{maxDelay: 10s, timeout: 20s}}\n  rollout: {{terminationGracePeriodSeconds: 30}}\n"
        ));
        let err = budget(&r.spec).expect_err("does not fit");
        assert_eq!(err.reason, "BudgetDoesNotFit");
        assert!(
            err.message.contains("is 30 but a drain needs 35s"),
            "{}",
            err.message
        );
        assert!(
            err.message
                .contains("drain.maxDelay 10s + drain.timeout 20s + 5s margin = 35s"),
            "{}",
            err.message
        );
        let ok = route(&format!(
            "{BASE}  drain: {{maxDelay: 10s, timeout: 20s}}\n  rollout: {{terminationGracePeriodSeconds: 90}}\n"
        ));
        assert_eq!(budget(&ok.spec).expect("fits").seconds, 90);
    }

    #[test]
    fn the_config_carries_routes_breakers_and_the_catch_all() {
        let base = BASE.replace("[{name: http}]", "[{name: grpc, protocol: grpc}]");
        let r = route(&format!(
            r#"{base}  circuitBreaker: {{maxConcurrent: 10}}
  routes:
  - name: api
    match: {{pathPrefix: /api, methods: [GET]}}
    timeout: 5s
    circuitBreaker: {{maxConcurrent: 3, errorRatio: 0.2}}
    fallback: {{status: 503, body: busy}}
    failOn: ["503", connect-error]
  - name: other
"#
        ));
        let b = budget(&r.spec).expect("valid");
        let c = sidecar_config(
            &r.spec,
            &b,
            Some(PortPlan {
                listen: 15181,
                upstream: 8080,
            }),
        )
        .expect("valid");
        assert_eq!(c.protocol, Protocol::Http2);
        assert_eq!(c.listen.to_string(), "0.0.0.0:15181");
        assert_eq!(c.upstream.to_string(), "127.0.0.1:8080");
        assert_eq!(c.routes.len(), 3);
        assert_eq!(
            c.routes[0]
                .circuit_breaker
                .as_ref()
                .map(|c| c.max_concurrent),
            Some(3)
        );
        assert_eq!(
            c.routes[0].fail_on,
            vec![FailureKind::Status(503), FailureKind::ConnectError]
        );
        assert_eq!(
            c.routes[1]
                .circuit_breaker
                .as_ref()
                .map(|c| c.max_concurrent),
            Some(10)
        );
        assert_eq!(c.routes[2].name, CATCH_ALL_ROUTE);
        // The file the sidecar reads back is the file we wrote.
        let (yaml, hash) = render(&c).expect("render");
        assert_eq!(sidecar_reads(&yaml), c);
        assert_eq!(hash.len(), 16);
        assert_eq!(render(&c).expect("render").1, hash, "hash is stable");
    }

    #[test]
    fn what_the_schema_would_refuse_is_refused_here_too() {
        let r = route(&format!("{BASE}  drain: {{minDelay: 20s, maxDelay: 5s}}\n"));
        let b = budget(&r.spec).expect("budget");
        let err = sidecar_config(&r.spec, &b, None).expect_err("minDelay > maxDelay");
        assert!(err.message.starts_with("drain.minDelay"), "{}", err.message);
    }

    #[test]
    fn an_unknown_port_names_the_ports_there_are() {
        let r = route(BASE);
        let t = template(
            "spec: {containers: [{name: app, ports: [{name: web, containerPort: 8080}, {name: metrics, containerPort: 9090}]}]}",
        );
        let err = check_template(&r.spec, "Deployment/web", &t).expect_err("no port http");
        assert_eq!(err.reason, "UnknownPort");
        assert!(
            err.message.contains("it has: web, metrics"),
            "{}",
            err.message
        );
        let t = template(
            "spec: {containers: [{name: app, ports: [{name: http, containerPort: 8080}]}]}",
        );
        assert_eq!(
            check_template(&r.spec, "Deployment/web", &t).expect("found"),
            PortPlan {
                listen: 15181,
                upstream: 8080
            }
        );
    }

    fn target(strategy: Option<&str>, recorded: Option<&str>) -> Target {
        Target {
            kind: TargetKind::Deployment,
            name: "web".into(),
            template: PodTemplateSpec::default(),
            strategy_type: strategy.map(Into::into),
            current: Originals {
                max_surge: Some(IntOrString::String("25%".into())),
                max_unavailable: Some(IntOrString::String("25%".into())),
                min_ready_seconds: None,
                termination_grace_period_seconds: Some(30),
            },
            recorded: recorded.map(Into::into),
            annotations: BTreeMap::new(),
        }
    }

    #[test]
    fn without_a_rollout_block_nothing_is_written_into_the_workload() {
        let r = route(BASE);
        let (body, notes) = target_apply(
            r.spec.rollout.as_ref(),
            &target(Some("RollingUpdate"), None),
        );
        assert!(body.is_none(), "{body:?}");
        assert!(notes.is_empty());
        // Only pinning the grace period is no reason to touch the workload either.
        let r = route(&format!(
            "{BASE}  rollout: {{terminationGracePeriodSeconds: 90}}\n"
        ));
        assert!(
            target_apply(r.spec.rollout.as_ref(), &target(None, None))
                .0
                .is_none()
        );
    }

    #[test]
    fn an_explicit_rollout_block_writes_only_its_fields_and_remembers_originals() {
        let r = route(&format!(
            "{BASE}  rollout: {{maxUnavailable: 0, minReadySeconds: 3}}\n"
        ));
        let (body, notes) = target_apply(
            r.spec.rollout.as_ref(),
            &target(Some("RollingUpdate"), None),
        );
        let body = body.expect("fields to write");
        assert!(notes.is_empty());
        assert_eq!(
            body["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"],
            0
        );
        assert!(
            body["spec"]["strategy"]["rollingUpdate"]
                .get("maxSurge")
                .is_none()
        );
        assert_eq!(body["spec"]["minReadySeconds"], 3);
        assert!(
            body["spec"].get("template").is_none(),
            "never the pod template: {body}"
        );
        let original = body["metadata"]["annotations"][keys::ORIGINAL]
            .as_str()
            .expect("string");
        assert_eq!(original, r#"{"maxUnavailable":"25%"}"#);
        // Once recorded, a field's record never changes (it would record our own values).
        let (again, _) = target_apply(r.spec.rollout.as_ref(), &target(None, Some(original)));
        assert_eq!(again.expect("body"), body);
        let (recreate, notes) =
            target_apply(r.spec.rollout.as_ref(), &target(Some("Recreate"), None));
        assert!(
            recreate.expect("minReadySeconds")["spec"]
                .get("strategy")
                .is_none()
        );
        assert_eq!(notes.len(), 1);
    }

    #[test]
    fn the_catch_all_is_the_sidecars_one_and_there_is_exactly_one() {
        let r = route(&format!(
            "{BASE}  circuitBreaker: {{maxConcurrent: 10}}\n  routes:\n  - {{name: api, match: {{pathPrefix: /api}}}}\n"
        ));
        let b = budget(&r.spec).expect("valid");
        let c = sidecar_config(&r.spec, &b, None).expect("valid");
        let (yaml, _) = render(&c).expect("render");
        let back = sidecar_reads(&yaml);
        let catch_alls: Vec<&RouteConfig> = back
            .routes
            .iter()
            .filter(|r| r.matcher == RouteMatch::default())
            .collect();
        assert_eq!(catch_alls.len(), 1, "{yaml}");
        assert_eq!(catch_alls[0].name, CATCH_ALL_ROUTE);
        // A user route of that name is the catch-all's policy: no second one.
        let r = route(&format!(
            "{BASE}  circuitBreaker: {{maxConcurrent: 10}}\n  routes:\n  - {{name: default, timeout: 5s}}\n"
        ));
        let c = sidecar_config(&r.spec, &b, None).expect("valid");
        assert_eq!(c.routes.len(), 1);
    }

    #[test]
    fn a_service_targeting_the_app_number_bypasses_and_a_named_one_does_not() {
        let svc = |name: &str, target: &str| -> k8s_openapi::api::core::v1::Service {
            serde_yaml::from_str(&format!(
                "metadata: {{name: {name}}}\nspec: {{selector: {{app: web}}, ports: [{{port: 80{target}}}]}}"
            ))
            .expect("service")
        };
        let services = vec![
            svc("web-num", ", targetPort: 8080"),
            svc("web-named", ", targetPort: http"),
            svc("web-renamed", ", targetPort: kg-http"),
        ];
        let pods = vec![BTreeMap::from([("app".to_string(), "web".to_string())])];
        let found = bypassing_services(&services, &pods, "http", 8080);
        let names: Vec<&str> = found.iter().map(|b| b.service.as_str()).collect();
        assert_eq!(names, vec!["web-num", "web-renamed"]);
        let msg = found[0].explain("http");
        assert!(
            msg.contains("Service web-num port 80 targets 8080 by number"),
            "{msg}"
        );
        assert!(msg.contains(r#"kubectl patch service web-num --type=json -p '[{"op":"replace","path":"/spec/ports/0/targetPort","value":"http"}]'"#), "{msg}");
        // targetPort unset means the port number: 8080 -> 8080 bypasses.
        let unset: k8s_openapi::api::core::v1::Service = serde_yaml::from_str(
            "metadata: {name: u}\nspec: {selector: {app: web}, ports: [{port: 8080}]}",
        )
        .expect("service");
        assert_eq!(bypassing_services(&[unset], &pods, "http", 8080).len(), 1);
        // A Service selecting other pods is not ours.
        let other = vec![BTreeMap::from([("app".to_string(), "db".to_string())])];
        assert!(bypassing_services(&services, &other, "http", 8080).is_empty());
    }

    #[test]
    fn the_restore_patch_puts_originals_back_in_one_write() {
        let t = target(
            Some("RollingUpdate"),
            Some(r#"{"maxSurge":"25%","maxUnavailable":"25%"}"#),
        );
        let patch = restore_patch(&t).expect("recorded");
        assert_eq!(
            patch["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"],
            "25%"
        );
        assert!(
            patch["spec"].get("template").is_none(),
            "pod template untouched: {patch}"
        );
        assert_eq!(
            patch["metadata"]["annotations"][keys::ORIGINAL],
            Value::Null
        );
        assert!(restore_patch(&target(None, None)).is_none());
        // A record from an earlier version (grace period in the template,
        // route pin) is put back too.
        let mut old = target(
            Some("RollingUpdate"),
            Some(r#"{"terminationGracePeriodSeconds":30}"#),
        );
        old.template = template("metadata: {annotations: {kubegrace.io/route: web}}");
        let patch = restore_patch(&old).expect("recorded");
        assert_eq!(
            patch["spec"]["template"]["spec"]["terminationGracePeriodSeconds"],
            30
        );
        assert_eq!(
            patch["spec"]["template"]["metadata"]["annotations"][keys::ROUTE],
            Value::Null
        );
    }
}
