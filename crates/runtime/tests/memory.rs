//! Memory accounting and recompute: every rank's measured peaks by category equal the
//! prediction `--explain` prints; recompute trains the numbers it trains without (and one
//! device's), and lowers the activation peak by the predicted amount; a sharded gradient
//! accumulation holds only the optimizer piece; bad `[parallel.recompute]` values are refused
//! naming the key.

use std::path::Path;

use parallel::memory::MemoryReport;
use runtime::{Session, TrainConfig};

use crate::run_util::{self, adam_gpt, train_report, Run, DP2, DP2_MP2};

/// Trains `config`; every rank's measured memory must equal its prediction. Returns the run
/// and the per-rank reports.
fn train_predicted(what: &str, config: &TrainConfig) -> (Session, Run, Vec<MemoryReport>) {
    let (session, report, run) = train_report(config);
    let measured = report.ranks[0].memory_by_rank.clone();
    assert_eq!(
        measured.len(),
        session.devices(),
        "{what}: a report per rank"
    );
    for (rank, m) in measured.iter().enumerate() {
        let predicted = session.predict_memory(rank).expect("a schedule");
        assert_eq!(*m, predicted, "{what}: rank {rank}'s memory as predicted");
        assert!(m.peaks.activations > 0 && m.peak >= m.peaks.parameters);
    }
    (session, run, measured)
}

