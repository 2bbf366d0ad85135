//! Draws shared by the sweeps: optimizer sharding, recomputation, learning-rate schedules.

use crate::{Config, Rng};

/// The divisors of `n`.
pub fn divisors(n: usize) -> Vec<usize> {
    (1..=n).filter(|&d| n.is_multiple_of(d)).collect()
}

/// Draws an `[parallel.hsdp]` level with threshold 0 and a shard size (`-1`, or a divisor of
/// `devices` above 1) into `c`.
pub fn draw_hsdp(rng: &mut Rng, c: &mut Config, devices: usize) {
    let level = rng.pick(&["level1", "level2", "level3", "zero1", "zero2"]);
    let sizes: Vec<i64> = std::iter::once(-1)
        .chain(
            divisors(devices)
                .into_iter()
                .filter(|&d| d > 1)
                .map(|d| d as i64),
        )
        .collect();
    c.set_str("parallel.hsdp.optimizer_level", level);
    c.set("parallel.hsdp.threshold", 0);
    c.set("parallel.hsdp.shard_size", rng.pick(&sizes));
}

/// Draws recomputation, of the blocks or of the GeLUs (even odds), into `c`.
pub fn draw_recompute(rng: &mut Rng, c: &mut Config) {
    if rng.chance(0.5) {
        c.set("parallel.recompute.cells", "[\"blocks.*\"]");
    } else {
        c.set("parallel.recompute.ops", "[\"GeLU\"]");
    }
}

/// Draws a weight decay for an AdamW, Adam or Lamb `optimizer` (Lamb's enters the update norm
/// of its trust ratio, which every layout must sum over the whole parameter), a learning-rate
/// schedule (`cosine` decaying over `cosine_decay_steps` when given, else over the run) and, in
/// most cases, a gradient clipping norm (or a bound no step reaches, so the norm is logged) into
/// `c`.
pub fn draw_schedule(
    rng: &mut Rng,
    c: &mut Config,
    optimizer: &str,
    cosine_decay_steps: Option<usize>,
) {
    if (optimizer.ends_with("adamw") || matches!(optimizer, "adam" | "lamb")) && rng.chance(0.5) {
        c.set("train.weight_decay", "0.1");
    }
    match rng.pick(&[
        "constant",
        "cosine",
        "warmup_lr",
        "polynomial_decay_lr",
        "exponential_decay_lr",
        "piecewise_constant_lr",
        "cosine_decay_lr",
    ]) {
        "constant" => {}
        "cosine" => {
            c.set_str("train.lr_schedule", "cosine");
            c.set("train.warmup_steps", 1);
            if let Some(steps) = cosine_decay_steps {
                c.set("train.decay_steps", steps);
            }
            c.set("train.min_lr", "0.0001");
        }
        "warmup_lr" => {
            c.set_str("train.lr_schedule", "warmup_lr");
            c.set("train.warmup_epoch", 3);
        }
        "polynomial_decay_lr" => {
            c.set_str("train.lr_schedule", "polynomial_decay_lr");
            c.set("train.decay_epoch", 3);
            c.set("train.min_lr", "0.0001");
        }
        "exponential_decay_lr" => {
            c.set_str("train.lr_schedule", "exponential_decay_lr");
            c.set("train.decay_epoch", 2);
            c.set("train.decay_rate", "0.5");
        }
        "piecewise_constant_lr" => {
            c.set_str("train.lr_schedule", "piecewise_constant_lr");
            c.set("train.milestone", "[2, 5]");
            c.set("train.learning_rates", "[0.01, 0.001]");
        }
        schedule => {
            c.set_str("train.lr_schedule", schedule);
            c.set("train.decay_epoch", 3);
            c.set("train.min_lr", "0.0001");
        }
    }
    // A gradient norm to compare in most cases: clipping, or a bound no step reaches.
    if rng.chance(0.75) {
        c.set("train.max_grad_norm", rng.pick(&["0.1", "1.0", "1e6"]));
    }
}

/// With odds `odds`, fused gradient buckets (`[parallel.comm_fusion]`, by size or automatic)
/// and, in most of those, their all-reduces overlapped with the backward pass, into `c`.
pub fn draw_fusion(rng: &mut Rng, c: &mut Config, odds: f64) {
    if !rng.chance(odds) {
        return;
    }
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
