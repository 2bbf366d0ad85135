//! Tessera's built-in networks and their default strategies.
//!
//! - [`embedding_bag`]: a bag of embedded pixel features, the large-table model of
//!   parameter-server training ([`embedding_bag::embedding_bag`]);
//! - [`gpt`](mod@gpt): a decoder-only transformer, [`gpt::gpt`], with hierarchical op and parameter names;
//! - [`gpt_parallel`]: the op strategies its cells set from a MindFormers-style parallel config
//!   (`data_parallel`, `model_parallel`, `context_parallel`, `vocab_emb_dp`,
//!   `use_seq_parallel`), as MindFormers'
//!   GPT cells set theirs from `parallel_config`.
//! - [`moe`]: the GPT's mixture-of-experts blocks (`[model.moe]`), and [`moe_parallel`] their
//!   strategies, with the experts split over `parallel.expert_parallel`.
//!
//! The seed MLP stays in `graph::models` (its home before this crate existed), re-exported here.

#![deny(missing_docs)]

pub mod embedding_bag;
pub mod error;
pub mod gpt;
pub mod gpt_parallel;
pub mod moe;
pub mod moe_parallel;

pub use crate::error::ModelsError;
pub use crate::gpt::{gpt, GptConfig};
pub use crate::gpt_parallel::{ContextParallelAlgo, GptParallel, GptParallelKeys};
pub use crate::moe::MoeConfig;
pub use graph::models::{seed_mlp, Model};
