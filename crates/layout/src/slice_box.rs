//! Slice boxes: a rectangular region of a tensor, and the algebra on them.

use std::fmt;

use smallvec::SmallVec;

/// A box's offsets or lengths, one per dim: inline up to four dims, so that making a box (the
/// planner makes millions) allocates nothing for the tensors of a network.
pub type Dims = SmallVec<[usize; 4]>;

/// A rectangular region of an N-dimensional tensor: an offset and a length per dim, counted in
/// elements (not bytes). A rank's shard of a tensor is a box; so is every piece a reshard or a
/// checkpoint conversion moves.
///
/// A box with a zero length in some dim is *empty* and holds no elements.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SliceBox {
    /// First element index per dim.
    pub offset: Dims,
    /// Number of elements per dim.
    pub shape: Dims,
}

impl SliceBox {
    /// A box from its offset and shape (same length).
    pub fn new(offset: impl Into<Dims>, shape: impl Into<Dims>) -> SliceBox {
        let (offset, shape) = (offset.into(), shape.into());
        assert_eq!(
            offset.len(),
            shape.len(),
            "a box needs one offset per dim and one length per dim"
        );
        SliceBox { offset, shape }
    }

    /// The box covering a whole tensor of `shape`.
    pub fn full(shape: &[usize]) -> SliceBox {
        SliceBox {
            offset: smallvec::smallvec![0; shape.len()],
            shape: shape.into(),
        }
    }

    /// Number of dims.
    pub fn ndim(&self) -> usize {
        self.shape.len()
    }

    /// Number of elements (1 for a 0-dim box).
    pub fn n_elements(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether the box holds no element.
    pub fn is_empty(&self) -> bool {
        self.shape.contains(&0)
    }

    /// One past the last index per dim.
    pub fn end(&self) -> Vec<usize> {
        self.offset
            .iter()
            .zip(&self.shape)
            .map(|(o, l)| o + l)
            .collect()
    }

    /// The common part of two boxes, or `None` if they share no element.
    pub fn intersect(&self, other: &SliceBox) -> Option<SliceBox> {
        assert_eq!(self.ndim(), other.ndim(), "boxes of different rank");
        let mut offset = Dims::with_capacity(self.ndim());
        let mut shape = Dims::with_capacity(self.ndim());
        for d in 0..self.ndim() {
            let start = self.offset[d].max(other.offset[d]);
            let end = (self.offset[d] + self.shape[d]).min(other.offset[d] + other.shape[d]);
            if end <= start {
                return None;
            }
            offset.push(start);
            shape.push(end - start);
        }
        Some(SliceBox { offset, shape })
    }

    /// Whether every element of `other` lies in `self`. An empty `other` is contained anywhere.
    pub fn contains(&self, other: &SliceBox) -> bool {
        assert_eq!(self.ndim(), other.ndim(), "boxes of different rank");
        other.is_empty()
            || (0..self.ndim()).all(|d| {
                self.offset[d] <= other.offset[d]
                    && other.offset[d] + other.shape[d] <= self.offset[d] + self.shape[d]
            })
    }

    /// Whether the element at `index` lies in the box.
    pub fn contains_point(&self, index: &[usize]) -> bool {
        index.len() == self.ndim()
            && (0..self.ndim())
                .all(|d| self.offset[d] <= index[d] && index[d] < self.offset[d] + self.shape[d])
    }

    /// `other` expressed in coordinates relative to `self`'s origin. `self` must contain `other`.
    pub fn relative(&self, other: &SliceBox) -> SliceBox {
        debug_assert!(self.contains(other));
        SliceBox {
            offset: other
                .offset
                .iter()
                .zip(&self.offset)
                .map(|(o, base)| o - base)
                .collect(),
            shape: other.shape.clone(),
        }
    }

    /// `self` moved by `origin` (the inverse of [`SliceBox::relative`]).
    pub fn translated(&self, origin: &[usize]) -> SliceBox {
        SliceBox {
            offset: self.offset.iter().zip(origin).map(|(o, b)| o + b).collect(),
            shape: self.shape.clone(),
        }
    }

    /// The parts of `self` not covered by `other`, as at most `2 * ndim` disjoint boxes.
    pub fn subtract(&self, other: &SliceBox) -> Vec<SliceBox> {
        let Some(common) = self.intersect(other) else {
            return if self.is_empty() {
                Vec::new()
            } else {
                vec![self.clone()]
            };
        };
        let mut pieces = Vec::new();
        let mut rest = self.clone();
        for d in 0..self.ndim() {
            let (lo, hi) = (common.offset[d], common.offset[d] + common.shape[d]);
            let (start, end) = (rest.offset[d], rest.offset[d] + rest.shape[d]);
            if start < lo {
                let mut piece = rest.clone();
                piece.shape[d] = lo - start;
                pieces.push(piece);
            }
            if hi < end {
                let mut piece = rest.clone();
                piece.offset[d] = hi;
                piece.shape[d] = end - hi;
                pieces.push(piece);
            }
            rest.offset[d] = lo;
            rest.shape[d] = hi - lo;
        }
        pieces
    }

    /// Row-major strides of a tensor with this box's shape, in elements.
    pub fn strides(&self) -> Vec<usize> {
        row_major_strides(&self.shape)
    }
}

/// Row-major strides (last dim contiguous) of a tensor of `shape`, in elements.
pub fn row_major_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * shape[d + 1];
    }
    strides
}

impl fmt::Display for SliceBox {
    /// `[0:4, 8:16]`, half-open ranges per dim.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for d in 0..self.ndim() {
            if d > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{}:{}", self.offset[d], self.offset[d] + self.shape[d])?;
        }
        f.write_str("]")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(offset: &[usize], shape: &[usize]) -> SliceBox {
        SliceBox::new(offset.to_vec(), shape.to_vec())
    }

    #[test]
    fn intersection_and_containment() {
        let a = b(&[0, 0], &[4, 8]);
        let c = b(&[2, 4], &[4, 8]);
        assert_eq!(a.intersect(&c), Some(b(&[2, 4], &[2, 4])));
        assert_eq!(a.intersect(&b(&[4, 0], &[1, 1])), None);
        assert!(a.contains(&b(&[1, 1], &[3, 7])));
        assert!(!a.contains(&c));
        assert_eq!(a.relative(&b(&[1, 2], &[1, 1])), b(&[1, 2], &[1, 1]));
        assert_eq!(c.to_string(), "[2:6, 4:12]");
    }

    #[test]
    fn subtract_tiles_the_difference() {
        let a = b(&[0, 0], &[4, 4]);
        let hole = b(&[1, 1], &[2, 2]);
        let parts = a.subtract(&hole);
        let covered: usize = parts.iter().map(SliceBox::n_elements).sum();
        assert_eq!(covered, 16 - 4);
        for p in &parts {
            assert!(a.contains(p));
            assert!(p.intersect(&hole).is_none());
            for q in &parts {
                if p != q {
                    assert!(p.intersect(q).is_none());
                }
            }
        }
    }
}
