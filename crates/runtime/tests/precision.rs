//! Mixed precision (`train.precision`, `train.loss_scale`, the f32 reduction switches): bf16
//! and f16 training follow the f32 loss curve within 5 % per step, on one device and under
//! data parallelism; the weights and activations take half the bytes, as predicted; an f16
//! loss scale that overflows skips every step on every rank; bad values are refused; steps
//! split into micro-batches (gradient accumulation, `micro_batch_interleave`, pipeline
//! micro-batches) train like the unsplit batch.

use std::path::Path;

use runtime::{Session, TrainConfig};

use crate::run_util::{self, adam_gpt, train_report, Run, DP2, DP2_MP2};

const SA: &str = "mode = \"stand_alone\"";

/// The documented tolerance: each step's loss within 5 % of the f32 run's (this small GPT at
/// learning rate 0.01 drifts most: measured worst 2.7 % in bf16, 4.5 % in f16).
const TOLERANCE: f32 = 5e-2;

/// bf16 and f16 (dynamic loss scale) on one device, data parallel 2 (with fp32 gradient sync
/// and without) and dp 2 × mp 2 (every sum in f32): 20 steps within 5 % of f32's losses, and
/// not bitwise f32's (the model really computes in half precision).
#[test]
fn half_precision_follows_the_f32_curve() {
    let tmp = tempfile::tempdir().unwrap();
    let steps = 20;
    let (_, reference) =
        run_util::train_steps(&adam_gpt(&tmp.path().join("f32"), SA, steps, &[]), steps);
    let cases: [(&str, &str, &[&str]); 6] = [
        ("bf16, one device", SA, &["train.precision=\"bf16\""]),
        ("f16, one device", SA, &["train.precision=\"f16\""]),
        ("bf16, dp 2", DP2, &["train.precision=\"bf16\""]),
        (
            "bf16, dp 2, half-precision gradient sums",
            DP2,
            &[
                "train.precision=\"bf16\"",
                "parallel.gradient_fp32_sync=false",
            ],
        ),
        (
            "bf16, dp 2 × mp 2, f32 communication",
            DP2_MP2,
            &[
                "train.precision=\"bf16\"",
                "parallel.enable_fp32_communication=true",
            ],
        ),
        (
            "f16 with a static scale, dp 2",
            DP2,
            &["train.precision=\"f16\"", "train.loss_scale=1024"],
        ),
    ];
    for (i, (what, parallel, overrides)) in cases.iter().enumerate() {
        let cfg = adam_gpt(
            &tmp.path().join(format!("case-{i}")),
            parallel,
            steps,
            overrides,
        );
        let (_, losses) = run_util::train_steps(&cfg, steps);
        run_util::assert_losses_within(what, &losses, &reference, TOLERANCE);
        assert_ne!(losses, reference, "{what}: computed in half precision");
    }
}

/// bf16 weights and gradients take half of f32's bytes and the activations less (the logits
/// stay f32 for the loss); the optimizer keeps f32 state and an f32 master piece (Adam: 3 × 4
/// bytes per element instead of 2 × 4); every figure as predicted.
#[test]
fn half_precision_halves_weights_and_activations() {
    let tmp = tempfile::tempdir().unwrap();
    let run = |name: &str, precision: &str| {
        let set = format!("train.precision=\"{precision}\"");
        let cfg = adam_gpt(&tmp.path().join(name), DP2, 2, &[&set]);
        let (session, report, _) = train_report(&cfg);
        let m = report.ranks[0].memory_by_rank[0];
        assert_eq!(
            Some(m),
            session.predict_memory(0),
            "{precision}: as predicted"
        );
        m
    };
    let f32 = run("f32", "f32");
    let bf16 = run("bf16", "bf16");
    assert_eq!(bf16.peaks.parameters * 2, f32.peaks.parameters);
    assert_eq!(bf16.peaks.gradients * 2, f32.peaks.gradients);
    assert_eq!(bf16.peaks.optimizer * 2, f32.peaks.optimizer * 3);
    // Less than f32's, not half: the logits are cast to f32 for the loss.
    assert!(bf16.peaks.activations < f32.peaks.activations);
}

