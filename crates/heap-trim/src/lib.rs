//! Gives the memory glibc's allocator keeps after a burst of frees back to the system.
//!
//! Why: glibc keeps what a thread freed in that thread's arena and returns pages only from
//! the top of a heap, so after a large answer is decoded into many small allocations and
//! dropped, the agent's resident memory stays at the peak (92 MB after a 3.7 MB kubelet
//! answer, docs/attribution.md "Message size"). `malloc_trim(0)` walks every arena and
//! returns the free pages inside the heaps too (`MADV_DONTNEED`).

/// Asks glibc to return the free pages of every arena to the system. Returns whether it
/// gave anything back. It locks each arena in turn while it walks it: call it after a
/// burst, not on every request. Elsewhere (musl, other systems) it does nothing and
/// returns false: those allocators give large blocks back on their own.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn release_freed_memory() -> bool {
    // SAFETY: malloc_trim takes no pointer and touches only glibc's own free lists, which it
    // locks while it runs; any thread may call it at any time.
    unsafe { libc::malloc_trim(0) == 1 }
}

/// See the glibc version: nothing to do here.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn release_freed_memory() -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// After many small allocations are freed, a trim gives some back (on glibc).
    #[test]
    fn a_burst_of_frees_is_given_back() {
        let burst: Vec<Vec<u8>> = (0..200_000).map(|i| vec![(i % 251) as u8; 200]).collect();
        // Allocated after the burst, so the freed memory lies below a live block and only a
        // trim (not the automatic one at the top of the heap) can give it back.
        let keep = Box::new([1u8; 64]);
        drop(burst);
        let released = release_freed_memory();
        assert_eq!(keep[0], 1);
        if cfg!(all(target_os = "linux", target_env = "gnu")) {
            assert!(
                released,
                "40 MB freed in small blocks: glibc should give pages back"
            );
        }
    }
}
