//! The GPT's mixture of experts (`[model.moe]`): a block whose MLP is `E` expert MLPs, each
//! token sent to its `top_k` experts by a learned router (Switch Transformer, GShard).
//!
//! The formulation is GShard's, in groups: the tokens of one sequence are a group, `x [G, T, d]`
//! with `G` the batch and `T` the sequence. Per block (scope `blocks.N.moe`):
//! - the router: `probs = softmax(x · router.weight [d, E])` (`[G, T, E]`);
//! - [`graph::Op::MoeRoute`] gives every token its `top_k` experts (ties to the lower expert
//!   index) and a slot of its experts' capacity `C = ⌈top_k · T · capacity_factor / E⌉` per
//!   group; a token past an expert's capacity is dropped for that expert (its combine weight is
//!   0: with no shared expert a token dropped by all its experts adds nothing to the residual);
//! - the gates: the chosen experts' probabilities, renormalised over the chosen experts when
//!   `top_k > 1` (GShard's top-2, Mixtral); with `top_k = 1` the probability itself (Switch), so
//!   the router learns through the gate;
//! - `dispatch [G, T, E, C]` moves tokens into the experts' slots, `xe [E, G·C, d]`, by one
//!   batched product over the groups; the experts are batched products over `E`:
//!   `gelu(xe · w1 [E, d, f] + b1) · w2 [E, f, d] + b2`; `combine = dispatch · gates` brings the
//!   slots back to their tokens in their order, weighted;
//! - with `shared_expert`, a dense MLP of the same width (`shared.fc1`, `shared.fc2`) is added
//!   for every token;
//! - the auxiliary load-balancing loss (Switch): `aux_loss_coeff · E · Σ_e f_e · P_e`, `f_e` the
//!   fraction of tokens whose first choice is `e`, `P_e` the mean router probability of `e`
//!   (over the global batch); the GPT adds every MoE block's term to its loss.
//!
//! The token side (`[G, …]`) splits its groups like the batch; the expert side (`[E, …]`) splits
//! its experts over `parallel.expert_parallel` ([`crate::moe_parallel`]), so that the move
//! between the two is a reshard the parallel pass plans (an all-to-all).

use graph::{GraphBuilder, GraphError, Initializer, ValueId};
use tensor::DType;

use crate::error::ModelsError;
use crate::gpt::mlp;

/// `[model.moe]`: the experts of the GPT's MoE blocks.
#[derive(Debug, Clone, PartialEq)]
pub struct MoeConfig {
    /// Experts per MoE block (`model.moe.experts`, at least 2).
    pub experts: usize,
    /// Experts every token is sent to (`model.moe.top_k`, `1..=experts`).
    pub top_k: usize,
    /// Slots per expert as a multiple of an even share of the routed tokens
    /// (`model.moe.capacity_factor`, above 0; default 1.25).
    pub capacity_factor: f64,
    /// The weight of the load-balancing loss (`model.moe.aux_loss_coeff`, at least 0; default
    /// 0.01).
    pub aux_loss_coeff: f64,
    /// A dense MLP every token also goes through (`model.moe.shared_expert`, default false).
    pub shared_expert: bool,
    /// Every how many blocks one is a MoE block (`model.moe.every`, default 1: every block;
    /// 2: blocks 1, 3, 5, … as GShard alternates): block `l` is one when `(l + 1) % every == 0`.
    pub every: usize,
}

impl MoeConfig {
    /// `experts` experts with top-`top_k` routing and the defaults of the other keys.
    pub fn new(experts: usize, top_k: usize) -> MoeConfig {
        MoeConfig {
            experts,
            top_k,
            capacity_factor: 1.25,
            aux_loss_coeff: 0.01,
            shared_expert: false,
            every: 1,
        }
    }

