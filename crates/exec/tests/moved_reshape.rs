//! A reshape whose input dies there takes the input's tensor over (no copy, no second buffer):
//! the measured peak drops by the reshaped bytes and equals the prediction, and the pass is
//! one device's.

use std::sync::Arc;

use comm::{Communicator, LocalCluster};
use exec::RankExecutor;
use graph::{GraphBuilder, Initializer};
use parallel::memory::{lifetimes, moved_buffers, predict, TrainingState};
use parallel::ParallelConfig;
use tensor::DType;

use crate::sharded::{compile, run, values};

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
    let reshape = program
        .steps
        .iter()
        .position(|s| matches!(s, parallel::Step::Kernel(k) if k.name == "op"))
        .expect("the reshape's step");
    assert!(moved[reshape].is_some(), "the reshape moves: {moved:?}");
    let state = TrainingState {
        optimizer_tensors: 0,
        accumulation_sharded: None,
        master_weights: false,
    };
    let predicted = predict(&program, 0, state);
    let program = Arc::new(program);
    let input = values(&[rows, cols], 1);
    let measured = LocalCluster::new(1).unwrap().run(|comm| {
        let world: Arc<dyn Communicator> = Arc::new(comm);
        let mut exec = RankExecutor::new(program.clone(), world).unwrap();
        exec.init_parameters(3).unwrap();
        exec.set_input(0, &input).unwrap();
        exec.run().unwrap();
        exec.memory().report()
    });
    let measured = measured.into_iter().next().unwrap().unwrap();
    assert_eq!(measured, predicted);
    // Activations at their peak: the fed x and one [rows, cols] value (x·w, become its
    // reshape) and scalars — not x·w and its copy beside it.
    let value = rows * cols * 8;
    let activations = measured.peaks.activations;
    assert!(
        (2 * value..3 * value).contains(&activations),
        "{activations} B of activations: {measured:?}"
    );
    // And the pass is one device's: the loss is Σ x·w, w's gradient x.
    let pass = run((*program).clone(), std::slice::from_ref(&input), 3);
    assert_eq!(pass.grads[0], input.to_f64_vec());
}
