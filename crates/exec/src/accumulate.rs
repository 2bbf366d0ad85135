//! Gradient accumulation's buffers (`train.grad_accumulation_steps` > 1): the mean gradient of
//! a step's micro-batches, one buffer per trainable parameter shard.
//!
//! Each buffer is shaped like the gradient the program leaves (the optimizer piece where `hsdp`
//! reduce-scatters the gradient), or — where hsdp shards the accumulation (levels 2 and 3,
//! `zero2`, and `zero1` with `parallel.hsdp.gradient_accumulation_shard`) — like the optimizer
//! piece alone: the rank accumulates, and its optimizer reads, only its rows. Level 1 keeps the
//! whole gradient. It is zeroed at every step's start and spent by the step's update,
//! so nothing in it outlives a step and checkpoints (taken between steps) need none of it.

use tensor::Tensor;

use crate::error::ExecError;
use crate::executor::RankExecutor;

/// One buffer per trainable parameter, in the optimizer's order.
#[derive(Debug)]
pub struct Accumulation {
    buffers: Vec<Tensor>,
    /// Offset, in elements, of each buffer's first element in the gradient's buffer.
    offsets: Vec<usize>,
}

impl Accumulation {
    /// Buffers for the trainable parameters `trainable` (indices into `exec`'s program's
    /// parameters), each the optimizer piece when `sharded`, else the gradient's shape.
    pub fn new(exec: &RankExecutor, trainable: &[usize], sharded: bool) -> Accumulation {
        let mut buffers = Vec::with_capacity(trainable.len());
        let mut offsets = Vec::with_capacity(trainable.len());
        for &i in trainable {
            let piece = exec.optimizer_piece(i);
            let dtype = exec.param_dtype(i);
            match exec.grad(i) {
                Some(grad) if !sharded => {
                    buffers.push(Tensor::zeros(dtype, grad.shape()));
                    offsets.push(0);
                }
                _ => {
                    buffers.push(Tensor::zeros(dtype, &piece.shape));
                    offsets.push(piece.grad_offset);
                }
            }
        }
        Accumulation { buffers, offsets }
    }

    /// The bytes held.
    pub fn bytes(&self) -> usize {
        self.buffers.iter().map(|t| t.as_bytes().len()).sum()
    }

    /// Buffer `k` (parameter `trainable[k]`).
    pub fn buffer(&self, k: usize) -> &Tensor {
        &self.buffers[k]
    }

    /// Buffer `k`, writable (the sum of a shared parameter's copies' gradients).
    pub fn buffer_mut(&mut self, k: usize) -> &mut Tensor {
        &mut self.buffers[k]
    }

    /// Where the optimizer finds parameter `trainable[k]`'s piece in buffer `k`, given where
    /// it lies in the gradient (`grad_offset`).
    pub fn piece_offset(&self, k: usize, grad_offset: usize) -> usize {
        grad_offset - self.offsets[k]
    }

    /// Zeroes every buffer (a step's start).
    pub fn zero(&mut self) {
        for t in &mut self.buffers {
            t.as_bytes_mut().fill(0);
        }
    }

    /// Adds `share` times each gradient `exec` holds (its rows in each buffer).
    pub fn add(
        &mut self,
        exec: &RankExecutor,
        trainable: &[usize],
        share: f64,
    ) -> Result<(), ExecError> {
        for (k, &i) in trainable.iter().enumerate() {
            let grad = gradient(exec, i)?;
            tensor::kernels::accumulate_scaled_from(
                &mut self.buffers[k],
                share,
                grad,
                self.offsets[k],
            )?;
        }
        Ok(())
    }

    /// Sets each buffer to the gradient `exec` holds (its rows): a pipelined step's gradients
    /// are already summed over its micro-batches.
    pub fn copy(&mut self, exec: &RankExecutor, trainable: &[usize]) -> Result<(), ExecError> {
        for (k, &i) in trainable.iter().enumerate() {
            let grad = gradient(exec, i)?;
            let width = grad.dtype().size_in_bytes();
            let dst = self.buffers[k].as_bytes_mut();
            let start = self.offsets[k] * width;
            dst.copy_from_slice(&grad.as_bytes()[start..start + dst.len()]);
        }
        Ok(())
    }
}

/// Parameter `i`'s gradient in `exec`.
fn gradient(exec: &RankExecutor, i: usize) -> Result<&Tensor, ExecError> {
    exec.grad(i).ok_or_else(|| ExecError::Mismatch {
        what: format!("the gradient of {}", exec.program().params[i].name),
        expected: "a gradient buffer (a trainable parameter)".to_string(),
        got: "none".to_string(),
    })
}
