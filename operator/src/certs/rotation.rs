//! Renewal and rotation: which step the stored bundle needs next, and
//! that step carried out (pure but for key generation).

use super::issue::{issue_leaf, new_ca};
use super::storage::Stored;
use super::{CA_RENEW_BEFORE_DAYS, LEAF_DAYS, LEAF_RENEW_BEFORE_DAYS, OVERLAP};
use crate::{Error, Result};

/// Where a CA rotation stands. The caBundle (Secret key `ca-bundle.crt`,
/// copied into both webhook configurations) always holds every CA a
/// replica may be serving a leaf of:
///
/// `Steady` (bundle: CA) -> `Introduced` (bundle: CA + next CA; leaves still
/// from the old CA) -> after [`OVERLAP`]: `Switched` (the next CA signs a new
/// leaf; bundle: old + new, as replicas pick the new leaf up over a round)
/// -> after [`OVERLAP`]: `Steady` (bundle: new CA).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Steady,
    Introduced,
    Switched,
}

impl Phase {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Self::Steady => "steady",
            Self::Introduced => "introduced",
            Self::Switched => "switched",
        }
    }
}

/// The next step for the stored bundle (pure).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Keep,
    /// Nothing usable (or the Service's names changed, which the CA's name
    /// constraint does not cover): a new CA and leaf at once.
    Create,
    /// A new leaf from the current CA.
    ReissueLeaf,
    /// Add a next CA to the bundle.
    Introduce,
    /// The next CA signs the leaf from now on.
    Switch,
    /// Drop the old CA from the bundle.
    Settle,
}

pub fn plan(stored: Option<&Stored>, sans: &[String], now: time::OffsetDateTime) -> Step {
    let Some(s) = stored else {
        return Step::Create;
    };
    if s.sans != sans.join(",") {
        return Step::Create;
    }
    let now = now.unix_timestamp();
    let overlap = i64::try_from(OVERLAP.as_secs()).unwrap_or(i64::MAX);
    let day = 86_400;
    match s.phase {
        Phase::Introduced if now - s.since >= overlap => Step::Switch,
        Phase::Switched if now - s.since >= overlap => Step::Settle,
        Phase::Steady if s.ca_not_after - now < CA_RENEW_BEFORE_DAYS * day => Step::Introduce,
        _ if s.not_after - now < LEAF_RENEW_BEFORE_DAYS * day => Step::ReissueLeaf,
        _ => Step::Keep,
    }
}

/// Carries out `step` (pure but for key generation); None for Keep.
pub fn next_state(
    stored: Option<&Stored>,
    step: Step,
    sans: &[String],
    now: time::OffsetDateTime,
) -> Result<Option<Stored>> {
    let ts = now.unix_timestamp();
    let fresh = || -> Result<Stored> {
        let (ca_pem, ca_key_pem, ca_after) = new_ca(sans, now)?;
        let (cert_pem, key_pem, after) = issue_leaf(sans, &ca_pem, &ca_key_pem, ca_after, now)?;
        Ok(Stored {
            bundle_pem: ca_pem.clone(),
            ca_pem,
            ca_key_pem,
            cert_pem,
            key_pem,
            next: None,
            not_after: after.unix_timestamp(),
            ca_not_after: ca_after.unix_timestamp(),
            next_ca_not_after: 0,
            sans: sans.join(","),
            phase: Phase::Steady,
            since: ts,
        })
    };
    let at = |t: i64| {
        time::OffsetDateTime::from_unix_timestamp(t).map_err(|e| Error::Cert(e.to_string()))
    };
    let Some(old) = stored else {
        return fresh().map(Some);
    };
    let mut s = old.clone();
    match step {
        Step::Keep => return Ok(None),
        Step::Create => return fresh().map(Some),
        Step::ReissueLeaf => {
            let ca_after = if s.ca_not_after > 0 {
                at(s.ca_not_after)?
            } else {
                now + time::Duration::days(LEAF_DAYS)
            };
            let (c, k, after) = issue_leaf(sans, &s.ca_pem, &s.ca_key_pem, ca_after, now)?;
            s.cert_pem = c;
            s.key_pem = k;
            s.not_after = after.unix_timestamp();
        }
        Step::Introduce => {
            let (c, k, after) = new_ca(sans, now)?;
            s.bundle_pem = format!("{}{}", ensure_newline(&s.ca_pem), c);
            s.next = Some((c, k));
            s.next_ca_not_after = after.unix_timestamp();
            s.phase = Phase::Introduced;
            s.since = ts;
        }
        Step::Switch => {
            let Some((c, k)) = s.next.take() else {
                return fresh().map(Some);
            };
            let (cert, key, after) = issue_leaf(sans, &c, &k, at(s.next_ca_not_after)?, now)?;
            // The bundle keeps old + new until Settle.
            s.ca_pem = c;
            s.ca_key_pem = k;
            s.ca_not_after = s.next_ca_not_after;
            s.next_ca_not_after = 0;
            s.cert_pem = cert;
            s.key_pem = key;
            s.not_after = after.unix_timestamp();
            s.phase = Phase::Switched;
            s.since = ts;
        }
        Step::Settle => {
            s.bundle_pem = s.ca_pem.clone();
            s.phase = Phase::Steady;
            s.since = ts;
        }
    }
    Ok(Some(s))
}

