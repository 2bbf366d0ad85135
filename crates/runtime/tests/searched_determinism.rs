//! The search modes in deterministic mode keep to its canonical blocks: with a
//! `parallel.deterministic_blocks` the unfiltered searches break (2 blocks on 4 devices: they
//! split a GPT's contraction or batch dims 4 ways), every search mode's plan builds, trains,
//! and gives one device's losses and parameters bit for bit; a split the searches keep fixed
//! (`[parallel.shard]`) and the blocks cannot serve is still refused naming
//! `parallel.deterministic_blocks`.

use runtime::{RuntimeError, Session};

use crate::run_util;

const STEPS: usize = 2;

/// The small GPT on `parallel`'s keys in deterministic mode with 2 canonical blocks, `STEPS`
/// steps.
fn config(out: &std::path::Path, parallel: &str) -> runtime::TrainConfig {
    let overrides = [
        "train.deterministic=true".to_string(),
        "parallel.deterministic_blocks=2".to_string(),
        format!("train.max_steps={STEPS}"),
    ];
    run_util::small_gpt(out, "momentum", "", parallel, &overrides)
}

/// Search mode `mode` on 4 devices with 2 canonical blocks: the session builds (before, each
/// mode chose a split of 4 its own refusal named) and trains one device's run bit for bit.
fn keeps_to_two_blocks_and_is_bitwise_one_device(mode: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let reference = run_util::train_run(
        &config(&tmp.path().join("sa"), "mode = \"stand_alone\""),
        STEPS,
    )
    .1;
    let parallel = format!("devices = 4\nmode = \"{mode}\"");
    let run_config = config(&tmp.path().join(mode), &parallel);
    if let Err(e) = Session::new(&run_config) {
        panic!("{mode}: the searched plan is refused: {e}");
    }
    let run = run_util::train_run(&run_config, STEPS).1;
    run_util::assert_bitwise_run(mode, &run, &reference);
}

#[test]
fn sharding_propagation_keeps_to_the_blocks() {
    keeps_to_two_blocks_and_is_bitwise_one_device("sharding_propagation");
}

#[test]
fn recursive_programming_keeps_to_the_blocks() {
    keeps_to_two_blocks_and_is_bitwise_one_device("recursive_programming");
}

#[test]
fn dynamic_programming_keeps_to_the_blocks() {
    keeps_to_two_blocks_and_is_bitwise_one_device("dynamic_programming");
}

/// A strategy the search keeps fixed (`[parallel.shard]`) that splits a summed dim 4 ways,
/// which 2 canonical blocks cannot serve: the session is refused naming
/// `parallel.deterministic_blocks` and the fixed strategy's op.
#[test]
fn a_fixed_split_the_blocks_cannot_serve_names_the_setting() {
    let tmp = tempfile::tempdir().unwrap();
    let parallel = "devices = 4\nmode = \"dynamic_programming\"\n\
                    [parallel.shard]\n\"blocks.0.attn.proj.matmul\" = [[1, 1, 4], [1, 4]]";
    match Session::new(&config(tmp.path(), parallel)) {
        Err(RuntimeError::Config { key, reason }) => {
            assert_eq!(key, "parallel.deterministic_blocks", "{reason}");
            assert!(reason.contains("blocks.0.attn.proj.matmul"), "{reason}");
            assert!(reason.contains("[parallel.shard]"), "{reason}");
        }
        Err(other) => panic!("another error: {other}"),
        Ok(_) => panic!("a split of 4 over 2 canonical blocks was accepted"),
    }
}
