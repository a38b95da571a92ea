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
//! Defaults come from the sidecar's own `Default` impls so the schema, the
//! ConfigMap and a bare sidecar agree.

use std::borrow::Cow;
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{CustomResource, KubeSchema};
use kubegrace_sidecar_api::config::{
    CircuitBreakerConfig, DrainConfig, DrainGrpcHealth, DrainReadiness, FallbackConfig,
    Http2GoAway, HumanDuration, WebSocketClose,
};
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Go-style durations limited to what both CEL `duration()` and the sidecar
/// parse: whole numbers of h, m, s, ms (`300ms`, `15s`, `1m30s`).
pub const DURATION_PATTERN: &str = "^([0-9]+(h|m|s|ms))+$";

/// A CEL rule over duration fields that only runs once every field has the
/// right syntax: otherwise the API server would add a confusing "type
/// conversion error" next to the pattern message that already says what to fix.
fn durations_ok(fields: &[&str], rule: &str) -> String {
    let guards: Vec<String> = fields
        .iter()
        .map(|f| format!("!self.{f}.matches('{DURATION_PATTERN}')"))
        .collect();
    format!("{} || ({rule})", guards.join(" || "))
}

/// A duration in the CRD: a string in the schema (pattern-checked by the API
/// server), a typed [`HumanDuration`] in Rust.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Duration(pub HumanDuration);

impl Duration {
    pub const fn from_secs(s: u64) -> Self {
        Self(HumanDuration::from_secs(s))
    }
    pub fn get(self) -> std::time::Duration {
        self.0.get()
    }
}

impl fmt::Display for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl Serialize for Duration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<'de> Deserialize<'de> for Duration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        HumanDuration::deserialize(d).map(Self)
    }
}

impl JsonSchema for Duration {
    fn schema_name() -> Cow<'static, str> {
        "Duration".into()
    }
    fn inline_schema() -> bool {
        true
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "pattern": DURATION_PATTERN,
            // Bounded so CEL cost estimation stays small.
            "maxLength": 32,
        })
    }
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
    // that carry a description into their neighbours.
    printcolumn = r#"{"name":"Targets","type":"integer","jsonPath":".status.targetCount","description":"workloads this route applies to"}"#,
    printcolumn = r#"{"name":"Injected","type":"string","jsonPath":".status.injected","description":"pods carrying the sidecar / pods that should"}"#,
    printcolumn = r#"{"name":"Budget","type":"string","jsonPath":".status.budget","description":"terminationGracePeriodSeconds in force"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"LastDrains","type":"string","jsonPath":".status.lastDrains.summary","description":"drain outcomes of the pods the last rollout replaced"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[x_kube(validation = Rule::new("has(self.targetRef) != has(self.selector)").message("set exactly one of targetRef (a Deployment or StatefulSet) and selector (pod labels)"))]
