//! Drain outcomes that outlive the pod. Each sidecar leaves its final drain
//! report as its container's termination message
//! ([`kubegrace_sidecar_api::report`]); the kubelet posts that status just
//! before the pod object goes away, so a reconcile that lists pods may
//! never see it. The pod watch sees every version of the pod, so its mapper
//! [`Inbox::offer`]s each report it finds; the reconcile of the route
//! [`Inbox::take`]s them, [`fold`]s them into `status.lastDrains` (pure),
//! and counts and announces the new ones.
//!
//! Each pod is counted once: by UID, in the inbox for the life of the
//! process (a watch shows the same terminated pod several times), and in
//! `status.lastDrains.podUids` across operator restarts. The inbox also
//! keeps the totals it last wrote: the route in the controller's cache may
//! not show that status write yet when the next pod's report comes.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use kubegrace_sidecar_api::pod::CONTAINER;
use kubegrace_sidecar_api::report::{DrainOutcome, KIND};

use crate::crd::{GraceRoute, LastDrains};

/// `status.lastDrains.podUids` keeps at most this many UIDs; a rollout of
/// more pods than this may count a pod twice after an operator restart.
const MAX_UIDS: usize = 512;
/// UIDs the inbox remembers per route before it starts over (the status
/// still holds the current rollout's).
const MAX_REMEMBERED: usize = 4096;
/// Labels the workload controllers put on a pod with its template revision
/// (Deployment, StatefulSet, Argo Rollouts).
const REVISION_LABELS: [&str; 3] = [
    "pod-template-hash",
    "controller-revision-hash",
    kubegrace_api::argo::POD_TEMPLATE_HASH,
];

/// One pod's drain report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodDrain {
    pub uid: String,
    pub pod: String,
    pub labels: BTreeMap<String, String>,
    pub revision: Option<String>,
    pub outcome: DrainOutcome,
    /// When the sidecar exited with the report (the drain's end), as the
    /// kubelet recorded it: a pause decision ignores drains that ended
    /// before the rollout was last resumed.
    pub finished_at: Option<Time>,
}

impl PodDrain {
    pub fn clean(&self) -> bool {
        self.outcome.is_clean()
    }

    /// The Event text for a drain that cut something.
    pub fn note(&self) -> String {
        let o = &self.outcome;
        format!(
            "pod {}: {} connections force-closed and {} requests cut at the drain timeout ({} in flight at the trigger {}, {} finished, drain took {:.1}s); raise drain.timeout above the longest request",
            self.pod,
            o.force_closed,
            o.requests_cut,
            o.inflight_at_trigger,
            o.trigger,
            o.requests_finished,
            Duration::from_millis(o.duration_ms).as_secs_f64(),
        )
    }
}

/// The sidecar's drain report, once its container has terminated with one
/// (native sidecar: an init container; classic: a container).
pub fn report_of(pod: &Pod) -> Option<PodDrain> {
    let status = pod.status.as_ref()?;
    let sidecar = |list: &Option<Vec<ContainerStatus>>| {
        list.as_ref()
            .and_then(|l| l.iter().find(|c| c.name == CONTAINER).cloned())
    };
    let container =
        sidecar(&status.init_container_statuses).or_else(|| sidecar(&status.container_statuses))?;
    let terminated = container.state?.terminated?;
    let outcome = parse(terminated.message.as_deref()?)?;
    let labels = pod.labels().clone();
    let revision = REVISION_LABELS.iter().find_map(|k| labels.get(*k).cloned());
    Some(PodDrain {
        uid: pod.uid()?,
        pod: pod.name_any(),
        labels,
        revision,
        outcome,
        finished_at: terminated.finished_at,
    })
}

/// A kubegrace drain report, or None for anything else a termination
/// message may hold (the log tail of a sidecar that failed, say).
pub fn parse(message: &str) -> Option<DrainOutcome> {
    serde_json::from_str::<DrainOutcome>(message.trim())
        .ok()
        .filter(|o| o.kind == KIND)
}

/// The drain reports the pod watch saw, per route, until a reconcile takes
/// them; and the pods already counted.
#[derive(Default)]
pub struct Inbox {
    inner: Mutex<Boxes>,
}

#[derive(Default)]
struct Boxes {
    pending: BTreeMap<String, BTreeMap<String, PodDrain>>,
    counted: BTreeMap<String, BTreeSet<String>>,
    written: BTreeMap<String, LastDrains>,
}

/// `namespace/name`: the route's key here and its `route` metric label.
pub fn route_label(route: &ObjectRef<GraceRoute>) -> String {
    format!(
        "{}/{}",
        route.namespace.as_deref().unwrap_or_default(),
        route.name
    )
}

