//! Adam's `use_amsgrad` and `use_nesterov`, and Lamb, in training runs: every layout trains
//! one device's run bit for bit in deterministic mode (Lamb's trust ratio takes its norms over
//! the whole parameter, summed over the ranks holding its pieces); AMSGrad's `vhat` is saved,
//! resumed, and a checkpoint without it is refused naming the tensor.

use std::path::Path;

use runtime::{RuntimeError, Session};

use crate::run_util::{self, reference_overrides, semi, small_gpt_plain as small_gpt, Run};

/// (name, devices, [parallel] keys, reference micro-batches: 1, or a pipeline's count, whose
/// one-device equivalent accumulates that many micro-batches of batch 8 / count). The layouts
/// of global-norm clipping's tests: tensor parallel, optimizer shards, pipeline stages with a
/// shared parameter.
const LAYOUTS: &[(&str, usize, &str, usize)] = &[
    ("data parallel 4", 4, "model_parallel = 1", 1),
    ("model parallel 2", 2, "model_parallel = 2", 1),
    ("model parallel 4", 4, "model_parallel = 4", 1),
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
        "hsdp zero1, dp 2",
        2,
        "model_parallel = 1\n[parallel.hsdp]\noptimizer_level = \"zero1\"\nthreshold = 0",
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

/// Trains `optimizer` with `common` keys (deterministic mode) under every layout of `layouts`
/// and checks each run is one device's bit for bit; returns the one-device runs.
fn bitwise_under_layouts(
    tmp: &Path,
    optimizer: &str,
    common: &[&str],
    layouts: &[(&str, usize, &str, usize)],
) -> std::collections::BTreeMap<usize, Run> {
    let mut references = std::collections::BTreeMap::new();
    for (i, (name, devices, parallel, micro)) in layouts.iter().enumerate() {
        let reference = references.entry(*micro).or_insert_with(|| {
            let extra = reference_overrides(*micro);
            let mut all: Vec<&str> = common.to_vec();
            all.extend(extra.iter().map(String::as_str));
            let out = tmp.join(format!("{optimizer}-sa-{micro}"));
            let (_, _, run) =
                run_util::train_report(&small_gpt(&out, optimizer, "mode = \"stand_alone\"", &all));
            run
        });
        let out = tmp.join(format!("{optimizer}-{i}"));
        let config = small_gpt(&out, optimizer, &semi(*devices, parallel), common);
        let (_, _, run) = run_util::train_report(&config);
        run_util::assert_bitwise_run(&format!("{optimizer}, {name}"), &run, reference);
    }
    references
}

/// Lamb (with weight decay, MindSpore's default filter) under tensor parallelism, optimizer
/// shards and pipeline stages: deterministic runs are one device's bit for bit, because each
/// parameter's trust ratio is taken over the whole parameter. Its first step is checked to move
/// the weights differently from Adam (the trust ratio binds).
#[test]
fn lamb_runs_are_bitwise_one_device_under_every_layout() {
    let tmp = tempfile::tempdir().unwrap();
    let common = [
        "train.deterministic=true",
        "train.max_steps=4",
        "train.weight_decay=0.01",
    ];
    let references = bitwise_under_layouts(tmp.path(), "lamb", &common, LAYOUTS);
    // The rule is not Adam's: the same run under Adam ends elsewhere.
    let out = tmp.path().join("adam");
    let (_, _, adam) =
        run_util::train_report(&small_gpt(&out, "adam", "mode = \"stand_alone\"", &common));
    let lamb = &references[&1];
    assert_ne!(lamb.0, adam.0, "Lamb's losses are not Adam's");
}

/// Adam with `use_nesterov` and with `use_amsgrad` (elementwise) under tensor parallelism and
/// optimizer shards: one device's run bit for bit.
#[test]
fn adam_nesterov_and_amsgrad_runs_are_bitwise_one_device() {
    let tmp = tempfile::tempdir().unwrap();
    let layouts = [LAYOUTS[3], LAYOUTS[7], LAYOUTS[8]];
    for flag in ["train.use_nesterov=true", "train.use_amsgrad=true"] {
        let common = ["train.deterministic=true", "train.max_steps=4", flag];
        let dir = tmp.path().join(flag.replace(['.', '='], "-"));
        let references = bitwise_under_layouts(&dir, "adam", &common, &layouts);
        let out = dir.join("plain");
        let plain = ["train.deterministic=true", "train.max_steps=4"];
        let (_, _, plain) =
            run_util::train_report(&small_gpt(&out, "adam", "mode = \"stand_alone\"", &plain));
        assert_ne!(references[&1].1, plain.1, "{flag} changes the run");
    }
}

/// The tensor names of the checkpoint in `out`.
fn checkpoint_names(out: &Path) -> Vec<String> {
    ckpt::Strategy::load(&out.join("strategy.json"))
        .unwrap()
        .params
        .into_iter()
        .map(|p| p.name)
        .collect()
}

/// AMSGrad's `vhat` is in the checkpoint (laid out like its parameter: here model parallel 2,
/// resumed under data parallel 2) and a resume restores it: 3 + 3 steps are the 6-step run bit
/// for bit. A plain Adam checkpoint, lacking `vhat`, is refused by an AMSGrad resume naming the
/// key and a missing tensor, and the other way round.
#[test]
fn amsgrad_state_is_saved_resumed_and_required() {
    let tmp = tempfile::tempdir().unwrap();
    let ams = ["train.deterministic=true", "train.use_amsgrad=true"];
    let with = |extra: &[&str]| -> Vec<String> {
        ams.iter()
            .chain(extra)
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
    };
    let cfg = |out: &Path, parallel: &str, keys: &[String]| {
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        small_gpt(out, "adam", parallel, &keys)
    };
    let whole_out = tmp.path().join("whole");
    let (_, _, whole) = run_util::train_report(&cfg(
        &whole_out,
        "mode = \"stand_alone\"",
        &with(&["train.max_steps=6"]),
    ));
    let first = tmp.path().join("first");
    let (_, first_report, _) = run_util::train_report(&cfg(
        &first,
        &semi(2, "model_parallel = 2"),
        &with(&["train.max_steps=3"]),
    ));
    let names = checkpoint_names(&first);
    assert!(
        names.iter().any(|n| n.starts_with("vhat.")),
        "the checkpoint holds vhat: {names:?}"
    );
    let resume = format!("output.resume_from=\"{}\"", first.display());
    let second = tmp.path().join("second");
    let (_, report, run) = run_util::train_report(&cfg(
        &second,
        &semi(2, "model_parallel = 1"),
        &with(&["train.max_steps=6", &resume]),
    ));
    assert_eq!(report.losses().len(), 3);
    let mut losses = first_report.losses().to_vec();
    losses.extend(report.losses());
    run_util::assert_bitwise_run("3 + 3 steps with AMSGrad", &(losses, run.1), &whole);

    // Plain Adam's checkpoint has no vhat; AMSGrad's has one plain Adam would drop.
    let plain = tmp.path().join("plain");
    run_util::train_report(&small_gpt(
        &plain,
        "adam",
        "mode = \"stand_alone\"",
        &["train.max_steps=2"],
    ));
    for (from, keys) in [
        (&plain, with(&["train.max_steps=4"])),
        (&first, vec!["train.max_steps=4".to_string()]),
    ] {
        let resume = format!("output.resume_from=\"{}\"", from.display());
        let mut keys = keys;
        keys.push(resume);
        let config = cfg(&tmp.path().join("refused"), "mode = \"stand_alone\"", &keys);
        let err = Session::new(&config)
            .and_then(|s| runtime::train_local(&s, &runtime::LaunchOptions::default()).map(|_| ()))
            .unwrap_err();
        let text = err.to_string();
        assert!(
            matches!(&err, RuntimeError::Config { key, .. } if key == "train.use_amsgrad"),
            "{text}"
        );
        assert!(text.contains("vhat"), "{text}");
        if from == &plain {
            assert!(
                text.contains("it has no vhat."),
                "names the missing tensor: {text}"
            );
        }
    }
}

/// Lamb under mixed precision (bf16, f32 master weights): with the optimizer state and masters
/// sharded (`hsdp` levels 1 and 2, each rank updating a piece of every parameter) the run is
/// bitwise the data-parallel run, where each rank updates whole parameters.
#[test]
fn lamb_under_mixed_precision_takes_whole_norms_of_the_master_pieces() {
    let tmp = tempfile::tempdir().unwrap();
    let dp4 = "devices = 4\nmode = \"semi_auto\"\nmodel_parallel = 1\n";
    let keys = [
        "train.precision=\"bf16\"",
        "train.max_steps=4",
        "train.weight_decay=0.01",
    ];
    let (_, _, whole) =
        run_util::train_report(&small_gpt(&tmp.path().join("dp"), "lamb", dp4, &keys));
    for level in ["level1", "level2"] {
        let parallel =
            format!("{dp4}[parallel.hsdp]\noptimizer_level = \"{level}\"\nthreshold = 0\n");
        let out = tmp.path().join(level);
        let (_, _, run) = run_util::train_report(&small_gpt(&out, "lamb", &parallel, &keys));
        run_util::assert_bitwise_run(&format!("bf16 lamb, hsdp {level}"), &run, &whole);
    }
}
