//! The `GraceRoute` API (kubegrace.io/v1alpha1).
//!
//! The schema carries everything the API server can check on its own:
//! defaults, bounds, enums, duration syntax (pattern) and the relations
//! between fields (CEL `x-kubernetes-validations`), so a bad route is refused
//! at `kubectl apply` time with a message that says what to fix. What needs
//! other objects (does the port exist on the target? does the budget fit a
//! grace period the user pinned?) is checked by the reconciler and reported
//! as the `Accepted` condition.
//!
//! Every value has a bound ([`bounds`], shared with the operator's own
//! re-check of stored objects and the tests), written in the field's
//! description with what to do, and refused by the API server without a
//! webhook: one GraceRoute can never hand the operator a number it cannot
//! add up, nor render a ConfigMap the API server would refuse.
//!
//! Defaults come from the sidecar's own `Default` impls so the schema, the
//! ConfigMap and a bare sidecar agree.

/// The functions `#[serde(default = "...")]` names, one per field: each
/// returns the field of the sidecar's own default `$config`, so a route that
/// leaves the field out runs what a sidecar without the operator would.
macro_rules! sidecar_defaults {
    ($config:ty { $($name:ident => $field:ident: $ty:ty),+ $(,)? }) => {$(
        fn $name() -> $ty {
            <$ty>::from(<$config>::default().$field)
        }
    )+};
}

/// The schema of a string newtype, written inline where a field uses it
/// (no `$ref`: a CRD's structural schema has no definitions).
macro_rules! inline_string_schema {
    ($ty:ident, $schema:tt) => {
        impl JsonSchema for $ty {
            fn schema_name() -> Cow<'static, str> {
                stringify!($ty).into()
            }
            fn inline_schema() -> bool {
                true
            }
            fn json_schema(_: &mut SchemaGenerator) -> Schema {
                json_schema!($schema)
            }
        }
    };
}

pub mod bounds;
mod breaker;
mod duration;
#[cfg(test)]
mod reference;
mod rollout;
mod status;
mod target;
#[cfg(test)]
mod tests;

use std::borrow::Cow;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{CustomResource, KubeSchema};
use kubegrace_sidecar_api::config::{
    DrainConfig, DrainGrpcHealth, DrainReadiness, Http2GoAway, WebSocketClose,
};
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

pub use bounds::DURATION_PATTERN;
use bounds::{
    DNS_LABEL_PATTERN, HOST_PATTERN, MAX_DRAIN_TEXT, MAX_FAIL_ON, MAX_FALLBACK_BODIES, MAX_HOST,
    MAX_METHOD, MAX_METHODS, MAX_PATH, MAX_PORTS, MAX_RETRY_BODY_BYTES, MAX_RETRY_MIN_PER_SECOND,
    MAX_ROUTE_NAME, MAX_ROUTE_OBJECT_NAME, MAX_ROUTES, PATH_PATTERN,
};
pub use breaker::{CircuitBreakerSpec, FallbackSpec};
pub use duration::Duration;
use duration::{durations_ok, over_cap, well_formed};
pub use rollout::RolloutSpec;
use rollout::r_grace;
pub use status::{GraceRouteStatus, LastDrains};
pub use target::{PortProtocol, PortSpec, TargetKind, TargetRef};

/// CEL: route `r` has a timeout that, with `drain.maxDelay`, is over the
/// drain cap (each within its own cap: those have their own message).
fn route_over_drain_cap(r: &str) -> String {
    format!(
        "has({r}.timeout) && {} && !({}) && duration(self.drain.maxDelay) + duration({r}.timeout) > duration('{MAX_DRAIN_TEXT}')",
        well_formed(&format!("{r}.timeout")),
        over_cap(&format!("{r}.timeout")),
    )
}

/// The longest route timeout takes drain.timeout's place in the budget, so
/// it shares the cap of `drain.maxDelay + drain.timeout`.
fn route_timeouts_rule() -> String {
    format!(
        "!has(self.routes) || !has(self.drain) || !{} || {} || !self.routes.exists(r, {})",
        well_formed("self.drain.maxDelay"),
        over_cap("self.drain.maxDelay"),
        route_over_drain_cap("r"),
    )
}

