//! A worker's arithmetic: the runtime's stand-alone training program on the worker's rows,
//! the data order of a data-parallel run, and the test accuracy. Servers use it for the
//! parameters' names, shapes and initial values. The seed MLP reads images (a row is a
//! sample); the GPT reads text (a row is a window of tokens, fed by the runtime's
//! `TextData::feed`); both run through the runtime's session. The embedding bag reads images
//! through [`crate::embedding`].

use std::collections::BTreeMap;
use std::sync::Arc;

use comm::{Communicator, LocalCluster};
use runtime::{
    BatchPlan, IdxDataset, ModelName, RankExecutor, Session, TextData, TrainConfig, TrainData,
};
use tensor::Tensor;

use crate::embedding::BagNet;
use crate::error::PsError;
use crate::sparse::{Rows, TableInfo};

/// A trainable parameter: its name and shape (f32).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamInfo {
    /// The name (`fc1.weight`).
    pub name: String,
    /// The global shape.
    pub shape: Vec<usize>,
}

impl ParamInfo {
    /// Bytes of the f32 tensor.
    pub fn bytes(&self) -> usize {
        self.shape.iter().product::<usize>() * 4
    }
}

/// One stand-alone program and its executor, for one batch size.
struct Program {
    session: Session,
    exec: RankExecutor,
    /// Program parameter index of every trainable parameter, in [`Compute::params`] order.
    param_index: Vec<usize>,
}

/// A job's data.
enum Data {
    /// Images (the seed MLP): the training and test splits.
    Images {
        train: Arc<IdxDataset>,
        test: Arc<IdxDataset>,
    },
    /// Text (the GPT).
    Text(Arc<TextData>),
}

/// The training and test splits of an image job; for a text job (the GPT), an error naming
/// `train.eval`, the one setting that asks for what only images give.
fn images(data: &Data) -> Result<(&Arc<IdxDataset>, &Arc<IdxDataset>), PsError> {
    match data {
        Data::Images { train, test } => Ok((train, test)),
        Data::Text(_) => Err(PsError::Config {
            key: "train.eval".to_string(),
            reason: "parameter-server GPT training does not evaluate: set train.eval = false"
                .to_string(),
        }),
    }
}

/// The model, data and programs of a parameter-server job.
pub struct Compute {
    base: TrainConfig,
    data: Data,
    /// The parameters a worker holds (server-resident tables excluded).
    params: Vec<ParamInfo>,
    /// The server-resident tables (`ps.embedding_on_server`).
    tables: Vec<TableInfo>,
    net: Net,
}

/// The network of the job.
enum Net {
    /// The seed MLP, through the runtime's session.
    Mlp(Box<MlpNet>),
    /// The embedding bag ([`crate::embedding`]).
    Bag(Box<BagNet>),
}

/// The seed MLP's programs.
struct MlpNet {
    /// Training programs by batch size (a worker's share changes when workers come and go).
    programs: BTreeMap<usize, Program>,
    /// The evaluation executor (global batch).
    eval: RankExecutor,
    eval_index: Vec<usize>,
    /// The graph value of the labels input (the same in every batch size's graph).
    labels: graph::ValueId,
}

/// A communicator of one rank (the stand-alone programs' world).
pub(crate) fn one_rank() -> Result<Arc<dyn Communicator>, PsError> {
    let cluster = LocalCluster::new(1).map_err(runtime::RuntimeError::from)?;
    let comm = cluster
        .comms()
        .pop()
        .ok_or_else(|| PsError::invariant("a one-rank cluster", "made no communicator"))?;
    Ok(Arc::new(comm))
}

