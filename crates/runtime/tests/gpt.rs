//! The GPT trained on N ranks gives the numbers one device gives.
//!
//! Every configuration trains 20 steps of a small GPT on the bundled KJV text (byte tokens) on
//! the local backend: the loss at every step equals `stand_alone`'s to a relative 1e-4, and the
//! checkpoints the ranks save, merged with `ckpt`, hold the same parameters.

use std::path::Path;

use runtime::{LaunchOptions, Session, TrainConfig};

use crate::run_util::{self, kjv, Run};

/// A small GPT (2 blocks, 8 heads, width 32, 16 tokens, batch 8) training 20 steps with
/// `optimizer`, `[parallel]` body `parallel`, and `model_extra` appended to `[model]`.
fn config(out: &Path, optimizer: &str, model_extra: &str, parallel: &str) -> TrainConfig {
    config_with(out, optimizer, model_extra, parallel, &[])
}

/// The small GPT with momentum in semi-auto mode on `devices` devices under the `[parallel]`
/// keys `keys` (`run_util::semi`), writing into `out`.
fn semi_config(out: &Path, devices: usize, keys: &str) -> TrainConfig {
    config(out, "momentum", "", &run_util::semi(devices, keys))
}

/// [`config`] with command-line style `overrides` (`train.deterministic=true`).
fn config_with(
    out: &Path,
    optimizer: &str,
    model_extra: &str,
    parallel: &str,
    overrides: &[String],
) -> TrainConfig {
    run_util::small_gpt(out, optimizer, model_extra, parallel, overrides)
}

/// Trains `config` for 20 steps: the losses, and every merged parameter by name.
fn train(config: &TrainConfig) -> Run {
    run_util::train_run(config, 20).1
}

fn assert_same_run(what: &str, run: &Run, reference: &Run) {
    run_util::assert_same_run(what, run, reference, 2e-4);
}

/// Configurations as (name, devices, optimizer, `[model]` extra, `[parallel]` keys).
const CASES: &[(&str, usize, &str, &str, &str)] = &[
    ("data parallel 8", 8, "momentum", "", "model_parallel = 1"),
    ("model parallel 2", 2, "momentum", "", "model_parallel = 2"),
    ("model parallel 4", 4, "momentum", "", "model_parallel = 4"),
    ("model parallel 8", 8, "momentum", "", "model_parallel = 8"),
    (
        "dp 2 × mp 4",
        8,
        "momentum",
        "",
        "data_parallel = 2\nmodel_parallel = 4",
    ),
    (
        "dp 2 × mp 2, untied embeddings",
        4,
        "momentum",
        "tie_embeddings = false",
        "data_parallel = 2\nmodel_parallel = 2",
    ),
    (
        "dp 2 × mp 2, dropout",
        4,
        "momentum",
        "dropout = 0.1",
        "data_parallel = 2\nmodel_parallel = 2",
    ),
    (
        "sequence parallel, dp 2 × mp 2",
        4,
        "momentum",
        "",
        "data_parallel = 2\nmodel_parallel = 2\nuse_seq_parallel = true",
    ),
    (
        "a glob override: every fc1 data parallel",
        4,
        "momentum",
        "",
        "data_parallel = 2\nmodel_parallel = 2\n[parallel.shard]\n\"blocks.*.mlp.fc1\" = [[4, 1, 1], [1, 1]]",
    ),
    (
        "layout overrides: fc1's batch over (dp, mp), fc2 row parallel",
        4,
        "momentum",
        "",
        "data_parallel = 2\nmodel_parallel = 2\n[parallel.mesh]\ndevice_matrix = [2, 2]\nalias_name = [\"dp\", \"mp\"]\n[parallel.shard]\n\"blocks.*.mlp.fc1\" = [[[\"dp\", \"mp\"], \"None\", \"None\"], [\"None\", \"None\"]]\n\"blocks.*.mlp.fc2\" = [[\"dp\", \"None\", \"mp\"], [\"None\", \"mp\"]]",
    ),
    ("adam, mp 2", 2, "adam", "", "model_parallel = 2"),
    (
        // The default is the fused attention (without dropout); the unfused ops too.
        "unfused attention, dp 2 × mp 4",
        8,
        "momentum",
        "fused_attention = false",
        "data_parallel = 2\nmodel_parallel = 4",
    ),
    (
        "vocabulary parallel, mp 2",
        2,
        "momentum",
        "",
        "model_parallel = 2\nvocab_emb_dp = false",
    ),
    (
        "vocabulary parallel, dp 2 × mp 4, untied, sequence parallel",
        8,
        "momentum",
        "tie_embeddings = false",
        "data_parallel = 2\nmodel_parallel = 4\nvocab_emb_dp = false\nuse_seq_parallel = true",
    ),
];

#[test]
fn gpt_configurations_match_one_device() {
    let tmp = tempfile::tempdir().unwrap();
    let mut references = std::collections::BTreeMap::new();
    for (i, (name, devices, optimizer, model_extra, parallel)) in CASES.iter().enumerate() {
        let key = (*optimizer, *model_extra);
        if !references.contains_key(&key) {
            let out = tmp.path().join(format!("sa-{}", references.len()));
            let reference = train(&config(
                &out,
                optimizer,
                model_extra,
                "mode = \"stand_alone\"",
            ));
            references.insert(key, reference);
        }
        let out = tmp.path().join(format!("case-{i}"));
        let run = train(&config(
            &out,
            optimizer,
            model_extra,
            &run_util::semi(*devices, parallel),
        ));
        assert_same_run(name, &run, &references[&key]);
    }
}