    /// Checks every key's range; errors name the `model.moe.*` key.
    pub fn validate(&self) -> Result<(), ModelsError> {
        let error = |key: &str, reason: String| ModelsError::Config {
            key: format!("model.moe.{key}"),
            reason,
        };
        if self.experts < 2 {
            return Err(error(
                "experts",
                format!("{} is out of range: it must be ≥ 2", self.experts),
            ));
        }
        if self.top_k == 0 || self.top_k > self.experts {
            return Err(error(
                "top_k",
                format!(
                    "{} is out of range: it must be in 1..={} (model.moe.experts)",
                    self.top_k, self.experts
                ),
            ));
        }
        if !(self.capacity_factor.is_finite() && self.capacity_factor > 0.0) {
            return Err(error(
                "capacity_factor",
                format!(
                    "{} is out of range: it must be finite and > 0",
                    self.capacity_factor
                ),
            ));
        }
        if !(self.aux_loss_coeff.is_finite() && self.aux_loss_coeff >= 0.0) {
            return Err(error(
                "aux_loss_coeff",
                format!(
                    "{} is out of range: it must be finite and ≥ 0",
                    self.aux_loss_coeff
                ),
            ));
        }
        // The balancing loss is at most `aux_loss_coeff · experts` (Σ_e f_e·P_e ≤ 1); it is
        // added to an f32 loss, so that bound must be a finite f32.
        let max_coeff = f64::from(f32::MAX) / self.experts as f64;
        if self.aux_loss_coeff > max_coeff {
            return Err(error(
                "aux_loss_coeff",
                format!(
                    "{} is out of range: the load-balancing loss (up to aux_loss_coeff × {} experts) must stay a finite f32, so it must be at most {max_coeff:e}",
                    self.aux_loss_coeff, self.experts
                ),
            ));
        }
        if self.every == 0 {
            return Err(error(
                "every",
                "0 is out of range: it must be ≥ 1".to_string(),
            ));
        }
        Ok(())
    }

    /// Slots per expert and group of `tokens` tokens: `⌈top_k · tokens · capacity_factor / E⌉`,
    /// at least 1 and at most `tokens` (an expert never receives a token twice).
    pub fn capacity(&self, tokens: usize) -> usize {
        let share = self.top_k as f64 * tokens as f64 * self.capacity_factor / self.experts as f64;
        (share.ceil() as usize).clamp(1, tokens.max(1))
    }

    /// Whether block `layer` (from 0) is a MoE block.
    pub fn applies_to(&self, layer: usize) -> bool {
        (layer + 1).is_multiple_of(self.every.max(1))
    }

    /// Parameters of one MoE block's experts, router and shared expert (in place of the MLP's).
    pub fn parameter_count(&self, hidden: usize, ffn_hidden: usize) -> u128 {
        let (h, f, e) = (hidden as u128, ffn_hidden as u128, self.experts as u128);
        let mlp = (h * f + f) + (f * h + h);
        let shared = if self.shared_expert { mlp } else { 0 };
        h * e + e * mlp + shared
    }
}

/// The widths a MoE block is built with.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct MoeShape {
    /// Groups (the batch).
    pub groups: usize,
    /// Tokens per group (the sequence).
    pub tokens: usize,
    /// The residual stream's width.
    pub hidden: usize,
    /// Every expert's hidden width.
    pub ffn_hidden: usize,
    /// The standard deviation of the output projections' init.
    pub out_std: f64,
}

/// A MoE block's output `[G, T, d]` for `x [G, T, d]`, and its scalar auxiliary loss (already
/// weighted by `aux_loss_coeff`), built in the current scope under `moe.*`.
pub(crate) fn moe_mlp(
    b: &mut GraphBuilder,
    moe: &MoeConfig,
    shape: MoeShape,
    x: ValueId,
) -> Result<(ValueId, ValueId), GraphError> {
    let MoeShape {
        groups,
        tokens,
        hidden,
        ffn_hidden,
        out_std,
    } = shape;
    let (experts, capacity) = (moe.experts, moe.capacity(tokens));
    b.scope("moe", |b| {
        let Routing {
            dispatch,
            combine,
            probs,
            first,
        } = route(b, moe, shape, x)?;
        let slots = experts * capacity;
        // Tokens into their slots: [G, E·C, d] = dispatchᵀ · x per group.
        let xe = b.batch_matmul("dispatch", dispatch, x, true, false)?;
        let xe = b.reshape("slots_4d", xe, &[groups, experts, capacity, hidden])?;
        let xe = b.transpose("to_experts", xe, &[1, 0, 2, 3])?;
        let xe = b.reshape("expert_in", xe, &[experts, groups * capacity, hidden])?;
        let h = experts_ffn(b, experts, hidden, ffn_hidden, out_std, xe)?;
        let h = b.reshape("expert_out", h, &[experts, groups, capacity, hidden])?;
        let h = b.transpose("to_tokens", h, &[1, 0, 2, 3])?;
        let h = b.reshape("slots_flat", h, &[groups, slots, hidden])?;
        // Slots back to their tokens, weighted: [G, T, d] = combine · h per group.
        let mut y = b.batch_matmul("combine_matmul", combine, h, false, false)?;
        if moe.shared_expert {
            let shared = b.scope("shared", |b| mlp(b, hidden, ffn_hidden, out_std, x))?;
            y = b.add("add_shared", y, shared)?;
        }
        let aux = aux_loss(b, moe, groups * tokens, probs, first)?;
        Ok((y, aux))
    })
}

