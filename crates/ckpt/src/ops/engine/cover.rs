//! Minimal source-rank lists: which source ranks a destination rank must read.
//!
//! Every piece a destination rank needs is held by a set of source ranks (a replica group,
//! joined over pipeline stages holding the parameter). The smallest set of source ranks that
//! hits every such set is a set-cover (hitting-set) problem. It is solved exactly by branch and
//! bound when the search fits a node budget, and greedily otherwise; [`RankCover::exact`] says
//! which. MindSpore's `rank_list_for_convert` instead returns every rank its simulated
//! collectives touch, usually all of them.

use std::collections::BTreeSet;

use layout::SliceBox;

use crate::model::{ResolvedParam, ResolvedStrategy};

/// The answer to "which source ranks does this destination rank need".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankCover {
    /// The source ranks, ascending.
    pub ranks: Vec<usize>,
    /// Whether the list is proven minimal (branch and bound finished) or greedy.
    pub exact: bool,
}

/// Branch-and-bound nodes explored before settling for the best cover found.
const NODE_BUDGET: usize = 200_000;

/// A piece of a parameter's box and the source ranks holding all of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldPiece {
    /// The piece, in global coordinates.
    pub region: SliceBox,
    /// The source ranks (physical devices) holding it, ascending.
    pub holders: Vec<usize>,
}

/// The pieces `region` of `param` splits into over every source placement, each with the
/// source ranks (physical devices) holding all of it. Uses the shared planner
/// ([`reshard::source_pieces`]) per placement and refines across placements.
pub(crate) fn pieces_for(param: &ResolvedParam, region: &SliceBox) -> Vec<HeldPiece> {
    let mut pieces = vec![HeldPiece {
        region: region.clone(),
        holders: Vec::new(),
    }];
    for pl in &param.placements {
        let mesh = pl.held.mesh();
        let mut next = Vec::with_capacity(pieces.len());
        for piece in &pieces {
            for sp in reshard::source_pieces(&pl.held, &piece.region) {
                let mut holders: BTreeSet<usize> = piece.holders.iter().copied().collect();
                holders.extend(sp.holders.iter().map(|&s| mesh.device_of_slot(s)));
                next.push(HeldPiece {
                    region: sp.region,
                    holders: holders.into_iter().collect(),
                });
            }
        }
        pieces = next;
    }
    pieces
}

/// The smallest set of ranks hitting every set in `sets` (each non-empty).
pub(crate) fn solve_cover(sets: &[Vec<usize>]) -> RankCover {
    // Distinct sets, then drop any set that contains another (hitting the smaller one hits it).
    let mut distinct: Vec<Vec<usize>> = sets
        .iter()
        .map(|s| {
            let mut s = s.clone();
            s.sort_unstable();
            s.dedup();
            s
        })
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    distinct.sort_by_key(Vec::len);
    if distinct.len() <= 4096 {
        let mut kept: Vec<Vec<usize>> = Vec::new();
        for s in distinct {
            if !kept.iter().any(|k| is_subset(k, &s)) {
                kept.push(s);
            }
        }
        distinct = kept;
    }
    if distinct.is_empty() {
        return RankCover {
            ranks: Vec::new(),
            exact: true,
        };
    }
    let candidates: Vec<usize> = distinct
        .iter()
        .flatten()
        .copied()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let index = |r: usize| candidates.binary_search(&r).expect("a candidate");
    let n_words = candidates.len().div_ceil(64);
    let masks: Vec<Vec<u64>> = distinct
        .iter()
        .map(|s| {
            let mut m = vec![0u64; n_words];
            for &r in s {
                let i = index(r);
                m[i / 64] |= 1 << (i % 64);
            }
            m
        })
        .collect();
    let greedy = greedy_cover(&masks, candidates.len());
    let mut search = Search {
        masks: &masks,
        n_candidates: candidates.len(),
        best: greedy,
        nodes: 0,
        exhausted: false,
    };
    let mut chosen = Vec::new();
    let mut covered = vec![false; masks.len()];
    search.dfs(&mut chosen, &mut covered);
    let mut ranks: Vec<usize> = search.best.iter().map(|&i| candidates[i]).collect();
    ranks.sort_unstable();
    RankCover {
        ranks,
        exact: !search.exhausted,
    }
}

fn is_subset(small: &[usize], big: &[usize]) -> bool {
    small.iter().all(|x| big.binary_search(x).is_ok())
}

fn has_bit(mask: &[u64], i: usize) -> bool {
    mask[i / 64] >> (i % 64) & 1 == 1
}

