//! Cluster-facing training features (issue 19): group-info files, parameter broadcast and lazy
//! parameter initialisation.

use std::collections::BTreeMap;
use std::sync::Arc;

use ckpt::{group_name, GroupInfo};
use comm::Communicator;
use runtime::RankExecutor;

use crate::run_util::{adam_gpt, train_steps, DP2, DP2_MP2};

/// Trains `parallel` for 2 steps writing group-info files under `template`; returns every
/// rank's decoded file.
fn group_infos(parallel: &str, template: &str, devices: usize) -> Vec<GroupInfo> {
    let dir = tempfile::tempdir().unwrap();
    let key = format!("output.group_info_file=\"{template}\"");
    let config = adam_gpt(dir.path(), parallel, 2, &[&key]);
    train_steps(&config, 2);
    (0..devices)
        .map(|r| {
            let path = runtime::group_info_path(&config.output().dir, template, r);
            GroupInfo::read(&path).unwrap_or_else(|e| panic!("rank {r}'s file: {e}"))
        })
        .collect()
}

/// Pure data parallel: every rank can restore every other, and the gradient all-reduce group
/// of both ranks is named as MindSpore names it.
#[test]
fn group_info_under_data_parallel_lists_every_rank() {
    let infos = group_infos(DP2, "group_info.pb", 2);
    for info in &infos {
        assert_eq!(info.restore_rank_list, Some(vec![0, 1]));
        let all = info
            .groups
            .iter()
            .find(|g| g.ranks == [0, 1])
            .expect("the dp group");
        assert_eq!(all.group_name, group_name(&[0, 1]));
    }
}

/// Model parallel splits the weights: only the ranks of the same model-parallel coordinate
/// (rank, rank + 2) hold this rank's shards, and each rank created both its data-parallel and
/// its model-parallel group.
#[test]
fn group_info_under_model_parallel_lists_the_replica_ranks() {
    let infos = group_infos(DP2_MP2, "gi/{rank}.pb", 4);
    for (rank, info) in infos.iter().enumerate() {
        let mp = (rank % 2) as u32;
        assert_eq!(
            info.restore_rank_list,
            Some(vec![mp, mp + 2]),
            "rank {rank}"
        );
        let dp_group = vec![mp, mp + 2];
        let first = (rank as u32 / 2) * 2;
        let mp_group = vec![first, first + 1];
        for group in [dp_group, mp_group] {
            assert!(
                info.groups.iter().any(|g| g.ranks == group),
                "rank {rank} lacks group {group:?}: {:?}",
                info.groups
            );
        }
        for g in &info.groups {
            assert_eq!(g.group_name, group_name(&g.ranks));
        }
    }
}

/// Optimizer sharding over the whole data-parallel group leaves every rank the only holder of
/// its optimizer pieces.
#[test]
fn group_info_with_full_optimizer_sharding_lists_only_the_rank() {
    let parallel = format!("{DP2}[parallel.hsdp]\nthreshold = 0");
    let infos = group_infos(&parallel, "group_info.pb", 2);
    for (rank, info) in infos.iter().enumerate() {
        assert_eq!(info.restore_rank_list, Some(vec![rank as u32]));
    }
}

/// A file at the group-info path that is not a group-info file is never replaced: the run
/// fails naming the key and the file is untouched.
#[test]
fn group_info_never_replaces_a_foreign_file() {
    let dir = tempfile::tempdir().unwrap();
    let foreign = dir.path().join("notes_0.pb");
    std::fs::write(&foreign, b"my own notes, not protobuf").unwrap();
    let config = adam_gpt(dir.path(), DP2, 1, &["output.group_info_file=\"notes.pb\""]);
    let session = runtime::Session::new(&config).unwrap();
    let options = runtime::LaunchOptions {
        print_loss: false,
        ..runtime::LaunchOptions::default()
    };
    let err = runtime::train_local(&session, &options)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("output.group_info_file") && err.contains("notes_0.pb"),
        "{err}"
    );
    assert_eq!(
        std::fs::read(&foreign).unwrap(),
        b"my own notes, not protobuf"
    );
}

