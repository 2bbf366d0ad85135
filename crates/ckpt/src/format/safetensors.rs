//! Safetensors: a validating header reader and a streaming writer.
//!
//! The `safetensors` crate wants whole buffers; checkpoints here are larger than memory should
//! hold, so this module reads only the header (tensor data is read later, by positioned reads of
//! the ranges the header gives) and writes tensors one chunk at a time after a header computed
//! up front. The format is specified in the crate documentation.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use serde_json::Value;
use tensor::DType;

use crate::error::{io_err, CkptError, Result};
use crate::io::atomic_write::AtomicFile;
use crate::io::durability::Durability;
use crate::model::tensor::{Extent, StoredTensor, StoredType, TensorMeta, MAX_DIMS};

/// Largest JSON header accepted, as the reference implementation (100 MB).
pub const MAX_HEADER_SIZE: u64 = 100_000_000;

/// What [`read_header`] returns: the `__metadata__` map and the tensors in file order.
#[derive(Debug, Clone)]
pub(crate) struct Header {
    pub metadata: BTreeMap<String, String>,
    pub tensors: Vec<StoredTensor>,
}

/// Whether `head`, the first bytes of a file of `len` bytes, starts like safetensors: a
/// little-endian header length within the cap and the file, then `{`. The evidence, or why not
/// (for the detection step).
pub(crate) fn sniff(head: &[u8], len: u64) -> std::result::Result<String, String> {
    let Some(len_bytes) = head.get(..8) else {
        return Err(format!(
            "not safetensors: {len} bytes cannot hold the 8-byte header length and a header"
        ));
    };
    let n = u64::from_le_bytes(len_bytes.try_into().expect("8 bytes"));
    if n > MAX_HEADER_SIZE {
        return Err(format!(
            "not safetensors: the header length {n} is over the {MAX_HEADER_SIZE}-byte limit"
        ));
    }
    if 8 + n > len {
        return Err(format!(
            "not safetensors: the header length {n} runs past the end of the file"
        ));
    }
    if head.get(8) != Some(&b'{') {
        return Err("not safetensors: the header does not start with '{'".to_string());
    }
    Ok(format!(
        "an 8-byte header length ({n}) followed by a JSON header"
    ))
}

/// Reads and validates the header of the safetensors file `file` (of `file_len` bytes).
///
/// Checks, in this order: the 8-byte length is present and below [`MAX_HEADER_SIZE`]; the
/// header fits in the file; it is UTF-8 JSON, an object whose `__metadata__` (if any) maps
/// strings to strings; every tensor has a known dtype, a shape whose byte size does not
/// overflow, and `data_offsets` whose span equals dtype × shape; the tensors tile the data
/// buffer from byte 0 without holes or overlaps; and the buffer ends where the last tensor does.
pub(crate) fn read_header(path: &Path, file: &File, file_len: u64) -> Result<Header> {
    let truncated = |reason: String| CkptError::SafetensorsTruncated {
        path: path.to_path_buf(),
        reason,
    };
    if file_len < 8 {
        return Err(truncated(format!(
            "{file_len} bytes, but the header length alone takes 8"
        )));
    }
    let mut len_bytes = [0u8; 8];
    file.read_exact_at(&mut len_bytes, 0)
        .map_err(io_err(path, "read"))?;
    let header_len = u64::from_le_bytes(len_bytes);
    if header_len > MAX_HEADER_SIZE {
        return Err(CkptError::HeaderTooLarge {
            path: path.to_path_buf(),
            size: header_len,
            max: MAX_HEADER_SIZE,
        });
    }
    if 8 + header_len > file_len {
        return Err(truncated(format!(
            "the header announces {header_len} bytes but only {} follow",
            file_len - 8
        )));
    }
    let mut header = vec![0u8; header_len as usize];
    file.read_exact_at(&mut header, 8)
        .map_err(io_err(path, "read"))?;
    let data_len = file_len - 8 - header_len;
    parse_header(path, &header, data_len, 8 + header_len)
}

