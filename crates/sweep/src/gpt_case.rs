//! The GPT sweep's generator: a training configuration drawn from the whole parallel space
//! (pipelines under every scheduler with virtual stages and data and model parallel inside a
//! stage; data, model and context parallel by ring and Ulysses; sequence and vocabulary
//! parallel; experts; the `data_parallel` mode and the three searches; `[parallel.hsdp]`;
//! recompute; fused and overlapped buckets; micro-batch interleave; gradient accumulation;
//! every optimizer and learning-rate schedule) in deterministic mode, and the one-device
//! reference that must give its bits: the same config in `stand_alone` mode whose gradient
//! accumulation runs the pipeline's and the interleave's micro-batches.

use std::path::Path;

use crate::layout_draw::{draw_semi_auto, set_pipeline, Pipeline, SemiAuto};
use crate::model::draw_gpt_model;
use crate::{draw_fusion, draw_hsdp, draw_recompute, draw_schedule, Config, Rng};

/// Steps each case trains.
pub const STEPS: usize = 2;

/// One case: the parallel configuration and its one-device reference.
pub struct GptCase {
    /// Which generator's space it came from (`pipeline`, or the mode's name).
    pub family: &'static str,
    /// The parallel configuration.
    pub parallel: Config,
    /// Its one-device reference (`docs/DETERMINISM.md`).
    pub reference: Config,
}

