//! The searches in deterministic mode (`search_deterministic`): whatever the devices, the
//! canonical blocks and the model's sizes, the plan they choose compiles to a program that
//! `parallel::check_deterministic` accepts (the unfiltered searches choose splits it refuses on
//! some of the same cases), and a block count that is not a power of two is refused naming
//! `parallel.deterministic_blocks`.

use std::collections::BTreeMap;

use graph::models::seed_mlp;
use graph::{Graph, GraphBuilder, Initializer, ValueId};
use parallel::{
    check_deterministic, compile_forward, compile_training, OpStrategy, ParallelConfig,
    ParallelMode,
};
use search::{profiles, search, search_deterministic, SearchError, SearchMode, SearchRequest};
use tensor::DType;

const MODES: [SearchMode; 3] = [
    SearchMode::ShardingPropagation,
    SearchMode::RecursiveProgramming,
    SearchMode::DynamicProgramming,
];

/// A residual block `x → matmul a → relu → matmul b → add(x, ·) → layer norm → matmul head →
/// loss`, with biases: sums over the batch (bias and weight gradients), the hidden width
/// (matmuls) and a normalised dim.
fn residual(batch: usize, width: usize, classes: usize) -> (Graph, ValueId) {
    let mut b = GraphBuilder::new();
    let x = b.input("x", &[batch, width], DType::F32).unwrap();
    let labels = b.input("labels", &[batch], DType::I32).unwrap();
    let param = |b: &mut GraphBuilder, name: &str, shape: &[usize]| {
        b.parameter(name, shape, Initializer::Zeros).unwrap()
    };
    let wa = param(&mut b, "wa", &[width, width]);
    let ba = param(&mut b, "ba", &[width]);
    let wb = param(&mut b, "wb", &[width, width]);
    let gamma = param(&mut b, "gamma", &[width]);
    let beta = param(&mut b, "beta", &[width]);
    let wh = param(&mut b, "wh", &[width, classes]);
    let h = b.matmul("a", x, wa).unwrap();
    let h = b.bias_add("a_bias", h, ba).unwrap();
    let h = b.relu("relu", h).unwrap();
    let h = b.matmul("b", h, wb).unwrap();
    let h = b.add("residual", x, h).unwrap();
    let h = b.layer_norm("norm", h, gamma, beta, 1e-5).unwrap();
    let logits = b.matmul("head", h, wh).unwrap();
    let loss = b
        .sparse_softmax_cross_entropy("loss", logits, labels)
        .unwrap();
    b.output(loss).unwrap();
    (b.finish(), loss)
}

/// The training and evaluation programs of `strategies` on `devices` devices in deterministic
/// mode, checked against `blocks` canonical blocks; the first refusal, as text.
fn refusal(
    graph: &Graph,
    loss: ValueId,
    strategies: &[(String, Vec<Vec<usize>>)],
    devices: usize,
    blocks: usize,
) -> Option<String> {
    let mut config = ParallelConfig::stand_alone();
    config.mode = ParallelMode::SemiAuto;
    config.devices = devices;
    config.deterministic = true;
    config.deterministic_blocks = blocks;
    config.strategies = strategies
        .iter()
        .map(|(name, s)| (name.clone(), OpStrategy::from_tuples(s.clone(), None)))
        .collect();
    let train = compile_training(graph, loss, &config).expect("the searched plan compiles");
    let eval = compile_forward(graph, &[loss], &config).expect("the searched plan compiles");
    check_deterministic(&train, blocks)
        .and_then(|()| check_deterministic(&eval, blocks))
        .err()
        .map(|e| e.to_string())
}

fn request(mode: SearchMode, profile: &search::DeviceProfile, devices: usize) -> SearchRequest<'_> {
    SearchRequest {
        mode,
        profile,
        devices,
        memory_budget: None,
        optimizer_states: 2,
        fixed: BTreeMap::new(),
        hints: BTreeMap::new(),
        time_budget: None,
        only: None,
    }
}

/// A small deterministic generator (a 64-bit LCG), so the cases are the same on every run.
struct Lcg(u64);

impl Lcg {
    fn pick<T: Copy>(&mut self, from: &[T]) -> T {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        from[((self.0 >> 33) as usize) % from.len()]
    }
}