/// An f16 loss scale so large that every gradient overflows: every rank skips every step, so
/// the merged weights are the initial ones; the loss is still reported.
/// A resumed mixed-precision run continues from the saved f32 master weights: 2 steps, a
/// checkpoint, 2 more steps train bitwise the 4 steps of one run, with whole and with
/// hsdp-sharded masters (weights in pieces under level 1, whole under zero1); a bf16 run resumed from an f32 checkpoint takes its weights as masters.
#[test]
fn a_half_precision_resume_continues_from_the_f32_masters() {
    let tmp = tempfile::tempdir().unwrap();
    let bf16 = "train.precision=\"bf16\"";
    let level1 = format!("{DP2}[parallel.hsdp]\nthreshold = 0");
    let zero1 = format!("{DP2}[parallel.hsdp]\noptimizer_level = \"zero1\"\nthreshold = 0");
    for (what, parallel) in [
        ("dp 2", DP2.to_string()),
        ("dp 2, hsdp level 1", level1),
        ("dp 2, hsdp zero1", zero1),
    ] {
        let dir = tmp.path().join(what.replace([' ', ','], "_"));
        let whole = adam_gpt(&dir.join("whole"), &parallel, 4, &[bf16]);
        let (_, _, reference) = run_util::train_report(&whole);
        let first = adam_gpt(&dir.join("first"), &parallel, 2, &[bf16]);
        run_util::train_steps(&first, 2);
        let from = format!("output.resume_from=\"{}\"", dir.join("first").display());
        let resumed = adam_gpt(&dir.join("resumed"), &parallel, 4, &[bf16, &from]);
        let (_, _, run) = run_util::train_report(&resumed);
        assert_eq!(
            run.0[..],
            reference.0[2..],
            "{what}: losses of steps 3 and 4"
        );
        assert_eq!(
            run.1, reference.1,
            "{what}: weights and masters after step 4"
        );
    }
    // From an f32 checkpoint: the masters are its weights. A resume must train a step (one
    // with nothing left is refused), so the step runs at learning rate 1e-30, which moves no
    // master by more than 1e-29.
    let first = adam_gpt(&tmp.path().join("f32"), DP2, 2, &[]);
    let (session, _) = run_util::train_steps(&first, 2);
    let from = format!(
        "output.resume_from=\"{}\"",
        tmp.path().join("f32").display()
    );
    let resumed = adam_gpt(
        &tmp.path().join("from-f32"),
        DP2,
        3,
        &[bf16, &from, "train.learning_rate=1e-30"],
    );
    run_util::train_steps(&resumed, 1);
    let names: Vec<String> = run_util::param_names(&session)
        .into_iter()
        .map(|n| format!("master_weight.{n}"))
        .collect();
    let masters = run_util::merged_params(&tmp.path().join("from-f32"), &names);
    let weights =
        run_util::merged_params(&tmp.path().join("f32"), &run_util::param_names(&session));
    for ((name, m), (_, w)) in masters.iter().zip(&weights) {
        assert_eq!(m.len(), w.len(), "{name}");
        for (a, b) in m.iter().zip(w) {
            assert!(
                (a - b).abs() <= 1e-29,
                "{name}: the f32 weights became the masters"
            );
        }
    }
}

/// A loss scale so large that every step overflows skips every update, and the run then fails
/// naming `train.loss_scale` instead of saving parameters that never moved (issue 30, item 6).
#[test]
fn an_overflowing_loss_scale_fails_the_run_and_saves_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let skip = ["train.precision=\"f16\"", "train.loss_scale=1e30"];
    let out = tmp.path().join("skip");
    let session = runtime::Session::new(&adam_gpt(&out, DP2, 3, &skip)).unwrap();
    let err = runtime::train_local(&session, &runtime::LaunchOptions::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("train.loss_scale"), "{err}");
    assert!(
        err.contains("every one of the run's 3 steps was skipped"),
        "{err}"
    );
    assert!(
        !out.join("strategy.json").exists(),
        "no checkpoint is written"
    );
}

