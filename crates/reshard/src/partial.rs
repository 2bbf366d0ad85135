//! Pending sums (and maxima): a source whose values still need adding up, or taking the maximum
//! of, over some mesh axes.
//!
//! A matmul whose reduction dim is split leaves every rank with a partial sum of its output box;
//! the true value is the sum over the ranks that differ only along the split axes. A maximum over
//! a split dim leaves partial maxima in the same way ([`PendingOp::Max`]). Such a value
//! exists only at run time (DESIGN: "A pending reduction (`Partial`) exists at run time only"), so
//! it lives here and not in `layout`.

use layout::{Layout, LayoutError, TensorLayout};

use crate::error::ReshardError;
use crate::plan::lower_bound_elements;

/// The reduction a pending value awaits over its partial axes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum PendingOp {
    /// The values add up (a split reduction dim of a sum or a matmul).
    #[default]
    Sum,
    /// The value is the maximum of the parts (a maximum over a split dim).
    Max,
}

impl PendingOp {
    /// `sum` or `max`.
    pub fn name(self) -> &'static str {
        match self {
            PendingOp::Sum => "sum",
            PendingOp::Max => "max",
        }
    }
}

/// A run-time tensor layout: a [`TensorLayout`] plus the mesh axes over which its values are
/// pending a reduction (a sum unless [`DistLayout::with_op`] says otherwise). With no partial
/// axes it is just the layout.
///
/// The order the axes were given in ([`DistLayout::sum_order`]) is part of the layout: it is the
/// order deterministic mode adds the parts in, so two pending sums over the same ranks in two
/// orders are two layouts (and two reshard plans).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DistLayout {
    layout: TensorLayout,
    /// Ascending.
    partial_axes: Vec<usize>,
    /// The partial axes as given, the summed dim's axes major first.
    sum_order: Vec<usize>,
    op: PendingOp,
}

impl DistLayout {
    /// `layout` with values pending a sum over `partial_axes`. Those axes must be mesh axes the
    /// layout does not use to split any dim (a split axis cannot also be summed over). Their
    /// order is the order of the parts along the summed dim (the dim's axes, major first): the
    /// order deterministic mode adds the parts in ([`DistLayout::canonical_member_order`]).
    pub fn partial(
        layout: TensorLayout,
        partial_axes: &[usize],
    ) -> Result<DistLayout, ReshardError> {
        let mut sum_order = Vec::with_capacity(partial_axes.len());
        for &axis in partial_axes {
            if !sum_order.contains(&axis) {
                sum_order.push(axis);
            }
        }
        let mut axes = sum_order.clone();
        axes.sort_unstable();
        let unused = layout.layout().unused_axes();
        for &axis in &axes {
            if axis >= layout.mesh().n_axes() {
                return Err(ReshardError::Layout(LayoutError::AxisOutOfRange {
                    index: axis,
                    n_axes: layout.mesh().n_axes(),
                }));
            }
            if !unused.contains(&axis) {
                return Err(ReshardError::PartialAxisSplits {
                    axis: layout.mesh().axis_name(axis).to_string(),
                    layout: layout.to_string(),
                });
            }
        }
        Ok(DistLayout {
            layout,
            partial_axes: axes,
            sum_order,
            op: PendingOp::Sum,
        })
    }

    /// The same layout pending `op` instead of a sum (a layout with no partial axes is final
    /// and stays as it is).
    pub fn with_op(mut self, op: PendingOp) -> DistLayout {
        if self.is_partial() {
            self.op = op;
        }
        self
    }

    /// The reduction the partial values await ([`PendingOp::Sum`] when there are none).
    pub fn pending_op(&self) -> PendingOp {
        self.op
    }

    /// The layout's placement (each slot's box).
    pub fn layout(&self) -> &TensorLayout {
        &self.layout
    }

    /// The mesh axes pending a sum, ascending; empty when the values are final.
    pub fn partial_axes(&self) -> &[usize] {
        &self.partial_axes
    }

