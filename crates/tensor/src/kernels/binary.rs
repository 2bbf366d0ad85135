//! Binary elementwise arithmetic (add, sub, mul, div) with NumPy broadcasting, its gradients, and
//! `bias_add`.

use crate::error::TensorError;
use crate::kernels::broadcast::{
    broadcast_shape, broadcast_strides, contiguous_strides, for_each_row, sum_to_shape_into,
};
use crate::kernels::check;
use crate::kernels::float::{with_float, Float};
use crate::kernels::row_sums::RowSums;
use crate::kernels::wide::widest;
use crate::tensor::Tensor;

/// A binary elementwise operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    /// `a + b`.
    Add,
    /// `a - b`.
    Sub,
    /// `a * b`.
    Mul,
    /// `a / b` (IEEE: division by zero gives ±inf or NaN).
    Div,
}

impl BinaryOp {
    /// The op's name (`add`, `sub`, `mul`, `div`).
    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
        }
    }
}

/// The arithmetic of one [`BinaryOp`], as a type so each op gets its own monomorphised loops.
trait Arith {
    fn apply<T: Float>(a: T, b: T) -> T;
}

macro_rules! arith {
    ($name:ident, $a:ident, $b:ident => $expr:expr) => {
        struct $name;
        impl Arith for $name {
            #[inline(always)]
            fn apply<T: Float>($a: T, $b: T) -> T {
                $expr
            }
        }
    };
}
arith!(AddOp, a, b => a + b);
arith!(SubOp, a, b => a - b);
arith!(MulOp, a, b => a * b);
arith!(DivOp, a, b => a / b);

/// `out = a ⊙ b` where `a` (of `a_shape`) and `b` (of `b_shape`) broadcast to `out`'s shape
/// (the broadcast of the two).
pub fn binary_into<T: Float>(
    op: BinaryOp,
    a: &[T],
    a_shape: &[usize],
    b: &[T],
    b_shape: &[usize],
    out: &mut [T],
) -> Result<(), TensorError> {
    let name = op.name();
    check::buffer_len(name, "a", a_shape.iter().product(), a.len())?;
    check::buffer_len(name, "b", b_shape.iter().product(), b.len())?;
    let out_shape = broadcast_shape(name, a_shape, b_shape)?;
    check::buffer_len(name, "out", out_shape.iter().product(), out.len())?;
    match op {
        BinaryOp::Add => broadcast_apply::<T, AddOp>(a, a_shape, b, b_shape, &out_shape, out),
        BinaryOp::Sub => broadcast_apply::<T, SubOp>(a, a_shape, b, b_shape, &out_shape, out),
        BinaryOp::Mul => broadcast_apply::<T, MulOp>(a, a_shape, b, b_shape, &out_shape, out),
        BinaryOp::Div => broadcast_apply::<T, DivOp>(a, a_shape, b, b_shape, &out_shape, out),
    }
    Ok(())
}

fn broadcast_apply<T: Float, Op: Arith>(
    a: &[T],
    a_shape: &[usize],
    b: &[T],
    b_shape: &[usize],
    out_shape: &[usize],
    out: &mut [T],
) {
    if a_shape == b_shape {
        for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
            *o = Op::apply(x, y);
        }
        return;
    }
    let out_strides = contiguous_strides(out_shape);
    let a_strides = broadcast_strides(a_shape, out_shape);
    let b_strides = broadcast_strides(b_shape, out_shape);
    for_each_row(
        out_shape,
        [&out_strides, &a_strides, &b_strides],
        |[o, i, j], len, [_, a_step, b_step]| {
            let dst = &mut out[o..o + len];
            match (a_step, b_step) {
                (0, 0) => dst.fill(Op::apply(a[i], b[j])),
                (0, _) => {
                    let x = a[i];
                    for (d, &y) in dst.iter_mut().zip(&b[j..j + len]) {
                        *d = Op::apply(x, y);
                    }
                }
                (_, 0) => {
                    let y = b[j];
                    for (d, &x) in dst.iter_mut().zip(&a[i..i + len]) {
                        *d = Op::apply(x, y);
                    }
                }
                _ => {
                    for ((d, &x), &y) in dst.iter_mut().zip(&a[i..i + len]).zip(&b[j..j + len]) {
                        *d = Op::apply(x, y);
                    }
                }
            }
        },
    );
}

