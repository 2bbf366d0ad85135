//! The one error type of the parallel crate.

use graph::GraphError;
use layout::LayoutError;
use reshard::ReshardError;

/// Everything that can be wrong with a parallel configuration or a sharded graph.
///
/// Messages name the op (its hierarchical name), the strategy and the rule broken, so a user can
/// fix their configuration from the message alone.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ParallelError {
    /// A strategy that breaks an op's sharding rule.
    #[error("{op} ({kind}): strategy {strategy}: {rule}")]
    InvalidStrategy {
        /// The op's name.
        op: String,
        /// The op's kind (`MatMul`).
        kind: &'static str,
        /// The strategy, formatted as MindSpore writes it: `((2, 4), (4, 1))`.
        strategy: String,
        /// The rule broken.
        rule: String,
    },
    /// A strategy for an op the graph does not have.
    #[error(
        "a strategy is set for op {op:?}, but the graph has no op of that name (ops: {known})"
    )]
    UnknownOp {
        /// The name given.
        op: String,
        /// The ops that exist, formatted.
        known: String,
    },
    /// An op kind that cannot be sharded the way its inputs are laid out.
    #[error("{op} ({kind}): {reason}")]
    Unsupported {
        /// The op's name.
        op: String,
        /// The op's kind.
        kind: &'static str,
        /// Why.
        reason: String,
    },
    /// A bad setting.
    #[error("parallel.{setting}: {reason}")]
    Setting {
        /// The setting (`dataset_strategy`, `devices`, …).
        setting: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A layout error while building an op's layouts.
    #[error("{op}: {source}")]
    Layout {
        /// The op's name.
        op: String,
        /// The layout error.
        source: LayoutError,
    },
    /// Planning a reshard failed.
    #[error("{context}: {source}")]
    Reshard {
        /// Where.
        context: String,
        /// The reshard error.
        source: Box<ReshardError>,
    },
    /// A graph error (rewriting the graph with local shapes).
    #[error(transparent)]
    Graph(Box<GraphError>),
}

impl From<GraphError> for ParallelError {
    fn from(e: GraphError) -> ParallelError {
        ParallelError::Graph(Box::new(e))
    }
}

/// Formats strategies as MindSpore prints them: `((2, 4), (4, 1))`.
pub fn format_strategy(strategy: &[Vec<usize>]) -> String {
    let inner: Vec<String> = strategy
        .iter()
        .map(|s| {
            let items: Vec<String> = s.iter().map(usize::to_string).collect();
            if items.len() == 1 {
                format!("({},)", items[0])
            } else {
                format!("({})", items.join(", "))
            }
        })
        .collect();
    if inner.len() == 1 {
        format!("({},)", inner[0])
    } else {
        format!("({})", inner.join(", "))
    }
}
