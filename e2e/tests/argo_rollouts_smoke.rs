//! The real Argo Rollouts controller in the cluster, without kubegrace: `e2e/argo/up`
//! installs it (building it first when the cache lacks it), then a canary and a blue-green
//! Rollout of the demo app each reach Healthy, get a new pod template, and reach Healthy
//! again at the new revision, with the controller's own marks on the way: the canary ran
//! its steps, the blue-green Rollout's active Service selects the new pods.
//!
//! Skipped (with a message) outside the cluster tier; inside it a missing cluster, image or
//! controller fails the test (see `kubegrace_e2e::cluster_client`).

use std::time::Duration;

use anyhow::{Result, ensure};
use k8s_openapi::api::core::v1::Service;
use kube::api::PostParams;
use kube::{Api, Client};
use kubegrace_e2e::scenario::Progress;
use kubegrace_e2e::scenario::argo::{
    CANARY_STEPS, RolloutState, blue_green_rollout, canary_rollout, demo_pod_template,
    ensure_argo_rollouts, rollout_api, rollout_service, service_pod_hash, trigger_new_revision,
    wait_healthy,
};
use kubegrace_e2e::{demo_image, in_test_namespace, require_images};

/// A first rollout and a second one each: pods to start, a 5 s pause for the canary,
/// readiness on a shared two-core node.
const ROLL_TIMEOUT: Duration = Duration::from_secs(180);
const REPLICAS: i32 = 2;

#[tokio::test]
async fn canary_and_blue_green_rollouts_reach_healthy_at_a_new_revision() -> Result<()> {
    in_test_namespace(
        "canary_and_blue_green_rollouts_reach_healthy_at_a_new_revision",
        "argo-smoke",
        |client, ns| async move {
            require_images(&client, &[demo_image()]).await?;
            ensure_argo_rollouts().await?;
            let p = Progress::default();
            let (canary, blue_green) = tokio::join!(
                roll_canary(&client, &ns, &p),
                roll_blue_green(&client, &ns, &p)
            );
            canary?;
            blue_green
        },
    )
    .await
}

/// Creates the Rollout, waits for revision 1, changes the template, waits for revision 2;
/// returns the states at both.
async fn create_and_roll(
    client: &Client,
    ns: &str,
    ro: kube::api::DynamicObject,
    p: &Progress,
) -> Result<(RolloutState, RolloutState)> {
    let api = rollout_api(client, ns);
    let name = ro.metadata.name.clone().unwrap_or_default();
    api.create(&PostParams::default(), &ro).await?;
    let first = wait_healthy(&api, &name, 1, ROLL_TIMEOUT, p).await?;
    p.step(format!(
        "Rollout {name} revision {} pods {}",
        first.revision, first.current_pod_hash
    ));
    trigger_new_revision(&api, &name, "2").await?;
    let second = wait_healthy(&api, &name, first.revision + 1, ROLL_TIMEOUT, p).await?;
    p.step(format!(
        "Rollout {name} revision {} pods {}",
        second.revision, second.current_pod_hash
    ));
    ensure!(
        second.current_pod_hash != first.current_pod_hash,
        "Rollout {name}: the new revision kept the pod hash {}",
        first.current_pod_hash
    );
    ensure!(
        second.updated_replicas == i64::from(REPLICAS)
            && second.available_replicas == i64::from(REPLICAS),
        "Rollout {name} after the roll: {second:?}"
    );
    Ok((first, second))
}

async fn roll_canary(client: &Client, ns: &str, p: &Progress) -> Result<()> {
    let name = "canary";
    let ro = canary_rollout(ns, name, REPLICAS, demo_pod_template(name))?;
    let (_, second) = create_and_roll(client, ns, ro, p).await?;
    // Past the last step: the controller ran setWeight and the pause, not a plain swap.
    ensure!(
        second.current_step_index == i64::try_from(CANARY_STEPS).ok(),
        "canary: step index {:?} after the roll, want {CANARY_STEPS}",
        second.current_step_index
    );
    Ok(())
}

async fn roll_blue_green(client: &Client, ns: &str, p: &Progress) -> Result<()> {
    let name = "bluegreen";
    let services: Api<Service> = Api::namespaced(client.clone(), ns);
    for svc in ["bluegreen-active", "bluegreen-preview"] {
        services
            .create(&PostParams::default(), &rollout_service(ns, svc, name)?)
            .await?;
    }
    let ro = blue_green_rollout(
        ns,
        name,
        REPLICAS,
        demo_pod_template(name),
        "bluegreen-active",
        "bluegreen-preview",
    )?;
    let (first, second) = create_and_roll(client, ns, ro, p).await?;
    // The controller switched the active Service over to the new pods.
    let active = service_pod_hash(client, ns, "bluegreen-active").await?;
    ensure!(
        active == second.current_pod_hash && active != first.current_pod_hash,
        "bluegreen-active selects pods {active}, want the new revision's {}",
        second.current_pod_hash
    );
    Ok(())
}
