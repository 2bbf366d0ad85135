//! Executing a plan over a communicator.
//!
//! Every rank runs the same plan. A partial source is summed within its groups first
//! (all-reduce or reduce-scatter); then each rank copies what it already holds, and the
//! network transfers run as the collectives [`reshard::lower`] found: an all-gather, an all-to-all, or a
//! variable-sized exchange within each independent group of ranks.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use comm::{Buf, BufMut, Communicator, Tag};
use layout::{SliceBox, TensorLayout};
use reshard::{
    lower_for, plan_from, DistLayout, Exchange, ExchangeKind, HalfSum, PendingOp, ReduceKind,
    ReshardPlan, Transfer,
};
use tensor::region::{copy_region, Placement};
use tensor::{DType, Tensor};

use crate::error::ExecError;

/// Runs plans on one rank, keeping the sub-group communicators it creates so repeated reshards
/// (every training step) do not create groups again.
///
/// The communicator is the world: its rank numbers are the device ranks the layouts use.
#[derive(Debug)]
pub struct ReshardRunner {
    world: Arc<dyn Communicator>,
    groups: HashMap<Vec<usize>, Box<dyn Communicator>>,
    /// Pending sums are added in the canonical tree over the group's members in block order.
    deterministic: bool,
    /// Network transfers as tagged point-to-point messages instead of a collective exchange
    /// ([`ReshardRunner::run_into_messages`]).
    messages: Option<Tag>,
    /// How pending sums of half-precision (bf16, f16) values are added.
    half_sum: HalfSum,
    /// Space kept between runs.
    space: KeptSpace,
}

/// Space a runner keeps between runs (it only grows): a training step runs the same reshards
/// every time, so it is allocated once.
#[derive(Default)]
struct KeptSpace {
    /// Where a reduce-scatter packs its parts.
    pack: Option<Tensor>,
}

impl std::fmt::Debug for KeptSpace {
    /// The sizes, not the bytes.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeptSpace")
            .field(
                "pack_bytes",
                &self.pack.as_ref().map_or(0, |t| t.as_bytes().len()),
            )
            .finish()
    }
}

impl ReshardRunner {
    /// A runner for this rank of `world`.
    pub fn new(world: Arc<dyn Communicator>) -> ReshardRunner {
        ReshardRunner {
            world,
            groups: HashMap::new(),
            deterministic: false,
            messages: None,
            half_sum: HalfSum::default(),
            space: KeptSpace::default(),
        }
    }

    /// How the pending sums of half-precision values are added from now on ([`HalfSum`]; the
    /// default accumulates in f32 and rounds once).
    pub fn set_half_sum(&mut self, half_sum: HalfSum) {
        self.half_sum = half_sum;
    }

    /// How pending sums of half-precision values are added.
    pub fn half_sum(&self) -> HalfSum {
        self.half_sum
    }

    /// Like [`ReshardRunner::run_into`], with the transfers between ranks sent as point-to-point
    /// messages tagged `tag` (sends first, which do not wait for the receiver, then receives)
    /// instead of one collective exchange. A sender and its receiver then need not run the plan
    /// at the same moment: between pipeline stages, a stage sends its activations and goes on
    /// while the next stage receives them when its schedule reaches them. Messages between two
    /// ranks with one tag arrive in the order they were sent. A pending sum of the source is
    /// still added by a collective of the source's ranks.
    pub fn run_into_messages(
        &mut self,
        plan: &ReshardPlan,
        local: &[&Tensor],
        out: &mut [Tensor],
        tag: Tag,
    ) -> Result<(), ExecError> {
        self.messages = Some(tag);
        let result = self.run_into(plan, local, out);
        self.messages = None;
        result
    }

    /// Deterministic mode: every pending sum is added in the canonical tree
    /// (`tensor::kernels::tree`) over its group's members, ordered by the blocks of the summed
    /// dim (row-major over the pending axes as the layout lists them), so that the result's bits
    /// do not depend on the group's size or the arrival order.
    pub fn set_deterministic(&mut self, on: bool) {
        self.deterministic = on;
    }

    /// Whether network transfers run as tagged messages
    /// ([`ReshardRunner::run_into_messages`] is running).
    pub(crate) fn sends_messages(&self) -> bool {
        self.messages.is_some()
    }

    /// Whether pending sums are added in the canonical order.
    pub fn is_deterministic(&self) -> bool {
        self.deterministic
    }

    /// This rank (a device rank of the layouts).
    pub fn rank(&self) -> usize {
        self.world.rank()
    }

    /// The world communicator.
    pub fn world(&self) -> &Arc<dyn Communicator> {
        &self.world
    }

    /// The communicator of the group `ranks` (world ranks, in group order), created on first use.
    /// Every member must ask for the same groups in the same order.
    pub fn group(&mut self, ranks: &[usize]) -> Result<&dyn Communicator, ExecError> {
        if !self.groups.contains_key(ranks) {
            let group = self.world.group(ranks)?;
            self.groups.insert(ranks.to_vec(), group);
        }
        Ok(self.groups[ranks].as_ref())
    }