/// What the router gives a MoE block.
struct Routing {
    /// `[G, T, E·C]` 0/1: token `t` holds slot `c` of expert `e` (the activations' dtype).
    dispatch: ValueId,
    /// `[G, T, E·C]`: the dispatch weighted by the gates (the activations' dtype).
    combine: ValueId,
    /// `[G, T, E]`: the router's probabilities (f32 under mixed precision).
    probs: ValueId,
    /// `[G, T, E]` 0/1: every token's first choice.
    first: ValueId,
}

/// The router on `x [G, T, d]`: probabilities, choices, slots and gates (see the module docs).
fn route(
    b: &mut GraphBuilder,
    moe: &MoeConfig,
    shape: MoeShape,
    x: ValueId,
) -> Result<Routing, GraphError> {
    let MoeShape {
        groups,
        tokens,
        hidden,
        ..
    } = shape;
    let (experts, capacity) = (moe.experts, moe.capacity(tokens));
    let router = b.parameter(
        "router.weight",
        &[hidden, experts],
        Initializer::normal(0.02),
    )?;
    let mut logits = b.batch_matmul("router.matmul", x, router, false, false)?;
    // Mixed precision: the router's softmax, choices and gates in f32 (as the loss).
    let half = !matches!(b.float_dtype(), DType::F32 | DType::F64);
    if half {
        logits = b.cast("router.cast", logits, DType::F32)?;
    }
    let probs = b.softmax("router.softmax", logits)?;
    let [dispatch, chosen, first] = b.moe_route("route", probs, moe.top_k, capacity)?;
    let mut gates = b.mul("gates", probs, chosen)?;
    if moe.top_k > 1 {
        let total = b.reduce_sum("gates_sum", gates, &[2], true)?;
        gates = b.div("gates_norm", gates, total)?;
    }
    let gates = b.reshape("gates_4d", gates, &[groups, tokens, experts, 1])?;
    let mut combine = b.mul("combine", dispatch, gates)?;
    let mut dispatch = dispatch;
    if half {
        // 0/1 masks and gates back to the activations' dtype (the masks exactly).
        dispatch = b.cast("dispatch_half", dispatch, b.float_dtype())?;
        combine = b.cast("combine_half", combine, b.float_dtype())?;
    }
    let slots = experts * capacity;
    Ok(Routing {
        dispatch: b.reshape("dispatch_flat", dispatch, &[groups, tokens, slots])?,
        combine: b.reshape("combine_flat", combine, &[groups, tokens, slots])?,
        probs,
        first,
    })
}

/// The experts on `xe [E, n, d]`: `gelu(xe · w1 + b1) · w2 + b2`, batched over `E`.
fn experts_ffn(
    b: &mut GraphBuilder,
    experts: usize,
    hidden: usize,
    ffn_hidden: usize,
    out_std: f64,
    xe: ValueId,
) -> Result<ValueId, GraphError> {
    b.scope("experts", |b| {
        let w1 = b.parameter(
            "w1",
            &[experts, hidden, ffn_hidden],
            Initializer::normal(0.02),
        )?;
        let b1 = b.parameter("b1", &[experts, 1, ffn_hidden], Initializer::Zeros)?;
        let w2 = b.parameter(
            "w2",
            &[experts, ffn_hidden, hidden],
            Initializer::normal(out_std),
        )?;
        let b2 = b.parameter("b2", &[experts, 1, hidden], Initializer::Zeros)?;
        let h = b.batch_matmul("fc1", xe, w1, false, false)?;
        let h = b.add("fc1_bias", h, b1)?;
        let h = b.gelu("gelu", h, true)?;
        let h = b.batch_matmul("fc2", h, w2, false, false)?;
        b.add("fc2_bias", h, b2)
    })
}

