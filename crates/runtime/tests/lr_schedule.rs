//! Learning-rate schedules against MindSpore's and MindFormers' formulas at every step (values
//! computed by hand from the formulas in `mindspore/nn/dynamic_lr.py` and
//! `mindformers/core/lr/lr_schedule.py`), their errors, and the rate a run logs per step.

use std::path::PathBuf;

use runtime::{LaunchOptions, LrDecay, LrSchedule, RuntimeError, Session};

use crate::config::{parse_with, MINIMAL};

fn schedule(learning_rate: f64, warmup_steps: u64, decay: LrDecay) -> LrSchedule {
    LrSchedule {
        learning_rate,
        warmup_steps,
        warmup_lr_init: 0.0,
        step_per_epoch: 1,
        decay,
    }
}

/// The rates of steps `0..want.len()` equal `want` (to 1e-12: the formulas are evaluated in f64).
fn assert_rates(what: &str, s: &LrSchedule, run_steps: u64, want: &[f64]) {
    s.validate().unwrap_or_else(|e| panic!("{what}: {e}"));
    for (i, &w) in want.iter().enumerate() {
        let got = s.learning_rate(i as u64, run_steps);
        assert!(
            (got - w).abs() <= 1e-12,
            "{what}: step {i}: got {got}, want {w}"
        );
    }
}

#[test]
fn warmup_lr_is_mindspore_s() {
    // MindSpore's docstring example: nn.warmup_lr(0.1, 6, 2, 2) = [0, 0, 0.05, 0.05, 0.1, 0.1].
    let mut s = schedule(0.1, 0, LrDecay::WarmupLr { warmup_epoch: 2 });
    s.step_per_epoch = 2;
    assert_rates(
        "warmup_lr",
        &s,
        6,
        &[0.0, 0.0, 0.05, 0.05, 0.1, 0.1, 0.1, 0.1],
    );
}

#[test]
fn cosine_decay_lr_is_mindspore_s_and_holds_min_lr_past_decay_epoch() {
    // nn.cosine_decay_lr(0.01, 0.1, 6, 2, 2) = [0.1, 0.1, 0.055, 0.055, 0.01, 0.01]; MindSpore
    // clamps the epoch at decay_epoch, so later steps stay at min_lr.
    let mut s = schedule(
        0.1,
        0,
        LrDecay::CosineDecayLr {
            min_lr: 0.01,
            decay_epoch: 2,
        },
    );
    s.step_per_epoch = 2;
    assert_rates(
        "cosine_decay_lr",
        &s,
        6,
        &[0.1, 0.1, 0.055, 0.055, 0.01, 0.01, 0.01, 0.01, 0.01],
    );
}

#[test]
fn polynomial_decay_lr_with_and_without_update_decay_epoch() {
    let poly = |update_decay_epoch| {
        schedule(
            0.1,
            0,
            LrDecay::PolynomialDecayLr {
                end_learning_rate: 0.01,
                decay_epoch: 2,
                power: 0.5,
                update_decay_epoch,
            },
        )
    };
    let half = 0.09 * 0.5f64.sqrt() + 0.01; // (0.1 − 0.01)(1 − 1/2)^0.5 + 0.01
    let mut s = poly(false);
    s.step_per_epoch = 2;
    // Epochs 0,0,1,1,2,2,3: the epoch clamps at decay_epoch = 2.
    assert_rates(
        "polynomial_decay_lr",
        &s,
        7,
        &[0.1, 0.1, half, half, 0.01, 0.01, 0.01],
    );
    // update_decay_epoch, one step per epoch: the period becomes 2·max(ceil(e/2), 1):
    // e = 3 → (1 − 3/4)^0.5, e = 5 → (1 − 5/6)^0.5.
    assert_rates(
        "polynomial_decay_lr update_decay_epoch",
        &poly(true),
        6,
        &[
            0.1,
            half,
            0.01,
            0.09 * 0.25f64.sqrt() + 0.01,
            0.01,
            0.09 * (1.0f64 / 6.0).sqrt() + 0.01,
        ],
    );
}

