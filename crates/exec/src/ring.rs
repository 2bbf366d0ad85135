//! Ring attention (context parallel, `parallel.context_parallel_algo = "ring"`): a
//! `FlashAttention` (or its gradient) whose sequence dim is split over a ring of ranks.
//!
//! Every member holds one block of the queries and one block of the keys and values (the same
//! positions). Under the causal mask the ring attends in the zigzag placement
//! ([`parallel::ring::Zigzag`]) when the blocks have one even length: the sequence is cut into
//! `2n` chunks and member `i` attends with chunks `i` and `2n − 1 − i` (moved there from their
//! owners before the passes, and the results moved back after), so every member does the same
//! work at every pass; otherwise each member attends with its own block.
//!
//! Forward: the key/value chunks travel around the ring — each member sends the chunks it holds
//! to the next member, attends its query chunks to them (an [`tensor::kernels::AttentionState`]
//! per query chunk accumulates them with the online softmax, the causal mask given by global
//! positions, and pairs the mask hides wholly are skipped), and receives the next member's
//! chunks from the previous one; after `n − 1` passes every query has seen every key, and no
//! member ever holds more than two sets of chunks. The sends are posted before the computation,
//! so the pass overlaps it. Backward: the chunks travel the same way with their `dk`/`dv`
//! accumulators; each member adds its queries' contribution to the chunks it holds, and `dq`
//! stays home. After `n` passes every accumulator is back with the member holding its chunk.
//!
//! The members of a ring are the ranks holding the same batch/heads block in the same replica,
//! ordered by their sequence block ([`Ring::of`]). Chunks are attended in arrival order (own
//! first), so the result equals one device's to rounding, not bitwise. In deterministic mode
//! (`RingAttention::canonical`) the passes gather the operands whole instead and each rank
//! calls one device's kernel (its queries against all keys; backward also all queries against
//! its keys), which is bitwise one device's.

use std::cell::{Cell, RefCell};
use std::time::{Duration, Instant};

use comm::{Communicator, Tag, MAX_TAG};
use layout::TensorLayout;
use parallel::ring::Zigzag;
use tensor::kernels::{
    attention_backward_block, attention_delta_into, flash_attention_into, AttentionDims,
    AttentionGradBuffers, AttentionParams, AttentionState, BlockGradInputs, Float,
};
use tensor::region::{copy_region, Placement as RegionAt};
use tensor::{DType, Element, Tensor};

use crate::error::ExecError;

/// One rank's ring: the members in sequence order, where their blocks start and how long
/// they are, and this rank's place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ring {
    /// Device ranks, by sequence block.
    pub members: Vec<usize>,
    /// Global position of each member's first row.
    pub offsets: Vec<usize>,
    /// Rows of each member's block.
    pub lengths: Vec<usize>,
    /// This rank's index in `members`.
    pub position: usize,
}

impl Ring {
    /// The ring of `rank` for attention operands laid out as `layout` (`[..., seq, head_dim]`),
    /// or `None` when the sequence dim is not split (or `rank` holds no block).
    pub fn of(layout: &TensorLayout, rank: usize) -> Option<Ring> {
        let ndim = layout.shape().len();
        let seq = ndim.checked_sub(2)?;
        if layout.split_factors()[seq] <= 1 {
            return None;
        }
        let mesh = layout.mesh();
        let mine = mesh.slot_of_rank(rank)?;
        let (block, replica) = (layout.block_index(mine), layout.replica_index(mine));
        let mut members: Vec<(usize, usize, usize, usize)> = (0..mesh.n_slots())
            .filter(|&s| layout.replica_index(s) == replica)
            .filter_map(|s| {
                let b = layout.block_index(s);
                let same_rest = (0..ndim).all(|d| d == seq || b[d] == block[d]);
                let slot_box = layout.slot_box(s);
                same_rest.then(|| {
                    (
                        b[seq],
                        mesh.device_of_slot(s),
                        slot_box.offset[seq],
                        slot_box.shape[seq],
                    )
                })
            })
            .collect();
        members.sort();
        let position = members.iter().position(|m| m.0 == block[seq])?;
        Some(Ring {
            members: members.iter().map(|m| m.1).collect(),
            offsets: members.iter().map(|m| m.2).collect(),
            lengths: members.iter().map(|m| m.3).collect(),
            position,
        })
    }

