//! A seeded random sweep of resumes across parallel layouts in deterministic mode.
//!
//! Each case draws one GPT model and training (the space of `config_sweep.rs`: heads, widths,
//! sequence lengths, dropout, experts, every optimizer and learning-rate schedule, clipping)
//! and two parallel layouts A and B from one space (pipelines under every scheduler with
//! virtual stages and data and model parallel inside a stage; data, model and context parallel
//! by ring and Ulysses; sequence and vocabulary parallel; expert parallel; the `data_parallel`
//! mode and the three searches; every `[parallel.hsdp]` level with shard sizes; recompute,
//! fused and overlapped buckets; micro-batch interleave; threads per rank). It trains 1 to
//! [`MAX_FIRST`] steps on A with `train.deterministic = true`, saving a checkpoint, resumes that
//! checkpoint (its final set, or a periodic one of a longer run, or `"latest"` in place) on B
//! (`output.resume_from`, converted on load) for 1 to [`MAX_SECOND`] more, and trains the one-device reference
//! `docs/DETERMINISM.md` describes for all of them uninterrupted (the micro-batches of a
//! pipeline or of the interleave as gradient accumulation; both layouts of a case cut a step
//! into the same micro-batches, and either may run them as gradient accumulation of smaller
//! batches instead). Every step's loss, gradient norm and count of
//! dropped expert choices, the validation loss after the last step and every element of every
//! parameter B saves must be the reference's bit for bit.
//!
//! A layout the engine refuses must be refused naming a `parallel.`, `model.`, `train.` or
//! `data.` key; a resume refused on a layout accepted on its own (an error naming
//! `output.resume_from`), a panic, a hang (a collective timeout, or a case over its deadline)
//! or an error naming no key fails the sweep.
//!
//! `TESSERA_RESUME_SWEEP_CASES` (default [`DEFAULT_CASES`]) and `TESSERA_RESUME_SWEEP_SEED`
//! (default [`DEFAULT_SEED`]) set the number of cases and the seed of a longer run;
//! `TESSERA_RESUME_SWEEP_ONLY=3,17` runs only those case indices of the seed (each case is
//! drawn from its own generator, so one reproduces alone). A failure prints the seed, the case
//! index and the three configurations as TOML (`tessera train <file>` runs them; B's
//! `output.resume_from` names A's `output.dir`, or the periodic set `checkpoint_step_<N>/` in it
//! when A trains a step past the set B resumes, or is `"latest"` when B continues in A's own
//! `output.dir`).

use std::collections::BTreeMap;
use std::path::Path;

use runtime::Session;

use crate::run_util;
use sweep::{draw_resume_case, Config, ResumeCase, MAX_FIRST, MAX_SECOND};

use crate::sweep_util::{names_a_key, open, run_sweep, train, Outcome, Stop, SweepCase, Verdict};

/// The default seed of the sweep.
const DEFAULT_SEED: u64 = 20_261_207;
/// The default number of cases (under a minute in a debug test build on 2 cores).
const DEFAULT_CASES: usize = 36;
/// Draws case `index` of `seed` (the shared generator's resume case); `out` holds its outputs.
fn draw(seed: u64, index: usize, out: &Path) -> ResumeCase {
    draw_resume_case(seed, index, &run_util::kjv(), out)
}

/// `first` followed by `next` (the resumed run's steps).
fn followed_by(mut first: Outcome, next: Outcome) -> Outcome {
    first.losses.extend(next.losses);
    first.grad_norms.extend(next.grad_norms);
    first.moe_dropped.extend(next.moe_dropped);
    first.eval_losses = next.eval_losses;
    first.global_step = next.global_step;
    first
}

/// The first `steps` steps of `outcome`, as a run of that many steps without validation would
/// give.
fn prefix(outcome: &Outcome, steps: usize) -> Outcome {
    let cut = |n: usize| n.min(steps);
    Outcome {
        losses: outcome.losses[..cut(outcome.losses.len())].to_vec(),
        grad_norms: outcome.grad_norms[..cut(outcome.grad_norms.len())].to_vec(),
        moe_dropped: outcome.moe_dropped[..cut(outcome.moe_dropped.len())].to_vec(),
        eval_losses: Vec::new(),
        global_step: steps as u64,
    }
}

/// The parameters `session` saved in `out`, merged into full tensors, as bits by name.
fn saved_params(session: &Session, out: &Path) -> Result<BTreeMap<String, Vec<u32>>, String> {
    let params = run_util::try_merged_params(out, &run_util::param_names(session))?;
    Ok(params
        .into_iter()
        .map(|(name, values)| (name, values.iter().map(|x| x.to_bits()).collect()))
        .collect())
}

/// Opens a layout's config: a refusal naming a key is the verdict `Refused`.
fn open_layout(which: &str, config: &Config) -> Result<Session, Verdict> {
    open(config).map_err(|(Stop::Refused(e) | Stop::Failed(e))| {
        if names_a_key(&e) {
            Verdict::Refused(format!("layout {which}: {e}"))
        } else {
            Verdict::Failed(format!(
                "layout {which} refused without naming a config key: {e}"
            ))
        }
    })
}

