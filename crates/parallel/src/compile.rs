//! The two programs a training run needs, from a forward graph in one call each.

use graph::{Graph, ValueId};

use crate::assign::place;
use crate::config::ParallelConfig;
use crate::error::ParallelError;
use crate::lower::{lower, LowerRequest, Program};

/// The training program of `forward` under `config`: forward, backward (by [`graph::grad`]) and
/// every trainable parameter's gradient in the parameter's layout; `loss` is gathered to every
/// rank as output 0. With pipeline stages, a parameter read on several stages is split into
/// one copy per stage first ([`crate::pipeline::split_shared_parameters`]).
pub fn compile_training(
    forward: &Graph,
    loss: ValueId,
    config: &ParallelConfig,
) -> Result<Program, ParallelError> {
    let forward = &crate::pipeline::split_shared_parameters(forward, config)?;
    let trainable = forward.trainable_parameters();
    let training = graph::grad(forward, loss, &trainable)?;
    let grads = trainable
        .iter()
        .filter_map(|&p| training.grad_of(p).map(|g| (p, g)))
        .collect();
    lower(
        &place(&training.graph, config)?,
        &LowerRequest {
            grads,
            replicated_outputs: vec![loss],
        },
    )
}

/// A forward-only program of `forward` under `config` computing `outputs`, each gathered to
/// every rank (outputs `0..`, in order): what evaluation runs.
pub fn compile_forward(
    forward: &Graph,
    outputs: &[ValueId],
    config: &ParallelConfig,
) -> Result<Program, ParallelError> {
    let forward = &crate::pipeline::split_shared_parameters(forward, config)?;
    lower(
        &place(forward, config)?,
        &LowerRequest {
            grads: Vec::new(),
            replicated_outputs: outputs.to_vec(),
        },
    )
}
