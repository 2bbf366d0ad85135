//! Which source ranks a destination rank of a conversion needs, without reading any tensor:
//! minimal source-rank lists from two strategies alone (MindSpore's `rank_list_for_convert`),
//! and conversion plans (per destination rank and parameter, the pieces of its box and the
//! source ranks holding each). Both are answered with the holder search and the cover the
//! conversions use ([`crate::ops::engine::cover`]).

use std::path::Path;

use layout::SliceBox;

use crate::error::{CkptError, Result};
use crate::model::strategy::lcm;
use crate::model::{ResolvedStrategy, ShapeHint, Strategy, StrategyParam};
use crate::ops::engine::cover::{
    needed_boxes, needed_params, pieces_for, solve_cover, HeldPiece, RankCover,
};
use crate::source::SourceSet;

/// The minimal list of source ranks whose data destination rank `rank` needs, from the two
/// strategies alone (no checkpoint files). Parameters in the destination rank's pipeline stage
/// count; `dst = None` means "everything merged on one rank".
///
/// Shapes the strategies do not record are replaced by the least common multiple of every
/// split factor of the parameter: which ranks hold which part of a box does not depend on scale.
pub fn minimal_rank_list(src: &Strategy, dst: Option<&Strategy>, rank: usize) -> Result<RankCover> {
    let (src_resolved, dst_resolved) = resolve_scale_free_pair(src, dst)?;
    cover_of_rank(&src_resolved, &dst_resolved, rank)
}

/// The minimal source ranks destination rank `rank` of two resolved strategies needs; an error
/// when `rank` is not a rank of `dst`.
fn cover_of_rank(src: &ResolvedStrategy, dst: &ResolvedStrategy, rank: usize) -> Result<RankCover> {
    if !dst.ranks().contains(&rank) {
        return Err(CkptError::NotADestinationRank {
            rank,
            ranks: dst.ranks(),
        });
    }
    let sets: Vec<Vec<usize>> = needed_boxes(src, dst, rank)
        .into_iter()
        .flat_map(|(p, b)| pieces_for(p, &b).into_iter().map(|piece| piece.holders))
        .collect();
    Ok(solve_cover(&sets))
}

/// Where [`conversion_plan`] takes the parameters' global shapes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlanShapes<'a> {
    /// From the strategies alone ([`resolve_scale_free_pair`]): which ranks hold which part of
    /// a box does not depend on scale, so only the boxes' sizes differ from the real ones.
    ScaleFree,
    /// From the source checkpoint in this directory (holding `rank_<N>/`), saved under the
    /// source strategy; the destination takes the source's shapes.
    Checkpoint(&'a Path),
}

/// One destination rank's part of a conversion ([`conversion_plan`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankConversionPlan {
    /// The destination rank.
    pub rank: usize,
    /// The minimal source ranks it reads ([`minimal_rank_list`]).
    pub cover: RankCover,
    /// Every destination parameter it holds that the source has, in the destination
    /// strategy's order.
    pub params: Vec<ParamPieces>,
}

/// A destination rank's box of one parameter and the pieces it is assembled from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamPieces {
    /// The parameter's name.
    pub name: String,
    /// Its global shape.
    pub global_shape: Vec<usize>,
    /// The rank's box of it.
    pub region: SliceBox,
    /// The pieces that tile the box, each with the source ranks holding all of it, ordered by
    /// their lowest holder (pieces with the same lowest holder in the search's block order).
    pub pieces: Vec<HeldPiece>,
}

