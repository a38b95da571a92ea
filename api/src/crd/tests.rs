//! The schema says every bound, and says it well: each bound is in its
//! field's description, every duration carries the cap, CEL strings are
//! quoted right, and the duration pattern cannot hold a number CEL's
//! `duration()` would fail on.

use kube::CustomResourceExt;
use kubegrace_sidecar_api::config::HumanDuration;
use serde_json::Value;

use super::bounds::{
    DURATION_DIGITS, DURATION_MAX_LEN, DURATION_PATTERN, MAX_DURATION, MAX_DURATION_TEXT,
};
use super::{GraceRoute, TargetKind, TargetRef};

fn spec_schema() -> Value {
    let crd = serde_json::to_value(GraceRoute::crd()).expect("crd json");
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone()
}

/// Calls `f(path, node, nearest description)` for every schema node under
/// `node` that a user writes (not `status`, not the Kubernetes selector).
fn walk(
    path: &str,
    node: &Value,
    desc: Option<&str>,
    f: &mut dyn FnMut(&str, &Value, Option<&str>),
) {
    let desc = node.get("description").and_then(Value::as_str).or(desc);
    f(path, node, desc);
    if let Some(props) = node.get("properties").and_then(Value::as_object) {
        for (k, v) in props {
            if path.is_empty() && (k == "status" || k == "metadata") || k == "selector" {
                continue;
            }
            walk(&format!("{path}.{k}"), v, desc, f);
        }
    }
    if let Some(items) = node.get("items") {
        walk(&format!("{path}[]"), items, desc, f);
    }
}

fn number(v: &Value) -> String {
    match v.as_f64() {
        Some(n) if n.fract() == 0.0 => format!("{n:.0}"),
        Some(n) => n.to_string(),
        None => v.to_string(),
    }
}

#[test]
fn every_bound_is_written_in_the_fields_description() {
    // The largest failOn value is implied by its pattern (connect-error).
    let exempt = [".spec.routes[].failOn[]"];
    let mut missing = Vec::new();
    let mut seen = 0;
    walk("", &spec_schema(), None, &mut |path, node, desc| {
        for key in ["maximum", "maxLength", "maxItems"] {
            let Some(v) = node.get(key) else { continue };
            // A duration's length is implied by its pattern and its cap,
            // which the description gives (checked below).
            let duration = node.get("pattern").and_then(Value::as_str) == Some(DURATION_PATTERN);
            if duration && key == "maxLength" {
                continue;
            }
            seen += 1;
            let n = number(v);
            if !exempt.contains(&path) && !desc.is_some_and(|d| d.contains(&n)) {
                missing.push(format!("{path}: {key} {n} not in {desc:?}"));
            }
        }
        if node.get("pattern").and_then(Value::as_str) == Some(DURATION_PATTERN)
            && !desc.is_some_and(|d| d.contains(MAX_DURATION_TEXT))
        {
            missing.push(format!(
                "{path}: the {MAX_DURATION_TEXT} cap not in {desc:?}"
            ));
        }
    });
    assert!(seen > 30, "the walk found only {seen} bounds");
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}

#[test]
fn every_duration_carries_the_cap_rule() {
    let mut durations = 0;
    walk("", &spec_schema(), None, &mut |path, node, _| {
        if node.get("pattern").and_then(Value::as_str) != Some(DURATION_PATTERN) {
            return;
        }
        durations += 1;
        let rules = node["x-kubernetes-validations"].to_string();
        assert!(
            rules.contains(&format!("duration('{MAX_DURATION_TEXT}')")),
            "{path}: {rules}"
        );
    });
    // drain (6), two breakers (4 each), routes[].timeout.
    assert_eq!(durations, 15);
}

#[test]
fn cel_strings_are_well_quoted() {
    // A stray apostrophe in a message ends the CEL string early, and the
    // API server refuses the whole CRD.
    let mut rules = 0;
    fn each(v: &Value, f: &mut dyn FnMut(&str)) {
        match v {
            Value::Object(m) => {
                for (k, v) in m {
                    if k == "rule" || k == "messageExpression" {
                        f(v.as_str().unwrap_or_default());
                    }
                    each(v, f);
                }
            }
            Value::Array(a) => a.iter().for_each(|v| each(v, f)),
            _ => {}
        }
    }
    each(&spec_schema(), &mut |cel| {
        rules += 1;
        let quotes = cel.matches('\'').count() - cel.matches("\\'").count();
        assert!(quotes % 2 == 0, "odd quotes in {cel}");
    });
    assert!(rules > 20, "{rules}");
}

#[test]
fn the_duration_pattern_cannot_overflow_cel() {
    assert!(
        DURATION_PATTERN.contains(&format!("{{1,{DURATION_DIGITS}}}")),
        "{DURATION_PATTERN}"
    );
    // The largest value a string the pattern accepts can hold: as many of
    // the largest component as fit, then the largest that fits the rest.
    let largest = format!("{}h", "9".repeat(DURATION_DIGITS));
    let mut text = largest.repeat(DURATION_MAX_LEN / largest.len());
    let rest = DURATION_MAX_LEN - text.len();
    if rest >= 2 {
        text.push_str(&format!("{}h", "9".repeat(rest - 1)));
    }
    assert_eq!(text.len(), DURATION_MAX_LEN);
    let d: HumanDuration = text.parse().expect("the sidecar parses it");
    // Go's time.Duration (what CEL's duration() parses into) is an i64 of
    // nanoseconds.
    assert!(d.get().as_nanos() < i64::MAX as u128, "{text}");
    assert!(d.get() > MAX_DURATION, "and the cap rule refuses it");
}

