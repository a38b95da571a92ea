//! The drain journal: a drain under way, written to the pod's own volume,
//! so a sidecar restarted in the middle of it carries on instead of serving
//! as if freshly started.
//!
//! A sidecar can crash or be OOM-killed while its pod terminates, and from
//! Kubernetes 1.37 the kubelet restarts native sidecars during termination
//! without running preStop again or waiting for a probe (KEP-4438). The
//! restarted process knows nothing of the drain: it would report ready and
//! take new connections on a pod that is going away. The journal is one
//! small file in a directory that outlives the container (an `emptyDir` the
//! webhook mounts, `--state-dir`): what started the drain, whether it ends
//! the process, when it started, by when the whole drain must be over, and
//! whether the app was seen gone (the evidence of an app restart, see
//! [`super::resume`]). It is written at the trigger and at each of those
//! changes, and removed when the drain resumes.
//!
//! Only drains that start provisionally (the preStop hook, `/drain`) are
//! written: the kubelet ends a pod with preStop first. A SIGTERM that finds
//! the sidecar serving, with no preStop before it, is written nowhere: in a
//! pod that is the kubelet restarting every container in place
//! (`RestartAllContainers`, KEP-5532: no preStop, two seconds of grace),
//! after which the pod must serve again. A journal left by that kill would
//! make the next process drain and exit until the deadline, while the app
//! it fronts is back.
//!
//! At start, a journal whose deadline has not passed is a drain to carry
//! on, from its original start: the phases are timed from then, so the
//! endpoint removal the first process waited for is not waited for again,
//! and the closing timeout is cut to what is left of the deadline, so a
//! restart never holds the pod past its budget. A journal past its
//! deadline, unreadable or too large is removed and the sidecar starts
//! fresh: the worst a bad file can do is nothing.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::config::DrainConfig;

/// The journal's file name in the state directory.
pub const FILE: &str = "drain.json";
/// Largest journal read (an entry is about 200 bytes; the reason is bounded
/// by [`MAX_REASON`]).
const MAX_BYTES: u64 = 4096;
/// Longest trigger reason kept.
const MAX_REASON: usize = 256;
/// What the deadline adds to the drain's own timers: the operator's time
/// budget adds the same to the pod's grace period.
const DEADLINE_MARGIN: Duration = Duration::from_secs(5);

/// One drain under way.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    pub reason: String,
    /// SIGTERM, SIGINT or an upgrade: the process ends once drained.
    pub exit: bool,
    pub started_unix_ms: u64,
    /// When the whole drain must be over: the start, plus `maxDelay` and
    /// `timeout`, plus [`DEADLINE_MARGIN`].
    pub deadline_unix_ms: u64,
    /// The app was seen unreachable since the trigger.
    pub app_gone: bool,
}

impl Entry {
    /// A drain triggered at `now` with `timers`.
    pub fn new(reason: &str, exit: bool, now: SystemTime, timers: &DrainConfig) -> Entry {
        let started = unix_ms(now);
        let budget = timers
            .max_delay
            .get()
            .saturating_add(timers.timeout.get())
            .saturating_add(DEADLINE_MARGIN);
        Entry {
            reason: reason.chars().take(MAX_REASON).collect(),
            exit,
            started_unix_ms: started,
            deadline_unix_ms: started.saturating_add(duration_ms(budget)),
            app_gone: false,
        }
    }

    /// How long ago it started and how much of its deadline is left, at
    /// `now`; `None` once the deadline passed (or when the entry is not
    /// one a drain could have written: a deadline before its start).
    pub fn live(&self, now: SystemTime) -> Option<(Duration, Duration)> {
        let now = unix_ms(now);
        if self.deadline_unix_ms <= now || self.deadline_unix_ms < self.started_unix_ms {
            return None;
        }
        let elapsed = Duration::from_millis(now.saturating_sub(self.started_unix_ms));
        let left = Duration::from_millis(self.deadline_unix_ms - now);
        Some((elapsed, left))
    }
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, duration_ms)
}

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The journal file, and the entry last written to it.
#[derive(Debug)]
pub struct Journal {
    path: PathBuf,
    current: Mutex<Option<Entry>>,
}

impl Journal {
    /// The journal in `dir` (made if missing). Nothing is read yet: see
    /// [`Journal::take_live`].
    pub fn open(dir: &Path) -> std::io::Result<Journal> {
        std::fs::create_dir_all(dir)?;
        Ok(Journal {
            path: dir.join(FILE),
            current: Mutex::new(None),
        })
    }

    /// The drain a previous process left under way, if its deadline has not
    /// passed at `now`; anything else found there is removed (logged).
    pub fn take_live(&self, now: SystemTime) -> Option<Entry> {
        let entry = match self.read() {
            Ok(None) => return None,
            Ok(Some(entry)) => entry,
            Err(why) => {
                tracing::warn!(file = %self.path.display(), "drain journal ignored and removed: {why}");
                self.remove();
                return None;
            }
        };
        if entry.live(now).is_none() {
            tracing::info!(trigger = %entry.reason, "a drain journal past its deadline was left by an earlier process; starting fresh");
            self.remove();
            return None;
        }
        *self.lock() = Some(entry.clone());
        Some(entry)
    }

