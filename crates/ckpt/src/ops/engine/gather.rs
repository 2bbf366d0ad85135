//! Gathering a box of a parameter from the pieces a plan assigns to source files: the chunks a
//! box is written in ([`Chunks`]) and filling one chunk's buffer ([`fill_chunk`]).

use std::path::Path;

use layout::SliceBox;

use super::plan::{ItemSource, OutItem};
use crate::error::{CkptError, Result};
use crate::source::SourceSet;

/// Fills `buf` with the chunk `chunk` (relative to the item's box) of a gathered item.
pub(crate) fn fill_chunk(
    sources: &SourceSet,
    item: &OutItem<'_>,
    chunk: &SliceBox,
    buf: &mut [u8],
    scratch: &mut Vec<u8>,
) -> Result<()> {
    let name = &item.meta.name;
    let ItemSource::Gather {
        param,
        region,
        pieces,
    } = &item.source
    else {
        return Err(CkptError::PlanMismatch {
            tensor: name.clone(),
            rule: "are not planned: it is copied whole from one file, not gathered".to_string(),
        });
    };
    let global = chunk.translated(&region.offset);
    let mut filled = 0usize;
    for (piece, rank) in pieces {
        let Some(sub) = piece.intersect(&global) else {
            continue;
        };
        let file = sources
            .file_for(*rank, name)?
            .ok_or_else(|| missing(sources.root(), name))?;
        let t = file
            .tensor(name)
            .ok_or_else(|| missing(file.path(), name))?;
        let (pl, slot) = param
            .placement_of_rank(*rank)
            .expect("a planned holder belongs to a placement");
        let held = pl.held.slot_box(slot);
        let rel = held.relative(&sub);
        let dst_off: Vec<usize> = sub
            .offset
            .iter()
            .zip(&global.offset)
            .map(|(a, b)| a - b)
            .collect();
        file.read_box(t, &rel, buf, &chunk.shape, &dst_off, scratch)?;
        filled += sub.n_elements();
    }
    if filled != chunk.n_elements() {
        return Err(CkptError::PlanMismatch {
            tensor: name.clone(),
            rule: format!(
                "cover {filled} of the {} elements of {global}",
                chunk.n_elements()
            ),
        });
    }
    Ok(())
}

/// A tensor the plan expected in a file that does not hold it.
pub(crate) fn missing(path: &Path, name: &str) -> CkptError {
    CkptError::TensorMissing {
        path: path.to_path_buf(),
        tensor: name.to_string(),
        rule: "the plan made from its header expected it".to_string(),
    }
}

/// The chunks of a box of `shape` (relative to the box's origin) in row-major order, each a
/// contiguous run of the box's bytes of at most `max_bytes` (or one row of the innermost dim
/// that fits).
#[derive(Debug)]
pub(crate) struct Chunks {
    shape: Vec<usize>,
    /// The dim along which chunks advance; dims before it advance one index at a time.
    k: usize,
    /// Indices of dim `k` per chunk.
    rows: usize,
    /// Next chunk's start: indices of dims `0..=k`.
    next: Option<Vec<usize>>,
}

impl Chunks {
    /// The chunks of a box of `shape` with elements of `elem` bytes, at most `max_bytes` each.
    pub(crate) fn new(shape: &[usize], elem: usize, max_bytes: usize) -> Chunks {
        let ndim = shape.len();
        if shape.contains(&0) {
            return Chunks {
                shape: shape.to_vec(),
                k: 0,
                rows: 1,
                next: None,
            };
        }
        if ndim == 0 {
            return Chunks {
                shape: Vec::new(),
                k: 0,
                rows: 1,
                next: Some(Vec::new()),
            };
        }
        let max_bytes = max_bytes.max(elem);
        // inner[d]: bytes of one index along dim d.
        let mut inner = vec![elem; ndim];
        for d in (0..ndim - 1).rev() {
            inner[d] = inner[d + 1].saturating_mul(shape[d + 1]);
        }
        let k = (0..ndim)
            .find(|&d| inner[d] <= max_bytes)
            .unwrap_or(ndim - 1);
        let rows = (max_bytes / inner[k]).clamp(1, shape[k]);
        Chunks {
            shape: shape.to_vec(),
            k,
            rows,
            next: Some(vec![0; k + 1]),
        }
    }
}

impl Iterator for Chunks {
    type Item = SliceBox;

    fn next(&mut self) -> Option<SliceBox> {
        let start = self.next.take()?;
        let ndim = self.shape.len();
        if ndim == 0 {
            return Some(SliceBox::new(Vec::new(), Vec::new()));
        }
        let k = self.k;
        let n = self.rows.min(self.shape[k] - start[k]);
        let mut offset = vec![0; ndim];
        let mut extent = self.shape.clone();
        for d in 0..k {
            offset[d] = start[d];
            extent[d] = 1;
        }
        offset[k] = start[k];
        extent[k] = n;
        // Advance: dim k by n, carrying into the dims before it.
        let mut next = start;
        next[k] += n;
        let mut d = k;
        while next[d] >= self.shape[d] {
            if d == 0 {
                self.next = None;
                return Some(SliceBox::new(offset, extent));
            }
            next[d] = 0;
            d -= 1;
            next[d] += 1;
        }
        self.next = Some(next);
        Some(SliceBox::new(offset, extent))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn covered(shape: &[usize], elem: usize, max: usize) -> Vec<SliceBox> {
        let chunks: Vec<SliceBox> = Chunks::new(shape, elem, max).collect();
        let total: usize = chunks.iter().map(SliceBox::n_elements).sum();
        assert_eq!(total, shape.iter().product::<usize>());
        // Row-major contiguity: each chunk starts where the last ended.
        let strides = layout::row_major_strides(shape);
        let mut at = 0;
        for c in &chunks {
            let start: usize = c.offset.iter().zip(&strides).map(|(o, s)| o * s).sum();
            assert_eq!(start, at, "{c}");
            at += c.n_elements();
        }
        chunks
    }

    #[test]
    fn chunks_tile_in_order() {
        assert_eq!(covered(&[4, 8], 4, 1 << 20).len(), 1);
        assert_eq!(covered(&[4, 8], 4, 64).len(), 2);
        assert_eq!(covered(&[3, 5, 7], 2, 10).len(), 3 * 5 * 2);
        assert_eq!(covered(&[3, 5, 7], 2, 1).len(), 3 * 5 * 7);
        assert_eq!(covered(&[], 4, 1).len(), 1);
        assert_eq!(Chunks::new(&[0, 4], 4, 16).count(), 0);
    }
}
