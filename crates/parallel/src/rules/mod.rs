//! Per-op sharding rules.
//!
//! Every op has two rules:
//! - [`strategy::input_layouts`]: MindSpore's rule from a strategy tuple per input to the op's
//!   device matrix and the layout each input must have (forward ops a user may annotate, and the
//!   data-parallel default of [`strategy::default_strategy`]);
//! - [`infer::output_layouts`]: from the layouts of the inputs (on one mesh) to the layouts of
//!   the outputs, with the mesh axes over which an output is a pending sum (a split reduction
//!   dim). Backward ops use only this rule, fed with layouts taken from their forward op.
//!
//! Both work on [`OpContext`]: the op, its name and the global shapes of its operands.

pub mod infer;
mod reshape;
pub mod strategy;

use graph::{Graph, Node, Op};
use layout::{Layout, Mesh};

use crate::error::{format_strategy, ParallelError};

/// What a rule knows about one node.
#[derive(Debug, Clone)]
pub struct OpContext<'a> {
    /// The node's hierarchical name.
    pub name: &'a str,
    /// The op.
    pub op: &'a Op,
    /// Global shapes of the inputs.
    pub input_shapes: Vec<&'a [usize]>,
    /// Global shapes of the outputs.
    pub output_shapes: Vec<&'a [usize]>,
}

impl<'a> OpContext<'a> {
    /// The context of `node` of `graph`.
    pub fn of(graph: &'a Graph, node: &'a Node) -> OpContext<'a> {
        let shape = |v: &graph::ValueId| graph.values()[v.0].shape.as_slice();
        OpContext {
            name: &node.name,
            op: &node.op,
            input_shapes: node.inputs.iter().map(shape).collect(),
            output_shapes: node.outputs.iter().map(shape).collect(),
        }
    }

    /// An [`ParallelError::InvalidStrategy`] for this op.
    pub fn invalid(&self, strategy: &[Vec<usize>], rule: impl Into<String>) -> ParallelError {
        ParallelError::InvalidStrategy {
            op: self.name.to_string(),
            kind: self.op.kind(),
            strategy: format_strategy(strategy),
            rule: rule.into(),
        }
    }

    /// An [`ParallelError::Unsupported`] for this op.
    pub fn unsupported(&self, reason: impl Into<String>) -> ParallelError {
        ParallelError::Unsupported {
            op: self.name.to_string(),
            kind: self.op.kind(),
            reason: reason.into(),
        }
    }

    /// Wraps a layout error with the op's name.
    pub fn layout_error(&self, source: layout::LayoutError) -> ParallelError {
        ParallelError::Layout {
            op: self.name.to_string(),
            source,
        }
    }
}

/// An op's device matrix and the layouts its inputs must have, as a strategy gives them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputPlacement {
    /// The op's device matrix (repeated-calculation axis included, unit axes dropped).
    pub mesh: Mesh,
    /// One layout per input, on `mesh`.
    pub inputs: Vec<Layout>,
}
