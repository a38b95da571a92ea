//! What the operator may touch: never a user's object that happens to carry
//! one of its names, and nothing outside its watched namespaces.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client, ResourceExt};
use kubegrace_operator::crd::GraceRoute;
use kubegrace_sidecar_api::pod;
use serde_json::json;

use crate::harness::*;

/// `helm template` of the chart's RBAC with `watchNamespaces`, as objects.
fn render_rbac(release: &str, release_ns: &str, watch: &str) -> Vec<serde_norway::Value> {
    let helm = kubegrace_e2e::scenario::helm_bin();
    let chart = kubegrace_e2e::repo_path("charts/kubegrace");
    let out = std::process::Command::new(&helm)
        .args(["template", release])
        .arg(&chart)
        .args(["--namespace", release_ns])
        .args(["--set", &format!("fullnameOverride={release}")])
        .args(["--set", &format!("watchNamespaces={{{watch}}}")])
        .args(["--show-only", "templates/rbac.yaml"])
        .args(["--show-only", "templates/serviceaccount.yaml"])
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "running {}: {e} (the cluster tier needs helm)",
                helm.display()
            )
        });
    assert!(
        out.status.success(),
        "helm template: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("utf-8");
    serde_norway::Deserializer::from_str(&text)
        .filter_map(|d| {
            let v = <serde_norway::Value as serde::Deserialize>::deserialize(d).ok()?;
            (!v.is_null()).then_some(v)
        })
        .collect()
}

/// What `kubectl auth can-i VERB RESOURCE -n NS --as SA` answers: a
/// SelfSubjectAccessReview made by a client impersonating the SA.
async fn can_i(as_sa: &Client, verb: &str, group: &str, resource: &str, ns: Option<&str>) -> bool {
    use k8s_openapi::api::authorization::v1::SelfSubjectAccessReview;
    let review: SelfSubjectAccessReview = serde_json::from_value(json!({
        "spec": {"resourceAttributes": {
            "verb": verb, "group": group, "resource": resource,
            "namespace": ns.unwrap_or_default()
        }}
    }))
    .expect("review");
    Api::<SelfSubjectAccessReview>::all(as_sa.clone())
        .create(&PostParams::default(), &review)
        .await
        .expect("self subject access review")
        .status
        .is_some_and(|s| s.allowed)
}

/// A user's ConfigMap that happens to be named `kubegrace-<route>` is never
/// taken over: not applied to, not given an owner reference, not deleted
/// with the route; the route says why and what to do, with an Event.
#[tokio::test]
async fn a_users_configmap_named_like_the_routes_survives_untouched_and_the_route_says_why() {
    in_cluster(
        "a_users_configmap_named_like_the_routes_survives_untouched_and_the_route_says_why",
        "kg-own",
        false,
        async |client, ns| {
            let port = free_port();
            // This operator watches only the test namespace.
            let (stop, task) = start_operator_extra(
                client,
                &ns.name,
                port,
                &[format!("--watch-namespaces={}", ns.name)],
            );
            let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
            let user_cm: ConfigMap = serde_json::from_value(json!({
                "metadata": {"name": "kubegrace-web", "labels": {"app": "web"}},
                "data": {"settings.ini": "mine=1\n"}
            }))
            .expect("cm");
            let before = create(&cms, &user_cm, "create the user's ConfigMap").await;
            create_web_deployment(client, &ns.name).await;
            let routes: Api<GraceRoute> = Api::namespaced(client.clone(), &ns.name);
            create(&routes, &graceroute("web", "web"), "create route").await;
            let msg =
                wait_condition(&routes, "web", ("Accepted", "False", "ConfigMapNotOwned")).await;
            let cm_ref = format!("ConfigMap {}/kubegrace-web", ns.name);
            for part in [
                cm_ref.as_str(),
                "was not created by kubegrace",
                "will not overwrite or delete it",
                "Rename or delete that ConfigMap",
            ] {
                assert!(msg.contains(part), "{part:?} not in {msg}");
            }
            wait_warning_event(client, &ns.name, "ConfigMapNotOwned").await;
            let untouched = |cm: &ConfigMap| {
                assert_eq!(cm.data, before.data, "data changed");
                assert_eq!(cm.labels(), before.labels(), "labels changed");
                assert!(cm.owner_references().is_empty(), "owner reference added");
                assert!(
                    cm.managed_fields()
                        .iter()
                        .all(|m| m.manager.as_deref() != Some(kubegrace_operator::FIELD_MANAGER)),
                    "kubegrace manages fields of it: {:?}",
                    cm.managed_fields()
                );
            };
            untouched(&cms.get("kubegrace-web").await.expect("still there"));
            // Deleting the route leaves the ConfigMap alone.
            delete_route(&routes, "web").await;
            // The garbage collector would act within seconds if it had an owner.
            tokio::time::sleep(Duration::from_secs(3)).await;
            let after = cms.get("kubegrace-web").await.expect("survives the route");
            untouched(&after);
            assert_eq!(after.metadata.uid, before.metadata.uid, "re-created");
            stop_operator((stop, task)).await;
        },
    )
    .await;
}