impl Inbox {
    fn lock(&self) -> std::sync::MutexGuard<'_, Boxes> {
        // A panic elsewhere mid-update leaves sets that are still usable.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Drops what is kept for routes (`namespace/name`) that no longer
    /// exist: a route deleted without a finalizer gets no last reconcile.
    pub fn retain(&self, exists: impl Fn(&str) -> bool) {
        let mut boxes = self.lock();
        boxes.pending.retain(|route, _| exists(route));
        boxes.counted.retain(|route, _| exists(route));
        boxes.written.retain(|route, _| exists(route));
    }

    /// From the pod watch: keeps `pod`'s report for each of `routes`.
    pub fn offer(&self, pod: &Pod, routes: &[ObjectRef<GraceRoute>]) {
        let Some(drain) = report_of(pod) else { return };
        let mut boxes = self.lock();
        for route in routes {
            let key = route_label(route);
            if boxes
                .counted
                .get(&key)
                .is_some_and(|c| c.contains(&drain.uid))
            {
                continue;
            }
            boxes
                .pending
                .entry(key)
                .or_default()
                .insert(drain.uid.clone(), drain.clone());
        }
    }

    /// The reports waiting for `route` (in UID order).
    pub fn take(&self, route: &ObjectRef<GraceRoute>) -> Vec<PodDrain> {
        self.lock()
            .pending
            .remove(&route_label(route))
            .map(|m| m.into_values().collect())
            .unwrap_or_default()
    }

    /// The totals this process last wrote for `route`, if any: newer than
    /// (or the same as) what the cached route shows.
    pub fn written(&self, route: &ObjectRef<GraceRoute>) -> Option<LastDrains> {
        self.lock().written.get(&route_label(route)).cloned()
    }

    /// The status holding `drains` (and totals `last`) was written: they are
    /// counted.
    pub fn counted(
        &self,
        route: &ObjectRef<GraceRoute>,
        drains: &[PodDrain],
        last: Option<&LastDrains>,
    ) {
        let mut boxes = self.lock();
        let key = route_label(route);
        let set = boxes.counted.entry(key.clone()).or_default();
        if set.len() + drains.len() > MAX_REMEMBERED {
            set.clear();
        }
        set.extend(drains.iter().map(|d| d.uid.clone()));
        if let Some(last) = last {
            boxes.written.insert(key, last.clone());
        }
    }

    /// Writing the status failed: the reports wait for the next reconcile.
    pub fn put_back(&self, route: &ObjectRef<GraceRoute>, drains: Vec<PodDrain>) {
        let mut boxes = self.lock();
        let pending = boxes.pending.entry(route_label(route)).or_default();
        for d in drains {
            pending.entry(d.uid.clone()).or_insert(d);
        }
    }

    /// The route is gone: forget it.
    pub fn forget(&self, route: &ObjectRef<GraceRoute>) {
        let mut boxes = self.lock();
        let key = route_label(route);
        boxes.pending.remove(&key);
        boxes.counted.remove(&key);
        boxes.written.remove(&key);
    }
}

/// What folding new reports into the last totals gives.
#[derive(Debug, Clone, PartialEq)]
pub struct Folded {
    pub last: Option<LastDrains>,
    /// The reports counted now (not seen in `last` before).
    pub new: Vec<PodDrain>,
}

/// Folds `drains` into `last` (pure): a pod already counted is skipped, a
/// pod of another revision than `last`'s starts new totals.
pub fn fold(last: Option<&LastDrains>, drains: Vec<PodDrain>, now: Time) -> Folded {
    let mut current = last.cloned();
    let mut new = Vec::new();
    for drain in drains {
        if current
            .as_ref()
            .is_some_and(|c| c.pod_uids.contains(&drain.uid))
        {
            continue;
        }
        let same_rollout = current
            .as_ref()
            .is_some_and(|c| c.revision == drain.revision);
        let totals = if same_rollout {
            current.get_or_insert_with(LastDrains::default)
        } else {
            current.insert(LastDrains {
                revision: drain.revision.clone(),
                ..LastDrains::default()
            })
        };
        totals.pods += 1;
        if drain.clean() {
            totals.clean += 1;
        } else {
            totals.force_closed += 1;
        }
        totals.requests_cut = totals
            .requests_cut
            .saturating_add(i64::try_from(drain.outcome.requests_cut).unwrap_or(i64::MAX));
        totals.pod_uids.push(drain.uid.clone());
        if totals.pod_uids.len() > MAX_UIDS {
            totals.pod_uids.remove(0);
        }
        totals.at = Some(now.clone());
        totals.summary = summary(totals);
        new.push(drain);
    }
    Folded { last: current, new }
}

