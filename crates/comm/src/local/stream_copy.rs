//! Copies of large buffers with non-temporal ("streaming") stores, for collectives whose buffers
//! together are larger than a last-level cache: a plain store first reads the destination's
//! line into the cache (a third of the memory traffic of a copy) and evicts data that will not
//! be read again soon. Measured on the local all-gather of 2 ranks, the binaries before and
//! after alternating three times (`tessera bench collectives --backend local --ranks 2
//! --max-mib 64 --reps 9`): 16 MiB 15.7–16.8 → 18.4–21.4 GB/s, 64 MiB 11.9–12.3 → 13.8–15.1;
//! buffers that fit the cache gain nothing (a streaming first try at 4 MiB lost a third),
//! hence [`STREAM_ABOVE`].

/// Bytes written by all ranks of a collective above which its copies stream: more than a
/// typical last-level cache holds alongside the sources (the machine measured has 32 MiB).
pub(super) const STREAM_ABOVE: usize = 16 << 20;

/// Copies `src` into `dst` (equal lengths), with non-temporal stores when `stream` and the CPU
/// has AVX2; otherwise as `copy_from_slice`.
pub(super) fn copy(dst: &mut [u8], src: &[u8], stream: bool) {
    assert_eq!(
        dst.len(),
        src.len(),
        "copy between buffers of different lengths"
    );
    #[cfg(target_arch = "x86_64")]
    {
        if stream && std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2.
            unsafe { stream_avx2(dst, src) };
            return;
        }
    }
    let _ = stream;
    dst.copy_from_slice(src);
}

/// [`copy`] with 32-byte streaming stores: the unaligned head and the tail as plain copies.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn stream_avx2(dst: &mut [u8], src: &[u8]) {
    use std::arch::x86_64::{__m256i, _mm256_loadu_si256, _mm256_stream_si256, _mm_sfence};
    const STEP: usize = 128;
    let head = dst.as_ptr().align_offset(32).min(dst.len());
    dst[..head].copy_from_slice(&src[..head]);
    let body = (dst.len() - head) / STEP * STEP;
    let (d, s) = (dst[head..].as_mut_ptr(), src[head..].as_ptr());
    for at in (0..body).step_by(STEP) {
        // SAFETY: `at + STEP <= body`, inside both slices past `head`; `d + at` is 32-byte
        // aligned, as the streaming store needs.
        unsafe {
            let v = [0, 32, 64, 96].map(|o| _mm256_loadu_si256(s.add(at + o).cast::<__m256i>()));
            for (o, x) in [0, 32, 64, 96].into_iter().zip(v) {
                _mm256_stream_si256(d.add(at + o).cast::<__m256i>(), x);
            }
        }
    }
    // Streaming stores are weakly ordered: fence them before the peers are told the data is
    // there.
    _mm_sfence();
    let tail = head + body;
    dst[tail..].copy_from_slice(&src[tail..]);
}

#[cfg(test)]
mod tests {
    use super::copy;

    #[test]
    fn streaming_copies_every_byte_at_any_alignment_and_length() {
        let src: Vec<u8> = (0..5000u32).map(|i| (i * 31 % 251) as u8).collect();
        for offset in [0, 1, 7, 31, 32, 33] {
            for len in [0, 1, 31, 127, 128, 129, 1000, 4000] {
                let mut dst = vec![0u8; len + offset + 8];
                copy(&mut dst[offset..offset + len], &src[3..3 + len], true);
                assert_eq!(
                    &dst[offset..offset + len],
                    &src[3..3 + len],
                    "{offset}+{len}"
                );
                assert!(dst[..offset]
                    .iter()
                    .chain(&dst[offset + len..])
                    .all(|&b| b == 0));
            }
        }
    }
}