/// The file reads back through the strategy tool's reader (`restore_group_info_list`).
#[test]
fn group_info_reads_back_with_restore_group_info_list() {
    let dir = tempfile::tempdir().unwrap();
    let config = adam_gpt(
        dir.path(),
        DP2_MP2,
        1,
        &["output.group_info_file=\"group_info.pb\""],
    );
    train_steps(&config, 1);
    let path = dir.path().join("group_info_3.pb");
    assert_eq!(ckpt::restore_group_info_list(&path).unwrap(), vec![1, 3]);
}

/// Every rank's parameter shards before and after [`runtime::parameter_broadcast`], each rank
/// initialised with its own seed so replicas start different: by rank, (name, box, before,
/// after).
type Shards = Vec<(String, layout::SliceBox, Vec<f32>, Vec<f32>)>;

fn broadcast_from_differing_ranks(parallel: &str) -> Vec<Shards> {
    let dir = tempfile::tempdir().unwrap();
    let config = adam_gpt(dir.path(), parallel, 1, &[]);
    let session = runtime::Session::new(&config).unwrap();
    let devices = session.devices();
    let layouts: BTreeMap<String, layout::TensorLayout> = session
        .train
        .params
        .iter()
        .map(|p| (p.name.clone(), p.layout.clone()))
        .collect();
    let cluster = comm::LocalCluster::new(devices).unwrap();
    let results = cluster.run(|comm| {
        let rank = comm.rank();
        let world: Arc<dyn comm::Communicator> = Arc::new(comm);
        let mut exec = RankExecutor::new(session.train.clone(), world.clone()).unwrap();
        exec.init_parameters(100 + rank as u64).unwrap();
        let values = |exec: &RankExecutor| -> Vec<Vec<f32>> {
            (0..session.train.params.len())
                .map(|i| exec.param(i).as_f32().unwrap().to_vec())
                .collect()
        };
        let before = values(&exec);
        runtime::parameter_broadcast(&mut exec, world.as_ref(), &layouts, rank, 0).unwrap();
        let after = values(&exec);
        session
            .train
            .params
            .iter()
            .zip(before.into_iter().zip(after))
            .map(|(p, (b, a))| (p.name.clone(), exec.box_of(&p.layout).unwrap(), b, a))
            .collect::<Shards>()
    });
    results.into_iter().map(Result::unwrap).collect()
}

/// Every rank ends with the values the first rank holding its box started with; replicas that
/// started different end equal.
fn assert_broadcast_from_first_holder(ranks: &[Shards]) {
    let mut differed = 0;
    for (rank, shards) in ranks.iter().enumerate() {
        for (k, (name, region, _, after)) in shards.iter().enumerate() {
            let first = (0..ranks.len())
                .find(|&q| &ranks[q][k].1 == region)
                .unwrap();
            assert_eq!(after, &ranks[first][k].2, "rank {rank}'s {name}");
            if first != rank && ranks[rank][k].2 != ranks[first][k].2 {
                differed += 1;
            }
        }
    }
    assert!(differed > 0, "the ranks started with equal replicas");
}

#[test]
fn parameter_broadcast_makes_differing_replicas_equal() {
    assert_broadcast_from_first_holder(&broadcast_from_differing_ranks(DP2));
    assert_broadcast_from_first_holder(&broadcast_from_differing_ranks(DP2_MP2));
}

