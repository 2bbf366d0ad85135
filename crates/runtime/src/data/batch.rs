//! Batch plans: which samples make up each global batch of an epoch.
//!
//! Batches are **global** (Tessera's choice: the config's `batch_size` is the whole batch over
//! all devices), and a plan depends only on the sample count, the batch size, the seed and the
//! epoch — never on the rank or the device count. Every rank builds the same plan and reads its
//! own rows of each batch, so one config gives the same numbers on any device count.
//!
//! The shuffle is a Fisher–Yates shuffle driven by the counter-based SplitMix64 stream
//! [`graph::rng`] keyed by the seed and the epoch (`stream_key(seed, "data.shuffle.epoch<e>")`);
//! the `i`-th swap draws number `i` of the stream and maps it to `0..=j` by a 128-bit multiply
//! (Lemire's method without rejection: the bias is below `j / 2⁶⁴`, far below anything a data
//! order could show).

use graph::rng;

use crate::error::RuntimeError;

/// The global batches of one epoch: `len()` batches of `batch_size` sample indices each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchPlan {
    /// The sample indices of every batch, back to back (`len() · batch_size` entries).
    order: Vec<usize>,
    batch_size: usize,
    /// Real (not padding) rows in total.
    n_real: usize,
}

/// One global batch of a [`BatchPlan`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batch<'a> {
    /// The batch's position in the epoch, from 0.
    pub index: usize,
    /// The sample index of every row (`batch_size` of them).
    pub indices: &'a [usize],
    /// How many leading rows are real samples; the rest is padding (evaluation only) and must
    /// not be counted.
    pub n_real: usize,
}

impl Batch<'_> {
    /// The sample indices of rows `start..start + len` (a rank's share: the dim-0 range of its
    /// input box).
    pub fn rows(&self, start: usize, len: usize) -> Result<&[usize], RuntimeError> {
        match start.checked_add(len) {
            Some(end) if end <= self.indices.len() => Ok(&self.indices[start..end]),
            _ => Err(RuntimeError::Mismatch {
                what: format!("rows of batch {}", self.index),
                expected: format!("a range inside 0..{}", self.indices.len()),
                got: format!("{start}..{}", start.saturating_add(len)),
            }),
        }
    }

    /// Whether row `row` of the batch is a real sample (not padding).
    pub fn is_real(&self, row: usize) -> bool {
        row < self.n_real
    }

    /// How many real rows a classifier got right: row `r`'s highest score in `logits`
    /// (row-major, one row of scores per batch row) is the label of its sample in `labels`.
    pub fn correct_predictions(&self, logits: &[f64], labels: &[u8]) -> usize {
        self.count_correct(logits, |row| {
            labels
                .get(self.indices[row])
                .map(|&label| usize::from(label))
        })
    }

    /// How many real rows a classifier got right, given each row's label: row `r`'s highest
    /// score in `logits` (row-major, one row of scores per batch row) is `row_labels[r]`.
    pub fn correct_rows(&self, logits: &[f64], row_labels: &[f64]) -> usize {
        self.count_correct(logits, |row| {
            row_labels
                .get(row)
                .filter(|&&label| label >= 0.0)
                .map(|&label| label as usize)
        })
    }

    fn count_correct(&self, logits: &[f64], label_of: impl Fn(usize) -> Option<usize>) -> usize {
        let classes = logits.len() / self.indices.len().max(1);
        (0..self.indices.len())
            .filter(|&row| self.is_real(row))
            .filter(|&row| {
                let scores = &logits[row * classes..(row + 1) * classes];
                let best = scores
                    .iter()
                    .enumerate()
                    .max_by(|a, b| a.1.total_cmp(b.1))
                    .map_or(0, |(c, _)| c);
                label_of(row).is_some_and(|label| best == label)
            })
            .count()
    }
}

fn check_sizes(n_samples: usize, batch_size: usize) -> Result<(), RuntimeError> {
    if batch_size == 0 {
        return Err(RuntimeError::Config {
            key: "data.batch_size".to_string(),
            reason: "0 is out of range: it must be ≥ 1".to_string(),
        });
    }
    if n_samples == 0 {
        return Err(RuntimeError::Mismatch {
            what: "batch plan".to_string(),
            expected: "a split with at least one sample".to_string(),
            got: "0 samples".to_string(),
        });
    }
    Ok(())
}