#[test]
fn exponential_decay_lr_smooth_and_stair() {
    // nn.exponential_decay_lr(0.1, 0.9, 6, 2, 1) = [0.1, 0.1, 0.09, 0.09, 0.081, 0.081].
    let exp = |decay_epoch, is_stair| {
        schedule(
            0.1,
            0,
            LrDecay::ExponentialDecayLr {
                decay_rate: 0.9,
                decay_epoch,
                is_stair,
            },
        )
    };
    let mut s = exp(1, false);
    s.step_per_epoch = 2;
    assert_rates("exponential", &s, 6, &[0.1, 0.1, 0.09, 0.09, 0.081, 0.081]);
    let root = 0.1 * 0.9f64.sqrt();
    assert_rates(
        "exponential e/2",
        &exp(2, false),
        4,
        &[0.1, root, 0.09, 0.9 * root],
    );
    assert_rates(
        "exponential stair",
        &exp(2, true),
        5,
        &[0.1, 0.1, 0.09, 0.09, 0.081],
    );
}

#[test]
fn piecewise_constant_lr_and_a_run_past_its_last_milestone() {
    // nn.piecewise_constant_lr([2, 5, 10], [0.1, 0.05, 0.01]).
    let s = schedule(
        0.1,
        0,
        LrDecay::PiecewiseConstantLr {
            milestone: vec![2, 5, 10],
            learning_rates: vec![0.1, 0.05, 0.01],
        },
    );
    let mut want = vec![0.1, 0.1, 0.05, 0.05, 0.05];
    want.extend([0.01; 5]);
    assert_rates("piecewise", &s, 10, &want);
    s.check_run_steps(10).unwrap();
    let err = s.check_run_steps(11).unwrap_err();
    assert_eq!(config_key(err), "train.milestone");
}

#[test]
fn mindformers_cosine_with_warm_up() {
    let cosine = |warmup_steps, lr_end, decay_steps| {
        schedule(
            0.005,
            warmup_steps,
            LrDecay::CosineWithWarmUp {
                lr_end,
                decay_steps,
                num_cycles: 0.5,
            },
        )
    };
    // MindFormers' docstring setting: learning_rate 0.005, warmup 10, total 20.
    let mut want: Vec<f64> = (0..10).map(|i| 0.005 * i as f64 / 10.0).collect();
    want.extend((10..20).map(|i| {
        let progress = (i - 10) as f64 / 10.0;
        0.005 * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
    }));
    want.push(0.0); // step ≥ total_steps: lr_end
    assert_rates("cosine", &cosine(10, 0.0, None), 20, &want);
    // Hand values: step 15 is half-way down the cosine, step 19 is 0.5(1 + cos 0.9π) of it.
    let s = cosine(10, 0.001, None);
    assert!((s.learning_rate(15, 20) - 0.003).abs() < 1e-15);
    let at_19 = 0.001 + 0.004 * 0.5 * (1.0 - 0.951_056_516_295_153_5);
    assert!((s.learning_rate(19, 20) - at_19).abs() < 1e-15);
    // Warm-up 0, and decay_steps (4) shorter than the run (10): min_lr from step 4 on.
    let mut s = cosine(0, 0.001, Some(4));
    s.learning_rate = 1.0;
    let c = |x: f64| 0.001 + 0.999 * 0.5 * (1.0 + (std::f64::consts::PI * x).cos());
    let mut want = vec![1.0, c(0.25), c(0.5), c(0.75)];
    want.extend([0.001; 6]);
    assert_rates("cosine decay_steps < run", &s, 10, &want);
    // warmup_lr_init: the warm-up starts there.
    let mut s = cosine(4, 0.0, Some(8));
    s.learning_rate = 1.0;
    s.warmup_lr_init = 0.2;
    assert_rates("cosine warmup_lr_init", &s, 8, &[0.2, 0.4, 0.6, 0.8, 1.0]);
    // A warm-up that does not end before an explicit decay_steps is refused, naming the key.
    let err = cosine(20, 0.0, Some(20)).check_run_steps(40).unwrap_err();
    assert_eq!(config_key(err), "train.warmup_steps");
    // Without decay_steps, a run shorter than the warm-up is all warm-up.
    let mut s = cosine(10, 0.0, None);
    s.learning_rate = 1.0;
    s.check_run_steps(4).unwrap();
    assert_rates(
        "cosine, a run inside its warm-up",
        &s,
        4,
        &[0.0, 0.1, 0.2, 0.3],
    );
}