/// MindSpore's three errors, as messages naming the argument.
#[test]
fn parameter_broadcast_refuses_bad_arguments() {
    let dir = tempfile::tempdir().unwrap();
    let config = adam_gpt(dir.path(), DP2, 1, &[]);
    let session = runtime::Session::new(&config).unwrap();
    let name = session.train.params[0].name.clone();
    let layout = session.train.params[0].layout.clone();
    let cluster = comm::LocalCluster::new(2).unwrap();
    let errors = cluster.run(|comm| {
        let rank = comm.rank();
        let world: Arc<dyn comm::Communicator> = Arc::new(comm);
        let mut exec = RankExecutor::new(session.train.clone(), world.clone()).unwrap();
        exec.init_parameters(1).unwrap();
        let good = BTreeMap::from([(name.clone(), layout.clone())]);
        let bad_name = BTreeMap::from([("no.such.weight".to_string(), layout.clone())]);
        let w = world.as_ref();
        [
            runtime::parameter_broadcast(&mut exec, w, &good, 1 - rank, 0),
            runtime::parameter_broadcast(&mut exec, w, &good, rank, 1),
            runtime::parameter_broadcast(&mut exec, w, &bad_name, rank, 0),
        ]
        .map(|r| r.unwrap_err().to_string())
    });
    for messages in errors {
        let [cur, initial, missing] = messages.unwrap();
        assert!(
            cur.contains("cur_rank") && cur.contains("this rank"),
            "{cur}"
        );
        assert!(
            initial.contains("initial_rank") && initial.contains("stage"),
            "{initial}"
        );
        assert!(
            missing.contains("no.such.weight") && missing.contains("lacks"),
            "{missing}"
        );
    }
}

/// `train.parameter_broadcast` runs the broadcast before the first step: every parameter with
/// more than one holder of a rank's box (here, under data parallel, all of them), and none
/// without the key; the run still trains the numbers it trains without.
#[test]
fn parameter_broadcast_key_broadcasts_every_replicated_parameter() {
    let dir = tempfile::tempdir().unwrap();
    let run = |broadcast: bool| {
        let out = dir.path().join(format!("run_{broadcast}"));
        let key = format!("train.parameter_broadcast={broadcast}");
        let config = adam_gpt(&out, DP2, 2, &[&key]);
        crate::run_util::train_report(&config)
    };
    let (session, with, with_run) = run(true);
    let (_, without, without_run) = run(false);
    let mut names = crate::run_util::param_names(&session);
    names.sort();
    for rank in &with.ranks {
        assert_eq!(rank.broadcast, names);
    }
    assert!(without.ranks.iter().all(|r| r.broadcast.is_empty()));
    crate::run_util::assert_bitwise_run("broadcast of equal replicas", &with_run, &without_run);
}

/// Bytes of every parameter shard a rank ended with.
fn shard_bytes(rank: &runtime::RankOutcome) -> usize {
    // A pipeline's shared-parameter copies (the tied table on the last stage) are filled too.
    rank.params
        .iter()
        .chain(&rank.shared_copies)
        .map(|p| p.values.as_bytes().len())
        .sum()
}

/// `train.lazy_init` trains the bits eager initialisation trains, fresh and resumed, under
/// data × model parallel and under pipeline stages; a resumed lazy run fills no parameter its
/// checkpoint holds, where an eager one fills every shard and then overwrites it.
#[test]
fn lazy_init_trains_the_same_bits_and_never_fills_what_a_resume_loads() {
    let cases = [
        ("dp 2 × mp 2", DP2_MP2.to_string()),
        (
            "2 stages, 2 micro-batches",
            "devices = 2\nmode = \"semi_auto\"\nmodel_parallel = 1\n[parallel.pipeline]\nstages = 2\nmicro_batches = 2"
                .to_string(),
        ),
    ];
    for (name, parallel) in cases {
        let dir = tempfile::tempdir().unwrap();
        let first = dir.path().join("first");
        let from = format!("output.resume_from=\"{}\"", first.display());
        crate::run_util::train_steps(&adam_gpt(&first, &parallel, 2, &[]), 2);
        let run = |lazy: bool, resume: bool| {
            let out = dir.path().join(format!("lazy_{lazy}_resume_{resume}"));
            let key = format!("train.lazy_init={lazy}");
            let mut keys = vec![key.as_str()];
            if resume {
                keys.push(&from);
            }
            crate::run_util::train_report(&adam_gpt(&out, &parallel, 4, &keys))
        };
        let (_, eager, eager_run) = run(false, false);
        let (_, lazy, lazy_run) = run(true, false);
        crate::run_util::assert_bitwise_run(&format!("{name}: lazy"), &lazy_run, &eager_run);
        for (e, l) in eager.ranks.iter().zip(&lazy.ranks) {
            assert_eq!(
                e.initialised_bytes,
                shard_bytes(e),
                "{name}: eager fills all"
            );
            assert_eq!(
                l.initialised_bytes,
                shard_bytes(l),
                "{name}: lazy fills all, later"
            );
        }
        let (_, eager, eager_run) = run(false, true);
        let (_, lazy, lazy_run) = run(true, true);
        assert_eq!(eager_run.0.len(), 2, "{name}: the resume ran steps 3 and 4");
        crate::run_util::assert_bitwise_run(&format!("{name}: lazy resume"), &lazy_run, &eager_run);
        for (e, l) in eager.ranks.iter().zip(&lazy.ranks) {
            assert_eq!(e.initialised_bytes, shard_bytes(e), "{name}: eager resume");
            assert_eq!(l.initialised_bytes, 0, "{name}: lazy resume fills nothing");
        }
    }
}