    fn n(&self) -> usize {
        self.members.len()
    }

    /// The member whose block this rank holds after `t` passes.
    fn held_after(&self, t: usize) -> usize {
        (self.position + self.n() - t % self.n()) % self.n()
    }
}

/// The message tag of the ring run by step `step`.
pub(crate) fn ring_tag(step: usize) -> Result<Tag, ExecError> {
    Tag::try_from(step)
        .ok()
        .filter(|&t| t <= MAX_TAG)
        .ok_or_else(|| ExecError::Mismatch {
            what: "a ring attention step".to_string(),
            expected: format!("a step index of at most {MAX_TAG} (one message tag per step)"),
            got: step.to_string(),
        })
}

/// A run of consecutive sequence positions attended as one: its global position and rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Chunk {
    offset: usize,
    len: usize,
}

/// Where the ring's attention happens: each member's own contiguous block, or the zigzag
/// placement ([`parallel::ring::Zigzag`]) that balances the causal mask's work.
struct Placement {
    zigzag: Option<Zigzag>,
    /// Rows of a zigzag chunk (half a block).
    chunk_rows: usize,
}

impl Placement {
    fn of(ring: &Ring, causal: bool) -> Placement {
        let zigzag = Zigzag::of(causal, &ring.lengths);
        Placement {
            zigzag,
            chunk_rows: ring.lengths[0] / 2,
        }
    }

    /// The chunks member `j` attends (queries) and holds (keys and values), in sequence order.
    fn chunks(&self, ring: &Ring, j: usize) -> Vec<Chunk> {
        match self.zigzag {
            Some(z) => z
                .held(j)
                .iter()
                .map(|&x| Chunk {
                    offset: ring.offsets[0] + x * self.chunk_rows,
                    len: self.chunk_rows,
                })
                .collect(),
            None => vec![Chunk {
                offset: ring.offsets[j],
                len: ring.lengths[j],
            }],
        }
    }
}

/// The attention call's sizes and mask.
struct Call {
    slices: usize,
    head_dim: usize,
    causal: bool,
    scale: f64,
}

impl Call {
    fn of(q: &Tensor, causal: bool, scale: f64) -> Result<Call, ExecError> {
        let shape = q.shape();
        if shape.len() < 2 {
            return Err(ExecError::Mismatch {
                what: "ring attention's q".to_string(),
                expected: "at least 2 dims ([..., seq, head_dim])".to_string(),
                got: format!("{shape:?}"),
            });
        }
        let r = shape.len();
        Ok(Call {
            slices: shape[..r - 2].iter().product(),
            head_dim: shape[r - 1],
            causal,
            scale,
        })
    }

    fn dims(&self, q: Chunk, kv: Chunk) -> AttentionDims {
        AttentionDims {
            slices: self.slices,
            q_len: q.len,
            kv_len: kv.len,
            head_dim: self.head_dim,
        }
    }

    fn params<T: Float>(&self, q: Chunk, kv: Chunk) -> AttentionParams<T> {
        AttentionParams {
            causal: self.causal,
            scale: T::from_f64(self.scale),
            q_offset: q.offset,
            k_offset: kv.offset,
        }
    }

    /// The operands' row shapes: `head_dim`-wide (q, k, v, out and their gradients) and
    /// one-wide (lse, delta).
    fn rows(&self) -> (Rows, Rows) {
        let wide = Rows {
            slices: self.slices,
            width: self.head_dim,
        };
        (wide, Rows { width: 1, ..wide })
    }

    /// FlashAttention-2's `delta` of every query row (see [`attention_delta_into`]).
    fn delta<T: Element + Float>(&self, out: &Tensor, dout: &Tensor) -> Result<Vec<T>, ExecError> {
        let dout = dout.as_slice::<T>()?;
        let mut delta = vec![T::ZERO; dout.len() / self.head_dim.max(1)];
        attention_delta_into(out.as_slice::<T>()?, dout, self.head_dim, &mut delta)?;
        Ok(delta)
    }