    /// The mesh axes pending a sum in the order the parts lie along the summed dim (major
    /// first), as [`DistLayout::partial`] was given them; empty when the values are final.
    pub fn sum_order(&self) -> &[usize] {
        &self.sum_order
    }

    /// Whether some values are pending a sum.
    pub fn is_partial(&self) -> bool {
        !self.partial_axes.is_empty()
    }

    /// Number of ranks whose values add up to one element.
    pub fn partial_count(&self) -> usize {
        self.partial_axes
            .iter()
            .map(|&a| self.layout.mesh().axis_size(a))
            .product()
    }

    /// The groups of slots whose values add up (one group per distinct box and replica), each in
    /// row-major order over the partial axes.
    pub fn partial_slot_groups(&self) -> Vec<Vec<usize>> {
        let mesh = self.layout.mesh();
        let mut done = vec![false; mesh.n_slots()];
        let mut groups = Vec::new();
        for slot in 0..mesh.n_slots() {
            if done[slot] {
                continue;
            }
            let group = mesh.slots_varying(slot, &self.partial_axes);
            for &s in &group {
                done[s] = true;
            }
            groups.push(group);
        }
        groups
    }

    /// `group_slots` ordered by their block along the summed dim: row-major over the pending
    /// axes in the order the layout lists them (the summed dim's axes, major first:
    /// [`DistLayout::sum_order`]). Deterministic mode adds a pending sum over the members in
    /// this order.
    pub fn canonical_member_order(&self, group_slots: &[usize]) -> Vec<usize> {
        let mesh = self.layout.mesh();
        let key = |slot: usize| {
            self.sum_order
                .iter()
                .fold(0, |k, &a| k * mesh.axis_size(a) + mesh.coord_along(slot, a))
        };
        let mut order = group_slots.to_vec();
        order.sort_by_key(|&s| key(s));
        order
    }
}

impl From<TensorLayout> for DistLayout {
    fn from(layout: TensorLayout) -> DistLayout {
        DistLayout {
            layout,
            partial_axes: Vec::new(),
            sum_order: Vec::new(),
            op: PendingOp::Sum,
        }
    }
}

impl std::fmt::Display for DistLayout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.layout)?;
        if self.is_partial() {
            let names: Vec<&str> = self
                .partial_axes
                .iter()
                .map(|&a| self.layout.mesh().axis_name(a))
                .collect();
            write!(f, " pending {} over {}", self.op.name(), names.join("+"))?;
        }
        Ok(())
    }
}

/// How a pending sum is resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReduceKind {
    /// Every member of a group gets the whole summed box.
    AllReduce,
    /// Each member gets the sum of one part of the box: the partial axes become inner splits of
    /// tensor dim `dim`.
    ReduceScatter {
        /// The tensor dim the group's members split after the reduction.
        dim: usize,
    },
}

impl ReduceKind {
    /// The collective's name (`all-reduce`, `reduce-scatter`).
    pub fn name(&self) -> &'static str {
        match self {
            ReduceKind::AllReduce => "all-reduce",
            ReduceKind::ReduceScatter { .. } => "reduce-scatter",
        }
    }
}

/// The first step of a plan from a partial source: reduce (sum or max) within each partial group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReduceStep {
    /// All-reduce or reduce-scatter.
    pub kind: ReduceKind,
    /// The reduction: the source's pending op.
    pub op: PendingOp,
    /// The partial groups as slots of the source mesh, each in member order.
    pub slot_groups: Vec<Vec<usize>>,
    /// The placement after the step, with no pending sum.
    pub result: TensorLayout,
}

