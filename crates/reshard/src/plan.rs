//! Planning a move from one tensor layout to another by box intersection.
//!
//! A destination slot needs its box. Whatever part of it the same device already holds under the
//! source layout is copied locally; every other element is received exactly once, from one of the
//! source slots holding it, chosen to spread the sending load over replicas. The plan therefore
//! moves exactly the lower bound of bytes: the elements each destination lacks.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::fmt::Write as _;

use layout::{SliceBox, TensorLayout};
use rustc_hash::FxHashMap;
use tensor::DType;

use crate::error::ReshardError;
use crate::partial::{DistLayout, PendingOp, ReduceKind, ReduceStep};

/// One piece of data moved by a plan: `region` (global tensor coordinates) from a source slot to a
/// destination slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transfer {
    /// Slot in the source mesh that sends.
    pub src_slot: usize,
    /// Device rank that sends.
    pub src_rank: usize,
    /// Slot in the destination mesh that receives.
    pub dst_slot: usize,
    /// Device rank that receives.
    pub dst_rank: usize,
    /// The elements moved, in global coordinates.
    pub region: SliceBox,
}

impl Transfer {
    /// Whether sender and receiver are the same device (a local copy, no network).
    pub fn is_local(&self) -> bool {
        self.src_rank == self.dst_rank
    }
}

/// A plan's transfers as stored: runs of consecutive transfers into one destination slot whose
/// source slots and interned region indices both count up by one — in a regular layout a
/// destination slot's pieces come from consecutive source blocks, so a plan whose every
/// destination receives from every source (ranks² transfers) takes memory in the ranks, and
/// ranks that receive the same region share one copy of it. [`Transfer`] values are made on
/// demand.
#[derive(Debug, Clone, Default)]
struct TransferTable {
    /// `[first src_slot, first region index, length]`, grouped by destination slot in slot order.
    runs: Vec<[u32; 3]>,
    /// For each destination slot, the end of its runs in `runs`.
    slot_ends: Vec<usize>,
    /// Number of transfers (the runs' lengths summed).
    n_transfers: usize,
    /// The distinct regions.
    regions: Vec<SliceBox>,
    /// Region → its index in `regions` (emptied once planning is done).
    region_ids: FxHashMap<SliceBox, u32>,
}

/// A stored transfer with its ranks, its region by index (see [`ReshardPlan::raw_transfers`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RawTransfer {
    pub(crate) src_slot: usize,
    pub(crate) src_rank: usize,
    pub(crate) dst_slot: usize,
    pub(crate) dst_rank: usize,
    pub(crate) region: u32,
}

impl TransferTable {
    /// Adds a transfer to the current destination slot.
    fn push(&mut self, src_slot: usize, region: SliceBox) -> Result<(), ReshardError> {
        let too_large = || ReshardError::Unsupported {
            what: "a plan with more than 2^32 slots or distinct regions".to_string(),
        };
        let region_id = match self.region_ids.get(&region) {
            Some(&id) => id,
            None => {
                let id = u32::try_from(self.regions.len()).map_err(|_| too_large())?;
                self.regions.push(region.clone());
                self.region_ids.insert(region, id);
                id
            }
        };
        let src_slot = u32::try_from(src_slot).map_err(|_| too_large())?;
        self.n_transfers += 1;
        let slot_start = self.slot_ends.last().copied().unwrap_or(0);
        if self.runs.len() > slot_start {
            if let Some([first_src, first_region, len]) = self.runs.last_mut() {
                if src_slot.checked_sub(*first_src) == Some(*len)
                    && region_id.checked_sub(*first_region) == Some(*len)
                {
                    *len += 1;
                    return Ok(());
                }
            }
        }
        self.runs.push([src_slot, region_id, 1]);
        Ok(())
    }

    /// Closes the current destination slot's run.
    fn end_slot(&mut self) {
        self.slot_ends.push(self.runs.len());
    }

    /// Frees the lookup once planning is done.
    fn finish(mut self) -> TransferTable {
        self.region_ids = FxHashMap::default();
        self.runs.shrink_to_fit();
        self.regions.shrink_to_fit();
        self
    }

    /// `(dst_slot, src_slot, region index)` in plan order.
    fn iter(&self) -> impl Iterator<Item = (usize, usize, u32)> + '_ {
        self.slot_ends
            .iter()
            .enumerate()
            .flat_map(move |(dst_slot, &end)| {
                let start = if dst_slot == 0 {
                    0
                } else {
                    self.slot_ends[dst_slot - 1]
                };
                self.runs[start..end]
                    .iter()
                    .flat_map(move |&[src_slot, region, len]| {
                        (0..len).map(move |i| (dst_slot, (src_slot + i) as usize, region + i))
                    })
            })
    }
}

/// A part of a region and the source slots that hold it (any of them can supply it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourcePiece {
    /// The elements, in global coordinates.
    pub region: SliceBox,
    /// The source slots holding all of `region`, ascending (a replica group).
    pub holders: Vec<usize>,
}

/// The pieces `region` is made of under `src`: its intersections with the distinct source boxes,
/// each with the replica group holding it. The pieces tile `region` exactly.
pub fn source_pieces(src: &TensorLayout, region: &SliceBox) -> Vec<SourcePiece> {
    let index = SourceIndex::new(src);
    let mut pieces = Vec::new();
    index.for_each_piece(region, |piece, _, holders| {
        pieces.push(SourcePiece {
            region: piece,
            holders: holders.to_vec(),
        })
    });
    pieces
}

/// A source layout indexed for planning, so that finding what a destination box needs costs
/// time in the pieces found, not in the ranks of the mesh: the distinct boxes in block order
/// (row-major over the split factors, so a block's position is computed from its index) and
/// every device's slots.
pub(crate) struct SourceIndex<'a> {
    layout: &'a TensorLayout,
    /// The distinct boxes with their holders, row-major over [`TensorLayout::split_factors`].
    blocks: Vec<(SliceBox, Vec<usize>)>,
    /// Split factor per dim.
    factors: Vec<usize>,
    /// `(device, slot)` for every slot, sorted.
    device_slots: Vec<(usize, usize)>,
}

