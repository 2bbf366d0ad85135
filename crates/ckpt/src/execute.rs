//! Writing a planned file: each output tensor goes out in bounded chunks (runs of rows of its
//! box). Safetensors output is written straight from mapped source pages with `pwritev`
//! ([`crate::direct`]: one copy, at most one chunk of source mappings at a time). `.ckpt` output
//! (protobuf framing, an optional CRC) is assembled from positioned reads into two circulating
//! chunk buffers ([`DEFAULT_CHUNK_BYTES`] each by default: one being assembled, one being written
//! by the writer thread) plus a small read scratch buffer. Either way memory stays bounded,
//! whatever the checkpoint size.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use layout::SliceBox;

use crate::atomic_write::{AtomicFile, Committer};
use crate::ckpt_file::{Format, TensorMeta};
use crate::error::{CkptError, Result};
use crate::ms_ckpt::CkptWriter;
use crate::plan::{ItemSource, OutItem};
use crate::progress::Progress;
use crate::safetensors::canonical_order;
use crate::sources::SourceSet;

/// Largest piece of one output tensor assembled in memory at once (64 MiB): large enough that
/// writes are long and sequential, small enough that memory stays far below the checkpoint size.
pub const DEFAULT_CHUNK_BYTES: usize = 64 << 20;

/// How output files are written.
#[derive(Clone, Copy)]
pub struct WriteOptions<'a> {
    /// Output format.
    pub format: Format,
    /// Replace existing destination files.
    pub force: bool,
    /// Append MindSpore's `crc_num` trailer to `.ckpt` output.
    pub crc: bool,
    /// Largest chunk of one tensor assembled in memory.
    pub chunk_bytes: usize,
    /// Where progress goes.
    pub progress: &'a dyn Progress,
    /// Whether finished files are fsynced before they are renamed into place.
    pub(crate) durability: crate::Durability,
    /// Commit finished files on this background committer instead of inline.
    pub(crate) committer: Option<&'a Committer>,
    /// Output names of renamed tensors (source name → name written); sources are still read
    /// under their own names.
    pub(crate) rename: Option<&'a BTreeMap<String, String>>,
}

impl std::fmt::Debug for WriteOptions<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteOptions")
            .field("format", &self.format)
            .field("force", &self.force)
            .field("crc", &self.crc)
            .field("chunk_bytes", &self.chunk_bytes)
            .field("durability", &self.durability)
            .finish()
    }
}

/// [`WriteOptions`] without the progress sink, which need not be `Sync`: what the threads
/// writing several files at once share ([`crate::fan_out`]).
#[derive(Clone, Copy)]
pub(crate) struct WriteSettings<'a> {
    format: Format,
    force: bool,
    crc: bool,
    chunk_bytes: usize,
    durability: crate::Durability,
    committer: Option<&'a Committer>,
    rename: Option<&'a BTreeMap<String, String>>,
}

impl<'a> WriteOptions<'a> {
    /// These options without their progress sink.
    pub(crate) fn settings(&self) -> WriteSettings<'a> {
        WriteSettings {
            format: self.format,
            force: self.force,
            crc: self.crc,
            chunk_bytes: self.chunk_bytes,
            durability: self.durability,
            committer: self.committer,
            rename: self.rename,
        }
    }
}

impl<'a> WriteSettings<'a> {
    /// The options of a write reporting to `progress`.
    pub(crate) fn with_progress(self, progress: &'a dyn Progress) -> WriteOptions<'a> {
        WriteOptions {
            format: self.format,
            force: self.force,
            crc: self.crc,
            chunk_bytes: self.chunk_bytes,
            progress,
            durability: self.durability,
            committer: self.committer,
            rename: self.rename,
        }
    }
}

/// What writing one file did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FileStats {
    /// The file written.
    pub path: PathBuf,
    /// Tensors written.
    pub n_tensors: usize,
    /// Bytes of tensor data written.
    pub data_bytes: u64,
}

