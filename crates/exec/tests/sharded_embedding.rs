//! Vocabulary-parallel (and column-split) embeddings compute on a local cluster what one device
//! computes: the lookup and the table's gradient.

use graph::{GraphBuilder, Initializer};
use parallel::{DatasetStrategy, ParallelConfig, ParallelMode};
use proptest::prelude::*;
use tensor::{DType, Tensor};

use crate::sharded::{assert_matches_one_device, compile, values};

const DEVICES: usize = 8;

/// `Σ embedding(table, ids)·t` with the embedding's strategy `[[vocab, cols], [batch]]`.
fn graph_and_config(
    vocab: usize,
    dim: usize,
    n: usize,
    split: [usize; 3],
) -> (graph::Graph, graph::ValueId, ParallelConfig) {
    let mut b = GraphBuilder::with_float_dtype(DType::F64);
    let ids = b.input("ids", &[n], DType::I32).unwrap();
    let t = b.input("t", &[n, dim], DType::F64).unwrap();
    let table = b
        .parameter("table", &[vocab, dim], Initializer::normal(0.5))
        .unwrap();
    let e = b.embedding("embed", table, ids).unwrap();
    let z = b.mul("mul", e, t).unwrap();
    let loss = b.reduce_sum("loss", z, &[], false).unwrap();
    let [v, c, d] = split;
    let config = ParallelConfig {
        dataset_strategy: DatasetStrategy::FullBatch,
        ..ParallelConfig::new(ParallelMode::SemiAuto, DEVICES).shard("embed", &[&[v, c], &[d]])
    };
    (b.finish(), loss, config)
}

fn check(vocab: usize, dim: usize, ids: &[i32], split: [usize; 3]) {
    let n = ids.len();
    let (graph, loss, config) = graph_and_config(vocab, dim, n, split);
    let inputs = [
        Tensor::from_vec(&[n], ids.to_vec()).unwrap(),
        values(&[n, dim], 3),
    ];
    assert_matches_one_device(&graph, loss, &config, &inputs, 1e-12);
}

fn arb_case() -> impl Strategy<Value = (usize, usize, Vec<i32>, [usize; 3])> {
    let pow2 = || prop_oneof![Just(1usize), Just(2), Just(4)];
    (pow2(), pow2(), pow2(), 1usize..=3, 1usize..=3, 1usize..=2)
        .prop_filter("the splits fit the devices", |(v, c, d, ..)| {
            DEVICES.is_multiple_of(v * c * d)
        })
        .prop_flat_map(|(v, c, d, rows, cols, per)| {
            let (vocab, dim, n) = (v * rows, c * cols, d * per * 2);
            (
                Just(vocab),
                Just(dim),
                proptest::collection::vec(0..vocab as i32, n),
                Just([v, c, d]),
            )
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn vocabulary_parallel_embeddings_match_one_device(
        (vocab, dim, ids, split) in arb_case()
    ) {
        check(vocab, dim, &ids, split);
    }
}

#[test]
fn mindspore_style_vocab_and_data_parallel_embedding() {
    // [[mp, 1], [dp, 1]]-style: the table split 4 ways on rows, the ids 2 ways.
    check(8, 3, &[7, 0, 3, 3, 5, 1, 6, 2], [4, 1, 2]);
    let (graph, loss, config) = graph_and_config(8, 3, 8, [4, 1, 2]);
    let program = compile(&graph, loss, &config);
    let explain = program.explain();
    // The lookup is summed over the 4 row blocks where `mul` consumes it; the table's gradient
    // stays in the table's layout, summed over the 2 id blocks.
    assert!(
        explain.contains("-> reshard embed: all-reduce over groups of 4")
            || explain.contains("-> reshard embed: reduce-scatter"),
        "{explain}"
    );
    let table = program.params.iter().find(|p| p.name == "table").unwrap();
    assert_eq!(table.layout.slice_shape(), &[2, 3]);
}

#[test]
fn two_dimensional_ids_with_a_mindspore_strategy() {
    // Token ids [batch, seq] under [[mp, 1], [dp, 1]]: mp = 4 row blocks, dp = 2 batch blocks.
    let (vocab, dim, batch, seq) = (12, 3, 4, 3);
    let mut b = GraphBuilder::with_float_dtype(DType::F64);
    let ids = b.input("ids", &[batch, seq], DType::I64).unwrap();
    let t = b.input("t", &[batch, seq, dim], DType::F64).unwrap();
    let table = b
        .parameter("table", &[vocab, dim], Initializer::normal(0.5))
        .unwrap();
    let e = b.embedding("embed", table, ids).unwrap();
    let z = b.mul("mul", e, t).unwrap();
    let loss = b.reduce_sum("loss", z, &[], false).unwrap();
    let config = ParallelConfig {
        dataset_strategy: DatasetStrategy::FullBatch,
        ..ParallelConfig::new(ParallelMode::SemiAuto, DEVICES).shard("embed", &[&[4, 1], &[2, 1]])
    };
    let n = batch * seq;
    let ids_values = (0..n as i64).map(|i| (i * 7 + 2) % vocab as i64).collect();
    let inputs = [
        Tensor::from_vec(&[batch, seq], ids_values).unwrap(),
        values(&[batch, seq, dim], 5),
    ];
    assert_matches_one_device(&b.finish(), loss, &config, &inputs, 1e-12);
}
