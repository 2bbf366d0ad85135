//! Hostile training data and `tessera generate` inputs under an address-space limit (`ulimit
//! -v`, as a batch system sets one): texts, gzip bombs and model descriptions too large for the
//! memory are errors naming the file, never an allocation abort (SIGABRT).

use std::path::Path;
use std::process::{Command, Output};

use crate::util::{repo_root, s, Scratch};

/// The address-space limit of these runs, in KiB (3 GB).
const LIMIT_KIB: u64 = 3_000_000;

/// Runs `tessera ARGS` under `ulimit -v LIMIT_KIB`.
fn under_limit(args: &str) -> Output {
    let script = format!(
        "ulimit -v {LIMIT_KIB} && exec {} {args}",
        env!("CARGO_BIN_EXE_tessera")
    );
    Command::new("sh")
        .args(["-c", &script])
        .current_dir(repo_root())
        .output()
        .expect("running sh")
}

/// The command failed with exit code 1 (an error, not a signal) and its error says `wants`.
#[track_caller]
fn assert_error(out: &Output, wants: &[&str]) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "expected an error (exit 1), got {}:\n{stderr}",
        out.status
    );
    for want in wants {
        assert!(stderr.contains(want), "missing {want:?} in:\n{stderr}");
    }
    assert!(!stderr.contains("memory allocation of"), "{stderr}");
}

/// A GPT config reading the text `data` into `out`.
fn text_config(dir: &Path, data: &Path) -> String {
    let config = dir.join("gpt.toml");
    std::fs::write(
        &config,
        format!(
            "[model]\nname = \"gpt\"\nlayers = 1\nheads = 2\nhidden = 16\nseq_len = 8\n\
             [data]\nformat = \"text\"\npath = \"{}\"\ntokenizer = \"byte\"\nval_fraction = 0.1\n\
             batch_size = 2\nsteps_per_epoch = 1\neval_batches = 1\n\
             [train]\nepochs = 1\noptimizer = \"adam\"\nlearning_rate = 0.01\n\
             [output]\ndir = \"{}\"\n",
            s(data),
            s(&dir.join("out"))
        ),
    )
    .unwrap();
    s(&config).to_string()
}

/// 1 GiB of text (a sparse file of NUL bytes, valid UTF-8) under a 3 GB limit: its 4 GiB of
/// tokens used to abort the run on allocation once the text was read.
#[test]
fn a_text_too_large_for_the_memory_is_an_error_before_it_is_read() {
    let scratch = Scratch::new("data-big-text");
    let data = scratch.0.join("big.txt");
    std::fs::File::create(&data)
        .unwrap()
        .set_len(1 << 30)
        .unwrap();
    let out = under_limit(&format!("train {}", text_config(&scratch.0, &data)));
    assert_error(
        &out,
        &[s(&data), "the text and its tokens would take", "available"],
    );
}

/// A gzip bomb: 1 GiB of zeros in 1 MiB of gzip, under a 3 GB limit. Decompressing it whole
/// then tokenising it aborted the run on allocation (or, for larger bombs, reported "not a
/// valid gzip stream (out of memory)"); it now stops as soon as the text passes what its tokens
/// could take.
#[test]
fn a_gzip_bomb_stops_with_an_error_naming_the_file() {
    let scratch = Scratch::new("data-gzip-bomb");
    let data = scratch.0.join("bomb.txt.gz");
    let made = Command::new("sh")
        .args([
            "-c",
            &format!("head -c 1073741824 /dev/zero | gzip -1 > {}", s(&data)),
        ])
        .status()
        .expect("running gzip");
    assert!(made.success(), "gzip is needed to build the bomb");
    let out = under_limit(&format!("train {}", text_config(&scratch.0, &data)));
    assert_error(
        &out,
        &[s(&data), "decompressed, the text passes", "available"],
    );
}

/// A `model.json` within every per-size bound describing 2^30 parameters (vocabulary 2^24 ×
/// hidden 64): `tessera generate` aborted building it ("memory allocation of 4294967296 bytes
/// failed"); it is refused first, naming the file.
#[test]
fn generate_refuses_a_model_larger_than_the_memory() {
    let scratch = Scratch::new("data-generate-huge");
    std::fs::write(
        scratch.0.join("model.json"),
        r#"{"model": "gpt", "vocab_size": 16777216, "layers": 1, "heads": 2, "hidden": 64,
            "seq_len": 8, "ffn_hidden": 64, "tie_embeddings": true, "moe": null,
            "tokenizer": "ids", "alphabet": null}"#,
    )
    .unwrap();
    let out = under_limit(&format!(
        "generate {} --prompt '1 2 3' --tokens 1",
        s(&scratch.0)
    ));
    assert_error(
        &out,
        &[
            "model.json",
            "sampling from this model needs at least",
            "available",
        ],
    );
}
