//! Giving memory back after a spike. A sidecar sits in every pod, so what it
//! keeps after a burst of connections is kept thousands of times over.
//! glibc's malloc keeps the pages of freed allocations: a heap whose top is
//! held by one live allocation cannot shrink, and the per-thread arenas the
//! runtime's workers allocate from rarely do. Measured (bench/README.md):
//! 10,000 idle connections closed left the RSS at 13x idle 30 s later.
//! `malloc_trim` walks the free lists and returns whole free pages to the
//! kernel wherever they are.
//!
//! It runs on a blocking thread (it holds each arena's lock while it walks
//! it) and only when connections went away: at least [`CLOSED_FOR_TRIM`]
//! closed since the last trim and the count no longer rising, checked every
//! [`TICK`]. It ignores the trim threshold main.rs raises to 4 MiB so that
//! a loaded sidecar keeps its heap between requests. The release images link
//! glibc statically, so this runs there too; other C libraries (musl) have
//! no `malloc_trim`, and there only the fast path's spare buffers are
//! released.

use std::time::Duration;

use crate::drain::Drain;

/// How often the connection count is looked at.
const TICK: Duration = Duration::from_secs(5);
/// Connections closed since the last trim that make the next one worth it:
/// a few dozen idle connections are a few hundred KiB.
const CLOSED_FOR_TRIM: u64 = 64;

/// Runs for the life of the process.
pub(crate) async fn give_back_after_spikes(drain: Drain) {
    let mut closed_at_trim = closed(&drain);
    let mut open_before = drain.open_connections();
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let open = drain.open_connections();
        let closed_now = closed(&drain);
        if should_trim(closed_now - closed_at_trim, open, open_before) {
            closed_at_trim = closed_now;
            // The fast path's spare buffers (proxy/h1/spare.rs) were kept
            // for the spike's next connections; the stack of app read
            // buffers in particular only shrinks when a buffer comes back,
            // which an idle sidecar never does. Held, they pin the heap
            // pages around them that the trim would return (measured: the
            // after-spike RSS went from +27% to +50% of idle with them).
            // This task runs on the runtime's thread: with one CPU, the
            // only one that has spares.
            crate::proxy::h1::release_spare_buffers(open);
            if trim_supported() {
                let _ = tokio::task::spawn_blocking(trim).await;
                tracing::debug!(open, "returned free heap pages to the kernel");
            }
        }
        open_before = open;
    }
}

/// Enough connections went away and the count is not climbing (trimming
/// in the middle of a rise would hand back pages about to be taken again).
fn should_trim(closed_since_trim: u64, open: usize, open_before: usize) -> bool {
    closed_since_trim >= CLOSED_FOR_TRIM && open <= open_before
}

fn closed(drain: &Drain) -> u64 {
    drain
        .connections_total()
        .saturating_sub(drain.open_connections() as u64)
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn trim_supported() -> bool {
    true
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn trim() {
    unsafe extern "C" {
        fn malloc_trim(pad: usize) -> std::ffi::c_int;
    }
    // SAFETY: malloc_trim takes no pointer and touches only glibc's own
    // free lists, under the arenas' locks; any thread may call it at any
    // time (glibc documents it MT-Safe).
    unsafe {
        malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim_supported() -> bool {
    false
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim() {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trims_once_enough_closed_and_the_count_stopped_rising() {
        assert!(should_trim(64, 10, 10));
        assert!(should_trim(10_000, 0, 10_000));
        // Still rising: later.
        assert!(!should_trim(500, 300, 200));
        // A few closed: not worth a walk of the heap.
        assert!(!should_trim(63, 0, 63));
    }
}
