//! The embedding bag ([`models::embedding_bag`]) in a parameter-server job: its programs, its
//! inputs (feature ids from the images) and, when its table is server-resident
//! (`ps.embedding_on_server`), the worker's side of the sparse lookup.
//!
//! A worker holding the table's rows of its batch only (`U` distinct ids, pulled from the
//! servers) runs the same network with a `[U, width]` table and the ids renumbered into it;
//! the program's table gradient is then the row-sparse gradient of those `U` rows, in the same
//! order of additions as the whole table's gradient (so the losses and updates equal the dense
//! run's).

use std::collections::BTreeMap;
use std::sync::Arc;

use models::embedding_bag::{bag_ids, embedding_bag, BagDims, HEAD, TABLE};
use parallel::{compile_forward, compile_training, ParallelConfig, Program};
use runtime::{BatchPlan, IdxDataset, RankExecutor, RuntimeError, TrainConfig};
use tensor::Tensor;

use crate::compute::ParamInfo;
use crate::error::PsError;
use crate::sparse::{Rows, TableInfo};

/// How many compiled programs (batch size × table rows) a worker keeps.
const PROGRAMS_KEPT: usize = 16;

/// One compiled embedding-bag program and its executor.
struct BagProgram {
    exec: RankExecutor,
    table: usize,
    head: usize,
    ids: usize,
    labels: Option<usize>,
}

/// The embedding bag of a job: sizes, data standardisation and compiled programs.
pub struct BagNet {
    dims: BagDims,
    mean: f32,
    std: f32,
    seed: u64,
    parallel: ParallelConfig,
    /// Whether the table lives on the servers.
    server_table: bool,
    train: BTreeMap<(usize, usize), BagProgram>,
    eval: BTreeMap<(usize, usize), BagProgram>,
}

/// The trainable parameters of the embedding bag of `dims`, table first.
fn bag_params(dims: &BagDims) -> [ParamInfo; 2] {
    [
        ParamInfo {
            name: TABLE.to_string(),
            shape: vec![dims.vocab_size(), dims.embedding_size],
        },
        ParamInfo {
            name: HEAD.to_string(),
            shape: vec![dims.embedding_size, dims.classes],
        },
    ]
}

impl BagNet {
    /// The embedding bag of `config` over `train`'s images; with its table on the servers when
    /// `ps.embedding_on_server` names it. Returns the net, the parameters a worker holds and
    /// the server-resident tables.
    pub fn new(
        config: &TrainConfig,
        train: &IdxDataset,
    ) -> Result<(BagNet, Vec<ParamInfo>, Vec<TableInfo>), PsError> {
        let [rows, cols] = train.image_shape();
        let dims = BagDims {
            pixels: rows * cols,
            embedding_size: config.model().hidden,
            classes: config.model().classes,
        };
        let on_server = config
            .ps()
            .map(|k| k.embedding_on_server.clone())
            .unwrap_or_default();
        for name in &on_server {
            if name != TABLE {
                return Err(PsError::Config {
                    key: "ps.embedding_on_server".to_string(),
                    reason: format!(
                        "{name:?} is not an embedding table of model.name = \"embedding_bag\" (its table is {TABLE:?})"
                    ),
                });
            }
        }
        let server_table = !on_server.is_empty();
        if server_table && config.train().eval {
            return Err(PsError::Config {
                key: "train.eval".to_string(),
                reason: format!(
                    "workers do not evaluate with a server-resident table ({TABLE} in ps.embedding_on_server) yet; set train.eval = false"
                ),
            });
        }
        let [table, head] = bag_params(&dims);
        let (params, tables) = if server_table {
            let info = TableInfo {
                name: table.name,
                rows: dims.vocab_size(),
                width: dims.embedding_size,
            };
            (vec![head], vec![info])
        } else {
            (vec![table, head], Vec::new())
        };
        let (mean, std) = train.standardization();
        let net = BagNet {
            dims,
            mean,
            std,
            seed: config.train().seed,
            parallel: config.parallel_config(),
            server_table,
            train: BTreeMap::new(),
            eval: BTreeMap::new(),
        };
        Ok((net, params, tables))
    }

    /// The sizes.
    pub fn dims(&self) -> &BagDims {
        &self.dims
    }

    /// Whether the table lives on the servers.
    pub fn server_table(&self) -> bool {
        self.server_table
    }