/// HYBRID_PARALLEL: the example's seed MLP, sliced by hand over dp × mp meshes, trains the
/// losses and weights `mode = "stand_alone"` trains.
#[test]
fn hybrid_parallel_example_trains_like_stand_alone() {
    let dir = tempfile::tempdir().unwrap();
    let steps = 12;
    let config = crate::run_util::seed_mlp(
        dir.path(),
        "momentum",
        "mode = \"stand_alone\"",
        &[&format!("train.max_steps={steps}")],
    );
    let (_, (losses, params)) = crate::run_util::train_run(&config, steps);
    for (dp, mp) in [(1, 1), (2, 2), (1, 4), (4, 1)] {
        let spec = crate::hybrid_mlp::HybridMlp {
            data_dir: crate::run_util::digits(),
            dp,
            mp,
            hidden: 128,
            batch_size: 32,
            steps,
            learning_rate: 0.02,
            momentum: 0.9,
            seed: 3,
        };
        let run = crate::hybrid_mlp::train_hybrid_mlp(&spec).unwrap();
        let what = format!("hybrid dp {dp} × mp {mp}");
        crate::run_util::assert_losses_within(&what, &run.losses, &losses, 1e-5);
        for ((name, w), (ref_name, reference)) in run.weights.iter().zip(&params) {
            assert_eq!(name, ref_name);
            for (i, (a, b)) in w.as_f32().unwrap().iter().zip(reference).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                    "{what}: {name}[{i}] {a} vs {b}"
                );
            }
        }
    }
}

/// A hybrid closure's errors name the mesh axis it lacks; a failing rank's own error is
/// reported, not its peers' "peer failed".
#[test]
fn hybrid_parallel_reports_the_failing_rank() {
    let mesh = layout::Mesh::new(&[2, 2], &["dp", "mp"], None).unwrap();
    let err = runtime::run_hybrid(&mesh, std::time::Duration::from_secs(20), |place| {
        if place.rank() == 3 {
            place.coordinate("tp")?;
        }
        place.axis_group(&["dp"])?.barrier()?;
        Ok(())
    })
    .unwrap_err()
    .to_string();
    assert!(err.contains("rank 3") && err.contains("tp"), "{err}");
}

/// `x[16, 32] · W1 → ReLU → · W2`, whole inputs and parameters drawn from a fixed seed, and
/// the outputs computed on one device by the kernels alone.
fn two_layer_sub_network() -> (
    graph::Graph,
    graph::ValueId,
    Vec<tensor::Tensor>,
    BTreeMap<String, tensor::Tensor>,
    tensor::Tensor,
) {
    use tensor::kernels::{self, UnaryOp};
    let mut b = graph::GraphBuilder::new();
    let init = graph::Initializer::Normal {
        mean: 0.0,
        sigma: 0.5,
    };
    let x = b.input("x", &[16, 32], tensor::DType::F32).unwrap();
    let w1 = b.parameter("w1", &[32, 64], init.clone()).unwrap();
    let w2 = b.parameter("w2", &[64, 8], init).unwrap();
    let h = b.matmul("matmul1", x, w1).unwrap();
    let h = b.relu("relu", h).unwrap();
    let y = b.matmul("matmul2", h, w2).unwrap();
    b.output(y).unwrap();
    let graph = b.finish();
    let whole = |name: &str, shape: &[usize]| {
        graph::Initializer::Normal {
            mean: 0.0,
            sigma: 1.0,
        }
        .fill(
            shape,
            &layout::SliceBox::full(shape),
            tensor::DType::F32,
            7,
            name,
        )
        .unwrap()
    };
    let xs = whole("x", &[16, 32]);
    let params = BTreeMap::from([
        ("w1".to_string(), whole("w1", &[32, 64])),
        ("w2".to_string(), whole("w2", &[64, 8])),
    ]);
    let h = kernels::unary(
        UnaryOp::Relu,
        &kernels::matmul(&xs, &params["w1"], false, false).unwrap(),
    )
    .unwrap();
    let expected = kernels::matmul(&h, &params["w2"], false, false).unwrap();
    (graph, y, vec![xs], params, expected)
}