impl Compute {
    /// The job of `config` (a parameter-server config: stand-alone programs).
    pub fn new(config: &TrainConfig) -> Result<Compute, PsError> {
        if config.model().name == ModelName::EmbeddingBag {
            let data = config.data();
            let (train, test) =
                IdxDataset::open_train_and_test(&data.dir, data.pixel_max, data.normalize)?;
            let (net, params, tables) = BagNet::new(config, &train)?;
            return Ok(Compute {
                base: config.clone(),
                data: Data::Images {
                    train: Arc::new(train),
                    test: Arc::new(test),
                },
                params,
                tables,
                net: Net::Bag(Box::new(net)),
            });
        }
        let session = Session::new(config)?;
        let data =
            match session.data.clone() {
                TrainData::Images { train, test } => Data::Images { train, test },
                TrainData::Text(_) if config.train().eval => return Err(PsError::Config {
                    key: "train.eval".to_string(),
                    reason:
                        "parameter-server GPT training does not evaluate: set train.eval = false"
                            .to_string(),
                }),
                TrainData::Text(text) => Data::Text(text),
            };
        let program = &session.train;
        let param_index: Vec<usize> = (0..program.params.len())
            .filter(|&i| program.params[i].trainable && program.params[i].grad_buffer.is_some())
            .collect();
        let params = param_index
            .iter()
            .map(|&i| ParamInfo {
                name: program.params[i].name.clone(),
                shape: program.params[i].layout.shape().to_vec(),
            })
            .collect::<Vec<_>>();
        let eval = RankExecutor::new(session.eval.clone(), one_rank()?)?;
        let eval_index = params
            .iter()
            .map(|p| {
                eval.program()
                    .params
                    .iter()
                    .position(|q| q.name == p.name)
                    .ok_or_else(|| PsError::missing_parameter(&p.name, "the evaluation program"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Compute {
            base: config.clone(),
            data,
            params,
            tables: Vec::new(),
            net: Net::Mlp(Box::new(MlpNet {
                programs: BTreeMap::new(),
                eval,
                eval_index,
                labels: session.model.labels,
            })),
        })
    }

    /// The trainable parameters, in program order.
    pub fn params(&self) -> &[ParamInfo] {
        &self.params
    }

    /// The server-resident tables (`ps.embedding_on_server`), which workers never hold whole.
    pub fn tables(&self) -> &[TableInfo] {
        &self.tables
    }

    /// Every server-resident table's initial value (`train.seed`): what the table starts as
    /// when a worker holds it whole.
    pub fn initial_tables(&self) -> Result<Vec<Tensor>, PsError> {
        match &self.net {
            Net::Bag(bag) if bag.server_table() => {
                Ok(vec![bag.initial(self.base.data().batch_size)?.0])
            }
            _ => Ok(Vec::new()),
        }
    }

    /// The distinct rows of server-resident table 0 that samples `rows` look up, in id order
    /// (empty when the job has no such table).
    pub fn table_ids(&self, rows: &[usize]) -> Result<Vec<u64>, PsError> {
        match &self.net {
            Net::Bag(bag) if bag.server_table() => bag.distinct_ids(images(&self.data)?.0, rows),
            _ => Ok(Vec::new()),
        }
    }

    /// The mean loss over samples `rows`, the gradient of every parameter at `weights` and the
    /// row-sparse gradient of server-resident table 0 at its rows `held` (distinct, in id
    /// order), whose values are `table_rows` (`[held.len(), width]`).
    pub fn gradient_with_rows(
        &mut self,
        weights: &[Tensor],
        rows: &[usize],
        held: &[u64],
        table_rows: &Tensor,
    ) -> Result<(f32, Vec<Tensor>, Rows), PsError> {
        let Net::Bag(bag) = &mut self.net else {
            return Err(PsError::invariant(
                "a gradient with table rows",
                "the job has no server-resident table",
            ));
        };
        let [head] = weights else {
            return Err(PsError::invariant(
                "a gradient with table rows",
                format!("needs 1 weight besides the table, got {}", weights.len()),
            ));
        };
        if rows.is_empty() {
            return Err(PsError::invariant(
                "a gradient with table rows",
                "needs rows",
            ));
        }
        let (loss, table_grad, head_grad) =
            bag.gradient(images(&self.data)?.0, rows, table_rows, Some(held), head)?;
        Ok((
            loss,
            vec![head_grad],
            crate::embedding::rows_of(held, &table_grad)?,
        ))
    }

    /// Every parameter's initial value (`train.seed`), as a data-parallel run starts.
    pub fn initial_params(&self) -> Result<Vec<Tensor>, PsError> {
        if let Net::Bag(bag) = &self.net {
            let (table, head) = bag.initial(self.base.data().batch_size)?;
            return Ok(match bag.server_table() {
                true => vec![head],
                false => vec![table, head],
            });
        }
        let session = Session::new(&self.base)?;
        let mut exec = RankExecutor::new(session.train.clone(), one_rank()?)?;
        exec.init_parameters(self.base.train().seed)?;
        let mut out = Vec::with_capacity(self.params.len());
        for p in &self.params {
            let i = session
                .train
                .params
                .iter()
                .position(|q| q.name == p.name)
                .ok_or_else(|| PsError::missing_parameter(&p.name, "the training program"))?;
            out.push(exec.param(i).clone());
        }
        Ok(out)
    }

    /// Global steps per epoch (full global batches of `data.batch_size`).
    pub fn steps_per_epoch(&self) -> u64 {
        match &self.data {
            Data::Images { train, .. } => (train.len() / self.base.data().batch_size).max(1) as u64,
            Data::Text(text) => text.steps_per_epoch.max(1),
        }
    }

    /// Steps of the whole run: `train.epochs` epochs, cut at `train.max_steps`.
    pub fn total_steps(&self) -> u64 {
        let all = self.steps_per_epoch() * self.base.train().epochs as u64;
        self.base.train().max_steps.map_or(all, |m| m.min(all))
    }

    /// The epoch (from 1) and the step in it (from 0) of global step `step` (from 0).
    pub fn epoch_of(&self, step: u64) -> (usize, u64) {
        let per = self.steps_per_epoch();
        ((step / per) as usize + 1, step % per)
    }

    /// Rows `offset..offset + count` of global step `step`'s batch, the batch a data-parallel
    /// run takes at that step: sample indices (images) or window starts (text).
    pub fn rows(&self, step: u64, offset: usize, count: usize) -> Result<Vec<usize>, PsError> {
        let (epoch, index) = self.epoch_of(step);
        let train = match &self.data {
            Data::Images { train, .. } => train,
            Data::Text(text) => {
                let starts = text.train_starts(self.base.train().seed, epoch as u64, index, 0)?;
                let mine = starts.get(offset..offset + count).ok_or_else(|| {
                    PsError::message(
                        format!("BeginStep reply of step {step}"),
                        format!(
                            "rows {offset}..{} of a batch of {}",
                            offset + count,
                            starts.len()
                        ),
                    )
                })?;
                return Ok(mine.iter().map(|&s| s as usize).collect());
            }
        };
        let data = self.base.data();
        let plan = BatchPlan::train(
            train.len(),
            data.batch_size,
            data.shuffle,
            self.base.train().seed,
            epoch as u64,
        )?;
        let batch = plan.batch(index as usize).ok_or_else(|| {
            PsError::invariant(
                format!("step {step}"),
                format!("batch {index} of epoch {epoch} does not exist"),
            )
        })?;
        Ok(batch.rows(offset, count)?.to_vec())
    }

    /// The mean loss over `rows` and its gradient for every parameter, at `weights`.
    pub fn gradient(
        &mut self,
        weights: &[Tensor],
        rows: &[usize],
    ) -> Result<(f32, Vec<Tensor>), PsError> {
        if rows.is_empty() || weights.len() != self.params.len() {
            return Err(PsError::invariant(
                "a gradient",
                format!(
                    "needs rows and {} weights, got {} rows and {} weights",
                    self.params.len(),
                    rows.len(),
                    weights.len()
                ),
            ));
        }
        let mlp = match &mut self.net {
            Net::Mlp(mlp) => mlp,
            Net::Bag(bag) => {
                let [table, head] = weights else {
                    return Err(PsError::invariant(
                        "a gradient",
                        "with a server-resident table, it needs the table's rows",
                    ));
                };
                let (loss, t, h) = bag.gradient(images(&self.data)?.0, rows, table, None, head)?;
                return Ok((loss, vec![t, h]));
            }
        };
        if let std::collections::btree_map::Entry::Vacant(slot) = mlp.programs.entry(rows.len()) {
            let config = self.base.clone().with_batch_size(rows.len())?;
            let session = Session::new(&config)?;
            let exec = RankExecutor::new(session.train.clone(), one_rank()?)?;
            let param_index = self
                .params
                .iter()
                .map(|p| {
                    session
                        .train
                        .params
                        .iter()
                        .position(|q| q.name == p.name)
                        .ok_or_else(|| {
                            PsError::missing_parameter(
                                &p.name,
                                format!("the training program of batch {}", rows.len()),
                            )
                        })
                })
                .collect::<Result<Vec<_>, _>>()?;
            slot.insert(Program {
                session,
                exec,
                param_index,
            });
        }
        let program = mlp.programs.get_mut(&rows.len()).ok_or_else(|| {
            PsError::invariant(
                format!("the training program of batch {}", rows.len()),
                "was not compiled",
            )
        })?;
        for (k, w) in weights.iter().enumerate() {
            copy_into(
                program.exec.param_mut(program.param_index[k]),
                w,
                &self.params[k].name,
            )?;
        }
        match &self.data {
            Data::Images { train, .. } => {
                let labels = program.session.model.labels;
                let inputs = program.exec.program().inputs.clone();
                for (i, input) in inputs.iter().enumerate() {
                    let block = if input.value == labels {
                        train.read_labels(rows)?
                    } else {
                        train.read_images(rows)?
                    };
                    program.exec.set_input_rows(i, block)?;
                }
            }
            Data::Text(text) => {
                let starts: Vec<u64> = rows.iter().map(|&r| r as u64).collect();
                text.feed(
                    &mut program.exec,
                    &program.session.model,
                    &text.corpus.train,
                    &starts,
                )?;
            }
        }
        program.exec.run()?;
        let loss = program.exec.output(0).to_f64_vec()[0] as f32;
        let mut grads = Vec::with_capacity(self.params.len());
        for (k, &i) in program.param_index.iter().enumerate() {
            let g = program.exec.grad(i).ok_or_else(|| PsError::NoGradient {
                name: self.params[k].name.clone(),
            })?;
            grads.push(g.clone());
        }
        Ok((loss, grads))
    }

    /// The test accuracy at `weights`: every test sample once.
    pub fn accuracy(&mut self, weights: &[Tensor]) -> Result<f64, PsError> {
        let test = images(&self.data)?.1.clone();
        let batch_size = self.base.data().batch_size;
        let mlp = match &mut self.net {
            Net::Mlp(mlp) => mlp,
            Net::Bag(bag) => {
                let [table, head] = weights else {
                    return Err(PsError::invariant(
                        "the test accuracy",
                        "is not computed with a server-resident table",
                    ));
                };
                return bag.accuracy(&test, batch_size, table, head);
            }
        };
        for (k, w) in weights.iter().enumerate() {
            copy_into(
                mlp.eval.param_mut(mlp.eval_index[k]),
                w,
                &self.params[k].name,
            )?;
        }
        let plan = BatchPlan::eval(test.len(), batch_size)?;
        let labels = test.labels();
        let label_value = Some(mlp.labels);
        let inputs = mlp.eval.program().inputs.clone();
        let mut correct = 0usize;
        for batch in plan.iter() {
            for (i, input) in inputs.iter().enumerate() {
                let block = if Some(input.value) == label_value {
                    test.read_labels(batch.indices)?
                } else {
                    test.read_images(batch.indices)?
                };
                mlp.eval.set_input_rows(i, block)?;
            }
            mlp.eval.run()?;
            correct += batch.correct_predictions(&mlp.eval.output(0).to_f64_vec(), labels);
        }
        Ok(correct as f64 / plan.n_real().max(1) as f64)
    }
}

/// Copies `src`'s values into `dst` (same shape and dtype), naming the parameter on mismatch.
fn copy_into(dst: &mut Tensor, src: &Tensor, name: &str) -> Result<(), PsError> {
    if dst.shape() != src.shape() || dst.dtype() != src.dtype() {
        return Err(PsError::invariant(
            format!("weights of {name}"),
            format!(
                "{:?} {}, expected {:?} {}",
                src.shape(),
                src.dtype(),
                dst.shape(),
                dst.dtype()
            ),
        ));
    }
    dst.as_bytes_mut().copy_from_slice(src.as_bytes());
    Ok(())
}