    /// Elements of a chunk's keys (or values, or queries).
    fn rows_len(&self, chunk: Chunk) -> usize {
        self.slices * chunk.len * self.head_dim
    }

    /// Whether any query of chunk `q` sees a key of chunk `kv`.
    fn sees(&self, q: Chunk, kv: Chunk) -> bool {
        !self.causal || kv.offset < q.offset + q.len
    }
}

fn unsupported(dtype: DType) -> ExecError {
    ExecError::Mismatch {
        what: "ring attention's operands".to_string(),
        expected: "f32 or f64 (mixed precision computes attention in f32)".to_string(),
        got: format!("{dtype:?}"),
    }
}

/// One span of a ring step on this rank: attending (`wait == false`) or waiting for a
/// message, during pass `pass` (0 = the rank's own keys; the moves to and from the zigzag
/// placement count as the first and last pass's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingSpan {
    /// The pass.
    pub pass: usize,
    /// Waiting for a message rather than attending.
    pub wait: bool,
    /// When it started.
    pub from: Instant,
    /// When it ended.
    pub to: Instant,
}

/// What a ring step reports: the time it waited for messages and its spans.
#[derive(Debug, Clone, Default)]
pub struct RingTiming {
    /// Time blocked in receives.
    pub waited: Duration,
    /// Attending and waiting, in order.
    pub spans: Vec<RingSpan>,
}

/// This rank's ring, the step's message tag, the pass under way, and the time spent waiting
/// for blocks.
struct Link<'a> {
    comm: &'a dyn Communicator,
    ring: &'a Ring,
    tag: Tag,
    pass: Cell<usize>,
    timing: RefCell<RingTiming>,
}

impl<'a> Link<'a> {
    fn of(comm: &'a dyn Communicator, ring: &'a Ring, tag: Tag) -> Link<'a> {
        Link {
            comm,
            ring,
            tag,
            pass: Cell::new(0),
            timing: RefCell::new(RingTiming::default()),
        }
    }

    /// Records a span of the pass under way.
    fn record(&self, wait: bool, from: Instant) {
        let to = Instant::now();
        let mut timing = self.timing.borrow_mut();
        if wait {
            timing.waited += to - from;
        }
        timing.spans.push(RingSpan {
            pass: self.pass.get(),
            wait,
            from,
            to,
        });
    }

    /// Runs `attend` as the pass under way's attention.
    fn attend<R>(&self, attend: impl FnOnce() -> R) -> R {
        let from = Instant::now();
        let result = attend();
        self.record(false, from);
        result
    }

    /// What the step reports.
    fn into_timing(self) -> RingTiming {
        self.timing.into_inner()
    }

    /// Sends `block` to member `member` (posted, not waited for).
    fn send_to<T: Element>(&self, member: usize, block: &[T]) -> Result<(), ExecError> {
        self.comm.send_bytes(
            self.ring.members[member],
            self.tag,
            bytemuck::cast_slice(block),
        )?;
        Ok(())
    }

    /// Receives the next message from member `member`: `count` elements of `T`.
    fn receive_from<T: Element>(&self, member: usize, count: usize) -> Result<Vec<T>, ExecError> {
        let from = self.ring.members[member];
        let started = Instant::now();
        let bytes = self.comm.recv_bytes(from, self.tag)?;
        self.record(true, started);
        let expected = count * std::mem::size_of::<T>();
        if bytes.len() != expected {
            return Err(ExecError::Mismatch {
                what: format!("a ring attention message from rank {from}"),
                expected: format!("{expected} bytes"),
                got: format!("{} bytes", bytes.len()),
            });
        }
        Ok(bytemuck::pod_collect_to_vec(&bytes))
    }

    /// Sends each of `blocks` to the next member, one message each.
    fn pass_on<T: Element>(&self, blocks: &[Vec<T>]) -> Result<(), ExecError> {
        let next = (self.ring.position + 1) % self.ring.n();
        blocks.iter().try_for_each(|b| self.send_to(next, b))
    }

    /// Receives one message of `count` elements from the previous member per entry of `counts`.
    fn receive<T: Element>(&self, counts: &[usize]) -> Result<Vec<Vec<T>>, ExecError> {
        let prev = (self.ring.position + self.ring.n() - 1) % self.ring.n();
        counts
            .iter()
            .map(|&count| self.receive_from(prev, count))
            .collect()
    }
}

