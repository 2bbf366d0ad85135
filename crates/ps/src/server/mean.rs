//! A sync step's pushes and their mean: the rows-weighted mean of the workers' gradients and
//! losses, and the step's learning rate (every push must carry the same).

use std::collections::BTreeMap;

use tensor::Tensor;

use crate::error::PsError;
use crate::sparse::Rows;

/// One worker's push of one step.
pub(super) struct Pushed {
    pub(super) rows: u64,
    pub(super) loss: f32,
    pub(super) replay: bool,
    /// The update's learning rate (the schedule's at the pushed step).
    pub(super) learning_rate: f64,
    pub(super) grads: Vec<Tensor>,
    /// Row-sparse gradients, one per server-resident table (empty when none).
    pub(super) sparse: Vec<Rows>,
}

/// Sync: the learning rate of step `step`, which every worker's push gives (the schedule is a
/// function of the step alone, so they agree).
pub(super) fn step_learning_rate(
    step: u64,
    pushed: &BTreeMap<u32, Pushed>,
) -> Result<f64, PsError> {
    let mut rates = pushed.iter().map(|(&w, p)| (w, p.learning_rate));
    let Some((first_worker, rate)) = rates.next() else {
        return Err(PsError::invariant(format!("step {step}"), "no pushes"));
    };
    match rates.find(|&(_, r)| r.to_bits() != rate.to_bits()) {
        None => Ok(rate),
        Some((worker, other)) => Err(PsError::message(
            format!("pushes of step {step}"),
            format!("worker {first_worker} pushed at learning rate {rate}, worker {worker} at {other}: the workers' schedules disagree"),
        )),
    }
}

/// The weighted mean (by rows) of the pushes' gradients and losses; a plain mean when every
/// push has the same rows, as data parallel's averaged all-reduce computes it. The gradients
/// are those of the parameters `names` of shapes `shapes`.
pub(super) fn mean_of(
    pushed: &BTreeMap<u32, Pushed>,
    (names, shapes): (&[String], &[Vec<usize>]),
) -> Result<(f32, Vec<Tensor>), PsError> {
    let total_rows: u64 = pushed.values().map(|p| p.rows).sum();
    let equal = pushed
        .values()
        .all(|p| Some(p.rows) == pushed.values().next().map(|q| q.rows));
    let n = pushed.len() as f64;
    let weight = |p: &Pushed| -> f64 {
        match equal {
            true => 1.0,
            false => p.rows as f64,
        }
    };
    let denominator = if equal { n } else { total_rows.max(1) as f64 };
    let loss = pushed
        .values()
        .map(|p| weight(p) * f64::from(p.loss))
        .sum::<f64>()
        / denominator;
    let mut grads = Vec::with_capacity(shapes.len());
    for (k, (name, shape)) in names.iter().zip(shapes).enumerate() {
        let mut sum = vec![0f32; shape.iter().product()];
        for (worker, p) in pushed {
            let g = p.grads[k]
                .as_f32()
                .map_err(|e| PsError::tensor(format!("worker {worker}'s gradient of {name}"), e))?;
            let w = weight(p) as f32;
            if equal {
                sum.iter_mut().zip(g).for_each(|(s, x)| *s += x);
            } else {
                sum.iter_mut().zip(g).for_each(|(s, x)| *s += w * x);
            }
        }
        let scale = 1.0 / denominator as f32;
        sum.iter_mut().for_each(|s| *s *= scale);
        let mean = Tensor::from_vec(shape, sum)
            .map_err(|e| PsError::tensor(format!("the mean gradient of {name}"), e))?;
        grads.push(mean);
    }
    Ok((loss as f32, grads))
}
