//! The closed set of ops and their attributes.
//!
//! Every attribute an op's semantics depends on is explicit, including the ones a sharded
//! execution must keep *global*:
//! - [`Op::SparseSoftmaxCrossEntropy`] and its grad divide by `batch_divisor`, the global batch
//!   size, so per-rank partial losses sum (all-reduce) to the global mean;
//! - [`Op::Reshape`], [`Op::Flatten`], [`Op::BroadcastTo`], [`Op::SumToShape`], [`Op::Fill`],
//!   [`Op::Triu`] and [`Op::StridedSliceGrad`] carry their target shape, which a parallel pass
//!   rewrites to the local shape;
//! - [`Op::Triu`]'s values are functions of global positions, like dropout's mask, and so is
//!   [`Op::FlashAttention`]'s causal mask (the global positions of a block's first query and key
//!   come from its placement);
//! - [`Op::Dropout`]'s mask is a pure function of `(seed, step, global element index)` (see
//!   [`crate::exec::dropout_mask_keeps`]): a rank computes its part given its box's offset in the
//!   global tensor ([`crate::exec::EvalCtx::placement`]);
//! - [`Op::Embedding`] and [`Op::EmbeddingGrad`] with the table's rows split (vocabulary
//!   parallel) look up, and scatter into, only the rows of the rank's block, given the block's row
//!   offset ([`crate::exec::EvalCtx::input_blocks`], [`crate::exec::EvalCtx::placement`]).
//!
//! Input order and outputs of every op are listed on its variant; [`crate::grad`]'s backward
//! rules use the ops marked *backward*.

use tensor::DType;

