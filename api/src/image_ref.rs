//! What the `kubegrace.io/sidecar-version` annotation says about an image
//! reference: the version a human compares across pods after an upgrade.

/// The tag of `image` (`ghcr.io/kubegrace/sidecar:0.2.0` -> `0.2.0`); its
/// digest when it is pinned by digest only; `latest` when it names neither,
/// which is what the container runtime pulls then.
pub fn version_of(image: &str) -> &str {
    let (name, digest) = match image.split_once('@') {
        Some((name, digest)) => (name, Some(digest)),
        None => (image, None),
    };
    // A colon before the last slash is a registry port, not a tag.
    let last_part = name.rsplit('/').next().unwrap_or(name);
    match (last_part.split_once(':'), digest) {
        (Some((_, tag)), _) if !tag.is_empty() => tag,
        (_, Some(digest)) => digest,
        _ => "latest",
    }
}

#[cfg(test)]
mod tests {
    use super::version_of;

    #[test]
    fn the_tag_is_the_version() {
        assert_eq!(version_of("ghcr.io/kubegrace/sidecar:0.2.0"), "0.2.0");
        assert_eq!(version_of("localhost/kubegrace/sidecar:e2e"), "e2e");
        assert_eq!(version_of("registry:5000/kubegrace/sidecar:1.0"), "1.0");
        assert_eq!(
            version_of("ghcr.io/kubegrace/sidecar:0.2.0@sha256:abc"),
            "0.2.0"
        );
    }

    #[test]
    fn a_digest_only_reference_gives_the_digest() {
        assert_eq!(
            version_of("ghcr.io/kubegrace/sidecar@sha256:abc"),
            "sha256:abc"
        );
    }

    #[test]
    fn no_tag_and_no_digest_is_latest_not_the_registry_port() {
        assert_eq!(version_of("registry:5000/kubegrace/sidecar"), "latest");
        assert_eq!(version_of("sidecar"), "latest");
    }
}
