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

fn train(config: &TrainConfig) -> Run {
    run_util::train_run(config, 20).1
}

/// Context-parallel configurations as (name, devices, `[model]` extra, `[parallel]` keys).
const CASES: &[(&str, usize, &str, &str)] = &[
    ("ulysses cp 2", 2, "", "context_parallel = 2"),
    (
        "ulysses cp 4, fused attention",
        4,
        "fused_attention = true",
        "context_parallel = 4",
    ),
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
    (
        "ring cp 2",
        2,
        "fused_attention = true",
        "context_parallel = 2\ncontext_parallel_algo = \"ring\"",
    ),
    (
        "ring cp 4",
        4,
        "fused_attention = true",
        "context_parallel = 4\ncontext_parallel_algo = \"ring\"",
    ),
    (
        "ring dp 2 × cp 2 × mp 2, sequence parallel",
        8,
        "fused_attention = true",
        "data_parallel = 2\ncontext_parallel = 2\nmodel_parallel = 2\nuse_seq_parallel = true\ncontext_parallel_algo = \"ring\"",
    ),
    (
        "ring cp 8 × mp 2: 16 ranks over 8 heads",
        16,
        "fused_attention = true",
        "context_parallel = 8\nmodel_parallel = 2\ncontext_parallel_algo = \"ring\"",
    ),
];

/// Whether element `i` of parameter `name` is in the key bias: the small GPT's `qkv` bias is laid
/// out `[heads, 3, head_dim]` (`head_dim` 4), queries, keys, values.
fn is_key_bias(name: &str, i: usize) -> bool {
    const HEAD_DIM: usize = 32 / 8;
    name.ends_with("attn.qkv.bias") && (i / HEAD_DIM) % 3 == 1
}

/// The key bias's gradient is zero in exact arithmetic (it adds `q·b` to every score of a row,
/// which the softmax cancels), so what a run computes for it is rounding noise, which Adam
/// normalises into steps of any size up to the learning rate: two layouts' noise differs, so
/// their key biases are not compared element by element. Each run must keep it (initialised
/// to 0) within a tenth of one step of the learning rate (0.01), where a real gradient would
/// move it by about 0.01 a step.
fn assert_key_bias_stays_put(what: &str, (_, params): &Run) {
    for (name, values) in params {
        for (i, x) in values.iter().enumerate() {
            if is_key_bias(name, i) {
                assert!(x.abs() <= 1e-3, "{what}: key bias {name}[{i}] = {x} moved");
            }
        }
    }
}

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
            &run_util::semi(*devices, parallel),
            false,
        ));
        // Every step's loss within 1e-5 of one device's (measured: at most 2.2e-6); the
        // parameters after 20 Adam steps within 5e-5 · (1 + |x|) (measured: at most 3.6e-5,
        // Adam's normalisation magnifying the rounding of small gradients), but the key bias.
        run_util::assert_losses_within(name, &run.0, &reference.0, 1e-5);
        run_util::assert_same_run_except(name, &run, reference, 5e-5, is_key_bias);
        assert_key_bias_stays_put(name, &run);
        assert_key_bias_stays_put("one device", reference);
    }
}

