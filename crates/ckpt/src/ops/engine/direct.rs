//! Writing a safetensors file straight from the page cache: every destination chunk is a list
//! of runs, each pointing into a read-only mapping of a source file, written with `pwritev`.
//! The kernel copies each byte once (source page cache → destination page cache), where
//! assembling a chunk in a buffer and then writing it copies it twice. The runs of a chunk are
//! split over two threads, which write disjoint byte ranges of the file.
//!
//! Chunks this path cannot serve (a `.ckpt` source whose tensor spans several extents, a
//! mapping the kernel refuses, a piece whose rows would map far more than it needs) are
//! assembled in a buffer by [`super::gather`] and written with one `pwrite`.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;

use layout::SliceBox;

use super::gather::{fill_chunk, missing, Chunks};
use super::options::WriteOptions;
use super::plan::{ItemSource, OutItem};
use crate::error::{io_err, CkptError, Result};
use crate::progress::stop_point;
use crate::source::box_runs::for_each_run;
use crate::source::{CheckpointFile, SourceSet};

/// Mappings larger than this many times the bytes they serve are not made (the chunk is
/// assembled in a buffer instead).
const MAX_OVERMAP: usize = 4;
/// Most iovecs one `pwritev` takes (Linux's `IOV_MAX`).
const IOV_MAX: usize = 1024;

/// One contiguous run of a chunk: `len` bytes at `src` (inside a live mapping) go to byte `dst`
/// of the chunk.
#[derive(Clone, Copy)]
struct Run {
    dst: usize,
    src: *const u8,
    len: usize,
}

// SAFETY: a run points into a read-only mapping that outlives every thread using it (the
// threads are scoped inside the function that owns the mappings).
unsafe impl Send for Run {}
unsafe impl Sync for Run {}