// Static messages: a messageExpression that names the routes (filter, map,
// join over 64 routes) is over the API server's CEL cost budget.
fn route_timeouts_message() -> String {
    format!(
        "drain.maxDelay + each routes[].timeout must stay within {MAX_DRAIN_TEXT}: the longest route timeout takes the place of drain.timeout in the time budget (maxDelay + timeout + 5s becomes the pods' terminationGracePeriodSeconds); shorten that route's timeout or drain.maxDelay"
    )
}

/// CEL: the characters of all fallback bodies.
fn bodies_size() -> &'static str {
    "self.routes.map(r, has(r.fallback) && has(r.fallback.body) ? size(r.fallback.body) : 0).sum()"
}

fn bodies_rule() -> String {
    format!(
        "!has(self.routes) || {} <= {MAX_FALLBACK_BODIES}",
        bodies_size()
    )
}

fn bodies_message() -> String {
    format!(
        "the fallback bodies of all routes add up to more than {MAX_FALLBACK_BODIES} characters (they all go into one ConfigMap); shorten them"
    )
}

fn name_rule() -> String {
    format!("size(self.metadata.name) <= {MAX_ROUTE_OBJECT_NAME}")
}

fn name_message() -> String {
    format!(
        "metadata.name must be at most {MAX_ROUTE_OBJECT_NAME} characters: it becomes the kubegrace.io/route label value on the route's ConfigMap; choose a shorter name"
    )
}

/// Routes the operator fronts with the sidecar and times.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "kubegrace.io",
    version = "v1alpha1",
    kind = "GraceRoute",
    plural = "graceroutes",
    shortname = "groute",
    category = "kubegrace",
    namespaced,
    status = "GraceRouteStatus",
    derive = "PartialEq",
    doc = "GraceRoute fronts the pods of a workload with the kubegrace sidecar and derives safe rollout timing from its drain settings.",
    // Raw JSON: kube-derive 5 merges structured printcolumn(...) entries
    // that carry a description into their neighbours. The columns answer
    // the first questions in the order people ask them: is it working, why
    // not, on what, with which grace period; `-o wide` adds the message.
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status","description":"the Ready condition"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].reason","description":"why the route is (not) Ready"}"#,
    printcolumn = r#"{"name":"Target","type":"string","jsonPath":".spec.targetRef.name","description":"the targetRef workload (empty for a selector route)"}"#,
    printcolumn = r#"{"name":"Targets","type":"integer","jsonPath":".status.targetCount","description":"workloads this route applies to"}"#,
    printcolumn = r#"{"name":"Injected","type":"string","jsonPath":".status.injected","description":"pods carrying the sidecar / pods that should"}"#,
    printcolumn = r#"{"name":"Budget","type":"string","jsonPath":".status.budget","description":"terminationGracePeriodSeconds in force"}"#,
    printcolumn = r#"{"name":"LastDrains","type":"string","jsonPath":".status.lastDrains.summary","description":"drain outcomes of the pods the last rollout replaced"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp","description":"time since the route was created"}"#,
    printcolumn = r#"{"name":"Message","type":"string","priority":1,"jsonPath":".status.conditions[?(@.type==\"Ready\")].message","description":"the Ready condition's message"}"#,
    validation = Rule::new(name_rule()).message(Message::Message(name_message()))
)]
#[x_kube(validation = Rule::new("has(self.targetRef) != has(self.selector)").message("set exactly one of targetRef (a Deployment, StatefulSet or Argo Rollout) and selector (pod labels)"))]
#[x_kube(validation = Rule::new(route_timeouts_rule()).message(Message::Message(route_timeouts_message())).field_path(".routes"))]
#[x_kube(validation = Rule::new(bodies_rule()).message(Message::Message(bodies_message())).field_path(".routes"))]
#[serde(rename_all = "camelCase")]
pub struct GraceRouteSpec {
    /// The workload whose pods get the sidecar. Set this or `selector`;
    /// no default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_ref: Option<TargetRef>,
    /// Pods (and the Deployments/StatefulSets whose pod template matches)
    /// selected by label. Set this or `targetRef`; no default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
    /// The named pod port the sidecar takes over. The sidecar listens under
    /// this name (so a Service with `targetPort: <name>` reaches it); the app
    /// keeps its port number under a new name. Exactly one port per route in
    /// v1alpha1: the sidecar has one listener (a second port needs a second
    /// route). Required: exactly 1 item (the list is keyed by `name`).
    #[schemars(
        length(min = 1, max = MAX_PORTS),
        extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"])
    )]
    pub ports: Vec<PortSpec>,
    /// The drain timers and modes; every field has its own default.
    #[serde(default)]
    pub drain: DrainSpec,
    /// Breaker for every route without its own, and for all other traffic.
    /// Unset: no concurrency limit, queue or breaker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub circuit_breaker: Option<CircuitBreakerSpec>,
    /// Per-route policy; first match wins (list order), and traffic no
    /// route matches goes on without a timeout or a route's breaker.
    /// Keyed by `name`. Default: none. At most 64 routes (merge routes
    /// that share a policy: a path prefix covers every path below it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = MAX_ROUTES),
        extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"])
    )]
    #[x_kube(validation = Rule::new("self.all(r, self.exists_one(o, o.name == r.name))").message("route names must be unique"))]
    pub routes: Vec<RouteSpec>,
    /// Bounds the retries of requests the app never saw (refused HTTP/2
    /// streams, streams above an app's GOAWAY) and of idempotent requests
    /// on routes with `retry.idempotent`. Unset: the sidecar's defaults
    /// (ratio 0.2, minPerSecond 10, maxBodyBytes 65536).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_budget: Option<RetryBudgetSpec>,
    /// Rollout pacing written into the target. Unset: the operator leaves
    /// the workload's strategy and minReadySeconds alone (GitOps tools and
    /// `helm upgrade` own them), and the grace period the budget needs is
    /// set on each pod by the injecting webhook, never in the Deployment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutSpec>,
}

