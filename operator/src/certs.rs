//! The webhook's serving certificate.
//!
//! Self-managed (default): a CA and a leaf for `<svc>.<ns>.svc` generated
//! with rcgen, stored in a Secret so every replica serves the same one,
//! the CA patched into the caBundle of the MutatingWebhookConfiguration
//! (pods) and of the ValidatingWebhookConfiguration (GraceRoutes), the leaf
//! rotated 30 days before it expires (the CA, valid 10 years, stays, so the
//! caBundle does not change on rotation).
//!
//! `--cert-dir` (cert-manager): tls.crt/tls.key are read from the directory
//! and re-read when they change; cert-manager's cainjector owns caBundle.
//!
//! Either way the TLS server asks [`CertResolver`] for the certificate on
//! every handshake, so a rotation needs no restart.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use crate::{Error, Result};

const NOT_AFTER: &str = "kubegrace.io/not-after";
const SANS: &str = "kubegrace.io/sans";
const LEAF_DAYS: i64 = 365;
const CA_DAYS: i64 = 3650;
const RENEW_BEFORE_DAYS: i64 = 30;

/// Hands the current certificate to every TLS handshake.
#[derive(Debug, Default)]
pub struct CertResolver {
    current: RwLock<Option<Arc<CertifiedKey>>>,
}

impl CertResolver {
    pub fn set(&self, key: CertifiedKey) {
        let mut cur = self
            .current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *cur = Some(Arc::new(key));
    }
    pub fn is_loaded(&self) -> bool {
        self.current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_some()
    }
}

impl ResolvesServerCert for CertResolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

/// Parses PEM chain + key into what rustls serves.
pub fn certified_key(cert_pem: &[u8], key_pem: &[u8]) -> Result<CertifiedKey> {
    let certs = rustls_pemfile::certs(&mut &*cert_pem)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| Error::Cert(format!("reading certificate PEM: {e}")))?;
    if certs.is_empty() {
        return Err(Error::Cert("no certificate in PEM".into()));
    }
    let key = rustls_pemfile::private_key(&mut &*key_pem)
        .map_err(|e| Error::Cert(format!("reading key PEM: {e}")))?
        .ok_or_else(|| Error::Cert("no private key in PEM".into()))?;
    let signer = rustls::crypto::ring::sign::any_supported_type(&key)
        .map_err(|e| Error::Cert(format!("unsupported key: {e}")))?;
    Ok(CertifiedKey::new(certs, signer))
}

/// A CA and a leaf, in PEM.
#[derive(Debug, Clone)]
pub struct Bundle {
    pub ca_pem: String,
    pub ca_key_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
    pub not_after: time::OffsetDateTime,
}

fn rc(e: rcgen::Error) -> Error {
    Error::Cert(e.to_string())
}

