//! The allocator's footprint on glibc: fewer malloc arenas, and free pages handed back.
//!
//! glibc's malloc gives each thread that contends for an arena a new one (up to eight per
//! core), and it returns to the kernel only the free memory at the top of each heap. A speaker
//! that caches 10,000 Services allocates its caches at start from several threads (the watch
//! tasks, the runtime's workers, the records writer) and then frees the lists it read: on the
//! lab's measurement (`speaker/tests/kubernetes_scale.rs`) the heap held 55 MB while the process
//! kept 97 MB of anonymous memory. One arena and a periodic `malloc_trim` bring that to about
//! the heap's size (docs/src/benchmarks.md); neither changes what is allocated.
//!
//! One arena, not one per runtime worker: each arena keeps its own partly used pages, and the
//! second one cost 4-5 MiB of resident memory at 10,000 Services (`kubernetes_scale`: 54.9-55.4
//! MiB with two, 50.1-50.7 with one) for no measurable change in event handling (p50 and p99
//! <= 1-2 ms both ways). The threads that allocate are few (two runtime workers, the owner
//! watch, the responders) and hold malloc's lock for well under a microsecond.
//!
//! The only other `unsafe` code is [`packet_socket`](crate::net::packet_socket).
#![allow(unsafe_code)]

use std::time::Duration;

/// The arenas the speaker allows itself (see the module docs); `MALLOC_ARENA_MAX` in the
/// environment wins over it.
pub const ARENAS: i32 = 1;

/// How often [`trim_every`] hands free pages back.
pub const TRIM_PERIOD: Duration = Duration::from_secs(5);

/// Allocations this large or larger get pages of their own (`mmap`), handed back the moment
/// they are freed; `MALLOC_MMAP_THRESHOLD_` in the environment wins over it. glibc starts at
/// 128 KiB but raises its threshold (up to 32 MiB) each time such a block is freed, after which
/// a `/metrics` exposition (1.9 MB at 10,000 IPs) or an initial list lands in the heap and stays
/// resident until the next trim. Fixed at 256 KiB, the `kubernetes_scale` measurement gave
/// 51.0-52.2 MiB right after a scrape (54.2-56.1 with the sliding threshold) and a cold-start
/// peak of 57.0-58.0 MiB (58.5-60.2); at rest 48.1-48.7 MiB (48.4-49.6).
pub const MMAP_THRESHOLD: i32 = 256 * 1024;

/// Caps glibc's malloc arenas at [`ARENAS`] and fixes its mmap threshold at
/// [`MMAP_THRESHOLD`], unless the environment sets them (`MALLOC_ARENA_MAX`,
/// `MALLOC_MMAP_THRESHOLD_`). Call before any thread starts (arenas already made stay).
pub fn limit_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
            // SAFETY: mallopt only sets a malloc parameter; it is called before other threads
            // exist.
            unsafe {
                libc::mallopt(libc::M_ARENA_MAX, ARENAS);
            }
        }
        if std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_none() {
            // SAFETY: as above.
            unsafe {
                libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
            }
        }
    }
}

/// Hands the free pages of every arena back to the kernel (`malloc_trim(0)`): a walk over the
/// free lists, under each arena's lock, a few milliseconds at most for a 100 MB heap.
pub fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes malloc's own locks and touches only free chunks.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Trims every [`TRIM_PERIOD`] until dropped (a task of the daemon's runtime).
pub async fn trim_every(period: Duration) {
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let started = tokio::time::Instant::now();
        trim();
        tracing::trace!(took = ?started.elapsed(), "malloc_trim");
    }
}