/// Calls `f(path, node)` for every property of the whole schema (spec and
/// status, the Kubernetes types inside them too).
fn each_property(path: &str, node: &Value, f: &mut dyn FnMut(&str, &Value)) {
    if let Some(props) = node.get("properties").and_then(Value::as_object) {
        for (k, v) in props {
            let p = format!("{path}.{k}");
            f(&p, v);
            each_property(&p, v, f);
        }
    }
    if let Some(items) = node.get("items") {
        each_property(&format!("{path}[]"), items, f);
    }
    if let Some(more) = node.get("additionalProperties").filter(|v| v.is_object()) {
        each_property(&format!("{path}{{}}"), more, f);
    }
}

#[test]
fn every_property_has_a_description() {
    let mut missing = Vec::new();
    let mut seen = 0;
    each_property("", &spec_schema(), &mut |path, node| {
        seen += 1;
        let d = node.get("description").and_then(Value::as_str);
        if d.is_none_or(|d| d.trim().is_empty()) {
            missing.push(path.to_string());
        }
    });
    assert!(seen > 100, "the walk found only {seen} properties");
    assert!(
        missing.is_empty(),
        "{} of {seen} properties have no description:\n{}",
        missing.len(),
        missing.join("\n")
    );
}

#[test]
fn every_default_is_written_in_the_fields_description() {
    let mut missing = Vec::new();
    let mut seen = 0;
    each_property("", &spec_schema(), &mut |path, node| {
        let Some(default) = node.get("default") else {
            return;
        };
        let text = match default {
            Value::String(s) => s.lines().next().unwrap_or_default().to_string(),
            Value::Bool(_) | Value::Number(_) => number(default),
            // An object's default is its fields' defaults, each written there.
            _ => return,
        };
        seen += 1;
        let desc = node.get("description").and_then(Value::as_str);
        let said = desc.is_some_and(|d| {
            let d = d.replace('\n', " ");
            d.contains(&format!("Default: {text}")) || d.contains(&format!("Default: `{text}"))
        });
        if !said {
            missing.push(format!("{path}: default {text:?} not in {desc:?}"));
        }
    });
    assert!(seen > 30, "the walk found only {seen} defaults");
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}

/// Server-side apply and GitOps tools merge keyed lists entry by entry
/// only when the schema says they are maps; the API server accepts such a
/// schema only when each key is required (or defaulted).
#[test]
fn keyed_lists_are_maps_whose_keys_are_required() {
    let s = spec_schema();
    let lists = [
        (&s["properties"]["spec"]["properties"]["ports"], "name"),
        (&s["properties"]["spec"]["properties"]["routes"], "name"),
        (
            &s["properties"]["status"]["properties"]["conditions"],
            "type",
        ),
    ];
    for (list, key) in lists {
        assert_eq!(list["x-kubernetes-list-type"], "map", "{list}");
        assert_eq!(list["x-kubernetes-list-map-keys"], serde_json::json!([key]));
        let item = &list["items"];
        let required = item["required"].as_array().cloned().unwrap_or_default();
        assert!(
            required.contains(&Value::from(key))
                || item["properties"][key].get("default").is_some(),
            "{key} must be required or defaulted: {item}"
        );
    }
}

#[test]
fn target_group_defaults_to_apps_and_must_be_the_kinds_by_rule() {
    let s = spec_schema();
    let target = &s["properties"]["spec"]["properties"]["targetRef"];
    assert_eq!(target["properties"]["group"]["default"], "apps");
    let kinds = target["properties"]["kind"]["enum"].to_string();
    assert!(kinds.contains("Rollout"), "{kinds}");
    let rules = target["x-kubernetes-validations"].to_string();
    assert!(
        rules.contains(
            "self.kind == 'Rollout' ? self.group == 'argoproj.io' : self.group == 'apps'"
        ),
        "{rules}"
    );
    assert!(rules.contains("Deployment and StatefulSet"), "{rules}");
    let required = &target["required"];
    assert!(
        !required.to_string().contains("group"),
        "manifests without group stay valid: {required}"
    );
}

#[test]
fn a_target_whose_group_is_not_its_kinds_is_unsupported() {
    let t = |group: &str, kind| TargetRef {
        group: group.into(),
        kind,
        name: "web".into(),
    };
    assert_eq!(t("apps", TargetKind::Deployment).unsupported_group(), None);
    assert_eq!(
        t("argoproj.io", TargetKind::Rollout).unsupported_group(),
        None
    );
    assert!(t("apps", TargetKind::Rollout).unsupported_group().is_some());
    assert!(
        t("argoproj.io", TargetKind::StatefulSet)
            .unsupported_group()
            .is_some()
    );
}

#[test]
fn printer_columns_answer_the_first_questions() {
    let crd = serde_json::to_value(GraceRoute::crd()).expect("crd json");
    let columns = crd["spec"]["versions"][0]["additionalPrinterColumns"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let names: Vec<&str> = columns.iter().filter_map(|c| c["name"].as_str()).collect();
    for wanted in ["Ready", "Reason", "Target", "Budget", "Age"] {
        assert!(names.contains(&wanted), "{wanted} not in {names:?}");
    }
    assert_eq!(names.first(), Some(&"Ready"), "{names:?}");
    for c in &columns {
        assert!(c.get("description").is_some(), "{c}");
    }
}