/// `0..n_samples` in the order of epoch `epoch` under `seed` (a permutation).
fn shuffled(n_samples: usize, seed: u64, epoch: u64) -> Vec<usize> {
    let key = rng::stream_key(seed, &format!("data.shuffle.epoch{epoch}"));
    let mut order: Vec<usize> = (0..n_samples).collect();
    for (draw, j) in (1..n_samples).rev().enumerate() {
        let bits = rng::bits_at(key, draw as u64);
        let k = ((u128::from(bits) * (j as u128 + 1)) >> 64) as usize;
        order.swap(j, k);
    }
    order
}

impl BatchPlan {
    /// The training batches of epoch `epoch` (any numbering, Tessera counts epochs from 1):
    /// the `n_samples` indices, shuffled when `shuffle` (the same permutation on every rank and
    /// device count for the same seed and epoch, a new one each epoch), cut into batches of
    /// `batch_size`; the last incomplete batch is dropped (MindSpore's `drop_remainder=True`).
    /// Fails when no full batch fits.
    pub fn train(
        n_samples: usize,
        batch_size: usize,
        shuffle: bool,
        seed: u64,
        epoch: u64,
    ) -> Result<BatchPlan, RuntimeError> {
        check_sizes(n_samples, batch_size)?;
        let n_batches = n_samples / batch_size;
        if n_batches == 0 {
            return Err(RuntimeError::Config {
                key: "data.batch_size".to_string(),
                reason: format!(
                    "{batch_size} is larger than the {n_samples} training samples, so no full batch fits"
                ),
            });
        }
        let mut order = if shuffle {
            shuffled(n_samples, seed, epoch)
        } else {
            (0..n_samples).collect()
        };
        order.truncate(n_batches * batch_size);
        Ok(BatchPlan {
            n_real: order.len(),
            order,
            batch_size,
        })
    }

    /// The evaluation batches: every sample once, in order, in batches of `batch_size`; the last
    /// batch is padded to full size by repeating its first sample, and its
    /// [`Batch::n_real`] says how many rows are real.
    pub fn eval(n_samples: usize, batch_size: usize) -> Result<BatchPlan, RuntimeError> {
        check_sizes(n_samples, batch_size)?;
        let n_batches = n_samples.div_ceil(batch_size);
        let mut order: Vec<usize> = (0..n_samples).collect();
        let last_first = (n_batches - 1) * batch_size;
        order.resize(n_batches * batch_size, last_first);
        Ok(BatchPlan {
            order,
            batch_size,
            n_real: n_samples,
        })
    }

    /// The number of batches.
    pub fn len(&self) -> usize {
        self.order.len() / self.batch_size
    }

    /// Whether there is no batch (never true for a built plan).
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// Rows per batch.
    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// Real rows over all batches (the sample count for evaluation; for training, the samples
    /// kept after dropping the remainder).
    pub fn n_real(&self) -> usize {
        self.n_real
    }

    /// Batch `index`, if there is one.
    pub fn batch(&self, index: usize) -> Option<Batch<'_>> {
        let start = index.checked_mul(self.batch_size)?;
        let indices = self.order.get(start..start.checked_add(self.batch_size)?)?;
        Some(Batch {
            index,
            indices,
            n_real: self.n_real.saturating_sub(start).min(self.batch_size),
        })
    }

    /// Every batch, in order.
    pub fn iter(&self) -> impl Iterator<Item = Batch<'_>> + '_ {
        (0..self.len()).filter_map(move |index| self.batch(index))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shuffle_is_a_permutation_that_changes_with_epoch_and_seed() {
        let a = shuffled(1000, 7, 1);
        let mut sorted = a.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..1000).collect::<Vec<_>>());
        assert_ne!(a, (0..1000).collect::<Vec<_>>());
        assert_ne!(a, shuffled(1000, 7, 2));
        assert_ne!(a, shuffled(1000, 8, 1));
        assert_eq!(a, shuffled(1000, 7, 1));
    }

    #[test]
    fn every_position_is_reachable() {
        // Over many epochs, element 0 lands in every slot of a small permutation.
        let mut seen = [false; 5];
        for epoch in 0..200 {
            let order = shuffled(5, 3, epoch);
            seen[order.iter().position(|&i| i == 0).unwrap()] = true;
        }
        assert!(seen.iter().all(|&s| s), "{seen:?}");
    }
}
