//! A step whose input dies there takes the input's tensor over (no second buffer): a reshape
//! (no copy), a bias add or elementwise sum computed over it, and an all-reduce of a whole
//! slice summed over it. The measured peak drops by
//! the moved bytes and equals the prediction, and the pass is one device's.

use std::sync::Arc;

use comm::{Communicator, LocalCluster};
use exec::RankExecutor;
use graph::{GraphBuilder, Initializer};
use parallel::memory::{lifetimes, moved_buffers, predict, MemoryReport, TrainingState};
use parallel::{ParallelConfig, Program};
use tensor::{DType, Tensor};

use crate::sharded::{compile, run, values};

/// The index of the kernel step `name` of `program`.
fn step_of(program: &Program, name: &str) -> usize {
    program
        .steps
        .iter()
        .position(|s| matches!(s, parallel::Step::Kernel(k) if k.name == name))
        .unwrap_or_else(|| panic!("no step {name}"))
}

/// One pass of `program` on one rank, parameters from seed 3: the predicted and the measured
/// memory (asserted equal), and the loss.
fn run_measured(program: Program, inputs: &[Tensor]) -> (MemoryReport, f64) {
    let state = TrainingState {
        optimizer_tensors: 0,
        accumulation_sharded: None,
        master_weights: false,
    };
    let predicted = predict(&program, 0, state);
    let program = Arc::new(program);
    let ran = LocalCluster::new(1).unwrap().run(|comm| {
        let world: Arc<dyn Communicator> = Arc::new(comm);
        let mut exec = RankExecutor::new(program.clone(), world).unwrap();
        exec.init_parameters(3).unwrap();
        for (i, input) in inputs.iter().enumerate() {
            exec.set_input(i, input).unwrap();
        }
        exec.run().unwrap();
        (exec.memory().report(), exec.output(0).to_f64_vec()[0])
    });
    let (measured, loss) = ran.into_iter().next().unwrap().unwrap();
    assert_eq!(measured, predicted);
    (measured, loss)
}

#[test]
fn a_reshape_of_a_dying_value_moves_it_and_the_peak_drops_as_predicted() {
    // x·w is the step's largest value; its reshape is read by the loss only.
    let (rows, cols) = (64, 256);
    let mut b = GraphBuilder::with_float_dtype(DType::F64);
    let x = b.input("x", &[rows, cols], DType::F64).unwrap();
    let w = b
        .parameter("w", &[rows, cols], Initializer::normal(0.5))
        .unwrap();
    let y = b.mul("mul", x, w).unwrap();
    let r = b.reshape("op", y, &[rows * cols]).unwrap();
    let loss = b.reduce_sum("loss", r, &[], false).unwrap();
    let graph = b.finish();
    let program = compile(&graph, loss, &ParallelConfig::stand_alone());
    let moved = moved_buffers(&program, &lifetimes(&program));
    assert!(
        moved[step_of(&program, "op")].is_some(),
        "the reshape moves: {moved:?}"
    );
    let input = values(&[rows, cols], 1);
    let (measured, _) = run_measured(program.clone(), std::slice::from_ref(&input));
    // Activations at their peak: the fed x and one [rows, cols] value (x·w, become its
    // reshape) and scalars — not x·w and its copy beside it.
    let value = rows * cols * 8;
    let activations = measured.peaks.activations;
    assert!(
        (2 * value..3 * value).contains(&activations),
        "{activations} B of activations: {measured:?}"
    );
    // And the pass is one device's: the loss is Σ x·w, w's gradient x.
    let pass = run(program, std::slice::from_ref(&input), 3);
    assert_eq!(pass.grads[0], input.to_f64_vec());
}

