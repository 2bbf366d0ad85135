//! Attention over the packed `qkv [batch, seq, heads, 3·head_dim]` layout against the
//! transposing path (`q`, `k`, `v` split off and transposed to `[batch, heads, seq, head_dim]`,
//! `flash_attention_into` / `flash_attention_grad_into`, the results transposed back): the same
//! bits, forward and backward, f32 and f64, causal or not, with offsets, at sizes that are not
//! multiples of the tiles; the same bits on one and two threads; the tensor level (bf16 too);
//! wrong buffers are errors, empty sizes no panic.

use tensor::kernels::{self, AttentionDims, AttentionParams, Float, PackedDims};
use tensor::{DType, Tensor, TensorError};

use super::reference::Rng;

/// `(batch, seq, heads, head_dim)`: single elements, sizes across several 64-row tiles and not
/// multiples of them, one head and several.
const SHAPES: [(usize, usize, usize, usize); 6] = [
    (1, 1, 1, 1),
    (2, 37, 3, 9),
    (3, 130, 1, 9),
    (1, 130, 4, 64),
    (2, 64, 3, 1),
    (3, 65, 4, 17),
];

fn packed_dims((batch, seq, heads, head_dim): (usize, usize, usize, usize)) -> PackedDims {
    PackedDims {
        batch,
        seq,
        heads,
        head_dim,
    }
}

/// One case's operands in the packed layout.
struct Case<T> {
    dims: PackedDims,
    qkv: Vec<T>,
    dout: Vec<T>,
}

fn case<T: Float>(seed: u64, dims: PackedDims) -> Case<T> {
    let PackedDims {
        batch,
        seq,
        heads,
        head_dim: d,
    } = dims;
    let mut rng = Rng::new(seed);
    let convert = |x: Vec<f64>| x.into_iter().map(T::from_f64).collect();
    Case {
        dims,
        qkv: convert(rng.vec(batch * seq * heads * 3 * d, -2.0, 2.0)),
        dout: convert(rng.vec(batch * seq * heads * d, -1.0, 1.0)),
    }
}

/// Column block `part` (0 q, 1 k, 2 v) of the packed `[b, s, h, parts·d]` rows, transposed to
/// `[b, h, s, d]`.
fn split_transposed<T: Copy>(x: &[T], dims: PackedDims, parts: usize, part: usize) -> Vec<T> {
    let PackedDims {
        batch,
        seq,
        heads,
        head_dim: d,
    } = dims;
    let mut t = Vec::with_capacity(batch * heads * seq * d);
    for b in 0..batch {
        for h in 0..heads {
            for s in 0..seq {
                for c in 0..d {
                    t.push(x[((b * seq + s) * heads + h) * parts * d + part * d + c]);
                }
            }
        }
    }
    t
}

/// `[b, h, s, width]` rows (one per part) transposed back to `[b, s, h, parts·width]`.
fn merge_transposed<T: Copy + Default>(parts: &[&[T]], dims: PackedDims, width: usize) -> Vec<T> {
    let PackedDims {
        batch, seq, heads, ..
    } = dims;
    let n = parts.len();
    let mut x = vec![T::default(); batch * seq * heads * n * width];
    for (p, part) in parts.iter().enumerate() {
        for b in 0..batch {
            for h in 0..heads {
                for s in 0..seq {
                    for c in 0..width {
                        x[((b * seq + s) * heads + h) * n * width + p * width + c] =
                            part[((b * heads + h) * seq + s) * width + c];
                    }
                }
            }
        }
    }
    x
}

/// Forward and backward results in the packed layout: `out`, `lse`, `dqkv`.
type Results<T> = (Vec<T>, Vec<T>, Vec<T>);

