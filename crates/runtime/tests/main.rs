//! Behaviour tests of the runtime.

mod batch_plan;
mod callbacks;
mod config;
mod equivalence;
mod gpt;
mod idx_data;
mod optimizer;
mod reproducibility;
mod text_data;
mod training;
