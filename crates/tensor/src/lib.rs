//! Tessera's host tensors: dtypes, contiguous row-major storage, box slicing and CPU kernels.
//!
//! # Brief overview
//! - [`DType`]: the element kinds (f64, f32, f16, bf16, integers, u8, bool) and their names in
//!   safetensors and MindSpore files.
//! - [`Tensor`]: a shape plus typed [`Storage`]. Extract and insert a [`layout::SliceBox`],
//!   concatenate along a dim, convert dtypes, view as bytes.
//! - [`region::copy_region`]: the byte-level box copy every slicing, reshard and checkpoint
//!   conversion goes through; it moves any dtype without converting it.
//! - [`kernels`]: the CPU arithmetic of training — matmul (through the `gemm` and
//!   `matrixmultiply` crates, single-threaded), broadcasting elementwise ops, reductions,
//!   softmax, layer norm, embedding, permute, cross entropy — each with its gradient. Every kernel
//!   has a slice level (`&[f32]`/`&[f64]` in, caller-allocated `&mut` out) and a `Tensor` level
//!   that checks shapes and dtypes; f16/bf16 tensors compute in f32. Row-major throughout;
//!   softmax-like ops work on the last axis.
//!
//! # Example
//! ```
//! use tensor::{DType, Tensor};
//! use layout::SliceBox;
//! let t = Tensor::from_vec(&[2, 3], vec![0f32, 1., 2., 3., 4., 5.])?;
//! let col = t.extract_box(&SliceBox::new(vec![0, 1], vec![2, 1]))?;
//! assert_eq!(col.as_f32()?, &[1., 4.]);
//! assert_eq!(col.dtype(), DType::F32);
//!
//! // Kernels: a linear layer and its loss.
//! use tensor::kernels;
//! let w = Tensor::from_vec(&[3, 2], vec![1f32, 0., 0., 1., 1., 1.])?;
//! let logits = kernels::matmul(&t, &w, false, false)?; // [2, 3]·[3, 2]
//! let labels = Tensor::from_vec(&[2], vec![1i64, 0])?;
//! let loss = kernels::sparse_softmax_cross_entropy(&logits, &labels)?;
//! assert_eq!(loss.shape(), &[] as &[usize]);
//! # Ok::<(), tensor::TensorError>(())
//! ```
//!
//! # Architecture invariant
//! No communication, no files, no graphs: tensors and kernels on one thread's memory.
#![deny(missing_docs)]

mod dtype;
mod error;
pub mod kernels;
pub mod region;
mod tensor;

pub use crate::dtype::DType;
pub use crate::error::TensorError;
pub use crate::tensor::{Element, Storage, Tensor};
