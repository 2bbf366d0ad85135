//! Gradient clipping by global norm (`train.max_grad_norm`, MindSpore's
//! `ops.clip_by_global_norm`): the norm is one device's under every layout (bitwise in
//! deterministic mode), the clipped run is one device's clipped run, the formula holds by hand,
//! a norm that never binds changes nothing, and bad values are refused naming the key.

use std::path::Path;
use std::sync::{Arc, Mutex};

use runtime::{Callback, RuntimeError, Session, StepInfo, TrainConfig, TrainReport};

use crate::run_util::{self, reference_overrides, semi, small_gpt_plain as small_gpt, Run};

/// A clipping norm the small GPT's gradients exceed at every step (their norm is ~1).
const TIGHT: &str = "train.max_grad_norm=0.05";

/// Trains `config`: the report (every rank's norms checked equal) and the run.
fn train(config: &TrainConfig) -> (TrainReport, Run) {
    let (_, report, run) = run_util::train_report(config);
    for r in &report.ranks {
        assert_eq!(
            bits(&r.grad_norms),
            bits(&report.ranks[0].grad_norms),
            "every rank reports the same norms"
        );
    }
    (report, run)
}

fn norms(report: &TrainReport) -> Vec<f64> {
    report.ranks[0]
        .grad_norms
        .iter()
        .map(|n| n.expect("a norm at every step"))
        .collect()
}

fn bits(norms: &[Option<f64>]) -> Vec<Option<u64>> {
    norms.iter().map(|n| n.map(f64::to_bits)).collect()
}

/// (name, devices, [parallel] keys, reference micro-batches: 1, or a pipeline's count, whose
/// one-device equivalent accumulates that many micro-batches of batch 8 / count).
const LAYOUTS: &[(&str, usize, &str, usize)] = &[
    ("data parallel 4", 4, "model_parallel = 1", 1),
    ("model parallel 2", 2, "model_parallel = 2", 1),
    ("dp 2 × mp 2", 4, "data_parallel = 2\nmodel_parallel = 2", 1),
    (
        "vocabulary and sequence parallel, mp 2",
        2,
        "model_parallel = 2\nvocab_emb_dp = false\nuse_seq_parallel = true",
        1,
    ),
    (
        "hsdp level1, dp 4",
        4,
        "model_parallel = 1\n[parallel.hsdp]\noptimizer_level = \"level1\"\nthreshold = 0",
        1,
    ),
    (
        "hsdp level3, dp 2 × mp 2, shard_size 2",
        4,
        "data_parallel = 2\nmodel_parallel = 2\n[parallel.hsdp]\noptimizer_level = \"level3\"\nthreshold = 0\nshard_size = 2",
        1,
    ),
    (
        "2 stages, 2 micro-batches, tied embedding",
        2,
        "[parallel.pipeline]\nstages = 2\nmicro_batches = 2",
        2,
    ),
    (
        "2 stages × dp 2, 2 micro-batches",
        4,
        "data_parallel = 2\n[parallel.pipeline]\nstages = 2\nmicro_batches = 2",
        2,
    ),
];

/// Deterministic mode: under every layout the norm of every step is one device's bit for bit,
/// the clip binds at every step, and the clipped run (losses, merged parameters) is one
/// device's clipped run bit for bit.
#[test]
fn deterministic_norms_and_clipped_runs_are_bitwise_one_device() {
    let tmp = tempfile::tempdir().unwrap();
    let mut references = std::collections::BTreeMap::new();
    for (i, (name, devices, parallel, micro)) in LAYOUTS.iter().enumerate() {
        let common = ["train.deterministic=true", "train.max_steps=6", TIGHT];
        let reference = references.entry(*micro).or_insert_with(|| {
            let extra = reference_overrides(*micro);
            let mut all: Vec<&str> = common.to_vec();
            all.extend(extra.iter().map(String::as_str));
            let out = tmp.path().join(format!("sa-{micro}"));
            train(&small_gpt(&out, "adam", "mode = \"stand_alone\"", &all))
        });
        let out = tmp.path().join(format!("det-{i}"));
        let (report, run) = train(&small_gpt(&out, "adam", &semi(*devices, parallel), &common));
        let (ref_report, ref_run) = &*reference;
        assert_eq!(
            bits(&report.ranks[0].grad_norms),
            bits(&ref_report.ranks[0].grad_norms),
            "{name}: norms {:?} vs one device's {:?}",
            report.ranks[0].grad_norms,
            ref_report.ranks[0].grad_norms
        );
        assert_eq!(norms(&report).len(), 6, "{name}");
        assert!(
            norms(&report).iter().all(|&n| n > 0.05),
            "{name}: the clip binds at every step: {:?}",
            norms(&report)
        );
        run_util::assert_bitwise_run(name, &run, ref_run);
    }
}