#[test]
fn warm_up_before_a_mindspore_schedule_shifts_it() {
    // warmup_steps = 2, then nn.cosine_decay_lr(0.01, 0.1, …, 1, 2) from step 2 on: the list
    // `warmup + decay` a MindSpore user concatenates.
    let s = schedule(
        0.1,
        2,
        LrDecay::CosineDecayLr {
            min_lr: 0.01,
            decay_epoch: 2,
        },
    );
    assert_rates(
        "warm-up + cosine_decay_lr",
        &s,
        6,
        &[0.0, 0.05, 0.1, 0.055, 0.01, 0.01],
    );
    let s = schedule(1.0, 4, LrDecay::Constant);
    assert_rates(
        "warm-up + constant",
        &s,
        6,
        &[0.0, 0.25, 0.5, 0.75, 1.0, 1.0],
    );
}

fn config_key(err: RuntimeError) -> String {
    match err {
        RuntimeError::Config { key, .. } | RuntimeError::ConfigFile { key, .. } => key,
        other => panic!("expected a config error, got {other}"),
    }
}

/// The config keys and their errors: each bad value names its key.
#[test]
fn bad_schedule_values_name_their_key() {
    let cases: &[(&[&str], &str)] = &[
        (&["train.warmup_steps=-1"], "train.warmup_steps"),
        (
            &["train.lr_schedule=\"cosine\"", "train.min_lr=0.5"],
            "train.min_lr",
        ),
        (
            &["train.lr_schedule=\"cosine\"", "train.min_lr=-0.1"],
            "train.min_lr",
        ),
        (
            &[
                "train.lr_schedule=\"cosine_decay_lr\"",
                "train.decay_epoch=2",
                "train.min_lr=0.1",
            ],
            "train.min_lr",
        ),
        (
            &["train.lr_schedule=\"cosine\"", "train.decay_steps=0"],
            "train.decay_steps",
        ),
        (
            &["train.lr_schedule=\"cosine\"", "train.num_cycles=0"],
            "train.num_cycles",
        ),
        (
            &["train.lr_schedule=\"cosine_decay_lr\""],
            "train.decay_epoch",
        ),
        (
            &[
                "train.lr_schedule=\"cosine_decay_lr\"",
                "train.decay_epoch=0",
            ],
            "train.decay_epoch",
        ),
        (
            &[
                "train.lr_schedule=\"warmup_lr\"",
                "train.warmup_epoch=2",
                "train.step_per_epoch=0",
            ],
            "train.step_per_epoch",
        ),
        (
            &[
                "train.lr_schedule=\"warmup_lr\"",
                "train.warmup_epoch=2",
                "train.warmup_steps=3",
            ],
            "train.warmup_steps",
        ),
        (
            &[
                "train.lr_schedule=\"exponential_decay_lr\"",
                "train.decay_epoch=1",
                "train.decay_rate=0",
            ],
            "train.decay_rate",
        ),
        (
            &[
                "train.lr_schedule=\"polynomial_decay_lr\"",
                "train.decay_epoch=1",
                "train.power=0",
            ],
            "train.power",
        ),
        (
            &[
                "train.lr_schedule=\"piecewise_constant_lr\"",
                "train.milestone=[2, 2]",
                "train.learning_rates=[0.1, 0.05]",
            ],
            "train.milestone",
        ),
        (
            &[
                "train.lr_schedule=\"piecewise_constant_lr\"",
                "train.milestone=[2]",
                "train.learning_rates=[0.1, 0.05]",
            ],
            "train.milestone",
        ),
        (&["train.lr_schedule=\"linear\""], "train.lr_schedule"),
        (
            &["train.warmup_steps=2", "train.warmup_lr_init=0.5"],
            "train.warmup_lr_init",
        ),
        (&["train.no_weight_decay=[\"\"]"], "train.no_weight_decay"),
    ];
    for (overrides, key) in cases {
        let err = parse_with(MINIMAL, overrides).expect_err(&format!("{overrides:?} is refused"));
        assert_eq!(config_key(err), *key, "{overrides:?}");
    }
    // A key of another schedule is reported as having no effect, not silently dropped.
    let config = parse_with(MINIMAL, &["train.decay_rate=0.5"]).unwrap();
    assert!(
        config
            .warnings()
            .iter()
            .any(|w| w.contains("train.decay_rate") && w.contains("constant")),
        "{:?}",
        config.warnings()
    );
}

