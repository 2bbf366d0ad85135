//! [`Executor`]: runs a graph on one device, step after step, in preallocated buffers.

use std::collections::HashMap;

use layout::SliceBox;
use tensor::{DType, Tensor};

use crate::error::GraphError;
use crate::exec::eval::{eval_op, EvalCtx};
use crate::ir::{Graph, NodeId, ValueId, ValueKind};
use crate::op::MAX_INPUTS;

/// One node of the schedule, with the buffers of its operands.
#[derive(Debug, Clone)]
struct Step {
    node: NodeId,
    inputs: Vec<usize>,
    outputs: Vec<usize>,
}

/// Executes a graph on one device.
///
/// Built once: the schedule is the topological order restricted to the nodes the requested
/// outputs need, and every buffer is allocated up front. Intermediates share buffers by liveness:
/// a buffer whose value has had its last use is reused by a later value of the same shape and
/// dtype, so a training step allocates nothing (see [`crate::exec::eval_op`] for the two
/// exceptions). Inputs and parameters have buffers of their own, written with
/// [`Executor::set_input`] or [`Executor::value_mut`] and read back with [`Executor::value`].
#[derive(Debug)]
pub struct Executor {
    graph: Graph,
    schedule: Vec<Step>,
    buffers: Vec<Option<Tensor>>,
    /// The buffer of each value the schedule touches.
    buffer_of: Vec<Option<usize>>,
    /// Values whose buffers hold their data after a run (leaves and requested outputs).
    kept: Vec<bool>,
    step: u64,
    scratch: Vec<Tensor>,
    placeholder: Tensor,
}

impl Executor {
    /// An executor computing `graph`'s declared outputs (every value, with no buffer reuse, when
    /// the graph declares none).
    pub fn new(graph: &Graph) -> Result<Executor, GraphError> {
        Executor::with_outputs(graph, graph.outputs())
    }

    /// An executor computing `outputs` (and what they need), keeping them readable after a run.
    pub fn with_outputs(graph: &Graph, outputs: &[ValueId]) -> Result<Executor, GraphError> {
        for &v in outputs {
            graph.value(v)?;
        }
        let n_values = graph.values().len();
        let (nodes, mut kept) = if outputs.is_empty() {
            (graph.topological_order().collect(), vec![true; n_values])
        } else {
            let mut kept = vec![false; n_values];
            for v in outputs {
                kept[v.0] = true;
            }
            (graph.nodes_needed_for(outputs), kept)
        };
        for (v, value) in graph.values().iter().enumerate() {
            if value.producer.is_none() {
                kept[v] = true;
            }
        }
        let mut plan = BufferPlan::new(graph, &kept);
        let mut last_use = vec![None; n_values];
        for (s, node) in nodes.iter().enumerate() {
            for v in &graph.nodes()[node.0].inputs {
                last_use[v.0] = Some(s);
            }
        }
        for v in outputs {
            plan.buffer(*v);
        }
        let mut schedule = Vec::with_capacity(nodes.len());
        for (s, &node_id) in nodes.iter().enumerate() {
            let node = &graph.nodes()[node_id.0];
            let inputs: Vec<usize> = node.inputs.iter().map(|&v| plan.buffer(v)).collect();
            let outputs: Vec<usize> = node.outputs.iter().map(|&v| plan.buffer(v)).collect();
            for &v in node.inputs.iter().chain(&node.outputs) {
                let dead = match last_use[v.0] {
                    Some(last) => last == s,
                    None => true, // an output nothing reads
                };
                if dead {
                    plan.release(v);
                }
            }
            schedule.push(Step {
                node: node_id,
                inputs,
                outputs,
            });
        }
        let BufferPlan {
            buffers, buffer_of, ..
        } = plan;
        Ok(Executor {
            graph: graph.clone(),
            schedule,
            buffers: buffers.into_iter().map(Some).collect(),
            buffer_of,
            kept,
            step: 0,
            scratch: Vec::with_capacity(3),
            placeholder: Tensor::zeros(DType::F32, &[0]),
        })
    }

    /// The graph being executed.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// Number of buffers (after liveness-based sharing).
    pub fn n_buffers(&self) -> usize {
        self.buffers.len()
    }

    /// The training step the next run uses (dropout masks depend on it); runs advance it by 1.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// Sets the step the next run uses.
    pub fn set_step(&mut self, step: u64) {
        self.step = step;
    }

    /// Fills every parameter from its initializer under `seed`.
    pub fn init_parameters(&mut self, seed: u64) -> Result<(), GraphError> {
        for (v, value) in self.graph.values().iter().enumerate() {
            let ValueKind::Parameter { init, .. } = &value.kind else {
                continue;
            };
            let full = SliceBox::full(&value.shape);
            let data = init.fill(&value.shape, &full, value.dtype, seed, &value.name)?;
            let Some(b) = self.buffer_of[v] else {
                // A parameter the schedule never reads still gets its values.
                self.buffers.push(Some(data));
                self.buffer_of[v] = Some(self.buffers.len() - 1);
                continue;
            };
            let buffer = self.buffers[b]
                .as_mut()
                .expect("buffers are in place between runs");
            buffer.as_bytes_mut().copy_from_slice(data.as_bytes());
        }
        Ok(())
    }

