//! One checkpoint file of either format, indexed once and read by positioned reads.
//!
//! [`CheckpointFile::open`] reads only the header (safetensors) or scans the value headers
//! (`.ckpt`, without copying tensor contents) and keeps, for every tensor, the byte ranges its
//! data occupies. Reading a box of a stored slice then issues `pread`s for exactly the bytes
//! needed, straight into the caller's buffer, or through a small bounded scratch buffer when the
//! contiguous runs are short.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use layout::SliceBox;
use tensor::region::{copy_region, Placement};
use tensor::Tensor;

use super::box_runs::{contiguous_run, for_each_run};
use crate::error::{io_err, CkptError, Result};
use crate::format::crypto::{self, Decryption};
use crate::format::detect::{checkpoint_format, read_head};
use crate::format::{ms_ckpt, safetensors, Format};
use crate::io::mmap::MappedRange;
use crate::model::StoredTensor;
use crate::set::SET_ID_KEY;

/// Bytes of a checkpoint file's start the detection step looks at when it is opened (enough
/// for an encrypted file's magic number and safetensors' header length).
const CHECKPOINT_HEAD_BYTES: usize = 64;

/// Below this many contiguous bytes per run, a box is read through the scratch buffer (one
/// large read, then an in-memory copy) instead of one `pread` per run. 64 KiB: a syscall costs
/// about as much as copying a few KiB, so shorter runs are cheaper to over-read.
const DIRECT_RUN_BYTES: u64 = 64 << 10;
/// Largest scratch read, so memory stays bounded whatever the tensor size.
const SCRATCH_BYTES: u64 = 8 << 20;
/// The scratch path over-reads whole rows; it is used only while it reads at most this many
/// times the bytes needed.
const MAX_OVERREAD: u64 = 4;

/// Reads of at least this many bytes through the scratch path map the file instead of copying
/// it into the scratch buffer: one memory copy instead of two. Measured on the
/// `tessera bench ckpt-convert` workload (every piece a whole 16 MiB source slice), the CPU part
/// of the conversion dropped from about 0.72 s to 0.54 s per GiB.
const MAP_MIN_BYTES: u64 = 1 << 20;

/// A checkpoint file, indexed and open for positioned reads.
#[derive(Debug)]
pub struct CheckpointFile {
    path: PathBuf,
    format: Format,
    file: File,
    tensors: Vec<StoredTensor>,
    by_name: HashMap<String, usize>,
    metadata: BTreeMap<String, String>,
    crc: Option<u32>,
}

impl CheckpointFile {
    /// Opens and indexes `path`. The format comes from the extension (`.safetensors`,
    /// `.ckpt`); any other name is read as `.ckpt` unless the detection step finds
    /// safetensors ([`crate::format::detect()`]).
    /// A `.ckpt` file with a `crc_num` trailer is checked against it.
    pub fn open(path: &Path) -> Result<CheckpointFile> {
        CheckpointFile::open_with(path, None)
    }

    /// [`CheckpointFile::open`], decrypting a MindSpore-encrypted `.ckpt` file with `dec`
    /// (see [`crate::crypto`]). With `dec`, the file must be an encrypted `.ckpt`; without it,
    /// an encrypted file is an error that says so.
    pub fn open_with(path: &Path, dec: Option<&Decryption>) -> Result<CheckpointFile> {
        CheckpointFile::open_as(path, None, dec)
    }