/// Switch's load-balancing loss of `probs [G, T, E]` and first choices `first [G, T, E]` over
/// `n_tokens = G·T` tokens: `coeff · E · Σ_e f_e · P_e`, a scalar.
fn aux_loss(
    b: &mut GraphBuilder,
    moe: &MoeConfig,
    n_tokens: usize,
    probs: ValueId,
    first: ValueId,
) -> Result<ValueId, GraphError> {
    b.scope("aux", |b| {
        let counts = b.reduce_sum("counts", first, &[0, 1], false)?;
        let mass = b.reduce_sum("mass", probs, &[0, 1], false)?;
        let product = b.mul("product", counts, mass)?;
        let total = b.reduce_sum("total", product, &[], false)?;
        let n = n_tokens as f64;
        let scale = moe.aux_loss_coeff * moe.experts as f64 / (n * n);
        // In the router's dtype (f32 under mixed precision), as the loss it is added to.
        let dtype = b.value(probs)?.dtype;
        let fill = graph::Op::Fill {
            shape: Vec::new(),
            dtype,
            value: scale,
        };
        let scale = b.node("scale", fill, &[])?[0];
        b.mul("loss", total, scale)
    })
}

/// `loss` plus every MoE block's auxiliary loss (`loss` itself when there is none), as
/// `loss_with_aux`.
pub(crate) fn add_aux_losses(
    b: &mut GraphBuilder,
    loss: ValueId,
    aux: &[ValueId],
) -> Result<ValueId, GraphError> {
    let Some((&first, rest)) = aux.split_first() else {
        return Ok(loss);
    };
    let mut total = first;
    for (i, &term) in rest.iter().enumerate() {
        total = b.add(&format!("moe_aux.sum{}", i + 1), total, term)?;
    }
    b.add("loss_with_aux", loss, total)
}

#[cfg(test)]
mod tests {
    use graph::{grad, Executor, Graph};
    use tensor::Tensor;

    use super::*;

    /// A MoE block on an input `x [G, T, d]` in f64: the graph, `x`, and its loss
    /// `Σ y ⊙ probe + aux` (with `y` and `aux` as outputs 1 and 2).
    struct Block {
        graph: Graph,
        x: ValueId,
        loss: ValueId,
        y: ValueId,
        aux: ValueId,
    }

    const SHAPE: MoeShape = MoeShape {
        groups: 2,
        tokens: 6,
        hidden: 4,
        ffn_hidden: 5,
        out_std: 0.5,
    };

    fn block(moe: &MoeConfig) -> Block {
        let mut b = GraphBuilder::with_float_dtype(DType::F64);
        let (g, t, d) = (SHAPE.groups, SHAPE.tokens, SHAPE.hidden);
        let x = b.input("x", &[g, t, d], DType::F64).unwrap();
        let (y, aux) = moe_mlp(&mut b, moe, SHAPE, x).unwrap();
        let probe = b
            .parameter_with(
                "probe",
                &[g, t, d],
                DType::F64,
                Initializer::normal(1.0),
                false,
            )
            .unwrap();
        let weighted = b.mul("probe_mul", y, probe).unwrap();
        let sum = b.reduce_sum("probe_sum", weighted, &[], false).unwrap();
        let loss = b.add("total", sum, aux).unwrap();
        for v in [loss, y, aux] {
            b.output(v).unwrap();
        }
        Block {
            graph: b.finish(),
            x,
            loss,
            y,
            aux,
        }
    }

    /// Inputs spread enough that no two router probabilities tie by accident.
    fn input() -> Tensor {
        let n = SHAPE.groups * SHAPE.tokens * SHAPE.hidden;
        let values = (0..n)
            .map(|i| ((i * 37 % 23) as f64 - 11.0) / 4.0)
            .collect();
        Tensor::from_vec(&[SHAPE.groups, SHAPE.tokens, SHAPE.hidden], values).unwrap()
    }

