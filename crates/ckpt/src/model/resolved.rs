//! A strategy with every global shape bound ([`ResolvedStrategy`]): each rank's box of each
//! parameter is known.

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;

use layout::{LayoutError, TensorLayout};
use tensor::DType;

use crate::error::{CkptError, Result};

/// A parameter's placement in one stage, bound to the global shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamLayout {
    /// The pipeline stage.
    pub stage: usize,
    /// The model-parallel layout.
    pub mp: TensorLayout,
    /// What each rank holds: `mp` with the optimizer shard applied.
    pub held: TensorLayout,
    /// Optimizer-shard group size (1 = none).
    pub opt_shard: usize,
}

impl ParamLayout {
    /// Binds a model-parallel layout and an optimizer-shard group size (1 = none).
    pub fn new(
        stage: usize,
        mp: TensorLayout,
        opt_shard: usize,
    ) -> Result<ParamLayout, LayoutError> {
        let held = if opt_shard > 1 {
            mp.with_optimizer_shard(Some(opt_shard))?
        } else {
            mp.clone()
        };
        Ok(ParamLayout {
            stage,
            mp,
            held,
            opt_shard: opt_shard.max(1),
        })
    }

    /// MindSpore's `opt_weight_shard_step`: the rank stride inside the optimizer-shard group,
    /// `(last - first) / (n - 1)` of the group containing the mesh's first slot (0 when not
    /// sharded).
    pub fn opt_shard_step(&self) -> usize {
        if self.opt_shard <= 1 {
            return 0;
        }
        let group = self.mp.replica_slots(0);
        let k = self.opt_shard.min(group.len());
        if k <= 1 {
            return 0;
        }
        let mesh = self.mp.mesh();
        let (first, last) = (mesh.rank_of_slot(group[0]), mesh.rank_of_slot(group[k - 1]));
        (last - first) / (k - 1)
    }
}

/// One parameter of a [`ResolvedStrategy`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedParam {
    /// The name.
    pub name: String,
    /// The global shape.
    pub shape: Vec<usize>,
    /// The dtype, when known.
    pub dtype: Option<DType>,
    /// Its placements, one per pipeline stage holding it.
    pub placements: Vec<ParamLayout>,
}

impl ResolvedParam {
    /// The placement whose mesh holds global rank `rank` (as a physical device), with its slot.
    /// The first slot in slot order when an interleaved mesh gives the device several. A lookup
    /// per virtual rank of the device, not a scan of the mesh (constant time for contiguous rank
    /// lists).
    pub fn placement_of_rank(&self, rank: usize) -> Option<(&ParamLayout, usize)> {
        self.placements.iter().find_map(|p| {
            let mesh = p.held.mesh();
            let k = mesh.interleave_factor();
            (0..k)
                .filter_map(|j| {
                    let virtual_rank = rank.checked_mul(k)?.checked_add(j)?;
                    mesh.slot_of_rank(virtual_rank)
                })
                .min()
                .map(|s| (p, s))
        })
    }
}

/// A strategy with every shape bound: each rank's box of each parameter is known.
#[derive(Debug, Clone, Default)]
pub struct ResolvedStrategy {
    params: Vec<ResolvedParam>,
    by_name: HashMap<String, usize>,
}

impl ResolvedStrategy {
    /// Builds a strategy from resolved parameters (names must be unique).
    pub fn new(params: Vec<ResolvedParam>) -> Result<ResolvedStrategy> {
        let mut by_name = HashMap::with_capacity(params.len());
        for (i, p) in params.iter().enumerate() {
            if by_name.insert(p.name.clone(), i).is_some() {
                return Err(CkptError::DuplicateParam {
                    tensor: p.name.clone(),
                });
            }
            for pl in &p.placements {
                if pl.held.mesh().is_interleaved() {
                    return Err(CkptError::InterleavedLayout {
                        tensor: p.name.clone(),
                    });
                }
            }
        }
        Ok(ResolvedStrategy { params, by_name })
    }

    /// The parameters, in order.
    pub fn params(&self) -> &[ResolvedParam] {
        &self.params
    }

    /// The parameter called `name`.
    pub fn param(&self, name: &str) -> Option<&ResolvedParam> {
        self.by_name.get(name).map(|&i| &self.params[i])
    }

    /// Every global rank of every placement, ascending.
    pub fn ranks(&self) -> Vec<usize> {
        let mut ranks = BTreeSet::new();
        for p in &self.params {
            for pl in &p.placements {
                ranks.extend(pl.held.mesh().device_ranks());
            }
        }
        ranks.into_iter().collect()
    }

    /// Number of ranks: one past the largest rank.
    pub fn n_ranks(&self) -> usize {
        self.ranks().last().map_or(0, |r| r + 1)
    }

    /// Number of pipeline stages (one past the largest stage).
    pub fn n_stages(&self) -> usize {
        stage_count(
            self.params
                .iter()
                .flat_map(|p| p.placements.iter().map(|pl| pl.stage)),
        )
    }

    /// This strategy's parameters whole on one rank (rank 0), same shapes and dtypes: the
    /// destination of a merge.
    pub fn merged(&self) -> Result<ResolvedStrategy> {
        let params: Vec<_> = self
            .params
            .iter()
            .map(|p| (p.name.clone(), p.shape.clone(), p.dtype))
            .collect();
        ResolvedStrategy::single_rank(&params)
    }

    /// Every parameter fully replicated on one rank (rank 0), with the given shapes: the
    /// destination of a merge.
    pub fn single_rank(params: &[(String, Vec<usize>, Option<DType>)]) -> Result<ResolvedStrategy> {
        let mesh = layout::Mesh::line("rank", 1).expect("a one-rank mesh");
        let params = params
            .iter()
            .map(|(name, shape, dtype)| {
                let mp = TensorLayout::replicated(mesh.clone(), shape);
                Ok(ResolvedParam {
                    name: name.clone(),
                    shape: shape.clone(),
                    dtype: *dtype,
                    placements: vec![ParamLayout::new(0, mp, 1).map_err(|source| {
                        CkptError::Layout {
                            path: PathBuf::from("(single rank)"),
                            tensor: name.clone(),
                            source,
                        }
                    })?],
                })
            })
            .collect::<Result<Vec<_>>>()?;
        ResolvedStrategy::new(params)
    }
}

/// One past the largest of `stages` (0 for none): a strategy's number of pipeline stages.
pub(crate) fn stage_count(stages: impl Iterator<Item = usize>) -> usize {
    stages.map(|s| s + 1).max().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placement_of_rank_finds_the_first_slot_of_each_device() {
        let meshes = [
            layout::Mesh::new(&[2, 4], &["a", "b"], None).unwrap(),
            layout::Mesh::new(&[2, 2], &["a", "b"], Some(vec![7, 3, 5, 1])).unwrap(),
            layout::Mesh::new(&[2, 2], &["a", layout::INTERLEAVED_ALIAS], None).unwrap(),
        ];
        for mesh in meshes {
            let mp = layout::Layout::from_mesh(mesh.clone(), vec![Vec::new(); 1])
                .unwrap()
                .bind(&[4])
                .unwrap();
            let param = ResolvedParam {
                name: "w".into(),
                shape: vec![4],
                dtype: None,
                placements: vec![ParamLayout::new(0, mp, 1).unwrap()],
            };
            for rank in 0..10 {
                let brute = (0..mesh.n_slots()).find(|&s| mesh.device_of_slot(s) == rank);
                assert_eq!(
                    param.placement_of_rank(rank).map(|(_, s)| s),
                    brute,
                    "rank {rank}"
                );
            }
        }
    }
}
