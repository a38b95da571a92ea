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
//! closed since the last trim, the count no longer rising and at most half
//! of its peak since the last trim, checked every [`TICK`]; and once more when the idle app connections the spike left in
//! the upstream pool have aged out (see [`TrimPlan`]). It ignores the trim
//! threshold allocator.rs raises to 4 MiB so that a loaded sidecar keeps its
//! heap between requests. The release images link glibc statically, so
//! this runs there too; other C libraries (musl) have no `malloc_trim`, and
//! there only the fast path's spare buffers are released.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::drain::Drain;
use crate::state::Shared;

/// How often the connection count is looked at.
const TICK: Duration = Duration::from_secs(5);
/// Connections closed since the last trim that make the next one worth it:
/// a few dozen idle connections are a few hundred KiB.
const CLOSED_FOR_TRIM: u64 = 64;

/// Runs for the life of the process.
pub(crate) async fn give_back_after_spikes(shared: Arc<Shared>) {
    let drain = &shared.drain;
    let mut plan = TrimPlan::new(closed(drain), drain.open_connections());
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let open = drain.open_connections();
        // upstreamPool takes a restart to change (reload.rs), so the live
        // value is the pools' own.
        let pool_idle_timeout = shared.live.load().config.upstream_pool.idle_timeout.get();
        let Some(trim_kind) = plan.at_tick(Instant::now(), open, closed(drain), pool_idle_timeout)
        else {
            continue;
        };
        // The fast path's spare buffers (spare.rs) were kept for
        // the spike's next connections; the stack of app read buffers in
        // particular only shrinks when a buffer comes back, which an idle
        // sidecar never does. Held, they pin the heap pages around them
        // that the trim would return (measured: the after-spike RSS went
        // from +27% to +50% of idle with them). This task runs on the
        // runtime's thread: with one CPU, the only one that has spares.
        crate::proxy::h1::release_spare_buffers(open);
        if trim_supported() {
            // Taken here, on the thread whose cache it is (the runtime's
            // only thread on one CPU; one worker's of several on more).
            let cached = take_thread_cache();
            // /proc is read only for the debug line that shows it.
            let logged = tracing::enabled!(tracing::Level::DEBUG);
            let before_kib = logged.then(resident_kib);
            let _ = tokio::task::spawn_blocking(move || trim(cached)).await;
            if let Some(before_kib) = before_kib {
                tracing::debug!(
                    open,
                    ?trim_kind,
                    before_kib,
                    after_kib = resident_kib(),
                    "returned free heap pages to the kernel"
                );
            }
        }
    }
}

/// Why a trim runs now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TrimKind {
    /// Enough connections closed and the count is not climbing (trimming
    /// in the middle of a rise would hand back pages about to be taken
    /// again).
    AfterCloses,
    /// The spike's idle app connections are gone. A spike of client
    /// connections leaves up to as many idle app connections in the
    /// upstream pool (proxy/h1/pool.rs, upstream/idle.rs), whose sockets
    /// and registrations, a few hundred bytes each, sit one or two to a
    /// page among the freed ones: the trim right after the spike cannot
    /// return those pages. The pool's reaper closes them within one and a
    /// half idle timeouts (it runs every half timeout). Measured with
    /// 10,000 connections closed and then 256 for 3 s: RSS 7,412 KiB after
    /// the first trim, 6,484 KiB after this one (idle: 6,068).
    PoolAgedOut,
}

/// When to trim: the state carried from tick to tick.
struct TrimPlan {
    closed_at_trim: u64,
    open_before: usize,
    /// The most connections open since the last trim: a spike is over
    /// once at most half of them are left. Without it a steady churn (a
    /// connection per request: dozens closed every tick, the count
    /// going up and down) trimmed every other tick in the middle of the
    /// load, emptying the allocator's cache (256 deep, allocator.rs:
    /// 16,384 allocations on the runtime's thread) for pages the next
    /// requests take again.
    peak: usize,
    /// When the idle app connections left by the last spike are gone.
    pool_aged_out_at: Option<Instant>,
}

impl TrimPlan {
    fn new(closed: u64, open: usize) -> TrimPlan {
        TrimPlan {
            closed_at_trim: closed,
            open_before: open,
            peak: open,
            pool_aged_out_at: None,
        }
    }

