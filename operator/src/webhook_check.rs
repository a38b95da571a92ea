//! `kubegrace-operator webhook-check`: succeeds only once the injection
//! webhook answers through its Service, as the API server calls it.
//!
//! The Helm chart runs it as a post-install / post-upgrade hook Job (the
//! shape of cert-manager's `startupapicheck`), so `helm install --wait`
//! returns only when pods created next will be injected. Without it, with
//! `failurePolicy: Ignore`, the first pods of a fresh install could start
//! bare while kube-proxy was still programming the webhook Service.
//!
//! The probe is a server-side dry-run create (`dryRun=All`: nothing is
//! stored, but every admission webhook runs) of a pod carrying the
//! injection label and the [`keys::WEBHOOK_CHECK`] label, which only the
//! chart's `check.inject.kubegrace.io` entry selects. The pod names no
//! GraceRoute, so a webhook that answered marks it
//! [`keys::INJECT_SKIPPED`]; an unreachable webhook under `Ignore` leaves it
//! untouched, under `Fail` makes the create fail. Either way: retry, with a
//! bounded backoff, until the timeout.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    Capabilities, Container, Pod, PodSecurityContext, PodSpec, SeccompProfile, SecurityContext,
};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};

use crate::{Error, Result, keys};

/// The shortest and longest `--timeout` accepted.
pub const MIN_TIMEOUT: Duration = Duration::from_secs(1);
pub const MAX_TIMEOUT: Duration = Duration::from_secs(3600);
/// First wait between probes, doubled after each miss up to [`MAX_DELAY`].
pub const FIRST_DELAY: Duration = Duration::from_millis(500);
pub const MAX_DELAY: Duration = Duration::from_secs(5);

/// What one probe showed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The answer carries the webhook's edit.
    Answered,
    /// Admitted, but unchanged: the webhook was not reached (`Ignore`).
    Untouched,
}

