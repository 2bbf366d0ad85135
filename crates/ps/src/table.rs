//! A server's block of a server-resident embedding table and its lazy (row-sparse) optimizer.
//!
//! A step updates only the rows its gradient has, with the runtime's optimizer rule applied to
//! each such row and that row's state, at the step's count `t` (MindSpore's sparse `SGD`,
//! `Momentum` and `LazyAdam` semantics: rows absent from the batch keep their weights *and*
//! their state — no momentum decay, no weight decay). With plain SGD and no weight decay this
//! is exactly the dense update; for stateful rules it is the lazy variant (see `docs/PS.md`).

use std::ops::Range;

use runtime::{Optimizer, OptimizerConfig, ParamSpec, WeightDecayFilter};
use tensor::{DType, Tensor};

use crate::error::PsError;
use crate::sparse::{Rows, TableInfo};

/// Rows `block` of one table, with their optimizer state.
pub struct ServerTable {
    info: TableInfo,
    block: Range<usize>,
    /// `[block.len(), width]`.
    weights: Tensor,
    /// The optimizer of one row: its rule, hyperparameters and weight decay by name.
    rule: Optimizer,
    /// The state of every row, one `[block.len(), width]` tensor per state name.
    state: Vec<Tensor>,
}

impl ServerTable {
    /// The block `block` of `info`, starting from `initial` (`[block.len(), width]`), updated
    /// by `config`'s rule with weight decay where `filter` applies it to the table's name.
    pub fn new(
        info: TableInfo,
        block: Range<usize>,
        initial: Tensor,
        config: OptimizerConfig,
        filter: &WeightDecayFilter,
    ) -> Result<ServerTable, PsError> {
        let shape = [block.len(), info.width];
        if initial.shape() != shape || initial.dtype() != DType::F32 {
            return Err(PsError::rows(
                &info.name,
                format!(
                    "initial rows {:?} {}, expected f32 {shape:?}",
                    initial.shape(),
                    initial.dtype()
                ),
            ));
        }
        let mut rule = Optimizer::new(
            config,
            &[ParamSpec {
                name: info.name.clone(),
                shape: vec![info.width],
                dtype: DType::F32,
            }],
        )?;
        rule.set_weight_decay_filter(filter);
        let state = config
            .kind
            .state_names()
            .iter()
            .map(|_| Tensor::zeros(DType::F32, &shape))
            .collect();
        Ok(ServerTable {
            info,
            block,
            weights: initial,
            rule,
            state,
        })
    }

    /// The table.
    pub fn info(&self) -> &TableInfo {
        &self.info
    }

    /// The global rows held.
    pub fn block(&self) -> &Range<usize> {
        &self.block
    }

    /// Bytes of the rows held.
    pub fn bytes(&self) -> usize {
        self.block.len() * self.info.width * 4
    }

    /// The values of rows `ids` (global, held: checked by the caller with
    /// [`crate::sparse::check_ids`]).
    pub fn rows(&self, ids: &[u64]) -> Result<Rows, PsError> {
        let w = self.info.width;
        let all = self
            .weights
            .as_f32()
            .map_err(|e| PsError::tensor(format!("the rows of table {}", self.info.name), e))?;
        let mut values = Vec::with_capacity(ids.len() * w);
        for &id in ids {
            let local = self.local(id)?;
            values.extend_from_slice(&all[local * w..(local + 1) * w]);
        }
        Ok(Rows {
            ids: ids.to_vec(),
            values,
        })
    }

    fn local(&self, id: u64) -> Result<usize, PsError> {
        let id = id as usize;
        if !self.block.contains(&id) {
            return Err(PsError::rows(
                &self.info.name,
                format!(
                    "row id {id} is not held here (rows {}..{})",
                    self.block.start, self.block.end
                ),
            ));
        }
        Ok(id - self.block.start)
    }

    /// Applies the gradient rows `grad` at optimizer step `step` (≥ 1) and `learning_rate`:
    /// each row and its state are updated by the runtime's rule; other rows are left alone.
    pub fn apply(&mut self, step: u64, learning_rate: f64, grad: &Rows) -> Result<(), PsError> {
        let w = self.info.width;
        if grad.values.len() != grad.ids.len() * w {
            return Err(PsError::rows(
                &self.info.name,
                format!(
                    "{} values for {} rows of width {w}",
                    grad.values.len(),
                    grad.ids.len()
                ),
            ));
        }
        let table = &self.info.name;
        let g = Tensor::from_vec(&[grad.ids.len(), w], grad.values.clone())
            .map_err(|e| PsError::tensor(format!("the gradient rows of table {table}"), e))?;
        let names = self.rule.config().kind.state_names();
        self.rule.set_step_count(step);
        self.rule.set_learning_rate(learning_rate)?;
        for (k, &id) in grad.ids.iter().enumerate() {
            let local = self.local(id)?;
            let span = local * w..(local + 1) * w;
            for (name, full) in names.iter().zip(&self.state) {
                let state = || format!("the optimizer state {name} of table {table}");
                let all = full.as_f32().map_err(|e| PsError::tensor(state(), e))?;
                let row = Tensor::from_vec(&[w], all[span.clone()].to_vec())
                    .map_err(|e| PsError::tensor(format!("{}, row {id}", state()), e))?;
                self.rule.load_state(0, name, &row)?;
            }
            self.rule
                .update_piece(0, &mut self.weights, local * w, &g, k * w)?;
            for (full, (_, row)) in self.state.iter_mut().zip(self.rule.state(0)?) {
                let what = || format!("the optimizer state of table {table}, row {id}");
                let row = row.as_f32().map_err(|e| PsError::tensor(what(), e))?;
                full.as_f32_mut().map_err(|e| PsError::tensor(what(), e))?[span.clone()]
                    .copy_from_slice(row);
            }
        }
        Ok(())
    }
}

/// Server `env.server_id`'s blocks of `compute`'s server-resident tables, from their initial
/// values. A restarted server with such a table is refused: snapshots do not hold tables yet.
pub fn server_tables(
    compute: &crate::compute::Compute,
    config: &runtime::TrainConfig,
    servers: usize,
    env: &crate::env::RoleEnv,
) -> Result<Vec<ServerTable>, PsError> {
    if compute.tables().is_empty() {
        return Ok(Vec::new());
    }
    if env.restart_count > 0 {
        return Err(PsError::Config {
            key: "ps.embedding_on_server".to_string(),
            reason: format!(
                "server {} restarted, but server-resident tables are not in its snapshots: the job cannot recover its rows",
                env.server_id
            ),
        });
    }
    let initial = compute.initial_tables()?;
    compute
        .tables()
        .iter()
        .zip(initial)
        .map(|(info, whole)| {
            let block = info.block(servers, env.server_id);
            let w = info.width;
            let what = || {
                format!(
                    "the initial rows {}..{} of table {}",
                    block.start, block.end, info.name
                )
            };
            let values = whole.as_f32().map_err(|e| PsError::tensor(what(), e))?
                [block.start * w..block.end * w]
                .to_vec();
            let rows = Tensor::from_vec(&[block.len(), w], values)
                .map_err(|e| PsError::tensor(what(), e))?;
            ServerTable::new(
                info.clone(),
                block,
                rows,
                config.optimizer_config(),
                config.weight_decay_filter(),
            )
        })
        .collect()
}
