//! A seeded random sweep of parallel configurations against one device in deterministic mode.
//!
//! Each case draws a GPT configuration from one space covering pipelines (every scheduler,
//! virtual stages, data and model parallel inside a stage, output broadcast) and the other
//! strategies (data, model, context parallel by ring and Ulysses, sequence and vocabulary
//! parallel, experts, the three searches, the `data_parallel` mode, `[parallel.hsdp]`,
//! recompute, fused and overlapped buckets, micro-batch interleave, gradient accumulation, every
//! optimizer and learning-rate schedule), trains it for [`STEPS`] steps with
//! `train.deterministic = true`, and trains the one-device reference `docs/DETERMINISM.md`
//! describes: the same config in `stand_alone` mode whose gradient accumulation runs the
//! pipeline's micro-batches and the interleaved ones. Every step's loss, gradient norm and count
//! of dropped expert choices must be the reference's bit for bit. A configuration the engine
//! refuses must be refused with an error naming a `parallel.`, `model.`, `train.` or `data.`
//! key; a panic, a hang (a collective timeout, or a case over its deadline) or an error naming
//! no key fails the sweep.
//!
//! `TESSERA_SWEEP_CASES` (default [`DEFAULT_CASES`]) and `TESSERA_SWEEP_SEED` (default
//! [`DEFAULT_SEED`]) set the number of cases and the seed of a longer run;
//! `TESSERA_SWEEP_ONLY=3,17` runs only those case indices of the seed (each case is drawn from
//! its own generator, so one reproduces alone). A failure prints the seed, the case index and
//! both configurations as TOML (`tessera train <file>` runs them).

use std::path::Path;

use crate::run_util;
use sweep::{draw_gpt_case, Config, GptCase, STEPS};

use crate::sweep_util::{names_a_key, open, run_sweep, train, Stop, SweepCase, Verdict};

/// The default seed of the sweep.
const DEFAULT_SEED: u64 = 20_261_206;
/// The default number of cases (about a minute in a debug test build on 2 cores).
const DEFAULT_CASES: usize = 100;

/// Draws case `index` of `seed` (the shared generator's GPT case); `out` holds its outputs.
fn draw(seed: u64, index: usize, out: &Path) -> GptCase {
    draw_gpt_case(seed, index, &run_util::kjv(), out)
}

/// Runs `case`: the parallel config (refused, or trained) and then its reference.
impl SweepCase for GptCase {
    fn label(&self) -> String {
        let devices = self.parallel.usize("parallel.devices").unwrap_or(1);
        format!("{} on {devices} devices", self.family)
    }

    fn configs(&self) -> String {
        format!(
            "--- parallel config ---\n{}--- one-device reference ---\n{}",
            self.parallel.toml(),
            self.reference.toml()
        )
    }

    fn run(&self) -> Verdict {
        run_case(self)
    }
}

fn run_case(case: &GptCase) -> Verdict {
    let session = match open(&case.parallel) {
        Ok(session) => session,
        Err(Stop::Refused(e)) | Err(Stop::Failed(e)) => {
            return if names_a_key(&e) {
                Verdict::Refused(e)
            } else {
                Verdict::Failed(format!("refused without naming a config key: {e}"))
            };
        }
    };
    let reference = match open(&case.reference).and_then(|s| train(&s, STEPS)) {
        Ok(outcome) => outcome,
        Err(Stop::Refused(e)) | Err(Stop::Failed(e)) => {
            return Verdict::Failed(format!(
                "the parallel config is accepted but its one-device reference fails: {e}"
            ))
        }
    };
    match train(&session, STEPS) {
        Ok(got) if got == reference => Verdict::Same,
        Ok(got) => Verdict::Failed(format!(
            "not one device's bits:\n  parallel:  {}\n  reference: {}",
            got.describe(),
            reference.describe()
        )),
        Err(Stop::Refused(e)) => Verdict::Refused(e),
        Err(Stop::Failed(e)) => Verdict::Failed(format!("training failed: {e}")),
    }
}

/// The sweep: every drawn configuration is bitwise one device or refused naming a key.
#[test]
fn random_parallel_configurations_are_bitwise_one_device_or_refused_naming_a_key() {
    run_sweep("sweep", "SWEEP", (DEFAULT_SEED, DEFAULT_CASES), draw);
}