fn ensure_newline(pem: &str) -> String {
    if pem.ends_with('\n') {
        pem.to_string()
    } else {
        format!("{pem}\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::certs::CA_DAYS;
    use crate::certs::serving::certified_key;
    use crate::certs::storage::bundle_secret;
    use crate::certs::testing::{at, sans, taken};

    /// Walks a whole CA rotation with a synthetic clock; at every step the
    /// bundle trusts the CA of the leaf being served and of the leaf served
    /// a step before (what replicas that have not re-read the Secret still
    /// serve).
    #[test]
    fn a_ca_rotation_overlaps_old_and_new_in_the_bundle() {
        let sans = sans();
        let t0 = at(0, 0);
        assert_eq!(plan(None, &sans, t0), Step::Create);
        let s0 = taken(None, Step::Create, &sans, t0);
        assert_eq!(plan(Some(&s0), &sans, t0), Step::Keep);
        // Leaf renewal at 60 days (30 left), same CA, bundle unchanged.
        let t1 = at(61, 0);
        assert_eq!(plan(Some(&s0), &sans, t1), Step::ReissueLeaf);
        let s1 = taken(Some(&s0), Step::ReissueLeaf, &sans, t1);
        assert_eq!(s1.bundle_pem, s0.bundle_pem);
        assert_ne!(s1.cert_pem, s0.cert_pem);
        // (Renewals every 60 days meanwhile; the last before the rotation.)
        let s1 = taken(Some(&s1), Step::ReissueLeaf, &sans, at(CA_DAYS - 62, 0));
        // 60 days before the CA expires: the next CA joins the bundle.
        let t2 = at(CA_DAYS - 59, 0);
        assert_eq!(plan(Some(&s1), &sans, t2), Step::Introduce);
        let s2 = taken(Some(&s1), Step::Introduce, &sans, t2);
        let (next_ca, _) = s2.next.clone().expect("next CA");
        assert!(s2.bundle_pem.contains(&s1.ca_pem) && s2.bundle_pem.contains(&next_ca));
        assert_eq!(s2.cert_pem, s1.cert_pem, "the leaf does not change yet");
        assert_eq!(
            plan(Some(&s2), &sans, t2 + time::Duration::minutes(30)),
            Step::Keep
        );
        // After the overlap: the new CA signs the leaf; the old stays trusted.
        let t3 = t2 + time::Duration::seconds(OVERLAP.as_secs() as i64);
        assert_eq!(plan(Some(&s2), &sans, t3), Step::Switch);
        let s3 = taken(Some(&s2), Step::Switch, &sans, t3);
        assert_eq!(s3.ca_pem, next_ca);
        assert!(s3.bundle_pem.contains(&s1.ca_pem) && s3.bundle_pem.contains(&next_ca));
        assert!(s3.next.is_none());
        // After another overlap: the old CA leaves the bundle.
        let t4 = t3 + time::Duration::seconds(OVERLAP.as_secs() as i64);
        assert_eq!(plan(Some(&s3), &sans, t4), Step::Settle);
        let s4 = taken(Some(&s3), Step::Settle, &sans, t4);
        assert_eq!(s4.bundle_pem, next_ca);
        assert_eq!(plan(Some(&s4), &sans, t4), Step::Keep);

        // The Secret round-trips every phase.
        for s in [&s0, &s2, &s3, &s4] {
            let back = Stored::read(&bundle_secret("x", s, None)).expect("readable");
            assert_eq!(back.phase, s.phase);
            assert_eq!(back.bundle_pem, s.bundle_pem);
            assert_eq!(back.next, s.next);
            assert_eq!(plan(Some(&back), &sans, t4), plan(Some(s), &sans, t4));
        }
        // The leaf served after the switch chains to the new CA (rustls).
        certified_key(s3.cert_pem.as_bytes(), s3.key_pem.as_bytes()).expect("rustls accepts it");
        // Changed Service names: a new CA at once (the old constraint does
        // not cover them).
        assert_eq!(plan(Some(&s4), &sans[..1], t4), Step::Create);
    }
}
