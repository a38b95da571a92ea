//! What a reconcile decided, in words, for the operator's info log (pure).
//!
//! kube-rs controllers log each decision at info, so an operator's log
//! answers "what did it do to my route, and why" without debug logging.
//! The status step already holds every decision (conditions with their
//! reasons, the config hash the pods get, the grace-period budget, the
//! targets), so the log is the difference between the status written last
//! and the one about to be written: one line per change, nothing when a
//! pass changed nothing (the periodic resync stays quiet).

use crate::crd::GraceRouteStatus;

/// One line per decision that differs between `old` and `new`.
pub fn changes(old: Option<&GraceRouteStatus>, new: &GraceRouteStatus) -> Vec<String> {
    let empty = GraceRouteStatus::default();
    let old = old.unwrap_or(&empty);
    let mut out = Vec::new();
    for c in &new.conditions {
        let before = old.conditions.iter().find(|p| p.type_ == c.type_);
        let changed = before.is_none_or(|p| p.status != c.status || p.reason != c.reason);
        if changed {
            let from = before.map_or_else(
                || "unset".to_string(),
                |p| format!("{} ({})", p.status, p.reason),
            );
            out.push(format!(
                "{} {from} -> {} ({}): {}",
                c.type_, c.status, c.reason, c.message
            ));
        }
    }
    if old.config_hash != new.config_hash
        && let Some(hash) = &new.config_hash
    {
        out.push(format!(
            "sidecar config {} -> {hash} in ConfigMap {}: running sidecars reload it at the kubelet's next volume sync",
            old.config_hash.as_deref().unwrap_or("none"),
            new.config_map.as_deref().unwrap_or("?"),
        ));
    }
    if old.budget_seconds != new.budget_seconds
        && let Some(seconds) = new.budget_seconds
    {
        out.push(format!(
            "grace-period budget {} -> {seconds}s ({}): pods created from now on get it",
            old.budget_seconds
                .map_or_else(|| "none".to_string(), |s| format!("{s}s")),
            new.budget.as_deref().unwrap_or("")
        ));
    }
    if old.targets != new.targets {
        out.push(format!(
            "targets [{}] -> [{}]",
            old.targets.join(", "),
            new.targets.join(", ")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

    fn cond(type_: &str, status: &str, reason: &str) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: format!("{reason} because"),
            observed_generation: Some(1),
            last_transition_time: Time(jiff::Timestamp::UNIX_EPOCH),
        }
    }

    fn status(conditions: Vec<Condition>, hash: &str, budget: i64) -> GraceRouteStatus {
        GraceRouteStatus {
            conditions,
            config_hash: Some(hash.into()),
            config_map: Some("kubegrace-web".into()),
            budget_seconds: Some(budget),
            targets: vec!["Deployment/web".into()],
            ..Default::default()
        }
    }

    #[test]
    fn a_first_status_names_every_decision() {
        let new = status(vec![cond("Accepted", "True", "Valid")], "abc", 50);
        let lines = changes(None, &new);
        assert_eq!(lines.len(), 4, "{lines:?}");
        assert!(
            lines[0].starts_with("Accepted unset -> True (Valid)"),
            "{lines:?}"
        );
        assert!(lines[1].contains("none -> abc"), "{lines:?}");
        assert!(lines[2].contains("none -> 50s"), "{lines:?}");
        assert!(lines[3].contains("[] -> [Deployment/web]"), "{lines:?}");
    }

    #[test]
    fn an_unchanged_pass_logs_nothing_and_each_change_logs_once() {
        let old = status(vec![cond("Ready", "True", "PodsInjected")], "abc", 50);
        assert!(changes(Some(&old), &old).is_empty());
        // A new message alone (counts in it) is not a decision.
        let mut reworded = old.clone();
        reworded.conditions[0].message = "3 of 3 pods".into();
        assert!(changes(Some(&old), &reworded).is_empty());
        let mut flipped = old.clone();
        flipped.conditions[0] = cond("Ready", "False", "PodsNotInjected");
        flipped.config_hash = Some("def".into());
        let lines = changes(Some(&old), &flipped);
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(
            lines[0].contains("Ready True (PodsInjected) -> False (PodsNotInjected)"),
            "{lines:?}"
        );
        assert!(lines[1].contains("abc -> def"), "{lines:?}");
    }
}
