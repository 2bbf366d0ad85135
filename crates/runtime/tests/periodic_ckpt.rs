//! Checkpoints while training (`output.save_checkpoint_steps`, `keep_checkpoint_max`),
//! `output.resume_from = "latest"`, exact resume mid-run, and `train.eval_interval`.

use std::path::Path;

use runtime::periodic_ckpt::TrainState;
use runtime::{RuntimeError, Session};

use crate::run_util::{adam_gpt, train_report, DP2, DP2_MP2};

/// A run of f16 with a dynamic loss scale saves a set every 3 steps, holding the loss
/// scaler's scale and clean-step count and Adam's own step count; a second run in the same
/// directory, stopped after step 4 without a final set, is resumed from `"latest"` (step 3's
/// set) and trains steps 4–6 bitwise as the run that never stopped.
#[test]
fn resuming_from_the_latest_periodic_set_continues_the_run_bitwise() {
    let tmp = tempfile::tempdir().unwrap();
    let f16 = "train.precision=\"f16\"";
    let every3 = "output.save_checkpoint_steps=3";
    let whole = adam_gpt(&tmp.path().join("whole"), DP2, 6, &[f16, every3]);
    let (_, report, reference) = train_report(&whole);
    let skipped = report.ranks[0].skipped_steps;
    let names = |dir: &std::path::Path| {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("checkpoint_step_"))
            .collect();
        v.sort();
        v
    };
    assert_eq!(
        names(&tmp.path().join("whole")),
        vec!["checkpoint_step_3", "checkpoint_step_6"]
    );
    let state =
        runtime::periodic_ckpt::TrainState::read(&tmp.path().join("whole/checkpoint_step_3"))
            .unwrap()
            .unwrap();
    assert_eq!(state.global_step, 3);
    assert_eq!(state.optimizer_steps, 3 - skipped.min(3), "{state:?}");
    assert!(state.loss_scale.is_some(), "{state:?}");

    let run = tmp.path().join("run");
    // Stopped after step 4 (its last set is step 3's); the final set is off, as after a kill.
    let first = adam_gpt(&run, DP2, 4, &[f16, every3, "output.save_checkpoint=false"]);
    train_report_without_final(&first);
    assert_eq!(
        runtime::periodic_ckpt::latest_set(&run),
        Some(run.join("checkpoint_step_3"))
    );
    let resumed = adam_gpt(
        &run,
        DP2,
        6,
        &[f16, every3, "output.resume_from=\"latest\""],
    );
    let (_, _, continued) = train_report(&resumed);
    assert_eq!(continued.0[..], reference.0[3..], "losses of steps 4–6");
    assert_eq!(continued.1, reference.1, "parameters after step 6");
}