/// The transposing path: split and transpose, the one-call kernels, transpose back.
fn transposing<T: Float + Default>(c: &Case<T>, p: AttentionParams<T>) -> Results<T> {
    let dims = c.dims;
    let (q, k, v) = (
        split_transposed(&c.qkv, dims, 3, 0),
        split_transposed(&c.qkv, dims, 3, 1),
        split_transposed(&c.qkv, dims, 3, 2),
    );
    let dout = split_transposed(&c.dout, dims, 1, 0);
    let slices = AttentionDims {
        slices: dims.batch * dims.heads,
        q_len: dims.seq,
        kv_len: dims.seq,
        head_dim: dims.head_dim,
    };
    let mut out = vec![T::ZERO; q.len()];
    let mut lse = vec![T::ZERO; slices.slices * slices.q_len];
    kernels::flash_attention_into((&q, &k, &v), slices, p, &mut out, &mut lse).unwrap();
    let (mut dq, mut dk, mut dv) = (
        vec![T::ZERO; q.len()],
        vec![T::ZERO; k.len()],
        vec![T::ZERO; v.len()],
    );
    let input = kernels::AttentionGradInputs {
        q: &q,
        k: &k,
        v: &v,
        out: &out,
        lse: &lse,
        dout: &dout,
    };
    let grads = kernels::AttentionGradBuffers {
        dq: &mut dq,
        dk: &mut dk,
        dv: &mut dv,
    };
    kernels::flash_attention_grad_into(input, slices, p, grads).unwrap();
    (
        merge_transposed(&[&out], dims, dims.head_dim),
        merge_transposed(&[&lse], dims, 1),
        merge_transposed(&[&dq, &dk, &dv], dims, dims.head_dim),
    )
}

/// The packed entry points; `dqkv` starts as NaN so that an element left unwritten shows.
fn packed<T: Float>(c: &Case<T>, p: AttentionParams<T>) -> Results<T> {
    let mut out = vec![T::from_f64(f64::NAN); c.dout.len()];
    let mut lse = vec![T::from_f64(f64::NAN); c.dims.batch * c.dims.seq * c.dims.heads];
    kernels::packed_attention_into(&c.qkv, c.dims, p, &mut out, &mut lse).unwrap();
    let mut dqkv = vec![T::from_f64(f64::NAN); c.qkv.len()];
    kernels::packed_attention_grad_into(&c.qkv, &out, &lse, &c.dout, c.dims, p, &mut dqkv).unwrap();
    (out, lse, dqkv)
}

/// The bits of `x` (f64 bits of each element, so f32 and f64 compare alike).
fn bits<T: Float>(x: &[T]) -> Vec<u64> {
    x.iter().map(|v| v.to_f64().to_bits()).collect()
}

#[track_caller]
fn assert_same_bits<T: Float>(got: &Results<T>, want: &Results<T>, what: &str) {
    assert!(bits(&got.0) == bits(&want.0), "{what}: out");
    assert!(bits(&got.1) == bits(&want.1), "{what}: lse");
    assert!(bits(&got.2) == bits(&want.2), "{what}: dqkv (dq | dk | dv)");
}

/// Every shape, causal or not, offsets 0, the packed results against the transposing path.
fn same_bits_as_transposing<T: Float + Default>(seed: u64, scale: f64) {
    for (n, &shape) in SHAPES.iter().enumerate() {
        let c = case::<T>(seed + n as u64, packed_dims(shape));
        for causal in [false, true] {
            let p = AttentionParams::new(causal, T::from_f64(scale));
            let what = format!("{:?} {shape:?} causal {causal}", T::DTYPE);
            assert_same_bits(&packed(&c, p), &transposing(&c, p), &what);
        }
    }
}

#[test]
fn packed_f32_forward_and_backward_give_the_transposing_bits() {
    same_bits_as_transposing::<f32>(100, 0.3);
}

#[test]
fn packed_f64_forward_and_backward_give_the_transposing_bits() {
    same_bits_as_transposing::<f64>(200, 0.3);
}

/// Offsets as a query block of a longer sequence (and keys after some queries, so that some
/// rows see no key at all: `out = 0`, `lse = -inf`, zero gradients) give the transposing bits.
/// With keys from position 40 on, a 64-row query tile's first half sees none of the first key
/// tile while its second half does: that half's gradients are written zero, not left unset.
#[test]
fn packed_with_offsets_gives_the_transposing_bits() {
    for (n, &shape) in SHAPES.iter().enumerate() {
        let c = case::<f32>(300 + n as u64, packed_dims(shape));
        for (q_offset, k_offset) in [(50, 0), (70, 3), (0, 5), (0, 40)] {
            let p = AttentionParams {
                q_offset,
                k_offset,
                ..AttentionParams::new(true, 0.25f32)
            };
            let what = format!("{shape:?} offsets {q_offset}, {k_offset}");
            let got = packed(&c, p);
            assert_same_bits(&got, &transposing(&c, p), &what);
            assert!(got.0.iter().chain(&got.2).all(|x| x.is_finite()), "{what}");
        }
    }
}

