//! Parallel settings: the mode, the device count, per-op strategies and the dataset strategy.

use std::collections::BTreeMap;

/// How ops are sharded (MindSpore's `parallel_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParallelMode {
    /// One device; shard settings are ignored, as MindSpore does.
    StandAlone,
    /// Every op data parallel (batch dim split over all devices); shard settings are ignored.
    DataParallel,
    /// Ops take the user's strategies; unannotated ops are data parallel.
    SemiAuto,
}

impl ParallelMode {
    /// Parses `stand_alone`, `data_parallel` or `semi_auto`.
    pub fn parse(text: &str) -> Option<ParallelMode> {
        match text {
            "stand_alone" => Some(ParallelMode::StandAlone),
            "data_parallel" => Some(ParallelMode::DataParallel),
            "semi_auto" | "semi_auto_parallel" => Some(ParallelMode::SemiAuto),
            _ => None,
        }
    }

    /// The config spelling.
    pub fn name(self) -> &'static str {
        match self {
            ParallelMode::StandAlone => "stand_alone",
            ParallelMode::DataParallel => "data_parallel",
            ParallelMode::SemiAuto => "semi_auto",
        }
    }
}

/// How the graph's inputs (data, labels) are split over the devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DatasetStrategy {
    /// Dim 0 of every input split over all devices: each rank reads its share of the batch.
    DataParallel,
    /// Every rank reads the whole batch.
    FullBatch,
    /// One strategy tuple per input, in the graph's input order.
    PerInput(Vec<Vec<usize>>),
}

/// A user strategy for one op: MindSpore's `shard(in_strategy, out_strategy)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpStrategy {
    /// One split tuple per input.
    pub inputs: Vec<Vec<usize>>,
    /// One split tuple per output, when the op's output layout is set explicitly.
    pub outputs: Option<Vec<Vec<usize>>>,
}

/// Everything the parallel pass needs to know besides the graph.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParallelConfig {
    /// The mode.
    pub mode: ParallelMode,
    /// Number of devices.
    pub devices: usize,
    /// User strategies by op name (`matmul1`).
    pub strategies: BTreeMap<String, OpStrategy>,
    /// How inputs are split.
    pub dataset_strategy: DatasetStrategy,
    /// Gradients are the gradient of the mean loss over the global batch (`true`, what one
    /// device computes), or, as MindSpore without `gradients_mean`, the sum over the data-parallel
    /// replicas of each replica's mean-loss gradient (`false`: `true`'s gradient times the
    /// number of batch shards).
    pub gradients_mean: bool,
    /// MindSpore's `loss_repeated_mean`. Tessera's loss is always the global mean, so `true`
    /// (the default) changes nothing; `false` multiplies gradients by the number of devices the
    /// loss is repeated on, as MindSpore does when it skips its `VirtualDiv`.
    pub loss_repeated_mean: bool,
}

impl ParallelConfig {
    /// One device, no sharding.
    pub fn stand_alone() -> ParallelConfig {
        ParallelConfig {
            mode: ParallelMode::StandAlone,
            devices: 1,
            strategies: BTreeMap::new(),
            dataset_strategy: DatasetStrategy::DataParallel,
            gradients_mean: true,
            loss_repeated_mean: true,
        }
    }

    /// `devices` devices in `mode`, with no user strategy yet.
    pub fn new(mode: ParallelMode, devices: usize) -> ParallelConfig {
        ParallelConfig {
            mode,
            devices,
            ..ParallelConfig::stand_alone()
        }
    }

    /// Adds a user strategy for op `op` (builder style).
    pub fn shard(mut self, op: &str, inputs: &[&[usize]]) -> ParallelConfig {
        self.strategies.insert(
            op.to_string(),
            OpStrategy {
                inputs: inputs.iter().map(|s| s.to_vec()).collect(),
                outputs: None,
            },
        );
        self
    }

    /// Adds a user strategy with an output strategy for op `op` (builder style).
    pub fn shard_with_out(
        mut self,
        op: &str,
        inputs: &[&[usize]],
        outputs: &[&[usize]],
    ) -> ParallelConfig {
        self.strategies.insert(
            op.to_string(),
            OpStrategy {
                inputs: inputs.iter().map(|s| s.to_vec()).collect(),
                outputs: Some(outputs.iter().map(|s| s.to_vec()).collect()),
            },
        );
        self
    }

    /// The number of devices the program runs on (1 in stand-alone mode).
    pub fn effective_devices(&self) -> usize {
        match self.mode {
            ParallelMode::StandAlone => 1,
            _ => self.devices,
        }
    }
}
