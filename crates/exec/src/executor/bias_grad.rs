//! The fused bias gradient ([`RankExecutor`]'s `bias_grad_fusion`): an activation's gradient,
//! the packed attention's gradient or an arithmetic op in place sums its output's rows into the
//! `BiasAddGrad` after it as it writes them ([`graph::eval_with_bias_grad`],
//! [`graph::eval_in_place_with_bias_grad`]); the `BiasAddGrad` step then only stores the sums.

use graph::{EvalCtx, Placement};
use parallel::{Program, Step};
use tensor::Tensor;

use super::RankExecutor;
use crate::error::ExecError;
use crate::profile::SpanStart;

impl RankExecutor {
    /// Whether step `i` runs with the `BiasAddGrad` after it fused in ([`RankExecutor`]'s
    /// `bias_grad_fusion`): it, the `BiasAddGrad` and any reshape between them run on this
    /// rank, the two alone (neither in a bucket nor a prefetched gather). Returns the
    /// `BiasAddGrad` step.
    pub(super) fn fused_bias_grad(&self, i: usize) -> Option<usize> {
        self.bias_grad_fusion[i].filter(|&j| {
            (i..=j).all(|s| self.offsets[s].is_some())
                && !self.fused[i]
                && !self.fused[j]
                && !self.prefetched[i]
                && !self.prefetched[j]
        })
    }

    /// Runs step `i` (moved or not, as [`RankExecutor::run`] would) summing its output's rows
    /// for the `BiasAddGrad` step `j`, and returns the sums, which
    /// [`RankExecutor::store_bias_grad`] writes when step `j` comes; `None` where one pass does
    /// not fit ([`graph::eval_with_bias_grad`]): then step `i` ran alone and step `j` runs as
    /// usual. Timed as step `i`'s kind when profiling.
    pub(super) fn run_summing_rows(
        &mut self,
        program: &Program,
        i: usize,
        j: usize,
    ) -> Result<Option<Tensor>, ExecError> {
        let started = self.profile.is_some().then(SpanStart::now);
        let (Step::Kernel(k), Step::Kernel(sum)) = (&program.steps[i], &program.steps[j]) else {
            unreachable!("bias_grad_fusions pairs two kernel steps")
        };
        let sum_out = sum.outputs[0];
        let mut sums = Tensor::zeros(program.buffers[sum_out].dtype, &self.fresh_shape(sum_out));
        if let Some((from, to)) = self.moved[i] {
            self.move_buffer(i, (from, to))?;
        }
        let out = k.outputs[0];
        let mut acc = match self.moved[i] {
            Some(_) => self.buffers[out]
                .take()
                .expect("the move just put it there"),
            None => self.take_output(out, k.op.writes_every_output_element()),
        };
        let result = {
            let placement = |step: usize, b: usize| Placement {
                offset: self.offsets[step].as_deref().unwrap_or_default(),
                global_shape: program.buffers[b].layout.layout().shape(),
            };
            let ctx = |step: usize, name, b| EvalCtx {
                node: name,
                step: self.step,
                placement: Some(placement(step, b)),
                input_blocks: &self.input_blocks[step],
                deterministic: self.deterministic,
            };
            let (op_ctx, sum_ctx) = (ctx(i, &k.name, out), ctx(j, &sum.name, sum_out));
            let summing = (&mut sums, &sum_ctx);
            match self.moved[i] {
                Some((from, _)) => {
                    let input = k.inputs.iter().position(|&b| b == from).unwrap_or(0);
                    let other = self.buffer(k.inputs[1 - input]);
                    graph::eval_in_place_with_bias_grad(
                        &k.op, input, &mut acc, other, summing, &op_ctx,
                    )
                    .and_then(|fused| match fused {
                        true => Ok(true),
                        false => graph::eval_in_place(&k.op, input, &mut acc, other, &op_ctx)
                            .map(|()| false),
                    })
                }
                None => {
                    let ins: Vec<&Tensor> = k.inputs.iter().map(|&b| self.buffer(b)).collect();
                    graph::eval_with_bias_grad(&k.op, &ins, &mut acc, summing, &op_ctx).and_then(
                        |fused| match fused {
                            true => Ok(true),
                            false => {
                                graph::eval_op(&k.op, &ins, std::slice::from_mut(&mut acc), &op_ctx)
                                    .map(|()| false)
                            }
                        },
                    )
                }
            }
        };
        self.buffers[out] = Some(acc);
        let fused = result?;
        if let (Some(p), Some(t)) = (self.profile.as_mut(), started) {
            p.kernel(k.op.kind(), t.elapsed());
        }
        Ok(fused.then_some(sums))
    }

    /// The `BiasAddGrad` step `j`'s output ← `sums`, computed by the step before it.
    pub(super) fn store_bias_grad(
        &mut self,
        program: &Program,
        j: usize,
        sums: Tensor,
    ) -> Result<(), ExecError> {
        let started = self.profile.is_some().then(SpanStart::now);
        let Step::Kernel(sum) = &program.steps[j] else {
            unreachable!("bias_grad_fusions pairs two kernel steps")
        };
        let b = sum.outputs[0];
        let mut out = self.take_output(b, true);
        let fits = out.dtype() == sums.dtype() && out.shape() == sums.shape();
        if fits {
            out.as_bytes_mut().copy_from_slice(sums.as_bytes());
        }
        self.buffers[b] = Some(out);
        if !fits {
            return Err(ExecError::Mismatch {
                what: format!("the bias gradient of step {j} ({})", sum.name),
                expected: format!("{:?} {:?}", sums.dtype(), sums.shape()),
                got: format!("{:?}", self.buffer(b).shape()),
            });
        }
        if let (Some(p), Some(t)) = (self.profile.as_mut(), started) {
            p.kernel(sum.op.kind(), t.elapsed());
        }
        Ok(())
    }
}
