//! The bundle's Secret: what it holds, how it is read and written, and
//! the conditional write that keeps several replicas on one bundle.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client, ResourceExt};

use super::rotation::{Phase, next_state, plan};
use crate::{Error, Result};

const NOT_AFTER: &str = "kubegrace.io/not-after";
const CA_NOT_AFTER: &str = "kubegrace.io/ca-not-after";
const SANS: &str = "kubegrace.io/sans";
/// Where a CA rotation stands ([`Phase`]) and since when (unix seconds).
const PHASE: &str = "kubegrace.io/ca-phase";
const PHASE_SINCE: &str = "kubegrace.io/ca-phase-since";
const NEXT_CA_NOT_AFTER: &str = "kubegrace.io/next-ca-not-after";

fn data_str(secret: &Secret, key: &str) -> Option<String> {
    secret
        .data
        .as_ref()?
        .get(key)
        .and_then(|b| String::from_utf8(b.0.clone()).ok())
}

/// What the Secret holds, read (pure).
#[derive(Debug, Clone)]
pub struct Stored {
    pub ca_pem: String,
    pub ca_key_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
    /// The PEMs the callers must trust (one or two CAs).
    pub bundle_pem: String,
    pub next: Option<(String, String)>,
    pub not_after: i64,
    /// 0 when unknown (a Secret from before rotation existed: its CA is
    /// replaced, through the same overlap, by a name-constrained one).
    pub ca_not_after: i64,
    pub next_ca_not_after: i64,
    pub sans: String,
    pub phase: Phase,
    pub since: i64,
}

impl Stored {
    /// None: not a usable bundle (missing keys), start over.
    pub fn read(secret: &Secret) -> Option<Self> {
        let ann = secret.annotations();
        let num = |k: &str| ann.get(k).and_then(|s| s.parse::<i64>().ok());
        let ca_pem = data_str(secret, "ca.crt")?;
        let next = data_str(secret, "next-ca.crt").zip(data_str(secret, "next-ca.key"));
        Some(Self {
            bundle_pem: data_str(secret, "ca-bundle.crt").unwrap_or_else(|| ca_pem.clone()),
            ca_key_pem: data_str(secret, "ca.key")?,
            cert_pem: data_str(secret, "tls.crt")?,
            key_pem: data_str(secret, "tls.key")?,
            ca_pem,
            not_after: num(NOT_AFTER)?,
            ca_not_after: num(CA_NOT_AFTER).unwrap_or(0),
            next_ca_not_after: num(NEXT_CA_NOT_AFTER).unwrap_or(0),
            sans: ann.get(SANS).cloned().unwrap_or_default(),
            phase: match (ann.get(PHASE).map(String::as_str), &next) {
                (Some("introduced"), Some(_)) => Phase::Introduced,
                (Some("switched"), _) => Phase::Switched,
                _ => Phase::Steady,
            },
            since: num(PHASE_SINCE).unwrap_or(0),
            next,
        })
    }
}

pub(super) fn bundle_secret(name: &str, b: &Stored, resource_version: Option<String>) -> Secret {
    let bytes = |s: &str| ByteString(s.as_bytes().to_vec());
    let mut data = BTreeMap::from([
        ("tls.crt".to_string(), bytes(&b.cert_pem)),
        ("tls.key".to_string(), bytes(&b.key_pem)),
        ("ca.crt".to_string(), bytes(&b.ca_pem)),
        ("ca.key".to_string(), bytes(&b.ca_key_pem)),
        ("ca-bundle.crt".to_string(), bytes(&b.bundle_pem)),
    ]);
    if let Some((c, k)) = &b.next {
        data.insert("next-ca.crt".into(), bytes(c));
        data.insert("next-ca.key".into(), bytes(k));
    }
    Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            resource_version,
            annotations: Some(BTreeMap::from([
                (NOT_AFTER.to_string(), b.not_after.to_string()),
                (CA_NOT_AFTER.to_string(), b.ca_not_after.to_string()),
                (
                    NEXT_CA_NOT_AFTER.to_string(),
                    b.next_ca_not_after.to_string(),
                ),
                (SANS.to_string(), b.sans.clone()),
                (PHASE.to_string(), b.phase.as_str().to_string()),
                (PHASE_SINCE.to_string(), b.since.to_string()),
            ])),
            labels: Some(BTreeMap::from([(
                crate::keys::MANAGED_BY.to_string(),
                crate::FIELD_MANAGER.to_string(),
            )])),
            ..Default::default()
        },
        type_: Some("kubernetes.io/tls".into()),
        data: Some(data),
        ..Default::default()
    }
}

/// Reads the bundle from the Secret, creating, renewing or rotating it when
/// needed; returns (caBundle, certificate, key) PEM. Safe with several
/// replicas: writes are conditional (create / replace at a resourceVersion)
/// and the loser re-reads the winner's bundle.
pub async fn ensure_secret(
    client: &Client,
    namespace: &str,
    name: &str,
    sans: &[String],
) -> Result<(String, String, String)> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    for _ in 0..5 {
        let current = api
            .get_opt(name)
            .await
            .map_err(Error::kube(format!("reading Secret {namespace}/{name}")))?;
        let now = time::OffsetDateTime::now_utc();
        let stored = current.as_ref().and_then(Stored::read);
        let step = plan(stored.as_ref(), sans, now);
        let Some(next) = next_state(stored.as_ref(), step, sans, now)? else {
            let s = stored.ok_or_else(|| Error::Cert(format!("Secret {name} unreadable")))?;
            return Ok((s.bundle_pem, s.cert_pem, s.key_pem));
        };
        let result = match &current {
            Some(cur) => {
                api.replace(
                    name,
                    &PostParams::default(),
                    &bundle_secret(name, &next, cur.resource_version()),
                )
                .await
            }
            None => {
                api.create(&PostParams::default(), &bundle_secret(name, &next, None))
                    .await
            }
        };
        match result {
            Ok(_) => {
                tracing::info!(
                    secret = name,
                    ?step,
                    phase = next.phase.as_str(),
                    "webhook certificate updated"
                );
                return Ok((next.bundle_pem, next.cert_pem, next.key_pem));
            }
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => {
                return Err(Error::kube(format!("writing Secret {namespace}/{name}"))(e));
            }
        }
    }
    Err(Error::Cert(format!(
        "Secret {namespace}/{name} kept changing under us"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::certs::rotation::Step;
    use crate::certs::testing::{at, sans, taken};

    /// A Secret written before rotation existed (10-year CA, no constraint,
    /// no bundle key) is migrated through the overlap, not swapped at once.
    #[test]
    fn a_legacy_secret_is_rotated_with_overlap() {
        let sans = sans();
        let t0 = at(0, 0);
        let s0 = taken(None, Step::Create, &sans, t0);
        let mut legacy = bundle_secret("x", &s0, None);
        for k in [CA_NOT_AFTER, PHASE, PHASE_SINCE] {
            legacy.metadata.annotations.as_mut().expect("ann").remove(k);
        }
        legacy.data.as_mut().expect("data").remove("ca-bundle.crt");
        let read = Stored::read(&legacy).expect("legacy is readable");
        assert_eq!(read.bundle_pem, s0.ca_pem);
        assert_eq!(plan(Some(&read), &sans, t0), Step::Introduce);
    }
}
