//! Behaviour tests of the strategy searches and of the crate's entry, `plan`.

mod deterministic;
mod plan;
mod strategy_search;
