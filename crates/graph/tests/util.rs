//! Shared helpers: deterministic random tensors and the finite-difference gradient check.

use graph::{grad, rng, Executor, GraphBuilder, GraphError, Initializer, ValueId};
use tensor::{DType, Tensor};

/// Deterministic values uniform in `[-1, 1)`, as an f64 tensor.
pub fn uniform(shape: &[usize], seed: u64) -> Tensor {
    let n: usize = shape.iter().product();
    let key = rng::stream_key(seed, "test");
    let values = (0..n)
        .map(|i| 2.0 * rng::unit_f64(rng::bits_at(key, i as u64)) - 1.0)
        .collect();
    Tensor::from_vec(shape, values).unwrap()
}

/// Deterministic i32 indices in `0..bound`.
pub fn indices(shape: &[usize], bound: usize, seed: u64) -> Tensor {
    let n: usize = shape.iter().product();
    let key = rng::stream_key(seed, "ids");
    let values = (0..n)
        .map(|i| (rng::bits_at(key, i as u64) % bound as u64) as i32)
        .collect();
    Tensor::from_vec(shape, values).unwrap()
}

/// Values fed to inputs of a graph under test.
pub type Feeds = Vec<(ValueId, Tensor)>;

/// Central-difference step. The check runs in f64: the truncation error is about
/// `h²/6·|L'''| ≈ 2e-11·|L'''|` and the rounding error about `ε·|L|/h ≈ 2e-11·|L|`; for these
/// small graphs (|L|, |L'''| well below 100) both stay under ~4e-9.
const STEP: f64 = 1e-5;
/// Allowed `|numeric - analytic| / (1 + |analytic|)`: 25× above the error budget above, while a
/// wrong backward rule is off by O(|analytic|).
const TOLERANCE: f64 = 1e-7;
/// At most this many elements of each parameter are perturbed (spread over the tensor).
const MAX_PROBES: usize = 24;

/// Checks the gradients `grad` computes for every trainable parameter of the graph `build`
/// makes against central finite differences.
///
/// `build` creates f64 parameters (initialised from their initializers) and any inputs (fed with
/// the returned tensors) and returns the value `y` under test; the loss is
/// `sum(y · probe)` with a frozen random `probe`, so every element of `y` matters with its own
/// weight.
pub fn check_gradients(
    label: &str,
    build: impl FnOnce(&mut GraphBuilder) -> Result<(ValueId, Feeds), GraphError>,
) -> Result<(), GraphError> {
    let mut b = GraphBuilder::with_float_dtype(DType::F64);
    let (y, feeds) = build(&mut b)?;
    let shape = b.shape(y)?.to_vec();
    let probe = b.parameter_with("probe", &shape, DType::F64, Initializer::normal(1.0), false)?;
    let weighted = b.mul("probe_mul", y, probe)?;
    let loss = b.reduce_sum("probe_sum", weighted, &[], false)?;
    let forward = b.finish();
    let params = forward.trainable_parameters();
    assert!(!params.is_empty(), "{label}: nothing to differentiate");
    let training = grad(&forward, loss, &params)?;
    let mut exec = Executor::new(&training.graph)?;
    exec.init_parameters(11)?;
    for (v, t) in &feeds {
        exec.set_input(*v, t)?;
    }
    let run = |exec: &mut Executor| -> Result<f64, GraphError> {
        exec.set_step(0);
        exec.run()?;
        Ok(exec.value(loss)?.to_f64_vec()[0])
    };
    run(&mut exec)?;
    let analytic: Vec<Vec<f64>> = training
        .grads
        .iter()
        .map(|&(_, g)| exec.value(g).map(Tensor::to_f64_vec))
        .collect::<Result<_, _>>()?;
    for (&(param, _), analytic) in training.grads.iter().zip(&analytic) {
        let name = forward.value(param)?.name.clone();
        let n = analytic.len();
        let stride = n.div_ceil(MAX_PROBES).max(1);
        for i in (0..n).step_by(stride) {
            let original = exec.value_mut(param)?.as_slice::<f64>().unwrap()[i];
            exec.value_mut(param)?.as_slice_mut::<f64>().unwrap()[i] = original + STEP;
            let plus = run(&mut exec)?;
            exec.value_mut(param)?.as_slice_mut::<f64>().unwrap()[i] = original - STEP;
            let minus = run(&mut exec)?;
            exec.value_mut(param)?.as_slice_mut::<f64>().unwrap()[i] = original;
            let numeric = (plus - minus) / (2.0 * STEP);
            let error = (numeric - analytic[i]).abs() / (1.0 + analytic[i].abs());
            assert!(
                error < TOLERANCE,
                "{label}: d loss / d {name}[{i}]: analytic {} vs numeric {numeric} (error {error:e})",
                analytic[i]
            );
        }
    }
    Ok(())
}

/// Held by the tests that change the process's kernel thread count
/// (`tensor::kernels::threads::set_threads`) and by those a second thread would disturb (a
/// split kernel allocates its list of parts, which the allocation count would see).
pub fn kernel_threads_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