/// A set converted to other layouts resumes the run as the set it came from: a conversion
/// carries `train_state.json` (Adam's own step count, fewer than the global step when the
/// dynamic loss scale skipped steps, and the scaler's scale and clean-step count) and, given a
/// destination strategy, writes that strategy as the set's `strategy.json`. Resumed with no
/// `output.resume_strategy` from step 3's set merged into rank 0, sharded for dp 2 × mp 2 (the
/// strategy given as MindSpore protobuf) and the same as MindSpore `.ckpt` files, a dp-2 run
/// trains steps 4–6 bitwise as the run that never stopped and ends with its optimizer step
/// count and loss scale. Without the training state, Adam would count 3 steps, not the saved
/// count, and the scale would restart.
#[test]
fn a_converted_set_resumes_the_run_bitwise() {
    let tmp = tempfile::tempdir().unwrap();
    // f16 under the dynamic loss scale; a rate this large overflows step 3's scaled gradients.
    let f16 = "train.precision=\"f16\"";
    let lr = "train.learning_rate=0.5";
    let whole_dir = tmp.path().join("whole");
    let whole = adam_gpt(
        &whole_dir,
        DP2,
        6,
        &[f16, lr, "output.save_checkpoint_steps=3"],
    );
    let (_, _, reference) = train_report(&whole);
    let read_state = |dir: &Path| TrainState::read(dir).unwrap().expect("a training state");
    let step3 = whole_dir.join("checkpoint_step_3");
    let saved = read_state(&step3);
    assert!(
        saved.optimizer_steps < saved.global_step,
        "the dynamic loss scale skipped a step by step 3: {saved:?}"
    );
    let end = read_state(&whole_dir);
    // The same model's dp 2 × mp 2 strategy, as MindSpore protobuf (no shapes, no dtypes).
    let layout_dir = tmp.path().join("dp2-mp2");
    std::fs::create_dir(&layout_dir).unwrap();
    let (_, proto) = Session::new(&adam_gpt(&layout_dir, DP2_MP2, 6, &[f16, lr]))
        .unwrap()
        .save_strategy_files(&layout_dir)
        .unwrap();
    let cases = [
        ("merged", None, None),
        ("sharded", Some(proto.as_path()), None),
        (
            "sharded-ckpt",
            Some(proto.as_path()),
            Some(ckpt::Format::Ckpt),
        ),
    ];
    for (name, dst_strategy, format) in cases {
        let dst = tmp.path().join(name);
        let opts = ckpt::ConvertOptions {
            format,
            ..Default::default()
        };
        let src_strategy = step3.join("strategy.json");
        ckpt::convert_checkpoints(&step3, &src_strategy, &dst, dst_strategy, &opts).unwrap();
        let marker = ckpt::check_set(&dst).unwrap().expect("a committed set");
        let listed = |file: &str| marker.entries.iter().any(|e| e == file);
        assert!(
            listed("train_state.json") && listed("model.json"),
            "{name}: {marker:?}"
        );
        assert_eq!(
            listed("strategy.json"),
            dst_strategy.is_some(),
            "{name}: {marker:?}"
        );
        assert_eq!(read_state(&dst), saved, "{name}");
        if let Some(proto) = dst_strategy {
            // Written as Tessera JSON, the protobuf's parameters with their shapes bound.
            let written = ckpt::Strategy::load(&dst.join("strategy.json")).unwrap();
            assert_eq!(written.flavour, ckpt::StrategyFlavour::Tessera, "{name}");
            let names = |s: &ckpt::Strategy| {
                let mut v: Vec<String> = s.params.iter().map(|p| p.name.clone()).collect();
                v.sort();
                v
            };
            assert_eq!(
                names(&written),
                names(&ckpt::Strategy::load(proto).unwrap())
            );
        }
        let resumed_dir = tmp.path().join(format!("resumed-{name}"));
        let from = format!("output.resume_from=\"{}\"", dst.display());
        let (_, _, continued) = train_report(&adam_gpt(&resumed_dir, DP2, 6, &[f16, lr, &from]));
        assert_eq!(
            continued.0[..],
            reference.0[3..],
            "{name}: losses of steps 4–6"
        );
        assert_eq!(continued.1, reference.1, "{name}: parameters after step 6");
        let state = read_state(&resumed_dir);
        assert_eq!(
            (state.global_step, state.optimizer_steps, state.loss_scale),
            (end.global_step, end.optimizer_steps, end.loss_scale),
            "{name}: the optimizer counted the saved steps, not global_step"
        );
    }
}

/// A set whose `train_state.json` is not a training state (a conversion carries it as it is,
/// never parsing it) is refused before any rank starts, naming the file.
#[test]
fn a_malformed_training_state_is_refused_before_training_naming_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let from = tmp.path().join("set");
    let set = ckpt::SetWriter::begin(&from, "ckpt convert", false).unwrap();
    let step = tensor::Tensor::from_vec(&[1], vec![3i32]).unwrap();
    ckpt::save_rank_checkpoint_in_set(set.staging(), set.id(), 0, &[("global_step", &step)])
        .unwrap();
    ckpt::save_side_file(
        &set.staged(Path::new("train_state.json")),
        b"{\"format\":",
        false,
    )
    .unwrap();
    set.commit().unwrap();
    let resume = format!("output.resume_from=\"{}\"", from.display());
    let cfg = adam_gpt(&tmp.path().join("out"), DP2, 6, &[&resume]);
    let session = Session::new(&cfg).unwrap();
    let err = runtime::train_local(&session, &runtime::LaunchOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&from.join("train_state.json").display().to_string()),
        "{err}"
    );
    assert!(
        !tmp.path().join("out").join("rank_0").exists(),
        "nothing trained: {err}"
    );
}

/// Trains `config` (which saves no final set) to its end.
fn train_report_without_final(config: &runtime::TrainConfig) {
    let session = Session::new(config).unwrap();
    let options = runtime::LaunchOptions {
        print_loss: false,
        ..runtime::LaunchOptions::default()
    };
    runtime::train_local(&session, &options).unwrap();
}

/// `keep_checkpoint_max = 2` over 5 sets leaves the newest two, whole.
#[test]
fn keep_checkpoint_max_keeps_the_newest_whole_sets() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let cfg = adam_gpt(
        &out,
        DP2,
        5,
        &[
            "output.save_checkpoint_steps=1",
            "output.keep_checkpoint_max=2",
        ],
    );
    train_report(&cfg);
    let mut kept: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("checkpoint_step_"))
        .collect();
    kept.sort();
    assert_eq!(kept, vec!["checkpoint_step_4", "checkpoint_step_5"]);
    for k in &kept {
        assert!(ckpt::check_set(&out.join(k)).unwrap().is_some(), "{k}");
    }
}

