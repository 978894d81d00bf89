//! A hint to the CPU: start loading a value's cache line now, because it will be read soon.
//! At saturation a publish touches a few lines of the home's state that are cold by then
//! (its topic's dedup filter, the message it evicts), and writes its body into memory that
//! is cold too (`message`'s next body buffer); asked for ahead, their misses overlap
//! instead of following one another (docs/PERFORMANCE.md, "Where the time goes at
//! saturation"). Changes no value and no behaviour; on other architectures it does nothing.

/// A cache line's size on the CPUs this crate is tuned for.
const LINE: usize = 64;

/// Starts loading the cache line holding the start of `value` into every cache level.
#[inline(always)]
pub fn line<T: ?Sized>(value: &T) {
    #[cfg(target_arch = "x86_64")]
    {
        let p = (value as *const T).cast::<i8>();
        // SAFETY: `_mm_prefetch` is a hint: it never faults, reads nothing the program
        // sees and writes nothing, whatever the address (here a live reference's, so a
        // valid one anyway). It needs SSE, part of the x86-64 baseline every build of this
        // crate targets.
        unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = value;
}

/// Starts loading every cache line of the `len` bytes from `start` (memory about to be
/// written: an allocation's capacity, initialised or not) into every cache level.
#[inline]
pub fn range(start: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    for off in (0..len).step_by(LINE) {
        let p = start.wrapping_add(off).cast::<i8>();
        // SAFETY: as in `line`: a prefetch never faults and neither reads nor writes
        // anything the program sees, whatever the address, so it is sound for any pointer
        // (`wrapping_add` forms it without claiming it is in bounds).
        unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (start, len, LINE);
}
