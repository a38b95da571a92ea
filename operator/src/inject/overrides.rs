//! Per-pod sidecar settings from the pod's own annotations: resources and
//! log level, as Linkerd's `config.linkerd.io/proxy-cpu-request` and
//! Istio's `sidecar.istio.io/proxyCPU` do.
//!
//! A bad value never leaves the pod unprotected and never makes the API
//! server refuse it: the annotation is ignored, the chart's value is used,
//! and the admission response carries a warning that names the annotation
//! and the fix. That includes a request above the limit it would end up
//! with, which the API server would otherwise reject with the whole pod.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::keys;

/// The grammar of quantities and log filters is the API crate's: the
/// operator's flags take the same values.
pub use kubegrace_api::values::{check_log_level, parse_quantity};

/// What the pod's annotations changed, and what they got wrong.
#[derive(Debug, Clone, PartialEq)]
pub struct Overrides {
    pub resources: ResourceRequirements,
    pub log_level: Option<String>,
    /// One line per ignored annotation, for the admission warnings.
    pub warnings: Vec<String>,
}

/// Where each resource annotation goes: (key, requests or limits, resource).
const RESOURCE_KEYS: [(&str, Side, &str); 4] = [
    (keys::SIDECAR_CPU_REQUEST, Side::Request, "cpu"),
    (keys::SIDECAR_MEMORY_REQUEST, Side::Request, "memory"),
    (keys::SIDECAR_CPU_LIMIT, Side::Limit, "cpu"),
    (keys::SIDECAR_MEMORY_LIMIT, Side::Limit, "memory"),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Request,
    Limit,
}

/// The sidecar's resources and log level for a pod with `annotations`,
/// starting from the chart's (`defaults`, `default_log_level`).
pub fn read(
    annotations: Option<&BTreeMap<String, String>>,
    defaults: &ResourceRequirements,
    default_log_level: Option<&str>,
) -> Overrides {
    let empty = BTreeMap::new();
    let annotations = annotations.unwrap_or(&empty);
    let mut warnings = Vec::new();
    let mut requests = defaults.requests.clone().unwrap_or_default();
    let mut limits = defaults.limits.clone().unwrap_or_default();
    // Limits first, so a request is compared with the limit it will have.
    for side in [Side::Limit, Side::Request] {
        for (key, _, resource) in RESOURCE_KEYS.iter().filter(|(_, s, _)| *s == side) {
            let Some(raw) = annotations.get(*key) else {
                continue;
            };
            let value = match parse_quantity(raw) {
                Ok(v) => v,
                Err(why) => {
                    warnings.push(format!(
                        "annotation {key}={raw:?} ignored: {why}; the chart's value is used"
                    ));
                    continue;
                }
            };
            match side {
                Side::Limit => {
                    limits.insert((*resource).to_string(), Quantity(raw.trim().to_string()));
                }
                Side::Request => {
                    let limit = limits
                        .get(*resource)
                        .and_then(|q| parse_quantity(&q.0).ok());
                    if let Some(limit) = limit
                        && value > limit
                    {
                        warnings.push(format!(
                            "annotation {key}={raw:?} ignored: it is above the sidecar's {resource} limit {}; raise the limit too ({})",
                            limits.get(*resource).map_or("", |q| q.0.as_str()),
                            limit_key(resource),
                        ));
                        continue;
                    }
                    requests.insert((*resource).to_string(), Quantity(raw.trim().to_string()));
                }
            }
        }
    }
    // A default request above an annotated limit: the API server would
    // refuse the pod, so the request follows the limit down.
    for (resource, limit) in &limits {
        let over = requests
            .get(resource)
            .and_then(|r| parse_quantity(&r.0).ok())
            .zip(parse_quantity(&limit.0).ok())
            .is_some_and(|(r, l)| r > l);
        if over {
            requests.insert(resource.clone(), limit.clone());
        }
    }
    let log_level = match annotations.get(keys::SIDECAR_LOG_LEVEL) {
        None => default_log_level.map(str::to_string),
        Some(raw) => match check_log_level(raw) {
            Ok(level) => Some(level),
            Err(why) => {
                warnings.push(format!(
                    "annotation {}={raw:?} ignored: {why}",
                    keys::SIDECAR_LOG_LEVEL
                ));
                default_log_level.map(str::to_string)
            }
        },
    };
    Overrides {
        resources: ResourceRequirements {
            requests: (!requests.is_empty()).then_some(requests),
            limits: (!limits.is_empty()).then_some(limits),
            ..defaults.clone()
        },
        log_level,
        warnings,
    }
}

