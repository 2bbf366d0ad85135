//! Unary elementwise functions (activations and friends) and their gradients.
//!
//! Each gradient takes the tensor its formula needs — the forward input `x` or the forward output
//! `y` (see [`UnaryOp::grad_input`]) — and the upstream gradient `dy`, and returns `dx`.
//!
//! GeLU comes in both forms MindSpore uses: `nn.GELU(approximate=True)` (the default of the `nn`
//! layer) is the tanh approximation [`GeluForm::Tanh`]; `ops.gelu(approximate='none')` (the
//! default of the functional op) is the exact erf form [`GeluForm::Erf`].

use crate::error::TensorError;
use crate::kernels::check;
use crate::kernels::float::{with_float, Float};
use crate::kernels::row_sums::RowSums;
use crate::kernels::wide::widest;
use crate::tensor::Tensor;

/// Which GeLU formula.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GeluForm {
    /// Exact: `0.5·x·(1 + erf(x/√2))`, computed as `0.5·x·erfc(-x/√2)` for accuracy in the tail.
    Erf,
    /// Approximate: `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`.
    Tanh,
}

/// A unary elementwise function.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    /// `max(x, 0)`; its gradient is 0 at `x = 0`.
    Relu,
    /// Gaussian error linear unit.
    Gelu(GeluForm),
    /// Hyperbolic tangent.
    Tanh,
    /// Logistic sigmoid `1 / (1 + e^-x)`.
    Sigmoid,
    /// `e^x`.
    Exp,
    /// Natural logarithm.
    Log,
    /// Square root.
    Sqrt,
    /// `-x`.
    Neg,
}

/// Which forward tensor a gradient formula reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GradInput {
    /// The forward input `x`.
    Input,
    /// The forward output `y`.
    Output,
}

impl UnaryOp {
    /// The op's name (`relu`, `gelu`, …).
    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Relu => "relu",
            UnaryOp::Gelu(_) => "gelu",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Sigmoid => "sigmoid",
            UnaryOp::Exp => "exp",
            UnaryOp::Log => "log",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Neg => "neg",
        }
    }

    /// The forward tensor the gradient reads: `x` for relu, gelu and log; `y` for tanh, sigmoid,
    /// exp and sqrt; neither for neg (either may be passed).
    pub fn grad_input(self) -> GradInput {
        match self {
            UnaryOp::Relu | UnaryOp::Gelu(_) | UnaryOp::Log | UnaryOp::Neg => GradInput::Input,
            UnaryOp::Tanh | UnaryOp::Sigmoid | UnaryOp::Exp | UnaryOp::Sqrt => GradInput::Output,
        }
    }
}

/// The maths of one [`UnaryOp`], as a type so each op gets its own monomorphised loops.
trait Function {
    /// `y = f(x)`.
    fn forward<T: Float>(x: T) -> T;
    /// `dx` from the saved tensor (`x` or `y`, see [`UnaryOp::grad_input`]) and `dy`.
    fn backward<T: Float>(saved: T, dy: T) -> T;
}

/// √(2/π).
const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;
/// 1/√2.
const FRAC_1_SQRT_2: f64 = std::f64::consts::FRAC_1_SQRT_2;
/// 1/√(2π).
const FRAC_1_SQRT_2PI: f64 = 0.398_942_280_401_432_7;
/// The cubic coefficient of the tanh approximation of GeLU.
const GELU_CUBIC: f64 = 0.044_715;
/// `-2·√(2/π)`: the tanh GeLU's `-2u = x·(GELU_M2K + GELU_M2KC·x²)`.
const GELU_M2K: f64 = -2.0 * SQRT_2_OVER_PI;
/// `-2·√(2/π)·0.044715`.
const GELU_M2KC: f64 = GELU_M2K * GELU_CUBIC;

macro_rules! function {
    ($name:ident, fwd |$x:ident| $fwd:expr, bwd |$s:ident, $dy:ident| $bwd:expr) => {
        struct $name;
        impl Function for $name {
            #[inline(always)]
            fn forward<T: Float>($x: T) -> T {
                $fwd
            }
            #[inline(always)]
            fn backward<T: Float>($s: T, $dy: T) -> T {
                $bwd
            }
        }
    };
}