/// Operands of `slices` slices of `rows` rows of `width` elements (`[..., rows, width]`).
#[derive(Clone, Copy)]
struct Rows {
    slices: usize,
    width: usize,
}

impl Rows {
    /// Rows `from .. from + len` of every slice of `data` (whose slices have `rows` rows).
    fn take<T: Element>(self, data: &[T], rows: usize, from: usize, len: usize) -> Vec<T> {
        let mut part = vec![T::zeroed(); self.slices * len * self.width];
        self.copy(data, (rows, from), &mut part, (len, 0), len);
        part
    }

    /// Writes `part` into rows `from ..` of every slice of `data`.
    fn put<T: Element>(self, data: &mut [T], rows: usize, from: usize, part: &[T]) {
        let len = part.len() / (self.slices * self.width).max(1);
        self.copy(part, (len, 0), data, (rows, from), len);
    }

    /// Copies `len` rows of every slice from `src` (slices of `src_rows` rows, from row
    /// `src_from`) to `dst` (slices of `dst_rows` rows, from row `dst_from`), by the box copy
    /// every slicing goes through.
    fn copy<T: Element>(
        self,
        src: &[T],
        (src_rows, src_from): (usize, usize),
        dst: &mut [T],
        (dst_rows, dst_from): (usize, usize),
        len: usize,
    ) {
        copy_region(
            bytemuck::cast_slice(src),
            RegionAt {
                shape: &[self.slices, src_rows, self.width],
                offset: &[0, src_from, 0],
            },
            bytemuck::cast_slice_mut(dst),
            RegionAt {
                shape: &[self.slices, dst_rows, self.width],
                offset: &[0, dst_from, 0],
            },
            &[self.slices, len, self.width],
            std::mem::size_of::<T>(),
        );
    }
}

/// This rank's operand `data` (its contiguous block) as the chunks it attends with: moved to
/// the zigzag placement, or the block itself.
fn to_placement<T: Element>(
    link: &Link<'_>,
    placement: &Placement,
    rows: Rows,
    data: &[T],
) -> Result<Vec<Vec<T>>, ExecError> {
    let Some(z) = placement.zigzag else {
        return Ok(vec![data.to_vec()]);
    };
    let (me, c) = (link.ring.position, placement.chunk_rows);
    let mut kept = Vec::new();
    for half in 0..2 {
        let x = 2 * me + half;
        let part = rows.take(data, 2 * c, half * c, c);
        match z.holder(x) {
            h if h == me => kept.push((x, part)),
            h => link.send_to(h, &part)?,
        }
    }
    z.held(me)
        .iter()
        .map(|&x| match kept.iter().position(|(y, _)| *y == x) {
            Some(i) => Ok(kept.swap_remove(i).1),
            None => link.receive_from(Zigzag::owner(x), rows.slices * c * rows.width),
        })
        .collect()
}

/// The inverse of [`to_placement`]: the chunks this rank attended with go back to their
/// owners, and `out` (this rank's contiguous block) receives its own.
fn from_placement<T: Element>(
    link: &Link<'_>,
    placement: &Placement,
    rows: Rows,
    chunks: Vec<Vec<T>>,
    out: &mut [T],
) -> Result<(), ExecError> {
    let Some(z) = placement.zigzag else {
        let whole = chunks.into_iter().next().unwrap_or_default();
        out.copy_from_slice(&whole);
        return Ok(());
    };
    let (me, c) = (link.ring.position, placement.chunk_rows);
    for (x, part) in z.held(me).into_iter().zip(chunks) {
        match Zigzag::owner(x) {
            o if o == me => rows.put(out, 2 * c, (x % 2) * c, &part),
            o => link.send_to(o, &part)?,
        }
    }
    for half in 0..2 {
        let x = 2 * me + half;
        let h = z.holder(x);
        if h != me {
            let part = link.receive_from(h, rows.slices * c * rows.width)?;
            rows.put(out, 2 * c, half * c, &part);
        }
    }
    Ok(())
}