/// Validates a header held in memory. `data_len` is the size of the data buffer and
/// `data_start` its offset in the file.
pub(crate) fn parse_header(
    path: &Path,
    header: &[u8],
    data_len: u64,
    data_start: u64,
) -> Result<Header> {
    let invalid = |reason: String| CkptError::InvalidHeader {
        path: path.to_path_buf(),
        reason,
    };
    let text = std::str::from_utf8(header)
        .map_err(|e| invalid(format!("the header is not UTF-8 ({e})")))?;
    let value: Value =
        serde_json::from_str(text).map_err(|e| invalid(format!("the header is not JSON ({e})")))?;
    let Value::Object(map) = value else {
        return Err(invalid("the header is not a JSON object".to_string()));
    };
    // The parsed object keeps the last of two equal keys: which tensor a name means would
    // depend on the order, so a repeated name is refused as such.
    let keys = crate::format::codec::json::object_keys(text)
        .map_err(|e| invalid(format!("the header is not JSON ({e})")))?
        .keys;
    if keys.len() != map.len() {
        let mut seen = std::collections::HashSet::with_capacity(keys.len());
        if let Some(k) = keys.iter().find(|k| !seen.insert(k.as_str())) {
            return Err(invalid(format!(
                "the key {:?} appears more than once",
                crate::error::brief_name(k)
            )));
        }
    }
    let mut metadata = BTreeMap::new();
    let mut raw = Vec::with_capacity(map.len());
    for (name, entry) in map {
        if name == "__metadata__" {
            let Value::Object(meta) = entry else {
                return Err(invalid("__metadata__ is not an object".to_string()));
            };
            for (k, v) in meta {
                let Value::String(s) = v else {
                    return Err(invalid(format!(
                        "__metadata__ value for {:?} is not a string",
                        crate::error::brief_name(&k)
                    )));
                };
                metadata.insert(k, s);
            }
            continue;
        }
        raw.push(parse_entry(path, name, entry)?);
    }
    // Tensors must tile the data buffer: sorted by offsets, each starts where the last ended.
    raw.sort_by_key(|a| (a.begin, a.end));
    let mut expected_start = 0u64;
    let mut tensors = Vec::with_capacity(raw.len());
    for e in raw {
        if e.begin != expected_start {
            return Err(CkptError::InvalidOffsets {
                path: path.to_path_buf(),
                tensor: e.name,
                offsets: [e.begin, e.end],
                expected_start,
            });
        }
        expected_start = e.end;
        tensors.push(StoredTensor {
            name: e.name,
            ty: StoredType::DType(e.dtype),
            shape: e.shape,
            n_bytes: e.end - e.begin,
            extents: vec![Extent {
                file_offset: data_start + e.begin,
                len: e.end - e.begin,
            }],
        });
    }
    if expected_start != data_len {
        return Err(CkptError::DataLength {
            path: path.to_path_buf(),
            described: expected_start,
            actual: data_len,
        });
    }
    Ok(Header { metadata, tensors })
}

struct RawEntry {
    name: String,
    dtype: DType,
    shape: Vec<usize>,
    begin: u64,
    end: u64,
}

fn parse_entry(path: &Path, name: String, entry: Value) -> Result<RawEntry> {
    let bad = |what: &str| CkptError::InvalidHeader {
        path: path.to_path_buf(),
        reason: format!("tensor {:?}: {what}", crate::error::brief_name(&name)),
    };
    let Value::Object(fields) = &entry else {
        return Err(bad("the entry is not an object"));
    };
    let dtype_name = fields
        .get("dtype")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("missing or non-string \"dtype\""))?;
    let shape_json = fields
        .get("shape")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("missing or non-array \"shape\""))?;
    let offsets = fields
        .get("data_offsets")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("missing or non-array \"data_offsets\""))?;
    if shape_json.len() > MAX_DIMS {
        return Err(bad(&format!(
            "\"shape\" has {} dims, more than the {MAX_DIMS} a checkpoint tensor may have",
            shape_json.len()
        )));
    }
    let mut shape64 = Vec::with_capacity(shape_json.len());
    for d in shape_json {
        shape64
            .push(d.as_u64().ok_or_else(|| {
                bad("\"shape\" holds a value that is not a non-negative integer")
            })?);
    }
    let [begin, end] = match offsets.as_slice() {
        [a, b] => [
            a.as_u64()
                .ok_or_else(|| bad("\"data_offsets\" are not non-negative integers"))?,
            b.as_u64()
                .ok_or_else(|| bad("\"data_offsets\" are not non-negative integers"))?,
        ],
        _ => return Err(bad("\"data_offsets\" must hold exactly two integers")),
    };
    let dtype =
        DType::from_safetensors_name(dtype_name).ok_or_else(|| CkptError::UnknownDType {
            path: path.to_path_buf(),
            tensor: name.clone(),
            dtype: dtype_name.to_string(),
        })?;
    let overflow = || CkptError::ShapeOverflow {
        path: path.to_path_buf(),
        tensor: name.clone(),
        shape: shape64.clone(),
    };
    let n_bytes = shape64
        .iter()
        .try_fold(dtype.size_in_bytes() as u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(overflow)?;
    let shape = shape64
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| overflow()))
        .collect::<Result<Vec<usize>>>()?;
    if end < begin {
        return Err(CkptError::InvalidOffsets {
            path: path.to_path_buf(),
            tensor: name,
            offsets: [begin, end],
            expected_start: begin,
        });
    }
    if end - begin != n_bytes {
        return Err(CkptError::TensorByteLength {
            path: path.to_path_buf(),
            tensor: name,
            dtype,
            shape,
            expected: n_bytes,
            got: end - begin,
        });
    }
    Ok(RawEntry {
        name,
        dtype,
        shape,
        begin,
        end,
    })
}

