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
//!
//! Under an address-space limit (`ulimit -v`, `RLIMIT_AS`) the same settings make the process
//! map far more than it holds: every thread's arena reserves its heaps 64 MiB at a time and
//! freed buffers stay mapped in them, all of it counted against the limit. A run whose buffers
//! fit the room the limit leaves (checked before any rank starts, see `docs/CONFIG.md`,
//! "Resource bounds") then aborted on an allocation: a GPT with 16,384 experts needed 85 MB
//! more room than its buffers took. There the settings are the other way round: one arena, and
//! every buffer from 128 KiB up mapped on its own and unmapped when freed, so that what the
//! process maps is what it holds.

/// Largest buffer served from the heap (glibc's ceiling for `M_MMAP_THRESHOLD`): larger ones
/// are still mapped and unmapped on their own.
const MMAP_THRESHOLD: i32 = 32 << 20;

/// Free memory at a heap's top that is kept rather than returned to the OS.
const TRIM_THRESHOLD: i32 = 1 << 30;

/// Under an address-space limit: the smallest buffer mapped on its own (glibc's default
/// threshold, fixed so that it does not rise as buffers are freed).
const LIMITED_MMAP_THRESHOLD: i32 = 128 << 10;

/// Makes `malloc` keep freed buffers for reuse (up to 32 MiB each, and up to 1 GiB of free
/// memory per heap) instead of returning them to the OS, as a training process wants: peak
/// memory is unchanged, the memory between peaks stays with the process. Under an
/// address-space limit (`RLIMIT_AS`) it instead maps what the process holds and no more (see
/// the module docs). Does nothing where the allocator is not glibc's. Called by `tessera`
/// (every command) and `tessera.train`, before any other thread starts.
pub fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: `mallopt` only changes the allocator's parameters; all are in range.
        unsafe {
            if address_space_limited() {
                libc::mallopt(libc::M_ARENA_MAX, 1);
                libc::mallopt(libc::M_MMAP_THRESHOLD, LIMITED_MMAP_THRESHOLD);
            } else {
                libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
                libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD);
            }
        }
    }
}

/// Whether the process has a soft address-space limit (`ulimit -v`).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn address_space_limited() -> bool {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `getrlimit` writes the limit into `limit`, a valid `rlimit`.
    let read = unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut limit) } == 0;
    read && limit.rlim_cur != libc::RLIM_INFINITY
}