/// How a ring step attends: its mask and scale, and whether in deterministic mode's canonical
/// order (the operands gathered whole and attended as one device does).
#[derive(Debug, Clone, Copy)]
pub(crate) struct RingAttention {
    /// The causal mask.
    pub causal: bool,
    /// The scores' factor.
    pub scale: f64,
    /// Deterministic mode: one device's order.
    pub canonical: bool,
}

/// Ring attention's forward: `out` and `lse` of this rank's queries over every member's keys;
/// the time spent waiting for blocks.
pub(crate) fn forward(
    comm: &dyn Communicator,
    ring: &Ring,
    tag: Tag,
    how: RingAttention,
    (q, k, v): (&Tensor, &Tensor, &Tensor),
    (out, lse): (&mut Tensor, &mut Tensor),
) -> Result<RingTiming, ExecError> {
    let call = Call::of(q, how.causal, how.scale)?;
    let link = Link::of(comm, ring, tag);
    match (q.dtype(), how.canonical) {
        (DType::F32, true) => forward_canonical::<f32>(&link, &call, (q, k, v), (out, lse))?,
        (DType::F64, true) => forward_canonical::<f64>(&link, &call, (q, k, v), (out, lse))?,
        (DType::F32, false) => forward_typed::<f32>(&link, &call, (q, k, v), (out, lse))?,
        (DType::F64, false) => forward_typed::<f64>(&link, &call, (q, k, v), (out, lse))?,
        (other, _) => return Err(unsupported(other)),
    }
    Ok(link.into_timing())
}

fn forward_typed<T: Element + Float>(
    link: &Link<'_>,
    call: &Call,
    (q, k, v): (&Tensor, &Tensor, &Tensor),
    (out, lse): (&mut Tensor, &mut Tensor),
) -> Result<(), ExecError> {
    let ring = link.ring;
    let placement = Placement::of(ring, call.causal);
    let (wide, narrow) = call.rows();
    let place = |t: &Tensor| to_placement(link, &placement, wide, t.as_slice::<T>()?);
    let (qs, ks, vs) = (place(q)?, place(k)?, place(v)?);
    let mine = placement.chunks(ring, ring.position);
    let mut states = mine
        .iter()
        .map(|c| AttentionState::<T>::new(call.slices, c.len, call.head_dim))
        .collect::<Result<Vec<_>, _>>()?;
    let mut held = (ks, vs);
    let n = ring.n();
    for t in 0..n {
        link.pass.set(t);
        let theirs = placement.chunks(ring, ring.held_after(t));
        if t + 1 < n {
            link.pass_on(&held.0)?;
            link.pass_on(&held.1)?;
        }
        link.attend(|| -> Result<(), ExecError> {
            for (a, &qc) in mine.iter().enumerate() {
                for (b, &kc) in theirs.iter().enumerate() {
                    if call.sees(qc, kc) {
                        let kv = (qs[a].as_slice(), held.0[b].as_slice(), held.1[b].as_slice());
                        states[a].accumulate(kv, kc.len, call.params::<T>(qc, kc))?;
                    }
                }
            }
            Ok(())
        })?;
        if t + 1 < n {
            let next = placement.chunks(ring, ring.held_after(t + 1));
            let counts: Vec<usize> = next.iter().map(|&c| call.rows_len(c)).collect();
            held = (link.receive(&counts)?, link.receive(&counts)?);
        }
    }
    let mut outs = Vec::with_capacity(mine.len());
    let mut lses = Vec::with_capacity(mine.len());
    for (state, c) in states.iter().zip(&mine) {
        let mut o = vec![T::ZERO; call.rows_len(*c)];
        let mut l = vec![T::ZERO; call.slices * c.len];
        state.finish_into(&mut o, &mut l)?;
        outs.push(o);
        lses.push(l);
    }
    from_placement(link, &placement, wide, outs, out.as_slice_mut::<T>()?)?;
    from_placement(link, &placement, narrow, lses, lse.as_slice_mut::<T>()?)?;
    Ok(())
}