/// An operation of the graph, with its attributes. Inputs and outputs are listed in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// `op(a)·op(b)` of 2-D matrices: `a` `[m, k]` (`[k, m]` if `transpose_a`), `b` `[k, n]`
    /// (`[n, k]` if `transpose_b`) → `[m, n]`.
    MatMul {
        /// Use `a` transposed.
        transpose_a: bool,
        /// Use `b` transposed.
        transpose_b: bool,
    },
    /// Batched `op(a)·op(b)` over the last two dims with NumPy broadcasting over the leading
    /// (batch) dims: `[..., m, k]·[..., k, n]` → `[broadcast(...), m, n]`.
    BatchMatMul {
        /// Use the matrices of `a` transposed.
        transpose_a: bool,
        /// Use the matrices of `b` transposed.
        transpose_b: bool,
    },
    /// *Backward* of [`Op::BatchMatMul`] for an operand shared by every batch element (a
    /// weight): `Σ_batch op(a_i)·op(b_i)` of two inputs with the same batch dims, `[..., m, k]`
    /// and `[..., k, n]` (transposes as flagged) → `[m, n]`. With `transpose_a` and not
    /// `transpose_b` the batch folds into the reduction dim: one product of `[B·k, m]ᵀ·[B·k, n]`.
    BatchMatMulSum {
        /// Use the matrices of `a` transposed.
        transpose_a: bool,
        /// Use the matrices of `b` transposed.
        transpose_b: bool,
    },
    /// `a + b`, broadcasting.
    Add,
    /// `a - b`, broadcasting.
    Sub,
    /// `a · b` elementwise, broadcasting.
    Mul,
    /// `a / b` elementwise, broadcasting.
    Div,
    /// `-x`.
    Neg,
    /// `x + bias`, `bias` 1-D of `x`'s last dim (MindSpore's `BiasAdd`, channel last).
    BiasAdd,
    /// `max(x, 0)`.
    Relu,
    /// GeLU: the tanh approximation if `approximate` (MindSpore's `nn.GELU()` default), else the
    /// exact erf form.
    Gelu {
        /// Use the tanh approximation.
        approximate: bool,
    },
    /// `tanh(x)`.
    Tanh,
    /// The logistic sigmoid `1 / (1 + e^-x)` (MindSpore's `Sigmoid`).
    Sigmoid,
    /// Softmax over the last dim.
    Softmax,
    /// Log-softmax over the last dim.
    LogSoftmax,
    /// Layer norm over the last dim: inputs `x [..., d]`, `gamma [d]`, `beta [d]`; outputs
    /// `y` (`x`'s shape), and the per-row `mean` and `rstd` (`x`'s shape without the last dim),
    /// saved for the backward pass as MindSpore's `LayerNorm` does.
    LayerNorm {
        /// Added to the variance.
        epsilon: f64,
    },
    /// MindSpore's `Flatten`: `[n, ...]` → `shape` = `[n, prod(...)]`.
    Flatten {
        /// The output shape (rewritten to the local shape by a parallel pass).
        shape: Vec<usize>,
    },
    /// The same elements with another shape of equal element count.
    Reshape {
        /// The output shape.
        shape: Vec<usize>,
    },
    /// Permutes the dims: output dim `i` is input dim `perm[i]`.
    Transpose {
        /// The permutation.
        perm: Vec<usize>,
    },
    /// Broadcasts `x` to `shape` (NumPy rules).
    BroadcastTo {
        /// The output shape.
        shape: Vec<usize>,
    },
    /// Sums `x` down to `shape`, which must broadcast to `x`'s shape: the adjoint of
    /// [`Op::BroadcastTo`], used for the gradients of broadcasting ops.
    SumToShape {
        /// The output shape.
        shape: Vec<usize>,
    },
    /// Sums over `axes` (every axis when empty), keeping them with size 1 if `keep_dims`.
    ReduceSum {
        /// The reduced axes, ascending and distinct.
        axes: Vec<usize>,
        /// Keep the reduced axes with size 1.
        keep_dims: bool,
    },
    /// Maximum over `axes` (every axis when empty), keeping them with size 1 if `keep_dims`.
    ///
    /// Not differentiable: its use is the shift of a log-sum-exp (`m` in
    /// `log Σ exp(x − m) + m`), whose value does not depend on the shift, so it is wrapped in
    /// [`Op::StopGradient`]; a gradient reaching it is an error naming the node. (Routing `dy` to
    /// the arg-max positions would need the ties broken alike on every shard.)
    ReduceMax {
        /// The reduced axes, ascending and distinct.
        axes: Vec<usize>,
        /// Keep the reduced axes with size 1.
        keep_dims: bool,
    },
    /// `e^x`.
    Exp,
    /// The natural logarithm `ln x`.
    Log,
    /// The square root `√x` (NaN below 0). Its gradient is `dy / (y + y)` with `y = √x`.
    Sqrt,
    /// The identity, through which no gradient flows: autodiff treats its output as a constant.
    StopGradient,
    /// MindSpore's `ops.Print`: the identity that also prints, each time it runs, `label` and the
    /// value it holds (on each rank its local shard) to standard output, as
    /// `Tensor(shape=[..], dtype=Float32, value=\n[..])`. No gradient flows through it.
    Print {
        /// The text printed before the value (the strings given before the tensor).
        label: String,
    },
    /// One-hot rows of integer `labels [...]` (i32 or i64) → `[..., depth]` of `dtype` (a float
    /// type): 1 in the label's column, 0 elsewhere; a label outside `0..depth` is an error. Given
    /// a block of the columns (the output placement's offset in the last dim), a rank writes its
    /// columns. Not differentiable (its input is integer).
    OneHot {
        /// The number of classes (of the global tensor).
        depth: usize,
        /// The output dtype.
        dtype: DType,
    },
    /// The router of a mixture of experts: input `probs [G, T, E]` (a float type; G groups of T
    /// tokens over E experts) → `dispatch [G, T, E, capacity]`, `chosen [G, T, E]` and `first
    /// [G, T, E]`, 0/1 masks of `probs`' dtype. Every token chooses its `top_k` most probable
    /// experts, ties broken by the lower expert index (`chosen`; `first` its first choice).
    /// Within a group, slots are given in token order, every first choice before any second
    /// choice (Switch Transformer, GShard); the `c`-th token routed to an expert takes slot `c`
    /// if `c < capacity` (`dispatch[g, t, e, c] = 1`) and is dropped for that expert otherwise
    /// (`chosen` is 1 and `dispatch` has no 1 in the row). Groups are independent, so dim 0
    /// splits freely; the token and expert dims cannot be split. Its outputs are piecewise
    /// constant: autodiff treats them as constants (as a [`Op::StopGradient`]'s).
    MoeRoute {
        /// Experts chosen per token, `1..=E`.
        top_k: usize,
        /// Slots per expert and group, at least 1.
        capacity: usize,
    },
    /// Embedding lookup (MindSpore's `Gather` on axis 0): inputs `table [vocab, dim]` and integer
    /// `ids [...]` (i32 or i64) → `[..., dim]`. Given a block of the table's rows, ids outside
    /// the block give zero rows (the blocks' results sum to the lookup).
    Embedding,
    /// Inverted dropout: keeps an element with probability `keep_prob` and scales kept elements
    /// by `1/keep_prob`. The mask is a pure function of `(seed, step, global element index)`.
    /// Dropout is its own backward rule (the same mask applied to `dy`).
    Dropout {
        /// Probability of keeping an element, in `(0, 1]`.
        keep_prob: f64,
        /// The op's seed.
        seed: u64,
    },
    /// Softmax cross entropy with integer labels: inputs `logits [n, c]` and `labels [n]` (i32
    /// or i64) → scalar `Σ_rows -log softmax(logits)[label] / batch_divisor`.
    SparseSoftmaxCrossEntropy {
        /// The divisor of the sum: the GLOBAL batch size, so sharded partial sums add up to the
        /// mean over the global batch.
        batch_divisor: usize,
    },
    /// A constant tensor: no inputs → `shape` of `dtype`, every element `value`.
    Fill {
        /// The output shape.
        shape: Vec<usize>,
        /// The output dtype.
        dtype: DType,
        /// The value.
        value: f64,
    },
    /// An upper-triangular constant: no inputs → `shape` (`[rows, cols]`, or with leading batch
    /// dims) of `dtype`, element `[.., i, j]` 1 where `j - i >= diagonal`, else 0. The causal
    /// attention mask is `Triu { diagonal: 1, .. }` (1 marks the future positions to hide).
    /// Element values are functions of *global* positions ([`crate::exec::EvalCtx::placement`]),
    /// so any block of it can be computed on its own.
    Triu {
        /// The output shape, at least 2 dims (rewritten to the local shape by a parallel pass).
        shape: Vec<usize>,
        /// The first diagonal that holds ones: 0 the main diagonal, 1 the one above it.
        diagonal: i64,
        /// The output dtype (floating-point).
        dtype: DType,
    },
    /// Inputs `x` and `mask` (any dtype, broadcastable to `x`, NumPy rules) → `x` where `mask`
    /// is 0, `value` where it is not.
    MaskedFill {
        /// The value written where the mask is nonzero (may be infinite, e.g. `-inf`).
        value: f64,
    },
    /// Inputs `cond` (any dtype, broadcastable to `x`, NumPy rules), `x` and `y` (one shape and
    /// dtype) → `x` where `cond` is nonzero, else `y`.
    Where,
    /// Concatenates its `n` inputs (`2..=MAX_INPUTS`, one dtype, equal in every dim but `axis`)
    /// along `axis`.
    Concat {
        /// The dim to join along.
        axis: usize,
        /// The number of inputs.
        n: usize,
    },
    /// Cuts `x` along `axis` into `sizes.len()` outputs (`1..=MAX_INPUTS`) of `sizes[k]` each
    /// along `axis` (MindSpore's `SplitV`); the sizes sum to the dim.
    Split {
        /// The dim to cut.
        axis: usize,
        /// The size of every piece along `axis`.
        sizes: Vec<usize>,
    },
    /// Elements `begin[d], begin[d] + strides[d], …` below `end[d]` of every dim `d` of `x`:
    /// output dim `d` has `⌈(end[d] - begin[d]) / strides[d]⌉` elements.
    StridedSlice {
        /// First index per dim.
        begin: Vec<usize>,
        /// End (exclusive) per dim, at most the dim's size.
        end: Vec<usize>,
        /// Step per dim, at least 1.
        strides: Vec<usize>,
    },
    /// *Backward* of [`Op::StridedSlice`]: input `dy` (the slice's shape) → zeros of
    /// `input_shape` with `dy` scattered to the sliced positions.
    StridedSliceGrad {
        /// The forward input's shape (rewritten to the local shape by a parallel pass).
        input_shape: Vec<usize>,
        /// The forward's `begin`.
        begin: Vec<usize>,
        /// The forward's `end`.
        end: Vec<usize>,
        /// The forward's `strides`.
        strides: Vec<usize>,
    },
    /// `x` converted to `dtype` (f32, f64, f16 or bf16), each element rounded to the nearest
    /// representable value (ties to even).
    Cast {
        /// The output dtype.
        dtype: DType,
    },
    /// `softmax(scale · x)` over the last dim (attention scores scaled by `1/√d`).
    ScaledSoftmax {
        /// The factor applied to `x`, finite and positive.
        scale: f64,
    },
    /// *Backward* of [`Op::ScaledSoftmax`]: inputs `y` (the forward output) and `dy` →
    /// `dx = scale · y ⊙ (dy − Σ_last y ⊙ dy)`.
    ScaledSoftmaxGrad {
        /// The forward's scale.
        scale: f64,
    },
    /// Fused scaled dot-product attention (FlashAttention's tiling: the scores are never
    /// materialised): inputs `q [..., Sq, d]`, `k` and `v [..., Sk, d]` (one dtype, equal leading
    /// dims, e.g. `[B, H, S, d]`) → `out = softmax(scale · q·kᵀ + mask)·v` (`q`'s shape) and
    /// the per-row log-sum-exp `lse [..., Sq]` of the scaled, masked scores, saved for the
    /// backward pass (it has no gradient of its own). The causal mask hides key `j` from query
    /// `i` when `j > i` in *global* positions. No dropout on the probabilities: a network that
    /// wants it keeps the unfused ops.
    FlashAttention {
        /// Hide the keys after each query's position.
        causal: bool,
        /// The factor of the scores (`1/√d`), finite and positive.
        scale: f64,
    },
    /// *Backward* of [`Op::FlashAttention`]: inputs `q`, `k`, `v`, `out`, `lse` and `dout` →
    /// `dq`, `dk`, `dv` (the probabilities recomputed per tile from `lse`).
    FlashAttentionGrad {
        /// The forward's mask.
        causal: bool,
        /// The forward's scale.
        scale: f64,
    },
    /// [`Op::FlashAttention`] on the fused QKV projection's layout, with no transposes: input
    /// `qkv [..., S, N, 3·d]` (every position's `N` heads, each head's query, key and value
    /// rows side by side) → `out [..., S, N, d]` and `lse [..., S, N]`. The bits are those of
    /// `FlashAttention` over `q`, `k`, `v` cut from `qkv` and transposed to `[..., N, S, d]`,
    /// with its outputs transposed back. The sequence dim is never split (no ring attention):
    /// context parallel keeps `FlashAttention`.
    PackedAttention {
        /// Hide the keys after each query's position.
        causal: bool,
        /// The factor of the scores (`1/√d`), finite and positive.
        scale: f64,
    },
    /// *Backward* of [`Op::PackedAttention`]: inputs `qkv`, `out`, `lse` and `dout` → `dqkv`
    /// (`qkv`'s layout: every head's `dq`, `dk` and `dv` rows side by side).
    PackedAttentionGrad {
        /// The forward's mask.
        causal: bool,
        /// The forward's scale.
        scale: f64,
    },
    /// *Backward* of [`Op::Relu`]: inputs `y` (the forward output) and `dy` → `dx`.
    ReluGrad,
    /// *Backward* of [`Op::Gelu`]: inputs `x` (the forward input) and `dy` → `dx`.
    GeluGrad {
        /// The forward's form.
        approximate: bool,
    },
    /// *Backward* of [`Op::Tanh`]: inputs `y` and `dy` → `dx`.
    TanhGrad,
    /// *Backward* of [`Op::Sigmoid`]: inputs `y` (the forward output) and `dy` →
    /// `dx = dy·y·(1 − y)`.
    SigmoidGrad,
    /// *Backward* of [`Op::Softmax`]: inputs `y` and `dy` → `dx`.
    SoftmaxGrad,
    /// *Backward* of [`Op::LogSoftmax`]: inputs `y` and `dy` → `dx`.
    LogSoftmaxGrad,
    /// *Backward* of [`Op::LayerNorm`]: inputs `x`, `dy`, `mean`, `rstd`, `gamma` → `dx`,
    /// `dgamma`, `dbeta`.
    LayerNormGrad,
    /// *Backward* of [`Op::Embedding`] for the table (a scatter-add): inputs `table` (read for
    /// its shape and layout only), `ids` and `dy [..., dim]` → the table's shape. Given a block
    /// of the table's rows, only ids in the block are accumulated.
    EmbeddingGrad,
    /// *Backward* of [`Op::BiasAdd`] for the bias: input `dy [..., c]` → `[c]` (sum over every
    /// dim but the last).
    BiasAddGrad,
    /// *Backward* of [`Op::SparseSoftmaxCrossEntropy`] for the logits: inputs `logits`, `labels`
    /// and the scalar `dloss` → `(softmax(logits) - onehot(labels))·dloss / batch_divisor`.
    SparseSoftmaxCrossEntropyGrad {
        /// The forward's divisor (the global batch size).
        batch_divisor: usize,
    },
}

