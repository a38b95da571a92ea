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
