//! Device meshes: named axes over an ordered list of ranks.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use crate::error::{py_tuple, LayoutError};
use crate::limits;

/// The reserved alias of MindSpore's virtual micro-interleaving axis.
pub const INTERLEAVED_ALIAS: &str = "interleaved_parallel";

/// One named axis of a [`Mesh`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MeshAxis {
    /// The alias, e.g. `"dp"`.
    pub name: String,
    /// Number of devices along the axis.
    pub size: usize,
}

/// A device mesh (MindSpore's *device matrix*): named axes and the ranks laid out over them.
///
/// Devices are numbered by a *local index* `0..n_slots()` in row-major order over the axes, the
/// last axis varying fastest. Local index `i` is the device whose global rank is `rank_list()[i]`
/// (by default the rank list is `0..n`). Every layout computation works on local indices;
/// ranks appear only at the edges.
///
/// When the last axis is [`INTERLEAVED_ALIAS`] it is *virtual*: each physical device runs `k`
/// copies (MindSpore's `interleaved_parallel`). A slot is then a virtual rank; the physical rank of
/// slot `i` is `rank_list()[i] / k` (MindSpore's virtual rank `r*k + j` lives on device `r`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Mesh {
    axes: Vec<MeshAxis>,
    /// Shared: cloning a mesh (every layout holds one) copies no per-rank data, and contiguous
    /// lists are interned (see [`contiguous_ranks`]), so a plan's thousands of layouts over the
    /// same devices hold one list between them.
    rank_list: Arc<[usize]>,
    /// Row-major strides of the axes, in slots.
    strides: Vec<usize>,
    /// `Some(start)` when `rank_list == start..start+n`, for O(1) rank lookup.
    contiguous_from: Option<usize>,
}

impl Mesh {
    /// Builds a mesh from a device matrix, its aliases and an optional rank list, with MindSpore's
    /// rules: as many aliases as axes, aliases unique, non-empty and not `"None"`,
    /// `interleaved_parallel` only as the last alias, and a rank list as long as the device count.
    pub fn new<S: AsRef<str>>(
        device_matrix: &[usize],
        alias_name: &[S],
        rank_list: Option<Vec<usize>>,
    ) -> Result<Mesh, LayoutError> {
        if device_matrix.len() != alias_name.len() {
            return Err(LayoutError::AliasCountMismatch {
                n_dims: device_matrix.len(),
                n_aliases: alias_name.len(),
            });
        }
        if device_matrix.is_empty() {
            return Err(LayoutError::EmptyDeviceMatrix);
        }
        limits::checked_rank_count(device_matrix)?;
        let names: Vec<&str> = alias_name.iter().map(|a| a.as_ref()).collect();
        for (i, name) in names.iter().enumerate() {
            if name.is_empty() {
                return Err(LayoutError::EmptyAlias);
            }
            if *name == "None" {
                return Err(LayoutError::AliasIsNone);
            }
            if names[..i].contains(name) {
                return Err(LayoutError::DuplicateAlias {
                    alias: name.to_string(),
                    aliases: py_tuple(&names),
                });
            }
            if *name == INTERLEAVED_ALIAS && i + 1 != names.len() {
                return Err(LayoutError::InterleavedNotLast {
                    aliases: py_tuple(&names),
                });
            }
        }
        let axes = names
            .iter()
            .zip(device_matrix)
            .map(|(name, &size)| MeshAxis {
                name: name.to_string(),
                size,
            })
            .collect();
        Mesh::from_axes(axes, rank_list)
    }