/// Runs `case`: both layouts opened (or refused), the reference, A, and B resumed from A.
impl SweepCase for ResumeCase {
    fn label(&self) -> String {
        self.family.clone()
    }

    fn configs(&self) -> String {
        format!(
            "--- layout A ({} steps, B resumes step {}) ---\n{}--- layout B (resumed from A) ---\n{}\
             --- one-device reference ---\n{}",
            self.a_steps,
            self.steps.0,
            self.a.toml(),
            self.b.toml(),
            self.reference.toml()
        )
    }

    fn run(&self) -> Verdict {
        run_case(self)
    }
}

fn run_case(case: &ResumeCase) -> Verdict {
    let a = match open_layout("A", &case.a) {
        Ok(s) => s,
        Err(v) => return v,
    };
    // B on its own (no checkpoint to resume yet): a refusal of the layout itself.
    let mut alone = case.b.clone();
    alone.0.remove("output.resume_from");
    if let Err(v) = open_layout("B", &alone) {
        return v;
    }
    drop(alone);
    let reference = match open(&case.reference).and_then(|s| {
        let outcome = train(&s, case.steps.0 + case.steps.1)?;
        Ok((s, outcome))
    }) {
        Ok(r) => r,
        Err(Stop::Refused(e)) | Err(Stop::Failed(e)) => {
            return Verdict::Failed(format!(
                "both layouts are accepted but the one-device reference fails: {e}"
            ))
        }
    };
    let first = match train(&a, case.a_steps) {
        Ok(outcome) => outcome,
        Err(Stop::Refused(e)) => return Verdict::Refused(format!("layout A: {e}")),
        Err(Stop::Failed(e)) => return Verdict::Failed(format!("training A failed: {e}")),
    };
    let resumed = match open(&case.b).and_then(|s| {
        let outcome = train(&s, case.steps.1)?;
        Ok((s, outcome))
    }) {
        Ok(r) => r,
        Err(Stop::Refused(e)) if !e.contains("output.") && !e.contains("resum") => {
            return Verdict::Refused(format!("layout B: {e}"))
        }
        Err(Stop::Refused(e)) | Err(Stop::Failed(e)) => {
            return Verdict::Failed(format!("resuming A's checkpoint on B failed: {e}"))
        }
    };
    let a_prefix = prefix(&reference.1, case.a_steps);
    if first != a_prefix {
        return Verdict::Failed(format!(
            "A alone is not one device's bits:\n  A:         {}\n  reference: {}",
            first.describe(),
            a_prefix.describe()
        ));
    }
    let got = followed_by(prefix(&first, case.steps.0), resumed.1);
    if got != reference.1 {
        return Verdict::Failed(format!(
            "A then B is not one device's bits:\n  A then B:  {}\n  reference: {}",
            got.describe(),
            reference.1.describe()
        ));
    }
    let params = |s: &Session, c: &Config| {
        let dir = c.0["output.dir"].trim_matches('"').to_string();
        saved_params(s, Path::new(&dir))
    };
    let (mine, theirs) = match (
        params(&resumed.0, &case.b),
        params(&reference.0, &case.reference),
    ) {
        (Ok(m), Ok(t)) => (m, t),
        (Err(e), _) | (_, Err(e)) => return Verdict::Failed(format!("the parameters: {e}")),
    };
    if mine.keys().ne(theirs.keys()) {
        return Verdict::Failed(format!(
            "B saved parameters {:?}, the reference {:?}",
            mine.keys().collect::<Vec<_>>(),
            theirs.keys().collect::<Vec<_>>()
        ));
    }
    for (name, bits) in &mine {
        let want = &theirs[name];
        let differ = bits.iter().zip(want).filter(|(x, y)| x != y).count();
        if differ > 0 || bits.len() != want.len() {
            return Verdict::Failed(format!(
                "B's final {name} differs from the reference in {differ} of {} elements",
                want.len()
            ));
        }
    }
    Verdict::Same
}

/// The sweep: training on one drawn layout and resuming on another is bitwise one device
/// trained without a stop, or a layout is refused naming a key.
#[test]
fn resuming_on_another_random_layout_is_bitwise_one_device_or_refused_naming_a_key() {
    run_sweep(
        "resume sweep",
        "RESUME_SWEEP",
        (DEFAULT_SEED, DEFAULT_CASES),
        draw,
    );
}