/// MindSpore's `manual_split`: the vocabulary-parallel table in uneven blocks of rows, tied to
/// the LM head (which takes the table in even blocks through a reshard) or untied.
#[test]
fn manual_split_tables_train_like_one_device() {
    let tmp = tempfile::tempdir().unwrap();
    let cases = [
        (
            "manual split [120, 56, 40, 40], dp 2 × mp 4, tied",
            8,
            "",
            "data_parallel = 2\nmodel_parallel = 4\nvocab_emb_dp = false\n[parallel.manual_split]\nembedding = [120, 56, 40, 40]",
        ),
        (
            "manual split as (rows, offset) pairs, mp 2, untied",
            2,
            "tie_embeddings = false",
            "model_parallel = 2\nvocab_emb_dp = false\n[parallel.manual_split]\n\"embedding.gather\" = [[200, 0], [56, 200]]",
        ),
    ];
    for (i, (name, devices, model_extra, parallel)) in cases.iter().enumerate() {
        let reference = train(&config(
            &tmp.path().join(format!("sa-{i}")),
            "momentum",
            model_extra,
            "mode = \"stand_alone\"",
        ));
        let out = tmp.path().join(format!("case-{i}"));
        let run = train(&config(
            &out,
            "momentum",
            model_extra,
            &run_util::semi(*devices, parallel),
        ));
        assert_same_run(name, &run, &reference);
        let explain = Session::new(&config(
            &out,
            "momentum",
            model_extra,
            &run_util::semi(*devices, parallel),
        ))
        .unwrap()
        .train
        .explain();
        let rows = if i == 0 {
            "rows [120, 56, 40, 40] × [32]"
        } else {
            "rows [200, 56] × [32]"
        };
        assert!(explain.contains(rows), "{explain}");
        // Both strategy files record the uneven blocks (MindSpore's as `param_split_shape`).
        for file in ["strategy.json", "strategy.ckpt"] {
            let strategy = ckpt::Strategy::load(&out.join(file)).unwrap();
            let table = strategy.param("embedding.embedding_table").unwrap();
            let rows = if i == 0 {
                vec![120, 56, 40, 40]
            } else {
                vec![200, 56]
            };
            assert_eq!(table.placements[0].rows, Some(rows), "{name}: {file}");
        }
        // MindSpore's strategy file alone (param_split_shape) merges the table the same way.
        let merged = out.join("merged-ms");
        ckpt::unified_safetensors(
            &out,
            &out.join("strategy.ckpt"),
            &merged,
            &ckpt::MergeOptions::default(),
        )
        .unwrap();
        let part = ckpt::CheckpointFile::open(&merged.join("part0.safetensors")).unwrap();
        let table = part.read_tensor("embedding.embedding_table").unwrap();
        let from_json = &run
            .1
            .iter()
            .find(|(n, _)| n == "embedding.embedding_table")
            .unwrap()
            .1;
        assert_eq!(table.as_f32().unwrap(), from_json.as_slice(), "{name}");
    }
}

/// Pipeline stages (one batch at a time): the GPT's layers over 2 stages, the tied embedding
/// shared by the first and the last stage, with model and vocabulary parallelism inside a stage.
#[test]
fn pipeline_stages_train_like_one_device() {
    let tmp = tempfile::tempdir().unwrap();
    let reference = train(&config(
        &tmp.path().join("sa"),
        "momentum",
        "",
        "mode = \"stand_alone\"",
    ));
    let cases: &[(&str, usize, &str)] = &[
        ("2 stages", 2, "[parallel.pipeline]\nstages = 2"),
        (
            "2 stages × model parallel 2, vocabulary parallel",
            4,
            "model_parallel = 2\nvocab_emb_dp = false\n[parallel.pipeline]\nstages = 2",
        ),
        (
            "2 stages, 4 micro-batches, 1F1B, tied embedding",
            2,
            "[parallel.pipeline]\nstages = 2\nmicro_batches = 4",
        ),
        (
            "2 stages × model parallel 2, 2 micro-batches, GPipe",
            4,
            "model_parallel = 2\n[parallel.pipeline]\nstages = 2\nmicro_batches = 2\nscheduler = \"gpipe\"",
        ),
        (
            "2 stages × data parallel 2, 2 micro-batches, zero bubble",
            4,
            "data_parallel = 2\n[parallel.pipeline]\nstages = 2\nmicro_batches = 2\nscheduler = \"zero_bubble\"",
        ),
        (
            "4 stages by stage_config",
            4,
            "[parallel.pipeline]\nstages = 4\n[parallel.pipeline.stage_config]\nembedding = 0\n\"blocks.0\" = 1\n\"blocks.1\" = 2\nln_f = 3",
        ),
    ];
    for (i, (name, devices, parallel)) in cases.iter().enumerate() {
        let out = tmp.path().join(format!("pipe-{i}"));
        let run = train(&semi_config(&out, *devices, parallel));
        assert_same_run(name, &run, &reference);
        // One MindSpore strategy file per stage, which merge into the run's merged file.
        let stages = out.join(runtime::STAGE_STRATEGY_DIR);
        let merged = tmp.path().join(format!("merged-stages-{i}.ckpt"));
        ckpt::merge_pipeline_strategies(&stages, &merged, false).unwrap();
        let (ours, theirs) = (
            ckpt::Strategy::load(&out.join("strategy.ckpt")).unwrap(),
            ckpt::Strategy::load(&merged).unwrap(),
        );
        let names = |s: &ckpt::Strategy| {
            let mut v: Vec<(String, usize)> = s
                .params
                .iter()
                .map(|p| (p.name.clone(), p.placements[0].stage))
                .collect();
            v.sort();
            v
        };
        assert_eq!(names(&ours), names(&theirs), "{name}");
        assert!(ours.n_stages() > 1, "{name}");
    }
    // Interleaved 1F1B: two model chunks per stage (chunk c of stage s holds cut c·P + s).
    for (stages, micro) in [(2, 2), (2, 4), (4, 4)] {
        let out = tmp.path().join(format!("interleaved-{stages}-{micro}"));
        let parallel = format!(
            "[parallel.pipeline]\nstages = {stages}\nmicro_batches = {micro}\nscheduler = \"interleaved_1f1b\"\nvirtual_stages = 2"
        );
        let run = train(&semi_config(&out, stages, &parallel));
        assert_same_run(
            &format!("interleaved 1F1B, {stages} stages × 2 chunks, {micro} micro-batches"),
            &run,
            &reference,
        );
    }
    // Every executed scheduler at 2 and 4 stages with 1, 2, 4 and 8 micro-batches.
    for scheduler in ["gpipe", "1f1b", "zero_bubble"] {
        for stages in [2, 4] {
            for micro in [1, 2, 4, 8] {
                let out = tmp
                    .path()
                    .join(format!("sweep-{scheduler}-{stages}-{micro}"));
                let parallel = format!(
                    "[parallel.pipeline]\nstages = {stages}\nmicro_batches = {micro}\nscheduler = \"{scheduler}\""
                );
                let run = train(&semi_config(&out, stages, &parallel));
                assert_same_run(
                    &format!("{scheduler}, {stages} stages, {micro} micro-batches"),
                    &run,
                    &reference,
                );
            }
        }
    }
}