impl<'a> SourceIndex<'a> {
    /// Indexes `layout`: linear in its slots.
    pub(crate) fn new(layout: &'a TensorLayout) -> SourceIndex<'a> {
        let mesh = layout.mesh();
        let mut device_slots: Vec<(usize, usize)> = (0..mesh.n_slots())
            .map(|s| (mesh.device_of_slot(s), s))
            .collect();
        device_slots.sort_unstable();
        SourceIndex {
            layout,
            blocks: layout.distinct_boxes(),
            factors: layout.split_factors(),
            device_slots,
        }
    }

    /// The slots on `device`, ascending, with their boxes.
    pub(crate) fn local_boxes(
        &self,
        device: usize,
    ) -> impl Iterator<Item = (usize, SliceBox)> + '_ {
        let start = self.device_slots.partition_point(|&(d, _)| d < device);
        self.device_slots[start..]
            .iter()
            .take_while(move |&&(d, _)| d == device)
            .map(|&(_, s)| (s, self.layout.slot_box(s)))
    }

    /// Per dim, the first and last block `region` overlaps; `None` when it overlaps none (an
    /// empty region).
    fn block_ranges(&self, region: &SliceBox) -> Option<Vec<(usize, usize)>> {
        if region.shape.contains(&0) {
            return None;
        }
        let ranges: Vec<(usize, usize)> = (0..region.ndim())
            .map(|d| {
                let first = self.layout.block_containing(d, region.offset[d]);
                let last = self
                    .layout
                    .block_containing(d, region.offset[d] + region.shape[d] - 1);
                (first, last.min(self.factors[d] - 1))
            })
            .collect();
        ranges
            .iter()
            .all(|&(first, last)| first <= last)
            .then_some(ranges)
    }

    /// The number of pieces [`SourceIndex::for_each_piece`] finds in `region`, in time linear
    /// in its dims: the blocks of a dim tile it contiguously and none is empty (an even split
    /// of a non-empty dim, or a manual row split of at least one row each), so every block in
    /// the overlapped ranges meets `region`.
    pub(crate) fn count_pieces(&self, region: &SliceBox) -> usize {
        self.block_ranges(region).map_or(0, |ranges| {
            ranges.iter().fold(1usize, |n, &(first, last)| {
                n.saturating_mul(last - first + 1)
            })
        })
    }

    /// Splits `dst_box`, wanted on `device`, into what the device already holds under the source
    /// layout — `(source slot, region)` local copies, in the order the plan lists them — and the
    /// boxes it still lacks.
    fn split_held(
        &self,
        device: usize,
        dst_box: SliceBox,
    ) -> (Vec<(usize, SliceBox)>, Vec<SliceBox>) {
        let mut local = Vec::new();
        let mut missing = vec![dst_box];
        for (src_slot, held) in self.local_boxes(device) {
            let mut still = Vec::new();
            for m in &missing {
                if let Some(common) = m.intersect(&held) {
                    local.push((src_slot, common));
                    still.extend(m.subtract(&held));
                } else {
                    still.push(m.clone());
                }
            }
            missing = still;
        }
        (local, missing)
    }

    /// Calls `f` with every non-empty intersection of `region` with a distinct box, and the
    /// box's holders, in block order — visiting only the blocks that overlap `region`.
    pub(crate) fn for_each_piece(
        &self,
        region: &SliceBox,
        mut f: impl FnMut(SliceBox, usize, &[usize]),
    ) {
        let Some(ranges) = self.block_ranges(region) else {
            return;
        };
        let mut index: Vec<usize> = ranges.iter().map(|&(first, _)| first).collect();
        loop {
            let linear = index
                .iter()
                .zip(&self.factors)
                .fold(0, |acc, (&i, &factor)| acc * factor + i);
            let (block, holders) = &self.blocks[linear];
            if let Some(piece) = region.intersect(block) {
                f(piece, linear, holders);
            }
            // Next index, row-major (last dim fastest).
            let mut d = index.len();
            loop {
                if d == 0 {
                    return;
                }
                d -= 1;
                if index[d] < ranges[d].1 {
                    index[d] += 1;
                    break;
                }
                index[d] = ranges[d].0;
            }
        }
    }
}

/// A plan moving a tensor from layout `src` to layout `dst`: data, inspectable before it runs.
///
/// A partial source is first summed within its partial groups ([`ReshardPlan::reduce`]); the
/// transfers then move boxes from the result (or from the source itself) to the destination.
#[derive(Debug, Clone)]
pub struct ReshardPlan {
    src: DistLayout,
    reduce: Option<ReduceStep>,
    dst: TensorLayout,
    dtype: DType,
    transfers: TransferTable,
    /// The exchanges' kinds and every rank's exchange, found once for all the ranks (and
    /// steps) that run the plan ([`crate::lower_for`]).
    lowering: std::sync::OnceLock<std::sync::Arc<crate::lower::Lowering>>,
}

impl ReshardPlan {
    /// The source layout, with its pending-sum axes.
    pub fn src(&self) -> &DistLayout {
        &self.src
    }

    /// The summation step of a partial source, if any.
    pub fn reduce(&self) -> Option<&ReduceStep> {
        self.reduce.as_ref()
    }

    /// The placement the transfers start from: the reduction's result, or the source.
    pub fn moved_from(&self) -> &TensorLayout {
        self.reduce
            .as_ref()
            .map_or(self.src.layout(), |r| &r.result)
    }

    /// Whether the plan is one all-reduce of every rank's whole slice into the same slice of the
    /// destination (model parallel's activation sums, data parallel's gradients): its pending
    /// sum is resolved by an all-reduce whose result is already the destination's placement, so
    /// nothing moves after it and the sum can be taken in place.
    /// (The meshes may name their axes apart: what counts is that every destination slot gets
    /// exactly its own device's whole summed slice.)
    pub fn is_whole_slice_all_reduce(&self) -> bool {
        let Some(reduce) = self.reduce.as_ref() else {
            return false;
        };
        if reduce.kind != ReduceKind::AllReduce {
            return false;
        }
        let mut filled = vec![false; self.dst.mesh().n_slots()];
        for t in self.raw_transfers() {
            let whole = self.copies_whole_reduced_slice(
                reduce,
                t.src_rank == t.dst_rank,
                (t.src_slot, t.dst_slot),
                self.region(t.region),
            );
            if !whole || std::mem::replace(&mut filled[t.dst_slot], true) {
                return false;
            }
        }
        filled.into_iter().all(|f| f)
    }

