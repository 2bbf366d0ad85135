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
use crate::sweep_util::{
    divisors, draw_hsdp, draw_recompute, draw_schedule, names_a_key, open, run_sweep, train,
    Config, Outcome, Rng, Stop, SweepCase, Verdict,
};

/// The default seed of the sweep.
const DEFAULT_SEED: u64 = 20_261_207;
/// The default number of cases (under a minute in a debug test build on 2 cores).
const DEFAULT_CASES: usize = 36;
/// The most steps layout A trains before its checkpoint.
const MAX_FIRST: usize = 3;
/// The most steps layout B trains after resuming (the reference trains both runs' steps).
const MAX_SECOND: usize = 2;
/// The most devices a layout uses (each a thread on this machine).
const MAX_DEVICES: usize = 16;

/// The model's sizes a layout must divide.
struct Model {
    vocab_parallel: bool,
    heads: usize,
    seq_len: usize,
    layers: usize,
    ffn: usize,
    dropout: bool,
    unfused: bool,
    experts: Option<usize>,
}

/// One drawn layout: its `parallel.` keys, what the batch must be a multiple of, and its
/// family (for the log).
struct Layout {
    keys: Config,
    /// Whether it runs a step's micro-batches as gradient accumulation of smaller batches.
    accumulates: bool,
    batch_unit: usize,
    family: String,
}

