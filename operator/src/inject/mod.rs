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
    Capabilities, ConfigMapVolumeSource, Container, ContainerPort, EmptyDirVolumeSource, EnvVar,
    EnvVarSource, HTTPGetAction, HTTPHeader, Lifecycle, LifecycleHandler, ObjectFieldSelector, Pod,
    PodSpec, Probe, ResourceRequirements, SeccompProfile, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use kubegrace_sidecar_api::cli::{env, flag};
use kubegrace_sidecar_api::config::AppReadiness;
use kubegrace_sidecar_api::{admin, pod, report};

use crate::keys;

mod app_readiness;
pub mod overrides;

pub use app_readiness::{APP_READINESS_IN_SIDECAR, APP_READINESS_ON_APP};
use app_readiness::{keeps_own_readiness, take_http_readiness};
/// What a pod says about the sidecar, read by the plugin too.
pub use kubegrace_api::inject::{
    admin_port_of, app_port_name, is_injected, own_choice, wants_injection,
};

/// The sidecar image's user (distroless nonroot); set explicitly so
/// `runAsNonRoot` holds whatever the image says, unless the platform
/// assigns users itself (OpenShift's restricted SCC refuses a fixed one):
/// see [`SidecarSettings::run_as_user`].
pub const SIDECAR_UID: i64 = 65532;

/// The cluster autoscaler's annotation: local volumes (comma-separated) it
/// may drop when it evicts the pod to remove a node.
pub const SAFE_TO_EVICT_LOCAL_VOLUMES: &str =
    "cluster-autoscaler.kubernetes.io/safe-to-evict-local-volumes";

/// What the operator's flags say about every sidecar.
#[derive(Debug, Clone)]
pub struct SidecarSettings {
    pub image: String,
    pub pull_policy: String,
    pub resources: ResourceRequirements,
    /// The sidecar's log filter (`KUBEGRACE_LOG`, `--sidecar-log-level`);
    /// `None` leaves the sidecar's default (info).
    pub log_level: Option<String>,
    /// The sidecar's `runAsUser` and `runAsGroup`; `None` leaves them to
    /// the platform (OpenShift assigns a UID from the namespace's range;
    /// `runAsNonRoot` still holds).
    pub run_as_user: Option<i64>,
    /// Native sidecar (init container, restartPolicy Always): Kubernetes >= 1.29.
    pub native: bool,
    /// Where the sidecar's admin port and listener go (chart values).
    pub ports: Ports,
}