    /// Whether, on device `rank`, the plan's pending sum leaves the rank's result exactly where
    /// the destination wants it: the rank holds one source and one destination slot, and its
    /// only transfer is the local copy of its whole reduced slice into its whole destination
    /// slice (sequence parallel's reduce-scatters: the reduced part is already the rank's
    /// sequence block). Then the sum can be written straight into the destination.
    pub fn is_whole_slice_reduce_on(&self, rank: usize) -> bool {
        let Some(reduce) = self.reduce.as_ref() else {
            return false;
        };
        let owned = |mesh: &layout::Mesh| {
            (0..mesh.n_slots())
                .filter(|&s| mesh.device_of_slot(s) == rank)
                .count()
        };
        if owned(self.src.layout().mesh()) != 1 || owned(self.dst.mesh()) != 1 {
            return false;
        }
        match self.transfers_of(rank).as_slice() {
            [t] => self.copies_whole_reduced_slice(
                reduce,
                t.is_local(),
                (t.src_slot, t.dst_slot),
                &t.region,
            ),
            _ => false,
        }
    }

    /// Whether a transfer of `region` from `src_slot` to `dst_slot` (`local`: on one device)
    /// copies a whole slice of `reduce`'s result, on its device, into a whole destination slice.
    fn copies_whole_reduced_slice(
        &self,
        reduce: &ReduceStep,
        local: bool,
        (src_slot, dst_slot): (usize, usize),
        region: &SliceBox,
    ) -> bool {
        local && reduce.result.slot_holds(src_slot, region) && self.dst.slot_holds(dst_slot, region)
    }

    /// What the plan runs on `rank`, by name: its pending sum's collective (`all-reduce`,
    /// `reduce-scatter`), else its exchange's (`all-gather`, `all-to-all`, `point-to-point`),
    /// else `local copy`.
    pub fn collective_on(&self, rank: usize) -> &'static str {
        match (&self.reduce, crate::lower::lower_for(self, rank)) {
            (Some(reduce), _) => reduce.kind.name(),
            (None, Some(exchange)) => exchange.kind.name(),
            (None, None) => "local copy",
        }
    }

    /// The destination layout.
    pub fn dst(&self) -> &TensorLayout {
        &self.dst
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Every transfer, grouped by destination slot in slot order; local copies first per slot.
    pub fn transfers(&self) -> impl Iterator<Item = Transfer> + '_ {
        self.raw_transfers().map(|t| self.transfer(t))
    }

    /// The [`Transfer`] of a raw one (its region copied out of the plan).
    pub(crate) fn transfer(&self, t: RawTransfer) -> Transfer {
        Transfer {
            src_slot: t.src_slot,
            src_rank: t.src_rank,
            dst_slot: t.dst_slot,
            dst_rank: t.dst_rank,
            region: self.region(t.region).clone(),
        }
    }

    /// The transfers without copying their regions (see [`ReshardPlan::region`]).
    pub(crate) fn raw_transfers(&self) -> impl Iterator<Item = RawTransfer> + '_ {
        let src_mesh = self.moved_from().mesh();
        let dst_mesh = self.dst.mesh();
        self.transfers
            .iter()
            .map(move |(dst_slot, src_slot, region)| RawTransfer {
                src_slot,
                src_rank: src_mesh.device_of_slot(src_slot),
                dst_slot,
                dst_rank: dst_mesh.device_of_slot(dst_slot),
                region,
            })
    }

    /// The transfers device rank `rank` sends or receives (its local copies included), in
    /// plan order. Takes time in the plan's runs, not in every rank's transfers.
    pub fn transfers_of(&self, rank: usize) -> Vec<Transfer> {
        self.raw_transfers_of(rank)
            .into_iter()
            .map(|t| self.transfer(t))
            .collect()
    }

    /// The transfers device rank `rank` sends or receives (local copies included), in the
    /// order of [`ReshardPlan::raw_transfers`]. Other ranks' runs are not expanded, so this
    /// takes time in the plan's runs, not in its transfers (an all-gather over `n` ranks is
    /// `n` runs of `n`).
    pub(crate) fn raw_transfers_of(&self, rank: usize) -> Vec<RawTransfer> {
        let src_mesh = self.moved_from().mesh();
        let dst_mesh = self.dst.mesh();
        // The rank's source slots, ascending (one, or one per copy on an interleaved mesh).
        let own_src: Vec<u32> = (0..src_mesh.n_slots())
            .filter(|&s| src_mesh.device_of_slot(s) == rank)
            .map(|s| s as u32)
            .collect();
        let raw = |dst_slot: usize, src_slot: u32, region: u32| RawTransfer {
            src_slot: src_slot as usize,
            src_rank: src_mesh.device_of_slot(src_slot as usize),
            dst_slot,
            dst_rank: dst_mesh.device_of_slot(dst_slot),
            region,
        };
        let table = &self.transfers;
        let mut out = Vec::new();
        let mut start = 0;
        for (dst_slot, &end) in table.slot_ends.iter().enumerate() {
            let receives = dst_mesh.device_of_slot(dst_slot) == rank;
            for &[first, region, len] in &table.runs[start..end] {
                if receives {
                    out.extend((0..len).map(|i| raw(dst_slot, first + i, region + i)));
                    continue;
                }
                for &s in &own_src {
                    if let Some(i) = s.checked_sub(first).filter(|&i| i < len) {
                        out.push(raw(dst_slot, s, region + i));
                    }
                }
            }
            start = end;
        }
        out
    }

    /// The plan's lowering, found at the first call and shared by every later one.
    pub(crate) fn lowering(&self) -> &crate::lower::Lowering {
        self.lowering
            .get_or_init(|| std::sync::Arc::new(crate::lower::Lowering::of(self)))
    }

    /// Region number `id` of [`ReshardPlan::raw_transfers`].
    pub(crate) fn region(&self, id: u32) -> &SliceBox {
        &self.transfers.regions[id as usize]
    }

    /// Number of transfers (local copies included).
    pub fn n_transfers(&self) -> usize {
        self.transfers.n_transfers
    }

    /// Bytes of one transfer.
    pub fn transfer_bytes(&self, t: &Transfer) -> usize {
        t.region.n_elements() * self.dtype.size_in_bytes()
    }

    /// Bytes received over the network by each device of the destination mesh, in the order of
    /// [`layout::Mesh::device_ranks`], the reduction of a partial source included. Local copies
    /// are not counted.
    pub fn bytes_per_rank(&self) -> Vec<(usize, usize)> {
        let network = self
            .network_transfers()
            .map(|(_, dst_rank, bytes)| (dst_rank, bytes));
        per_rank(
            &self.dst.mesh().device_ranks(),
            network.chain(self.reduce_bytes_per_rank()),
        )
    }

    /// Bytes each source device receives while summing a partial source (empty without one).
    pub fn reduce_bytes_per_rank(&self) -> Vec<(usize, usize)> {
        let Some(step) = &self.reduce else {
            return Vec::new();
        };
        let mesh = self.src.layout().mesh();
        let bytes = step.elements_received_per_member(&self.src) * self.dtype.size_in_bytes();
        (0..mesh.n_slots())
            .map(|s| (mesh.device_of_slot(s), bytes))
            .collect()
    }

    /// Bytes sent over the network by each device of the source mesh, in mesh order (transfers
    /// only; a reduction sends what it receives).
    pub fn bytes_sent_per_rank(&self) -> Vec<(usize, usize)> {
        let network = self
            .network_transfers()
            .map(|(src_rank, _, bytes)| (src_rank, bytes));
        per_rank(&self.moved_from().mesh().device_ranks(), network)
    }

    /// Total bytes received over the network, the reduction included (the sum of
    /// [`ReshardPlan::bytes_per_rank`], without building the per-rank table).
    pub fn bytes_total(&self) -> usize {
        let network: usize = self.network_transfers().map(|(_, _, bytes)| bytes).sum();
        let reduce = self.reduce.as_ref().map_or(0, |step| {
            step.elements_received_per_member(&self.src)
                * self.dtype.size_in_bytes()
                * self.src.layout().mesh().n_slots()
        });
        network + reduce
    }

    /// Bytes copied locally (no network).
    pub fn bytes_local(&self) -> usize {
        let elem = self.dtype.size_in_bytes();
        self.raw_transfers()
            .filter(|t| t.src_rank == t.dst_rank)
            .map(|t| self.region(t.region).n_elements() * elem)
            .sum()
    }

    /// The fewest bytes any plan must move: for every destination slot, the elements of its box
    /// that its device does not hold under the source layout. For a partial source, the bytes of
    /// the chosen reduction (a bandwidth-optimal reduce-scatter or all-reduce) plus that bound
    /// from the reduction's result.
    pub fn bytes_lower_bound(&self) -> usize {
        let reduce: usize = self.reduce_bytes_per_rank().iter().map(|(_, b)| b).sum();
        lower_bound_elements(self.moved_from(), &self.dst) * self.dtype.size_in_bytes() + reduce
    }

    /// The transfers that cross the network.
    /// `(src_rank, dst_rank, bytes)` of every transfer that crosses the network.
    fn network_transfers(&self) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
        let elem = self.dtype.size_in_bytes();
        self.raw_transfers()
            .filter(|t| t.src_rank != t.dst_rank)
            .map(move |t| {
                (
                    t.src_rank,
                    t.dst_rank,
                    self.region(t.region).n_elements() * elem,
                )
            })
    }

    /// One line per transfer with its reason, then the totals.
    pub fn explain(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "from {}", self.src);
        let _ = writeln!(out, "to   {}", self.dst);
        if let Some(step) = &self.reduce {
            let mesh = self.src.layout().mesh();
            for group in &step.slot_groups {
                let ranks: Vec<usize> = group.iter().map(|&s| mesh.device_of_slot(s)).collect();
                let op = step.op.name();
                let what = match step.kind {
                    crate::partial::ReduceKind::AllReduce => format!("{} ({op})", step.kind.name()),
                    crate::partial::ReduceKind::ReduceScatter { dim } => {
                        format!("{} ({op}) along dim {dim}", step.kind.name())
                    }
                };
                let parts = match step.op {
                    crate::partial::PendingOp::Sum => "partial sums",
                    crate::partial::PendingOp::Max => "partial maxima",
                };
                let _ = writeln!(
                    out,
                    "  ranks {ranks:?}: {what}: their values are {parts} of one box"
                );
            }
        }
        for t in self.transfers() {
            let bytes = self.transfer_bytes(&t);
            if t.is_local() {
                let _ = writeln!(
                    out,
                    "  rank {:>4}: local copy {} ({} B): already held under the source layout",
                    t.dst_rank, t.region, bytes
                );
            } else {
                let _ = writeln!(
                    out,
                    "  rank {:>4} <- rank {:>4}: {} ({} B): needed by the destination box, held by the sender",
                    t.dst_rank, t.src_rank, t.region, bytes
                );
            }
        }
        let _ = writeln!(
            out,
            "network bytes: {} (lower bound {}), local copies: {} B",
            self.bytes_total(),
            self.bytes_lower_bound(),
            self.bytes_local()
        );
        out
    }
}