/// Bad precision settings are refused naming the key.
#[test]
fn bad_precision_settings_name_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    for (set, key) in [
        ("train.precision=\"fp8\"", "train.precision"),
        ("train.loss_scale=0.5", "train.loss_scale"),
        ("train.loss_scale=\"auto\"", "train.loss_scale"),
        (
            "parallel.gradient_fp32_sync=1",
            "parallel.gradient_fp32_sync",
        ),
    ] {
        let text = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/gpt_kjv.toml"),
        )
        .unwrap();
        let err = TrainConfig::parse(&text, None, &[set.to_string()], tmp.path())
            .expect_err(set)
            .to_string();
        assert!(err.contains(key), "{set}: {err}");
    }
    let seed = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/seed_stand_alone.toml"),
    )
    .unwrap();
    let cfg = TrainConfig::parse(
        &seed,
        None,
        &["train.precision=\"bf16\"".to_string()],
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../..")
            .as_path(),
    )
    .unwrap();
    let err = Session::new(&cfg)
        .expect_err("the MLP trains in f32")
        .to_string();
    assert!(err.contains("train.precision"), "{err}");
}

/// bf16 and f16 train with the vocabulary-parallel loss (`vocab_emb_dp = false`, whose one-hot
/// and divisor follow the f32 logits), within the documented tolerance of f32; and half
/// precision trains in deterministic mode, which builds that loss on every device count, the
/// same bits on every run.
#[test]
fn half_precision_trains_with_the_vocabulary_parallel_loss() {
    let tmp = tempfile::tempdir().unwrap();
    let steps = 8;
    let vocab = "devices = 2\nmode = \"semi_auto\"\nmodel_parallel = 2\nvocab_emb_dp = false\n";
    let (_, reference) =
        run_util::train_steps(&adam_gpt(&tmp.path().join("f32"), SA, steps, &[]), steps);
    let det = "train.deterministic=true";
    let cases: [(&str, &str, &[&str]); 4] = [
        (
            "bf16, vocabulary parallel",
            vocab,
            &["train.precision=\"bf16\""],
        ),
        (
            "f16, vocabulary parallel",
            vocab,
            &["train.precision=\"f16\""],
        ),
        (
            "bf16, deterministic",
            SA,
            &["train.precision=\"bf16\"", det],
        ),
        ("f16, deterministic", SA, &["train.precision=\"f16\"", det]),
    ];
    for (i, (what, parallel, overrides)) in cases.iter().enumerate() {
        let out = tmp.path().join(format!("case-{i}"));
        let (_, _, run) = train_report(&adam_gpt(&out, parallel, steps, overrides));
        run_util::assert_losses_within(what, &run.0, &reference, TOLERANCE);
        assert_ne!(run.0, reference, "{what}: computed in half precision");
        if overrides.contains(&det) {
            let again = tmp.path().join(format!("again-{i}"));
            let (_, _, rerun) = train_report(&adam_gpt(&again, parallel, steps, overrides));
            run_util::assert_bitwise_run(what, &rerun, &run);
        }
    }
}

/// Half precision in deterministic mode on more than one device is refused before training,
/// naming `train.precision` (each rank's partial sums round to the half type, which one device
/// never does, so the run could not be bitwise one device's).
#[test]
fn half_precision_deterministic_on_several_devices_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    for precision in ["train.precision=\"bf16\"", "train.precision=\"f16\""] {
        for parallel in [DP2, DP2_MP2] {
            let config = adam_gpt(
                tmp.path(),
                parallel,
                2,
                &[precision, "train.deterministic=true"],
            );
            let err = Session::new(&config).unwrap_err().to_string();
            assert!(
                err.contains("train.precision") && err.contains("one device"),
                "{precision}: {err}"
            );
        }
    }
}

/// One rank's row of the input in [`half_type_gradient_sums`]: column 0 is 1 on rank 0 and
/// `3/8` of the half type's ulp at 1 on the others (alone below half an ulp, so adding it to 1
/// in the half type changes nothing, while two or three of them added in f32 round `1 + …` up),
/// column 1 the same with the 1 on the last rank (`small ⊕ small ⊕ … ⊕ 1`: the small values
/// first add up, so both sums round up), the other columns inexact values over four decades.
fn half_sum_input_row(dtype: tensor::DType, rank: usize, n: usize, columns: usize) -> Vec<f64> {
    let ulp = if dtype == tensor::DType::BF16 {
        2f64.powi(-7)
    } else {
        2f64.powi(-10)
    };
    (0..columns)
        .map(|c| match c {
            0 | 1 if rank == c * (n - 1) => 1.0,
            0 | 1 => 0.375 * ulp,
            _ => {
                let k = rank * 7 + c * 3;
                let x = (1.0 + (k % 13) as f64) / 17.0 * 10f64.powi((k % 4) as i32 - 2);
                if k.is_multiple_of(3) {
                    -x
                } else {
                    x
                }
            }
        })
        .map(|x| half_round(dtype, x))
        .collect()
}