    /// The initial table and head (`train.seed`), as one process holding the whole table
    /// starts: the same values whether the table then lives on the servers or not.
    pub fn initial(&self, batch: usize) -> Result<(Tensor, Tensor), PsError> {
        let model =
            embedding_bag(&self.dims, batch, self.dims.vocab_size()).map_err(RuntimeError::from)?;
        let program = compile_training(&model.graph, model.loss, &self.parallel)
            .map_err(RuntimeError::from)?;
        let mut p = build(program, &model, true)?;
        p.exec.init_parameters(self.seed)?;
        Ok((p.exec.param(p.table).clone(), p.exec.param(p.head).clone()))
    }

    /// The feature ids of samples `rows` of `data`, `features()` per sample.
    pub fn ids(&self, data: &IdxDataset, rows: &[usize]) -> Result<Vec<u32>, PsError> {
        let images = data.read_images(rows)?;
        let fractions: Vec<f32> = images
            .as_f32()
            .map_err(|e| PsError::tensor("the batch's images", e))?
            .iter()
            .map(|&x| x * self.std + self.mean)
            .collect();
        Ok(bag_ids(&self.dims, &fractions))
    }

    /// The distinct table rows of samples `rows` of `data`, in id order.
    pub fn distinct_ids(&self, data: &IdxDataset, rows: &[usize]) -> Result<Vec<u64>, PsError> {
        let mut ids: Vec<u64> = self.ids(data, rows)?.into_iter().map(u64::from).collect();
        ids.sort_unstable();
        ids.dedup();
        Ok(ids)
    }

    /// The mean loss over samples `rows` of `data` and the gradients of `table` (whole, or the
    /// rows `held` of it, in id order) and `head`, at those values.
    pub fn gradient(
        &mut self,
        data: &IdxDataset,
        rows: &[usize],
        table: &Tensor,
        held: Option<&[u64]>,
        head: &Tensor,
    ) -> Result<(f32, Tensor, Tensor), PsError> {
        let ids = self.program_ids(data, rows, table, held)?;
        let key = (rows.len(), table.shape()[0]);
        if !self.train.contains_key(&key) {
            let model = embedding_bag(&self.dims, key.0, key.1).map_err(RuntimeError::from)?;
            let program = compile_training(&model.graph, model.loss, &self.parallel)
                .map_err(RuntimeError::from)?;
            keep(&mut self.train, key, build(program, &model, true)?);
        }
        let p = self.train.get_mut(&key).ok_or_else(|| {
            PsError::invariant(
                format!("the embedding-bag training program of {key:?}"),
                "was not compiled",
            )
        })?;
        p.exec.set_param(p.table, table.clone())?;
        p.exec.set_param(p.head, head.clone())?;
        p.exec.set_input_rows(p.ids, ids)?;
        if let Some(l) = p.labels {
            p.exec.set_input_rows(l, data.read_labels(rows)?)?;
        }
        p.exec.run()?;
        let loss = p.exec.output(0).to_f64_vec()[0] as f32;
        let grad = |i: usize, name: &str| {
            p.exec.grad(i).cloned().ok_or_else(|| PsError::NoGradient {
                name: name.to_string(),
            })
        };
        Ok((loss, grad(p.table, TABLE)?, grad(p.head, HEAD)?))
    }

    /// The ids input of samples `rows`: the feature ids, renumbered into `held` when the table
    /// passed is those rows only.
    fn program_ids(
        &self,
        data: &IdxDataset,
        rows: &[usize],
        table: &Tensor,
        held: Option<&[u64]>,
    ) -> Result<Tensor, PsError> {
        let ids = self.ids(data, rows)?;
        let local: Vec<i32> = match held {
            None => ids.iter().map(|&i| i as i32).collect(),
            Some(held) => ids
                .iter()
                .map(|&i| {
                    held.binary_search(&u64::from(i))
                        .map(|k| k as i32)
                        .map_err(|_| {
                            PsError::rows(TABLE, format!("row {i} of the batch was not pulled"))
                        })
                })
                .collect::<Result<_, _>>()?,
        };
        let expected_rows = held.map_or(self.dims.vocab_size(), <[u64]>::len);
        if table.shape() != [expected_rows, self.dims.embedding_size] {
            return Err(PsError::rows(
                TABLE,
                format!(
                    "{:?} values, expected [{expected_rows}, {}]",
                    table.shape(),
                    self.dims.embedding_size
                ),
            ));
        }
        Tensor::from_vec(&[rows.len(), self.dims.features()], local)
            .map_err(|e| PsError::tensor("the ids input of the embedding bag", e))
    }

