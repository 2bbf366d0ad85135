//! Lowering a plan's transfers to collectives.
//!
//! The network transfers of a plan fall into independent groups of ranks (connected components
//! of "who sends to whom"). A group where every member sends its whole slice, the same box, to
//! every other member is an all-gather; one where every member sends one equally sized box to each
//! other member is an all-to-all; anything else is a variable-sized exchange (all-to-all-v)
//! within the group. Collectives let a backend use its tuned algorithms; the bytes are the same.

use std::collections::{BTreeMap, BTreeSet};
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

impl ExchangeKind {
    /// The collective's name (`all-gather`, `all-to-all`, `point-to-point`).
    pub fn name(self) -> &'static str {
        match self {
            ExchangeKind::AllGather => "all-gather",
            ExchangeKind::AllToAll => "all-to-all",
            ExchangeKind::PointToPoint => "point-to-point",
        }
    }
}

impl fmt::Display for ExchangeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
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

impl Exchange {
    /// The transfers from device `from` to device `to`, in plan order.
    pub fn sends(&self, from: usize, to: usize) -> Vec<&Transfer> {
        self.transfers
            .iter()
            .filter(|t| t.src_rank == from && t.dst_rank == to)
            .collect()
    }
}

/// The ranks and collective of one exchange, without its transfers (see [`lower_kinds`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExchangeKindOf {
    /// The collective it lowers to.
    pub kind: ExchangeKind,
    /// The device ranks taking part, ascending.
    pub ranks: Vec<usize>,
}

/// Groups the plan's network transfers into independent exchanges and classifies each.
pub fn lower(plan: &ReshardPlan) -> Vec<Exchange> {
    let (kinds, mut groups_of) = classify_groups(plan);
    let mut groups: BTreeMap<usize, Vec<Transfer>> = BTreeMap::new();
    for t in plan.transfers().filter(|t| !t.is_local()) {
        let root = groups_of.find(t.src_rank);
        groups.entry(root).or_default().push(t);
    }
    kinds
        .into_iter()
        .map(|k| Exchange {
            transfers: groups.remove(&k.ranks[0]).unwrap_or_default(),
            kind: k.kind,
            ranks: k.ranks,
        })
        .collect()
}

/// The exchange of [`lower`] that device `rank` takes part in, holding only the transfers it
/// sends or receives (all a member needs to run it): memory linear in the group where
/// [`lower`] holds every transfer of every group, so that each of `n` ranks lowering a plan
/// costs `O(n)` memory rather than `O(n²)`. `None` when `rank` sends and receives nothing.
pub fn lower_for(plan: &ReshardPlan, rank: usize) -> Option<Exchange> {
    let lowering = plan.lowering();
    let kind = &lowering.kinds[(*lowering.exchange_of.get(rank)?)?];
    let transfers = plan
        .raw_transfers_of(rank)
        .into_iter()
        .filter(|t| t.src_rank != t.dst_rank)
        .map(|t| plan.transfer(t))
        .collect();
    Some(Exchange {
        kind: kind.kind,
        ranks: kind.ranks.clone(),
        transfers,
    })
}

/// A plan's exchanges without their transfers, and the exchange each device rank takes part
/// in: what [`lower_for`] needs, found once per plan (memory linear in the ranks).
#[derive(Debug)]
pub(crate) struct Lowering {
    kinds: Vec<ExchangeKindOf>,
    /// Per device rank, the index in `kinds` of its exchange (`None`: it takes part in none).
    exchange_of: Vec<Option<usize>>,
}

impl Lowering {
    pub(crate) fn of(plan: &ReshardPlan) -> Lowering {
        let (kinds, mut groups) = classify_groups(plan);
        let by_root: BTreeMap<usize, usize> = kinds
            .iter()
            .enumerate()
            .map(|(i, k)| (k.ranks[0], i))
            .collect();
        let exchange_of = (0..groups.touched.len())
            .map(|r| match groups.touched[r] {
                true => by_root.get(&groups.find(r)).copied(),
                false => None,
            })
            .collect();
        Lowering { kinds, exchange_of }
    }
}

