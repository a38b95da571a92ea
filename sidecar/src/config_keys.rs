//! Keys of a config file that this release of the sidecar does not know.
//!
//! During an upgrade the operator of release N renders files that
//! sidecars of release N-1 still read until their pods roll: a route field
//! new in N reaches them as a key they have no field for. Refusing such a
//! file would fail every reload of the old sidecars (and stop a restarted
//! one), so an unknown key is skipped, named in a warning and counted
//! (`kubegrace_config_unknown_keys`), and the rest of the file applies,
//! as the Kubernetes API server's `fieldValidation=Warn` and cargo's
//! "unused manifest key" do. Known keys keep every type and bound check:
//! a wrong value of a known key still refuses the file, and the last good
//! config stays in force.
//!
//! The skipped keys are found while the file is parsed
//! ([`serde_ignored`]), not by comparing key lists by hand, so a field
//! added to the config types is known here at once.

use serde::de::DeserializeOwned;

/// At most this many unknown keys are named (the metric counts them all):
/// a file of thousands of unknown keys must not make a log line of
/// megabytes.
pub const MAX_NAMED: usize = 32;

/// The value parsed from `text`, and the paths of the keys it skipped in
/// YAML spelling (`drain.newKey`, `routes[0].match.newKey`), in file order.
pub fn parse_tolerant<T: DeserializeOwned>(
    text: &str,
) -> Result<(T, Vec<String>), serde_norway::Error> {
    let mut unknown = Vec::new();
    let value = serde_ignored::deserialize(serde_norway::Deserializer::from_str(text), |path| {
        unknown.push(key_path(&path));
    })?;
    Ok((value, unknown))
}

/// `path` in the spelling of the config's error keys
/// ([`crate::config::ConfigError::key`]).
fn key_path(path: &serde_ignored::Path<'_>) -> String {
    use serde_ignored::Path;
    match path {
        Path::Root => String::new(),
        Path::Seq { parent, index } => format!("{}[{index}]", key_path(parent)),
        Path::Map { parent, key } => {
            let parent = key_path(parent);
            if parent.is_empty() {
                key.to_string()
            } else {
                format!("{parent}.{key}")
            }
        }
        Path::Some { parent }
        | Path::NewtypeStruct { parent }
        | Path::NewtypeVariant { parent } => key_path(parent),
    }
}

/// The unknown keys for a log line: at most [`MAX_NAMED`], then how many
/// more.
pub fn named(keys: &[String]) -> String {
    let mut text = keys
        .iter()
        .take(MAX_NAMED)
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(", ");
    if keys.len() > MAX_NAMED {
        text.push_str(&format!(" and {} more", keys.len() - MAX_NAMED));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, HumanDuration};

    fn parse(text: &str) -> (Config, Vec<String>) {
        parse_tolerant::<Config>(text).expect("parses")
    }

    #[test]
    fn unknown_keys_are_named_by_their_path_and_the_rest_applies() {
        let (config, unknown) = parse(
            "drain: {maxDelay: 5s, surgeGuard: on}\nroutes:\n- {name: a, match: {pathPrefix: /a, headerPrefix: x}}\n- {name: b, hedging: {delay: 1s}}\nnewSection: {a: 1}\n",
        );
        assert_eq!(
            unknown,
            [
                "drain.surgeGuard",
                "routes[0].match.headerPrefix",
                "routes[1].hedging",
                "newSection",
            ]
        );
        assert_eq!(config.drain.max_delay, HumanDuration::from_secs(5));
        assert_eq!(config.routes.len(), 2);
        assert_eq!(config.routes[0].matcher.path_prefix.as_deref(), Some("/a"));
        config.validate().expect("valid");
    }

    #[test]
    fn a_file_of_known_keys_has_none() {
        let (_, unknown) = parse(
            "drain: {minDelay: 1s, maxDelay: 5s}\nroutes: [{name: a, circuitBreaker: {maxConcurrent: 2}, fallback: {status: 503}}]\nretryBudget: {ratio: 0.1}\n",
        );
        assert!(unknown.is_empty(), "{unknown:?}");
        let (_, unknown) = parse("");
        assert!(unknown.is_empty(), "{unknown:?}");
    }

    #[test]
    fn known_keys_keep_their_type_and_bound_checks() {
        // A type error in a known key still refuses the file, with the line.
        let err = parse_tolerant::<Config>("newKey: 1\ndrain: {maxDelay: soon}\n")
            .expect_err("a known key of the wrong type");
        assert!(err.to_string().contains("soon"), "{err}");
        assert!(err.location().is_some());
        // A bound of a known key is still checked (after the parse).
        let (config, unknown) = parse("newKey: 1\ndrain: {minDelay: 20s, maxDelay: 5s}\n");
        assert_eq!(unknown, ["newKey"]);
        assert_eq!(config.validate().expect_err("bound").key, "drain.minDelay");
        // A value of a known enum the release does not know is not a key:
        // it is refused, not skipped.
        parse_tolerant::<Config>("drain: {readiness: someday}\n").expect_err("unknown value");
    }

    #[test]
    fn a_log_line_names_at_most_max_named_keys() {
        let keys: Vec<String> = (0..MAX_NAMED + 3).map(|i| format!("k{i}")).collect();
        let text = named(&keys);
        assert!(text.starts_with("k0, k1"), "{text}");
        assert!(text.ends_with("and 3 more"), "{text}");
        assert!(!text.contains(&format!("k{MAX_NAMED}")), "{text}");
        assert_eq!(named(&keys[..2]), "k0, k1");
    }
}