/// Head widths whose tile products the strided products route to the other backends
/// (`GemmColumnMajor` from 128 on, `MatrixMultiply` up to 24) give the transposing bits too.
#[test]
fn packed_heads_on_every_gemm_route_give_the_transposing_bits() {
    let shapes = [
        (1, 70, 2, 128),
        (2, 33, 2, 130),
        (1, 40, 3, 2),
        (2, 66, 2, 24),
    ];
    for (n, &shape) in shapes.iter().enumerate() {
        let c32 = case::<f32>(500 + n as u64, packed_dims(shape));
        let c64 = case::<f64>(600 + n as u64, packed_dims(shape));
        for causal in [false, true] {
            let what = format!("{shape:?} causal {causal}");
            let p = AttentionParams::new(causal, 0.3f32);
            assert_same_bits(&packed(&c32, p), &transposing(&c32, p), &what);
            let p = AttentionParams::new(causal, 0.3f64);
            assert_same_bits(&packed(&c64, p), &transposing(&c64, p), &what);
        }
    }
}

#[test]
fn packed_attention_gives_the_same_bits_on_one_and_two_threads() {
    // 3 batch elements of 4 heads of 4·90·90·40 flops each: above the threshold that splits.
    let c = case::<f32>(400, packed_dims((3, 90, 4, 40)));
    for causal in [false, true] {
        let p = AttentionParams::new(causal, 0.2f32);
        kernels::threads::set_threads(1);
        let one = packed(&c, p);
        kernels::threads::set_threads(2);
        let two = packed(&c, p);
        kernels::threads::set_threads(1);
        assert_same_bits(&two, &one, &format!("two threads, causal {causal}"));
        assert_same_bits(&one, &transposing(&c, p), &format!("causal {causal}"));
    }
}

#[test]
fn packed_attention_of_empty_sizes_does_not_panic() {
    for shape in [
        (0, 5, 2, 3),
        (2, 0, 2, 3),
        (2, 5, 0, 3),
        (2, 5, 2, 0),
        (0, 0, 0, 0),
    ] {
        let c = case::<f32>(500, packed_dims(shape));
        for causal in [false, true] {
            let p = AttentionParams::new(causal, 0.5f32);
            let what = format!("{shape:?} causal {causal}");
            assert_same_bits(&packed(&c, p), &transposing(&c, p), &what);
        }
    }
}

#[test]
fn packed_attention_wrong_buffers_and_scales_are_errors() {
    let dims = packed_dims((2, 5, 3, 4));
    let c = case::<f32>(600, dims);
    let p = AttentionParams::new(true, 0.5f32);
    let rows = 2 * 5 * 3;
    let (mut out, mut lse) = (vec![0f32; rows * 4], vec![0f32; rows]);
    let mut dqkv = vec![0f32; rows * 12];
    let forward = |qkv: &[f32], out: &mut [f32], lse: &mut [f32], p| {
        kernels::packed_attention_into(qkv, dims, p, out, lse)
    };
    let is_buffer = |r: Result<(), TensorError>, name: &str| {
        matches!(r, Err(TensorError::BufferLength { op, buffer, .. })
            if buffer == name && op.starts_with("packed_attention"))
    };
    assert!(is_buffer(
        forward(&c.qkv[1..], &mut out, &mut lse, p),
        "qkv"
    ));
    assert!(is_buffer(
        forward(&c.qkv, &mut out[1..], &mut lse, p),
        "out"
    ));
    assert!(is_buffer(
        forward(&c.qkv, &mut out, &mut vec![0f32; rows + 1], p),
        "lse"
    ));
    let nan = AttentionParams::new(true, f32::NAN);
    assert!(matches!(
        forward(&c.qkv, &mut out, &mut lse, nan),
        Err(TensorError::InvalidArgument { .. })
    ));
    let huge = PackedDims {
        batch: usize::MAX / 2,
        ..dims
    };
    assert!(matches!(
        kernels::packed_attention_into(&c.qkv, huge, p, &mut out, &mut lse),
        Err(TensorError::InvalidArgument { .. })
    ));
    forward(&c.qkv, &mut out, &mut lse, p).unwrap();
    let backward = |qkv: &[f32], out: &[f32], lse: &[f32], dout: &[f32], dqkv: &mut [f32]| {
        kernels::packed_attention_grad_into(qkv, out, lse, dout, dims, p, dqkv)
    };
    let (q, o, l, d) = (&c.qkv[..], &out[..], &lse[..], &c.dout[..]);
    assert!(is_buffer(backward(&q[1..], o, l, d, &mut dqkv), "qkv"));
    assert!(is_buffer(backward(q, &o[1..], l, d, &mut dqkv), "out"));
    assert!(is_buffer(backward(q, o, &l[1..], d, &mut dqkv), "lse"));
    assert!(is_buffer(backward(q, o, l, &d[1..], &mut dqkv), "dout"));
    assert!(is_buffer(backward(q, o, l, d, &mut dqkv[1..]), "dqkv"));
    assert!(matches!(
        kernels::packed_attention_grad_into(q, o, l, d, dims, nan, &mut dqkv),
        Err(TensorError::InvalidArgument { .. })
    ));
    backward(q, o, l, d, &mut dqkv).unwrap();
}