/// Generates a leaf for `sans`, signed by the given CA or a new one.
pub fn generate(sans: &[String], ca: Option<(&str, &str)>) -> Result<Bundle> {
    let now = time::OffsetDateTime::now_utc();
    let (ca_pem, ca_key_pem, issuer) = match ca {
        Some((cert, key)) => {
            let key_pair = KeyPair::from_pem(key).map_err(rc)?;
            let issuer = Issuer::from_ca_cert_pem(cert, key_pair).map_err(rc)?;
            (cert.to_string(), key.to_string(), issuer)
        }
        None => {
            let mut params = CertificateParams::new(Vec::<String>::new()).map_err(rc)?;
            let mut dn = DistinguishedName::new();
            dn.push(DnType::CommonName, "kubegrace-webhook-ca");
            params.distinguished_name = dn;
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            params.key_usages = vec![
                KeyUsagePurpose::KeyCertSign,
                KeyUsagePurpose::CrlSign,
                KeyUsagePurpose::DigitalSignature,
            ];
            params.not_before = now - time::Duration::hours(1);
            params.not_after = now + time::Duration::days(CA_DAYS);
            let key = KeyPair::generate().map_err(rc)?;
            let cert = params.self_signed(&key).map_err(rc)?;
            let key_pem = key.serialize_pem();
            (cert.pem(), key_pem, Issuer::new(params, key))
        }
    };
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
    params.not_after = now + time::Duration::days(LEAF_DAYS);
    let key = KeyPair::generate().map_err(rc)?;
    let cert = params.signed_by(&key, &issuer).map_err(rc)?;
    Ok(Bundle {
        ca_pem,
        ca_key_pem,
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
        not_after: params.not_after,
    })
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

fn data_str(secret: &Secret, key: &str) -> Option<String> {
    secret
        .data
        .as_ref()?
        .get(key)
        .and_then(|b| String::from_utf8(b.0.clone()).ok())
}

/// Whether a stored bundle must be replaced (pure).
pub fn needs_rotation(secret: &Secret, sans: &[String], now: time::OffsetDateTime) -> bool {
    let ann = secret.annotations();
    let Some(not_after) = ann.get(NOT_AFTER).and_then(|s| s.parse::<i64>().ok()) else {
        return true;
    };
    if ann.get(SANS).map(String::as_str) != Some(sans.join(",").as_str()) {
        return true;
    }
    not_after - now.unix_timestamp() < RENEW_BEFORE_DAYS * 86400
        || ["tls.crt", "tls.key", "ca.crt", "ca.key"]
            .iter()
            .any(|k| data_str(secret, k).is_none())
}

fn bundle_secret(
    name: &str,
    b: &Bundle,
    sans: &[String],
    resource_version: Option<String>,
) -> Secret {
    let bytes = |s: &str| ByteString(s.as_bytes().to_vec());
    Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            resource_version,
            annotations: Some(BTreeMap::from([
                (
                    NOT_AFTER.to_string(),
                    b.not_after.unix_timestamp().to_string(),
                ),
                (SANS.to_string(), sans.join(",")),
            ])),
            labels: Some(BTreeMap::from([(
                crate::keys::MANAGED_BY.to_string(),
                crate::FIELD_MANAGER.to_string(),
            )])),
            ..Default::default()
        },
        type_: Some("kubernetes.io/tls".into()),
        data: Some(BTreeMap::from([
            ("tls.crt".to_string(), bytes(&b.cert_pem)),
            ("tls.key".to_string(), bytes(&b.key_pem)),
            ("ca.crt".to_string(), bytes(&b.ca_pem)),
            ("ca.key".to_string(), bytes(&b.ca_key_pem)),
        ])),
        ..Default::default()
    }
}

/// Reads the bundle from the Secret, creating or rotating it when needed;
/// returns (CA, certificate, key) PEM. Safe with several replicas: writes
/// are conditional (create / replace at a resourceVersion) and the loser
/// re-reads the winner's bundle.
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
        match current {
            Some(s) if !needs_rotation(&s, sans, now) => {
                let get = |k| {
                    data_str(&s, k).ok_or_else(|| Error::Cert(format!("Secret {name} lacks {k}")))
                };
                return Ok((get("ca.crt")?, get("tls.crt")?, get("tls.key")?));
            }
            Some(s) => {
                let ca = data_str(&s, "ca.crt").zip(data_str(&s, "ca.key"));
                let bundle = generate(sans, ca.as_ref().map(|(c, k)| (c.as_str(), k.as_str())))
                    .or_else(|_| generate(sans, None))?;
                let secret = bundle_secret(name, &bundle, sans, s.resource_version());
                match api.replace(name, &PostParams::default(), &secret).await {
                    Ok(_) => {
                        tracing::info!(secret = name, "webhook certificate rotated");
                        return Ok((bundle.ca_pem, bundle.cert_pem, bundle.key_pem));
                    }
                    Err(kube::Error::Api(e)) if e.code == 409 => continue,
                    Err(e) => {
                        return Err(Error::kube(format!("replacing Secret {namespace}/{name}"))(
                            e,
                        ));
                    }
                }
            }
            None => {
                let bundle = generate(sans, None)?;
                let secret = bundle_secret(name, &bundle, sans, None);
                match api.create(&PostParams::default(), &secret).await {
                    Ok(_) => {
                        tracing::info!(secret = name, "webhook certificate created");
                        return Ok((bundle.ca_pem, bundle.cert_pem, bundle.key_pem));
                    }
                    Err(kube::Error::Api(e)) if e.code == 409 => continue,
                    Err(e) => {
                        return Err(Error::kube(format!("creating Secret {namespace}/{name}"))(
                            e,
                        ));
                    }
                }
            }
        }
    }
    Err(Error::Cert(format!(
        "Secret {namespace}/{name} kept changing under us"
    )))
}

