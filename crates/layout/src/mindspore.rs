//! MindSpore interop: the reversed-index `tensor_map` and `Layout.to_dict()`.
//!
//! MindSpore names a device-matrix axis by its index *from the right*: tensor-map value `m`
//! means axis `len(dev_matrix) - 1 - m`, and `-1` means "not split". A dim split over several
//! axes is a tuple of such values, first listed outermost. This convention lives only here; the
//! rest of Tessera uses axis indices from the left.

use crate::error::LayoutError;
use crate::layout::Layout;
use crate::mesh::{Mesh, MeshAxis};

/// MindSpore's "not split" tensor-map value.
pub const MAP_NONE: i64 = -1;

/// One tensor dim of a MindSpore tensor map as `to_dict()` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MsDimMap {
    /// One value: an axis index from the right, or `-1`.
    Single(i64),
    /// A tuple of axis indices from the right, outermost first.
    Multi(Vec<i64>),
}

impl MsDimMap {
    /// The axis values of this dim; `-1` for none. (`Single(-1)` gives `[-1]`.)
    pub fn values(&self) -> Vec<i64> {
        match self {
            MsDimMap::Single(v) => vec![*v],
            MsDimMap::Multi(vs) => vs.clone(),
        }
    }
}

/// The equivalent of MindSpore's `Layout.to_dict()`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayoutDict {
    /// Axis sizes (the interleaved virtual axis included).
    pub device_matrix: Vec<usize>,
    /// The tensor map, one entry per tensor dim.
    pub tensor_map: Vec<MsDimMap>,
    /// Whether the last axis is `interleaved_parallel`.
    pub interleaved_parallel: bool,
    /// Axis names.
    pub alias_name: Vec<String>,
    /// The rank list.
    pub rank_list: Vec<usize>,
}

impl Layout {
    /// The tensor map in MindSpore's extended form: per dim the list of axis indices counted
    /// from the right, `[-1]` for a dim that is not split.
    pub fn ms_tensor_map(&self) -> Result<Vec<Vec<i64>>, LayoutError> {
        let n = self.mesh().n_axes() as i64;
        Ok(self
            .dims()?
            .iter()
            .map(|axes| {
                if axes.is_empty() {
                    vec![MAP_NONE]
                } else {
                    axes.iter().map(|&a| n - 1 - a as i64).collect()
                }
            })
            .collect())
    }

    /// The tensor map in MindSpore's flat form (one value per dim), or `None` when some dim is
    /// split over more than one axis.
    pub fn ms_flat_tensor_map(&self) -> Option<Vec<i64>> {
        let map = self.ms_tensor_map().ok()?;
        map.iter()
            .map(|values| match values.as_slice() {
                [v] => Some(*v),
                _ => None,
            })
            .collect()
    }

    /// The tensor map as `to_dict()` shows it: a plain value for a dim with at most one axis,
    /// a tuple for a dim with several.
    pub fn ms_dim_maps(&self) -> Result<Vec<MsDimMap>, LayoutError> {
        Ok(self
            .ms_tensor_map()?
            .into_iter()
            .map(|values| match values.as_slice() {
                [v] => MsDimMap::Single(*v),
                _ => MsDimMap::Multi(values),
            })
            .collect())
    }

    /// MindSpore's `to_dict()`.
    pub fn to_dict(&self) -> Result<LayoutDict, LayoutError> {
        let mesh = self.mesh();
        Ok(LayoutDict {
            device_matrix: mesh.device_matrix(),
            tensor_map: self.ms_dim_maps()?,
            interleaved_parallel: mesh.is_interleaved(),
            alias_name: mesh.alias_names().iter().map(|s| s.to_string()).collect(),
            rank_list: mesh.rank_list().to_vec(),
        })
    }

    /// A layout over `mesh` from a MindSpore tensor map in extended form: per dim the axis values
    /// counted from the right. `[-1]` or `[]` means not split; `-1` inside a longer list is
    /// ignored. A flat map `[1, 0]` is passed as `[[1], [0]]`.
    pub fn from_ms_tensor_map(mesh: Mesh, tensor_map: &[Vec<i64>]) -> Result<Layout, LayoutError> {
        let n_axes = mesh.n_axes();
        let mut dims = Vec::with_capacity(tensor_map.len());
        for (dim, values) in tensor_map.iter().enumerate() {
            let mut axes = Vec::with_capacity(values.len());
            for &value in values {
                if value == MAP_NONE {
                    continue;
                }
                if value < 0 || value >= n_axes as i64 {
                    return Err(LayoutError::TensorMapOutOfRange { dim, value, n_axes });
                }
                axes.push(n_axes - 1 - value as usize);
            }
            dims.push(axes);
        }
        Layout::from_mesh(mesh, dims)
    }

    /// A layout from a MindSpore device matrix and flat tensor map, as strategy files store them.
    /// Axes get the names `dev0`, `dev1`, … from the left.
    pub fn from_ms_flat(
        device_matrix: &[usize],
        tensor_map: &[i64],
        rank_list: Option<Vec<usize>>,
    ) -> Result<Layout, LayoutError> {
        let nested: Vec<Vec<i64>> = tensor_map.iter().map(|&v| vec![v]).collect();
        Layout::from_ms_tensor_map(unnamed_mesh(device_matrix, rank_list)?, &nested)
    }

    /// A layout from a MindSpore device matrix and extended tensor map (one list per dim).
    /// Axes get the names `dev0`, `dev1`, … from the left.
    pub fn from_ms_extended(
        device_matrix: &[usize],
        tensor_map: &[Vec<i64>],
        rank_list: Option<Vec<usize>>,
    ) -> Result<Layout, LayoutError> {
        Layout::from_ms_tensor_map(unnamed_mesh(device_matrix, rank_list)?, tensor_map)
    }
}

/// A mesh over `device_matrix` with axes named `dev0`, `dev1`, … from the left, for layouts
/// read from files that carry no alias names.
pub fn unnamed_mesh(
    device_matrix: &[usize],
    rank_list: Option<Vec<usize>>,
) -> Result<Mesh, LayoutError> {
    let axes = device_matrix
        .iter()
        .enumerate()
        .map(|(i, &size)| MeshAxis {
            name: format!("dev{i}"),
            size,
        })
        .collect();
    Mesh::from_axes(axes, rank_list)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reversed_index_round_trip() {
        let base = Layout::new(&[2, 2, 2], &["dp", "sp", "mp"], None).unwrap();
        let l = base.apply(&[["dp", "sp"].into(), "mp".into()]).unwrap();
        assert_eq!(l.ms_tensor_map().unwrap(), vec![vec![2, 1], vec![0]]);
        assert_eq!(l.ms_flat_tensor_map(), None);
        let back =
            Layout::from_ms_tensor_map(l.mesh().clone(), &l.ms_tensor_map().unwrap()).unwrap();
        assert_eq!(back, l);
        let flat = Layout::from_ms_flat(&[2, 4], &[0, -1], None).unwrap();
        assert_eq!(flat.dims().unwrap(), &[vec![1], vec![]]);
        assert!(matches!(
            Layout::from_ms_flat(&[2, 4], &[2], None),
            Err(LayoutError::TensorMapOutOfRange { value: 2, .. })
        ));
    }
}
