//! Behaviour tests of the parallel pass.

mod layouts;
mod op_rules;
mod pipeline_schedule;
mod rules;