    /// Large weights so that the router is far from uniform and the experts differ.
    fn init(exec: &mut Executor, graph: &Graph) {
        exec.init_parameters(3).unwrap();
        for name in ["moe.router.weight", "moe.experts.b1", "moe.experts.b2"] {
            let id = graph.value_by_name(name).unwrap();
            let t = exec.value_mut(id).unwrap();
            let values: Vec<f64> = (0..t.n_elements())
                .map(|i| ((i * 7 % 11) as f64 - 5.0) / 3.0)
                .collect();
            *t = Tensor::from_vec(t.shape(), values).unwrap();
        }
    }

    fn param(exec: &Executor, graph: &Graph, name: &str) -> Vec<f64> {
        exec.value(graph.value_by_name(name).unwrap())
            .unwrap()
            .to_f64_vec()
    }

    fn gelu(x: f64) -> f64 {
        let c = (2.0 / std::f64::consts::PI).sqrt();
        0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
    }

    /// The block computed token by token with loops: `(y, aux, dropped token-choices)`.
    fn naive(moe: &MoeConfig, exec: &Executor, graph: &Graph, x: &[f64]) -> (Vec<f64>, f64, usize) {
        let MoeShape {
            groups,
            tokens,
            hidden: d,
            ffn_hidden: f,
            ..
        } = SHAPE;
        let (e_n, cap) = (moe.experts, moe.capacity(tokens));
        let wr = param(exec, graph, "moe.router.weight");
        let (w1, b1) = (
            param(exec, graph, "moe.experts.w1"),
            param(exec, graph, "moe.experts.b1"),
        );
        let (w2, b2) = (
            param(exec, graph, "moe.experts.w2"),
            param(exec, graph, "moe.experts.b2"),
        );
        let mut y = vec![0.0; groups * tokens * d];
        let (mut counts, mut mass) = (vec![0.0; e_n], vec![0.0; e_n]);
        let mut dropped = 0;
        for g in 0..groups {
            let mut probs = Vec::new();
            let mut picks = Vec::new();
            for t in 0..tokens {
                let xt = &x[(g * tokens + t) * d..][..d];
                let logits: Vec<f64> = (0..e_n)
                    .map(|e| (0..d).map(|i| xt[i] * wr[i * e_n + e]).sum())
                    .collect();
                let max = logits.iter().cloned().fold(f64::MIN, f64::max);
                let z: f64 = logits.iter().map(|l| (l - max).exp()).sum();
                let p: Vec<f64> = logits.iter().map(|l| (l - max).exp() / z).collect();
                let mut order: Vec<usize> = (0..e_n).collect();
                order.sort_by(|&a, &b| p[b].partial_cmp(&p[a]).unwrap().then(a.cmp(&b)));
                order.truncate(moe.top_k);
                counts[order[0]] += 1.0;
                for e in 0..e_n {
                    mass[e] += p[e];
                }
                probs.push(p);
                picks.push(order);
            }
            let mut used = vec![0; e_n];
            for j in 0..moe.top_k {
                for t in 0..tokens {
                    let e = picks[t][j];
                    used[e] += 1;
                    if used[e] > cap {
                        dropped += 1;
                        continue;
                    }
                    let chosen: f64 = picks[t].iter().map(|&c| probs[t][c]).sum();
                    let gate = probs[t][e] / if moe.top_k > 1 { chosen } else { 1.0 };
                    let xt = &x[(g * tokens + t) * d..][..d];
                    let h: Vec<f64> = (0..f)
                        .map(|k| {
                            let s: f64 = (0..d).map(|i| xt[i] * w1[(e * d + i) * f + k]).sum();
                            gelu(s + b1[e * f + k])
                        })
                        .collect();
                    for o in 0..d {
                        let s: f64 = (0..f).map(|k| h[k] * w2[(e * f + k) * d + o]).sum();
                        y[(g * tokens + t) * d + o] += gate * (s + b2[e * d + o]);
                    }
                }
            }
        }
        let n = (groups * tokens) as f64;
        let balance: f64 = (0..e_n).map(|e| counts[e] / n * mass[e] / n).sum();
        (y, moe.aux_loss_coeff * e_n as f64 * balance, dropped)
    }