impl GraceRouteSpec {
    /// The name of the pod port the sidecar takes over (`ports` has one
    /// entry); empty when a stored route has none.
    pub fn port_name(&self) -> &str {
        self.ports
            .first()
            .map(|p| p.name.as_str())
            .unwrap_or_default()
    }

    /// `rollout.terminationGracePeriodSeconds`, `auto` when unset.
    pub fn grace(&self) -> IntOrString {
        self.rollout
            .as_ref()
            .map_or_else(r_grace, |r| r.termination_grace_period_seconds.clone())
    }
}

sidecar_defaults!(DrainConfig {
    d_min_delay => min_delay: Duration,
    d_quiet => quiet: Duration,
    d_max_delay => max_delay: Duration,
    d_timeout => timeout: Duration,
    d_http2_go_away => http2_go_away: Http2GoAwaySpec,
    d_grpc_health => grpc_health: GrpcHealthSpec,
    d_websocket_close => websocket_close: WebSocketCloseSpec,
    d_websocket_close_window => websocket_close_window: Duration,
    d_websocket_close_wait => websocket_close_wait: Duration,
    d_readiness => readiness: Readiness,
});

/// CEL: duration field `a` is not longer than `b` (once both are well
/// formed and within the cap, which have their own messages).
fn not_longer(a: &str, b: &str) -> String {
    durations_ok(
        &[a, b],
        &format!(
            "{} || {} || duration(self.{a}) <= duration(self.{b})",
            over_cap(&format!("self.{a}")),
            over_cap(&format!("self.{b}")),
        ),
    )
}

fn drain_sum_rule() -> String {
    durations_ok(
        &["maxDelay", "timeout"],
        &format!(
            "{} || {} || duration(self.maxDelay) + duration(self.timeout) <= duration('{MAX_DRAIN_TEXT}')",
            over_cap("self.maxDelay"),
            over_cap("self.timeout"),
        ),
    )
}