#[serde(rename_all = "camelCase")]
pub struct GraceRouteSpec {
    /// The workload whose pods get the sidecar. Set this or `selector`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_ref: Option<TargetRef>,
    /// Pods (and the Deployments/StatefulSets whose pod template matches)
    /// selected by label. Set this or `targetRef`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
    /// The named pod port the sidecar takes over. The sidecar listens under
    /// this name (so a Service with `targetPort: <name>` reaches it); the app
    /// keeps its port number under a new name. One port per route in v1alpha1:
    /// the sidecar has one listener.
    #[schemars(length(min = 1, max = 1))]
    pub ports: Vec<PortSpec>,
    #[serde(default)]
    pub drain: DrainSpec,
    /// Breaker for every route without its own, and for all other traffic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub circuit_breaker: Option<CircuitBreakerSpec>,
    /// Per-route policy; first match wins.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
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
    /// `rollout.terminationGracePeriodSeconds`, `auto` when unset.
    pub fn grace(&self) -> IntOrString {
        self.rollout
            .as_ref()
            .map_or_else(r_grace, |r| r.termination_grace_period_seconds.clone())
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TargetRef {
    pub kind: TargetKind,
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum TargetKind {
    Deployment,
    StatefulSet,
}

impl fmt::Display for TargetKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Deployment => "Deployment",
            Self::StatefulSet => "StatefulSet",
        })
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PortSpec {
    /// Name of a container port of the target's pods (IANA service name).
    #[schemars(
        length(min = 1, max = 15),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub name: String,
    #[serde(default)]
    pub protocol: PortProtocol,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum PortProtocol {
    /// HTTP/1.1; HTTP/2 prior knowledge (h2c) is detected too.
    #[default]
    Http,
    Http2,
    Grpc,
    Tcp,
}

fn d_min_delay() -> Duration {
    Duration(DrainConfig::default().min_delay)
}
fn d_quiet() -> Duration {
    Duration(DrainConfig::default().quiet)
}
fn d_max_delay() -> Duration {
    Duration(DrainConfig::default().max_delay)
}
fn d_timeout() -> Duration {
    Duration(DrainConfig::default().timeout)
}
fn d_http2_go_away() -> Http2GoAwaySpec {
    match DrainConfig::default().http2_go_away {
        Http2GoAway::Auto => Http2GoAwaySpec::Auto,
        Http2GoAway::TwoPhase => Http2GoAwaySpec::TwoPhase,
        Http2GoAway::FinalOnly => Http2GoAwaySpec::FinalOnly,
    }
}
fn d_grpc_health() -> GrpcHealthSpec {
    match DrainConfig::default().grpc_health {
        DrainGrpcHealth::NotServing => GrpcHealthSpec::NotServing,
        DrainGrpcHealth::App => GrpcHealthSpec::App,
    }
}
fn d_websocket_close() -> WebSocketCloseSpec {
    match DrainConfig::default().websocket_close {
        WebSocketClose::GoingAway => WebSocketCloseSpec::GoingAway,
        WebSocketClose::Cut => WebSocketCloseSpec::Cut,
    }
}
fn d_websocket_close_window() -> Duration {
    Duration(DrainConfig::default().websocket_close_window)
}
fn d_websocket_close_wait() -> Duration {
    Duration(DrainConfig::default().websocket_close_wait)
}
fn d_readiness() -> Readiness {
    match DrainConfig::default().readiness {
        DrainReadiness::FailFast => Readiness::FailFast,
        DrainReadiness::StayServing => Readiness::StayServing,
    }
}

/// The drain timers, and what readiness does while draining (see the
/// sidecar's drain protocol).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[x_kube(validation = Rule::new(durations_ok(&["minDelay", "maxDelay"], "duration(self.minDelay) <= duration(self.maxDelay)")).message(Message::Expression("'minDelay ' + self.minDelay + ' is longer than maxDelay ' + self.maxDelay + '; minDelay must be <= maxDelay'".into())).field_path(".minDelay"))]
#[x_kube(validation = Rule::new(durations_ok(&["timeout"], "duration(self.timeout) > duration('0s')")).message("timeout must be more than 0s, or every in-flight request is cut at once").field_path(".timeout"))]
#[x_kube(validation = Rule::new(durations_ok(&["maxDelay", "timeout"], "duration(self.maxDelay) + duration(self.timeout) <= duration('1h')")).message("maxDelay + timeout must stay within 1h: that sum becomes the pods' terminationGracePeriodSeconds"))]
#[serde(rename_all = "camelCase")]
pub struct DrainSpec {
    /// Keep serving at least this long after the drain starts (routers lag).
    #[serde(default = "d_min_delay")]
    pub min_delay: Duration,
    /// After minDelay, stop accepting once no new connection came for this long.
    #[serde(default = "d_quiet")]
    pub quiet: Duration,
    /// Stop accepting after this long at the latest.
    #[serde(default = "d_max_delay")]
    pub max_delay: Duration,
    /// Then wait at most this long for in-flight requests.
    #[serde(default = "d_timeout")]
    pub timeout: Duration,
    /// What the sidecar's readiness answers during the grace phase:
    /// `failFast` turns the endpoint not-serving at the drain's start;
    /// `stayServing` keeps it serving (and terminating) until the listener
    /// closes, for L4 load balancers with `externalTrafficPolicy: Local`.
    #[serde(default = "d_readiness")]
    pub readiness: Readiness,
    /// How a downstream HTTP/2 connection is told to go: `auto` (per
    /// client: `finalOnly` for python's h2, `twoPhase` for the rest),
    /// `twoPhase` or `finalOnly` (docs/http2-drain.md).
    #[serde(default = "d_http2_go_away")]
    pub http2_go_away: Http2GoAwaySpec,
    /// Who answers the gRPC health service (`grpc.health.v1.Health`) once
    /// the drain starts: `notServing` (the sidecar answers Check and pushes
    /// down Watch streams NOT_SERVING, so clients that balance on health
    /// checks leave before the GOAWAY) or `app` (health calls always reach
    /// the app).
    #[serde(default = "d_grpc_health")]
    pub grpc_health: GrpcHealthSpec,
    /// How an upgraded WebSocket ends at the drain deadline: `goingAway`
    /// (a Close frame with 1001 to the client and to the app, at frame
    /// boundaries, then the close handshake, then the TCP close) or `cut`
    /// (the TCP connection is closed, as for other upgrades).
    #[serde(default = "d_websocket_close")]
    pub websocket_close: WebSocketCloseSpec,
    /// The WebSocket closes are spread over this window, which ends at the
    /// drain deadline (each session picks a random point), so clients do
    /// not all reconnect at once.
    #[serde(default = "d_websocket_close_window")]
    pub websocket_close_window: Duration,
    /// How long a WebSocket close waits for the peers' Close replies
    /// before the TCP close (capped by `timeout`).
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
#[serde(rename_all = "camelCase")]
pub struct RouteSpec {
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub name: String,
    #[serde(default, rename = "match", skip_serializing_if = "Option::is_none")]
    pub matcher: Option<RouteMatchSpec>,
    /// Upstream request timeout. The drain waits at least this long for
    /// in-flight requests, so it also raises the time budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Duration>,
    /// Overrides the route-wide `circuitBreaker`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub circuit_breaker: Option<CircuitBreakerSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<FallbackSpec>,
    /// What counts as a failure: 5xx, a 5xx status such as 503, connect-error, timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    pub fail_on: Option<Vec<FailOn>>,
    /// Retries beyond the requests the app never saw (those are always
    /// retried within `retryBudget`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RouteRetrySpec>,
}

/// The sidecar's `retryBudget`: unset fields keep the sidecar's defaults.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RetryBudgetSpec {
    /// Retries allowed per request over the last ten seconds (0 to 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub ratio: Option<f64>,
    /// Retries allowed per second whatever the traffic (a floor for quiet apps).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 10000))]
    pub min_per_second: Option<u32>,
    /// Request body bytes kept for a retry; a larger request is not
    /// retried. 0 turns retries off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 16777216))]
    pub max_body_bytes: Option<u64>,
}

/// A route's `retry`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct RouteRetrySpec {
    /// Also retry requests that may have reached the app (no answer came)
    /// when their method is idempotent (GET, HEAD, OPTIONS, TRACE, PUT,
    /// DELETE). Only for apps where doing such a request twice is harmless.
    #[serde(default)]
    pub idempotent: bool,
}

/// A failure kind: `5xx`, `connect-error`, `timeout` or a 5xx status code.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct FailOn(pub String);

impl JsonSchema for FailOn {
    fn schema_name() -> Cow<'static, str> {
        "FailOn".into()
    }
    fn inline_schema() -> bool {
        true
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "pattern": "^(5xx|connect-error|timeout|5[0-9][0-9])$",
        })
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RouteMatchSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024), regex(pattern = "^/"))]
    pub path_prefix: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024), regex(pattern = "^/"))]
    pub path: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub methods: Vec<HttpMethod>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub host: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct HttpMethod(pub String);

