//! Writing a planned file: each output tensor goes out in bounded chunks (runs of rows of its
//! box). Safetensors output is written straight from mapped source pages with `pwritev`
//! ([`super::direct`]: one copy, at most one chunk of source mappings at a time). `.ckpt` output
//! (protobuf framing, an optional CRC) is assembled from positioned reads into two circulating
//! chunk buffers ([`super::options::DEFAULT_CHUNK_BYTES`] each by default: one being assembled, one being written
//! by the writer thread) plus a small read scratch buffer. Either way memory stays bounded,
//! whatever the checkpoint size.

use std::path::Path;

use super::direct;
use super::gather::{fill_chunk, missing, Chunks};
use super::options::{data_bytes, FileStats, WriteOptions};
use super::plan::{ItemSource, OutItem};
use crate::error::{CkptError, Result};
use crate::format::ms_ckpt::CkptWriter;
use crate::format::safetensors::{self, canonical_order};
use crate::format::Format;
use crate::io::atomic_write::AtomicFile;
use crate::model::TensorMeta;
use crate::progress::stop_point;
use crate::source::SourceSet;

/// Writes `items` to `dest`. Safetensors output is reordered as the reference writer orders
/// tensors; `.ckpt` output keeps the given order. The progress sink's stop is polled before the
/// file is created, after every chunk and before the commit; a stop returns
/// [`CkptError::Stopped`] and removes the temporary file.
pub(crate) fn write_items(
    sources: &SourceSet,
    dest: &Path,
    mut items: Vec<OutItem<'_>>,
    metadata: &[(String, String)],
    opts: &WriteOptions<'_>,
) -> Result<FileStats> {
    stop_point(opts.progress)?;
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
        let written = handle.join().unwrap_or(Err(CkptError::ThreadPanicked {
            thread: "the writing thread",
        }));
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

/// Hands a finished file to the committer (or commits it now) and reports it done; a stop asked
/// for first drops it instead (removing its temporary file).
fn commit_file(file: AtomicFile, stats: FileStats, opts: &WriteOptions<'_>) -> Result<FileStats> {
    stop_point(opts.progress)?;
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
/// files' pages ([`super::direct`]).
fn write_safetensors(
    sources: &SourceSet,
    dest: &Path,
    items: &[OutItem<'_>],
    metas: &[TensorMeta],
    metadata: &[(String, String)],
    opts: &WriteOptions<'_>,
) -> Result<FileStats> {
    let header = safetensors::header_bytes(dest, metadata, metas)?;
    let mut out = AtomicFile::create(dest, opts.force, opts.durability)?;
    out.write_all(&header)?;
    let path = out.dest().to_path_buf();
    direct::write_data(
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

    /// Queues a filled buffer for writing, then polls the progress sink's stop.
    fn send(&mut self, buf: Vec<u8>, opts: &WriteOptions<'_>) -> Result<()> {
        let n = buf.len() as u64;
        self.full
            .as_ref()
            .expect("an open pipe")
            .send(buf)
            .map_err(|_| self.writer_gone())?;
        opts.progress.advance(n);
        stop_point(opts.progress)
    }

    fn writer_gone(&self) -> CkptError {
        // The writer thread stopped early; its own error is reported when it is joined.
        CkptError::ThreadStopped {
            thread: "the writing thread",
        }
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
