//! Behaviour tests of the runtime.

mod auto_parallel;
mod batch_plan;
mod callbacks;
mod clip;
mod cluster;
mod comm_fusion;
mod config;
mod config_caps;
mod config_effect;
mod config_sweep;
mod context_parallel;
mod custom_dataset;
mod dataset_columns;
mod gpt;
mod grad_accumulation;
mod hsdp;
/// The HYBRID_PARALLEL example, run by `cluster`'s tests.
#[allow(dead_code)]
#[path = "../../../examples/hybrid_mlp.rs"]
mod hybrid_mlp;
mod idx_data;
mod layout_config;
mod lr_schedule;
mod memory;
mod micro_batch_interleave;
mod moe;
mod optimizer_rules;
mod periodic_ckpt;
mod pipeline_forward_transfers;
mod pipeline_output;
mod pipeline_shared;
mod plan_memory;
mod precision;
mod reproducibility;
mod resume_sweep;
mod run_util;
mod search_bound;
mod searched_determinism;
mod stage_warnings;
mod sweep_util;
mod text_data;
mod trainable_params;
mod training;
