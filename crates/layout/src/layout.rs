//! Layouts: for every tensor dim, the ordered list of mesh axes that split it.

use crate::error::{py_tuple, LayoutError};
use crate::mesh::{Mesh, MeshAxis};
use crate::tensor_layout::TensorLayout;

/// One entry of a MindSpore-style layout call: how one tensor dim is split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DimSpec {
    /// `"None"`: the dim is not split.
    Replicated,
    /// One alias: the dim is split along that mesh axis.
    Axis(String),
    /// A tuple of aliases: the dim is split by the product of the axes, first listed outermost.
    Axes(Vec<String>),
}

impl DimSpec {
    /// Parses the command-line spelling: `None`, an alias, or `a+b` for several axes.
    pub fn parse(text: &str) -> DimSpec {
        if text == "None" {
            DimSpec::Replicated
        } else if text.contains('+') {
            DimSpec::Axes(text.split('+').map(str::to_string).collect())
        } else {
            DimSpec::Axis(text.to_string())
        }
    }
}

impl From<&str> for DimSpec {
    /// `"None"` is [`DimSpec::Replicated`]; anything else an alias.
    fn from(text: &str) -> DimSpec {
        if text == "None" {
            DimSpec::Replicated
        } else {
            DimSpec::Axis(text.to_string())
        }
    }
}

impl<const N: usize> From<[&str; N]> for DimSpec {
    /// A tuple of aliases.
    fn from(aliases: [&str; N]) -> DimSpec {
        DimSpec::Axes(aliases.iter().map(|a| a.to_string()).collect())
    }
}

/// A placement of a tensor over a mesh: for every tensor dim, the mesh axes that split it, outer
/// to inner. Axes that no dim uses replicate the tensor.
///
/// This one model expresses plain splits, multi-axis splits, MindSpore's `interleaved_parallel`
/// (a virtual last mesh axis), optimizer sharding (further axes appended to dim 0, see
/// [`Layout::with_optimizer_shard`]) and pipeline stages (a mesh whose rank list is the stage's).
///
/// Built the MindSpore way, a layout first has a mesh but no tensor map:
/// ```
/// use layout::{Layout, DimSpec};
/// let base = Layout::new(&[2, 2, 2], &["dp", "sp", "mp"], None)?;
/// let x = base.apply(&["dp".into(), "mp".into()])?;
/// assert_eq!(x.ms_flat_tensor_map(), Some(vec![2, 0]));
/// let y = base.apply(&[["dp", "mp"].into(), "None".into()])?;
/// assert_eq!(y.bind(&[8, 16])?.slice_shape(), &[2, 16]);
/// # Ok::<(), layout::LayoutError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Layout {
    mesh: Mesh,
    dims: Option<Vec<Vec<usize>>>,
}

impl Layout {
    /// MindSpore's `Layout(device_matrix, alias_name, rank_list)`: a mesh with no tensor map yet.
    /// Apply per-dim entries with [`Layout::apply`].
    pub fn new<S: AsRef<str>>(
        device_matrix: &[usize],
        alias_name: &[S],
        rank_list: Option<Vec<usize>>,
    ) -> Result<Layout, LayoutError> {
        Ok(Layout {
            mesh: Mesh::new(device_matrix, alias_name, rank_list)?,
            dims: None,
        })
    }

    /// A layout over `mesh` where tensor dim `d` is split by the mesh axes `dims[d]`, outer first.
    /// Every axis may be used once over the whole layout.
    pub fn from_mesh(mesh: Mesh, dims: Vec<Vec<usize>>) -> Result<Layout, LayoutError> {
        let mut used = vec![false; mesh.n_axes()];
        for axes in &dims {
            for &axis in axes {
                if axis >= mesh.n_axes() {
                    return Err(LayoutError::AxisOutOfRange {
                        index: axis,
                        n_axes: mesh.n_axes(),
                    });
                }
                if std::mem::replace(&mut used[axis], true) {
                    return Err(LayoutError::AxisUsedTwice {
                        alias: mesh.axis_name(axis).to_string(),
                        aliases: py_tuple(&mesh.alias_names()),
                    });
                }
            }
        }
        Ok(Layout {
            mesh,
            dims: Some(dims),
        })
    }