/// Everything the webhook decided for one pod.
#[derive(Debug, Clone)]
pub struct InjectPlan {
    pub route: String,
    pub config_map: String,
    /// The pod port name the sidecar takes over.
    pub port: String,
    /// The operator's settings, with this pod's own resources and log
    /// level where its annotations set them.
    pub sidecar: SidecarSettings,
    pub token: String,
    /// The route's time budget; the pod's grace period is raised to it.
    pub budget_seconds: Option<i64>,
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
fn sidecar(
    plan: &InjectPlan,
    listen: u16,
    admin: u16,
    upstream: i32,
    app_readiness: Option<&AppReadiness>,
) -> Container {
    let mut vars = vec![
        EnvVar {
            name: env::DRAIN_TOKEN.into(),
            value: Some(plan.token.clone()),
            ..Default::default()
        },
        field_env(pod::POD_NAME_ENV, "metadata.name"),
        field_env(pod::POD_NAMESPACE_ENV, "metadata.namespace"),
        // The drain journal: a sidecar restarted mid-drain carries it on.
        // An environment variable, not the flag: a sidecar of an older
        // release ignores it instead of refusing to start.
        EnvVar {
            name: env::STATE_DIR.into(),
            value: Some(pod::STATE_DIR.into()),
            ..Default::default()
        },
    ];
    if let Some(level) = &plan.sidecar.log_level {
        vars.push(EnvVar {
            name: env::LOG.into(),
            value: Some(level.clone()),
            ..Default::default()
        });
    }
    // The app's check runs inside /ready: the same JSON the flag takes.
    if let Some(check) = app_readiness.and_then(|r| serde_json::to_string(r).ok()) {
        vars.push(EnvVar {
            name: env::APP_READINESS.into(),
            value: Some(check),
            ..Default::default()
        });
    }
    // /ready may wait for the app's check (its own timeout) after the
    // connect check: give the kubelet's probe room for both.
    let ready_timeout = app_readiness.map_or(1, |r| {
        i32::try_from(r.timeout_seconds)
            .unwrap_or(1)
            .saturating_add(1)
    });
    Container {
        name: pod::CONTAINER.into(),
        image: Some(plan.sidecar.image.clone()),
        image_pull_policy: Some(plan.sidecar.pull_policy.clone()),
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
            // The drain report becomes the container's termination message,
            // which the operator reads once the sidecar has exited.
            flag::TERMINATION_LOG.into(),
            report::DEFAULT_PATH.into(),
        ]),
        env: Some(vars),
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
        // /ready is 503 while draining, while the app is unreachable, or
        // while the app's own readiness check (moved here) fails.
        // Every second (the kubelet's shortest period): the first probe
        // usually runs before the app listens, and each period it waits
        // after that is added to every new pod's start, so to the rollout.
        readiness_probe: Some(Probe {
            http_get: Some(http_get(admin::path::READY, i32::from(admin), None)),
            period_seconds: Some(1),
            failure_threshold: Some(1),
            timeout_seconds: Some(ready_timeout),
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
        resources: Some(plan.sidecar.resources.clone()),
        security_context: Some(SecurityContext {
            run_as_non_root: Some(true),
            run_as_user: plan.sidecar.run_as_user,
            run_as_group: plan.sidecar.run_as_user,
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
        volume_mounts: Some(vec![
            VolumeMount {
                name: pod::CONFIG_VOLUME.into(),
                mount_path: pod::CONFIG_DIR.into(),
                read_only: Some(true),
                ..Default::default()
            },
            VolumeMount {
                name: pod::STATE_VOLUME.into(),
                mount_path: pod::STATE_DIR.into(),
                ..Default::default()
            },
        ]),
        restart_policy: plan.sidecar.native.then(|| "Always".into()),
        // The file holds the drain report after a clean exit; the log tail
        // stands in only when the sidecar failed before writing one.
        termination_message_path: Some(report::DEFAULT_PATH.into()),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        ..Default::default()
    }
}

/// Where the API server's ServiceAccount admission plugin mounts the token.
const TOKEN_MOUNT_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// The token mount the ServiceAccount admission plugin gave the pod's
/// containers before the webhook ran, if it did: its volume
/// (`kube-api-access-*`, the first such, as the plugin picks it) mounted
/// read-only at [`TOKEN_MOUNT_PATH`] by a container.
///
/// The sidecar gets the same mount from us. The plugin would add it anyway:
/// a webhook's change makes the API server run the in-tree plugins again,
/// the plugin mounts the token into the new container, and because the pod
/// changed after our webhook (`reinvocationPolicy: IfNeeded`) the API
/// server calls the webhook a second time, for every injected pod
/// (`make bench-scale` counted two reviews per injected pod). With the
/// mount already there the plugin changes nothing and the second call and
/// its round of admission go away; the pod comes out the same.
fn service_account_mount(spec: &PodSpec) -> Option<VolumeMount> {
    let volume = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name.starts_with("kube-api-access-"))?;
    let mounted = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .flat_map(|c| c.volume_mounts.iter().flatten())
        .any(|m| m.name == volume.name && m.mount_path == TOKEN_MOUNT_PATH);
    mounted.then(|| VolumeMount {
        name: volume.name.clone(),
        mount_path: TOKEN_MOUNT_PATH.into(),
        read_only: Some(true),
        ..Default::default()
    })
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
    let admin = plan.sidecar.ports.admin_port(spec, Some(&pod.metadata))?;
    let listen = plan.sidecar.ports.listen_port(spec, admin);
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
    let app_readiness = if keeps_own_readiness(&pod.metadata) {
        None
    } else {
        take_http_readiness(app)
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

    let mut container = sidecar(plan, listen, admin, upstream, app_readiness.as_ref());
    if let Some(m) = service_account_mount(spec) {
        container.volume_mounts.get_or_insert_with(Vec::new).push(m);
    }
    if plan.sidecar.native {
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
    // Outlives a restart of the sidecar container (not of the pod): the
    // drain journal. In memory and tiny (one small file).
    spec.volumes.get_or_insert_with(Vec::new).push(Volume {
        name: pod::STATE_VOLUME.into(),
        empty_dir: Some(EmptyDirVolumeSource {
            medium: Some("Memory".into()),
            size_limit: Some(k8s_openapi::apimachinery::pkg::api::resource::Quantity(
                "1Mi".into(),
            )),
        }),
        ..Default::default()
    });
    if let Some(budget) = plan.budget_seconds
        && kubegrace_api::workloads::pod_grace_period(Some(spec)) < budget
    {
        spec.termination_grace_period_seconds = Some(budget);
    }

    let ann = out.metadata.annotations.get_or_insert_with(BTreeMap::new);
    ann.insert(keys::INJECTED.into(), "true".into());
    // The cluster autoscaler keeps a node whose pods have local volumes
    // unless they are named safe to evict (as Linkerd does for its own):
    // the journal means nothing once the pod is gone.
    let safe = ann
        .get(SAFE_TO_EVICT_LOCAL_VOLUMES)
        .filter(|v| !v.trim().is_empty())
        .map(|v| format!("{v},{}", pod::STATE_VOLUME))
        .unwrap_or_else(|| pod::STATE_VOLUME.into());
    ann.insert(SAFE_TO_EVICT_LOCAL_VOLUMES.into(), safe);
    ann.insert(
        keys::SIDECAR_MODE.into(),
        if plan.sidecar.native {
            "native"
        } else {
            "container"
        }
        .into(),
    );
    ann.insert(
        keys::SIDECAR_VERSION.into(),
        crate::image_ref::version_of(&plan.sidecar.image).into(),
    );
    ann.entry(keys::ROUTE.into())
        .or_insert_with(|| plan.route.clone());
    if app_readiness.is_some() {
        // Where the app's readiness probe went, for whoever reads the pod.
        ann.insert(keys::APP_READINESS.into(), APP_READINESS_IN_SIDECAR.into());
    }
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
mod tests;
