//! The composite cross entropy with its logits split on the class dim (vocabulary-parallel
//! head) and on rows computes on a local cluster what one device computes, and moves only
//! `[n, 1]`-sized tensors across ranks: nothing gathers the logits.

use graph::{vocab_parallel_cross_entropy_strategies, Graph, GraphBuilder, Initializer, ValueId};
use parallel::{DatasetStrategy, ParallelConfig, ParallelMode, Program, Step};
use tensor::{DType, Tensor};

use crate::sharded::{assert_matches_one_device, compile, values};

const DEVICES: usize = 4;
const N: usize = 8;
const K: usize = 3;
const C: usize = 12;

/// `x [N, K] · w [K, C]` (the head, split `dp × mp` on its output), then the composite loss.
fn head() -> (Graph, ValueId) {
    let mut b = GraphBuilder::with_float_dtype(DType::F64);
    let x = b.input("x", &[N, K], DType::F64).unwrap();
    let labels = b.input("labels", &[N], DType::I32).unwrap();
    let w = b.parameter("w", &[K, C], Initializer::normal(1.0)).unwrap();
    let logits = b.matmul("head", x, w).unwrap();
    let loss = b
        .vocab_parallel_cross_entropy("xent", logits, labels, N)
        .unwrap();
    (b.finish(), loss)
}

fn config(dp: usize, mp: usize) -> ParallelConfig {
    let mut config = ParallelConfig {
        dataset_strategy: DatasetStrategy::FullBatch,
        ..ParallelConfig::new(ParallelMode::SemiAuto, DEVICES).shard("head", &[&[dp, 1], &[1, mp]])
    };
    for (name, strategy) in vocab_parallel_cross_entropy_strategies("xent", dp, mp) {
        let strategy: Vec<&[usize]> = strategy.iter().map(Vec::as_slice).collect();
        config = config.shard(&name, &strategy);
    }
    config
}

fn inputs() -> [Tensor; 2] {
    let labels = (0..N).map(|i| ((i * 5 + 3) % C) as i32).collect();
    [values(&[N, K], 4), Tensor::from_vec(&[N], labels).unwrap()]
}

/// Bytes the reshards of `program` move for values of `shape`.
fn bytes_moved_for(program: &Program, shape: &[usize]) -> usize {
    program
        .steps
        .iter()
        .filter_map(|s| match s {
            Step::Reshard(r) if program.placed.graph.values()[r.value.0].shape == shape => {
                Some(r.plan.bytes_total())
            }
            _ => None,
        })
        .sum()
}

#[test]
fn class_and_row_split_logits_match_one_device() {
    let (graph, loss) = head();
    for (dp, mp) in [(1, 4), (4, 1), (2, 2), (1, 2)] {
        assert_matches_one_device(&graph, loss, &config(dp, mp), &inputs(), 1e-12);
    }
}

#[test]
fn nothing_moves_a_logits_sized_tensor() {
    let (graph, loss) = head();
    let program = compile(&graph, loss, &config(1, 4));
    let explain = program.explain();
    assert_eq!(bytes_moved_for(&program, &[N, C]), 0, "{explain}");
    // The row maximum and the two row sums are all-reduced over the 4 class shards.
    assert!(
        explain.contains("-> reshard xent.max: all-reduce (max) over groups of 4"),
        "{explain}"
    );
    assert!(
        explain.contains("-> reshard xent.sum_exp: all-reduce over groups of 4"),
        "{explain}"
    );
    assert!(
        explain.contains("xent.max (ReduceMax)") && explain.contains("pending max over d1"),
        "{explain}"
    );
    let rank0 = program.for_rank(0).to_string();
    assert!(rank0.contains("all-reduce (max)"), "{rank0}");
    // Every forward reshard with communication moves an [N, 1] tensor or a scalar.
    for step in &program.steps {
        if let Step::Reshard(r) = step {
            let value = &program.placed.graph.values()[r.value.0];
            if r.plan.bytes_total() > 0 && !value.name.starts_with("w") {
                assert!(
                    value.shape.iter().product::<usize>() <= N,
                    "{} {:?} moves {} bytes: {explain}",
                    value.name,
                    value.shape,
                    r.plan.bytes_total()
                );
            }
        }
    }
}
