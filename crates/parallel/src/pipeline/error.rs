//! The one error type of the pipeline module.

use std::fmt;

/// Everything that can be wrong with a pipeline configuration, a stage assignment or a schedule.
///
/// Configuration messages name the key (`parallel.pipeline.stages`), the value given and the rule
/// broken; schedule messages name the stage and the action.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum PipelineError {
    /// `stages = 0`.
    #[error("parallel.pipeline.stages = {stages}: must be at least 1")]
    NoStages {
        /// The value given.
        stages: usize,
    },
    /// More stages than [`MAX_STAGES`](super::MAX_STAGES).
    #[error("parallel.pipeline.stages = {stages}: must be at most {max}")]
    TooManyStages {
        /// The value given.
        stages: usize,
        /// The bound.
        max: usize,
    },
    /// The stage count does not divide the device count.
    #[error(
        "parallel.pipeline.stages = {stages}: must divide the device count {devices} \
         (parallel.devices, or --devices): each stage gets devices / stages ranks, at least one"
    )]
    StagesDoNotDivideDevices {
        /// The value given.
        stages: usize,
        /// The device count.
        devices: usize,
    },
    /// `micro_batches = 0`.
    #[error("parallel.pipeline.micro_batches = {micro_batches}: must be at least 1")]
    NoMicroBatches {
        /// The value given.
        micro_batches: usize,
    },
    /// More micro-batches than [`MAX_MICRO_BATCHES`](super::MAX_MICRO_BATCHES).
    #[error("parallel.pipeline.micro_batches = {micro_batches}: must be at most {max}")]
    TooManyMicroBatches {
        /// The value given.
        micro_batches: usize,
        /// The bound.
        max: usize,
    },
    /// `virtual_stages` outside `2..=MAX_VIRTUAL_STAGES` while `interleave = true`.
    #[error(
        "parallel.pipeline.virtual_stages = {virtual_stages}: with interleave = true it must be \
         between 2 and {max} (model chunks per stage)"
    )]
    VirtualStagesOutOfRange {
        /// The value given.
        virtual_stages: usize,
        /// The upper bound.
        max: usize,
    },
    /// The scheduler string is not one of the four names.
    #[error(
        "parallel.pipeline.scheduler = {given:?}: unknown scheduler \
         (expected \"gpipe\", \"1f1b\", \"interleaved_1f1b\" or \"zero_bubble\")"
    )]
    UnknownScheduler {
        /// The string given.
        given: String,
    },
    /// `interleave = true` with a scheduler that runs one model chunk per stage.
    #[error(
        "parallel.pipeline.interleave = true: scheduler {scheduler:?} runs one model chunk per \
         stage; use \"interleaved_1f1b\" or \"gpipe\", or set interleave = false"
    )]
    InterleaveUnsupported {
        /// The scheduler's config name.
        scheduler: &'static str,
    },
    /// `scheduler = "interleaved_1f1b"` with `interleave = false`.
    #[error(
        "parallel.pipeline.scheduler = \"interleaved_1f1b\": needs interleave = true \
         (and virtual_stages ≥ 2)"
    )]
    InterleavedNeedsInterleave,
    /// Interleaved 1F1B with a micro-batch count that is not a multiple of the stage count.
    #[error(
        "parallel.pipeline.micro_batches = {micro_batches}: interleaved_1f1b needs a multiple of \
         parallel.pipeline.stages = {stages} (Megatron's rule: micro-batches run in groups of \
         one per stage)"
    )]
    MicroBatchesNotMultipleOfStages {
        /// The value given.
        micro_batches: usize,
        /// The stage count.
        stages: usize,
    },
    /// `stages × chunks × micro_batches` beyond [`MAX_TOTAL_PASSES`](super::MAX_TOTAL_PASSES).
    #[error(
        "parallel.pipeline: stages {stages} × model chunks {chunks} × micro_batches \
         {micro_batches} = {total} forward passes, more than the bound {max}"
    )]
    TooManyPasses {
        /// Stages.
        stages: usize,
        /// Model chunks per stage.
        chunks: usize,
        /// Micro-batches.
        micro_batches: usize,
        /// The product (saturated).
        total: usize,
        /// The bound.
        max: usize,
    },
    /// A `stage_config` entry names a stage (or model chunk) that does not exist.
    #[error(
        "parallel.pipeline.stage_config.{prefix:?} = {stage}: must be below {limit} \
         (stages × virtual stages)"
    )]
    StageConfigOutOfRange {
        /// The cell-name prefix.
        prefix: String,
        /// The stage given.
        stage: usize,
        /// The number of stages (times the virtual stages with interleave).
        limit: usize,
    },
    /// A `stage_config` prefix that is empty or given twice.
    #[error("parallel.pipeline.stage_config.{prefix:?}: {reason}")]
    StageConfigPrefix {
        /// The prefix.
        prefix: String,
        /// Empty, or duplicated.
        reason: &'static str,
    },
    /// Nothing to split into stages.
    #[error("pipeline stage assignment: the model has no layers")]
    NoLayers,
    /// Fewer layers than stages × chunks: some stage would be empty.
    #[error(
        "pipeline stage assignment: parallel.pipeline.stages × virtual_stages = {groups} model \
         chunks, but the model has only {layers} cells to place (the layers stage_config names, \
         e.g. blocks.3), and each chunk needs at least one; lower parallel.pipeline.stages or \
         virtual_stages"
    )]
    FewerLayersThanStages {
        /// Layers in the model.
        layers: usize,
        /// Stages × chunks.
        groups: usize,
    },
    /// Following `stage_config`, a cell comes after a cell of a later stage.
    #[error(
        "parallel.pipeline.stage_config: cell {cell:?} is assigned to stage {stage}, but it comes \
         after {previous:?} on stage {previous_stage}; stages must not decrease along the model"
    )]
    StageOrderDecreasing {
        /// The offending cell.
        cell: String,
        /// Its stage.
        stage: usize,
        /// The cell before it.
        previous: String,
        /// That cell's stage.
        previous_stage: usize,
    },
    /// Following `stage_config`, an op of a cell a key names runs on an earlier stage than an
    /// op whose output it reads (a cell called again after a later stage's cell).
    #[error(
        "parallel.pipeline.stage_config: op {node:?} of cell {cell:?} is given stage {stage}, \
         but it reads the output of op {input:?} on stage {input_stage} (a cell called again \
         after a later stage's cell); stages must not decrease along the model: give the cell \
         the later stage, or no key (its ops then run on the stage of what they read)"
    )]
    CellSplitBetweenStages {
        /// The op (node) that would run too early.
        node: String,
        /// Its cell (layer).
        cell: String,
        /// The stage its key gives it (model-chunk index with interleave).
        stage: usize,
        /// The op whose output it reads.
        input: String,
        /// That op's stage.
        input_stage: usize,
    },
    /// Following `stage_config`, a stage (or model chunk) gets no layer.
    #[error(
        "parallel.pipeline.stage_config: stage {stage} gets no layer; every stage needs at \
         least one ({})",
        match keys.as_slice() {
            [] => format!("no key names stage {stage}"),
            keys => format!(
                "the key(s) naming it, {}, match only layers that a longer key gives another stage",
                keys.iter().map(|k| format!("{k:?}")).collect::<Vec<_>>().join(", ")
            ),
        }
    )]
    EmptyStage {
        /// The empty stage (model-chunk index with interleave).
        stage: usize,
        /// The `stage_config` keys that name it.
        keys: Vec<String>,
    },
    /// A stage holding no trainable parameter before a stage that holds some. MindSpore refuses every
    /// stage without a trainable parameter; Tessera allows trailing ones (a last stage holding
    /// only the loss), but a strategy numbers its stages by the parameters they hold, so the
    /// checkpoint of a run with a gap could not be read back (resume, conversion, loading).
    #[error(
        "{}: stage {stage} holds no trainable parameter (its cells: {}) but stage {later} does; \
         every stage up to the last one with parameters needs one (MindSpore: \"each stage \
         must have at least one parameter that needs to be trained\"), or the run's checkpoint \
         could not be read back; {}",
        if *by_stage_config { "parallel.pipeline.stage_config" } else {
            "parallel.pipeline.stages (the cut by parameter counts)"
        },
        cells.join(", "),
        if *by_stage_config {
            "move a cell with parameters onto it, or use fewer stages"
        } else {
            "give parallel.pipeline.stage_config, or use fewer stages"
        }
    )]
    StageWithoutParameters {
        /// The stage without parameters.
        stage: usize,
        /// The last stage holding parameters.
        later: usize,
        /// The cells (layers) placed on it.
        cells: Vec<String>,
        /// Whether `stage_config` placed the cells (else the cut by parameter counts did).
        by_stage_config: bool,
    },
    /// A `stage_config` key that matches no layer: a typo would otherwise be ignored.
    #[error(
        "parallel.pipeline.stage_config.{prefix:?}: matches no layer of the model (a key is a \
         layer's name or a `.`-separated ancestor of it; the layers: {layers})"
    )]
    StageConfigMatchesNoLayer {
        /// The key.
        prefix: String,
        /// The model's layer names (the first few).
        layers: String,
    },
    /// A schedule or program with a list count other than its stage count.
    #[error("pipeline {what}: {given} per-stage lists for {stages} stages")]
    WrongStageCount {
        /// `schedule` or `program`.
        what: &'static str,
        /// Lists given.
        given: usize,
        /// Stages.
        stages: usize,
    },
    /// A program whose computations are not its schedule's list for that stage, in order.
    #[error("pipeline program: stage {stage}: its computations differ from the schedule's list")]
    ProgramDiffersFromSchedule {
        /// The stage.
        stage: usize,
    },
    /// A schedule's shape does not fit its action (stage, micro-batch or chunk out of range).
    #[error("pipeline schedule: stage {stage}: {action}: {reason}")]
    ActionOutOfRange {
        /// The stage.
        stage: usize,
        /// The action, formatted.
        action: String,
        /// What is out of range.
        reason: String,
    },
    /// An action that must occur exactly once on a stage occurs another number of times, or a
    /// micro-batch's backward is both full and split.
    #[error(
        "pipeline schedule: stage {stage}: {action} occurs {count} times, expected {expected}"
    )]
    ActionCount {
        /// The stage.
        stage: usize,
        /// The action, formatted.
        action: String,
        /// How often it occurs.
        count: usize,
        /// How often it must.
        expected: usize,
    },
    /// A send without exactly one matching receive, or the other way round, or a cross-stage
    /// input with no transfer.
    #[error("pipeline program: {event}: {reason}")]
    UnmatchedCommunication {
        /// The event, formatted with its stage.
        event: String,
        /// What is missing.
        reason: String,
    },
    /// A step that needs an input its stage has not computed or received by then.
    #[error("pipeline program: stage {stage}: {step} runs before its input {input} is available")]
    InputNotReady {
        /// The stage.
        stage: usize,
        /// The step, formatted.
        step: String,
        /// The missing input, formatted.
        input: String,
    },
    /// No stage can make progress.
    #[error("pipeline {mode} simulation deadlocks: {}", format_stuck(.stuck))]
    Deadlock {
        /// `dependency` or `blocking`.
        mode: &'static str,
        /// Every unfinished stage with its stuck step.
        stuck: Vec<StuckStage>,
    },
    /// A duration that is negative or not finite, or per-stage durations of the wrong length.
    #[error("pipeline simulation: {what} = {value}: {reason}")]
    InvalidDuration {
        /// Which duration.
        what: &'static str,
        /// The value (or length) given.
        value: f64,
        /// The rule.
        reason: &'static str,
    },
}

/// One stage that cannot progress in a deadlocked simulation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StuckStage {
    /// The stage.
    pub stage: usize,
    /// Its next step, formatted (`F(mb 3, chunk 0)` or `send activation to stage 1 …`).
    pub step: String,
    /// What it waits for, formatted.
    pub waiting_for: String,
}

impl fmt::Display for StuckStage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "stage {} stuck at {} waiting for {}",
            self.stage, self.step, self.waiting_for
        )
    }
}

fn format_stuck(stuck: &[StuckStage]) -> String {
    stuck
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}
