//! Planning one output file: which tensors it holds, and for each piece of each tensor, the
//! source rank whose file supplies it.
//!
//! The set of source files opened is minimal: the holders of every needed piece are covered by
//! the smallest set of source ranks ([`super::cover::solve_cover`]). When a chosen file turns
//! out not to hold a tensor (a checkpoint saved without redundancy) or a rank has no file, that
//! holder is struck off and the cover is solved again.

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;

use layout::SliceBox;

use super::cover::{needed_boxes, pieces_for, solve_cover, RankCover};
use crate::error::{CkptError, Result};
use crate::model::{ResolvedParam, ResolvedStrategy, StoredTensor, StoredType, TensorMeta};
use crate::source::{CheckpointFile, SourceSet};

/// Where an output tensor's bytes come from.
#[derive(Debug, Clone)]
pub(crate) enum ItemSource<'a> {
    /// A box of a strategy parameter, assembled from pieces of source slices: each piece with
    /// the source rank that supplies it.
    Gather {
        param: &'a ResolvedParam,
        region: SliceBox,
        pieces: Vec<(SliceBox, usize)>,
    },
    /// A box of one stored tensor (`None`: the whole tensor, byte for byte).
    Stored {
        file: Arc<CheckpointFile>,
        region: Option<SliceBox>,
    },
}

/// One tensor of an output file.
#[derive(Debug, Clone)]
pub(crate) struct OutItem<'a> {
    pub meta: TensorMeta,
    pub source: ItemSource<'a>,
}

impl<'a> OutItem<'a> {
    /// Tensor `tensor` of `file`, copied whole and byte for byte.
    pub(crate) fn whole(file: &Arc<CheckpointFile>, tensor: &StoredTensor) -> OutItem<'a> {
        OutItem {
            meta: tensor.meta(),
            source: ItemSource::Stored {
                file: file.clone(),
                region: None,
            },
        }
    }
}

/// The plan of one output file.
#[derive(Debug, Clone)]
pub(crate) struct RankPlan<'a> {
    pub items: Vec<OutItem<'a>>,
    pub cover: RankCover,
}

/// What a destination rank's file holds besides the destination strategy's parameters.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Extras {
    /// Source parameters the destination strategy lacks are copied whole.
    pub src_only_params: bool,
    /// Tensors outside the source strategy are copied from this source rank's file.
    pub home_rank: Option<usize>,
}

/// Plans the file of destination rank `rank`.
pub(crate) fn plan_rank<'a>(
    sources: &SourceSet,
    src: &'a ResolvedStrategy,
    dst: &ResolvedStrategy,
    rank: usize,
    extras: Extras,
) -> Result<RankPlan<'a>> {
    let mut boxes = needed_boxes(src, dst, rank);
    if extras.src_only_params {
        for p in src.params() {
            if dst.param(&p.name).is_none() {
                boxes.push((p, SliceBox::full(&p.shape)));
            }
        }
    }
    let mut plan = plan_gathers(sources, boxes)?;
    if let Some(home) = extras.home_rank {
        if let Some(file) = sources.extras_file(home)? {
            for t in file.tensors() {
                if src.param(&t.name).is_some() {
                    continue;
                }
                let region = match dst.param(&t.name).and_then(|p| p.placement_of_rank(rank)) {
                    Some((pl, slot)) => {
                        if pl.held.shape() != t.shape.as_slice() {
                            return Err(CkptError::SliceShape {
                                path: file.path().to_path_buf(),
                                tensor: t.name.clone(),
                                expected: pl.held.shape().to_vec(),
                                found: t.shape.clone(),
                            });
                        }
                        Some(pl.held.slot_box(slot))
                    }
                    None if dst.param(&t.name).is_some() => continue,
                    None => None,
                };
                let meta = match &region {
                    Some(b) => TensorMeta::new(&t.name, t.ty.clone(), b.shape.to_vec()),
                    None => t.meta(),
                };
                plan.items.push(OutItem {
                    meta,
                    source: ItemSource::Stored {
                        file: file.clone(),
                        region,
                    },
                });
            }
        }
    }
    Ok(plan)
}