/// The pod the probe dry-run creates in `namespace`. It passes the
/// restricted Pod Security Standard, which runs after the webhook and would
/// otherwise refuse it in a namespace that enforces it.
pub fn probe_pod(namespace: &str) -> Pod {
    let labels = BTreeMap::from([
        (keys::INJECT.to_string(), "enabled".to_string()),
        (keys::WEBHOOK_CHECK.to_string(), "true".to_string()),
    ]);
    Pod {
        metadata: ObjectMeta {
            generate_name: Some("kubegrace-webhook-check-".into()),
            namespace: Some(namespace.into()),
            labels: Some(labels),
            ..Default::default()
        },
        spec: Some(PodSpec {
            automount_service_account_token: Some(false),
            security_context: Some(PodSecurityContext {
                run_as_non_root: Some(true),
                run_as_user: Some(65532),
                seccomp_profile: Some(SeccompProfile {
                    type_: "RuntimeDefault".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            containers: vec![Container {
                name: "probe".into(),
                // Never pulled: a dry run schedules nothing.
                image: Some("kubegrace.invalid/webhook-check:never-pulled".into()),
                security_context: Some(SecurityContext {
                    allow_privilege_escalation: Some(false),
                    run_as_non_root: Some(true),
                    capabilities: Some(Capabilities {
                        drop: Some(vec!["ALL".into()]),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Whether the pod the API server returned was edited by the webhook:
/// injected (it is not expected to be, no route selects it) or marked
/// skipped.
pub fn verdict(answer: &Pod) -> Verdict {
    let marked =
        answer.metadata.annotations.as_ref().is_some_and(|a| {
            a.contains_key(keys::INJECT_SKIPPED) || a.contains_key(keys::INJECTED)
        });
    if marked || crate::inject::is_injected(answer) {
        Verdict::Answered
    } else {
        Verdict::Untouched
    }
}

/// The wait after a miss that followed a wait of `prev`: doubled, capped.
pub fn next_delay(prev: Duration) -> Duration {
    prev.saturating_mul(2).clamp(FIRST_DELAY, MAX_DELAY)
}

/// Refuses a timeout outside [`MIN_TIMEOUT`]..=[`MAX_TIMEOUT`].
pub fn checked_timeout(t: Duration) -> Result<Duration> {
    crate::cli::duration_within("--timeout", t, MIN_TIMEOUT, MAX_TIMEOUT)
}

/// One probe: the verdict, or why the create failed.
pub async fn probe(api: &Api<Pod>, pod: &Pod) -> std::result::Result<Verdict, String> {
    let params = PostParams {
        dry_run: true,
        field_manager: Some("kubegrace-webhook-check".into()),
    };
    match api.create(&params, pod).await {
        Ok(answer) => Ok(verdict(&answer)),
        Err(e) => Err(e.to_string()),
    }
}

/// Probes until the webhook answers (Ok, with the number of probes) or
/// `timeout` passes (Err, naming what the last probe saw).
pub async fn check(client: Client, namespace: &str, timeout: Duration) -> Result<u32> {
    let timeout = checked_timeout(timeout)?;
    let api: Api<Pod> = Api::namespaced(client, namespace);
    let pod = probe_pod(namespace);
    let deadline = tokio::time::Instant::now() + timeout;
    let mut delay = FIRST_DELAY;
    let mut probes: u32 = 0;
    loop {
        probes = probes.saturating_add(1);
        let last = match probe(&api, &pod).await {
            Ok(Verdict::Answered) => return Ok(probes),
            Ok(Verdict::Untouched) => format!(
                "a dry-run pod in {namespace} labelled {}=enabled was admitted without the webhook's mark: the API server did not reach the webhook (failurePolicy Ignore)",
                keys::INJECT
            ),
            Err(e) => format!("dry-run pod create in {namespace}: {e}"),
        };
        tracing::info!(probe = probes, %last, "webhook not answering yet");
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return Err(Error::Timeout(
                timeout,
                format!(
                    "the injection webhook never answered through its Service ({probes} probes); last: {last}"
                ),
            ));
        }
        tokio::time::sleep(delay.min(deadline - now)).await;
        delay = next_delay(delay);
    }
}

/// The subcommand's body: exit 0 when the webhook answered, 1 otherwise.
pub fn main(namespace: &str, timeout: Duration) -> std::process::ExitCode {
    crate::run::init_tracing(crate::cli::LogFormat::Text);
    let builder = tokio::runtime::Builder::new_current_thread();
    let runtime = match crate::run::runtime("kubegrace-operator webhook-check", builder) {
        Ok(r) => r,
        Err(code) => return code,
    };
    let outcome = runtime.block_on(async {
        let _ = rustls::crypto::ring::default_provider().install_default();
        check(crate::run::client().await?, namespace, timeout).await
    });
    match outcome {
        Ok(probes) => {
            println!(
                "kubegrace: the injection webhook answers through its Service ({probes} probes)"
            );
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("kubegrace-operator webhook-check: FAILED: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_asks_for_injection_and_carries_the_check_label() {
        let p = probe_pod("kubegrace-system");
        let labels = p.metadata.labels.as_ref().expect("labels");
        assert_eq!(
            labels.get(keys::INJECT).map(String::as_str),
            Some("enabled")
        );
        assert_eq!(
            labels.get(keys::WEBHOOK_CHECK).map(String::as_str),
            Some("true")
        );
        assert!(crate::inject::wants_injection(&p, &BTreeMap::new()));
        // Unchanged by the API server: not the webhook's answer.
        assert_eq!(verdict(&p), Verdict::Untouched);
    }

    #[test]
    fn the_webhooks_skip_mark_or_an_injection_counts_as_an_answer() {
        let p = probe_pod("ns");
        let skipped = crate::inject::mark_skipped(&p, &crate::inject::Skip("no route".into()));
        assert_eq!(verdict(&skipped), Verdict::Answered);
        let mut injected = p.clone();
        injected
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(keys::INJECTED.into(), "true".into());
        assert_eq!(verdict(&injected), Verdict::Answered);
        // Some other annotation (another webhook's) is not ours.
        let mut other = p;
        other
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert("example.com/x".into(), "y".into());
        assert_eq!(verdict(&other), Verdict::Untouched);
    }

    #[test]
    fn the_backoff_doubles_up_to_its_cap_and_never_overflows() {
        assert_eq!(next_delay(FIRST_DELAY), Duration::from_secs(1));
        assert_eq!(next_delay(Duration::from_secs(4)), MAX_DELAY);
        assert_eq!(next_delay(Duration::MAX), MAX_DELAY);
        assert_eq!(next_delay(Duration::ZERO), FIRST_DELAY);
    }

    #[test]
    fn the_timeout_is_bounded_at_both_ends() {
        crate::testing::assert_bounded(checked_timeout, MIN_TIMEOUT, MAX_TIMEOUT);
        assert!(checked_timeout(Duration::ZERO).is_err());
    }
}