function!(
    Relu,
    fwd | x | if x > T::ZERO { x } else { T::ZERO },
    bwd | x,
    dy | if x > T::ZERO { dy } else { T::ZERO }
);
// Φ(x) = 0.5·erfc(-x/√2): unlike 1 + erf(x/√2) it does not cancel for negative x, so the tail
// is accurate (MindSpore's f32 kernel returns -1.49e-6 for gelu(-5); the exact value is -1.43e-6).
function!(
    GeluErf,
    fwd | x | {
        let half = T::from_f64(0.5);
        half * x * (-x * T::from_f64(FRAC_1_SQRT_2)).erfc()
    },
    bwd | x,
    dy | {
        let half = T::from_f64(0.5);
        let cdf = half * (-x * T::from_f64(FRAC_1_SQRT_2)).erfc();
        let pdf = T::from_f64(FRAC_1_SQRT_2PI) * (-half * x * x).exp_vectorizable();
        dy * (cdf + x * pdf)
    }
);
/// `(x², e^{-2u})` of the tanh GeLU at `x`, `u = √(2/π)·(x + 0.044715·x³)`.
#[inline(always)]
fn gelu_tanh_exp<T: Float>(x: T) -> (T, T) {
    let x2 = x * x;
    let minus_2u = x * x2.mul_add(T::from_f64(GELU_M2KC), T::from_f64(GELU_M2K));
    (x2, minus_2u.exp_vectorizable())
}

// `0.5·x·(1 + tanh(u))` computed as `x·σ(2u) = x / (1 + e^{-2u})`, the same function: one
// exponential and one division, where the tanh form also takes |u|, a sign and a small-argument
// branch, and `1 + tanh(u)` cancels for negative x (relative error 2.5e-5 at x = -3, growing
// down the tail). The gradient `σ(2u) + 2x·σ(2u)(1 - σ(2u))·u'` takes `1 - σ` as `e·σ` where
// σ ≥ ½, where `1 - σ` would cancel.
function!(
    GeluTanh,
    fwd | x | {
        let (_, e) = gelu_tanh_exp(x);
        x / (T::ONE + e)
    },
    bwd | x,
    dy | {
        let (x2, e) = gelu_tanh_exp(x);
        let s = T::ONE / (T::ONE + e);
        let half = T::from_f64(0.5);
        let one_minus_s = if s < half { T::ONE - s } else { e * s };
        let twice_du = x2.mul_add(T::from_f64(-3.0 * GELU_M2KC), T::from_f64(-GELU_M2K));
        dy * (x * s * one_minus_s).mul_add(twice_du, s)
    }
);
function!(
    Tanh,
    fwd | x | x.tanh_vectorizable(),
    bwd | y,
    dy | dy * (T::ONE - y * y)
);
function!(
    Sigmoid,
    fwd | x | T::ONE / (T::ONE + (-x).exp_vectorizable()),
    bwd | y,
    dy | dy * y * (T::ONE - y)
);
function!(Exp, fwd | x | x.exp_vectorizable(), bwd | y, dy | dy * y);
function!(Log, fwd | x | x.ln_vectorizable(), bwd | x, dy | dy / x);
function!(Sqrt, fwd | x | x.sqrt(), bwd | y, dy | dy / (y + y));
function!(Neg, fwd | x | -x, bwd | _s, dy | -dy);

/// Runs `$body` with the type `$F` bound to the [`Function`] of `$op`.
macro_rules! with_function {
    ($op:expr, |$F:ident| $body:expr) => {
        match $op {
            UnaryOp::Relu => {
                type $F = Relu;
                $body
            }
            UnaryOp::Gelu(GeluForm::Erf) => {
                type $F = GeluErf;
                $body
            }
            UnaryOp::Gelu(GeluForm::Tanh) => {
                type $F = GeluTanh;
                $body
            }
            UnaryOp::Tanh => {
                type $F = Tanh;
                $body
            }
            UnaryOp::Sigmoid => {
                type $F = Sigmoid;
                $body
            }
            UnaryOp::Exp => {
                type $F = Exp;
                $body
            }
            UnaryOp::Log => {
                type $F = Log;
                $body
            }
            UnaryOp::Sqrt => {
                type $F = Sqrt;
                $body
            }
            UnaryOp::Neg => {
                type $F = Neg;
                $body
            }
        }
    };
}

/// `out = f(x)`, on the threads [`super::threads`] allows for large inputs.
pub fn unary_into<T: Float>(op: UnaryOp, x: &[T], out: &mut [T]) -> Result<(), TensorError> {
    check::buffer_len(op.name(), "out", x.len(), out.len())?;
    super::threads::for_each_chunk(out, |start, part| {
        forward_chunk(op, &x[start..start + part.len()], part)
    });
    Ok(())
}

