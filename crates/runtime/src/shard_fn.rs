//! Functional operator splitting, MindSpore's PyNative `shard(fn, in_strategy, out_strategy,
//! parameter_plan)`: code holding whole tensors on one device calls a sub-network that is
//! compiled once into a parallel program and runs sharded over threads of this process.
//!
//! The strategies given are those of the sub-network's inputs (`in_strategy`) and parameters
//! (`parameter_plan`); the ops reading them take the cheapest strategy that splits them so
//! ([`search::anchored_strategies`]), and sharding propagation places the rest, as
//! MindSpore's `shard` requires its `sharding_propagation` search. `out_strategy` sets the
//! layout the ops producing the outputs leave them in; the caller gets whole outputs back.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use comm::LocalCluster;
use exec::RankExecutor;
use graph::{Graph, ValueId, ValueKind};
use parallel::{
    compile_forward, DatasetStrategy, OpStrategy, ParallelConfig, ParallelMode, Program,
};
use search::{
    anchored_strategies, search, Anchor, DeviceProfile, EvalSettings, SearchMode, SearchRequest,
};
use tensor::Tensor;

use crate::error::RuntimeError;

/// Where and how a sharded sub-network runs.
#[derive(Debug, Clone)]
pub struct ShardOptions {
    /// Devices (threads of this process).
    pub devices: usize,
    /// The device profile the strategy choice is costed on.
    pub profile: DeviceProfile,
    /// The longest any rank waits for a peer.
    pub timeout: Duration,
}

impl ShardOptions {
    /// `devices` devices costed as `h100-nvlink-ib` (the default profile of
    /// `parallel.device_profile`), every wait bounded by 60 s.
    pub fn new(devices: usize) -> ShardOptions {
        ShardOptions {
            devices,
            profile: search::profiles::built_in("h100-nvlink-ib").expect("a built-in profile"),
            timeout: Duration::from_secs(60),
        }
    }
}

/// A sub-network compiled once into a parallel program ([`shard`]); [`ShardedCell::call`] runs
/// it as often as asked.
#[derive(Debug, Clone)]
pub struct ShardedCell {
    program: Arc<Program>,
    strategies: BTreeMap<String, Vec<Vec<usize>>>,
    inputs: Vec<ValueId>,
    timeout: Duration,
}

/// Compiles `sub_network` computing `outputs` for `options.devices` devices: graph input `i`
/// laid out as `in_strategy[i]` (a split per dim), parameters as `parameter_plan` says (by
/// name; the others wherever propagation puts them), and the op producing output `k` leaving
/// it as `out_strategy[k]`, when given. Errors name the input, parameter or op that cannot
/// take its strategy.
pub fn shard(
    sub_network: &Graph,
    outputs: &[ValueId],
    in_strategy: &[Vec<usize>],
    out_strategy: Option<&[Vec<usize>]>,
    parameter_plan: &BTreeMap<String, Vec<usize>>,
    options: &ShardOptions,
) -> Result<ShardedCell, RuntimeError> {
    let inputs = sub_network.inputs();
    if in_strategy.len() != inputs.len() {
        return Err(setting(format!(
            "in_strategy has {} entries but the sub-network has {} inputs",
            in_strategy.len(),
            inputs.len()
        )));
    }
    let mut anchors: Vec<Anchor> = inputs
        .iter()
        .zip(in_strategy)
        .map(|(&value, split)| Anchor {
            value,
            split: split.clone(),
        })
        .collect();
    for (name, split) in parameter_plan {
        let value = sub_network
            .value_by_name(name)
            .filter(|&v| matches!(sub_network.values()[v.0].kind, ValueKind::Parameter { .. }))
            .ok_or_else(|| {
                setting(format!(
                    "parameter_plan names {name:?}, which is not a parameter of the sub-network"
                ))
            })?;
        anchors.push(Anchor {
            value,
            split: split.clone(),
        });
    }
    let devices = options.devices;
    let settings = EvalSettings {
        profile: &options.profile,
        devices,
        optimizer_states: 0,
        held: None,
    };
    let fixed = anchored_strategies(sub_network, &anchors, &settings)?;
    let request = SearchRequest {
        mode: SearchMode::ShardingPropagation,
        profile: &options.profile,
        devices,
        memory_budget: None,
        optimizer_states: 0,
        fixed,
        hints: BTreeMap::new(),
        time_budget: None,
        only: None,
    };
    let found = search(sub_network, &request)?;
    let mut strategies: BTreeMap<String, OpStrategy> = found
        .strategies
        .iter()
        .map(|(name, s)| (name.clone(), OpStrategy::from_tuples(s.clone(), None)))
        .collect();
    if let Some(out) = out_strategy {
        if out.len() != outputs.len() {
            return Err(setting(format!(
                "out_strategy has {} entries but {} outputs are asked for",
                out.len(),
                outputs.len()
            )));
        }
        for (&value, split) in outputs.iter().zip(out) {
            let producer = sub_network.producer(value).ok_or_else(|| {
                let name = &sub_network.values()[value.0].name;
                setting(format!(
                    "out_strategy: output {name} is not computed by an op"
                ))
            })?;
            let op = &sub_network.nodes()[producer.0].name;
            if let Some(s) = strategies.get_mut(op) {
                s.outputs = Some(vec![split.clone()]);
            }
        }
    }
    let mut config = ParallelConfig::stand_alone();
    config.mode = ParallelMode::SemiAuto;
    config.devices = devices;
    config.strategies = strategies;
    config.dataset_strategy = DatasetStrategy::PerInput(in_strategy.to_vec());
    let program = compile_forward(sub_network, outputs, &config)?;
    Ok(ShardedCell {
        program: Arc::new(program),
        strategies: found.strategies.into_iter().collect(),
        inputs,
        timeout: options.timeout,
    })
}

