//! Read-only mappings of byte ranges of source files.
//!
//! Mapping a source range lets a piece be copied straight from the page cache into the
//! destination buffer (one copy) instead of being read into a scratch buffer first (two
//! copies). Mappings are small (one scratch block, at most 8 MiB) and dropped right after the
//! copy, so resident memory stays bounded.
//!
//! Limitation: a source file truncated by another process *while* it is mapped makes the kernel
//! raise SIGBUS. The file's length is checked against its index just before mapping, which
//! catches files changed since they were opened; a truncation racing with the copy itself is not
//! caught. Checkpoints being converted must not be modified concurrently.

use std::fs::File;
use std::os::unix::io::AsRawFd;

/// A read-only shared mapping of `len` bytes of a file from byte `offset`.
pub(crate) struct MappedRange {
    base: *mut libc::c_void,
    map_len: usize,
    skip: usize,
    len: usize,
}

impl MappedRange {
    /// Maps `[offset, offset + len)` of `file`, or `None` when the range is empty, lies beyond
    /// the file's current end, or the kernel refuses.
    pub(crate) fn new(file: &File, offset: u64, len: usize) -> Option<MappedRange> {
        let end = offset.checked_add(len as u64)?;
        if len == 0 || file.metadata().ok()?.len() < end {
            return None;
        }
        const PAGE: u64 = 4096;
        let aligned = offset / PAGE * PAGE;
        let skip = (offset - aligned) as usize;
        let map_len = skip.checked_add(len)?;
        let file_offset = libc::off_t::try_from(aligned).ok()?;
        // SAFETY: a fresh read-only shared mapping of a file descriptor we hold open; the
        // kernel picks the address. The result is checked before use.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                file.as_raw_fd(),
                file_offset,
            )
        };
        if base == libc::MAP_FAILED {
            return None;
        }
        Some(MappedRange {
            base,
            map_len,
            skip,
            len,
        })
    }

    /// The mapped bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: `base .. base + map_len` is a live read-only mapping owned by `self`, and
        // `skip + len == map_len`; it is unmapped only in `drop`, after every borrow ends.
        unsafe { std::slice::from_raw_parts((self.base as *const u8).add(self.skip), self.len) }
    }
}

impl Drop for MappedRange {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping created in `new`, once.
        unsafe {
            libc::munmap(self.base, self.map_len);
        }
    }
}