    /// Builds a mesh from already-named axes. Checks sizes and the rank list, not alias spelling.
    ///
    /// The sizes are bounded before anything per slot is allocated: at most
    /// [`limits::MAX_MESH_AXES`] axes, and a product (the slot count) that neither overflows nor
    /// exceeds [`limits::max_ranks`]; every rank of an explicit rank list is below that ceiling.
    pub fn from_axes(
        axes: Vec<MeshAxis>,
        rank_list: Option<Vec<usize>>,
    ) -> Result<Mesh, LayoutError> {
        if axes.is_empty() {
            return Err(LayoutError::EmptyDeviceMatrix);
        }
        if let Some(axis) = axes.iter().find(|a| a.size == 0) {
            return Err(LayoutError::ZeroAxisSize {
                alias: axis.name.clone(),
            });
        }
        // Bounded before anything per slot is allocated.
        let device_matrix: Vec<usize> = axes.iter().map(|a| a.size).collect();
        let n_slots = limits::checked_rank_count(&device_matrix)?;
        let rank_list: Arc<[usize]> = match rank_list {
            None => contiguous_ranks(0, n_slots),
            Some(list) if list.len() == n_slots && is_contiguous(&list) => {
                let max = limits::max_ranks();
                match list.last() {
                    Some(&last) if last >= max => {
                        return Err(LayoutError::RankAboveCeiling { rank: last, max })
                    }
                    _ => contiguous_ranks(list[0], n_slots),
                }
            }
            Some(list) => {
                if list.len() != n_slots {
                    return Err(LayoutError::RankListLength {
                        got: list.len(),
                        expected: n_slots,
                    });
                }
                let max = limits::max_ranks();
                if let Some(&rank) = list.iter().find(|&&r| r >= max) {
                    return Err(LayoutError::RankAboveCeiling { rank, max });
                }
                let mut sorted = list.clone();
                sorted.sort_unstable();
                if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
                    return Err(LayoutError::DuplicateRank { rank: w[0] });
                }
                list.into()
            }
        };
        check_interleaved_ranks(&axes, &rank_list)?;
        Ok(Mesh::with_checked_ranks(axes, rank_list))
    }

    /// A mesh over `axes` with a rank list already checked (as long as the slots, unique,
    /// below the ceiling).
    fn with_checked_ranks(axes: Vec<MeshAxis>, rank_list: Arc<[usize]>) -> Mesh {
        let mut strides = vec![1; axes.len()];
        for i in (0..axes.len().saturating_sub(1)).rev() {
            strides[i] = strides[i + 1] * axes[i + 1].size;
        }
        let contiguous_from = rank_list
            .first()
            .copied()
            .filter(|_| is_contiguous(&rank_list));
        Mesh {
            axes,
            rank_list,
            strides,
            contiguous_from,
        }
    }

    /// A one-axis mesh of `n` ranks `0..n` named `name`.
    pub fn line(name: &str, n: usize) -> Result<Mesh, LayoutError> {
        Mesh::new(&[n], &[name], None)
    }

    /// The axes, outermost first.
    pub fn axes(&self) -> &[MeshAxis] {
        &self.axes
    }

    /// Number of axes.
    pub fn n_axes(&self) -> usize {
        self.axes.len()
    }

    /// Axis sizes, outermost first (MindSpore's `device_matrix`).
    pub fn device_matrix(&self) -> Vec<usize> {
        self.axes.iter().map(|a| a.size).collect()
    }

    /// Axis names, outermost first (MindSpore's `alias_name`).
    pub fn alias_names(&self) -> Vec<&str> {
        self.axes.iter().map(|a| a.name.as_str()).collect()
    }

    /// Size of axis `axis`.
    pub fn axis_size(&self, axis: usize) -> usize {
        self.axes[axis].size
    }

    /// Name of axis `axis`.
    pub fn axis_name(&self, axis: usize) -> &str {
        &self.axes[axis].name
    }

    /// Index of the axis called `name`.
    pub fn axis_index(&self, name: &str) -> Result<usize, LayoutError> {
        self.axes
            .iter()
            .position(|a| a.name == name)
            .ok_or_else(|| LayoutError::UnknownAlias {
                alias: name.to_string(),
                aliases: py_tuple(&self.alias_names()),
            })
    }

    /// Number of device slots (the product of the device matrix). Equals the number of devices
    /// unless the mesh is interleaved, in which case each device has `k` slots.
    pub fn n_slots(&self) -> usize {
        self.rank_list.len()
    }

    /// Whether the last axis is the virtual `interleaved_parallel` axis.
    pub fn is_interleaved(&self) -> bool {
        self.axes
            .last()
            .is_some_and(|a| a.name == INTERLEAVED_ALIAS)
    }

    /// Copies per physical device: the size of the interleaved axis, or 1.
    pub fn interleave_factor(&self) -> usize {
        if self.is_interleaved() {
            self.axes.last().map_or(1, |a| a.size)
        } else {
            1
        }
    }

    /// Number of physical devices.
    pub fn n_devices(&self) -> usize {
        self.n_slots() / self.interleave_factor()
    }

    /// The rank list, one entry per slot (MindSpore's `rank_list`).
    pub fn rank_list(&self) -> &[usize] {
        &self.rank_list
    }

    /// Global rank of slot `slot`; for interleaved meshes the *virtual* rank.
    pub fn rank_of_slot(&self, slot: usize) -> usize {
        self.rank_list[slot]
    }

    /// Physical device rank of slot `slot` (equal to [`Mesh::rank_of_slot`] unless interleaved).
    pub fn device_of_slot(&self, slot: usize) -> usize {
        self.rank_list[slot] / self.interleave_factor()
    }

    /// The physical device ranks of the mesh in slot order, without repeats.
    pub fn device_ranks(&self) -> Vec<usize> {
        let k = self.interleave_factor();
        (0..self.n_slots())
            .step_by(k)
            .map(|s| self.device_of_slot(s))
            .collect()
    }

    /// Slot of global rank `rank`, if the rank belongs to the mesh.
    pub fn slot_of_rank(&self, rank: usize) -> Option<usize> {
        match self.contiguous_from {
            Some(start) => rank
                .checked_sub(start)
                .filter(|&slot| slot < self.rank_list.len()),
            None => self.rank_list.iter().position(|&r| r == rank),
        }
    }

    /// Like [`Mesh::slot_of_rank`] but an error naming the mesh's ranks when absent.
    pub fn require_slot(&self, rank: usize) -> Result<usize, LayoutError> {
        self.slot_of_rank(rank)
            .ok_or_else(|| LayoutError::RankNotInMesh {
                rank,
                ranks: format!("{:?}", self.rank_list),
            })
    }

    /// Coordinate of `slot` along axis `axis`.
    pub fn coord_along(&self, slot: usize, axis: usize) -> usize {
        (slot / self.strides[axis]) % self.axes[axis].size
    }

    /// Coordinates of `slot`, one per axis (row-major, last axis fastest).
    pub fn coord(&self, slot: usize) -> Vec<usize> {
        (0..self.axes.len())
            .map(|axis| self.coord_along(slot, axis))
            .collect()
    }

    /// Slot at coordinates `coord` (one entry per axis, each below its axis size).
    pub fn slot_of_coord(&self, coord: &[usize]) -> usize {
        debug_assert_eq!(coord.len(), self.axes.len());
        coord.iter().zip(&self.strides).map(|(c, s)| c * s).sum()
    }

    /// Row-major stride of axis `axis`, in slots.
    pub fn stride(&self, axis: usize) -> usize {
        self.strides[axis]
    }

    /// The slots that differ from `slot` only along `axis`, in axis order
    /// (MindSpore's `GetDevicesAlongDim`).
    pub fn slots_along_axis(&self, slot: usize, axis: usize) -> Vec<usize> {
        let base = slot - self.coord_along(slot, axis) * self.strides[axis];
        (0..self.axes[axis].size)
            .map(|i| base + i * self.strides[axis])
            .collect()
    }

    /// The global ranks that differ from `rank` only along `axis`, in axis order.
    pub fn ranks_along_axis(&self, rank: usize, axis: usize) -> Result<Vec<usize>, LayoutError> {
        self.check_axis(axis)?;
        let slot = self.require_slot(rank)?;
        Ok(self
            .slots_along_axis(slot, axis)
            .into_iter()
            .map(|s| self.rank_list[s])
            .collect())
    }

    /// The slots that agree with `slot` on every axis *not* in `free_axes`, in row-major order
    /// over `free_axes`. With `free_axes` the axes a tensor does not use, this is the tensor's
    /// replica group.
    pub fn slots_varying(&self, slot: usize, free_axes: &[usize]) -> Vec<usize> {
        let mut free: Vec<usize> = free_axes.to_vec();
        free.sort_unstable();
        free.dedup();
        let base = slot
            - free
                .iter()
                .map(|&a| self.coord_along(slot, a) * self.strides[a])
                .sum::<usize>();
        let mut out = vec![base];
        for &axis in &free {
            let mut next = Vec::with_capacity(out.len() * self.axes[axis].size);
            for &s in &out {
                for i in 0..self.axes[axis].size {
                    next.push(s + i * self.strides[axis]);
                }
            }
            out = next;
        }
        out
    }

    /// The sub-mesh over `axes` (kept in mesh order) that contains `rank`: the other axes are
    /// fixed at `rank`'s coordinates. Its rank list is the ranks of those slots.
    pub fn sub_mesh(&self, axes: &[usize], rank: usize) -> Result<Mesh, LayoutError> {
        for &a in axes {
            self.check_axis(a)?;
        }
        let slot = self.require_slot(rank)?;
        let mut kept: Vec<usize> = axes.to_vec();
        kept.sort_unstable();
        kept.dedup();
        let slots = self.slots_varying(slot, &kept);
        let sub_axes = kept.iter().map(|&a| self.axes[a].clone()).collect();
        Mesh::from_axes(
            sub_axes,
            Some(slots.iter().map(|&s| self.rank_list[s]).collect()),
        )
    }

    /// The mesh left when axis `axis` is fixed at `index` and dropped — e.g. one pipeline stage
    /// of a mesh whose first axis is the stage axis. A one-axis mesh becomes a one-slot mesh.
    pub fn select(&self, axis: usize, index: usize) -> Result<Mesh, LayoutError> {
        self.check_axis(axis)?;
        if index >= self.axes[axis].size {
            return Err(LayoutError::AxisIndexOutOfRange {
                alias: self.axes[axis].name.clone(),
                index,
                size: self.axes[axis].size,
            });
        }
        let rest: Vec<usize> = (0..self.axes.len()).filter(|&a| a != axis).collect();
        let first_slot = index * self.strides[axis];
        let rank = self.rank_list[first_slot];
        if rest.is_empty() {
            return Mesh::from_axes(
                vec![MeshAxis {
                    name: self.axes[axis].name.clone(),
                    size: 1,
                }],
                Some(vec![rank]),
            );
        }
        self.sub_mesh(&rest, rank)
    }

    /// The ranks of pipeline stage `stage` when the rank list is cut into `n_stages` equal
    /// consecutive parts (MindSpore: stage `s` owns ranks `[s*P, (s+1)*P)`).
    pub fn stage_ranks(&self, n_stages: usize, stage: usize) -> Result<Vec<usize>, LayoutError> {
        if n_stages == 0 || !self.n_slots().is_multiple_of(n_stages) || stage >= n_stages {
            return Err(LayoutError::AxisIndexOutOfRange {
                alias: "pipeline stage".to_string(),
                index: stage,
                size: n_stages,
            });
        }
        let per_stage = self.n_slots() / n_stages;
        Ok(self.rank_list[stage * per_stage..(stage + 1) * per_stage].to_vec())
    }

    /// The same devices with axis `axis` refined into consecutive factors (outer first), named
    /// `names`. Row-major order is kept, so every slot keeps its rank. Used to express a split
    /// over part of an axis (e.g. an optimizer shard over the inner half of a data-parallel axis).
    pub fn split_axis(
        &self,
        axis: usize,
        factors: &[usize],
        names: &[String],
    ) -> Result<Mesh, LayoutError> {
        self.check_axis(axis)?;
        let product: usize = factors.iter().product();
        if product != self.axes[axis].size || factors.len() != names.len() || factors.is_empty() {
            return Err(LayoutError::BadAxisSplit {
                alias: self.axes[axis].name.clone(),
                size: self.axes[axis].size,
                factors: factors.to_vec(),
                product,
            });
        }
        let mut axes = self.axes[..axis].to_vec();
        axes.extend(names.iter().zip(factors).map(|(name, &size)| MeshAxis {
            name: name.clone(),
            size,
        }));
        axes.extend_from_slice(&self.axes[axis + 1..]);
        Ok(Mesh::with_checked_ranks(axes, self.rank_list.clone()))
    }

    /// The same devices without the axes of size 1 (MindSpore's normalisation). A mesh whose
    /// axes all have size 1 keeps its first axis.
    pub fn without_unit_axes(&self) -> (Mesh, Vec<Option<usize>>) {
        let mut remap = Vec::with_capacity(self.axes.len());
        let mut axes = Vec::new();
        for axis in &self.axes {
            if axis.size == 1 {
                remap.push(None);
            } else {
                remap.push(Some(axes.len()));
                axes.push(axis.clone());
            }
        }
        if axes.is_empty() {
            axes.push(self.axes[0].clone());
            remap[0] = Some(0);
        }
        let mesh = Mesh::with_checked_ranks(axes, self.rank_list.clone());
        (mesh, remap)
    }

    fn check_axis(&self, axis: usize) -> Result<(), LayoutError> {
        if axis < self.axes.len() {
            Ok(())
        } else {
            Err(LayoutError::AxisOutOfRange {
                index: axis,
                n_axes: self.axes.len(),
            })
        }
    }
}

