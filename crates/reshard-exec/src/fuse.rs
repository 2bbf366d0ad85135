//! Communication fusion, the executing side: several reductions that each resolve a pending sum
//! over the same groups of ranks, and move nothing after it (one [`reshard::FusionKey`]), run as
//! one collective over their concatenated buffers — one all-reduce (or one reduce-scatter) per
//! bucket instead of one per tensor.
//!
//! The sums are the same sums: each element is still the sum over the same ranks (with
//! deterministic mode, in the same canonical tree, so fused and unfused give the same bits).

use comm::{Buf, BufMut};
use layout::SliceBox;
use reshard::{fusion_key, HalfSum, PendingOp, ReduceKind, ReshardPlan};
use tensor::{DType, Tensor};

use crate::error::ExecError;
use crate::execute::{check_half_sum, comm_op, ReshardRunner};

/// Box `j` of `n` equal parts of a tensor of `shape` along `dim`.
fn part_box(shape: &[usize], dim: usize, n: usize, j: usize) -> SliceBox {
    let len = shape[dim] / n;
    let mut offset = vec![0; shape.len()];
    offset[dim] = j * len;
    let mut extent = shape.to_vec();
    extent[dim] = len;
    SliceBox::new(offset, extent)
}

/// A fused reduction packed on one rank, ready to run (possibly on another thread, with
/// another [`ReshardRunner`] over the same ranks) and then to unpack into the destinations.
#[derive(Debug)]
pub struct PackedReduction {
    /// The ranks reducing together, in the order the collective takes them.
    group: Vec<usize>,
    /// The reduction.
    op: PendingOp,
    /// Deterministic mode's canonical tree (an all-reduce, parts kept after).
    deterministic: bool,
    /// Half-precision values added in the half type, every partial sum rounded
    /// ([`HalfSum::InHalfType`]).
    in_element_type: bool,
    /// Reduce-scatter counts per member (elements), when run as a reduce-scatter.
    counts: Option<Vec<usize>>,
    /// The concatenated sources; after [`ReshardRunner::reduce_packed`], the result.
    data: Tensor,
    /// Each destination's part of its summed slice (the whole slice for an all-reduce), and
    /// the slice's shape, in plan order.
    parts: Vec<(SliceBox, Vec<usize>)>,
    /// A reduce-scatter's result holds the parts alone.
    scattered: bool,
    /// The bytes packed (the reduction's input).
    packed_bytes: usize,
}

/// A packed reduction started by [`ReshardRunner::start_packed`], in flight.
#[derive(Debug)]
pub struct StartedReduction {
    packed: PackedReduction,
    pending: comm::PendingCollective,
}

impl StartedReduction {
    /// Advances the reduction (a backend that progresses only inside its calls needs this);
    /// whether it has completed.
    pub fn test(&mut self) -> Result<bool, ExecError> {
        Ok(self.pending.test()?)
    }

    /// Whether it runs in the background rather than having completed when started.
    pub fn is_background(&self) -> bool {
        self.pending.is_background()
    }
}

impl PackedReduction {
    /// The data, leaving an empty tensor of its type in its place.
    fn take_data(&mut self) -> Tensor {
        let empty = Tensor::zeros(self.data.dtype(), &[0]);
        std::mem::replace(&mut self.data, empty)
    }