/// Optimizer parallelism composes with context parallel: a weight's replicas on the `cp` ranks
/// (and the `dp` ones) are one replica group, so `[parallel.hsdp]` shards its optimizer state —
/// and at MindSpore's levels the weight itself — over all of them. Each rank keeps Adam's
/// moments for 1/(dp·cp) of every parameter, and the runs train one device's numbers.
#[test]
fn hsdp_shards_the_optimizer_over_the_context_parallel_ranks() {
    let tmp = tempfile::tempdir().unwrap();
    let fused = "fused_attention = true";
    let (_, _, reference) = run_util::train_report(&config(
        &tmp.path().join("sa"),
        "adam",
        fused,
        "mode = \"stand_alone\"",
        false,
    ));
    let cases = [
        ("ulysses cp 2, zero1", 2, 2, "context_parallel = 2", "zero1"),
        (
            "ring cp 2, level1",
            2,
            2,
            "context_parallel = 2\ncontext_parallel_algo = \"ring\"",
            "level1",
        ),
        (
            "ring dp 2 × cp 2, level2",
            4,
            4,
            "data_parallel = 2\ncontext_parallel = 2\ncontext_parallel_algo = \"ring\"",
            "level2",
        ),
    ];
    for (i, (name, devices, replicas, keys, level)) in cases.into_iter().enumerate() {
        let keys = format!("{keys}\n[parallel.hsdp]\noptimizer_level = \"{level}\"\nthreshold = 0");
        let out = tmp.path().join(format!("hsdp-{i}"));
        let cfg = config(&out, "adam", fused, &run_util::semi(devices, &keys), false);
        let (session, report, run) = run_util::train_report(&cfg);
        // Every replicated parameter is sharded over its replicas; the blocks' weights are
        // replicated over every dp and cp rank (the position table is split on cp instead).
        let mut optimizer_bytes = 0;
        for p in &session.train.params {
            // The layout its strategy gives it (at MindSpore's levels its buffer is the piece).
            let strategy = p.strategy_layout();
            let group = strategy.replica_count();
            let size = p.optimizer_shard().map(|s| s.size);
            assert_eq!(
                size,
                (group > 1).then_some(group),
                "{name}: {} is sharded over its {group} replicas",
                p.name
            );
            if p.name.starts_with("blocks.") {
                assert_eq!(
                    group, replicas,
                    "{name}: {} on every dp and cp rank",
                    p.name
                );
            }
            optimizer_bytes += 2 * 4 * strategy.slice_elements() / size.unwrap_or(1);
        }
        for (rank, r) in report.ranks.iter().enumerate() {
            assert_eq!(
                r.memory.optimizer, optimizer_bytes,
                "{name}, rank {rank}: Adam's two moments for its piece of every parameter"
            );
        }
        run_util::assert_same_run(name, &run, &reference, 2e-4);
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
        let run = train(&config(
            &out,
            "adam",
            "",
            &run_util::semi(*devices, parallel),
            true,
        ));
        run_util::assert_bitwise_run(name, &run, &reference);
    }
    // The ring in deterministic mode attends in one device's order (its operands gathered
    // whole): bitwise the fused attention's one-device run.
    let fused = "fused_attention = true";
    let reference = train(&config(
        &tmp.path().join("sa-fused"),
        "adam",
        fused,
        "mode = \"stand_alone\"",
        true,
    ));
    let ring = [
        ("ring cp 2", 2, "context_parallel = 2"),
        ("ring cp 4", 4, "context_parallel = 4"),
        (
            "ring dp 2 × cp 2 × mp 2, sequence parallel",
            8,
            "data_parallel = 2\ncontext_parallel = 2\nmodel_parallel = 2\nuse_seq_parallel = true",
        ),
    ];
    for (i, (name, devices, parallel)) in ring.iter().enumerate() {
        let keys = format!("{parallel}\ncontext_parallel_algo = \"ring\"");
        let out = tmp.path().join(format!("det-ring-{i}"));
        let run = train(&config(
            &out,
            "adam",
            fused,
            &run_util::semi(*devices, &keys),
            true,
        ));
        run_util::assert_bitwise_run(name, &run, &reference);
    }
}

/// Ulysses moves q, k and v from the sequence split to the head split, and the context back,
/// each by one all-to-all inside a `cp` group of ranks; the final hidden states move to the
/// batch split of the LM head the same way. The fused attention under Ulysses reads the QKV
/// projection's layout in place (`PackedAttention`): `qkv` itself moves to the head split, by
/// one all-to-all instead of three, and the context back; nothing is transposed.
#[test]
fn ulysses_moves_activations_by_all_to_all_in_cp_groups() {
    let tmp = tempfile::tempdir().unwrap();
    let keys = "data_parallel = 2\ncontext_parallel = 2\nmodel_parallel = 2";
    // (attention, the reshards it shows, those it must not, its op recording the attention
    // core's (dp, cp, mp) mesh, and that op's input splits.)
    type Case = (
        &'static str,
        &'static [&'static str],
        &'static [&'static str],
        &'static str,
        Vec<Vec<usize>>,
    );
    let cases: [Case; 2] = [
        (
            "fused_attention = false",
            &["q_t", "k_t", "v_t", "context_t"],
            &[],
            "blocks.0.attn.scores",
            vec![vec![2, 4, 1, 1], vec![2, 4, 1, 1]],
        ),
        (
            "fused_attention = true",
            &["split_heads", "flash"],
            &["q_t", "k_t", "v_t", "context_t"],
            "blocks.0.attn.flash",
            vec![vec![2, 1, 4, 1]],
        ),
    ];
    for (attention, moved, absent, op, splits) in cases {
        let session = Session::new(&config(
            tmp.path(),
            "adam",
            attention,
            &run_util::semi(8, keys),
            false,
        ))
        .unwrap();
        let plan = session.train.explain();
        for value in moved {
            let line = format!("reshard blocks.0.attn.{value}: all-to-all over 2 ranks");
            assert!(plan.contains(&line), "{attention}: no {line:?} in\n{plan}");
        }
        for value in absent {
            let name = format!("blocks.0.attn.{value}");
            assert!(!plan.contains(&name), "{attention}: {name} in\n{plan}");
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
        assert!(gathers.is_empty(), "{attention}: {gathers:#?}");
        let records = session.op_strategies();
        let record = records
            .iter()
            .find(|r| r.name == op)
            .unwrap_or_else(|| panic!("{attention}: no op {op}"));
        assert_eq!(record.inputs, splits, "{attention}");
    }
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
        let text = run_util::small_gpt_text(tmp.path(), "adam", "", &run_util::semi(devices, keys));
        let err = match TrainConfig::parse(&text, None, &[], Path::new("/")) {
            Err(e) => e.to_string(),
            Ok(config) => Session::new(&config).unwrap_err().to_string(),
        };
        assert!(err.contains(needle), "{keys}: {err}");
    }
}

