//! What the rules unit tests share: routes and pod templates from inline
//! YAML, and the sidecar's reading of a rendered config.

use k8s_openapi::api::core::v1::PodTemplateSpec;
use kubegrace_sidecar_api::config::Config;

use super::{budget, sidecar_config};
use crate::crd::GraceRoute;

pub(super) fn route(yaml: &str) -> GraceRoute {
    serde_norway::from_str(yaml).expect("valid route yaml")
}

/// Reads a rendered config back the way the sidecar reads its file.
pub(super) fn sidecar_reads(yaml: &str) -> Config {
    let config: Config = serde_norway::from_str(yaml).expect("the sidecar parses it");
    config.validate().expect("the sidecar accepts it");
    config
}

pub(super) use kubegrace_api::fixtures::ROUTE_YAML as BASE;

pub(super) fn template(yaml: &str) -> PodTemplateSpec {
    serde_norway::from_str(yaml).expect("valid template")
}
/// The sidecar config a route renders to (without a port plan).
pub(super) fn config_of(route_yaml: &str) -> Config {
    let spec = route(route_yaml).spec;
    let budget = budget(&spec).expect("valid");
    sidecar_config(&spec, &budget, None).expect("valid")
}

/// The route's ConfigMap file, and the sidecar's reading of it.
pub(super) fn rendered(route_yaml: &str) -> (String, Config) {
    let (yaml, _) = sidecar_config::render(&config_of(route_yaml)).expect("render");
    let read = sidecar_reads(&yaml);
    (yaml, read)
}
