//! CPU kernels: the arithmetic of training, on one thread's memory.
//!
//! # Two levels
//! Every kernel exists at two levels:
//! - **slice level** (`*_into`, `*_slice`, and the in-place BLAS-style updates): generic over
//!   [`Float`] (f32, f64), reading `&[T]` and writing into a caller-allocated `&mut [T]`, so an
//!   executor can reuse its buffers. Lengths are checked and a mismatch is a
//!   [`TensorError::BufferLength`](crate::TensorError::BufferLength), never a panic.
//! - **tensor level** (plain names: [`matmul`](fn@matmul), [`add`], [`softmax`](fn@softmax),
//!   …): check shapes and dtypes, allocate the result and return `Result<Tensor, TensorError>`.
//!
//! # Dtypes
//! f32 is the compute type that is made fast; f64 runs the same code. Tensor-level kernels take
//! f16 and bf16 tensors, compute in f32 and return the input's storage dtype (layer norm's
//! statistics stay f32). Integer and bool tensors are rejected with
//! [`TensorError::UnsupportedDType`](crate::TensorError::UnsupportedDType), except where a kernel
//! only moves elements ([`permute`](fn@permute), [`transpose`], the table of
//! [`embedding`](fn@embedding): every dtype) or reads indices (i32 or i64). Operands of one op
//! must share a dtype; nothing is promoted implicitly. In-place tensor updates
//! ([`accumulate_scaled`]) take f32 or f64 only; mixed precision's gradient accumulation
//! ([`accumulate_scaled_mixed`]) adds an f32, bf16 or f16 source into an f32, bf16 or f16
//! accumulator, computing in f32.
//!
//! # Conventions
//! - Row-major, contiguous. Axes are `usize` (no negative axes).
//! - [`softmax`](fn@softmax), [`log_softmax`] and the cross entropy normalise over the **last**
//!   axis.
//! - [`layer_norm`] normalises over the trailing `gamma.ndim()` dims.
//! - Gradients are named `<op>_grad` and return the gradient of the op's input(s) given the
//!   upstream gradient `dy`; each documents whether it reads the forward input or output.
//! - Binary ops broadcast like NumPy; [`sum_to_shape`] brings a broadcast gradient back.
//! - Matmul routes each shape to the fastest backend on the CPU it runs on
//!   ([`GemmBackend::for_shape`]), single-threaded unless [`threads::set_threads`] allows more
//!   (bitwise the same results).
//!
//! # Modules
//! One family per module: [`matmul`](mod@matmul), [`attention`](mod@attention) (fused,
//! tiled attention), [`binary`](mod@binary),
//! [`unary`](mod@unary), [`broadcast`], [`reduce`], [`softmax`](mod@softmax), [`norm`],
//! [`embedding`](mod@embedding), [`permute`](mod@permute), [`loss`], [`vector`]. Everything
//! public is re-exported here, so callers write `tensor::kernels::softmax`.

pub mod attention;
pub mod binary;
pub mod broadcast;
pub(crate) mod check;
pub mod det;
pub mod embedding;
pub(crate) mod float;
pub mod loss;
pub mod matmul;
pub mod norm;
pub mod permute;
pub mod reduce;
pub mod row_sums;
pub mod softmax;
pub mod threads;
pub mod tree;
pub mod unary;
pub mod vector;
mod wide;

pub use self::attention::{
    attention_backward_block, attention_backward_block_accumulate, attention_delta_into,
    flash_attention, flash_attention_grad, flash_attention_grad_into, flash_attention_into,
    merge_attention_into, packed_attention, packed_attention_grad, packed_attention_grad_into,
    packed_attention_grad_summing_rows, packed_attention_into, AttentionDims, AttentionGradBuffers,
    AttentionGradInputs, AttentionGrads, AttentionParams, AttentionState, BlockGradInputs,
    PackedDims,
};
pub use self::binary::{
    add, bias_add, bias_add_grad, bias_add_in_place, bias_add_into, binary, binary_grad,
    binary_in_place, binary_in_place_summing_rows, binary_into, div, mul, sub, BinaryOp,
};
pub use self::broadcast::{
    broadcast_shape, broadcast_to, broadcast_to_into, sum_to_shape, sum_to_shape_into,
};
pub use self::embedding::{
    check_indices, embedding, embedding_grad, gather_block_rows_into, gather_rows_into,
    scatter_add_block_rows, scatter_add_rows, IndexElement, RowBlock,
};
pub use self::float::Float;
pub use self::loss::{
    sparse_softmax_cross_entropy, sparse_softmax_cross_entropy_grad,
    sparse_softmax_cross_entropy_grad_into, sparse_softmax_cross_entropy_slice,
};
pub use self::matmul::{
    batch_gemm_sum, batch_matmul, batch_matmul_bias_into, batch_matmul_into, batch_matmul_shape,
    gemm, gemm_bias, gemm_with, l2_cache_bytes, matmul, solo_band_rows, GemmBackend, GemmShape,
    TileCpu,
};
pub use self::norm::{
    layer_norm, layer_norm_grad, layer_norm_grad_into, layer_norm_into, LayerNormGradBuffers,
    LayerNormGrads, LayerNormOutput, LayerNormParams, LayerNormSaved,
};
pub use self::permute::{
    inverse_axes, permute, permute_into, permuted_shape, transpose, transpose_into,
};
pub use self::reduce::{
    dot_slice, max, max_all, max_slice, mean, mean_all, reduce_all, reduce_all_slice, reduce_axis,
    reduce_axis_grad, reduce_axis_grad_into, reduce_axis_into, sum, sum_all, sum_map_slice,
    sum_slice, Reduction,
};
pub use self::row_sums::{RowOrder, RowSums};
pub use self::softmax::{
    log_softmax, log_softmax_grad, log_softmax_grad_into, log_softmax_into, log_sum_exp,
    scaled_softmax_grad_into, scaled_softmax_into, softmax, softmax_grad, softmax_grad_into,
    softmax_into,
};
pub use self::unary::{
    exp, exp_grad, gelu, gelu_grad, log, log_grad, neg, relu, relu_grad, sigmoid, sigmoid_grad,
    sqrt, sqrt_grad, tanh, tanh_grad, unary, unary_grad, unary_grad_into, unary_grad_summing_rows,
    unary_inplace, unary_into, GeluForm, GradInput, UnaryOp,
};
pub use self::vector::{
    accumulate_scaled, accumulate_scaled_from, accumulate_scaled_mixed,
    accumulate_scaled_mixed_from, axpby, axpy, div_sqrt_axpy, fill, scale, scale_inplace,
    square_axpby,
};
pub use self::wide::VectorUnit;