/// `train.deterministic = true`: the loss at every step and every merged parameter are bitwise
/// one device's, under data, model, vocabulary parallelism and their mixes, with SGD-momentum
/// and Adam.
#[test]
fn deterministic_runs_are_bitwise_one_device() {
    let tmp = tempfile::tempdir().unwrap();
    let det = ["train.deterministic=true".to_string()];
    let cases: &[(&str, usize, &str, &str)] = &[
        ("data parallel 2", 2, "momentum", "model_parallel = 1"),
        ("data parallel 4", 4, "momentum", "model_parallel = 1"),
        ("data parallel 8", 8, "momentum", "model_parallel = 1"),
        ("model parallel 2", 2, "momentum", "model_parallel = 2"),
        ("model parallel 4, adam", 4, "adam", "model_parallel = 4"),
        (
            "dp 2 × mp 4",
            8,
            "momentum",
            "data_parallel = 2\nmodel_parallel = 4",
        ),
        (
            "vocabulary and sequence parallel, mp 2",
            2,
            "momentum",
            "model_parallel = 2\nvocab_emb_dp = false\nuse_seq_parallel = true",
        ),
        (
            "sequence parallel, dp 2 × mp 2",
            4,
            "adam",
            "data_parallel = 2\nmodel_parallel = 2\nuse_seq_parallel = true",
        ),
        (
            "vocabulary parallel, dp 2 × mp 2",
            4,
            "adam",
            "data_parallel = 2\nmodel_parallel = 2\nvocab_emb_dp = false",
        ),
    ];
    let mut references = std::collections::BTreeMap::new();
    for (i, (name, devices, optimizer, parallel)) in cases.iter().enumerate() {
        if !references.contains_key(optimizer) {
            let out = tmp.path().join(format!("sa-{optimizer}"));
            let reference = train(&config_with(
                &out,
                optimizer,
                "",
                "mode = \"stand_alone\"",
                &det,
            ));
            references.insert(*optimizer, reference);
        }
        let reference = &references[optimizer];
        let out = tmp.path().join(format!("det-{i}"));
        let run_config = config_with(
            &out,
            optimizer,
            "",
            &run_util::semi(*devices, parallel),
            &det,
        );
        let (losses, params) = train(&run_config);
        if i == 0 {
            // `--explain` says which collectives add in the canonical order.
            let session = Session::new(&run_config).unwrap();
            assert_eq!(session.deterministic_blocks(), Some(16));
            let plan = session.train.explain_with(session.deterministic_blocks());
            assert!(plan.starts_with("deterministic mode"), "{plan}");
            assert!(
                plan.contains("deterministic all-reduce over groups of 2"),
                "{plan}"
            );
        }
        run_util::assert_bitwise_run(name, &(losses, params), reference);
    }
}

/// `train.deterministic = true` with pipeline stages and several micro-batches: a pipeline's
/// micro-batches are a step's gradient accumulation (`data.batch_size / micro_batches` each,
/// `train.grad_accumulation_steps = micro_batches`), so the losses and the merged parameters
/// are bitwise one device's run of those micro-batches, on 2 and 4 devices, with data
/// parallelism and model parallelism inside a stage, and the tied embedding's copies summed.
#[test]
fn deterministic_pipelines_are_bitwise_one_device() {
    let tmp = tempfile::tempdir().unwrap();
    let steps = 8;
    let det = |extra: &[&str]| -> Vec<String> {
        let mut all = vec![
            "train.deterministic=true".to_string(),
            format!("train.max_steps={steps}"),
        ];
        all.extend(extra.iter().map(|s| s.to_string()));
        all
    };
    let run = |name: &str, parallel: &str, extra: &[&str]| {
        let out = tmp.path().join(name);
        run_util::train_run(
            &config_with(&out, "momentum", "", parallel, &det(extra)),
            steps,
        )
        .1
    };
    // (name, devices, [parallel] keys, micro-batches)
    let cases: &[(&str, usize, &str, usize)] = &[
        ("2 stages, 2 micro-batches, 1F1B", 2, "[parallel.pipeline]\nstages = 2\nmicro_batches = 2", 2),
        ("2 stages, 4 micro-batches, GPipe", 2, "[parallel.pipeline]\nstages = 2\nmicro_batches = 4\nscheduler = \"gpipe\"", 4),
        ("4 stages, 4 micro-batches", 4, "[parallel.pipeline]\nstages = 4\nmicro_batches = 4", 4),
        (
            "2 stages × data parallel 2, 2 micro-batches, zero bubble",
            4,
            "data_parallel = 2\n[parallel.pipeline]\nstages = 2\nmicro_batches = 2\nscheduler = \"zero_bubble\"",
            2,
        ),
        (
            "2 stages × model parallel 2, vocabulary parallel, 2 micro-batches",
            4,
            "model_parallel = 2\nvocab_emb_dp = false\n[parallel.pipeline]\nstages = 2\nmicro_batches = 2",
            2,
        ),
    ];
    let mut references = std::collections::BTreeMap::new();
    for (i, (name, devices, parallel, micro)) in cases.iter().enumerate() {
        let reference = references.entry(*micro).or_insert_with(|| {
            let batch = format!("data.batch_size={}", 8 / micro);
            let accumulate = format!("train.grad_accumulation_steps={micro}");
            run(
                &format!("sa-{micro}"),
                "mode = \"stand_alone\"",
                &[&batch, &accumulate],
            )
        });
        let piped = run(
            &format!("pipe-{i}"),
            &run_util::semi(*devices, parallel),
            &[],
        );
        run_util::assert_bitwise_run(name, &piped, reference);
    }
}