impl std::fmt::Display for Mesh {
    /// `dp=2,mp=4`, plus the rank list when it is not `0..n`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, a) in self.axes.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{}={}", a.name, a.size)?;
        }
        if self.contiguous_from != Some(0) {
            write!(f, " ranks {:?}", self.rank_list)?;
        }
        Ok(())
    }
}

/// On an interleaved mesh (last axis [`INTERLEAVED_ALIAS`] of size `k`), the rank list holds
/// *virtual* ranks: virtual rank `r*k + j` is copy `j` of physical device `r`. The `k` slots of
/// one mesh position (consecutive slots differing only along the interleaved axis) are the `k`
/// copies of one device, so slot `s` must hold a virtual rank whose copy index is `s % k`, and the
/// slots of one position must name the same device. Any other list would put one position's
/// copies on several devices (or label a copy with another's index), so it is refused.
fn check_interleaved_ranks(axes: &[MeshAxis], rank_list: &[usize]) -> Result<(), LayoutError> {
    let k = match axes.last() {
        Some(a) if a.name == INTERLEAVED_ALIAS && a.size > 1 => a.size,
        _ => return Ok(()),
    };
    for (slot, &rank) in rank_list.iter().enumerate() {
        let first = rank_list[slot - slot % k];
        if rank % k != slot % k || rank / k != first / k {
            return Err(LayoutError::InterleavedRankList {
                slot,
                rank,
                k,
                expected: (first / k) * k + slot % k,
            });
        }
    }
    Ok(())
}