/// `3/3 clean`, or `1/3 force-closed` when any drain cut something.
fn summary(t: &LastDrains) -> String {
    if t.force_closed == 0 {
        format!("{}/{} clean", t.clean, t.pods)
    } else {
        format!("{}/{} force-closed", t.force_closed, t.pods)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REPORT: &str = r#"{"kind":"kubegrace.io/drain-report","trigger":"SIGTERM","durationMs":12500,"connections":4,"inflightAtTrigger":1,"requestsFinished":9,"forceClosed":1,"requestsCut":1}"#;

    fn pod(uid: &str, hash: &str, init: bool, message: &str) -> Pod {
        let statuses = serde_json::json!([{
            "name": CONTAINER, "image": "s", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": 0, "reason": "Completed", "message": message}}
        }]);
        let key = if init {
            "initContainerStatuses"
        } else {
            "containerStatuses"
        };
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("web-{uid}"), "namespace": "shop", "uid": uid,
                         "labels": {"app": "web", "pod-template-hash": hash}},
            "status": {key: statuses}
        }))
        .expect("pod fixture")
    }

    fn clean_report() -> String {
        REPORT
            .replace("\"forceClosed\":1", "\"forceClosed\":0")
            .replace("\"requestsCut\":1", "\"requestsCut\":0")
    }

    fn now() -> Time {
        Time(jiff::Timestamp::UNIX_EPOCH)
    }

    #[test]
    fn a_report_is_read_from_the_native_or_the_classic_sidecar() {
        for init in [true, false] {
            let d = report_of(&pod("u1", "aaa", init, REPORT)).expect("report");
            assert_eq!(d.uid, "u1");
            assert_eq!(d.revision.as_deref(), Some("aaa"));
            assert_eq!((d.outcome.force_closed, d.outcome.requests_cut), (1, 1));
            assert!(!d.clean());
        }
    }

    #[test]
    fn an_argo_rollouts_pod_reports_its_revision_from_argos_hash_label() {
        let mut p = pod("u1", "aaa", true, REPORT);
        let labels = p.metadata.labels.get_or_insert_default();
        labels.remove("pod-template-hash");
        labels.insert("rollouts-pod-template-hash".into(), "7c9b".into());
        let d = report_of(&p).expect("report");
        assert_eq!(d.revision.as_deref(), Some("7c9b"));
    }

    #[test]
    fn anything_but_a_kubegrace_report_is_ignored() {
        for message in [
            "",
            "panicked at src/main.rs:3",
            r#"{"kind":"other","trigger":"x","durationMs":1,"connections":0,"inflightAtTrigger":0,"requestsFinished":0,"forceClosed":0,"requestsCut":0}"#,
            r#"{"kind":"kubegrace.io/drain-report"}"#,
        ] {
            assert_eq!(report_of(&pod("u1", "a", true, message)), None, "{message}");
        }
        let mut running = pod("u1", "a", true, REPORT);
        if let Some(s) = running.status.as_mut() {
            s.init_container_statuses = None;
        }
        assert_eq!(report_of(&running), None);
    }

    #[test]
    fn a_rollout_totals_its_pods_once_each() {
        let drains: Vec<PodDrain> = [
            ("u1", REPORT.to_string()),
            ("u2", clean_report()),
            ("u3", clean_report()),
        ]
        .iter()
        .map(|(uid, m)| report_of(&pod(uid, "old", true, m)).expect("report"))
        .collect();
        let first = fold(None, drains[..2].to_vec(), now());
        assert_eq!(first.new.len(), 2);
        // The watch shows u2 again (its Deleted event), with u3.
        let second = fold(first.last.as_ref(), drains[1..].to_vec(), now());
        assert_eq!(second.new.len(), 1);
        let last = second.last.expect("totals");
        assert_eq!(
            (last.pods, last.clean, last.force_closed, last.requests_cut),
            (3, 2, 1, 1)
        );
        assert_eq!(last.summary, "1/3 force-closed");
        assert_eq!(last.revision.as_deref(), Some("old"));
    }

    #[test]
    fn a_pod_of_another_revision_starts_the_next_rollout() {
        let old = report_of(&pod("u1", "old", true, REPORT)).expect("report");
        let next = report_of(&pod("u9", "new", true, &clean_report())).expect("report");
        let first = fold(None, vec![old], now());
        let second = fold(first.last.as_ref(), vec![next], now());
        let last = second.last.expect("totals");
        assert_eq!((last.pods, last.clean, last.force_closed), (1, 1, 0));
        assert_eq!(last.summary, "1/1 clean");
        assert_eq!(last.pod_uids, ["u9"]);
    }

    #[test]
    fn the_inbox_hands_each_pod_over_until_it_is_counted() {
        let inbox = Inbox::default();
        let route = ObjectRef::<GraceRoute>::new("web").within("shop");
        let p = pod("u1", "a", true, REPORT);
        inbox.offer(&p, std::slice::from_ref(&route));
        inbox.offer(&p, std::slice::from_ref(&route));
        let taken = inbox.take(&route);
        assert_eq!(taken.len(), 1);
        inbox.put_back(&route, taken);
        let taken = inbox.take(&route);
        assert_eq!(taken.len(), 1);
        let folded = fold(None, taken.clone(), now());
        inbox.counted(&route, &taken, folded.last.as_ref());
        inbox.offer(&p, std::slice::from_ref(&route));
        assert!(inbox.take(&route).is_empty());
        assert_eq!(inbox.written(&route), folded.last);
    }
}
