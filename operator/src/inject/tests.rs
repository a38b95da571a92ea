//! The webhook's pod rewrite, from YAML fixtures.

use super::*;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

pub(super) const POD: &str = r#"
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

pub(super) fn pod(yaml: &str) -> Pod {
    serde_norway::from_str(yaml).expect("valid pod")
}

/// What the webhook makes of `POD` with `from` replaced by `to`.
pub(super) fn injected(from: &str, to: &str, native: bool) -> Pod {
    let yaml = POD.replace(from, to);
    inject(&pod(&yaml), &plan(native)).expect("injected")
}

/// The native sidecar (the first init container) of an injected pod.
pub(super) fn native_sidecar(out: &Pod) -> &Container {
    &out.spec
        .as_ref()
        .expect("spec")
        .init_containers
        .as_ref()
        .expect("init")[0]
}

/// What the tests look up by name in a pod spec: env variables, volumes, mounts.
pub(super) trait Named {
    fn name(&self) -> &str;
}

impl Named for EnvVar {
    fn name(&self) -> &str {
        &self.name
    }
}

impl Named for Volume {
    fn name(&self) -> &str {
        &self.name
    }
}

impl Named for VolumeMount {
    fn name(&self) -> &str {
        &self.name
    }
}

/// The entry of an optional pod-spec list with this name.
pub(super) fn named<'a, T: Named>(list: &'a Option<Vec<T>>, name: &str) -> Option<&'a T> {
    list.iter().flatten().find(|item| item.name() == name)
}

pub(super) fn plan(native: bool) -> InjectPlan {
    InjectPlan {
        route: "web".into(),
        config_map: "kubegrace-web".into(),
        port: "http".into(),
        sidecar: SidecarSettings {
            image: "localhost/kubegrace/sidecar:e2e".into(),
            pull_policy: "IfNotPresent".into(),
            resources: ResourceRequirements {
                requests: Some(BTreeMap::from([("cpu".into(), Quantity("50m".into()))])),
                ..Default::default()
            },
            log_level: None,
            run_as_user: Some(SIDECAR_UID),
            native,
            ports: Ports::default(),
        },
        token: "t0k3n".into(),
        budget_seconds: Some(50),
    }
}

#[test]
fn native_injection_takes_over_the_port_name_and_keeps_the_app_port_number() {
    let out = inject(&pod(POD), &plan(true)).expect("injected");
    let spec = out.spec.as_ref().expect("spec");
    let sc = native_sidecar(&out);
    assert_eq!(sc.name, pod::CONTAINER);
    assert_eq!(sc.restart_policy.as_deref(), Some("Always"));
    assert_eq!(
        sc.termination_message_path.as_deref(),
        Some(report::DEFAULT_PATH)
    );
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
    // The app's httpGet readiness probe moved into the sidecar's /ready,
    // with its named port resolved: one readiness probe per pod.
    assert!(app.readiness_probe.is_none(), "{:?}", app.readiness_probe);
    let moved = named(&sc.env, env::APP_READINESS)
        .and_then(|e| e.value.as_deref())
        .expect("app readiness env");
    let moved: AppReadiness = serde_json::from_str(moved).expect("json");
    assert_eq!(moved, AppReadiness::http_get(8080, "/healthz"));
    assert_eq!(
        sc.readiness_probe.as_ref().and_then(|p| p.timeout_seconds),
        Some(2)
    );
    assert_eq!(
        out.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(keys::APP_READINESS))
            .map(String::as_str),
        Some(APP_READINESS_IN_SIDECAR)
    );
    // preStop drains through the sidecar, with the pod's token.
    let hook = pre_stop_get(app);
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
    let out = injected(
        "{name: metrics, containerPort: 9090}",
        "{name: metrics, containerPort: 15020}, {name: a, containerPort: 15180}, {name: b, containerPort: 15181}",
        true,
    );
    let spec = out.spec.as_ref().expect("spec");
    let sc = native_sidecar(&out);
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
        let hook = pre_stop_get(c);
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
    let labelled =
        pod("metadata: {name: x, labels: {kubegrace.io/inject: enabled}}\nspec: {containers: []}");
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

#[test]
fn the_sidecar_user_is_fixed_or_left_to_the_platform() {
    let user_of = |plan: &InjectPlan| {
        let out = inject(&pod(POD), plan).expect("injected");
        let sc = native_sidecar(&out)
            .security_context
            .clone()
            .expect("security context");
        (sc.run_as_user, sc.run_as_group, sc.run_as_non_root)
    };
    assert_eq!(
        user_of(&plan(true)),
        (Some(SIDECAR_UID), Some(SIDECAR_UID), Some(true))
    );
    // OpenShift: no UID, so the restricted SCC assigns one; still non-root.
    let mut platform = plan(true);
    platform.sidecar.run_as_user = None;
    assert_eq!(user_of(&platform), (None, None, Some(true)));
}

