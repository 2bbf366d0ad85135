//! `tessera generate` on a tiny trained GPT: its output when stdout cannot be written.

use std::process::Stdio;

use crate::util::{assert_ok, s, tessera, tessera_command, Scratch};

/// Trains a one-layer GPT of hidden 16 for two steps on one device into `dir`.
fn train_tiny_gpt(dir: &std::path::Path) {
    let out_set = format!("output.dir={:?}", s(dir));
    let out = tessera(&[
        "train",
        "examples/gpt_kjv.toml",
        "--devices",
        "1",
        "--set",
        "parallel.data_parallel=1",
        "--set",
        "parallel.model_parallel=1",
        "--set",
        "model.layers=1",
        "--set",
        "model.heads=2",
        "--set",
        "model.hidden=16",
        "--set",
        "model.seq_len=16",
        "--set",
        "train.epochs=1",
        "--set",
        "data.steps_per_epoch=2",
        "--set",
        "data.eval_batches=1",
        "--set",
        "train.warmup_steps=1",
        "--set",
        &out_set,
    ]);
    assert_ok(&out);
}

/// The sample was printed with `println!`, which panics (exit code 101, a backtrace) when
/// stdout cannot be written; a full device is now an error naming stdout, exit code 1.
#[test]
fn generate_to_a_full_stdout_is_an_error_not_a_panic() {
    let scratch = Scratch::new("generate-full-stdout");
    let run = scratch.0.join("run");
    train_tiny_gpt(&run);
    let args = ["generate", s(&run), "--prompt", "And", "--tokens", "3"];
    let out = tessera(&args);
    assert_ok(&out);
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("And"));
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .expect("/dev/full");
    let out = tessera_command()
        .args(args)
        .current_dir(crate::util::repo_root())
        .stdout(Stdio::from(full))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.contains("cannot write the output to stdout"), "{err}");
}

/// At `--temperature 0` every token is the arg max and `--seed` changes nothing; a seed given
/// there was taken without a word. It is now reported in a warning (the sample is the same);
/// without `--seed`, or at a temperature above 0, there is none.
#[test]
fn a_seed_at_temperature_zero_is_reported() {
    let scratch = Scratch::new("generate-seed-at-zero");
    let run = scratch.0.join("run");
    train_tiny_gpt(&run);
    let sample = |extra: &[&str]| {
        let mut args = vec!["generate", s(&run), "--prompt", "And", "--tokens", "4"];
        args.extend_from_slice(extra);
        let out = tessera(&args);
        assert_ok(&out);
        (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (greedy, quiet) = sample(&["--temperature", "0"]);
    assert!(!quiet.contains("warning"), "{quiet}");
    let (seeded, warned) = sample(&["--temperature", "0", "--seed", "7"]);
    assert_eq!(seeded, greedy);
    assert!(
        warned.contains("warning: --seed 7 has no effect at --temperature 0"),
        "{warned}"
    );
    let (_, drawn) = sample(&["--temperature", "0.8", "--seed", "7"]);
    assert!(!drawn.contains("warning"), "{drawn}");
}

/// A checkpoint holding a NaN weight (a diverged run's, or a damaged file's) made `generate`
/// print garbage and exit 0: every logit was NaN and the sampler fell through to one. It is now
/// an error naming the tensor.
#[test]
fn a_checkpoint_with_a_nan_weight_is_refused() {
    let scratch = Scratch::new("generate-nan-weight");
    let run = scratch.0.join("run");
    train_tiny_gpt(&run);
    let file = run.join("rank_0").join("checkpoint_0.safetensors");
    let mut bytes = std::fs::read(&file).unwrap();
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + header_len]).unwrap();
    let name = "blocks.0.attn.proj.bias";
    let offsets = &header[name]["data_offsets"];
    let (start, end) = (
        8 + header_len + offsets[0].as_u64().unwrap() as usize,
        8 + header_len + offsets[1].as_u64().unwrap() as usize,
    );
    for value in bytes[start..end].chunks_exact_mut(4) {
        value.copy_from_slice(&f32::NAN.to_le_bytes());
    }
    std::fs::write(&file, bytes).unwrap();
    let out = tessera(&["generate", s(&run), "--prompt", "And", "--tokens", "3"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(name) && err.contains("non-finite"), "{err}");
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}
