//! The sidecar's `config.yaml` for a route (the route's ConfigMap), and
//! the port plan it is checked against.

use std::fmt::Write as _;
use std::net::SocketAddr;

use k8s_openapi::api::core::v1::PodTemplateSpec;
use kubegrace_sidecar_api::config::{
    CATCH_ALL_ROUTE, CircuitBreakerConfig, Config, DrainConfig, Endpoint, FailureKind,
    FallbackConfig, HumanDuration, Protocol, RetryBudgetConfig, RouteConfig, RouteMatch,
    RouteRetry,
};
use sha2::{Digest, Sha256};

use super::{Budget, Invalid};
use crate::crd::bounds::CONFIG_MAP_LIMIT;
use crate::crd::{CircuitBreakerSpec, DrainSpec, FallbackSpec, GraceRouteSpec, PortProtocol};
use crate::reasons;

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
            reasons::TARGET_INVALID,
            format!("{target} has no pod template spec"),
        ));
    };
    let wanted = spec.port_name();
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
        reasons::UNKNOWN_PORT,
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

/// The route's `drain` as the sidecar's, before the budget has its say
/// (see [`sidecar_config`]).
pub(super) fn drain(d: &DrainSpec) -> DrainConfig {
    DrainConfig {
        min_delay: d.min_delay.0,
        quiet: d.quiet.0,
        max_delay: d.max_delay.0,
        timeout: d.timeout.0,
        readiness: d.readiness.into(),
        http2_go_away: d.http2_go_away.into(),
        grpc_health: d.grpc_health.into(),
        websocket_close: d.websocket_close.into(),
        websocket_close_window: d.websocket_close_window.0,
        websocket_close_wait: d.websocket_close_wait.0,
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
            timeout: HumanDuration(budget.effective_timeout()),
            // The budget may shorten the timeout; the sidecar caps the wait
            // at it anyway, this keeps the rendered file saying what runs.
            websocket_close_wait: HumanDuration(
                spec.drain
                    .websocket_close_wait
                    .0
                    .get()
                    .min(budget.effective_timeout()),
            ),
            ..drain(&spec.drain)
        },
        ..Config::default()
    };
    if let Some(b) = &spec.retry_budget {
        let d = RetryBudgetConfig::default();
        config.retry_budget = RetryBudgetConfig {
            ratio: b.ratio.unwrap_or(d.ratio),
            min_per_second: b.min_per_second.unwrap_or(d.min_per_second),
            max_body_bytes: b.max_body_bytes.unwrap_or(d.max_body_bytes),
        };
    }
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
                        Invalid::new(
                            reasons::INVALID_SPEC,
                            format!("routes[{i}].failOn[{j}]: {e}"),
                        )
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
            retry: r.retry.as_ref().map(|r| RouteRetry {
                idempotent: r.idempotent,
            }),
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
            retry: None,
        });
    }
    // The sidecar's keys are the CRD's (same vocabulary), so its message
    // points at the field to fix.
    config
        .validate()
        .map_err(|e| Invalid::new(reasons::INVALID_SPEC, format!("{}: {}", e.key, e.message)))?;
    Ok(config)
}

/// `config.yaml` and its hash (sha256, first 16 hex digits).
pub fn render(config: &Config) -> Result<(String, String), Invalid> {
    let yaml = serde_norway::to_string(config).map_err(|e| {
        Invalid::new(
            reasons::INVALID_SPEC,
            format!("rendering the sidecar config: {e}"),
        )
    })?;
    let digest = Sha256::digest(yaml.as_bytes());
    let mut hash = String::with_capacity(16);
    for b in digest.iter().take(8) {
        let _ = write!(hash, "{b:02x}");
    }
    Ok((yaml, hash))
}

/// The rendered `config.yaml` fits the route's ConfigMap. Within the CRD's
/// bounds it always does ([`crate::crd::bounds::WORST_RENDERED_CONFIG`]);
/// this catches a route stored under an older CRD, which the API server
/// would otherwise refuse at apply time while the pods keep their old config.
pub fn check_rendered_size(yaml: &str) -> Result<(), Invalid> {
    let size = yaml
        .len()
        .saturating_add(kubegrace_sidecar_api::pod::CONFIG_FILE.len());
    if size > CONFIG_MAP_LIMIT {
        return Err(Invalid::new(
            reasons::INVALID_SPEC,
            format!(
                "the sidecar config this route renders is {size} bytes, over the {CONFIG_MAP_LIMIT} a ConfigMap holds; shorten the fallback bodies, paths and hosts, or split the routes over several GraceRoutes"
            ),
        ));
    }
    Ok(())
}

/// The name of the ConfigMap holding a route's sidecar config.
pub fn config_map_name(route: &str) -> String {
    format!("kubegrace-{route}")
}