impl JsonSchema for HttpMethod {
    fn schema_name() -> Cow<'static, str> {
        "HttpMethod".into()
    }
    fn inline_schema() -> bool {
        true
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({"type": "string", "pattern": "^[A-Z]+$", "maxLength": 32})
    }
}

fn cb_default() -> CircuitBreakerConfig {
    CircuitBreakerConfig::default()
}
fn cb_max_concurrent() -> u32 {
    cb_default().max_concurrent
}
fn cb_max_queue() -> u32 {
    cb_default().max_queue
}
fn cb_queue_timeout() -> Duration {
    Duration(cb_default().queue_timeout)
}
fn cb_error_ratio() -> f64 {
    cb_default().error_ratio
}
fn cb_min_requests() -> u32 {
    cb_default().min_requests
}
fn cb_window() -> Duration {
    Duration(cb_default().window)
}
fn cb_consecutive_failures() -> u32 {
    cb_default().consecutive_failures
}
fn cb_open_for() -> Duration {
    Duration(cb_default().open_for)
}
fn cb_max_open_for() -> Duration {
    Duration(cb_default().max_open_for)
}
fn cb_half_open_probes() -> u32 {
    cb_default().half_open_probes
}
fn cb_min_concurrent() -> u32 {
    cb_default().min_concurrent
}