widest! {
    /// One thread's share of [`unary_into`], on the widest vector unit the CPU has.
    fn forward_chunk<T>(op: UnaryOp, x: &[T], out: &mut [T]) => forward_loop
}

/// `x = f(x)` in place.
pub fn unary_inplace<T: Float>(op: UnaryOp, x: &mut [T]) {
    with_function!(op, |F| {
        for v in x.iter_mut() {
            *v = F::forward(*v);
        }
    });
}

/// `dx = f'(·)·dy`, where `saved` is the forward input or output as [`UnaryOp::grad_input`]
/// says; on the threads [`super::threads`] allows for large inputs.
pub fn unary_grad_into<T: Float>(
    op: UnaryOp,
    saved: &[T],
    dy: &[T],
    dx: &mut [T],
) -> Result<(), TensorError> {
    check::buffer_len(op.name(), "dy", saved.len(), dy.len())?;
    check::buffer_len(op.name(), "dx", saved.len(), dx.len())?;
    super::threads::for_each_chunk(dx, |start, part| {
        let end = start + part.len();
        backward_chunk(op, &saved[start..end], &dy[start..end], part)
    });
    Ok(())
}

widest! {
    /// One thread's share of [`unary_grad_into`], on the widest vector unit the CPU has.
    fn backward_chunk<T>(op: UnaryOp, saved: &[T], dy: &[T], dx: &mut [T]) => backward_loop
}

/// [`unary_grad_into`] with `sums` taking every row of `dx` (rows of [`RowSums::cols`]) as it
/// is written, while it is in L1: the bits of [`unary_grad_into`] and then the separate sum
/// of `dx`'s rows (a bias's gradient after an activation's). One thread: with more allowed,
/// the caller runs the two apart, each on its threads.
pub fn unary_grad_summing_rows<T: Float>(
    op: UnaryOp,
    saved: &[T],
    dy: &[T],
    dx: &mut [T],
    sums: &mut RowSums<T>,
) -> Result<(), TensorError> {
    check::buffer_len(op.name(), "dy", saved.len(), dy.len())?;
    check::buffer_len(op.name(), "dx", saved.len(), dx.len())?;
    check::buffer_len(op.name(), "dx", sums.rows() * sums.cols(), dx.len())?;
    if sums.cols() > 0 {
        backward_rows_summing(op, saved, dy, dx, sums);
    }
    Ok(())
}

widest! {
    /// [`unary_grad_summing_rows`]' loop, on the widest vector unit the CPU has.
    fn backward_rows_summing<T>(op: UnaryOp, saved: &[T], dy: &[T], dx: &mut [T], sums: &mut RowSums<T>) => backward_rows_summing_loop
}

/// [`backward_rows_summing`]'s loop: each row's gradient, then its sum (lengths checked by the
/// caller, `cols > 0`).
#[inline(always)]
fn backward_rows_summing_loop<T: Float>(
    op: UnaryOp,
    saved: &[T],
    dy: &[T],
    dx: &mut [T],
    sums: &mut RowSums<T>,
) {
    let cols = sums.cols();
    let rows = saved.chunks_exact(cols).zip(dy.chunks_exact(cols));
    for ((s, g), d) in rows.zip(dx.chunks_exact_mut(cols)) {
        backward_loop(op, s, g, d);
        sums.add_row(d);
    }
}

/// The forward loop (lengths checked by the caller).
#[inline(always)]
fn forward_loop<T: Float>(op: UnaryOp, x: &[T], out: &mut [T]) {
    with_function!(op, |F| {
        for (o, &v) in out.iter_mut().zip(x) {
            *o = F::forward(v);
        }
    });
}

/// The backward loop (lengths checked by the caller).
#[inline(always)]
fn backward_loop<T: Float>(op: UnaryOp, saved: &[T], dy: &[T], dx: &mut [T]) {
    with_function!(op, |F| {
        for ((d, &s), &g) in dx.iter_mut().zip(saved).zip(dy) {
            *d = F::backward(s, g);
        }
    });
}

