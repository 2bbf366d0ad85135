//! A small protobuf wire codec: enough for MindSpore's strategy, group-info and checkpoint
//! messages, with no code generator and no `protoc`.
//!
//! The reader walks fields of one message held in memory and never allocates for payloads
//! (length-delimited fields come back as sub-slices). It accepts repeated scalars both packed
//! and unpacked. The writer reproduces what MindSpore's C++/Python protobuf emits for proto2:
//! fields in number order as the caller writes them, repeated scalars *not* packed, and negative
//! `int32` values as 10-byte sign-extended varints.

/// Wire types of the protobuf encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WireValue<'a> {
    /// Wire type 0.
    Varint(u64),
    /// Wire type 1.
    Fixed64(u64),
    /// Wire type 2 (bytes, strings, sub-messages, packed repeated).
    Bytes(&'a [u8]),
    /// Wire type 5.
    Fixed32(u32),
}

/// A decoding fault: the byte offset (relative to the buffer given to [`Reader::new`]) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WireError {
    pub offset: usize,
    pub reason: String,
}

impl WireError {
    fn at(offset: usize, reason: impl Into<String>) -> WireError {
        WireError {
            offset,
            reason: reason.into(),
        }
    }
}

/// Longest varint: 10 bytes for 64 bits.
const MAX_VARINT_LEN: usize = 10;

/// Decodes a varint at the start of `buf`: the value and its length in bytes.
pub(crate) fn decode_varint(buf: &[u8]) -> Result<(u64, usize), String> {
    let mut value: u64 = 0;
    for (i, &byte) in buf.iter().enumerate().take(MAX_VARINT_LEN) {
        if i == MAX_VARINT_LEN - 1 && byte > 1 {
            return Err("varint overflows 64 bits".to_string());
        }
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Ok((value, i + 1));
        }
    }
    if buf.len() >= MAX_VARINT_LEN {
        Err("varint longer than 10 bytes".to_string())
    } else {
        Err("truncated varint".to_string())
    }
}

/// Iterates over the fields of one message.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    /// Offset of `buf[0]` in the enclosing buffer, for error messages.
    base: usize,
}

impl<'a> Reader<'a> {
    /// A reader over a whole message.
    pub(crate) fn new(buf: &'a [u8]) -> Reader<'a> {
        Reader {
            buf,
            pos: 0,
            base: 0,
        }
    }

    /// A reader over a sub-message found at `base` in the enclosing buffer.
    pub(crate) fn nested(buf: &'a [u8], base: usize) -> Reader<'a> {
        Reader { buf, pos: 0, base }
    }

    /// Absolute offset of the next byte to read.
    pub(crate) fn offset(&self) -> usize {
        self.base + self.pos
    }

    fn varint(&mut self) -> Result<u64, WireError> {
        let at = self.offset();
        let (v, n) = decode_varint(&self.buf[self.pos..]).map_err(|r| WireError::at(at, r))?;
        self.pos += n;
        Ok(v)
    }

    /// The next field: its number, its value and the absolute offset where the value starts.
    pub(crate) fn next_field(&mut self) -> Option<Result<(u32, WireValue<'a>, usize), WireError>> {
        if self.pos >= self.buf.len() {
            return None;
        }
        Some(self.read_field())
    }

    fn read_field(&mut self) -> Result<(u32, WireValue<'a>, usize), WireError> {
        let key_at = self.offset();
        let key = self.varint()?;
        let field = key >> 3;
        if field == 0 || field > u64::from(u32::MAX >> 3) {
            return Err(WireError::at(
                key_at,
                format!("invalid field number {field}"),
            ));
        }
        let value_at = self.offset();
        let value = match key & 7 {
            0 => WireValue::Varint(self.varint()?),
            1 => {
                let bytes = self.take(8)?;
                WireValue::Fixed64(u64::from_le_bytes(bytes.try_into().expect("8 bytes")))
            }
            2 => {
                let len = self.varint()?;
                let len = usize::try_from(len).map_err(|_| {
                    WireError::at(value_at, format!("length {len} does not fit in memory"))
                })?;
                WireValue::Bytes(self.take(len)?)
            }
            5 => {
                let bytes = self.take(4)?;
                WireValue::Fixed32(u32::from_le_bytes(bytes.try_into().expect("4 bytes")))
            }
            t => {
                return Err(WireError::at(
                    key_at,
                    format!("unsupported wire type {t} for field {field} (groups are not used by MindSpore files)"),
                ))
            }
        };
        Ok((field as u32, value, value_at))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        let at = self.offset();
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| {
                WireError::at(
                    at,
                    format!(
                        "field of {n} bytes runs past the end of its message ({} bytes left)",
                        self.buf.len() - self.pos
                    ),
                )
            })?;
        let out = &self.buf[self.pos..end];
        self.pos = end;
        Ok(out)
    }
}

/// Appends the values of a repeated varint field (packed or not) to `out`.
pub(crate) fn push_varints(
    value: WireValue<'_>,
    at: usize,
    out: &mut Vec<u64>,
) -> Result<(), WireError> {
    match value {
        WireValue::Varint(v) => {
            out.push(v);
            Ok(())
        }
        WireValue::Bytes(packed) => {
            let mut pos = 0;
            while pos < packed.len() {
                let (v, n) =
                    decode_varint(&packed[pos..]).map_err(|r| WireError::at(at + pos, r))?;
                out.push(v);
                pos += n;
            }
            Ok(())
        }
        _ => Err(WireError::at(at, "expected a varint (or packed varints)")),
    }
}

/// The varint value of a scalar field.
pub(crate) fn expect_varint(value: WireValue<'_>, at: usize, what: &str) -> Result<u64, WireError> {
    match value {
        WireValue::Varint(v) => Ok(v),
        _ => Err(WireError::at(at, format!("{what}: expected a varint"))),
    }
}

/// The payload of a length-delimited field.
pub(crate) fn expect_bytes<'a>(
    value: WireValue<'a>,
    at: usize,
    what: &str,
) -> Result<&'a [u8], WireError> {
    match value {
        WireValue::Bytes(b) => Ok(b),
        _ => Err(WireError::at(
            at,
            format!("{what}: expected a length-delimited field"),
        )),
    }
}

