//! Who holds the operator's leader-election Lease, read by the operator
//! (before it takes the Lease over) and by the kubectl plugin (is a leader
//! alive?).

use k8s_openapi::api::coordination::v1::LeaseSpec;

/// Whether `spec` is held by someone else whose lease has not run out.
pub fn held_by_other(spec: &LeaseSpec, identity: &str, now: jiff::Timestamp) -> bool {
    let Some(holder) = spec.holder_identity.as_deref().filter(|h| !h.is_empty()) else {
        return false;
    };
    if holder == identity {
        return false;
    }
    let secs = i64::from(spec.lease_duration_seconds.unwrap_or(15));
    match spec.renew_time.as_ref().or(spec.acquire_time.as_ref()) {
        Some(t) => t.0 + jiff::SignedDuration::from_secs(secs) > now,
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    use super::*;

    #[test]
    fn a_lease_is_free_when_unheld_expired_or_ours() {
        let now = jiff::Timestamp::now();
        let spec = |holder: Option<&str>, ago: i64| LeaseSpec {
            holder_identity: holder.map(Into::into),
            lease_duration_seconds: Some(15),
            renew_time: Some(MicroTime(now - jiff::SignedDuration::from_secs(ago))),
            ..Default::default()
        };
        assert!(!held_by_other(&spec(None, 0), "me", now));
        assert!(!held_by_other(&spec(Some("me"), 0), "me", now));
        assert!(held_by_other(&spec(Some("other"), 5), "me", now));
        assert!(!held_by_other(&spec(Some("other"), 20), "me", now));
    }
}
