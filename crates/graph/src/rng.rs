//! Counter-based random numbers: every random value is a pure function of a key and the global
//! flat index of the element it belongs to.
//!
//! This is what makes initializers and dropout *sharding-independent*: a rank holding any box of
//! a global tensor computes exactly the values the whole tensor would hold there, without
//! generating (or skipping over) anybody else's elements. The generator is SplitMix64 used in
//! counter mode: the `i`-th number of stream `key` is `mix64(key + (i + 1)·γ)`, which is exactly
//! the `i`-th output of a SplitMix64 generator seeded with `key` (γ is its golden-ratio
//! increment), so its statistical quality is SplitMix64's.
//!
//! Streams are keyed by a seed and a name ([`stream_key`]): a parameter's values depend on the
//! global seed and the parameter's name only, not on the order parameters are created in.

/// SplitMix64's increment, ⌊2⁶⁴/φ⌋.
const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's output function (a bijective 64-bit finaliser).
#[inline(always)]
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The `counter`-th 64-bit number of stream `key`.
#[inline(always)]
pub fn bits_at(key: u64, counter: u64) -> u64 {
    mix64(key.wrapping_add(counter.wrapping_add(1).wrapping_mul(GAMMA)))
}

/// A uniform number in `[0, 1)` from the top 53 bits of `bits`.
#[inline(always)]
pub fn unit_f64(bits: u64) -> f64 {
    (bits >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// The key of the stream named `name` under `seed`: FNV-1a of the name, mixed with the seed.
pub fn stream_key(seed: u64, name: &str) -> u64 {
    let mut hash: u64 = 0xCBF2_9CE4_8422_2325;
    for byte in name.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01B3);
    }
    mix64(seed ^ mix64(hash))
}

/// Walks the elements of the box at `offset` with `shape` (a box of a row-major tensor of
/// `global_shape`) in row-major order, one run of consecutive elements per call:
/// `run(local_start, global_start, len)`, where `local_start` counts elements of the box and
/// `global_start` is the global flat index of the run's first element. The box must lie inside
/// `global_shape` (checked by callers).
pub(crate) fn for_each_global_run(
    global_shape: &[usize],
    offset: &[usize],
    shape: &[usize],
    mut run: impl FnMut(usize, usize, usize),
) {
    let n: usize = shape.iter().product();
    if n == 0 {
        return;
    }
    let ndim = global_shape.len();
    if ndim == 0 {
        run(0, 0, 1);
        return;
    }
    let strides = layout::row_major_strides(global_shape);
    let len = shape[ndim - 1];
    let mut index = vec![0usize; ndim - 1];
    let mut local = 0;
    loop {
        let global: usize = (0..ndim)
            .map(|d| (offset[d] + index.get(d).copied().unwrap_or(0)) * strides[d])
            .sum();
        run(local, global, len);
        local += len;
        // Next row of the box, last outer dim fastest.
        let mut d = ndim - 1;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            index[d] += 1;
            if index[d] < shape[d] {
                break;
            }
            index[d] = 0;
        }
    }
}

/// Whether the box at `offset` with `shape` lies inside a tensor of `global_shape`.
pub(crate) fn region_fits(offset: &[usize], shape: &[usize], global_shape: &[usize]) -> bool {
    offset.len() == global_shape.len()
        && shape.len() == global_shape.len()
        && (0..global_shape.len()).all(|d| {
            offset[d]
                .checked_add(shape[d])
                .is_some_and(|end| end <= global_shape[d])
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_mode_is_splitmix64() {
        // SplitMix64 seeded with 0 starts 0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4 (Vigna's reference).
        assert_eq!(bits_at(0, 0), 0xE220_A839_7B1D_CDAF);
        assert_eq!(bits_at(0, 1), 0x6E78_9E6A_A1B9_65F4);
        assert!(unit_f64(u64::MAX) < 1.0);
        assert_ne!(stream_key(1, "a"), stream_key(1, "b"));
        assert_ne!(stream_key(1, "a"), stream_key(2, "a"));
    }

    #[test]
    fn runs_cover_the_box_in_order() {
        let mut seen = Vec::new();
        for_each_global_run(&[4, 6], &[1, 2], &[2, 3], |local, global, len| {
            seen.push((local, global, len))
        });
        assert_eq!(seen, vec![(0, 8, 3), (3, 14, 3)]);
        let mut scalar = Vec::new();
        for_each_global_run(&[], &[], &[], |l, g, n| scalar.push((l, g, n)));
        assert_eq!(scalar, vec![(0, 0, 1)]);
    }
}