/// Over a seeded handful of (devices, blocks, model sizes), every search mode's deterministic
/// plan passes `check_deterministic`; the unfiltered searches break it on some of the cases
/// (so the property is not vacuous).
#[test]
fn deterministic_searches_keep_to_the_canonical_blocks() {
    let profile = profiles::built_in("h100-nvlink-ib").unwrap();
    let mut rng = Lcg(0x5eed);
    let mut unfiltered_refused = 0;
    let mut cases = 0;
    for case in 0..12 {
        let devices = rng.pick(&[2, 4, 8]);
        let blocks = rng.pick(&[1, 2, 4, 8]);
        let batch = rng.pick(&[8, 16, 32]);
        let (graph, loss, what) = if case % 2 == 0 {
            let hidden = rng.pick(&[8, 16, 24, 32]);
            let classes = rng.pick(&[4, 8]);
            let model = seed_mlp(batch, &[4, 4], hidden, classes).unwrap();
            let what = format!("seed mlp batch {batch} hidden {hidden} classes {classes}");
            (model.graph, model.loss, what)
        } else {
            let width = rng.pick(&[8, 16, 32]);
            let (graph, loss) = residual(batch, width, 4);
            (graph, loss, format!("residual batch {batch} width {width}"))
        };
        for mode in MODES {
            let what = format!("{what} on {devices} devices, blocks {blocks}, {mode:?}");
            let req = request(mode, &profile, devices);
            let found = search_deterministic(&graph, &req, blocks)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            if let Some(refused) = refusal(&graph, loss, &found.strategies, devices, blocks) {
                panic!("{what}: the deterministic search's plan is refused: {refused}");
            }
            let plain = search(&graph, &req).unwrap_or_else(|e| panic!("{what}: {e}"));
            if refusal(&graph, loss, &plain.strategies, devices, blocks).is_some() {
                unfiltered_refused += 1;
            }
            cases += 1;
        }
    }
    assert!(
        unfiltered_refused > 0,
        "the unfiltered searches kept to the blocks in all {cases} cases: the cases test nothing"
    );
}

/// A block count that is not a power of two is refused before anything is searched, naming
/// `parallel.deterministic_blocks`.
#[test]
fn a_block_count_not_a_power_of_two_names_the_setting() {
    let profile = profiles::built_in("h100-nvlink-ib").unwrap();
    let model = seed_mlp(8, &[4, 4], 8, 4).unwrap();
    for blocks in [0, 3, 12] {
        let req = request(SearchMode::DynamicProgramming, &profile, 4);
        match search_deterministic(&model.graph, &req, blocks) {
            Err(SearchError::Config { key, reason }) => {
                assert_eq!(key, "parallel.deterministic_blocks");
                assert!(reason.contains(&blocks.to_string()), "{reason}");
            }
            other => panic!("blocks {blocks}: {other:?}"),
        }
    }
}

/// The rule the searches filter with checks an op's backward too: data parallel 4 on a matmul
/// of a batch of 8 sums no split dim forward, but its weight's gradient sums the batch split 4
/// ways, which 2 canonical blocks cannot serve (4 blocks can); the unsplit strategy always
/// keeps to the blocks.
#[test]
fn the_rule_checks_the_backward_of_a_strategy() {
    let model = seed_mlp(8, &[4, 4], 8, 4).unwrap();
    let training = graph::grad(
        &model.graph,
        model.loss,
        &model.graph.trainable_parameters(),
    )
    .unwrap()
    .graph;
    let matmul = training
        .node_by_name("matmul1")
        .expect("the seed MLP's first matmul");
    let dp4 = vec![vec![4, 1], vec![1, 1]];
    let check = |strategy: &[Vec<usize>], blocks| {
        parallel::check_deterministic_strategy(&training, matmul, strategy, 4, blocks)
    };
    let err = check(&dp4, 2).unwrap_err().to_string();
    assert!(
        err.contains("splits 4 ways") && err.contains("= 2"),
        "{err}"
    );
    // Forward alone, the strategy sums nothing split.
    assert!(parallel::check_deterministic_strategy(&model.graph, matmul, &dp4, 4, 2).is_ok());
    assert!(check(&dp4, 4).is_ok());
    assert!(check(&[vec![1, 1], vec![1, 1]], 1).is_ok());
    let bad_blocks = check(&dp4, 3).unwrap_err().to_string();
    assert!(bad_blocks.contains("deterministic_blocks"), "{bad_blocks}");
}
