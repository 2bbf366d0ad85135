//! MindSpore `.ckpt` checkpoints: a scanner that indexes values without copying their
//! contents, and a streaming writer.
//!
//! The file is a concatenation of `Checkpoint` messages (one `value` each), which on the wire
//! is one `Checkpoint` with a repeated `value`; see the crate documentation for the schema.
//! Consecutive values with the same tag are chunks of one tensor and are joined.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use tensor::DType;

use super::codec::wire::{decode_varint, peek_field, put_varint, varint_len};
use crate::error::{io_err, CkptError, Result};
use crate::io::atomic_write::AtomicFile;
use crate::io::durability::Durability;
use crate::model::tensor::{Extent, StoredTensor, StoredType, TensorMeta, MAX_DIMS};

/// MindSpore splits tensors larger than this into several values (512 MiB).
pub const SLICE_BYTES: u64 = 512 << 20;
/// The ASCII marker of the CRC trailer.
pub const CRC_MARKER: &[u8; 7] = b"crc_num";
/// Length of the CRC trailer: the marker and a 10-byte big-endian CRC32.
pub const CRC_TRAILER_LEN: u64 = 17;
/// Caps on the small fields read while scanning (a hostile file cannot make us allocate more).
const MAX_TAG_BYTES: u64 = 1 << 16;
const MAX_TYPE_BYTES: u64 = 64;
/// Buffer of the scanner's positioned reads.
const SCAN_BUF: usize = 64 << 10;

/// What [`scan`] finds.
#[derive(Debug)]
pub(crate) struct Scan {
    pub tensors: Vec<StoredTensor>,
    /// The CRC32 from the trailer, verified against the contents.
    pub crc: Option<u32>,
}

/// Positioned reads through a small buffer, for walking value headers.
struct ScanReader<'f> {
    path: &'f Path,
    file: &'f File,
    end: u64,
    buf: Vec<u8>,
    buf_at: u64,
}

impl<'f> ScanReader<'f> {
    fn malformed(&self, offset: u64, reason: impl Into<String>) -> CkptError {
        CkptError::Protobuf {
            path: self.path.to_path_buf(),
            offset,
            reason: reason.into(),
        }
    }

    /// The bytes `[at, at+n)`, with `at + n <= end`.
    fn bytes(&mut self, at: u64, n: u64) -> Result<&[u8]> {
        if at.checked_add(n).is_none_or(|e| e > self.end) {
            return Err(self.malformed(
                at,
                format!("a field of {n} bytes runs past the end of the data"),
            ));
        }
        let buf_end = self.buf_at + self.buf.len() as u64;
        if at < self.buf_at || at + n > buf_end {
            let want = (n as usize).max(SCAN_BUF).min((self.end - at) as usize);
            self.buf.resize(want, 0);
            self.file
                .read_exact_at(&mut self.buf, at)
                .map_err(io_err(self.path, "read"))?;
            self.buf_at = at;
        }
        let start = (at - self.buf_at) as usize;
        Ok(&self.buf[start..start + n as usize])
    }

    fn varint(&mut self, at: u64) -> Result<(u64, u64)> {
        let avail = (self.end - at).min(10);
        if avail == 0 {
            return Err(self.malformed(at, "truncated varint at the end of the data"));
        }
        let bytes = self.bytes(at, avail)?;
        let (v, n) = decode_varint(bytes).map_err(|r| self.malformed(at, r))?;
        Ok((v, n as u64))
    }

    /// Reads a field key at `at`: (field number, wire type, position after the key).
    fn key(&mut self, at: u64) -> Result<(u64, u8, u64)> {
        let (key, n) = self.varint(at)?;
        Ok((key >> 3, (key & 7) as u8, at + n))
    }

    /// Skips a field's value of `wire_type` starting at `at`; returns the position after it.
    fn skip(&mut self, wire_type: u8, at: u64, limit: u64) -> Result<u64> {
        let next = match wire_type {
            0 => at + self.varint(at)?.1,
            1 => at + 8,
            5 => at + 4,
            2 => {
                let (len, n) = self.varint(at)?;
                at.checked_add(n)
                    .and_then(|p| p.checked_add(len))
                    .ok_or_else(|| self.malformed(at, "length overflows"))?
            }
            t => return Err(self.malformed(at, format!("unsupported wire type {t}"))),
        };
        if next > limit {
            return Err(self.malformed(at, "a field runs past the end of its message"));
        }
        Ok(next)
    }