/// `f(x)` as a new tensor of `x`'s dtype and shape.
pub fn unary(op: UnaryOp, x: &Tensor) -> Result<Tensor, TensorError> {
    let name = op.name();
    with_float!(name, x.dtype(), |T| {
        let xs = T::read(name, x)?;
        let mut out = vec![T::ZERO; xs.len()];
        unary_into::<T>(op, &xs, &mut out)?;
        Ok(T::write(x.shape(), out, x.dtype()))
    })
}

/// The gradient `dx` of `f` given the saved forward tensor (see [`UnaryOp::grad_input`]) and `dy`
/// of the same shape and dtype.
pub fn unary_grad(op: UnaryOp, saved: &Tensor, dy: &Tensor) -> Result<Tensor, TensorError> {
    let name = op.name();
    check::same_dtype(name, saved, dy)?;
    check::same_shape(name, saved, dy)?;
    with_float!(name, saved.dtype(), |T| {
        let s = T::read(name, saved)?;
        let g = T::read(name, dy)?;
        let mut dx = vec![T::ZERO; s.len()];
        unary_grad_into::<T>(op, &s, &g, &mut dx)?;
        Ok(T::write(saved.shape(), dx, saved.dtype()))
    })
}

/// Named Tensor-level forward and gradient functions for the ops without parameters.
macro_rules! named_unary {
    ($($op:ident: $fwd:ident, $grad:ident($saved:ident);)*) => {$(
        #[doc = concat!(
            "`", stringify!($fwd), "(x)` elementwise; see [`UnaryOp::", stringify!($op), "`]."
        )]
        pub fn $fwd(x: &Tensor) -> Result<Tensor, TensorError> {
            unary(UnaryOp::$op, x)
        }
        #[doc = concat!("The gradient of [`", stringify!($fwd), "`] from the forward `",
            stringify!($saved), "` and `dy`.")]
        pub fn $grad($saved: &Tensor, dy: &Tensor) -> Result<Tensor, TensorError> {
            unary_grad(UnaryOp::$op, $saved, dy)
        }
    )*};
}
named_unary! {
    Relu: relu, relu_grad(x);
    Tanh: tanh, tanh_grad(y);
    Sigmoid: sigmoid, sigmoid_grad(y);
    Exp: exp, exp_grad(y);
    Log: log, log_grad(x);
    Sqrt: sqrt, sqrt_grad(y);
}

/// GeLU in the given form.
pub fn gelu(x: &Tensor, form: GeluForm) -> Result<Tensor, TensorError> {
    unary(UnaryOp::Gelu(form), x)
}

/// The gradient of [`gelu`] from the forward input `x` and `dy`.
pub fn gelu_grad(x: &Tensor, dy: &Tensor, form: GeluForm) -> Result<Tensor, TensorError> {
    unary_grad(UnaryOp::Gelu(form), x, dy)
}

/// `-x`. Its gradient is `neg(dy)`.
pub fn neg(x: &Tensor) -> Result<Tensor, TensorError> {
    unary(UnaryOp::Neg, x)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The dispatched loops (AVX-512 or AVX2 where the CPU has it) give the portable loops' bits, for every
    /// op, on ordinary values and the awkward ones.
    #[test]
    fn wide_loops_give_the_portable_bits() {
        let ops = [
            UnaryOp::Relu,
            UnaryOp::Gelu(GeluForm::Erf),
            UnaryOp::Gelu(GeluForm::Tanh),
            UnaryOp::Tanh,
            UnaryOp::Sigmoid,
            UnaryOp::Exp,
            UnaryOp::Log,
            UnaryOp::Sqrt,
            UnaryOp::Neg,
        ];
        let mut x: Vec<f32> = (0..1000)
            .map(|i| ((i * 37) % 1000) as f32 / 97.0 - 5.0)
            .collect();
        x.extend([
            0.0,
            -0.0,
            1e-30,
            -1e-30,
            90.0,
            -90.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
        ]);
        x.push(f32::NAN);
        let dy: Vec<f32> = x.iter().map(|v| 0.5 - v / 7.0).collect();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for op in ops {
            let (mut got, mut want) = (vec![0f32; x.len()], vec![0f32; x.len()]);
            unary_into(op, &x, &mut got).unwrap();
            forward_loop(op, &x, &mut want);
            assert_eq!(bits(&got), bits(&want), "{op:?} forward");
            unary_grad_into(op, &x, &dy, &mut got).unwrap();
            backward_loop(op, &x, &dy, &mut want);
            assert_eq!(bits(&got), bits(&want), "{op:?} backward");
        }
    }
}