/// The prediction holds under data, model, sequence and context parallelism, every hsdp level,
/// gradient accumulation (sharded or not, and under mixed precision, whose accumulation
/// buffers are f32 — or the half type with `gradient_fp32_sync = false`), recompute, and
/// overlapped gradient buckets.
#[test]
fn measured_memory_equals_the_prediction() {
    let tmp = tempfile::tempdir().unwrap();
    let bf16_k2: &[&str] = &[
        "train.precision=\"bf16\"",
        "train.grad_accumulation_steps=2",
    ];
    let cases: [(&str, String, &[&str]); 20] = [
        ("stand-alone", "mode = \"stand_alone\"".to_string(), &[]),
        (
            "cp 2 × mp 2 (Ulysses)",
            "devices = 4\nmode = \"semi_auto\"\ncontext_parallel = 2\nmodel_parallel = 2\n".to_string(),
            &[],
        ),
        ("dp 2", DP2.to_string(), &[]),
        (
            "dp 2 × mp 2, sequence parallel",
            format!("{DP2_MP2}use_seq_parallel = true"),
            &[],
        ),
        (
            "dp 2 × mp 2, hsdp level 3",
            format!("{DP2_MP2}[parallel.hsdp]\noptimizer_level = \"level3\"\nthreshold = 0"),
            &[],
        ),
        (
            "dp 2, hsdp level 1, accumulation",
            format!("{DP2}[parallel.hsdp]\nthreshold = 0"),
            &["train.grad_accumulation_steps=2"],
        ),
        (
            "dp 2 × mp 2, hsdp level 1",
            format!("{DP2_MP2}[parallel.hsdp]\nthreshold = 0"),
            &[],
        ),
        (
            "dp 2, hsdp level 2, accumulation",
            format!("{DP2}[parallel.hsdp]\noptimizer_level = \"level2\"\nthreshold = 0"),
            &["train.grad_accumulation_steps=2"],
        ),
        (
            "dp 2, hsdp zero1, accumulation",
            format!("{DP2}[parallel.hsdp]\noptimizer_level = \"zero1\"\nthreshold = 0"),
            &["train.grad_accumulation_steps=2"],
        ),
        (
            "dp 2 × mp 2, hsdp zero2",
            format!("{DP2_MP2}[parallel.hsdp]\noptimizer_level = \"zero2\"\nthreshold = 0"),
            &[],
        ),
        (
            "dp 2, hsdp level 1, prefetched gathers, recompute",
            format!(
                "{DP2}[parallel.hsdp]\nthreshold = 0\n[parallel.overlap]\ncomputation_allgather_overlap = true\n[parallel.recompute]\ncells = [\"blocks.*\"]"
            ),
            &[],
        ),
        (
            "dp 2, hsdp level 2, recompute",
            format!(
                "{DP2}[parallel.hsdp]\noptimizer_level = \"level2\"\nthreshold = 0\n[parallel.recompute]\ncells = [\"blocks.*\"]"
            ),
            &[],
        ),
        (
            "dp 2, fused and overlapped buckets",
            format!(
                "{DP2}[parallel.comm_fusion]\nallreduce = {{ mode = \"index\", config = [6] }}\n[parallel.overlap]\ngrad_computation_allreduce_overlap = true"
            ),
            &[],
        ),
        (
            "dp 2, hsdp level 3, prefetched gathers, overlapped buckets, recompute",
            format!(
                "{DP2}[parallel.hsdp]\noptimizer_level = \"level3\"\nthreshold = 0\n[parallel.comm_fusion]\n[parallel.overlap]\ncomputation_allgather_overlap = true\ngrad_computation_allreduce_overlap = true\n[parallel.recompute]\ncells = [\"blocks.*\"]"
            ),
            &[],
        ),
        (
            "dp 2 × mp 2, unfused attention, recompute by op",
            format!("{DP2_MP2}[parallel.recompute]\nops = [\"ScaledSoftmax\", \"blocks.*.mlp.fc1.gelu\"]"),
            &["model.fused_attention=false"],
        ),
        (
            "dp 2 × mp 2, fused attention, recompute by op",
            format!("{DP2_MP2}[parallel.recompute]\nops = [\"FlashAttention\", \"blocks.*.mlp.fc1.gelu\"]"),
            &["model.fused_attention=true"],
        ),
        ("bf16, dp 2, accumulation", DP2.to_string(), bf16_k2),
        (
            "bf16, dp 2, accumulation in the half type",
            DP2.to_string(),
            &[
                "train.precision=\"bf16\"",
                "train.grad_accumulation_steps=2",
                "parallel.gradient_fp32_sync=false",
            ],
        ),
        (
            "f16, dp 2 × mp 2, hsdp level 2, accumulation",
            format!("{DP2_MP2}[parallel.hsdp]\noptimizer_level = \"level2\"\nthreshold = 0"),
            &["train.precision=\"f16\"", "train.grad_accumulation_steps=2"],
        ),
        (
            "bf16, one device, micro_batch_interleave 2",
            "mode = \"stand_alone\"\nmicro_batch_interleave = 2".to_string(),
            &["train.precision=\"bf16\""],
        ),
    ];
    let mut gradients = std::collections::BTreeMap::new();
    for (i, (what, parallel, overrides)) in cases.iter().enumerate() {
        let cfg = adam_gpt(
            &tmp.path().join(format!("case-{i}")),
            parallel,
            2,
            overrides,
        );
        let (_, _, measured) = train_predicted(what, &cfg);
        gradients.insert(*what, measured[0].peaks.gradients);
    }
    // bf16 gradients take 2 bytes an element, their f32 accumulation 4 and a half-type one 2:
    // the f32 accumulation holds as many more bytes as the half-type one holds in all.
    let (f32_sums, half_sums) = (
        gradients["bf16, dp 2, accumulation"],
        gradients["bf16, dp 2, accumulation in the half type"],
    );
    assert_eq!(f32_sums * 2, half_sums * 3, "{gradients:?}");
}

/// Pipelined steps: every rank's measured peaks equal the prediction from its stage's
/// schedule (buffers allocated for good, plus the micro-batch sums and one copy of a
/// micro-batch's buffers per micro-batch held at once); GPipe holds all M micro-batches where
/// 1F1B and zero bubble hold P − s, so its activation peak is the larger.
#[test]
fn pipelined_memory_equals_the_prediction() {
    let tmp = tempfile::tempdir().unwrap();
    let pipeline = |scheduler: &str, mp: usize| {
        format!(
            "devices = {}\nmode = \"semi_auto\"\nmodel_parallel = {mp}\n[parallel.pipeline]\nstages = 2\nmicro_batches = 4\nscheduler = \"{scheduler}\"",
            2 * mp
        )
    };
    let mut activations = std::collections::BTreeMap::new();
    for (scheduler, mp, precision) in [
        ("gpipe", 1, "f32"),
        ("1f1b", 1, "f32"),
        ("zero_bubble", 1, "f32"),
        ("1f1b", 2, "f32"),
        // Half precision: the micro-batch sums of the bf16 gradients are f32.
        ("1f1b", 2, "bf16"),
    ] {
        let what = format!("2 stages, {scheduler}, mp {mp}, {precision}");
        let out = tmp.path().join(what.replace([' ', ','], "_"));
        let set = format!("train.precision=\"{precision}\"");
        let (_, _, measured) =
            train_predicted(&what, &adam_gpt(&out, &pipeline(scheduler, mp), 2, &[&set]));
        if precision != "f32" {
            continue;
        }
        if mp == 1 {
            activations.insert(scheduler, measured[0].peaks.activations);
        }
    }
    assert!(
        activations["gpipe"] > activations["1f1b"],
        "{activations:?}"
    );
    assert!(
        activations["zero_bubble"] >= activations["1f1b"],
        "{activations:?}"
    );
}