/// At 12 tokens (batch 12): a ring of 3 (blocks of 4 rows, the zigzag placement of 6 chunks, where the
/// middle member holds two chunks of one owner) and a ring of 4 (blocks of 3 rows, too short to
/// halve: the contiguous placement) each train as one device does.
#[test]
fn ring_attention_balances_odd_rings_and_keeps_odd_blocks_whole() {
    let tmp = tempfile::tempdir().unwrap();
    let short = |out: &Path, parallel: &str| {
        run_util::small_gpt(
            out,
            "adam",
            "fused_attention = true",
            parallel,
            &[
                "model.seq_len=12".to_string(),
                "data.batch_size=12".to_string(),
            ],
        )
    };
    let reference = train(&short(&tmp.path().join("sa"), "mode = \"stand_alone\""));
    for (cp, placement) in [(3, "zigzag-balanced"), (4, "")] {
        let keys = format!("context_parallel = {cp}\ncontext_parallel_algo = \"ring\"");
        let config = short(
            &tmp.path().join(format!("cp{cp}")),
            &run_util::semi(cp, &keys),
        );
        let plan = Session::new(&config).unwrap().train.explain();
        let line = format!(
            "ring attention over {cp} ranks (1 ring{}",
            if placement.is_empty() {
                "):".to_string()
            } else {
                format!(", {placement}):")
            }
        );
        assert!(plan.contains(&line), "no {line:?} in\n{plan}");
        let run = train(&config);
        run_util::assert_same_run(
            &format!("ring cp {cp} at 12 tokens"),
            &run,
            &reference,
            2e-4,
        );
    }
}