/// The exchanges of [`lower`] without their transfers, in the same order: memory linear in the
/// ranks, whatever the number of transfers (what `--explain` prints).
pub fn lower_kinds(plan: &ReshardPlan) -> Vec<ExchangeKindOf> {
    plan.lowering().kinds.clone()
}

/// Union-find over device ranks (dense: ranks are below the rank ceiling). The representative
/// of a group is its smallest rank.
struct RankGroups {
    parent: Vec<usize>,
    /// Whether a rank takes part in some network transfer.
    touched: Vec<bool>,
}

impl RankGroups {
    fn new(plan: &ReshardPlan) -> RankGroups {
        let max_rank = plan
            .moved_from()
            .mesh()
            .device_ranks()
            .into_iter()
            .chain(plan.dst().mesh().device_ranks())
            .max()
            .unwrap_or(0);
        RankGroups {
            parent: (0..=max_rank).collect(),
            touched: vec![false; max_rank + 1],
        }
    }

    fn find(&mut self, r: usize) -> usize {
        let mut root = r;
        while self.parent[root] != root {
            root = self.parent[root];
        }
        let mut node = r;
        while node != root {
            let next = self.parent[node];
            self.parent[node] = root;
            node = next;
        }
        root
    }

    fn union(&mut self, a: usize, b: usize) {
        self.touched[a] = true;
        self.touched[b] = true;
        let (a, b) = (self.find(a), self.find(b));
        if a != b {
            self.parent[a.max(b)] = a.min(b);
        }
    }
}

/// What one group's transfers look like, gathered in one pass.
#[derive(Default)]
struct GroupStats {
    n_transfers: usize,
    /// The size of the first transfer, and whether every other has it too.
    size: Option<usize>,
    sizes_equal: bool,
    /// Whether every transfer sends its sender's whole slice.
    sends_whole: bool,
    /// Whether some ordered pair of ranks appears twice.
    repeated_pair: bool,
    /// Per sending rank, the first region sent and whether it sent only that region.
    first_sent: BTreeMap<usize, (u32, bool)>,
}

