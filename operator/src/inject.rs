//! Pod mutation, pure: a Pod and an [`InjectPlan`] in, the injected Pod out.
//! The webhook turns the difference into a JSON patch.
//!
//! Port takeover: the sidecar gets the port *name* the Service targets
//! (`targetPort: http`) on a new number (15081 and up); the app keeps its
//! port *number* under a new name (`kg-http`). So a Service that targets
//! the port by name goes through the sidecar, the app keeps listening where
//! it always did (nothing to change in the app), and the sidecar forwards
//! to it on 127.0.0.1. A Service that targets the port by number bypasses
//! the sidecar: name the port in the Service (the route reports such
//! Services as `ServiceBypassesSidecar`).
//!
//! Ports of our own (admin, listener) are chosen per pod against every
//! container port of the pod, from defaults outside the ranges meshes use
//! (Istio 15000-15090, Linkerd 4140-4191), so a meshed pod or an app that
//! listens on one of our defaults still gets the sidecar.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMapVolumeSource, Container, ContainerPort, EnvVar, EnvVarSource,
    HTTPGetAction, HTTPHeader, Lifecycle, LifecycleHandler, ObjectFieldSelector, Pod, PodSpec,
    Probe, ResourceRequirements, SeccompProfile, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use kubegrace_sidecar_api::cli::{env, flag};
use kubegrace_sidecar_api::{admin, pod};

use crate::keys;

/// The sidecar image's user (distroless nonroot); set explicitly so
/// `runAsNonRoot` holds whatever the image says.
pub const SIDECAR_UID: i64 = 65532;

/// Everything the webhook decided for one pod.
#[derive(Debug, Clone)]
pub struct InjectPlan {
    pub route: String,
    pub config_map: String,
    /// The pod port name the sidecar takes over.
    pub port: String,
    pub image: String,
    pub pull_policy: String,
    pub resources: ResourceRequirements,
    /// Native sidecar (init container, restartPolicy Always): Kubernetes >= 1.29.
    pub native: bool,
    pub token: String,
    /// The route's time budget; the pod's grace period is raised to it.
    pub budget_seconds: Option<i64>,
    pub ports: Ports,
}

/// Why a pod that asked for the sidecar did not get it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skip(pub String);

/// Where the sidecar's own ports go: chart values (operator flags), and a
/// pod annotation ([`keys::ADMIN_PORT`]) for the admin port of one pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ports {
    /// Admin port tried first; the next free one above it otherwise.
    pub admin: u16,
    /// Listener port tried first; the next free one above it otherwise.
    pub first_listen: u16,
}

impl Default for Ports {
    fn default() -> Self {
        Self {
            admin: admin::DEFAULT_PORT,
            first_listen: pod::FIRST_LISTEN_PORT,
        }
    }
}

/// Every container port of the pod, init containers included.
fn used_ports(spec: &PodSpec) -> BTreeSet<i32> {
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .flat_map(|c| c.ports.iter().flatten())
        .map(|p| p.container_port)
        .collect()
}

fn first_free(from: u16, used: &BTreeSet<i32>, also_not: Option<u16>) -> Option<u16> {
    (from..u16::MAX).find(|p| !used.contains(&i32::from(*p)) && Some(*p) != also_not)
}

impl Ports {
    /// The admin port for this pod: the pod's [`keys::ADMIN_PORT`]
    /// annotation if it has one (refused when a container uses it: the
    /// person who set it has to pick another), else the first port from
    /// [`Ports::admin`] up that no container of the pod uses.
    pub fn admin_port(&self, spec: &PodSpec, meta: Option<&ObjectMeta>) -> Result<u16, Skip> {
        let used = used_ports(spec);
        let wanted = meta
            .and_then(|m| m.annotations.as_ref())
            .and_then(|a| a.get(keys::ADMIN_PORT));
        if let Some(v) = wanted {
            let port: u16 = v.trim().parse().ok().filter(|p| *p > 0).ok_or_else(|| {
                Skip(format!(
                    "annotation {}={v:?} is not a port number (1-65535); fix or remove it",
                    keys::ADMIN_PORT
                ))
            })?;
            if used.contains(&i32::from(port)) {
                return Err(Skip(format!(
                    "annotation {}={port} names a port a container of the pod already uses; pick a free one or remove the annotation (the sidecar then picks one from {} up)",
                    keys::ADMIN_PORT,
                    self.admin
                )));
            }
            return Ok(port);
        }
        first_free(self.admin, &used, None).ok_or_else(|| {
            Skip(format!(
                "no free port from {} up for the admin port",
                self.admin
            ))
        })
    }

