//! A hint to the CPU: start loading a value's cache line now, because it will be read soon.
//! At saturation a publish touches a few lines of the home's state that are cold by then
//! (its topic's dedup filter, the message it evicts), and writes its body into memory that
//! is cold too (`message`'s next body buffer); asked for ahead, their misses overlap
//! instead of following one another (docs/PERFORMANCE.md, "The publish path at
//! saturation"). Changes no value and no behaviour; on other architectures it does nothing.

/// A cache line's size on the CPUs this crate is tuned for.
const LINE: usize = 64;

/// Starts loading the cache line holding the start of `value` into every cache level.
#[inline(always)]
pub fn line<T: ?Sized>(value: &T) {
    hint((value as *const T).cast());
}

/// Starts loading every cache line of the `len` bytes from `start` (memory about to be
/// written: an allocation's capacity, initialised or not) into every cache level.
#[inline]
pub fn range(start: *const u8, len: usize) {
    for off in (0..len).step_by(LINE) {
        // `wrapping_add` forms the address without claiming it is in bounds.
        hint(start.wrapping_add(off));
    }
}

/// The hint itself, for the line holding `p`, which may be any address.
#[inline(always)]
fn hint(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `_mm_prefetch` is a hint: it never faults, reads nothing the program sees and
    // writes nothing, whatever the address, so it is sound for any pointer. It needs SSE,
    // part of the x86-64 baseline every build of this crate targets.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