    /// A length-delimited field's payload range `[start, end)` for a value at `at`.
    fn delimited(&mut self, at: u64, limit: u64) -> Result<(u64, u64)> {
        let (len, n) = self.varint(at)?;
        let start = at + n;
        let end = start
            .checked_add(len)
            .filter(|&e| e <= limit)
            .ok_or_else(|| {
                self.malformed(
                    at,
                    format!("a field of {len} bytes runs past the end of its message"),
                )
            })?;
        Ok((start, end))
    }
}

/// One `Checkpoint.value` as scanned.
struct RawValue {
    tag: String,
    dims: Vec<i64>,
    tensor_type: String,
    content: Extent,
}

/// Whether `head`, the first bytes of a file, starts like a `.ckpt` checkpoint: a
/// `Checkpoint.value` (field 1) holding a tag (field 1) and a tensor (field 2) whose
/// `tensor_type` (field 2) is a type name, or a map tensor (field 3). Looks no further than the
/// first value's type. The evidence, or why not (for the detection step).
pub(crate) fn sniff(head: &[u8]) -> std::result::Result<String, String> {
    let not = |why: &str| Err(format!("not a MindSpore .ckpt: {why}"));
    let Some(value) = peek_field(head).filter(|f| f.field == 1 && f.wire_type == 2) else {
        return not("it does not start with a Checkpoint value (field 1, length-delimited)");
    };
    let mut tag: Option<&str> = None;
    let mut rest = value.payload;
    while let Some(f) = peek_field(rest) {
        match (f.field, f.wire_type) {
            (1, 2) if f.complete => tag = std::str::from_utf8(f.payload).ok(),
            (2, 2) => {
                let Some(tag) = tag else { break };
                return match tensor_type(f.payload) {
                    Ok(ty) => Ok(format!(
                        "protobuf Checkpoint value {tag:?} holding a {ty} tensor"
                    )),
                    Err(dims) if dims > MAX_DIMS => Err(format!(
                        "not a MindSpore .ckpt: its first value's tensor lists more than {MAX_DIMS} dims (at least {dims} before its tensor_type), more than a checkpoint tensor may have"
                    )),
                    Err(_) => not("its first value's tensor has no tensor_type"),
                };
            }
            (3, 2) if tag.is_some() => {
                return Ok(format!(
                    "protobuf Checkpoint value {:?} holding a MapTensor",
                    tag.unwrap_or_default()
                ))
            }
            _ => break,
        }
        match rest.get(f.len as usize..) {
            Some(next) => rest = next,
            None => break,
        }
    }
    not("its first value holds no tag followed by a tensor")
}

/// The `tensor_type` of the first bytes of a `TensorProto`: after its dims, a printable name.
/// Without one, the number of dims read before giving up.
fn tensor_type(mut tensor: &[u8]) -> std::result::Result<&str, usize> {
    let mut dims = 0;
    while let Some(f) = peek_field(tensor) {
        match (f.field, f.wire_type) {
            (1, 0) => dims += 1,
            (1, 2) => dims += f.payload.iter().filter(|&&b| b < 0x80).count(),
            (2, 2) if f.complete && !f.payload.is_empty() => {
                return std::str::from_utf8(f.payload)
                    .ok()
                    .filter(|t| t.bytes().all(|b| b.is_ascii_graphic()))
                    .ok_or(dims);
            }
            _ => return Err(dims),
        }
        tensor = tensor.get(f.len as usize..).ok_or(dims)?;
    }
    Err(dims)
}