/// `train.deterministic = true` with the other switches that change how a step runs: interleaved
/// micro-batches (bitwise the one-device accumulation of those micro-batches), recompute, fused
/// and overlapped gradient buckets, and a searched plan — each bitwise one device.
#[test]
fn deterministic_mode_holds_under_the_other_switches() {
    let tmp = tempfile::tempdir().unwrap();
    let steps = 6;
    let run = |name: &str, parallel: &str, extra: &[&str]| {
        let mut overrides = vec![
            "train.deterministic=true".to_string(),
            format!("train.max_steps={steps}"),
        ];
        overrides.extend(extra.iter().map(|s| s.to_string()));
        let out = tmp.path().join(name);
        run_util::train_run(
            &config_with(&out, "momentum", "", parallel, &overrides),
            steps,
        )
        .1
    };
    let one_device = run("sa", "mode = \"stand_alone\"", &[]);
    let one_device_accumulating = run(
        "sa-acc",
        "mode = \"stand_alone\"",
        &["data.batch_size=4", "train.grad_accumulation_steps=2"],
    );
    let cases: &[(&str, String, &Run)] = &[
        (
            "micro-batch interleave 2, dp 2",
            run_util::semi(2, "model_parallel = 1\nmicro_batch_interleave = 2"),
            &one_device_accumulating,
        ),
        (
            "recompute every block, dp 2 × mp 2",
            run_util::semi(4, "data_parallel = 2\nmodel_parallel = 2\n[parallel.recompute]\ncells = [\"blocks.*\"]"),
            &one_device,
        ),
        (
            "fused and overlapped buckets, dp 4",
            run_util::semi(4, "model_parallel = 1\n[parallel.comm_fusion]\n[parallel.overlap]\ngrad_computation_allreduce_overlap = true"),
            &one_device,
        ),
        (
            "dynamic programming search on 4 devices",
            "devices = 4\nmode = \"dynamic_programming\"".to_string(),
            &one_device,
        ),
    ];
    for (name, parallel, reference) in cases {
        let got = run(name, parallel, &[]);
        run_util::assert_bitwise_run(name, &got, reference);
    }
}

/// `parallel.gradients_mean` and `parallel.loss_repeated_mean` scale the gradients as MindSpore
/// does, under either loss (the fused `SparseSoftmaxCrossEntropy` and the vocabulary-parallel
/// one built from primitive ops). On dp 2 × mp 2 the loss is summed from 2 batch shards and
/// repeated on 2 devices each: `gradients_mean = false` doubles every gradient (the sum over
/// the 2 replicas of each one's mean-loss gradient), `loss_repeated_mean = false` doubles it
/// (no division by the 2 devices repeating the loss), both quadruple it. With SGD-momentum
/// (no weight decay) a gradient k times larger at learning rate η takes exactly the steps of
/// the mean gradient at k·η, so the runs are compared bit for bit.
#[test]
fn gradient_scale_switches_act_under_every_loss() {
    let tmp = tempfile::tempdir().unwrap();
    let steps = 4;
    let dp_mp = "data_parallel = 2\nmodel_parallel = 2";
    for (l, loss_keys) in ["", "\nvocab_emb_dp = false"].iter().enumerate() {
        let parallel = run_util::semi(4, &format!("{dp_mp}{loss_keys}"));
        let run = |name: &str, lr: f64, switches: &[&str]| {
            let mut overrides = vec![
                format!("train.max_steps={steps}"),
                format!("train.learning_rate={lr}"),
            ];
            overrides.extend(switches.iter().map(|s| s.to_string()));
            let out = tmp.path().join(format!("{l}-{name}"));
            run_util::train_run(
                &config_with(&out, "momentum", "", &parallel, &overrides),
                steps,
            )
            .1
        };
        let cases: [(&str, &[&str], f64); 3] = [
            (
                "gradients_mean = false",
                &["parallel.gradients_mean=false"],
                2.0,
            ),
            (
                "loss_repeated_mean = false",
                &["parallel.loss_repeated_mean=false"],
                2.0,
            ),
            (
                "both false",
                &[
                    "parallel.gradients_mean=false",
                    "parallel.loss_repeated_mean=false",
                ],
                4.0,
            ),
        ];
        let unscaled = run("unscaled", 0.005, &[]);
        for (i, (what, switches, factor)) in cases.iter().enumerate() {
            let scaled = run(&format!("off-{i}"), 0.005, switches);
            let mean = run(&format!("mean-{i}"), 0.005 * factor, &[]);
            let what = format!("{what}, loss {l}");
            // The same parameters after every step as the mean gradient at factor × η ...
            run_util::assert_bitwise_run(&what, &scaled, &mean);
            // ... which is not the mean gradient at η: the switch acted.
            assert_ne!(scaled.1, unscaled.1, "{what}: the switch changed nothing");
        }
    }
}

#[test]
fn gpt_strategy_keys_are_checked_against_the_devices_and_model() {
    let tmp = tempfile::tempdir().unwrap();
    let bad = [
        (
            "data_parallel = 3\nmodel_parallel = 2",
            4,
            "parallel.data_parallel",
        ),
        ("model_parallel = 3", 4, "parallel.model_parallel"),
        ("model_parallel = 16", 16, "model.heads"),
    ];
    for (keys, devices, needle) in bad {
        let config = semi_config(tmp.path(), devices, keys);
        let err = Session::new(&config).unwrap_err().to_string();
        assert!(err.contains(needle), "{keys}: {err}");
    }
    // Without model parallelism the rest is data parallel: every device takes batch rows.
    let keys = "data_parallel = 2\nmodel_parallel = 1";
    let session = Session::new(&semi_config(tmp.path(), 8, keys)).unwrap();
    let strategies: std::collections::BTreeMap<String, Vec<Vec<usize>>> = session
        .op_strategies()
        .into_iter()
        .map(|r| (r.name, r.inputs))
        .collect();
    assert_eq!(strategies["embedding.gather"], vec![vec![1, 1], vec![8, 1]]);
}

