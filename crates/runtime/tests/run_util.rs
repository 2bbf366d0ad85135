//! Training runs compared with one device: train a config on the local backend, merge the
//! checkpoint its ranks saved, and compare losses and parameters.

use std::path::{Path, PathBuf};

use ckpt::{CheckpointFile, MergeOptions};
use runtime::{LaunchOptions, Session, TrainConfig, TrainReport};

/// A run's loss at every step, and its merged parameters by name.
pub type Run = (Vec<f32>, Vec<(String, Vec<f32>)>);

/// Trains `config` on the local backend, expecting `steps` steps with the same loss on every
/// rank; returns the session (for its programs) and the losses.
pub fn train_steps(config: &TrainConfig, steps: usize) -> (Session, Vec<f32>) {
    train_session_steps(Session::new(config).expect("the session builds"), steps)
}

/// [`train_steps`] of a session already built (a network of one's own:
/// `Session::with_model`).
pub fn train_session_steps(session: Session, steps: usize) -> (Session, Vec<f32>) {
    let options = LaunchOptions {
        print_loss: false,
        ..LaunchOptions::default()
    };
    let report = runtime::train_local(&session, &options).expect("training runs");
    assert_eq!(report.losses().len(), steps);
    for r in &report.ranks {
        assert_eq!(
            r.losses,
            report.losses(),
            "every rank reports the same losses"
        );
    }
    let losses = report.losses().to_vec();
    (session, losses)
}

/// Trains `config` for `steps` steps: the session, and the run (losses and every parameter of
/// the training program, merged from the checkpoint the ranks saved).
pub fn train_run(config: &TrainConfig, steps: usize) -> (Session, Run) {
    train_session_run(
        config,
        Session::new(config).expect("the session builds"),
        steps,
    )
}

/// [`train_run`] of `session`, already built under `config` (`Session::with_model`).
pub fn train_session_run(config: &TrainConfig, session: Session, steps: usize) -> (Session, Run) {
    let (session, losses) = train_session_steps(session, steps);
    let params = merged_params(&config.output().dir, &param_names(&session));
    (session, (losses, params))
}

/// The parameters `names` of the checkpoint the ranks saved in `out`, merged into full tensors.
pub fn merged_params(out: &Path, names: &[String]) -> Vec<(String, Vec<f32>)> {
    try_merged_params(out, names).unwrap_or_else(|e| panic!("{e}"))
}

/// [`merged_params`], a failure (the merge, a missing part or parameter) as an error naming
/// the directory and the tensor.
pub fn try_merged_params(out: &Path, names: &[String]) -> Result<Vec<(String, Vec<f32>)>, String> {
    let merged = out.join("merged");
    ckpt::unified_safetensors(
        out,
        &out.join("strategy.json"),
        &merged,
        &MergeOptions::default(),
    )
    .map_err(|e| format!("merging {}: {e:#}", out.display()))?;
    let part = CheckpointFile::open(&merged.join("part0.safetensors"))
        .map_err(|e| format!("{}: {e:#}", merged.display()))?;
    names
        .iter()
        .map(|name| {
            let t = part
                .read_tensor(name)
                .map_err(|e| format!("{}: {name}: {e:#}", out.display()))?;
            // Half-precision weights (mixed precision) widened, exactly.
            let values = match t.as_f32() {
                Ok(xs) => xs.to_vec(),
                Err(_) => t.to_f64_vec().into_iter().map(|x| x as f32).collect(),
            };
            Ok((name.clone(), values))
        })
        .collect()
}

/// Asserts that `run` matches `reference`, one device's run: every step's loss to a relative
/// 1e-4, every parameter element to `tolerance · (1 + |x|)`.
pub fn assert_same_run(what: &str, run: &Run, reference: &Run, tolerance: f32) {
    assert_same_run_except(what, run, reference, tolerance, |_, _| false);
}

