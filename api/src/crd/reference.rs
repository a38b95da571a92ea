//! `docs/api.md`'s field reference is generated from the schema, so it
//! names every field with the default and bounds the API server enforces.
//! The test fails when the page differs from the schema; run it with
//! `KUBEGRACE_BLESS=1` to rewrite the generated part:
//!
//! ```sh
//! KUBEGRACE_BLESS=1 cargo test -p kubegrace-operator --lib crd::reference
//! ```

use std::fmt::Write as _;

use kube::CustomResourceExt;
use serde_json::Value;

use super::GraceRoute;

const BEGIN: &str = "<!-- BEGIN GENERATED FIELD REFERENCE: KUBEGRACE_BLESS=1 cargo test -p kubegrace-operator --lib crd::reference -->";
const END: &str = "<!-- END GENERATED FIELD REFERENCE -->";
const PAGE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/api.md");

fn cell(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

fn number(v: &Value) -> String {
    match v.as_f64() {
        Some(n) if n.fract() == 0.0 => format!("{n:.0}"),
        _ => v.to_string(),
    }
}

fn type_of(node: &Value) -> String {
    if node.get("x-kubernetes-int-or-string").is_some() {
        return "integer or string".into();
    }
    match node.get("type").and_then(Value::as_str) {
        Some("array") => {
            let item = node["items"]["type"].as_str().unwrap_or("object");
            format!("[]{item}")
        }
        Some(t) => t.into(),
        None => "any".into(),
    }
}

fn default_of(node: &Value) -> String {
    match node.get("default") {
        None | Some(Value::Object(_)) => String::new(),
        Some(Value::String(s)) => format!("`{}`", s.escape_debug()),
        Some(v) => format!("`{v}`"),
    }
}

fn bounds_of(node: &Value) -> String {
    let mut out = Vec::new();
    let pair = |lo: &str, hi: &str, what: &str| -> Option<String> {
        let (lo, hi) = (node.get(lo), node.get(hi));
        match (lo, hi) {
            (None, None) => None,
            (Some(l), Some(h)) => Some(format!("{what}{}..{}", number(l), number(h))),
            (Some(l), None) => Some(format!("{what}>= {}", number(l))),
            (None, Some(h)) => Some(format!("{what}<= {}", number(h))),
        }
    };
    out.extend(pair("minimum", "maximum", ""));
    out.extend(pair("minLength", "maxLength", "length "));
    out.extend(pair("minItems", "maxItems", "items "));
    if let Some(p) = node.get("pattern").and_then(Value::as_str) {
        out.push(format!("pattern `{p}`"));
    }
    if let Some(e) = node.get("enum").and_then(Value::as_array) {
        let values: Vec<String> = e
            .iter()
            .map(|v| format!("`{}`", v.as_str().unwrap_or_default()))
            .collect();
        out.push(format!("one of {}", values.join(", ")));
    }
    if node["x-kubernetes-list-type"] == "map" {
        let keys: Vec<String> = node["x-kubernetes-list-map-keys"]
            .as_array()
            .map(|k| {
                k.iter()
                    .map(|k| format!("`{}`", k.as_str().unwrap_or_default()))
                    .collect()
            })
            .unwrap_or_default();
        out.push(format!("map keyed by {}", keys.join(", ")));
    }
    out.join("; ")
}

fn rows(path: &str, node: &Value, out: &mut String) {
    let Some(props) = node.get("properties").and_then(Value::as_object) else {
        if let Some(items) = node.get("items") {
            rows(&format!("{path}[]"), items, out);
        }
        return;
    };
    let required_here = node["required"].as_array().cloned().unwrap_or_default();
    for (k, v) in props {
        let p = if path.is_empty() {
            k.clone()
        } else {
            format!("{path}.{k}")
        };
        let req = if required_here.contains(&Value::from(k.as_str())) {
            " (required)"
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "| `{p}`{req} | {} | {} | {} | {} |",
            type_of(v),
            default_of(v),
            cell(&bounds_of(v)),
            cell(v.get("description").and_then(Value::as_str).unwrap_or("")),
        );
        rows(&p, v, out);
    }
}

/// The generated part of `docs/api.md`.
pub(crate) fn field_reference() -> String {
    let crd = serde_json::to_value(GraceRoute::crd()).unwrap_or_default();
    let root = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"];
    let mut out = String::new();
    for part in ["spec", "status"] {
        let _ = writeln!(out, "\n### `{part}`\n");
        let _ = writeln!(
            out,
            "{}\n",
            cell(root[part]["description"].as_str().unwrap_or(""))
        );
        out.push_str("| Field | Type | Default | Bounds | Description |\n");
        out.push_str("| --- | --- | --- | --- | --- |\n");
        rows(part, &root[part], &mut out);
    }
    out
}

#[test]
fn docs_api_md_is_the_schema() {
    let page = std::fs::read_to_string(PAGE).unwrap_or_default();
    let generated = field_reference();
    let (Some(b), Some(e)) = (page.find(BEGIN), page.find(END)) else {
        panic!("{PAGE} has no generated field reference between {BEGIN} and {END}");
    };
    let current = &page[b + BEGIN.len()..e];
    if current == generated {
        return;
    }
    if std::env::var_os("KUBEGRACE_BLESS").is_some() {
        let new = format!(
            "{}{BEGIN}{generated}{END}{}",
            &page[..b],
            &page[e + END.len()..]
        );
        std::fs::write(PAGE, new).expect("writing docs/api.md");
        return;
    }
    panic!(
        "docs/api.md's field reference is not the schema's: rerun with KUBEGRACE_BLESS=1 (cargo test -p kubegrace-operator --lib crd::reference) and commit docs/api.md"
    );
}

#[test]
fn the_reference_names_every_field_of_the_schema() {
    let generated = field_reference();
    let crd = serde_json::to_value(GraceRoute::crd()).unwrap_or_default();
    let root = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
    let mut fields = 0;
    fn each(path: &str, node: &Value, f: &mut dyn FnMut(&str)) {
        if let Some(props) = node.get("properties").and_then(Value::as_object) {
            for (k, v) in props {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                f(&p);
                each(&p, v, f);
            }
        }
        if let Some(items) = node.get("items") {
            each(&format!("{path}[]"), items, f);
        }
    }
    each("", root, &mut |p| {
        if ["apiVersion", "kind", "metadata", "spec", "status"].contains(&p) {
            return;
        }
        fields += 1;
        assert!(
            generated.contains(&format!("| `{p}`")),
            "{p} not in the reference"
        );
    });
    assert!(fields >= 100, "{fields}");
}
