//! The final drain report as the container's termination message: the
//! kubelet copies the file into the pod's status when the container exits,
//! so the outcome outlives the process and its logs (the operator counts it
//! per route). Outside Kubernetes nothing reads it; the default path is
//! written only where the kubelet has put the file.

use std::path::{Path, PathBuf};

use kubegrace_sidecar_api::report::{DEFAULT_PATH, MAX_BYTES};

use crate::drain::DrainReport;

/// The file to write: the one asked for, else the kubelet's default when it
/// exists (a file the kubelet mounted; never created in a machine's /dev).
pub fn target(asked: Option<&Path>) -> Option<PathBuf> {
    match asked {
        Some(path) if path.as_os_str().is_empty() => None,
        Some(path) => Some(path.to_path_buf()),
        None => Path::new(DEFAULT_PATH)
            .is_file()
            .then(|| PathBuf::from(DEFAULT_PATH)),
    }
}

/// The report as the JSON the operator parses, always under the kubelet's
/// size limit (the trigger is the only free text and is cut short).
pub fn message(report: &DrainReport) -> Vec<u8> {
    let mut text = serde_json::to_vec(&report.outcome()).unwrap_or_default();
    text.truncate(MAX_BYTES);
    text
}

/// Writes the message, replacing what the file held.
pub fn write(report: &DrainReport, path: &Path) -> std::io::Result<()> {
    std::fs::write(path, message(report))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use kubegrace_sidecar_api::report::{DrainOutcome, KIND};

    use super::*;
    use crate::drain::GraceEnd;

    fn report(trigger: &str) -> DrainReport {
        DrainReport {
            trigger: trigger.to_string(),
            connections: 7,
            duration: Duration::from_millis(31_250),
            grace: Duration::from_secs(2),
            force_closed: 1,
            grace_end: GraceEnd::Quiet,
            inflight_at_trigger: 3,
            requests_finished: 40,
            requests_cut: 1,
        }
    }

    #[test]
    fn the_message_is_the_contract_json() {
        let text = message(&report("SIGTERM"));
        let back: DrainOutcome = serde_json::from_slice(&text).expect("contract JSON");
        assert_eq!(back.kind, KIND);
        assert_eq!(back.trigger, "SIGTERM");
        assert_eq!(back.duration_ms, 31_250);
        assert_eq!(
            (
                back.connections,
                back.inflight_at_trigger,
                back.requests_finished
            ),
            (7, 3, 40)
        );
        assert_eq!((back.force_closed, back.requests_cut), (1, 1));
        assert!(!back.is_clean());
    }

    #[test]
    fn a_long_trigger_keeps_the_message_small_and_valid() {
        let text = message(&report(&"x".repeat(10_000)));
        assert!(text.len() < 512, "{} bytes", text.len());
        serde_json::from_slice::<DrainOutcome>(&text).expect("still JSON");
    }

    #[test]
    fn written_where_asked_and_nowhere_by_default_outside_a_pod() {
        let dir = crate::testing::temp_dir("termination", "written");
        let path = dir.join("termination-log");
        let to = target(Some(&path)).expect("asked for");
        write(&report("SIGTERM"), &to).expect("write");
        let text = std::fs::read(&path).expect("read");
        assert_eq!(text, message(&report("SIGTERM")));
        assert_eq!(target(Some(Path::new(""))), None);
        // The default is written only where the kubelet created the file.
        assert_eq!(target(None).is_some(), Path::new(DEFAULT_PATH).is_file());
    }
}
