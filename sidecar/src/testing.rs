//! What the sidecar's unit tests share.

use std::path::PathBuf;

/// A fresh, empty directory for one test, named after the module (`area`),
/// this process and the test, so parallel runs never share one.
pub(crate) fn temp_dir(area: &str, name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kubegrace-{area}-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// `config.yaml` with `text`, alone in a fresh [`temp_dir`].
pub(crate) fn config_file(area: &str, name: &str, text: &str) -> PathBuf {
    let path = temp_dir(area, name).join("config.yaml");
    std::fs::write(&path, text).expect("write");
    path
}

/// The fuzz tests' proptest settings: `default_cases` cases unless
/// `KUBEGRACE_FUZZ_CASES` sets the count (`make fuzz` runs them long).
pub(crate) fn fuzz_config(default_cases: u32) -> proptest::prelude::ProptestConfig {
    let cases = std::env::var("KUBEGRACE_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default_cases);
    proptest::prelude::ProptestConfig {
        cases,
        // A failure prints its minimal input; no regression files in the tree.
        failure_persistence: None,
        ..proptest::prelude::ProptestConfig::default()
    }
}