    fn read(&self) -> Result<Option<Entry>, String> {
        let file = match std::fs::File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e.to_string()),
        };
        let mut text = String::new();
        file.take(MAX_BYTES + 1)
            .read_to_string(&mut text)
            .map_err(|e| e.to_string())?;
        if text.len() as u64 > MAX_BYTES {
            return Err(format!("larger than {MAX_BYTES} bytes"));
        }
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| e.to_string())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Entry>> {
        self.current.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Writes `entry` (write then rename: a reader never sees half a file).
    /// A failure is logged, never fatal: the drain goes on without it.
    pub fn record(&self, entry: Entry) {
        let mut current = self.lock();
        if let Err(e) = self.write(&entry) {
            tracing::warn!(file = %self.path.display(), error = %e, "could not write the drain journal; a restart mid-drain would not resume it");
        }
        *current = Some(entry);
    }

    fn write(&self, entry: &Entry) -> std::io::Result<()> {
        let tmp = self.path.with_extension("tmp");
        std::fs::write(&tmp, serde_json::to_vec(entry)?)?;
        std::fs::rename(&tmp, &self.path)
    }

    /// Changes the entry under way, if there is one.
    pub fn update(&self, change: impl FnOnce(&mut Entry)) {
        let Some(mut entry) = self.lock().clone() else {
            return;
        };
        change(&mut entry);
        self.record(entry);
    }

    /// The drain is over without an exit (it resumed): nothing to carry on.
    pub fn clear(&self) {
        *self.lock() = None;
        self.remove();
    }

    fn remove(&self) {
        match std::fs::remove_file(&self.path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(file = %self.path.display(), error = %e, "could not remove the drain journal")
            }
        }
    }

    #[cfg(test)]
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drain::testing::timers;

    /// A fresh directory of this test's own under the system's temp dir.
    fn test_dir(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("kubegrace-journal-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_700_000_000 + secs)
    }

    #[test]
    fn an_entry_lives_until_its_deadline() {
        // minDelay 1s, quiet 1s, maxDelay 10s, timeout 20s: 35 s with the margin.
        let e = Entry::new("SIGTERM", true, at(0), &timers(1000, 1000, 10_000, 20_000));
        assert_eq!(e.deadline_unix_ms - e.started_unix_ms, 35_000);
        assert_eq!(
            e.live(at(5)),
            Some((Duration::from_secs(5), Duration::from_secs(30)))
        );
        assert_eq!(
            e.live(at(34)),
            Some((Duration::from_secs(34), Duration::from_secs(1)))
        );
        assert_eq!(e.live(at(35)), None);
        assert_eq!(e.live(at(3600)), None);
        // A clock that went back: still live, elapsed 0.
        assert_eq!(
            Entry::new("x", false, at(10), &timers(1, 1, 1, 1))
                .live(at(9))
                .map(|(e, _)| e),
            Some(Duration::ZERO)
        );
        let reversed = Entry {
            deadline_unix_ms: e.started_unix_ms - 1,
            ..e.clone()
        };
        assert_eq!(reversed.live(at(0)), None);
    }

    #[test]
    fn a_long_reason_is_cut_at_the_bound() {
        let e = Entry::new(&"r".repeat(1000), false, at(0), &timers(1, 1, 1, 1));
        assert_eq!(e.reason.len(), MAX_REASON);
    }

    #[test]
    fn a_journal_round_trips_and_goes_when_cleared() {
        let dir = test_dir("round-trip");
        let journal = Journal::open(&dir).expect("open");
        assert_eq!(journal.take_live(SystemTime::now()), None);
        let e = Entry::new(
            "admin /drain",
            false,
            SystemTime::now(),
            &timers(1000, 1000, 10_000, 10_000),
        );
        journal.record(e.clone());
        journal.update(|e| e.app_gone = true);
        let again = Journal::open(&dir).expect("open");
        let found = again.take_live(SystemTime::now()).expect("live");
        assert!(found.app_gone);
        assert_eq!(found.reason, e.reason);
        again.clear();
        assert!(!again.path().exists());
        assert_eq!(
            Journal::open(&dir)
                .expect("open")
                .take_live(SystemTime::now()),
            None
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_stale_malformed_or_oversized_journal_is_removed_and_ignored() {
        let dir = test_dir("stale");
        let journal = Journal::open(&dir).expect("open");
        let stale = Entry::new("SIGTERM", true, at(0), &timers(1, 1, 1, 1));
        journal.record(stale);
        assert_eq!(journal.take_live(SystemTime::now()), None);
        assert!(!journal.path().exists());
        for bad in ["{not json", "", "[]"] {
            std::fs::write(journal.path(), bad).expect("write");
            assert_eq!(journal.take_live(SystemTime::now()), None, "{bad:?}");
            assert!(!journal.path().exists(), "{bad:?}");
        }
        // At the size bound it is read; past it, removed.
        let live = Entry::new(
            "SIGTERM",
            true,
            SystemTime::now(),
            &timers(1000, 1000, 10_000, 10_000),
        );
        let json = serde_json::to_string(&live).expect("json");
        let padded = format!("{json:<width$}", width = MAX_BYTES as usize);
        std::fs::write(journal.path(), &padded).expect("write");
        assert_eq!(journal.take_live(SystemTime::now()), Some(live));
        std::fs::write(journal.path(), format!("{padded} ")).expect("write");
        assert_eq!(journal.take_live(SystemTime::now()), None);
        assert!(!journal.path().exists());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