/// Draws case `index` of `seed`, training [`STEPS`] steps of the text at `text` (the bundled
/// `data/kjv/kjv.txt.gz`); `out` holds its output directories (`parallel/`, `reference/`).
pub fn draw_gpt_case(seed: u64, index: usize, text: &Path, out: &Path) -> GptCase {
    let mut rng = Rng::for_case(seed, index as u64);
    let pipelined = rng.chance(0.4);
    let mut c = Config::default();

    // The model.
    let gpt = draw_gpt_model(&mut rng, &mut c, if pipelined { 8 } else { 4 });
    let (heads, ffn) = (gpt.heads, gpt.ffn);

    // The strategy: `micro` micro-batches of a pipeline, `interleave` of
    // `micro_batch_interleave`, both run by the reference as gradient accumulation.
    let (devices, batch, micro, interleave, family);
    if pipelined {
        family = "pipeline";
        let mut stages = rng.pick(&[1, 2, 2, 3, 4, 4, 8]);
        let mut mp = if heads.is_multiple_of(2) {
            rng.pick(&[1, 1, 2, 2, 4])
        } else {
            1
        };
        if !heads.is_multiple_of(mp) || !ffn.is_multiple_of(mp) {
            mp = 1;
        }
        let mut dp = rng.pick(&[1, 1, 2, 2, 4]);
        while stages * mp * dp > 16 {
            if dp > 1 {
                dp /= 2;
            } else if mp > 1 {
                mp /= 2;
            } else {
                stages /= 2;
            }
        }
        let scheduler = rng.pick(&["gpipe", "1f1b", "zero_bubble", "interleaved_1f1b"]);
        let mut m = rng.range(1, 16);
        if scheduler == "interleaved_1f1b" || (scheduler == "gpipe" && rng.chance(0.3)) {
            c.set("parallel.pipeline.interleave", true);
            c.set("parallel.pipeline.virtual_stages", rng.pick(&[2, 2, 3, 4]));
            if scheduler == "interleaved_1f1b" {
                m = (m / stages).max(1) * stages;
                if m > 16 {
                    m -= stages;
                }
            }
        }
        let per = rng.pick(&[1, 1, 2]);
        let mut b = m * per * dp;
        if rng.chance(0.2) {
            b *= 2;
        }
        devices = stages * mp * dp;
        let pipeline = Pipeline {
            stages,
            dp,
            mp,
            micro: m,
            scheduler,
        };
        set_pipeline(&mut rng, &mut c, &pipeline, (&gpt, true), 0.3);
        (batch, micro, interleave) = (b, m, 1);
    } else {
        let weights = [
            ("semi_auto", 6),
            ("data_parallel", 1),
            ("sharding_propagation", 1),
            ("dynamic_programming", 1),
            ("recursive_programming", 1),
        ];
        let mut draw = rng.range(1, 10);
        let mode = weights
            .iter()
            .find(|(_, w)| {
                let here = draw <= *w;
                draw = draw.saturating_sub(*w);
                here
            })
            .unwrap()
            .0;
        family = mode;
        c.set_str("parallel.mode", mode);
        let unit;
        if mode == "semi_auto" {
            let SemiAuto { dp, mp, cp } = draw_semi_auto(&mut rng, &mut c, &gpt, true);
            devices = dp * mp * cp;
            unit = dp * cp;
        } else {
            devices = if mode == "data_parallel" {
                rng.pick(&[2, 4, 8])
            } else {
                rng.pick(&[2, 4, 8, 16])
            };
            c.set("parallel.devices", devices);
            // The searches and `data_parallel` split the batch on every device.
            unit = devices;
        }
        let inter = rng.pick(&[1, 1, 1, 2]);
        if inter > 1 {
            c.set("parallel.micro_batch_interleave", inter);
        }
        let mut b = unit * inter * rng.pick(&[1, 2, 3]);
        while b < 2 {
            b *= 2;
        }
        let accumulate = rng.pick(&[1, 1, 2, 3]);
        if accumulate > 1 {
            c.set("train.grad_accumulation_steps", accumulate);
        }
        if rng.chance(0.25) {
            draw_recompute(&mut rng, &mut c);
        }
        (batch, micro, interleave) = (b, 1, inter);
    }
    if pipelined && rng.chance(0.25) {
        c.set("parallel.recompute.cells", "[\"blocks.*\"]");
    }

    // Switches of every strategy.
    if rng.chance(0.2) {
        c.set("parallel.deterministic_blocks", rng.pick(&[4, 8, 32, 64]));
    }
    if !pipelined && devices > 1 && rng.chance(0.3) {
        draw_hsdp(&mut rng, &mut c, devices);
    }
    if devices > 1 {
        draw_fusion(&mut rng, &mut c, 0.25);
    }

    // The data and the training.
    c.set_str("data.format", "text");
    c.set_str("data.path", &text.display().to_string());
    c.set_str(
        "data.tokenizer",
        if rng.chance(0.3) { "char" } else { "byte" },
    );
    c.set("data.batch_size", batch);
    c.set("data.steps_per_epoch", 100);
    c.set("data.eval_batches", 1);
    let optimizer = rng.pick(&["adam", "adamw", "momentum", "mint_adamw", "lamb"]);
    c.set("train.epochs", 1);
    c.set("train.max_steps", STEPS);
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
    if rng.chance(0.15) {
        c.set("train.threads_per_rank", 2);
    }
    draw_schedule(&mut rng, &mut c, optimizer, None);
    // The validation loss after the last step tests its parameters too; the reference of
    // micro-batches evaluates batches of its own (smaller) size, so only without them.
    if micro * interleave == 1 && rng.chance(0.5) {
        c.set("train.eval", true);
    }
    c.set("output.save_checkpoint", false);

    // The one-device reference: the same model, data and training, with the pipeline's and
    // the interleave's micro-batches as gradient accumulation.
    let mut reference = c.clone();
    reference.0.retain(|k, _| !k.starts_with("parallel."));
    reference.set_str("parallel.mode", "stand_alone");
    reference.set("parallel.devices", 1);
    if let Some(blocks) = c.0.get("parallel.deterministic_blocks") {
        reference.set("parallel.deterministic_blocks", blocks);
    }
    let split = micro * interleave;
    if split > 1 {
        let accumulate = c.usize("train.grad_accumulation_steps").unwrap_or(1);
        reference.set("data.batch_size", batch / split);
        reference.set("train.grad_accumulation_steps", accumulate * split);
    }
    c.set_str("output.dir", &out.join("parallel").display().to_string());
    reference.set_str("output.dir", &out.join("reference").display().to_string());
    GptCase {
        family,
        parallel: c,
        reference,
    }
}
