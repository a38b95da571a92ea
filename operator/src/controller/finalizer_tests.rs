//! The finalizer is held only while a route has something in a workload to
//! undo: pure decisions, and the order of the API calls around a write
//! (scripted mock API server, one second per step, so a missing or extra
//! call fails the test).

use super::*;
use crate::controller::fixtures::{DEPLOYMENT, ROUTE, checked, observed, route};
use crate::testing::{Handle, mock, no_more, reply, scripted};

const ROUTE_PATH: &str = "/apis/kubegrace.io/v1alpha1/namespaces/shop/graceroutes/web";
const CM_PATH: &str = "/api/v1/namespaces/shop/configmaps/kubegrace-web";
const DEPLOY_PATH: &str = "/apis/apps/v1/namespaces/shop/deployments/web";

fn with_rollout() -> String {
    format!("{ROUTE}  rollout: {{minReadySeconds: 3}}\n")
}

/// The route (optionally holding `finalizers`), what was observed and
/// what it wants written.
fn pass(yaml: &str, finalizers: &[&str]) -> (GraceRoute, Observed, Desired) {
    let mut r = route(yaml);
    if !finalizers.is_empty() {
        r.metadata.finalizers = Some(finalizers.iter().map(|f| f.to_string()).collect());
    }
    let seen = observed(&r, &[DEPLOYMENT], &[]);
    let (_, d) = checked(&r, &seen);
    (r, seen, d)
}

/// What the API server answers, by object.
struct Answers {
    route: Value,
    config_map: Value,
    deployment: Value,
}

impl Answers {
    /// The object a path names.
    fn of(&self, path: &str) -> Value {
        match path {
            CM_PATH => self.config_map.clone(),
            DEPLOY_PATH => self.deployment.clone(),
            _ => self.route.clone(),
        }
    }
}

/// Answers the next request with the object it names; returns (method,
/// path, content type, body).
async fn next(api: &mut Handle, answers: &Answers) -> (String, String, String, Value) {
    let seen = reply(api, 200, |path, _| answers.of(path)).await;
    (seen.method, seen.path, seen.content_type, seen.body)
}

/// The apply of a route with a rollout block: the ConfigMap, then the
/// Deployment, and no call after them.
async fn writes_then_nothing(api: &mut Handle, answers: &Answers) {
    for want in [CM_PATH, DEPLOY_PATH] {
        let (_, path, _, _) = next(api, answers).await;
        assert_eq!(path, want);
    }
    no_more(api).await;
}

/// Runs [`apply_guarded`] for the pass against `script`.
async fn run(
    (r, seen, d): (GraceRoute, Observed, Desired),
    script: impl FnOnce(Handle, Answers) -> futures_util::future::BoxFuture<'static, ()>,
) {
    let (client, handle) = mock();
    let api: Api<GraceRoute> = Api::namespaced(client.clone(), "shop");
    let answers = Answers {
        route: serde_json::to_value(&r).expect("route json"),
        config_map: serde_json::to_value(&d.config_map).expect("cm json"),
        deployment: serde_norway::from_str(DEPLOYMENT).expect("deployment"),
    };
    scripted(
        script(handle, answers),
        apply_guarded(&client, &api, &r, &seen, &d, &Echoes::default()),
    )
    .await
    .expect("apply succeeds");
}

#[test]
fn a_route_without_a_rollout_block_wants_no_finalizer() {
    let (r, seen, d) = pass(ROUTE, &[]);
    assert!(d.rollout.is_empty());
    assert!(!wanted(&r, &seen, Some(&d)));
    assert!(!wanted(&r, &seen, None));
}

#[test]
fn a_rollout_block_wants_the_finalizer() {
    let (r, seen, d) = pass(&with_rollout(), &[]);
    assert!(wanted(&r, &seen, Some(&d)));
    // Refused this pass (nothing written), with nothing recorded yet.
    assert!(!wanted(&r, &seen, None));
}

#[test]
fn a_target_that_still_carries_the_record_keeps_the_finalizer() {
    // The rollout block was removed, but the target still has the
    // originals the route recorded: its deletion must restore them.
    let (r, mut seen, _) = pass(ROUTE, &[FINALIZER]);
    seen.targets[0].0.recorded = Some(r#"{"minReadySeconds":0}"#.into());
    assert!(must_undo(&r, &seen));
    assert!(wanted(&r, &seen, None));
}

#[test]
fn the_patches_test_the_list_they_change() {
    let mut r = route(ROUTE);
    assert_eq!(
        add_patch(&r),
        json!([
            {"op": "test", "path": "/metadata/finalizers", "value": null},
            {"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]},
        ])
    );
    assert_eq!(remove_patch(&r), None);
    r.metadata.finalizers = Some(vec!["other.io/x".into()]);
    assert_eq!(
        add_patch(&r),
        json!([
            {"op": "test", "path": "/metadata/finalizers", "value": ["other.io/x"]},
            {"op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER},
        ])
    );
    r.metadata.finalizers = Some(vec!["other.io/x".into(), FINALIZER.into()]);
    assert_eq!(
        remove_patch(&r),
        Some(json!([
            {"op": "test", "path": "/metadata/finalizers/1", "value": FINALIZER},
            {"op": "remove", "path": "/metadata/finalizers/1"},
        ]))
    );
}

#[tokio::test]
async fn a_route_without_a_rollout_block_writes_its_config_map_and_never_a_finalizer() {
    run(pass(ROUTE, &[]), |mut api, answer| {
        Box::pin(async move {
            let (method, path, _, _) = next(&mut api, &answer).await;
            assert_eq!((method.as_str(), path.as_str()), ("PATCH", CM_PATH));
            no_more(&mut api).await;
        })
    })
    .await;
}

#[tokio::test]
async fn the_finalizer_is_added_before_the_first_write_into_a_workload() {
    run(pass(&with_rollout(), &[]), |mut api, answer| {
        Box::pin(async move {
            let (method, path, ct, body) = next(&mut api, &answer).await;
            assert_eq!((method.as_str(), path.as_str()), ("PATCH", ROUTE_PATH));
            assert_eq!(ct, "application/json-patch+json");
            assert_eq!(body[1]["op"], "add", "{body}");
            assert_eq!(body[1]["value"], json!([FINALIZER]), "{body}");
            writes_then_nothing(&mut api, &answer).await;
        })
    })
    .await;
}

#[tokio::test]
async fn a_route_that_holds_the_finalizer_and_writes_into_a_workload_adds_nothing() {
    run(pass(&with_rollout(), &[FINALIZER]), |mut api, answer| {
        Box::pin(async move { writes_then_nothing(&mut api, &answer).await })
    })
    .await;
}

#[tokio::test]
async fn a_finalizer_with_nothing_left_to_undo_is_released_after_the_write() {
    // Every route of an earlier release holds the finalizer.
    run(
        pass(ROUTE, &["other.io/x", FINALIZER]),
        |mut api, answer| {
            Box::pin(async move {
                let (_, path, _, _) = next(&mut api, &answer).await;
                assert_eq!(path, CM_PATH);
                let (method, path, _, body) = next(&mut api, &answer).await;
                assert_eq!((method.as_str(), path.as_str()), ("PATCH", ROUTE_PATH));
                assert_eq!(
                    body,
                    json!([
                        {"op": "test", "path": "/metadata/finalizers/1", "value": FINALIZER},
                        {"op": "remove", "path": "/metadata/finalizers/1"},
                    ])
                );
                no_more(&mut api).await;
            })
        },
    )
    .await;
}
