//! Lowering a plan's transfers to collectives.
//!
//! The network transfers of a plan fall into independent groups of ranks (connected components
//! of "who sends to whom"). A group where every member sends one box, the same box, to every
//! other member is an all-gather; one where every member sends one equally sized box to each
//! other member is an all-to-all; anything else is a variable-sized exchange (all-to-all-v)
//! within the group. Collectives let a backend use its tuned algorithms; the bytes are the same.

use std::collections::BTreeMap;
use std::fmt;

use crate::plan::{ReshardPlan, Transfer};

/// The collective a group of transfers lowers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExchangeKind {
    /// Each member sends the same box to every other member.
    AllGather,
    /// Each member sends one box of one size to each other member.
    AllToAll,
    /// Pieces of any size between any members (all-to-all-v).
    PointToPoint,
}

impl fmt::Display for ExchangeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ExchangeKind::AllGather => "all-gather",
            ExchangeKind::AllToAll => "all-to-all",
            ExchangeKind::PointToPoint => "point-to-point",
        })
    }
}

/// A group of ranks exchanging pieces among themselves, independent of every other group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exchange {
    /// The collective it lowers to.
    pub kind: ExchangeKind,
    /// The device ranks taking part, ascending. Group rank `i` is `ranks[i]`.
    pub ranks: Vec<usize>,
    /// The network transfers of the group, in plan order.
    pub transfers: Vec<Transfer>,
}

/// Groups the plan's network transfers into independent exchanges and classifies each.
pub fn lower(plan: &ReshardPlan) -> Vec<Exchange> {
    let network: Vec<&Transfer> = plan.transfers().iter().filter(|t| !t.is_local()).collect();
    // Union-find over ranks.
    let mut parent: BTreeMap<usize, usize> = BTreeMap::new();
    fn find(parent: &mut BTreeMap<usize, usize>, r: usize) -> usize {
        let p = *parent.entry(r).or_insert(r);
        if p == r {
            return r;
        }
        let root = find(parent, p);
        parent.insert(r, root);
        root
    }
    for t in &network {
        let a = find(&mut parent, t.src_rank);
        let b = find(&mut parent, t.dst_rank);
        if a != b {
            parent.insert(a.max(b), a.min(b));
        }
    }
    let mut groups: BTreeMap<usize, Vec<Transfer>> = BTreeMap::new();
    for t in network {
        let root = find(&mut parent, t.src_rank);
        groups.entry(root).or_default().push(t.clone());
    }
    groups
        .into_values()
        .map(|transfers| {
            let mut ranks: Vec<usize> = transfers
                .iter()
                .flat_map(|t| [t.src_rank, t.dst_rank])
                .collect();
            ranks.sort_unstable();
            ranks.dedup();
            Exchange {
                kind: classify(&ranks, &transfers),
                ranks,
                transfers,
            }
        })
        .collect()
}

fn classify(ranks: &[usize], transfers: &[Transfer]) -> ExchangeKind {
    let n = ranks.len();
    if transfers.len() != n * (n - 1) {
        return ExchangeKind::PointToPoint;
    }
    let mut pairs: BTreeMap<(usize, usize), &Transfer> = BTreeMap::new();
    for t in transfers {
        if pairs.insert((t.src_rank, t.dst_rank), t).is_some() {
            return ExchangeKind::PointToPoint;
        }
    }
    // Every ordered pair of distinct members appears exactly once.
    if pairs.len() != n * (n - 1) {
        return ExchangeKind::PointToPoint;
    }
    let size = transfers[0].region.n_elements();
    if transfers.iter().any(|t| t.region.n_elements() != size) {
        return ExchangeKind::PointToPoint;
    }
    let same_box_to_all = ranks.iter().all(|&src| {
        let mut regions = transfers
            .iter()
            .filter(|t| t.src_rank == src)
            .map(|t| &t.region);
        let first = regions.next();
        regions.all(|r| Some(r) == first)
    });
    if same_box_to_all {
        ExchangeKind::AllGather
    } else {
        ExchangeKind::AllToAll
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::plan;
    use layout::TensorLayout;
    use tensor::DType;

    fn tl(map: &[&str]) -> TensorLayout {
        crate::test_util::tl(&[2, 2], &["a", "b"], map, &[8, 8])
    }

    #[test]
    fn gather_and_all_to_all_patterns() {
        // (S0 over a) -> replicated: pairs {0,2} and {1,3} all-gather.
        let p = plan(&tl(&["a", "None"]), &tl(&["None", "None"]), DType::F32).unwrap();
        let ex = lower(&p);
        assert_eq!(ex.len(), 2);
        assert!(ex.iter().all(|e| e.kind == ExchangeKind::AllGather));
        assert_eq!(ex[0].ranks, vec![0, 2]);
        // 4 ranks, (S0) -> (S1): each sends a different quarter to every other: all-to-all.
        let line = |map: &[&str]| crate::test_util::tl(&[4], &["x"], map, &[8, 8]);
        let p = plan(&line(&["x", "None"]), &line(&["None", "x"]), DType::F32).unwrap();
        let ex = lower(&p);
        assert_eq!(ex.len(), 1);
        assert_eq!(ex[0].kind, ExchangeKind::AllToAll);
        assert_eq!(ex[0].transfers.len(), 12);
    }
}
