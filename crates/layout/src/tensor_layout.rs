//! A layout bound to a global shape: per-slot boxes and replica groups.

use crate::error::LayoutError;
use crate::layout::Layout;
use crate::mesh::Mesh;
use crate::slice_box::{Dims, SliceBox};

/// A [`Layout`] bound to a tensor's global shape. Every split dim divides exactly, so each slot of
/// the mesh holds one [`SliceBox`] of the same shape — unless dim 0 has a *manual row split*
/// (MindSpore's `manual_split` of a Gather's table, its `param_split_shape`): then block `i` of
/// dim 0 has `row_split[i]` rows, and the slots' boxes differ in dim 0 only.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TensorLayout {
    layout: Layout,
    shape: Vec<usize>,
    slice_shape: Vec<usize>,
    /// Rows of each block of dim 0 when they are uneven; `None`: `shape[0] / split` each.
    row_split: Option<Vec<usize>>,
}

impl TensorLayout {
    /// Binds `layout` to `shape`: the layout has one entry per dim and every dim's size is
    /// divisible by the product of the axes splitting it.
    pub fn new(layout: Layout, shape: &[usize]) -> Result<TensorLayout, LayoutError> {
        TensorLayout::bind(layout, shape, false)
    }

    /// Binds `layout` to `shape` with block `i` of dim 0 holding `rows[i]` rows (MindSpore's
    /// manual split): dim 0 need not divide evenly; the other dims must.
    pub fn with_rows(
        layout: Layout,
        shape: &[usize],
        rows: &[usize],
    ) -> Result<TensorLayout, LayoutError> {
        TensorLayout::bind(layout, shape, true)?.with_row_split(rows)
    }

    /// [`TensorLayout::new`]; with `rows_by_hand`, dim 0 is not checked (its blocks are cut by
    /// [`TensorLayout::with_row_split`] next).
    fn bind(
        layout: Layout,
        shape: &[usize],
        rows_by_hand: bool,
    ) -> Result<TensorLayout, LayoutError> {
        let dims = layout.dims()?;
        if dims.len() != shape.len() {
            return Err(LayoutError::RankMismatch {
                layout_dims: dims.len(),
                shape_dims: shape.len(),
                shape: shape.to_vec(),
            });
        }
        shape
            .iter()
            .try_fold(1usize, |acc, &s| acc.checked_mul(s))
            .ok_or_else(|| LayoutError::Overflow {
                shape: shape.to_vec(),
            })?;
        let mesh = layout.mesh();
        let mut slice_shape = Vec::with_capacity(shape.len());
        for (dim, (axes, &size)) in dims.iter().zip(shape).enumerate() {
            let split: usize = axes.iter().map(|&a| mesh.axis_size(a)).product();
            if dim == 0 && rows_by_hand {
                slice_shape.push(size.div_ceil(split));
                continue;
            }
            if size % split != 0 {
                return Err(LayoutError::NotDivisible {
                    dim,
                    size,
                    split,
                    axes: axes
                        .iter()
                        .map(|&a| format!("{}({})", mesh.axis_name(a), mesh.axis_size(a)))
                        .collect::<Vec<_>>()
                        .join("*"),
                    shape: shape.to_vec(),
                });
            }
            slice_shape.push(size / split);
        }
        Ok(TensorLayout {
            layout,
            shape: shape.to_vec(),
            slice_shape,
            row_split: None,
        })
    }

