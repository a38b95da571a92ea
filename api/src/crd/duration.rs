//! Durations in the CRD: a pattern-checked, length- and value-capped string
//! in the schema, a typed [`HumanDuration`] in Rust; and the CEL helpers for
//! rules that compare durations.

use std::borrow::Cow;
use std::fmt;

use kubegrace_sidecar_api::config::HumanDuration;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::bounds::{DURATION_MAX_LEN, DURATION_PATTERN, MAX_DURATION_TEXT};

/// `expr` (a CEL string) has the duration syntax, so `duration(expr)`
/// cannot fail.
pub(super) fn well_formed(expr: &str) -> String {
    format!("{expr}.matches('{DURATION_PATTERN}')")
}

/// A CEL rule over duration fields that only runs once every field has the
/// right syntax: otherwise the API server would add a confusing "type
/// conversion error" next to the pattern message that already says what to fix.
pub(super) fn durations_ok(fields: &[&str], rule: &str) -> String {
    let guards: Vec<String> = fields
        .iter()
        .map(|f| format!("!{}", well_formed(&format!("self.{f}"))))
        .collect();
    format!("{} || ({rule})", guards.join(" || "))
}

/// CEL: `expr` (a well-formed duration string) is over the cap every
/// duration has. Relations between durations hold off while a field is
/// over it, so one mistake gets one message (the field's own).
pub(super) fn over_cap(expr: &str) -> String {
    format!("duration({expr}) > duration('{MAX_DURATION_TEXT}')")
}

/// A duration in the CRD: a string in the schema (pattern-checked by the API
/// server), a typed [`HumanDuration`] in Rust.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Duration(pub HumanDuration);

impl From<HumanDuration> for Duration {
    fn from(d: HumanDuration) -> Self {
        Self(d)
    }
}

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

inline_string_schema!(Duration, {
    "type": "string",
    "pattern": DURATION_PATTERN,
    // Bounded so CEL cost estimation stays small.
    "maxLength": DURATION_MAX_LEN,
    // Every duration field has the same cap, so it lives here; the
    // API server names the field in front of the message.
    "x-kubernetes-validations": [{
        "rule": format!("!{} || !({})", well_formed("self"), over_cap("self")),
        "messageExpression": format!(
            "self + ' is longer than the {MAX_DURATION_TEXT} maximum; write at most {MAX_DURATION_TEXT}'"
        ),
    }],
});
