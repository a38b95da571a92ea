//! glibc's malloc, set for a proxy. The binary calls [`exec_tuned`] first
//! thing and [`tune_heap`] after it; `memory.rs` asks
//! [`thread_cache_per_class`] how deep the cache it empties is.
//!
//! The per-thread cache (tcache) is glibc's fast path: each of its 64 size
//! classes up to 1,032 bytes keeps the last chunks freed, 7 by default,
//! for the thread's next allocations of that size. A proxy allocates and
//! frees in batches: one read of a busy connection carries dozens of
//! requests, and their heads, bodies and stream states are allocated one
//! after another, then freed as their answers go out. Past the seventh
//! free of a class in a batch a chunk goes to the arena's bins, and the
//! next allocation takes the slow path (`_int_malloc`, `_int_free`,
//! consolidation): with 64 gRPC calls in flight that was a sixth of the
//! sidecar's instructions per call, and h2load's 256 streams in flight
//! missed a cache 64 deep as well (bench/README.md, #39). HAProxy keeps
//! per-thread pool caches for the same reason.
//!
//! glibc reads the cache's depth from `GLIBC_TUNABLES` when the process
//! starts, and has no call to change it later (`mallopt` covers the trim
//! and mmap thresholds only). So the binary, started without
//! `GLIBC_TUNABLES`, executes itself again at once with [`TUNABLES`] set:
//! same pid, same arguments, same open descriptors (inherited listeners
//! included), a millisecond at start. An operator who sets `GLIBC_TUNABLES`
//! (even empty) keeps exactly what they set; so does a process started by
//! an upgrade, which inherits ours.

/// glibc's tunables the sidecar runs with: 256 chunks per cache class, and
/// the heap thresholds [`tune_heap`] sets otherwise. What the cache holds
/// is what the last burst freed, of the sizes it used; at most 256 x 64
/// chunks of 24 to 1,032 bytes, 8.3 MiB, were every class filled. In
/// `make bench` the RSS under 256 keep-alive connections went from 10,980
/// to 11,360 KiB (medians), and the high-water mark over the whole run
/// from 10,948 to 15,120-15,636 KiB: `memory.rs` empties the cache after a
/// spike by allocating 256 chunks of every class at once, most of them
/// fresh heap for that moment.
/// Measured per relayed request (callgrind, bench/profile): h2c with 256
/// streams in flight 33,112 instructions at 64 deep, 31,799 at 128, 31,109
/// at 256; gRPC unary 46,984 at 64, 46,069 at 256.
pub const TUNABLES: &str = "glibc.malloc.tcache_count=256:glibc.malloc.trim_threshold=4194304:glibc.malloc.mmap_threshold=1048576";

/// The variable glibc reads [`TUNABLES`] from.
pub const TUNABLES_ENV: &str = "GLIBC_TUNABLES";

/// glibc's default chunks per cache class.
const DEFAULT_PER_CLASS: usize = 7;

/// The most chunks per class [`thread_cache_per_class`] answers for: a
/// deeper cache is not emptied (64 classes of it would be allocated).
const MAX_PER_CLASS_EMPTIED: usize = 1024;

/// Executes this binary again with [`TUNABLES`] when the environment has no
/// `GLIBC_TUNABLES`. Returns only when it did not: `None` when it had
/// nothing to do, the error when the exec failed (the process goes on with
/// glibc's defaults and [`tune_heap`]'s thresholds, as before the exec
/// existed).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn exec_tuned() -> Option<std::io::Error> {
    use std::os::unix::process::CommandExt;
    if std::env::var_os(TUNABLES_ENV).is_some() {
        return None;
    }
    // The path, not /proc/self/exe: under valgrind the link names
    // valgrind's tool, which valgrind answers for with the program's path.
    // A binary replaced on disk reads "PATH (deleted)"; the link still
    // reaches the running one.
    let exe = match std::env::current_exe() {
        Ok(path) if !path.to_string_lossy().ends_with(" (deleted)") => path,
        _ => std::path::PathBuf::from("/proc/self/exe"),
    };
    let mut args = std::env::args_os();
    let mut command = std::process::Command::new(exe);
    if let Some(arg0) = args.next() {
        command.arg0(arg0);
    }
    Some(command.args(args).env(TUNABLES_ENV, TUNABLES).exec())
}

/// Other C libraries have no tunables to set.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn exec_tuned() -> Option<std::io::Error> {
    None
}

