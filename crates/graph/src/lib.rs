//! Tessera's static graph: ops on tensors with shapes and dtypes, built like MindSpore cells,
//! differentiated in reverse mode, and executed on one device.
//!
//! # Brief overview
//! - [`GraphBuilder`] builds a [`Graph`] op by op. Names are hierarchical and scoped
//!   (`b.scope("layer2", …)` makes `layer2.matmul`); every op method infers its output's shape and
//!   dtype at once and returns a [`ValueId`] or a [`GraphError`] naming the node, the values and
//!   the rule broken (`layer2.matmul: inner dims 512 and 256 differ …`).
//! - [`Graph`]: [`Value`]s (name, shape, dtype, [`ValueKind`]: input, parameter with its
//!   [`Initializer`], or intermediate) and [`Node`]s (name, [`Op`], inputs, outputs, [`NodeRole`])
//!   in topological order, with producers, consumers, and [`Graph::rewrite`] to derive a copy with
//!   other attributes and leaf shapes (how a parallel pass makes per-rank graphs).
//! - [`Op`]: the closed set of ops with explicit attributes, forward and backward.
//! - [`nn`]: blocks ([`nn::Dense`], [`nn::MatMulCell`], [`nn::Embedding`], [`nn::LayerNorm`],
//!   [`nn::Mlp`]) used through [`GraphBuilder::call`]; [`models::seed_mlp`] the built-in model.
//! - [`grad()`] turns a forward graph and a scalar loss into a [`TrainingGraph`]: the backward
//!   nodes are ordinary nodes of the same IR, each recording which forward node and input it
//!   differentiates ([`Node::grad_of`]).
//! - [`Executor`] runs a graph on one device in preallocated, liveness-shared buffers through
//!   [`eval_op`], the single dispatch from an op to `tensor::kernels`.
//! - [`Initializer::fill`] computes any box of a parameter from a counter-based RNG ([`rng`]), so
//!   every sharding of a parameter holds the same global values.
//!
//! # Example
//! ```
//! use graph::{grad, nn, Executor, GraphBuilder};
//! use tensor::{DType, Tensor};
//!
//! let mut b = GraphBuilder::new();
//! let x = b.input("x", &[4, 16], DType::F32)?;
//! let labels = b.input("labels", &[4], DType::I32)?;
//! let h = b.call("layer1", &nn::Dense::new(16, 32).activation(nn::Activation::Relu), x)?;
//! let logits = b.call("layer2", &nn::Dense::new(32, 10), h)?;
//! let loss = b.sparse_softmax_cross_entropy("loss", logits, labels)?;
//! let forward = b.finish();
//! assert!(forward.node_by_name("layer2.bias_add").is_some());
//!
//! // Shape errors name the node and the rule.
//! let mut bad = GraphBuilder::new();
//! let x = bad.input("x", &[4, 16], DType::F32)?;
//! let err = bad.call("layer2", &nn::Dense::new(8, 10), x).unwrap_err();
//! assert!(err.to_string().starts_with("layer2.matmul: inner dims 16 and 8 differ"));
//!
//! let training = grad(&forward, loss, &forward.trainable_parameters())?;
//! let mut exec = Executor::new(&training.graph)?;
//! exec.init_parameters(42)?;
//! exec.set_input(labels, &Tensor::from_vec(&[4], vec![1i32, 0, 9, 3])?)?;
//! exec.run()?;
//! let weight = forward.value_by_name("layer1.weight").unwrap();
//! let dweight = exec.value(training.grad_of(weight).unwrap())?;
//! assert_eq!(dweight.shape(), &[32, 16]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Key design decisions
//! - **Global semantics in attributes.** Whatever an op's result depends on beyond its operands
//!   is an attribute — the cross entropy's `batch_divisor` (the global batch), target shapes of
//!   reshapes, the vocabulary size of an embedding gradient — or a pure function of global
//!   indices (dropout masks, initial values). So the same op, evaluated by [`eval_op`] on a
//!   shard, computes exactly that shard's part of the global result.
//! - **The backward graph is ordinary IR.** Autodiff emits `MatMul`s with transpose flags,
//!   `ReluGrad`, `SumToShape`, … in the same graph, so the parallel pass shards, schedules and
//!   lowers backward nodes with the machinery it uses for forward ones.
//!
//! # Architecture invariant
//! `graph` knows nothing about devices, layouts, communication or files. Its only use of the
//! `layout` crate is [`layout::SliceBox`] as a plain box of a global tensor (which part of a
//! parameter to initialise); which rank holds which box is the parallel pass's business.
#![deny(missing_docs)]

mod autodiff;
mod builder;
mod cross_entropy;
mod error;
pub mod exec;
mod infer;
mod init;
mod ir;
pub mod models;
pub mod nn;
mod op;
pub mod print;
pub mod rng;

pub use crate::autodiff::{depends_on, grad, TrainingGraph};
pub use crate::builder::GraphBuilder;
pub use crate::cross_entropy::vocab_parallel_cross_entropy_strategies;
pub use crate::error::{GraphError, Operand};
pub use crate::exec::{
    eval_in_place, eval_in_place_with_bias_grad, eval_op, eval_product_with_bias,
    eval_with_bias_grad, EvalCtx, Executor, InputBlock, Placement,
};
pub use crate::init::{FanMode, Initializer};
pub use crate::ir::{GradOf, Graph, Node, NodeId, NodeRole, Use, Value, ValueId, ValueKind};
pub use crate::op::{Op, MAX_INPUTS};