/// The chart's namespaced RBAC mode, enforced by the real API server: the
/// operator runs in-process as the chart's ServiceAccount (impersonated),
/// with `--watch-namespaces`; its route in the watched namespace
/// reconciles, it may not write ConfigMaps or Deployments elsewhere, and a
/// route elsewhere is left alone.
#[tokio::test]
async fn with_watch_namespaces_the_operator_works_there_and_may_write_nothing_elsewhere() {
    use k8s_openapi::api::core::v1::ServiceAccount;
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
    let Some((client, _serial)) =
        cluster("with_watch_namespaces_the_operator_works_there_and_may_write_nothing_elsewhere")
            .await
    else {
        return;
    };
    let op_ns = TestNs::new(&client, "kg-rbac-op", false).await;
    let watched = TestNs::new(&client, "kg-rbac-w", false).await;
    let other = TestNs::new(&client, "kg-rbac-x", false).await;
    let release = format!("kg-rbac-{:06x}", rand::random::<u32>() & 0xff_ffff);
    let docs = render_rbac(&release, &op_ns.name, &watched.name);
    let pp = PostParams::default();
    let mut cluster_roles = Vec::new();
    for d in &docs {
        let kind = d["kind"].as_str().unwrap_or_default().to_string();
        let ns = d["metadata"]["namespace"].as_str().map(str::to_string);
        let j = serde_json::to_value(d).expect("json");
        let ns_of = || ns.clone().expect("namespaced object has a namespace");
        match kind.as_str() {
            "ServiceAccount" => drop(
                Api::<ServiceAccount>::namespaced(client.clone(), &ns_of())
                    .create(&pp, &serde_json::from_value(j).expect("sa"))
                    .await
                    .expect("sa"),
            ),
            "Role" => drop(
                Api::<Role>::namespaced(client.clone(), &ns_of())
                    .create(&pp, &serde_json::from_value(j).expect("role"))
                    .await
                    .expect("role"),
            ),
            "RoleBinding" => drop(
                Api::<RoleBinding>::namespaced(client.clone(), &ns_of())
                    .create(&pp, &serde_json::from_value(j).expect("rb"))
                    .await
                    .expect("rb"),
            ),
            "ClusterRole" => {
                let cr: ClusterRole = serde_json::from_value(j).expect("cr");
                cluster_roles.push(("ClusterRole", cr.name_any()));
                create(&Api::all(client.clone()), &cr, "cr").await;
            }
            "ClusterRoleBinding" => {
                let crb: ClusterRoleBinding = serde_json::from_value(j).expect("crb");
                cluster_roles.push(("ClusterRoleBinding", crb.name_any()));
                create(&Api::all(client.clone()), &crb, "crb").await;
            }
            other => panic!("unexpected {other} in the RBAC render"),
        }
    }
    // The operator's client: the chart's ServiceAccount, impersonated.
    let sa = format!("system:serviceaccount:{}:{release}-operator", op_ns.name);
    let path = kubegrace_e2e::kubeconfig_path().expect("the cluster tier's kubeconfig");
    let mut config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&path).expect("kubeconfig"),
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .expect("config");
    config.auth_info.impersonate = Some(sa.clone());
    let as_sa = Client::try_from(config).expect("client");

    // `kubectl auth can-i ... --as <sa>`
    let (w, o) = (watched.name.as_str(), other.name.as_str());
    for (verb, group, res, ns, want) in [
        ("create", "", "configmaps", Some(w), true),
        ("patch", "apps", "deployments", Some(w), true),
        ("create", "", "configmaps", Some(o), false),
        ("patch", "", "configmaps", Some(o), false),
        ("delete", "", "configmaps", Some(o), false),
        ("update", "apps", "deployments", Some(o), false),
        ("update", "apps", "statefulsets", Some(o), false),
        ("list", "", "configmaps", None, false),
        ("watch", "", "pods", None, false),
    ] {
        assert_eq!(
            can_i(&as_sa, verb, group, res, ns).await,
            want,
            "{sa} can-i {verb} {group}/{res} in {ns:?}"
        );
    }

    let port = free_port();
    let (stop, task) = start_operator_extra(
        &as_sa,
        &op_ns.name,
        port,
        &[
            format!("--watch-namespaces={w}"),
            format!("--cert-secret={release}-webhook-cert"),
            format!("--leader-election-lease={release}-operator"),
            format!("--webhook-config={release}-sidecar-injector"),
            format!("--validating-webhook-config={release}-route-validator"),
        ],
    );
    for ns in [w, o] {
        Api::<Deployment>::namespaced(client.clone(), ns)
            .create(&pp, &deployment("web"))
            .await
            .expect("deployment");
        Api::<GraceRoute>::namespaced(client.clone(), ns)
            .create(&pp, &graceroute("web", "web"))
            .await
            .expect("route");
    }
    let routes: Api<GraceRoute> = Api::namespaced(client.clone(), w);
    wait_for(90, "the watched namespace's route accepted", || async {
        let r = routes.get("web").await.ok()?;
        (condition(&r, "Accepted")?.0 == "True").then_some(())
    })
    .await;
    let cm = Api::<ConfigMap>::namespaced(client.clone(), w)
        .get("kubegrace-web")
        .await
        .expect("the route's ConfigMap, written as the ServiceAccount");
    assert!(cm.data.is_some_and(|d| d.contains_key(pod::CONFIG_FILE)));
    // Nothing happened in the other namespace: no status, no finalizer, no
    // ConfigMap (and the API server would have refused them anyway).
    let elsewhere = Api::<GraceRoute>::namespaced(client.clone(), o)
        .get("web")
        .await
        .expect("route");
    assert!(elsewhere.status.is_none(), "{:?}", elsewhere.status);
    assert!(elsewhere.finalizers().is_empty());
    assert!(
        Api::<ConfigMap>::namespaced(client.clone(), o)
            .get_opt("kubegrace-web")
            .await
            .expect("get")
            .is_none()
    );
    assert!(!task.is_finished(), "the operator stopped: {task:?}");
    // Let the operator remove its finalizer while it runs.
    delete_route(&routes, "web").await;
    stop_operator((stop, task)).await;
    for (kind, name) in cluster_roles {
        let dp = DeleteParams::default();
        let _ = match kind {
            "ClusterRole" => Api::<k8s_openapi::api::rbac::v1::ClusterRole>::all(client.clone())
                .delete(&name, &dp)
                .await
                .map(drop),
            _ => Api::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>::all(client.clone())
                .delete(&name, &dp)
                .await
                .map(drop),
        };
    }
    for ns in [other, watched, op_ns] {
        ns.cleanup().await;
    }
}
