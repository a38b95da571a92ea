//! The time budget: how long a drain may take, and the
//! terminationGracePeriodSeconds that follows from it.

use std::fmt::Write as _;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kubegrace_sidecar_api::config::HumanDuration;

use super::Invalid;
use crate::crd::GraceRouteSpec;
use crate::crd::bounds::MAX_DRAIN;
use crate::reasons;

/// Time after the drain for the app to exit on SIGTERM and the sidecar to
/// follow. With native sidecars the kubelet sends the sidecar SIGTERM only
/// after the app exited, and only 2s remain for it if the app used up the
/// grace period; the margin keeps us clear of that cliff.
pub const MARGIN: Duration = Duration::from_secs(5);

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
/// short, with the numbers, and a drain longer than the CRD allows
/// (`drain.maxDelay` + the effective timeout over [`MAX_DRAIN`]): the
/// injection webhook calls this on routes the validate step never saw, and
/// a sum of user durations must neither overflow nor give pods a grace
/// period of years.
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
    let drain = max_delay.checked_add(effective).filter(|d| *d <= MAX_DRAIN);
    let Some(drain) = drain else {
        let timeout = match &longest_route {
            Some((name, t)) => format!("route {name:?} timeout {}", HumanDuration(*t)),
            None => format!("drain.timeout {}", HumanDuration(drain_timeout)),
        };
        return Err(Invalid::new(
            reasons::INVALID_SPEC,
            format!(
                "drain.maxDelay {} + {timeout} is over {}: with a {} margin that sum becomes the pods' terminationGracePeriodSeconds; shorten them",
                HumanDuration(max_delay),
                HumanDuration(MAX_DRAIN),
                HumanDuration(MARGIN)
            ),
        ));
    };
    // At most MAX_DRAIN + MARGIN: far from overflowing.
    let required_seconds = ceil_secs(drain.saturating_add(MARGIN));
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
                    reasons::BUDGET_DOES_NOT_FIT,
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
                reasons::INVALID_SPEC,
                format!(
                    "rollout.terminationGracePeriodSeconds {other:?} is neither auto nor a number of seconds"
                ),
            ));
        }
    }
    Ok(b)
}

#[cfg(test)]
mod tests {
    use super::super::testing::{BASE, route};
    use super::*;
    use crate::rules::sidecar_config;
    use kubegrace_sidecar_api::config::DrainConfig;

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
}
