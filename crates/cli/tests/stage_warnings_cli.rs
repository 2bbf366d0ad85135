//! `tessera train` prints what only the compiled program shows: `parallel.hsdp.shard_size`
//! capped by the replicas a `[parallel.shard]` strategy gives a parameter (once, beside the
//! configuration's warnings), and a strategy using more devices than a pipeline stage has names
//! the stage's devices and the key.

use std::process::Output;

use crate::util::{assert_ok, tessera};

/// `tessera train examples/gpt_kjv.toml --explain` with `sets` (each a `--set`).
fn explain(sets: &[&str]) -> Output {
    let mut args = vec!["train", "examples/gpt_kjv.toml", "--explain"];
    for set in sets {
        args.extend(["--set", set]);
    }
    tessera(&args)
}

/// The `warning:` lines of `out` about `parallel.hsdp.shard_size`.
fn shard_size_warnings(out: &Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter(|l| l.starts_with("warning:") && l.contains("parallel.hsdp.shard_size"))
        .map(str::to_string)
        .collect()
}

#[test]
fn train_prints_a_cap_the_compiled_layout_makes_once() {
    let hsdp = ["parallel.hsdp.shard_size=4", "parallel.hsdp.threshold=0"];
    // data_parallel 4 × model_parallel 2: every weight has 4 or 8 replicas, which 4 divides.
    let plain = explain(&hsdp);
    assert_ok(&plain);
    assert_eq!(shard_size_warnings(&plain), Vec::<String>::new());
    // fc1's weight split 4 ways keeps 2 replicas: sharded over 2, and said once.
    let split = [
        hsdp[0],
        hsdp[1],
        r#"parallel.shard."blocks.*.mlp.fc1"=[[2,1,1],[4,1]]"#,
    ];
    let out = explain(&split);
    assert_ok(&out);
    let warned = shard_size_warnings(&out);
    assert_eq!(warned.len(), 1, "{warned:?}");
    assert!(
        warned[0].contains("parallel.hsdp.shard_size = 4 is capped to 2")
            && warned[0].contains("blocks.0.mlp.fc1.weight"),
        "{warned:?}"
    );
    // The plan agrees: fc1's weights are sharded over groups of 2 ranks.
    let plan = String::from_utf8_lossy(&out.stdout);
    assert!(plan.contains("over groups of 2 ranks"), "{plan}");
}

#[test]
fn a_strategy_wider_than_a_stage_names_the_stage() {
    let out = explain(&[
        "parallel.pipeline.stages=2",
        "parallel.data_parallel=2",
        r#"parallel.shard."blocks.*.mlp.fc1"=[[8,1,1],[1,1]]"#,
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("blocks.0.mlp.fc1.matmul")
            && err.contains(
                "the 4 devices of pipeline stage 0 (parallel.devices 8 / parallel.pipeline.stages 2)"
            )
            && err.contains(r#"parallel.shard."blocks.*.mlp.fc1""#),
        "{err}"
    );
}