    /// A layout of an `ndim`-dim tensor fully replicated over `mesh`.
    pub fn replicated(mesh: Mesh, ndim: usize) -> Layout {
        Layout {
            mesh,
            dims: Some(vec![Vec::new(); ndim]),
        }
    }

    /// MindSpore's `layout(*dims)`: a copy of this layout's mesh with the tensor map given by one
    /// entry per tensor dim. Errors as MindSpore: an unknown alias, an alias used twice.
    pub fn apply(&self, entries: &[DimSpec]) -> Result<Layout, LayoutError> {
        let mut dims = Vec::with_capacity(entries.len());
        let mut seen: Vec<usize> = Vec::new();
        for entry in entries {
            let names: Vec<&str> = match entry {
                DimSpec::Replicated => Vec::new(),
                DimSpec::Axis(name) => vec![name.as_str()],
                DimSpec::Axes(names) => names.iter().map(String::as_str).collect(),
            };
            let mut axes = Vec::with_capacity(names.len());
            for name in names.into_iter().filter(|&n| n != "None") {
                let axis = self.mesh.axis_index(name)?;
                if seen.contains(&axis) {
                    return Err(LayoutError::AxisUsedTwice {
                        alias: name.to_string(),
                        aliases: py_tuple(&self.mesh.alias_names()),
                    });
                }
                seen.push(axis);
                axes.push(axis);
            }
            dims.push(axes);
        }
        Layout::from_mesh(self.mesh.clone(), dims)
    }

    /// MindSpore's strategy tuple for one operator input on `device_num` devices: dim `d` is split
    /// `strategy[d]` ways. The mesh is the strategy itself (axes `s0`, `s1`, …) with a
    /// repeated-calculation axis `rep` appended on the right when the strategy uses fewer devices.
    pub fn from_strategy(strategy: &[usize], device_num: usize) -> Result<Layout, LayoutError> {
        let names: Vec<String> = (0..strategy.len()).map(|d| format!("s{d}")).collect();
        let mesh = repeated_calc_mesh(strategy, &names, device_num)?;
        let dims = (0..strategy.len()).map(|d| vec![d]).collect();
        Layout::from_mesh(mesh, dims)
    }

    /// The mesh.
    pub fn mesh(&self) -> &Mesh {
        &self.mesh
    }

    /// The per-dim axis lists, or [`LayoutError::TensorMapNotSet`] before [`Layout::apply`].
    pub fn dims(&self) -> Result<&[Vec<usize>], LayoutError> {
        self.dims.as_deref().ok_or(LayoutError::TensorMapNotSet)
    }

    /// Whether a tensor map has been applied.
    pub fn has_tensor_map(&self) -> bool {
        self.dims.is_some()
    }

    /// Number of tensor dims (0 before a tensor map is applied).
    pub fn ndim(&self) -> usize {
        self.dims.as_ref().map_or(0, Vec::len)
    }

    /// Mesh axes used by some dim, in mesh order.
    pub fn used_axes(&self) -> Vec<usize> {
        let mut used: Vec<usize> = self.dims.iter().flatten().flatten().copied().collect();
        used.sort_unstable();
        used
    }

    /// Mesh axes used by no dim (they replicate the tensor), in mesh order.
    pub fn unused_axes(&self) -> Vec<usize> {
        let used = self.used_axes();
        (0..self.mesh.n_axes())
            .filter(|a| !used.contains(a))
            .collect()
    }

    /// Split factor per dim: the product of its axes' sizes (MindSpore's `sharding_strategy`).
    pub fn split_factors(&self) -> Vec<usize> {
        self.dims
            .iter()
            .flatten()
            .map(|axes| axes.iter().map(|&a| self.mesh.axis_size(a)).product())
            .collect()
    }

