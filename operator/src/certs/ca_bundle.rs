//! The caBundle of the webhook configurations: every webhook that does
//! not carry the current bundle gets it, in one JSON patch.

use base64::Engine as _;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};

use crate::{Error, Result};

/// Writes the CA into every webhook of the MutatingWebhookConfiguration
/// that lacks it. Returns false if the configuration does not exist (yet).
pub async fn patch_ca_bundle(client: &Client, config: &str, ca_pem: &str) -> Result<bool> {
    patch_ca_bundle_of::<MutatingWebhookConfiguration>(client, config, ca_pem).await
}

/// The same for the GraceRoute ValidatingWebhookConfiguration.
pub async fn patch_validating_ca_bundle(
    client: &Client,
    config: &str,
    ca_pem: &str,
) -> Result<bool> {
    patch_ca_bundle_of::<ValidatingWebhookConfiguration>(client, config, ca_pem).await
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

/// A webhook configuration: a list of webhooks, each with a caBundle.
/// The mutating and the validating kinds are two types of the same shape.
trait CaBundles {
    /// Each webhook's caBundle, in order.
    fn ca_bundles(&self) -> Vec<Option<ByteString>>;
}

macro_rules! ca_bundles_of_webhooks {
    ($($kind:ty),*) => {$(
        impl CaBundles for $kind {
            fn ca_bundles(&self) -> Vec<Option<ByteString>> {
                self.webhooks
                    .iter()
                    .flatten()
                    .map(|w| w.client_config.ca_bundle.clone())
                    .collect()
            }
        }
    )*};
}

ca_bundles_of_webhooks!(MutatingWebhookConfiguration, ValidatingWebhookConfiguration);

async fn patch_ca_bundle_of<K>(client: &Client, config: &str, ca_pem: &str) -> Result<bool>
where
    K: kube::Resource<Scope = kube::core::ClusterResourceScope, DynamicType = ()>
        + CaBundles
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
    let ops = ca_bundle_ops(&current.ca_bundles(), ca_pem);
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
}
