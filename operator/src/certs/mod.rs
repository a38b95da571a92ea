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
//!
//! The parts: [`issue`] makes CAs and leaves, [`rotation`] decides and
//! takes each renewal and rotation step (pure), [`storage`] keeps the
//! bundle in its Secret, [`ca_bundle`] writes the caBundle into the webhook
//! configurations, and [`serving`] hands the certificate to the TLS server
//! (and reads it from `--cert-dir`).

use std::sync::Arc;
use std::time::Duration;

use kube::Client;

use crate::Result;

mod ca_bundle;
mod issue;
mod rotation;
mod serving;
mod storage;
#[cfg(test)]
mod testing;

pub use ca_bundle::{patch_ca_bundle, patch_validating_ca_bundle};
pub use issue::{issue_leaf, name_constraints, new_ca, service_sans};
pub use rotation::{Phase, Step, next_state, plan};
pub use serving::{CertResolver, certified_key, load_dir, watch_dir};
pub use storage::{Stored, ensure_secret};

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
