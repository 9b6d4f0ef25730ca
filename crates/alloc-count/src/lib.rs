//! A global allocator that counts, per thread, the allocations (and reallocations) and the
//! bytes asked for, then hands every request to the system allocator.
//!
//! Install it in a bench or test binary and read a window of work with [`measure`]:
//!
//! ```ignore
//! #[global_allocator]
//! static ALLOC: alloc_count::Counting = alloc_count::Counting;
//! let (stats, out) = alloc_count::measure(|| do_the_work());
//! ```
//!
//! Counting is per thread, so tests running in parallel in one binary do not see each
//! other's allocations.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// The counting allocator: the system allocator plus per-thread counters.
pub struct Counting;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
    static REALLOCS: Cell<u64> = const { Cell::new(0) };
    static FREES: Cell<u64> = const { Cell::new(0) };
    static BYTES: Cell<u64> = const { Cell::new(0) };
}

fn bump(c: &'static std::thread::LocalKey<Cell<u64>>, by: u64) {
    // `try_with`: a thread's locals may already be gone while it frees during exit.
    let _ = c.try_with(|c| c.set(c.get().wrapping_add(by)));
}

// SAFETY: every request goes unchanged to `System`; the counters are thread-local cells
// with const initialisers, which never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        bump(&ALLOCS, 1);
        bump(&BYTES, layout.size() as u64);
        // SAFETY: the caller's contract is `System`'s.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        bump(&ALLOCS, 1);
        bump(&BYTES, layout.size() as u64);
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        bump(&FREES, 1);
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        bump(&REALLOCS, 1);
        bump(&BYTES, new_size.saturating_sub(layout.size()) as u64);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// What one thread asked of the allocator over a window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// New blocks (`alloc`, `alloc_zeroed`).
    pub allocs: u64,
    /// Blocks grown or shrunk in place or moved (`realloc`).
    pub reallocs: u64,
    /// Blocks given back.
    pub frees: u64,
    /// Bytes asked for by new blocks and by growth.
    pub bytes: u64,
}

impl Stats {
    /// Allocations of any kind: new blocks plus reallocations.
    pub fn total(&self) -> u64 {
        self.allocs + self.reallocs
    }
}

/// This thread's counters since it started.
pub fn now() -> Stats {
    let get = |c: &'static std::thread::LocalKey<Cell<u64>>| c.try_with(Cell::get).unwrap_or(0);
    Stats {
        allocs: get(&ALLOCS),
        reallocs: get(&REALLOCS),
        frees: get(&FREES),
        bytes: get(&BYTES),
    }
}

/// Runs `f` and returns what this thread allocated meanwhile (zero unless [`Counting`] is
/// the binary's global allocator), with `f`'s result.
pub fn measure<T>(f: impl FnOnce() -> T) -> (Stats, T) {
    let before = now();
    let out = f();
    let after = now();
    (
        Stats {
            allocs: after.allocs - before.allocs,
            reallocs: after.reallocs - before.reallocs,
            frees: after.frees - before.frees,
            bytes: after.bytes - before.bytes,
        },
        out,
    )
}