    /// `closed`: connections closed since start; `open`: open now.
    fn at_tick(
        &mut self,
        now: Instant,
        open: usize,
        closed: u64,
        pool_idle_timeout: Duration,
    ) -> Option<TrimKind> {
        let not_rising = open <= self.open_before;
        self.open_before = open;
        self.peak = self.peak.max(open);
        if !not_rising {
            return None;
        }
        if closed.saturating_sub(self.closed_at_trim) >= CLOSED_FOR_TRIM && open <= self.peak / 2 {
            self.closed_at_trim = closed;
            self.peak = open;
            self.pool_aged_out_at = Some(now + pool_idle_timeout + pool_idle_timeout / 2);
            return Some(TrimKind::AfterCloses);
        }
        if self.pool_aged_out_at.is_some_and(|at| now >= at) {
            self.pool_aged_out_at = None;
            return Some(TrimKind::PoolAgedOut);
        }
        None
    }
}

fn closed(drain: &Drain) -> u64 {
    drain
        .connections_total()
        .saturating_sub(drain.open_connections() as u64)
}

/// VmRSS, for the debug log's before and after.
fn resident_kib() -> u64 {
    let pages = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|statm| statm.split_whitespace().nth(1)?.parse::<u64>().ok());
    pages.unwrap_or(0) * 4
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn trim_supported() -> bool {
    true
}

/// glibc's per-thread cache (tcache): the last chunks freed in each of its
/// 64 size classes up to 1,032 bytes (256 each as allocator.rs sets it, 7
/// by glibc's default) stay with the thread that freed them, for its next
/// allocations of that size. To the heap they are in use, so `malloc_trim`
/// cannot return the pages they sit on, and after a spike they are the
/// spike's last frees, scattered over pages that are otherwise free: up to
/// 448 pages, 1.75 MiB, at 7 a class. glibc has no call to flush the cache
/// (jemalloc's `thread.tcache.flush`, mimalloc's `mi_collect`); it is
/// emptied when the thread exits. So the chunks are taken out of it by
/// allocating them (an allocation of a cached size is served from the
/// cache first) and freed on a short-lived thread, whose exit hands them
/// to the heap's free lists before the trim. At 256 a class that is
/// 16,384 allocations once after a spike (a few ms on this thread) and up
/// to 8.3 MiB more heap for that moment, which the trim returns with the
/// rest. Measured with 10,000
/// connections closed and then 256 for 3 s, 30 s later (two runs each, 7 a
/// class): the heap's resident pages 524-528 KiB without, 184-200 KiB
/// with; VmRSS +10-11% of idle without, +4-6% with.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
struct ThreadCacheChunks(Vec<usize>);

/// glibc's size classes: 64, 16 bytes apart, the smallest chunk 32 bytes
/// (24 usable).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const TCACHE_CLASSES: usize = 64;

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn take_thread_cache() -> ThreadCacheChunks {
    // An operator who changed the cache's classes through GLIBC_TUNABLES
    // has other numbers than these; taking too few would leave chunks
    // behind. Its depth is read: ours, glibc's, or an operator's.
    let Some(per_class) = crate::allocator::thread_cache_per_class() else {
        return ThreadCacheChunks(Vec::new());
    };
    let mut chunks = Vec::with_capacity(TCACHE_CLASSES * per_class);
    for class in 0..TCACHE_CLASSES {
        let usable = 24 + 16 * class;
        for _ in 0..per_class {
            // SAFETY: malloc takes a size and returns a pointer owned by
            // the returned value, whose Drop frees it; nothing reads or
            // writes through it. A null (out of memory) is skipped.
            let chunk = unsafe { libc_heap::malloc(usable) };
            if !chunk.is_null() {
                chunks.push(chunk as usize);
            }
        }
    }
    ThreadCacheChunks(chunks)
}