/// One case: layout A's run, B's resumed run and the one-device reference.
struct Case {
    /// Steps A trains before the checkpoint B resumes, and steps B trains after it.
    steps: (usize, usize),
    /// Steps A trains (one more than `steps.0` when B resumes a periodic set).
    a_steps: usize,
    a: Config,
    b: Config,
    reference: Config,
    family: String,
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Draws a layout of `model` whose steps are cut into `split` micro-batches (pipeline
/// micro-batches, or `micro_batch_interleave`).
fn draw_layout(rng: &mut Rng, model: &Model, split: usize) -> Layout {
    let mut c = Config::default();
    let (devices, unit, family);
    let mut accumulates = false;
    if rng.chance(0.35) && model.layers > 1 {
        let mut stages = rng.pick(&[2, 2, 3, 4, 4, 8]);
        while stages > model.layers {
            stages = if stages == 3 { 2 } else { stages / 2 };
        }
        let mut mp = rng.pick(&[1, 1, 2, 2, 4]);
        if !model.heads.is_multiple_of(mp) || !model.ffn.is_multiple_of(mp) {
            mp = 1;
        }
        let mut dp = rng.pick(&[1, 1, 2, 2, 4]);
        while stages * mp * dp > MAX_DEVICES {
            if dp > 1 {
                dp /= 2;
            } else {
                mp /= 2;
            }
        }
        let mut schedulers = vec!["gpipe", "1f1b", "zero_bubble"];
        if split.is_multiple_of(stages) {
            schedulers.push("interleaved_1f1b");
        }
        let scheduler = rng.pick(&schedulers);
        if scheduler == "interleaved_1f1b" || (scheduler == "gpipe" && rng.chance(0.3)) {
            c.set("parallel.pipeline.interleave", true);
            c.set("parallel.pipeline.virtual_stages", rng.pick(&[2, 2, 3]));
        }
        devices = stages * mp * dp;
        c.set_str("parallel.mode", "semi_auto");
        c.set("parallel.devices", devices);
        c.set("parallel.data_parallel", dp);
        c.set("parallel.model_parallel", mp);
        c.set("parallel.pipeline.stages", stages);
        c.set("parallel.pipeline.micro_batches", split);
        c.set_str("parallel.pipeline.scheduler", scheduler);
        if rng.chance(0.25) {
            c.set("parallel.pipeline.output_broadcast", true);
        }
        if mp > 1 && model.vocab_parallel && rng.chance(0.4) {
            c.set("parallel.vocab_emb_dp", false);
        }
        if mp > 1 && model.seq_len.is_multiple_of(mp) && rng.chance(0.4) {
            c.set("parallel.use_seq_parallel", true);
        }
        if dp > 1 && rng.chance(0.35) {
            let level = rng.pick(&["level1", "level2", "level3", "zero1", "zero2"]);
            c.set_str("parallel.hsdp.optimizer_level", level);
            c.set("parallel.hsdp.threshold", 0);
        }
        if rng.chance(0.2) {
            c.set("parallel.recompute.cells", "[\"blocks.*\"]");
        }
        family = format!("pipeline {stages}x{dp}x{mp} {scheduler}");
        unit = dp * split;
    } else {
        let mode = rng.pick(&[
            "semi_auto",
            "semi_auto",
            "semi_auto",
            "semi_auto",
            "semi_auto",
            "semi_auto",
            "data_parallel",
            "sharding_propagation",
            "dynamic_programming",
            "recursive_programming",
        ]);
        c.set_str("parallel.mode", mode);
        let per;
        if mode == "semi_auto" {
            let mps: Vec<usize> = [1, 2, 4, 8]
                .into_iter()
                .filter(|&d| model.heads.is_multiple_of(d) && model.ffn.is_multiple_of(d))
                .collect();
            let mut mp = rng.pick(&mps);
            let mut cp = if model.seq_len.is_multiple_of(2) {
                rng.pick(&[1, 1, 2, 4])
            } else {
                1
            };
            if !model.seq_len.is_multiple_of(cp) {
                cp = 1;
            }
            let mut algo = None;
            if cp > 1 {
                let mut a = Some(rng.pick(&["ulysses", "ring"]));
                if a == Some("ulysses") && !model.heads.is_multiple_of(mp * cp) {
                    a = Some("ring");
                }
                // The ring needs the fused attention and no dropout (the model is shared).
                if a == Some("ring") && (model.dropout || model.unfused) {
                    a = model.heads.is_multiple_of(mp * cp).then_some("ulysses");
                }
                if a.is_none() {
                    cp = 1;
                }
                algo = a;
            }
            while mp * cp > MAX_DEVICES {
                mp /= 2;
            }
            let dps: Vec<usize> = [1, 2, 4, 8]
                .into_iter()
                .filter(|d| d * mp * cp <= MAX_DEVICES)
                .collect();
            let dp = rng.pick(&dps);
            devices = dp * mp * cp;
            c.set("parallel.devices", devices);
            c.set("parallel.data_parallel", dp);
            c.set("parallel.model_parallel", mp);
            if let Some(algo) = algo {
                c.set("parallel.context_parallel", cp);
                c.set_str("parallel.context_parallel_algo", algo);
            }
            if mp > 1 && rng.chance(0.4) && model.seq_len.is_multiple_of(mp * cp) {
                c.set("parallel.use_seq_parallel", true);
            }
            if mp > 1 && model.vocab_parallel && rng.chance(0.35) {
                c.set("parallel.vocab_emb_dp", false);
            }
            if let Some(experts) = model.experts {
                if dp > 1 && rng.chance(0.7) {
                    let eps: Vec<usize> = divisors(dp)
                        .into_iter()
                        .filter(|&d| experts.is_multiple_of(d))
                        .collect();
                    let ep = rng.pick(&eps);
                    if ep > 1 {
                        c.set("parallel.expert_parallel", ep);
                    }
                }
            }
            family = format!("semi_auto dp{dp} mp{mp} cp{cp}");
            per = dp * cp;
        } else {
            devices = rng.pick(&[2, 4, 8]);
            c.set("parallel.devices", devices);
            family = format!("{mode} on {devices}");
            // The searches and `data_parallel` split the batch on every device.
            per = devices;
        }
        // The micro-batches as `micro_batch_interleave`, or as gradient accumulation of
        // batches `split` times smaller (one device's way, under this layout).
        if split > 1 && rng.chance(0.3) {
            accumulates = true;
        } else if split > 1 {
            c.set("parallel.micro_batch_interleave", split);
        }
        if rng.chance(0.2) {
            draw_recompute(rng, &mut c);
        }
        if devices > 1 && rng.chance(0.35) {
            draw_hsdp(rng, &mut c, devices);
        }
        unit = per * split;
    }
    // Not a layout key, but how a rank runs: its bits may not depend on it.
    if rng.chance(0.15) {
        c.set("train.threads_per_rank", 2);
    }
    if devices > 1 && rng.chance(0.2) {
        c.set("parallel.comm_fusion.openstate", true);
        let allreduce = if rng.chance(0.5) {
            "{ mode = \"auto\" }"
        } else {
            "{ mode = \"size\", config = 1 }"
        };
        c.set("parallel.comm_fusion.allreduce", allreduce);
        if rng.chance(0.6) {
            c.set("parallel.overlap.grad_computation_allreduce_overlap", true);
        }
    }
    Layout {
        keys: c,
        accumulates,
        batch_unit: unit,
        family,
    }
}

/// Draws case `index` of `seed`; `out` holds its output directories.
fn draw(seed: u64, index: usize, out: &Path) -> Case {
    let mut rng = Rng::for_case(seed, index as u64);
    let mut c = Config::default();

    // The model, shared by both layouts and the reference.
    let heads: usize = rng.pick(&[1, 2, 3, 4, 6, 8, 2, 4]);
    let widths: Vec<usize> = (16..=64usize)
        .step_by(4)
        .filter(|&h| h.is_multiple_of(heads))
        .collect();
    let hidden = rng.pick(&widths);
    let seq_len: usize = rng.pick(&[8, 9, 12, 15, 16, 20, 24, 32]);
    let layers = rng.range(1, 6);
    c.set_str("model.name", "gpt");
    c.set("model.layers", layers);
    c.set("model.heads", heads);
    c.set("model.hidden", hidden);
    c.set("model.seq_len", seq_len);
    c.set("model.tie_embeddings", rng.chance(0.7));
    let dropout = rng.chance(0.25);
    let mut unfused = false;
    if dropout {
        c.set("model.dropout", "0.1");
    } else if rng.chance(0.2) {
        c.set("model.fused_attention", false);
        unfused = true;
    }
    let mut ffn = 4 * hidden;
    if rng.chance(0.3) {
        ffn = rng.pick(&[24, 48, 64, 96]);
        c.set("model.ffn_hidden", ffn);
    }
    let experts: Option<usize> = rng.chance(0.25).then(|| rng.pick(&[2, 4, 8]));
    if let Some(experts) = experts {
        c.set("model.moe.experts", experts);
        c.set("model.moe.top_k", rng.pick(&[1, 2]));
        let every = if layers > 1 { rng.pick(&[1, 1, 2]) } else { 1 };
        c.set("model.moe.every", every);
        if rng.chance(0.3) {
            c.set("model.moe.capacity_factor", rng.pick(&["1.0", "2.0"]));
        }
        if rng.chance(0.3) {
            c.set("model.moe.shared_expert", true);
        }
    }
    // The char tokenizer's vocabulary of the bundled text (73) divides no model-parallel
    // degree: vocabulary parallel only with bytes (256), or the layout would be refused.
    let char_tokens = rng.chance(0.3);
    c.set_str("data.tokenizer", if char_tokens { "char" } else { "byte" });
    let model = Model {
        vocab_parallel: !char_tokens,
        heads,
        seq_len,
        layers,
        ffn,
        dropout,
        unfused,
        experts,
    };

    // The two layouts: both cut a step into `split` micro-batches, which the reference runs
    // as gradient accumulation.
    let split = rng.pick(&[1, 1, 2, 4]);
    let a = draw_layout(&mut rng, &model, split);
    let b = draw_layout(&mut rng, &model, split);
    let lcm = a.batch_unit / gcd(a.batch_unit, b.batch_unit) * b.batch_unit;
    let mut batch = lcm * rng.pick(&[1, 1, 2]);
    while batch < 2 {
        batch *= 2;
    }
    let pipelined = |l: &Layout| l.keys.0.contains_key("parallel.pipeline.stages");
    let accumulate = if pipelined(&a) || pipelined(&b) {
        1
    } else {
        rng.pick(&[1, 1, 2])
    };
    if accumulate > 1 {
        c.set("train.grad_accumulation_steps", accumulate);
    }
    // Shared by all three runs: the canonical blocks fix the summation order.
    if rng.chance(0.2) {
        c.set("parallel.deterministic_blocks", rng.pick(&[4, 8, 32, 64]));
    }

    // The data and the training.
    c.set_str("data.format", "text");
    c.set_str("data.path", &run_util::kjv().display().to_string());
    c.set("data.batch_size", batch);
    // Epochs of 1 to 3 steps put the resume at or across an epoch's end (each step's windows
    // are a function of the seed, the epoch and the step).
    let steps_per_epoch = if rng.chance(0.3) {
        rng.range(1, 3)
    } else {
        100
    };
    c.set("data.steps_per_epoch", steps_per_epoch);
    c.set("data.eval_batches", 1);
    let optimizer = rng.pick(&["adam", "adamw", "momentum", "mint_adamw"]);
    c.set(
        "train.epochs",
        (MAX_FIRST + MAX_SECOND + 1).div_ceil(steps_per_epoch),
    );
    c.set_str("train.optimizer", optimizer);
    c.set("train.learning_rate", rng.pick(&["0.001", "0.003", "0.01"]));
    c.set("train.deterministic", true);
    c.set("train.eval", false);
    c.set("train.seed", rng.range(0, 1000));
    c.set("train.per_print_times", 0);
    if optimizer == "momentum" {
        c.set("train.momentum", "0.9");
        if rng.chance(0.5) {
            c.set("train.use_nesterov", true);
        }
    }
    // `decay_steps` defaults to the run's steps, which A's shorter run would change.
    draw_schedule(
        &mut rng,
        &mut c,
        optimizer,
        Some(MAX_FIRST + MAX_SECOND + 1),
    );
    // The validation loss after B's last step tests the resumed parameters; the reference of
    // micro-batches evaluates batches of its own (smaller) size, so only without them.
    // One validation after the last step: not after every short epoch (A would run some).
    let eval = split == 1 && steps_per_epoch == 100 && rng.chance(0.5);
    c.set("output.save_checkpoint", true);

    // The one-device reference: the same model, data and training for both halves, the
    // micro-batches as gradient accumulation.
    let mut reference = c.clone();
    reference.set_str("parallel.mode", "stand_alone");
    reference.set("parallel.devices", 1);
    if split > 1 {
        reference.set("data.batch_size", batch / split);
        reference.set("train.grad_accumulation_steps", accumulate * split);
    }
    let steps = (rng.range(1, MAX_FIRST), rng.range(1, MAX_SECOND));
    let total = steps.0 + steps.1;
    reference.set("train.max_steps", total);
    reference.set("train.eval", eval);
    reference.set_str("output.dir", &out.join("reference").display().to_string());

    let a_dir = out.join("a");
    // A layout that accumulates reads the reference's batches.
    let realize = |l: &Layout| {
        let mut keys = c.with(&l.keys);
        if l.accumulates {
            keys.set("data.batch_size", batch / split);
            keys.set("train.grad_accumulation_steps", accumulate * split);
        }
        keys
    };
    let mut first = realize(&a);
    first.set("train.max_steps", steps.0);
    first.set_str("output.dir", &a_dir.display().to_string());
    let mut second = realize(&b);
    second.set("train.max_steps", total);
    second.set("train.eval", eval);
    second.set_str("output.dir", &out.join("b").display().to_string());
    // Or A trains a step further, and B resumes its periodic set of step `steps.0`.
    let periodic = rng.chance(0.3);
    let mut from = a_dir.clone();
    if periodic {
        first.set("train.max_steps", steps.0 + 1);
        first.set("output.save_checkpoint_steps", steps.0);
        from = a_dir.join(format!("checkpoint_step_{}", steps.0));
    }
    second.set_str("output.resume_from", &from.display().to_string());
    // Or B continues in A's own directory from `"latest"` (an elastic restart on another
    // layout): its set replaces A's, rank folders and all.
    if !periodic && rng.chance(0.25) {
        second.set_str("output.dir", &a_dir.display().to_string());
        second.set_str("output.resume_from", "latest");
    }
    Case {
        steps,
        a_steps: steps.0 + usize::from(periodic),
        a: first,
        b: second,
        reference,
        family: format!("{} -> {}", a.family, b.family),
    }
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
impl SweepCase for Case {
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

fn run_case(case: &Case) -> Verdict {
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
    let drawn: Vec<Case> = (0..1000).map(|i| draw(DEFAULT_SEED, i, out)).collect();
    let quoted = |v: &str| format!("\"{v}\"");
    for (side, pick) in [
        ("A", (|c: &Case| &c.a) as fn(&Case) -> &Config),
        ("B", |c: &Case| &c.b),
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
