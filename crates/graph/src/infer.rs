//! Shape and dtype inference: the rule of every op, checked when a node is built.

use tensor::kernels::broadcast::broadcast_shape;
use tensor::DType;

use crate::error::{GraphError, Operand};
use crate::ir::Value;
use crate::op::{Op, MAX_INPUTS};

/// A value's type: its shape and dtype.
pub(crate) type ValueType = (Vec<usize>, DType);

/// The output types of `op` applied to `inputs` in node `node`, or the rule the inputs break.
pub(crate) fn infer(node: &str, op: &Op, inputs: &[&Value]) -> Result<Vec<ValueType>, GraphError> {
    let c = Check {
        node,
        op: op.kind(),
        inputs,
    };
    c.count(op.n_inputs())?;
    let out = match op {
        Op::MatMul {
            transpose_a,
            transpose_b,
        } => {
            let (a, b) = (c.float(0)?, c.same_dtype(1, 0)?);
            c.rank(0, 2, "a 2-D matrix")?;
            c.rank(1, 2, "a 2-D matrix")?;
            let (m, k) = matrix_dims(&a.shape, *transpose_a);
            let (k_b, n) = matrix_dims(&b.shape, *transpose_b);
            c.dims_equal("inner dims", (0, k), (1, k_b))?;
            vec![(vec![m, n], a.dtype)]
        }
        Op::BatchMatMul {
            transpose_a,
            transpose_b,
        } => {
            let (a, b) = (c.float(0)?, c.same_dtype(1, 0)?);
            c.min_rank(0, 2, "at least 2 dims")?;
            c.min_rank(1, 2, "at least 2 dims")?;
            let (m, k) = matrix_dims(&a.shape, *transpose_a);
            let (k_b, n) = matrix_dims(&b.shape, *transpose_b);
            c.dims_equal("inner dims", (0, k), (1, k_b))?;
            let a_batch = &a.shape[..a.shape.len() - 2];
            let b_batch = &b.shape[..b.shape.len() - 2];
            let mut shape =
                broadcast_shape("", a_batch, b_batch).map_err(|_| c.not_broadcastable())?;
            shape.extend([m, n]);
            vec![(shape, a.dtype)]
        }
        Op::BatchMatMulSum {
            transpose_a,
            transpose_b,
        } => {
            let (a, b) = (c.float(0)?, c.same_dtype(1, 0)?);
            c.min_rank(0, 3, "at least 3 dims (batch dims, then a matrix)")?;
            c.min_rank(1, 3, "at least 3 dims (batch dims, then a matrix)")?;
            let (m, k) = matrix_dims(&a.shape, *transpose_a);
            let (k_b, n) = matrix_dims(&b.shape, *transpose_b);
            c.dims_equal("inner dims", (0, k), (1, k_b))?;
            if a.shape[..a.shape.len() - 2] != b.shape[..b.shape.len() - 2] {
                return Err(c.not_broadcastable());
            }
            vec![(vec![m, n], a.dtype)]
        }
        Op::Add | Op::Sub | Op::Mul | Op::Div => {
            let (a, b) = (c.float(0)?, c.same_dtype(1, 0)?);
            let shape =
                broadcast_shape("", &a.shape, &b.shape).map_err(|_| c.not_broadcastable())?;
            vec![(shape, a.dtype)]
        }
        Op::Neg
        | Op::Relu
        | Op::Gelu { .. }
        | Op::Tanh
        | Op::Sigmoid
        | Op::Exp
        | Op::Log
        | Op::Sqrt
        | Op::StopGradient
        | Op::Print { .. } => {
            vec![c.same_as(0)?]
        }
        Op::MoeRoute { top_k, capacity } => {
            let probs = c.float(0)?;
            c.rank(0, 3, "3 dims [groups, tokens, experts]")?;
            let experts = probs.shape[2];
            if *top_k == 0 || *top_k > experts {
                return Err(c.attribute(
                    "top_k",
                    format!("{top_k} is out of range: it must be in 1..={experts} (the experts)"),
                ));
            }
            if *capacity == 0 {
                return Err(c.attribute("capacity", "must be at least 1".to_string()));
            }
            let mut dispatch = probs.shape.clone();
            dispatch.push(*capacity);
            let mask = (probs.shape.clone(), probs.dtype);
            vec![(dispatch, probs.dtype), mask.clone(), mask]
        }
        Op::OneHot { depth, dtype } => {
            let labels = c.index(0)?;
            if *depth == 0 {
                return Err(c.attribute("depth", "must be at least 1".to_string()));
            }
            if !dtype.is_float() {
                return Err(c.attribute(
                    "dtype",
                    format!("must be a floating-point dtype, got {dtype}"),
                ));
            }
            let mut shape = labels.shape.clone();
            shape.push(*depth);
            vec![(shape, *dtype)]
        }
        Op::Softmax | Op::LogSoftmax => {
            c.min_rank(0, 1, "at least 1 dim (the class dim)")?;
            vec![c.same_as(0)?]
        }
        Op::ScaledSoftmax { scale } => {
            c.min_rank(0, 1, "at least 1 dim (the class dim)")?;
            c.softmax_scale(*scale)?;
            vec![c.same_as(0)?]
        }
        Op::Where => {
            let x = c.float(1)?;
            c.same_dtype(2, 1)?;
            c.same_shape(2, 1)?;
            if !broadcasts_to(&c.input(0).shape, &x.shape) {
                return Err(c.rank_error(0, "a condition shape that broadcasts to x's shape"));
            }
            vec![c.same_as(1)?]
        }
        Op::Concat { axis, n } => {
            if !(2..=MAX_INPUTS).contains(n) {
                return Err(c.attribute(
                    "n",
                    format!("must be from 2 to {MAX_INPUTS} inputs, got {n}"),
                ));
            }
            let first = c.float(0)?;
            c.axis(*axis, first)?;
            let mut shape = first.shape.clone();
            for i in 1..*n {
                let v = c.same_dtype(i, 0)?;
                let agrees = v.shape.len() == shape.len()
                    && (0..shape.len()).all(|d| d == *axis || v.shape[d] == shape[d]);
                if !agrees {
                    return Err(c.rank_error(
                        i,
                        "the shape of the first input in every dim but the concat axis",
                    ));
                }
                shape[*axis] += v.shape[*axis];
            }
            vec![(shape, first.dtype)]
        }
        Op::Split { axis, sizes } => {
            let x = c.float(0)?;
            c.axis(*axis, x)?;
            if sizes.is_empty() || sizes.len() > MAX_INPUTS {
                return Err(c.attribute(
                    "sizes",
                    format!("must have 1 to {MAX_INPUTS} pieces, got {}", sizes.len()),
                ));
            }
            let total: usize = sizes.iter().sum();
            if total != x.shape[*axis] {
                return Err(c.attribute(
                    "sizes",
                    format!(
                        "{sizes:?} add up to {total}, but dim {axis} of `{}` {:?} is {}",
                        x.name, x.shape, x.shape[*axis]
                    ),
                ));
            }
            sizes
                .iter()
                .map(|&size| {
                    let mut shape = x.shape.clone();
                    shape[*axis] = size;
                    (shape, x.dtype)
                })
                .collect()
        }
        Op::StridedSlice {
            begin,
            end,
            strides,
        } => {
            let x = c.float(0)?;
            let shape = c.strided_slice(&x.shape, begin, end, strides)?;
            vec![(shape, x.dtype)]
        }
        Op::StridedSliceGrad {
            input_shape,
            begin,
            end,
            strides,
        } => {
            let dy = c.float(0)?;
            let shape = c.strided_slice(input_shape, begin, end, strides)?;
            if dy.shape != shape {
                return Err(c.rank_error(0, "the shape of the slice it is the gradient of"));
            }
            vec![(input_shape.clone(), dy.dtype)]
        }
        Op::Cast { dtype } => {
            let x = c.float(0)?;
            if !dtype.is_float() {
                return Err(c.attribute(
                    "dtype",
                    format!("must be f32, f64, f16 or bf16, got {dtype}"),
                ));
            }
            vec![(x.shape.clone(), *dtype)]
        }
        Op::MaskedFill { value } => {
            let x = c.float(0)?;
            if !broadcasts_to(&c.input(1).shape, &x.shape) {
                return Err(c.rank_error(1, "a mask shape that broadcasts to x's shape"));
            }
            if value.is_nan() {
                return Err(c.attribute("value", "must not be NaN".to_string()));
            }
            vec![c.same_as(0)?]
        }
        Op::BiasAdd => {
            let x = c.float(0)?;
            c.same_dtype(1, 0)?;
            c.min_rank(0, 1, "at least 1 dim (the channel dim)")?;
            c.rank(1, 1, "a 1-D bias")?;
            c.dims_equal(
                "channel dim and bias length",
                (0, last(&x.shape)),
                (1, c.inputs[1].shape[0]),
            )?;
            vec![c.same_as(0)?]
        }
        Op::LayerNorm { epsilon } => {
            let x = c.float(0)?;
            c.min_rank(0, 1, "at least 1 dim (the normalised dim)")?;
            for i in [1, 2] {
                c.same_dtype(i, 0)?;
                c.rank(i, 1, "a 1-D scale or shift")?;
                c.dims_equal(
                    "normalised dim and parameter length",
                    (0, last(&x.shape)),
                    (i, c.inputs[i].shape[0]),
                )?;
            }
            if !(epsilon.is_finite() && *epsilon >= 0.0) {
                return Err(
                    c.attribute("epsilon", format!("must be finite and >= 0, got {epsilon}"))
                );
            }
            let lead = x.shape[..x.shape.len() - 1].to_vec();
            vec![c.same_as(0)?, (lead.clone(), x.dtype), (lead, x.dtype)]
        }
        Op::Flatten { shape } => {
            let x = c.input(0);
            c.min_rank(0, 1, "at least 1 dim (the batch dim)")?;
            let expected = vec![x.shape[0], x.shape[1..].iter().product()];
            if *shape != expected {
                return Err(c.attribute(
                    "shape",
                    format!(
                        "is {shape:?}, but flattening `{}` {:?} gives {expected:?}",
                        x.name, x.shape
                    ),
                ));
            }
            vec![(shape.clone(), x.dtype)]
        }
        Op::Reshape { shape } => {
            let x = c.input(0);
            let n: usize = shape.iter().product();
            if n != x.n_elements() {
                return Err(c.attribute(
                    "shape",
                    format!(
                        "{shape:?} holds {n} elements, but `{}` {:?} holds {}",
                        x.name,
                        x.shape,
                        x.n_elements()
                    ),
                ));
            }
            vec![(shape.clone(), x.dtype)]
        }
        Op::Transpose { perm } => {
            let x = c.input(0);
            let mut seen = vec![false; x.shape.len()];
            let valid = perm.len() == x.shape.len()
                && perm
                    .iter()
                    .all(|&d| d < seen.len() && !std::mem::replace(&mut seen[d], true));
            if !valid {
                return Err(c.attribute(
                    "perm",
                    format!(
                        "{perm:?} is not a permutation of the {} dims of `{}` {:?}",
                        x.shape.len(),
                        x.name,
                        x.shape
                    ),
                ));
            }
            vec![(perm.iter().map(|&d| x.shape[d]).collect(), x.dtype)]
        }
        Op::BroadcastTo { shape } => {
            let x = c.float(0)?;
            if !broadcasts_to(&x.shape, shape) {
                return Err(c.attribute(
                    "shape",
                    format!("{shape:?} is not a broadcast of `{}` {:?}", x.name, x.shape),
                ));
            }
            vec![(shape.clone(), x.dtype)]
        }
        Op::SumToShape { shape } => {
            let x = c.float(0)?;
            if !broadcasts_to(shape, &x.shape) {
                return Err(c.attribute(
                    "shape",
                    format!("{shape:?} does not broadcast to `{}` {:?}", x.name, x.shape),
                ));
            }
            vec![(shape.clone(), x.dtype)]
        }
        Op::ReduceSum { axes, keep_dims } | Op::ReduceMax { axes, keep_dims } => {
            let x = c.float(0)?;
            let ndim = x.shape.len();
            let ascending = axes.windows(2).all(|w| w[0] < w[1]);
            if !ascending || axes.iter().any(|&a| a >= ndim) {
                return Err(c.attribute(
                    "axes",
                    format!(
                        "{axes:?} must be ascending, distinct and below the rank {ndim} of `{}`",
                        x.name
                    ),
                ));
            }
            let reduced = |d: usize| axes.is_empty() || axes.contains(&d);
            if matches!(op, Op::ReduceMax { .. }) {
                if let Some(d) = (0..ndim).find(|&d| reduced(d) && x.shape[d] == 0) {
                    return Err(c.attribute(
                        "axes",
                        format!(
                            "reduce dim {d} of `{}` {:?}, which is empty: a maximum of nothing",
                            x.name, x.shape
                        ),
                    ));
                }
            }
            vec![(reduced_shape(&x.shape, axes, *keep_dims), x.dtype)]
        }
        Op::Embedding => {
            let table = c.float(0)?;
            c.rank(0, 2, "a 2-D table [vocab, dim]")?;
            let ids = c.index(1)?;
            let mut shape = ids.shape.clone();
            shape.push(table.shape[1]);
            vec![(shape, table.dtype)]
        }
        Op::Dropout { keep_prob, .. } => {
            if !(*keep_prob > 0.0 && *keep_prob <= 1.0) {
                return Err(
                    c.attribute("keep_prob", format!("must lie in (0, 1], got {keep_prob}"))
                );
            }
            vec![c.same_as(0)?]
        }
        Op::SparseSoftmaxCrossEntropy { batch_divisor } => {
            let logits = c.logits_and_labels(*batch_divisor)?;
            vec![(Vec::new(), logits.dtype)]
        }
        Op::Fill {
            shape,
            dtype,
            value,
        } => {
            if !dtype.is_float() {
                return Err(c.attribute(
                    "dtype",
                    format!("must be a floating-point dtype, got {dtype}"),
                ));
            }
            if !value.is_finite() {
                return Err(c.attribute("value", format!("must be finite, got {value}")));
            }
            vec![(shape.clone(), *dtype)]
        }
        Op::Triu { shape, dtype, .. } => {
            if !dtype.is_float() {
                return Err(c.attribute(
                    "dtype",
                    format!("must be a floating-point dtype, got {dtype}"),
                ));
            }
            if shape.len() < 2 {
                return Err(c.attribute(
                    "shape",
                    format!("{shape:?} needs at least 2 dims ([.., rows, cols])"),
                ));
            }
            vec![(shape.clone(), *dtype)]
        }
        Op::FlashAttention { scale, .. } => {
            c.softmax_scale(*scale)?;
            let q = c.attention_operands()?;
            let rows = q.shape[..q.shape.len() - 1].to_vec();
            vec![c.same_as(0)?, (rows, q.dtype)]
        }
        Op::FlashAttentionGrad { scale, .. } => {
            c.softmax_scale(*scale)?;
            let q = c.attention_operands()?;
            for i in [3, 5] {
                c.same_dtype(i, 0)?;
                c.same_shape(i, 0)?;
            }
            c.same_dtype(4, 0)?;
            if c.inputs[4].shape != q.shape[..q.shape.len() - 1] {
                return Err(c.rank_error(4, "the row shape of q (q's shape without its last dim)"));
            }
            vec![c.same_as(0)?, c.same_as(1)?, c.same_as(2)?]
        }
        Op::PackedAttention { scale, .. } => {
            c.softmax_scale(*scale)?;
            let (out, lse) = c.packed_attention_shapes()?;
            let dtype = c.input(0).dtype;
            vec![(out, dtype), (lse, dtype)]
        }
        Op::PackedAttentionGrad { scale, .. } => {
            c.softmax_scale(*scale)?;
            let (out, lse) = c.packed_attention_shapes()?;
            for (i, shape, expected) in [
                (
                    1,
                    &out,
                    "qkv's shape with its last dim a third (the forward's out)",
                ),
                (
                    2,
                    &lse,
                    "qkv's shape without its last dim (the forward's lse)",
                ),
                (
                    3,
                    &out,
                    "qkv's shape with its last dim a third (the forward's out)",
                ),
            ] {
                c.same_dtype(i, 0)?;
                if &c.input(i).shape != shape {
                    return Err(c.rank_error(i, expected));
                }
            }
            vec![c.same_as(0)?]
        }
        Op::ScaledSoftmaxGrad { scale } => {
            c.softmax_scale(*scale)?;
            c.same_dtype(1, 0)?;
            c.same_shape(1, 0)?;
            vec![c.same_as(0)?]
        }
        Op::ReluGrad
        | Op::GeluGrad { .. }
        | Op::TanhGrad
        | Op::SigmoidGrad
        | Op::SoftmaxGrad
        | Op::LogSoftmaxGrad => {
            c.same_dtype(1, 0)?;
            c.same_shape(1, 0)?;
            vec![c.same_as(0)?]
        }
        Op::LayerNormGrad => {
            let x = c.float(0)?;
            c.min_rank(0, 1, "at least 1 dim (the normalised dim)")?;
            c.same_dtype(1, 0)?;
            c.same_shape(1, 0)?;
            let lead = &x.shape[..x.shape.len() - 1];
            for i in [2, 3] {
                c.same_dtype(i, 0)?;
                if c.inputs[i].shape != lead {
                    return Err(
                        c.rank_error(i, "the row shape of x (x's shape without its last dim)")
                    );
                }
            }
            let gamma = c.same_dtype(4, 0)?;
            c.rank(4, 1, "a 1-D scale")?;
            c.dims_equal(
                "normalised dim and parameter length",
                (0, last(&x.shape)),
                (4, gamma.shape[0]),
            )?;
            vec![c.same_as(0)?, c.same_as(4)?, c.same_as(4)?]
        }
        Op::EmbeddingGrad => {
            let table = c.float(0)?;
            c.rank(0, 2, "a 2-D table [vocab, dim]")?;
            let ids = c.index(1)?;
            let dy = c.same_dtype(2, 0)?;
            let expected_rank = ids.shape.len() + 1;
            if dy.shape.len() != expected_rank || dy.shape[..ids.shape.len()] != ids.shape[..] {
                return Err(c.rank_error(2, "the ids' shape followed by the embedding dim"));
            }
            c.dims_equal("embedding dim", (0, table.shape[1]), (2, last(&dy.shape)))?;
            vec![c.same_as(0)?]
        }
        Op::BiasAddGrad => {
            let dy = c.float(0)?;
            c.min_rank(0, 1, "at least 1 dim (the channel dim)")?;
            vec![(vec![last(&dy.shape)], dy.dtype)]
        }
        Op::SparseSoftmaxCrossEntropyGrad { batch_divisor } => {
            c.logits_and_labels(*batch_divisor)?;
            c.same_dtype(2, 0)?;
            c.rank(2, 0, "a scalar loss gradient")?;
            vec![c.same_as(0)?]
        }
    };
    Ok(out)
}

