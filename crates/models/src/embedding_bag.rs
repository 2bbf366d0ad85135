//! The embedding bag: a wide, sparse classifier over images whose one large parameter is an
//! embedding table — the model of MindSpore's large-table `EmbeddingLookup(target="CPU")` case.
//!
//! Every image becomes a bag of integer feature ids ([`bag_ids`]): for each pixel `p`, the id of
//! its quantised intensity (`p·L + level`), and for each pixel and its right-hand neighbour
//! (wrapping), the id of the pair of levels. The network sums the table rows of a sample's ids
//! (`EmbeddingBag(mode="sum")`) and classifies the sum with one matrix:
//!
//! `logits = (Σ_f table[ids[b, f]]) · head_weight`, loss: softmax cross-entropy.
//!
//! A batch touches few of the table's rows, so a worker that holds only those rows (with the
//! ids renumbered into them, [`embedding_bag`] with `table_rows` = the rows held) computes the
//! same loss and, row for row, the same table gradient as one holding the whole table.

use graph::{FanMode, GraphBuilder, GraphError, Initializer};
use tensor::DType;

use crate::Model;

/// Intensity levels a pixel is quantised to.
pub const LEVELS: usize = 16;

/// The name of the embedding table.
pub const TABLE: &str = "embedding.embedding_table";

/// The name of the classifier's matrix.
pub const HEAD: &str = "head.weight";

/// The sizes of an embedding bag over images of `pixels` pixels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BagDims {
    /// Pixels per image.
    pub pixels: usize,
    /// Embedding width (`model.hidden`).
    pub embedding_size: usize,
    /// Classes (`model.classes`).
    pub classes: usize,
}

impl BagDims {
    /// Feature ids per image: one per pixel and one per pixel pair.
    pub fn features(&self) -> usize {
        2 * self.pixels
    }

    /// Rows of the embedding table: `pixels·L` single-pixel ids, then `pixels·L²` pair ids.
    pub fn vocab_size(&self) -> usize {
        self.pixels * LEVELS + self.pixels * LEVELS * LEVELS
    }
}

/// The level (0..[`LEVELS`]) of a pixel whose intensity is `fraction` of the maximum.
fn level(fraction: f32) -> usize {
    let l = (fraction * LEVELS as f32).floor();
    if l.is_nan() || l < 0.0 {
        0
    } else {
        (l as usize).min(LEVELS - 1)
    }
}

/// The feature ids of images whose pixels (row-major, `pixels` per image) are `fractions` of
/// the maximum intensity: `features()` ids per image, each below `vocab_size()`.
pub fn bag_ids(dims: &BagDims, fractions: &[f32]) -> Vec<u32> {
    let p = dims.pixels;
    let mut ids = Vec::with_capacity(fractions.len() * 2);
    for image in fractions.chunks(p.max(1)) {
        let levels: Vec<usize> = image.iter().map(|&x| level(x)).collect();
        for (i, &l) in levels.iter().enumerate() {
            ids.push((i * LEVELS + l) as u32);
        }
        let pairs = p * LEVELS;
        for (i, &l) in levels.iter().enumerate() {
            let next = levels[(i + 1) % levels.len()];
            ids.push((pairs + (i * LEVELS + l) * LEVELS + next) as u32);
        }
    }
    ids
}

/// The embedding bag for `batch` images: inputs `ids [batch, features]` (i32, below
/// `table_rows`) and `labels [batch]` (i32); parameters [`TABLE`] `[table_rows,
/// embedding_size]` and [`HEAD`] `[embedding_size, classes]`; outputs the mean cross-entropy
/// and the logits. `table_rows` is `dims.vocab_size()` for the whole table, or the rows a
/// worker holds (the ids renumbered into them).
pub fn embedding_bag(dims: &BagDims, batch: usize, table_rows: usize) -> Result<Model, GraphError> {
    let mut b = GraphBuilder::new();
    let ids = b.input("ids", &[batch, dims.features()], DType::I32)?;
    let labels = b.input("labels", &[batch], DType::I32)?;
    let table = b.parameter(
        TABLE,
        &[table_rows, dims.embedding_size],
        Initializer::normal(0.05),
    )?;
    let head = b.parameter(
        HEAD,
        &[dims.embedding_size, dims.classes],
        Initializer::HeUniform {
            negative_slope: 0.0,
            mode: FanMode::FanOut,
        },
    )?;
    let rows = b.embedding("embedding.gather", table, ids)?;
    let bag = b.reduce_sum("embedding.bag_sum", rows, &[1], false)?;
    let logits = b.matmul("head.matmul", bag, head)?;
    let loss = b.sparse_softmax_cross_entropy("loss", logits, labels)?;
    b.output(loss)?;
    b.output(logits)?;
    Ok(Model {
        graph: b.finish(),
        input: ids,
        labels,
        logits,
        loss,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_stay_in_the_table() {
        let dims = BagDims {
            pixels: 4,
            embedding_size: 3,
            classes: 2,
        };
        let ids = bag_ids(&dims, &[0.0, 0.5, 1.0, f32::NAN, 0.99, 0.0, 0.1, 0.2]);
        assert_eq!(ids.len(), 2 * dims.features());
        assert!(ids.iter().all(|&i| (i as usize) < dims.vocab_size()));
        // Pixel 2 at full intensity is level 15; its pair with pixel 3 (level 0) follows.
        assert_eq!(ids[2], (2 * LEVELS + 15) as u32);
        assert_eq!(ids[6], (4 * LEVELS + (2 * LEVELS + 15) * LEVELS) as u32);
        let model = embedding_bag(&dims, 2, 10).unwrap();
        assert_eq!(model.graph.trainable_parameters().len(), 2);
    }
}
