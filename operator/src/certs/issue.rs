//! Issuing: a name-constrained CA, and the serving certificates it signs.

use rcgen::{
    BasicConstraints, CertificateParams, CidrSubnet, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, GeneralSubtree, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    NameConstraints,
};

use super::{CA_DAYS, LEAF_DAYS};
use crate::{Error, Result};

fn rc(e: rcgen::Error) -> Error {
    Error::Cert(e.to_string())
}

/// The CA's name constraint: it may sign for the webhook Service's names
/// (and their subdomains) and the extra SANs, nothing else. A stolen CA key
/// cannot mint a certificate the cluster's clients would accept for any
/// other host.
pub fn name_constraints(sans: &[String]) -> NameConstraints {
    let permitted_subtrees = sans
        .iter()
        .map(|s| match s.parse::<std::net::IpAddr>() {
            Ok(ip) => GeneralSubtree::IpAddress(CidrSubnet::from_addr_prefix(
                ip,
                if ip.is_ipv4() { 32 } else { 128 },
            )),
            Err(_) => GeneralSubtree::DnsName(s.clone()),
        })
        .collect();
    NameConstraints {
        permitted_subtrees,
        excluded_subtrees: Vec::new(),
    }
}

/// A new CA for `sans` (PEM cert, PEM key, expiry).
pub fn new_ca(
    sans: &[String],
    now: time::OffsetDateTime,
) -> Result<(String, String, time::OffsetDateTime)> {
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(rc)?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "kubegrace-webhook-ca");
    params.distinguished_name = dn;
    // pathLen 0: the CA signs leaves only, never another CA.
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.name_constraints = Some(name_constraints(sans));
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::days(CA_DAYS);
    let key = KeyPair::generate().map_err(rc)?;
    let cert = params.self_signed(&key).map_err(rc)?;
    Ok((cert.pem(), key.serialize_pem(), params.not_after))
}

/// A serving certificate for `sans` signed by the CA, valid [`LEAF_DAYS`]
/// but never past the CA (PEM cert, PEM key, expiry).
pub fn issue_leaf(
    sans: &[String],
    ca_pem: &str,
    ca_key_pem: &str,
    ca_not_after: time::OffsetDateTime,
    now: time::OffsetDateTime,
) -> Result<(String, String, time::OffsetDateTime)> {
    let key_pair = KeyPair::from_pem(ca_key_pem).map_err(rc)?;
    let issuer = Issuer::from_ca_cert_pem(ca_pem, key_pair).map_err(rc)?;
    let mut params = CertificateParams::new(sans.to_vec()).map_err(rc)?;
    let mut dn = DistinguishedName::new();
    dn.push(
        DnType::CommonName,
        sans.first()
            .cloned()
            .unwrap_or_else(|| "kubegrace-webhook".into()),
    );
    params.distinguished_name = dn;
    params.is_ca = IsCa::NoCa;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.not_before = now - time::Duration::hours(1);
    params.not_after = (now + time::Duration::days(LEAF_DAYS)).min(ca_not_after);
    let key = KeyPair::generate().map_err(rc)?;
    let cert = params.signed_by(&key, &issuer).map_err(rc)?;
    Ok((cert.pem(), key.serialize_pem(), params.not_after))
}

