//! The route controller's own writes coming back through its watches.
//!
//! A reconcile that changes a route's ConfigMap, its target's rollout fields
//! or its status gets each change back as a watch event, and every one of
//! them used to queue the route again: a cold start after every route's spec
//! changed ran 2.0 reconciles per route (`make bench-scale`), the second one
//! reading everything again to find nothing to do. Before 2,000 routes can
//! be current within a minute of a start, that second pass has to go.
//!
//! The rule: after a write, the resourceVersion the API server answered
//! with is kept for the object; a watch event carrying exactly that version
//! is the write coming back (the object is what this controller just wrote
//! and saw written), so it queues nothing. Any other version, whoever wrote
//! it, queues the route as before. What is lost when the rule errs is only
//! ever a saving, never a reconcile a change needs:
//! - the event arrives before the write's answer: not recognised, one extra
//!   reconcile, as before;
//! - the table is full ([`MAX_REMEMBERED`]): it is cleared, same;
//! - a watch relists and delivers an object still at the version written:
//!   nothing changed it since, so nothing needs reconciling for it.
//!
//! A remembered version is forgotten when its echo arrives, so the table
//! holds only writes whose echo is still on its way.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use kube::core::ObjectMeta;

use crate::crd::TargetKind;

/// Writes awaiting their echo, at most. A cold start writes about three
/// objects per route; past this the table is cleared, which costs extra
/// reconciles, never a missed one.
pub const MAX_REMEMBERED: usize = 50_000;

/// The kinds the route controller writes and watches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    GraceRoute,
    ConfigMap,
    Deployment,
    StatefulSet,
    Rollout,
}

impl From<TargetKind> for Kind {
    fn from(k: TargetKind) -> Self {
        match k {
            TargetKind::Deployment => Kind::Deployment,
            TargetKind::StatefulSet => Kind::StatefulSet,
            TargetKind::Rollout => Kind::Rollout,
        }
    }
}

type Key = (Kind, String, String);

/// The resourceVersions of the controller's latest writes, by object.
#[derive(Debug, Default)]
pub struct Echoes {
    pending: Mutex<HashMap<Key, String>>,
}

fn key(kind: Kind, meta: &ObjectMeta) -> Option<Key> {
    Some((kind, meta.namespace.clone()?, meta.name.clone()?))
}

impl Echoes {
    /// Remembers what the API server answered a write with.
    pub fn wrote(&self, kind: Kind, answer: &ObjectMeta) {
        let (Some(k), Some(version)) = (key(kind, answer), answer.resource_version.clone()) else {
            return;
        };
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        if pending.len() >= MAX_REMEMBERED && !pending.contains_key(&k) {
            pending.clear();
        }
        pending.insert(k, version);
    }

    /// Whether a watched object is exactly the controller's latest write of
    /// it; forgets that write when it is.
    pub fn is_echo(&self, kind: Kind, seen: &ObjectMeta) -> bool {
        let (Some(k), Some(version)) = (key(kind, seen), seen.resource_version.as_deref()) else {
            return false;
        };
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        if pending.get(&k).is_some_and(|v| v == version) {
            pending.remove(&k);
            return true;
        }
        false
    }

    /// Writes still awaiting their echo.
    pub fn pending(&self) -> usize {
        self.pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(ns: &str, name: &str, version: &str) -> ObjectMeta {
        ObjectMeta {
            namespace: Some(ns.into()),
            name: Some(name.into()),
            resource_version: Some(version.into()),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn the_version_written_is_an_echo_once_and_any_other_is_not() {
        let e = Echoes::default();
        e.wrote(Kind::ConfigMap, &meta("shop", "kubegrace-web", "10"));
        // Someone else's later write, another object, another kind: news.
        assert!(!e.is_echo(Kind::ConfigMap, &meta("shop", "kubegrace-web", "11")));
        assert!(!e.is_echo(Kind::ConfigMap, &meta("shop", "kubegrace-api", "10")));
        assert!(!e.is_echo(Kind::ConfigMap, &meta("other", "kubegrace-web", "10")));
        assert!(!e.is_echo(Kind::Deployment, &meta("shop", "kubegrace-web", "10")));
        assert!(e.is_echo(Kind::ConfigMap, &meta("shop", "kubegrace-web", "10")));
        // Forgotten once seen: the same version again (a relist) is let
        // through, which costs a reconcile and never misses one.
        assert!(!e.is_echo(Kind::ConfigMap, &meta("shop", "kubegrace-web", "10")));
        assert_eq!(e.pending(), 0);
    }

    #[test]
    fn a_newer_write_replaces_the_older_one() {
        let e = Echoes::default();
        e.wrote(Kind::GraceRoute, &meta("shop", "web", "5"));
        e.wrote(Kind::GraceRoute, &meta("shop", "web", "7"));
        assert!(!e.is_echo(Kind::GraceRoute, &meta("shop", "web", "5")));
        assert!(e.is_echo(Kind::GraceRoute, &meta("shop", "web", "7")));
    }

    #[test]
    fn an_answer_without_a_version_or_name_is_not_remembered() {
        let e = Echoes::default();
        let mut m = meta("shop", "web", "5");
        m.resource_version = None;
        e.wrote(Kind::GraceRoute, &m);
        let mut unnamed = meta("shop", "web", "5");
        unnamed.name = None;
        e.wrote(Kind::GraceRoute, &unnamed);
        assert_eq!(e.pending(), 0);
        assert!(!e.is_echo(Kind::GraceRoute, &unnamed));
    }

    #[test]
    fn the_table_is_bounded_at_max_remembered() {
        let e = Echoes::default();
        for i in 0..MAX_REMEMBERED {
            e.wrote(Kind::ConfigMap, &meta("ns", &format!("cm-{i}"), "1"));
        }
        assert_eq!(e.pending(), MAX_REMEMBERED);
        // Rewriting a remembered object does not clear.
        e.wrote(Kind::ConfigMap, &meta("ns", "cm-0", "2"));
        assert_eq!(e.pending(), MAX_REMEMBERED);
        // One more object clears the table first.
        e.wrote(Kind::ConfigMap, &meta("ns", "one-more", "1"));
        assert_eq!(e.pending(), 1);
        assert!(e.is_echo(Kind::ConfigMap, &meta("ns", "one-more", "1")));
    }
}