impl ShardedCell {
    /// The per-rank program (inspect its layouts and communication).
    pub fn program(&self) -> &Program {
        &self.program
    }

    /// The strategy every op runs with, by op name.
    pub fn strategies(&self) -> &BTreeMap<String, Vec<Vec<usize>>> {
        &self.strategies
    }

    /// Runs the sub-network on whole `inputs` (in graph input order) and whole `params` (by
    /// name; every parameter of the program): each rank takes its slices, runs its program,
    /// and the whole outputs come back.
    pub fn call(
        &self,
        inputs: &[Tensor],
        params: &BTreeMap<String, Tensor>,
    ) -> Result<Vec<Tensor>, RuntimeError> {
        if inputs.len() != self.inputs.len() {
            return Err(RuntimeError::Mismatch {
                what: "inputs of the sharded sub-network".to_string(),
                expected: format!("{} tensors", self.inputs.len()),
                got: format!("{} tensors", inputs.len()),
            });
        }
        for p in &self.program.params {
            if !params.contains_key(&p.name) {
                return Err(RuntimeError::Mismatch {
                    what: format!("parameter {}", p.name),
                    expected: "a value in params".to_string(),
                    got: "none".to_string(),
                });
            }
        }
        let cluster = LocalCluster::new(self.program.devices())?.with_timeout(self.timeout);
        let results = cluster.run(|comm| -> Result<Option<Vec<Tensor>>, RuntimeError> {
            let mut exec =
                RankExecutor::with_lazy_parameters(self.program.clone(), Arc::new(comm))?;
            for (i, p) in self.program.params.iter().enumerate() {
                if exec.holds(&p.layout) {
                    let region = exec.box_of(&p.layout)?;
                    exec.set_param(i, params[&p.name].extract_box(&region)?)?;
                }
            }
            for (i, input) in self.program.inputs.iter().enumerate() {
                let k = self
                    .inputs
                    .iter()
                    .position(|&v| v == input.value)
                    .expect("program inputs are graph inputs");
                if exec.holds(&input.layout) {
                    let region = exec.box_of(&input.layout)?;
                    exec.set_input(i, &inputs[k].extract_box(&region)?)?;
                }
            }
            exec.run()?;
            // The outputs are replicated: rank 0's are whole.
            Ok((exec.rank() == 0).then(|| {
                (0..self.program.outputs.len())
                    .map(|k| exec.output(k).clone())
                    .collect()
            }))
        });
        let ranks = crate::launch::root_cause(results)?;
        Ok(ranks.into_iter().flatten().next().unwrap_or_default())
    }
}

fn setting(reason: String) -> RuntimeError {
    RuntimeError::Parallel(parallel::ParallelError::Setting {
        setting: "shard",
        reason,
    })
}