#[test]
fn sequence_parallel_joins_regions_by_all_gather_and_reduce_scatter() {
    let tmp = tempfile::tempdir().unwrap();
    let keys = "data_parallel = 2\nmodel_parallel = 2\nuse_seq_parallel = true";
    let session = Session::new(&semi_config(tmp.path(), 4, keys)).unwrap();
    let plan = session.train.explain();
    // The row-parallel outputs are reduce-scattered onto the sequence split, and the column-
    // parallel inputs all-gathered from it: no activation is all-reduced.
    for op in ["attn.proj.matmul", "mlp.fc2.matmul"] {
        let line = format!("reshard blocks.0.{op}: reduce-scatter along dim 1");
        assert!(plan.contains(&line), "no {line:?} in\n{plan}");
    }
    for ln in ["ln1", "ln2"] {
        let line = format!("reshard blocks.0.{ln}.layer_norm: all-gather");
        assert!(plan.contains(&line), "no {line:?} in\n{plan}");
    }
    // Without sequence parallelism the same sums are all-reduces.
    let keys = "data_parallel = 2\nmodel_parallel = 2";
    let session = Session::new(&semi_config(tmp.path(), 4, keys)).unwrap();
    let plan = session.train.explain();
    assert!(
        plan.contains("reshard blocks.0.attn.proj.matmul: all-reduce"),
        "{plan}"
    );
}

#[test]
fn data_parallel_mode_moves_no_activation() {
    // `mode = "data_parallel"`: every op takes the batch rows, so the only communication is
    // the gradients' all-reduce and the loss's report. The reshapes before the loss (`[B, S, V]`
    // → `[B·S, V]`) used to be left whole, all-gathering the logits forward and their gradient
    // backward in every step.
    let tmp = tempfile::tempdir().unwrap();
    let parallel = "devices = 4\nmode = \"data_parallel\"";
    let out = tmp.path().join("dp");
    let session = Session::new(&config(&out, "momentum", "", parallel)).unwrap();
    let strategies: std::collections::BTreeMap<String, Vec<Vec<usize>>> = session
        .op_strategies()
        .into_iter()
        .map(|r| (r.name, r.inputs))
        .collect();
    assert_eq!(strategies["logits"], vec![vec![4, 1, 1]]);
    assert_eq!(strategies["labels_flat"], vec![vec![4, 1]]);
    let plan = session.train.explain();
    for moved in ["all-gather", "all-to-all", "reduce-scatter"] {
        assert!(!plan.contains(moved), "{moved} in\n{plan}");
    }
    let reference = train(&config(
        &tmp.path().join("sa"),
        "momentum",
        "",
        "mode = \"stand_alone\"",
    ));
    assert_same_run(
        "data_parallel mode",
        &train(&config(&out, "momentum", "", parallel)),
        &reference,
    );
}

#[test]
fn glob_and_cell_keys_override_the_cells_strategies() {
    let tmp = tempfile::tempdir().unwrap();
    let keys = "data_parallel = 2\nmodel_parallel = 2\n[parallel.shard]\n\"blocks.*.mlp.fc1\" = [[4, 1, 1], [1, 1]]\n\"blocks.1.attn.qkv.bias_add\" = [[4, 1, 1], [1]]";
    let session = Session::new(&semi_config(tmp.path(), 4, keys)).unwrap();
    let strategies: std::collections::BTreeMap<String, Vec<Vec<usize>>> = session
        .op_strategies()
        .into_iter()
        .map(|r| (r.name, r.inputs))
        .collect();
    for block in 0..2 {
        let fc1 = &strategies[&format!("blocks.{block}.mlp.fc1.matmul")];
        assert_eq!(fc1, &vec![vec![4, 1, 1], vec![1, 1]]);
        // The cells' own choice stays for the ops no key names.
        let fc2 = &strategies[&format!("blocks.{block}.mlp.fc2.matmul")];
        assert_eq!(fc2, &vec![vec![2, 1, 2], vec![1, 2]]);
    }
    assert_eq!(
        strategies["blocks.1.attn.qkv.bias_add"],
        vec![vec![4, 1, 1], vec![1]]
    );
    assert_eq!(
        strategies["blocks.0.attn.qkv.bias_add"],
        vec![vec![2, 1, 2], vec![2]]
    );
    // A key that matches no op is an error naming it.
    let keys = "model_parallel = 2\n[parallel.shard]\n\"blocks.*.mlp.fc9\" = [[2, 1, 1], [1, 1]]";
    let err = Session::new(&semi_config(tmp.path(), 2, keys)).unwrap_err();
    assert!(err.to_string().contains("blocks.*.mlp.fc9"), "{err}");
}

#[test]
fn generate_continues_a_prompt_from_a_checkpoint_of_any_strategy() {
    let tmp = tempfile::tempdir().unwrap();
    let char_tokens = |out: &Path, parallel: &str| {
        TrainConfig::parse(
            &format!(
                "[model]\nname = \"gpt\"\nlayers = 2\nheads = 8\nhidden = 32\nseq_len = 16\n\
                 [data]\nformat = \"text\"\npath = \"{}\"\ntokenizer = \"char\"\nbatch_size = 8\nsteps_per_epoch = 20\n\
                 [parallel]\n{parallel}\n[train]\nepochs = 1\noptimizer = \"adam\"\nlearning_rate = 0.01\neval = false\n\
                 [output]\ndir = \"{}\"\n",
                kjv().display(),
                out.display()
            ),
            None,
            &[],
            Path::new("/"),
        )
        .unwrap()
    };
    let alone = tmp.path().join("alone");
    let sharded = tmp.path().join("mp2");
    train(&char_tokens(&alone, "mode = \"stand_alone\""));
    train(&char_tokens(
        &sharded,
        &run_util::semi(2, "model_parallel = 2"),
    ));
    let options = |temperature: f64, seed: u64| runtime::GenerateOptions {
        prompt: "And God said".to_string(),
        tokens: 20,
        temperature,
        seed,
    };
    let greedy = runtime::generate(&alone, &options(0.0, 1)).unwrap();
    assert!(greedy.starts_with("And God said"), "{greedy}");
    assert_eq!(greedy.chars().count(), "And God said".len() + 20);
    // The model-parallel checkpoint, merged on load, continues the same way.
    assert_eq!(
        runtime::generate(&sharded, &options(0.0, 1)).unwrap(),
        greedy
    );
    // Sampling is a function of the seed.
    let a = runtime::generate(&alone, &options(1.0, 7)).unwrap();
    assert_eq!(a, runtime::generate(&alone, &options(1.0, 7)).unwrap());
    // Bad requests get errors naming what is wrong.
    let err = runtime::generate(tmp.path(), &options(1.0, 7)).unwrap_err();
    assert!(err.to_string().contains("model.json"), "{err}");
    let err = runtime::generate(&alone, &options(-1.0, 7)).unwrap_err();
    assert!(err.to_string().contains("--temperature"), "{err}");
    let mut unknown = options(0.0, 1);
    unknown.prompt = "And God said 😀".to_string();
    let err = runtime::generate(&alone, &unknown).unwrap_err();
    assert!(err.to_string().contains("--prompt"), "{err}");
}

