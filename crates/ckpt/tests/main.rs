//! Integration tests of the checkpoint crate, in one binary.

mod attacks;
mod conformance;
mod detect;
mod differences;
mod file_lists;
mod fuzz;
mod hostile_strategy;
mod layouts;
mod op_strategy;
mod options;
mod pipeline;
mod plan;
mod redundancy;
mod roundtrip;
mod sets;
mod stop;
mod strategy_records;
mod util;