/// Sums `(rank, bytes)` pairs per rank, listing every rank of `ranks` in that order (a rank the
/// pairs name outside `ranks` is added after them).
fn per_rank(
    ranks: &[usize],
    pairs: impl IntoIterator<Item = (usize, usize)>,
) -> Vec<(usize, usize)> {
    let mut totals: Vec<(usize, usize)> = ranks.iter().map(|&r| (r, 0)).collect();
    let mut index: BTreeMap<usize, usize> =
        ranks.iter().enumerate().map(|(i, &r)| (r, i)).collect();
    for (rank, bytes) in pairs {
        let i = *index.entry(rank).or_insert_with(|| {
            totals.push((rank, 0));
            totals.len() - 1
        });
        totals[i].1 += bytes;
    }
    totals
}

/// Elements each destination slot lacks under the source layout, summed.
pub(crate) fn lower_bound_elements(src: &TensorLayout, dst: &TensorLayout) -> usize {
    if src.mesh().is_interleaved() {
        lower_bound_by_source_index(src, dst)
    } else {
        lower_bound_one_slot_per_device(src, dst)
    }
}

/// [`lower_bound_elements`] for any source mesh: each destination box less every box its device
/// holds.
fn lower_bound_by_source_index(src: &TensorLayout, dst: &TensorLayout) -> usize {
    let index = SourceIndex::new(src);
    let dst_mesh = dst.mesh();
    (0..dst_mesh.n_slots())
        .map(|slot| {
            let device = dst_mesh.device_of_slot(slot);
            let mut missing = vec![dst.slot_box(slot)];
            for (_, b) in index.local_boxes(device) {
                missing = missing.iter().flat_map(|m| m.subtract(&b)).collect();
            }
            missing.iter().map(SliceBox::n_elements).sum::<usize>()
        })
        .sum()
}

