//! Behaviour tests of the parallel pass.

mod op_rules;
mod rules;