/// Ring attention's backward: `dq`, `dk`, `dv` of this rank's blocks from the forward's
/// `out`, `lse` and the output's gradient `dout`; the time spent waiting for blocks.
pub(crate) fn backward(
    comm: &dyn Communicator,
    ring: &Ring,
    tag: Tag,
    how: RingAttention,
    inputs: [&Tensor; 6],
    grads: [&mut Tensor; 3],
) -> Result<RingTiming, ExecError> {
    let call = Call::of(inputs[0], how.causal, how.scale)?;
    let link = Link::of(comm, ring, tag);
    match (inputs[0].dtype(), how.canonical) {
        (DType::F32, true) => backward_canonical::<f32>(&link, &call, inputs, grads)?,
        (DType::F64, true) => backward_canonical::<f64>(&link, &call, inputs, grads)?,
        (DType::F32, false) => backward_typed::<f32>(&link, &call, inputs, grads)?,
        (DType::F64, false) => backward_typed::<f64>(&link, &call, inputs, grads)?,
        (other, _) => return Err(unsupported(other)),
    }
    Ok(link.into_timing())
}

fn backward_typed<T: Element + Float>(
    link: &Link<'_>,
    call: &Call,
    [q, k, v, out, lse, dout]: [&Tensor; 6],
    [dq, dk, dv]: [&mut Tensor; 3],
) -> Result<(), ExecError> {
    let ring = link.ring;
    let placement = Placement::of(ring, call.causal);
    let (wide, narrow) = call.rows();
    let dout_rows = dout.as_slice::<T>()?;
    let delta = call.delta::<T>(out, dout)?;
    let place = |rows: Rows, data: &[T]| to_placement(link, &placement, rows, data);
    let (qs, douts) = (place(wide, q.as_slice::<T>()?)?, place(wide, dout_rows)?);
    let (lses, deltas) = (place(narrow, lse.as_slice::<T>()?)?, place(narrow, &delta)?);
    let (ks, vs) = (
        place(wide, k.as_slice::<T>()?)?,
        place(wide, v.as_slice::<T>()?)?,
    );
    let mine = placement.chunks(ring, ring.position);
    let mut dqs: Vec<Vec<T>> = qs.iter().map(|c| vec![T::ZERO; c.len()]).collect();
    // The blocks held: their keys and values, and their accumulated key and value gradients.
    let zeros = |chunks: &[Vec<T>]| -> Vec<Vec<T>> {
        chunks.iter().map(|c| vec![T::ZERO; c.len()]).collect()
    };
    let mut held = (zeros(&ks), zeros(&vs), ks, vs);
    let mut parts: (Vec<T>, Vec<T>) = (Vec::new(), Vec::new());
    let n = ring.n();
    for t in 0..n {
        link.pass.set(t);
        let theirs = placement.chunks(ring, ring.held_after(t));
        if t + 1 < n {
            // The keys and values go on at once; their gradients after this member's part.
            link.pass_on(&held.2)?;
            link.pass_on(&held.3)?;
        }
        link.attend(|| -> Result<(), ExecError> {
            for (a, &qc) in mine.iter().enumerate() {
                for (b, &kc) in theirs.iter().enumerate() {
                    if !call.sees(qc, kc) {
                        continue;
                    }
                    // The kernel overwrites the parts; one pair of buffers serves every pair.
                    let len = held.2[b].len();
                    parts.0.resize(len, T::ZERO);
                    parts.1.resize(len, T::ZERO);
                    let (dk_part, dv_part) = (&mut parts.0[..len], &mut parts.1[..len]);
                    let input = BlockGradInputs {
                        q: &qs[a],
                        k: &held.2[b],
                        v: &held.3[b],
                        dout: &douts[a],
                        lse: &lses[a],
                        delta: &deltas[a],
                    };
                    let grads = AttentionGradBuffers {
                        dq: &mut dqs[a],
                        dk: dk_part,
                        dv: dv_part,
                    };
                    attention_backward_block(
                        input,
                        call.dims(qc, kc),
                        call.params::<T>(qc, kc),
                        grads,
                    )?;
                    add_into(&mut held.0[b], &parts.0[..len]);
                    add_into(&mut held.1[b], &parts.1[..len]);
                }
            }
            Ok(())
        })?;
        link.pass_on(&held.0)?;
        link.pass_on(&held.1)?;
        let next = placement.chunks(ring, ring.held_after(t + 1));
        let counts: Vec<usize> = next.iter().map(|&c| call.rows_len(c)).collect();
        if t + 1 < n {
            let (k_next, v_next) = (link.receive(&counts)?, link.receive(&counts)?);
            held = (
                link.receive(&counts)?,
                link.receive(&counts)?,
                k_next,
                v_next,
            );
        } else {
            // After n passes the accumulators of this rank's own chunks are back.
            held.0 = link.receive(&counts)?;
            held.1 = link.receive(&counts)?;
        }
    }
    from_placement(link, &placement, wide, dqs, dq.as_slice_mut::<T>()?)?;
    from_placement(link, &placement, wide, held.0, dk.as_slice_mut::<T>()?)?;
    from_placement(link, &placement, wide, held.1, dv.as_slice_mut::<T>()?)?;
    Ok(())
}