/// [`assert_same_run`] for every parameter element but those `skip(name, index)` names (the
/// caller checks those its own way).
pub fn assert_same_run_except(
    what: &str,
    run: &Run,
    reference: &Run,
    tolerance: f32,
    skip: impl Fn(&str, usize) -> bool,
) {
    let ((losses, params), (ref_losses, ref_params)) = (run, reference);
    assert_eq!(losses.len(), ref_losses.len(), "{what}: step count");
    for (step, (a, b)) in losses.iter().zip(ref_losses).enumerate() {
        let rel = (a - b).abs() / b.abs().max(1e-12);
        assert!(
            rel <= 1e-4,
            "{what}: step {}: loss {a} vs one device's {b}",
            step + 1
        );
    }
    assert_eq!(params.len(), ref_params.len(), "{what}: parameter count");
    for ((name, a), (ref_name, b)) in params.iter().zip(ref_params) {
        assert_eq!(name, ref_name);
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            if skip(name, i) {
                continue;
            }
            assert!(
                (x - y).abs() <= tolerance * (1.0 + y.abs()),
                "{what}: {name}[{i}] = {x} vs one device's {y}"
            );
        }
    }
}

/// Asserts that `run` holds `reference`'s bits: every step's loss and every element of every
/// parameter (deterministic mode's promise).
pub fn assert_bitwise_run(what: &str, run: &Run, reference: &Run) {
    let bits = |xs: &[f32]| xs.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(
        bits(&run.0),
        bits(&reference.0),
        "{what}: losses {:?} vs {:?}",
        run.0,
        reference.0
    );
    assert_eq!(run.1.len(), reference.1.len(), "{what}: parameter count");
    for ((name, a), (_, b)) in run.1.iter().zip(&reference.1) {
        let differ = a
            .iter()
            .zip(b)
            .filter(|(x, y)| x.to_bits() != y.to_bits())
            .count();
        assert_eq!(
            differ,
            0,
            "{what}: {name} differs in {differ} of {} elements",
            a.len()
        );
    }
}

/// The bundled King James text (gzipped).
pub fn kjv() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data/kjv/kjv.txt.gz")
}

/// A small GPT (2 blocks, 8 heads, width 32, 16 tokens, batch 8) training 20 steps of the
/// bundled text with `optimizer`, `model_extra` appended to `[model]`, `[parallel]` body
/// `parallel`, and command-line style `overrides` (`train.max_steps=10`).
pub fn small_gpt(
    out: &Path,
    optimizer: &str,
    model_extra: &str,
    parallel: &str,
    overrides: &[String],
) -> TrainConfig {
    let text = small_gpt_text(out, optimizer, model_extra, parallel);
    TrainConfig::parse(&text, None, overrides, Path::new("/")).expect("a valid test config")
}

/// [`small_gpt`] without `model_extra`, its overrides given as `&str`s.
pub fn small_gpt_plain(
    out: &Path,
    optimizer: &str,
    parallel: &str,
    overrides: &[&str],
) -> TrainConfig {
    let overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    small_gpt(out, optimizer, "", parallel, &overrides)
}

/// The `[parallel]` body of a semi-auto run on `devices` with `keys` added.
pub fn semi(devices: usize, keys: &str) -> String {
    format!("devices = {devices}\nmode = \"semi_auto\"\n{keys}")
}

/// The overrides of the one-device run a layout's run equals: `micro` micro-batches (1, or a
/// pipeline's count) of the batch of 8 accumulated per step.
pub fn reference_overrides(micro: usize) -> Vec<String> {
    match micro {
        1 => Vec::new(),
        m => vec![
            format!("data.batch_size={}", 8 / m),
            format!("train.grad_accumulation_steps={m}"),
        ],
    }
}