/// The tied table's two gradient contributions (the embedding's and the LM head's) await the
/// same sum over the data-parallel ranks: they are added first and summed once, one all-reduce
/// of the table a step instead of two (the training equivalence tests check the numbers).
/// Deterministic mode sums each in its canonical order first, as one device adds them.
#[test]
fn a_tied_tables_gradient_is_summed_once() {
    let tmp = tempfile::tempdir().unwrap();
    let keys = "data_parallel = 2\nmodel_parallel = 2";
    let table_sums = |overrides: &[String]| -> Vec<String> {
        let config = config_with(
            tmp.path(),
            "momentum",
            "",
            &run_util::semi(4, keys),
            overrides,
        );
        let session = Session::new(&config).unwrap();
        session
            .train
            .steps
            .iter()
            .filter_map(|step| match step {
                parallel::Step::Reshard(r)
                    if r.reason.contains("embedding.embedding_table")
                        && !r.reason.contains("position_embedding") =>
                {
                    Some(r.reason.clone())
                }
                _ => None,
            })
            .collect()
    };
    let ordinary = table_sums(&[]);
    assert_eq!(ordinary.len(), 1, "{ordinary:#?}");
    assert!(
        ordinary[0].contains("the gradient of embedding.embedding_table must be laid out like"),
        "{ordinary:#?}"
    );
    let deterministic = table_sums(&["train.deterministic=true".to_string()]);
    assert_eq!(deterministic.len(), 2, "{deterministic:#?}");
    assert!(
        deterministic
            .iter()
            .all(|r| r.contains("embedding.embedding_table.grad_sum1 needs input")),
        "{deterministic:#?}"
    );
}

#[test]
fn vocabulary_parallel_never_moves_the_logits() {
    let tmp = tempfile::tempdir().unwrap();
    let keys = "data_parallel = 2\nmodel_parallel = 2\nvocab_emb_dp = false";
    let session = Session::new(&semi_config(tmp.path(), 4, keys)).unwrap();
    // A rank's block of the [B·S, V] f32 logits: nothing that large crosses the network.
    let logits_block = 8 * 16 * 256 * 4 / 4;
    for step in &session.train.steps {
        if let parallel::Step::Reshard(r) = step {
            let value = &session.train.placed.graph.values()[r.value.0];
            let sent = r
                .plan
                .bytes_sent_per_rank()
                .iter()
                .map(|&(_, b)| b)
                .max()
                .unwrap_or(0);
            assert!(
                sent < logits_block / 4,
                "{} ({:?}) sends {sent} B from one rank: {}",
                value.name,
                value.shape,
                r.reason
            );
        }
    }
    // The table is split on its rows, and the embedding's output is pending a sum.
    let plan = session.train.explain();
    assert!(
        plan.contains("reshard embedding.gather: all-reduce"),
        "{plan}"
    );
}

#[test]
fn bad_gpt_and_text_settings_name_the_key_or_file() {
    let tmp = tempfile::tempdir().unwrap();
    let parse = |extra: &[&str]| {
        let overrides: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let text = format!(
            "[model]\nname = \"gpt\"\nlayers = 1\nheads = 2\nhidden = 8\nseq_len = 8\n\
             [data]\nformat = \"text\"\npath = \"{}\"\nbatch_size = 2\n\
             [train]\nepochs = 1\noptimizer = \"sgd\"\nlearning_rate = 0.1\n[output]\ndir = \"{}\"\n",
            kjv().display(),
            tmp.path().display()
        );
        TrainConfig::parse(&text, None, &overrides, Path::new("/"))
            .and_then(|c| Session::new(&c).map(|_| ()))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    };
    let not_text = tmp.path().join("latin1.txt");
    std::fs::write(&not_text, [b'a', 0xE9, b'b']).unwrap();
    let corrupt = tmp.path().join("broken.txt.gz");
    std::fs::write(&corrupt, b"not gzip at all").unwrap();
    let short = tmp.path().join("short.txt");
    std::fs::write(&short, "tiny").unwrap();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["data.format=\"idx\"".into(), "data.dir=/nowhere".into()],
            "data.format",
        ),
        (vec!["data.tokenizer=\"word\"".into()], "data.tokenizer"),
        (vec!["model.dropout=1.5".into()], "model.dropout"),
        (
            vec![
                "model.dropout=0.1".into(),
                "model.fused_attention=true".into(),
            ],
            "model.fused_attention",
        ),
        (vec!["model.heads=3".into()], "model.heads"),
        (vec!["data.val_fraction=1.0".into()], "data.val_fraction"),
        (
            vec!["data.path=/nowhere/kjv.txt".into()],
            "/nowhere/kjv.txt",
        ),
        (
            vec![format!("data.path=\"{}\"", not_text.display())],
            "latin1.txt",
        ),
        (
            vec![format!("data.path=\"{}\"", corrupt.display())],
            "broken.txt.gz",
        ),
        (
            vec![format!("data.path=\"{}\"", short.display())],
            "short.txt",
        ),
        (
            vec![
                "parallel.mode=\"semi_auto\"".into(),
                "parallel.devices=4".into(),
                "parallel.model_parallel=4".into(),
                "model.heads=4".into(),
                "data.batch_size=4".into(),
                "parallel.vocab_emb_dp=false".into(),
                "data.tokenizer=\"char\"".into(),
            ],
            "vocabulary",
        ),
    ];
    // `[parallel.manual_split]` on a vocabulary-parallel table over mp = 2 (256 byte ids).
    let vocab_parallel = |extra: &[&str]| -> Vec<String> {
        [
            "parallel.mode=\"semi_auto\"",
            "parallel.devices=2",
            "parallel.model_parallel=2",
            "parallel.vocab_emb_dp=false",
        ]
        .iter()
        .chain(extra)
        .map(|s| s.to_string())
        .collect()
    };
    let mut cases = cases;
    cases.extend([
        (
            vocab_parallel(&["parallel.manual_split.embedding=[100, 100, 56]"]),
            "needs 2 size(s), got 3",
        ),
        (
            vocab_parallel(&["parallel.manual_split.embedding=[100, 100]"]),
            "add up to 200, but dim 0 has 256 rows",
        ),
        (
            vocab_parallel(&["parallel.manual_split.embedding=[256, 0]"]),
            "parallel.manual_split.embedding[1]",
        ),
        (
            vocab_parallel(&["parallel.manual_split.blocks=[128, 128]"]),
            "\"blocks\" names no Embedding (Gather) op or cell; the Embedding ops are: embedding.gather",
        ),
        (
            vocab_parallel(&["parallel.manual_split.embedding=[[200, 0], [56, 100]]"]),
            "offset 100 is not where the block must start: 200",
        ),
        (
            vocab_parallel(&[
                "parallel.vocab_emb_dp=true",
                "parallel.manual_split.embedding=[128, 128]",
            ]),
            "splits the table's 256 rows into 1 block(s)",
        ),
    ]);
    for (overrides, needle) in cases {
        let args: Vec<&str> = overrides.iter().map(String::as_str).collect();
        let err = parse(&args);
        assert!(err.contains(needle), "{overrides:?}: {err:?}");
    }
}

