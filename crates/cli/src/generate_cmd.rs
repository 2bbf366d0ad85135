//! `tessera generate RUN_DIR --prompt TEXT --tokens N [--temperature T] [--seed S]`: samples a
//! continuation from a trained GPT (its checkpoint under any strategy, merged on the fly).

use std::path::PathBuf;

use clap::Args;
use runtime::{GenerateOptions, PathKind};

/// Arguments of `tessera generate`.
#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// The output directory of a GPT training run (`output.dir`): its checkpoint, strategy and
    /// `model.json`.
    pub run_dir: PathBuf,
    /// The text to continue (for a model trained on a token file: space-separated ids).
    #[arg(long)]
    pub prompt: String,
    /// How many tokens to sample.
    #[arg(long, default_value_t = 200, value_parser = crate::parse::count(0..=1_000_000))]
    pub tokens: usize,
    /// Softmax temperature (0: always the most likely token).
    #[arg(long, default_value_t = 0.8)]
    pub temperature: f64,
    /// Seed of the sampling (default 1). At `--temperature 0` nothing is drawn, so a seed
    /// given there changes nothing and is reported in a warning.
    #[arg(long)]
    pub seed: Option<u64>,
}

/// The seed when `--seed` is not given.
const DEFAULT_SEED: u64 = 1;

/// The largest `--tokens` accepted.
const MAX_TOKENS: usize = 1 << 20;

/// Runs `tessera generate`.
pub fn run(args: &GenerateArgs) -> anyhow::Result<()> {
    if args.tokens > MAX_TOKENS {
        anyhow::bail!(
            "--tokens {}: at most {MAX_TOKENS} tokens are sampled",
            args.tokens
        );
    }
    let expected = "a directory (the output.dir of a GPT training run: its checkpoint, \
                    strategy.json and model.json)";
    runtime::check_input_path(
        "run directory",
        &args.run_dir,
        PathKind::Directory,
        expected,
    )?;
    if !args.run_dir.join(runtime::MODEL_FILE).exists() {
        anyhow::bail!(
            "run directory {}: holds no {}; expected {expected}",
            args.run_dir.display(),
            runtime::MODEL_FILE
        );
    }
    match args.seed {
        Some(seed) if args.temperature == 0.0 => eprintln!(
            "warning: --seed {seed} has no effect at --temperature 0: every token is the most \
             likely one, nothing is drawn"
        ),
        _ => {}
    }
    let text = runtime::generate(
        &args.run_dir,
        &GenerateOptions {
            prompt: args.prompt.clone(),
            tokens: args.tokens,
            temperature: args.temperature,
            seed: args.seed.unwrap_or(DEFAULT_SEED),
        },
    )?;
    // Not `println!`, which panics when stdout cannot be written (a full disk, `> /dev/full`):
    // a failed write is an error, and a closed pipe is left for `main` to ignore.
    crate::stdout::write_stdout(&format!("{text}\n"))
}