impl Op {
    /// The op's kind, as MindSpore names the primitive (`MatMul`, `BiasAdd`, `ReluGrad`).
    pub fn kind(&self) -> &'static str {
        match self {
            Op::MatMul { .. } => "MatMul",
            Op::BatchMatMul { .. } => "BatchMatMul",
            Op::BatchMatMulSum { .. } => "BatchMatMulSum",
            Op::Add => "Add",
            Op::Sub => "Sub",
            Op::Mul => "Mul",
            Op::Div => "Div",
            Op::Neg => "Neg",
            Op::BiasAdd => "BiasAdd",
            Op::Relu => "ReLU",
            Op::Gelu { .. } => "GeLU",
            Op::Tanh => "Tanh",
            Op::Sigmoid => "Sigmoid",
            Op::Softmax => "Softmax",
            Op::LogSoftmax => "LogSoftmax",
            Op::LayerNorm { .. } => "LayerNorm",
            Op::Flatten { .. } => "Flatten",
            Op::Reshape { .. } => "Reshape",
            Op::Transpose { .. } => "Transpose",
            Op::BroadcastTo { .. } => "BroadcastTo",
            Op::SumToShape { .. } => "SumToShape",
            Op::ReduceSum { .. } => "ReduceSum",
            Op::ReduceMax { .. } => "ReduceMax",
            Op::Exp => "Exp",
            Op::Log => "Log",
            Op::Sqrt => "Sqrt",
            Op::StopGradient => "StopGradient",
            Op::Print { .. } => "Print",
            Op::OneHot { .. } => "OneHot",
            Op::MoeRoute { .. } => "MoeRoute",
            Op::Embedding => "Embedding",
            Op::Dropout { .. } => "Dropout",
            Op::SparseSoftmaxCrossEntropy { .. } => "SparseSoftmaxCrossEntropy",
            Op::Fill { .. } => "Fill",
            Op::Triu { .. } => "Triu",
            Op::MaskedFill { .. } => "MaskedFill",
            Op::Where => "Select",
            Op::Concat { .. } => "Concat",
            Op::Split { .. } => "Split",
            Op::StridedSlice { .. } => "StridedSlice",
            Op::Cast { .. } => "Cast",
            Op::StridedSliceGrad { .. } => "StridedSliceGrad",
            Op::ScaledSoftmax { .. } => "ScaledSoftmax",
            Op::ScaledSoftmaxGrad { .. } => "ScaledSoftmaxGrad",
            Op::FlashAttention { .. } => "FlashAttention",
            Op::FlashAttentionGrad { .. } => "FlashAttentionGrad",
            Op::PackedAttention { .. } => "PackedAttention",
            Op::PackedAttentionGrad { .. } => "PackedAttentionGrad",
            Op::ReluGrad => "ReluGrad",
            Op::GeluGrad { .. } => "GeluGrad",
            Op::TanhGrad => "TanhGrad",
            Op::SigmoidGrad => "SigmoidGrad",
            Op::SoftmaxGrad => "SoftmaxGrad",
            Op::LogSoftmaxGrad => "LogSoftmaxGrad",
            Op::LayerNormGrad => "LayerNormGrad",
            Op::EmbeddingGrad => "EmbeddingGrad",
            Op::BiasAddGrad => "BiasAddGrad",
            Op::SparseSoftmaxCrossEntropyGrad { .. } => "SparseSoftmaxCrossEntropyGrad",
        }
    }

    /// Whether a setting naming an op kind (`[parallel.recompute] ops`) means this op: its own
    /// [`Op::kind`], and for [`Op::PackedAttention`] (and its gradient) also `FlashAttention`
    /// (`FlashAttentionGrad`), the same attention on another layout, so that such a setting
    /// keeps its meaning whichever layout the model builds.
    pub fn answers_to(&self, kind: &str) -> bool {
        self.kind() == kind
            || matches!(
                (self, kind),
                (Op::PackedAttention { .. }, "FlashAttention")
                    | (Op::PackedAttentionGrad { .. }, "FlashAttentionGrad")
            )
    }

    /// Whether running the op does something besides computing its outputs ([`Op::Print`]), so
    /// that it runs even when nothing reads them.
    pub fn has_side_effect(&self) -> bool {
        matches!(self, Op::Print { .. })
    }

    /// Number of inputs.
    pub fn n_inputs(&self) -> usize {
        match self {
            Op::Fill { .. } | Op::Triu { .. } => 0,
            Op::Neg
            | Op::Relu
            | Op::Gelu { .. }
            | Op::Tanh
            | Op::Sigmoid
            | Op::Softmax
            | Op::LogSoftmax
            | Op::ScaledSoftmax { .. }
            | Op::Flatten { .. }
            | Op::Reshape { .. }
            | Op::Transpose { .. }
            | Op::BroadcastTo { .. }
            | Op::SumToShape { .. }
            | Op::ReduceSum { .. }
            | Op::ReduceMax { .. }
            | Op::Exp
            | Op::Log
            | Op::Sqrt
            | Op::StopGradient
            | Op::Print { .. }
            | Op::OneHot { .. }
            | Op::MoeRoute { .. }
            | Op::Dropout { .. }
            | Op::Split { .. }
            | Op::StridedSlice { .. }
            | Op::PackedAttention { .. }
            | Op::StridedSliceGrad { .. }
            | Op::Cast { .. }
            | Op::BiasAddGrad => 1,
            Op::MatMul { .. }
            | Op::BatchMatMul { .. }
            | Op::BatchMatMulSum { .. }
            | Op::Add
            | Op::Sub
            | Op::Mul
            | Op::Div
            | Op::BiasAdd
            | Op::Embedding
            | Op::SparseSoftmaxCrossEntropy { .. }
            | Op::MaskedFill { .. }
            | Op::ScaledSoftmaxGrad { .. }
            | Op::ReluGrad
            | Op::GeluGrad { .. }
            | Op::TanhGrad
            | Op::SigmoidGrad
            | Op::SoftmaxGrad
            | Op::LogSoftmaxGrad => 2,
            Op::LayerNorm { .. }
            | Op::EmbeddingGrad
            | Op::SparseSoftmaxCrossEntropyGrad { .. }
            | Op::FlashAttention { .. }
            | Op::Where => 3,
            Op::LayerNormGrad => 5,
            Op::PackedAttentionGrad { .. } => 4,
            Op::FlashAttentionGrad { .. } => 6,
            Op::Concat { n, .. } => *n,
        }
    }

    /// Number of outputs.
    pub fn n_outputs(&self) -> usize {
        match self {
            Op::LayerNorm { .. }
            | Op::LayerNormGrad
            | Op::FlashAttentionGrad { .. }
            | Op::MoeRoute { .. } => 3,
            Op::FlashAttention { .. } | Op::PackedAttention { .. } => 2,
            Op::Split { sizes, .. } => sizes.len(),
            _ => 1,
        }
    }

    /// Whether the op exists only to compute gradients (it has no backward rule itself).
    pub fn is_backward(&self) -> bool {
        matches!(
            self,
            Op::ReluGrad
                | Op::BatchMatMulSum { .. }
                | Op::GeluGrad { .. }
                | Op::TanhGrad
                | Op::SigmoidGrad
                | Op::SoftmaxGrad
                | Op::LogSoftmaxGrad
                | Op::ScaledSoftmaxGrad { .. }
                | Op::FlashAttentionGrad { .. }
                | Op::PackedAttentionGrad { .. }
                | Op::StridedSliceGrad { .. }
                | Op::LayerNormGrad
                | Op::EmbeddingGrad
                | Op::BiasAddGrad
                | Op::SparseSoftmaxCrossEntropyGrad { .. }
        )
    }

    /// Whether [`crate::eval_in_place`] computes this op over its input `i`, that input's
    /// buffer becoming the output: the bias add over `x` (input 0), and the elementwise
    /// arithmetic over either operand (the caller checks that operand has the output's shape).
    pub fn computes_in_place_over(&self, i: usize) -> bool {
        match self {
            Op::BiasAdd => i == 0,
            Op::Add | Op::Sub | Op::Mul | Op::Div => i < 2,
            _ => false,
        }
    }

    /// Whether [`crate::eval_op`] (ordinary and deterministic) writes every element of every
    /// output without reading it first, so a caller may hand it buffers holding stale values
    /// instead of zeroed ones. Listed op by op from their kernels; an op not listed gets zeroed
    /// outputs. The executor's debug builds fill such buffers with NaN, so the test suite
    /// shows an element an op left unwritten.
    pub fn writes_every_output_element(&self) -> bool {
        matches!(
            self,
            Op::MatMul { .. }
                | Op::BatchMatMul { .. }
                | Op::BatchMatMulSum { .. }
                | Op::Add
                | Op::Sub
                | Op::Mul
                | Op::Div
                | Op::BiasAdd
                | Op::Neg
                | Op::Exp
                | Op::Log
                | Op::Sqrt
                | Op::Relu
                | Op::Gelu { .. }
                | Op::Tanh
                | Op::Sigmoid
                | Op::ReluGrad
                | Op::GeluGrad { .. }
                | Op::TanhGrad
                | Op::SigmoidGrad
                | Op::Softmax
                | Op::LogSoftmax
                | Op::ScaledSoftmax { .. }
                | Op::SoftmaxGrad
                | Op::LogSoftmaxGrad
                | Op::ScaledSoftmaxGrad { .. }
                | Op::FlashAttention { .. }
                | Op::FlashAttentionGrad { .. }
                | Op::PackedAttention { .. }
                | Op::PackedAttentionGrad { .. }
                | Op::LayerNorm { .. }
                | Op::LayerNormGrad
                | Op::Transpose { .. }
                | Op::Concat { .. }
                | Op::Split { .. }
                | Op::MaskedFill { .. }
                | Op::BiasAddGrad
                | Op::SumToShape { .. }
                | Op::Flatten { .. }
                | Op::Reshape { .. }
                | Op::StopGradient
                | Op::Print { .. }
                | Op::Embedding
                | Op::SparseSoftmaxCrossEntropyGrad { .. }
                | Op::Fill { .. }
        )
    }
}

/// The most inputs any op takes ([`Op::Concat`]; [`Op::FlashAttentionGrad`] takes 6), and the most
/// outputs of an [`Op::Split`] (its gradient is a `Concat` of them).
pub const MAX_INPUTS: usize = 8;