/// Indexes the `.ckpt` file `file` of `len` bytes. Verifies the CRC trailer if present.
pub(crate) fn scan(path: &Path, file: &File, len: u64) -> Result<Scan> {
    let (end, crc) = match read_trailer(path, file, len)? {
        Some(stored) => {
            let payload = len - CRC_TRAILER_LEN;
            let computed = crc_of_range(path, file, payload)?;
            if u64::from(computed) != stored {
                return Err(CkptError::CrcMismatch {
                    path: path.to_path_buf(),
                    stored,
                    computed,
                });
            }
            (payload, Some(computed))
        }
        None => (len, None),
    };
    let mut r = ScanReader {
        path,
        file,
        end,
        buf: Vec::new(),
        buf_at: 0,
    };
    let mut values: Vec<RawValue> = Vec::new();
    let mut pos = 0u64;
    while pos < end {
        let (field, wire_type, after_key) = r.key(pos)?;
        if field == 1 && wire_type == 2 {
            let (start, stop) = r.delimited(after_key, end)?;
            values.push(scan_value(&mut r, start, stop)?);
            pos = stop;
        } else if field == 0 {
            return Err(r.malformed(pos, "field number 0 is not valid protobuf"));
        } else {
            pos = r.skip(wire_type, after_key, end)?;
        }
    }
    Ok(Scan {
        tensors: join_chunks(path, values)?,
        crc,
    })
}

fn scan_value(r: &mut ScanReader<'_>, start: u64, stop: u64) -> Result<RawValue> {
    let mut tag: Option<String> = None;
    let mut tensor: Option<(Vec<i64>, String, Extent)> = None;
    let mut pos = start;
    while pos < stop {
        let (field, wire_type, after_key) = r.key(pos)?;
        match (field, wire_type) {
            (1, 2) => {
                let (s, e) = r.delimited(after_key, stop)?;
                if e - s > MAX_TAG_BYTES {
                    return Err(r.malformed(
                        s,
                        format!(
                            "a tag of {} bytes is over the {MAX_TAG_BYTES}-byte limit",
                            e - s
                        ),
                    ));
                }
                let bytes = r.bytes(s, e - s)?.to_vec();
                tag = Some(
                    String::from_utf8(bytes).map_err(|_| r.malformed(s, "the tag is not UTF-8"))?,
                );
                pos = e;
            }
            (2, 2) => {
                let (s, e) = r.delimited(after_key, stop)?;
                tensor = Some(scan_tensor(r, s, e)?);
                pos = e;
            }
            (3, 2) => {
                let (s, _) = r.delimited(after_key, stop)?;
                let name = tag.clone().unwrap_or_default();
                return Err(CkptError::Unsupported {
                    path: r.path.to_path_buf(),
                    tensor: name,
                    reason: format!(
                        "value at byte {s} is a MapTensor, which Tessera does not convert"
                    ),
                });
            }
            (0, _) => return Err(r.malformed(pos, "field number 0 is not valid protobuf")),
            _ => pos = r.skip(wire_type, after_key, stop)?,
        }
    }
    let tag = tag.ok_or_else(|| r.malformed(start, "a checkpoint value without a tag"))?;
    let (dims, tensor_type, content) = tensor.ok_or_else(|| CkptError::CkptValue {
        path: r.path.to_path_buf(),
        tensor: tag.clone(),
        rule: "the value holds no tensor".to_string(),
    })?;
    Ok(RawValue {
        tag,
        dims,
        tensor_type,
        content,
    })
}

fn scan_tensor(
    r: &mut ScanReader<'_>,
    start: u64,
    stop: u64,
) -> Result<(Vec<i64>, String, Extent)> {
    let mut dims = Vec::new();
    let mut tensor_type = None;
    let mut content = None;
    let mut pos = start;
    while pos < stop {
        let (field, wire_type, after_key) = r.key(pos)?;
        match (field, wire_type) {
            (1, 0) => {
                let (v, n) = r.varint(after_key)?;
                dims.push(v as i64);
                pos = after_key + n;
            }
            (1, 2) => {
                // Packed dims.
                let (s, e) = r.delimited(after_key, stop)?;
                let mut p = s;
                while p < e {
                    let (v, n) = r.varint(p)?;
                    dims.push(v as i64);
                    p += n;
                    if p > e {
                        return Err(r.malformed(s, "packed dims run past their field"));
                    }
                    if dims.len() > MAX_DIMS {
                        break;
                    }
                }
                pos = e;
            }
            (2, 2) => {
                let (s, e) = r.delimited(after_key, stop)?;
                if e - s > MAX_TYPE_BYTES {
                    return Err(
                        r.malformed(s, "tensor_type is longer than any MindSpore type name")
                    );
                }
                let bytes = r.bytes(s, e - s)?.to_vec();
                tensor_type = Some(
                    String::from_utf8(bytes)
                        .map_err(|_| r.malformed(s, "tensor_type is not UTF-8"))?,
                );
                pos = e;
            }
            (3, 2) => {
                let (s, e) = r.delimited(after_key, stop)?;
                content = Some(Extent {
                    file_offset: s,
                    len: e - s,
                });
                pos = e;
            }
            (0, _) => return Err(r.malformed(pos, "field number 0 is not valid protobuf")),
            _ => pos = r.skip(wire_type, after_key, stop)?,
        }
        if dims.len() > MAX_DIMS {
            return Err(r.malformed(pos, format!("more than {MAX_DIMS} dims")));
        }
    }
    let tensor_type =
        tensor_type.ok_or_else(|| r.malformed(start, "a tensor without tensor_type"))?;
    let content = content.unwrap_or(Extent {
        file_offset: stop,
        len: 0,
    });
    Ok((dims, tensor_type, content))
}