    /// The same layout with block `i` of dim 0 holding `rows[i]` rows: one entry per block of
    /// dim 0, each at least 1, adding up to the rows of the tensor.
    pub fn with_row_split(&self, rows: &[usize]) -> Result<TensorLayout, LayoutError> {
        let bad = |rule: String| LayoutError::BadRowSplit {
            sizes: rows.to_vec(),
            rule: format!("{rule} (shape {:?})", self.shape),
        };
        let Some(&total) = self.shape.first() else {
            return Err(bad("a scalar has no rows to split".to_string()));
        };
        let blocks = self.split_factors()[0];
        if rows.len() != blocks {
            return Err(bad(format!(
                "dim 0 is split into {blocks} block(s), so it needs {blocks} size(s), got {}",
                rows.len()
            )));
        }
        if let Some(i) = rows.iter().position(|&r| r == 0) {
            return Err(bad(format!(
                "block {i} has no rows; every block needs at least one"
            )));
        }
        let sum = rows.iter().try_fold(0usize, |acc, &r| acc.checked_add(r));
        if sum != Some(total) {
            return Err(bad(format!(
                "the sizes add up to {}, but dim 0 has {total} rows",
                sum.map_or_else(|| "more than usize::MAX".to_string(), |s| s.to_string())
            )));
        }
        let even = rows.iter().all(|&r| r == rows[0]);
        let mut out = self.clone();
        out.slice_shape[0] = rows.iter().copied().max().unwrap_or(total);
        out.row_split = (!even).then(|| rows.to_vec());
        Ok(out)
    }

    /// Rows of each block of dim 0 when a manual row split makes them uneven.
    pub fn row_split(&self) -> Option<&[usize]> {
        self.row_split.as_deref()
    }

    /// Whether every slot holds a box of the same shape (no uneven row split).
    pub fn is_uniform(&self) -> bool {
        self.row_split.is_none()
    }

    /// First row and row count of block `block` of dim 0.
    fn row_block(&self, block: usize) -> (usize, usize) {
        match &self.row_split {
            Some(rows) => (rows[..block].iter().sum(), rows[block]),
            None => (block * self.slice_shape[0], self.slice_shape[0]),
        }
    }

    /// The block of dim `dim` holding element `index` of that dim.
    pub fn block_containing(&self, dim: usize, index: usize) -> usize {
        match (&self.row_split, dim) {
            (Some(rows), 0) => {
                let mut end = 0;
                rows.iter()
                    .position(|&r| {
                        end += r;
                        index < end
                    })
                    .unwrap_or(rows.len() - 1)
            }
            _ => index / self.slice_shape[dim].max(1),
        }
    }

    /// A fully replicated tensor of `shape` over `mesh`.
    pub fn replicated(mesh: Mesh, shape: &[usize]) -> TensorLayout {
        TensorLayout::new(Layout::replicated(mesh, shape.len()), shape)
            .expect("a replicated layout always divides")
    }

    /// The layout.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The mesh.
    pub fn mesh(&self) -> &Mesh {
        self.layout.mesh()
    }

    /// Per-dim axis lists, outer to inner.
    pub fn dims(&self) -> &[Vec<usize>] {
        self.layout.dims().expect("a bound layout has a tensor map")
    }

    /// The global shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The shape every slot holds; with an uneven row split ([`TensorLayout::row_split`]), dim 0
    /// is the largest block's rows and [`TensorLayout::slot_shape`] gives each slot's.
    pub fn slice_shape(&self) -> &[usize] {
        &self.slice_shape
    }

    /// The shape `slot` holds.
    pub fn slot_shape(&self, slot: usize) -> Vec<usize> {
        match &self.row_split {
            None => self.slice_shape.clone(),
            Some(_) => self.slot_box(slot).shape.into_vec(),
        }
    }

    /// Number of elements of the global tensor.
    pub fn n_elements(&self) -> usize {
        self.shape.iter().product()
    }

    /// Number of elements each slot holds (the largest slot's with an uneven row split).
    pub fn slice_elements(&self) -> usize {
        self.slice_shape.iter().product()
    }

    /// Number of blocks along each dim (the split factors).
    pub fn split_factors(&self) -> Vec<usize> {
        self.layout.split_factors()
    }

    /// Block index of `slot` along each dim: mixed radix over the dim's axes, first axis major.
    pub fn block_index(&self, slot: usize) -> Vec<usize> {
        (0..self.dims().len())
            .map(|dim| self.block_along(slot, dim))
            .collect()
    }

    /// [`TensorLayout::block_index`]'s entry for `dim`, without building the list.
    fn block_along(&self, slot: usize, dim: usize) -> usize {
        let mesh = self.mesh();
        self.dims()[dim].iter().fold(0, |idx, &a| {
            idx * mesh.axis_size(a) + mesh.coord_along(slot, a)
        })
    }

