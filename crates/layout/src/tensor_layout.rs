//! A layout bound to a global shape: per-slot boxes and replica groups.

use crate::error::LayoutError;
use crate::layout::Layout;
use crate::mesh::Mesh;
use crate::slice_box::SliceBox;

/// A [`Layout`] bound to a tensor's global shape. Every split dim divides exactly, so each slot of
/// the mesh holds one [`SliceBox`] of the same shape.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TensorLayout {
    layout: Layout,
    shape: Vec<usize>,
    slice_shape: Vec<usize>,
}

impl TensorLayout {
    /// Binds `layout` to `shape`: the layout has one entry per dim and every dim's size is
    /// divisible by the product of the axes splitting it.
    pub fn new(layout: Layout, shape: &[usize]) -> Result<TensorLayout, LayoutError> {
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
        })
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

    /// The shape every slot holds.
    pub fn slice_shape(&self) -> &[usize] {
        &self.slice_shape
    }

    /// Number of elements of the global tensor.
    pub fn n_elements(&self) -> usize {
        self.shape.iter().product()
    }

    /// Number of elements each slot holds.
    pub fn slice_elements(&self) -> usize {
        self.slice_shape.iter().product()
    }

    /// Number of blocks along each dim (the split factors).
    pub fn split_factors(&self) -> Vec<usize> {
        self.layout.split_factors()
    }

    /// Block index of `slot` along each dim: mixed radix over the dim's axes, first axis major.
    pub fn block_index(&self, slot: usize) -> Vec<usize> {
        let mesh = self.mesh();
        self.dims()
            .iter()
            .map(|axes| {
                axes.iter().fold(0, |idx, &a| {
                    idx * mesh.axis_size(a) + mesh.coord_along(slot, a)
                })
            })
            .collect()
    }

    /// The box held by `slot`.
    pub fn slot_box(&self, slot: usize) -> SliceBox {
        let offset = self
            .block_index(slot)
            .iter()
            .zip(&self.slice_shape)
            .map(|(i, len)| i * len)
            .collect();
        SliceBox::new(offset, self.slice_shape.clone())
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
        let mut out: Vec<(Vec<usize>, SliceBox, Vec<usize>)> = self
            .replica_slot_groups()
            .into_iter()
            .map(|g| (self.block_index(g[0]), self.slot_box(g[0]), g))
            .collect();
        out.sort();
        out.into_iter().map(|(_, b, g)| (b, g)).collect()
    }

    /// Whether `other` places every element on the same ranks: the same global shape, the same
    /// ranks, and every rank holding the same box. The meshes may differ in spelling (axis names,
    /// unit axes, shape, the order of the rank list).
    pub fn same_placement(&self, other: &TensorLayout) -> bool {
        let (mine, theirs) = (self.mesh(), other.mesh());
        self.shape == other.shape
            && mine.n_slots() == theirs.n_slots()
            && mine.interleave_factor() == theirs.interleave_factor()
            && (0..mine.n_slots()).all(|s| {
                theirs
                    .slot_of_rank(mine.rank_of_slot(s))
                    .is_some_and(|t| self.slot_box(s) == other.slot_box(t))
            })
    }

    /// The same placement without unit mesh axes.
    pub fn normalized(&self) -> TensorLayout {
        TensorLayout::new(self.layout.normalized(), &self.shape)
            .expect("normalisation keeps divisibility")
    }

    /// Adds optimizer sharding (see [`Layout::with_optimizer_shard`]) and checks divisibility.
    pub fn with_optimizer_shard(
        &self,
        shard_size: Option<usize>,
    ) -> Result<TensorLayout, LayoutError> {
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
        )
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
        assert_eq!(a.rank_box(1).unwrap().offset, vec![0, 8]);
        assert_eq!(a.rank_box(5).unwrap().offset, vec![4, 8]);
        assert_eq!(a.replica_slots(0), vec![0, 2]);
        assert_eq!(a.replica_slots(5), vec![5, 7]);

        let b = base
            .apply(&[["dp", "mp"].into(), "None".into()])
            .unwrap()
            .bind(&[8, 16])
            .unwrap();
        assert_eq!(b.slice_shape(), &[2, 16]);
        assert_eq!(b.rank_box(1).unwrap().offset, vec![2, 0]);
        assert_eq!(b.rank_box(5).unwrap().offset, vec![6, 0]);
        assert_eq!(b.rank_box(4).unwrap().offset, vec![4, 0]);
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
}
