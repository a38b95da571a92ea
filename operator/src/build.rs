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
use kubegrace_sidecar::config::{
    CircuitBreakerConfig, Config, DrainConfig, Endpoint, FailureKind, FallbackConfig,
    HumanDuration, Protocol, RouteConfig, RouteMatch,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::crd::{
    CircuitBreakerSpec, FallbackSpec, GraceRouteSpec, PortProtocol, RolloutSpec, TargetKind,
};
use crate::keys;

/// Time after the drain for the app to exit on SIGTERM and the sidecar to
/// follow. With native sidecars the kubelet sends the sidecar SIGTERM only
/// after the app exited, and only 2s remain for it if the app used up the
/// grace period; the margin keeps us clear of that cliff.
pub const MARGIN: Duration = Duration::from_secs(5);
/// The sidecar's admin port: /ready, /live, /drain.
pub const ADMIN_PORT: u16 = 15020;
/// Name of the catch-all route generated from the route-wide circuitBreaker.
pub const DEFAULT_ROUTE: &str = "kubegrace-default";

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
    match &spec.rollout.termination_grace_period_seconds {
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
                    let listen = crate::inject::pick_sidecar_port(pod);
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
        },
        ..Config::default()
    };
    if let Some(p) = ports {
        config.listen = Endpoint::Tcp(SocketAddr::from(([0, 0, 0, 0], p.listen)));
        config.upstream = Endpoint::Tcp(SocketAddr::from(([127, 0, 0, 1], p.upstream)));
    }
    config.admin = Endpoint::Tcp(SocketAddr::from(([0, 0, 0, 0], ADMIN_PORT)));
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
    if let Some(cb) = shared_cb {
        // The route-wide breaker also guards traffic no route matches.
        config.routes.push(RouteConfig {
            name: DEFAULT_ROUTE.into(),
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
    let yaml = config
        .to_yaml()
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

/// The server-side apply body for the target: everything the route decides,
/// nothing else (fields left out are not ours). Also returns notes on what
/// could not be applied (a person should know).
pub fn target_apply(
    route: &str,
    rollout: &RolloutSpec,
    budget: &Budget,
    target: &Target,
) -> (Value, Vec<String>) {
    let mut notes = Vec::new();
    let original = target
        .recorded
        .clone()
        .unwrap_or_else(|| serde_json::to_string(&target.current).unwrap_or_else(|_| "{}".into()));
    let kind = target.kind.to_string();
    let mut spec = serde_json::Map::new();
    spec.insert("minReadySeconds".into(), json!(rollout.min_ready_seconds));
    spec.insert(
        "template".into(),
        json!({
            "metadata": {"annotations": {keys::ROUTE: route}},
            "spec": {"terminationGracePeriodSeconds": budget.seconds},
        }),
    );
    match (target.kind, target.strategy_type.as_deref()) {
        (TargetKind::Deployment, Some("Recreate")) => {
            notes.push(format!(
                "{} uses the Recreate strategy: maxSurge and maxUnavailable not applied",
                target.id()
            ));
        }
        (TargetKind::Deployment, _) => {
            spec.insert(
                "strategy".into(),
                json!({"rollingUpdate": {"maxSurge": rollout.max_surge, "maxUnavailable": rollout.max_unavailable}}),
            );
        }
        (TargetKind::StatefulSet, Some("OnDelete")) => {
            notes.push(format!(
                "{} uses OnDelete updates: pods pick up the budget when deleted",
                target.id()
            ));
        }
        (TargetKind::StatefulSet, _) => {
            // StatefulSets roll one pod at a time; maxUnavailable there is
            // still behind a feature gate, so only the timing is applied.
            notes.push(format!(
                "{} is a StatefulSet: maxSurge/maxUnavailable do not apply",
                target.id()
            ));
        }
    }
    let body = json!({
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": {
            "name": target.name,
            "annotations": {keys::ORIGINAL: original},
        },
        "spec": spec,
    });
    (body, notes)
}

/// The merge patch restoring what a route changed: the recorded originals,
/// and the route pin removed from the pod template, in one write so the
/// pods roll at most once.
pub fn restore_patch(target: &Target) -> Option<Value> {
    let recorded = target.recorded.as_deref()?;
    let original: Originals = serde_json::from_str(recorded).unwrap_or_default();
    let mut template_spec = serde_json::Map::new();
    if let Some(t) = original.termination_grace_period_seconds {
        template_spec.insert("terminationGracePeriodSeconds".into(), json!(t));
    }
    let mut spec = serde_json::Map::new();
    spec.insert(
        "template".into(),
        json!({"metadata": {"annotations": {keys::ROUTE: null}}, "spec": template_spec}),
    );
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
        assert_eq!(r.spec.rollout.max_unavailable, IntOrString::Int(0));
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
                listen: 15081,
                upstream: 8080,
            }),
        )
        .expect("valid");
        assert_eq!(c.protocol, Protocol::Http2);
        assert_eq!(c.listen.to_string(), "0.0.0.0:15081");
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
        assert_eq!(c.routes[2].name, DEFAULT_ROUTE);
        // The file the sidecar reads back is the file we wrote.
        let (yaml, hash) = render(&c).expect("render");
        assert_eq!(Config::from_yaml(&yaml).expect("sidecar accepts it"), c);
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
                listen: 15081,
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
    fn the_target_apply_sets_rollout_budget_pin_and_remembers_originals() {
        let r = route(BASE);
        let b = budget(&r.spec).expect("valid");
        let (body, notes) = target_apply(
            "web",
            &r.spec.rollout,
            &b,
            &target(Some("RollingUpdate"), None),
        );
        assert!(notes.is_empty());
        assert_eq!(
            body["spec"]["template"]["spec"]["terminationGracePeriodSeconds"],
            50
        );
        assert_eq!(
            body["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"],
            0
        );
        assert_eq!(
            body["spec"]["template"]["metadata"]["annotations"][keys::ROUTE],
            "web"
        );
        let original = body["metadata"]["annotations"][keys::ORIGINAL]
            .as_str()
            .expect("string");
        assert_eq!(
            original,
            r#"{"maxSurge":"25%","maxUnavailable":"25%","terminationGracePeriodSeconds":30}"#
        );
        // Once recorded, the record never changes (it would record our own values).
        let (again, _) = target_apply("web", &r.spec.rollout, &b, &target(None, Some(original)));
        assert_eq!(again, body);
        let (recreate, notes) =
            target_apply("web", &r.spec.rollout, &b, &target(Some("Recreate"), None));
        assert!(recreate["spec"].get("strategy").is_none());
        assert_eq!(notes.len(), 1);
    }

    #[test]
    fn the_restore_patch_puts_originals_back_in_one_write() {
        let t = target(
            Some("RollingUpdate"),
            Some(r#"{"maxSurge":"25%","maxUnavailable":"25%","terminationGracePeriodSeconds":30}"#),
        );
        let patch = restore_patch(&t).expect("recorded");
        assert_eq!(
            patch["spec"]["template"]["spec"]["terminationGracePeriodSeconds"],
            30
        );
        assert_eq!(
            patch["spec"]["template"]["metadata"]["annotations"][keys::ROUTE],
            Value::Null
        );
        assert_eq!(
            patch["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"],
            "25%"
        );
        assert_eq!(
            patch["metadata"]["annotations"][keys::ORIGINAL],
            Value::Null
        );
        assert!(restore_patch(&target(None, None)).is_none());
    }
}