/// `x` rounded to `dtype`.
fn half_round(dtype: tensor::DType, x: f64) -> f64 {
    tensor::Tensor::from_vec(&[1], vec![x])
        .unwrap()
        .to_dtype(dtype)
        .to_f64_vec()[0]
}

/// `parallel.gradient_fp32_sync` on the gradients' sums over data-parallel ranks, computed by
/// hand. The graph `loss = Σ (x·w1 + x·w2)` with one batch row of `x` per rank makes each
/// rank's gradient of `w1` and `w2` (`[12, 2]`) its own row of `x` (the same row for every
/// output column), so the summed gradient is the sum over ranks of their rows. On 3 and 4
/// data-parallel ranks, in bf16 and f16, for the plain all-reduce, a fused bucket
/// (`[parallel.comm_fusion]`) and hsdp zero2's reduce-scatter: with `gradient_fp32_sync =
/// true` each element is the f32 sum rounded once to the half type; with `false` it is the sum
/// in the half type in rank order, rounded after every addition; the two differ.
#[test]
fn half_type_gradient_sums() {
    use std::sync::Arc;

    use comm::{Communicator, LocalCluster};
    use graph::{GraphBuilder, Initializer};
    use parallel::{lower, place, HsdpConfig, LowerRequest, OptimizerLevel, ParallelConfig};
    use runtime::RankExecutor;
    use tensor::{DType, Tensor};

    let (columns, outputs) = (12, 2);
    for dtype in [DType::BF16, DType::F16] {
        for n in [3usize, 4] {
            let rows: Vec<Vec<f64>> = (0..n)
                .map(|r| half_sum_input_row(dtype, r, n, columns))
                .collect();
            let by_hand = |fp32_sync: bool| -> Vec<f64> {
                (0..columns)
                    .map(|c| match fp32_sync {
                        // Exact in f64 (a few values of 8 or 11 bits over four decades).
                        true => half_round(dtype, rows.iter().map(|row| row[c]).sum()),
                        false => rows[1..]
                            .iter()
                            .fold(rows[0][c], |acc, row| half_round(dtype, acc + row[c])),
                    })
                    // The gradient of w[c][j] is the sum of x[.][c], for each of the j columns.
                    .flat_map(|g| std::iter::repeat_n(g, outputs))
                    .collect()
            };
            let (f32_once, in_type) = (by_hand(true), by_hand(false));
            assert_ne!(
                f32_once, in_type,
                "{dtype} on {n}: the values tell the two apart"
            );
            let mut b = GraphBuilder::with_float_dtype(dtype);
            let x = b.input("x", &[n, columns], dtype).unwrap();
            let init = Initializer::normal(1.0);
            let w1 = b
                .parameter("w1", &[columns, outputs], init.clone())
                .unwrap();
            let w2 = b.parameter("w2", &[columns, outputs], init).unwrap();
            let y1 = b.matmul("m1", x, w1).unwrap();
            let y2 = b.matmul("m2", x, w2).unwrap();
            let y = b.add("y", y1, y2).unwrap();
            let loss = b.reduce_sum("loss", y, &[], false).unwrap();
            let graph = b.finish();
            let training = graph::grad(&graph, loss, &[w1, w2]).unwrap();
            let request = LowerRequest {
                grads: vec![
                    (w1, training.grad_of(w1).unwrap()),
                    (w2, training.grad_of(w2).unwrap()),
                ],
                replicated_outputs: vec![loss],
            };
            let dp: &[&[usize]] = &[&[n, 1], &[1, 1]];
            let base = ParallelConfig::new(parallel::ParallelMode::SemiAuto, n)
                .shard("m1", dp)
                .shard("m2", dp);
            let variants: [(&str, ParallelConfig); 3] = [
                ("all-reduce", base.clone()),
                (
                    "fused bucket",
                    ParallelConfig {
                        comm_fusion: Some(parallel::fusion::CommFusionConfig::default()),
                        ..base.clone()
                    },
                ),
                (
                    "hsdp zero2 reduce-scatter (whole weights, gradient pieces)",
                    ParallelConfig {
                        hsdp: Some(HsdpConfig {
                            threshold_kb: 0,
                            level: OptimizerLevel::Zero2,
                            ..HsdpConfig::default()
                        }),
                        ..base.clone()
                    },
                ),
            ];
            for (what, config) in variants {
                for (fp32_sync, want) in [(true, &f32_once), (false, &in_type)] {
                    let config = ParallelConfig {
                        gradient_fp32_sync: fp32_sync,
                        ..config.clone()
                    };
                    let placed = place(&training.graph, &config).unwrap();
                    let program = Arc::new(lower(&placed, &request).unwrap());
                    let label =
                        format!("{dtype} on {n} ranks, {what}, gradient_fp32_sync = {fp32_sync}");
                    if what == "fused bucket" {
                        assert!(!program.buckets.is_empty(), "{label}: no bucket");
                    }
                    let results = LocalCluster::new(n).unwrap().run(|comm| {
                        let rank = comm.rank();
                        let world: Arc<dyn Communicator> = Arc::new(comm);
                        let mut exec = RankExecutor::new(program.clone(), world).unwrap();
                        exec.init_parameters(5).unwrap();
                        let row = Tensor::from_vec(&[1, columns], rows[rank].clone())
                            .unwrap()
                            .to_dtype(dtype);
                        exec.set_input(0, &row).unwrap();
                        exec.run().unwrap();
                        (0..program.params.len())
                            .map(|i| {
                                let piece = exec.optimizer_piece(i).param_offset;
                                (piece, exec.grad(i).unwrap().to_f64_vec())
                            })
                            .collect::<Vec<_>>()
                    });
                    for (rank, grads) in results.into_iter().enumerate() {
                        for (i, (offset, grad)) in grads.unwrap().into_iter().enumerate() {
                            assert_eq!(
                                grad,
                                want[offset..offset + grad.len()],
                                "{label}: rank {rank}, the gradient of w{}",
                                i + 1
                            );
                        }
                    }
                }
            }
        }
    }
}