/// Total bytes of tensor data `items` will write.
pub(crate) fn data_bytes(items: &[OutItem<'_>]) -> u64 {
    items.iter().map(|i| i.meta.n_bytes).sum()
}

/// Writes `items` to `dest`. Safetensors output is reordered as the reference writer orders
/// tensors; `.ckpt` output keeps the given order.
pub(crate) fn write_items(
    sources: &SourceSet,
    dest: &Path,
    mut items: Vec<OutItem<'_>>,
    metadata: &[(String, String)],
    opts: &WriteOptions<'_>,
) -> Result<FileStats> {
    let out_meta = |i: &OutItem<'_>| {
        let mut m = i.meta.clone();
        if let Some(new) = opts.rename.and_then(|r| r.get(&m.name)) {
            m.name = new.clone();
        }
        m
    };
    if opts.rename.is_some() {
        let mut seen = std::collections::HashSet::new();
        if let Some(dup) = items
            .iter()
            .map(out_meta)
            .find(|m| !seen.insert(m.name.clone()))
        {
            return Err(CkptError::UnsafeDestination {
                path: dest.to_path_buf(),
                rule: format!(
                    "two tensors would both be written as {:?} after renaming",
                    dup.name
                ),
            });
        }
    }
    if opts.format == Format::Safetensors {
        let mut metas: Vec<TensorMeta> = items.iter().map(out_meta).collect();
        canonical_order(&mut metas);
        let rank_of = |name: &str| {
            metas
                .iter()
                .position(|m| m.name == name)
                .unwrap_or(usize::MAX)
        };
        items.sort_by_key(|i| rank_of(&out_meta(i).name));
    }
    let metas: Vec<TensorMeta> = items.iter().map(out_meta).collect();
    if opts.format == Format::Safetensors {
        return write_safetensors(sources, dest, &items, &metas, metadata, opts);
    }
    let mut writer = CkptWriter::create(dest, metas, opts.crc, opts.force, opts.durability)?;
    let mut stats = FileStats {
        n_tensors: items.len(),
        data_bytes: data_bytes(&items),
        path: dest.to_path_buf(),
    };
    // Two threads: this one assembles chunks, the writer thread writes the previous one, so the
    // copy into the page cache overlaps the reads. Two buffers circulate between them.
    let (full_tx, full_rx) = std::sync::mpsc::sync_channel::<Vec<u8>>(1);
    let (free_tx, free_rx) = std::sync::mpsc::channel::<Vec<u8>>();
    let file = std::thread::scope(|scope| -> Result<AtomicFile> {
        let handle = scope.spawn(move || -> Result<CkptWriter> {
            for buf in full_rx {
                writer.write(&buf)?;
                // The assembling side may have finished; a lost buffer is just freed.
                let _ = free_tx.send(buf);
            }
            Ok(writer)
        });
        let mut pipe = Pipe {
            full: Some(full_tx),
            free: free_rx,
            n_buffers: 0,
        };
        let mut scratch: Vec<u8> = Vec::new();
        let assembled = items
            .iter()
            .try_for_each(|item| write_item(sources, item, &mut pipe, &mut scratch, opts));
        drop(pipe.full.take());
        let written = handle.join().unwrap_or_else(|_| {
            Err(CkptError::InvalidRequest(
                "the writing thread panicked".to_string(),
            ))
        });
        // A writer failure (e.g. a full disk) is the root cause of any "writer gone" error.
        match (assembled, written) {
            (Ok(()), Ok(writer)) => writer.finish(),
            (_, Err(e)) => Err(e),
            (Err(e), Ok(_)) => Err(e),
        }
    })?;
    stats.path = file.dest().to_path_buf();
    commit_file(file, stats, opts)
}

/// Hands a finished file to the committer (or commits it now) and reports it done.
fn commit_file(file: AtomicFile, stats: FileStats, opts: &WriteOptions<'_>) -> Result<FileStats> {
    match opts.committer {
        Some(c) => c.submit(file)?,
        None => {
            file.commit()?;
        }
    }
    opts.progress.file_done(&stats.path);
    Ok(stats)
}

