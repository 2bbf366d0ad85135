//! Tessera's host tensors: dtypes, contiguous row-major storage, box slicing and CPU kernels.
//!
//! # Brief overview
//! - [`DType`]: the element kinds (f64, f32, f16, bf16, integers, u8, bool) and their names in
//!   safetensors and MindSpore files.
//! - [`Tensor`]: a shape plus typed [`Storage`]. Extract and insert a [`layout::SliceBox`],
//!   concatenate along a dim, convert dtypes, view as bytes.
//! - [`region::copy_region`]: the byte-level box copy every slicing, reshard and checkpoint
//!   conversion goes through; it moves any dtype without converting it.
//!
//! # Example
//! ```
//! use tensor::{DType, Tensor};
//! use layout::SliceBox;
//! let t = Tensor::from_vec(&[2, 3], vec![0f32, 1., 2., 3., 4., 5.])?;
//! let col = t.extract_box(&SliceBox::new(vec![0, 1], vec![2, 1]))?;
//! assert_eq!(col.as_f32()?, &[1., 4.]);
//! assert_eq!(col.dtype(), DType::F32);
//! # Ok::<(), tensor::TensorError>(())
//! ```
//!
//! # Architecture invariant
//! No communication, no files, no graphs: tensors and kernels on one thread's memory.
#![deny(missing_docs)]

mod dtype;
mod error;
pub mod region;
mod tensor;

pub use crate::dtype::DType;
pub use crate::error::TensorError;
pub use crate::tensor::{Element, Storage, Tensor};
