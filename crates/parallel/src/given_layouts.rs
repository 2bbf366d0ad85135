//! Strategies given as layouts (MindSpore's `shard(in_strategy=(layout("dp", ("sp", "mp")), …))`):
//! checking them against the op and the devices, and binding them to the operands' shapes.
//!
//! A given layout is used as it is, on its own mesh with unit axes dropped (as the tuple path
//! normalises its device matrices); the op's output rule then checks that the inputs agree
//! (reduction dims split alike, softmax axes whole, …).

use layout::{Layout, TensorLayout};

use crate::error::ParallelError;
use crate::rules::strategy::{describe_devices, PipelineStage};
use crate::rules::OpContext;

/// Whether the operands are inputs or outputs (for messages).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Operands {
    /// The op's inputs (`in_strategy`).
    Inputs,
    /// The op's outputs (`out_strategy`).
    Outputs,
}

impl Operands {
    fn noun(self) -> &'static str {
        match self {
            Operands::Inputs => "input",
            Operands::Outputs => "output",
        }
    }

    fn strategy(self) -> &'static str {
        match self {
            Operands::Inputs => "in_strategy",
            Operands::Outputs => "out_strategy",
        }
    }
}

/// Why a layout's mesh cannot serve a run on `devices` devices (those of pipeline `stage`
/// when given), if it cannot.
pub(crate) fn mesh_mismatch(
    layout: &Layout,
    devices: usize,
    stage: Option<PipelineStage>,
) -> Option<String> {
    let mesh = layout.mesh();
    if mesh.is_interleaved() {
        return Some(format!(
            "the device matrix {:?} has an interleaved_parallel axis, which placement does not support",
            mesh.device_matrix()
        ));
    }
    (mesh.n_devices() != devices).then(|| {
        let runs_on = match stage {
            None => format!("the run has {devices}"),
            Some(_) => format!("the op runs on {}", describe_devices(devices, stage)),
        };
        format!(
            "the device matrix {:?} (aliases {:?}) holds {} devices, but {runs_on}: \
             its product must equal the device count",
            mesh.device_matrix(),
            mesh.alias_names(),
            mesh.n_devices()
        )
    })
}

/// Binds one given layout to `shape`, with unit mesh axes dropped; `what` names the operand.
pub(crate) fn bind_given(
    layout: &Layout,
    shape: &[usize],
    (devices, stage): (usize, Option<PipelineStage>),
    what: &str,
) -> Result<TensorLayout, String> {
    if let Some(reason) = mesh_mismatch(layout, devices, stage) {
        return Err(reason);
    }
    if layout.ndim() != shape.len() {
        return Err(format!(
            "the layout {} for {what} has {} dims, but its shape {shape:?} has {}",
            layout.describe_map(),
            layout.ndim(),
            shape.len()
        ));
    }
    layout
        .normalized()
        .bind(shape)
        .map_err(|e| format!("the layout {} for {what}: {e}", layout.describe_map()))
}

/// The operands' layouts when a strategy gives them: one per operand, each bound to its shape,
/// on `devices` devices (those of pipeline `stage` when given).
pub(crate) fn bind_op_layouts(
    ctx: &OpContext<'_>,
    layouts: &[Layout],
    operands: Operands,
    on: (usize, Option<PipelineStage>),
) -> Result<Vec<TensorLayout>, ParallelError> {
    let shapes = match operands {
        Operands::Inputs => &ctx.input_shapes,
        Operands::Outputs => &ctx.output_shapes,
    };
    let factors: Vec<Vec<usize>> = layouts.iter().map(Layout::split_factors).collect();
    if layouts.len() != shapes.len() {
        return Err(ctx.invalid(
            &factors,
            format!(
                "the {} has {} layouts but the op has {} {}s",
                operands.strategy(),
                layouts.len(),
                shapes.len(),
                operands.noun()
            ),
        ));
    }
    layouts
        .iter()
        .zip(shapes)
        .enumerate()
        .map(|(i, (layout, shape))| {
            let what = format!("{} {i}", operands.noun());
            bind_given(layout, shape, on, &what).map_err(|rule| ctx.invalid(&factors, rule))
        })
        .collect()
}