/// [`lower_bound_elements`] where every device holds at most one source slot (a mesh that is
/// not interleaved): a destination slot lacks its box less the one box its device holds,
/// counted dim by dim without building either box (a search asks this of every candidate
/// layout, over every slot of meshes of tens of thousands of ranks).
fn lower_bound_one_slot_per_device(src: &TensorLayout, dst: &TensorLayout) -> usize {
    let src_mesh = src.mesh();
    let mut device_slots: Vec<(usize, usize)> = (0..src_mesh.n_slots())
        .map(|s| (src_mesh.device_of_slot(s), s))
        .collect();
    device_slots.sort_unstable();
    let dst_mesh = dst.mesh();
    let ndim = dst.shape().len();
    (0..dst_mesh.n_slots())
        .map(|slot| {
            let device = dst_mesh.device_of_slot(slot);
            let wanted: usize = (0..ndim).map(|d| dst.slot_extent(slot, d).1).product();
            let held = device_slots
                .binary_search_by_key(&device, |&(d, _)| d)
                .map_or(0, |i| {
                    let src_slot = device_slots[i].1;
                    (0..ndim)
                        .map(|d| {
                            let (a, la) = dst.slot_extent(slot, d);
                            let (b, lb) = src.slot_extent(src_slot, d);
                            (a + la).min(b + lb).saturating_sub(a.max(b))
                        })
                        .product()
                });
            wanted - held
        })
        .sum()
}

/// Plans moving a tensor of `dtype` from `src` to `dst`.
///
/// The two layouts must describe the same global shape; their meshes may differ in axes, device
/// count and rank list. Each destination slot first copies what its device already holds, then
/// receives each missing element exactly once from the least-loaded source slot holding it.
pub fn plan(
    src: &TensorLayout,
    dst: &TensorLayout,
    dtype: DType,
) -> Result<ReshardPlan, ReshardError> {
    plan_from(&DistLayout::from(src.clone()), dst, dtype)
}

/// Plans moving a tensor whose source may be pending a sum (see [`DistLayout`]): the sum is
/// resolved first within each partial group (see [`ReduceStep::choose`]), then boxes move as in
/// [`plan`]. The plan may have as many transfers as the layouts need (an all-gather over `n`
/// ranks has `n²`); [`plan_from_within`] bounds them.
pub fn plan_from(
    src: &DistLayout,
    dst: &TensorLayout,
    dtype: DType,
) -> Result<ReshardPlan, ReshardError> {
    plan_from_within(src, dst, dtype, usize::MAX)
}

/// [`plan_from`] for a plan of at most `max_transfers` transfers (local copies included), so
/// that a caller which lists, stores or sends every transfer refuses a plan too large for it
/// without planning it: an all-gather over 65,536 ranks has 2³² transfers, and planning them
/// takes minutes.
///
/// The transfers are counted first, exactly and in time linear in the destination slots (each
/// slot's pieces are counted without being made; a manual row split of dim 0 adds a scan of its
/// blocks per piece, as planning does), and a count above `max_transfers` is
/// [`ReshardError::TooManyTransfers`]. A plan within the bound is the plan [`plan_from`]
/// makes, transfer for transfer.
pub fn plan_from_within(
    src: &DistLayout,
    dst: &TensorLayout,
    dtype: DType,
    max_transfers: usize,
) -> Result<ReshardPlan, ReshardError> {
    check_same_shape(src.layout(), dst)?;
    check_byte_figures(src.layout(), dst, dtype)?;
    check_pending_op(src, dtype)?;
    let reduce = src.is_partial().then(|| ReduceStep::choose(src, dst));
    let from = reduce.as_ref().map_or(src.layout(), |r| &r.result);
    // No plan has more than `usize::MAX` transfers: the unbounded plan skips the count.
    let counted = (max_transfers < usize::MAX).then(|| count_transfers(from, dst));
    if let Some(n_transfers) = counted.filter(|&n| n > max_transfers) {
        return Err(ReshardError::TooManyTransfers {
            n_transfers,
            max_transfers,
            src_devices: src.layout().mesh().n_devices(),
            dst_devices: dst.mesh().n_devices(),
        });
    }
    let transfers = plan_transfers(from, dst, dtype)?;
    debug_assert!(
        counted.is_none_or(|n| n == transfers.n_transfers),
        "counted {counted:?} transfers but planned {}",
        transfers.n_transfers
    );
    Ok(ReshardPlan {
        src: src.clone(),
        reduce,
        dst: dst.clone(),
        dtype,
        transfers,
        lowering: std::sync::OnceLock::new(),
    })
}

/// [`ReshardError::ShapeMismatch`] unless `src` and `dst` describe the same global shape.
fn check_same_shape(src: &TensorLayout, dst: &TensorLayout) -> Result<(), ReshardError> {
    if src.shape() != dst.shape() {
        return Err(ReshardError::ShapeMismatch {
            src: src.shape().to_vec(),
            dst: dst.shape().to_vec(),
        });
    }
    Ok(())
}

/// [`ReshardError::Unsupported`] for a pending sum of `bool` values: a sum is not defined on
/// `bool` (every backend refuses it), so such a plan could only fail when it runs, after every
/// rank has started; a pending maximum (logical or) is planned.
fn check_pending_op(src: &DistLayout, dtype: DType) -> Result<(), ReshardError> {
    if src.is_partial() && src.pending_op() == PendingOp::Sum && dtype == DType::Bool {
        return Err(ReshardError::Unsupported {
            what: format!(
                "a pending sum of {dtype} values ({src}): a sum is not defined on {dtype} \
                 (only a pending maximum is)"
            ),
        });
    }
    Ok(())
}

/// [`ReshardError::TooLarge`] unless the tensor's bytes times twice the slots of both meshes
/// fit in `usize`: every byte figure of a plan (a rank's bytes received or sent, the totals, the
/// lower bound, a reduction's steps) is at most that, so none of them wraps.
fn check_byte_figures(
    src: &TensorLayout,
    dst: &TensorLayout,
    dtype: DType,
) -> Result<(), ReshardError> {
    let slots = src.mesh().n_slots().saturating_add(dst.mesh().n_slots());
    let fits = src
        .shape()
        .iter()
        .try_fold(dtype.size_in_bytes(), |n, &d| n.checked_mul(d))
        .and_then(|bytes| bytes.checked_mul(slots))
        .and_then(|bytes| bytes.checked_mul(2));
    match fits {
        Some(_) => Ok(()),
        None => Err(ReshardError::TooLarge {
            shape: src.shape().to_vec(),
            dtype: dtype.to_string(),
            slots,
        }),
    }
}