/// The chunks per class of this process's thread cache, as far as the
/// environment says: glibc's 7 without tunables, the count set otherwise.
/// `None` when the cache's classes were changed (`tcache_max`), the count
/// does not parse or is deeper than is worth emptying: what `memory.rs`
/// would take out of the cache is then not known.
pub(crate) fn thread_cache_per_class() -> Option<usize> {
    per_class_in(std::env::var(TUNABLES_ENV).ok().as_deref())
}

fn per_class_in(tunables: Option<&str>) -> Option<usize> {
    let Some(tunables) = tunables else {
        return Some(DEFAULT_PER_CLASS);
    };
    let mut per_class = DEFAULT_PER_CLASS;
    for setting in tunables.split(':') {
        let (name, value) = setting.split_once('=').unwrap_or((setting, ""));
        match name {
            "glibc.malloc.tcache_count" => per_class = value.parse().ok()?,
            "glibc.malloc.tcache_max" | "glibc.malloc.tcache_unsorted_limit" => return None,
            _ => {}
        }
    }
    (per_class <= MAX_PER_CLASS_EMPTIED).then_some(per_class)
}

/// The heap's thresholds, for a process [`exec_tuned`] could not restart
/// (they are in [`TUNABLES`] otherwise). With the current-thread runtime
/// every allocation is on the main arena, and glibc gives its top back
/// (`brk`) whenever more than `M_TRIM_THRESHOLD` (128 KiB) is free there,
/// to fault it in again on the next requests: 0.3-0.6 page faults per
/// request at 256 keep-alive connections or with a connection per request
/// (bench/README.md, "Issue #14, third pass"). Of the two values tried,
/// 1 MiB did not stop that at 256 connections and 4 MiB did (0.015 faults
/// per request: the heap's first growth). It bounds what a sidecar whose
/// connections went quiet keeps unused; after a spike of closed
/// connections `memory.rs` hands everything free back with `malloc_trim`,
/// which ignores the threshold. Setting a threshold turns off glibc's
/// dynamic one, which would otherwise raise the mmap threshold (128 KiB)
/// to the largest mapped block freed so far (and the trim threshold to
/// twice that), so the mmap threshold is set too: 1 MiB, blocks up to that
/// come from the heap as they would once the dynamic threshold had moved,
/// larger ones are mapped and unmapped on their own (none was, under the
/// loads measured). `GLIBC_TUNABLES` with `glibc.malloc.` settings (ours
/// or an operator's) wins over all this.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
pub fn tune_heap() {
    const M_TRIM_THRESHOLD: std::ffi::c_int = -1;
    const M_MMAP_THRESHOLD: std::ffi::c_int = -3;
    const TRIM_THRESHOLD: std::ffi::c_int = 4 << 20;
    const MMAP_THRESHOLD: std::ffi::c_int = 1 << 20;
    unsafe extern "C" {
        fn mallopt(param: std::ffi::c_int, value: std::ffi::c_int) -> std::ffi::c_int;
    }
    if std::env::var(TUNABLES_ENV).is_ok_and(|t| t.contains("glibc.malloc.")) {
        return;
    }
    // SAFETY: mallopt takes two integers and changes glibc's own malloc
    // parameters under its lock; it is called before any other thread exists.
    unsafe {
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD);
        mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD);
    }
}

/// Other allocators (musl's) return memory by themselves.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn tune_heap() {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_depth_is_read_from_the_tunables() {
        assert_eq!(per_class_in(None), Some(7));
        assert_eq!(per_class_in(Some("")), Some(7));
        assert_eq!(per_class_in(Some(TUNABLES)), Some(256));
        assert_eq!(
            per_class_in(Some(
                "glibc.malloc.trim_threshold=1:glibc.malloc.tcache_count=0"
            )),
            Some(0)
        );
        assert_eq!(
            per_class_in(Some("glibc.malloc.tcache_count=1024")),
            Some(1024)
        );
        assert_eq!(per_class_in(Some("glibc.malloc.tcache_count=1025")), None);
        assert_eq!(per_class_in(Some("glibc.malloc.tcache_count=lots")), None);
        assert_eq!(per_class_in(Some("glibc.malloc.tcache_count")), None);
        assert_eq!(per_class_in(Some("glibc.malloc.tcache_max=2048")), None);
        assert_eq!(per_class_in(Some("glibc.elision.enable=1")), Some(7));
    }

    #[test]
    fn the_tunables_name_the_thresholds_tune_heap_sets() {
        assert!(TUNABLES.contains("glibc.malloc.trim_threshold=4194304"));
        assert!(TUNABLES.contains("glibc.malloc.mmap_threshold=1048576"));
    }
}