/// Plans gathering each `(parameter, box)` from the sources with a minimal set of files.
pub(crate) fn plan_gathers<'a>(
    sources: &SourceSet,
    boxes: Vec<(&'a ResolvedParam, SliceBox)>,
) -> Result<RankPlan<'a>> {
    struct Need {
        item: usize,
        region: SliceBox,
        holders: Vec<usize>,
    }
    let mut needs = Vec::new();
    let mut items = Vec::with_capacity(boxes.len());
    for (i, (param, region)) in boxes.iter().enumerate() {
        let dtype = param.dtype.ok_or_else(|| CkptError::Unsupported {
            path: sources.root().to_path_buf(),
            tensor: param.name.clone(),
            reason:
                "its element type cannot be sliced (not a numeric dtype), so it cannot be resharded"
                    .to_string(),
        })?;
        for piece in pieces_for(param, region) {
            needs.push(Need {
                item: i,
                region: piece.region,
                holders: piece.holders,
            });
        }
        items.push(TensorMeta::new(
            &param.name,
            StoredType::DType(dtype),
            region.shape.to_vec(),
        ));
    }
    let mut unavailable: BTreeSet<usize> = BTreeSet::new();
    let mut absent: HashSet<(usize, usize)> = HashSet::new(); // (rank, item)
    let ok =
        |h: usize, item: usize, unavailable: &BTreeSet<usize>, absent: &HashSet<(usize, usize)>| {
            !unavailable.contains(&h) && !absent.contains(&(h, item))
        };
    loop {
        let mut sets = Vec::with_capacity(needs.len());
        for n in &needs {
            let set: Vec<usize> = n
                .holders
                .iter()
                .copied()
                .filter(|&h| ok(h, n.item, &unavailable, &absent))
                .collect();
            if set.is_empty() {
                let name = &boxes[n.item].0.name;
                let first = n.holders[0];
                if n.holders.iter().all(|h| unavailable.contains(h)) {
                    return Err(CkptError::MissingRank {
                        path: sources.root().to_path_buf(),
                        rank: first,
                    });
                }
                let holder = *n
                    .holders
                    .iter()
                    .find(|h| !unavailable.contains(h))
                    .expect("checked");
                let path = sources
                    .file_for(holder, name)?
                    .map(|f| f.path().to_path_buf())
                    .unwrap_or_else(|| sources.root().to_path_buf());
                return Err(CkptError::TensorMissing {
                    path,
                    tensor: name.clone(),
                    rule: format!(
                        "the strategy places its box {} on source ranks {:?} and none of their files holds it",
                        n.region, n.holders
                    ),
                });
            }
            sets.push(set);
        }
        let cover = solve_cover(&sets);
        let chosen: BTreeSet<usize> = cover.ranks.iter().copied().collect();
        let mut changed = false;
        let mut checked: HashSet<(usize, usize)> = HashSet::new();
        let mut assignment = Vec::with_capacity(needs.len());
        for (n, set) in needs.iter().zip(&sets) {
            let h = *set
                .iter()
                .find(|h| chosen.contains(h))
                .expect("the cover hits every set");
            assignment.push(h);
            if !checked.insert((h, n.item)) {
                continue;
            }
            let param = boxes[n.item].0;
            match sources.file_for(h, &param.name)? {
                None => {
                    unavailable.insert(h);
                    changed = true;
                }
                Some(file) => match file.tensor(&param.name) {
                    None => {
                        absent.insert((h, n.item));
                        changed = true;
                    }
                    Some(t) => check_stored(&file, t, param, h)?,
                },
            }
        }
        if changed {
            continue;
        }
        let mut gathered: Vec<Vec<(SliceBox, usize)>> = vec![Vec::new(); boxes.len()];
        for (n, h) in needs.iter().zip(assignment) {
            gathered[n.item].push((n.region.clone(), h));
        }
        let out = boxes
            .into_iter()
            .zip(items)
            .zip(gathered)
            .map(|(((param, region), meta), pieces)| OutItem {
                meta,
                source: ItemSource::Gather {
                    param,
                    region,
                    pieces,
                },
            })
            .collect();
        return Ok(RankPlan { items: out, cover });
    }
}

/// Checks that the tensor stored on source rank `rank` has the slice shape and dtype the
/// strategy implies.
fn check_stored(
    file: &CheckpointFile,
    t: &StoredTensor,
    param: &ResolvedParam,
    rank: usize,
) -> Result<()> {
    let (pl, slot) = param
        .placement_of_rank(rank)
        .expect("a holder is a rank of one of the parameter's placements");
    let expected = pl.held.slot_shape(slot);
    if t.shape != expected {
        return Err(CkptError::SliceShape {
            path: file.path().to_path_buf(),
            tensor: t.name.clone(),
            expected,
            found: t.shape.clone(),
        });
    }
    if let (Some(expected), found) = (param.dtype, t.dtype()) {
        if found != Some(expected) {
            return Err(match found {
                Some(found) => CkptError::DTypeMismatch {
                    path: file.path().to_path_buf(),
                    tensor: t.name.clone(),
                    expected,
                    found,
                    reason: "another rank's slice of the same parameter has that dtype".to_string(),
                },
                None => CkptError::Unsupported {
                    path: file.path().to_path_buf(),
                    tensor: t.name.clone(),
                    reason: format!(
                        "stored as MindSpore type {}, which cannot be resharded",
                        t.ty
                    ),
                },
            });
        }
    }
    Ok(())
}
