//! Where a ring step attends: each member's own block or the zigzag placement, and the row
//! copies that move operands there and back.

use std::ops::Range;

use parallel::ring::{Ring, Zigzag};
use tensor::region::{copy_region, Placement as RegionAt};
use tensor::Element;

use super::link::Link;
use crate::error::ExecError;

/// A run of consecutive sequence positions attended as one: its global position and rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Chunk {
    pub(super) offset: usize,
    pub(super) len: usize,
}

/// Where the ring's attention happens: each member's own contiguous block, or the zigzag
/// placement ([`parallel::ring::Zigzag`]) that balances the causal mask's work.
pub(super) struct Placement {
    pub(super) zigzag: Option<Zigzag>,
    /// Rows of a zigzag chunk (half a block).
    pub(super) chunk_rows: usize,
}

impl Placement {
    pub(super) fn of(ring: &Ring, causal: bool) -> Placement {
        let zigzag = Zigzag::of(causal, &ring.lengths);
        Placement {
            zigzag,
            chunk_rows: ring.lengths[0] / 2,
        }
    }

    /// The chunks member `j` attends (queries) and holds (keys and values), in sequence order.
    pub(super) fn chunks(&self, ring: &Ring, j: usize) -> Vec<Chunk> {
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

/// Operands of `slices` slices of `rows` rows of `width` elements (`[..., rows, width]`).
#[derive(Clone, Copy)]
pub(super) struct Rows {
    pub(super) slices: usize,
    pub(super) width: usize,
}

impl Rows {
    /// Rows `from .. from + len` of every slice of `data` (whose slices have `rows` rows).
    pub(super) fn take<T: Element>(
        self,
        data: &[T],
        rows: usize,
        from: usize,
        len: usize,
    ) -> Vec<T> {
        let mut part = vec![T::zeroed(); self.slices * len * self.width];
        self.copy(data, (rows, from), &mut part, (len, 0), len);
        part
    }

    /// Writes `part` into rows `from ..` of every slice of `data`.
    pub(super) fn put<T: Element>(self, data: &mut [T], rows: usize, from: usize, part: &[T]) {
        let len = part.len() / (self.slices * self.width).max(1);
        self.copy(part, (len, 0), data, (rows, from), len);
    }

    /// Copies `len` rows of every slice from `src` (slices of `src_rows` rows, from row
    /// `src_from`) to `dst` (slices of `dst_rows` rows, from row `dst_from`), by the box copy
    /// every slicing goes through.
    pub(super) fn copy<T: Element>(
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

/// Where each of `chunks` lies in a buffer holding them one after another, each
/// `[slices, len, width]` (`rows`-shaped).
pub(super) fn chunk_ranges(rows: Rows, chunks: &[Chunk]) -> Vec<Range<usize>> {
    let mut at = 0;
    chunks
        .iter()
        .map(|c| {
            let len = rows.slices * c.len * rows.width;
            at += len;
            at - len..at
        })
        .collect()
}

/// Writes this rank's operand `data` (its contiguous block) into `slot` as the chunks it
/// attends with, one after another: moved to the zigzag placement, or the block itself.
pub(super) fn to_placement<T: Element>(
    link: &Link<'_>,
    placement: &Placement,
    rows: Rows,
    data: &[T],
    slot: &mut [T],
) -> Result<(), ExecError> {
    let Some(z) = placement.zigzag else {
        slot[..data.len()].copy_from_slice(data);
        return Ok(());
    };
    let (me, c) = (link.ring.position, placement.chunk_rows);
    let held = z.held(me);
    let mine = placement.chunks(link.ring, me);
    let parts = chunk_ranges(rows, &mine);
    for half in 0..2 {
        let x = 2 * me + half;
        match held.iter().position(|&y| y == x) {
            Some(i) => rows.copy(
                data,
                (2 * c, half * c),
                &mut slot[parts[i].clone()],
                (c, 0),
                c,
            ),
            None => link.send_to(z.holder(x), &rows.take(data, 2 * c, half * c, c))?,
        }
    }
    for (i, &x) in held.iter().enumerate() {
        let owner = Zigzag::owner(x);
        if owner != me {
            link.receive_into(owner, &mut slot[parts[i].clone()])?;
        }
    }
    Ok(())
}

/// The inverse of [`to_placement`]: the chunks this rank attended with (one after another in
/// `slot`) go back to their owners, and `out` (this rank's contiguous block) receives its own.
/// The chunks coming back land in the slot's parts just sent away (as many as leave).
pub(super) fn from_placement<T: Element>(
    link: &Link<'_>,
    placement: &Placement,
    rows: Rows,
    slot: &mut [T],
    out: &mut [T],
) -> Result<(), ExecError> {
    let Some(z) = placement.zigzag else {
        out.copy_from_slice(&slot[..out.len()]);
        return Ok(());
    };
    let (me, c) = (link.ring.position, placement.chunk_rows);
    let parts = chunk_ranges(rows, &placement.chunks(link.ring, me));
    let mut sent = Vec::new();
    for (x, part) in z.held(me).into_iter().zip(parts) {
        match Zigzag::owner(x) {
            o if o == me => rows.put(out, 2 * c, (x % 2) * c, &slot[part]),
            o => {
                link.send_to(o, &slot[part.clone()])?;
                sent.push(part);
            }
        }
    }
    let mut free = sent.into_iter();
    for half in 0..2 {
        let x = 2 * me + half;
        let h = z.holder(x);
        if h != me {
            let part = free.next().expect("as many chunks come back as left");
            link.receive_into(h, &mut slot[part.clone()])?;
            rows.put(out, 2 * c, half * c, &slot[part]);
        }
    }
    Ok(())
}
