//! Open connections: each one holds a guard, and `Closing` waits for the
//! last guard to go.

use std::sync::atomic::Ordering;

use super::Drain;

impl Drain {
    /// Registers an accepted connection; the guard unregisters it on drop.
    pub fn connection(&self) -> ConnGuard {
        let s = &self.machine;
        s.open.fetch_add(1, Ordering::AcqRel);
        s.accepted.fetch_add(1, Ordering::Relaxed);
        let ms = u64::try_from(s.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        s.last_conn_ms.store(ms, Ordering::Relaxed);
        ConnGuard {
            drain: self.clone(),
            forced: false,
        }
    }

    /// Registers something that must be waited for like a connection but is
    /// not a new arrival (an upgraded tunnel split off its connection), so it
    /// does not reset the `quiet` clock.
    pub fn track(&self) -> ConnGuard {
        self.machine.open.fetch_add(1, Ordering::AcqRel);
        ConnGuard {
            drain: self.clone(),
            forced: false,
        }
    }

    pub fn open_connections(&self) -> usize {
        self.machine.open.load(Ordering::Acquire)
    }

    pub fn connections_total(&self) -> u64 {
        self.machine.accepted.load(Ordering::Relaxed)
    }

    pub fn force_closed_total(&self) -> u64 {
        self.machine.force_closed.load(Ordering::Relaxed)
    }

    /// Resolves once no connection is open.
    pub(super) async fn wait_all_closed(&self) {
        loop {
            let notified = self.machine.idle_notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.open_connections() == 0 {
                return;
            }
            notified.await;
        }
    }
}

/// One open connection (or upgraded tunnel). Dropping it unregisters it.
pub struct ConnGuard {
    drain: Drain,
    forced: bool,
}

impl ConnGuard {
    /// This connection was closed by the drain deadline, not by its peer.
    pub fn mark_forced(&mut self) {
        self.forced = true;
    }

    pub fn drain(&self) -> &Drain {
        &self.drain
    }
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        let s = &self.drain.machine;
        if self.forced {
            s.force_closed.fetch_add(1, Ordering::Relaxed);
        }
        if s.open.fetch_sub(1, Ordering::AcqRel) == 1 {
            s.idle_notify.notify_waiters();
        }
    }
}
