//! Behaviour tests of the parallel pass.

mod grad_scale;
mod layouts;
mod op_rules;
mod pipeline_cells;
mod pipeline_schedule;
mod rules;