#[test]
fn a_bias_add_and_a_sum_over_dying_values_compute_in_place_and_the_peak_drops_as_predicted() {
    // y = x·w dies at the bias add, h = y + b at the sum with z: both compute in place.
    let (rows, cols) = (64, 256);
    let mut b = GraphBuilder::with_float_dtype(DType::F64);
    let x = b.input("x", &[rows, cols], DType::F64).unwrap();
    let w = b.input("w", &[rows, cols], DType::F64).unwrap();
    let bias = b.input("bias", &[cols], DType::F64).unwrap();
    let z = b.input("z", &[rows, cols], DType::F64).unwrap();
    let y = b.mul("mul", x, w).unwrap();
    let h = b.bias_add("bias_add", y, bias).unwrap();
    let g = b.add("add", z, h).unwrap();
    let loss = b.reduce_sum("loss", g, &[], false).unwrap();
    let graph = b.finish();
    let program = compile(&graph, loss, &ParallelConfig::stand_alone());
    let moved = moved_buffers(&program, &lifetimes(&program));
    for name in ["bias_add", "add"] {
        assert!(
            moved[step_of(&program, name)].is_some(),
            "{name} moves: {moved:?}"
        );
    }
    assert!(
        moved[step_of(&program, "mul")].is_none(),
        "x and w live on: nothing to take over"
    );
    let inputs = [
        values(&[rows, cols], 1),
        values(&[rows, cols], 2),
        values(&[cols], 3),
        values(&[rows, cols], 4),
    ];
    let (measured, loss) = run_measured(program, &inputs);
    // Activations at their peak: the fed x, w and z, the bias and one [rows, cols] value
    // (x·w, become h, then g) — not two of them side by side.
    let value = rows * cols * 8;
    let activations = measured.peaks.activations;
    assert!(
        (4 * value..5 * value).contains(&activations),
        "{activations} B of activations: {measured:?}"
    );
    // The loss is Σ x·w + b + z, computed here apart.
    let f = |t: &Tensor| t.to_f64_vec();
    let (xs, ws, bs, zs) = (f(&inputs[0]), f(&inputs[1]), f(&inputs[2]), f(&inputs[3]));
    let want: f64 = (0..rows * cols)
        .map(|i| zs[i] + (xs[i] * ws[i] + bs[i % cols]))
        .sum();
    assert!(
        (loss - want).abs() <= 1e-9 * want.abs().max(1.0),
        "{loss} vs {want}"
    );
}

#[test]
fn a_whole_slice_all_reduce_of_a_dying_partial_sum_sums_in_place_as_predicted() {
    // y = x·w split on the reduction over 2 ranks is a pending sum, read by nothing but its
    // all-reduce; the square needs it whole. The all-reduce takes y's tensor over.
    let (rows, k, n) = (32, 64, 128);
    let mut b = GraphBuilder::with_float_dtype(DType::F64);
    let x = b.input("x", &[rows, k], DType::F64).unwrap();
    let w = b.parameter("w", &[k, n], Initializer::normal(0.5)).unwrap();
    let y = b.matmul("mm", x, w).unwrap();
    let sq = b.mul("sq", y, y).unwrap();
    let loss = b.reduce_sum("loss", sq, &[], false).unwrap();
    let graph = b.finish();
    let config = ParallelConfig::new(parallel::ParallelMode::SemiAuto, 2)
        .shard("mm", &[&[1, 2], &[2, 1]])
        .shard("sq", &[&[1, 1], &[1, 1]]);
    let program = compile(&graph, loss, &config);
    let moved = moved_buffers(&program, &lifetimes(&program));
    let reshard = program
        .steps
        .iter()
        .position(|s| matches!(s, parallel::Step::Reshard(r) if r.plan.is_whole_slice_all_reduce()))
        .expect("y's pending sum is all-reduced");
    assert!(moved[reshard].is_some(), "the all-reduce moves: {moved:?}");
    let input = values(&[rows, k], 1);
    let state = TrainingState {
        optimizer_tensors: 0,
        accumulation_sharded: None,
        master_weights: false,
    };
    let predicted: Vec<MemoryReport> = (0..2).map(|r| predict(&program, r, state)).collect();
    let shared = Arc::new(program.clone());
    let measured = LocalCluster::new(2).unwrap().run(|comm| {
        let world: Arc<dyn Communicator> = Arc::new(comm);
        let mut exec = RankExecutor::new(shared.clone(), world).unwrap();
        exec.init_parameters(3).unwrap();
        let b = exec.box_of(&shared.inputs[0].layout).unwrap();
        exec.set_input(0, &input.extract_box(&b).unwrap()).unwrap();
        exec.run().unwrap();
        exec.memory().report()
    });
    // The executor's in-place sum meters what the prediction's move frees and holds.
    for (rank, m) in measured.into_iter().enumerate() {
        assert_eq!(m.unwrap(), predicted[rank], "rank {rank}");
    }
    // And the pass is one device's.
    crate::sharded::assert_matches_one_device(&graph, loss, &config, &[input], 1e-12);
}
