//! What the certificate unit tests share.

use super::{Step, Stored, next_state, service_sans};

/// The webhook Service's names, and one extra IP.
pub(super) fn sans() -> Vec<String> {
    service_sans(
        "kubegrace-webhook",
        "kubegrace-system",
        &["127.0.0.1".into()],
    )
}

/// The first certificate of a PEM, as DER.
pub(super) fn der(pem: &str) -> Vec<u8> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    CertificateDer::from_pem_slice(pem.as_bytes())
        .expect("a certificate")
        .to_vec()
}

/// `days` and `secs` from now.
pub(super) fn at(days: i64, secs: i64) -> time::OffsetDateTime {
    time::OffsetDateTime::now_utc() + time::Duration::days(days) + time::Duration::seconds(secs)
}

/// The state after `step`, which must be one that writes a new state.
pub(super) fn taken(
    stored: Option<&Stored>,
    step: Step,
    sans: &[String],
    now: time::OffsetDateTime,
) -> Stored {
    next_state(stored, step, sans, now)
        .unwrap_or_else(|e| panic!("{step:?}: {e}"))
        .unwrap_or_else(|| panic!("{step:?} writes a new state"))
}