fn assert_close(what: &str, got: &tensor::Tensor, expected: &tensor::Tensor) {
    assert_eq!(got.shape(), expected.shape(), "{what}");
    for (i, (a, b)) in got
        .as_f32()
        .unwrap()
        .iter()
        .zip(expected.as_f32().unwrap())
        .enumerate()
    {
        assert!(
            (a - b).abs() <= 1e-4 * (1.0 + b.abs()),
            "{what}: [{i}] {a} vs {b}"
        );
    }
}

/// Functional `shard`: the ops reading the inputs and planned parameters split them as asked,
/// propagation places the rest, and the sharded sub-network computes what one device does —
/// the same compiled cell called twice.
#[test]
fn shard_runs_a_sub_network_sharded_as_planned() {
    let (graph, y, inputs, params, expected) = two_layer_sub_network();
    let plan = BTreeMap::from([
        ("w1".to_string(), vec![1, 2]),
        ("w2".to_string(), vec![2, 1]),
    ]);
    let cell = runtime::shard(
        &graph,
        &[y],
        &[vec![2, 1]],
        None,
        &plan,
        &runtime::ShardOptions::new(4),
    )
    .unwrap();
    assert_eq!(cell.strategies()["matmul1"], vec![vec![2, 1], vec![1, 2]]);
    assert_eq!(cell.strategies()["matmul2"][1], vec![2, 1]);
    let w1 = cell
        .program()
        .params
        .iter()
        .find(|p| p.name == "w1")
        .unwrap();
    assert_eq!(w1.layout.layout().split_factors(), vec![1, 2]);
    for call in 0..2 {
        let out = cell.call(&inputs, &params).unwrap();
        assert_close(&format!("call {call}"), &out[0], &expected);
    }
    // No plan: propagation alone, from the input's split.
    let cell = runtime::shard(
        &graph,
        &[y],
        &[vec![4, 1]],
        Some(&[vec![4, 1]]),
        &BTreeMap::new(),
        &runtime::ShardOptions::new(4),
    )
    .unwrap();
    assert_close(
        "propagated",
        &cell.call(&inputs, &params).unwrap()[0],
        &expected,
    );
}

/// `shard`'s errors name what is wrong.
#[test]
fn shard_refuses_bad_strategies() {
    let (graph, y, _, _, _) = two_layer_sub_network();
    let options = runtime::ShardOptions::new(4);
    let err = |in_s: &[Vec<usize>], plan: &[(&str, Vec<usize>)]| {
        let plan = plan
            .iter()
            .map(|(n, s)| (n.to_string(), s.clone()))
            .collect();
        runtime::shard(&graph, &[y], in_s, None, &plan, &options)
            .unwrap_err()
            .to_string()
    };
    let e = err(&[], &[]);
    assert!(
        e.contains("in_strategy has 0 entries") && e.contains("1 inputs"),
        "{e}"
    );
    let e = err(&[vec![2, 1]], &[("w9", vec![1, 2])]);
    assert!(e.contains("w9") && e.contains("not a parameter"), "{e}");
    let e = err(&[vec![2, 1, 1]], &[]);
    assert!(e.contains("x has 2 dims"), "{e}");
    let e = err(&[vec![2, 1]], &[("w1", vec![1, 8])]);
    assert!(e.contains("matmul1") && e.contains("w1"), "{e}");
}
