//! Leader election on a coordination.k8s.io Lease: only the leader runs the
//! controllers (two writers would fight over status and events); every
//! replica serves the webhook.
//!
//! The holder renews every `renew`; others take over once `renewTime +
//! leaseDurationSeconds` has passed. Updates carry the Lease's
//! resourceVersion, so two candidates can never both win a round.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};

use crate::{Error, Result};

pub struct LeaderElector {
    api: Api<Lease>,
    name: String,
    identity: String,
    duration: Duration,
    renew: Duration,
}

pub use kubegrace_api::lease::held_by_other;

impl LeaderElector {
    pub fn new(client: Client, namespace: &str, name: &str, identity: &str) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: name.into(),
            identity: identity.into(),
            duration: Duration::from_secs(15),
            renew: Duration::from_secs(5),
        }
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// One round: Ok(true) if we hold the lease afterwards.
    pub async fn try_acquire_or_renew(&self) -> Result<bool> {
        let now = jiff::Timestamp::now();
        let secs = i32::try_from(self.duration.as_secs()).unwrap_or(15);
        let current = self
            .api
            .get_opt(&self.name)
            .await
            .map_err(Error::kube(format!("reading Lease {}", self.name)))?;
        let Some(mut lease) = current else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    lease_duration_seconds: Some(secs),
                    acquire_time: Some(MicroTime(now)),
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(e) => Err(Error::kube(format!("creating Lease {}", self.name))(e)),
            };
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if held_by_other(spec, &self.identity, now) {
            return Ok(false);
        }
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            spec.holder_identity = Some(self.identity.clone());
            spec.acquire_time = Some(MicroTime(now));
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        spec.renew_time = Some(MicroTime(now));
        spec.lease_duration_seconds = Some(secs);
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(Error::kube(format!("renewing Lease {}", self.name))(e)),
        }
    }

    /// Waits until we lead.
    pub async fn acquire(&self) {
        loop {
            match self.try_acquire_or_renew().await {
                Ok(true) => return,
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, "leader election"),
            }
            tokio::time::sleep(self.renew).await;
        }
    }

    /// Renews until leadership is lost (someone else holds the lease, or
    /// renewals failed for nearly a lease duration); then returns.
    pub async fn hold(&self) {
        let mut last_ok = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(self.renew).await;
            match self.try_acquire_or_renew().await {
                Ok(true) => last_ok = tokio::time::Instant::now(),
                Ok(false) => return,
                Err(e) => {
                    tracing::warn!(error = %e, "renewing leadership");
                    // Another replica may take over once our lease runs out:
                    // stop leading a little before that.
                    if last_ok.elapsed() + self.renew >= self.duration {
                        return;
                    }
                }
            }
        }
    }

    /// Gives the lease up so a successor need not wait for it to expire.
    pub async fn release(&self) {
        let Ok(Some(mut lease)) = self.api.get_opt(&self.name).await else {
            return;
        };
        let Some(spec) = lease.spec.as_mut() else {
            return;
        };
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return;
        }
        spec.holder_identity = None;
        if let Err(e) = self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            tracing::debug!(error = %e, "releasing lease");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use serde_json::json;

    use crate::testing::{answer_with, mock, no_more, reply, scripted};

    fn elector() -> (LeaderElector, crate::testing::Handle) {
        let (client, handle) = mock();
        (LeaderElector::new(client, "ops", "lease", "me"), handle)
    }

    const PATH: &str = "/apis/coordination.k8s.io/v1/namespaces/ops/leases/lease";

    /// The API call sequence, scripted: a missing call or an extra one
    /// fails the test.
    #[tokio::test]
    async fn a_missing_lease_is_created_with_us_as_holder() {
        let (elector, mut api) = elector();
        let script = async move {
            let not_found = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": "not found"});
            let seen = answer_with(&mut api, 404, &not_found).await;
            assert_eq!(seen.call(), ("GET", PATH));
            let seen = reply(&mut api, 200, |_, body| body.clone()).await;
            assert_eq!(seen.method, "POST");
            let lease: Lease = serde_json::from_value(seen.body).expect("a Lease");
            let spec = lease.spec.expect("spec");
            assert_eq!(spec.holder_identity.as_deref(), Some("me"));
            assert_eq!(spec.lease_duration_seconds, Some(15));
        };
        let won = scripted(script, elector.try_acquire_or_renew())
            .await
            .expect("no error");
        assert!(won);
    }

    #[tokio::test]
    async fn a_lease_held_by_another_live_replica_is_left_alone() {
        let (elector, mut api) = elector();
        let script = async move {
            let now = jiff::Timestamp::now();
            let held = json!({
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": "lease", "namespace": "ops", "resourceVersion": "7"},
                "spec": {"holderIdentity": "other", "leaseDurationSeconds": 15, "renewTime": MicroTime(now)},
            });
            answer_with(&mut api, 200, &held).await;
            // No write may follow.
            no_more(&mut api).await;
        };
        let won = scripted(script, elector.try_acquire_or_renew())
            .await
            .expect("no error");
        assert!(!won);
    }
}