/// Without deterministic mode: under every layout the first step's norm is one device's to a
/// relative 1e-6 (later steps to 1e-4, as the parameters drift by rounding), and the clipped
/// run is one device's clipped run to the equivalence suite's tolerance.
#[test]
fn norms_and_clipped_runs_match_one_device() {
    let tmp = tempfile::tempdir().unwrap();
    let mut references = std::collections::BTreeMap::new();
    for (i, (name, devices, parallel, micro)) in LAYOUTS.iter().enumerate() {
        let common = ["train.max_steps=8", TIGHT];
        let reference = references.entry(*micro).or_insert_with(|| {
            let extra = reference_overrides(*micro);
            let mut all: Vec<&str> = common.to_vec();
            all.extend(extra.iter().map(String::as_str));
            let out = tmp.path().join(format!("sa-{micro}"));
            train(&small_gpt(&out, "momentum", "mode = \"stand_alone\"", &all))
        });
        let out = tmp.path().join(format!("case-{i}"));
        let (report, run) = train(&small_gpt(
            &out,
            "momentum",
            &semi(*devices, parallel),
            &common,
        ));
        let (ref_report, ref_run) = &*reference;
        let (ours, theirs) = (norms(&report), norms(ref_report));
        assert_eq!(ours.len(), theirs.len(), "{name}");
        for (step, (a, b)) in ours.iter().zip(&theirs).enumerate() {
            let tolerance = if step == 0 { 1e-6 } else { 1e-4 };
            assert!(
                (a - b).abs() <= tolerance * b,
                "{name}: step {}: norm {a} vs one device's {b}",
                step + 1
            );
        }
        run_util::assert_same_run(name, &run, ref_run, 2e-4);
    }
}

/// One step's parameters and the gradients its update applied, by name.
type StepShards = Vec<(String, Vec<f32>, Vec<f32>)>;

/// Records every step's parameters and (clipped) gradients by name.
#[derive(Clone, Default)]
struct Shards(Arc<Mutex<Vec<StepShards>>>);

impl Callback for Shards {
    fn on_step_end(&mut self, step: &StepInfo<'_>) -> Result<(), RuntimeError> {
        let shards = step
            .shards
            .iter()
            .filter_map(|s| {
                let grad = s.grad?.as_f32().ok()?.to_vec();
                Some((s.name.to_string(), s.param.as_f32().ok()?.to_vec(), grad))
            })
            .collect();
        self.0.lock().unwrap().push(shards);
        Ok(())
    }
}

/// One step of SGD on one device, recording parameters and the gradient the update applied.
fn one_sgd_step(out: &Path, overrides: &[&str]) -> (StepShards, Vec<f64>) {
    let mut all = vec!["train.max_steps=1"];
    all.extend(overrides);
    let config = small_gpt(out, "sgd", "mode = \"stand_alone\"", &all);
    let session = Session::new(&config).unwrap();
    let cluster = comm::LocalCluster::new(1).unwrap();
    let world: Arc<dyn comm::Communicator> = Arc::new(cluster.comms().remove(0));
    let mut recorder = Shards::default();
    let outcome = session.run_rank(world, &mut recorder, true).unwrap();
    let mut steps = recorder.0.lock().unwrap().clone();
    let norms = outcome.grad_norms.iter().map(|n| n.unwrap()).collect();
    (steps.remove(0), norms)
}