/// Joins consecutive same-tag values into tensors and checks each against its dims and type.
fn join_chunks(path: &Path, values: Vec<RawValue>) -> Result<Vec<StoredTensor>> {
    let mut out: Vec<(StoredTensor, Vec<i64>)> = Vec::new();
    for v in values {
        if let Some((last, last_dims)) = out.last_mut() {
            if last.name == v.tag {
                if *last_dims != v.dims || last.ty.mindspore_name() != v.tensor_type {
                    return Err(CkptError::CkptValue {
                        path: path.to_path_buf(),
                        tensor: v.tag,
                        rule: format!(
                            "chunks of one tensor must repeat the same dims and type, but {:?} {} follows {:?} {}",
                            v.dims, v.tensor_type, last_dims, last.ty
                        ),
                    });
                }
                last.n_bytes += v.content.len;
                last.extents.push(v.content);
                continue;
            }
        }
        let ty = match DType::from_mindspore_name(&v.tensor_type) {
            Some(d) => StoredType::DType(d),
            None => StoredType::Opaque(v.tensor_type.clone()),
        };
        out.push((
            StoredTensor {
                name: v.tag,
                ty,
                shape: Vec::new(),
                n_bytes: v.content.len,
                extents: vec![v.content],
            },
            v.dims,
        ));
    }
    let mut tensors = Vec::with_capacity(out.len());
    for (mut t, dims) in out {
        t.shape = checked_shape(path, &t, &dims)?;
        tensors.push(t);
    }
    Ok(tensors)
}

/// The shape of a value from its dims, checked against its byte count when the type is known.
/// A value of one element stored with `dims [0]` is MindSpore's spelling of a 0-dim tensor.
fn checked_shape(path: &Path, t: &StoredTensor, dims: &[i64]) -> Result<Vec<usize>> {
    let bad = |rule: String| CkptError::CkptValue {
        path: path.to_path_buf(),
        tensor: t.name.clone(),
        rule,
    };
    let mut shape = Vec::with_capacity(dims.len());
    for &d in dims {
        let d =
            usize::try_from(d).map_err(|_| bad(format!("dims {dims:?} hold a negative size")))?;
        shape.push(d);
    }
    let Some(dtype) = t.dtype() else {
        return Ok(shape);
    };
    let elem = dtype.size_in_bytes() as u64;
    if dims == [0] && t.n_bytes == elem {
        return Ok(Vec::new());
    }
    let expected = shape
        .iter()
        .try_fold(elem, |acc, &d| acc.checked_mul(d as u64))
        .ok_or_else(|| CkptError::ShapeOverflow {
            path: path.to_path_buf(),
            tensor: t.name.clone(),
            shape: shape.iter().map(|&d| d as u64).collect(),
        })?;
    if expected != t.n_bytes {
        return Err(bad(format!(
            "dims {dims:?} of {} need {expected} bytes but tensor_content holds {}",
            t.ty, t.n_bytes
        )));
    }
    Ok(shape)
}