/// A token file of the text's bytes trains exactly as the text does (the same ids, windows and
/// losses), and every epoch ends with the validation loss in the metrics log.
#[test]
fn token_files_train_as_their_text_and_epochs_report_the_validation_loss() {
    let tmp = tempfile::tempdir().unwrap();
    let mut text = Vec::new();
    std::io::Read::read_to_end(
        &mut flate2::read::GzDecoder::new(std::fs::File::open(kjv()).unwrap()),
        &mut text,
    )
    .unwrap();
    text.truncate(200_000);
    let text_path = tmp.path().join("part.txt");
    std::fs::write(&text_path, &text).unwrap();
    let ids: Vec<u8> = text
        .iter()
        .flat_map(|&b| u16::from(b).to_le_bytes())
        .collect();
    let ids_path = tmp.path().join("part.bin");
    std::fs::write(&ids_path, ids).unwrap();
    let run = |name: &str, data: &str| {
        let out = tmp.path().join(name);
        let toml = format!(
            "[model]\nname = \"gpt\"\nlayers = 1\nheads = 2\nhidden = 16\nseq_len = 16\n\
             [data]\n{data}\nbatch_size = 4\nsteps_per_epoch = 3\neval_batches = 2\n\
             [train]\nepochs = 2\noptimizer = \"adam\"\nlearning_rate = 0.01\n\
             [output]\ndir = \"{}\"\nsave_checkpoint = false\n",
            out.display()
        );
        let config = TrainConfig::parse(&toml, None, &[], Path::new("/")).unwrap();
        let session = Session::new(&config).unwrap();
        let options = LaunchOptions {
            print_loss: false,
            metrics_log: Some(config.output().metrics_file()),
            ..LaunchOptions::default()
        };
        let report = runtime::train_local(&session, &options).unwrap();
        let log = std::fs::read_to_string(config.output().metrics_file()).unwrap();
        let evals: Vec<f64> = log
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .filter_map(|v| v.get("eval_loss").and_then(serde_json::Value::as_f64))
            .collect();
        (
            report.losses().to_vec(),
            report.eval_losses().to_vec(),
            evals,
        )
    };
    let text_run = run(
        "text",
        &format!("format = \"text\"\npath = \"{}\"", text_path.display()),
    );
    let ids_run = run(
        "ids",
        &format!(
            "format = \"tokens\"\npath = \"{}\"\ndtype = \"u16\"\nvocab_size = 256",
            ids_path.display()
        ),
    );
    assert_eq!(text_run.0.len(), 6);
    assert_eq!(ids_run.0, text_run.0, "the same ids train the same");
    assert_eq!(ids_run.1, text_run.1);
    // One validation loss per epoch, in the log as in the report.
    assert_eq!(text_run.1.len(), 2);
    assert_eq!(text_run.2, text_run.1);
    assert!(text_run.1.iter().all(|l| l.is_finite() && *l > 0.0));
}

/// `parallel.mode = "data_parallel"` (every op's default strategy: the batch over all devices)
/// trains the GPT as one device does.
#[test]
fn data_parallel_mode_matches_one_device() {
    let tmp = tempfile::tempdir().unwrap();
    let reference = train(&config(
        &tmp.path().join("alone"),
        "momentum",
        "",
        "mode = \"stand_alone\"",
    ));
    let run = train(&config(
        &tmp.path().join("dp"),
        "momentum",
        "",
        "devices = 4\nmode = \"data_parallel\"",
    ));
    assert_same_run("data_parallel mode on 4 devices", &run, &reference);
}

/// `train.threads_per_rank` lets a rank's large products use more threads, splitting their
/// output only: a GPT wide enough for its products to be split trains bit for bit as on one
/// thread, alone and on 2 ranks.
#[test]
fn threads_inside_a_rank_change_no_bit() {
    let tmp = tempfile::tempdir().unwrap();
    let wide = ["model.hidden=256", "model.ffn_hidden=1024"].map(String::from);
    for (devices, parallel) in [
        (1, "devices = 1".to_string()),
        (2, run_util::semi(2, "model_parallel = 1")),
    ] {
        let run = |threads: usize| {
            let mut overrides = wide.to_vec();
            overrides.push(format!("train.threads_per_rank={threads}"));
            let out = tmp.path().join(format!("{devices}-{threads}"));
            train(&config_with(&out, "adam", "", &parallel, &overrides))
        };
        let one = run(1);
        run_util::assert_bitwise_run(&format!("{devices} rank(s), 2 threads"), &run(2), &one);
    }
    let text = run_util::small_gpt_text(&tmp.path().join("bad"), "adam", "", "devices = 1");
    for (value, rule) in [("0", "out of range"), ("300", "above 256")] {
        let set = [format!("train.threads_per_rank={value}")];
        let err = TrainConfig::parse(&text, None, &set, Path::new("/")).unwrap_err();
        assert!(
            err.to_string().contains("train.threads_per_rank") && err.to_string().contains(rule),
            "{err}"
        );
    }
}

