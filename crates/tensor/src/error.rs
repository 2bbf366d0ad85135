//! The one error type of the tensor crate.

use crate::dtype::DType;
use layout::SliceBox;

/// Everything that can go wrong building, slicing or computing on host tensors.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum TensorError {
    /// A dtype name nobody knows.
    #[error("unknown dtype {name:?} (expected one of f64, f32, f16, bf16, i64, i32, i16, i8, u64, u32, u16, u8, bool)")]
    UnknownDType {
        /// The name given.
        name: String,
    },
    /// Data whose length does not match the shape.
    #[error("{op}: shape {shape:?} needs {expected} elements but {got} were given")]
    ElementCount {
        /// The operation.
        op: &'static str,
        /// The shape.
        shape: Vec<usize>,
        /// Elements the shape needs.
        expected: usize,
        /// Elements given.
        got: usize,
    },
    /// A byte buffer whose length does not match shape and dtype.
    #[error("{op}: shape {shape:?} of {dtype} needs {expected} bytes but {got} were given")]
    ByteCount {
        /// The operation.
        op: &'static str,
        /// The shape.
        shape: Vec<usize>,
        /// The dtype.
        dtype: DType,
        /// Bytes needed.
        expected: usize,
        /// Bytes given.
        got: usize,
    },
    /// An operation got a dtype it does not support.
    #[error("{op}: expected dtype {expected}, got {got}")]
    DTypeMismatch {
        /// The operation.
        op: &'static str,
        /// The dtype it needs.
        expected: DType,
        /// The dtype it got.
        got: DType,
    },
    /// An operation that needs a floating-point tensor got another kind.
    #[error("{op}: dtype {got} is not supported (it needs a floating-point tensor)")]
    UnsupportedDType {
        /// The operation.
        op: &'static str,
        /// The dtype given.
        got: DType,
    },
    /// Two shapes that should agree do not.
    #[error("{op}: shapes {lhs:?} and {rhs:?} do not match")]
    ShapeMismatch {
        /// The operation.
        op: &'static str,
        /// Left shape.
        lhs: Vec<usize>,
        /// Right shape.
        rhs: Vec<usize>,
    },
    /// A box that does not fit in the tensor it addresses.
    #[error("{op}: box {region} does not fit in a tensor of shape {shape:?}")]
    BoxOutOfRange {
        /// The operation.
        op: &'static str,
        /// The box (boxed: a box holds its dims inline, and every result of this type would
        /// carry its size).
        region: Box<SliceBox>,
        /// The tensor shape.
        shape: Vec<usize>,
    },
    /// A dim index out of range.
    #[error("{op}: dim {dim} is out of range for a tensor of rank {ndim}")]
    DimOutOfRange {
        /// The operation.
        op: &'static str,
        /// The dim.
        dim: usize,
        /// The tensor's rank.
        ndim: usize,
    },
    /// A caller-provided buffer of a slice-level kernel with the wrong number of elements.
    #[error("{op}: buffer `{buffer}` needs {expected} elements but has {got}")]
    BufferLength {
        /// The operation.
        op: &'static str,
        /// Which buffer (the kernel's parameter name).
        buffer: &'static str,
        /// Elements the kernel needs.
        expected: usize,
        /// Elements the buffer has.
        got: usize,
    },
    /// Two shapes that NumPy broadcasting cannot reconcile.
    #[error("{op}: shapes {lhs:?} and {rhs:?} cannot be broadcast together")]
    NotBroadcastable {
        /// The operation.
        op: &'static str,
        /// Left shape.
        lhs: Vec<usize>,
        /// Right shape.
        rhs: Vec<usize>,
    },
    /// An index tensor (embedding indices, class labels) whose dtype is not i32 or i64.
    #[error("{op}: indices must be i32 or i64, got {got}")]
    IndexDType {
        /// The operation.
        op: &'static str,
        /// The dtype given.
        got: DType,
    },
    /// An index (embedding row, class label) outside `0..bound`.
    #[error("{op}: index {index} at position {position} is out of range 0..{bound}")]
    IndexOutOfRange {
        /// The operation.
        op: &'static str,
        /// Flat position of the offending entry in the index tensor.
        position: usize,
        /// The offending value.
        index: i64,
        /// The exclusive upper bound (vocabulary size, number of classes).
        bound: usize,
    },
    /// An invalid argument, described.
    #[error("{op}: {reason}")]
    InvalidArgument {
        /// The operation.
        op: &'static str,
        /// What is wrong.
        reason: String,
    },
}
