//! Behaviour tests of the parallel pass.

mod layouts;
mod op_rules;
mod rules;
