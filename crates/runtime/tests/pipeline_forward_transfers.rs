//! Activations that a later stage's backward pass reads but no forward pass does (deterministic
//! mode's whole input of a LayerNorm gradient under sequence parallelism) cross stages in the
//! forward passes. Sent in the sender's backward pass, interleaved chunks deadlocked: the
//! receiving chunk's backward runs before the sending chunk's.

use std::time::Duration;

use graph::NodeRole;
use parallel::pipeline::{step_phases, StepPhase};
use parallel::Step;
use runtime::{LaunchOptions, Session, TrainConfig};

use crate::run_util::{self, small_gpt, Run};

const STEPS: usize = 2;

/// A 2-stage × model parallel 2 pipeline with sequence parallelism, `scheduler_keys` in
/// `[parallel.pipeline]`, the cells cut as `stage_config` says.
fn piped(scheduler_keys: &str, stage_config: &str) -> String {
    format!(
        "devices = 4\nmode = \"semi_auto\"\nmodel_parallel = 2\nuse_seq_parallel = true\n\
         [parallel.pipeline]\nstages = 2\nmicro_batches = 2\n{scheduler_keys}\n\
         [parallel.pipeline.stage_config]\n{stage_config}\n"
    )
}

fn config(out: &std::path::Path, parallel: &str, extra: &[&str]) -> TrainConfig {
    let mut overrides = vec![
        "train.deterministic=true".to_string(),
        format!("train.max_steps={STEPS}"),
    ];
    overrides.extend(extra.iter().map(|s| s.to_string()));
    small_gpt(out, "adam", "", parallel, &overrides)
}

/// Trains on the local backend with a short collective timeout, so a deadlock fails the test
/// instead of hanging it.
fn train(config: &TrainConfig) -> (Session, Run) {
    let session = Session::new(config).expect("the session builds");
    let options = LaunchOptions {
        print_loss: false,
        timeout: Duration::from_secs(20),
        ..LaunchOptions::default()
    };
    let report = runtime::train_local(&session, &options)
        .unwrap_or_else(|e| panic!("training runs (no deadlock): {e}"));
    assert_eq!(report.losses().len(), STEPS);
    let losses = report.losses().to_vec();
    let params = run_util::merged_params(&config.output().dir, &run_util::param_names(&session));
    (session, (losses, params))
}

/// Every transfer between stages whose source a forward kernel wrote runs in the forward
/// passes; returns how many such transfers only a backward kernel reads.
fn forward_made_transfers_in_forward_passes(what: &str, session: &Session) -> usize {
    let program = &session.train;
    let graph = &program.placed.graph;
    let phases = step_phases(program, 2);
    let mut read_backward_only = 0;
    for (i, (step, phase)) in program.steps.iter().zip(&phases).enumerate() {
        let (Step::Reshard(r), StepPhase::Transfer { backward, .. }) = (step, phase) else {
            continue;
        };
        let writer = program.steps[..i].iter().rev().find_map(|s| match s {
            Step::Kernel(k) if k.outputs.contains(&r.from) => Some(k),
            _ => None,
        });
        let made_forward = writer
            .is_some_and(|k| !k.recompute && graph.nodes()[k.node.0].role == NodeRole::Forward);
        if made_forward {
            let name = &graph.values()[r.value.0].name;
            assert!(
                !backward,
                "{what}: activation {name} crosses stages in the backward passes"
            );
            let first_reader = program.steps[i + 1..].iter().find_map(|s| match s {
                Step::Kernel(k) if k.inputs.contains(&r.to) => Some(k),
                _ => None,
            });
            if first_reader.is_some_and(|k| graph.nodes()[k.node.0].role != NodeRole::Forward) {
                read_backward_only += 1;
            }
        }
    }
    read_backward_only
}

/// Interleaved chunks (`interleaved_1f1b`, and `gpipe` with `interleave`) with sequence
/// parallelism in deterministic mode, cut so that a stage boundary falls before a block's first
/// LayerNorm on both chunks: the runs finish and give one device's bits (the same
/// micro-batches as gradient accumulation); a plain 1F1B pipeline still does too.
#[test]
fn activations_read_by_a_later_stages_backward_cross_in_the_forward_passes() {
    let tmp = tempfile::tempdir().unwrap();
    let reference = train(&config(
        &tmp.path().join("sa"),
        "mode = \"stand_alone\"",
        &["data.batch_size=4", "train.grad_accumulation_steps=2"],
    ))
    .1;
    // Chunk index c·stages + s: cut 0 (stage 0) the embeddings, cut 1 (stage 1) block 0,
    // cut 2 (stage 0) block 1, cut 3 (stage 1) the head and the loss.
    let interleaved_cut = "\"embedding\" = 0\n\"blocks.0\" = 1\n\"blocks.1\" = 2\n\"ln_f\" = 3";
    let cases = [
        (
            "interleaved_1f1b",
            "scheduler = \"interleaved_1f1b\"\ninterleave = true\nvirtual_stages = 2",
            interleaved_cut,
        ),
        (
            "gpipe with interleave",
            "scheduler = \"gpipe\"\ninterleave = true\nvirtual_stages = 2",
            interleaved_cut,
        ),
        (
            "1f1b",
            "scheduler = \"1f1b\"",
            "\"embedding\" = 0\n\"blocks.1\" = 1",
        ),
    ];
    for (i, (what, keys, cut)) in cases.iter().enumerate() {
        let (session, run) = train(&config(
            &tmp.path().join(format!("pipe-{i}")),
            &piped(keys, cut),
            &[],
        ));
        assert!(
            forward_made_transfers_in_forward_passes(what, &session) > 0,
            "{what}: the cut moves an activation only a later stage's backward pass reads"
        );
        run_util::assert_bitwise_run(what, &run, &reference);
    }
}

/// More stages (times virtual stages) than the model has cells is refused before training,
/// naming the keys to change and what the count is of (cells, not `model.layers`).
#[test]
fn more_stages_than_cells_is_refused_naming_the_keys() {
    let tmp = tempfile::tempdir().unwrap();
    let parallel = "devices = 16\nmode = \"semi_auto\"\n[parallel.pipeline]\nstages = 16\n";
    let config = config(&tmp.path().join("too-many"), parallel, &[]);
    let error = match Session::new(&config) {
        Ok(_) => panic!("16 stages of a 2-block GPT are refused"),
        Err(e) => e.to_string(),
    };
    for needed in [
        "parallel.pipeline.stages",
        "virtual_stages",
        "= 16 model chunks",
        "cells",
    ] {
        assert!(error.contains(needed), "{needed:?} missing from: {error}");
    }
}
