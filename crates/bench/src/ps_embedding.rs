//! `tessera bench ps-embedding`: the embedding bag (digits, embedding size 16, global batch
//! 32, SGD) in parameter-server mode with its table held by the workers (dense: pulled and
//! pushed whole) and on the servers (`ps.embedding_on_server`: only the batch's rows) — worker
//! 0's pull and push bytes per step, its largest buffer of table rows, and steps/s.
//!
//! The roles run as threads of this process over real gRPC on 127.0.0.1; everything shares
//! this machine's cores.

use std::fmt;
use std::path::{Path, PathBuf};

use runtime::TrainConfig;

use crate::error::toml_path;
use crate::{BenchError, Progress};

/// What to measure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PsEmbeddingRequest {
    /// Steps per run.
    pub steps: u64,
    /// The digits directory.
    pub data: PathBuf,
    /// Servers.
    pub servers: usize,
    /// Workers.
    pub workers: usize,
}

/// The embedding-bag config, `[ps]` extras `extra`.
fn config_text(
    request: &PsEmbeddingRequest,
    out: &Path,
    extra: &str,
) -> Result<String, BenchError> {
    Ok(format!(
        "[model]\nname = \"embedding_bag\"\nhidden = 16\nclasses = 10\n\
         [data]\nformat = \"idx\"\ndir = {}\nbatch_size = 32\nshuffle = true\n\
         [parallel]\nmode = \"parameter_server\"\n\
         [ps]\nservers = {}\nworkers = {}\n{extra}\n\
         [train]\nepochs = 100\nmax_steps = {}\noptimizer = \"sgd\"\nlearning_rate = 0.05\n\
         seed = 3\neval = false\nper_print_times = 0\n\
         [output]\ndir = {}\n",
        toml_path("--data", &request.data)?,
        request.servers,
        request.workers,
        request.steps,
        toml_path("output.dir", out)?
    ))
}

/// The report's header: what ran, and the columns.
struct Header<'a>(&'a PsEmbeddingRequest);

impl fmt::Display for Header<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "embedding bag (digits, table 17408 × 16 f32 = 1114112 B, global batch 32, SGD), sync, {} worker(s) × {} server(s), {} steps; worker 0's bytes per step (values only) and steps/s",
            self.0.workers, self.0.servers, self.0.steps
        )?;
        writeln!(
            f,
            "{:<24} {:>12} {:>12} {:>16} {:>9} {:>11}",
            "table", "pull B/step", "push B/step", "table rows held", "steps/s", "final loss"
        )
    }
}

/// One placement of the table: worker 0's figures.
#[derive(Debug, Clone, PartialEq)]
pub struct PsEmbeddingRow {
    /// Where the table is (`on the servers (sparse)`).
    pub table: &'static str,
    /// Bytes pulled per step.
    pub pull_bytes_per_step: u64,
    /// Bytes pushed per step.
    pub push_bytes_per_step: u64,
    /// The largest buffer of table rows held, bytes.
    pub table_bytes_held: u64,
    /// Steps per second.
    pub steps_per_s: f64,
    /// The last loss (NaN: none).
    pub final_loss: f32,
}

impl fmt::Display for PsEmbeddingRow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{:<24} {:>12} {:>12} {:>14} B {:>9.1} {:>11.4}",
            self.table,
            self.pull_bytes_per_step,
            self.push_bytes_per_step,
            self.table_bytes_held,
            self.steps_per_s,
            self.final_loss
        )
    }
}

/// Both placements' figures.
#[derive(Debug, Clone, PartialEq)]
pub struct PsEmbeddingReport {
    /// What ran.
    pub request: PsEmbeddingRequest,
    /// The table on the workers, then on the servers.
    pub rows: Vec<PsEmbeddingRow>,
}

impl fmt::Display for PsEmbeddingReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        Header(&self.request).fmt(f)?;
        self.rows.iter().try_for_each(|row| row.fmt(f))
    }
}

/// Runs `tessera bench ps-embedding` in a fresh directory under the system temp dir, removed
/// at the end.
pub fn ps_embedding(
    request: &PsEmbeddingRequest,
    progress: &mut dyn Progress,
) -> Result<PsEmbeddingReport, BenchError> {
    let dir = std::env::temp_dir().join(format!("tessera-bench-psemb-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let rows = runs(request, &dir, progress);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(PsEmbeddingReport {
        request: request.clone(),
        rows: rows?,
    })
}

/// The two runs, in `dir`: each row shown as it is measured.
fn runs(
    request: &PsEmbeddingRequest,
    dir: &Path,
    progress: &mut dyn Progress,
) -> Result<Vec<PsEmbeddingRow>, BenchError> {
    progress.piece(&Header(request));
    let runs = [
        ("on the workers (dense)", String::new()),
        (
            "on the servers (sparse)",
            "embedding_on_server = [\"embedding.embedding_table\"]\nworker_max_param_bytes = 400000"
                .to_string(),
        ),
    ];
    let mut rows = Vec::new();
    for (name, extra) in runs {
        crate::go_on(progress)?;
        let text = config_text(
            request,
            &dir.join(name.split(' ').nth(2).unwrap_or("x")),
            &extra,
        )?;
        let config = TrainConfig::parse(&text, None, &[], Path::new("."))?;
        let r = crate::ps::run_threads(&config, request.servers, request.workers)?;
        let steps = r.steps_run.max(1);
        let row = PsEmbeddingRow {
            table: name,
            pull_bytes_per_step: r.pull_bytes / steps,
            push_bytes_per_step: r.push_bytes / steps,
            table_bytes_held: r.largest_table_bytes,
            steps_per_s: r.steps_run as f64 / r.step_seconds.max(1e-9),
            final_loss: r.losses.last().copied().unwrap_or(f32::NAN),
        };
        progress.piece(&row);
        rows.push(row);
    }
    Ok(rows)
}