    /// Packs `plans` (each a fusable reduction with one [`reshard::fusion_key`]) for `rank`: `local[i]`
    /// is its source slice of plan `i`. `None` when the rank is outside the plans' meshes. The
    /// sum runs in deterministic mode's canonical tree when `deterministic`, and adds half
    /// values as `half_sum` says.
    ///
    /// `spare`, a tensor of the sources' type with as many elements as they hold together (an
    /// earlier bucket's [`PackedReduction::into_data`]), takes the packed values in place of a
    /// freshly allocated one; any other `spare` is dropped.
    pub fn pack(
        plans: &[&ReshardPlan],
        local: &[&Tensor],
        rank: usize,
        (deterministic, half_sum): (bool, HalfSum),
        spare: Option<Tensor>,
    ) -> Result<Option<PackedReduction>, ExecError> {
        let Some(first) = plans.first() else {
            return Ok(None);
        };
        let key = fusion_key(first).ok_or_else(|| ExecError::Unsupported {
            what: "fusing a reshard that is not a reduction alone".to_string(),
        })?;
        if plans.iter().any(|p| fusion_key(p).as_ref() != Some(&key)) {
            return Err(ExecError::Unsupported {
                what: "fusing reductions over different groups, ops or types".to_string(),
            });
        }
        let Some(g) = key.groups.iter().position(|g| g.contains(&rank)) else {
            return Ok(None);
        };
        if local.len() != plans.len() {
            return Err(ExecError::LocalMismatch {
                reason: format!("{} fused plans with {} sources", plans.len(), local.len()),
            });
        }
        let deterministic = deterministic && key.op == PendingOp::Sum;
        check_half_sum(half_sum, key.dtype, deterministic)?;
        let members = &key.groups[g];
        let n = members.len();
        let j = members
            .iter()
            .position(|&r| r == rank)
            .expect("the rank is in its group");
        let parts = plans
            .iter()
            .zip(local)
            .map(|(plan, t)| {
                let part = match key.scatter {
                    true => part_box(t.shape(), scatter_dim(plan), n, j),
                    false => SliceBox::new(vec![0; t.shape().len()], t.shape().to_vec()),
                };
                (part, t.shape().to_vec())
            })
            .collect();
        if let Some(t) = local.iter().find(|t| t.dtype() != key.dtype) {
            return Err(ExecError::LocalMismatch {
                reason: format!(
                    "a fused {:?} reduction given a {:?} source",
                    key.dtype,
                    t.dtype()
                ),
            });
        }
        let total: usize = local.iter().map(|t| t.n_elements()).sum();
        let mut data = spare
            .filter(|t| t.dtype() == key.dtype && t.n_elements() == total)
            .and_then(|t| t.reshape(&[total]).ok())
            .unwrap_or_else(|| Tensor::zeros(key.dtype, &[total]));
        let width = key.dtype.size_in_bytes();
        let counts = if key.scatter && !deterministic {
            // Member k's parts of every plan, one after another, then member k + 1's.
            let mut send = Vec::with_capacity(total * width);
            let mut counts = Vec::with_capacity(n);
            for k in 0..n {
                let before = send.len();
                for (plan, t) in plans.iter().zip(local) {
                    let part = part_box(t.shape(), scatter_dim(plan), n, k);
                    send.extend_from_slice(t.extract_box(&part)?.as_bytes());
                }
                counts.push((send.len() - before) / width);
            }
            data.as_bytes_mut().copy_from_slice(&send);
            Some(counts)
        } else {
            // One copy of each source into its place.
            let mut rest = data.as_bytes_mut();
            for t in local {
                let (into, after) = rest.split_at_mut(t.as_bytes().len());
                into.copy_from_slice(t.as_bytes());
                rest = after;
            }
            None
        };
        if half_sum.widens(key.dtype) {
            data = data.to_dtype(DType::F32);
        }
        let packed_bytes = data.as_bytes().len();
        Ok(Some(PackedReduction {
            group: match deterministic {
                true => key.canonical[g].clone(),
                false => members.clone(),
            },
            op: key.op,
            deterministic,
            in_element_type: half_sum.rounds_every_addition(key.dtype),
            counts,
            data,
            parts,
            scattered: key.scatter && !deterministic,
            packed_bytes,
        }))
    }

    /// The ranks reducing together (the group a runner needs).
    pub fn group(&self) -> &[usize] {
        &self.group
    }

    /// The bytes packed: what the reduction takes in (its result may be smaller).
    pub fn bytes(&self) -> usize {
        self.packed_bytes
    }

    /// The packed values (after the reduction, its result), for the next bucket's `spare`.
    pub fn into_data(self) -> Tensor {
        self.data
    }

    /// Writes the reduced result into `out` (this rank's destination slice of each plan,
    /// allocated; every element overwritten).
    pub fn unpack(&self, out: &mut [&mut Tensor]) -> Result<(), ExecError> {
        if out.len() != self.parts.len() {
            return Err(ExecError::LocalMismatch {
                reason: format!(
                    "{} fused plans with {} destinations",
                    self.parts.len(),
                    out.len()
                ),
            });
        }
        let dtype = self.data.dtype();
        let width = dtype.size_in_bytes();
        let data = self.data.as_bytes();
        let mut at = 0;
        for (o, (part, shape)) in out.iter_mut().zip(&self.parts) {
            let whole = match self.scattered {
                true => &part.shape[..],
                false => &shape[..],
            };
            let len = whole.iter().product::<usize>() * width;
            let bytes = &data[at..at + len];
            at += len;
            if o.dtype() == dtype && o.as_bytes().len() == len && whole == &part.shape[..] {
                // The destination is the whole summed slice, in the type summed: one copy.
                o.as_bytes_mut().copy_from_slice(bytes);
                continue;
            }
            let summed = Tensor::from_bytes(dtype, whole, bytes)?;
            let mine = match summed.shape() == part.shape.as_slice() {
                true => summed,
                false => summed.extract_box(part)?,
            };
            if mine.shape() != o.shape() {
                return Err(ExecError::LocalMismatch {
                    reason: format!(
                        "a fused reduction's part of shape {:?} for a destination of shape {:?}",
                        mine.shape(),
                        o.shape()
                    ),
                });
            }
            // Rounded back when the sum ran wider than the destination.
            let mine = mine.to_dtype(o.dtype());
            o.as_bytes_mut().copy_from_slice(mine.as_bytes());
        }
        Ok(())
    }
}