/// Deterministic mode: every member's block of an operand (`rows`-shaped), passed around the
/// ring `n − 1` times and assembled in sequence order: `[slices, Σ lengths, width]`.
fn gather_blocks<T: Element>(link: &Link<'_>, rows: Rows, own: &[T]) -> Result<Vec<T>, ExecError> {
    let ring = link.ring;
    let (n, total) = (ring.n(), ring.lengths.iter().sum::<usize>());
    let mut whole = vec![T::zeroed(); rows.slices * total * rows.width];
    let mut held = own.to_vec();
    for t in 0..n {
        link.pass.set(t);
        let j = ring.held_after(t);
        if t + 1 < n {
            link.pass_on(std::slice::from_ref(&held))?;
        }
        rows.put(&mut whole, total, ring.offsets[j] - ring.offsets[0], &held);
        if t + 1 < n {
            let next = ring.held_after(t + 1);
            let count = rows.slices * ring.lengths[next] * rows.width;
            held = link.receive(&[count])?.pop().unwrap_or_default();
        }
    }
    Ok(whole)
}

/// The attention dims and mask of this rank's queries against the whole sequence's keys
/// (`keys_whole`), or the whole sequence's queries against this rank's keys.
fn canonical_call<T: Float>(
    call: &Call,
    ring: &Ring,
    keys_whole: bool,
) -> (AttentionDims, AttentionParams<T>) {
    let total = ring.lengths.iter().sum::<usize>();
    let (own, base) = (
        Chunk {
            offset: ring.offsets[ring.position],
            len: ring.lengths[ring.position],
        },
        Chunk {
            offset: ring.offsets[0],
            len: total,
        },
    );
    let (q, kv) = if keys_whole { (own, base) } else { (base, own) };
    (call.dims(q, kv), call.params(q, kv))
}

/// Deterministic mode's forward: the keys and values gathered whole, then this rank's queries
/// attended over them in one call of one device's kernel, so every row adds the same tiles in
/// the same order as on one device.
fn forward_canonical<T: Element + Float>(
    link: &Link<'_>,
    call: &Call,
    (q, k, v): (&Tensor, &Tensor, &Tensor),
    (out, lse): (&mut Tensor, &mut Tensor),
) -> Result<(), ExecError> {
    let (wide, _) = call.rows();
    let keys = gather_blocks(link, wide, k.as_slice::<T>()?)?;
    let values = gather_blocks(link, wide, v.as_slice::<T>()?)?;
    let (dims, params) = canonical_call::<T>(call, link.ring, true);
    link.attend(|| {
        flash_attention_into(
            (q.as_slice::<T>()?, &keys, &values),
            dims,
            params,
            out.as_slice_mut::<T>()?,
            lse.as_slice_mut::<T>()?,
        )
        .map_err(ExecError::from)
    })
}

