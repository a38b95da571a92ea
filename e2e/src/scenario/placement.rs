//! Where a run's pods go when the cluster has more than one node that takes them (a kind
//! cluster with workers, `make kind-test KIND_NODES=3`): the loadgen Job on one node, the
//! demo app's pods on the others. Then the load crosses nodes, as a real client's does, and
//! the kube-proxy that rewrites a ClusterIP for the load (the one on the load's node) is not
//! the one on the node whose pods stop: each changes its rules at its own moment. With one
//! such node (the local cluster, a one-node kind cluster) nothing is pinned and the
//! manifests are the ones a single-node run always had.

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{
    Affinity, Node, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
};
use kube::api::ListParams;
use kube::{Api, Client};

/// The node the load runs on, and the ones the app's pods may use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    pub load_node: String,
    pub app_nodes: Vec<String>,
}

impl Placement {
    /// The placement on `client`'s cluster now, or `None` when fewer than two nodes take
    /// ordinary pods.
    pub async fn of(client: &Client) -> Result<Option<Placement>> {
        let nodes: Api<Node> = Api::all(client.clone());
        let list = nodes
            .list(&ListParams::default())
            .await
            .context("listing nodes for the pods' placement")?;
        Ok(Placement::from_nodes(&list.items))
    }

    /// The first schedulable node by name takes the load, the rest the app; `None` below
    /// two schedulable nodes.
    pub fn from_nodes(nodes: &[Node]) -> Option<Placement> {
        let mut names: Vec<String> = nodes
            .iter()
            .filter(|n| takes_pods(n))
            .filter_map(|n| n.metadata.name.clone())
            .collect();
        names.sort();
        if names.len() < 2 {
            return None;
        }
        let load_node = names.remove(0);
        Some(Placement {
            load_node,
            app_nodes: names,
        })
    }

    /// The loadgen pod's affinity: on [`Placement::load_node`].
    pub fn load_affinity(&self) -> Affinity {
        node_name_affinity("In", &self.load_node)
    }

    /// The app pods' affinity (every revision a rollout makes): off [`Placement::load_node`].
    pub fn app_affinity(&self) -> Affinity {
        node_name_affinity("NotIn", &self.load_node)
    }

    /// What a step prints.
    pub fn describe(&self) -> String {
        format!(
            "loadgen on node {}, the app's pods on {}",
            self.load_node,
            self.app_nodes.join(", ")
        )
    }
}

/// Ready, not cordoned, and without a taint that keeps pods with no tolerations away (a
/// kind control plane with workers has `node-role.kubernetes.io/control-plane:NoSchedule`).
fn takes_pods(node: &Node) -> bool {
    let spec = node.spec.as_ref();
    let cordoned = spec.and_then(|s| s.unschedulable).unwrap_or(false);
    let tainted = spec
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.effect != "PreferNoSchedule"));
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    ready && !cordoned && !tainted
}

/// A required node affinity on the node's name (`metadata.name`, not a label a node may
/// lack): `operator` `In` or `NotIn`.
fn node_name_affinity(operator: &str, node: &str) -> Affinity {
    Affinity {
        node_affinity: Some(NodeAffinity {
            required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_fields: Some(vec![NodeSelectorRequirement {
                        key: "metadata.name".into(),
                        operator: operator.into(),
                        values: Some(vec![node.into()]),
                    }]),
                    ..NodeSelectorTerm::default()
                }],
            }),
            ..NodeAffinity::default()
        }),
        ..Affinity::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(name: &str, ready: bool, taint: Option<&str>, cordoned: bool) -> Node {
        let taints = taint.map(
            |effect| json!([{"key": "node-role.kubernetes.io/control-plane", "effect": effect}]),
        );
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"unschedulable": cordoned, "taints": taints},
            "status": {"conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]},
        }))
        .expect("a Node")
    }

    #[test]
    fn one_node_pins_nothing() {
        // The local cluster and a one-node kind cluster (its control plane untainted).
        assert_eq!(Placement::from_nodes(&[node("n", true, None, false)]), None);
        assert_eq!(Placement::from_nodes(&[]), None);
    }

    #[test]
    fn kind_with_two_workers_splits_them() {
        let nodes = [
            node("kg-worker2", true, None, false),
            node("kg-control-plane", true, Some("NoSchedule"), false),
            node("kg-worker", true, None, false),
        ];
        let p = Placement::from_nodes(&nodes).expect("two schedulable nodes");
        assert_eq!(p.load_node, "kg-worker");
        assert_eq!(p.app_nodes, ["kg-worker2"]);
    }

    #[test]
    fn unready_cordoned_and_tainted_nodes_take_no_pods() {
        let nodes = [
            node("a", false, None, false),
            node("b", true, None, true),
            node("c", true, Some("NoExecute"), false),
            node("d", true, None, false),
        ];
        assert_eq!(Placement::from_nodes(&nodes), None);
        // A soft taint still takes pods.
        let nodes = [
            node("d", true, None, false),
            node("e", true, Some("PreferNoSchedule"), false),
        ];
        let p = Placement::from_nodes(&nodes).expect("two nodes");
        assert_eq!((p.load_node.as_str(), p.app_nodes.len()), ("d", 1));
    }

    #[test]
    fn load_and_app_affinities_are_opposite() {
        let p = Placement {
            load_node: "w1".into(),
            app_nodes: vec!["w2".into()],
        };
        let term = |a: Affinity| {
            serde_json::to_value(a).expect("json")["nodeAffinity"]
                ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
                ["matchFields"][0]
                .clone()
        };
        assert_eq!(
            term(p.load_affinity()),
            json!({"key": "metadata.name", "operator": "In", "values": ["w1"]})
        );
        assert_eq!(
            term(p.app_affinity()),
            json!({"key": "metadata.name", "operator": "NotIn", "values": ["w1"]})
        );
    }
}
