//! Every bound on what a GraceRoute may say, in one place. The CRD schema
//! (`maximum`, `maxLength`, `maxItems`, patterns and CEL rules), the
//! validate step (the operator's `rules::check_bounds`, for objects stored under an older,
//! looser CRD) and the tests all read these constants, so the API server,
//! the operator and the tests cannot disagree.
//!
//! Why these numbers:
//! - Durations: at most [`MAX_DURATION`] each, and the time budget
//!   (`drain.maxDelay + max(drain.timeout, longest route timeout) + 5s`)
//!   at most [`MAX_DRAIN`] + 5s, so a pod's terminationGracePeriodSeconds
//!   stays within an hour and no sum of durations can overflow.
//! - Counts: each fits its Rust type with room to spare and is far beyond
//!   what a real deployment sets.
//! - Sizes: the rendered sidecar `config.yaml` (the route's ConfigMap) must
//!   fit the API server's 1 MiB ConfigMap limit in the worst case. The
//!   worst case under these bounds: 64 routes, each with every string at
//!   its longest in the character YAML writes longest (`'` in paths and
//!   hosts, tab in the content type: 2 bytes; U+FFFF in a body: 6 bytes,
//!   `"\uFFFF"`), 16 methods of 32 letters, 16 failOn entries, a breaker
//!   with every number at its maximum, and one body of all 32,768
//!   characters the routes share: 64 x ~3.5 KiB of route + 192 KiB of
//!   body. `rules::fuzz::the_worst_case_route_renders_well_under_1_mib`
//!   builds it: 424,472 bytes, under [`WORST_RENDERED_CONFIG`] (512 KiB,
//!   half the limit), which the property tests hold every route to.

use std::time::Duration;

/// The longest any duration field may be (`drain.*`, `routes[].timeout`,
/// `circuitBreaker.*`).
pub const MAX_DURATION: Duration = Duration::from_secs(3600);
/// [`MAX_DURATION`] as CEL's `duration()` and people write it.
pub const MAX_DURATION_TEXT: &str = "1h";
/// The most `drain.maxDelay + drain.timeout` and `drain.maxDelay +
/// routes[].timeout` may add up to: with the 5s margin this sum is the pods'
/// terminationGracePeriodSeconds.
pub const MAX_DRAIN: Duration = Duration::from_secs(3600);
/// [`MAX_DRAIN`] as written in CEL and messages.
pub const MAX_DRAIN_TEXT: &str = "1h";

/// Digits per number in a duration (`99999ms` is the longest number).
pub const DURATION_DIGITS: usize = 5;
/// Characters in a duration.
pub const DURATION_MAX_LEN: usize = 32;
/// Go-style durations limited to what both CEL `duration()` and the sidecar
/// parse: whole numbers of h, m, s, ms (`300ms`, `15s`, `1m30s`), at most
/// [`DURATION_DIGITS`] digits each. Within [`DURATION_MAX_LEN`] characters
/// that is at most five `99999h` and a `9h`, 500,004h: far inside the
/// 2,562,047h of Go's `time.Duration`, so `duration()` in a CEL rule never
/// fails on a string this pattern accepts (a huge number would turn every
/// rule on the field into an evaluation error instead of a message).
pub const DURATION_PATTERN: &str = "^([0-9]{1,5}(h|m|s|ms))+$";

/// `metadata.name`: it becomes the value of the `kubegrace.io/route` label
/// on the route's ConfigMap, and label values have at most 63 characters.
pub const MAX_ROUTE_OBJECT_NAME: usize = 63;
/// `targetRef.name`: a Deployment, StatefulSet or Rollout name.
pub const MAX_TARGET_NAME: usize = 253;
/// `targetRef.group`: an API group is a DNS subdomain.
pub const MAX_GROUP: usize = 253;
/// `targetRef.group` of a Deployment or StatefulSet (and its default).
pub const SUPPORTED_GROUP: &str = "apps";
/// `targetRef.group` of an Argo Rollouts `Rollout`.
pub const ARGO_GROUP: &str = "argoproj.io";
/// `ports[].name`: an IANA service name.
pub const MAX_PORT_NAME: usize = 15;
/// `ports`: the sidecar has one listener.
pub const MAX_PORTS: usize = 1;

