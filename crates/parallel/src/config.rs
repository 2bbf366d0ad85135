//! Parallel settings: the mode, the device count, per-op strategies and the dataset strategy.

use std::collections::BTreeMap;

use layout::Layout;

/// How ops are sharded (MindSpore's `parallel_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParallelMode {
    /// One device; shard settings are ignored, as MindSpore does.
    StandAlone,
    /// Every op data parallel (batch dim split over all devices); shard settings are ignored.
    DataParallel,
    /// Ops take the user's strategies; unannotated ops are data parallel.
    SemiAuto,
    /// Automatic parallel: ops without a user strategy get one found by a search over the cost
    /// model (`sharding_propagation`, `recursive_programming`, `dynamic_programming`). Once
    /// found, the strategies are placed as in `semi_auto`.
    Auto(SearchMode),
}

/// The search algorithms of automatic parallel (`parallel.mode`); the searches themselves live
/// in the `search` crate, this is only the setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SearchMode {
    /// `sharding_propagation`.
    ShardingPropagation,
    /// `recursive_programming`.
    RecursiveProgramming,
    /// `dynamic_programming`.
    DynamicProgramming,
}

impl SearchMode {
    /// Every mode, in documentation order.
    pub const ALL: [SearchMode; 3] = [
        SearchMode::ShardingPropagation,
        SearchMode::RecursiveProgramming,
        SearchMode::DynamicProgramming,
    ];

    /// The config spelling.
    pub fn name(self) -> &'static str {
        match self {
            SearchMode::ShardingPropagation => "sharding_propagation",
            SearchMode::RecursiveProgramming => "recursive_programming",
            SearchMode::DynamicProgramming => "dynamic_programming",
        }
    }
}

impl ParallelMode {
    /// Every config spelling [`ParallelMode::parse`] accepts, in documentation order.
    pub const NAMES: [&'static str; 6] = [
        "stand_alone",
        "data_parallel",
        "semi_auto",
        "sharding_propagation",
        "recursive_programming",
        "dynamic_programming",
    ];

    /// Parses `stand_alone`, `data_parallel`, `semi_auto` or a search mode
    /// (`sharding_propagation`, `recursive_programming`, `dynamic_programming`).
    pub fn parse(text: &str) -> Option<ParallelMode> {
        match text {
            "stand_alone" => Some(ParallelMode::StandAlone),
            "data_parallel" => Some(ParallelMode::DataParallel),
            "semi_auto" | "semi_auto_parallel" => Some(ParallelMode::SemiAuto),
            _ => SearchMode::ALL
                .into_iter()
                .find(|m| m.name() == text)
                .map(ParallelMode::Auto),
        }
    }

    /// Whether ops take strategies from `[parallel.shard]` (or a search): `semi_auto` and the
    /// search modes.
    pub fn uses_strategies(self) -> bool {
        matches!(self, ParallelMode::SemiAuto | ParallelMode::Auto(_))
    }

    /// The config spelling.
    pub fn name(self) -> &'static str {
        match self {
            ParallelMode::StandAlone => "stand_alone",
            ParallelMode::DataParallel => "data_parallel",
            ParallelMode::SemiAuto => "semi_auto",
            ParallelMode::Auto(search) => search.name(),
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
    /// One layout per input, in the graph's input order, all on one mesh whose device count is
    /// the run's (MindSpore's `dataset_strategy` given `Layout`s).
    Layouts(Vec<Layout>),
}

/// A user strategy for one op: MindSpore's `shard(in_strategy, out_strategy)`, given as split
/// tuples or as layouts (MindSpore's `Layout(device_matrix, alias_name)` applied per input).
///
/// The tuples are always there: for a strategy given as layouts they are the layouts' split
/// factors, which is what strategy files record. The layouts, when present, decide the
/// placement: the op runs on their mesh and its inputs (outputs) take exactly those layouts,
/// where tuples would have the op's rule build a device matrix. Build one with
/// [`OpStrategy::from_tuples`] or [`OpStrategy::from_layouts`] so the two agree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpStrategy {
    /// One split tuple per input.
    pub inputs: Vec<Vec<usize>>,
    /// One split tuple per output, when the op's output layout is set explicitly.
    pub outputs: Option<Vec<Vec<usize>>>,
    /// One layout per input when the in_strategy was given as layouts; `inputs` are their split
    /// factors.
    pub in_layouts: Option<Vec<Layout>>,
    /// One layout per output when the out_strategy was given as layouts; `outputs` are their
    /// split factors.
    pub out_layouts: Option<Vec<Layout>>,
}

