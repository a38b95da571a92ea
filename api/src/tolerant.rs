//! GraceRoutes read one object at a time, so one the operator cannot decode
//! affects that route alone.
//!
//! A typed LIST or watch of GraceRoutes fails as a whole on the first item
//! whose JSON does not fit the Rust type: a value the API server stored
//! under an older, looser schema (before a CRD upgrade added a bound), or a
//! field the API server does not check (`format: uint32`). Every reader of
//! GraceRoutes (the route controller, the workload controller, both
//! webhooks, the kubectl plugin) lists or watches them as [`DynamicObject`]s
//! with [`api_resource`] and decodes each with [`decode`]: the good ones go
//! on, an undecodable one is reported by name with the field that failed
//! ([`Undecodable`]); the route controller writes it into the route's
//! status (the operator's `tolerant::invalid_status`) with a patch that
//! needs no typed object.

use kube::ResourceExt;
use kube::core::{ApiResource, DynamicObject};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::crd::GraceRoute;

/// Longest decode error kept: serde quotes the offending value, which a
/// client controls (a string field can hold a megabyte).
pub const MAX_ERROR_LEN: usize = 512;

/// The GraceRoute kind, for dynamic APIs, watches and object references.
pub fn api_resource() -> ApiResource {
    ApiResource::erase::<GraceRoute>(&())
}

/// A stored GraceRoute that does not decode, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Undecodable {
    pub namespace: String,
    pub name: String,
    /// The serde error, with the path of the field (`spec.circuitBreaker.
    /// consecutiveFailures: invalid value: ...`), at most [`MAX_ERROR_LEN`].
    pub error: String,
}

impl Undecodable {
    /// The condition message: what is wrong and what to do.
    pub fn message(&self) -> String {
        format!(
            "the operator cannot read this GraceRoute: {}. It is not reconciled until that field is fixed \
             (kubectl edit graceroute {} -n {}); objects stored before a CRD upgrade can hold values the new schema refuses",
            self.error, self.name, self.namespace
        )
    }
}

impl std::fmt::Display for Undecodable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "GraceRoute {}/{}: {}",
            self.namespace, self.name, self.error
        )
    }
}

/// Cuts `s` to at most `max` bytes on a character boundary.
pub fn bounded(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push_str("...");
    }
    s
}

/// Decodes a dynamic object into `K`; the error names the field that
/// failed. Consumes the object, so no copy of its data is made.
pub fn into_typed<K: DeserializeOwned>(obj: DynamicObject) -> std::result::Result<K, String> {
    let DynamicObject {
        types,
        metadata,
        data,
    } = obj;
    let mut value = match data {
        Value::Object(map) => Value::Object(map),
        // A Kubernetes object is a JSON object; anything else has no fields
        // to read.
        _ => json!({}),
    };
    if let Some(t) = types {
        value["apiVersion"] = Value::String(t.api_version);
        value["kind"] = Value::String(t.kind);
    }
    value["metadata"] = serde_json::to_value(metadata).map_err(|e| e.to_string())?;
    serde_path_to_error::deserialize(value).map_err(|e| bounded(e.to_string(), MAX_ERROR_LEN))
}

/// Decodes one stored route.
pub fn decode(obj: &DynamicObject) -> std::result::Result<GraceRoute, Undecodable> {
    into_typed(obj.clone()).map_err(|error| Undecodable {
        namespace: obj.namespace().unwrap_or_default(),
        name: obj.name_any(),
        error,
    })
}

/// The routes of a namespace: those that decode, and those that do not.
#[derive(Debug, Default)]
pub struct Listed {
    pub routes: Vec<GraceRoute>,
    pub undecodable: Vec<Undecodable>,
}

/// Splits dynamic objects into decoded routes and undecodable ones.
pub fn split(objects: impl IntoIterator<Item = DynamicObject>) -> Listed {
    let mut out = Listed::default();
    for obj in objects {
        match decode(&obj) {
            Ok(r) => out.routes.push(r),
            Err(u) => out.undecodable.push(u),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{
        decodable_route as good, route_object as object, undecodable_route as bad,
    };

    #[test]
    fn one_undecodable_route_is_left_out_by_name_and_the_others_decode() {
        let listed = split([good("a"), bad("b"), good("c")]);
        let names: Vec<String> = listed.routes.iter().map(ResourceExt::name_any).collect();
        assert_eq!(names, ["a", "c"]);
        assert_eq!(listed.undecodable.len(), 1);
        let u = &listed.undecodable[0];
        assert_eq!((u.namespace.as_str(), u.name.as_str()), ("shop", "b"));
        assert!(
            u.error
                .starts_with("spec.circuitBreaker.consecutiveFailures: "),
            "{}",
            u.error
        );
    }

    /// The error quotes the value, which the client chose: it is bounded.
    #[test]
    fn the_error_is_bounded_at_the_limit() {
        let long = "é".repeat(MAX_ERROR_LEN);
        let obj = object("x", json!({"targetRef": long, "ports": []}));
        let err = decode(&obj).expect_err("undecodable").error;
        assert!(err.len() <= MAX_ERROR_LEN + 3, "{}", err.len());
        assert!(err.ends_with("..."));
        let short = decode(&bad("b")).expect_err("undecodable").error;
        assert!(short.len() < MAX_ERROR_LEN && !short.ends_with("..."));
        assert_eq!(bounded("abc".into(), 3), "abc");
        assert_eq!(bounded("abcd".into(), 3), "abc...");
    }
}