/// A UTF-8 string field.
pub(crate) fn expect_string(
    value: WireValue<'_>,
    at: usize,
    what: &str,
) -> Result<String, WireError> {
    let bytes = expect_bytes(value, at, what)?;
    String::from_utf8(bytes.to_vec())
        .map_err(|_| WireError::at(at, format!("{what}: not valid UTF-8")))
}

/// Interprets a varint as proto `int32` (two's complement, sign-extended to 64 bits on the wire).
pub(crate) fn as_int32(v: u64, at: usize, what: &str) -> Result<i32, WireError> {
    let signed = v as i64;
    i32::try_from(signed)
        .map_err(|_| WireError::at(at, format!("{what}: {signed} is not an int32")))
}

/// Interprets a varint as proto `uint32`.
pub(crate) fn as_uint32(v: u64, at: usize, what: &str) -> Result<u32, WireError> {
    u32::try_from(v).map_err(|_| WireError::at(at, format!("{what}: {v} is not a uint32")))
}

/// Reads every varint of a `{repeated <int> dim = 1}` message (MindSpore's `dim` lists:
/// strategy tuples, device matrices, rank lists), packed or not.
pub(crate) fn decode_dims(bytes: &[u8], base: usize) -> Result<Vec<u64>, WireError> {
    let mut r = Reader::nested(bytes, base);
    let mut out = Vec::new();
    while let Some(f) = r.next_field() {
        let (field, value, at) = f?;
        if field == 1 {
            push_varints(value, at, &mut out)?;
        }
    }
    Ok(out)
}

/// The first field of a buffer that may be cut short (the first bytes of a file): what the
/// detection step looks at without reading a whole message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PeekedField<'a> {
    /// The field number.
    pub field: u64,
    /// The wire type.
    pub wire_type: u8,
    /// The payload as far as the buffer holds it (the varint's bytes for wire type 0).
    pub payload: &'a [u8],
    /// Whether the buffer holds the whole payload.
    pub complete: bool,
    /// Bytes the whole field takes (key and payload), possibly past the buffer's end.
    pub len: u64,
}

