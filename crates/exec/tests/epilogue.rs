//! A product whose output dies at the bias add right after it runs the bias add as its epilogue
//! (`exec::bias_epilogues`), with the bits of the two ops run apart: the one-device
//! `graph::Executor`, which never fuses, computes the same loss to the bit.

use std::sync::Arc;

use comm::{Communicator, LocalCluster};
use exec::RankExecutor;
use graph::{Executor, GraphBuilder};
use parallel::memory::{lifetimes, moved_buffers};
use parallel::ParallelConfig;
use tensor::{DType, Tensor};

use crate::sharded::{compile, values};

#[test]
fn a_product_s_bias_add_runs_as_its_epilogue_with_the_two_ops_bits() {
    // y = x·wᵀ over 512 rows (a shape the engine's own tiles take where they route), 88
    // columns (whole panels, then a short one), then h = y + bias, read by nothing else; the
    // loss Σ h² depends on every element and on which column each bias lands in.
    let (batch, tokens, k, n) = (4, 128, 256, 88);
    let mut b = GraphBuilder::with_float_dtype(DType::F32);
    let x = b.input("x", &[batch, tokens, k], DType::F32).unwrap();
    let w = b.input("w", &[n, k], DType::F32).unwrap();
    let bias = b.input("bias", &[n], DType::F32).unwrap();
    let y = b.batch_matmul("product", x, w, false, true).unwrap();
    let h = b.bias_add("bias_add", y, bias).unwrap();
    let sq = b.mul("square", h, h).unwrap();
    let loss = b.reduce_sum("loss", sq, &[], false).unwrap();
    let graph = b.finish();
    let program = compile(&graph, loss, &ParallelConfig::stand_alone());

    let step = |name: &str| {
        program
            .steps
            .iter()
            .position(|s| matches!(s, parallel::Step::Kernel(k) if k.name == name))
            .unwrap_or_else(|| panic!("no step {name}"))
    };
    let fused = exec::bias_epilogues(&program, &moved_buffers(&program, &lifetimes(&program)));
    assert_eq!(fused[step("product")], Some(step("bias_add")));
    assert_eq!(fused.iter().flatten().count(), 1, "{fused:?}");

    let inputs: Vec<Tensor> = [vec![batch, tokens, k], vec![n, k], vec![n]]
        .iter()
        .enumerate()
        .map(|(i, shape)| values(shape, i + 1).to_dtype(DType::F32))
        .collect();
    let program = Arc::new(program);
    let ran = LocalCluster::new(1).unwrap().run(|comm| {
        let world: Arc<dyn Communicator> = Arc::new(comm);
        let mut exec = RankExecutor::new(program.clone(), world).unwrap();
        for (i, input) in inputs.iter().enumerate() {
            exec.set_input(i, input).unwrap();
        }
        exec.run().unwrap();
        exec.output(0).clone()
    });
    let fused_loss = ran.into_iter().next().unwrap().unwrap();

    let mut apart = Executor::with_outputs(&graph, &[loss]).unwrap();
    for (v, input) in [x, w, bias].into_iter().zip(&inputs) {
        apart.set_input(v, input).unwrap();
    }
    apart.run().unwrap();
    let want = apart.value(loss).unwrap();
    let bits = |t: &Tensor| t.as_slice::<f32>().unwrap()[0].to_bits();
    assert_eq!(bits(&fused_loss), bits(want), "{fused_loss:?} vs {want:?}");
}