/// Concurrency limit, queue and breaker (the sidecar's `circuitBreaker`).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(validation = Rule::new(durations_ok(&["openFor", "maxOpenFor"], "duration(self.maxOpenFor) >= duration(self.openFor)")).message("maxOpenFor must be >= openFor").field_path(".maxOpenFor"))]
#[x_kube(validation = Rule::new("!self.adaptive || self.minConcurrent <= self.maxConcurrent").message("minConcurrent must be <= maxConcurrent when adaptive is on").field_path(".minConcurrent"))]
#[x_kube(validation = Rule::new(durations_ok(&["openFor"], "duration(self.openFor) > duration('0s')")).message("openFor must be more than 0s").field_path(".openFor"))]
#[serde(rename_all = "camelCase")]
pub struct CircuitBreakerSpec {
    #[serde(default = "cb_max_concurrent")]
    #[schemars(range(min = 1, max = 1_000_000))]
    pub max_concurrent: u32,
    #[serde(default = "cb_max_queue")]
    #[schemars(range(max = 1_000_000))]
    pub max_queue: u32,
    #[serde(default = "cb_queue_timeout")]
    pub queue_timeout: Duration,
    /// Open when failures/requests reach this over `window`; 0 disables.
    #[serde(default = "cb_error_ratio")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub error_ratio: f64,
    #[serde(default = "cb_min_requests")]
    pub min_requests: u32,
    #[serde(default = "cb_window")]
    pub window: Duration,
    /// Open on this many failures in a row; 0 disables.
    #[serde(default = "cb_consecutive_failures")]
    pub consecutive_failures: u32,
    #[serde(default = "cb_open_for")]
    pub open_for: Duration,
    #[serde(default = "cb_max_open_for")]
    pub max_open_for: Duration,
    #[serde(default = "cb_half_open_probes")]
    #[schemars(range(min = 1, max = 1000))]
    pub half_open_probes: u32,
    #[serde(default)]
    pub adaptive: bool,
    #[serde(default = "cb_min_concurrent")]
    #[schemars(range(min = 1))]
    pub min_concurrent: u32,
}

fn fb_status() -> u16 {
    FallbackConfig::default().status
}
fn fb_content_type() -> String {
    FallbackConfig::default().content_type
}
fn fb_body() -> String {
    FallbackConfig::default().body
}

/// The response served while the breaker is open or the queue overflows.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FallbackSpec {
    #[serde(default = "fb_status")]
    #[schemars(range(min = 200, max = 599))]
    pub status: u16,
    #[serde(default = "fb_content_type")]
    #[schemars(length(max = 256))]
    pub content_type: String,
    #[serde(default = "fb_body")]
    #[schemars(length(max = 65536))]
    pub body: String,
}

fn r_grace() -> IntOrString {
    IntOrString::String("auto".into())
}

