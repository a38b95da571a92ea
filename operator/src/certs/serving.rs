//! What the TLS server serves: the current certificate, handed to every
//! handshake, and the `--cert-dir` mode that reads it from files.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use crate::{Error, Result};

/// Hands the current certificate to every TLS handshake.
#[derive(Debug, Default)]
pub struct CertResolver {
    current: RwLock<Option<Arc<CertifiedKey>>>,
    /// The served leaf's notAfter, Unix seconds; 0 until one is loaded.
    not_after: AtomicI64,
}

impl CertResolver {
    pub fn set(&self, key: CertifiedKey) {
        let not_after = key
            .cert
            .first()
            .and_then(|der| x509_parser::parse_x509_certificate(der).ok())
            .map_or(0, |(_, cert)| cert.validity().not_after.timestamp());
        self.not_after.store(not_after, Ordering::Relaxed);
        let mut cur = self
            .current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *cur = Some(Arc::new(key));
    }
    /// When the served certificate expires (Unix seconds), once one is
    /// loaded.
    pub fn not_after(&self) -> Option<i64> {
        Some(self.not_after.load(Ordering::Relaxed)).filter(|t| *t > 0)
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
    let certs = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| Error::Cert(format!("reading certificate PEM: {e}")))?;
    if certs.is_empty() {
        return Err(Error::Cert("no certificate in PEM".into()));
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| match e {
        pem::Error::NoItemsFound => Error::Cert("no private key in PEM".into()),
        e => Error::Cert(format!("reading key PEM: {e}")),
    })?;
    let signer = rustls::crypto::ring::sign::any_supported_type(&key)
        .map_err(|e| Error::Cert(format!("unsupported key: {e}")))?;
    Ok(CertifiedKey::new(certs, signer))
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
    use super::certified_key;
    use crate::certs::{issue_leaf, new_ca};

    fn leaf() -> (String, String) {
        let sans = super::super::testing::sans();
        let now = time::OffsetDateTime::now_utc();
        let (ca, ca_key, ca_after) = new_ca(&sans, now).expect("ca");
        let (cert, key, _) = issue_leaf(&sans, &ca, &ca_key, ca_after, now).expect("leaf");
        (cert, key)
    }

    fn refusal(cert: &[u8], key: &[u8]) -> String {
        match certified_key(cert, key) {
            Ok(_) => panic!("accepted"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn reads_a_chain_and_its_key() {
        let (cert, key) = leaf();
        let served = certified_key(cert.as_bytes(), key.as_bytes()).expect("served");
        assert_eq!(served.cert.len(), 1);
    }

    #[test]
    fn names_what_is_missing_or_broken() {
        let (cert, key) = leaf();
        assert!(refusal(b"", key.as_bytes()).contains("no certificate in PEM"));
        assert!(refusal(cert.as_bytes(), b"").contains("no private key in PEM"));
        // A certificate where the key belongs: PEM, but no key in it.
        assert!(refusal(cert.as_bytes(), cert.as_bytes()).contains("no private key in PEM"));
        let torn = key.replace("-----END", "-----XXX");
        assert!(refusal(cert.as_bytes(), torn.as_bytes()).contains("reading key PEM"));
        let bad_base64 = cert.replacen('M', "*", 1);
        assert!(refusal(bad_base64.as_bytes(), key.as_bytes()).contains("reading certificate PEM"));
    }
}