    /// The box held by `slot`.
    pub fn slot_box(&self, slot: usize) -> SliceBox {
        let (offset, shape): (Dims, Dims) = (0..self.shape.len())
            .map(|dim| self.slot_extent(slot, dim))
            .unzip();
        SliceBox::new(offset, shape)
    }

    /// First index and length along `dim` of the box `slot` holds: [`TensorLayout::slot_box`]'s
    /// entry for that dim, without building the box (comparing placements over thousands of
    /// slots asks for it per slot).
    pub fn slot_extent(&self, slot: usize, dim: usize) -> (usize, usize) {
        let block = self.block_along(slot, dim);
        match (&self.row_split, dim) {
            (Some(_), 0) => self.row_block(block),
            _ => (block * self.slice_shape[dim], self.slice_shape[dim]),
        }
    }

    /// Whether `slot` holds exactly `region` (`slot_box(slot) == *region`, without building
    /// the box).
    pub fn slot_holds(&self, slot: usize, region: &SliceBox) -> bool {
        region.offset.len() == self.shape.len()
            && region.shape.len() == self.shape.len()
            && (0..self.shape.len())
                .all(|dim| self.slot_extent(slot, dim) == (region.offset[dim], region.shape[dim]))
    }

    /// The box held by global rank `rank` (for interleaved meshes, the virtual rank).
    pub fn rank_box(&self, rank: usize) -> Result<SliceBox, LayoutError> {
        Ok(self.slot_box(self.mesh().require_slot(rank)?))
    }

    /// The boxes held by physical device `device`: one, or `k` for an interleaved mesh.
    pub fn device_boxes(&self, device: usize) -> Vec<SliceBox> {
        let mesh = self.mesh();
        (0..mesh.n_slots())
            .filter(|&s| mesh.device_of_slot(s) == device)
            .map(|s| self.slot_box(s))
            .collect()
    }

    /// Every slot's box, in slot order.
    pub fn boxes(&self) -> Vec<SliceBox> {
        (0..self.mesh().n_slots())
            .map(|s| self.slot_box(s))
            .collect()
    }

    /// Number of slots holding each element.
    pub fn replica_count(&self) -> usize {
        self.layout.replica_count()
    }

    /// The slots holding the same box as `slot` (its replica group, MindSpore's repeated
    /// device group and gradient mirror group), ascending.
    pub fn replica_slots(&self, slot: usize) -> Vec<usize> {
        self.mesh().slots_varying(slot, &self.layout.unused_axes())
    }

    /// The device ranks holding the same box as device rank `rank`, ascending (`None` when
    /// the rank is outside the mesh).
    pub fn replica_ranks(&self, rank: usize) -> Option<Vec<usize>> {
        let mesh = self.mesh();
        let slot = mesh.slot_of_rank(rank)?;
        let mut ranks: Vec<usize> = self
            .replica_slots(slot)
            .into_iter()
            .map(|s| mesh.device_of_slot(s))
            .collect();
        ranks.sort_unstable();
        Some(ranks)
    }

    /// Index of `slot` inside its replica group.
    pub fn replica_index(&self, slot: usize) -> usize {
        let mesh = self.mesh();
        self.layout.unused_axes().iter().fold(0, |idx, &a| {
            idx * mesh.axis_size(a) + mesh.coord_along(slot, a)
        })
    }

    /// All replica groups as slot lists, ordered by their first slot. They partition the slots.
    pub fn replica_slot_groups(&self) -> Vec<Vec<usize>> {
        let n = self.mesh().n_slots();
        let mut done = vec![false; n];
        let mut groups = Vec::new();
        for slot in 0..n {
            if done[slot] {
                continue;
            }
            let group = self.replica_slots(slot);
            for &s in &group {
                done[s] = true;
            }
            groups.push(group);
        }
        groups
    }

    /// All replica groups as global-rank lists (virtual ranks for an interleaved mesh).
    pub fn replica_groups(&self) -> Vec<Vec<usize>> {
        let mesh = self.mesh();
        self.replica_slot_groups()
            .into_iter()
            .map(|g| g.into_iter().map(|s| mesh.rank_of_slot(s)).collect())
            .collect()
    }