/// The formula by hand on one SGD step: the norm is `sqrt(Σ g²)` of the unclipped gradient,
/// the applied gradient is `g · c / max(norm, c)`, and the parameters moved by the learning
/// rate times it.
#[test]
fn clipping_follows_the_formula_by_hand() {
    let tmp = tempfile::tempdir().unwrap();
    let (plain, no_norms) = one_sgd_step(&tmp.path().join("plain"), &[]);
    assert!(no_norms.is_empty(), "no norm without train.max_grad_norm");
    let norm: f64 = plain
        .iter()
        .flat_map(|(_, _, g)| g.iter().map(|&x| f64::from(x) * f64::from(x)))
        .sum::<f64>()
        .sqrt();
    let c = norm / 4.0;
    let setting = format!("train.max_grad_norm={c}");
    let (clipped, norms) = one_sgd_step(&tmp.path().join("clipped"), &[&setting]);
    assert_eq!(norms.len(), 1);
    assert!(
        (norms[0] - norm).abs() <= 1e-12 * norm,
        "reported {} vs by hand {norm}",
        norms[0]
    );
    let lr = 0.01f64;
    for ((name, p_plain, g), (_, p_clipped, g_clipped)) in plain.iter().zip(&clipped) {
        for j in 0..g.len() {
            let expected = f64::from(g[j]) * c / norm.max(c);
            let got = f64::from(g_clipped[j]);
            assert!(
                (got - expected).abs() <= 1e-6 * expected.abs() + 1e-30,
                "{name}[{j}]: clipped gradient {got} vs {expected}"
            );
            // p₀ = p_plain + lr·g, so the clipped run's parameter is p₀ − lr·g_clipped.
            let p0 = f64::from(p_plain[j]) + lr * f64::from(g[j]);
            let want = p0 - lr * expected;
            assert!(
                (f64::from(p_clipped[j]) - want).abs() <= 1e-6 * (1.0 + want.abs()),
                "{name}[{j}]: parameter {} vs {want}",
                p_clipped[j]
            );
        }
    }
    // A norm equal to the gradient's own norm binds nowhere: the factor would be 1.
    let loose = format!("train.max_grad_norm={}", norm * 2.0);
    let (unclipped, _) = one_sgd_step(&tmp.path().join("loose"), &[&loose]);
    for ((name, p, g), (_, q, h)) in plain.iter().zip(&unclipped) {
        assert_eq!(g, h, "{name}: gradient untouched");
        assert_eq!(p, q, "{name}: parameter untouched");
    }
}

/// A `max_grad_norm` the gradients never reach leaves the run bitwise the unclipped run, with
/// data and model parallelism, gradient accumulation, and Adam.
#[test]
fn a_norm_that_never_binds_is_bitwise_the_unclipped_run() {
    let tmp = tempfile::tempdir().unwrap();
    let parallel = semi(4, "data_parallel = 2\nmodel_parallel = 2");
    let common = ["train.max_steps=6", "train.grad_accumulation_steps=2"];
    let (plain_report, plain) = train(&small_gpt(
        &tmp.path().join("plain"),
        "adam",
        &parallel,
        &common,
    ));
    assert!(plain_report.ranks[0].grad_norms.is_empty());
    let mut huge = common.to_vec();
    huge.push("train.max_grad_norm=1e30");
    let (report, run) = train(&small_gpt(
        &tmp.path().join("huge"),
        "adam",
        &parallel,
        &huge,
    ));
    assert_eq!(norms(&report).len(), 6);
    run_util::assert_bitwise_run("max_grad_norm = 1e30", &run, &plain);
}

/// With gradient accumulation the mean gradient is clipped once per step: two micro-batches
/// of 4 give the norm and the clipped run of one batch of 8 (clipping each micro-batch would
/// not).
#[test]
fn accumulation_clips_the_mean_gradient_once_per_step() {
    let tmp = tempfile::tempdir().unwrap();
    let whole = ["train.max_steps=6", TIGHT];
    let (ref_report, reference) = train(&small_gpt(
        &tmp.path().join("whole"),
        "momentum",
        "mode = \"stand_alone\"",
        &whole,
    ));
    let mut split = whole.to_vec();
    split.extend(["data.batch_size=4", "train.grad_accumulation_steps=2"]);
    let (report, run) = train(&small_gpt(
        &tmp.path().join("split"),
        "momentum",
        "mode = \"stand_alone\"",
        &split,
    ));
    for (a, b) in norms(&report).iter().zip(norms(&ref_report)) {
        assert!((a - b).abs() <= 1e-5 * b, "norm {a} vs one batch's {b}");
    }
    run_util::assert_same_run("accumulated", &run, &reference, 2e-4);
}

