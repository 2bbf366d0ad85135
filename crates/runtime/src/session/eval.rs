//! Evaluating a session: the test accuracy (a data set of samples) or the validation loss
//! (text), on the
//! evaluation program with the training program's current parameters.

use exec::RankExecutor;

use super::{SessionData, TrainSession};
use crate::data::{column_of, feed_rows, BatchPlan, Dataset};
use crate::error::RuntimeError;

impl TrainSession {
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

    /// The evaluation after an epoch: the test accuracy (samples; none without a test set) or
    /// the validation loss (text).
    fn evaluate(
        &self,
        eval: &mut RankExecutor,
    ) -> Result<(Option<f64>, Option<f64>), RuntimeError> {
        match &self.data {
            SessionData::Samples { test, columns, .. } => match test {
                Some(test) => Ok((Some(self.accuracy(eval, test.as_ref(), columns)?), None)),
                None => Ok((None, None)),
            },
            SessionData::Text(text) => {
                let seed = self.config.train().seed;
                Ok((None, text.validation_loss(eval, &self.model, seed)?))
            }
        }
    }

    /// Test accuracy: every test sample once, the last batch padded and its padding ignored;
    /// the labels are the column bound to the model's labels input.
    fn accuracy(
        &self,
        eval: &mut RankExecutor,
        test: &dyn Dataset,
        columns: &[graph::ValueId],
    ) -> Result<f64, RuntimeError> {
        let plan = BatchPlan::eval(test.len(), self.config.data().batch_size)?;
        let label_column = column_of(columns, self.model.labels, "of the labels")?;
        let mut correct = 0usize;
        for batch in plan.iter() {
            feed_rows(eval, columns, test, batch.indices)?;
            eval.run()?;
            let labels = test.read_column(label_column, batch.indices)?.to_f64_vec();
            correct += batch.correct_rows(&eval.output(0).to_f64_vec(), &labels);
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