    #[test]
    fn the_block_is_the_token_by_token_mixture() {
        for top_k in [1, 2] {
            let moe = MoeConfig {
                capacity_factor: 0.5,
                aux_loss_coeff: 0.5,
                ..MoeConfig::new(3, top_k)
            };
            let blk = block(&moe);
            let route = blk.graph.node_by_name("moe.route").unwrap();
            let masks = blk.graph.node(route).unwrap().outputs.clone();
            let mut kept = blk.graph.outputs().to_vec();
            kept.extend(&masks);
            let mut exec = Executor::with_outputs(&blk.graph, &kept).unwrap();
            init(&mut exec, &blk.graph);
            let x = input();
            exec.set_input(blk.x, &x).unwrap();
            exec.run().unwrap();
            let (y, aux, dropped) = naive(&moe, &exec, &blk.graph, &x.to_f64_vec());
            assert!(dropped > 0, "top-{top_k}: the case drops tokens");
            // The dropped token-choices are the chosen ones without a slot.
            let total = |v: ValueId| exec.value(v).unwrap().to_f64_vec().iter().sum::<f64>();
            let routed_out = total(masks[1]) - total(masks[0]);
            assert_eq!(routed_out as usize, dropped, "top-{top_k}: dropped");
            let got = exec.value(blk.y).unwrap().to_f64_vec();
            for (i, (a, b)) in got.iter().zip(&y).enumerate() {
                assert!((a - b).abs() < 1e-12, "top-{top_k}: y[{i}] = {a} vs {b}");
            }
            let got_aux = exec.value(blk.aux).unwrap().to_f64_vec()[0];
            assert!(
                (got_aux - aux).abs() < 1e-12,
                "top-{top_k}: aux {got_aux} vs {aux}"
            );
        }
    }

    #[test]
    fn gradients_match_finite_differences() {
        for (top_k, shared) in [(1, false), (2, true)] {
            let moe = MoeConfig {
                shared_expert: shared,
                aux_loss_coeff: 0.5,
                ..MoeConfig::new(3, top_k)
            };
            let blk = block(&moe);
            let params = blk.graph.trainable_parameters();
            let training = grad(&blk.graph, blk.loss, &params).unwrap();
            let mut exec = Executor::new(&training.graph).unwrap();
            init(&mut exec, &training.graph);
            exec.set_input(blk.x, &input()).unwrap();
            exec.run().unwrap();
            let analytic: Vec<Vec<f64>> = training
                .grads
                .iter()
                .map(|&(_, g)| exec.value(g).unwrap().to_f64_vec())
                .collect();
            let loss_at = |exec: &mut Executor| {
                exec.run().unwrap();
                exec.value(training.loss).unwrap().to_f64_vec()[0]
            };
            for (&(p, _), analytic) in training.grads.iter().zip(&analytic) {
                let name = training.graph.value(p).unwrap().name.clone();
                for i in (0..analytic.len()).step_by(analytic.len().div_ceil(8)) {
                    let h = 1e-6;
                    let original = exec.value(p).unwrap().to_f64_vec();
                    let mut shifted = |delta: f64| {
                        let mut values = original.clone();
                        values[i] += delta;
                        let shape = exec.value(p).unwrap().shape().to_vec();
                        *exec.value_mut(p).unwrap() = Tensor::from_vec(&shape, values).unwrap();
                        loss_at(&mut exec)
                    };
                    let numeric = (shifted(h) - shifted(-h)) / (2.0 * h);
                    shifted(0.0);
                    let err = (numeric - analytic[i]).abs() / (1.0 + analytic[i].abs());
                    assert!(
                        err < 1e-6,
                        "top-{top_k}: d loss / d {name}[{i}]: {} vs numeric {numeric}",
                        analytic[i]
                    );
                }
            }
            let router = training.graph.value_by_name("moe.router.weight").unwrap();
            let g = &analytic[training
                .grads
                .iter()
                .position(|&(p, _)| p == router)
                .unwrap()];
            assert!(
                g.iter().any(|v| v.abs() > 1e-6),
                "the router learns through the gates"
            );
        }
    }