/// Recompute by cell, by op, with and without `mp_comm_recompute`, and under hsdp levels 3
/// and 1 with `parallel_optimizer_comm_recompute` (and level 1 without it): 20 steps train bitwise the numbers the same
/// strategy trains without recompute (the same kernels run again on the same inputs) and one
/// device's within 1e-4; the activation peak falls, by exactly the predicted amount.
#[test]
fn recompute_trains_the_same_numbers_with_fewer_activations() {
    let tmp = tempfile::tempdir().unwrap();
    let steps = 20;
    let (_, reference) = run_util::train_steps(
        &adam_gpt(&tmp.path().join("sa"), "mode = \"stand_alone\"", steps, &[]),
        steps,
    );
    let level3 = "[parallel.hsdp]\noptimizer_level = \"level3\"\nthreshold = 0\n";
    let level1 = "[parallel.hsdp]\noptimizer_level = \"level1\"\nthreshold = 0\n";
    let cases = [
        ("dp 2 × mp 2", DP2_MP2, "", "cells = [\"blocks.*\"]"),
        (
            "dp 2 × mp 2, no mp_comm_recompute",
            DP2_MP2,
            "",
            "cells = [\"blocks.*\"]\nmp_comm_recompute = false",
        ),
        (
            "dp 2 × mp 2, by op",
            DP2_MP2,
            "",
            "ops = [\"blocks.*.attn.*\", \"GeLU\"]",
        ),
        (
            "dp 2, level 3",
            DP2,
            level3,
            "cells = [\"blocks.*\"]\nparallel_optimizer_comm_recompute = true",
        ),
        ("dp 2, level 1", DP2, level1, "cells = [\"blocks.*\"]"),
        (
            "dp 2, level 1, parallel_optimizer_comm_recompute",
            DP2,
            level1,
            "cells = [\"blocks.*\"]\nparallel_optimizer_comm_recompute = true",
        ),
        (
            "stand-alone",
            "mode = \"stand_alone\"\n",
            "",
            "cells = [\"blocks.*.mlp\"]",
        ),
    ];
    for (i, (what, base, extra, recompute)) in cases.iter().enumerate() {
        let plain = format!("{base}{extra}");
        let with = format!("{plain}[parallel.recompute]\n{recompute}\n");
        let (_, off, off_memory) = train_predicted(
            what,
            &adam_gpt(&tmp.path().join(format!("off-{i}")), &plain, steps, &[]),
        );
        let (session, on, on_memory) = train_predicted(
            what,
            &adam_gpt(&tmp.path().join(format!("on-{i}")), &with, steps, &[]),
        );
        let recomputed = session
            .train
            .steps
            .iter()
            .filter(|s| matches!(s, parallel::Step::Kernel(k) if k.recompute))
            .count();
        assert!(recomputed > 0, "{what}: some op is recomputed");
        run_util::assert_bitwise_run(what, &on, &off);
        assert_eq!(on.0.len(), steps);
        run_util::assert_losses_within(what, &on.0, &reference, 1e-4);
        for (rank, (on, off)) in on_memory.iter().zip(&off_memory).enumerate() {
            assert!(
                on.peaks.activations < off.peaks.activations,
                "{what}: rank {rank}'s activations {} not below {}",
                on.peaks.activations,
                off.peaks.activations
            );
        }
    }
}