/// A run logs the rate of every step, the schedule's (MindFormers' cosine here, checked
/// against the formula written out), and a resumed run continues it from its global step.
#[test]
fn a_run_logs_the_schedule_s_rate_per_step_and_a_resume_continues_it() {
    let out = std::env::temp_dir().join(format!("tessera-lr-run-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let schedule_keys = [
        "train.lr_schedule=\"cosine\"",
        "train.warmup_steps=3",
        "train.min_lr=0.002",
        "train.decay_steps=10",
        "train.max_steps=12",
    ];
    let parallel = "devices = 2\nmode = \"data_parallel\"";
    let logged = |dir: &PathBuf, extra: &[&str]| -> Vec<f64> {
        let mut keys: Vec<&str> = schedule_keys.to_vec();
        keys.extend(extra);
        let config = crate::run_util::seed_mlp(dir, "sgd", parallel, &keys);
        let session = Session::new(&config).unwrap();
        let log = dir.join("log.jsonl");
        let options = LaunchOptions {
            print_loss: false,
            metrics_log: Some(log.clone()),
            ..LaunchOptions::default()
        };
        runtime::train_local(&session, &options).unwrap();
        std::fs::read_to_string(&log)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .filter_map(|v| v.get("lr").and_then(|lr| lr.as_f64()))
            .collect()
    };
    let full = logged(&out.join("full"), &[]);
    let want: Vec<f64> = (0..12)
        .map(|i| match i {
            0..=2 => 0.02 * i as f64 / 3.0,
            3..=9 => {
                let progress = (i - 3) as f64 / 7.0;
                0.002 + 0.018 * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
            }
            _ => 0.002,
        })
        .collect();
    assert_eq!(full.len(), 12);
    for (i, (g, w)) in full.iter().zip(&want).enumerate() {
        assert!((g - w).abs() < 1e-15, "step {i}: logged {g}, formula {w}");
    }
    // Stop after 5 steps, resume to 12: steps 6..12 take the same rates.
    let first = out.join("first");
    logged(&first, &["train.max_steps=5"]);
    let from = format!("output.resume_from=\"{}\"", first.display());
    let resumed = logged(&out.join("resumed"), &[&from]);
    assert_eq!(resumed, full[5..], "the resumed run continues the schedule");
    let _ = std::fs::remove_dir_all(&out);
}

/// A schedule that does not fit the run is refused when the session is built (what
/// `--explain` and every front end do before any rank starts), naming the key.
#[test]
fn a_schedule_that_does_not_fit_the_run_is_refused_before_any_rank_starts() {
    let tmp = tempfile::tempdir().unwrap();
    let refused = |overrides: &[&str], key: &str| {
        let overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
        let config = crate::run_util::small_gpt(tmp.path(), "sgd", "", "", &overrides);
        match runtime::Session::new(&config) {
            Ok(_) => panic!("{overrides:?}: the session builds"),
            Err(e) => assert!(e.to_string().contains(key), "{overrides:?}: {e}"),
        }
    };
    refused(
        &[
            "train.lr_schedule=\"cosine\"",
            "train.warmup_steps=10",
            "train.decay_steps=5",
        ],
        "train.warmup_steps",
    );
    // 20 steps, rates for 3.
    refused(
        &[
            "train.lr_schedule=\"piecewise_constant_lr\"",
            "train.milestone=[2, 3]",
            "train.learning_rates=[0.1, 0.01]",
        ],
        "train.milestone",
    );
}