/// `parallel.gradient_fp32_sync` in training: bf16 on 4 data-parallel devices, 4 steps. With
/// `false` the gradients' sums add in bf16 (see [`half_type_gradient_sums`] for the sums
/// themselves): the parameters differ from `true`'s, the losses stay within the documented
/// tolerance of f32's, and every path a gradient sum can take — the plain all-reduce, a fused
/// bucket, a fused bucket reduced while the backward pass goes on, hsdp level 2's
/// reduce-scatter — gives the same bits, as they do with `true`.
#[test]
fn gradient_fp32_sync_false_sums_gradients_in_the_half_type_on_every_path() {
    let tmp = tempfile::tempdir().unwrap();
    let steps = 4;
    let dp4 = "devices = 4\nmode = \"semi_auto\"\nmodel_parallel = 1\n";
    let (_, reference) =
        run_util::train_steps(&adam_gpt(&tmp.path().join("f32"), SA, steps, &[]), steps);
    let paths = [
        ("all-reduce", String::new()),
        ("fused", "[parallel.comm_fusion]\n".to_string()),
        (
            "fused, overlapped",
            "[parallel.comm_fusion]\n[parallel.overlap]\ngrad_computation_allreduce_overlap = true\n"
                .to_string(),
        ),
        (
            "hsdp level 2",
            "[parallel.hsdp]\noptimizer_level = \"level2\"\nthreshold = 0\n".to_string(),
        ),
    ];
    let mut by_switch = Vec::new();
    for sync in ["true", "false"] {
        let set = format!("parallel.gradient_fp32_sync={sync}");
        let mut runs: Vec<(&str, run_util::Run)> = paths
            .iter()
            .map(|(what, keys)| {
                let out = tmp
                    .path()
                    .join(format!("{sync}-{}", what.replace([' ', ','], "_")));
                let overrides = ["train.precision=\"bf16\"", set.as_str()];
                let cfg = adam_gpt(&out, &format!("{dp4}{keys}"), steps, &overrides);
                (*what, train_report(&cfg).2)
            })
            .collect();
        for (what, run) in &runs {
            let what = format!("gradient_fp32_sync = {sync}, {what}");
            run_util::assert_losses_within(&what, &run.0, &reference, TOLERANCE);
            run_util::assert_bitwise_run(&what, run, &runs[0].1);
        }
        by_switch.push(runs.swap_remove(0).1);
    }
    let differ = by_switch[0]
        .1
        .iter()
        .zip(&by_switch[1].1)
        .filter(|((_, a), (_, b))| a != b)
        .count();
    assert!(
        differ > 0,
        "gradient_fp32_sync = false trained bitwise like true"
    );
}