impl OpStrategy {
    /// A strategy of split tuples: `inputs` per input, `outputs` per output when set.
    pub fn from_tuples(inputs: Vec<Vec<usize>>, outputs: Option<Vec<Vec<usize>>>) -> OpStrategy {
        OpStrategy {
            inputs,
            outputs,
            in_layouts: None,
            out_layouts: None,
        }
    }

    /// A strategy of layouts: one per input, and one per output when set. The split tuples are
    /// the layouts' split factors.
    pub fn from_layouts(inputs: Vec<Layout>, outputs: Option<Vec<Layout>>) -> OpStrategy {
        OpStrategy {
            inputs: split_factors(&inputs),
            outputs: outputs.as_deref().map(split_factors),
            in_layouts: Some(inputs),
            out_layouts: outputs,
        }
    }

    /// The same in_strategy with `outputs` as the out_strategy, given as layouts.
    pub fn with_out_layouts(self, outputs: Vec<Layout>) -> OpStrategy {
        OpStrategy {
            outputs: Some(split_factors(&outputs)),
            out_layouts: Some(outputs),
            ..self
        }
    }

    /// The same in_strategy with `outputs` as the out_strategy, given as split tuples.
    pub fn with_out_tuples(self, outputs: Vec<Vec<usize>>) -> OpStrategy {
        OpStrategy {
            outputs: Some(outputs),
            out_layouts: None,
            ..self
        }
    }
}

/// The split factors of every layout.
fn split_factors(layouts: &[Layout]) -> Vec<Vec<usize>> {
    layouts.iter().map(Layout::split_factors).collect()
}

/// What optimizer parallelism shards (MindSpore's `optimizer_level`, plus ZeRO's stages 1 and 2
/// under their own names). See [`crate::hsdp`] for what each one does to the program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptimizerLevel {
    /// ZeRO-1 (`zero1`): the weights stay whole on every rank; each rank keeps optimizer state
    /// for, and updates, only its dim-0 piece of the all-reduced gradient, then the pieces are
    /// all-gathered into the whole weights.
    Zero1,
    /// ZeRO-2 (`zero2`): as ZeRO-1, but the gradients are reduce-scattered into the pieces
    /// instead of all-reduced.
    Zero2,
    /// MindSpore's `level1`: the weights and the optimizer state are sharded. Each rank holds
    /// only its piece of the weight, all-gathered before its first forward use (the gathered
    /// weight lives until its last backward use); the gradient is reduce-scattered into the
    /// piece (the backward of the gather). With gradient accumulation the whole gradient is
    /// accumulated.
    Level1,
    /// MindSpore's `level2`: level 1 with the gradient accumulation sharded too (MindSpore's
    /// `grad_accumulation_shard`): the gradient is reduce-scattered at every micro step and only
    /// the piece is accumulated. Without accumulation it is level 1.
    Level2,
    /// MindSpore's `level3` (ZeRO-3, FSDP): level 2, and each weight is gathered again before
    /// its first backward use, so no gathered weight lives from one pass to the other.
    Level3,
}

impl OptimizerLevel {
    /// Every level, in the order of [`OptimizerLevel::name`]'s spellings.
    pub const ALL: [OptimizerLevel; 5] = [
        OptimizerLevel::Level1,
        OptimizerLevel::Level2,
        OptimizerLevel::Level3,
        OptimizerLevel::Zero1,
        OptimizerLevel::Zero2,
    ];