/// Rank of a dtype in the reference library's enum, which orders tensors in a file: larger
/// kinds first (`U64, I64, F64, F32, U32, I32, BF16, F16, U16, I16, I8, U8, BOOL`), then by name.
fn library_rank(dtype: DType) -> u8 {
    match dtype {
        DType::Bool => 0,
        DType::U8 => 1,
        DType::I8 => 2,
        DType::I16 => 3,
        DType::U16 => 4,
        DType::F16 => 5,
        DType::BF16 => 6,
        DType::I32 => 7,
        DType::U32 => 8,
        DType::F32 => 9,
        DType::F64 => 10,
        DType::I64 => 11,
        DType::U64 => 12,
    }
}

/// Sorts tensors the way the reference writer lays them out (dtype descending, then name), so
/// our files match the bytes MindSpore's `safetensors` package writes.
pub(crate) fn canonical_order(metas: &mut [TensorMeta]) {
    metas.sort_by(|a, b| {
        let ka = a.dtype().map_or(0, library_rank);
        let kb = b.dtype().map_or(0, library_rank);
        kb.cmp(&ka).then_with(|| a.name.cmp(&b.name))
    });
}

/// Builds the header bytes (length prefix included) for `tensors` in the given order.
pub(crate) fn header_bytes(
    path: &Path,
    metadata: &[(String, String)],
    tensors: &[TensorMeta],
) -> Result<Vec<u8>> {
    let mut json = String::from("{");
    let quote = |s: &str| serde_json::to_string(s).expect("a string serializes");
    let mut first = true;
    if !metadata.is_empty() {
        json.push_str("\"__metadata__\":{");
        for (i, (k, v)) in metadata.iter().enumerate() {
            if i > 0 {
                json.push(',');
            }
            json.push_str(&quote(k));
            json.push(':');
            json.push_str(&quote(v));
        }
        json.push('}');
        first = false;
    }
    let mut offset = 0u64;
    for t in tensors {
        let StoredType::DType(dtype) = &t.ty else {
            return Err(CkptError::Unsupported {
                path: path.to_path_buf(),
                tensor: t.name.clone(),
                reason: format!(
                    "MindSpore type {} has no safetensors dtype; write this checkpoint as .ckpt",
                    t.ty
                ),
            });
        };
        if !first {
            json.push(',');
        }
        first = false;
        let shape: Vec<String> = t.shape.iter().map(|d| d.to_string()).collect();
        json.push_str(&format!(
            "{}:{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}",
            quote(&t.name),
            dtype.safetensors_name(),
            shape.join(","),
            offset,
            offset + t.n_bytes
        ));
        offset += t.n_bytes;
    }
    json.push('}');
    // Pad with spaces so the data starts 8-byte aligned, as the reference writer does.
    while json.len() % 8 != 0 {
        json.push(' ');
    }
    let mut out = Vec::with_capacity(8 + json.len());
    out.extend_from_slice(&(json.len() as u64).to_le_bytes());
    out.extend_from_slice(json.as_bytes());
    Ok(out)
}