/// The tensor level in f32 and bf16 (computed in f32, returned as bf16) gives the bits of the
/// tensor-level `flash_attention` on the transposed tensors, transposed back; shapes checked.
#[test]
fn packed_tensor_level_gives_the_transposing_bits_and_checks_shapes() {
    let dims = packed_dims((2, 70, 3, 8));
    let c = case::<f32>(700, dims);
    let [b, s, h, d] = [dims.batch, dims.seq, dims.heads, dims.head_dim];
    let scale = 0.35;
    for dtype in [DType::F32, DType::BF16] {
        let qkv = Tensor::from_vec(&[b, s, h, 3 * d], c.qkv.clone())
            .unwrap()
            .to_dtype(dtype);
        let dout = Tensor::from_vec(&[b, s, h, d], c.dout.clone())
            .unwrap()
            .to_dtype(dtype);
        let (out, lse) = kernels::packed_attention(&qkv, true, scale).unwrap();
        assert_eq!((out.shape(), out.dtype()), (&[b, s, h, d][..], dtype));
        assert_eq!(lse.shape(), &[b, s, h]);
        let dqkv = kernels::packed_attention_grad(&qkv, &out, &lse, &dout, true, scale).unwrap();
        assert_eq!((dqkv.shape(), dqkv.dtype()), (qkv.shape(), dtype));
        // The transposing path at the tensor level, in the same dtype.
        let heads_first = |x: &Tensor, parts: usize, part: usize| {
            let values = split_transposed(&x.to_f64_vec(), dims, parts, part);
            Tensor::from_vec(&[b, h, s, d], values)
                .unwrap()
                .to_dtype(dtype)
        };
        let (q, k, v) = (
            heads_first(&qkv, 3, 0),
            heads_first(&qkv, 3, 1),
            heads_first(&qkv, 3, 2),
        );
        let (t_out, t_lse) = kernels::flash_attention(&q, &k, &v, true, scale).unwrap();
        let t_dout = heads_first(&dout, 1, 0);
        let g = kernels::flash_attention_grad((&q, &k, &v), &t_out, &t_lse, &t_dout, true, scale)
            .unwrap();
        let back = |parts: &[&Tensor], width: usize| {
            let values: Vec<Vec<f64>> = parts.iter().map(|t| t.to_f64_vec()).collect();
            let refs: Vec<&[f64]> = values.iter().map(|v| &v[..]).collect();
            bits(&merge_transposed(&refs, dims, width))
        };
        let what = format!("{dtype:?}");
        assert!(bits(&out.to_f64_vec()) == back(&[&t_out], d), "{what}: out");
        assert!(bits(&lse.to_f64_vec()) == back(&[&t_lse], 1), "{what}: lse");
        let want = back(&[&g.dq, &g.dk, &g.dv], d);
        assert!(bits(&dqkv.to_f64_vec()) == want, "{what}: dqkv");
    }
    let qkv = Tensor::from_vec(&[b, s, h, 3 * d], c.qkv.clone()).unwrap();
    let not_packed = Tensor::from_vec(&[b, s, h * 3 * d], c.qkv.clone()).unwrap();
    assert!(matches!(
        kernels::packed_attention(&not_packed, true, scale),
        Err(TensorError::InvalidArgument { .. })
    ));
    let odd = Tensor::from_vec(&[b, s, 36, 2], c.qkv.clone()).unwrap();
    assert!(matches!(
        kernels::packed_attention(&odd, true, scale),
        Err(TensorError::InvalidArgument { .. })
    ));
    let (out, lse) = kernels::packed_attention(&qkv, true, scale).unwrap();
    assert!(matches!(
        kernels::packed_attention_grad(&qkv, &out, &lse, &qkv, true, scale),
        Err(TensorError::ShapeMismatch { .. })
    ));
}