/// The CRC stored in a `crc_num` trailer, if the file ends with one.
fn read_trailer(path: &Path, file: &File, len: u64) -> Result<Option<u64>> {
    if len < CRC_TRAILER_LEN {
        return Ok(None);
    }
    let mut tail = [0u8; CRC_TRAILER_LEN as usize];
    file.read_exact_at(&mut tail, len - CRC_TRAILER_LEN)
        .map_err(io_err(path, "read"))?;
    if &tail[..7] != CRC_MARKER {
        return Ok(None);
    }
    let mut value = 0u64;
    for &b in &tail[7..] {
        value = value.checked_shl(8).unwrap_or(0) | u64::from(b);
    }
    // Ten big-endian bytes; a CRC32 leaves the top six zero. Anything else is data, not a trailer.
    if tail[7..13].iter().any(|&b| b != 0) {
        return Ok(None);
    }
    Ok(Some(value))
}

/// CRC32 (IEEE, as zlib) of the first `n` bytes of `file`, read in bounded chunks.
fn crc_of_range(path: &Path, file: &File, n: u64) -> Result<u32> {
    let mut hasher = crc32fast::Hasher::new();
    let mut buf = vec![0u8; (4 << 20).min(n as usize).max(1)];
    let mut at = 0u64;
    while at < n {
        let k = ((n - at) as usize).min(buf.len());
        file.read_exact_at(&mut buf[..k], at)
            .map_err(io_err(path, "read"))?;
        hasher.update(&buf[..k]);
        at += k as u64;
    }
    Ok(hasher.finalize())
}

/// The bytes that precede `content_len` bytes of content in one serialized
/// `Checkpoint { value { tag, tensor { dims, tensor_type, tensor_content } } }`.
pub(crate) fn value_header(
    tag: &str,
    dims: &[u64],
    tensor_type: &str,
    content_len: u64,
) -> Vec<u8> {
    // TensorProto: dims (field 1, unpacked), tensor_type (2), tensor_content (3).
    let mut tensor_head = Vec::new();
    for &d in dims {
        tensor_head.push(0x08);
        put_varint(&mut tensor_head, d);
    }
    tensor_head.push(0x12);
    put_varint(&mut tensor_head, tensor_type.len() as u64);
    tensor_head.extend_from_slice(tensor_type.as_bytes());
    tensor_head.push(0x1a);
    put_varint(&mut tensor_head, content_len);
    let tensor_len = tensor_head.len() as u64 + content_len;
    // Value: tag (field 1), tensor (field 2).
    let mut value_head = Vec::new();
    value_head.push(0x0a);
    put_varint(&mut value_head, tag.len() as u64);
    value_head.extend_from_slice(tag.as_bytes());
    value_head.push(0x12);
    put_varint(&mut value_head, tensor_len);
    let value_len = value_head.len() as u64 + tensor_len;
    // Checkpoint: value (field 1).
    let mut out =
        Vec::with_capacity(1 + varint_len(value_len) + value_head.len() + tensor_head.len());
    out.push(0x0a);
    put_varint(&mut out, value_len);
    out.extend_from_slice(&value_head);
    out.extend_from_slice(&tensor_head);
    out
}

/// Writes a `.ckpt` file tensor by tensor, in chunks, through an [`AtomicFile`].
///
/// Tensors over [`SLICE_BYTES`] are split into several values with the same tag and dims, as
/// MindSpore does. With `crc`, the `crc_num` trailer is appended.
#[derive(Debug)]
pub(crate) struct CkptWriter {
    out: AtomicFile,
    tensors: Vec<TensorMeta>,
    current: usize,
    written_in_current: u64,
    hasher: Option<crc32fast::Hasher>,
}

impl CkptWriter {
    /// Creates `dest`, to be committed with `durability`; tensors must be written in the
    /// order of `tensors`.
    pub(crate) fn create(
        dest: &Path,
        tensors: Vec<TensorMeta>,
        crc: bool,
        force: bool,
        durability: Durability,
    ) -> Result<CkptWriter> {
        Ok(CkptWriter {
            out: AtomicFile::create(dest, force, durability)?,
            tensors,
            current: 0,
            written_in_current: 0,
            hasher: crc.then(crc32fast::Hasher::new),
        })
    }

    fn emit(&mut self, data: &[u8]) -> Result<()> {
        if let Some(h) = self.hasher.as_mut() {
            h.update(data);
        }
        self.out.write_all(data)
    }

