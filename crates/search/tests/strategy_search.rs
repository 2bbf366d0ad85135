//! The strategy searches: dynamic programming is the exact optimum (checked against brute force
//! on small graphs), no search beats it, propagation keeps the user's strategies, and every
//! search keeps the memory per device under the budget or names the memory that would fit.

use std::collections::BTreeMap;

use graph::models::seed_mlp;
use graph::{Graph, GraphBuilder, Initializer};
use proptest::prelude::*;
use search::SearchError;
use search::{
    brute_force, profiles, search, DeviceProfile, EvalSettings, SearchMode, SearchProblem,
    SearchRequest,
};
use tensor::DType;

fn h100() -> DeviceProfile {
    profiles::built_in("h100-nvlink-ib").expect("a built-in profile")
}

/// A profile whose network is as fast as its compute is slow, so that splitting weights pays.
fn slow_compute() -> DeviceProfile {
    let mut p = h100();
    for m in &mut p.matmul {
        m.flops_per_s = 1e6;
    }
    p.memory_bandwidth = 1e6;
    p
}

/// A residual block: `x → matmul a → relu → matmul b → add(x, ·) → matmul head → loss`, whose
/// graph is a diamond (the residual), not a chain.
fn residual(batch: usize, width: usize) -> Graph {
    let mut b = GraphBuilder::new();
    let x = b.input("x", &[batch, width], DType::F32).unwrap();
    let labels = b.input("labels", &[batch], DType::I32).unwrap();
    let wa = b
        .parameter("wa", &[width, width], Initializer::Zeros)
        .unwrap();
    let wb = b
        .parameter("wb", &[width, width], Initializer::Zeros)
        .unwrap();
    let wh = b.parameter("wh", &[width, 4], Initializer::Zeros).unwrap();
    let h = b.matmul("a", x, wa).unwrap();
    let h = b.relu("relu", h).unwrap();
    let h = b.matmul("b", h, wb).unwrap();
    let h = b.add("residual", x, h).unwrap();
    let logits = b.matmul("head", h, wh).unwrap();
    let loss = b
        .sparse_softmax_cross_entropy("loss", logits, labels)
        .unwrap();
    b.output(loss).unwrap();
    b.finish()
}

fn request(
    mode: SearchMode,
    profile: &DeviceProfile,
    devices: usize,
    memory: Option<u64>,
) -> SearchRequest<'_> {
    SearchRequest {
        mode,
        profile,
        devices,
        memory_budget: memory,
        optimizer_states: 2,
        fixed: BTreeMap::new(),
        hints: BTreeMap::new(),
        time_budget: None,
        only: None,
    }
}

/// The problem [`search`] solves: the same settings, the values the backward holds (and the
/// gradients it computes) included.
fn problem(graph: &Graph, profile: &DeviceProfile, devices: usize) -> SearchProblem {
    let held = search::HeldValues::of(graph);
    let settings = EvalSettings {
        profile,
        devices,
        optimizer_states: 2,
        held: Some(&held),
    };
    SearchProblem::build(graph, &settings, &BTreeMap::new(), &BTreeMap::new()).unwrap()
}

/// Small graphs (≤ 10 ops, ≤ 8 devices) whose every combination brute force can try.
fn small_cases() -> Vec<(&'static str, Graph, usize)> {
    vec![
        ("mlp on 2", seed_mlp(8, &[4, 4], 8, 4).unwrap().graph, 2),
        ("mlp on 4", seed_mlp(8, &[4, 4], 8, 4).unwrap().graph, 4),
        ("residual on 2", residual(8, 8), 2),
        ("residual on 4", residual(8, 8), 4),
        ("residual on 8", residual(8, 8), 8),
    ]
}

#[test]
fn dynamic_programming_equals_brute_force_and_no_search_beats_it() {
    for profile in [h100(), slow_compute()] {
        for (name, graph, devices) in small_cases() {
            let p = problem(&graph, &profile, devices);
            assert!(p.nodes.len() <= 10, "{name}: a small graph");
            let (_, best) = brute_force(&p, f64::INFINITY).expect("few combinations");
            let dp = search(
                &graph,
                &request(SearchMode::DynamicProgramming, &profile, devices, None),
            )
            .unwrap();
            let found = dp.cost.time();
            assert!(
                (found - best).abs() <= 1e-9 * best.max(1e-30),
                "{name} ({}): dynamic programming {found} vs brute force {best}",
                profile.name
            );
            assert_eq!(dp.gap, None, "{name}: proven optimal");
            for mode in SearchMode::ALL {
                let t = search(&graph, &request(mode, &profile, devices, None))
                    .unwrap()
                    .cost
                    .time();
                assert!(
                    t >= best * (1.0 - 1e-9),
                    "{name}: {} found {t}, below the optimum {best}",
                    mode.name()
                );
            }
        }
    }
}