    /// [`CheckpointFile::open_with`], reading the file in `format` when it is given (the format
    /// the detection step found in its bytes) instead of the one its name declares.
    pub(crate) fn open_as(
        path: &Path,
        format: Option<Format>,
        dec: Option<&Decryption>,
    ) -> Result<CheckpointFile> {
        // A weight map may name any path: a FIFO there would wait for a writer.
        let (mut file, mut len) = crate::format::detect::open_regular(path)?;
        let head = read_head(path, &file, len, CHECKPOINT_HEAD_BYTES)?;
        let (named, cipher) = checkpoint_format(path, &head, len);
        let format = format.unwrap_or(named);
        if format == Format::Ckpt {
            match (dec, cipher) {
                (Some(dec), _) => (file, len) = crypto::decrypt_file(path, dec)?,
                (None, Some(mode)) => {
                    return Err(CkptError::Decrypt {
                        path: path.to_path_buf(),
                        reason: format!(
                            "the file is encrypted ({mode}); pass dec_key (and dec_mode='{mode}')"
                        ),
                    })
                }
                (None, None) => {}
            }
        } else if dec.is_some() {
            return Err(CkptError::Decrypt {
                path: path.to_path_buf(),
                reason: "a key was given, but only .ckpt files are encrypted (MindSpore refuses dec_key for safetensors)".to_string(),
            });
        }
        let (tensors, metadata, crc) = match format {
            Format::Safetensors => {
                let h = safetensors::read_header(path, &file, len)?;
                (h.tensors, h.metadata, None)
            }
            Format::Ckpt => {
                let scan = ms_ckpt::scan(path, &file, len)?;
                (scan.tensors, BTreeMap::new(), scan.crc)
            }
        };
        let mut by_name = HashMap::with_capacity(tensors.len());
        for (i, t) in tensors.iter().enumerate() {
            if by_name.insert(t.name.clone(), i).is_some() {
                return Err(CkptError::CkptValue {
                    path: path.to_path_buf(),
                    tensor: t.name.clone(),
                    rule: "the name appears twice in one file".to_string(),
                });
            }
        }
        Ok(CheckpointFile {
            path: path.to_path_buf(),
            format,
            file,
            tensors,
            by_name,
            metadata,
            crc,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Checks a safetensors file's `crc_num` metadata, when it has one (MindSpore's CRC32
    /// chained over each tensor's name then data, in name order). Reads every tensor.
    pub fn verify_metadata_crc(&self) -> Result<()> {
        let Some(stored) = self.metadata.get("crc_num") else {
            return Ok(());
        };
        let stored: u64 = stored.parse().map_err(|_| CkptError::InvalidHeader {
            path: self.path.clone(),
            reason: format!("metadata crc_num {stored:?} is not a number"),
        })?;
        let mut names: Vec<&str> = self.tensors.iter().map(|t| t.name.as_str()).collect();
        names.sort_unstable();
        let mut hasher = crc32fast::Hasher::new();
        let mut buf = Vec::new();
        for name in names {
            hasher.update(name.as_bytes());
            let t = self.tensor(name).expect("listed");
            let mut at = 0;
            while at < t.n_bytes {
                let n = (t.n_bytes - at).min(4 << 20) as usize;
                buf.resize(n, 0);
                self.read_bytes(t, at, &mut buf)?;
                hasher.update(&buf);
                at += n as u64;
            }
        }
        let computed = hasher.finalize();
        if u64::from(computed) != stored {
            return Err(CkptError::CrcMismatch {
                path: self.path.clone(),
                stored,
                computed,
            });
        }
        Ok(())
    }

    /// The set id a safetensors file carries in its metadata (`tessera_set`), if any.
    pub fn set_id(&self) -> Option<&str> {
        self.metadata.get(SET_ID_KEY).map(String::as_str)
    }

    /// The format.
    pub fn format(&self) -> Format {
        self.format
    }

    /// The tensors, in file order.
    pub fn tensors(&self) -> &[StoredTensor] {
        &self.tensors
    }

    /// The tensor called `name`.
    pub fn tensor(&self, name: &str) -> Option<&StoredTensor> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    /// Safetensors `__metadata__` (empty for `.ckpt`).
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }

    /// The verified CRC32 of a `.ckpt` file with a `crc_num` trailer.
    pub fn crc(&self) -> Option<u32> {
        self.crc
    }

    /// Whether the file says it was saved without redundancy (`remove_redundancy: "True"`).
    pub fn removes_redundancy(&self) -> bool {
        self.metadata
            .get("remove_redundancy")
            .is_some_and(|v| v == "True")
    }

    /// Reads `buf.len()` bytes of `t`'s data starting at byte `offset` of the data.
    pub fn read_bytes(&self, t: &StoredTensor, mut offset: u64, mut buf: &mut [u8]) -> Result<()> {
        for e in &t.extents {
            if buf.is_empty() {
                break;
            }
            if offset >= e.len {
                offset -= e.len;
                continue;
            }
            let n = (e.len - offset).min(buf.len() as u64) as usize;
            let (head, rest) = buf.split_at_mut(n);
            self.file
                .read_exact_at(head, e.file_offset + offset)
                .map_err(io_err(&self.path, "read"))?;
            buf = rest;
            offset = 0;
        }
        if !buf.is_empty() {
            return Err(CkptError::CkptValue {
                path: self.path.clone(),
                tensor: t.name.clone(),
                rule: "a read ran past the end of the tensor's data".to_string(),
            });
        }
        Ok(())
    }

    /// Reads the whole tensor `name` into memory.
    pub fn read_tensor(&self, name: &str) -> Result<Tensor> {
        let t = self.tensor(name).ok_or_else(|| CkptError::TensorMissing {
            path: self.path.clone(),
            tensor: name.to_string(),
            rule: "it was asked for".to_string(),
        })?;
        let dtype = t.dtype().ok_or_else(|| CkptError::Unsupported {
            path: self.path.clone(),
            tensor: name.to_string(),
            reason: format!("MindSpore type {} cannot be read as a tensor", t.ty),
        })?;
        let mut tensor = Tensor::zeros(dtype, &t.shape);
        self.read_bytes(t, 0, tensor.as_bytes_mut())?;
        Ok(tensor)
    }

    /// Copies the box `region` of stored tensor `t` (coordinates relative to the stored slice)
    /// into `dst`, a row-major buffer of shape `dst_shape`, at `dst_offset`.
    ///
    /// Long contiguous runs are read with one `pread` each straight into `dst`; short runs go
    /// through `scratch` (at most [`SCRATCH_BYTES`]) when reading whole rows over-reads by at
    /// most [`MAX_OVERREAD`] times.
    pub(crate) fn read_box(
        &self,
        t: &StoredTensor,
        region: &SliceBox,
        dst: &mut [u8],
        dst_shape: &[usize],
        dst_offset: &[usize],
        scratch: &mut Vec<u8>,
    ) -> Result<()> {
        let dtype = t.dtype().ok_or_else(|| CkptError::Unsupported {
            path: self.path.clone(),
            tensor: t.name.clone(),
            reason: format!("MindSpore type {} cannot be sliced", t.ty),
        })?;
        let elem = dtype.size_in_bytes() as u64;
        let src_shape = &t.shape;
        let ndim = src_shape.len();
        if region.is_empty() {
            return Ok(());
        }
        if ndim == 0 {
            return self.read_bytes(t, 0, &mut dst[..elem as usize]);
        }
        // Trailing dims that both sides hold whole make one run.
        let (_, run) = contiguous_run(&region.shape, src_shape, dst_shape);
        let run = run as u64;
        let src_strides = layout::row_major_strides(src_shape);
        let row_elems = src_strides[0] as u64; // elements per index of dim 0
        let needed = region.n_elements() as u64 * elem;
        let rows_bytes = region.shape[0] as u64 * row_elems * elem;
        let use_scratch = run * elem < DIRECT_RUN_BYTES && rows_bytes <= needed * MAX_OVERREAD;
        if use_scratch {
            // Read whole rows of dim 0 in blocks, then copy the box out of memory.
            let rows_per_block = (SCRATCH_BYTES / (row_elems * elem).max(1)).max(1) as usize;
            let mut row = 0;
            while row < region.shape[0] {
                let n_rows = rows_per_block.min(region.shape[0] - row);
                let start_row = region.offset[0] + row;
                let bytes = n_rows as u64 * row_elems * elem;
                let logical = start_row as u64 * row_elems * elem;
                let mapped = if bytes >= MAP_MIN_BYTES {
                    self.map_range_of(t, logical, bytes)
                } else {
                    None
                };
                let src_bytes: &[u8] = match &mapped {
                    Some(m) => m.bytes(),
                    None => {
                        scratch.resize(bytes as usize, 0);
                        self.read_bytes(t, logical, scratch)?;
                        scratch
                    }
                };
                let mut block_shape = src_shape.clone();
                block_shape[0] = n_rows;
                let mut src_off = region.offset.clone();
                src_off[0] = 0;
                let mut dst_off = dst_offset.to_vec();
                dst_off[0] += row;
                let mut block_extent = region.shape.clone();
                block_extent[0] = n_rows;
                copy_region(
                    src_bytes,
                    Placement {
                        shape: &block_shape,
                        offset: &src_off,
                    },
                    dst,
                    Placement {
                        shape: dst_shape,
                        offset: &dst_off,
                    },
                    &block_extent,
                    elem as usize,
                );
                row += n_rows;
            }
            return Ok(());
        }
        // One pread per contiguous run, straight into the destination.
        let e = elem as usize;
        for_each_run(
            src_shape,
            &region.offset,
            dst_shape,
            dst_offset,
            &region.shape,
            |src, dst_at, n| {
                self.read_bytes(t, (src * e) as u64, &mut dst[dst_at * e..(dst_at + n) * e])
            },
        )
    }
}

impl CheckpointFile {
    /// A read-only mapping of `bytes` bytes of `t`'s data from byte `logical`, when they lie in
    /// one extent and the kernel agrees.
    pub(crate) fn map_range_of(
        &self,
        t: &StoredTensor,
        logical: u64,
        bytes: u64,
    ) -> Option<MappedRange> {
        let mut off = logical;
        let e = t.extents.iter().find(|e| {
            if off < e.len {
                true
            } else {
                off -= e.len;
                false
            }
        })?;
        if off.checked_add(bytes)? > e.len {
            return None;
        }
        MappedRange::new(&self.file, e.file_offset + off, bytes as usize)
    }
}