/// Tolerance between a half-precision run whose steps are split into micro-batches and the
/// same precision on the unsplit batch (each step's loss, relative). Both add the same samples'
/// gradients, but the split run rounds each micro-batch's gradient (its sum over the
/// micro-batch's rows, and every half-precision activation gradient on the way) to the half
/// type before the micro-batches are added in f32, where the unsplit run rounds the whole
/// batch's sums once: the gradients differ by about the half type's rounding unit (bf16 2⁻⁸,
/// f16 2⁻¹¹ relative), which Adam's steps carry into the weights from step 2 on, and a loss
/// averages that over every token. Measured worst over 8 steps of the test GPT: 1.7e-4 in
/// bf16, 5.5e-5 in f16 (bf16 with half-type sums 1.3e-4). 1e-3 leaves a 6× margin and is a
/// quarter of bf16's rounding unit (3.9e-3); half precision against f32 differs by up to
/// 4.5e-2 ([`TOLERANCE`]).
const MICRO_BATCH_TOLERANCE: f32 = 1e-3;

/// bf16 and f16 with a step split into micro-batches (E1 of the probe: every such run crashed
/// at step 1): `train.grad_accumulation_steps = 2` of half the batch and
/// `parallel.micro_batch_interleave = 2`, on one device and under data parallel 2, each train
/// 8 steps within [`MICRO_BATCH_TOLERANCE`] of the same precision on the unsplit batch. The
/// interleaved parts add the same micro-batch gradients in the same order and arithmetic as
/// accumulation, so each interleaved run is bitwise its accumulating run — in deterministic
/// mode too, where half precision runs on one device (more devices are refused, see
/// [`half_precision_deterministic_on_several_devices_is_refused`]), and then bitwise again on
/// a second run.
#[test]
fn half_precision_accumulates_micro_batches_like_the_unsplit_batch() {
    let tmp = tempfile::tempdir().unwrap();
    let steps = 8;
    let det = "train.deterministic=true";
    for precision in ["bf16", "f16"] {
        let run = |name: &str, parallel: &str, extra: &[&str]| {
            half_precision_run(tmp.path(), precision, steps, (name, parallel, extra))
        };
        let reference = run("unsplit", SA, &[]);
        let accumulate = ["data.batch_size=4", "train.grad_accumulation_steps=2"];
        let interleave = |parallel: &str| format!("{parallel}\nmicro_batch_interleave = 2\n");
        for (what, parallel, extra) in [
            ("one device", SA.to_string(), Vec::new()),
            ("dp 2", DP2.to_string(), Vec::new()),
            ("one device, deterministic", SA.to_string(), vec![det]),
        ] {
            let what = format!("{precision}, {what}");
            let mut with_accumulation = extra.clone();
            with_accumulation.extend_from_slice(&accumulate);
            let tag = what.replace([' ', ','], "_");
            let accumulated = run(&format!("{tag}-accumulated"), &parallel, &with_accumulation);
            let interleaved = run(
                &format!("{tag}-interleaved"),
                &interleave(&parallel),
                &extra,
            );
            run_util::assert_losses_within(
                &format!("{what}, K = 2 against the unsplit batch"),
                &accumulated.0,
                &reference.0,
                MICRO_BATCH_TOLERANCE,
            );
            run_util::assert_bitwise_run(
                &format!("{what}, interleave 2 against K = 2"),
                &interleaved,
                &accumulated,
            );
            if extra.contains(&det) {
                let again = run(&format!("{tag}-again"), &parallel, &with_accumulation);
                run_util::assert_bitwise_run(&format!("{what}, rerun"), &again, &accumulated);
            }
        }
    }
}