/// Frees the chunks on a thread that exits at once, so they end on the
/// heap's free lists rather than in this thread's cache, then returns the
/// free pages.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn trim(cached: ThreadCacheChunks) {
    if !cached.0.is_empty() {
        let freeing = std::thread::Builder::new()
            .name("kubegrace-free".into())
            .spawn(move || drop(cached));
        match freeing {
            Ok(thread) => {
                let _ = thread.join();
            }
            // The closure, chunks and all, was dropped here: freed into
            // this thread's cache, not lost.
            Err(err) => tracing::debug!(error = %err, "no thread to empty the malloc cache on"),
        }
    }
    // SAFETY: malloc_trim takes no pointer and touches only glibc's own
    // free lists, under the arenas' locks; any thread may call it at any
    // time (glibc documents it MT-Safe).
    unsafe {
        libc_heap::malloc_trim(0);
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
impl Drop for ThreadCacheChunks {
    fn drop(&mut self) {
        for &chunk in &self.0 {
            // SAFETY: each was returned by malloc in `take_thread_cache`,
            // never handed to anything else, and is freed once: here, as
            // the only owner goes.
            unsafe { libc_heap::free(chunk as *mut std::ffi::c_void) };
        }
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
mod libc_heap {
    unsafe extern "C" {
        pub(super) fn malloc(size: usize) -> *mut std::ffi::c_void;
        pub(super) fn free(ptr: *mut std::ffi::c_void);
        pub(super) fn malloc_trim(pad: usize) -> std::ffi::c_int;
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
struct ThreadCacheChunks;

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn take_thread_cache() -> ThreadCacheChunks {
    ThreadCacheChunks
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim_supported() -> bool {
    false
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim(_: ThreadCacheChunks) {}

#[cfg(test)]
mod tests {
    use super::*;

    const POOL_IDLE: Duration = Duration::from_secs(4);

    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn the_thread_cache_is_taken_and_freed_on_a_passing_thread() {
        let expected = crate::allocator::thread_cache_per_class().map_or(0, |n| n * TCACHE_CLASSES);
        let cached = take_thread_cache();
        assert_eq!(cached.0.len(), expected);
        // glibc aborts the process on a double or foreign free.
        trim(cached);
        trim(take_thread_cache());
    }

    /// One tick of a plan: (ticks since start, open, closed, expected).
    type Tick = (u32, usize, u64, Option<TrimKind>);

    /// Runs `ticks` through a plan that starts with `open` connections and
    /// none closed; each tick's decision must be the expected one.
    fn walk(open: usize, ticks: &[Tick]) {
        let start = Instant::now();
        let mut plan = TrimPlan::new(0, open);
        for (i, &(tick, open, closed, expected)) in ticks.iter().enumerate() {
            let got = plan.at_tick(start + TICK * tick, open, closed, POOL_IDLE);
            assert_eq!(
                got, expected,
                "step {i} (tick {tick}, {open} open, {closed} closed)"
            );
        }
    }

    #[test]
    fn trims_once_enough_closed_and_the_count_stopped_rising() {
        walk(
            0,
            &[
                // 10,000 opened: rising.
                (0, 10_000, 0, None),
                // A few closed: not worth a walk of the heap.
                (1, 9_937, 63, None),
                // Still rising again: later.
                (2, 9_990, 500, None),
                (3, 0, 10_000, Some(TrimKind::AfterCloses)),
                // Nothing more closed.
                (4, 0, 10_000, None),
            ],
        );
    }

    #[test]
    fn a_steady_churn_is_no_spike_until_it_ends() {
        walk(
            0,
            &[
                (0, 64, 0, None),
                // A connection per request at 64 at a time: thousands
                // closed a tick, the count up and down, never half gone.
                (1, 60, 9_000, None),
                (2, 64, 18_000, None),
                (3, 33, 27_000, None),
                (4, 50, 36_000, None),
                // The load ended.
                (5, 0, 40_000, Some(TrimKind::AfterCloses)),
                (6, 0, 40_000, None),
            ],
        );
    }

    #[test]
    fn trims_again_once_the_spikes_idle_app_connections_aged_out() {
        walk(
            1_000,
            &[
                (0, 0, 1_000, Some(TrimKind::AfterCloses)),
                // The reaper runs every half timeout: gone by 1.5 timeouts (6 s).
                (1, 0, 1_000, None),
                (2, 0, 1_000, Some(TrimKind::PoolAgedOut)),
                // Once.
                (3, 0, 1_000, None),
            ],
        );
    }

    #[test]
    fn a_rise_puts_the_follow_up_off_and_a_new_spike_moves_it() {
        walk(
            1_000,
            &[
                (0, 0, 1_000, Some(TrimKind::AfterCloses)),
                // Due, but connections are coming in: not while they do.
                (2, 300, 1_000, None),
                (3, 300, 1_010, Some(TrimKind::PoolAgedOut)),
                // A second spike's trim sets a new follow-up from its own time.
                (4, 0, 1_310, Some(TrimKind::AfterCloses)),
                (5, 0, 1_310, None),
                (6, 0, 1_310, Some(TrimKind::PoolAgedOut)),
            ],
        );
    }
}