fn greedy_cover(masks: &[Vec<u64>], n: usize) -> Vec<usize> {
    let mut covered = vec![false; masks.len()];
    let mut chosen = Vec::new();
    while covered.iter().any(|c| !c) {
        let best = (0..n)
            .max_by_key(|&i| {
                let hits = masks
                    .iter()
                    .zip(&covered)
                    .filter(|(m, c)| !**c && has_bit(m, i))
                    .count();
                (hits, std::cmp::Reverse(i))
            })
            .expect("some candidate");
        for (m, c) in masks.iter().zip(covered.iter_mut()) {
            if has_bit(m, best) {
                *c = true;
            }
        }
        chosen.push(best);
    }
    chosen
}

struct Search<'a> {
    masks: &'a [Vec<u64>],
    n_candidates: usize,
    best: Vec<usize>,
    nodes: usize,
    exhausted: bool,
}

impl Search<'_> {
    fn dfs(&mut self, chosen: &mut Vec<usize>, covered: &mut [bool]) {
        self.nodes += 1;
        if self.nodes > NODE_BUDGET {
            self.exhausted = true;
            return;
        }
        // The uncovered set with the fewest candidates is branched on.
        let mut pick: Option<(usize, usize)> = None;
        for (i, m) in self.masks.iter().enumerate() {
            if covered[i] {
                continue;
            }
            let n = m.iter().map(|w| w.count_ones() as usize).sum();
            if pick.is_none_or(|(_, best)| n < best) {
                pick = Some((i, n));
            }
        }
        let Some((set, _)) = pick else {
            if chosen.len() < self.best.len() {
                self.best = chosen.clone();
            }
            return;
        };
        // Lower bound: uncovered sets that pairwise share no candidate each need their own rank.
        if chosen.len() + self.disjoint_bound(covered) >= self.best.len() {
            return;
        }
        for r in 0..self.n_candidates {
            if !has_bit(&self.masks[set], r) {
                continue;
            }
            let newly: Vec<usize> = (0..self.masks.len())
                .filter(|&i| !covered[i] && has_bit(&self.masks[i], r))
                .collect();
            for &i in &newly {
                covered[i] = true;
            }
            chosen.push(r);
            self.dfs(chosen, covered);
            chosen.pop();
            for &i in &newly {
                covered[i] = false;
            }
            if self.exhausted {
                return;
            }
        }
    }

    fn disjoint_bound(&self, covered: &[bool]) -> usize {
        let words = self.masks.first().map_or(0, Vec::len);
        let mut used = vec![0u64; words];
        let mut count = 0;
        for (i, m) in self.masks.iter().enumerate() {
            if covered[i] {
                continue;
            }
            if m.iter().zip(&used).all(|(a, b)| a & b == 0) {
                for (u, w) in used.iter_mut().zip(m) {
                    *u |= w;
                }
                count += 1;
            }
        }
        count
    }
}

/// The boxes destination rank `rank` holds under `dst`, for parameters the source has:
/// `(source parameter, box)` pairs. Destination parameters the source lacks are skipped.
pub(crate) fn needed_boxes<'a>(
    src: &'a ResolvedStrategy,
    dst: &ResolvedStrategy,
    rank: usize,
) -> Vec<(&'a ResolvedParam, SliceBox)> {
    needed_params(src, dst, rank)
        .map(|(_, src_param, region)| (src_param, region))
        .collect()
}

/// [`needed_boxes`] with the destination parameter of each box: `(destination parameter,
/// source parameter, box)`, in the destination strategy's order.
pub(crate) fn needed_params<'a, 'd>(
    src: &'a ResolvedStrategy,
    dst: &'d ResolvedStrategy,
    rank: usize,
) -> impl Iterator<Item = (&'d ResolvedParam, &'a ResolvedParam, SliceBox)> {
    dst.params().iter().filter_map(move |p| {
        let (pl, slot) = p.placement_of_rank(rank)?;
        let src_param = src.param(&p.name)?;
        Some((p, src_param, pl.held.slot_box(slot)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cover_is_minimal() {
        // {0,4} {1,5} {0} {1} {2,6} {3,7}: two forced ranks and one from each pair.
        let sets = vec![
            vec![0, 4],
            vec![1, 5],
            vec![0],
            vec![1],
            vec![2, 6],
            vec![3, 7],
        ];
        let c = solve_cover(&sets);
        assert_eq!(c.ranks, vec![0, 1, 2, 3]);
        assert!(c.exact);
    }

    #[test]
    fn exact_beats_greedy() {
        // Greedy picks 0 (hits three sets) and then needs two more; {1, 2} suffices.
        let sets = vec![
            vec![0, 1],
            vec![0, 2],
            vec![0, 1, 2],
            vec![1, 3],
            vec![2, 4],
        ];
        let c = solve_cover(&sets);
        assert_eq!(c.ranks, vec![1, 2]);
        assert!(c.exact);
    }
}