#[test]
fn propagation_keeps_every_user_strategy() {
    let graph = seed_mlp(8, &[4, 4], 8, 4).unwrap().graph;
    let profile = h100();
    let fixed: BTreeMap<String, Vec<Vec<usize>>> = [
        ("matmul1".to_string(), vec![vec![1, 2], vec![2, 2]]),
        ("relu2".to_string(), vec![vec![4, 1]]),
    ]
    .into_iter()
    .collect();
    for mode in SearchMode::ALL {
        let mut r = request(mode, &profile, 4, None);
        r.fixed = fixed.clone();
        let found: BTreeMap<String, Vec<Vec<usize>>> =
            search(&graph, &r).unwrap().strategies.into_iter().collect();
        for (op, s) in &fixed {
            assert_eq!(&found[op], s, "{}: {op} keeps its strategy", mode.name());
        }
    }
}

#[test]
fn a_budget_below_the_smallest_plan_names_the_memory_needed() {
    let graph = seed_mlp(8, &[4, 4], 8, 4).unwrap().graph;
    let profile = h100();
    for mode in SearchMode::ALL {
        let err = search(&graph, &request(mode, &profile, 4, Some(10))).unwrap_err();
        match &err {
            SearchError::MemoryExceeded {
                needed, available, ..
            } => {
                assert_eq!(*available, 10);
                // The memory named fits: a search with that budget succeeds within it.
                let r = search(&graph, &request(mode, &profile, 4, Some(*needed))).unwrap();
                assert!(r.cost.memory.total() <= *needed as f64);
            }
            other => panic!("{}: {other}", mode.name()),
        }
        assert!(err.to_string().contains("max_device_memory"));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    /// Whatever the budget between the smallest and the largest plan, every search's plan fits
    /// it, and dynamic programming's is never slower than another that fits.
    #[test]
    fn plans_never_exceed_the_memory_budget(fraction in 0.0f64..1.0, devices_log in 1u32..4) {
        let devices = 1usize << devices_log;
        let graph = residual(8, 16);
        let profile = slow_compute();
        let p = problem(&graph, &profile, devices);
        let mem = |pick: &dyn Fn(f64, f64) -> f64, init: f64| -> f64 {
            (0..p.nodes.len())
                .map(|n| (0..p.n_candidates(n)).map(|c| p.node_memory(n, c)).fold(init, pick))
                .sum()
        };
        let least = mem(&f64::min, f64::INFINITY);
        let most = mem(&f64::max, 0.0);
        let budget = (least + fraction * (most - least)).ceil() as u64;
        for mode in SearchMode::ALL {
            let r = search(&graph, &request(mode, &profile, devices, Some(budget))).unwrap();
            prop_assert!(r.cost.memory.total() <= budget as f64, "{}: {} > {budget}", mode.name(), r.cost.memory.total());
        }
    }
}

/// Building the problem costs the same at 64 and 8192 devices: nothing is kept per rank.
#[test]
fn the_problem_does_not_grow_with_the_devices() {
    let model = seed_mlp(8192, &[8, 8], 64, 16).unwrap();
    let profile = h100();
    let small = problem(&model.graph, &profile, 64);
    let large = problem(&model.graph, &profile, 8192);
    assert_eq!(small.nodes.len(), large.nodes.len());
    assert_eq!(small.edges.len(), large.edges.len());
    let cells = |p: &SearchProblem| p.edges.iter().map(|e| e.time.len()).sum::<usize>();
    // Candidates grow with log2(devices), never with the devices.
    assert!(
        cells(&large) <= cells(&small) * 8,
        "{} vs {}",
        cells(&large),
        cells(&small)
    );
}

/// The three search modes.
const MODES: [SearchMode; 3] = [
    SearchMode::ShardingPropagation,
    SearchMode::RecursiveProgramming,
    SearchMode::DynamicProgramming,
];

/// A profile the cost model accepts (every figure positive and finite) but whose costs
/// overflow: the smallest normal rate or bandwidth makes every op's time infinite. Before, the
/// searches ranked candidates on those infinities, chose among the ties (nothing split) and
/// `tessera plan` printed `predicted step: NaN ms = compute inf + … + bubble NaN`.
#[test]
fn costs_that_overflow_are_refused_by_every_search_naming_the_profile_and_the_op() {
    let tiny = f64::MIN_POSITIVE;
    let mut slow_matmul = h100();
    slow_matmul.name = "slow-matmul".to_string();
    slow_matmul.matmul[0].flops_per_s = tiny;
    let mut slow_memory = h100();
    slow_memory.name = "slow-memory".to_string();
    slow_memory.memory_bandwidth = tiny;
    let mut slow_link = h100();
    slow_link.name = "slow-link".to_string();
    slow_link.intra_node.bandwidth = tiny;
    let graph = residual(8, 8);
    for profile in [slow_matmul, slow_memory, slow_link] {
        profile.validate_usable().expect("positive and finite");
        assert!(profile.validate().is_err(), "outside the plausible ranges");
        for mode in MODES {
            let err = search(&graph, &request(mode, &profile, 4, None))
                .map(|r| format!("{:?}", r.cost))
                .expect_err("an infinite cost is refused");
            let text = err.to_string();
            assert!(
                matches!(err, SearchError::NonFiniteCost { .. })
                    && text.contains(&format!("profile {}", profile.name))
                    && text.contains("op ")
                    && text.contains("not a finite number"),
                "{} {mode:?}: {text}",
                profile.name
            );
        }
        let err = search::evaluate_strategies(
            &graph,
            &request(SearchMode::DynamicProgramming, &profile, 4, None),
            &BTreeMap::new(),
        )
        .map(|c| format!("{c:?}"))
        .expect_err("costing is refused too");
        assert!(
            matches!(err, SearchError::NonFiniteCost { .. }),
            "{}: {err}",
            profile.name
        );
    }
}

/// Profiles at the edges of the plausible ranges (everything as slow as allowed, everything as
/// fast, and slow compute with a fast network and the reverse): every search gives finite
/// costs and bounds, and the same plan on every run (ties broken the same way).
#[test]
fn extreme_valid_profiles_give_finite_plans_the_same_on_every_run() {
    let edge = |flops: f64, bandwidth: f64, alpha: f64| {
        let mut p = h100();
        for m in &mut p.matmul {
            m.flops_per_s = flops;
        }
        p.memory_bandwidth = bandwidth;
        for link in [&mut p.intra_node, &mut p.inter_node] {
            link.bandwidth = bandwidth;
            link.alpha = alpha;
        }
        p.validate().expect("within the plausible ranges");
        p
    };
    let (slow, fast) = (
        *search::cost::FLOPS_PER_S_RANGE.start(),
        *search::cost::FLOPS_PER_S_RANGE.end(),
    );
    let (narrow, wide) = (
        *search::cost::BANDWIDTH_RANGE.start(),
        *search::cost::BANDWIDTH_RANGE.end(),
    );
    let max_alpha = *search::cost::ALPHA_RANGE.end();
    let profiles = [
        edge(slow, narrow, max_alpha),
        edge(fast, wide, 0.0),
        edge(slow, wide, 0.0),
        edge(fast, narrow, max_alpha),
    ];
    let graph = seed_mlp(64, &[8, 8], 32, 4).unwrap().graph;
    for profile in &profiles {
        for mode in MODES {
            let what = format!("{mode:?} on {:?}", (profile.matmul[0], profile.intra_node));
            let first = search(&graph, &request(mode, profile, 8, None)).expect(&what);
            let c = &first.cost;
            for v in [c.compute, c.comm, c.comm_bytes, c.memory.total()] {
                assert!(v.is_finite(), "{what}: {c:?}");
            }
            assert!(first.lower_bound.is_finite(), "{what}");
            assert!(first.gap.is_none_or(f64::is_finite), "{what}");
            let again = search(&graph, &request(mode, profile, 8, None)).expect(&what);
            assert_eq!(first.strategies, again.strategies, "{what}");
            assert_eq!(first.cost, again.cost, "{what}");
        }
    }
}
