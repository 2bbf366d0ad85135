//! An activation's gradient or a residual's gradient sum followed by the bias gradient over its
//! output runs as one pass (`exec::bias_grad_fusions`), with the bits of the ops run apart: the
//! one-device `graph::Executor`, which never fuses, computes the same gradients to the bit, and
//! in deterministic mode two data-parallel ranks (each summing half the rows) give one rank's.

use std::sync::Arc;

use comm::{Communicator, LocalCluster};
use exec::RankExecutor;
use graph::{Executor, Graph, GraphBuilder, Initializer, ValueId};
use parallel::memory::{lifetimes, moved_buffers};
use parallel::{ParallelConfig, ParallelMode, Program, Step};
use tensor::{DType, Tensor};

use crate::sharded::{compile, values};

/// `Dense` (`[out, in]` weight and a bias) over `x [.., in]`.
fn dense(b: &mut GraphBuilder, name: &str, x: ValueId, (inp, out): (usize, usize)) -> ValueId {
    let init = Initializer::Constant(0.0);
    let w = b
        .parameter(&format!("{name}.w"), &[out, inp], init.clone())
        .unwrap();
    let bias = b.parameter(&format!("{name}.b"), &[out], init).unwrap();
    let y = b
        .batch_matmul(&format!("{name}.matmul"), x, w, false, true)
        .unwrap();
    b.bias_add(&format!("{name}.bias_add"), y, bias).unwrap()
}

/// A residual attention block, `a = x + proj(attention(qkv(x)))` (the packed attention over
/// two heads), two residual MLP blocks, `u = a + fc2(gelu(fc1(a)))`, `v = u + fc4(gelu(fc3(u)))`,
/// and the loss `Σ v²`: the backward sums `u`'s two gradients right before `fc2`'s bias
/// gradient, and reshapes the attention's gradient before `qkv`'s.
fn two_blocks() -> (Graph, ValueId) {
    let (batch, tokens, width, hidden, heads) = (4, 32, 24, 40, 2);
    let mut b = GraphBuilder::with_float_dtype(DType::F32);
    let x = b.input("x", &[batch, tokens, width], DType::F32).unwrap();
    let qkv = dense(&mut b, "qkv", x, (width, 3 * width));
    let shape = [batch, tokens, heads, 3 * width / heads];
    let qkv = b.reshape("split_heads", qkv, &shape).unwrap();
    let context = b.packed_attention("attention", qkv, true, 0.3).unwrap().0;
    let context = b
        .reshape("merge_heads", context, &[batch, tokens, width])
        .unwrap();
    let projected = dense(&mut b, "proj", context, (width, width));
    let mut h = b.add("residual", x, projected).unwrap();
    for blk in 0..2 {
        let up = dense(&mut b, &format!("fc{}", 2 * blk + 1), h, (width, hidden));
        let act = b.gelu(&format!("gelu{blk}"), up, true).unwrap();
        let down = dense(&mut b, &format!("fc{}", 2 * blk + 2), act, (hidden, width));
        h = b.add(&format!("residual{blk}"), h, down).unwrap();
    }
    let sq = b.mul("square", h, h).unwrap();
    let loss = b.reduce_sum("loss", sq, &[], false).unwrap();
    (b.finish(), loss)
}

/// Every parameter's values, by name (the same for every executor).
fn param_values(graph: &Graph) -> Vec<(String, Tensor)> {
    graph
        .trainable_parameters()
        .iter()
        .enumerate()
        .map(|(i, &p)| {
            let v = graph.value(p).unwrap();
            (
                v.name.clone(),
                values(&v.shape, 10 + i).to_dtype(DType::F32),
            )
        })
        .collect()
}