fn drain_sum_message() -> String {
    format!(
        "'maxDelay ' + self.maxDelay + ' + timeout ' + self.timeout + ' is over {MAX_DRAIN_TEXT}: with a 5s margin that sum becomes terminationGracePeriodSeconds of the pods; shorten maxDelay or timeout'"
    )
}

/// The drain timers, and what readiness does while draining (see the
/// sidecar's drain protocol). Durations are written like `300ms`, `15s` or
/// `1m30s` (whole numbers of at most 5 digits with h, m, s or ms) and are
/// at most 1h.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[x_kube(validation = Rule::new(not_longer("minDelay", "maxDelay")).message(Message::Expression("'minDelay ' + self.minDelay + ' is longer than maxDelay ' + self.maxDelay + '; minDelay must be <= maxDelay'".into())).field_path(".minDelay"))]
#[x_kube(validation = Rule::new(not_longer("quiet", "maxDelay")).message(Message::Expression("'quiet ' + self.quiet + ' is longer than maxDelay ' + self.maxDelay + ', which ends the grace phase anyway; quiet must be <= maxDelay'".into())).field_path(".quiet"))]
#[x_kube(validation = Rule::new(durations_ok(&["timeout"], "duration(self.timeout) > duration('0s')")).message("timeout must be more than 0s, or every in-flight request is cut at once").field_path(".timeout"))]
#[x_kube(validation = Rule::new(drain_sum_rule()).message(Message::Expression(drain_sum_message())).field_path(".timeout"))]
#[serde(rename_all = "camelCase")]
pub struct DrainSpec {
    /// Keep serving at least this long after the drain starts (routers
    /// lag): at most `maxDelay` (so at most 1h). Default: `2s`.
    #[serde(default = "d_min_delay")]
    pub min_delay: Duration,
    /// After minDelay, stop accepting once no new connection came for this
    /// long: at most `maxDelay` (so at most 1h). Default: `1s`.
    #[serde(default = "d_quiet")]
    pub quiet: Duration,
    /// Stop accepting after this long at the latest. `maxDelay + timeout`,
    /// and `maxDelay` + each route's timeout, must stay within 1h: with a
    /// 5s margin that sum is the pods' terminationGracePeriodSeconds.
    /// Default: `15s`.
    #[serde(default = "d_max_delay")]
    pub max_delay: Duration,
    /// Then wait at most this long for in-flight requests: more than 0s,
    /// and `maxDelay + timeout` at most 1h. Default: `30s`.
    #[serde(default = "d_timeout")]
    pub timeout: Duration,
    /// What the sidecar's readiness answers during the grace phase:
    /// `failFast` turns the endpoint not-serving at the drain's start;
    /// `stayServing` keeps it serving (and terminating) until the listener
    /// closes, for L4 load balancers with `externalTrafficPolicy: Local`.
    /// Default: `failFast`.
    #[serde(default = "d_readiness")]
    pub readiness: Readiness,
    /// How a downstream HTTP/2 connection is told to go: `auto` (per
    /// client: `finalOnly` for python's h2, `twoPhase` for the rest),
    /// `twoPhase` or `finalOnly` (docs/http2-drain.md). Default: `auto`.
    #[serde(default = "d_http2_go_away")]
    pub http2_go_away: Http2GoAwaySpec,
    /// Who answers the gRPC health service (`grpc.health.v1.Health`) once
    /// the drain starts: `notServing` (the sidecar answers Check and pushes
    /// down Watch streams NOT_SERVING, so clients that balance on health
    /// checks leave before the GOAWAY) or `app` (health calls always reach
    /// the app). Default: `notServing`.
    #[serde(default = "d_grpc_health")]
    pub grpc_health: GrpcHealthSpec,
    /// How an upgraded WebSocket ends at the drain deadline: `goingAway`
    /// (a Close frame with 1001 to the client and to the app, at frame
    /// boundaries, then the close handshake, then the TCP close) or `cut`
    /// (the TCP connection is closed, as for other upgrades). Default:
    /// `goingAway`.
    #[serde(default = "d_websocket_close")]
    pub websocket_close: WebSocketCloseSpec,
    /// The WebSocket closes are spread over this window, which ends at the
    /// drain deadline (each session picks a random point), so clients do
    /// not all reconnect at once. At most 1h (and capped by `timeout`).
    /// Default: `5s`.
    #[serde(default = "d_websocket_close_window")]
    pub websocket_close_window: Duration,
    /// How long a WebSocket close waits for the peers' Close replies
    /// before the TCP close: at most 1h (and capped by `timeout`).
    /// Default: `1s`.
    #[serde(default = "d_websocket_close_wait")]
    pub websocket_close_wait: Duration,
}