/// Mixed precision: the norm is the unscaled gradient's (the same under loss scales 1 and
/// 1024 to f16's precision), and a step skipped for overflow has no norm and is not clipped.
#[test]
fn mixed_precision_clips_the_unscaled_gradient_and_skips_overflow_steps() {
    let tmp = tempfile::tempdir().unwrap();
    let run = |name: &str, scale: &str| {
        let scale = format!("train.loss_scale={scale}");
        train(&small_gpt(
            &tmp.path().join(name),
            "momentum",
            "mode = \"stand_alone\"",
            &[
                "train.max_steps=4",
                "train.precision=\"f16\"",
                &scale,
                TIGHT,
            ],
        ))
        .0
    };
    let (one, scaled) = (run("one", "1"), run("scaled", "1024"));
    for (a, b) in norms(&scaled).iter().zip(norms(&one)) {
        assert!(
            (a - b).abs() <= 1e-2 * b,
            "norm {a} under scale 1024 vs {b} under 1"
        );
    }
    // A dynamic scale starts at 65536, where the gradients overflow f16: those steps are
    // skipped and have no norm.
    let dynamic = run("dynamic", "\"dynamic\"");
    let outcome = &dynamic.ranks[0];
    let skipped = outcome.grad_norms.iter().filter(|n| n.is_none()).count() as u64;
    assert_eq!(skipped, outcome.skipped_steps);
    assert_eq!(outcome.grad_norms.len(), outcome.losses.len());
}

/// A norm ≤ 0, not finite or not a number is refused naming `train.max_grad_norm`.
#[test]
fn bad_clipping_norms_are_refused_naming_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    let text = run_util::small_gpt_text(tmp.path(), "sgd", "", "mode = \"stand_alone\"");
    for bad in ["0", "-1.5", "nan", "inf", "\"1\"", "true"] {
        let err = TrainConfig::parse(
            &text,
            None,
            &[format!("train.max_grad_norm={bad}")],
            Path::new("/"),
        )
        .expect_err(bad)
        .to_string();
        assert!(err.contains("train.max_grad_norm"), "{bad}: {err}");
    }
    let ok = TrainConfig::parse(
        &text,
        None,
        &["train.max_grad_norm=1".to_string()],
        Path::new("/"),
    )
    .unwrap();
    assert_eq!(ok.train().max_grad_norm.map(|m| m.get()), Some(1.0));
    // Parameter-server mode clips too (async on the worker, sync on the servers by the
    // norm the workers gather): the key is taken, not refused.
    let ps = text.replace("mode = \"stand_alone\"", "mode = \"parameter_server\"");
    for sync in ["true", "false"] {
        let config = TrainConfig::parse(
            &ps,
            None,
            &[
                "train.max_grad_norm=1".to_string(),
                format!("ps.sync={sync}"),
            ],
            Path::new("/"),
        )
        .unwrap_or_else(|e| panic!("ps.sync = {sync}: {e}"));
        assert_eq!(config.train().max_grad_norm.map(|m| m.get()), Some(1.0));
    }
}

/// The metrics log carries each step's norm as `"grad_norm"`, the value the step clipped with.
#[test]
fn the_metrics_log_records_each_step_s_norm() {
    let tmp = tempfile::tempdir().unwrap();
    let config = small_gpt(
        &tmp.path().join("run"),
        "momentum",
        &semi(2, "model_parallel = 1"),
        &[TIGHT, "train.max_steps=4"],
    );
    let session = Session::new(&config).unwrap();
    let log = tmp.path().join("metrics.jsonl");
    let options = runtime::LaunchOptions {
        print_loss: false,
        metrics_log: Some(log.clone()),
        ..runtime::LaunchOptions::default()
    };
    let report = runtime::train_local(&session, &options).unwrap();
    let logged: Vec<f64> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v.get("loss").is_some())
        .map(|v| {
            v["grad_norm"]
                .as_f64()
                .expect("a grad_norm on every step line")
        })
        .collect();
    assert_eq!(logged, norms(&report));
}