    /// Copies `tensor` into the buffer of input or parameter `value`.
    pub fn set_input(&mut self, value: ValueId, tensor: &Tensor) -> Result<(), GraphError> {
        let buffer = self.value_mut(value)?;
        if buffer.shape() != tensor.shape() || buffer.dtype() != tensor.dtype() {
            let expected_shape = buffer.shape().to_vec();
            let expected_dtype = buffer.dtype();
            return Err(GraphError::TensorMismatch {
                context: format!("input `{}`", self.graph.values()[value.0].name),
                expected_shape,
                expected_dtype,
                got_shape: tensor.shape().to_vec(),
                got_dtype: tensor.dtype(),
            });
        }
        buffer.as_bytes_mut().copy_from_slice(tensor.as_bytes());
        Ok(())
    }

    /// The buffer of input or parameter `value`, writable in place (e.g. by an optimizer).
    pub fn value_mut(&mut self, value: ValueId) -> Result<&mut Tensor, GraphError> {
        let v = self.graph.value(value)?;
        if v.producer.is_some() {
            return Err(GraphError::NotKept {
                value: format!("{} (an intermediate cannot be written)", v.name),
            });
        }
        let b = self.leaf_buffer(value)?;
        Ok(self.buffers[b]
            .as_mut()
            .expect("buffers are in place between runs"))
    }

    /// The data of `value` after the last run: an input, a parameter or a requested output.
    pub fn value(&self, value: ValueId) -> Result<&Tensor, GraphError> {
        let v = self.graph.value(value)?;
        match self.buffer_of[value.0] {
            Some(b) if self.kept[value.0] => Ok(self.buffers[b]
                .as_ref()
                .expect("buffers are in place between runs")),
            _ => Err(GraphError::NotKept {
                value: v.name.clone(),
            }),
        }
    }

    /// The buffer of a leaf, allocating one for a leaf the schedule never reads.
    fn leaf_buffer(&mut self, value: ValueId) -> Result<usize, GraphError> {
        if let Some(b) = self.buffer_of[value.0] {
            return Ok(b);
        }
        let v = &self.graph.values()[value.0];
        self.buffers.push(Some(Tensor::zeros(v.dtype, &v.shape)));
        let b = self.buffers.len() - 1;
        self.buffer_of[value.0] = Some(b);
        Ok(b)
    }

    /// Runs every scheduled node once, then advances the step.
    pub fn run(&mut self) -> Result<(), GraphError> {
        let Executor {
            graph,
            schedule,
            buffers,
            scratch,
            placeholder,
            step,
            ..
        } = self;
        for s in schedule.iter() {
            let node = &graph.nodes()[s.node.0];
            for &b in &s.outputs {
                scratch.push(
                    buffers[b]
                        .take()
                        .expect("an output buffer is never an input"),
                );
            }
            let mut refs: [&Tensor; MAX_INPUTS] = [&*placeholder; MAX_INPUTS];
            for (r, &b) in refs.iter_mut().zip(&s.inputs) {
                *r = buffers[b].as_ref().expect("input buffers are in place");
            }
            let ctx = EvalCtx {
                node: &node.name,
                step: *step,
                placement: None,
                input_blocks: &[],
                deterministic: None,
            };
            let result = eval_op(&node.op, &refs[..s.inputs.len()], scratch, &ctx);
            for &b in s.outputs.iter().rev() {
                buffers[b] = scratch.pop();
            }
            result?;
        }
        *step += 1;
        Ok(())
    }
}

/// Assigns buffers to values while walking the schedule: a value gets a free buffer of its shape
/// and dtype if there is one, a new one otherwise; a released value's buffer becomes free.
struct BufferPlan<'g> {
    graph: &'g Graph,
    kept: &'g [bool],
    buffers: Vec<Tensor>,
    buffer_of: Vec<Option<usize>>,
    free: HashMap<(DType, Vec<usize>), Vec<usize>>,
}

impl<'g> BufferPlan<'g> {
    fn new(graph: &'g Graph, kept: &'g [bool]) -> BufferPlan<'g> {
        BufferPlan {
            graph,
            kept,
            buffers: Vec::new(),
            buffer_of: vec![None; graph.values().len()],
            free: HashMap::new(),
        }
    }

    /// The buffer of `v`, assigned on first use.
    fn buffer(&mut self, v: ValueId) -> usize {
        if let Some(b) = self.buffer_of[v.0] {
            return b;
        }
        let value = &self.graph.values()[v.0];
        let key = (value.dtype, value.shape.clone());
        let reused = if self.kept[v.0] {
            None
        } else {
            self.free.get_mut(&key).and_then(Vec::pop)
        };
        let b = reused.unwrap_or_else(|| {
            self.buffers.push(Tensor::zeros(value.dtype, &value.shape));
            self.buffers.len() - 1
        });
        self.buffer_of[v.0] = Some(b);
        b
    }

    /// Frees `v`'s buffer for later values, unless `v` must be kept.
    fn release(&mut self, v: ValueId) {
        if self.kept[v.0] {
            return;
        }
        let Some(b) = self.buffer_of[v.0] else {
            return;
        };
        let value = &self.graph.values()[v.0];
        let free = self
            .free
            .entry((value.dtype, value.shape.clone()))
            .or_default();
        if !free.contains(&b) {
            free.push(b);
        }
    }
}