    /// Parses `level1`, `level2`, `level3`, `zero1` or `zero2`.
    pub fn parse(text: &str) -> Option<OptimizerLevel> {
        OptimizerLevel::ALL.into_iter().find(|l| l.name() == text)
    }

    /// The config spelling.
    pub fn name(self) -> &'static str {
        match self {
            OptimizerLevel::Zero1 => "zero1",
            OptimizerLevel::Zero2 => "zero2",
            OptimizerLevel::Level1 => "level1",
            OptimizerLevel::Level2 => "level2",
            OptimizerLevel::Level3 => "level3",
        }
    }

    /// Whether a sharded parameter's own buffer holds only the rank's piece (MindSpore's
    /// levels), rather than the whole slice (ZeRO-1 and ZeRO-2).
    pub fn shards_weights(self) -> bool {
        matches!(
            self,
            OptimizerLevel::Level1 | OptimizerLevel::Level2 | OptimizerLevel::Level3
        )
    }

    /// Whether a sharded weight is gathered again before its first backward use (level 3).
    pub fn regathers_for_backward(self) -> bool {
        self == OptimizerLevel::Level3
    }

    /// Whether gradient accumulation keeps only the piece at this level (`Some`), or as
    /// `gradient_accumulation_shard` says (`None`, ZeRO-1).
    pub fn accumulation_shard(self) -> Option<bool> {
        match self {
            OptimizerLevel::Zero1 => None,
            OptimizerLevel::Level1 => Some(false),
            OptimizerLevel::Zero2 | OptimizerLevel::Level2 | OptimizerLevel::Level3 => Some(true),
        }
    }
}

/// Optimizer parallelism (`[parallel.hsdp]`, MindSpore's `AutoParallel.hsdp(shard_size,
/// threshold, optimizer_level)`): a trainable parameter held by more than one rank is cut along
/// dim 0 over its replica group (see [`crate::OptimizerShard`] for the rule).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HsdpConfig {
    /// The most ranks a parameter is sharded over (`None`: its whole replica group,
    /// MindSpore's `-1`). A replica group larger than this is cut into consecutive chunks of
    /// this many ranks.
    pub shard_size: Option<usize>,
    /// Parameters whose whole (unsharded) size is below this many KB (1024 bytes) are not
    /// sharded.
    pub threshold_kb: usize,
    /// What is sharded.
    pub level: OptimizerLevel,
    /// Under ZeRO-1 with gradient accumulation, each rank accumulates only its optimizer piece
    /// of a sharded parameter's gradient (MindSpore's `parallel_optimizer_config`
    /// `gradient_accumulation_shard`). The other levels decide it themselves
    /// ([`OptimizerLevel::accumulation_shard`]).
    pub gradient_accumulation_shard: bool,
    /// Whether the run accumulates gradients over micro-batches (`train.grad_accumulation_steps`
    /// > 1, set by the trainer): level 1 then keeps, and accumulates, the whole gradient.
    pub accumulates: bool,
}

impl HsdpConfig {
    /// Whether the program brings a sharded parameter's gradient to its shard layout (its sum
    /// is a reduce-scatter) rather than to the strategy layout (an all-reduce).
    pub fn gradient_sharded(&self) -> bool {
        match self.level {
            OptimizerLevel::Zero1 => false,
            OptimizerLevel::Level1 => !self.accumulates,
            OptimizerLevel::Zero2 | OptimizerLevel::Level2 | OptimizerLevel::Level3 => true,
        }
    }

    /// Whether gradient accumulation keeps only each rank's optimizer piece of a sharded
    /// parameter's gradient.
    pub fn accumulation_sharded(&self) -> bool {
        self.level
            .accumulation_shard()
            .unwrap_or(self.gradient_accumulation_shard)
    }
}

impl Default for HsdpConfig {
    /// MindSpore's defaults: the whole replica group, 64 KB, level 1; ZeRO-1's accumulation
    /// sharded; no accumulation.
    fn default() -> HsdpConfig {
        HsdpConfig {
            shard_size: None,
            threshold_kb: 64,
            level: OptimizerLevel::Level1,
            gradient_accumulation_shard: true,
            accumulates: false,
        }
    }
}

