//! What every pass of the route controller shares: the client, the Event
//! recorder, the metrics, the route cache, the workload and Service stores
//! and the drain inbox. The edges of
//! the pipeline (dereference, apply, the status write) take it; the pure
//! steps never do.

use std::sync::Arc;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Client, Resource, ResourceExt};

use super::drains;
use crate::admin::Metrics;
use crate::crd::{GraceRoute, TargetKind};
use crate::tolerant::Routes;

pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    /// All routes that decode, for overlap detection and for mapping
    /// watched objects.
    pub routes: Routes,
    /// Drain reports the pod watch saw, waiting for their route's reconcile.
    pub drains: Arc<drains::Inbox>,
    /// The controller's own writes, so that their watch events queue
    /// nothing.
    pub echoes: Arc<super::echoes::Echoes>,
    /// The workloads and Services the reconciles read, kept by the
    /// controller's watches.
    pub cache: super::cache::Cache,
}

impl Context {
    /// Publishes an Event on `on` (with `related` as its secondary object).
    pub(crate) async fn publish(
        &self,
        on: &ObjectReference,
        related: Option<ObjectReference>,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: action.into(),
            secondary: related,
        };
        if let Err(e) = self.recorder.publish(&event, on).await {
            // Events are for people; a failed one must not fail the reconcile.
            tracing::debug!(error = %e, "publishing event");
        }
    }
}

/// An Event a step decided on (pure); [`Context::announce`] publishes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    pub on: Subject,
    /// The other object the Event is about (a route's Event about one of
    /// its workloads).
    pub related: Option<Subject>,
    pub type_: EventType,
    pub reason: &'static str,
    pub action: &'static str,
    pub note: String,
}

/// What an Event of a route is published on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Subject {
    Route,
    /// A workload of the route, where `kubectl describe deploy` shows it.
    Workload {
        kind: TargetKind,
        name: String,
    },
}

impl Note {
    /// An Event on the route itself.
    pub fn on_route(
        type_: EventType,
        reason: &'static str,
        action: &'static str,
        note: String,
    ) -> Self {
        Self {
            on: Subject::Route,
            related: None,
            type_,
            reason,
            action,
            note,
        }
    }
}

impl Subject {
    fn reference(&self, route: &GraceRoute) -> ObjectReference {
        match self {
            Subject::Route => route.object_ref(&()),
            Subject::Workload { kind, name } => ObjectReference {
                api_version: Some(kind.api_version()),
                kind: Some(kind.to_string()),
                name: Some(name.clone()),
                namespace: route.namespace(),
                ..Default::default()
            },
        }
    }
}

impl Context {
    /// Publishes the Events a step decided on for `route`.
    pub(crate) async fn announce(&self, route: &GraceRoute, notes: &[Note]) {
        for n in notes {
            let related = n.related.as_ref().map(|r| r.reference(route));
            self.publish(
                &n.on.reference(route),
                related,
                n.type_,
                n.reason,
                n.action,
                n.note.clone(),
            )
            .await;
        }
    }
}