/// The number of transfers [`plan_transfers`] makes from `src` to `dst` (same shape, no
/// pending sums), without making them: per destination slot, its local copies plus the pieces
/// of what it lacks. Time linear in the destination slots, whatever the count (saturating at
/// `usize::MAX`); see [`plan_from_within`].
pub(crate) fn count_transfers(src: &TensorLayout, dst: &TensorLayout) -> usize {
    let index = SourceIndex::new(src);
    let dst_mesh = dst.mesh();
    (0..dst_mesh.n_slots()).fold(0usize, |total, dst_slot| {
        let (local, missing) =
            index.split_held(dst_mesh.device_of_slot(dst_slot), dst.slot_box(dst_slot));
        missing
            .iter()
            .fold(total.saturating_add(local.len()), |n, m| {
                n.saturating_add(index.count_pieces(m))
            })
    })
}

/// A block's holders by `(bytes sent, rank, slot)`, least loaded first.
type HolderHeap = BinaryHeap<Reverse<(usize, usize, usize)>>;

/// The transfers moving boxes from `src` to `dst` (no pending sums).
fn plan_transfers(
    src: &TensorLayout,
    dst: &TensorLayout,
    dtype: DType,
) -> Result<TransferTable, ReshardError> {
    check_same_shape(src, dst)?;
    let src_mesh = src.mesh();
    let dst_mesh = dst.mesh();
    let elem = dtype.size_in_bytes();
    let index = SourceIndex::new(src);
    // Bytes sent so far per source device (ranks are below the rank ceiling, so dense).
    let max_src_rank = src_mesh.device_ranks().into_iter().max().unwrap_or(0);
    let mut sent: Vec<usize> = vec![0; max_src_rank + 1];
    // Per block, its holders by (bytes sent, rank, slot), smallest first: the least-loaded
    // holder, ties to the lower rank, then the lower slot, in log time rather than a scan of
    // the replica group (which made a replicated source over n ranks quadratic in n).
    let mut heaps: FxHashMap<usize, HolderHeap> = FxHashMap::default();
    let mut transfers = TransferTable::default();
    let mut failed = None;
    for dst_slot in 0..dst_mesh.n_slots() {
        let dst_rank = dst_mesh.device_of_slot(dst_slot);
        let (local, missing) = index.split_held(dst_rank, dst.slot_box(dst_slot));
        for (src_slot, common) in local {
            transfers.push(src_slot, common)?;
        }
        for m in &missing {
            index.for_each_piece(m, |region, block, holders| {
                let bytes = region.n_elements() * elem;
                let heap = heaps.entry(block).or_insert_with(|| {
                    holders
                        .iter()
                        .map(|&s| Reverse((0, src_mesh.device_of_slot(s), s)))
                        .collect()
                });
                // A device of an interleaved mesh holds several slots, so pieces of other blocks
                // load it too: an entry whose load is behind the device's is stale, and goes
                // back with the current load (loads only grow, so the first entry that is
                // current is the least-loaded holder).
                let src_slot = loop {
                    let Reverse((load, rank, slot)) =
                        heap.pop().expect("a replica group is never empty");
                    if load == sent[rank] {
                        heap.push(Reverse((load + bytes, rank, slot)));
                        break slot;
                    }
                    heap.push(Reverse((sent[rank], rank, slot)));
                };
                let src_rank = src_mesh.device_of_slot(src_slot);
                sent[src_rank] += bytes;
                if let Err(e) = transfers.push(src_slot, region) {
                    failed.get_or_insert(e);
                }
            });
        }
        transfers.end_slot();
    }
    match failed {
        Some(e) => Err(e),
        None => Ok(transfers.finish()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::tl;
    use layout::Layout;

    /// Each kind of plan is named by what it runs.
    #[test]
    fn a_plan_is_named_by_the_collective_it_runs() {
        let on_two = |map: [&str; 2]| tl(&[2], &["d"], &map, &[4, 6]);
        let whole = on_two(["None", "None"]);
        let rows = on_two(["d", "None"]);
        let partial = DistLayout::partial(whole.clone(), &[0]).unwrap();
        let cases = [
            (partial.clone(), whole.clone(), "all-reduce"),
            (partial, rows.clone(), "reduce-scatter"),
            (rows.clone().into(), whole.clone(), "all-gather"),
            (rows.clone().into(), on_two(["None", "d"]), "all-to-all"),
            (whole.clone().into(), rows, "local copy"),
        ];
        for (src, dst, want) in cases {
            let p = plan_from(&src, &dst, DType::F32).unwrap();
            assert_eq!(p.collective_on(0), want, "{src} to {dst}");
        }
    }

    /// `transfers_of(r)` is exactly the plan's transfers `r` sends or receives, local copies
    /// included, in plan order.
    #[test]
    fn a_rank_s_transfers_are_read_from_the_runs() {
        let cases = [
            (
                tl(&[2, 3], &["a", "b"], &["a", "b"], &[6, 6]),
                tl(&[2, 3], &["a", "b"], &["b", "None"], &[6, 6]),
            ),
            (
                tl(&[6], &["x"], &["x", "None"], &[6, 6]),
                tl(&[6], &["x"], &["None", "None"], &[6, 6]),
            ),
            (
                tl(&[2, 3], &["a", "b"], &["None", "b"], &[6, 6]),
                tl(&[2, 3], &["a", "b"], &["a", "None"], &[6, 6]),
            ),
        ];
        for (src, dst) in &cases {
            let p = plan(src, dst, DType::F32).unwrap();
            for rank in 0..6 {
                let expected: Vec<Transfer> = p
                    .transfers()
                    .filter(|t| t.src_rank == rank || t.dst_rank == rank)
                    .collect();
                assert!(!expected.is_empty());
                assert_eq!(p.transfers_of(rank), expected, "rank {rank}");
            }
        }
    }

    #[test]
    fn row_to_column_split_moves_only_what_is_missing() {
        // 4 ranks, (S0) -> (S1) of a 4x4 tensor: each rank keeps 1 of its 4 elements of the new
        // column block and receives the other 3 (one from each other rank).
        let src = tl(&[4], &["x"], &["x", "None"], &[4, 4]);
        let dst = tl(&[4], &["x"], &["None", "x"], &[4, 4]);
        let p = plan(&src, &dst, DType::F32).unwrap();
        assert_eq!(p.bytes_total(), 4 * 3 * 4);
        assert_eq!(p.bytes_total(), p.bytes_lower_bound());
        assert_eq!(p.bytes_local(), 4 * 4);
        assert!(p.bytes_per_rank().iter().all(|&(_, b)| b == 12));
    }

    /// Layout pairs of every kind the planner handles: splits to splits, gathers, scatters,
    /// multi-axis maps, different meshes and rank lists, interleaved meshes, pending sums.
    fn layout_pairs() -> Vec<(DistLayout, TensorLayout)> {
        let with_ranks = |dev: &[usize], names: &[&str], ranks: Vec<usize>, map: &[&str]| {
            let entries: Vec<layout::DimSpec> =
                map.iter().map(|m| layout::DimSpec::parse(m)).collect();
            Layout::new(dev, names, Some(ranks))
                .unwrap()
                .apply(&entries)
                .unwrap()
                .bind(&[8, 12])
                .unwrap()
        };
        let il = ["dp", "interleaved_parallel"];
        let mut pairs: Vec<(DistLayout, TensorLayout)> = vec![
            (
                tl(&[4], &["x"], &["x", "None"], &[8, 12]).into(),
                tl(&[4], &["x"], &["None", "None"], &[8, 12]),
            ),
            (
                tl(&[4], &["x"], &["x", "None"], &[8, 12]).into(),
                tl(&[4], &["x"], &["None", "x"], &[8, 12]),
            ),
            (
                tl(&[2, 3], &["a", "b"], &["a", "b"], &[12, 12]).into(),
                tl(&[2, 3], &["a", "b"], &["b", "a"], &[12, 12]),
            ),
            (
                tl(&[2, 3], &["a", "b"], &["None", "a+b"], &[8, 12]).into(),
                tl(&[3, 2], &["p", "q"], &["q", "p"], &[8, 12]),
            ),
            (
                tl(&[2], &["x"], &["None", "None"], &[8, 12]).into(),
                with_ranks(&[4], &["y"], vec![5, 2, 7, 3], &["y", "None"]),
            ),
            (
                with_ranks(
                    &[2, 2],
                    &il,
                    vec![0, 1, 2, 3],
                    &["dp", "interleaved_parallel"],
                )
                .into(),
                tl(&[4], &["x"], &["None", "x"], &[8, 12]),
            ),
            (
                with_ranks(&[2, 2], &il, vec![0, 1, 2, 3], &["None", "None"]).into(),
                tl(&[4], &["x"], &["x", "None"], &[8, 12]),
            ),
            (
                tl(&[4], &["x"], &["x", "None"], &[8, 12]).into(),
                with_ranks(
                    &[2, 2],
                    &il,
                    vec![4, 5, 6, 7],
                    &["interleaved_parallel", "dp"],
                ),
            ),
        ];
        let partial = |map: [&str; 2], axes: &[usize]| {
            DistLayout::partial(tl(&[2, 2], &["dp", "tp"], &map, &[8, 12]), axes).unwrap()
        };
        pairs.push((
            partial(["dp", "None"], &[1]),
            tl(&[2, 2], &["dp", "tp"], &["dp", "tp"], &[8, 12]),
        ));
        pairs.push((
            partial(["None", "None"], &[0, 1]),
            tl(&[2, 2], &["dp", "tp"], &["None", "None"], &[8, 12]),
        ));
        pairs
    }

    /// The lower bound counted dim by dim (a source of one slot per device) is the one counted
    /// by subtracting boxes, on every pair whose source is not interleaved, in both directions
    /// and from a moved source (a reduction's result).
    #[test]
    fn the_lower_bound_by_extents_is_the_lower_bound_by_boxes() {
        let mut checked = 0;
        for (src, dst) in layout_pairs() {
            let from = plan_from(&src, &dst, DType::F32)
                .unwrap()
                .moved_from()
                .clone();
            for (a, b) in [(src.layout(), &dst), (&from, &dst), (&dst, src.layout())] {
                if a.mesh().is_interleaved() {
                    continue;
                }
                let by_boxes = lower_bound_by_source_index(a, b);
                assert_eq!(
                    lower_bound_one_slot_per_device(a, b),
                    by_boxes,
                    "{a} to {b}"
                );
                checked += usize::from(by_boxes > 0);
            }
        }
        assert!(checked >= 10, "only {checked} pairs moved anything");
    }

    /// Within its bound, the bounded plan is the unbounded one, transfer for transfer, and the
    /// count made before planning is its exact number of transfers; one transfer fewer is
    /// refused, naming the count, the bound and both meshes' device counts.
    #[test]
    fn a_bounded_plan_is_the_plan_or_refused() {
        for (src, dst) in layout_pairs() {
            let full = plan_from(&src, &dst, DType::F32).unwrap();
            let n = full.n_transfers();
            assert!(n > 0, "{src} to {dst}");
            let from = full.moved_from().clone();
            assert_eq!(count_transfers(&from, &dst), n, "{src} to {dst}");
            for max in [n, n + 1, usize::MAX] {
                let bounded = plan_from_within(&src, &dst, DType::F32, max).unwrap();
                assert_eq!(
                    bounded.transfers().collect::<Vec<_>>(),
                    full.transfers().collect::<Vec<_>>(),
                    "{src} to {dst} within {max}"
                );
                assert_eq!(bounded.reduce(), full.reduce());
            }
            let err = plan_from_within(&src, &dst, DType::F32, n - 1).unwrap_err();
            let (src_devices, dst_devices) =
                (src.layout().mesh().n_devices(), dst.mesh().n_devices());
            assert_eq!(
                err,
                ReshardError::TooManyTransfers {
                    n_transfers: n,
                    max_transfers: n - 1,
                    src_devices,
                    dst_devices,
                },
                "{src} to {dst}"
            );
            let message = err.to_string();
            for part in [
                format!("{n} transfers"),
                format!("at most {} transfers", n - 1),
                format!("between {src_devices} source and {dst_devices} destination devices"),
            ] {
                assert!(message.contains(&part), "{message}");
            }
        }
    }

    /// An all-gather over 65,536 ranks has 2³² transfers: the bound refuses it from the count,
    /// without planning a transfer (which took minutes).
    #[test]
    fn a_gather_over_65536_ranks_is_refused_before_planning() {
        let n = 1 << 16;
        let src = tl(&[n], &["dp"], &["dp"], &[n]);
        let dst = tl(&[n], &["dp"], &["None"], &[n]);
        let started = std::time::Instant::now();
        let err = plan_from_within(&src.into(), &dst, DType::F32, 1 << 22).unwrap_err();
        assert_eq!(
            err,
            ReshardError::TooManyTransfers {
                n_transfers: n * n,
                max_transfers: 1 << 22,
                src_devices: n,
                dst_devices: n,
            }
        );
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "refused only after {:?}",
            started.elapsed()
        );
    }

    /// A shape mismatch is refused before anything is planned or counted, a partial source's
    /// reduction included (choosing it compared boxes of different ranks).
    #[test]
    fn a_shape_mismatch_is_refused_first() {
        let src = tl(&[2, 2], &["dp", "tp"], &["dp", "None"], &[8, 12]);
        let src = DistLayout::partial(src, &[1]).unwrap();
        let dst = tl(&[2], &["x"], &["x"], &[8]);
        for max in [0, usize::MAX] {
            assert!(matches!(
                plan_from_within(&src, &dst, DType::F32, max),
                Err(ReshardError::ShapeMismatch { .. })
            ));
        }
    }

    /// A pending sum of `bool` values is refused when planned, naming the dtype (it was planned,
    /// and `tessera reshard --run` failed on rank 0 with the backend's reduction error); a
    /// pending maximum of `bool` values, and a final `bool` source, are planned.
    #[test]
    fn a_pending_sum_of_bools_is_refused() {
        let src = tl(&[2, 2], &["dp", "tp"], &["dp", "None"], &[8, 12]);
        let dst = tl(&[2, 2], &["dp", "tp"], &["dp", "tp"], &[8, 12]);
        let summed = DistLayout::partial(src.clone(), &[1]).unwrap();
        let refused = plan_from(&summed, &dst, DType::Bool).unwrap_err();
        assert!(
            matches!(&refused, ReshardError::Unsupported { what } if what.contains("pending sum of bool")),
            "{refused:?}"
        );
        assert!(plan_from(&summed, &dst, DType::U8).is_ok());
        assert!(plan_from(&summed.with_op(PendingOp::Max), &dst, DType::Bool).is_ok());
        assert!(plan(&src, &dst, DType::Bool).is_ok());
    }

    /// A tensor whose bytes times twice the slots pass `usize::MAX` is refused (its byte
    /// figures summed to 0 in a release build), one just inside is planned with every figure
    /// exact.
    #[test]
    fn a_tensor_whose_byte_figures_would_wrap_is_refused() {
        let on_two = |len: usize, map: &str| tl(&[2], &["dp"], &[map], &[len]);
        let huge = 1usize << 61;
        let refused = plan(&on_two(huge, "dp"), &on_two(huge, "None"), DType::F64);
        assert!(
            matches!(&refused, Err(ReshardError::TooLarge { shape, slots: 4, .. }) if shape == &[huge]),
            "{refused:?}"
        );
        let message = refused.unwrap_err().to_string();
        assert!(
            message.contains("f64") && message.contains(&huge.to_string()),
            "{message}"
        );
        let large = 1usize << 56;
        let p = plan(&on_two(large, "dp"), &on_two(large, "None"), DType::F64).unwrap();
        assert_eq!(
            p.bytes_total(),
            large * 8,
            "each rank receives the other's half"
        );
    }

    /// Every network transfer comes from the holder that had sent the fewest bytes so far
    /// (ties to the lower rank, then the lower slot), the devices of an interleaved mesh
    /// included, whose several slots share one load: the greedy choice, made by a scan of
    /// each replica group here and by per-block heaps in the planner.
    #[test]
    fn senders_are_the_least_loaded_holders() {
        let il = ["dp", "interleaved_parallel"];
        let replicated_interleaved = |ranks: usize| {
            Layout::new(&[ranks, 2], &il, None)
                .unwrap()
                .apply(&[
                    layout::DimSpec::parse("None"),
                    layout::DimSpec::parse("None"),
                ])
                .unwrap()
                .bind(&[16, 4])
                .unwrap()
        };
        let half_interleaved = Layout::new(&[2, 2], &il, None)
            .unwrap()
            .apply(&[
                layout::DimSpec::parse("interleaved_parallel"),
                layout::DimSpec::parse("None"),
            ])
            .unwrap()
            .bind(&[16, 4])
            .unwrap();
        let cases = [
            (
                replicated_interleaved(2),
                tl(&[8], &["x"], &["x", "None"], &[16, 4]),
            ),
            (
                replicated_interleaved(3),
                tl(&[16], &["x"], &["x", "None"], &[16, 4]),
            ),
            (
                half_interleaved,
                tl(&[8], &["x"], &["None", "None"], &[16, 4]),
            ),
            (
                tl(&[2, 2], &["a", "b"], &["a", "None"], &[16, 4]),
                tl(&[8], &["x"], &["x", "None"], &[16, 4]),
            ),
        ];
        for (src, dst) in cases {
            let p = plan(&src, &dst, DType::F32).unwrap();
            let mesh = src.mesh();
            let mut sent = vec![0usize; mesh.n_devices()];
            let mut network = 0;
            for t in p.transfers().filter(|t| !t.is_local()) {
                let [piece] = &source_pieces(&src, &t.region)[..] else {
                    panic!("{} is one source block's piece", t.region);
                };
                let best = *piece
                    .holders
                    .iter()
                    .min_by_key(|&&s| (sent[mesh.device_of_slot(s)], mesh.device_of_slot(s)))
                    .unwrap();
                assert_eq!(t.src_slot, best, "{src} to {dst}: {t:?}");
                sent[t.src_rank] += p.transfer_bytes(&t);
                network += 1;
            }
            assert!(network > 0, "{src} to {dst}");
        }
    }

    #[test]
    fn replicated_sources_share_the_load() {
        // Replicated over 2 ranks -> split over 4 other ranks: senders alternate.
        let src = TensorLayout::replicated(layout::Mesh::line("a", 2).unwrap(), &[8]);
        let dst_mesh = layout::Mesh::new(&[4], &["b"], Some(vec![2, 3, 4, 5])).unwrap();
        let dst = Layout::from_mesh(dst_mesh, vec![vec![0]])
            .unwrap()
            .bind(&[8])
            .unwrap();
        let p = plan(&src, &dst, DType::F32).unwrap();
        let sent = p.bytes_sent_per_rank();
        assert_eq!(sent, vec![(0, 16), (1, 16)]);
        assert_eq!(p.bytes_total(), 32);
    }
}