fn limit_key(resource: &str) -> &'static str {
    if resource == "cpu" {
        keys::SIDECAR_CPU_LIMIT
    } else {
        keys::SIDECAR_MEMORY_LIMIT
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubegrace_api::values::MAX_QUANTITY_LEN;

    fn defaults() -> ResourceRequirements {
        crate::webhook::resources("50m", "32Mi", "", "128Mi")
    }

    fn with(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect()
    }

    fn get(r: &Option<BTreeMap<String, Quantity>>, k: &str) -> Option<String> {
        r.as_ref().and_then(|m| m.get(k)).map(|q| q.0.clone())
    }

    #[test]
    fn no_annotations_keep_the_chart_values() {
        let o = read(None, &defaults(), Some("info"));
        assert_eq!(o.resources, defaults());
        assert_eq!(o.log_level.as_deref(), Some("info"));
        assert!(o.warnings.is_empty());
    }

    #[test]
    fn annotations_set_requests_limits_and_log_level() {
        let a = with(&[
            (keys::SIDECAR_CPU_REQUEST, "200m"),
            (keys::SIDECAR_CPU_LIMIT, "1"),
            (keys::SIDECAR_MEMORY_REQUEST, "64Mi"),
            (keys::SIDECAR_MEMORY_LIMIT, "256Mi"),
            (
                keys::SIDECAR_LOG_LEVEL,
                "info,kubegrace_sidecar::drain=debug",
            ),
        ]);
        let o = read(Some(&a), &defaults(), None);
        assert!(o.warnings.is_empty(), "{:?}", o.warnings);
        assert_eq!(get(&o.resources.requests, "cpu").as_deref(), Some("200m"));
        assert_eq!(get(&o.resources.limits, "cpu").as_deref(), Some("1"));
        assert_eq!(
            get(&o.resources.requests, "memory").as_deref(),
            Some("64Mi")
        );
        assert_eq!(get(&o.resources.limits, "memory").as_deref(), Some("256Mi"));
        assert_eq!(
            o.log_level.as_deref(),
            Some("info,kubegrace_sidecar::drain=debug")
        );
    }

    #[test]
    fn a_bad_quantity_is_ignored_with_a_warning_naming_it() {
        for bad in [
            "lots",
            "",
            "1e",
            "1e+",
            "-5Mi",
            "0",
            "0e9",
            "1.2.3Mi",
            "5.",
            ".",
            "5Xi",
            "5Mii",
            &"9".repeat(25),
        ] {
            let a = with(&[(keys::SIDECAR_MEMORY_LIMIT, bad)]);
            let o = read(Some(&a), &defaults(), None);
            assert_eq!(o.resources, defaults(), "{bad:?}");
            assert_eq!(o.warnings.len(), 1, "{bad:?}");
            assert!(
                o.warnings[0].contains(keys::SIDECAR_MEMORY_LIMIT),
                "{}",
                o.warnings[0]
            );
        }
        // At the length bound it is read.
        let at_bound = format!("1.{}", "0".repeat(MAX_QUANTITY_LEN - 2));
        assert!(parse_quantity(&at_bound).is_ok());
        // At the size bound it is read; past it, refused.
        assert!(parse_quantity("9.2e18").is_ok());
        assert!(parse_quantity("1Ei").is_ok());
        assert!(parse_quantity("9.3e18").is_err());
    }

    #[test]
    fn a_request_above_its_limit_is_ignored_not_sent_to_the_api_server() {
        // Above the chart's 128Mi limit: the API server would refuse the pod.
        let a = with(&[(keys::SIDECAR_MEMORY_REQUEST, "512Mi")]);
        let o = read(Some(&a), &defaults(), None);
        assert_eq!(
            get(&o.resources.requests, "memory").as_deref(),
            Some("32Mi")
        );
        assert!(
            o.warnings[0].contains(keys::SIDECAR_MEMORY_LIMIT),
            "{:?}",
            o.warnings
        );
        // At the limit it is fine.
        let a = with(&[(keys::SIDECAR_MEMORY_REQUEST, "128Mi")]);
        let o = read(Some(&a), &defaults(), None);
        assert!(o.warnings.is_empty());
        assert_eq!(
            get(&o.resources.requests, "memory").as_deref(),
            Some("128Mi")
        );
        // Raised together, it is taken.
        let a = with(&[
            (keys::SIDECAR_MEMORY_REQUEST, "512Mi"),
            (keys::SIDECAR_MEMORY_LIMIT, "1Gi"),
        ]);
        let o = read(Some(&a), &defaults(), None);
        assert!(o.warnings.is_empty());
        assert_eq!(
            get(&o.resources.requests, "memory").as_deref(),
            Some("512Mi")
        );
    }

    #[test]
    fn a_limit_below_the_chart_request_takes_the_request_down_with_it() {
        let a = with(&[(keys::SIDECAR_CPU_LIMIT, "20m")]);
        let o = read(Some(&a), &defaults(), None);
        assert_eq!(get(&o.resources.limits, "cpu").as_deref(), Some("20m"));
        assert_eq!(get(&o.resources.requests, "cpu").as_deref(), Some("20m"));
    }

    #[test]
    fn quantities_compare_across_suffixes() {
        let v = |s| parse_quantity(s).expect(s);
        assert!(v("500m") < v("1"));
        assert!(v("1Gi") > v("1G"));
        assert!(v("1024Mi") == v("1Gi"));
        assert!(v("0.5") == v("500m"));
        assert!(v(".5") == v("500m"));
        assert!(v("1e3") == v("1k"));
        assert!(v("1E-3") == v("1m"));
        assert!(v("1E") > v("1P"));
    }

    #[test]
    fn a_bad_log_level_keeps_the_default() {
        for bad in ["loud", "a=b=c", "x;rm", "", &"info,".repeat(60)] {
            let a = with(&[(keys::SIDECAR_LOG_LEVEL, bad)]);
            let o = read(Some(&a), &defaults(), Some("warn"));
            assert_eq!(o.log_level.as_deref(), Some("warn"), "{bad:?}");
            assert_eq!(o.warnings.len(), 1, "{bad:?}");
        }
        let a = with(&[(keys::SIDECAR_LOG_LEVEL, "DEBUG")]);
        assert_eq!(
            read(Some(&a), &defaults(), None).log_level.as_deref(),
            Some("DEBUG")
        );
    }
}