/// The ring passes key/value blocks (and in the backward their gradients) around each `cp`
/// ring, in the zigzag placement under the causal mask: `--explain` lists each ring step with
/// its bytes (the passes and the moves to the placement), counted in the step's total; q, k
/// and v are not resharded before attention. In deterministic mode the passes gather the
/// operands whole, and explain says so with their bytes.
#[test]
fn ring_attention_passes_blocks_around_cp_rings() {
    let tmp = tempfile::tempdir().unwrap();
    let keys = "data_parallel = 2\ncontext_parallel = 2\nmodel_parallel = 2\ncontext_parallel_algo = \"ring\"";
    let session = Session::new(&config(
        tmp.path(),
        "adam",
        "fused_attention = true",
        &run_util::semi(8, keys),
        false,
    ))
    .unwrap();
    let plan = session.train.explain();
    // Local blocks of k and v: [B/dp = 4, heads/mp = 4, S/cp = 8, head_dim 4] f32 = 2 KiB each.
    let block = 4 * 4 * 8 * 4 * 4;
    // Causal, with blocks of 8 rows: the zigzag placement, chunks of 4 rows. Chunks 1 and 3
    // trade places (and come back): forward q, k, v, out (a half block each) and lse (a
    // quarter-row-width chunk: 4 × 4 slices × 4 rows × 4 B); backward q, k, v, dout, dq, dk,
    // dv and lse, delta.
    let (wide, narrow) = (block / 2, 4 * 4 * 4 * 4);
    let (zig_forward, zig_backward) = (2 * (4 * wide + narrow), 2 * (7 * wide + 2 * narrow));
    let forward = format!(
        "-> ring attention over 2 ranks (4 rings, zigzag-balanced): 1 pass of key/value blocks ({} B/step, {} B per rank in the passes, {zig_forward} B per ring to the zigzag placement and back)",
        8 * 2 * block + 4 * zig_forward,
        2 * block
    );
    assert!(plan.contains(&forward), "no {forward:?} in\n{plan}");
    let backward = format!(
        "-> ring attention over 2 ranks (4 rings, zigzag-balanced): 2 passes of key/value blocks and their gradients ({} B/step, {} B per rank in the passes, {zig_backward} B per ring to the zigzag placement and back)",
        8 * 6 * block + 4 * zig_backward,
        6 * block
    );
    assert!(plan.contains(&backward), "no {backward:?} in\n{plan}");
    // Working blocks (elements of a block W = K = 512, of one-wide rows N = 128): forward the
    // placed queries and output, keys, values, the state and lse (2W + 2K + 3N); backward
    // q, dout, dq, the keys, values and their gradients, lse, delta twice (3W + 4K + 3N).
    let (w, n) = (block / 4, 4 * 4 * 8);
    for (pass, elements) in [(&forward, 4 * w + 3 * n), (&backward, 7 * w + 3 * n)] {
        let line = format!(
            "{pass}\n       working blocks: up to {} B per rank while it runs",
            4 * elements
        );
        assert!(plan.contains(&line), "no {line:?} in\n{plan}");
    }
    for value in ["q_t", "k_t", "v_t"] {
        let moved = format!("reshard blocks.0.attn.{value}:");
        assert!(!plan.contains(&moved), "{moved} in\n{plan}");
    }
    // In deterministic mode the passes gather q, k, v (and backward dout, lse, delta) whole,
    // with no zigzag moves.
    let det = Session::new(&config(
        tmp.path(),
        "adam",
        "fused_attention = true",
        &run_util::semi(8, keys),
        true,
    ))
    .unwrap()
    .train
    .explain();
    let narrow = block / 4;
    for (what, per_rank) in [
        ("1 pass of key/value blocks", 2 * block),
        (
            "1 pass of query, key, value and output-gradient blocks",
            4 * block + 2 * narrow,
        ),
    ] {
        let line = format!(
            "-> ring attention over 2 ranks (4 rings, deterministic: operands gathered whole): {what} ({} B/step, {per_rank} B per rank in the passes)",
            8 * per_rank
        );
        assert!(det.contains(&line), "no {line:?} in\n{det}");
    }
    // Deterministic working blocks (the whole sequence S = 4 × 4 × 16 rows): forward the whole
    // keys and values and a staging block (2·S·4 + K); backward seven whole wide operands,
    // lse and delta whole, this rank's delta and the staging block.
    let (w, n, s) = (block / 4, 4 * 4 * 8, 4 * 4 * 16);
    for elements in [2 * s * 4 + w, 7 * s * 4 + 2 * s + n + w] {
        let line = format!(
            "working blocks: up to {} B per rank while it runs",
            4 * elements
        );
        assert!(det.contains(&line), "no {line:?} in\n{det}");
    }
    // The ring algo without the fused attention is refused.
    let err = Session::new(&config(
        tmp.path(),
        "adam",
        "fused_attention = false",
        &run_util::semi(8, keys),
        false,
    ))
    .unwrap_err()
    .to_string();
    assert!(err.contains("parallel.context_parallel_algo"), "{err}");
}

