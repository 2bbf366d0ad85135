//! The resume sweep's generator: one GPT model and training drawn from the GPT sweep's space,
//! two parallel layouts A and B from one space (every family of `gpt_case`, and threads per
//! rank), A training 1 to [`MAX_FIRST`] steps and saving a checkpoint (its final set, or a
//! periodic one of a longer run), B resuming it (`output.resume_from`, converted on load, or
//! `"latest"` in A's own directory) for 1 to [`MAX_SECOND`] more, and the one-device reference
//! that must give both runs' bits uninterrupted (`docs/DETERMINISM.md`).

use std::path::Path;

use crate::layout_draw::{draw_semi_auto, set_pipeline, Pipeline, SemiAuto, MAX_DEVICES};
use crate::model::{draw_gpt_model, GptModel};
use crate::{draw_fusion, draw_hsdp, draw_recompute, draw_schedule, Config, Rng};

/// The most steps layout A trains before its checkpoint.
pub const MAX_FIRST: usize = 3;
/// The most steps layout B trains after resuming (the reference trains both runs' steps).
pub const MAX_SECOND: usize = 2;

/// The model's sizes a layout must divide.
struct Model {
    /// Whether the vocabulary can be split (the byte tokenizer's 256 entries).
    vocab_parallel: bool,
    gpt: GptModel,
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
pub struct ResumeCase {
    /// Steps A trains before the checkpoint B resumes, and steps B trains after it.
    pub steps: (usize, usize),
    /// Steps A trains (one more than `steps.0` when B resumes a periodic set).
    pub a_steps: usize,
    /// Layout A's configuration (it saves the checkpoint B resumes).
    pub a: Config,
    /// Layout B's configuration, resuming A's checkpoint (`output.resume_from`).
    pub b: Config,
    /// The one-device reference, trained for both runs' steps without a stop.
    pub reference: Config,
    /// Both layouts' families, `A -> B` (for the log).
    pub family: String,
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
    if rng.chance(0.35) && model.gpt.layers > 1 {
        let mut stages = rng.pick(&[2, 2, 3, 4, 4, 8]);
        while stages > model.gpt.layers {
            stages = if stages == 3 { 2 } else { stages / 2 };
        }
        let mut mp = rng.pick(&[1, 1, 2, 2, 4]);
        if !model.gpt.heads.is_multiple_of(mp) || !model.gpt.ffn.is_multiple_of(mp) {
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
        let pipeline = Pipeline {
            stages,
            dp,
            mp,
            micro: split,
            scheduler,
        };
        set_pipeline(
            rng,
            &mut c,
            &pipeline,
            (&model.gpt, model.vocab_parallel),
            0.35,
        );
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
            let SemiAuto { dp, mp, cp } =
                draw_semi_auto(rng, &mut c, &model.gpt, model.vocab_parallel);
            devices = dp * mp * cp;
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
    if devices > 1 {
        draw_fusion(rng, &mut c, 0.2);
    }
    Layout {
        keys: c,
        accumulates,
        batch_unit: unit,
        family,
    }
}

/// Draws case `index` of `seed`; `out` holds its output directories.
/// Draws case `index` of `seed` training on the text at `text` (the bundled
/// `data/kjv/kjv.txt.gz`); `out` holds its output directories (`a/`, `b/`, `reference/`).
pub fn draw_resume_case(seed: u64, index: usize, text: &Path, out: &Path) -> ResumeCase {
    let mut rng = Rng::for_case(seed, index as u64);
    let mut c = Config::default();

    // The model, shared by both layouts and the reference.
    let gpt = draw_gpt_model(&mut rng, &mut c, 6);
    // The char tokenizer's vocabulary of the bundled text (73) divides no model-parallel
    // degree: vocabulary parallel only with bytes (256), or the layout would be refused.
    let char_tokens = rng.chance(0.3);
    c.set_str("data.tokenizer", if char_tokens { "char" } else { "byte" });
    let model = Model {
        vocab_parallel: !char_tokens,
        gpt,
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
    c.set_str("data.path", &text.display().to_string());
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
    let optimizer = rng.pick(&["adam", "adamw", "momentum", "mint_adamw", "lamb"]);
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
    if optimizer == "adam" {
        // MindSpore's nn.Adam flags: AMSGrad (a third state, vhat) or Nesterov's step.
        match rng.pick(&["plain", "use_amsgrad", "use_nesterov"]) {
            "plain" => {}
            flag => c.set(&format!("train.{flag}"), true),
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
    ResumeCase {
        steps,
        a_steps: steps.0 + usize::from(periodic),
        a: first,
        b: second,
        reference,
        family: format!("{} -> {}", a.family, b.family),
    }
}