    /// The test accuracy at the whole `table` and `head`: every test sample once, in batches of
    /// `batch_size`.
    pub fn accuracy(
        &mut self,
        test: &IdxDataset,
        batch_size: usize,
        table: &Tensor,
        head: &Tensor,
    ) -> Result<f64, PsError> {
        let plan = BatchPlan::eval(test.len(), batch_size)?;
        let key = (batch_size, table.shape()[0]);
        if !self.eval.contains_key(&key) {
            let model = embedding_bag(&self.dims, key.0, key.1).map_err(RuntimeError::from)?;
            let program = compile_forward(&model.graph, &[model.logits], &self.parallel)
                .map_err(RuntimeError::from)?;
            keep(&mut self.eval, key, build(program, &model, false)?);
        }
        let mut correct = 0usize;
        for batch in plan.iter() {
            let ids = self.program_ids(test, batch.indices, table, None)?;
            let p = self.eval.get_mut(&key).ok_or_else(|| {
                PsError::invariant(
                    format!("the embedding-bag evaluation program of {key:?}"),
                    "was not compiled",
                )
            })?;
            p.exec.set_param(p.table, table.clone())?;
            p.exec.set_param(p.head, head.clone())?;
            p.exec.set_input_rows(p.ids, ids)?;
            p.exec.run()?;
            correct += batch.correct_predictions(&p.exec.output(0).to_f64_vec(), test.labels());
        }
        Ok(correct as f64 / plan.n_real().max(1) as f64)
    }
}

/// Keeps `program` under `key`, dropping the oldest-keyed one when too many are kept.
fn keep(map: &mut BTreeMap<(usize, usize), BagProgram>, key: (usize, usize), p: BagProgram) {
    if map.len() >= PROGRAMS_KEPT {
        if let Some(&first) = map.keys().next() {
            map.remove(&first);
        }
    }
    map.insert(key, p);
}

/// An executor of `program` (of `model`) on one rank, with its parameters' and inputs'
/// positions.
fn build(
    program: Program,
    model: &models::Model,
    with_labels: bool,
) -> Result<BagProgram, PsError> {
    let program = Arc::new(program);
    let param = |name: &str| {
        program
            .params
            .iter()
            .position(|q| q.name == name)
            .ok_or_else(|| PsError::missing_parameter(name, "the embedding-bag program"))
    };
    let input = |value: graph::ValueId| program.inputs.iter().position(|i| i.value == value);
    let (table, head) = (param(TABLE)?, param(HEAD)?);
    let ids = input(model.input)
        .ok_or_else(|| PsError::invariant("the embedding-bag program", "has no ids input"))?;
    let labels = if with_labels {
        input(model.labels)
    } else {
        None
    };
    let exec = RankExecutor::new(program.clone(), crate::compute::one_rank()?)?;
    Ok(BagProgram {
        exec,
        table,
        head,
        ids,
        labels,
    })
}

/// The row-sparse gradient of the rows `held` from their `[held.len(), width]` gradient.
pub fn rows_of(held: &[u64], grad: &Tensor) -> Result<Rows, PsError> {
    Ok(Rows {
        ids: held.to_vec(),
        values: grad
            .as_f32()
            .map_err(|e| PsError::tensor("the gradient of the table's rows", e))?
            .to_vec(),
    })
}

/// `ps.worker_max_param_bytes`, after checking that no parameter a worker holds whole is
/// larger: such a parameter is refused by name (a table may be made server-resident with
/// `ps.embedding_on_server`).
pub fn worker_limit(
    config: &TrainConfig,
    compute: &crate::compute::Compute,
) -> Result<Option<u64>, PsError> {
    let Some(limit) = config.ps().and_then(|k| k.worker_max_param_bytes) else {
        return Ok(None);
    };
    for p in compute.params() {
        if p.bytes() as u64 > limit {
            return Err(PsError::Config {
                key: "ps.worker_max_param_bytes".to_string(),
                reason: format!(
                    "a worker would hold parameter {} of {} bytes ({:?} f32), more than the limit of {limit} bytes; keep it on the servers with ps.embedding_on_server = [{:?}] if it is an embedding table",
                    p.name,
                    p.bytes(),
                    p.shape,
                    p.name
                ),
            });
        }
    }
    Ok(Some(limit))
}

/// Refuses a batch whose rows of a server-resident table take more than `limit` bytes.
pub fn check_rows_limit(
    pulled: &crate::sparse::PulledRows,
    limit: Option<u64>,
) -> Result<(), PsError> {
    let (Some(limit), Some(table)) = (limit, &pulled.table) else {
        return Ok(());
    };
    if pulled.bytes() as u64 > limit {
        return Err(PsError::Config {
            key: "ps.worker_max_param_bytes".to_string(),
            reason: format!(
                "the batch looks up {} rows of table {} ({} bytes), more than the limit of {limit} bytes; lower data.batch_size or raise the limit",
                pulled.ids.len(),
                table.name,
                pulled.bytes()
            ),
        });
    }
    Ok(())
}