/// (rows, cols) of a matrix's last two dims as used, given its transpose flag.
pub(crate) fn matrix_dims(shape: &[usize], transposed: bool) -> (usize, usize) {
    let (rows, cols) = (shape[shape.len() - 2], shape[shape.len() - 1]);
    if transposed {
        (cols, rows)
    } else {
        (rows, cols)
    }
}

/// The last dim (callers checked the rank).
fn last(shape: &[usize]) -> usize {
    shape[shape.len() - 1]
}

/// Whether `shape` broadcasts to exactly `target`.
pub(crate) fn broadcasts_to(shape: &[usize], target: &[usize]) -> bool {
    broadcast_shape("", shape, target).is_ok_and(|b| b == target)
}

/// `shape` reduced over `axes` (all when empty).
pub(crate) fn reduced_shape(shape: &[usize], axes: &[usize], keep_dims: bool) -> Vec<usize> {
    let reduced = |d: usize| axes.is_empty() || axes.contains(&d);
    shape
        .iter()
        .enumerate()
        .filter_map(|(d, &size)| match (reduced(d), keep_dims) {
            (false, _) => Some(size),
            (true, true) => Some(1),
            (true, false) => None,
        })
        .collect()
}

/// The inputs of one node under inference, with helpers that produce errors naming them.
struct Check<'a> {
    node: &'a str,
    op: &'static str,
    inputs: &'a [&'a Value],
}

