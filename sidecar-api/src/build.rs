//! What a binary was built from: its crate version and the git revision.
//!
//! The revision comes from the environment of the build
//! (`KUBEGRACE_GIT_REVISION`, set by `e2e/cluster/images`, the Dockerfile's
//! build argument and the release workflow) rather than from a
//! build script that runs git:
//! the same source and the same variable give the same binary, and a build
//! from a tarball without `.git` still works. Without it the revision is
//! [`UNKNOWN`].

/// The build-time environment variable that carries the git revision.
pub const REVISION_ENV: &str = "KUBEGRACE_GIT_REVISION";

/// The revision of a build that was not told one.
pub const UNKNOWN: &str = "unknown";

/// The git revision this workspace was built from.
pub const REVISION: &str = revision_or_unknown(option_env!("KUBEGRACE_GIT_REVISION"));

const fn revision_or_unknown(built_with: Option<&'static str>) -> &'static str {
    match built_with {
        // An empty variable (an unset shell variable passed on) says nothing.
        Some(revision) if !revision.is_empty() => revision,
        _ => UNKNOWN,
    }
}

/// The `--version` text after the program name (clap prints the name):
/// `0.1.0 (revision 1a2b3c4)`.
pub fn version_line(crate_version: &str, revision: &str) -> String {
    format!("{crate_version} (revision {revision})")
}

/// What `PROGRAM --version` prints for a binary of this build, for its
/// tests to compare with.
pub fn version_text(program: &str, crate_version: &str) -> String {
    format!("{program} {}\n", version_line(crate_version, REVISION))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_or_empty_revision_is_unknown() {
        assert_eq!(revision_or_unknown(None), UNKNOWN);
        assert_eq!(revision_or_unknown(Some("")), UNKNOWN);
        assert_eq!(revision_or_unknown(Some("1a2b3c4")), "1a2b3c4");
    }

    #[test]
    fn the_version_line_names_version_and_revision() {
        assert_eq!(version_line("0.1.0", "1a2b3c4"), "0.1.0 (revision 1a2b3c4)");
    }
}
