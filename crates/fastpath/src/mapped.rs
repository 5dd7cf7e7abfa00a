//! A `BPF_F_MMAPABLE` array map mapped into this process and seen as a slice of `T`, so user
//! space and the program on any CPU share its elements through atomic fields, with no syscall
//! per access (the tenant table, the per-CPU reader counts, the word-count cache's slots).
//!
//! Not for: maps read or written through bpf(2) (`sys.rs`), or element types with plain
//! (non-atomic) fields: the program writes them concurrently.

use std::io;
use std::marker::PhantomData;
use std::os::fd::RawFd;
use std::ptr::NonNull;

use crate::FastPathError;

/// Element types that may live in a shared mapping.
///
/// # Safety
/// The type must be `#[repr(C)]`, made only of atomics (so shared mutation through `&T` is
/// sound), valid when all-zero (the kernel zero-fills the map) and a multiple of 8 bytes long
/// (the kernel's array stride is the value size rounded up to 8).
pub(crate) unsafe trait Shared: Sync {}

// SAFETY: repr(C), atomics only, all-zero valid, 64 bytes (abi's mirror asserts).
unsafe impl Shared for crate::abi::Tenant {}
// SAFETY: as above.
unsafe impl Shared for crate::abi::Reader {}
// SAFETY: repr(C), atomics only, all-zero valid (an empty slot), 8-byte multiple (stream.rs
// asserts its size against the header's struct). The map's element is a table of these slots
// with no padding between them (the table's size is a multiple of 8), so the mapping is one
// array of slots.
unsafe impl Shared for crate::stream::WccSlot {}

pub(crate) struct MappedArray<T: Shared> {
    base: NonNull<T>,
    len: usize,
    len_bytes: usize,
    _elements: PhantomData<T>,
}

// SAFETY: the mapping is process-wide shared memory that lives until Drop, and it is only ever
// accessed through `&T`, whose fields are atomics (`Shared`).
unsafe impl<T: Shared> Send for MappedArray<T> {}
// SAFETY: as above.
unsafe impl<T: Shared> Sync for MappedArray<T> {}

impl<T: Shared> MappedArray<T> {
    /// Map the first `len` elements of the array map `fd` (`what` names it in errors).
    pub(crate) fn map(fd: RawFd, len: usize, what: &'static str) -> Result<MappedArray<T>, FastPathError> {
        let len_bytes = len * std::mem::size_of::<T>();
        // SAFETY: mmap with a null hint creates a new mapping and touches no existing memory;
        // fd is a live BPF_F_MMAPABLE array map with at least `len` elements (the caller's
        // map definition), page aligned; failure is reported as MAP_FAILED.
        let p = unsafe {
            libc::mmap(std::ptr::null_mut(), len_bytes, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0)
        };
        if p == libc::MAP_FAILED {
            return Err(FastPathError::Map { op: what, error: io::Error::last_os_error() });
        }
        let base = NonNull::new(p.cast::<T>())
            .ok_or_else(|| FastPathError::Map { op: what, error: io::Error::other("null mapping") })?;
        Ok(MappedArray { base, len, len_bytes, _elements: PhantomData })
    }

    pub(crate) fn get(&self, i: usize) -> Option<&T> {
        self.as_slice().get(i)
    }

    pub(crate) fn as_slice(&self) -> &[T] {
        // SAFETY: the mapping holds `len` consecutive elements (the stride is size_of::<T>, a
        // multiple of 8 by `Shared`); it is page aligned, so every element is aligned for T
        // (8); the kernel zero-fills it and all-zero is a valid T; the slice lives no longer
        // than &self, and the mapping lives until self is dropped.
        unsafe { std::slice::from_raw_parts(self.base.as_ptr(), self.len) }
    }
}

impl<T: Shared> Drop for MappedArray<T> {
    fn drop(&mut self) {
        // SAFETY: base/len_bytes are exactly what mmap returned and were given; no reference
        // into the mapping outlives self (get borrows self).
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len_bytes) };
    }
}