/// The exchanges' ranks and kinds in the order of their smallest rank, and the union-find that
/// groups the ranks. Two passes over the transfers; memory linear in the ranks.
fn classify_groups(plan: &ReshardPlan) -> (Vec<ExchangeKindOf>, RankGroups) {
    let mut groups = RankGroups::new(plan);
    for t in plan.raw_transfers().filter(|t| t.src_rank != t.dst_rank) {
        groups.union(t.src_rank, t.dst_rank);
    }
    // A destination device receives all its transfers in one run of the plan unless it holds
    // several slots (an interleaved mesh); then repeated pairs are looked up in one set.
    let one_slot_per_device = plan.dst().mesh().interleave_factor() == 1;
    let mut all_pairs: BTreeSet<(usize, usize)> = BTreeSet::new();
    let mut slot_sources: BTreeSet<usize> = BTreeSet::new();
    let mut current_slot = None;
    let mut stats: BTreeMap<usize, GroupStats> = BTreeMap::new();
    let moved_from = plan.moved_from();
    for t in plan.raw_transfers().filter(|t| t.src_rank != t.dst_rank) {
        let root = groups.find(t.src_rank);
        let g = stats.entry(root).or_insert_with(|| GroupStats {
            sizes_equal: true,
            sends_whole: true,
            ..GroupStats::default()
        });
        g.n_transfers += 1;
        let size = plan.region(t.region).n_elements();
        match g.size {
            None => g.size = Some(size),
            Some(first) => g.sizes_equal &= first == size,
        }
        let repeated = if one_slot_per_device {
            if current_slot != Some(t.dst_slot) {
                current_slot = Some(t.dst_slot);
                slot_sources.clear();
            }
            !slot_sources.insert(t.src_rank)
        } else {
            !all_pairs.insert((t.src_rank, t.dst_rank))
        };
        g.repeated_pair |= repeated;
        // An all-gather sends the sender's whole slice; a part of it (two ranks swapping
        // halves, as Ulysses' sequence-to-heads move does) is an all-to-all.
        g.sends_whole &= *plan.region(t.region) == moved_from.slot_box(t.src_slot);
        // Interned regions: equal boxes have equal indices.
        match g.first_sent.get_mut(&t.src_rank) {
            None => {
                g.first_sent.insert(t.src_rank, (t.region, true));
            }
            Some((first, same)) => *same &= *first == t.region,
        }
    }
    let mut members: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for r in 0..groups.touched.len() {
        if groups.touched[r] {
            let root = groups.find(r);
            members.entry(root).or_default().push(r);
        }
    }
    let kinds = stats
        .into_iter()
        .map(|(root, g)| {
            let ranks = members.remove(&root).unwrap_or_default();
            let n = ranks.len();
            let kind = if g.n_transfers != n * (n - 1) || g.repeated_pair || !g.sizes_equal {
                ExchangeKind::PointToPoint
            } else if g.sends_whole && g.first_sent.values().all(|(_, same)| *same) {
                ExchangeKind::AllGather
            } else {
                ExchangeKind::AllToAll
            };
            ExchangeKindOf { kind, ranks }
        })
        .collect();
    (kinds, groups)
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
        // 2 ranks, (S0) -> (S1): each sends the other half of its slice, not all of it: an
        // all-to-all, though with two members every box also goes to "every other member".
        let pair = |map: &[&str]| crate::test_util::tl(&[2], &["x"], map, &[8, 8]);
        let p = plan(&pair(&["x", "None"]), &pair(&["None", "x"]), DType::F32).unwrap();
        let ex = lower(&p);
        assert_eq!(ex.len(), 1);
        assert_eq!(ex[0].kind, ExchangeKind::AllToAll);
        // ...and (S0) -> replicated on 2 ranks sends whole slices: an all-gather.
        let p = plan(&pair(&["x", "None"]), &pair(&["None", "None"]), DType::F32).unwrap();
        assert_eq!(lower(&p)[0].kind, ExchangeKind::AllGather);
    }

    /// `lower_for(plan, r)` is `lower`'s exchange holding `r`, with exactly the transfers `r`
    /// sends or receives; `None` for a rank outside every exchange.
    #[test]
    fn a_rank_s_exchange_holds_its_own_transfers() {
        let line = |map: &[&str]| crate::test_util::tl(&[4], &["x"], map, &[8, 8]);
        let plans = [
            plan(&tl(&["a", "None"]), &tl(&["None", "None"]), DType::F32).unwrap(),
            plan(&line(&["x", "None"]), &line(&["None", "x"]), DType::F32).unwrap(),
            plan(&line(&["x", "None"]), &line(&["x", "None"]), DType::F32).unwrap(),
            // An all-gather: every destination's pieces are one run over every source.
            plan(&line(&["x", "None"]), &line(&["None", "None"]), DType::F32).unwrap(),
            plan(&line(&["None", "x"]), &line(&["x", "None"]), DType::F32).unwrap(),
        ];
        for p in &plans {
            let whole = lower(p);
            for rank in 0..4 {
                let mine = lower_for(p, rank);
                let Some(e) = whole.iter().find(|e| e.ranks.contains(&rank)) else {
                    assert!(mine.is_none(), "rank {rank}");
                    continue;
                };
                let mine = mine.expect("the rank's exchange");
                assert_eq!((mine.kind, &mine.ranks), (e.kind, &e.ranks));
                let own: Vec<&Transfer> = e
                    .transfers
                    .iter()
                    .filter(|t| t.src_rank == rank || t.dst_rank == rank)
                    .collect();
                assert_eq!(
                    mine.transfers.iter().collect::<Vec<_>>(),
                    own,
                    "rank {rank}"
                );
            }
        }
    }
}
