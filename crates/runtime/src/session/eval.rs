//! Evaluating a session: the test accuracy (images) or the validation loss (text), on the
//! evaluation program with the training program's current parameters.

use exec::RankExecutor;

use super::{Session, TrainData};
use crate::data::{BatchPlan, IdxDataset};
use crate::error::RuntimeError;

impl Session {
    /// Evaluates the parameters `exec` holds now (copied into `eval`).
    pub(super) fn evaluate_now(
        &self,
        exec: &mut RankExecutor,
        eval: &mut RankExecutor,
    ) -> Result<(Option<f64>, Option<f64>), RuntimeError> {
        exec.materialize_parameters()?;
        copy_params(exec, eval)?;
        self.evaluate(eval)
    }

    /// The evaluation after an epoch: the test accuracy (images) or the validation loss
    /// (text).
    fn evaluate(
        &self,
        eval: &mut RankExecutor,
    ) -> Result<(Option<f64>, Option<f64>), RuntimeError> {
        match &self.data {
            TrainData::Images { test, .. } => Ok((Some(self.accuracy(eval, test)?), None)),
            TrainData::Text(text) => {
                let seed = self.config.train().seed;
                Ok((None, text.validation_loss(eval, &self.model, seed)?))
            }
        }
    }

    /// Test accuracy: every test sample once, the last batch padded and its padding ignored.
    fn accuracy(&self, eval: &mut RankExecutor, test: &IdxDataset) -> Result<f64, RuntimeError> {
        let plan = BatchPlan::eval(test.len(), self.config.data().batch_size)?;
        let mut correct = 0usize;
        for batch in plan.iter() {
            self.feed(eval, test, &batch)?;
            eval.run()?;
            correct += batch.correct_predictions(&eval.output(0).to_f64_vec(), test.labels());
        }
        Ok(correct as f64 / plan.n_real().max(1) as f64)
    }
}

/// Copies the training program's parameter shards into the evaluation program's (the layouts
/// agree: both programs place the forward graph alike).
fn copy_params(from: &RankExecutor, to: &mut RankExecutor) -> Result<(), RuntimeError> {
    let eval_params = to.program().params.clone();
    for (j, p) in eval_params.iter().enumerate() {
        let i = from
            .program()
            .params
            .iter()
            .position(|q| q.name == p.name)
            .ok_or_else(|| RuntimeError::Mismatch {
                what: format!("parameter {}", p.name),
                expected: "a parameter of the training program".to_string(),
                got: "none".to_string(),
            })?;
        let src = &from.program().params[i];
        if !src.layout.same_placement(&p.layout) {
            return Err(RuntimeError::Mismatch {
                what: format!("parameter {} in the evaluation program", p.name),
                expected: format!("{}", src.layout),
                got: format!("{}", p.layout),
            });
        }
        to.param_mut(j)
            .as_bytes_mut()
            .copy_from_slice(from.param(i).as_bytes());
    }
    Ok(())
}