/// The sidecar's `drain.websocketClose`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum WebSocketCloseSpec {
    GoingAway,
    Cut,
}

/// The sidecar's `drain.grpcHealth`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum GrpcHealthSpec {
    NotServing,
    App,
}

/// The sidecar's `drain.http2GoAway`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Http2GoAwaySpec {
    Auto,
    TwoPhase,
    FinalOnly,
}

/// The sidecar's `drain.readiness`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Readiness {
    FailFast,
    StayServing,
}

/// A CRD enum and the sidecar's enum it stands for (the CRD's has the
/// schema), converted variant by variant both ways: the schema's defaults
/// come from the sidecar's, and the operator renders the CRD's into the
/// sidecar's file.
macro_rules! twin_enums {
    ($spec:ident <=> $sidecar:ident { $($variant:ident),+ $(,)? }) => {
        impl From<$spec> for $sidecar {
            fn from(v: $spec) -> Self {
                match v {
                    $($spec::$variant => Self::$variant,)+
                }
            }
        }
        impl From<$sidecar> for $spec {
            fn from(v: $sidecar) -> Self {
                match v {
                    $($sidecar::$variant => Self::$variant,)+
                }
            }
        }
    };
}

twin_enums!(WebSocketCloseSpec <=> WebSocketClose { GoingAway, Cut });
twin_enums!(GrpcHealthSpec <=> DrainGrpcHealth { NotServing, App });
twin_enums!(Http2GoAwaySpec <=> Http2GoAway { Auto, TwoPhase, FinalOnly });
twin_enums!(Readiness <=> DrainReadiness { FailFast, StayServing });

impl Default for DrainSpec {
    fn default() -> Self {
        Self {
            min_delay: d_min_delay(),
            quiet: d_quiet(),
            max_delay: d_max_delay(),
            timeout: d_timeout(),
            readiness: d_readiness(),
            http2_go_away: d_http2_go_away(),
            grpc_health: d_grpc_health(),
            websocket_close: d_websocket_close(),
            websocket_close_window: d_websocket_close_window(),
            websocket_close_wait: d_websocket_close_wait(),
        }
    }
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(validation = Rule::new("!has(self.match) || !has(self.match.path) || !has(self.match.pathPrefix)").message("set match.path (exact) or match.pathPrefix, not both"))]
#[x_kube(validation = Rule::new("!has(self.retry) || !self.retry.idempotent || !has(self.match) || !has(self.match.methods) || size(self.match.methods) == 0 || self.match.methods.exists(m, m in ['GET', 'HEAD', 'OPTIONS', 'TRACE', 'PUT', 'DELETE'])").message("retry.idempotent on a route that matches no idempotent method (GET, HEAD, OPTIONS, TRACE, PUT, DELETE) would never retry anything; remove it or match such a method"))]
#[x_kube(validation = Rule::new(format!("!has(self.timeout) || !{} || duration(self.timeout) > duration('0s')", well_formed("self.timeout"))).message("timeout must be more than 0s; leave it out for no timeout").field_path(".timeout"))]
#[serde(rename_all = "camelCase")]
pub struct RouteSpec {
    /// Unique among the routes: at most 63 lowercase letters, digits and
    /// dashes (it names the route in the sidecar's metrics); the key of the
    /// `routes` list. No default.
    #[schemars(
        length(min = 1, max = MAX_ROUTE_NAME),
        regex(pattern = DNS_LABEL_PATTERN)
    )]
    pub name: String,
    /// Which requests this route takes: every condition set must hold.
    /// Unset: every request (a catch-all route).
    #[serde(default, rename = "match", skip_serializing_if = "Option::is_none")]
    pub matcher: Option<RouteMatchSpec>,
    /// Upstream request timeout: more than 0s and at most 1h. The drain
    /// waits at least this long for in-flight requests, so it also raises
    /// the time budget: `drain.maxDelay` + this must stay within 1h too.
    /// Unset: no timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Duration>,
    /// Overrides the route-wide `circuitBreaker` for this route. Unset: the
    /// route-wide one applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub circuit_breaker: Option<CircuitBreakerSpec>,
    /// The response served while this route's breaker is open or its
    /// queue is full. Unset: a plain 503 with `Retry-After`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<FallbackSpec>,
    /// What counts as a failure: 5xx, a 5xx status such as 503,
    /// connect-error, timeout; at most 16 entries, each at most 13
    /// characters. Unset: 5xx, connect-error and timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_FAIL_ON))]
    pub fail_on: Option<Vec<FailOn>>,
    /// Retries beyond the requests the app never saw (those are always
    /// retried within `retryBudget`). Unset: no other retries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RouteRetrySpec>,
}