/// Activation memory falls as 1/N: a sequence 4× longer on 4 context-parallel ranks (ring or
/// Ulysses, fused attention) holds no more activations per rank than one device needs for the
/// short sequence today (unfused attention), and every rank's measured peaks equal the
/// prediction (the ring's working blocks counted on both sides, as communication).
#[test]
fn four_cp_ranks_fit_a_four_times_longer_sequence_in_one_ranks_activations() {
    let tmp = tempfile::tempdir().unwrap();
    let activations = |name: &str, model_extra: &str, parallel: &str, seq: usize| {
        let overrides = [
            format!("model.seq_len={seq}"),
            "train.max_steps=2".to_string(),
        ];
        let out = tmp.path().join(name);
        let config = run_util::small_gpt(&out, "adam", model_extra, parallel, &overrides);
        let (session, report, _) = run_util::train_report(&config);
        let measured = &report.ranks[0].memory_by_rank;
        assert_eq!(measured.len(), session.devices(), "{name}");
        for (rank, m) in measured.iter().enumerate() {
            let predicted = session.predict_memory(rank).expect("a schedule");
            assert_eq!(*m, predicted, "{name}: rank {rank}'s memory as predicted");
        }
        measured.iter().map(|m| m.peaks.activations).max().unwrap()
    };
    let today = activations("short", "", "mode = \"stand_alone\"", 16);
    let long_alone = activations("long", "", "mode = \"stand_alone\"", 64);
    for algo in ["ring", "ulysses"] {
        let keys = format!("context_parallel = 4\ncontext_parallel_algo = \"{algo}\"");
        let long_cp4 = activations(
            algo,
            "fused_attention = true",
            &run_util::semi(4, &keys),
            64,
        );
        assert!(
            long_cp4 <= today,
            "{algo}: {long_cp4} B of activations per rank at 64 tokens over cp 4, {today} B on one device at 16 tokens"
        );
        assert!(
            long_alone > 3 * long_cp4,
            "{algo}: {long_alone} vs {long_cp4}"
        );
    }
}

/// Ring attention under mixed precision (`bf16`, `f16`): the half operands are attended in
/// `f32` as one device's kernel attends them, so cp 2 and 4 train to within half precision's
/// rounding of one device (whose losses they match closely), and every rank's measured peaks
/// equal the prediction, which counts the ring's `f32` blocks and copies. It used to fail at
/// the first step ("ring attention's operands: expected f32 or f64").
#[test]
fn half_precision_ring_attention_trains_like_one_device() {
    let tmp = tempfile::tempdir().unwrap();
    let fused = "fused_attention = true";
    for precision in ["bf16", "f16"] {
        let run = |name: &str, parallel: &str| {
            let overrides = [
                format!("train.precision=\"{precision}\""),
                "train.max_steps=6".to_string(),
            ];
            let out = tmp.path().join(format!("{precision}-{name}"));
            let config = run_util::small_gpt(&out, "adam", fused, parallel, &overrides);
            let (session, report, (losses, _)) = run_util::train_report(&config);
            for (rank, m) in report.ranks[0].memory_by_rank.iter().enumerate() {
                let predicted = session.predict_memory(rank).expect("a schedule");
                assert_eq!(*m, predicted, "{precision} {name}: rank {rank}'s memory");
            }
            losses
        };
        let one = run("one device", "mode = \"stand_alone\"");
        for cp in [2, 4] {
            let keys = format!("context_parallel = {cp}\ncontext_parallel_algo = \"ring\"");
            let ring = run(&format!("ring cp {cp}"), &run_util::semi(cp, &keys));
            run_util::assert_losses_within(&format!("{precision} ring cp {cp}"), &ring, &one, 1e-3);
        }
    }
}

/// A checkpoint saved under ring context parallel 2 (dp 2, 4 devices) resumes under Ulysses
/// cp 4, under cp 1 (data parallel 2) and on one device: each continues one device's
/// uninterrupted run, so checkpoints convert between context-parallel degrees and algorithms.
#[test]
fn checkpoints_resume_under_other_context_parallel_degrees() {
    let tmp = tempfile::tempdir().unwrap();
    let fused = "fused_attention = true";
    let whole = train(&config(
        &tmp.path().join("whole"),
        "adam",
        fused,
        "mode = \"stand_alone\"",
        false,
    ));
    let first = tmp.path().join("first");
    let ring = "data_parallel = 2\ncontext_parallel = 2\ncontext_parallel_algo = \"ring\"";
    let half = ["train.max_steps=10".to_string()];
    let first_config = run_util::small_gpt(&first, "adam", fused, &run_util::semi(4, ring), &half);
    let first_losses = run_util::train_steps(&first_config, 10).1;
    let resume = [format!("output.resume_from=\"{}\"", first.display())];
    let seconds = [
        ("ulysses cp 4", run_util::semi(4, "context_parallel = 4")),
        ("dp 2", run_util::semi(2, "model_parallel = 1")),
        ("one device", "mode = \"stand_alone\"".to_string()),
    ];
    for (i, (what, parallel)) in seconds.iter().enumerate() {
        let out = tmp.path().join(format!("second-{i}"));
        let second = run_util::small_gpt(&out, "adam", fused, parallel, &resume);
        let (losses, params) = train_resumed(&second);
        let mut all = first_losses.clone();
        all.extend(losses);
        assert_eq!(all.len(), 20, "{what}: 10 steps, then the remaining 10");
        run_util::assert_same_run(what, &(all, params), &whole, 2e-4);
    }
}

