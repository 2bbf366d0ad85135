//! Context parallel (`parallel.context_parallel`): the GPT's sequence split over a `cp` mesh
//! axis trains as one device does, step for step, and bitwise in deterministic mode.

use std::path::Path;

use runtime::{Session, TrainConfig};

use crate::run_util::{self, Run};

/// The small GPT of `run_util::small_gpt` (2 blocks, 8 heads, width 32, 16 tokens, batch 8).
fn config(
    out: &Path,
    optimizer: &str,
    model_extra: &str,
    parallel: &str,
    det: bool,
) -> TrainConfig {
    let overrides = if det {
        vec!["train.deterministic=true".to_string()]
    } else {
        Vec::new()
    };
    run_util::small_gpt(out, optimizer, model_extra, parallel, &overrides)
}

fn semi(devices: usize, keys: &str) -> String {
    format!("devices = {devices}\nmode = \"semi_auto\"\n{keys}")
}

fn train(config: &TrainConfig) -> Run {
    run_util::train_run(config, 20).1
}

/// Context-parallel configurations as (name, devices, `[model]` extra, `[parallel]` keys).
const CASES: &[(&str, usize, &str, &str)] = &[
    ("ulysses cp 2", 2, "", "context_parallel = 2"),
    ("ulysses cp 4", 4, "", "context_parallel = 4"),
    (
        "dp 2 × cp 2 × mp 2",
        8,
        "",
        "data_parallel = 2\ncontext_parallel = 2\nmodel_parallel = 2",
    ),
    (
        "cp 2 × mp 2, sequence and vocabulary parallel, untied",
        4,
        "tie_embeddings = false",
        "context_parallel = 2\nmodel_parallel = 2\nuse_seq_parallel = true\nvocab_emb_dp = false",
    ),
    (
        "dp 2 × cp 4, dropout",
        8,
        "dropout = 0.1",
        "data_parallel = 2\ncontext_parallel = 4",
    ),
];

#[test]
fn context_parallel_trains_like_one_device() {
    let tmp = tempfile::tempdir().unwrap();
    let mut references = std::collections::BTreeMap::new();
    for (i, (name, devices, model_extra, parallel)) in CASES.iter().enumerate() {
        let reference = references.entry(*model_extra).or_insert_with(|| {
            let out = tmp.path().join(format!("sa-{i}"));
            train(&config(
                &out,
                "adam",
                model_extra,
                "mode = \"stand_alone\"",
                false,
            ))
        });
        let out = tmp.path().join(format!("case-{i}"));
        let run = train(&config(
            &out,
            "adam",
            model_extra,
            &semi(*devices, parallel),
            false,
        ));
        run_util::assert_same_run(name, &run, reference, 2e-4);
    }
}

/// Deterministic mode: context-parallel runs are bitwise one device's.
#[test]
fn deterministic_context_parallel_is_bitwise_one_device() {
    let tmp = tempfile::tempdir().unwrap();
    let reference = train(&config(
        &tmp.path().join("sa"),
        "adam",
        "",
        "mode = \"stand_alone\"",
        true,
    ));
    let cases = [
        ("cp 2", 2, "context_parallel = 2"),
        (
            "dp 2 × cp 2 × mp 2, sequence parallel",
            8,
            "data_parallel = 2\ncontext_parallel = 2\nmodel_parallel = 2\nuse_seq_parallel = true",
        ),
    ];
    for (i, (name, devices, parallel)) in cases.iter().enumerate() {
        let out = tmp.path().join(format!("det-{i}"));
        let run = train(&config(&out, "adam", "", &semi(*devices, parallel), true));
        run_util::assert_bitwise_run(name, &run, &reference);
    }
}

/// Ulysses moves q, k and v from the sequence split to the head split, and the context back,
/// each by one all-to-all inside a `cp` group of ranks; the final hidden states move to the
/// batch split of the LM head the same way.
#[test]
fn ulysses_moves_activations_by_all_to_all_in_cp_groups() {
    let tmp = tempfile::tempdir().unwrap();
    let keys = "data_parallel = 2\ncontext_parallel = 2\nmodel_parallel = 2";
    let session = Session::new(&config(tmp.path(), "adam", "", &semi(8, keys), false)).unwrap();
    let plan = session.train.explain();
    for value in ["q_t", "k_t", "v_t", "context_t"] {
        let line = format!("reshard blocks.0.attn.{value}: all-to-all over 2 ranks");
        assert!(plan.contains(&line), "no {line:?} in\n{plan}");
    }
    assert!(
        plan.contains("reshard ln_f.layer_norm: all-to-all over 2 ranks"),
        "{plan}"
    );
    // Nothing in the attention core is gathered whole.
    let gathers: Vec<&str> = plan
        .lines()
        .filter(|l| l.contains("attn.") && l.contains("all-gather"))
        .collect();
    assert!(gathers.is_empty(), "{gathers:#?}");
    // The strategy file records the (dp, cp, mp) mesh of the attention core.
    let records = session.op_strategies();
    let scores = records
        .iter()
        .find(|r| r.name == "blocks.0.attn.scores")
        .expect("the scores op");
    assert_eq!(scores.inputs, vec![vec![2, 4, 1, 1], vec![2, 4, 1, 1]]);
}

/// Bad context-parallel settings are refused naming the key and the rule.
#[test]
fn bad_context_parallel_settings_name_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    let bad = [
        // 3 does not divide the 16 positions.
        ("context_parallel = 3", 3, "model.seq_len"),
        // 8 heads cannot split over mp 4 × cp 4.
        (
            "context_parallel = 4\nmodel_parallel = 4",
            16,
            "model.heads",
        ),
        // The batch of 8 cannot split over dp 4 × cp 4 at the LM head.
        (
            "data_parallel = 4\ncontext_parallel = 4",
            16,
            "data.batch_size",
        ),
        ("context_parallel = 3", 4, "parallel.context_parallel"),
        ("context_parallel = 0", 2, "parallel.context_parallel"),
        (
            "context_parallel = 2\ncontext_parallel_algo = \"zigzag\"",
            2,
            "parallel.context_parallel_algo",
        ),
        (
            "data_parallel = 2\ncontext_parallel = 2",
            8,
            "parallel.data_parallel",
        ),
    ];
    for (keys, devices, needle) in bad {
        let text = run_util::small_gpt_text(tmp.path(), "adam", "", &semi(devices, keys));
        let err = match TrainConfig::parse(&text, None, &[], Path::new("/")) {
            Err(e) => e.to_string(),
            Ok(config) => Session::new(&config).unwrap_err().to_string(),
        };
        assert!(err.contains(needle), "{keys}: {err}");
    }
}
