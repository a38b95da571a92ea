//! kubegrace-operator: GraceRoute controller and sidecar-injection webhook.
