//! The status step's one edge: takes the drain reports waiting for the
//! route, [`plan`]s (pure), then pauses, writes the status, publishes the
//! Events, and counts the drains, in that order.
//!
//! Order matters twice. The pause comes before the status that counts the
//! drain, and a failed pause or status write puts the reports back in the
//! inbox: the retry decides again, and no drain is counted that the status
//! does not hold. The Events come after the write: they announce what the
//! status now says, and a failed write announces nothing, so its retry
//! (which finds the same change) does.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use serde_json::json;

use super::super::context::Context;
use super::super::dereference::Observed;
use super::super::drains;
use super::super::pause;
use super::{Error, Plan, Report, plan};
use crate::crd::GraceRoute;

/// Writes the report with the drain reports collected since the last pass
/// folded in; counts and announces them once the status holds them.
pub async fn update(
    ctx: &Context,
    api: &Api<GraceRoute>,
    route: &GraceRoute,
    observed: &Observed,
    report: Report,
) -> Result<(), Error> {
    let key = ObjectRef::from_obj(route);
    let label = drains::route_label(&key);
    ctx.metrics.route_seen(&label);
    let status = &report.status;
    let bare = status.pods_expected.saturating_sub(status.pods_injected);
    ctx.metrics
        .pods_not_injected(&label, i64::from(bare).max(0));
    let taken = ctx.drains.take(&key);
    let now = Time(jiff::Timestamp::now());
    let plan = plan(
        route,
        observed,
        report,
        ctx.drains.written(&key),
        taken.clone(),
        now,
    );
    if let Err(err) = send(ctx, api, route, &plan).await {
        ctx.drains.put_back(&key, taken);
        return Err(err);
    }
    ctx.drains.counted(&key, &taken, plan.drains.last.as_ref());
    for drain in &plan.drains.new {
        ctx.metrics
            .pod_drained(&label, drain.clean(), drain.outcome.requests_cut);
    }
    ctx.announce(route, &plan.events).await;
    Ok(())
}

/// The API calls of a plan: the pause, then the status (no write when only
/// timestamps would change).
async fn send(
    ctx: &Context,
    api: &Api<GraceRoute>,
    route: &GraceRoute,
    plan: &Plan,
) -> Result<(), Error> {
    let (namespace, name) = (route.namespace().unwrap_or_default(), route.name_any());
    if let Some((kind, workload)) = &plan.pause {
        pause::set_paused(&ctx.client, &namespace, *kind, workload, true)
            .await
            .map_err(|source| Error::Pause {
                namespace: namespace.clone(),
                name: format!("{kind}/{workload}"),
                source,
            })?;
    }
    for change in &plan.decisions {
        tracing::info!(namespace = %namespace, route = %name, "{change}");
    }
    if !plan.changed {
        return Ok(());
    }
    let patch = Patch::Merge(json!({ "status": plan.status }));
    match api
        .patch_status(&name, &PatchParams::default(), &patch)
        .await
    {
        Ok(written) => {
            ctx.echoes.wrote(
                crate::controller::echoes::Kind::GraceRoute,
                &written.metadata,
            );
            Ok(())
        }
        Err(source) => Err(Error::Write {
            namespace,
            name,
            source,
        }),
    }
}