    /// Writes the value header for the chunk starting at the current position.
    fn start_chunk(&mut self) -> Result<()> {
        let t = &self.tensors[self.current];
        let chunk = (t.n_bytes - self.written_in_current).min(SLICE_BYTES);
        // A 0-dim tensor is written with dims [0], as MindSpore does.
        let dims: Vec<u64> = if t.shape.is_empty() {
            vec![0]
        } else {
            t.shape.iter().map(|&d| d as u64).collect()
        };
        let head = value_header(&t.name, &dims, t.ty.mindspore_name(), chunk);
        self.emit(&head)
    }

    /// Appends the next bytes of data, in tensor order.
    pub(crate) fn write(&mut self, mut data: &[u8]) -> Result<()> {
        while !data.is_empty() {
            self.flush_empty()?;
            let Some(t) = self.tensors.get(self.current) else {
                return Err(CkptError::WrittenPastEnd {
                    path: self.out.dest().to_path_buf(),
                });
            };
            let n_bytes = t.n_bytes;
            if self.written_in_current.is_multiple_of(SLICE_BYTES) {
                self.start_chunk()?;
            }
            let room = SLICE_BYTES - self.written_in_current % SLICE_BYTES;
            let room = room.min(n_bytes - self.written_in_current);
            let k = (data.len() as u64).min(room) as usize;
            self.emit(&data[..k])?;
            self.written_in_current += k as u64;
            data = &data[k..];
            if self.written_in_current == n_bytes {
                self.current += 1;
                self.written_in_current = 0;
            }
        }
        Ok(())
    }

    /// Writes the (content-less) values of empty tensors at the current position.
    fn flush_empty(&mut self) -> Result<()> {
        while self.written_in_current == 0
            && self
                .tensors
                .get(self.current)
                .is_some_and(|t| t.n_bytes == 0)
        {
            self.start_chunk()?;
            self.current += 1;
        }
        Ok(())
    }

    /// Writes the values of empty tensors still pending and the CRC trailer if asked; the file
    /// is then ready to commit.
    pub(crate) fn finish(mut self) -> Result<AtomicFile> {
        self.flush_empty()?;
        if let Some(t) = self.tensors.get(self.current) {
            return Err(CkptError::TensorIncomplete {
                path: self.out.dest().to_path_buf(),
                tensor: t.name.clone(),
            });
        }
        if let Some(h) = self.hasher.take() {
            let crc = u64::from(h.finalize());
            let mut trailer = CRC_MARKER.to_vec();
            trailer.extend_from_slice(&[0u8; 2]);
            trailer.extend_from_slice(&crc.to_be_bytes());
            self.out.write_all(&trailer)?;
        }
        Ok(self.out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_matches_mindspore_bytes() {
        // First bytes of case1 src_ckpt/rank_5 (FORMAT_EXAMPLES.txt):
        // 0a 9b 08 0a 06 'net.w1' 12 90 08 08 20 08 08 12 07 'Float32' 1a 80 08
        let head = value_header("net.w1", &[32, 8], "Float32", 1024);
        let mut expected = vec![0x0a, 0x9b, 0x08, 0x0a, 0x06];
        expected.extend_from_slice(b"net.w1");
        expected.extend_from_slice(&[0x12, 0x90, 0x08, 0x08, 0x20, 0x08, 0x08, 0x12, 0x07]);
        expected.extend_from_slice(b"Float32");
        expected.extend_from_slice(&[0x1a, 0x80, 0x08]);
        assert_eq!(head, expected);
    }

    #[test]
    fn a_tensor_with_too_many_dims_is_named_so_by_the_sniffer() {
        let dims = vec![1u64; 5000];
        let mut file = value_header("w", &dims, "Float32", 4);
        file.extend_from_slice(&[0; 4]);
        // The sniffer sees only the file's first bytes: the dims run past them.
        let why = sniff(&file[..4096]).unwrap_err();
        assert!(why.contains(&format!("more than {MAX_DIMS} dims")), "{why}");
        // A few dims are still read up to the type.
        let mut file = value_header("w", &[2, 3], "Float32", 24);
        file.extend_from_slice(&[0; 24]);
        assert!(sniff(&file).unwrap().contains("Float32"));
    }
}
