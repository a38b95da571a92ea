//! Which kind of HTTP/2 client this is, from its first SETTINGS frame.

/// The client kind, from its first SETTINGS frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ClientKind {
    /// Not known yet (the SETTINGS frame has not been read).
    Unknown = 0,
    /// Follows RFC 9113 §6.8 and gets the two-phase GOAWAY.
    Conforming = 1,
    /// Python's h2: fails on any frame after a GOAWAY.
    Strict = 2,
}

/// Python's h2 serialises its settings object in its own order, defaults
/// included: HEADER_TABLE_SIZE=4096, ENABLE_PUSH, INITIAL_WINDOW_SIZE=65535,
/// MAX_FRAME_SIZE=16384, then the rest. Other clients omit defaults (Go,
/// hyper/tonic, nghttp2) or send other values (browsers), and the h2 crate
/// orders by identifier, so the first four entries tell it apart.
/// Measured with httpcore 0.16.3/h2 4.1.0 and httpcore 1.0.9/h2 4.4.1.
pub(crate) fn classify(settings: &[u8]) -> ClientKind {
    let entries: Vec<(u16, u32)> = settings
        .chunks_exact(6)
        .map(|e| {
            (
                u16::from_be_bytes([e[0], e[1]]),
                u32::from_be_bytes([e[2], e[3], e[4], e[5]]),
            )
        })
        .collect();
    match entries.as_slice() {
        [(1, 4096), (2, _), (4, 65535), (5, 16384), ..] => ClientKind::Strict,
        _ => ClientKind::Conforming,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(entries: &[(u16, u32)]) -> Vec<u8> {
        entries
            .iter()
            .flat_map(|&(id, v)| {
                let mut e = id.to_be_bytes().to_vec();
                e.extend_from_slice(&v.to_be_bytes());
                e
            })
            .collect()
    }

    #[test]
    fn python_h2_settings_are_recognised() {
        // As captured from httpx 0.23.3 and 0.28.1.
        let python = settings(&[
            (1, 4096),
            (2, 0),
            (4, 65535),
            (5, 16384),
            (3, 100),
            (6, 65536),
        ]);
        assert_eq!(classify(&python), ClientKind::Strict);
        // h2 crate (hyper, tonic): identifier order, no defaults.
        let hyper = settings(&[(2, 0), (4, 2 * 1024 * 1024), (5, 16384), (6, 16384)]);
        assert_eq!(classify(&hyper), ClientKind::Conforming);
        // Go's transport.
        let go = settings(&[(2, 0), (4, 4 << 20), (6, 10 << 20)]);
        assert_eq!(classify(&go), ClientKind::Conforming);
        assert_eq!(classify(&[]), ClientKind::Conforming);
    }
}
