//! Gradient accumulation's buffers (`train.grad_accumulation_steps` > 1): the mean gradient of
//! a step's micro-batches, one buffer per trainable parameter shard.
//!
//! Each buffer is shaped like the gradient the program leaves (the optimizer piece where `hsdp`
//! reduce-scatters the gradient), or — where hsdp shards the accumulation (levels 2 and 3,
//! `zero2`, and `zero1` with `parallel.hsdp.gradient_accumulation_shard`) — like the optimizer
//! piece alone: the rank accumulates, and its optimizer reads, only its rows. Level 1 keeps the
//! whole gradient. It is zeroed at every step's start and spent by the step's update,
//! so nothing in it outlives a step and checkpoints (taken between steps) need none of it.
//!
//! Under mixed precision the gradients are bf16 or f16 and each buffer is in
//! [`parallel::ParallelConfig::gradient_accumulation_dtype`]: f32 (each micro-batch's half
//! gradient widened and added in f32, as the gradients' sums over ranks are under
//! `parallel.gradient_fp32_sync`), or with `gradient_fp32_sync = false` the half type, rounded
//! after every addition. The optimizer widens whatever it reads, so either feeds the update.

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
            let dtype = exec
                .program()
                .placed
                .config
                .gradient_accumulation_dtype(exec.param_dtype(i));
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

    /// Adds `share` times each gradient `exec` holds (its rows in each buffer), computed in f32
    /// and stored in the buffer's type.
    pub fn add(
        &mut self,
        exec: &RankExecutor,
        trainable: &[usize],
        share: f64,
    ) -> Result<(), ExecError> {
        for (k, &i) in trainable.iter().enumerate() {
            let grad = gradient(exec, i)?;
            tensor::kernels::accumulate_scaled_mixed_from(
                &mut self.buffers[k],
                share,
                grad,
                self.offsets[k],
            )?;
        }
        Ok(())
    }

    /// Sets each buffer to the gradient `exec` holds (its rows), widened exactly when the
    /// buffer is f32 and the gradient half precision: a pipelined step's gradients are already
    /// summed over its micro-batches.
    pub fn copy(&mut self, exec: &RankExecutor, trainable: &[usize]) -> Result<(), ExecError> {
        for (k, &i) in trainable.iter().enumerate() {
            let grad = gradient(exec, i)?;
            let width = grad.dtype().size_in_bytes();
            let dst = &mut self.buffers[k];
            let start = self.offsets[k] * width;
            let len = dst.n_elements() * width;
            let rows =
                grad.as_bytes()
                    .get(start..start + len)
                    .ok_or_else(|| ExecError::Mismatch {
                        what: format!("the gradient of {}", exec.program().params[i].name),
                        expected: format!("{} elements", self.offsets[k] + dst.n_elements()),
                        got: grad.n_elements().to_string(),
                    })?;
            if dst.dtype() == grad.dtype() {
                dst.as_bytes_mut().copy_from_slice(rows);
            } else {
                let widened = Tensor::from_bytes(grad.dtype(), dst.shape(), rows)?;
                let widened = widened.to_dtype(dst.dtype());
                dst.as_bytes_mut().copy_from_slice(widened.as_bytes());
            }
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