/// Under hsdp level 1 the backward pass reads the weight gathered for the forward pass: with
/// recompute, a recomputed op gathers the weight again only with
/// `parallel_optimizer_comm_recompute`; level 3 gathers again for the backward pass anyway.
#[test]
fn level1_gathers_again_only_for_recompute_when_asked() {
    let tmp = tempfile::tempdir().unwrap();
    let gathers = |level: &str, recompute: &str| {
        let parallel = format!(
            "{DP2}[parallel.hsdp]\noptimizer_level = \"{level}\"\nthreshold = 0\n{recompute}"
        );
        let session = Session::new(&adam_gpt(tmp.path(), &parallel, 1, &[])).unwrap();
        let pieces: Vec<usize> = session
            .train
            .params
            .iter()
            .filter(|p| p.optimizer_shard().is_some())
            .map(|p| p.buffer)
            .collect();
        assert!(!pieces.is_empty(), "{level}: some weight in pieces");
        session
            .train
            .steps
            .iter()
            .filter(|s| matches!(s, parallel::Step::Reshard(r) if pieces.contains(&r.from)))
            .count()
    };
    let cells = "[parallel.recompute]\ncells = [\"blocks.*\"]\n";
    let plain = gathers("level1", "");
    assert_eq!(
        gathers("level1", cells),
        plain,
        "the forward gathers serve recompute"
    );
    let again = format!("{cells}parallel_optimizer_comm_recompute = true\n");
    assert!(gathers("level1", &again) > plain, "recompute gathers again");
    assert!(
        gathers("level3", "") > plain,
        "level 3 gathers again for the backward pass"
    );
}

/// With hsdp `zero1` and gradient accumulation, `gradient_accumulation_shard` (the default)
/// keeps only the optimizer piece of each sharded gradient's accumulation: the gradient bytes
/// fall by the sharded parameters' (n − 1)/n, and the numbers are the unsharded accumulation's.
#[test]
fn sharded_accumulation_holds_the_piece_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let run = |name: &str, shard: bool| {
        let parallel = format!(
            "{DP2}[parallel.hsdp]\noptimizer_level = \"zero1\"\nthreshold = 0\ngradient_accumulation_shard = {shard}"
        );
        let cfg = adam_gpt(
            &tmp.path().join(name),
            &parallel,
            6,
            &["train.grad_accumulation_steps=3"],
        );
        train_predicted(name, &cfg)
    };
    let (session, whole, whole_memory) = run("whole", false);
    let (_, sharded, sharded_memory) = run("sharded", true);
    run_util::assert_same_run("sharded accumulation", &sharded, &whole, 1e-6);
    let sharded_bytes: usize = session
        .train
        .params
        .iter()
        .filter(|p| p.optimizer_shard().is_some())
        .map(|p| p.layout.n_elements() * 4)
        .sum();
    assert!(sharded_bytes > 0);
    for (w, s) in whole_memory.iter().zip(&sharded_memory) {
        assert_eq!(
            w.peaks.gradients - s.peaks.gradients,
            sharded_bytes / 2,
            "half of each sharded parameter's accumulation is not held"
        );
    }
}

/// MindSpore's level 1 accumulates the whole gradient, level 2 only each rank's piece
/// (`grad_accumulation_shard`), both with the weights in pieces: on 2 data-parallel ranks with
/// every parameter sharded, level 1's gradient peak holds the sharded parameters' whole
/// gradient twice (the program's gradient, all-reduced at every micro step, and its
/// accumulation), level 2's their halves (reduce-scattered at every micro step, accumulated as
/// pieces): Ψₛ apart. Both hold half of every sharded weight, and train the same numbers.
#[test]
fn level2_accumulates_the_piece_level1_the_whole_gradient() {
    let tmp = tempfile::tempdir().unwrap();
    let run = |level: &str| {
        let parallel =
            format!("{DP2}[parallel.hsdp]\noptimizer_level = \"{level}\"\nthreshold = 0");
        let cfg = adam_gpt(
            &tmp.path().join(level),
            &parallel,
            6,
            &["train.grad_accumulation_steps=3"],
        );
        train_predicted(level, &cfg)
    };
    let (session, level1, level1_memory) = run("level1");
    let (_, level2, level2_memory) = run("level2");
    run_util::assert_same_run("level 2 against level 1", &level2, &level1, 1e-6);
    let sharded_bytes: usize = session
        .train
        .params
        .iter()
        .filter(|p| p.optimizer_shard().is_some())
        .map(|p| p.layout.n_elements() * 4)
        .sum();
    assert!(sharded_bytes > 0);
    for (rank, (one, two)) in level1_memory.iter().zip(&level2_memory).enumerate() {
        assert_eq!(
            one.peaks.gradients - two.peaks.gradients,
            sharded_bytes,
            "rank {rank}: level 1 holds the whole gradient and its whole accumulation"
        );
        assert_eq!(
            one.peaks.parameters, two.peaks.parameters,
            "rank {rank}: both hold the weights in pieces"
        );
    }
}