/// The TOML text of [`small_gpt`].
pub fn small_gpt_text(out: &Path, optimizer: &str, model_extra: &str, parallel: &str) -> String {
    format!(
        r#"
[model]
name = "gpt"
layers = 2
heads = 8
hidden = 32
seq_len = 16
ffn_hidden = 64
{model_extra}
[data]
format = "text"
path = "{data}"
batch_size = 8
steps_per_epoch = 20
[parallel]
{parallel}
[train]
epochs = 1
max_steps = 20
optimizer = "{optimizer}"
learning_rate = 0.01
momentum = 0.9
seed = 5
eval = false
[output]
dir = "{out}"
"#,
        data = kjv().display(),
        out = out.display(),
    )
}

/// Trains `config`: the session, the report, and the merged parameters by name.
pub fn train_report(config: &TrainConfig) -> (Session, TrainReport, Run) {
    let session = Session::new(config).expect("the session builds");
    let options = LaunchOptions {
        print_loss: false,
        ..LaunchOptions::default()
    };
    let report = runtime::train_local(&session, &options).expect("training runs");
    for r in &report.ranks {
        assert_eq!(
            r.losses,
            report.losses(),
            "every rank reports the same losses"
        );
    }
    let params = merged_params(&config.output().dir, &param_names(&session));
    let losses = report.losses().to_vec();
    (session, report, (losses, params))
}

/// Every step's loss within relative `tolerance` of `reference`'s, and as many steps.
pub fn assert_losses_within(what: &str, losses: &[f32], reference: &[f32], tolerance: f32) {
    assert_eq!(losses.len(), reference.len(), "{what}: steps");
    for (i, (a, b)) in losses.iter().zip(reference).enumerate() {
        let rel = ((a - b) / b).abs();
        assert!(
            rel <= tolerance,
            "{what}: step {} loss {a} vs {b} (relative {rel} > {tolerance})",
            i + 1
        );
    }
}

/// The names of `session`'s parameters, in program order (a shared parameter's per-stage
/// copies, which checkpoints hold under their owner's name, left out).
pub fn param_names(session: &Session) -> Vec<String> {
    session
        .train
        .params
        .iter()
        .filter(|p| parallel::pipeline::shared_copy_of(&p.name).is_none())
        .map(|p| p.name.clone())
        .collect()
}

/// `[parallel]` body: data parallel 2 (the GPT keys: model parallel 1).
pub const DP2: &str = "devices = 2\nmode = \"semi_auto\"\nmodel_parallel = 1\n";

/// `[parallel]` body: data parallel 2 × model parallel 2.
pub const DP2_MP2: &str =
    "devices = 4\nmode = \"semi_auto\"\ndata_parallel = 2\nmodel_parallel = 2\n";

/// [`small_gpt`] with Adam for `steps` steps under `[parallel]` body `parallel`, and
/// command-line style `overrides`.
pub fn adam_gpt(out: &Path, parallel: &str, steps: usize, overrides: &[&str]) -> TrainConfig {
    let mut all = vec![format!("train.max_steps={steps}")];
    all.extend(overrides.iter().map(|s| s.to_string()));
    small_gpt(out, "adam", "", parallel, &all)
}

/// The bundled digits (IDX images), relative to this crate.
pub fn digits() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data/digits")
}

/// The seed MLP (hidden 128) training 20 steps of the bundled digits with `optimizer`,
/// `[parallel]` body `parallel`, and command-line style `extra` overrides.
pub fn seed_mlp(out: &Path, optimizer: &str, parallel: &str, extra: &[&str]) -> TrainConfig {
    let text = format!(
        r#"
[model]
name = "seed_mlp"
hidden = 128
classes = 10
[data]
format = "idx"
dir = "{data}"
batch_size = 32
shuffle = true
[parallel]
{parallel}
[train]
epochs = 1
max_steps = 20
optimizer = "{optimizer}"
learning_rate = 0.02
momentum = 0.9
seed = 3
eval = false
[output]
dir = "{out}"
"#,
        data = digits().display(),
        out = out.display(),
    );
    let overrides: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
    TrainConfig::parse(&text, None, &overrides, Path::new("/")).expect("a valid test config")
}
