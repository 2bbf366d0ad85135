//! Unary kernels (ReLU, GeLU forms, …) and their gradients against analytic references and finite differences; GeLU at MindSpore's documented values.

use tensor::kernels::{self, GeluForm, GradInput, UnaryOp};
use tensor::{DType, Tensor, TensorError};

use super::reference::{self as r, assert_close, assert_close_f32, Rng};

/// An op, its f64 reference forward, reference derivative f'(x), and input range.
type Case = (UnaryOp, fn(f64) -> f64, fn(f64) -> f64, (f64, f64));

fn cases() -> Vec<Case> {
    vec![
        (
            UnaryOp::Relu,
            |x| x.max(0.0),
            |x| if x > 0.0 { 1.0 } else { 0.0 },
            (-3.0, 3.0),
        ),
        (
            UnaryOp::Gelu(GeluForm::Erf),
            r::gelu_erf,
            gelu_erf_prime,
            (-4.0, 4.0),
        ),
        (
            UnaryOp::Gelu(GeluForm::Tanh),
            r::gelu_tanh,
            gelu_tanh_prime,
            (-4.0, 4.0),
        ),
        (
            UnaryOp::Tanh,
            f64::tanh,
            |x| 1.0 - x.tanh().powi(2),
            (-3.0, 3.0),
        ),
        (
            UnaryOp::Sigmoid,
            sigmoid,
            |x| sigmoid(x) * (1.0 - sigmoid(x)),
            (-6.0, 6.0),
        ),
        (UnaryOp::Exp, f64::exp, f64::exp, (-3.0, 3.0)),
        (UnaryOp::Log, f64::ln, |x| 1.0 / x, (0.1, 5.0)),
        (UnaryOp::Sqrt, f64::sqrt, |x| 0.5 / x.sqrt(), (0.1, 5.0)),
        (UnaryOp::Neg, |x| -x, |_| -1.0, (-3.0, 3.0)),
    ]
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// d/dx of x·Φ(x): Φ(x) + x·φ(x).
fn gelu_erf_prime(x: f64) -> f64 {
    let cdf = 0.5 * r::erfc(-x / std::f64::consts::SQRT_2);
    cdf + x * (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt()
}

/// d/dx of the tanh approximation.
fn gelu_tanh_prime(x: f64) -> f64 {
    let k = (2.0 / std::f64::consts::PI).sqrt();
    let t = (k * (x + 0.044715 * x * x * x)).tanh();
    0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * x * x)
}

const LENGTHS: [usize; 5] = [1, 3, 16, 17, 100];

#[test]
fn forward_matches_reference() {
    let mut rng = Rng::new(20);
    for (op, f, _, (lo, hi)) in cases() {
        for n in LENGTHS {
            let x = rng.vec(n, lo, hi);
            let want: Vec<f64> = x.iter().map(|&v| f(v)).collect();
            let y = kernels::unary(op, &r::f32_tensor(&[n], &x)).unwrap();
            assert_close_f32(y.as_f32().unwrap(), &want, op.name());
            let y = kernels::unary(op, &r::f64_tensor(&[n], &x)).unwrap();
            assert_close(&y.to_f64_vec(), &want, 1e-13, 1e-14, op.name());
            // In place agrees with out of place.
            let mut inplace = r::to_f32(&x);
            kernels::unary_inplace(op, &mut inplace);
            assert_close_f32(&inplace, &want, op.name());
        }
    }
}

#[test]
fn gradients_match_analytic_reference_and_finite_differences() {
    let mut rng = Rng::new(21);
    for (op, f, f_prime, (lo, hi)) in cases() {
        for n in LENGTHS {
            let mut x = rng.vec(n, lo, hi);
            if op == UnaryOp::Relu {
                // Keep away from the kink, where finite differences are meaningless.
                x.iter_mut()
                    .filter(|v| v.abs() < 1e-3)
                    .for_each(|v| *v = 0.5);
            }
            let dy = rng.vec(n, -1.0, 1.0);
            let want: Vec<f64> = x.iter().zip(&dy).map(|(&v, &g)| f_prime(v) * g).collect();
            let saved: Vec<f64> = match op.grad_input() {
                GradInput::Input => x.clone(),
                GradInput::Output => x.iter().map(|&v| f(v)).collect(),
            };
            let dx =
                kernels::unary_grad(op, &r::f64_tensor(&[n], &saved), &r::f64_tensor(&[n], &dy))
                    .unwrap();
            assert_close(&dx.to_f64_vec(), &want, 1e-11, 1e-12, op.name());
            let dx32 =
                kernels::unary_grad(op, &r::f32_tensor(&[n], &saved), &r::f32_tensor(&[n], &dy))
                    .unwrap();
            assert_close_f32(dx32.as_f32().unwrap(), &want, op.name());
            // Central differences of Σ dy·f(x) through the f64 kernel.
            let numeric = r::numeric_grad(&x, 1e-6, |probe| {
                let mut y = vec![0.0; n];
                kernels::unary_into(op, probe, &mut y).unwrap();
                r::weighted_sum(&dy, &y)
            });
            assert_close(&dx.to_f64_vec(), &numeric, 1e-6, 1e-7, op.name());
        }
    }
}

/// MindSpore's documented outputs for `[[-1, 4, -8], [2, -5, 9]]`: `nn.GELU()` (tanh form) and
/// `nn.GELU(approximate=False)` (erf form), float32.
#[test]
fn gelu_matches_mindspore_documented_values() {
    let x = Tensor::from_vec(&[2, 3], vec![-1.0f32, 4.0, -8.0, 2.0, -5.0, 9.0]).unwrap();
    let tanh_form = kernels::gelu(&x, GeluForm::Tanh).unwrap();
    let want_tanh = [
        -1.5880802e-01,
        3.9999299e+00,
        -3.1077917e-21,
        1.9545976e+00,
        -2.2918017e-07,
        9.0,
    ];
    assert_close_f32(tanh_form.as_f32().unwrap(), &want_tanh, "gelu tanh");
    let erf_form = kernels::gelu(&x, GeluForm::Erf).unwrap();
    // MindSpore prints -1.4901161e-06 for gelu(-5): the cancellation of `1 + erf(x/√2)` in f32.
    // The exact value is -1.4332e-06, which the erfc form computes.
    let want_erf = [
        -1.5865526e-01,
        3.9998732e+00,
        0.0,
        1.9544997e+00,
        -1.4332e-06,
        9.0,
    ];
    let got: Vec<f64> = erf_form
        .as_f32()
        .unwrap()
        .iter()
        .map(|&v| f64::from(v))
        .collect();
    assert_close(&got, &want_erf, 1e-4, 1e-9, "gelu erf");
}

/// The tanh GeLU `x·σ(2u)`, `u = √(2/π)·(x + 0.044715·x³)`, and its derivative in f64, in the
/// sigmoid form, which does not cancel in the negative tail (`1 + tanh(u)` does, even in f64).
fn gelu_tanh_tail_exact(x: f64) -> (f64, f64) {
    let k = (2.0 / std::f64::consts::PI).sqrt();
    let u = k * (x + 0.044715 * x * x * x);
    let e = (-2.0 * u).exp();
    let s = 1.0 / (1.0 + e);
    let du = k * (1.0 + 3.0 * 0.044715 * x * x);
    (x * s, s + 2.0 * x * s * (e * s) * du)
}

/// The f32 tanh GeLU and its gradient keep their relative accuracy over [-10, 10], the
/// negative tail included: the form `0.5·x·(1 + tanh(u))` loses it there (100 % at x = -5,
/// where `1 + tanh(u)` is below f32's unit in the last place of 1).
#[test]
fn tanh_gelu_is_accurate_down_the_negative_tail() {
    let x: Vec<f32> = (-1000..=1000).map(|i| i as f32 / 100.0).collect();
    let ones = vec![1.0f32; x.len()];
    let (mut y, mut dx) = (vec![0.0f32; x.len()], vec![0.0f32; x.len()]);
    let op = UnaryOp::Gelu(GeluForm::Tanh);
    kernels::unary_into(op, &x, &mut y).unwrap();
    kernels::unary_grad_into(op, &x, &ones, &mut dx).unwrap();
    for (i, &xi) in x.iter().enumerate() {
        let (want_y, want_dx) = gelu_tanh_tail_exact(f64::from(xi));
        // The input's own rounding moves `e^{-2u}` by up to |2u|·2^-24 relatively.
        let tol = 1e-6 * (1.0 + f64::from(xi).abs().powi(3));
        let rel = |got: f32, want: f64| ((f64::from(got) - want) / want.abs().max(1e-300)).abs();
        if want_y != 0.0 {
            assert!(
                rel(y[i], want_y) <= tol,
                "gelu({xi}) = {}, want {want_y}",
                y[i]
            );
        }
        if want_dx.abs() > 1e-300 {
            assert!(
                rel(dx[i], want_dx) <= tol || (f64::from(dx[i]) - want_dx).abs() <= 1e-7,
                "gelu'({xi}) = {}, want {want_dx}",
                dx[i]
            );
        }
    }
}

/// The f32 tanh keeps f32's absolute accuracy into its saturating tail, and so does its gradient
/// `1 - y²`: over [-10, 10] `y` is within two units of 1's last place of the f64 value and never
/// leaves [-1, 1], and the gradient is never negative. MindSpore 2.10's CPU `Tanh` does not
/// (docs/MINDSPORE_DIFFERENCES.md, difference 16): 1.0000098 at x = 5, exactly ±1 from |x| ≈
/// 5, so a gradient of 0 there where the true one is 1.7e-4 at 5.02, negative near 4.99.
#[test]
fn tanh_is_accurate_in_its_saturating_tail() {
    let x: Vec<f32> = (-1000..=1000).map(|i| i as f32 / 100.0).collect();
    let ones = vec![1.0f32; x.len()];
    let (mut y, mut dx) = (vec![0.0f32; x.len()], vec![0.0f32; x.len()]);
    kernels::unary_into(UnaryOp::Tanh, &x, &mut y).unwrap();
    assert_eq!(UnaryOp::Tanh.grad_input(), GradInput::Output);
    kernels::unary_grad_into(UnaryOp::Tanh, &y, &ones, &mut dx).unwrap();
    // Two units in the last place of 1 (below 1 an f32 steps by 2^-24).
    let tol = 2.0 * f64::from(f32::EPSILON);
    for (i, &xi) in x.iter().enumerate() {
        let want = f64::from(xi).tanh();
        let (yi, di) = (f64::from(y[i]), f64::from(dx[i]));
        assert!(
            yi.abs() <= 1.0 && (yi - want).abs() <= tol,
            "tanh({xi}) = {yi}, want {want}"
        );
        let want_dx = 1.0 - want * want;
        assert!(
            di >= 0.0 && (di - want_dx).abs() <= tol,
            "tanh'({xi}) = {di}, want {want_dx}"
        );
    }
}

#[test]
fn named_wrappers_and_dtypes() {
    let x = Tensor::from_vec(&[3], vec![-1.0f32, 0.0, 2.0]).unwrap();
    assert_eq!(
        kernels::relu(&x).unwrap().as_f32().unwrap(),
        &[0.0, 0.0, 2.0]
    );
    assert_eq!(
        kernels::neg(&x).unwrap().as_f32().unwrap(),
        &[1.0, -0.0, -2.0]
    );
    let dy = Tensor::from_vec(&[3], vec![1.0f32, 1.0, 1.0]).unwrap();
    // relu's gradient at exactly 0 is 0.
    assert_eq!(
        kernels::relu_grad(&x, &dy).unwrap().as_f32().unwrap(),
        &[0.0, 0.0, 1.0]
    );
    let y = kernels::exp(&x.to_dtype(DType::BF16)).unwrap();
    assert_eq!(y.dtype(), DType::BF16);
    assert_close(
        &y.to_f64_vec(),
        &[(-1f64).exp(), 1.0, 2f64.exp()],
        1e-2,
        0.0,
        "exp bf16",
    );
    for f in [kernels::tanh, kernels::sigmoid, kernels::log, kernels::sqrt] {
        assert!(f(&x).is_ok());
    }
    assert!(matches!(
        kernels::relu(&Tensor::zeros(DType::I64, &[2])),
        Err(TensorError::UnsupportedDType { op: "relu", .. })
    ));
    assert!(matches!(
        kernels::tanh_grad(&x, &Tensor::zeros(DType::F32, &[4])),
        Err(TensorError::ShapeMismatch { op: "tanh", .. })
    ));
}

/// The unary kernels and their gradients split their elements over threads: GeLU (both forms)
/// and its gradient on a GPT-sized activation are bitwise the one thread's.
#[test]
fn unary_kernels_are_bitwise_the_same_on_any_thread_count() {
    use tensor::kernels::{self, GeluForm, UnaryOp};
    let mut rng = super::reference::Rng::new(12);
    let len = 2048 * 1024 + 37; // not a multiple of any chunk
    let x = super::reference::to_f32(&rng.vec(len, -4.0, 4.0));
    let dy = super::reference::to_f32(&rng.vec(len, -1.0, 1.0));
    for op in [
        UnaryOp::Gelu(GeluForm::Tanh),
        UnaryOp::Gelu(GeluForm::Erf),
        UnaryOp::Relu,
    ] {
        let run = |threads: usize| {
            kernels::threads::set_threads(threads);
            let mut y = vec![0f32; len];
            let mut dx = vec![0f32; len];
            kernels::unary_into(op, &x, &mut y).unwrap();
            kernels::unary_grad_into(op, &x, &dy, &mut dx).unwrap();
            kernels::threads::set_threads(1);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            (bits(&y), bits(&dx))
        };
        let one = run(1);
        assert!(run(2) == one && run(3) == one, "{op:?}");
    }
}