    /// The first free port from [`Ports::first_listen`] up that no container
    /// of the pod uses and that is not the admin port.
    pub fn listen_port(&self, spec: &PodSpec, admin: u16) -> u16 {
        first_free(self.first_listen, &used_ports(spec), Some(admin)).unwrap_or(self.first_listen)
    }
}

/// The admin port of an injected pod: the sidecar's [`admin::PORT_NAME`]
/// port (what the webhook chose for this pod), for callers of its admin API.
pub fn admin_port_of(pod: &Pod) -> Option<u16> {
    let spec = pod.spec.as_ref()?;
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .filter(|c| c.name == pod::CONTAINER)
        .flat_map(|c| c.ports.iter().flatten())
        .find(|p| p.name.as_deref() == Some(admin::PORT_NAME))
        .and_then(|p| u16::try_from(p.container_port).ok())
}

/// A new name for the app's port: `kg-<name>`, within the 15 characters a
/// port name may have, not taken by another port of the pod.
pub fn app_port_name(name: &str, taken: &BTreeSet<String>) -> String {
    let base: String = format!("kg-{name}").chars().take(15).collect();
    let base = base.trim_end_matches('-').to_string();
    if !taken.contains(&base) {
        return base;
    }
    (0..100)
        .map(|i| {
            let suffix = format!("-{i}");
            let stem: String = base.chars().take(15 - suffix.len()).collect();
            format!("{}{suffix}", stem.trim_end_matches('-'))
        })
        .find(|n| !taken.contains(n))
        .unwrap_or(base)
}

fn annotations(pod: &Pod) -> Option<&BTreeMap<String, String>> {
    pod.metadata.annotations.as_ref()
}

/// Already injected (by us, earlier: the webhook may be called twice with
/// reinvocationPolicy, or a pod may be re-submitted).
pub fn is_injected(pod: &Pod) -> bool {
    annotations(pod).is_some_and(|a| a.contains_key(keys::INJECTED))
        || pod.spec.as_ref().is_some_and(|s| {
            s.containers
                .iter()
                .chain(s.init_containers.iter().flatten())
                .any(|c| c.name == pod::CONTAINER)
        })
}

/// Whether a pod asks for the sidecar: its own label or annotation wins
/// (`disabled` opts out of a labelled namespace), else the namespace label.
/// The label is what the webhook configuration's objectSelector sees; the
/// operator copies a workload's annotation into both.
pub fn wants_injection(pod: &Pod, namespace_labels: &BTreeMap<String, String>) -> bool {
    let label = pod
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(keys::INJECT))
        .map(String::as_str);
    let annotation = annotations(pod)
        .and_then(|a| a.get(keys::INJECT))
        .map(String::as_str);
    if label == Some("disabled") || annotation == Some("disabled") {
        return false;
    }
    if label == Some("enabled") || annotation == Some("enabled") {
        return true;
    }
    namespace_labels
        .get(keys::INJECT)
        .is_some_and(|v| v == "enabled")
}

fn http_get(path: &str, port: i32, token: Option<&str>) -> HTTPGetAction {
    HTTPGetAction {
        path: Some(path.into()),
        port: IntOrString::Int(port),
        scheme: Some("HTTP".into()),
        http_headers: token.map(|t| {
            vec![HTTPHeader {
                name: admin::TOKEN_HEADER.into(),
                value: t.into(),
            }]
        }),
        host: None,
    }
}

