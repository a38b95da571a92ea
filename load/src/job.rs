//! The load as a Kubernetes Job: `kubegrace-loadgen` in a pod of the workload's namespace,
//! sending to the Service's ClusterIP (the path a client pod's traffic takes), stopped
//! through the API server's pod proxy, its [`Summary`] read from the last JSON line of its
//! log. The e2e scenario and `kubectl kubegrace verify` both run their load this way;
//! each waits with its own patience around the probes here.

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::LogParams;
use kube::{Api, Client};
use serde_json::json;

use super::{Config, Error, Summary};

/// The loadgen's control port in its Job (`GET /ready`, `POST /stop`).
pub const CONTROL_PORT: u16 = 9000;
/// The loadgen's container name (its log holds the summary).
pub const CONTAINER: &str = "loadgen";

/// The Job `name` that sends `cfg`'s load from `image`, labelled `loadgen-for=<target>`.
/// It ends by itself even if nobody stops it: the schedule is bounded (rate x duration,
/// `max_requests`) and `activeDeadlineSeconds` bounds the pod's life.
pub fn manifest(name: &str, target: &str, image: &str, cfg: &Config) -> Result<Job, Error> {
    let deadline_s = cfg.duration.as_secs() + cfg.timeout.as_secs() + 120;
    let labels = BTreeMap::from([("app", "loadgen"), ("loadgen-for", target)]);
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": deadline_s,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": false,
                    "terminationGracePeriodSeconds": cfg.timeout.as_secs() + 5,
                    "containers": [{
                        "name": CONTAINER,
                        "image": image,
                        "imagePullPolicy": "IfNotPresent",
                        "args": args(cfg),
                        "ports": [{"name": "control", "containerPort": CONTROL_PORT}],
                        "readinessProbe": {"httpGet": {"path": "/ready", "port": "control"}, "periodSeconds": 1},
                        "resources": {"requests": {"cpu": "50m", "memory": "32Mi"}},
                        "securityContext": {"allowPrivilegeEscalation": false, "runAsNonRoot": true,
                                            "capabilities": {"drop": ["ALL"]},
                                            "seccompProfile": {"type": "RuntimeDefault"}},
                    }],
                },
            },
        },
    }))?)
}

/// `kubegrace-loadgen`'s command line for `cfg`, with the control port open.
pub fn args(cfg: &Config) -> Vec<String> {
    vec![
        format!("--target={}", cfg.target),
        format!("--protocol={}", cfg.protocol.as_str()),
        format!("--rate={}", cfg.rate),
        format!("--duration={}s", cfg.duration.as_secs()),
        format!("--max-requests={}", cfg.max_requests),
        format!("--connections={}", cfg.connections),
        format!("--path={}", cfg.path),
        format!("--timeout={}ms", cfg.timeout.as_millis()),
        format!("--control=0.0.0.0:{CONTROL_PORT}"),
    ]
}

/// The label selector of the Job's pod.
pub fn pod_selector(job: &str) -> String {
    format!("job-name={job}")
}

/// Whether the Job's pod (the first of `pods`) sends: `Ok(name)` once it is ready, an
/// `Err` saying what is missing otherwise. A pod that already ended is an `Err` too, one
/// no wait will cure, so its text says so.
pub fn sending(pods: &[Pod]) -> Result<String, String> {
    let Some(pod) = pods.first() else {
        return Err("no pod yet".to_owned());
    };
    let phase = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default();
    if phase == "Failed" || phase == "Succeeded" {
        return Err(format!("pod ended early ({phase})"));
    }
    let ready = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    match (ready, pod.metadata.name.clone()) {
        (true, Some(n)) => Ok(n),
        _ => Err(format!("pod {phase}, not ready")),
    }
}

/// `POST /stop` on the loadgen's control port through the API server's pod proxy, which
/// reaches pods wherever the API server does (kind too): it stops sending and lets the
/// requests in flight finish, then prints its summary and exits.
pub async fn stop(client: &Client, namespace: &str, pod: &str) -> Result<(), String> {
    let url = format!("/api/v1/namespaces/{namespace}/pods/{pod}:{CONTROL_PORT}/proxy/stop");
    let req = http::Request::post(url.as_str())
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
    client
        .request_text(req)
        .await
        .map(drop)
        .map_err(|e| e.to_string())
}