impl ReduceStep {
    /// Chooses how to resolve `src`'s pending sum on the way to `dst`: the option moving the
    /// fewest bytes in total (the reduction plus the transfers after it).
    ///
    /// The options are a reduce-scatter onto each dim whose slice the partial groups divide (the
    /// partial axes become inner splits of that dim) and an all-reduce. A reduce-scatter onto
    /// the dim the destination splits with those axes costs half an all-reduce and leaves
    /// nothing to move; ties go to the earlier option (reduce-scatters by dim, then all-reduce).
    pub fn choose(src: &DistLayout, dst: &TensorLayout) -> ReduceStep {
        let t = src.layout();
        let n = src.partial_count();
        let slice = t.slice_shape();
        // The all-reduce comes first so that it wins a tie (one collective instead of two).
        let mut options: Vec<(ReduceKind, TensorLayout)> = vec![(ReduceKind::AllReduce, t.clone())];
        // An uneven row split keeps dim 0 whole within a block: no reduce-scatter onto it.
        let scatterable = |d: usize| slice[d].is_multiple_of(n) && (t.is_uniform() || d != 0);
        options.extend((0..slice.len()).filter(|&d| scatterable(d)).map(|dim| {
            let mut dims = t.dims().to_vec();
            dims[dim].extend_from_slice(src.partial_axes());
            let result = Layout::from_mesh(t.mesh().clone(), dims)
                .and_then(|l| match t.row_split() {
                    Some(rows) => TensorLayout::with_rows(l, t.shape(), rows),
                    None => l.bind(t.shape()),
                })
                .expect("partial axes are unused and divide the chosen dim");
            (ReduceKind::ReduceScatter { dim }, result)
        }));
        let per_member = received_per_member(t.slice_elements(), n);
        let (kind, result) = options
            .into_iter()
            .min_by_key(|(kind, result)| {
                let reduce = match kind {
                    ReduceKind::AllReduce => 2 * per_member,
                    ReduceKind::ReduceScatter { .. } => per_member,
                } * t.mesh().n_slots();
                reduce + lower_bound_elements(result, dst)
            })
            .expect("the all-reduce option is always there");
        ReduceStep {
            kind,
            op: src.pending_op(),
            slot_groups: src.partial_slot_groups(),
            result,
        }
    }

    /// Elements each member receives: `(n-1)/n` of its box for a reduce-scatter, twice that for
    /// an all-reduce (a reduce-scatter then an all-gather), with `n` the group size.
    pub fn elements_received_per_member(&self, src: &DistLayout) -> usize {
        let per_member = received_per_member(src.layout().slice_elements(), src.partial_count());
        match self.kind {
            ReduceKind::AllReduce => 2 * per_member,
            ReduceKind::ReduceScatter { .. } => per_member,
        }
    }
}

/// Elements a member of a group of `n` receives in a reduce-scatter of `elements`: the other
/// members' shares of its part, rounded up (a part is never less than one element).
fn received_per_member(elements: usize, n: usize) -> usize {
    (elements * (n - 1)).div_ceil(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::tl;

    #[test]
    fn reduce_scatter_onto_the_dim_the_destination_splits() {
        // Matmul output [dp, None] pending a sum over tp; the destination splits dim 1 over tp.
        let src = tl(&[2, 2], &["dp", "tp"], &["dp", "None"], &[4, 8]);
        let src = DistLayout::partial(src, &[1]).unwrap();
        let dst = tl(&[2, 2], &["dp", "tp"], &["dp", "tp"], &[4, 8]);
        let step = ReduceStep::choose(&src, &dst);
        assert_eq!(step.kind, ReduceKind::ReduceScatter { dim: 1 });
        assert!(step.result.same_placement(&dst));
        assert_eq!(step.slot_groups, vec![vec![0, 1], vec![2, 3]]);
    }

    #[test]
    fn a_split_axis_cannot_be_partial() {
        let src = tl(&[2, 2], &["dp", "tp"], &["dp", "tp"], &[4, 8]);
        assert!(matches!(
            DistLayout::partial(src, &[1]),
            Err(ReshardError::PartialAxisSplits { .. })
        ));
    }
}