/// The small GPT with Adam trained `steps` steps in `precision` into `dir/<precision>-<name>`,
/// under `[parallel]` body `parallel`, with `extra` overrides.
fn half_precision_run(
    dir: &Path,
    precision: &str,
    steps: usize,
    (name, parallel, extra): (&str, &str, &[&str]),
) -> Run {
    let p = format!("train.precision=\"{precision}\"");
    let mut overrides = vec![p.as_str()];
    overrides.extend_from_slice(extra);
    let out = dir.join(format!("{precision}-{name}"));
    train_report(&adam_gpt(&out, parallel, steps, &overrides)).2
}

/// bf16 and f16 pipelines of 2 stages × 4 micro-batches (1F1B), with data parallel 2 and with
/// model parallel 2 inside the stages: each trains 8 steps within [`MICRO_BATCH_TOLERANCE`] of
/// the same precision on one device with the unsplit batch, and of one device accumulating
/// the same 4 micro-batches (`train.grad_accumulation_steps = 4`). A stage sums its
/// micro-batches' half-precision gradients in f32 and rounds their mean once before the
/// gradients' reduction.
#[test]
fn half_precision_pipelines_with_micro_batches() {
    let tmp = tempfile::tempdir().unwrap();
    let steps = 8;
    for precision in ["bf16", "f16"] {
        let run = |name: &str, parallel: &str, extra: &[&str]| {
            half_precision_run(tmp.path(), precision, steps, (name, parallel, extra))
        };
        let unsplit = run("unsplit", SA, &[]);
        let accumulated = run(
            "accumulated",
            SA,
            &["data.batch_size=2", "train.grad_accumulation_steps=4"],
        );
        let pipeline = "[parallel.pipeline]\nstages = 2\nmicro_batches = 4";
        for (what, parallel) in [
            (
                "2 stages × dp 2",
                format!("devices = 4\nmode = \"semi_auto\"\ndata_parallel = 2\nmodel_parallel = 1\n{pipeline}"),
            ),
            (
                "2 stages × mp 2",
                format!("devices = 4\nmode = \"semi_auto\"\nmodel_parallel = 2\n{pipeline}"),
            ),
        ] {
            let what = format!("{precision}, {what}, 4 micro-batches");
            let pipelined = run(&what.replace([' ', ',', '×'], "_"), &parallel, &[]);
            for (against, reference) in [("the unsplit batch", &unsplit), ("K = 4", &accumulated)] {
                run_util::assert_losses_within(
                    &format!("{what} against {against}"),
                    &pipelined.0,
                    &reference.0,
                    MICRO_BATCH_TOLERANCE,
                );
            }
        }
    }
}

/// With `parallel.gradient_fp32_sync = false` (gradient sums in the half type) the
/// micro-batches' gradients are accumulated in the half type as well, rounded after every
/// addition: bf16 with `train.grad_accumulation_steps = 4` on one device then trains within
/// [`MICRO_BATCH_TOLERANCE`] of the unsplit batch, but not bitwise the f32 accumulation's
/// run (which `enable_fp32_communication = true` restores, as it widens every sum).
#[test]
fn gradient_fp32_sync_false_accumulates_in_the_half_type() {
    let tmp = tempfile::tempdir().unwrap();
    let steps = 8;
    let run = |name: &str, extra: &[&str]| {
        let mut overrides = vec!["train.precision=\"bf16\""];
        overrides.extend_from_slice(extra);
        train_report(&adam_gpt(&tmp.path().join(name), SA, steps, &overrides)).2
    };
    let unsplit = run("unsplit", &[]);
    let k4 = ["data.batch_size=2", "train.grad_accumulation_steps=4"];
    let in_f32 = run("f32-sums", &k4);
    let in_half = run(
        "half-sums",
        &[k4[0], k4[1], "parallel.gradient_fp32_sync=false"],
    );
    let widened = run(
        "widened",
        &[
            k4[0],
            k4[1],
            "parallel.gradient_fp32_sync=false",
            "parallel.enable_fp32_communication=true",
        ],
    );
    run_util::assert_losses_within(
        "bf16, K = 4, half-type sums",
        &in_half.0,
        &unsplit.0,
        MICRO_BATCH_TOLERANCE,
    );
    assert_ne!(in_half.1, in_f32.1, "the half-type sums round differently");
    run_util::assert_bitwise_run("f32 communication widens the sums", &widened, &in_f32);
}