/// One pass of `program` on its ranks: every parameter's global gradient, as f32 bits.
fn gradients(
    program: Program,
    x: &Tensor,
    params: &[(String, Tensor)],
    det: bool,
) -> Vec<Vec<u32>> {
    let program = Arc::new(program);
    let ran = LocalCluster::new(program.devices()).unwrap().run(|comm| {
        let world: Arc<dyn Communicator> = Arc::new(comm);
        let mut exec = RankExecutor::new(program.clone(), world).unwrap();
        exec.set_deterministic(det.then_some(16));
        for (i, p) in program.params.iter().enumerate() {
            let (_, global) = params.iter().find(|(n, _)| *n == p.name).unwrap();
            let b = exec.box_of(&p.layout).unwrap();
            exec.set_param(i, global.extract_box(&b).unwrap()).unwrap();
        }
        let b = exec.box_of(&program.inputs[0].layout).unwrap();
        exec.set_input(0, &x.extract_box(&b).unwrap()).unwrap();
        exec.run().unwrap();
        (0..program.params.len())
            .map(|i| exec.grad(i).unwrap().clone())
            .collect::<Vec<_>>()
    });
    let grads = ran.into_iter().next().unwrap().unwrap();
    grads
        .iter()
        .map(|g| g.as_f32().unwrap().iter().map(|v| v.to_bits()).collect())
        .collect()
}

#[test]
fn a_bias_gradient_is_summed_by_the_op_before_it_with_the_ops_bits() {
    let (graph, loss) = two_blocks();
    let program = compile(&graph, loss, &ParallelConfig::stand_alone());
    let fusions = exec::bias_grad_fusions(&program, &moved_buffers(&program, &lifetimes(&program)));
    let kind = |i: usize| match &program.steps[i] {
        Step::Kernel(k) => k.op.kind(),
        Step::Reshard(_) => "reshard",
    };
    let fused: Vec<(&str, &str)> = fusions
        .iter()
        .enumerate()
        .filter_map(|(i, j)| j.map(|j| (kind(i), kind(j))))
        .collect();
    // Both activations' gradients, and the residual's gradient sum before `fc2`'s bias.
    assert_eq!(
        fused
            .iter()
            .filter(|f| **f == ("GeluGrad", "BiasAddGrad"))
            .count(),
        2,
        "{fused:?}"
    );
    assert!(fused.contains(&("Add", "BiasAddGrad")), "{fused:?}");
    assert!(
        fused.contains(&("PackedAttentionGrad", "BiasAddGrad")),
        "{fused:?}"
    );

    let x = values(&[4, 32, 24], 3).to_dtype(DType::F32);
    let params = param_values(&graph);
    let got = gradients(program, &x, &params, false);

    // The one-device executor runs every op apart.
    let names: Vec<String> = params.iter().map(|(n, _)| n.clone()).collect();
    let trainable = graph.trainable_parameters();
    let training = graph::grad(&graph, loss, &trainable).unwrap();
    let grad_values: Vec<ValueId> = graph
        .trainable_parameters()
        .iter()
        .map(|&p| training.grad_of(p).unwrap())
        .collect();
    let mut apart = Executor::with_outputs(&training.graph, &grad_values).unwrap();
    for (&p, (_, v)) in trainable.iter().zip(&params) {
        *apart.value_mut(p).unwrap() = v.clone();
    }
    apart.set_input(graph.inputs()[0], &x).unwrap();
    apart.run().unwrap();
    let order = compile(&graph, loss, &ParallelConfig::stand_alone());
    for (i, p) in order.params.iter().enumerate() {
        let at = names.iter().position(|n| *n == p.name).unwrap();
        let want: Vec<u32> = apart
            .value(grad_values[at])
            .unwrap()
            .as_f32()
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect();
        assert_eq!(got[i], want, "the gradient of {}", p.name);
    }

    // Deterministic mode: two data-parallel ranks sum half the rows each, in whole canonical
    // blocks of the global rows, and give one rank's bits.
    let one = gradients(
        compile(&graph, loss, &ParallelConfig::stand_alone()),
        &x,
        &params,
        true,
    );
    let two = gradients(
        compile(
            &graph,
            loss,
            &ParallelConfig::new(ParallelMode::DataParallel, 2),
        ),
        &x,
        &params,
        true,
    );
    assert_eq!(one, two);
}