/// Bad `[parallel.recompute]` values are refused naming the key and the rule: a wrong type or
/// an unknown key when the config is read, a glob that matches nothing when the session builds.
#[test]
fn bad_recompute_settings_name_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    let read_cases = [
        (
            "cells = \"blocks.*\"",
            "parallel.recompute.cells",
            "a list of name globs",
        ),
        ("cells = [\"\"]", "parallel.recompute.cells[0]", "non-empty"),
        (
            "mp_comm_recompute = 1",
            "parallel.recompute.mp_comm_recompute",
            "bool",
        ),
        (
            "every_layer = true",
            "parallel.recompute.every_layer",
            "unknown key",
        ),
    ];
    for (body, key, rule) in read_cases {
        let text = format!("{DP2}[parallel.recompute]\n{body}\n");
        let message = config_error(&text, tmp.path());
        assert!(
            message.contains(key) && message.contains(rule),
            "{body}: {message}"
        );
    }
    let build_cases = [
        (
            "cells = [\"block.*\"]",
            "recompute.cells",
            "matches no cell",
        ),
        ("ops = [\"NoSuchOp\"]", "recompute.ops", "matches no op"),
    ];
    for (body, key, rule) in build_cases {
        let text = format!("{DP2}[parallel.recompute]\n{body}\n");
        let message = Session::new(&adam_gpt(tmp.path(), &text, 1, &[]))
            .expect_err("the session refuses it")
            .to_string();
        assert!(
            message.contains(key) && message.contains(rule),
            "{body}: {message}"
        );
    }
}

/// The error of reading the small GPT config with `[parallel]` body `parallel`.
fn config_error(parallel: &str, out: &Path) -> String {
    let text = format!(
        "[model]\nname = \"gpt\"\nlayers = 2\nheads = 8\nhidden = 32\nseq_len = 16\n[data]\nformat = \"text\"\npath = \"{}\"\nbatch_size = 8\n[parallel]\n{parallel}\n[train]\nepochs = 1\noptimizer = \"adam\"\nlearning_rate = 0.01\n[output]\ndir = \"{}\"\n",
        run_util::kjv().display(),
        out.display()
    );
    TrainConfig::parse(&text, None, &[], Path::new("/"))
        .expect_err("the config is refused")
        .to_string()
}

/// `tessera plan`'s activation estimate (`runtime::plan`, the figure the searches keep under
/// the memory budget) covers the activation peak `--explain` predicts, and is not far above
/// it: the forward outputs the backward reads plus the gradients written before their sum.
/// Counting every forward output, as the searches did, put it at 1.7–2× the peak on the GPT
/// and counting no gradient before its sum put the data-parallel MLP at 1/60 of it.
#[test]
fn the_plans_activation_estimate_brackets_the_predicted_peak() {
    let tmp = tempfile::tempdir().unwrap();
    let out = |what: &str| tmp.path().join(what);
    let cases: [(&str, TrainConfig); 5] = [
        (
            "gpt, one device",
            adam_gpt(&out("a"), "mode = \"stand_alone\"", 1, &[]),
        ),
        ("gpt, dp 2", adam_gpt(&out("b"), DP2, 1, &[])),
        ("gpt, dp 2 × mp 2", adam_gpt(&out("c"), DP2_MP2, 1, &[])),
        (
            "mlp, dp 4",
            run_util::seed_mlp(
                &out("d"),
                "momentum",
                "devices = 4\nmode = \"data_parallel\"",
                &[],
            ),
        ),
        (
            "mlp, one device",
            run_util::seed_mlp(&out("e"), "momentum", "mode = \"stand_alone\"", &[]),
        ),
    ];
    for (what, config) in cases {
        let planned = runtime::plan(&config)
            .expect("a plan")
            .cost
            .memory
            .activations;
        let session = Session::new(&config).expect("the session builds");
        let peak = session
            .predict_memory(0)
            .expect("a schedule")
            .peaks
            .activations as f64;
        let ratio = planned / peak;
        assert!(
            (0.6..=1.6).contains(&ratio),
            "{what}: planned activations {planned} B against a predicted peak of {peak} B ({ratio:.2}×)"
        );
    }
}
