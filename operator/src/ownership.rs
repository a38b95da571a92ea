//! Whose ConfigMap is `kubegrace-<route>`?
//!
//! The route controller writes its sidecar config with a *forced*
//! server-side apply and an owner reference to the route, so the garbage
//! collector deletes the ConfigMap with the route. Pointed at a ConfigMap
//! someone else made (a user's `kubegrace-web`, another tool's), that apply
//! would take its fields over and the route's deletion would later delete
//! it. So before every apply the controller asks [`decide`] (pure) and
//! touches the ConfigMap only when it is absent or ours; otherwise the route
//! is not accepted (`Accepted=False`, reason [`REASON`]), which also keeps
//! the webhook from injecting sidecars that would mount the foreign
//! ConfigMap as their config.
//!
//! Ours means: controlled by a GraceRoute of the same name (any uid: a route
//! deleted and re-created under the same name inherits the ConfigMap the
//! garbage collector has not removed yet), or, with no controller at all,
//! carrying both labels the controller writes
//! (`app.kubernetes.io/managed-by=kubegrace-operator` and
//! `kubegrace.io/route=<route>`). A user who wants kubegrace to adopt a
//! ConfigMap can add those two labels; nobody sets both by accident.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;

use crate::rules::Invalid;
use crate::{FIELD_MANAGER, keys};

/// The condition reason (and Event reason) of a refused ConfigMap.
pub use crate::reasons::CONFIG_MAP_NOT_OWNED as REASON;

/// What the controller may do with the route's ConfigMap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ownership {
    /// There is none: create it.
    Absent,
    /// Ours: apply (and let the garbage collector delete it with the route).
    Ours,
    /// Someone else's: neither apply nor delete; the string says whose.
    Foreign(String),
}

/// Decides from the existing ConfigMap (None: it does not exist).
pub fn decide(existing: Option<&ConfigMap>, route: &str) -> Ownership {
    let Some(cm) = existing else {
        return Ownership::Absent;
    };
    let controller = cm
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true));
    if let Some(o) = controller {
        let group = o.api_version.split('/').next().unwrap_or_default();
        return if o.kind == "GraceRoute" && group == "kubegrace.io" && o.name == route {
            Ownership::Ours
        } else {
            Ownership::Foreign(format!("it is controlled by {} {}", o.kind, o.name))
        };
    }
    let labels = cm.labels();
    let managed = labels.get(keys::MANAGED_BY).map(String::as_str) == Some(FIELD_MANAGER);
    let for_route = labels.get(keys::ROUTE_LABEL).map(String::as_str) == Some(route);
    if managed && for_route {
        Ownership::Ours
    } else {
        Ownership::Foreign(format!(
            "it lacks the labels kubegrace puts on its own ConfigMaps ({}={FIELD_MANAGER}, {}={route})",
            keys::MANAGED_BY,
            keys::ROUTE_LABEL
        ))
    }
}

/// The route's condition message for a foreign ConfigMap: why, and what to do.
pub fn refusal(ns: &str, cm: &str, route: &str, why: &str) -> Invalid {
    Invalid::new(
        REASON,
        format!(
            "ConfigMap {ns}/{cm} already exists and was not created by kubegrace ({why}); \
             kubegrace will not overwrite or delete it. Rename or delete that ConfigMap, \
             rename GraceRoute {route}, or, to hand it to kubegrace, label it \
             {}={FIELD_MANAGER} and {}={route}",
            keys::MANAGED_BY,
            keys::ROUTE_LABEL
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::yaml;

    #[test]
    fn absent_is_created() {
        assert_eq!(decide(None, "web"), Ownership::Absent);
    }

    #[test]
    fn a_users_configmap_is_foreign() {
        let user =
            yaml::<ConfigMap>("metadata: {name: kubegrace-web, labels: {app: web}}\ndata: {a: b}");
        let Ownership::Foreign(why) = decide(Some(&user), "web") else {
            panic!("a user's ConfigMap must not be ours");
        };
        assert!(why.contains("lacks the labels"), "{why}");
        // One of the two labels is not enough.
        let half = yaml::<ConfigMap>(
            "metadata: {name: kubegrace-web, labels: {app.kubernetes.io/managed-by: kubegrace-operator}}",
        );
        assert!(matches!(decide(Some(&half), "web"), Ownership::Foreign(_)));
        // Our labels, but for another route (a renamed copy).
        let other = yaml::<ConfigMap>(
            "metadata: {name: kubegrace-web, labels: {app.kubernetes.io/managed-by: kubegrace-operator, kubegrace.io/route: api}}",
        );
        assert!(matches!(decide(Some(&other), "web"), Ownership::Foreign(_)));
    }

    /// The route's ConfigMap, unlabelled, with a controller reference.
    fn controlled_by(api_version: &str, kind: &str, name: &str) -> ConfigMap {
        yaml::<ConfigMap>(&format!(
            "metadata:\n  name: kubegrace-web\n  ownerReferences:\n  - {{apiVersion: {api_version}, kind: {kind}, name: {name}, uid: u-{name}, controller: true}}"
        ))
    }

    #[test]
    fn our_labels_or_our_controller_make_it_ours() {
        let labelled = yaml::<ConfigMap>(
            "metadata: {name: kubegrace-web, labels: {app.kubernetes.io/managed-by: kubegrace-operator, kubegrace.io/route: web}}",
        );
        assert_eq!(decide(Some(&labelled), "web"), Ownership::Ours);
        let owned = controlled_by("kubegrace.io/v1alpha1", "GraceRoute", "web");
        assert_eq!(decide(Some(&owned), "web"), Ownership::Ours);
    }

    #[test]
    fn another_controller_wins_over_our_labels() {
        let helm = yaml::<ConfigMap>(
            r#"
metadata:
  name: kubegrace-web
  labels: {app.kubernetes.io/managed-by: kubegrace-operator, kubegrace.io/route: web}
  ownerReferences:
  - {apiVersion: apps/v1, kind: Deployment, name: web, uid: "2", controller: true}
"#,
        );
        let Ownership::Foreign(why) = decide(Some(&helm), "web") else {
            panic!("controlled by a Deployment");
        };
        assert!(why.contains("Deployment web"), "{why}");
        let other_route = controlled_by("kubegrace.io/v1alpha1", "GraceRoute", "api");
        assert!(matches!(
            decide(Some(&other_route), "web"),
            Ownership::Foreign(_)
        ));
    }

    #[test]
    fn the_refusal_says_what_to_do() {
        let r = refusal("shop", "kubegrace-web", "web", "it lacks the labels");
        assert_eq!(r.reason, REASON);
        for part in [
            "shop/kubegrace-web",
            "will not overwrite or delete",
            "Rename or delete",
        ] {
            assert!(r.message.contains(part), "{}", r.message);
        }
    }
}
