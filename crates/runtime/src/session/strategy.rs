//! The strategy of a session's checkpoints: every checkpointed tensor's global shape, dtype
//! and layout, and every forward op's strategy, saved as Tessera JSON and MindSpore protobuf
//! strategy files (one per pipeline stage too).

use std::path::{Path, PathBuf};

use ckpt::{OpStrategyRecord, ParamLayout, ResolvedParam, ResolvedStrategy, StrategyFlavour};
use exec::state_checkpoint_name;
use layout::TensorLayout;

use super::{TrainSession, MASTER_WEIGHT, STAGE_STRATEGY_DIR};
use crate::error::RuntimeError;

impl TrainSession {
    /// In a search mode, the plan this session's programs were placed by: searched (or loaded
    /// from `parallel.load_operator_strategy_file`) by [`crate::plan_model`] while the session
    /// was built, exactly what [`crate::plan`] returns for its configuration (`search_ms`
    /// aside), so that `tessera plan` searches once; `None` outside the search modes.
    pub fn searched_plan(&self) -> Option<&search::PlanReport> {
        self.searched.as_ref().map(|p| &p.report)
    }

    /// The strategy of everything a checkpoint holds: the checkpointed parameters (every
    /// trainable one; the others only with `strategy_file_only_for_trainable_params = false`)
    /// and every optimizer state (laid out like its parameter), with global shapes and dtypes.
    pub fn strategy(&self) -> Result<ResolvedStrategy, RuntimeError> {
        let states = self.config.optimizer_config().kind.state_names();
        let mut params = Vec::new();
        for p in self.train.params.iter().filter(|p| self.checkpointed(p)) {
            let dtype = self.train.buffers[p.buffer].dtype;
            // A pipeline stage's parameters live on its ranks, `stage · n ..`.
            let stage = parallel::pipeline::stage_of_ranks(p.layout.mesh());
            let bind = |mp: &TensorLayout, opt_shard: usize| {
                ParamLayout::new(stage, mp.clone(), opt_shard).map_err(|e| RuntimeError::Mismatch {
                    what: format!("layout of {}", p.name),
                    expected: "a valid layout".to_string(),
                    got: e.to_string(),
                })
            };
            // hsdp: the optimizer state is held in optimizer-shard pieces at every level, the
            // weights at MindSpore's levels (zero1 and zero2 keep them whole on every rank).
            let (weights, state) = match p.optimizer_shard() {
                Some(shard) => {
                    let sharded = bind(&shard.strategy_layout, shard.size)?;
                    let weights = if shard.level.shards_weights() {
                        sharded.clone()
                    } else {
                        bind(&p.layout, 1)?
                    };
                    (weights, sharded)
                }
                None => {
                    let whole = bind(&p.layout, 1)?;
                    (whole.clone(), whole)
                }
            };
            // Under mixed precision the optimizer state is f32 (beside f32 master weights).
            let state_dtype = match self.config.train().precision.has_master_weights() {
                true => tensor::DType::F32,
                false => dtype,
            };
            let mut entries = vec![(p.name.clone(), weights, dtype)];
            if p.trainable {
                let master = self.config.train().precision.has_master_weights();
                let names = states.iter().chain(master.then_some(&MASTER_WEIGHT));
                entries.extend(names.map(|s| {
                    (
                        state_checkpoint_name(s, &p.name),
                        state.clone(),
                        state_dtype,
                    )
                }));
            }
            for (name, placement, dtype) in entries {
                params.push(ResolvedParam {
                    name,
                    shape: p.layout.shape().to_vec(),
                    dtype: Some(dtype),
                    placements: vec![placement],
                });
            }
        }
        Ok(ResolvedStrategy::new(params)?)
    }

    /// Writes the strategy as Tessera JSON (`strategy.json`: every tensor's global shape, dtype
    /// and layout) and MindSpore protobuf (`strategy.ckpt`: the parameter layouts) into `dir`,
    /// each with every forward op's strategy, as MindSpore's `save_param_strategy_file` does
    /// (only the JSON has room for output strategies).
    pub fn save_strategy_files(&self, dir: &Path) -> Result<(PathBuf, PathBuf), RuntimeError> {
        let strategy = self.strategy()?;
        let ops = self.op_strategies();
        let save = |name: &str, flavour| {
            ckpt::save_param_strategy_file(&dir.join(name), &strategy, &ops, flavour, true)
        };
        let json = save("strategy.json", StrategyFlavour::Tessera)?;
        let ms = save("strategy.ckpt", StrategyFlavour::MsProtobuf)?;
        if strategy.n_stages() > 1 {
            self.save_stage_strategy_files(&dir.join(STAGE_STRATEGY_DIR), &strategy, &ops)?;
        }
        Ok((json, ms))
    }

    /// With pipeline stages, also one MindSpore strategy file per stage, as each stage's ranks
    /// save it in MindSpore (`<dir>/stage_<s>.ckpt`, plain names): `tessera strategy
    /// merge-stages` (MindSpore's `merge_pipeline_strategys`) turns them into the merged file.
    fn save_stage_strategy_files(
        &self,
        dir: &Path,
        strategy: &ResolvedStrategy,
        ops: &[OpStrategyRecord],
    ) -> Result<(), RuntimeError> {
        std::fs::create_dir_all(dir).map_err(|e| RuntimeError::Mismatch {
            what: format!("the directory {}", dir.display()),
            expected: "a directory for the per-stage strategy files".to_string(),
            got: e.to_string(),
        })?;
        for stage in 0..strategy.n_stages() {
            let params: Vec<ResolvedParam> = strategy
                .params()
                .iter()
                .filter(|p| p.placements.iter().any(|pl| pl.stage == stage))
                .cloned()
                .collect();
            let stage_ops: Vec<OpStrategyRecord> =
                ops.iter().filter(|o| o.stage == stage).cloned().collect();
            ckpt::save_param_strategy_file(
                &dir.join(format!("stage_{stage}.ckpt")),
                &ResolvedStrategy::new(params)?,
                &stage_ops,
                StrategyFlavour::MsProtobuf,
                true,
            )?;
        }
        Ok(())
    }

    /// Every forward op's strategy, in graph order: its input tuples and, when its outputs
    /// are brought to a set layout (an `out_strategy`), their split factors.
    pub fn op_strategies(&self) -> Vec<OpStrategyRecord> {
        let placed = &self.train.placed;
        placed
            .graph
            .nodes()
            .iter()
            .zip(&placed.nodes)
            .filter_map(|(node, place)| match (&node.role, &place.strategy) {
                (graph::NodeRole::Forward, Some(inputs)) => Some(OpStrategyRecord {
                    name: node.name.clone(),
                    stage: place
                        .inputs
                        .first()
                        .map_or(0, |l| parallel::pipeline::stage_of_ranks(l.mesh())),
                    inputs: inputs.clone(),
                    outputs: place
                        .out_layouts
                        .as_ref()
                        .map(|outs| outs.iter().map(|l| l.split_factors()).collect()),
                    in_layouts: None,
                    out_layouts: None,
                }),
                _ => None,
            })
            .collect()
    }
}