#[cfg(test)]
mod tests {
    use super::super::testing::{BASE, config_of, rendered, route, sidecar_reads, template};
    use super::*;
    use crate::crd::{GraceRoute, Readiness};
    use crate::rules::budget;
    use kubegrace_sidecar_api::config::{
        DrainGrpcHealth, DrainReadiness, Http2GoAway, WebSocketClose,
    };

    /// A route with this `drain` does not parse, and the error names the
    /// value that would.
    fn assert_unknown_value_names(drain: &str, valid: &str) {
        let err = serde_norway::from_str::<GraceRoute>(&format!("{BASE}  drain: {drain}\n"))
            .expect_err("unknown value");
        assert!(err.to_string().contains(valid), "{err}");
    }

    #[test]
    fn drain_readiness_is_carried_into_the_sidecar_config() {
        let c = config_of(BASE);
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
        assert_unknown_value_names("{readiness: stay}", "stayServing");
    }

    #[test]
    fn drain_grpc_health_is_carried_into_the_sidecar_config() {
        assert_eq!(
            config_of(BASE).drain.grpc_health,
            DrainGrpcHealth::NotServing,
            "unset: the sidecar default"
        );
        let (yaml, read) = rendered(&format!("{BASE}  drain: {{grpcHealth: app}}\n"));
        assert_eq!(read.drain.grpc_health, DrainGrpcHealth::App, "{yaml}");
        assert_unknown_value_names("{grpcHealth: off}", "notServing");
    }

    #[test]
    fn retry_budget_and_route_retry_are_carried_into_the_sidecar_config() {
        let (yaml, _) = rendered(BASE);
        assert!(!yaml.contains("retryBudget"), "unset: not written\n{yaml}");
        let (yaml, read) = rendered(&format!(
            "{BASE}  retryBudget: {{ratio: 0.5}}\n  routes:\n  - name: reads\n    retry: {{idempotent: true}}\n"
        ));
        assert_eq!(read.retry_budget.ratio, 0.5, "{yaml}");
        assert_eq!(
            read.retry_budget.min_per_second,
            RetryBudgetConfig::default().min_per_second,
            "unset fields keep the sidecar's defaults"
        );
        assert!(read.routes[0].retry.is_some_and(|r| r.idempotent), "{yaml}");
    }

    #[test]
    fn drain_websocket_close_is_carried_into_the_sidecar_config() {
        let c = config_of(BASE);
        assert_eq!(c.drain.websocket_close, WebSocketClose::GoingAway);
        assert_eq!(
            c.drain.websocket_close_window,
            DrainConfig::default().websocket_close_window,
            "unset: the sidecar default"
        );
        let (yaml, read) = rendered(&format!(
            "{BASE}  drain: {{websocketClose: cut, websocketCloseWindow: 3s, websocketCloseWait: 200ms}}\n"
        ));
        let read = read.drain;
        assert_eq!(read.websocket_close, WebSocketClose::Cut, "{yaml}");
        assert_eq!(read.websocket_close_window.get().as_secs(), 3);
        assert_eq!(read.websocket_close_wait.get().as_millis(), 200);
        assert_unknown_value_names("{websocketClose: close}", "goingAway");
    }

    #[test]
    fn drain_http2_go_away_is_carried_into_the_sidecar_config() {
        let c = config_of(BASE);
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
            let c = config_of(&format!("{BASE}  drain: {{http2GoAway: {given}}}\n"));
            assert_eq!(c.drain.http2_go_away, want, "{given}");
            let (yaml, _) = render(&c).expect("render");
            assert_eq!(sidecar_reads(&yaml).drain.http2_go_away, want, "{yaml}");
        }
        assert_unknown_value_names("{http2GoAway: two}", "twoPhase");
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

    #[test]
    fn the_catch_all_is_the_sidecars_one_and_there_is_exactly_one() {
        let (yaml, back) = rendered(&format!(
            "{BASE}  circuitBreaker: {{maxConcurrent: 10}}\n  routes:\n  - {{name: api, match: {{pathPrefix: /api}}}}\n"
        ));
        let catch_alls: Vec<&RouteConfig> = back
            .routes
            .iter()
            .filter(|r| r.matcher == RouteMatch::default())
            .collect();
        assert_eq!(catch_alls.len(), 1, "{yaml}");
        assert_eq!(catch_alls[0].name, CATCH_ALL_ROUTE);
        // A user route of that name is the catch-all's policy: no second one.
        let c = config_of(&format!(
            "{BASE}  circuitBreaker: {{maxConcurrent: 10}}\n  routes:\n  - {{name: default, timeout: 5s}}\n"
        ));
        assert_eq!(c.routes.len(), 1);
    }
}