/// The plan of converting from `src` to `dst` (`None`: everything merged into rank 0) for the
/// destination ranks `ranks` (`None`: every destination rank, ascending): per rank the minimal
/// source ranks, and per parameter the rank's box with the pieces it needs and their holders.
/// Shapes come from `shapes`; the cover always comes from the strategies alone, as
/// [`minimal_rank_list`] answers it. A requested rank outside `dst` is an error. No tensor is
/// read: a checkpoint directory only gives the shapes.
pub fn conversion_plan(
    src: &Strategy,
    dst: Option<&Strategy>,
    shapes: PlanShapes<'_>,
    ranks: Option<&[usize]>,
) -> Result<Vec<RankConversionPlan>> {
    let resolved = match shapes {
        PlanShapes::ScaleFree => None,
        PlanShapes::Checkpoint(dir) => Some(resolve_with_checkpoint(src, dst, dir)?),
    };
    let scale_free = resolve_scale_free_pair(src, dst)?;
    let (src_res, dst_res) = resolved.as_ref().unwrap_or(&scale_free);
    let ranks = ranks.map_or_else(|| dst_res.ranks(), <[usize]>::to_vec);
    ranks
        .into_iter()
        .map(|rank| {
            let cover = cover_of_rank(&scale_free.0, &scale_free.1, rank)?;
            let params = needed_params(src_res, dst_res, rank)
                .map(|(p, src_param, region)| {
                    let mut pieces = pieces_for(src_param, &region);
                    pieces.sort_by_key(|piece| piece.holders.first().copied());
                    ParamPieces {
                        name: p.name.clone(),
                        global_shape: p.shape.clone(),
                        pieces,
                        region,
                    }
                })
                .collect();
            Ok(RankConversionPlan {
                rank,
                cover,
                params,
            })
        })
        .collect()
}

/// Both strategies bound to the shapes of the checkpoint in `dir` (saved under `src`): the
/// source by its files, the destination by the source's shapes (`None`: everything merged on
/// one rank).
fn resolve_with_checkpoint(
    src: &Strategy,
    dst: Option<&Strategy>,
    dir: &Path,
) -> Result<(ResolvedStrategy, ResolvedStrategy)> {
    let src_res = SourceSet::rank_dirs(dir)?.resolve_source(src)?.0;
    let dst_res = match dst {
        Some(d) => {
            d.resolve(|p, _| {
                Ok(src_res.param(&p.name).map(|s| ShapeHint {
                    shape: s.shape.clone(),
                    is_global: true,
                    dtype: s.dtype,
                    source: "the source checkpoint".to_string(),
                }))
            })?
            .0
        }
        None => src_res.merged()?,
    };
    Ok((src_res, dst_res))
}

/// Both strategies of a conversion bound to shapes without any checkpoint: the recorded ones,
/// else per dim the least common multiple of every split factor the two strategies give the
/// parameter (`dst = None`: everything on one rank). Which ranks hold which part of a box does
/// not depend on scale, so plans and rank lists made on these shapes hold for the real ones.
pub fn resolve_scale_free_pair(
    src: &Strategy,
    dst: Option<&Strategy>,
) -> Result<(ResolvedStrategy, ResolvedStrategy)> {
    src.check_stages()?;
    let synthetic = |p: &StrategyParam| -> Result<Option<Vec<usize>>> {
        let mut factors: Vec<usize> = Vec::new();
        let others = dst.and_then(|d| d.param(&p.name));
        for pl in p
            .placements
            .iter()
            .chain(others.into_iter().flat_map(|o| &o.placements))
        {
            let held = pl.held_layout().map_err(|source| CkptError::Layout {
                path: src.path.clone(),
                tensor: p.name.clone(),
                source,
            })?;
            let f = held.split_factors();
            if factors.is_empty() {
                factors = f;
            } else if factors.len() != f.len() {
                return Err(CkptError::GlobalShape {
                    tensor: p.name.clone(),
                    reason: format!("the strategies map {} and {} dims", factors.len(), f.len()),
                });
            } else {
                for (a, b) in factors.iter_mut().zip(f) {
                    *a = lcm(*a, b);
                }
            }
        }
        Ok(Some(factors))
    };
    let mut shapes: std::collections::HashMap<String, Vec<usize>> = Default::default();
    for p in &src.params {
        let shape = match &p.shape {
            Some(s) => s.clone(),
            None => match dst
                .and_then(|d| d.param(&p.name))
                .and_then(|d| d.shape.clone())
            {
                Some(s) => s,
                None => synthetic(p)?.unwrap_or_default(),
            },
        };
        shapes.insert(p.name.clone(), shape);
    }
    let hint = |name: &str| {
        shapes.get(name).map(|s| ShapeHint {
            shape: s.clone(),
            is_global: true,
            dtype: None,
            source: "the source strategy".to_string(),
        })
    };
    let (src_resolved, _) = src.resolve(|p, _| Ok(hint(&p.name)))?;
    let dst_resolved = match dst {
        Some(d) => {
            d.check_stages()?;
            d.resolve(|p, _| Ok(hint(&p.name)))?.0
        }
        None => src_resolved.merged()?,
    };
    Ok((src_resolved, dst_resolved))
}
