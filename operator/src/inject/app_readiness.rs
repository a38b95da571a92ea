//! The app's readiness probe, moved into the sidecar's `/ready` when the
//! sidecar can run it (see [`take_http_readiness`]).

use k8s_openapi::api::core::v1::Container;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kubegrace_sidecar_api::config::{AppReadiness, ProbeHeader};

use crate::keys;
pub use crate::keys::{APP_READINESS_IN_SIDECAR, APP_READINESS_ON_APP};

pub(super) fn keeps_own_readiness(meta: &ObjectMeta) -> bool {
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(keys::APP_READINESS))
        .is_some_and(|v| v == APP_READINESS_ON_APP)
}

/// Takes the app's readiness probe off the app container when the sidecar
/// can run it: a plain-HTTP `httpGet` on the pod's own address whose port
/// is a number or one of the container's named ports. Any other probe
/// (exec, tcpSocket, grpc, HTTPS, another host) stays where it is: the pod
/// then waits for both probes, as before.
///
/// Why: the kubelet runs each container's readiness probe on its own
/// ticker, so a pod with the app's probe and the sidecar's is Ready only
/// after the later of the two; measured on the local cluster, that and the
/// sidecar's extra start made a rolling update up to 2x slower than the
/// same Deployment without kubegrace. One probe, answered by the sidecar as
/// soon as the app passes its check, removes the second wait.
pub(super) fn take_http_readiness(app: &mut Container) -> Option<AppReadiness> {
    let probe = app.readiness_probe.as_ref()?;
    let get = probe.http_get.as_ref()?;
    if probe.exec.is_some() || probe.tcp_socket.is_some() || probe.grpc.is_some() {
        return None;
    }
    let plain_http = get
        .scheme
        .as_deref()
        .is_none_or(|s| s.eq_ignore_ascii_case("HTTP"));
    if !plain_http || get.host.as_deref().is_some_and(|h| !h.is_empty()) {
        return None;
    }
    let port = match &get.port {
        IntOrString::Int(n) => *n,
        IntOrString::String(name) => {
            app.ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(name.as_str()))?
                .container_port
        }
    };
    let positive = |v: Option<i32>, default: u32| {
        v.and_then(|v| u32::try_from(v).ok())
            .filter(|v| *v > 0)
            .unwrap_or(default)
    };
    let moved = AppReadiness {
        port: u16::try_from(port).ok().filter(|p| *p > 0)?,
        path: get
            .path
            .clone()
            .filter(|p| p.starts_with('/'))
            .unwrap_or_else(|| "/".into()),
        headers: get
            .http_headers
            .iter()
            .flatten()
            .map(|h| ProbeHeader {
                name: h.name.clone(),
                value: h.value.clone(),
            })
            .collect(),
        period_seconds: positive(probe.period_seconds, 10),
        timeout_seconds: positive(probe.timeout_seconds, 1),
        success_threshold: positive(probe.success_threshold, 1),
        failure_threshold: positive(probe.failure_threshold, 3),
        initial_delay_seconds: probe
            .initial_delay_seconds
            .and_then(|v| u32::try_from(v).ok())
            .unwrap_or(0),
    };
    // What the sidecar would refuse (a header with a line break) stays on the app.
    moved.validate("appReadiness").ok()?;
    app.readiness_probe = None;
    Some(moved)
}

#[cfg(test)]
mod tests {
    use super::super::tests::{injected, native_sidecar};
    use super::*;
    use kubegrace_sidecar_api::cli::env;

    const PROBE: &str = "{httpGet: {path: /healthz, port: http}}";

    fn moved_check(sidecar: &Container) -> Option<&str> {
        sidecar
            .env
            .iter()
            .flatten()
            .find(|e| e.name == env::APP_READINESS)
            .and_then(|e| e.value.as_deref())
    }

    #[test]
    fn probes_the_sidecar_cannot_run_stay_on_the_app_and_follow_the_rename() {
        for probe in [
            "{exec: {command: [ready]}}",
            "{httpGet: {path: /healthz, port: http, scheme: HTTPS}}",
            "{httpGet: {path: /healthz, port: http, host: 10.0.0.1}}",
            "{tcpSocket: {port: http}}",
        ] {
            let out = injected(PROBE, probe, true);
            let app = &out.spec.as_ref().expect("spec").containers[0];
            let kept = app.readiness_probe.as_ref().expect("kept on the app");
            let port = kept
                .http_get
                .as_ref()
                .map(|h| &h.port)
                .or(kept.tcp_socket.as_ref().map(|t| &t.port));
            if let Some(port) = port {
                assert_eq!(port, &IntOrString::String("kg-http".into()), "{probe}");
            }
            assert_eq!(moved_check(native_sidecar(&out)), None, "{probe}");
        }
    }

    #[test]
    fn the_app_readiness_annotation_keeps_the_probe_on_the_app() {
        let out = injected(
            "annotations: {kubegrace.io/inject: enabled}",
            "annotations: {kubegrace.io/inject: enabled, kubegrace.io/app-readiness: app}",
            false,
        );
        let app = &out.spec.as_ref().expect("spec").containers[0];
        assert!(app.readiness_probe.is_some());
    }

    #[test]
    fn a_moved_probe_keeps_its_numbers_headers_and_numeric_port() {
        let out = injected(
            PROBE,
            "{httpGet: {path: /ready?full=1, port: 9090, httpHeaders: [{name: X-Probe, value: k}]}, periodSeconds: 5, timeoutSeconds: 3, successThreshold: 2, failureThreshold: 4, initialDelaySeconds: 7}",
            true,
        );
        let sc = native_sidecar(&out);
        let json = moved_check(sc).expect("env");
        let moved: AppReadiness = serde_json::from_str(json).expect("json");
        assert_eq!(
            moved,
            AppReadiness {
                port: 9090,
                path: "/ready?full=1".into(),
                headers: vec![ProbeHeader {
                    name: "X-Probe".into(),
                    value: "k".into()
                }],
                period_seconds: 5,
                timeout_seconds: 3,
                success_threshold: 2,
                failure_threshold: 4,
                initial_delay_seconds: 7,
            }
        );
        assert_eq!(
            sc.readiness_probe.as_ref().and_then(|p| p.timeout_seconds),
            Some(4)
        );
    }
}