/// Whether `list` is `start..start + len` for its first entry `start`.
fn is_contiguous(list: &[usize]) -> bool {
    list.first()
        .is_some_and(|&start| list.iter().enumerate().all(|(i, &r)| r == start + i))
}

/// Interned rank lists by `(start, n)`.
type RankListCache = HashMap<(usize, usize), Arc<[usize]>>;

/// The rank list `start..start + n`, one shared copy per `(start, n)` for the process: every
/// layout of a plan over the same devices points at it. A cache of values, not state: the
/// list is the same whoever asks.
fn contiguous_ranks(start: usize, n: usize) -> Arc<[usize]> {
    static CACHE: OnceLock<Mutex<RankListCache>> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    let mut cache = cache
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    cache
        .entry((start, n))
        .or_insert_with(|| (start..start + n).collect())
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_major_last_axis_fastest() {
        let mesh = Mesh::new(&[2, 2, 2], &["dp", "sp", "mp"], None).unwrap();
        // r = 4*c_dp + 2*c_sp + c_mp
        assert_eq!(mesh.coord(5), vec![1, 0, 1]);
        assert_eq!(mesh.slot_of_coord(&[1, 1, 0]), 6);
        assert_eq!(mesh.slots_along_axis(5, 1), vec![5, 7]);
        assert_eq!(mesh.slots_varying(5, &[0, 2]), vec![0, 1, 4, 5]);
    }

    #[test]
    fn sub_mesh_and_select_keep_ranks() {
        let mesh = Mesh::new(&[2, 4], &["pp", "tp"], Some((10..18).collect())).unwrap();
        let stage1 = mesh.select(0, 1).unwrap();
        assert_eq!(stage1.rank_list(), &[14, 15, 16, 17]);
        assert_eq!(stage1.alias_names(), vec!["tp"]);
        let column = mesh.sub_mesh(&[0], 12).unwrap();
        assert_eq!(column.rank_list(), &[12, 16]);
        assert_eq!(mesh.stage_ranks(2, 0).unwrap(), vec![10, 11, 12, 13]);
        assert!(matches!(
            mesh.sub_mesh(&[0], 3),
            Err(LayoutError::RankNotInMesh { rank: 3, .. })
        ));
    }

    #[test]
    fn split_axis_keeps_every_slot() {
        let mesh = Mesh::new(&[4, 2], &["dp", "mp"], None).unwrap();
        let split = mesh
            .split_axis(0, &[2, 2], &["dp0".into(), "dp1".into()])
            .unwrap();
        assert_eq!(split.device_matrix(), vec![2, 2, 2]);
        for slot in 0..8 {
            let c = mesh.coord(slot);
            let s = split.coord(slot);
            assert_eq!(c[0], s[0] * 2 + s[1]);
            assert_eq!(c[1], s[2]);
        }
    }

    #[test]
    fn absurd_device_matrices_are_errors_not_allocations() {
        // 10^12 slots: refused before a rank list is allocated.
        let err = Mesh::new(&[1_000_000, 1_000_000], &["a", "b"], None).unwrap_err();
        assert!(matches!(
            err,
            LayoutError::TooManyRanks {
                n_ranks: Some(1_000_000_000_000),
                ..
            }
        ));
        // The product overflows usize.
        let err = Mesh::line("dp", usize::MAX)
            .and_then(|m| m.split_axis(0, &[usize::MAX], &["x".into()]))
            .unwrap_err();
        assert!(matches!(err, LayoutError::TooManyRanks { .. }));
        let err = Mesh::new(&[1 << 33, 1 << 33], &["a", "b"], None).unwrap_err();
        assert!(matches!(
            err,
            LayoutError::TooManyRanks { n_ranks: None, .. }
        ));
        // 12000 axes of size 1 hold one rank but are still refused.
        let names: Vec<String> = (0..12_000).map(|i| format!("a{i}")).collect();
        let err = Mesh::new(&vec![1; 12_000], &names, None).unwrap_err();
        assert_eq!(
            err,
            LayoutError::TooManyAxes {
                n_axes: 12_000,
                max: limits::MAX_MESH_AXES
            }
        );
        // A rank list naming a rank at the ceiling.
        let err = Mesh::new(&[2], &["dp"], Some(vec![0, limits::max_ranks()])).unwrap_err();
        assert!(matches!(err, LayoutError::RankAboveCeiling { .. }));
        // The largest mesh allowed by default is built.
        assert_eq!(
            Mesh::line("dp", limits::DEFAULT_MAX_RANKS)
                .unwrap()
                .n_slots(),
            1 << 20
        );
    }

    #[test]
    fn an_interleaved_rank_list_keeps_each_positions_copies_on_one_device() {
        let names = ["dp", INTERLEAVED_ALIAS];
        // Virtual ranks r*2 + j in order: devices 3, 2, 1, 0.
        let ok = Mesh::new(&[4, 2], &names, Some(vec![6, 7, 4, 5, 2, 3, 0, 1])).unwrap();
        assert_eq!(ok.device_ranks(), vec![3, 2, 1, 0]);
        // Reversed: slot 0 (copy 0) would be virtual rank 7, copy 1 of device 3.
        let err = Mesh::new(&[4, 2], &names, Some((0..8).rev().collect())).unwrap_err();
        assert_eq!(
            err,
            LayoutError::InterleavedRankList {
                slot: 0,
                rank: 7,
                k: 2,
                expected: 6
            }
        );
        assert!(err.to_string().contains("interleaved_parallel"), "{err}");
        // Position dp=1 split over devices 1 and 2.
        let err = Mesh::new(&[2, 2], &names, Some(vec![0, 1, 2, 5])).unwrap_err();
        assert!(matches!(
            err,
            LayoutError::InterleavedRankList {
                slot: 3,
                rank: 5,
                expected: 3,
                ..
            }
        ));
        // A contiguous list must start on a device boundary.
        assert!(Mesh::new(&[2, 2], &names, Some(vec![1, 2, 3, 4])).is_err());
        assert!(Mesh::new(&[2, 2], &names, Some(vec![4, 5, 6, 7])).is_ok());
    }

    #[test]
    fn interleaved_slots_map_to_devices() {
        let mesh = Mesh::new(&[2, 2], &["dp", INTERLEAVED_ALIAS], None).unwrap();
        assert!(mesh.is_interleaved());
        assert_eq!(mesh.n_devices(), 2);
        assert_eq!(
            (0..4).map(|s| mesh.device_of_slot(s)).collect::<Vec<_>>(),
            vec![0, 0, 1, 1]
        );
        assert_eq!(mesh.device_ranks(), vec![0, 1]);
    }
}