/// Writes a safetensors file tensor by tensor, in chunks, through an [`AtomicFile`].
#[derive(Debug)]
pub(crate) struct SafetensorsWriter {
    out: AtomicFile,
    tensors: Vec<TensorMeta>,
    current: usize,
    written_in_current: u64,
}

impl SafetensorsWriter {
    /// Creates `dest` and writes the header for `tensors`, which must already be in the order
    /// their data will be written.
    pub(crate) fn create(
        dest: &Path,
        metadata: &[(String, String)],
        tensors: Vec<TensorMeta>,
        force: bool,
    ) -> Result<SafetensorsWriter> {
        let header = header_bytes(dest, metadata, &tensors)?;
        let mut out = AtomicFile::create(dest, force, Durability::Fsync)?;
        out.write_all(&header)?;
        let mut w = SafetensorsWriter {
            out,
            tensors,
            current: 0,
            written_in_current: 0,
        };
        w.skip_empty();
        Ok(w)
    }

    fn skip_empty(&mut self) {
        while self.current < self.tensors.len()
            && self.written_in_current == self.tensors[self.current].n_bytes
        {
            self.current += 1;
            self.written_in_current = 0;
        }
    }

    /// Appends the next bytes of the current tensor (a chunk may not cross tensors). Writing
    /// no bytes is always allowed: the data of an empty tensor (a dim of 0) is nothing, also
    /// when it comes last, after every byte was written.
    pub(crate) fn write(&mut self, data: &[u8]) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let Some(t) = self.tensors.get(self.current) else {
            return Err(CkptError::WrittenPastEnd {
                path: self.out.dest().to_path_buf(),
            });
        };
        if self.written_in_current + data.len() as u64 > t.n_bytes {
            return Err(CkptError::TensorOverrun {
                path: self.out.dest().to_path_buf(),
                tensor: t.name.clone(),
                n_bytes: t.n_bytes,
            });
        }
        self.out.write_all(data)?;
        self.written_in_current += data.len() as u64;
        self.skip_empty();
        Ok(())
    }

    /// Checks that every tensor was written whole; the file is then ready to commit.
    pub(crate) fn finish(self) -> Result<AtomicFile> {
        if self.current != self.tensors.len() {
            return Err(CkptError::TensorIncomplete {
                path: self.out.dest().to_path_buf(),
                tensor: self.tensors[self.current].name.clone(),
            });
        }
        Ok(self.out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(name: &str, dtype: DType, shape: &[usize]) -> TensorMeta {
        TensorMeta::new(name, StoredType::DType(dtype), shape.to_vec())
    }

    #[test]
    fn header_matches_reference_layout() {
        // The header of case1's src_safetensors/rank_5 file (see FORMAT_EXAMPLES.txt).
        let mut metas = vec![
            meta("net.w1", DType::F32, &[32, 8]),
            meta("net.b1", DType::F32, &[8]),
            meta("net.w2", DType::F32, &[32, 64]),
            meta("net.emb", DType::F32, &[16, 8]),
            meta("net.h16", DType::F16, &[32, 8]),
            meta("global_step", DType::I32, &[1]),
        ];
        canonical_order(&mut metas);
        let bytes = header_bytes(
            Path::new("x"),
            &[("format".to_string(), "ms".to_string())],
            &metas,
        )
        .unwrap();
        let expected = r#"{"__metadata__":{"format":"ms"},"net.b1":{"dtype":"F32","shape":[8],"data_offsets":[0,32]},"net.emb":{"dtype":"F32","shape":[16,8],"data_offsets":[32,544]},"net.w1":{"dtype":"F32","shape":[32,8],"data_offsets":[544,1568]},"net.w2":{"dtype":"F32","shape":[32,64],"data_offsets":[1568,9760]},"global_step":{"dtype":"I32","shape":[1],"data_offsets":[9760,9764]},"net.h16":{"dtype":"F16","shape":[32,8],"data_offsets":[9764,10276]}}    "#;
        assert_eq!(u64::from_le_bytes(bytes[..8].try_into().unwrap()), 432);
        assert_eq!(std::str::from_utf8(&bytes[8..]).unwrap(), expected);
    }
}