    /// The rank lists of every sub-group communicator this runner has created, ascending.
    pub fn created_groups(&self) -> Vec<Vec<usize>> {
        let mut groups: Vec<Vec<usize>> = self.groups.keys().cloned().collect();
        groups.sort();
        groups
    }

    /// Runs this rank's part of `plan`. `local` holds this rank's source slices, one per source
    /// slot on this device in slot order (none when the rank is outside the source mesh); the
    /// result holds this rank's destination slices the same way.
    pub fn run(
        &mut self,
        plan: &ReshardPlan,
        local: Vec<Tensor>,
    ) -> Result<Vec<Tensor>, ExecError> {
        let dst = plan.dst();
        let mut out: Vec<Tensor> = device_slots(dst, self.rank())
            .iter()
            .map(|&slot| Tensor::zeros(plan.dtype(), &dst.slot_shape(slot)))
            .collect();
        let refs: Vec<&Tensor> = local.iter().collect();
        self.run_into(plan, &refs, &mut out)?;
        Ok(out)
    }

    /// Like [`ReshardRunner::run`], writing into `out` (this rank's destination slices, already
    /// allocated with the destination slice shape and the plan's dtype) and reading `local`
    /// without taking it. Every element of `out` is overwritten. A training step reshards into
    /// the same buffers every time, so nothing is allocated but the messages.
    pub fn run_into(
        &mut self,
        plan: &ReshardPlan,
        local: &[&Tensor],
        out: &mut [Tensor],
    ) -> Result<(), ExecError> {
        let me = self.rank();
        let dtype = plan.dtype();
        let src_slots = device_slots(plan.src().layout(), me);
        check_inputs(plan.src().layout(), &src_slots, local, dtype)?;
        let dst = plan.dst();
        let dst_slots = device_slots(dst, me);
        check_inputs(dst, &dst_slots, &out.iter().collect::<Vec<_>>(), dtype)?;
        if let Some(result) = self.all_reduce_into(plan, local, out) {
            return result;
        }
        if let Some(result) = self.reduce_scatter_into(plan, local, out) {
            return result;
        }
        let reduced: Vec<Tensor>;
        let held: Vec<(usize, &Tensor)> = match plan.reduce() {
            Some(step) => {
                // Borrowed: an all-reduce sums in a copy, a reduce-scatter reads them in place.
                let sources: Vec<(usize, Cow<'_, Tensor>)> = src_slots
                    .iter()
                    .zip(local)
                    .map(|(&s, &t)| (s, Cow::Borrowed(t)))
                    .collect();
                reduced = self
                    .reduce(plan, step.kind.clone(), sources)?
                    .into_iter()
                    .map(|(_, t)| t)
                    .collect();
                src_slots.iter().copied().zip(reduced.iter()).collect()
            }
            None => src_slots
                .iter()
                .copied()
                .zip(local.iter().copied())
                .collect(),
        };
        let mut out: Vec<(usize, &mut Tensor)> =
            dst_slots.iter().copied().zip(out.iter_mut()).collect();
        copy_local(plan, me, &held, &mut out);
        // Network transfers, one exchange per independent group.
        if let Some(exchange) = lower_for(plan, me) {
            self.exchange(plan, &exchange, &held, &mut out)?;
        }
        Ok(())
    }

    /// Runs `plan`, one all-reduce of every rank's whole slice into the same slice
    /// ([`ReshardPlan::is_whole_slice_all_reduce`]), over this rank's `slice` in place: the
    /// executor hands over a source read by nothing after the reshard, and no copy is made.
    pub fn all_reduce_in_place(
        &mut self,
        plan: &ReshardPlan,
        slice: &mut Tensor,
    ) -> Result<(), ExecError> {
        let step = plan
            .reduce()
            .filter(|_| plan.is_whole_slice_all_reduce())
            .ok_or_else(|| ExecError::Unsupported {
                what: format!(
                    "an in-place all-reduce of a reshard that is not one ({} to {})",
                    plan.src(),
                    plan.dst()
                ),
            })?;
        let slots = device_slots(plan.src().layout(), self.rank());
        check_inputs(plan.src().layout(), &slots, &[&*slice], plan.dtype())?;
        let summed = std::mem::replace(slice, Tensor::zeros(slice.dtype(), &[0]));
        let mut reduced = self.reduce(
            plan,
            step.kind.clone(),
            vec![(slots[0], Cow::Owned(summed))],
        )?;
        *slice = reduced.pop().expect("one slice in, one out").1;
        Ok(())
    }

    /// A plan that is one all-reduce of this rank's whole slice into the same slice, whose
    /// source is still read after it: the slice is copied into `out` once and summed there,
    /// instead of summed in a copy that is then copied again. `None` (nothing done) for any
    /// other plan.
    fn all_reduce_into(
        &mut self,
        plan: &ReshardPlan,
        local: &[&Tensor],
        out: &mut [Tensor],
    ) -> Option<Result<(), ExecError>> {
        let ([src], [dst]) = (local, out) else {
            return None;
        };
        if !plan.is_whole_slice_all_reduce() || src.shape() != dst.shape() {
            return None;
        }
        dst.as_bytes_mut().copy_from_slice(src.as_bytes());
        Some(self.all_reduce_in_place(plan, dst))
    }

    /// A plan whose reduce-scatter leaves this rank's part exactly where the destination wants
    /// it ([`ReshardPlan::is_whole_slice_reduce_on`]; sequence parallel's sums of partial
    /// activations): the part is summed straight into `out` ([`Self::reduce_scatter_part`]).
    /// `None` (nothing done) for any other plan, and in the modes that sum otherwise
    /// (deterministic sums, half-precision values widened to f32).
    fn reduce_scatter_into(
        &mut self,
        plan: &ReshardPlan,
        local: &[&Tensor],
        out: &mut [Tensor],
    ) -> Option<Result<(), ExecError>> {
        let step = plan.reduce()?;
        let ReduceKind::ReduceScatter { dim } = step.kind else {
            return None;
        };
        let ([src], [dst]) = (local, out) else {
            return None;
        };
        let dtype = src.dtype();
        let canonical = self.deterministic && step.op == PendingOp::Sum;
        if canonical || self.half_sum.widens(dtype) || !plan.is_whole_slice_reduce_on(self.rank()) {
            return None;
        }
        let slot = device_slots(plan.src().layout(), self.rank())[0];
        Some(self.reduce_scatter_part(plan, slot, (src, dim), dst))
    }

    /// Reduce-scatters this rank's partial sum `src` (source slot `slot`) along `dim` within
    /// its group into `part`, this member's part, which is overwritten. The parts interleave
    /// when a dim before `dim` is longer than 1: the backend reads them where they lie
    /// (`reduce_scatter_rows`); summed in the element type, they are packed one after another
    /// into the runner's kept space first.
    fn reduce_scatter_part(
        &mut self,
        plan: &ReshardPlan,
        slot: usize,
        (src, dim): (&Tensor, usize),
        part: &mut Tensor,
    ) -> Result<(), ExecError> {
        let step = plan.reduce().expect("called with a reduce step");
        let ranks = sum_group(plan, slot)?;
        let n = ranks.len();
        let op = comm_op(step.op);
        let rows: usize = src.shape()[..dim].iter().product();
        if !self.half_sum.rounds_every_addition(src.dtype()) {
            let group = self.group(&ranks)?;
            let recv = BufMut::from_tensor(part);
            return Ok(group.reduce_scatter_rows(Buf::from_tensor(src), recv, rows, op)?);
        }
        let mut space = self.space.pack.take();
        let send = if rows == 1 {
            Buf::from_tensor(src)
        } else {
            let fits = space
                .as_ref()
                .is_some_and(|s| s.dtype() == src.dtype() && s.n_elements() >= src.n_elements());
            if !fits {
                space = Some(Tensor::zeros(src.dtype(), &[src.n_elements()]));
            }
            let space = space.as_mut().expect("made above");
            comm::parts_one_after_another(src.as_bytes(), (rows, n), space.as_bytes_mut());
            Buf::from_tensor(space).prefix(src.n_elements())
        };
        let counts = vec![part.n_elements(); n];
        let group = self.group(&ranks)?;
        let recv = BufMut::from_tensor(part);
        let result = group.reduce_scatter_in_element_type_v(send, recv, &counts, op);
        self.space.pack = space;
        Ok(result?)
    }

    /// Sums the partial source within its groups; returns the slices of the reduction's result.
    /// An all-reduce sums over an owned slice in place (a borrowed one is copied first); a
    /// reduce-scatter only reads its slice.
    fn reduce(
        &mut self,
        plan: &ReshardPlan,
        kind: ReduceKind,
        held: Vec<(usize, Cow<'_, Tensor>)>,
    ) -> Result<Vec<(usize, Tensor)>, ExecError> {
        let src = plan.src();
        let mesh = src.layout().mesh();
        let step = plan.reduce().expect("called with a reduce step");
        let mut out = Vec::with_capacity(held.len());
        for (slot, tensor) in held {
            let dtype = tensor.dtype();
            let widen = self.half_sum.widens(dtype);
            let in_type = self.half_sum.rounds_every_addition(dtype);
            check_half_sum(
                self.half_sum,
                dtype,
                self.deterministic && step.op == PendingOp::Sum,
            )?;
            let tensor = match widen {
                true => Cow::Owned(tensor.to_dtype(DType::F32)),
                false => tensor,
            };
            let narrow = |t: Tensor| if widen { t.to_dtype(dtype) } else { t };
            let group_slots = group_of(plan, slot);
            let ranks = sum_group(plan, slot)?;
            if self.deterministic && step.op == PendingOp::Sum {
                let order = src.canonical_member_order(group_slots);
                let ordered: Vec<usize> = order.iter().map(|&s| mesh.device_of_slot(s)).collect();
                let group = self.group(&ordered)?;
                // Reduce-scatter plus all-gather, each chunk's owner adding in the tree.
                let mut tensor = tensor.into_owned();
                group.all_reduce_deterministic(&mut tensor, comm_op(step.op))?;
                let tensor = match kind {
                    ReduceKind::AllReduce => tensor,
                    ReduceKind::ReduceScatter { dim } => {
                        // The part the ordinary path gives this member: its index in slot order.
                        let j = group_slots
                            .iter()
                            .position(|&s| s == slot)
                            .expect("the slot is in its group");
                        let n = group_slots.len();
                        let shape = tensor.shape().to_vec();
                        let part_len = shape[dim] / n;
                        let mut offset = vec![0; shape.len()];
                        offset[dim] = j * part_len;
                        let mut extent = shape;
                        extent[dim] = part_len;
                        tensor.extract_box(&SliceBox::new(offset, extent))?
                    }
                };
                out.push((slot, narrow(tensor)));
                continue;
            }
            let group = self.group(&ranks)?;
            match kind {
                ReduceKind::AllReduce => {
                    let mut tensor = tensor.into_owned();
                    match in_type {
                        true => group.all_reduce_in_element_type(&mut tensor, comm_op(step.op))?,
                        false => group.all_reduce(&mut tensor, comm_op(step.op))?,
                    }
                    out.push((slot, narrow(tensor)));
                }
                ReduceKind::ReduceScatter { dim } => {
                    let mut part_shape = tensor.shape().to_vec();
                    part_shape[dim] /= ranks.len();
                    let mut mine = Tensor::zeros(tensor.dtype(), &part_shape);
                    self.reduce_scatter_part(plan, slot, (&tensor, dim), &mut mine)?;
                    out.push((slot, narrow(mine)));
                }
            }
        }
        Ok(out)
    }

    /// Runs one exchange this rank takes part in.
    fn exchange(
        &mut self,
        plan: &ReshardPlan,
        exchange: &Exchange,
        held: &[(usize, &Tensor)],
        out: &mut [(usize, &mut Tensor)],
    ) -> Result<(), ExecError> {
        let me = self.rank();
        let elem = plan.dtype().size_in_bytes();
        let n = exchange.ranks.len();
        let sends_to = |peer: usize| exchange.sends(me, peer);
        let receives_from = |peer: usize| exchange.sends(peer, me);
        let pack = |transfers: &[&Transfer], buf: &mut Vec<u8>| pack(plan, transfers, held, buf);
        let unpack = |transfers: &[&Transfer], bytes: &[u8], out: &mut [(usize, &mut Tensor)]| {
            unpack(plan, transfers, bytes, out)
        };
        if let Some(tag) = self.messages {
            for &peer in exchange.ranks.iter().filter(|&&p| p != me) {
                let sends = sends_to(peer);
                if !sends.is_empty() {
                    let mut buf = Vec::new();
                    let bytes = packed(plan, &sends, held, &mut buf);
                    self.world.send_bytes(peer, tag, bytes)?;
                }
            }
            for &peer in exchange.ranks.iter().filter(|&&p| p != me) {
                let receives = receives_from(peer);
                if receives.is_empty() {
                    continue;
                }
                let expected: usize = receives.iter().map(|t| t.region.n_elements() * elem).sum();
                let bytes = self.world.recv_bytes(peer, tag)?;
                if bytes.len() != expected {
                    return Err(ExecError::LocalMismatch {
                        reason: format!(
                            "rank {peer} sent {} bytes under tag {tag}, the plan expects {expected}",
                            bytes.len()
                        ),
                    });
                }
                unpack(&receives, &bytes, out);
            }
            return Ok(());
        }
        let my_index = exchange
            .ranks
            .iter()
            .position(|&r| r == me)
            .expect("this rank is in the exchange");
        let ranks = exchange.ranks.clone();
        match exchange.kind {
            ExchangeKind::AllGather => {
                let mine = sends_to(ranks[(my_index + 1) % n]);
                let mut buf = Vec::new();
                let send = packed(plan, &mine, held, &mut buf);
                // Each peer's piece is unpacked from where it lies (no gathered copy).
                self.group(&ranks)?
                    .all_gather_visit(send, &mut |j, bytes| {
                        let peer = ranks[j];
                        if peer != me {
                            unpack(&receives_from(peer), bytes, out);
                        }
                    })?;
            }
            ExchangeKind::AllToAll => {
                let chunk = exchange.transfers[0].region.n_elements() * elem;
                let mut send = Vec::with_capacity(chunk * n);
                for &peer in &ranks {
                    if peer == me {
                        send.resize(send.len() + chunk, 0);
                    } else {
                        pack(&sends_to(peer), &mut send);
                    }
                }
                let mut recv = vec![0u8; chunk * n];
                self.group(&ranks)?.all_to_all_bytes(&send, &mut recv)?;
                for (j, &peer) in ranks.iter().enumerate() {
                    if peer != me {
                        unpack(&receives_from(peer), &recv[j * chunk..(j + 1) * chunk], out);
                    }
                }
            }
            ExchangeKind::PointToPoint => {
                let mut send = Vec::new();
                let mut send_counts = Vec::with_capacity(n);
                let mut recv_counts = Vec::with_capacity(n);
                for &peer in &ranks {
                    let before = send.len();
                    pack(&sends_to(peer), &mut send);
                    send_counts.push(send.len() - before);
                    recv_counts.push(
                        receives_from(peer)
                            .iter()
                            .map(|t| t.region.n_elements() * elem)
                            .sum(),
                    );
                }
                let mut recv = vec![0u8; recv_counts.iter().sum()];
                self.group(&ranks)?.all_to_all_v_bytes(
                    &send,
                    &send_counts,
                    &mut recv,
                    &recv_counts,
                )?;
                let mut pos = 0;
                for (j, &peer) in ranks.iter().enumerate() {
                    unpack(&receives_from(peer), &recv[pos..pos + recv_counts[j]], out);
                    pos += recv_counts[j];
                }
            }
        }
        Ok(())
    }
}

/// Copies the pieces of `plan` that stay on device `me` from its source slices `held` into its
/// destination slices `out` (both by slot).
pub(crate) fn copy_local(
    plan: &ReshardPlan,
    me: usize,
    held: &[(usize, &Tensor)],
    out: &mut [(usize, &mut Tensor)],
) {
    let (from, dst) = (plan.moved_from(), plan.dst());
    for t in plan.transfers_of(me).into_iter().filter(|t| t.is_local()) {
        let (_, src) = held
            .iter()
            .find(|(s, _)| *s == t.src_slot)
            .expect("a local transfer reads a slot of this device");
        let (_, dst_tensor) = out
            .iter_mut()
            .find(|(s, _)| *s == t.dst_slot)
            .expect("a local transfer writes a slot of this device");
        copy_piece(
            src,
            &from.slot_box(t.src_slot),
            dst_tensor,
            &dst.slot_box(t.dst_slot),
            &t.region,
        );
    }
}

/// The regions of `transfers` (sent by this rank) packed one after another: the source slice
/// itself when they are one whole box of it (a row-major slice is its own packing, so nothing
/// is copied), else [`pack`]ed into `buf`.
fn packed<'a>(
    plan: &ReshardPlan,
    transfers: &[&Transfer],
    held: &[(usize, &'a Tensor)],
    buf: &'a mut Vec<u8>,
) -> &'a [u8] {
    if let [t] = transfers {
        let whole = held
            .iter()
            .find(|(s, _)| *s == t.src_slot)
            .filter(|_| t.region == plan.moved_from().slot_box(t.src_slot));
        if let Some((_, src)) = whole {
            return src.as_bytes();
        }
    }
    pack(plan, transfers, held, buf);
    buf
}

/// Appends the regions of `transfers` (sent by this rank) to `buf`, one after another, each
/// packed dense, read from this rank's source slices `held` (by slot).
pub(crate) fn pack(
    plan: &ReshardPlan,
    transfers: &[&Transfer],
    held: &[(usize, &Tensor)],
    buf: &mut Vec<u8>,
) {
    let from = plan.moved_from();
    let elem = plan.dtype().size_in_bytes();
    for t in transfers {
        let (_, src) = held
            .iter()
            .find(|(s, _)| *s == t.src_slot)
            .expect("a transfer reads a slot of its sender");
        let start = buf.len();
        buf.resize(start + t.region.n_elements() * elem, 0);
        let zero = vec![0; t.region.ndim()];
        let src_box = from.slot_box(t.src_slot);
        copy_region(
            src.as_bytes(),
            Placement {
                shape: src.shape(),
                offset: &src_box.relative(&t.region).offset,
            },
            &mut buf[start..],
            Placement {
                shape: &t.region.shape,
                offset: &zero,
            },
            &t.region.shape,
            elem,
        );
    }
}

/// Writes the regions of `transfers` (received by this rank), packed one after another in
/// `bytes` as [`pack`] packs them, into this rank's destination slices `out` (by slot).
pub(crate) fn unpack(
    plan: &ReshardPlan,
    transfers: &[&Transfer],
    bytes: &[u8],
    out: &mut [(usize, &mut Tensor)],
) {
    let dst = plan.dst();
    let elem = plan.dtype().size_in_bytes();
    let mut pos = 0;
    for t in transfers {
        let len = t.region.n_elements() * elem;
        let (_, dst_tensor) = out
            .iter_mut()
            .find(|(s, _)| *s == t.dst_slot)
            .expect("a transfer writes a slot of its receiver");
        let dst_box = dst.slot_box(t.dst_slot);
        let zero = vec![0; t.region.ndim()];
        let shape = dst_tensor.shape().to_vec();
        copy_region(
            &bytes[pos..pos + len],
            Placement {
                shape: &t.region.shape,
                offset: &zero,
            },
            dst_tensor.as_bytes_mut(),
            Placement {
                shape: &shape,
                offset: &dst_box.relative(&t.region).offset,
            },
            &t.region.shape,
            elem,
        );
        pos += len;
    }
}

/// A tensor spread over ranks: its run-time layout and this rank's slices of it.
#[derive(Debug, Clone)]
pub struct DistTensor {
    layout: DistLayout,
    local: Vec<Tensor>,
}

impl DistTensor {
    /// This rank's slices (one per slot of this device, in slot order) of a tensor laid out as
    /// `layout`.
    pub fn new(layout: DistLayout, local: Vec<Tensor>) -> DistTensor {
        DistTensor { layout, local }
    }

    /// This rank's slices of `global` under `layout` (every rank slices the same global tensor;
    /// for tests and for loading data).
    pub fn from_global(
        global: &Tensor,
        layout: &TensorLayout,
        rank: usize,
    ) -> Result<DistTensor, ExecError> {
        let local = device_slots(layout, rank)
            .into_iter()
            .map(|s| global.extract_box(&layout.slot_box(s)))
            .collect::<Result<_, _>>()?;
        Ok(DistTensor {
            layout: layout.clone().into(),
            local,
        })
    }

    /// The run-time layout.
    pub fn layout(&self) -> &DistLayout {
        &self.layout
    }

    /// This rank's slices.
    pub fn local(&self) -> &[Tensor] {
        &self.local
    }

    /// Takes this rank's slices.
    pub fn into_local(self) -> Vec<Tensor> {
        self.local
    }
}

/// Moves `tensor` to `dst` (the user API): plans the move and runs this rank's part of it.
/// Every rank of the source and destination meshes calls it with the same layouts.
pub fn reshard(
    tensor: DistTensor,
    dst: &TensorLayout,
    runner: &mut ReshardRunner,
) -> Result<DistTensor, ExecError> {
    let dtype = tensor.local.first().map_or(DType::F32, |t| t.dtype());
    let plan = plan_from(&tensor.layout, dst, dtype)?;
    let local = runner.run(&plan, tensor.local)?;
    Ok(DistTensor {
        layout: dst.clone().into(),
        local,
    })
}

/// The slots of `layout`'s mesh on device `rank`, in slot order.
pub(crate) fn device_slots(layout: &TensorLayout, rank: usize) -> Vec<usize> {
    let mesh = layout.mesh();
    (0..mesh.n_slots())
        .filter(|&s| mesh.device_of_slot(s) == rank)
        .collect()
}

/// Checks that `local` holds one tensor per slot of `slots`, each of its slot's shape and `dtype`.
pub(crate) fn check_inputs(
    layout: &TensorLayout,
    slots: &[usize],
    local: &[&Tensor],
    dtype: DType,
) -> Result<(), ExecError> {
    if local.len() != slots.len() {
        return Err(ExecError::LocalMismatch {
            reason: format!(
                "this rank holds {} slots of {layout} but {} slices were given",
                slots.len(),
                local.len()
            ),
        });
    }
    for (&slot, t) in slots.iter().zip(local) {
        let shape = layout.slot_shape(slot);
        if t.shape() != shape || t.dtype() != dtype {
            return Err(ExecError::LocalMismatch {
                reason: format!(
                    "a slice of {layout} must be {:?} {dtype}, got {:?} {}",
                    shape,
                    t.shape(),
                    t.dtype()
                ),
            });
        }
    }
    Ok(())
}

/// The communicator's reduction for a pending `op`.
pub(crate) fn comm_op(op: PendingOp) -> comm::ReduceOp {
    match op {
        PendingOp::Sum => comm::ReduceOp::Sum,
        PendingOp::Max => comm::ReduceOp::Max,
    }
}

/// Refuses half-type sums (`half_sum`) of `dtype` in deterministic mode, whose canonical tree
/// adds in f32: the two orders cannot both hold.
pub(crate) fn check_half_sum(
    half_sum: HalfSum,
    dtype: DType,
    deterministic: bool,
) -> Result<(), ExecError> {
    if deterministic && half_sum.rounds_every_addition(dtype) {
        return Err(ExecError::Unsupported {
            what: format!(
                "a {dtype} sum added in the half type (gradient fp32 sync off) in \
                 deterministic mode, whose canonical tree adds in f32"
            ),
        });
    }
    Ok(())
}

/// Copies `region` (global coordinates) from a slice at `src_box` to a slice at `dst_box`.
fn copy_piece(
    src: &Tensor,
    src_box: &SliceBox,
    dst: &mut Tensor,
    dst_box: &SliceBox,
    region: &SliceBox,
) {
    let elem = src.dtype().size_in_bytes();
    let dst_shape = dst.shape().to_vec();
    copy_region(
        src.as_bytes(),
        Placement {
            shape: src.shape(),
            offset: &src_box.relative(region).offset,
        },
        dst.as_bytes_mut(),
        Placement {
            shape: &dst_shape,
            offset: &dst_box.relative(region).offset,
        },
        &region.shape,
        elem,
    );
}

/// The source slots of the pending-sum group that holds `slot`.
fn group_of(plan: &ReshardPlan, slot: usize) -> &[usize] {
    plan.reduce()
        .expect("called with a reduce step")
        .slot_groups
        .iter()
        .find(|g| g.contains(&slot))
        .expect("every slot is in one partial group")
}

/// The device ranks of the pending-sum group that holds `slot`, in slot order; an error when
/// one device holds two of its parts (an interleaved axis).
fn sum_group(plan: &ReshardPlan, slot: usize) -> Result<Vec<usize>, ExecError> {
    let mesh = plan.src().layout().mesh();
    let ranks: Vec<usize> = group_of(plan, slot)
        .iter()
        .map(|&s| mesh.device_of_slot(s))
        .collect();
    let mut unique = ranks.clone();
    unique.sort_unstable();
    unique.dedup();
    if unique.len() != ranks.len() {
        return Err(ExecError::Unsupported {
            what: format!(
                "a pending sum over an interleaved axis ({}): one device holds two of its parts",
                plan.src()
            ),
        });
    }
    Ok(ranks)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The parts as `extract_box` cuts them, concatenated: what the one pass must equal.
    fn by_boxes(tensor: &Tensor, dim: usize, n: usize) -> Tensor {
        let shape = tensor.shape().to_vec();
        let part_len = shape[dim] / n;
        let parts: Vec<Tensor> = (0..n)
            .map(|j| {
                let mut offset = vec![0; shape.len()];
                offset[dim] = j * part_len;
                let mut extent = shape.clone();
                extent[dim] = part_len;
                tensor.extract_box(&SliceBox::new(offset, extent)).unwrap()
            })
            .collect();
        Tensor::concat(&parts, 0).unwrap()
    }

    /// A `[4, 6]` layout over a mesh of 2 devices named `d`, its dims mapped as `map`.
    fn on_two(map: [&str; 2]) -> TensorLayout {
        on_two_in_order(map, None)
    }

    /// [`on_two`] with the mesh's devices in the order `ranks`.
    fn on_two_in_order(map: [&str; 2], ranks: Option<Vec<usize>>) -> TensorLayout {
        layout::Layout::new(&[2], &["d"], ranks)
            .unwrap()
            .apply(&[map[0].into(), map[1].into()])
            .unwrap()
            .bind(&[4, 6])
            .unwrap()
    }

    /// An all-reduce of each rank's whole slice into the same slice is summed in place over a
    /// handed-over slice, or in `out` after one copy; a reduce-scatter, whose destination is a
    /// part of the slice, is refused in place and takes the general path. Every rank gets the
    /// sum.
    #[test]
    fn a_whole_slice_all_reduce_is_summed_in_place() {
        let src = DistLayout::partial(on_two(["None", "None"]), &[0]).unwrap();
        for (dst, whole) in [
            (on_two(["None", "None"]), true),
            (on_two(["d", "None"]), false),
        ] {
            let plan = Arc::new(plan_from(&src, &dst, DType::F32).unwrap());
            assert_eq!(plan.is_whole_slice_all_reduce(), whole, "{dst}");
            let results = comm::LocalCluster::new(2).unwrap().run({
                let plan = plan.clone();
                move |comm| -> Result<(Vec<f32>, Vec<f32>), String> {
                    let rank = comm.rank();
                    let mut runner = ReshardRunner::new(Arc::new(comm));
                    // Rank r holds r + 1 + i at element i: the sum is 3 + 2i.
                    let values: Vec<f32> = (0..24).map(|i| (rank + 1 + i) as f32).collect();
                    let local = Tensor::from_vec(&[4, 6], values).unwrap();
                    let mut slice = local.clone();
                    let in_place = runner.all_reduce_in_place(&plan, &mut slice);
                    assert_eq!(in_place.is_ok(), whole, "{in_place:?}");
                    let mut out = vec![Tensor::zeros(DType::F32, &plan.dst().slot_shape(rank))];
                    runner
                        .run_into(&plan, &[&local], &mut out)
                        .map_err(|e| e.to_string())?;
                    let slice = slice.as_f32().unwrap().to_vec();
                    Ok((slice, out[0].as_f32().unwrap().to_vec()))
                }
            });
            for (rank, result) in results.into_iter().enumerate() {
                let (slice, got) = result.unwrap().unwrap();
                let first = if whole { 0 } else { rank * 12 };
                let want: Vec<f32> = (first..first + got.len())
                    .map(|i| (3 + 2 * i) as f32)
                    .collect();
                assert_eq!(got, want, "{dst}: rank {rank}");
                if whole {
                    assert_eq!(slice, want, "{dst}: rank {rank}, in place");
                }
            }
        }
    }

    /// A reduce-scatter whose parts are the destination's slices is summed straight into the
    /// destination, split along either dim: its parts read where they lie, or, summed in the
    /// half type, packed into the runner's kept space when they interleave (the space reused by
    /// the next run). Every rank gets its part of the sum on both runs; the same split with the
    /// devices reversed is refused.
    #[test]
    fn a_reduce_scatter_into_its_destination_is_summed_there() {
        let src = DistLayout::partial(on_two(["None", "None"]), &[0]).unwrap();
        for (map, interleaved) in [(["None", "d"], true), (["d", "None"], false)] {
            let dst = on_two(map);
            // The same split with the devices' order reversed: each rank's sum is the other's
            // part, so it moves after the sum.
            let swapped = on_two_in_order(map, Some(vec![1, 0]));
            let moved = plan_from(&src, &swapped, DType::F32).unwrap();
            assert!(
                (0..2).all(|r| !moved.is_whole_slice_reduce_on(r)),
                "{swapped}"
            );
            for (dtype, half_sum) in [
                (DType::F32, HalfSum::AccumulateInF32),
                (DType::BF16, HalfSum::InHalfType),
            ] {
                let plan = Arc::new(plan_from(&src, &dst, dtype).unwrap());
                assert_eq!(plan.collective_on(0), "reduce-scatter", "{dst}");
                assert!((0..2).all(|r| plan.is_whole_slice_reduce_on(r)), "{dst}");
                let results = comm::LocalCluster::new(2).unwrap().run({
                    let plan = plan.clone();
                    move |comm| -> Result<Vec<(Vec<f64>, bool)>, String> {
                        let rank = comm.rank();
                        let mut runner = ReshardRunner::new(Arc::new(comm));
                        runner.set_half_sum(half_sum);
                        let mut runs = Vec::new();
                        // Rank r holds (r + 1)·base + i at element i: the sum is 3·base + 2i
                        // (whole numbers below 256, exact in bf16).
                        for base in [1, 10] {
                            let values: Vec<f64> =
                                (0..24).map(|i| ((rank + 1) * base + i) as f64).collect();
                            let local = Tensor::from_vec(&[4, 6], values).unwrap().to_dtype(dtype);
                            let shape = plan.dst().slot_shape(rank);
                            let mut out = vec![Tensor::from_vec(&shape, vec![f64::NAN; 12])
                                .unwrap()
                                .to_dtype(dtype)];
                            runner
                                .run_into(&plan, &[&local], &mut out)
                                .map_err(|e| e.to_string())?;
                            runs.push((out[0].to_f64_vec(), runner.space.pack.is_some()));
                        }
                        Ok(runs)
                    }
                });
                for (rank, result) in results.into_iter().enumerate() {
                    let runs = result.unwrap().unwrap();
                    for ((got, packed), base) in runs.into_iter().zip([1, 10]) {
                        // The global index of local element `e`.
                        let global = |e: usize| match interleaved {
                            true => (e / 3) * 6 + rank * 3 + e % 3,
                            false => rank * 12 + e,
                        };
                        let want: Vec<f64> =
                            (0..12).map(|e| (3 * base + 2 * global(e)) as f64).collect();
                        let what = format!("{dst} {dtype}: rank {rank}, base {base}");
                        assert_eq!(got, want, "{what}");
                        assert_eq!(packed, interleaved && dtype == DType::BF16, "{what}");
                    }
                }
            }
        }
    }

    /// A rank's whole slice is sent as it is (no copy); part of it is packed.
    #[test]
    fn a_whole_slice_is_its_own_packing() {
        let src = on_two(["d", "None"]);
        let slice = Tensor::from_vec(&[2, 6], (0..12).map(|i| i as f32).collect()).unwrap();
        let held = [(0, &slice)];
        // Gathered whole: rank 0 sends rank 1 its whole slice.
        for (dst, whole) in [
            (on_two(["None", "None"]), true),
            (on_two(["None", "d"]), false),
        ] {
            let plan = plan_from(&src.clone().into(), &dst, DType::F32).unwrap();
            let sends = plan.transfers_of(0);
            let to_peer: Vec<&Transfer> = sends.iter().filter(|t| t.dst_rank == 1).collect();
            let mut buf = Vec::new();
            let bytes = packed(&plan, &to_peer, &held, &mut buf);
            assert_eq!(
                std::ptr::eq(bytes.as_ptr(), slice.as_bytes().as_ptr()),
                whole,
                "{dst}"
            );
            let mut want = Vec::new();
            pack(&plan, &to_peer, &held, &mut want);
            assert_eq!(bytes, &want[..], "{dst}");
        }
    }

    #[test]
    fn parts_one_after_another_are_the_boxes_in_member_order() {
        let cases: [(&[usize], usize, usize); 5] = [
            (&[4, 6, 8], 1, 2),
            (&[4, 6, 8], 2, 4),
            (&[3, 5, 6, 2], 2, 3),
            (&[2, 9], 1, 3),
            (&[7, 1, 4], 2, 2),
        ];
        for (shape, dim, n) in cases {
            let len: usize = shape.iter().product();
            for dtype in [DType::F32, DType::F64, DType::BF16] {
                let values: Vec<f64> = (0..len).map(|i| i as f64).collect();
                let tensor = Tensor::from_vec(shape, values).unwrap().to_dtype(dtype);
                // Into longer space than it needs, whose tail it leaves alone.
                let bytes = tensor.as_bytes().len();
                let mut packed = vec![0xA5u8; bytes + 8];
                let rows = shape[..dim].iter().product();
                comm::parts_one_after_another(tensor.as_bytes(), (rows, n), &mut packed);
                let want = by_boxes(&tensor, dim, n);
                assert_eq!(
                    &packed[..bytes],
                    want.as_bytes(),
                    "{shape:?} dim {dim} / {n}, {dtype:?}"
                );
                assert!(packed[bytes..].iter().all(|&b| b == 0xA5));
            }
        }
    }
}
