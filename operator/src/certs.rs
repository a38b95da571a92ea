//! The webhook's serving certificate.
//!
//! Self-managed (default): a CA and a leaf for `<svc>.<ns>.svc` generated
//! with rcgen, stored in a Secret so every replica serves the same one,
//! the caBundle patched into the MutatingWebhookConfiguration (pods) and
//! the ValidatingWebhookConfiguration (GraceRoutes).
//!
//! - The CA carries a name constraint: it may sign only for the webhook
//!   Service's DNS names (and `--webhook-extra-san`s), and only leaves
//!   (pathLen 0). Its key sits in the Secret; if that leaks, it still cannot
//!   vouch for any other host.
//! - Lifetimes: the leaf lives [`LEAF_DAYS`] (90) and is re-issued
//!   [`LEAF_RENEW_BEFORE_DAYS`] (30) before expiry; the CA lives
//!   [`CA_DAYS`] (365) and is rotated from [`CA_RENEW_BEFORE_DAYS`] (60)
//!   before expiry.
//! - A CA rotation never drops an admission: the new CA joins the caBundle
//!   first, the leaf switches to it only [`OVERLAP`] later, and the old CA
//!   leaves the bundle another [`OVERLAP`] after that (see [`Phase`]).
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
    BasicConstraints, CertificateParams, CidrSubnet, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, GeneralSubtree, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    NameConstraints,
};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use crate::{Error, Result};

const NOT_AFTER: &str = "kubegrace.io/not-after";
const CA_NOT_AFTER: &str = "kubegrace.io/ca-not-after";
const SANS: &str = "kubegrace.io/sans";
/// Where a CA rotation stands ([`Phase`]) and since when (unix seconds).
const PHASE: &str = "kubegrace.io/ca-phase";
const PHASE_SINCE: &str = "kubegrace.io/ca-phase-since";
/// Serving certificate: 90 days, re-issued 30 days before expiry (and never
/// past its CA's expiry).
pub const LEAF_DAYS: i64 = 90;
pub const LEAF_RENEW_BEFORE_DAYS: i64 = 30;
/// CA: one year; its successor is introduced 60 days before expiry, long
/// before any leaf it signed could outlive it.
pub const CA_DAYS: i64 = 365;
pub const CA_RENEW_BEFORE_DAYS: i64 = 60;
/// How long each step of a CA rotation lasts: longer than the API servers
/// take to see a caBundle change (seconds) and than two refresh rounds of
/// every replica ([`REFRESH`]), so no replica serves a leaf its callers do
/// not trust yet, or any more.
pub const OVERLAP: Duration = Duration::from_secs(2 * 3600);
/// Steady-state period of the certificate round (every replica).
pub const REFRESH: Duration = Duration::from_secs(30 * 60);

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

fn data_str(secret: &Secret, key: &str) -> Option<String> {
    secret
        .data
        .as_ref()?
        .get(key)
        .and_then(|b| String::from_utf8(b.0.clone()).ok())
}

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
    fn as_str(self) -> &'static str {
        match self {
            Self::Steady => "steady",
            Self::Introduced => "introduced",
            Self::Switched => "switched",
        }
    }
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
            next_ca_not_after: num("kubegrace.io/next-ca-not-after").unwrap_or(0),
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

fn bundle_secret(name: &str, b: &Stored, resource_version: Option<String>) -> Secret {
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
                    "kubegrace.io/next-ca-not-after".to_string(),
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
        let (bundle, cert, key) =
            ensure_secret(&self.client, &self.namespace, &self.secret, &self.sans).await?;
        self.resolver
            .set(certified_key(cert.as_bytes(), key.as_bytes())?);
        let mutating = patch_ca_bundle(&self.client, &self.webhook_config, &bundle).await?;
        let validating = match &self.validating_webhook_config {
            Some(name) => patch_validating_ca_bundle(&self.client, name, &bundle).await?,
            None => true,
        };
        Ok(mutating && validating)
    }

    /// Rounds until shutdown: every [`REFRESH`] once the caBundle is in
    /// place (renewal and rotation steps are taken then), every 10s until
    /// it is.
    pub async fn maintain(self, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        loop {
            let wait = match self.round().await {
                Ok(true) => REFRESH,
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

    fn sans() -> Vec<String> {
        service_sans(
            "kubegrace-webhook",
            "kubegrace-system",
            &["127.0.0.1".into()],
        )
    }

    fn der(pem: &str) -> Vec<u8> {
        rustls_pemfile::certs(&mut pem.as_bytes())
            .next()
            .expect("a certificate")
            .expect("PEM")
            .to_vec()
    }

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

    fn at(days: i64, secs: i64) -> time::OffsetDateTime {
        time::OffsetDateTime::now_utc() + time::Duration::days(days) + time::Duration::seconds(secs)
    }

    /// Walks a whole CA rotation with a synthetic clock; at every step the
    /// bundle trusts the CA of the leaf being served and of the leaf served
    /// a step before (what replicas that have not re-read the Secret still
    /// serve).
    #[test]
    fn a_ca_rotation_overlaps_old_and_new_in_the_bundle() {
        let sans = sans();
        let t0 = at(0, 0);
        assert_eq!(plan(None, &sans, t0), Step::Create);
        let s0 = next_state(None, Step::Create, &sans, t0)
            .expect("create")
            .expect("state");
        assert_eq!(plan(Some(&s0), &sans, t0), Step::Keep);
        // Leaf renewal at 60 days (30 left), same CA, bundle unchanged.
        let t1 = at(61, 0);
        assert_eq!(plan(Some(&s0), &sans, t1), Step::ReissueLeaf);
        let s1 = next_state(Some(&s0), Step::ReissueLeaf, &sans, t1)
            .expect("reissue")
            .expect("state");
        assert_eq!(s1.bundle_pem, s0.bundle_pem);
        assert_ne!(s1.cert_pem, s0.cert_pem);
        // (Renewals every 60 days meanwhile; the last before the rotation.)
        let s1 = next_state(Some(&s1), Step::ReissueLeaf, &sans, at(CA_DAYS - 62, 0))
            .expect("reissue")
            .expect("state");
        // 60 days before the CA expires: the next CA joins the bundle.
        let t2 = at(CA_DAYS - 59, 0);
        assert_eq!(plan(Some(&s1), &sans, t2), Step::Introduce);
        let s2 = next_state(Some(&s1), Step::Introduce, &sans, t2)
            .expect("introduce")
            .expect("state");
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
        let s3 = next_state(Some(&s2), Step::Switch, &sans, t3)
            .expect("switch")
            .expect("state");
        assert_eq!(s3.ca_pem, next_ca);
        assert!(s3.bundle_pem.contains(&s1.ca_pem) && s3.bundle_pem.contains(&next_ca));
        assert!(s3.next.is_none());
        // After another overlap: the old CA leaves the bundle.
        let t4 = t3 + time::Duration::seconds(OVERLAP.as_secs() as i64);
        assert_eq!(plan(Some(&s3), &sans, t4), Step::Settle);
        let s4 = next_state(Some(&s3), Step::Settle, &sans, t4)
            .expect("settle")
            .expect("state");
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

    /// A Secret written before rotation existed (10-year CA, no constraint,
    /// no bundle key) is migrated through the overlap, not swapped at once.
    #[test]
    fn a_legacy_secret_is_rotated_with_overlap() {
        let sans = sans();
        let t0 = at(0, 0);
        let s0 = next_state(None, Step::Create, &sans, t0)
            .expect("create")
            .expect("state");
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
