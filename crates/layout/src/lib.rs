//! Tessera's layout algebra: which slice of which tensor each rank holds.
//!
//! # Brief overview
//! - [`Mesh`]: a device matrix with named axes (MindSpore's aliases) over an ordered rank list.
//!   Devices are numbered by *slot* in row-major order, the last axis fastest.
//! - [`Layout`]: a mesh plus, for every tensor dim, the ordered list of mesh axes that split it
//!   (outer to inner). Built directly ([`Layout::from_mesh`]), the MindSpore way
//!   ([`Layout::new`] then [`Layout::apply`]), from a strategy tuple ([`Layout::from_strategy`]),
//!   or from a MindSpore tensor map ([`Layout::from_ms_tensor_map`]).
//! - [`TensorLayout`]: a layout bound to a global shape. It knows each slot's [`SliceBox`], the
//!   replica groups (ranks holding identical data) and the distinct boxes.
//! - [`SliceBox`]: offset and length per dim, with intersection, containment and subtraction.
//!
//! # Key design decision
//! There is one placement model. Multi-axis splits, MindSpore's `interleaved_parallel`, optimizer
//! sharding and pipeline stages are all a mesh plus per-dim axis lists, so every consumer
//! (reshard, checkpoint conversion, operator sharding) has one code path. MindSpore's
//! reversed-index `tensor_map` exists only in [`mindspore`] for reading and writing its files.
//!
//! # Example
//! ```
//! use layout::{Layout, SliceBox};
//! let layout = Layout::new(&[2, 4], &["dp", "mp"], None)?.apply(&["dp".into(), "mp".into()])?;
//! let x = layout.bind(&[8, 16])?;
//! assert_eq!(x.rank_box(5)?, SliceBox::new(vec![4, 4], vec![4, 4]));
//! assert_eq!(x.replica_count(), 1);
//! # Ok::<(), layout::LayoutError>(())
//! ```
//!
//! # Architecture invariant
//! This crate is pure arithmetic: no devices, no IO, no tensors' data, no serialization.
#![deny(missing_docs)]

mod error;
mod layout;
pub mod limits;
mod mesh;
pub mod mindspore;
mod slice_box;
mod tensor_layout;

pub use crate::error::LayoutError;
pub use crate::layout::{repeated_calc_mesh, DimSpec, Layout};
pub use crate::mesh::{Mesh, MeshAxis, INTERLEAVED_ALIAS};
pub use crate::mindspore::{LayoutDict, MsDimMap};
pub use crate::slice_box::{row_major_strides, Dims, SliceBox};
pub use crate::tensor_layout::TensorLayout;
