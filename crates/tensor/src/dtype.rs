//! Element types.

use std::fmt;
use std::str::FromStr;

use crate::error::TensorError;

/// The element type of a tensor.
///
/// Kernels compute in f32 or f64; f16 and bf16 are storage types (converted on the way in and
/// out). The integer kinds, u8 and bool exist for labels, indices and checkpoint contents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// IEEE 754 binary64.
    F64,
    /// IEEE 754 binary32.
    F32,
    /// IEEE 754 binary16.
    F16,
    /// bfloat16 (the upper half of an f32).
    BF16,
    /// Signed 64-bit integer.
    I64,
    /// Signed 32-bit integer.
    I32,
    /// Signed 16-bit integer.
    I16,
    /// Signed 8-bit integer.
    I8,
    /// Unsigned 64-bit integer.
    U64,
    /// Unsigned 32-bit integer.
    U32,
    /// Unsigned 16-bit integer.
    U16,
    /// Unsigned 8-bit integer.
    U8,
    /// Boolean, one byte per element (0 or 1).
    Bool,
}

impl DType {
    /// Every dtype.
    pub const ALL: [DType; 13] = [
        DType::F64,
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::I64,
        DType::I32,
        DType::I16,
        DType::I8,
        DType::U64,
        DType::U32,
        DType::U16,
        DType::U8,
        DType::Bool,
    ];

    /// Bytes per element.
    pub fn size_in_bytes(self) -> usize {
        match self {
            DType::F64 | DType::I64 | DType::U64 => 8,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F16 | DType::BF16 | DType::I16 | DType::U16 => 2,
            DType::I8 | DType::U8 | DType::Bool => 1,
        }
    }

    /// Whether the dtype is a half-precision float (`bf16` or `f16`), which kernels compute in
    /// `f32`.
    pub fn is_half(self) -> bool {
        matches!(self, DType::F16 | DType::BF16)
    }

    /// Whether the dtype is a floating-point kind.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F64 | DType::F32 | DType::F16 | DType::BF16)
    }

    /// The lower-case short name used on the command line: `f32`, `bf16`, `i64`, `bool`.
    pub fn name(self) -> &'static str {
        match self {
            DType::F64 => "f64",
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I64 => "i64",
            DType::I32 => "i32",
            DType::I16 => "i16",
            DType::I8 => "i8",
            DType::U64 => "u64",
            DType::U32 => "u32",
            DType::U16 => "u16",
            DType::U8 => "u8",
            DType::Bool => "bool",
        }
    }

    /// The safetensors header name: `F32`, `BF16`, `BOOL`, …
    pub fn safetensors_name(self) -> &'static str {
        match self {
            DType::F64 => "F64",
            DType::F32 => "F32",
            DType::F16 => "F16",
            DType::BF16 => "BF16",
            DType::I64 => "I64",
            DType::I32 => "I32",
            DType::I16 => "I16",
            DType::I8 => "I8",
            DType::U64 => "U64",
            DType::U32 => "U32",
            DType::U16 => "U16",
            DType::U8 => "U8",
            DType::Bool => "BOOL",
        }
    }

    /// The dtype for a safetensors header name.
    pub fn from_safetensors_name(name: &str) -> Option<DType> {
        DType::ALL
            .into_iter()
            .find(|d| d.safetensors_name() == name)
    }

    /// MindSpore's `tensor_type` string: `Float32`, `BFloat16`, `Int64`, `Bool`, …
    pub fn mindspore_name(self) -> &'static str {
        match self {
            DType::F64 => "Float64",
            DType::F32 => "Float32",
            DType::F16 => "Float16",
            DType::BF16 => "BFloat16",
            DType::I64 => "Int64",
            DType::I32 => "Int32",
            DType::I16 => "Int16",
            DType::I8 => "Int8",
            DType::U64 => "UInt64",
            DType::U32 => "UInt32",
            DType::U16 => "UInt16",
            DType::U8 => "UInt8",
            DType::Bool => "Bool",
        }
    }

    /// The dtype for a MindSpore `tensor_type` string.
    pub fn from_mindspore_name(name: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.mindspore_name() == name)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = TensorError;

    /// Accepts the short name (`f32`), the safetensors name (`F32`) or MindSpore's (`Float32`).
    fn from_str(s: &str) -> Result<DType, TensorError> {
        DType::ALL
            .into_iter()
            .find(|d| d.name() == s || d.safetensors_name() == s || d.mindspore_name() == s)
            .ok_or_else(|| TensorError::UnknownDType {
                name: s.to_string(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for d in DType::ALL {
            assert_eq!(d.name().parse::<DType>().unwrap(), d);
            assert_eq!(DType::from_safetensors_name(d.safetensors_name()), Some(d));
            assert_eq!(DType::from_mindspore_name(d.mindspore_name()), Some(d));
        }
        assert!("f8".parse::<DType>().is_err());
    }
}
