//! `tessera bench ps-embedding`: the embedding bag (digits, embedding size 16, global batch
//! 32, SGD) in parameter-server mode with its table held by the workers (dense: pulled and
//! pushed whole) and on the servers (`ps.embedding_on_server`: only the batch's rows) — worker
//! 0's pull and push bytes per step, its largest buffer of table rows, and steps/s.
//!
//! The roles run as threads of this process over real gRPC on 127.0.0.1; everything shares
//! this machine's cores.

use std::path::{Path, PathBuf};

use clap::Args;
use runtime::TrainConfig;

/// Arguments of `tessera bench ps-embedding`.
#[derive(Debug, Args)]
pub struct PsEmbeddingBenchArgs {
    /// Steps per run.
    #[arg(long, default_value_t = 100)]
    steps: u64,
    /// The digits directory.
    #[arg(long, default_value = "data/digits")]
    data: PathBuf,
    /// Servers.
    #[arg(long, default_value_t = 2)]
    servers: usize,
    /// Workers.
    #[arg(long, default_value_t = 2)]
    workers: usize,
}

/// The embedding-bag config, `[ps]` extras `extra`.
fn config_text(args: &PsEmbeddingBenchArgs, out: &Path, extra: &str) -> String {
    format!(
        "[model]\nname = \"embedding_bag\"\nhidden = 16\nclasses = 10\n\
         [data]\nformat = \"idx\"\ndir = \"{}\"\nbatch_size = 32\nshuffle = true\n\
         [parallel]\nmode = \"parameter_server\"\n\
         [ps]\nservers = {}\nworkers = {}\n{extra}\n\
         [train]\nepochs = 100\nmax_steps = {}\noptimizer = \"sgd\"\nlearning_rate = 0.05\n\
         seed = 3\neval = false\nper_print_times = 0\n\
         [output]\ndir = \"{}\"\n",
        args.data.display(),
        args.servers,
        args.workers,
        args.steps,
        out.display()
    )
}

/// Worker 0's report of one job.
fn run_job(args: &PsEmbeddingBenchArgs, text: &str) -> anyhow::Result<ps::WorkerReport> {
    let config = TrainConfig::parse(text, None, &[], Path::new("."))?;
    crate::bench_ps::run_threads(&config, args.servers, args.workers)
}

/// Runs `tessera bench ps-embedding`.
pub fn run(args: &PsEmbeddingBenchArgs) -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("tessera-bench-psemb-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    println!(
        "embedding bag (digits, table 17408 × 16 f32 = 1114112 B, global batch 32, SGD), sync, {} worker(s) × {} server(s), {} steps; worker 0's bytes per step (values only) and steps/s",
        args.workers, args.servers, args.steps
    );
    println!(
        "{:<24} {:>12} {:>12} {:>16} {:>9} {:>11}",
        "table", "pull B/step", "push B/step", "table rows held", "steps/s", "final loss"
    );
    let runs = [
        ("on the workers (dense)", String::new()),
        (
            "on the servers (sparse)",
            "embedding_on_server = [\"embedding.embedding_table\"]\nworker_max_param_bytes = 400000"
                .to_string(),
        ),
    ];
    for (name, extra) in runs {
        let text = config_text(
            args,
            &dir.join(name.split(' ').nth(2).unwrap_or("x")),
            &extra,
        );
        let r = run_job(args, &text)?;
        let steps = r.steps_run.max(1);
        println!(
            "{name:<24} {:>12} {:>12} {:>14} B {:>9.1} {:>11.4}",
            r.pull_bytes / steps,
            r.push_bytes / steps,
            r.largest_table_bytes,
            r.steps_run as f64 / r.step_seconds.max(1e-9),
            r.losses.last().copied().unwrap_or(f32::NAN)
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
