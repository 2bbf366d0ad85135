//! Tensor records: what a checkpoint file holds ([`StoredTensor`]) and what a writer is about
//! to write ([`TensorMeta`]), with their element types ([`StoredType`]).
//!
//! Plain data: no file is opened here. The format readers fill these records, the writers take
//! them, and the operations plan with them.

use std::fmt;

use tensor::DType;

/// The most dims a stored tensor may have, in any format (MindSpore's tensors have at most 8;
/// the bound keeps a hostile header's shape, and every message quoting it, small).
pub(crate) const MAX_DIMS: usize = 64;

/// The element type of a stored tensor.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum StoredType {
    /// A dtype Tessera knows; such tensors can be sliced and converted.
    DType(DType),
    /// A MindSpore `tensor_type` Tessera moves only whole and only between `.ckpt` files
    /// (`str`, `Int4`, …), kept by name.
    Opaque(String),
}

impl StoredType {
    /// The dtype, if the type is one Tessera can slice.
    pub fn dtype(&self) -> Option<DType> {
        match self {
            StoredType::DType(d) => Some(*d),
            StoredType::Opaque(_) => None,
        }
    }

    /// MindSpore's name for the type (`Float32`, `str`, …).
    pub fn mindspore_name(&self) -> &str {
        match self {
            StoredType::DType(d) => d.mindspore_name(),
            StoredType::Opaque(s) => s,
        }
    }
}

impl fmt::Display for StoredType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoredType::DType(d) => write!(f, "{d}"),
            StoredType::Opaque(s) => write!(f, "{s}"),
        }
    }
}

/// A byte range of a file holding part of a tensor's data, in data order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Extent {
    /// Offset of the range's first byte in the file.
    pub file_offset: u64,
    /// Bytes in the range.
    pub len: u64,
}

/// One tensor of a checkpoint file: name, type, shape and where its bytes are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredTensor {
    /// The name (MindSpore's tag).
    pub name: String,
    /// The element type.
    pub ty: StoredType,
    /// The stored shape (the rank's slice for a sharded checkpoint).
    pub shape: Vec<usize>,
    /// Bytes of data.
    pub n_bytes: u64,
    /// Where the data lies in the file: one range, or several for a `.ckpt` value chunked over
    /// 512 MiB.
    pub(crate) extents: Vec<Extent>,
}

impl StoredTensor {
    /// Its name, type, shape and size as an output tensor's description.
    pub fn meta(&self) -> TensorMeta {
        TensorMeta {
            name: self.name.clone(),
            ty: self.ty.clone(),
            shape: self.shape.clone(),
            n_bytes: self.n_bytes,
        }
    }

    /// The dtype, if Tessera can slice this tensor.
    pub fn dtype(&self) -> Option<DType> {
        self.ty.dtype()
    }

    /// Number of `.ckpt` values the data is split over (1 for safetensors).
    pub fn n_chunks(&self) -> usize {
        self.extents.len().max(1)
    }
}

/// A tensor to be written: name, type and shape (the data comes later, in order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorMeta {
    /// The name.
    pub name: String,
    /// The element type.
    pub ty: StoredType,
    /// The shape.
    pub shape: Vec<usize>,
    /// Bytes of data.
    pub n_bytes: u64,
}

impl TensorMeta {
    /// A tensor of a Tessera dtype or opaque type; `n_bytes` follows from dtype × shape
    /// (opaque types must use [`TensorMeta::opaque`]).
    pub fn new(name: &str, ty: StoredType, shape: Vec<usize>) -> TensorMeta {
        let elem = ty.dtype().map_or(1, |d| d.size_in_bytes()) as u64;
        let n_bytes = shape.iter().fold(elem, |acc, &d| acc * d as u64);
        TensorMeta {
            name: name.to_string(),
            ty,
            shape,
            n_bytes,
        }
    }

    /// An opaque MindSpore value of `n_bytes` bytes.
    pub fn opaque(name: &str, tensor_type: &str, shape: Vec<usize>, n_bytes: u64) -> TensorMeta {
        TensorMeta {
            name: name.to_string(),
            ty: StoredType::Opaque(tensor_type.to_string()),
            shape,
            n_bytes,
        }
    }

    /// The dtype, if any.
    pub fn dtype(&self) -> Option<DType> {
        self.ty.dtype()
    }
}
