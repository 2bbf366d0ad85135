//! `tessera train --timeline FILE.svg`: the pipeline schedule drawn as stages × time, one block
//! per forward, backward and weight-gradient pass of each micro-batch, so the bubble shows as
//! white space. The times are the schedule simulator's (`parallel::pipeline::simulate`), with a
//! backward twice a forward (zero bubble: its two halves one forward each).

use std::path::Path;

use anyhow::Context;
use parallel::pipeline::{
    simulate, ActionKind, Durations, PipelineConfig, ProgramStep, Schedule, Scheduler,
};
use plotters::prelude::*;

/// Width of the drawing, in pixels; its height grows with the stages.
const WIDTH: u32 = 1000;

/// Draws `config`'s schedule into `path` (SVG); returns the predicted bubble fraction. The
/// drawing is made in memory and written whole ([`crate::train_cmd::write_output_file`]): a
/// write that fails (a full disk) leaves no empty or half-written file.
pub fn draw(config: &PipelineConfig, path: &Path) -> anyhow::Result<f64> {
    let schedule = Schedule::generate(config)?;
    let durations = match config.scheduler {
        Scheduler::ZeroBubble => Durations::uniform(1.0, 1.0, 1.0),
        _ => Durations::uniform(1.0, 2.0, 0.0),
    };
    let report = simulate(&schedule, &durations)?;
    let stages = config.stages;
    let height = 90 + 40 * stages as u32;
    let mut svg = String::new();
    let root = SVGBackend::with_string(&mut svg, (WIDTH, height)).into_drawing_area();
    let drawn = (|| -> Result<(), Box<dyn std::error::Error>> {
        root.fill(&WHITE)?;
        let title = format!(
            "{} stages, {} micro-batches, {}: predicted bubble {:.1} %",
            stages,
            config.micro_batches,
            config.scheduler.name(),
            report.bubble_fraction * 100.0
        );
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..report.makespan.max(1e-9), 0f64..stages as f64)?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(stages)
            .y_label_formatter(&|y| format!("stage {}", stages - 1 - (*y as usize).min(stages - 1)))
            .x_desc("time (one forward = 1)")
            .draw()?;
        for (stage, steps) in report.timeline.iter().enumerate() {
            // Stage 0 at the top.
            let row = (stages - 1 - stage) as f64;
            for timed in steps {
                let ProgramStep::Compute(action) = &timed.step else {
                    continue;
                };
                let (color, letter) = match action.kind {
                    ActionKind::Forward => (RGBColor(91, 155, 213), "F"),
                    ActionKind::Backward | ActionKind::BackwardInput => {
                        (RGBColor(237, 125, 49), "B")
                    }
                    ActionKind::BackwardWeight => (RGBColor(112, 173, 71), "W"),
                };
                let (x0, x1) = (timed.start, timed.end);
                chart.draw_series(std::iter::once(Rectangle::new(
                    [(x0, row + 0.1), (x1, row + 0.9)],
                    color.filled(),
                )))?;
                chart.draw_series(std::iter::once(Rectangle::new(
                    [(x0, row + 0.1), (x1, row + 0.9)],
                    BLACK.stroke_width(1),
                )))?;
                chart.draw_series(std::iter::once(Text::new(
                    format!("{letter}{}", action.micro_batch),
                    ((x0 + x1) / 2.0, row + 0.5),
                    ("sans-serif", 11).into_font().color(&BLACK),
                )))?;
            }
        }
        root.present()?;
        Ok(())
    })();
    drawn
        .map_err(|e| anyhow::anyhow!("{e}"))
        .with_context(|| format!("--timeline: cannot draw {}", path.display()))?;
    drop(root);
    crate::train_cmd::write_output_file(path, svg.as_bytes())
        .with_context(|| format!("--timeline: cannot write {}", path.display()))?;
    Ok(report.bubble_fraction)
}
