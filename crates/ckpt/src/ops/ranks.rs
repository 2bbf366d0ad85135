//! Minimal source-rank lists from two strategies alone (no checkpoint files): MindSpore's
//! `rank_list_for_convert`, answered with the cover the conversions use
//! ([`crate::ops::engine::cover`]).

use crate::error::{CkptError, Result};
use crate::model::strategy::lcm;
use crate::model::{ResolvedStrategy, ShapeHint, Strategy, StrategyParam};
use crate::ops::engine::cover::{needed_boxes, pieces_for, solve_cover, RankCover};

/// The minimal list of source ranks whose data destination rank `rank` needs, from the two
/// strategies alone (no checkpoint files). Parameters in the destination rank's pipeline stage
/// count; `dst = None` means "everything merged on one rank".
///
/// Shapes the strategies do not record are replaced by the least common multiple of every
/// split factor of the parameter: which ranks hold which part of a box does not depend on scale.
pub fn minimal_rank_list(src: &Strategy, dst: Option<&Strategy>, rank: usize) -> Result<RankCover> {
    let (src_resolved, dst_resolved) = resolve_scale_free_pair(src, dst)?;
    if !dst_resolved.ranks().contains(&rank) {
        return Err(CkptError::NotADestinationRank {
            rank,
            ranks: dst_resolved.ranks(),
        });
    }
    let sets: Vec<Vec<usize>> = needed_boxes(&src_resolved, &dst_resolved, rank)
        .into_iter()
        .flat_map(|(p, b)| pieces_for(p, &b).into_iter().map(|piece| piece.holders))
        .collect();
    Ok(solve_cover(&sets))
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