/// Writes the CA into every webhook of the MutatingWebhookConfiguration
/// that lacks it. Returns false if the configuration does not exist (yet).
pub async fn patch_ca_bundle(client: &Client, config: &str, ca_pem: &str) -> Result<bool> {
    patch_ca_bundle_of::<MutatingWebhookConfiguration>(client, config, ca_pem, |c| {
        c.webhooks
            .iter()
            .flatten()
            .map(|w| w.client_config.ca_bundle.clone())
            .collect()
    })
    .await
}

/// The same for the GraceRoute ValidatingWebhookConfiguration.
pub async fn patch_validating_ca_bundle(
    client: &Client,
    config: &str,
    ca_pem: &str,
) -> Result<bool> {
    patch_ca_bundle_of::<ValidatingWebhookConfiguration>(client, config, ca_pem, |c| {
        c.webhooks
            .iter()
            .flatten()
            .map(|w| w.client_config.ca_bundle.clone())
            .collect()
    })
    .await
}

/// One JSON-patch `add` per webhook whose caBundle is not `ca_pem` (pure).
fn ca_bundle_ops(current: &[Option<ByteString>], ca_pem: &str) -> Vec<serde_json::Value> {
    let want = ca_pem.as_bytes();
    current
        .iter()
        .enumerate()
        .filter(|(_, b)| b.as_ref().map(|b| b.0.as_slice()) != Some(want))
        .map(|(i, _)| {
            serde_json::json!({
                "op": "add",
                "path": format!("/webhooks/{i}/clientConfig/caBundle"),
                "value": base64::engine::general_purpose::STANDARD.encode(want),
            })
        })
        .collect()
}

async fn patch_ca_bundle_of<K>(
    client: &Client,
    config: &str,
    ca_pem: &str,
    bundles: impl Fn(&K) -> Vec<Option<ByteString>>,
) -> Result<bool>
where
    K: kube::Resource<Scope = kube::core::ClusterResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::all(client.clone());
    let kind = K::kind(&());
    let Some(current) = api
        .get_opt(config)
        .await
        .map_err(Error::kube(format!("reading {kind} {config}")))?
    else {
        return Ok(false);
    };
    let ops = ca_bundle_ops(&bundles(&current), ca_pem);
    if ops.is_empty() {
        return Ok(true);
    }
    let patch: json_patch::Patch = serde_json::from_value(serde_json::Value::Array(ops))
        .map_err(Error::serde("caBundle patch"))?;
    api.patch(config, &PatchParams::default(), &Patch::Json::<()>(patch))
        .await
        .map_err(Error::kube(format!("patching caBundle of {kind} {config}")))?;
    tracing::info!(config, %kind, "caBundle written");
    Ok(true)
}

/// Self-managed mode: keeps the Secret, the resolver and the caBundle
/// current.
pub struct SelfManaged {
    pub client: Client,
    pub namespace: String,
    pub secret: String,
    pub webhook_config: String,
    /// The GraceRoute ValidatingWebhookConfiguration; None: not installed.
    pub validating_webhook_config: Option<String>,
    pub sans: Vec<String>,
    pub resolver: Arc<CertResolver>,
}

