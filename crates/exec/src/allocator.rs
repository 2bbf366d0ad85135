//! The process allocator's settings for training.
//!
//! A training step allocates its activations and gradients afresh and frees them when their
//! last reader has run, so every step allocates and frees the same large buffers again. glibc's
//! `malloc` serves a buffer above its mmap threshold with a fresh `mmap` and returns it with
//! `munmap`, and trims freed heap tops back to the OS; each step then faults its buffers in page
//! by page, and with several ranks as threads of one process each `mmap`/`munmap` takes the
//! process's address-space lock for writing, stalling the other ranks' page faults. Measured on
//! the GPT benchmark (`tessera bench gpt-step`, see docs/PERFORMANCE.md): model parallel 2 in
//! deterministic mode took 164–169 ms per step with the default settings and 151–153 ms with
//! these.

/// Largest buffer served from the heap (glibc's ceiling for `M_MMAP_THRESHOLD`): larger ones
/// are still mapped and unmapped on their own.
const MMAP_THRESHOLD: i32 = 32 << 20;

/// Free memory at a heap's top that is kept rather than returned to the OS.
const TRIM_THRESHOLD: i32 = 1 << 30;

/// Makes `malloc` keep freed buffers for reuse (up to 32 MiB each, and up to 1 GiB of free
/// memory per heap) instead of returning them to the OS, as a training process wants: peak
/// memory is unchanged, the memory between peaks stays with the process. Does nothing where
/// the allocator is not glibc's. Called by `tessera` (every command) and `tessera.train`.
pub fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: `mallopt` only changes the allocator's parameters; both are in range.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
            libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD);
        }
    }
}
