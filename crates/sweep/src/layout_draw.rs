//! The layout draws both sweeps share: a `semi_auto` layout's data, model and context parallel
//! degrees with their switches, and a pipeline's keys once its degrees are drawn.

use crate::model::GptModel;
use crate::{divisors, Config, Rng};

/// The most devices a layout uses (each a thread, or a process, on this machine).
pub const MAX_DEVICES: usize = 16;

/// A `semi_auto` layout's degrees.
pub(crate) struct SemiAuto {
    /// Data parallel.
    pub dp: usize,
    /// Model parallel.
    pub mp: usize,
    /// Context parallel (1 when none).
    pub cp: usize,
}

/// Draws a `semi_auto` layout of `gpt` into `c` (`parallel.devices` and the degrees; context
/// parallel by Ulysses or the ring, which needs the fused attention and no dropout; sequence
/// parallel; vocabulary parallel when `vocab_parallel`; expert parallel), at most
/// [`MAX_DEVICES`] devices.
pub(crate) fn draw_semi_auto(
    rng: &mut Rng,
    c: &mut Config,
    gpt: &GptModel,
    vocab_parallel: bool,
) -> SemiAuto {
    let mps: Vec<usize> = [1, 2, 4, 8]
        .into_iter()
        .filter(|&d| gpt.heads.is_multiple_of(d) && gpt.ffn.is_multiple_of(d))
        .collect();
    let mut mp = rng.pick(&mps);
    let mut cp = if gpt.seq_len.is_multiple_of(2) {
        rng.pick(&[1, 1, 2, 4])
    } else {
        1
    };
    if !gpt.seq_len.is_multiple_of(cp) {
        cp = 1;
    }
    let mut algo = None;
    if cp > 1 {
        let mut a = Some(rng.pick(&["ulysses", "ring"]));
        if a == Some("ulysses") && !gpt.heads.is_multiple_of(mp * cp) {
            a = Some("ring");
        }
        if a == Some("ring") && (gpt.dropout || gpt.unfused) {
            a = gpt.heads.is_multiple_of(mp * cp).then_some("ulysses");
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
    c.set("parallel.devices", dp * mp * cp);
    c.set("parallel.data_parallel", dp);
    c.set("parallel.model_parallel", mp);
    if let Some(algo) = algo {
        c.set("parallel.context_parallel", cp);
        c.set_str("parallel.context_parallel_algo", algo);
    }
    if mp > 1 && rng.chance(0.4) && gpt.seq_len.is_multiple_of(mp * cp) {
        c.set("parallel.use_seq_parallel", true);
    }
    if mp > 1 && vocab_parallel && rng.chance(0.35) {
        c.set("parallel.vocab_emb_dp", false);
    }
    if let Some(experts) = gpt.experts {
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
    SemiAuto { dp, mp, cp }
}

/// A pipeline's drawn degrees and schedule.
pub(crate) struct Pipeline {
    /// Stages.
    pub stages: usize,
    /// Data parallel inside a stage.
    pub dp: usize,
    /// Model parallel inside a stage.
    pub mp: usize,
    /// Micro-batches per step.
    pub micro: usize,
    /// The scheduler's name.
    pub scheduler: &'static str,
}

/// Sets pipeline `p`'s keys in `c` (`semi_auto` on `stages · dp · mp` devices) and draws its
/// switches: output broadcast, vocabulary parallel (when `vocab_parallel`), sequence parallel,
/// and an optimizer-sharding level with odds `hsdp_odds`.
pub(crate) fn set_pipeline(
    rng: &mut Rng,
    c: &mut Config,
    p: &Pipeline,
    (gpt, vocab_parallel): (&GptModel, bool),
    hsdp_odds: f64,
) {
    c.set_str("parallel.mode", "semi_auto");
    c.set("parallel.devices", p.stages * p.mp * p.dp);
    c.set("parallel.data_parallel", p.dp);
    c.set("parallel.model_parallel", p.mp);
    c.set("parallel.pipeline.stages", p.stages);
    c.set("parallel.pipeline.micro_batches", p.micro);
    c.set_str("parallel.pipeline.scheduler", p.scheduler);
    if rng.chance(0.25) {
        c.set("parallel.pipeline.output_broadcast", true);
    }
    if p.mp > 1 && vocab_parallel && rng.chance(0.4) {
        c.set("parallel.vocab_emb_dp", false);
    }
    if p.mp > 1 && gpt.seq_len.is_multiple_of(p.mp) && rng.chance(0.4) {
        c.set("parallel.use_seq_parallel", true);
    }
    if p.dp > 1 && rng.chance(hsdp_odds) {
        let level = rng.pick(&["level1", "level2", "level3", "zero1", "zero2"]);
        c.set_str("parallel.hsdp.optimizer_level", level);
        c.set("parallel.hsdp.threshold", 0);
    }
}
