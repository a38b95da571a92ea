//! The operator in-process against a real kube-apiserver (the cluster tier:
//! see `kubegrace_e2e::cluster_client`; outside it every test prints that it
//! skipped).
//!
//! The operator runs on this host; the API server reaches its webhook by URL
//! (`https://127.0.0.1:<port>/mutate`), with the caBundle the operator itself
//! patches in. That needs an API server on this host (the local cluster of
//! `e2e/cluster/up`), not one in a container (kind). Each test has its own
//! labelled namespace, webhook configuration, Lease and ports, and removes
//! them at the end; the tests run one at a time because every operator
//! watches all namespaces.

mod admission;
mod balancer;
mod harness;
mod ownership;
mod pause;
mod reconcile;
mod resilience;
mod sidecar_pod;