/// The names the API server may use for the webhook Service, plus extras.
pub fn service_sans(service: &str, namespace: &str, extra: &[String]) -> Vec<String> {
    let mut v = vec![
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.cluster.local"),
        format!("{service}.{namespace}"),
        service.to_string(),
    ];
    v.extend(extra.iter().filter(|s| !s.is_empty()).cloned());
    v
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::certs::testing::{der, sans};

    /// Parses the generated CA: the name constraint lists exactly the
    /// Service's names and the extra IP, and the validity is the documented one.
    #[test]
    fn the_ca_is_name_constrained_and_lives_a_year() {
        use x509_parser::extensions::{GeneralName, ParsedExtension};
        let now = time::OffsetDateTime::now_utc();
        let (ca, _key, not_after) = new_ca(&sans(), now).expect("ca");
        let ca_der = der(&ca);
        let (_, cert) = x509_parser::parse_x509_certificate(&ca_der).expect("parse");
        let nc = cert
            .extensions()
            .iter()
            .find_map(|e| match e.parsed_extension() {
                ParsedExtension::NameConstraints(nc) => Some((e.critical, nc.clone())),
                _ => None,
            })
            .expect("a NameConstraints extension");
        assert!(nc.0, "name constraints are critical");
        let permitted: Vec<String> =
            nc.1.permitted_subtrees
                .expect("permitted subtrees")
                .iter()
                .map(|t| match &t.base {
                    GeneralName::DNSName(d) => (*d).to_string(),
                    GeneralName::IPAddress(ip) => format!("ip:{ip:?}"),
                    other => format!("{other:?}"),
                })
                .collect();
        assert_eq!(
            permitted,
            [
                "kubegrace-webhook.kubegrace-system.svc",
                "kubegrace-webhook.kubegrace-system.svc.cluster.local",
                "kubegrace-webhook.kubegrace-system",
                "kubegrace-webhook",
                "ip:[127, 0, 0, 1, 255, 255, 255, 255]",
            ]
        );
        let bc = cert
            .basic_constraints()
            .expect("bc")
            .expect("present")
            .value;
        assert!(bc.ca);
        assert_eq!(bc.path_len_constraint, Some(0));
        let life = cert.validity().not_after.timestamp() - now.unix_timestamp();
        assert!(
            (CA_DAYS * 86400 - 60..=CA_DAYS * 86400 + 60).contains(&life),
            "{life}"
        );
        assert_eq!(
            not_after.unix_timestamp(),
            cert.validity().not_after.timestamp()
        );

        let (leaf, _k, leaf_after) = issue_leaf(&sans(), &ca, &_key, not_after, now).expect("leaf");
        let leaf_der = der(&leaf);
        let (_, cert) = x509_parser::parse_x509_certificate(&leaf_der).expect("parse leaf");
        let life = cert.validity().not_after.timestamp() - now.unix_timestamp();
        assert!(
            (LEAF_DAYS * 86400 - 60..=LEAF_DAYS * 86400 + 60).contains(&life),
            "{life}"
        );
        // Never past the CA.
        let (_, _, clamped) =
            issue_leaf(&sans(), &ca, &_key, now + time::Duration::days(3), now).expect("leaf");
        assert!(clamped < leaf_after);
        assert_eq!(
            clamped.unix_timestamp(),
            (now + time::Duration::days(3)).unix_timestamp()
        );
    }

    /// A real verifier (webpki, as rustls clients use it) accepts the leaf
    /// for the Service name and refuses one for a host outside the
    /// constraint, even though the CA signed it.
    #[test]
    fn a_verifier_enforces_the_name_constraint() {
        use rustls::client::danger::ServerCertVerifier as _;
        let _ = rustls::crypto::ring::default_provider().install_default();
        let now = time::OffsetDateTime::now_utc();
        let (ca, key, ca_after) = new_ca(&sans(), now).expect("ca");
        let mut roots = rustls::RootCertStore::empty();
        roots.add(der(&ca).into()).expect("root");
        let verifier = rustls::client::WebPkiServerVerifier::builder(Arc::new(roots))
            .build()
            .expect("verifier");
        let verify = |leaf: &str, host: &str| {
            verifier.verify_server_cert(
                &der(leaf).into(),
                &[],
                &rustls::pki_types::ServerName::try_from(host.to_string()).expect("name"),
                &[],
                rustls::pki_types::UnixTime::now(),
            )
        };
        let (good, _, _) = issue_leaf(&sans(), &ca, &key, ca_after, now).expect("leaf");
        verify(&good, "kubegrace-webhook.kubegrace-system.svc").expect("the Service name verifies");
        let evil_names = vec!["bank.example.com".to_string()];
        let (evil, _, _) =
            issue_leaf(&evil_names, &ca, &key, ca_after, now).expect("signed anyway");
        let err = verify(&evil, "bank.example.com").expect_err("outside the constraint");
        assert!(
            format!("{err:?}").contains("NameConstraint") || format!("{err:?}").contains("Name"),
            "{err:?}"
        );
    }
}