/// The generator reaches every mode, pipeline scheduler, context-parallel algorithm, optimizer
/// sharding level, optimizer, learning-rate schedule and switch of the two sweeps it joins, and
/// its references run the micro-batches as accumulation.
#[test]
fn the_sweep_reaches_every_mode_and_schedule() {
    let out = Path::new("/sweep");
    let drawn: Vec<GptCase> = (0..2000).map(|i| draw(DEFAULT_SEED, i, out)).collect();
    let has = |key: &str, value: &str| {
        drawn
            .iter()
            .any(|c| c.parallel.0.get(key).map(String::as_str) == Some(value))
    };
    let quoted = |v: &str| format!("\"{v}\"");
    let wanted: &[(&str, &[&str])] = &[
        (
            "parallel.mode",
            &[
                "semi_auto",
                "data_parallel",
                "sharding_propagation",
                "dynamic_programming",
                "recursive_programming",
            ],
        ),
        (
            "parallel.pipeline.scheduler",
            &["gpipe", "1f1b", "zero_bubble", "interleaved_1f1b"],
        ),
        ("parallel.context_parallel_algo", &["ring", "ulysses"]),
        (
            "parallel.hsdp.optimizer_level",
            &["level1", "level2", "level3", "zero1", "zero2"],
        ),
        (
            "train.optimizer",
            &["adam", "adamw", "momentum", "mint_adamw", "lamb"],
        ),
        (
            "train.lr_schedule",
            &[
                "cosine",
                "warmup_lr",
                "polynomial_decay_lr",
                "exponential_decay_lr",
                "piecewise_constant_lr",
                "cosine_decay_lr",
            ],
        ),
    ];
    for (key, values) in wanted {
        for value in *values {
            assert!(has(key, &quoted(value)), "{key} = {value} is never drawn");
        }
    }
    for (key, value) in [
        ("parallel.pipeline.interleave", "true"),
        ("parallel.pipeline.output_broadcast", "true"),
        ("parallel.use_seq_parallel", "true"),
        ("parallel.vocab_emb_dp", "false"),
        ("parallel.micro_batch_interleave", "2"),
        ("parallel.expert_parallel", "2"),
        (
            "parallel.overlap.grad_computation_allreduce_overlap",
            "true",
        ),
        ("parallel.recompute.ops", "[\"GeLU\"]"),
        ("parallel.recompute.cells", "[\"blocks.*\"]"),
        ("model.dropout", "0.1"),
        ("model.moe.shared_expert", "true"),
        ("train.grad_accumulation_steps", "3"),
        ("train.threads_per_rank", "2"),
        ("train.use_amsgrad", "true"),
        ("train.use_nesterov", "true"),
        ("train.eval", "true"),
    ] {
        assert!(has(key, value), "{key} = {value} is never drawn");
    }
    // Context parallel under each algorithm with data and model parallel; pipelines with
    // data and model parallel inside a stage.
    for algo in ["ring", "ulysses"] {
        assert!(
            drawn.iter().any(|c| {
                let p = &c.parallel;
                p.0.get("parallel.context_parallel_algo") == Some(&quoted(algo))
                    && p.usize("parallel.data_parallel") > Some(1)
                    && p.usize("parallel.model_parallel") > Some(1)
            }),
            "{algo} with dp and mp is never drawn"
        );
    }
    assert!(drawn.iter().any(|c| {
        let p = &c.parallel;
        p.usize("parallel.pipeline.stages") > Some(1)
            && p.usize("parallel.data_parallel") > Some(1)
            && p.usize("parallel.model_parallel") > Some(1)
    }));
    // Each reference: one device, and the pipeline's and the interleave's micro-batches as
    // gradient accumulation of the same samples per step.
    for c in &drawn {
        let (p, r) = (&c.parallel, &c.reference);
        assert_eq!(r.0["parallel.mode"], quoted("stand_alone"));
        let split = p.usize("parallel.pipeline.micro_batches").unwrap_or(1)
            * p.usize("parallel.micro_batch_interleave").unwrap_or(1);
        let accumulate = |c: &Config| c.usize("train.grad_accumulation_steps").unwrap_or(1);
        assert_eq!(accumulate(r), accumulate(p) * split);
        assert_eq!(
            r.usize("data.batch_size").unwrap() * split,
            p.usize("data.batch_size").unwrap()
        );
    }
}