fn drain_hook(token: &str, admin: u16) -> Lifecycle {
    Lifecycle {
        pre_stop: Some(LifecycleHandler {
            http_get: Some(http_get(
                admin::path::DRAIN_WAIT,
                i32::from(admin),
                Some(token),
            )),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn field_env(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Rewrites probe ports that name `old` to `new` (a named port resolves in
/// the probe's own container, and the app's port was renamed).
fn rename_probe_port(probe: &mut Option<Probe>, old: &str, new: &str) {
    let Some(p) = probe else { return };
    let named = |port: &mut IntOrString| {
        if matches!(port, IntOrString::String(s) if s == old) {
            *port = IntOrString::String(new.into());
        }
    };
    if let Some(h) = p.http_get.as_mut() {
        named(&mut h.port);
    }
    if let Some(t) = p.tcp_socket.as_mut() {
        named(&mut t.port);
    }
}

/// The sidecar container for this pod.
fn sidecar(plan: &InjectPlan, listen: u16, admin: u16, upstream: i32) -> Container {
    Container {
        name: pod::CONTAINER.into(),
        image: Some(plan.image.clone()),
        image_pull_policy: Some(plan.pull_policy.clone()),
        // Flags win over the file, so pod-specific addresses live here and
        // the route's ConfigMap stays the same for every pod.
        args: Some(vec![
            flag::CONFIG.into(),
            pod::config_path(),
            flag::LISTEN.into(),
            format!("0.0.0.0:{listen}"),
            flag::UPSTREAM.into(),
            format!("127.0.0.1:{upstream}"),
            // Explicit, with the token below: the kubelet's probes and the
            // app's preStop reach it on the pod IP, whatever the sidecar's
            // built-in default is.
            flag::ADMIN.into(),
            format!("0.0.0.0:{admin}"),
        ]),
        env: Some(vec![
            EnvVar {
                name: env::DRAIN_TOKEN.into(),
                value: Some(plan.token.clone()),
                ..Default::default()
            },
            field_env(pod::POD_NAME_ENV, "metadata.name"),
            field_env(pod::POD_NAMESPACE_ENV, "metadata.namespace"),
        ]),
        ports: Some(vec![
            ContainerPort {
                name: Some(plan.port.clone()),
                container_port: i32::from(listen),
                protocol: Some("TCP".into()),
                ..Default::default()
            },
            ContainerPort {
                name: Some(admin::PORT_NAME.into()),
                container_port: i32::from(admin),
                protocol: Some("TCP".into()),
                ..Default::default()
            },
        ]),
        // /ready is 503 while draining or while the app is unreachable.
        // Every second (the kubelet's shortest period): the first probe
        // usually runs before the app listens, and each period it waits
        // after that is added to every new pod's start, so to the rollout.
        readiness_probe: Some(Probe {
            http_get: Some(http_get(admin::path::READY, i32::from(admin), None)),
            period_seconds: Some(1),
            failure_threshold: Some(1),
            timeout_seconds: Some(1),
            ..Default::default()
        }),
        // No startupProbe: with one, the kubelet starts the app only after
        // the native sidecar's first successful probe, a probe period after
        // the sidecar runs; measured on the local cluster, every new pod was
        // Ready about a second later, and a rolling update pays that once
        // per pod. The sidecar binds its ports within milliseconds of
        // starting, before the kubelet's next sync starts the app, and the
        // readiness probe gates traffic either way.
        liveness_probe: Some(Probe {
            http_get: Some(http_get(admin::path::LIVE, i32::from(admin), None)),
            period_seconds: Some(10),
            failure_threshold: Some(3),
            timeout_seconds: Some(2),
            ..Default::default()
        }),
        // The sidecar drains itself at pod termination too: in classic mode
        // this holds its own SIGTERM until drained (it would otherwise get
        // TERM together with the app); in native mode it is a no-op twin of
        // the app's hook.
        lifecycle: Some(drain_hook(&plan.token, admin)),
        resources: Some(plan.resources.clone()),
        security_context: Some(SecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(SIDECAR_UID),
            run_as_group: Some(SIDECAR_UID),
            allow_privilege_escalation: Some(false),
            privileged: Some(false),
            read_only_root_filesystem: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                add: None,
            }),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                localhost_profile: None,
            }),
            ..Default::default()
        }),
        volume_mounts: Some(vec![VolumeMount {
            name: pod::CONFIG_VOLUME.into(),
            mount_path: pod::CONFIG_DIR.into(),
            read_only: Some(true),
            ..Default::default()
        }]),
        restart_policy: plan.native.then(|| "Always".into()),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        ..Default::default()
    }
}

/// Injects the sidecar into a pod. Idempotent: an injected pod comes back
/// unchanged.
pub fn inject(pod: &Pod, plan: &InjectPlan) -> Result<Pod, Skip> {
    if is_injected(pod) {
        return Ok(pod.clone());
    }
    let mut out = pod.clone();
    let Some(spec) = out.spec.as_mut() else {
        return Err(Skip("pod has no spec".into()));
    };
    if spec.host_network == Some(true) {
        return Err(Skip(
            "hostNetwork pods share the node's ports; not injected".into(),
        ));
    }
    let all_ports = || {
        spec.containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
            .flat_map(|c| c.ports.iter().flatten())
    };
    let taken: BTreeSet<String> = all_ports().filter_map(|p| p.name.clone()).collect();
    let admin = plan.ports.admin_port(spec, Some(&pod.metadata))?;
    let listen = plan.ports.listen_port(spec, admin);
    let new_name = app_port_name(&plan.port, &taken);

    let Some(app) = spec.containers.iter_mut().find(|c| {
        c.ports
            .iter()
            .flatten()
            .any(|p| p.name.as_deref() == Some(plan.port.as_str()))
    }) else {
        let names: Vec<&str> = taken.iter().map(String::as_str).collect();
        return Err(Skip(format!(
            "no container port named {:?} (route {}; ports: {})",
            plan.port,
            plan.route,
            if names.is_empty() {
                "none named".into()
            } else {
                names.join(", ")
            }
        )));
    };
    let mut upstream = 0;
    for p in app.ports.iter_mut().flatten() {
        if p.name.as_deref() == Some(plan.port.as_str()) {
            upstream = p.container_port;
            p.name = Some(new_name.clone());
        }
    }
    rename_probe_port(&mut app.readiness_probe, &plan.port, &new_name);
    rename_probe_port(&mut app.liveness_probe, &plan.port, &new_name);
    rename_probe_port(&mut app.startup_probe, &plan.port, &new_name);
    // The app's own preStop (if any) stays: it knows its shutdown better
    // than we do, and the sidecar's hook still drains the proxy.
    let lifecycle = app.lifecycle.get_or_insert_with(Lifecycle::default);
    if lifecycle.pre_stop.is_none() {
        lifecycle.pre_stop = drain_hook(&plan.token, admin).pre_stop;
    }

    let container = sidecar(plan, listen, admin, upstream);
    if plan.native {
        // First, so it is up before any other init container or the app.
        spec.init_containers
            .get_or_insert_with(Vec::new)
            .insert(0, container);
    } else {
        spec.containers.push(container);
    }
    spec.volumes.get_or_insert_with(Vec::new).push(Volume {
        name: pod::CONFIG_VOLUME.into(),
        config_map: Some(ConfigMapVolumeSource {
            name: plan.config_map.clone(),
            // A deleted route must not leave pods unable to start: the
            // sidecar then runs on its defaults and flags.
            optional: Some(true),
            ..Default::default()
        }),
        ..Default::default()
    });
    if let Some(budget) = plan.budget_seconds
        && spec.termination_grace_period_seconds.unwrap_or(30) < budget
    {
        spec.termination_grace_period_seconds = Some(budget);
    }

    let ann = out.metadata.annotations.get_or_insert_with(BTreeMap::new);
    ann.insert(keys::INJECTED.into(), "true".into());
    ann.insert(
        keys::SIDECAR_MODE.into(),
        if plan.native { "native" } else { "container" }.into(),
    );
    ann.insert(
        keys::SIDECAR_VERSION.into(),
        crate::image_ref::version_of(&plan.image).into(),
    );
    ann.entry(keys::ROUTE.into())
        .or_insert_with(|| plan.route.clone());
    Ok(out)
}

/// Marks a pod that asked for the sidecar but did not get it, so status and
/// humans can see why.
pub fn mark_skipped(pod: &Pod, skip: &Skip) -> Pod {
    let mut out = pod.clone();
    out.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(keys::INJECT_SKIPPED.into(), skip.0.clone());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    const POD: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: web-1
  namespace: shop
  annotations: {kubegrace.io/inject: enabled}
spec:
  containers:
  - name: app
    image: app:1
    ports: [{name: http, containerPort: 8080}, {name: metrics, containerPort: 9090}]
    readinessProbe: {httpGet: {path: /healthz, port: http}}
"#;

    fn pod(yaml: &str) -> Pod {
        serde_yaml::from_str(yaml).expect("valid pod")
    }

    fn plan(native: bool) -> InjectPlan {
        InjectPlan {
            route: "web".into(),
            config_map: "kubegrace-web".into(),
            port: "http".into(),
            image: "localhost/kubegrace/sidecar:e2e".into(),
            pull_policy: "IfNotPresent".into(),
            resources: ResourceRequirements {
                requests: Some(BTreeMap::from([("cpu".into(), Quantity("50m".into()))])),
                ..Default::default()
            },
            native,
            token: "t0k3n".into(),
            budget_seconds: Some(50),
            ports: Ports::default(),
        }
    }

    #[test]
    fn native_injection_takes_over_the_port_name_and_keeps_the_app_port_number() {
        let out = inject(&pod(POD), &plan(true)).expect("injected");
        let spec = out.spec.as_ref().expect("spec");
        let sc = &spec.init_containers.as_ref().expect("init")[0];
        assert_eq!(sc.name, pod::CONTAINER);
        assert_eq!(sc.restart_policy.as_deref(), Some("Always"));
        let sc_ports = sc.ports.as_ref().expect("ports");
        assert_eq!(sc_ports[0].name.as_deref(), Some("http"));
        let listen = pod::FIRST_LISTEN_PORT;
        assert_eq!(sc_ports[0].container_port, i32::from(listen));
        let args = sc.args.as_ref().expect("args").join(" ");
        let (l, u, a) = (flag::LISTEN, flag::UPSTREAM, flag::ADMIN);
        assert!(
            args.contains(&format!("{l} 0.0.0.0:{listen} {u} 127.0.0.1:8080"))
                && args.contains(&format!("{a} 0.0.0.0:{}", admin::DEFAULT_PORT)),
            "{args}"
        );
        let app = &spec.containers[0];
        let app_ports = app.ports.as_ref().expect("ports");
        assert_eq!(app_ports[0].name.as_deref(), Some("kg-http"));
        assert_eq!(app_ports[0].container_port, 8080);
        // The app's probe followed the rename.
        let probe_port = &app
            .readiness_probe
            .as_ref()
            .and_then(|p| p.http_get.as_ref())
            .expect("probe")
            .port;
        assert_eq!(probe_port, &IntOrString::String("kg-http".into()));
        // preStop drains through the sidecar, with the pod's token.
        let hook = app
            .lifecycle
            .as_ref()
            .and_then(|l| l.pre_stop.as_ref())
            .and_then(|p| p.http_get.as_ref())
            .expect("hook");
        assert_eq!(hook.path.as_deref(), Some(admin::path::DRAIN_WAIT));
        assert_eq!(hook.port, IntOrString::Int(i32::from(admin::DEFAULT_PORT)));
        assert_eq!(
            hook.http_headers.as_ref().expect("headers")[0].value,
            "t0k3n"
        );
        let env = sc.env.as_ref().expect("env");
        assert!(
            env.iter()
                .any(|e| e.name == env::DRAIN_TOKEN && e.value.as_deref() == Some("t0k3n"))
        );
        let sec = sc.security_context.as_ref().expect("security context");
        assert_eq!(sec.run_as_non_root, Some(true));
        assert_eq!(sec.read_only_root_filesystem, Some(true));
        assert_eq!(sec.allow_privilege_escalation, Some(false));
        assert_eq!(
            sec.capabilities.as_ref().and_then(|c| c.drop.clone()),
            Some(vec!["ALL".to_string()])
        );
        assert_eq!(
            sec.seccomp_profile.as_ref().map(|s| s.type_.as_str()),
            Some("RuntimeDefault")
        );
        assert_eq!(spec.termination_grace_period_seconds, Some(50));
        let vol = &spec.volumes.as_ref().expect("volumes")[0];
        assert_eq!(
            vol.config_map.as_ref().map(|c| c.name.as_str()),
            Some("kubegrace-web")
        );
        let ann = out.metadata.annotations.as_ref().expect("annotations");
        assert_eq!(ann.get(keys::INJECTED).map(String::as_str), Some("true"));
        assert_eq!(ann.get(keys::ROUTE).map(String::as_str), Some("web"));
        // The plan's image is localhost/kubegrace/sidecar:e2e.
        assert_eq!(
            ann.get(keys::SIDECAR_VERSION).map(String::as_str),
            Some("e2e")
        );
    }

    fn ports_of(c: &Container) -> Vec<(String, i32)> {
        c.ports
            .iter()
            .flatten()
            .map(|p| (p.name.clone().unwrap_or_default(), p.container_port))
            .collect()
    }

    #[test]
    fn a_pod_on_our_default_ports_and_istios_gets_the_next_free_ones() {
        // An app that listens on Istio's 15020, on our default admin port
        // and on our first listener port.
        let yaml = POD.replace(
            "{name: metrics, containerPort: 9090}",
            "{name: metrics, containerPort: 15020}, {name: a, containerPort: 15180}, {name: b, containerPort: 15181}",
        );
        let out = inject(&pod(&yaml), &plan(true)).expect("injected, not skipped");
        let spec = out.spec.as_ref().expect("spec");
        let sc = &spec.init_containers.as_ref().expect("init")[0];
        assert_eq!(
            ports_of(sc),
            vec![("http".into(), 15183), (admin::PORT_NAME.into(), 15182)]
        );
        let args = sc.args.as_ref().expect("args").join(" ");
        assert!(args.contains("--admin 0.0.0.0:15182"), "{args}");
        // Probes and both preStop hooks follow the chosen port.
        let port_of = |p: &Option<Probe>| {
            p.as_ref()
                .and_then(|p| p.http_get.as_ref())
                .map(|h| h.port.clone())
        };
        assert!(
            sc.startup_probe.is_none(),
            "a startupProbe delays the app's start"
        );
        for probe in [&sc.readiness_probe, &sc.liveness_probe] {
            assert_eq!(port_of(probe), Some(IntOrString::Int(15182)));
        }
        for c in [sc, &spec.containers[0]] {
            let hook = c
                .lifecycle
                .as_ref()
                .and_then(|l| l.pre_stop.as_ref())
                .and_then(|p| p.http_get.as_ref())
                .expect("preStop");
            assert_eq!(hook.port, IntOrString::Int(15182));
        }
        assert_eq!(admin_port_of(&out), Some(15182));
    }

    #[test]
    fn the_admin_port_annotation_wins_and_a_taken_one_is_a_clear_skip() {
        let yaml = POD.replace(
            "annotations: {kubegrace.io/inject: enabled}",
            "annotations: {kubegrace.io/inject: enabled, kubegrace.io/admin-port: '9901'}",
        );
        let out = inject(&pod(&yaml), &plan(false)).expect("injected");
        assert_eq!(admin_port_of(&out), Some(9901));
        let taken = yaml.replace("'9901'", "'9090'");
        let err = inject(&pod(&taken), &plan(false)).expect_err("port in use");
        assert!(
            err.0.contains("kubegrace.io/admin-port=9090") && err.0.contains("pick a free one"),
            "{}",
            err.0
        );
        let bad = yaml.replace("'9901'", "'http'");
        let err = inject(&pod(&bad), &plan(false)).expect_err("not a number");
        assert!(err.0.contains("not a port number"), "{}", err.0);
    }

    #[test]
    fn injection_is_idempotent() {
        let once = inject(&pod(POD), &plan(true)).expect("injected");
        let twice = inject(&once, &plan(true)).expect("no-op");
        assert_eq!(once, twice);
    }

    #[test]
    fn classic_injection_appends_a_container() {
        let out = inject(&pod(POD), &plan(false)).expect("injected");
        let spec = out.spec.as_ref().expect("spec");
        assert!(spec.init_containers.is_none());
        assert_eq!(spec.containers.len(), 2);
        assert_eq!(spec.containers[1].name, pod::CONTAINER);
        assert!(spec.containers[1].restart_policy.is_none());
    }

    #[test]
    fn a_pod_without_the_port_is_skipped_with_a_reason() {
        let mut p = plan(true);
        p.port = "grpc".into();
        let err = inject(&pod(POD), &p).expect_err("skipped");
        assert!(
            err.0.contains("\"grpc\"") && err.0.contains("http, metrics"),
            "{}",
            err.0
        );
    }

    #[test]
    fn an_existing_prestop_and_a_longer_grace_period_are_kept() {
        let yaml = POD.replace(
            "    image: app:1\n",
            "    image: app:1\n    lifecycle: {preStop: {sleep: {seconds: 3}}}\n",
        ) + "  terminationGracePeriodSeconds: 120\n";
        let out = inject(&pod(&yaml), &plan(true)).expect("injected");
        let spec = out.spec.as_ref().expect("spec");
        let hook = spec.containers[0]
            .lifecycle
            .as_ref()
            .and_then(|l| l.pre_stop.as_ref())
            .expect("hook");
        assert!(hook.sleep.is_some() && hook.http_get.is_none());
        assert_eq!(spec.termination_grace_period_seconds, Some(120));
    }

    #[test]
    fn opt_in_rules() {
        let ns_on = BTreeMap::from([(keys::INJECT.to_string(), "enabled".to_string())]);
        let none = BTreeMap::new();
        assert!(wants_injection(&pod(POD), &none));
        let bare = pod("metadata: {name: x}\nspec: {containers: []}");
        assert!(!wants_injection(&bare, &none));
        assert!(wants_injection(&bare, &ns_on));
        let off = pod(
            "metadata: {name: x, annotations: {kubegrace.io/inject: disabled}}\nspec: {containers: []}",
        );
        assert!(!wants_injection(&off, &ns_on));
        let labelled = pod(
            "metadata: {name: x, labels: {kubegrace.io/inject: enabled}}\nspec: {containers: []}",
        );
        assert!(wants_injection(&labelled, &none));
    }

    #[test]
    fn port_names_stay_valid_and_unique() {
        let taken = BTreeSet::from(["kg-http".to_string()]);
        assert_eq!(app_port_name("http", &BTreeSet::new()), "kg-http");
        assert_eq!(app_port_name("http", &taken), "kg-http-0");
        assert_eq!(
            app_port_name("very-long-name1", &BTreeSet::new()),
            "kg-very-long-na"
        );
        assert!(app_port_name("abcdefghijkl-xy", &BTreeSet::new()).len() <= 15);
    }
}
