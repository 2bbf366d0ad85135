//! The seeded random sweeps' generator, shared by the in-process sweeps
//! (`crates/runtime/tests/config_sweep.rs`, `resume_sweep.rs`) and the one across processes
//! (`crates/cli/tests/mpi_sweep.rs`): a small seeded generator, a configuration as dotted keys
//! with its TOML text, the draws the sweeps share, and the cases of the GPT sweep and of the
//! resume sweep with their one-device references. A test-support crate: nothing here runs a model.

#![deny(missing_docs)]

mod config;
mod draw;
mod gpt_case;
mod layout_draw;
mod model;
mod resume_case;
mod rng;

pub use config::Config;
pub use draw::{divisors, draw_fusion, draw_hsdp, draw_recompute, draw_schedule};
pub use gpt_case::{draw_gpt_case, GptCase, STEPS};
pub use layout_draw::MAX_DEVICES;
pub use resume_case::{draw_resume_case, ResumeCase, MAX_FIRST, MAX_SECOND};
pub use rng::Rng;