/// `Ok(phase)` once the pod ended (`Succeeded` or `Failed`).
pub fn finished(pod: &Pod) -> Result<String, String> {
    match pod.status.as_ref().and_then(|s| s.phase.as_deref()) {
        Some(ph @ ("Succeeded" | "Failed")) => Ok(ph.to_owned()),
        other => Err(format!("phase {}", other.unwrap_or("-"))),
    }
}

/// The summary of a loadgen pod that ended in `phase`: the last JSON line of its log.
pub async fn summary(
    client: &Client,
    namespace: &str,
    pod: &str,
    phase: &str,
) -> Result<Summary, Error> {
    let log = Api::<Pod>::namespaced(client.clone(), namespace)
        .logs(
            pod,
            &LogParams {
                container: Some(CONTAINER.into()),
                ..LogParams::default()
            },
        )
        .await
        .map_err(|source| Error::Kube {
            context: format!("reading the log of {pod}"),
            source,
        })?;
    if phase != "Succeeded" {
        return Err(Error::Job(format!(
            "loadgen pod {pod} {phase}; its log:\n{log}"
        )));
    }
    summary_from_log(&log).map_err(|e| Error::Job(format!("{pod}: {e}")))
}

/// The last line of a loadgen log that starts with `{`, parsed (the log mixes stderr in).
pub fn summary_from_log(log: &str) -> Result<Summary, String> {
    let line = log
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .ok_or_else(|| format!("no JSON summary in the log:\n{log}"))?;
    serde_json::from_str(line).map_err(|e| format!("parsing the summary in the log: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(yaml: &str) -> Pod {
        serde_json::from_value(serde_json::from_str::<serde_json::Value>(yaml).expect("json"))
            .expect("pod")
    }

    #[test]
    fn the_job_carries_the_whole_load_and_a_deadline() {
        let cfg = Config {
            target: "http://10.0.0.9:80".into(),
            rate: 50.0,
            duration: std::time::Duration::from_secs(60),
            max_requests: 3000,
            ..Config::default()
        };
        let job = manifest("loadgen-web-1", "web", "img:1", &cfg).expect("job");
        let spec = job.spec.expect("spec");
        assert_eq!(spec.active_deadline_seconds, Some(60 + 5 + 120));
        assert_eq!(spec.backoff_limit, Some(0));
        let c = &spec.template.spec.expect("pod spec").containers[0];
        let args = c.args.clone().unwrap_or_default();
        assert!(args.contains(&"--target=http://10.0.0.9:80".to_owned()));
        assert!(args.contains(&"--max-requests=3000".to_owned()));
        assert!(args.contains(&format!("--control=0.0.0.0:{CONTROL_PORT}")));
    }

    #[test]
    fn a_pod_sends_once_ready_and_an_ended_one_never_will() {
        assert!(sending(&[]).is_err());
        let ready = pod(
            r#"{"metadata":{"name":"p"},"status":{"phase":"Running","conditions":[{"type":"Ready","status":"True"}]}}"#,
        );
        assert_eq!(sending(&[ready]), Ok("p".to_owned()));
        let pending = pod(r#"{"metadata":{"name":"p"},"status":{"phase":"Pending"}}"#);
        assert_eq!(
            sending(&[pending]),
            Err("pod Pending, not ready".to_owned())
        );
        let failed = pod(r#"{"metadata":{"name":"p"},"status":{"phase":"Failed"}}"#);
        assert!(
            sending(&[failed])
                .expect_err("ended")
                .contains("ended early")
        );
    }

    #[test]
    fn the_summary_is_the_last_json_line() {
        let log = "starting\n{\"not\": \"it\"}\nwarning: x\n";
        assert!(summary_from_log(log).is_err());
        assert!(summary_from_log("no json at all").is_err());
    }
}