/// `a ⊙ b` with NumPy broadcasting; both tensors must have one dtype.
pub fn binary(op: BinaryOp, a: &Tensor, b: &Tensor) -> Result<Tensor, TensorError> {
    let name = op.name();
    check::same_dtype(name, a, b)?;
    let out_shape = broadcast_shape(name, a.shape(), b.shape())?;
    with_float!(name, a.dtype(), |T| {
        let xa = T::read(name, a)?;
        let xb = T::read(name, b)?;
        let mut out = vec![T::ZERO; out_shape.iter().product()];
        binary_into::<T>(op, &xa, a.shape(), &xb, b.shape(), &mut out)?;
        Ok(T::write(&out_shape, out, a.dtype()))
    })
}

/// `a + b`, broadcasting.
pub fn add(a: &Tensor, b: &Tensor) -> Result<Tensor, TensorError> {
    binary(BinaryOp::Add, a, b)
}

/// `a - b`, broadcasting.
pub fn sub(a: &Tensor, b: &Tensor) -> Result<Tensor, TensorError> {
    binary(BinaryOp::Sub, a, b)
}

/// `a * b` (elementwise), broadcasting.
pub fn mul(a: &Tensor, b: &Tensor) -> Result<Tensor, TensorError> {
    binary(BinaryOp::Mul, a, b)
}

/// `a / b` (elementwise), broadcasting.
pub fn div(a: &Tensor, b: &Tensor) -> Result<Tensor, TensorError> {
    binary(BinaryOp::Div, a, b)
}

/// The gradients `(da, db)` of `y = a ⊙ b` given `dy` (of the broadcast shape), each summed back
/// to its input's shape:
/// add `(dy, dy)`, sub `(dy, -dy)`, mul `(dy·b, dy·a)`, div `(dy/b, -dy·a/b²)`.
pub fn binary_grad(
    op: BinaryOp,
    a: &Tensor,
    b: &Tensor,
    dy: &Tensor,
) -> Result<(Tensor, Tensor), TensorError> {
    const OP: &str = "binary_grad";
    check::same_dtype(OP, a, b)?;
    check::same_dtype(OP, a, dy)?;
    let out_shape = broadcast_shape(OP, a.shape(), b.shape())?;
    if dy.shape() != out_shape.as_slice() {
        return Err(TensorError::ShapeMismatch {
            op: OP,
            lhs: out_shape,
            rhs: dy.shape().to_vec(),
        });
    }
    with_float!(OP, a.dtype(), |T| {
        let xa = T::read(OP, a)?;
        let xb = T::read(OP, b)?;
        let g = T::read(OP, dy)?;
        let (ga, gb) = binary_grad_full::<T>(op, &xa, a.shape(), &xb, b.shape(), &g, &out_shape)?;
        let mut da = vec![T::ZERO; xa.len()];
        let mut db = vec![T::ZERO; xb.len()];
        sum_to_shape_into::<T>(&ga, &out_shape, a.shape(), &mut da)?;
        sum_to_shape_into::<T>(&gb, &out_shape, b.shape(), &mut db)?;
        Ok((
            T::write(a.shape(), da, a.dtype()),
            T::write(b.shape(), db, b.dtype()),
        ))
    })
}

/// The gradients of `a ⊙ b` at the broadcast shape, before summing back to the input shapes.
fn binary_grad_full<T: Float>(
    op: BinaryOp,
    a: &[T],
    a_shape: &[usize],
    b: &[T],
    b_shape: &[usize],
    dy: &[T],
    out_shape: &[usize],
) -> Result<(Vec<T>, Vec<T>), TensorError> {
    let n = dy.len();
    let mut ga = vec![T::ZERO; n];
    let mut gb = vec![T::ZERO; n];
    match op {
        BinaryOp::Add => {
            ga.copy_from_slice(dy);
            gb.copy_from_slice(dy);
        }
        BinaryOp::Sub => {
            ga.copy_from_slice(dy);
            for (g, &d) in gb.iter_mut().zip(dy) {
                *g = -d;
            }
        }
        BinaryOp::Mul => {
            binary_into(BinaryOp::Mul, dy, out_shape, b, b_shape, &mut ga)?;
            binary_into(BinaryOp::Mul, dy, out_shape, a, a_shape, &mut gb)?;
        }
        BinaryOp::Div => {
            // da = dy/b; db = -dy·a/b² = -(dy/b)·(a/b).
            binary_into(BinaryOp::Div, dy, out_shape, b, b_shape, &mut ga)?;
            let mut a_over_b = vec![T::ZERO; n];
            binary_into(BinaryOp::Div, a, a_shape, b, b_shape, &mut a_over_b)?;
            for ((g, &q), &r) in gb.iter_mut().zip(&ga).zip(&a_over_b) {
                *g = -q * r;
            }
        }
    }
    Ok((ga, gb))
}

