//! The route's finalizer (`kubegrace.io/cleanup`), held only while the
//! route has written something into a workload that its deletion must
//! undo.
//!
//! A route without a `rollout` block writes only its own ConfigMap, which
//! the garbage collector removes through the owner reference: such a route
//! needs no finalizer, and without one it can be deleted when the operator
//! is gone first (an Argo CD app or a namespace deleted as a whole), where
//! a finalizer would leave it Terminating for good.
//!
//! Expected flow (as kube-runtime's `finalizer` helper documents it, with
//! the add moved to where it is needed):
//! 1. A live route that is about to write into a workload (an explicit
//!    `rollout` block), or whose targets still carry what it wrote (the
//!    recorded originals, a pod-template pin of an earlier version), gets
//!    the finalizer *before* that write ([`apply_guarded`]).
//! 2. Once nothing is left to undo (the rollout block and its record are
//!    gone, the target changed), the finalizer is released after the
//!    write that made it so.
//! 3. A deleted route with the finalizer has its targets restored, then
//!    the finalizer released ([`release`]); without it there is nothing to
//!    do and the API server has already let it go.
//!
//! Every step is idempotent, and each patch `test`s the list it changes,
//! so a concurrent edit fails the patch (and the reconcile retries) rather
//! than dropping someone else's finalizer.

use kube::api::{Patch, PatchParams};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::{Value, json};

use super::apply;
use super::build::Desired;
use super::dereference::Observed;
use super::echoes::Echoes;
use crate::FINALIZER;
use crate::crd::GraceRoute;

/// What failed in the finalizer's patches.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{what} the finalizer of GraceRoute {route}: {source}")]
    Patch {
        what: &'static str,
        route: String,
        #[source]
        source: kube::Error,
    },
    #[error("the finalizer patch: {0}")]
    Serde(#[source] serde_json::Error),
}

impl Error {
    /// The metric label.
    pub fn kind(&self) -> &'static str {
        "finalizer"
    }
}

/// What this route wrote into its targets and would restore on deletion:
/// the recorded originals, or a pod-template pin to it. The same test as
/// [`apply::cleanup`]'s.
pub fn must_undo(route: &GraceRoute, observed: &Observed) -> bool {
    let name = route.name_any();
    observed
        .targets
        .iter()
        .any(|(t, _)| t.recorded.is_some() || t.pinned_route() == Some(name.as_str()))
}

/// Whether the route must hold the finalizer once `desired` is written
/// (`None`: nothing will be written this pass).
pub fn wanted(route: &GraceRoute, observed: &Observed, desired: Option<&Desired>) -> bool {
    desired.is_some_and(|d| !d.rollout.is_empty()) || must_undo(route, observed)
}

/// The route holds the finalizer.
pub fn has(route: &GraceRoute) -> bool {
    route.finalizers().iter().any(|f| f == FINALIZER)
}

/// The JSON patch that adds the finalizer, `test`ing the list it extends.
fn add_patch(route: &GraceRoute) -> Value {
    match route.meta().finalizers.as_deref() {
        None | Some([]) => json!([
            {"op": "test", "path": "/metadata/finalizers", "value": null},
            {"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]},
        ]),
        Some(list) => json!([
            {"op": "test", "path": "/metadata/finalizers", "value": list},
            {"op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER},
        ]),
    }
}

/// The JSON patch that removes the finalizer at its index, `None` when the
/// route does not hold it.
fn remove_patch(route: &GraceRoute) -> Option<Value> {
    let i = route.finalizers().iter().position(|f| f == FINALIZER)?;
    let path = format!("/metadata/finalizers/{i}");
    Some(json!([
        {"op": "test", "path": path, "value": FINALIZER},
        {"op": "remove", "path": path},
    ]))
}

async fn patch(
    api: &Api<GraceRoute>,
    route: &GraceRoute,
    body: Value,
    what: &'static str,
) -> Result<(), Error> {
    let name = route.name_any();
    let patch: json_patch::Patch = serde_json::from_value(body).map_err(Error::Serde)?;
    match api
        .patch(&name, &PatchParams::default(), &Patch::<()>::Json(patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(source) => Err(Error::Patch {
            what,
            route: name,
            source,
        }),
    }
}

/// Adds the finalizer unless the route holds it.
pub async fn hold(api: &Api<GraceRoute>, route: &GraceRoute) -> Result<(), Error> {
    if has(route) {
        return Ok(());
    }
    patch(api, route, add_patch(route), "adding").await?;
    tracing::info!(namespace = route.namespace().unwrap_or_default(), route = %route.name_any(), "finalizer added: the route writes into its targets and restores them when deleted");
    Ok(())
}

/// Releases the finalizer if the route holds it.
pub async fn release(api: &Api<GraceRoute>, route: &GraceRoute) -> Result<(), Error> {
    let Some(body) = remove_patch(route) else {
        return Ok(());
    };
    patch(api, route, body, "releasing").await?;
    tracing::info!(namespace = route.namespace().unwrap_or_default(), route = %route.name_any(), "finalizer released: nothing in a workload left to restore");
    Ok(())
}

/// Writes `desired` (the apply step) with the finalizer held exactly while needed: added
/// before the first write into a workload, released after the write that
/// left nothing to undo.
pub async fn apply_guarded(
    client: &Client,
    api: &Api<GraceRoute>,
    route: &GraceRoute,
    observed: &Observed,
    desired: &Desired,
    echoes: &Echoes,
) -> crate::Result<()> {
    let ns = route.namespace().unwrap_or_default();
    let wanted = wanted(route, observed, Some(desired));
    if wanted {
        hold(api, route).await?;
    }
    apply::apply(client, &ns, desired, echoes).await?;
    if !wanted {
        release(api, route).await?;
    }
    Ok(())
}

/// A pass that writes nothing (the route is refused): the finalizer
/// follows what is already in the targets.
pub async fn follow(
    api: &Api<GraceRoute>,
    route: &GraceRoute,
    observed: &Observed,
) -> Result<(), Error> {
    if wanted(route, observed, None) {
        hold(api, route).await
    } else {
        release(api, route).await
    }
}

#[cfg(test)]
#[path = "finalizer_tests.rs"]
mod tests;