    /// The distinct boxes with the slots holding each, in block order (dim 0 slowest).
    pub fn distinct_boxes(&self) -> Vec<(SliceBox, Vec<usize>)> {
        let factors = self.split_factors();
        // The block's position row-major over the split factors: the order of the block
        // indices compared as lists, without making one per group.
        let linear = |slot: usize| {
            factors.iter().enumerate().fold(0, |acc, (dim, &factor)| {
                acc * factor + self.block_along(slot, dim)
            })
        };
        let mut out: Vec<(usize, SliceBox, Vec<usize>)> = self
            .replica_slot_groups()
            .into_iter()
            .map(|g| (linear(g[0]), self.slot_box(g[0]), g))
            .collect();
        // Each group holds another block, so no two keys are equal.
        out.sort_unstable_by_key(|&(key, _, _)| key);
        out.into_iter().map(|(_, b, g)| (b, g)).collect()
    }

    /// Whether `other` places every element on the same ranks: the same global shape, the same
    /// ranks, and every rank holding the same box. The meshes may differ in spelling (axis names,
    /// unit axes, shape, the order of the rank list).
    pub fn same_placement(&self, other: &TensorLayout) -> bool {
        if self == other {
            return true;
        }
        let (mine, theirs) = (self.mesh(), other.mesh());
        self.shape == other.shape
            && mine.n_slots() == theirs.n_slots()
            && mine.interleave_factor() == theirs.interleave_factor()
            && (0..mine.n_slots()).all(|s| {
                theirs.slot_of_rank(mine.rank_of_slot(s)).is_some_and(|t| {
                    (0..self.shape.len())
                        .all(|dim| self.slot_extent(s, dim) == other.slot_extent(t, dim))
                })
            })
    }

    /// The same placement without unit mesh axes.
    pub fn normalized(&self) -> TensorLayout {
        TensorLayout {
            layout: self.layout.normalized(),
            ..self.clone()
        }
    }

    /// Adds optimizer sharding (see [`Layout::with_optimizer_shard`]) and checks divisibility.
    pub fn with_optimizer_shard(
        &self,
        shard_size: Option<usize>,
    ) -> Result<TensorLayout, LayoutError> {
        if let Some(rows) = &self.row_split {
            return Err(LayoutError::BadRowSplit {
                sizes: rows.clone(),
                rule: "optimizer sharding divides dim 0 evenly, which an uneven row split cannot"
                    .to_string(),
            });
        }
        TensorLayout::new(self.layout.with_optimizer_shard(shard_size)?, &self.shape)
    }
}