// Int-or-string values cannot carry typed anyOf branches in a structural
// schema (and `minimum`/`pattern` would each pass the other type), so the
// rules are CEL.
fn int_or_percent(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "x-kubernetes-int-or-string": true,
        "x-kubernetes-validations": [{
            "rule": "type(self) == string ? self.matches('^[0-9]+%$') : self >= 0",
            "message": "must be a number >= 0 or a percentage like 25%",
        }],
    })
}

fn grace_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "x-kubernetes-int-or-string": true,
        "x-kubernetes-validations": [{
            "rule": "type(self) == string ? self == 'auto' : (self >= 1 && self <= 86400)",
            "message": "must be auto or a number of seconds from 1 to 86400",
        }],
    })
}

/// Rollout pacing written into the target (Deployment `spec.strategy`,
/// `spec.minReadySeconds`) only for the fields set here: a field left out
/// stays whatever the workload's own manifest says. The grace period is
/// never written into the pod template; the webhook raises it on each pod.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(validation = Rule::new("!has(self.maxSurge) || !has(self.maxUnavailable) || !(self.maxSurge == 0 || self.maxSurge == '0%') || !(self.maxUnavailable == 0 || self.maxUnavailable == '0%')").message("maxSurge and maxUnavailable cannot both be 0: the rollout could never progress"))]
#[serde(rename_all = "camelCase")]
pub struct RolloutSpec {
    /// Deployments only (StatefulSets have no surge). Unset: not written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "int_or_percent")]
    pub max_surge: Option<IntOrString>,
    /// Deployments only. Unset: not written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "int_or_percent")]
    pub max_unavailable: Option<IntOrString>,
    /// Unset: not written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 3600))]
    pub min_ready_seconds: Option<i32>,
    /// `auto` (derived from drain and route timeouts) or a number of seconds,
    /// which must be at least the derived budget. Set on each injected pod
    /// by the webhook (raised to it, never lowered), not in the workload.
    #[serde(default = "r_grace")]
    #[schemars(schema_with = "grace_schema")]
    pub termination_grace_period_seconds: IntOrString,
}

impl Default for RolloutSpec {
    fn default() -> Self {
        Self {
            max_surge: None,
            max_unavailable: None,
            min_ready_seconds: None,
            termination_grace_period_seconds: r_grace(),
        }
    }
}

/// What the operator found and did.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GraceRouteStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Workloads this route applies to, as `Kind/name`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub targets: Vec<String>,
    #[serde(default)]
    pub target_count: i32,
    /// Pods carrying the sidecar.
    #[serde(default)]
    pub pods_injected: i32,
    /// Pods that should carry the sidecar (their workload opted in).
    #[serde(default)]
    pub pods_expected: i32,
    /// `injected/expected`, for the printer column.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub injected: Option<String>,
    /// terminationGracePeriodSeconds in force.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_seconds: Option<i64>,
    /// The budget in seconds with unit, for the printer column.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<String>,
    /// The sidecar ConfigMap and the sha256 of its `config.yaml`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_hash: Option<String>,
    /// The drain reports of the pods the last rollout (or scale-down)
    /// replaced, read from their sidecars' termination messages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_drains: Option<LastDrains>,
}

/// Totals of the drain reports of one rollout: the pods of one pod-template
/// revision that went away. A report from a pod of another revision starts
/// the next totals.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LastDrains {
    /// The pod-template hash (`pod-template-hash` or
    /// `controller-revision-hash`) of the drained pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// Pods whose drain report was counted.
    pub pods: i32,
    /// ... of which nothing was closed by force.
    pub clean: i32,
    /// ... of which a connection was still open at drain.timeout and closed.
    pub force_closed: i32,
    /// Requests cut by those force-closes.
    pub requests_cut: i64,
    /// When the latest report was counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<Time>,
    /// `3/3 clean` or `1/3 force-closed`, for the printer column.
    pub summary: String,
    /// UIDs of the counted pods, so a pod is counted once even across
    /// operator restarts (bounded; the oldest are dropped first).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pod_uids: Vec<String>,
}

impl GraceRoute {
    /// The condition of this type, if the status has one.
    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == type_))
    }
}