impl SelfManaged {
    /// One round; returns whether the caBundle is in place.
    pub async fn round(&self) -> Result<bool> {
        let (ca, cert, key) =
            ensure_secret(&self.client, &self.namespace, &self.secret, &self.sans).await?;
        self.resolver
            .set(certified_key(cert.as_bytes(), key.as_bytes())?);
        let mutating = patch_ca_bundle(&self.client, &self.webhook_config, &ca).await?;
        let validating = match &self.validating_webhook_config {
            Some(name) => patch_validating_ca_bundle(&self.client, name, &ca).await?,
            None => true,
        };
        Ok(mutating && validating)
    }

    /// Rounds until shutdown: hourly once the caBundle is in place (rotation
    /// is checked then), every 10s until it is.
    pub async fn maintain(self, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        loop {
            let wait = match self.round().await {
                Ok(true) => Duration::from_secs(3600),
                Ok(false) => {
                    tracing::info!(
                        mutating = %self.webhook_config,
                        validating = ?self.validating_webhook_config,
                        "a webhook configuration is not there yet; retrying"
                    );
                    Duration::from_secs(10)
                }
                Err(e) => {
                    tracing::warn!(error = %e, "webhook certificate");
                    Duration::from_secs(10)
                }
            };
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                _ = shutdown.changed() => return,
            }
        }
    }
}

fn mtime(p: &Path) -> Option<SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

/// `--cert-dir` mode: loads tls.crt/tls.key.
pub fn load_dir(dir: &Path, resolver: &CertResolver) -> Result<()> {
    let read = |f: &str| {
        std::fs::read(dir.join(f)).map_err(Error::io(format!("reading {}", dir.join(f).display())))
    };
    resolver.set(certified_key(&read("tls.crt")?, &read("tls.key")?)?);
    Ok(())
}

/// Re-reads the directory when tls.crt changes (cert-manager renewals).
pub async fn watch_dir(
    dir: PathBuf,
    resolver: Arc<CertResolver>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let mut seen = mtime(&dir.join("tls.crt"));
    loop {
        tokio::select! {
            () = tokio::time::sleep(Duration::from_secs(30)) => {}
            _ = shutdown.changed() => return,
        }
        let now = mtime(&dir.join("tls.crt"));
        if now != seen {
            match load_dir(&dir, &resolver) {
                Ok(()) => {
                    tracing::info!(dir = %dir.display(), "serving certificate reloaded");
                    seen = now;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "reloading serving certificate; keeping the old one")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_webhooks_without_the_current_ca_are_patched() {
        let ca = "-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n";
        let current = [
            Some(ByteString(ca.as_bytes().to_vec())),
            None,
            Some(ByteString(b"stale".to_vec())),
        ];
        let ops = ca_bundle_ops(&current, ca);
        let paths: Vec<&str> = ops.iter().filter_map(|o| o["path"].as_str()).collect();
        assert_eq!(
            paths,
            [
                "/webhooks/1/clientConfig/caBundle",
                "/webhooks/2/clientConfig/caBundle"
            ]
        );
        assert!(ca_bundle_ops(&current[..1], ca).is_empty());
    }

    #[test]
    fn a_generated_bundle_serves_and_rotation_keeps_the_ca() {
        let sans = service_sans(
            "kubegrace-webhook",
            "kubegrace-system",
            &["127.0.0.1".into()],
        );
        let b = generate(&sans, None).expect("generate");
        certified_key(b.cert_pem.as_bytes(), b.key_pem.as_bytes()).expect("rustls accepts it");
        let again = generate(&sans, Some((&b.ca_pem, &b.ca_key_pem))).expect("re-issue");
        assert_eq!(again.ca_pem, b.ca_pem);
        assert_ne!(again.cert_pem, b.cert_pem);

        let fresh = bundle_secret("s", &b, &sans, None);
        let now = time::OffsetDateTime::now_utc();
        assert!(!needs_rotation(&fresh, &sans, now));
        assert!(
            needs_rotation(&fresh, &sans, now + time::Duration::days(340)),
            "30 days before expiry"
        );
        assert!(needs_rotation(&fresh, &sans[..1], now), "names changed");
    }
}