impl std::fmt::Display for TensorLayout {
    /// `[8, 16] over dp=2,mp=4 as (dp, mp)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:?} over {} as {}",
            self.shape,
            self.mesh(),
            self.layout.describe_map()
        )?;
        match &self.row_split {
            Some(rows) => write!(f, " with rows {rows:?}"),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SEMANTICS §1.8, checked against MindSpore 2.10.
    #[test]
    fn worked_example_a_and_b() {
        let base = Layout::new(&[2, 2, 2], &["dp", "sp", "mp"], None).unwrap();
        let a = base
            .apply(&["dp".into(), "mp".into()])
            .unwrap()
            .bind(&[8, 16])
            .unwrap();
        assert_eq!(a.slice_shape(), &[4, 8]);
        assert_eq!(a.rank_box(1).unwrap().offset[..], [0, 8]);
        assert_eq!(a.rank_box(5).unwrap().offset[..], [4, 8]);
        assert_eq!(a.replica_slots(0), vec![0, 2]);
        assert_eq!(a.replica_slots(5), vec![5, 7]);

        let b = base
            .apply(&[["dp", "mp"].into(), "None".into()])
            .unwrap()
            .bind(&[8, 16])
            .unwrap();
        assert_eq!(b.slice_shape(), &[2, 16]);
        assert_eq!(b.rank_box(1).unwrap().offset[..], [2, 0]);
        assert_eq!(b.rank_box(5).unwrap().offset[..], [6, 0]);
        assert_eq!(b.rank_box(4).unwrap().offset[..], [4, 0]);
    }

    #[test]
    fn divisibility_error_names_dim_and_axes() {
        let base = Layout::new(&[2, 4], &["dp", "mp"], None).unwrap();
        let err = base
            .apply(&["dp".into(), "mp".into()])
            .unwrap()
            .bind(&[8, 6])
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "dim 1 of shape [8, 6] has size 6, which is not divisible by 4 (split over mp(4))"
        );
    }

    #[test]
    fn explicit_rank_list() {
        let base = Layout::new(&[2, 4], &["dp", "mp"], Some((0..8).rev().collect())).unwrap();
        let t = base
            .apply(&["dp".into(), "mp".into()])
            .unwrap()
            .bind(&[8, 16])
            .unwrap();
        // Rank 7 sits in slot 0.
        assert_eq!(
            t.rank_box(7).unwrap(),
            SliceBox::new(vec![0, 0], vec![4, 4])
        );
        assert_eq!(
            t.rank_box(0).unwrap(),
            SliceBox::new(vec![4, 12], vec![4, 4])
        );
    }

    /// MindSpore's manual split of an embedding table: `[120, 56, 40, 40]` rows over mp = 4,
    /// replicated over dp = 2.
    #[test]
    fn manual_row_split_gives_uneven_boxes() {
        let base = Layout::new(&[2, 4], &["dp", "mp"], None).unwrap();
        let t = base
            .apply(&["mp".into(), "None".into()])
            .unwrap()
            .bind(&[256, 8])
            .unwrap()
            .with_row_split(&[120, 56, 40, 40])
            .unwrap();
        assert!(!t.is_uniform());
        assert_eq!(t.slice_shape(), &[120, 8]);
        assert_eq!(
            t.rank_box(1).unwrap(),
            SliceBox::new(vec![120, 0], vec![56, 8])
        );
        assert_eq!(
            t.rank_box(7).unwrap(),
            SliceBox::new(vec![216, 0], vec![40, 8])
        );
        assert_eq!(t.slot_shape(2), vec![40, 8]);
        // Every row is held once per replica.
        let rows: usize = t.distinct_boxes().iter().map(|(b, _)| b.shape[0]).sum();
        assert_eq!(rows, 256);
        assert_eq!(t.block_containing(0, 119), 0);
        assert_eq!(t.block_containing(0, 120), 1);
        assert_eq!(t.block_containing(0, 255), 3);
        assert!(!t.same_placement(&t.normalized().with_row_split(&[64; 4]).unwrap()));
        assert!(t.same_placement(&t.normalized()));
        assert!(
            t.to_string().ends_with("with rows [120, 56, 40, 40]"),
            "{t}"
        );
        // Equal sizes are the uniform layout.
        let even = t.with_row_split(&[64; 4]).unwrap();
        assert!(even.is_uniform());
        assert_eq!(
            even,
            base.apply(&["mp".into(), "None".into()])
                .unwrap()
                .bind(&[256, 8])
                .unwrap()
        );
    }

    #[test]
    fn bad_row_splits_name_the_rule() {
        let t = Layout::new(&[4], &["mp"], None)
            .unwrap()
            .apply(&["mp".into(), "None".into()])
            .unwrap()
            .bind(&[256, 8])
            .unwrap();
        let msg = |rows: &[usize]| t.with_row_split(rows).unwrap_err().to_string();
        assert!(
            msg(&[128, 128]).contains("needs 4 size(s), got 2"),
            "{}",
            msg(&[128, 128])
        );
        assert!(msg(&[256, 0, 0, 0]).contains("block 1 has no rows"));
        assert!(msg(&[100, 100, 100, 100]).contains("add up to 400, but dim 0 has 256 rows"));
        assert!(msg(&[usize::MAX, 1, 1, 1]).contains("more than usize::MAX"));
        let uneven = t.with_row_split(&[100, 56, 50, 50]).unwrap();
        assert!(uneven.with_optimizer_shard(None).is_err());
    }
}