    /// Number of copies of every element: the product of the unused axes' sizes.
    pub fn replica_count(&self) -> usize {
        self.unused_axes()
            .iter()
            .map(|&a| self.mesh.axis_size(a))
            .product()
    }

    /// The same placement without mesh axes of size 1 (MindSpore's normalisation). Every slot
    /// keeps its box.
    pub fn normalized(&self) -> Layout {
        let (mesh, remap) = self.mesh.without_unit_axes();
        let dims = self.dims.as_ref().map(|dims| {
            dims.iter()
                .map(|axes| axes.iter().filter_map(|&a| remap[a]).collect())
                .collect()
        });
        Layout { mesh, dims }
    }

    /// Binds the layout to a global shape, checking divisibility.
    pub fn bind(&self, shape: &[usize]) -> Result<TensorLayout, LayoutError> {
        TensorLayout::new(self.clone(), shape)
    }

    /// Adds optimizer sharding: dim 0 is further split over `shard_size` of the replica ranks
    /// (`None` = all of them), as MindSpore's parallel optimizer does.
    ///
    /// MindSpore cuts the replica group (ranks in ascending order) into consecutive chunks of
    /// `shard_size`; a rank's piece is its index inside its chunk. Ascending rank order inside a
    /// replica group is row-major order over the unused axes, so a chunk is the innermost
    /// `shard_size` factor of those axes: that factor is appended to dim 0 as inner axes,
    /// splitting a mesh axis in two when only part of it is needed.
    ///
    /// A shard size at or above the replica count means the whole group; 1, or a tensor without
    /// replicas, leaves the layout unchanged.
    pub fn with_optimizer_shard(&self, shard_size: Option<usize>) -> Result<Layout, LayoutError> {
        let dims = self.dims()?;
        let replicas = self.replica_count();
        let k = shard_size.unwrap_or(replicas).min(replicas);
        if k <= 1 {
            return Ok(self.clone());
        }
        let fail = |reason: String| LayoutError::OptimizerShard {
            shard_size: k,
            reason,
        };
        if dims.is_empty() {
            return Err(fail("a 0-dim tensor has no dim 0 to split".to_string()));
        }
        if !replicas.is_multiple_of(k) {
            return Err(fail(format!(
                "it does not divide the {replicas} replicas of the tensor"
            )));
        }
        let mut mesh = self.mesh.clone();
        let mut dims = dims.to_vec();
        let mut taken = Vec::new();
        let mut need = k;
        for axis in self.unused_axes().into_iter().rev() {
            if need == 1 {
                break;
            }
            let size = mesh.axis_size(axis);
            if need.is_multiple_of(size) {
                taken.push(axis);
                need /= size;
            } else if size.is_multiple_of(need) {
                // Split `axis` into (size/need, need) and take the inner part.
                let name = mesh.axis_name(axis).to_string();
                let names = vec![name.clone(), format!("{name}.opt")];
                mesh = mesh.split_axis(axis, &[size / need, need], &names)?;
                for d in dims.iter_mut() {
                    for a in d.iter_mut() {
                        if *a > axis {
                            *a += 1;
                        }
                    }
                }
                for t in taken.iter_mut() {
                    *t += 1;
                }
                taken.push(axis + 1);
                need = 1;
            } else {
                return Err(fail(format!(
                    "the replica axes ({}) cannot be cut into chunks of {k} consecutive ranks",
                    self.unused_axes()
                        .iter()
                        .map(|&a| format!("{}({})", self.mesh.axis_name(a), self.mesh.axis_size(a)))
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
        }
        taken.sort_unstable();
        dims[0].extend(taken);
        Layout::from_mesh(mesh, dims)
    }

    /// Human-readable map: `(dp, mp)`, `(dp+mp, None)`.
    pub fn describe_map(&self) -> String {
        match &self.dims {
            None => "(unset)".to_string(),
            Some(dims) => {
                let parts: Vec<String> = dims
                    .iter()
                    .map(|axes| {
                        if axes.is_empty() {
                            "None".to_string()
                        } else {
                            axes.iter()
                                .map(|&a| self.mesh.axis_name(a))
                                .collect::<Vec<_>>()
                                .join("+")
                        }
                    })
                    .collect();
                format!("({})", parts.join(", "))
            }
        }
    }
}

/// A mesh for an operator's device matrix on `device_num` devices, with MindSpore's
/// repeated-calculation axis `rep` appended on the right when the matrix uses fewer devices.
pub fn repeated_calc_mesh<S: AsRef<str>>(
    dev_matrix: &[usize],
    names: &[S],
    device_num: usize,
) -> Result<Mesh, LayoutError> {
    if let Some(dim) = dev_matrix.iter().position(|&s| s == 0) {
        return Err(LayoutError::ZeroStrategy {
            strategy: dev_matrix.to_vec(),
            dim,
        });
    }
    let used: usize = dev_matrix.iter().product();
    if device_num == 0 || !device_num.is_multiple_of(used) {
        return Err(LayoutError::StrategyDeviceMismatch {
            strategy: dev_matrix.to_vec(),
            used,
            device_num,
        });
    }
    let mut axes: Vec<MeshAxis> = names
        .iter()
        .zip(dev_matrix)
        .map(|(name, &size)| MeshAxis {
            name: name.as_ref().to_string(),
            size,
        })
        .collect();
    if device_num / used > 1 {
        axes.push(MeshAxis {
            name: "rep".to_string(),
            size: device_num / used,
        });
    }
    if axes.is_empty() {
        axes.push(MeshAxis {
            name: "rep".to_string(),
            size: 1,
        });
    }
    Mesh::from_axes(axes, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mindspore_errors() {
        let base = Layout::new(&[2, 4], &["dp", "mp"], None).unwrap();
        let err = base.apply(&["dp".into(), "dp".into()]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "The axis dp has been set more than one in ('dp', 'mp')"
        );
        let err = base.apply(&["xx".into()]).unwrap_err();
        assert_eq!(err.to_string(), "The axis xx is not found in ('dp', 'mp')");
        assert_eq!(base.dims().unwrap_err(), LayoutError::TensorMapNotSet);
    }

    #[test]
    fn strategy_with_repeat_axis_on_the_right() {
        let l = Layout::from_strategy(&[2, 1], 8).unwrap();
        assert_eq!(l.mesh().device_matrix(), vec![2, 1, 4]);
        let n = l.normalized();
        assert_eq!(n.mesh().device_matrix(), vec![2, 4]);
        assert_eq!(n.dims().unwrap(), &[vec![0], vec![]]);
        assert!(matches!(
            Layout::from_strategy(&[3, 1], 8),
            Err(LayoutError::StrategyDeviceMismatch { used: 3, .. })
        ));
    }

    #[test]
    fn optimizer_shard_takes_inner_replica_factor() {
        // dev [4,2], map [-1,0] (dim 1 over the last axis), shard size 4: dim 0 over axis 0.
        let base = Layout::new(&[4, 2], &["dp", "mp"], None).unwrap();
        let l = base.apply(&["None".into(), "mp".into()]).unwrap();
        let opt = l.with_optimizer_shard(Some(4)).unwrap();
        assert_eq!(opt.dims().unwrap(), &[vec![0], vec![1]]);
        // Shard size 2 of 4 replicas: split dp into (2, 2) and take the inner part.
        let opt2 = l.with_optimizer_shard(Some(2)).unwrap();
        assert_eq!(opt2.mesh().device_matrix(), vec![2, 2, 2]);
        assert_eq!(opt2.dims().unwrap(), &[vec![1], vec![2]]);
        let t = opt2.bind(&[8, 8]).unwrap();
        // Ranks 0 and 2 are chunk mates (replica group 0,2,4,6 cut into {0,2},{4,6}).
        assert_eq!(t.slot_box(0).offset[..], [0, 0]);
        assert_eq!(t.slot_box(2).offset[..], [4, 0]);
        assert_eq!(t.slot_box(4).offset[..], [0, 0]);
    }
}