/// Writes a safetensors file: the header, then every item's data straight from the source
/// files' pages ([`crate::direct`]).
fn write_safetensors(
    sources: &SourceSet,
    dest: &Path,
    items: &[OutItem<'_>],
    metas: &[TensorMeta],
    metadata: &[(String, String)],
    opts: &WriteOptions<'_>,
) -> Result<FileStats> {
    let header = crate::safetensors::header_bytes(dest, metadata, metas)?;
    let mut out = AtomicFile::create(dest, opts.force, opts.durability)?;
    out.write_all(&header)?;
    let path = out.dest().to_path_buf();
    crate::direct::write_data(
        sources,
        out.as_file(),
        &path,
        header.len() as u64,
        items,
        opts,
    )?;
    let stats = FileStats {
        n_tensors: items.len(),
        data_bytes: data_bytes(items),
        path,
    };
    commit_file(out, stats, opts)
}

/// The assembling side of the writer thread: hands out buffers and takes them back filled.
struct Pipe {
    full: Option<std::sync::mpsc::SyncSender<Vec<u8>>>,
    free: std::sync::mpsc::Receiver<Vec<u8>>,
    n_buffers: usize,
}

impl Pipe {
    /// A buffer of `len` bytes: a returned one, or a new one while fewer than two exist.
    fn buffer(&mut self, len: usize) -> Result<Vec<u8>> {
        let mut buf = match self.free.try_recv() {
            Ok(b) => b,
            Err(_) if self.n_buffers < 2 => {
                self.n_buffers += 1;
                Vec::new()
            }
            Err(_) => self.free.recv().map_err(|_| self.writer_gone())?,
        };
        buf.resize(len, 0);
        Ok(buf)
    }

    /// Queues a filled buffer for writing.
    fn send(&mut self, buf: Vec<u8>, opts: &WriteOptions<'_>) -> Result<()> {
        let n = buf.len() as u64;
        self.full
            .as_ref()
            .expect("an open pipe")
            .send(buf)
            .map_err(|_| self.writer_gone())?;
        opts.progress.advance(n);
        Ok(())
    }

    fn writer_gone(&self) -> CkptError {
        // The writer thread stopped early; its own error is reported when it is joined.
        CkptError::InvalidRequest("the writing thread stopped".to_string())
    }
}

fn write_item(
    sources: &SourceSet,
    item: &OutItem<'_>,
    pipe: &mut Pipe,
    scratch: &mut Vec<u8>,
    opts: &WriteOptions<'_>,
) -> Result<()> {
    let name = &item.meta.name;
    match &item.source {
        ItemSource::Stored { file, region: None } => {
            let t = file
                .tensor(name)
                .ok_or_else(|| missing(file.path(), name))?;
            let mut at = 0u64;
            while at < t.n_bytes {
                let n = ((t.n_bytes - at) as usize).min(opts.chunk_bytes.max(1));
                let mut buf = pipe.buffer(n)?;
                file.read_bytes(t, at, &mut buf)?;
                pipe.send(buf, opts)?;
                at += n as u64;
            }
            Ok(())
        }
        ItemSource::Stored {
            file,
            region: Some(region),
        } => {
            let t = file
                .tensor(name)
                .ok_or_else(|| missing(file.path(), name))?;
            let elem = item.meta.dtype().map_or(1, |d| d.size_in_bytes());
            for chunk in Chunks::new(&region.shape, elem, opts.chunk_bytes) {
                let global = chunk.translated(&region.offset);
                let mut buf = pipe.buffer(chunk.n_elements() * elem)?;
                let zero = vec![0; chunk.ndim()];
                file.read_box(t, &global, &mut buf, &chunk.shape, &zero, scratch)?;
                pipe.send(buf, opts)?;
            }
            Ok(())
        }
        ItemSource::Gather { region, .. } => {
            let elem = item.meta.dtype().map_or(1, |d| d.size_in_bytes());
            for chunk in Chunks::new(&region.shape, elem, opts.chunk_bytes) {
                let mut buf = pipe.buffer(chunk.n_elements() * elem)?;
                fill_chunk(sources, item, &chunk, &mut buf, scratch)?;
                pipe.send(buf, opts)?;
            }
            Ok(())
        }
    }
}

/// Fills `buf` with the chunk `chunk` (relative to the item's box) of a gathered item.
pub(crate) fn fill_chunk(
    sources: &SourceSet,
    item: &OutItem<'_>,
    chunk: &SliceBox,
    buf: &mut [u8],
    scratch: &mut Vec<u8>,
) -> Result<()> {
    let name = &item.meta.name;
    let ItemSource::Gather {
        param,
        region,
        pieces,
    } = &item.source
    else {
        return Err(CkptError::InvalidRequest(format!(
            "internal error: {name:?} is not gathered from pieces"
        )));
    };
    let global = chunk.translated(&region.offset);
    let mut filled = 0usize;
    for (piece, rank) in pieces {
        let Some(sub) = piece.intersect(&global) else {
            continue;
        };
        let file = sources
            .file_for(*rank, name)?
            .ok_or_else(|| missing(sources.root(), name))?;
        let t = file
            .tensor(name)
            .ok_or_else(|| missing(file.path(), name))?;
        let (pl, slot) = param
            .placement_of_rank(*rank)
            .expect("a planned holder belongs to a placement");
        let held = pl.held.slot_box(slot);
        let rel = held.relative(&sub);
        let dst_off: Vec<usize> = sub
            .offset
            .iter()
            .zip(&global.offset)
            .map(|(a, b)| a - b)
            .collect();
        file.read_box(t, &rel, buf, &chunk.shape, &dst_off, scratch)?;
        filled += sub.n_elements();
    }
    if filled != chunk.n_elements() {
        return Err(CkptError::InvalidRequest(format!(
            "internal error: the pieces of {name:?} cover {filled} of the {} elements of {}",
            chunk.n_elements(),
            global
        )));
    }
    Ok(())
}

fn missing(path: &Path, name: &str) -> CkptError {
    CkptError::TensorMissing {
        path: path.to_path_buf(),
        tensor: name.to_string(),
        rule: "the plan made from its header expected it".to_string(),
    }
}

/// The chunks of a box of `shape` (relative to the box's origin) in row-major order, each a
/// contiguous run of the box's bytes of at most `max_bytes` (or one row of the innermost dim
/// that fits).
#[derive(Debug)]
pub(crate) struct Chunks {
    shape: Vec<usize>,
    /// The dim along which chunks advance; dims before it advance one index at a time.
    k: usize,
    /// Indices of dim `k` per chunk.
    rows: usize,
    /// Next chunk's start: indices of dims `0..=k`.
    next: Option<Vec<usize>>,
}

impl Chunks {
    pub(crate) fn new(shape: &[usize], elem: usize, max_bytes: usize) -> Chunks {
        let ndim = shape.len();
        if shape.contains(&0) {
            return Chunks {
                shape: shape.to_vec(),
                k: 0,
                rows: 1,
                next: None,
            };
        }
        if ndim == 0 {
            return Chunks {
                shape: Vec::new(),
                k: 0,
                rows: 1,
                next: Some(Vec::new()),
            };
        }
        let max_bytes = max_bytes.max(elem);
        // inner[d]: bytes of one index along dim d.
        let mut inner = vec![elem; ndim];
        for d in (0..ndim - 1).rev() {
            inner[d] = inner[d + 1].saturating_mul(shape[d + 1]);
        }
        let k = (0..ndim)
            .find(|&d| inner[d] <= max_bytes)
            .unwrap_or(ndim - 1);
        let rows = (max_bytes / inner[k]).clamp(1, shape[k]);
        Chunks {
            shape: shape.to_vec(),
            k,
            rows,
            next: Some(vec![0; k + 1]),
        }
    }
}

impl Iterator for Chunks {
    type Item = SliceBox;

    fn next(&mut self) -> Option<SliceBox> {
        let start = self.next.take()?;
        let ndim = self.shape.len();
        if ndim == 0 {
            return Some(SliceBox::new(Vec::new(), Vec::new()));
        }
        let k = self.k;
        let n = self.rows.min(self.shape[k] - start[k]);
        let mut offset = vec![0; ndim];
        let mut extent = self.shape.clone();
        for d in 0..k {
            offset[d] = start[d];
            extent[d] = 1;
        }
        offset[k] = start[k];
        extent[k] = n;
        // Advance: dim k by n, carrying into the dims before it.
        let mut next = start;
        next[k] += n;
        let mut d = k;
        while next[d] >= self.shape[d] {
            if d == 0 {
                self.next = None;
                return Some(SliceBox::new(offset, extent));
            }
            next[d] = 0;
            d -= 1;
            next[d] += 1;
        }
        self.next = Some(next);
        Some(SliceBox::new(offset, extent))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn covered(shape: &[usize], elem: usize, max: usize) -> Vec<SliceBox> {
        let chunks: Vec<SliceBox> = Chunks::new(shape, elem, max).collect();
        let total: usize = chunks.iter().map(SliceBox::n_elements).sum();
        assert_eq!(total, shape.iter().product::<usize>());
        // Row-major contiguity: each chunk starts where the last ended.
        let strides = layout::row_major_strides(shape);
        let mut at = 0;
        for c in &chunks {
            let start: usize = c.offset.iter().zip(&strides).map(|(o, s)| o * s).sum();
            assert_eq!(start, at, "{c}");
            at += c.n_elements();
        }
        chunks
    }

    #[test]
    fn chunks_tile_in_order() {
        assert_eq!(covered(&[4, 8], 4, 1 << 20).len(), 1);
        assert_eq!(covered(&[4, 8], 4, 64).len(), 2);
        assert_eq!(covered(&[3, 5, 7], 2, 10).len(), 3 * 5 * 2);
        assert_eq!(covered(&[3, 5, 7], 2, 1).len(), 3 * 5 * 7);
        assert_eq!(covered(&[], 4, 1).len(), 1);
        assert_eq!(Chunks::new(&[0, 4], 4, 16).count(), 0);
    }
}