impl ReshardRunner {
    /// Runs a packed reduction's collective over its group.
    pub fn reduce_packed(&mut self, packed: &mut PackedReduction) -> Result<(), ExecError> {
        let op = comm_op(packed.op);
        let group = self.group(&packed.group)?;
        match &packed.counts {
            Some(counts) => {
                // The group communicator numbers its members in the group's order.
                let mut mine = Tensor::zeros(packed.data.dtype(), &[counts[group.rank()]]);
                let (send, recv) = (
                    Buf::from_tensor(&packed.data),
                    BufMut::from_tensor(&mut mine),
                );
                match packed.in_element_type {
                    true => group.reduce_scatter_in_element_type_v(send, recv, counts, op)?,
                    false => group.reduce_scatter_v(send, recv, counts, op)?,
                }
                packed.data = mine;
            }
            None if packed.deterministic => group.all_reduce_deterministic(&mut packed.data, op)?,
            None if packed.in_element_type => {
                group.all_reduce_in_element_type(&mut packed.data, op)?
            }
            None => group.all_reduce(&mut packed.data, op)?,
        }
        Ok(())
    }

    /// Starts [`ReshardRunner::reduce_packed`] so that it can run while the caller computes:
    /// an all-reduce or a reduce-scatter starts on the group's communicator
    /// ([`comm::Communicator::start_all_reduce`], [`comm::Communicator::start_reduce_scatter_v`]);
    /// a deterministic all-reduce (the canonical tree) and a sum in the half type (the fold in
    /// member order) run now. Finish with [`ReshardRunner::finish_packed`].
    pub fn start_packed(
        &mut self,
        mut packed: PackedReduction,
    ) -> Result<StartedReduction, ExecError> {
        if packed.deterministic || packed.in_element_type {
            self.reduce_packed(&mut packed)?;
            let data = packed.take_data();
            return Ok(StartedReduction {
                packed,
                pending: comm::PendingCollective::done(data),
            });
        }
        let op = comm_op(packed.op);
        let group = self.group(&packed.group)?;
        let data = packed.take_data();
        let pending = match &packed.counts {
            Some(counts) => group.start_reduce_scatter_v(data, counts, op)?,
            None => group.start_all_reduce(data, op)?,
        };
        Ok(StartedReduction { packed, pending })
    }

    /// Waits for a [`ReshardRunner::start_packed`] reduction: the packed result, as
    /// [`ReshardRunner::reduce_packed`] leaves it.
    pub fn finish_packed(
        &mut self,
        started: StartedReduction,
    ) -> Result<PackedReduction, ExecError> {
        let StartedReduction {
            mut packed,
            pending,
        } = started;
        packed.data = pending.wait()?;
        Ok(packed)
    }

    /// Runs `plans` (each a fusable reduction with one [`reshard::fusion_key`]) as one collective:
    /// `local[i]` is this rank's source slice of plan `i`, `out[i]` its destination slice
    /// (allocated, every element overwritten). A rank outside the plans' meshes does nothing.
    pub fn run_fused(
        &mut self,
        plans: &[&ReshardPlan],
        local: &[&Tensor],
        out: &mut [&mut Tensor],
    ) -> Result<(), ExecError> {
        let modes = (self.is_deterministic(), self.half_sum());
        if let Some(mut packed) = PackedReduction::pack(plans, local, self.rank(), modes, None)? {
            self.reduce_packed(&mut packed)?;
            packed.unpack(out)?;
        }
        Ok(())
    }
}

/// The dim a reduce-scatter plan leaves split (0 for an all-reduce).
fn scatter_dim(plan: &ReshardPlan) -> usize {
    match &plan.reduce().expect("a reduction").kind {
        ReduceKind::ReduceScatter { dim } => *dim,
        ReduceKind::AllReduce => 0,
    }
}