/// Trains a resumed config to its end: the losses of the steps it ran, and its parameters.
fn train_resumed(config: &TrainConfig) -> Run {
    let (session, report, run) = run_util::train_report(config);
    drop(session);
    assert_eq!(report.ranks[0].global_step, 20);
    run
}

/// A device profile whose products are slow and links fast, so attention's compute over a
/// long sequence outweighs moving its blocks.
const SLOW_COMPUTE_PROFILE: &str = "name = \"slow-compute\"\nmemory_bandwidth = 1e10\n\
    memory_bytes = 1073741824\ndevices_per_node = 2\n[[matmul]]\nmin_flops = 0.0\n\
    flops_per_s = 1e10\n[intra_node]\nalpha = 1e-5\nbandwidth = 1e10\n\
    [inter_node]\nalpha = 1e-5\nbandwidth = 1e10\n";

/// The searched GPT of `heads` heads (width 16 per head) over 2 devices: one sequence of 128
/// tokens per step (`full_batch`, so the batch cannot split), fused attention.
fn searched_gpt(dir: &Path, heads: usize, mode: &str) -> TrainConfig {
    let profile = dir.join("slow.toml");
    std::fs::write(&profile, SLOW_COMPUTE_PROFILE).unwrap();
    let parallel = format!(
        "devices = 2\nmode = \"{mode}\"\ndataset_strategy = \"full_batch\"\n\
         device_profile = \"{}\"",
        profile.display()
    );
    let text = run_util::small_gpt_text(
        &dir.join(format!("out-{heads}-{mode}")),
        "adam",
        "fused_attention = true",
        &parallel,
    )
    .replace("heads = 8", &format!("heads = {heads}"))
    .replace("hidden = 32", &format!("hidden = {}", 16 * heads))
    .replace("seq_len = 16", "seq_len = 128")
    .replace("batch_size = 8", "batch_size = 1");
    TrainConfig::parse(&text, None, &[], Path::new("/")).expect("a valid test config")
}

/// The fused attention's strategy in a plan of the 2-block GPT.
fn attention_strategy(config: &TrainConfig) -> Vec<Vec<usize>> {
    let report = runtime::plan(config).expect("the search plans");
    let (_, strategy) = report
        .strategies
        .iter()
        .find(|(name, _)| name == "blocks.0.attn.flash")
        .expect("the plan has the fused attention")
        .clone();
    strategy
}

/// Ring attention is in the search's space, costed by the blocks it passes: where the heads
/// cannot split over the devices (3 heads on 2) and the sequence's compute dominates, the
/// search splits the fused attention's sequence (ring attention); where they can (4 heads), it
/// splits the heads, which moves fewer bytes. The searched ring plan trains as one device.
#[test]
fn the_search_chooses_ring_attention_where_heads_cannot_split() {
    let tmp = tempfile::tempdir().unwrap();
    let ring = searched_gpt(tmp.path(), 3, "dynamic_programming");
    let sequence_split = vec![vec![1, 1, 2, 1]; 3];
    assert_eq!(attention_strategy(&ring), sequence_split);
    // Split on the heads, the attention keeps the sequence whole, so the search takes the
    // packed attention's graph where that costs less: its one input, the QKV projection's
    // `[B, S, heads, 3·head_dim]`, split on the heads (FlashAttention's three `[B, heads, S,
    // head_dim]` would be `[1, 2, 1, 1]` each).
    let heads = searched_gpt(tmp.path(), 4, "dynamic_programming");
    assert_eq!(attention_strategy(&heads), vec![vec![1, 1, 2, 1]]);

    let (session, searched) = run_util::train_run(&ring, 20);
    assert!(
        session.runs_ring_attention(),
        "the searched plan runs ring attention"
    );
    let reference = run_util::train_run(&searched_gpt(tmp.path(), 3, "stand_alone"), 20).1;
    run_util::assert_same_run("searched ring attention", &searched, &reference, 2e-4);
}