/// `"latest"` in a directory holding no set of a training run is refused naming the key.
#[test]
fn latest_without_a_set_is_refused_naming_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = adam_gpt(tmp.path(), DP2, 2, &["output.resume_from=\"latest\""]);
    let session = Session::new(&cfg).unwrap();
    match session.resume_dir() {
        Err(RuntimeError::Config { key, reason }) => {
            assert_eq!(key, "output.resume_from");
            assert!(reason.contains("latest"), "{reason}");
        }
        other => panic!("expected a config error, got {other:?}"),
    }
}

/// `train.eval_interval = 2` over a 4-step epoch evaluates after steps 2 and 4; the second
/// is the epoch's own evaluation (the same parameters, the same validation windows).
#[test]
fn eval_interval_evaluates_every_n_steps() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = adam_gpt(
        tmp.path(),
        DP2,
        4,
        &[
            "data.steps_per_epoch=4",
            "train.eval=true",
            "train.eval_interval=2",
        ],
    );
    let (_, report, _) = train_report(&cfg);
    let rank = &report.ranks[0];
    let steps: Vec<u64> = rank.step_evals.iter().map(|e| e.global_step).collect();
    assert_eq!(steps, vec![2, 4]);
    assert_eq!(rank.eval_losses.len(), 1);
    assert_eq!(rank.step_evals[1].eval_loss, Some(rank.eval_losses[0]));
    assert_ne!(rank.step_evals[0].eval_loss, rank.step_evals[1].eval_loss);
}

/// In deterministic mode a periodic set of a data-parallel run (2 devices) resumed on one
/// device continues bitwise the uninterrupted one-device run.
#[test]
fn a_deterministic_resume_continues_across_device_counts() {
    let tmp = tempfile::tempdir().unwrap();
    let det = "train.deterministic=true";
    let every2 = "output.save_checkpoint_steps=2";
    let one = "devices = 1\nmode = \"semi_auto\"\nmodel_parallel = 1\n";
    let (_, _, reference) = train_report(&adam_gpt(&tmp.path().join("one"), one, 4, &[det]));
    let two = tmp.path().join("two");
    train_report(&adam_gpt(&two, DP2, 2, &[det, every2]));
    let from = format!(
        "output.resume_from=\"{}\"",
        two.join("checkpoint_step_2").display()
    );
    let (_, _, resumed) = train_report(&adam_gpt(
        &tmp.path().join("resumed"),
        one,
        4,
        &[det, &from],
    ));
    assert_eq!(resumed.0[..], reference.0[2..], "losses of steps 3 and 4");
    assert_eq!(resumed.1, reference.1, "parameters after step 4");
}

/// `output.save_checkpoint_seconds = 1` (no step interval) saves a whole set whenever a second
/// has passed on any rank: a run of a few seconds leaves timed sets, each committed whole, its
/// training state at the step its name says.
#[test]
fn save_checkpoint_seconds_saves_whole_sets_by_the_clock() {
    let tmp = tempfile::tempdir().unwrap();
    let mut steps = 20;
    // Long enough for at least two seconds of training on this machine, whatever its speed.
    let (out, seconds) = loop {
        let out = tmp.path().join(format!("run_{steps}"));
        let cfg = adam_gpt(
            &out,
            DP2,
            steps,
            &["output.save_checkpoint_seconds=1", "train.epochs=100000"],
        );
        let start = std::time::Instant::now();
        train_report(&cfg);
        let seconds = start.elapsed().as_secs_f64();
        if seconds >= 2.5 || steps >= 20 * 4usize.pow(8) {
            break (out, seconds);
        }
        // Aim at three seconds from the speed just seen (at least four times more steps).
        let wanted = (3.0 / seconds.max(1e-3) * steps as f64).ceil() as usize;
        steps = wanted.max(steps * 4);
    };
    assert!(seconds >= 2.5, "{steps} steps took only {seconds} s");
    let mut sets: Vec<u64> = std::fs::read_dir(&out)
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            name.strip_prefix("checkpoint_step_")?.parse().ok()
        })
        .collect();
    sets.sort_unstable();
    assert!(
        sets.len() >= 2 && sets.iter().all(|&s| s <= steps as u64),
        "{seconds:.1} s of training left a timed set per second or so: {sets:?}"
    );
    for &step in &sets {
        let dir = out.join(format!("checkpoint_step_{step}"));
        assert!(ckpt::check_set(&dir).unwrap().is_some(), "{step}: whole");
        let state = runtime::periodic_ckpt::TrainState::read(&dir)
            .unwrap()
            .unwrap();
        assert_eq!(state.global_step, step);
    }
}