/// The fused attention (`model.fused_attention`) against the
/// unfused ops it replaces, in f64 on one whole GPT: the same loss and every parameter's
/// gradient, from the same parameter values. The packed attention (one `PackedAttention` over
/// the QKV projection's layout, no cut and no transposes) gives `FlashAttention`'s bits.
#[test]
fn fused_attention_gives_the_loss_and_gradients_of_the_unfused_ops() {
    use graph::{grad, Executor};
    use tensor::{DType, Tensor};
    let gpt = |fused: bool, packed: bool| {
        let config = models::GptConfig {
            fused_attention: fused,
            packed_attention: packed,
            // 20 tokens: more than one tile would need 64, so also the odd-size tile edge.
            ..models::GptConfig::new(40, 2, 4, 16, 20, 3)
        };
        let model = models::gpt(&config, DType::F64).unwrap();
        let kinds: Vec<&str> = model.graph.nodes().iter().map(|n| n.op.kind()).collect();
        assert_eq!(kinds.contains(&"FlashAttention"), fused && !packed);
        assert_eq!(kinds.contains(&"PackedAttention"), fused && packed);
        assert_eq!(kinds.contains(&"Transpose"), !(fused && packed));
        assert_eq!(kinds.contains(&"ScaledSoftmax"), !fused);
        model
    };
    let ids = Tensor::from_vec(&[3, 20], (0..60i32).map(|i| i * 7 % 40).collect()).unwrap();
    let labels = Tensor::from_vec(&[3, 20], (0..60i32).map(|i| i * 11 % 40).collect()).unwrap();
    // Runs `model` from the parameter values `start` (by name; drawn when `None`): the loss,
    // the gradients by parameter name, and the parameter values used.
    type Named = Vec<(String, Tensor)>;
    let run = |model: &graph::models::Model, start: Option<&Named>| -> (f64, Named, Named) {
        let params = model.graph.trainable_parameters();
        let training = grad(&model.graph, model.loss, &params).unwrap();
        let mut exec = Executor::new(&training.graph).unwrap();
        exec.init_parameters(5).unwrap();
        let name = |v| model.graph.value(v).unwrap().name.clone();
        if let Some(start) = start {
            for &p in &params {
                let (_, value) = start.iter().find(|(n, _)| *n == name(p)).unwrap();
                *exec.value_mut(p).unwrap() = value.clone();
            }
        }
        exec.set_input(model.input, &ids).unwrap();
        exec.set_input(model.labels, &labels).unwrap();
        exec.run().unwrap();
        let loss = exec.value(model.loss).unwrap().to_f64_vec()[0];
        let grads = training
            .grads
            .iter()
            .map(|&(p, g)| (name(p), exec.value(g).unwrap().clone()))
            .collect();
        let values = params
            .iter()
            .map(|&p| (name(p), exec.value(p).unwrap().clone()))
            .collect();
        (loss, grads, values)
    };
    let (fused_loss, fused_grads, values) = run(&gpt(true, false), None);
    let (packed_loss, packed_grads, _) = run(&gpt(true, true), Some(&values));
    assert_eq!(packed_loss.to_bits(), fused_loss.to_bits());
    for ((name, packed), (_, fused)) in packed_grads.iter().zip(&fused_grads) {
        let bits = |t: &Tensor| {
            t.to_f64_vec()
                .iter()
                .map(|x| x.to_bits())
                .collect::<Vec<_>>()
        };
        assert!(
            bits(packed) == bits(fused),
            "{name}: packed and flash differ"
        );
    }
    let (loss, grads, _) = run(&gpt(false, false), Some(&values));
    assert!(
        (fused_loss - loss).abs() <= 1e-12 * loss.abs(),
        "{fused_loss} vs {loss}"
    );
    assert_eq!(fused_grads.len(), grads.len());
    for ((name, fused), (other, unfused)) in fused_grads.iter().zip(&grads) {
        assert_eq!(name, other);
        let (f, u) = (fused.to_f64_vec(), unfused.to_f64_vec());
        let scale = u.iter().fold(0f64, |m, x| m.max(x.abs()));
        assert!(scale > 0.0, "{name}: no gradient");
        for (i, (a, b)) in f.iter().zip(&u).enumerate() {
            assert!(
                (a - b).abs() <= 1e-10 * scale,
                "{name}[{i}]: fused {a} vs unfused {b}"
            );
        }
    }
}

/// `model.fused_attention` defaults to the fused op without dropout and to the unfused ops
/// with it (the fused op has no attention dropout); either may be asked for by name.
#[test]
fn the_fused_attention_is_the_default_without_dropout() {
    let fused = |overrides: &[&str]| {
        let text = format!(
            "[model]\nname = \"gpt\"\nlayers = 1\nheads = 2\nhidden = 8\nseq_len = 8\n\
             [data]\nformat = \"text\"\npath = \"{}\"\nbatch_size = 2\n\
             [train]\nepochs = 1\noptimizer = \"sgd\"\nlearning_rate = 0.1\n[output]\ndir = \"/tmp\"\n",
            kjv().display()
        );
        let overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
        let config = TrainConfig::parse(&text, None, &overrides, Path::new("/")).unwrap();
        config.model().gpt.as_ref().expect("a GPT").fused_attention
    };
    assert!(fused(&[]));
    assert!(!fused(&["model.dropout=0.1"]));
    assert!(!fused(&["model.fused_attention=false"]));
    assert!(fused(&["model.fused_attention=true"]));
}