/// Deterministic mode's backward: every operand gathered whole; `dq` from this rank's queries
/// against every key, and `dk`, `dv` from every query against this rank's keys, each in one call
/// of one device's kernel (so each sum runs over the same tiles in the same order as on one
/// device; the other gradients of each call are not needed).
fn backward_canonical<T: Element + Float>(
    link: &Link<'_>,
    call: &Call,
    [q, k, v, out, lse, dout]: [&Tensor; 6],
    [dq, dk, dv]: [&mut Tensor; 3],
) -> Result<(), ExecError> {
    let (wide, narrow) = call.rows();
    let (q_own, dout_own, lse_own) = (
        q.as_slice::<T>()?,
        dout.as_slice::<T>()?,
        lse.as_slice::<T>()?,
    );
    let (k_own, v_own) = (k.as_slice::<T>()?, v.as_slice::<T>()?);
    let delta = call.delta::<T>(out, dout)?;
    let (keys, values) = (
        gather_blocks(link, wide, k_own)?,
        gather_blocks(link, wide, v_own)?,
    );
    let (queries, douts) = (
        gather_blocks(link, wide, q_own)?,
        gather_blocks(link, wide, dout_own)?,
    );
    let (lses, deltas) = (
        gather_blocks(link, narrow, lse_own)?,
        gather_blocks(link, narrow, &delta)?,
    );
    link.attend(|| -> Result<(), ExecError> {
        let (dims, params) = canonical_call::<T>(call, link.ring, true);
        let dq = dq.as_slice_mut::<T>()?;
        dq.fill(T::ZERO);
        let (mut dk_unused, mut dv_unused) = (vec![T::ZERO; keys.len()], vec![T::ZERO; keys.len()]);
        let input = BlockGradInputs {
            q: q_own,
            k: &keys,
            v: &values,
            dout: dout_own,
            lse: lse_own,
            delta: &delta,
        };
        let grads = AttentionGradBuffers {
            dq,
            dk: &mut dk_unused,
            dv: &mut dv_unused,
        };
        attention_backward_block(input, dims, params, grads)?;
        let (dims, params) = canonical_call::<T>(call, link.ring, false);
        let mut dq_unused = vec![T::ZERO; queries.len()];
        let input = BlockGradInputs {
            q: &queries,
            k: k_own,
            v: v_own,
            dout: &douts,
            lse: &lses,
            delta: &deltas,
        };
        let grads = AttentionGradBuffers {
            dq: &mut dq_unused,
            dk: dk.as_slice_mut::<T>()?,
            dv: dv.as_slice_mut::<T>()?,
        };
        attention_backward_block(input, dims, params, grads)?;
        Ok(())
    })
}

fn add_into<T: Float>(acc: &mut [T], part: &[T]) {
    for (a, &p) in acc.iter_mut().zip(part) {
        *a += p;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use layout::Layout;

    #[test]
    fn a_ring_holds_the_ranks_of_one_batch_and_heads_block_in_sequence_order() {
        // [B, H, S, d] over (dp 2, cp 2, mp 2): heads over mp, sequence over cp.
        let base = Layout::new(&[2, 2, 2], &["dp", "cp", "mp"], None).unwrap();
        let layout = base
            .apply(&["dp".into(), "mp".into(), "cp".into(), "None".into()])
            .unwrap()
            .bind(&[4, 8, 16, 4])
            .unwrap();
        // Rank 5 = (dp 1, cp 0, mp 1): its ring partner is rank 7 = (dp 1, cp 1, mp 1).
        let ring = Ring::of(&layout, 5).unwrap();
        assert_eq!(ring.members, vec![5, 7]);
        assert_eq!(ring.offsets, vec![0, 8]);
        assert_eq!(ring.lengths, vec![8, 8]);
        assert_eq!(ring.position, 0);
        assert_eq!(Ring::of(&layout, 7).unwrap().position, 1);
        // Not split on the sequence: no ring.
        let whole = base
            .apply(&["dp".into(), "mp".into(), "None".into(), "None".into()])
            .unwrap()
            .bind(&[4, 8, 16, 4])
            .unwrap();
        assert_eq!(Ring::of(&whole, 5), None);
    }
}