/// `out[r, c] = x[r, c] + bias[c]` for `x` viewed as rows of `bias.len()` elements.
pub fn bias_add_into<T: Float>(x: &[T], bias: &[T], out: &mut [T]) -> Result<(), TensorError> {
    const OP: &str = "bias_add";
    check::buffer_len(OP, "out", x.len(), out.len())?;
    if bias.is_empty() {
        return check::buffer_len(OP, "x", 0, x.len());
    }
    check::buffer_len(OP, "x", x.len() - x.len() % bias.len(), x.len())?;
    super::threads::for_each_rows(out, bias.len(), |start, part| {
        let x = &x[start..start + part.len()];
        for (out_row, x_row) in part
            .chunks_exact_mut(bias.len())
            .zip(x.chunks_exact(bias.len()))
        {
            for ((o, &v), &b) in out_row.iter_mut().zip(x_row).zip(bias) {
                *o = v + b;
            }
        }
    });
    Ok(())
}

/// `acc ← acc ∘ other` (with `acc_is_lhs`) or `acc ← other ∘ acc`, elementwise over two
/// operands of one shape: [`binary_into`]'s bits, written over an operand no one reads after.
pub fn binary_in_place<T: Float>(
    op: BinaryOp,
    acc: &mut [T],
    other: &[T],
    acc_is_lhs: bool,
) -> Result<(), TensorError> {
    check::buffer_len(op.name(), "other", acc.len(), other.len())?;
    super::threads::for_each_chunk(acc, |start, part| {
        in_place_part(op, part, &other[start..start + part.len()], acc_is_lhs)
    });
    Ok(())
}

/// [`binary_in_place`] with `sums` taking every row of the result (rows of
/// [`RowSums::cols`]) as it is written, while it is in L1: the bits of [`binary_in_place`] and
/// then the separate sum of the result's rows (a bias's gradient after a residual's sum). One
/// thread: with more allowed, the caller runs the two apart, each on its threads.
pub fn binary_in_place_summing_rows<T: Float>(
    op: BinaryOp,
    acc: &mut [T],
    other: &[T],
    acc_is_lhs: bool,
    sums: &mut RowSums<T>,
) -> Result<(), TensorError> {
    check::buffer_len(op.name(), "other", acc.len(), other.len())?;
    check::buffer_len(op.name(), "acc", sums.rows() * sums.cols(), acc.len())?;
    if sums.cols() > 0 {
        in_place_rows_summing(op, acc, other, acc_is_lhs, sums);
    }
    Ok(())
}

widest! {
    /// [`binary_in_place_summing_rows`]' loop, on the widest vector unit the CPU has.
    fn in_place_rows_summing<T>(op: BinaryOp, acc: &mut [T], other: &[T], acc_is_lhs: bool, sums: &mut RowSums<T>) => in_place_rows_summing_loop
}

/// [`in_place_rows_summing`]'s loop: each row's result, then its sum (lengths checked by the
/// caller, `cols > 0`).
#[inline(always)]
fn in_place_rows_summing_loop<T: Float>(
    op: BinaryOp,
    acc: &mut [T],
    other: &[T],
    acc_is_lhs: bool,
    sums: &mut RowSums<T>,
) {
    let cols = sums.cols();
    for (a, o) in acc.chunks_exact_mut(cols).zip(other.chunks_exact(cols)) {
        in_place_part_loop(op, a, o, acc_is_lhs);
        sums.add_row(a);
    }
}

widest! {
    /// One thread's part of [`binary_in_place`] (`acc` and `other` of one length), on the
    /// widest vector unit the CPU has.
    fn in_place_part<T>(op: BinaryOp, acc: &mut [T], other: &[T], acc_is_lhs: bool) => in_place_part_loop
}

/// [`in_place_part`]'s loops, one per op.
#[inline(always)]
fn in_place_part_loop<T: Float>(op: BinaryOp, acc: &mut [T], other: &[T], acc_is_lhs: bool) {
    match op {
        BinaryOp::Add => apply_in_place::<T, AddOp>(acc, other, acc_is_lhs),
        BinaryOp::Sub => apply_in_place::<T, SubOp>(acc, other, acc_is_lhs),
        BinaryOp::Mul => apply_in_place::<T, MulOp>(acc, other, acc_is_lhs),
        BinaryOp::Div => apply_in_place::<T, DivOp>(acc, other, acc_is_lhs),
    }
}

#[inline(always)]
fn apply_in_place<T: Float, Op: Arith>(acc: &mut [T], other: &[T], acc_is_lhs: bool) {
    if acc_is_lhs {
        acc.iter_mut()
            .zip(other)
            .for_each(|(a, &b)| *a = Op::apply(*a, b));
    } else {
        acc.iter_mut()
            .zip(other)
            .for_each(|(a, &b)| *a = Op::apply(b, *a));
    }
}

