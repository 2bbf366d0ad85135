//! Freed buffers kept for the next output of the same size, so a kernel that writes every
//! element of its output ([`graph::Op::writes_every_output_element`]) is not handed a freshly
//! zeroed one.
//!
//! A training step frees and allocates the same buffers step after step. A fresh buffer is a
//! `calloc`, which zeroes memory the allocator had kept: a pass over the buffer's bytes
//! before the kernel writes them all again (about 600 MB a step in the bench GPT, where the
//! in-place bias add of a `2048 × 1024` `f32` tensor took a third of the zeroed out-of-place
//! one). A recycled buffer holds the last values written to it; only an op that overwrites them
//! all gets one.
//!
//! The recycler holds no more than the room it is given: the executor gives it its memory
//! meter's peak less what its live buffers hold, so live and recycled buffers together never
//! hold more than the peak the meter reports.

use std::collections::HashMap;

use tensor::{DType, Tensor};

/// Freed tensors by dtype and element count.
#[derive(Debug, Default)]
pub(crate) struct Recycler {
    free: HashMap<(DType, usize), Vec<Tensor>>,
    /// Bytes of every tensor in `free`.
    bytes: usize,
}

impl Recycler {
    /// Keeps `t` for a later output if the recycler then holds at most `room` bytes; drops it
    /// otherwise.
    pub(crate) fn keep(&mut self, t: Tensor, room: usize) {
        let bytes = t.as_bytes().len();
        if bytes == 0 || self.bytes + bytes > room {
            return;
        }
        self.bytes += bytes;
        self.free
            .entry((t.dtype(), t.n_elements()))
            .or_default()
            .push(t);
    }

    /// A kept tensor of `dtype` with `shape`'s element count, reshaped to `shape`, its
    /// values stale (NaN or all-ones bits in debug builds, so an element a kernel leaves
    /// unwritten shows in the tests).
    pub(crate) fn take(&mut self, dtype: DType, shape: &[usize]) -> Option<Tensor> {
        let numel = shape.iter().product::<usize>();
        let t = self.free.get_mut(&(dtype, numel))?.pop()?;
        self.bytes -= t.as_bytes().len();
        let mut t = t.reshape(shape).ok()?;
        if cfg!(debug_assertions) {
            // All-ones bits: NaN in every float type.
            t.as_bytes_mut().fill(0xFF);
        }
        Some(t)
    }

    /// Drops kept tensors until at most `room` bytes are kept.
    pub(crate) fn shrink_to(&mut self, room: usize) {
        if self.bytes <= room {
            return;
        }
        let mut keys: Vec<(DType, usize)> = self.free.keys().copied().collect();
        // Largest first: the fewest tensors dropped.
        keys.sort_by_key(|&(dtype, numel)| std::cmp::Reverse(numel * dtype.size_in_bytes()));
        for key in keys {
            let list = self.free.get_mut(&key).expect("a key of the map");
            while self.bytes > room {
                let Some(t) = list.pop() else { break };
                self.bytes -= t.as_bytes().len();
            }
            if list.is_empty() {
                self.free.remove(&key);
            }
            if self.bytes <= room {
                return;
            }
        }
    }

    /// Bytes kept.
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(shape: &[usize]) -> Tensor {
        Tensor::zeros(DType::F32, shape)
    }

    #[test]
    fn a_kept_tensor_serves_the_same_dtype_and_element_count_reshaped() {
        let mut r = Recycler::default();
        r.keep(f32s(&[4, 6]), 1 << 20);
        assert_eq!(r.bytes(), 96);
        assert!(r.take(DType::F64, &[4, 6]).is_none(), "another dtype");
        assert!(
            r.take(DType::F32, &[5, 5]).is_none(),
            "another element count"
        );
        let t = r
            .take(DType::F32, &[2, 3, 4])
            .expect("same dtype and count");
        assert_eq!(t.shape(), [2, 3, 4]);
        assert_eq!(r.bytes(), 0);
        assert!(r.take(DType::F32, &[24]).is_none(), "taken once only");
        if cfg!(debug_assertions) {
            assert!(t.as_f32().unwrap().iter().all(|v| v.is_nan()), "poisoned");
        }
    }

    #[test]
    fn it_never_keeps_more_than_its_room_and_shrinks_largest_first() {
        let mut r = Recycler::default();
        r.keep(f32s(&[10]), 100);
        r.keep(f32s(&[10]), 100);
        assert_eq!(r.bytes(), 80);
        r.keep(f32s(&[10]), 100);
        assert_eq!(r.bytes(), 80, "a third would exceed the room: dropped");
        r.keep(f32s(&[2]), 100);
        assert_eq!(r.bytes(), 88);
        r.shrink_to(50);
        assert_eq!(
            r.bytes(),
            48,
            "one of the 40-byte tensors went, the small one stays"
        );
        assert!(r.take(DType::F32, &[2]).is_some());
        r.shrink_to(0);
        assert_eq!(r.bytes(), 0);
        assert!(r.take(DType::F32, &[10]).is_none());
    }
}