    #[test]
    fn capacity_is_the_rounded_up_share_clamped_to_the_tokens() {
        let moe = MoeConfig::new(4, 1);
        assert_eq!(moe.capacity(16), 5, "⌈16 · 1.25 / 4⌉");
        let two = MoeConfig::new(4, 2);
        assert_eq!(two.capacity(16), 10, "⌈2 · 16 · 1.25 / 4⌉");
        let tiny = MoeConfig {
            capacity_factor: 0.01,
            ..MoeConfig::new(8, 1)
        };
        assert_eq!(tiny.capacity(16), 1);
        let huge = MoeConfig {
            capacity_factor: 100.0,
            ..MoeConfig::new(2, 2)
        };
        assert_eq!(huge.capacity(16), 16);
    }

    #[test]
    fn every_bad_value_names_its_key() {
        let cases = [
            (MoeConfig::new(1, 1), "model.moe.experts"),
            (MoeConfig::new(4, 0), "model.moe.top_k"),
            (MoeConfig::new(4, 5), "model.moe.top_k"),
            (
                MoeConfig {
                    capacity_factor: 0.0,
                    ..MoeConfig::new(4, 1)
                },
                "model.moe.capacity_factor",
            ),
            (
                MoeConfig {
                    aux_loss_coeff: -1.0,
                    ..MoeConfig::new(4, 1)
                },
                "model.moe.aux_loss_coeff",
            ),
            (
                MoeConfig {
                    aux_loss_coeff: 1e38,
                    ..MoeConfig::new(4, 1)
                },
                "model.moe.aux_loss_coeff",
            ),
            (
                MoeConfig {
                    every: 0,
                    ..MoeConfig::new(4, 1)
                },
                "model.moe.every",
            ),
        ];
        for (moe, key) in cases {
            let err = moe.validate().unwrap_err().to_string();
            assert!(err.starts_with(key), "{err}");
        }
        assert!(MoeConfig::new(4, 4).validate().is_ok());
        let largest = MoeConfig {
            aux_loss_coeff: f64::from(f32::MAX) / 4.0,
            ..MoeConfig::new(4, 1)
        };
        assert!(largest.validate().is_ok(), "the bound itself is allowed");
    }

    #[test]
    fn the_gpt_counts_its_moe_parameters() {
        for (every, shared) in [(1, false), (2, true)] {
            let config = crate::GptConfig {
                moe: Some(MoeConfig {
                    every,
                    shared_expert: shared,
                    ..MoeConfig::new(4, 2)
                }),
                ..crate::GptConfig::new(50, 3, 4, 16, 8, 2)
            };
            let model = crate::gpt(&config, DType::F32).unwrap();
            let built = crate::gpt::tests::parameter_elements(&model.graph);
            assert_eq!(config.parameter_count(), built as u128, "every {every}");
            let routes = model
                .graph
                .nodes()
                .iter()
                .filter(|n| matches!(n.op, graph::Op::MoeRoute { .. }))
                .count();
            assert_eq!(routes, 3 / every, "every {every}");
        }
    }

    #[test]
    fn every_picks_the_second_block_of_each_run() {
        let moe = MoeConfig {
            every: 2,
            ..MoeConfig::new(4, 1)
        };
        let blocks: Vec<usize> = (0..6).filter(|&l| moe.applies_to(l)).collect();
        assert_eq!(blocks, [1, 3, 5]);
    }

    /// `every` above the layer count would leave `[model.moe]` without a MoE block: refused,
    /// naming the key; `every` equal to it makes the last block one.
    #[test]
    fn every_beyond_the_layers_is_refused() {
        let config = |every| crate::GptConfig {
            moe: Some(MoeConfig {
                every,
                ..MoeConfig::new(4, 1)
            }),
            ..crate::GptConfig::new(50, 2, 4, 16, 8, 2)
        };
        let err = crate::gpt(&config(3), DType::F32).unwrap_err().to_string();
        assert!(err.starts_with("model.moe.every"), "{err}");
        assert!(err.contains("model.layers = 2"), "{err}");
        assert!(crate::gpt(&config(2), DType::F32).is_ok());
    }
}