/// `x[r, c] += bias[c]` for `x` viewed as rows of `bias.len()` elements: [`bias_add_into`]'s
/// bits, written over `x`.
pub fn bias_add_in_place<T: Float>(x: &mut [T], bias: &[T]) -> Result<(), TensorError> {
    const OP: &str = "bias_add";
    if bias.is_empty() {
        return check::buffer_len(OP, "x", 0, x.len());
    }
    check::buffer_len(OP, "x", x.len() - x.len() % bias.len(), x.len())?;
    super::threads::for_each_rows(x, bias.len(), |_, part| add_bias_rows(part, bias));
    Ok(())
}

widest! {
    /// `x[r, c] += bias[c]` over whole rows of `bias.len()`, on the widest vector unit the CPU
    /// has.
    fn add_bias_rows<T>(x: &mut [T], bias: &[T]) => add_bias_rows_loop
}

/// [`add_bias_rows`]' loop.
#[inline(always)]
fn add_bias_rows_loop<T: Float>(x: &mut [T], bias: &[T]) {
    for row in x.chunks_exact_mut(bias.len()) {
        for (v, &b) in row.iter_mut().zip(bias) {
            *v += b;
        }
    }
}

/// `x + bias` where `bias` is 1-D and matches `x`'s last dim (MindSpore's `BiasAdd` with the
/// channel last). Its gradient is `dy` for `x` and [`bias_add_grad`] for `bias`.
pub fn bias_add(x: &Tensor, bias: &Tensor) -> Result<Tensor, TensorError> {
    const OP: &str = "bias_add";
    check::same_dtype(OP, x, bias)?;
    check::min_rank(OP, x, 1)?;
    if bias.ndim() != 1 || bias.shape()[0] != x.shape()[x.ndim() - 1] {
        return Err(TensorError::ShapeMismatch {
            op: OP,
            lhs: x.shape().to_vec(),
            rhs: bias.shape().to_vec(),
        });
    }
    with_float!(OP, x.dtype(), |T| {
        let xs = T::read(OP, x)?;
        let bs = T::read(OP, bias)?;
        let mut out = vec![T::ZERO; xs.len()];
        bias_add_into::<T>(&xs, &bs, &mut out)?;
        Ok(T::write(x.shape(), out, x.dtype()))
    })
}

/// The gradient of the bias of [`bias_add`]: `dy` summed over every dim but the last.
pub fn bias_add_grad(dy: &Tensor) -> Result<Tensor, TensorError> {
    const OP: &str = "bias_add_grad";
    check::min_rank(OP, dy, 1)?;
    let channels = dy.shape()[dy.ndim() - 1];
    crate::kernels::broadcast::sum_to_shape(dy, &[channels])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The dispatched in-place loops (AVX-512 or AVX2 where the CPU has it) give the portable
    /// loops' bits and [`binary_into`]'s and [`bias_add_into`]'s, on lengths with a tail.
    #[test]
    fn the_wide_in_place_loops_give_the_portable_bits() {
        let value = |n: usize, m: usize| -> Vec<f32> {
            (0..n).map(|i| ((i * m) % 97) as f32 / 11.0 - 4.0).collect()
        };
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let (acc, other) = (value(203, 7), value(203, 13));
        for op in [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div] {
            for acc_is_lhs in [true, false] {
                let (mut wide, mut portable) = (acc.clone(), acc.clone());
                in_place_part(op, &mut wide, &other, acc_is_lhs);
                in_place_part_loop(op, &mut portable, &other, acc_is_lhs);
                let (a, b) = if acc_is_lhs {
                    (&acc, &other)
                } else {
                    (&other, &acc)
                };
                let mut want = vec![0f32; acc.len()];
                binary_into(op, a, &[a.len()], b, &[b.len()], &mut want).unwrap();
                assert_eq!(bits(&wide), bits(&portable), "{op:?}, acc lhs {acc_is_lhs}");
                assert_eq!(bits(&wide), bits(&want), "{op:?}, acc lhs {acc_is_lhs}");
            }
        }
        let (x, bias) = (value(7 * 29, 5), value(29, 3));
        let (mut wide, mut portable) = (x.clone(), x.clone());
        add_bias_rows(&mut wide, &bias);
        add_bias_rows_loop(&mut portable, &bias);
        let mut want = vec![0f32; x.len()];
        bias_add_into(&x, &bias, &mut want).unwrap();
        assert_eq!(bits(&wide), bits(&portable));
        assert_eq!(bits(&wide), bits(&want));
    }
}