/// A DNS label (RFC 1123): route names and port names, which the sidecar's
/// metrics and the pod's port list carry; the operator's re-check of stored
/// routes is `rules::bounds::is_dns_label` in the operator.
pub const DNS_LABEL_PATTERN: &str = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";
/// `routes`.
pub const MAX_ROUTES: usize = 64;
/// `routes[].name`.
pub const MAX_ROUTE_NAME: usize = 63;
/// `routes[].match.path` and `.pathPrefix`.
pub const MAX_PATH: usize = 1024;
/// Paths are compared with the request target as sent, which is ASCII
/// (RFC 9112 §3.2): printable, no spaces.
pub const PATH_PATTERN: &str = "^/[!-~]*$";
/// `routes[].match.methods`.
pub const MAX_METHODS: usize = 16;
/// One method name.
pub const MAX_METHOD: usize = 32;
/// `routes[].match.host`: a DNS name, `*.` wildcard allowed.
pub const MAX_HOST: usize = 253;
/// Hosts are compared with the `Host` header, which is ASCII (IDNs travel
/// as punycode): printable, no spaces.
pub const HOST_PATTERN: &str = "^[!-~]*$";
/// `routes[].failOn`.
pub const MAX_FAIL_ON: usize = 16;
/// `routes[].fallback.contentType`.
pub const MAX_CONTENT_TYPE: usize = 256;
/// A header value the sidecar can send: printable ASCII and tab.
pub const CONTENT_TYPE_PATTERN: &str = "^[\t -~]*$";
/// `routes[].fallback.body`, in characters.
pub const MAX_FALLBACK_BODY: usize = 32_768;
/// The fallback bodies of all routes together, in characters: they all go
/// into the one ConfigMap.
pub const MAX_FALLBACK_BODIES: usize = 32_768;

/// `circuitBreaker.maxConcurrent` and `.minConcurrent`: the sidecar's own
/// maximum.
pub const MAX_CONCURRENT: u32 = kubegrace_sidecar_api::config::MAX_BREAKER_COUNT;
/// `circuitBreaker.maxQueue`: the sidecar's own maximum.
pub const MAX_QUEUE: u32 = kubegrace_sidecar_api::config::MAX_BREAKER_COUNT;
/// `circuitBreaker.minRequests`.
pub const MAX_MIN_REQUESTS: u32 = 1_000_000;
/// `circuitBreaker.consecutiveFailures`: beyond this the breaker would in
/// effect never open; 0 turns it off.
pub const MAX_CONSECUTIVE_FAILURES: u32 = 100_000;
/// `circuitBreaker.halfOpenProbes`: the sidecar's own maximum.
pub const MAX_HALF_OPEN_PROBES: u32 = kubegrace_sidecar_api::config::MAX_HALF_OPEN_PROBES;
/// `retryBudget.minPerSecond`: the sidecar's own maximum.
pub const MAX_RETRY_MIN_PER_SECOND: u32 = kubegrace_sidecar_api::config::MAX_RETRY_MIN_PER_SECOND;
/// `retryBudget.maxBodyBytes`: the sidecar's own maximum.
pub const MAX_RETRY_BODY_BYTES: u64 = kubegrace_sidecar_api::config::MAX_RETRY_BODY_BYTES;

/// `rollout.minReadySeconds`.
pub const MAX_MIN_READY_SECONDS: i32 = 3600;
/// `rollout.terminationGracePeriodSeconds` when pinned to a number.
pub const MAX_GRACE_SECONDS: i32 = 86_400;
/// `rollout.maxSurge` and `.maxUnavailable` as a number of pods.
pub const MAX_ROLLOUT_PODS: i32 = 100_000;
/// `rollout.maxSurge` and `.maxUnavailable` as a percentage: 0% to 100%,
/// no leading zeros (the Deployment refuses `00%`).
pub const PERCENT_PATTERN: &str = "^(100|[1-9]?[0-9])%$";

/// What the API server stores in one ConfigMap (`data` and `binaryData`).
pub const CONFIG_MAP_LIMIT: usize = 1024 * 1024;
/// At least the rendered `config.yaml` of the largest route these bounds
/// allow (424,472 bytes measured by the fuzz module's worst-case test),
/// and half of [`CONFIG_MAP_LIMIT`].
pub const WORST_RENDERED_CONFIG: usize = 512 * 1024;