impl<'a> Check<'a> {
    fn input(&self, i: usize) -> &'a Value {
        self.inputs[i]
    }

    fn count(&self, expected: usize) -> Result<(), GraphError> {
        if self.inputs.len() == expected {
            Ok(())
        } else {
            Err(GraphError::InputCount {
                node: self.node.to_string(),
                op: self.op,
                expected,
                got: self.inputs.len(),
            })
        }
    }

    fn dtype_error(&self, i: usize, expected: String) -> GraphError {
        GraphError::InputDType {
            node: self.node.to_string(),
            op: self.op,
            value: self.inputs[i].name.clone(),
            got: self.inputs[i].dtype,
            expected,
        }
    }

    fn rank_error(&self, i: usize, expected: &'static str) -> GraphError {
        GraphError::InputRank {
            node: self.node.to_string(),
            op: self.op,
            value: self.inputs[i].name.clone(),
            shape: self.inputs[i].shape.clone(),
            expected,
        }
    }

    fn attribute(&self, attribute: &'static str, reason: String) -> GraphError {
        GraphError::Attribute {
            node: self.node.to_string(),
            attribute,
            reason,
        }
    }

    fn operand(&self, i: usize) -> Box<Operand> {
        Box::new(Operand {
            name: self.inputs[i].name.clone(),
            shape: self.inputs[i].shape.clone(),
        })
    }

    fn not_broadcastable(&self) -> GraphError {
        GraphError::NotBroadcastable {
            node: self.node.to_string(),
            lhs: self.operand(0),
            rhs: self.operand(1),
        }
    }

    /// Input `i`, which must be floating-point.
    fn float(&self, i: usize) -> Result<&'a Value, GraphError> {
        let v = self.inputs[i];
        if v.dtype.is_float() {
            Ok(v)
        } else {
            Err(self.dtype_error(i, "a floating-point dtype".to_string()))
        }
    }

    /// Input `i`, which must be an i32 or i64 index tensor.
    fn index(&self, i: usize) -> Result<&'a Value, GraphError> {
        let v = self.inputs[i];
        if matches!(v.dtype, DType::I32 | DType::I64) {
            Ok(v)
        } else {
            Err(self.dtype_error(i, "integer indices (i32 or i64)".to_string()))
        }
    }

    /// Input `i`, which must have input `j`'s dtype (and `j` a floating-point one).
    fn same_dtype(&self, i: usize, j: usize) -> Result<&'a Value, GraphError> {
        self.float(j)?;
        let (v, reference) = (self.inputs[i], self.inputs[j]);
        if v.dtype == reference.dtype {
            Ok(v)
        } else {
            Err(self.dtype_error(
                i,
                format!("the dtype of `{}` ({})", reference.name, reference.dtype),
            ))
        }
    }

    /// Input `i`'s type, which must be floating-point.
    fn same_as(&self, i: usize) -> Result<ValueType, GraphError> {
        let v = self.float(i)?;
        Ok((v.shape.clone(), v.dtype))
    }

    fn same_shape(&self, i: usize, j: usize) -> Result<(), GraphError> {
        if self.inputs[i].shape == self.inputs[j].shape {
            Ok(())
        } else {
            Err(self.rank_error(i, "the shape of the forward tensor it pairs with"))
        }
    }

    fn rank(&self, i: usize, ndim: usize, expected: &'static str) -> Result<(), GraphError> {
        if self.inputs[i].shape.len() == ndim {
            Ok(())
        } else {
            Err(self.rank_error(i, expected))
        }
    }

    fn min_rank(&self, i: usize, ndim: usize, expected: &'static str) -> Result<(), GraphError> {
        if self.inputs[i].shape.len() >= ndim {
            Ok(())
        } else {
            Err(self.rank_error(i, expected))
        }
    }

    /// `Ok` when dim `lhs.1` (of input `lhs.0`) equals dim `rhs.1` (of input `rhs.0`).
    fn dims_equal(
        &self,
        what: &'static str,
        lhs: (usize, usize),
        rhs: (usize, usize),
    ) -> Result<(), GraphError> {
        if lhs.1 == rhs.1 {
            return Ok(());
        }
        Err(GraphError::DimMismatch {
            node: self.node.to_string(),
            what,
            lhs: self.operand(lhs.0),
            lhs_dim: lhs.1,
            rhs: self.operand(rhs.0),
            rhs_dim: rhs.1,
        })
    }

    /// `Ok` when `axis` is a dim of `v`.
    fn axis(&self, axis: usize, v: &Value) -> Result<(), GraphError> {
        if axis < v.shape.len() {
            Ok(())
        } else {
            Err(self.attribute(
                "axis",
                format!("{axis} is not a dim of `{}` {:?}", v.name, v.shape),
            ))
        }
    }

    /// The shape of the strided slice `begin..end` by `strides` of a tensor of `shape`, or the
    /// attribute that does not fit it.
    fn strided_slice(
        &self,
        shape: &[usize],
        begin: &[usize],
        end: &[usize],
        strides: &[usize],
    ) -> Result<Vec<usize>, GraphError> {
        for (attribute, list) in [("begin", begin), ("end", end), ("strides", strides)] {
            if list.len() != shape.len() {
                return Err(self.attribute(
                    attribute,
                    format!("{list:?} needs one entry per dim of the sliced shape {shape:?}"),
                ));
            }
        }
        (0..shape.len())
            .map(|d| {
                if strides[d] == 0 {
                    return Err(self.attribute("strides", format!("{strides:?}: dim {d} is 0")));
                }
                if begin[d] > end[d] || end[d] > shape[d] {
                    return Err(self.attribute(
                        "end",
                        format!(
                            "dim {d}: {}..{} is not a range within its size {} (shape {shape:?})",
                            begin[d], end[d], shape[d]
                        ),
                    ));
                }
                Ok((end[d] - begin[d]).div_ceil(strides[d]))
            })
            .collect()
    }

    /// Checks attention's inputs 0, 1 and 2: `q [..., Sq, d]`, `k` and `v [..., Sk, d]` of one
    /// floating-point dtype, `k` and `v` of one shape, the leading dims and `d` equal; returns q.
    fn attention_operands(&self) -> Result<&'a Value, GraphError> {
        let q = self.float(0)?;
        self.min_rank(0, 2, "at least 2 dims ([..., rows, head_dim])")?;
        let k = self.same_dtype(1, 0)?;
        self.same_dtype(2, 0)?;
        if self.inputs[2].shape != k.shape {
            return Err(self.rank_error(2, "the shape of k"));
        }
        let r = q.shape.len();
        if k.shape.len() != r || k.shape[..r - 2] != q.shape[..r - 2] {
            return Err(self.rank_error(1, "q's rank and leading (batch, heads) dims"));
        }
        self.dims_equal("head dim", (0, last(&q.shape)), (1, last(&k.shape)))?;
        Ok(q)
    }

    /// Checks input 0 (`qkv [..., S, N, 3·d]`, floating-point, at least 3 dims, the last a
    /// multiple of 3) and returns the shapes of the packed attention's `out [..., S, N, d]` and
    /// `lse [..., S, N]`.
    fn packed_attention_shapes(&self) -> Result<(Vec<usize>, Vec<usize>), GraphError> {
        let qkv = self.float(0)?;
        self.min_rank(0, 3, "at least 3 dims ([..., seq, heads, 3·head_dim])")?;
        let width = last(&qkv.shape);
        if !width.is_multiple_of(3) {
            return Err(self.rank_error(0, "a last dim of 3·head_dim (q, k and v side by side)"));
        }
        let mut out = qkv.shape.clone();
        *out.last_mut().expect("at least 3 dims") = width / 3;
        let lse = qkv.shape[..qkv.shape.len() - 1].to_vec();
        Ok((out, lse))
    }

    /// `Ok` when a softmax scale is finite and positive.
    fn softmax_scale(&self, scale: f64) -> Result<(), GraphError> {
        if scale.is_finite() && scale > 0.0 {
            Ok(())
        } else {
            Err(self.attribute("scale", format!("must be finite and > 0, got {scale}")))
        }
    }

    /// Checks inputs 0 (`logits [n, c]`) and 1 (`labels [n]`) and the divisor; returns logits.
    fn logits_and_labels(&self, batch_divisor: usize) -> Result<&'a Value, GraphError> {
        let logits = self.float(0)?;
        self.rank(0, 2, "2-D logits [batch, classes]")?;
        let labels = self.index(1)?;
        self.rank(1, 1, "1-D labels [batch]")?;
        self.dims_equal("batch sizes", (0, logits.shape[0]), (1, labels.shape[0]))?;
        if batch_divisor == 0 {
            return Err(self.attribute("batch_divisor", "must be at least 1, got 0".to_string()));
        }
        Ok(logits)
    }
}