/// Recompute (`[parallel.recompute]`, MindSpore's `cell.recompute()` and
/// `primitive.recompute()`): forward values the backward pass reads are not kept from the
/// forward pass but computed again just before their first backward use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecomputeConfig {
    /// Cell globs (`blocks.*`): every op of a matching cell is recomputed, except the cell's
    /// outputs (values read outside the cell), which are kept as the next cell's checkpoint.
    pub cells: Vec<String>,
    /// Op globs over node names (`blocks.*.attn.softmax`) or op kinds (`Softmax`): each
    /// output of a matching op is recomputed.
    pub ops: Vec<String>,
    /// Redo the communication that feeds recomputed ops (a model-parallel all-gather) rather
    /// than keeping its result from the forward pass (MindSpore's `mp_comm_recompute`).
    pub mp_comm_recompute: bool,
    /// Under `hsdp` levels 1–3, gather a weight again for its recomputed ops rather than sharing
    /// the backward pass's gather (MindSpore's `parallel_optimizer_comm_recompute`).
    pub parallel_optimizer_comm_recompute: bool,
}

impl Default for RecomputeConfig {
    /// Nothing recomputed; MindSpore's defaults for the two switches.
    fn default() -> RecomputeConfig {
        RecomputeConfig {
            cells: Vec::new(),
            ops: Vec::new(),
            mp_comm_recompute: true,
            parallel_optimizer_comm_recompute: false,
        }
    }
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
    /// MindSpore's `manual_split` of an embedding table (`[parallel.manual_split]`): for each key
    /// (an Embedding op, its cell or a glob over them), the rows of each block of the table's
    /// dim 0, in block order. Uneven blocks are allowed; they add up to the vocabulary.
    pub manual_split: BTreeMap<String, Vec<usize>>,
    /// Deterministic mode's most canonical blocks per summed dim (`parallel.deterministic_blocks`,
    /// a power of two): a split of a summed dim must divide the dim's block count.
    pub deterministic_blocks: usize,
    /// Deterministic mode (`train.deterministic`): a backward op whose sum runs over a split dim
    /// that is not the outermost summed dim takes its inputs with that dim whole (a gather is
    /// inserted), so every sum is one contiguous run of canonical blocks per rank.
    pub deterministic: bool,
    /// Optimizer parallelism (`[parallel.hsdp]`), when on.
    pub hsdp: Option<HsdpConfig>,
    /// `[parallel.pipeline]`: with more than one stage, every op runs on its stage's sub-mesh
    /// (its strategy applies within the stage's devices) and values cross stages by reshards.
    pub pipeline: Option<crate::pipeline::PipelineConfig>,
    /// `[parallel.recompute]`, when on.
    pub recompute: Option<RecomputeConfig>,
    /// `[parallel.comm_fusion]`, when given.
    pub comm_fusion: Option<crate::fusion::CommFusionConfig>,
    /// `[parallel.overlap]`.
    pub overlap: crate::fusion::OverlapConfig,
    /// Every pending sum of half-precision values (activations and gradients) is added in f32
    /// (MindSpore's `enable_fp32_communication`).
    pub enable_fp32_communication: bool,
    /// The gradients' sums of half-precision values are added in f32 (MindSpore's inverse of
    /// `disable_gradient_fp32_sync`).
    pub gradient_fp32_sync: bool,
    /// `parallel.comm_reuse`: identical communications (same plan) share one plan, at most
    /// this many of them (`None`: all, MindSpore's `-1`; `Some(0)`: none).
    pub comm_reuse: Option<usize>,
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
            manual_split: BTreeMap::new(),
            deterministic_blocks: 16,
            deterministic: false,
            hsdp: None,
            pipeline: None,
            recompute: None,
            comm_fusion: None,
            overlap: crate::fusion::OverlapConfig::default(),
            enable_fp32_communication: false,
            gradient_fp32_sync: true,
            comm_reuse: None,
        }
    }

    /// The dtype a step's gradients of `dtype` are summed over its micro-batches in (gradient
    /// accumulation, `parallel.micro_batch_interleave`, a pipeline's micro-batches): a half
    /// type (bf16, f16) is widened to f32 — each micro-batch's gradient added into an f32
    /// buffer — unless the gradients' sums over ranks are added in the half type
    /// (`gradient_fp32_sync = false` without `enable_fp32_communication`), when the sum stays
    /// in it, rounded after every addition. f32 and f64 stay themselves. The accumulation
    /// buffers and a pipeline's micro-batch sums are allocated in this type, and the memory
    /// prediction counts them in it.
    pub fn gradient_accumulation_dtype(&self, dtype: tensor::DType) -> tensor::DType {
        use tensor::DType;
        match dtype {
            half if half.is_half()
                && (self.gradient_fp32_sync || self.enable_fp32_communication) =>
            {
                DType::F32
            }
            other => other,
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
            OpStrategy::from_tuples(inputs.iter().map(|s| s.to_vec()).collect(), None),
        );
        self
    }

    /// Splits the table of Embedding op (or cell, or glob) `key` into blocks of `rows` rows
    /// (builder style; see [`ParallelConfig::manual_split`]).
    pub fn with_manual_split(mut self, key: &str, rows: &[usize]) -> ParallelConfig {
        self.manual_split.insert(key.to_string(), rows.to_vec());
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
            OpStrategy::from_tuples(
                inputs.iter().map(|s| s.to_vec()).collect(),
                Some(outputs.iter().map(|s| s.to_vec()).collect()),
            ),
        );
        self
    }

    /// Adds a user strategy given as layouts for op `op`: one per input, and one per output
    /// when `outputs` is set (builder style).
    pub fn shard_layouts(
        mut self,
        op: &str,
        inputs: Vec<Layout>,
        outputs: Option<Vec<Layout>>,
    ) -> ParallelConfig {
        self.strategies
            .insert(op.to_string(), OpStrategy::from_layouts(inputs, outputs));
        self
    }

    /// Turns recompute on with `recompute` (builder style).
    pub fn with_recompute(mut self, recompute: RecomputeConfig) -> ParallelConfig {
        self.recompute = Some(recompute);
        self
    }

    /// Turns optimizer parallelism on with `hsdp` (builder style).
    pub fn with_hsdp(mut self, hsdp: HsdpConfig) -> ParallelConfig {
        self.hsdp = Some(hsdp);
        self
    }

    /// The number of devices the program runs on (1 in stand-alone mode).
    pub fn effective_devices(&self) -> usize {
        match self.mode {
            ParallelMode::StandAlone => 1,
            _ => self.devices,
        }
    }

    /// Checks `[parallel.pipeline]` against the device count ([`PipelineConfig::validate`]
    /// with [`ParallelConfig::effective_devices`]): every stage needs at least one rank, so the
    /// stages must divide the devices. The one check of the rule, for every model: the parallel
    /// pass runs it before placing a graph, and the runtime before it builds a model, whose
    /// strategies divide each stage's devices ([`ParallelConfig::devices_per_stage`]).
    ///
    /// [`PipelineConfig::validate`]: crate::pipeline::PipelineConfig::validate
    pub fn validate_pipeline(&self) -> Result<(), crate::error::ParallelError> {
        match self.pipeline.as_ref().filter(|p| p.stages > 1) {
            None => Ok(()),
            Some(p) => p.validate(self.effective_devices()).map_err(|e| {
                crate::error::ParallelError::Setting {
                    setting: "pipeline",
                    reason: e.to_string(),
                }
            }),
        }
    }

    /// The devices of one pipeline stage ([`ParallelConfig::effective_devices`] without a
    /// pipeline); 0 when there are more stages than devices, which
    /// [`ParallelConfig::validate_pipeline`] refuses.
    pub fn devices_per_stage(&self) -> usize {
        let stages = self.pipeline.as_ref().map_or(1, |p| p.stages.max(1));
        self.effective_devices() / stages
    }
}