/// The field at the start of `buf`, or `None` when `buf` does not start with a valid key and
/// value header.
pub(crate) fn peek_field(buf: &[u8]) -> Option<PeekedField<'_>> {
    let (key, key_len) = decode_varint(buf).ok()?;
    let (field, wire_type) = (key >> 3, (key & 7) as u8);
    if field == 0 {
        return None;
    }
    let rest = &buf[key_len..];
    let (start, payload_len) = match wire_type {
        0 => (0, decode_varint(rest).ok()?.1 as u64),
        1 => (0, 8),
        5 => (0, 4),
        2 => {
            let (n, n_len) = decode_varint(rest).ok()?;
            (n_len, n)
        }
        _ => return None,
    };
    let end = (start as u64).checked_add(payload_len)?;
    let available = rest.len() - start;
    let complete = end <= rest.len() as u64;
    let payload = &rest[start..start + (payload_len.min(available as u64) as usize)];
    Some(PeekedField {
        field,
        wire_type,
        payload,
        complete,
        len: key_len as u64 + end,
    })
}

/// Encodes a varint onto `out`.
pub(crate) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Number of bytes [`put_varint`] writes for `v`.
pub(crate) fn varint_len(v: u64) -> usize {
    let bits = 64 - v.max(1).leading_zeros() as usize;
    bits.div_ceil(7).max(1)
}

/// Builds a message by appending fields.
#[derive(Debug, Default)]
pub(crate) struct Writer {
    pub buf: Vec<u8>,
}

impl Writer {
    pub(crate) fn new() -> Writer {
        Writer::default()
    }

    fn key(&mut self, field: u32, wire_type: u8) {
        put_varint(
            &mut self.buf,
            (u64::from(field) << 3) | u64::from(wire_type),
        );
    }

    /// An unsigned varint field (`uint32`, `uint64`, `int64` ≥ 0, `bool`).
    pub(crate) fn uint(&mut self, field: u32, v: u64) {
        self.key(field, 0);
        put_varint(&mut self.buf, v);
    }

    /// A signed `int32`/`int64` field: negative values take 10 bytes, as protobuf specifies.
    pub(crate) fn int(&mut self, field: u32, v: i64) {
        self.key(field, 0);
        put_varint(&mut self.buf, v as u64);
    }

    /// A bytes or string field.
    pub(crate) fn bytes(&mut self, field: u32, data: &[u8]) {
        self.key(field, 2);
        put_varint(&mut self.buf, data.len() as u64);
        self.buf.extend_from_slice(data);
    }

    /// A sub-message field built by `f`.
    pub(crate) fn message(&mut self, field: u32, f: impl FnOnce(&mut Writer)) {
        let mut inner = Writer::new();
        f(&mut inner);
        self.bytes(field, &inner.buf);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minus_one_is_ten_bytes() {
        let mut w = Writer::new();
        w.int(1, -1);
        assert_eq!(w.buf.len(), 11);
        let mut r = Reader::new(&w.buf);
        let (f, v, at) = r.next_field().unwrap().unwrap();
        assert_eq!(f, 1);
        let n = expect_varint(v, at, "x").unwrap();
        assert_eq!(as_int32(n, at, "x").unwrap(), -1);
    }

    #[test]
    fn packed_and_unpacked_agree() {
        let mut unpacked = Writer::new();
        for v in [2u64, 300, 4] {
            unpacked.uint(1, v);
        }
        let mut packed_payload = Vec::new();
        for v in [2u64, 300, 4] {
            put_varint(&mut packed_payload, v);
        }
        let mut packed = Writer::new();
        packed.bytes(1, &packed_payload);
        for buf in [&unpacked.buf, &packed.buf] {
            let mut r = Reader::new(buf);
            let mut out = Vec::new();
            while let Some(field) = r.next_field() {
                let (_, v, at) = field.unwrap();
                push_varints(v, at, &mut out).unwrap();
            }
            assert_eq!(out, vec![2, 300, 4]);
        }
    }

    #[test]
    fn varint_lengths() {
        for v in [0u64, 1, 127, 128, 16383, 16384, u64::MAX] {
            let mut out = Vec::new();
            put_varint(&mut out, v);
            assert_eq!(out.len(), varint_len(v), "{v}");
            assert_eq!(decode_varint(&out).unwrap(), (v, out.len()));
        }
        assert!(decode_varint(&[0x80, 0x80]).is_err());
        assert!(decode_varint(&[0xff; 11]).is_err());
    }
}