/// The generator draws both sides of a resume from every family (pipelines, context parallel,
/// optimizer shards, experts, the searches), layouts that differ, and references whose
/// accumulation runs the layouts' micro-batches.
#[test]
fn the_resume_sweep_reaches_every_family_on_both_sides() {
    let out = Path::new("/resume-sweep");
    let drawn: Vec<ResumeCase> = (0..1000).map(|i| draw(DEFAULT_SEED, i, out)).collect();
    let quoted = |v: &str| format!("\"{v}\"");
    for (side, pick) in [
        ("A", (|c: &ResumeCase| &c.a) as fn(&ResumeCase) -> &Config),
        ("B", |c: &ResumeCase| &c.b),
    ] {
        let has = |key: &str, value: &str| {
            drawn
                .iter()
                .any(|c| pick(c).0.get(key).map(String::as_str) == Some(value))
        };
        for (key, value) in [
            ("parallel.mode", quoted("data_parallel")),
            ("parallel.mode", quoted("sharding_propagation")),
            ("parallel.mode", quoted("dynamic_programming")),
            ("parallel.mode", quoted("recursive_programming")),
            ("parallel.pipeline.scheduler", quoted("interleaved_1f1b")),
            ("parallel.pipeline.scheduler", quoted("zero_bubble")),
            ("parallel.context_parallel_algo", quoted("ring")),
            ("parallel.context_parallel_algo", quoted("ulysses")),
            ("parallel.hsdp.optimizer_level", quoted("level3")),
            ("parallel.hsdp.optimizer_level", quoted("zero2")),
            ("parallel.expert_parallel", "2".to_string()),
            ("parallel.use_seq_parallel", "true".to_string()),
            ("parallel.vocab_emb_dp", "false".to_string()),
            ("parallel.micro_batch_interleave", "2".to_string()),
            ("parallel.pipeline.micro_batches", "4".to_string()),
            ("train.threads_per_rank", "2".to_string()),
        ] {
            assert!(has(key, &value), "{side}: {key} = {value} is never drawn");
        }
    }
    // Layouts that differ, also in device count; a pipeline resumed without one.
    let differ = drawn
        .iter()
        .filter(|c| c.a.usize("parallel.devices") != c.b.usize("parallel.devices"))
        .count();
    assert!(differ * 2 > drawn.len(), "{differ} of {}", drawn.len());
    assert!(drawn.iter().any(|c| {
        c.a.usize("parallel.pipeline.stages") > Some(1)
            && c.b.usize("parallel.pipeline.stages").is_none()
    }));
    assert!(
        drawn
            .iter()
            .any(|c| c.a_steps > c.steps.0
                && c.b.0["output.resume_from"].contains("checkpoint_step_"))
    );
    assert!(drawn
        .iter()
        .any(|c| c.a.usize("data.steps_per_epoch") == Some(c.steps.0)));
    assert!(drawn.iter().any(|c| {
        c.b.0["output.resume_from"] == quoted("latest")
            && c.b.0["output.dir"] == c.a.0["output.dir"]
    }));
    // Micro-batches of a pipeline or an interleave resumed as accumulation, and back.
    for (x, y) in [(0, 1), (1, 0)] {
        assert!(drawn.iter().any(|c| {
            let sides = [&c.a, &c.b];
            let pipes = |p: &Config| p.usize("parallel.pipeline.micro_batches") > Some(1);
            let interleaves = |p: &Config| p.usize("parallel.micro_batch_interleave") > Some(1);
            (pipes(sides[x]) || interleaves(sides[x]))
                && sides[y].usize("data.batch_size") < sides[x].usize("data.batch_size")
        }));
    }
    for c in &drawn {
        let split = |p: &Config| {
            p.usize("parallel.pipeline.micro_batches").unwrap_or(1)
                * p.usize("parallel.micro_batch_interleave").unwrap_or(1)
        };
        let (a, b, r) = (&c.a, &c.b, &c.reference);
        assert_eq!(r.0["parallel.mode"], quoted("stand_alone"));
        let accumulate = |c: &Config| c.usize("train.grad_accumulation_steps").unwrap_or(1);
        // Each layout's step: the reference's micro-batches, as many, in the same order.
        for l in [a, b] {
            assert_eq!(accumulate(l) * split(l), accumulate(r));
            assert_eq!(
                l.usize("data.batch_size").unwrap(),
                r.usize("data.batch_size").unwrap() * split(l)
            );
        }
        let (first, second) = c.steps;
        assert!((1..=MAX_FIRST).contains(&first) && (1..=MAX_SECOND).contains(&second));
        assert_eq!(a.usize("train.max_steps"), Some(c.a_steps));
        assert!(c.a_steps == first || a.usize("output.save_checkpoint_steps") == Some(first));
        assert_eq!(b.usize("train.max_steps"), Some(first + second));
        assert_eq!(r.usize("train.max_steps"), Some(first + second));
        // Everything but the layout is the same in all three.
        for (key, value) in &a.0 {
            if !key.starts_with("parallel.")
                && !key.starts_with("output.")
                && !matches!(
                    key.as_str(),
                    "train.max_steps"
                        | "train.eval"
                        | "train.grad_accumulation_steps"
                        | "train.threads_per_rank"
                )
                && key != "data.batch_size"
            {
                assert_eq!(b.0.get(key), Some(value), "{key}");
                assert_eq!(r.0.get(key), Some(value), "{key}");
            }
        }
    }
}