#[test]
fn a_log_level_becomes_the_sidecars_log_variable() {
    let env_of = |plan: &InjectPlan| {
        let out = inject(&pod(POD), plan).expect("injected");
        named(
            &native_sidecar(&out).env,
            kubegrace_sidecar_api::cli::env::LOG,
        )
        .and_then(|e| e.value.clone())
    };
    assert_eq!(env_of(&plan(true)), None);
    let mut debug = plan(true);
    debug.sidecar.log_level = Some("debug".into());
    assert_eq!(env_of(&debug).as_deref(), Some("debug"));
}

/// The drain journal's volume: mounted writable in the sidecar, named in
/// the sidecar's environment, and safe for the cluster autoscaler to drop
/// (kept beside a value the pod already had).
#[test]
fn the_sidecar_gets_a_state_volume_the_autoscaler_may_drop() {
    let out = inject(&pod(POD), &plan(true)).expect("injected");
    let spec = out.spec.as_ref().expect("spec");
    let volume = named(&spec.volumes, pod::STATE_VOLUME).expect("state volume");
    assert_eq!(
        volume.empty_dir.as_ref().and_then(|e| e.medium.as_deref()),
        Some("Memory")
    );
    let sc = native_sidecar(&out);
    let mount = named(&sc.volume_mounts, pod::STATE_VOLUME).expect("mount");
    assert_eq!(mount.mount_path, pod::STATE_DIR);
    assert_ne!(mount.read_only, Some(true));
    assert!(sc.env.iter().flatten().any(|e| {
        e.name == kubegrace_sidecar_api::cli::env::STATE_DIR
            && e.value.as_deref() == Some(pod::STATE_DIR)
    }));
    let ann = |p: &Pod| {
        p.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(SAFE_TO_EVICT_LOCAL_VOLUMES))
            .cloned()
    };
    assert_eq!(ann(&out).as_deref(), Some(pod::STATE_VOLUME));
    let mut own = pod(POD);
    own.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(SAFE_TO_EVICT_LOCAL_VOLUMES.into(), "scratch".into());
    let out = inject(&own, &plan(true)).expect("injected");
    assert_eq!(ann(&out), Some(format!("scratch,{}", pod::STATE_VOLUME)));
}

/// The container's preStop `httpGet` (the drain through the sidecar).
fn pre_stop_get(c: &Container) -> &HTTPGetAction {
    c.lifecycle
        .as_ref()
        .and_then(|l| l.pre_stop.as_ref())
        .and_then(|p| p.http_get.as_ref())
        .expect("a preStop httpGet")
}

/// The sidecar gets the token mount the ServiceAccount plugin gave the app
/// (so the plugin, run again after the webhook, changes nothing and the
/// webhook is not called a second time); a pod without one gets none.
#[test]
fn the_sidecar_takes_the_token_mount_the_service_account_plugin_gave_the_pod() {
    let with_token = POD.replace(
        "    readinessProbe: {httpGet: {path: /healthz, port: http}}\n",
        "    readinessProbe: {httpGet: {path: /healthz, port: http}}\n    volumeMounts: [{name: kube-api-access-x7k2p, readOnly: true, mountPath: /var/run/secrets/kubernetes.io/serviceaccount}]\n  volumes: [{name: data, emptyDir: {}}, {name: kube-api-access-x7k2p, projected: {sources: []}}]\n",
    );
    let mounts = sidecar_mounts(&with_token);
    let token = mounts
        .iter()
        .find(|m| m.name == "kube-api-access-x7k2p")
        .expect("token mount");
    assert_eq!(token.mount_path, TOKEN_MOUNT_PATH);
    assert_eq!(token.read_only, Some(true));

    let mounts = sidecar_mounts(POD);
    assert!(
        mounts.iter().all(|m| m.mount_path != TOKEN_MOUNT_PATH),
        "{mounts:?}"
    );
    // A volume by that name that no container mounts at the token path is
    // not the plugin's: left alone.
    let stray = POD.replace(
        "    readinessProbe: {httpGet: {path: /healthz, port: http}}\n",
        "    readinessProbe: {httpGet: {path: /healthz, port: http}}\n  volumes: [{name: kube-api-access-mine, emptyDir: {}}]\n",
    );
    let mounts = sidecar_mounts(&stray);
    assert!(mounts.iter().all(|m| m.name != "kube-api-access-mine"));
}

/// The volume mounts of the sidecar injected into the pod `yaml` describes.
fn sidecar_mounts(yaml: &str) -> Vec<VolumeMount> {
    let out = inject(&pod(yaml), &plan(true)).expect("injected");
    native_sidecar(&out)
        .volume_mounts
        .clone()
        .unwrap_or_default()
}