/// The sidecar's `retryBudget`: unset fields keep the sidecar's defaults.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RetryBudgetSpec {
    /// Retries allowed per request over the last ten seconds: 0 to 1.
    /// Default: 0.2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub ratio: Option<f64>,
    /// Retries allowed per second whatever the traffic (a floor for quiet
    /// apps): 0 to 10000. Default: 10.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = MAX_RETRY_MIN_PER_SECOND))]
    pub min_per_second: Option<u32>,
    /// Request body bytes kept for a retry; a larger request is not
    /// retried. 0 turns retries off; at most 16777216 (16 MiB: each request
    /// in flight may keep this much memory). Default: 65536.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = MAX_RETRY_BODY_BYTES))]
    pub max_body_bytes: Option<u64>,
}

/// A route's `retry`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct RouteRetrySpec {
    /// Also retry requests that may have reached the app (no answer came)
    /// when their method is idempotent (GET, HEAD, OPTIONS, TRACE, PUT,
    /// DELETE). Only for apps where doing such a request twice is harmless.
    /// Default: false.
    #[serde(default)]
    pub idempotent: bool,
}

/// A failure kind: `5xx`, `connect-error`, `timeout` or a 5xx status code.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct FailOn(pub String);

inline_string_schema!(FailOn, {
    "type": "string",
    "pattern": "^(5xx|connect-error|timeout|5[0-9][0-9])$",
    "maxLength": "connect-error".len(),
});

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RouteMatchSpec {
    /// Whole path segments below this prefix (`/api` takes `/api/users`,
    /// not `/apis`): starts with `/`, printable ASCII without spaces (as
    /// requests send paths: percent-encode the rest), at most 1024
    /// characters. Unset: any path (or `path` decides).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_PATH), regex(pattern = PATH_PATTERN))]
    pub path_prefix: Option<String>,
    /// Exactly this path: starts with `/`, printable ASCII without spaces,
    /// at most 1024 characters. Set this or `pathPrefix`, not both. Unset:
    /// any path (or `pathPrefix` decides).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_PATH), regex(pattern = PATH_PATTERN))]
    pub path: Option<String>,
    /// Methods in capitals (`GET`); at most 16, each at most 32 letters.
    /// Unset: any method.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_METHODS))]
    pub methods: Vec<HttpMethod>,
    /// The `Host` header without port; `*.example.com` matches one or more
    /// labels. Printable ASCII without spaces (IDNs as punycode), at most
    /// 253 characters. Unset: any host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_HOST), regex(pattern = HOST_PATTERN))]
    pub host: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct HttpMethod(pub String);

inline_string_schema!(HttpMethod, {"type": "string", "pattern": "^[A-Z]+$", "maxLength": MAX_METHOD});