/// Writes the data of `items` (in order) into `file` from byte `start`, polling the progress
/// sink's stop after every chunk ([`CkptError::Stopped`]: the caller drops the file).
pub(crate) fn write_data(
    sources: &SourceSet,
    file: &File,
    path: &std::path::Path,
    start: u64,
    items: &[OutItem<'_>],
    opts: &WriteOptions<'_>,
) -> Result<()> {
    let mut pos = start;
    let mut scratch = Vec::new();
    let mut buf = Vec::new();
    for item in items {
        let elem = item.meta.dtype().map_or(1, |d| d.size_in_bytes());
        match &item.source {
            ItemSource::Stored {
                file: src,
                region: None,
            } => {
                let t = src
                    .tensor(&item.meta.name)
                    .ok_or_else(|| missing(src.path(), &item.meta.name))?;
                let mut at = 0u64;
                while at < t.n_bytes {
                    let n = ((t.n_bytes - at) as usize).min(opts.chunk_bytes.max(1));
                    match src.map_range_of(t, at, n as u64) {
                        Some(m) => {
                            let run = Run {
                                dst: 0,
                                src: m.bytes().as_ptr(),
                                len: n,
                            };
                            write_runs(file, path, pos, &[run])?;
                        }
                        None => {
                            buf.resize(n, 0);
                            src.read_bytes(t, at, &mut buf)?;
                            file.write_all_at(&buf, pos)
                                .map_err(io_err(path, "write"))?;
                        }
                    }
                    pos += n as u64;
                    at += n as u64;
                    opts.progress.advance(n as u64);
                    stop_point(opts.progress)?;
                }
            }
            ItemSource::Stored {
                file: src,
                region: Some(region),
            } => {
                for chunk in Chunks::new(&region.shape, elem, opts.chunk_bytes) {
                    let n = chunk.n_elements() * elem;
                    let global = chunk.translated(&region.offset);
                    let pieces = [(src.as_ref(), global.clone(), SliceBox::full(&chunk.shape))];
                    let zero = vec![0; chunk.ndim()];
                    if !write_pieces(file, path, pos, &item.meta.name, &pieces, &chunk, elem)? {
                        buf.resize(n, 0);
                        let t = src
                            .tensor(&item.meta.name)
                            .ok_or_else(|| missing(src.path(), &item.meta.name))?;
                        src.read_box(t, &global, &mut buf, &chunk.shape, &zero, &mut scratch)?;
                        file.write_all_at(&buf, pos)
                            .map_err(io_err(path, "write"))?;
                    }
                    pos += n as u64;
                    opts.progress.advance(n as u64);
                    stop_point(opts.progress)?;
                }
            }
            ItemSource::Gather {
                param,
                region,
                pieces,
            } => {
                for chunk in Chunks::new(&region.shape, elem, opts.chunk_bytes) {
                    let n = chunk.n_elements() * elem;
                    let global = chunk.translated(&region.offset);
                    let mut parts = Vec::new();
                    for (piece, rank) in pieces {
                        let Some(sub) = piece.intersect(&global) else {
                            continue;
                        };
                        let src = sources
                            .file_for(*rank, &item.meta.name)?
                            .ok_or_else(|| missing(sources.root(), &item.meta.name))?;
                        let (pl, slot) = param
                            .placement_of_rank(*rank)
                            .expect("a planned holder belongs to a placement");
                        let rel = pl.held.slot_box(slot).relative(&sub);
                        let dst = global.relative(&sub);
                        parts.push((src, rel, dst));
                    }
                    let refs: Vec<(&CheckpointFile, SliceBox, SliceBox)> = parts
                        .iter()
                        .map(|(f, r, d)| (f.as_ref(), r.clone(), d.clone()))
                        .collect();
                    if !write_pieces(file, path, pos, &item.meta.name, &refs, &chunk, elem)? {
                        buf.resize(n, 0);
                        fill_chunk(sources, item, &chunk, &mut buf, &mut scratch)?;
                        file.write_all_at(&buf, pos)
                            .map_err(io_err(path, "write"))?;
                    }
                    pos += n as u64;
                    opts.progress.advance(n as u64);
                    stop_point(opts.progress)?;
                }
            }
        }
    }
    Ok(())
}

/// Writes one chunk (of shape `chunk.shape`, at file byte `pos`) from `pieces`: each a source
/// file, the box it supplies (relative to its stored slice) and where that box lands in the
/// chunk. Returns `false`, having written nothing, when a piece cannot be mapped.
fn write_pieces(
    file: &File,
    path: &std::path::Path,
    pos: u64,
    name: &str,
    pieces: &[(&CheckpointFile, SliceBox, SliceBox)],
    chunk: &SliceBox,
    elem: usize,
) -> Result<bool> {
    let ndim = chunk.ndim();
    if ndim == 0 {
        return Ok(false);
    }
    let mut maps = Vec::with_capacity(pieces.len());
    let mut runs = Vec::new();
    for (src, rel, dst) in pieces {
        let t = src.tensor(name).ok_or_else(|| missing(src.path(), name))?;
        if rel.is_empty() {
            continue;
        }
        let src_shape = &t.shape;
        let row_bytes = src_shape[1..].iter().product::<usize>() * elem;
        let rows = rel.shape[0];
        let map_bytes = rows * row_bytes;
        if map_bytes > rel.n_elements() * elem * MAX_OVERMAP {
            return Ok(false);
        }
        let Some(m) = src.map_range_of(t, (rel.offset[0] * row_bytes) as u64, map_bytes as u64)
        else {
            return Ok(false);
        };
        let mut rows_origin = rel.offset.clone();
        rows_origin[0] = 0;
        emit_runs(
            m.bytes().as_ptr(),
            src_shape,
            &rows_origin,
            &chunk.shape,
            &dst.offset,
            &rel.shape,
            elem,
            &mut runs,
        );
        maps.push(m);
    }
    runs.sort_unstable_by_key(|r| r.dst);
    let mut end = 0;
    for r in &runs {
        if r.dst != end {
            return Err(CkptError::PlanMismatch {
                tensor: name.to_string(),
                rule: format!("do not tile chunk {chunk} (gap or overlap at byte {end})"),
            });
        }
        end += r.len;
    }
    if end != chunk.n_elements() * elem {
        return Err(CkptError::PlanMismatch {
            tensor: name.to_string(),
            rule: format!(
                "cover {end} of the {} bytes of chunk {chunk}",
                chunk.n_elements() * elem
            ),
        });
    }
    let runs = merge(runs);
    // Two threads, each writing a contiguous half of the chunk's runs.
    let half = runs.len() / 2;
    let (a, b) = runs.split_at(half);
    std::thread::scope(|s| -> Result<()> {
        let other = s.spawn(|| write_runs(file, path, pos, a));
        let mine = write_runs(file, path, pos, b);
        let theirs = other.join().unwrap_or(Err(CkptError::ThreadPanicked {
            thread: "a writing thread",
        }));
        mine.and(theirs)
    })?;
    drop(maps);
    Ok(true)
}

/// The runs copying box `extent` from a row-major source of `src_shape` (at `src_off`, with
/// `base` its byte 0) to a row-major chunk of `dst_shape` (at `dst_off`).
#[allow(clippy::too_many_arguments)]
fn emit_runs(
    base: *const u8,
    src_shape: &[usize],
    src_off: &[usize],
    dst_shape: &[usize],
    dst_off: &[usize],
    extent: &[usize],
    elem: usize,
    out: &mut Vec<Run>,
) {
    for_each_run::<()>(src_shape, src_off, dst_shape, dst_off, extent, |s, d, n| {
        out.push(Run {
            dst: d * elem,
            // SAFETY: the run lies inside the mapping `base` starts (the caller mapped every
            // row of the box).
            src: unsafe { base.add(s * elem) },
            len: n * elem,
        });
        Ok(())
    })
    .expect("pushing runs cannot fail");
}

/// Joins runs that continue each other on both sides.
fn merge(runs: Vec<Run>) -> Vec<Run> {
    let mut out: Vec<Run> = Vec::with_capacity(runs.len());
    for r in runs {
        if let Some(last) = out.last_mut() {
            // SAFETY: pointer arithmetic within the same mapping is only compared, not read.
            if last.dst + last.len == r.dst && last.src.wrapping_add(last.len) == r.src {
                last.len += r.len;
                continue;
            }
        }
        out.push(r);
    }
    out
}

/// `pwritev` of `runs` (sorted, contiguous in the chunk) to the file at `pos + run.dst`.
fn write_runs(file: &File, path: &std::path::Path, pos: u64, runs: &[Run]) -> Result<()> {
    let mut i = 0;
    while i < runs.len() {
        let batch = &runs[i..(i + IOV_MAX).min(runs.len())];
        let mut iov: Vec<libc::iovec> = batch
            .iter()
            .map(|r| libc::iovec {
                iov_base: r.src as *mut libc::c_void,
                iov_len: r.len,
            })
            .collect();
        let mut at = pos + batch[0].dst as u64;
        let mut first = 0;
        while first < iov.len() {
            let off = libc::off_t::try_from(at)
                .map_err(|_| io_err(path, "write")(std::io::Error::other("offset overflow")))?;
            // SAFETY: every iovec points into a live read-only mapping of at least its length.
            let n = unsafe {
                libc::pwritev(
                    file.as_raw_fd(),
                    iov[first..].as_ptr(),
                    (iov.len() - first) as libc::c_int,
                    off,
                )
            };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(io_err(path, "write")(e));
            }
            if n == 0 {
                return Err(io_err(path, "write")(std::io::Error::from(
                    std::io::ErrorKind::WriteZero,
                )));
            }
            // Skip what was written; a partial iovec is shortened in place.
            let mut left = n as usize;
            at += left as u64;
            while left > 0 {
                let v = &mut iov[first];
                if left >= v.iov_len {
                    left -= v.iov_len;
                    first += 1;
                } else {
                    // SAFETY: advancing within the same iovec's buffer.
                    v.iov_base = unsafe { (v.iov_base as *mut u8).add(left) } as *mut libc::c_void;
                    v.iov_len -= left;
                    left = 0;
                }
            }
        }
        i += batch.len();
    }
    Ok(())
}
