//! `tessera train`: train a model from a TOML configuration.

use std::path::PathBuf;
use std::time::Instant;

use clap::{Args, ValueEnum};
use runtime::{LaunchOptions, LossMonitor, TrainConfig, TrainSession, Training};

use crate::stdout::{self, out, outln, write_stdout, StdoutLines};

/// Which communicator backend runs the ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    /// One thread per rank in this process.
    Local,
    /// One process per rank, started by `mpirun` (needs a build with `--features mpi`).
    Mpi,
}

/// Arguments of `tessera train`.
#[derive(Debug, Args)]
pub struct TrainArgs {
    /// The training configuration (TOML; see docs/CONFIG.md).
    config: PathBuf,
    /// Override `parallel.devices`.
    #[arg(long)]
    devices: Option<usize>,
    /// Override one key, `section.key=value` (the value is read as TOML, or as a string when it
    /// is not valid TOML); repeatable.
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    sets: Vec<String>,
    /// Write one JSON object per step and per epoch to FILE (default: `<output.dir>/metrics.jsonl`).
    #[arg(long)]
    log_json: Option<PathBuf>,
    /// Print every op's strategy and every inserted communication with its reason and bytes per
    /// step, then exit without training.
    #[arg(long)]
    explain: bool,
    /// With --explain: print JSON instead, one object per rank: the run's figures and the
    /// rank's predicted memory (`{"rank": r, "memory": {"rank": r, "parameters": B, …}, …}`).
    #[arg(long, requires = "explain")]
    json: bool,
    /// With --explain: also print the program as this rank runs it (local shapes, the peers of
    /// every reshard and the bytes exchanged with each).
    #[arg(long, value_name = "RANK")]
    explain_rank: Option<usize>,
    /// Write every rank's timeline of the pipelined steps, or of ring attention's passes
    /// (compute and waiting spans), to FILE in Chrome trace-event format (Perfetto,
    /// chrome://tracing). Under MPI each process writes its rank's, `FILE` with `.rank<r>`
    /// before the extension.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// Draw the pipeline schedule (stages × time; forward, backward and weight-gradient blocks
    /// per micro-batch; bubbles as white space) into FILE as SVG, then go on (with --explain,
    /// exit).
    #[arg(long, value_name = "FILE.svg")]
    timeline: Option<PathBuf>,
    /// Where the ranks run (default: `TESSERA_BACKEND` when set, as `tessera rank-env` sets it
    /// for the ranks of an `mpirun` job; else `local`).
    #[arg(long, value_enum, default_value = "local", env = "TESSERA_BACKEND")]
    backend: Backend,
    /// Longest wait for a peer in any collective, in seconds (1 to 604800, a week: 0 would
    /// time out every collective at once). On the local backend, ranks still running this long
    /// after another rank failed are hung (a thread cannot be stopped): the first failure is
    /// printed and the process exits 1.
    #[arg(long, default_value_t = 300, value_parser = crate::parse::count_u64(1..=604_800))]
    timeout: u64,
    /// With --backend mpi: OpenMPI's blocking collectives under a watchdog that ends the job
    /// when one overruns --timeout, instead of polled ones that return an error on every rank.
    #[arg(long)]
    mpi_watchdog: bool,
}

/// Runs `tessera train`.
pub fn run(args: &TrainArgs) -> anyhow::Result<()> {
    check_config_file(&args.config)?;
    let config = TrainConfig::load_on(&args.config, &args.sets, args.devices)?;
    for warning in config.warnings().into_iter().chain(config.train_warnings()) {
        eprintln!("warning: {warning}");
    }
    if args.mpi_watchdog && args.backend != Backend::Mpi {
        anyhow::bail!("--mpi-watchdog applies to --backend mpi only");
    }
    // Checked here to name the flag (the run checks the log again, as "metrics log"); under
    // MPI only rank 0 writes it.
    if let Some(path) = &args.log_json {
        if config.ps().is_some() {
            // Worker 0 creates the log's missing directories (`MetricsLog::create`).
            runtime::check_output_path(
                "--log-json",
                path,
                runtime::PathKind::File,
                "a file to write (the metrics log; missing directories are created)",
            )?;
        } else if args.backend == Backend::Local || mpi_rank_is_zero() {
            runtime::check_output_file("--log-json: metrics log", path)?;
        }
    }
    if config.ps().is_some() {
        // `--devices` is refused by the configuration itself (`parallel.devices` has no
        // meaning in this mode), naming the flag.
        let refused = [
            ("--explain", args.explain || args.explain_rank.is_some()),
            ("--trace", args.trace.is_some()),
            ("--timeline", args.timeline.is_some()),
            ("--backend mpi", args.backend == Backend::Mpi),
        ];
        if let Some((flag, _)) = refused.iter().find(|(_, given)| *given) {
            anyhow::bail!(
                "{flag} does not apply to parallel.mode = \"parameter_server\" (set the counts in [ps])"
            );
        }
        return crate::ps_cmd::run(&config, args.log_json.as_deref());
    }
    // The same library entry as `runtime::Trainer`: a `Training`, here of the configuration's
    // built-in model and data.
    let training = Training::from_config(&config)?;
    let session = training.session();
    // What the compiled program caps or skips beyond what the configuration's warnings said.
    for warning in session.warnings() {
        eprintln!("warning: {warning}");
    }
    if let Some(path) = &args.timeline {
        let pipeline = config
            .parallel_config()
            .pipeline
            .filter(|p| p.stages > 1)
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "--timeline {}: the run has no pipeline to draw (set [parallel.pipeline] stages > 1)",
                    path.display()
                )
            })?;
        runtime::check_output_file("--timeline", path)?;
        let bubble = crate::timeline::draw(&pipeline, path)?;
        eprintln!(
            "timeline: {} (predicted bubble {:.1} %)",
            path.display(),
            bubble * 100.0
        );
    }
    // Written, not printed: a closed pipe (`… | head`) ends the command quietly.
    if args.json {
        let summary = session.train.summary();
        for rank in 0..session.devices() {
            let local = args.backend == Backend::Local;
            outln!("{}", explain_json(session, &summary, rank, local))?;
        }
        return Ok(());
    }
    if args.explain || args.explain_rank.is_some() {
        // A rank the run does not have is refused before the plan is printed.
        if let Some(rank) = args.explain_rank.filter(|&r| r >= session.devices()) {
            anyhow::bail!(
                "--explain-rank {rank}: the run has {} ranks",
                session.devices()
            );
        }
        out!(
            "{}",
            session.train.explain_with(session.deterministic_blocks())
        )?;
        write_stdout(&explain_memory(session, args.backend == Backend::Local))?;
        if let Some(rank) = args.explain_rank {
            out!("\n{}", session.train.for_rank(rank))?;
        }
        return Ok(());
    }
    if let Some(path) = &args.trace {
        if !session.is_pipelined() && !session.runs_ring_attention() {
            anyhow::bail!("{}", nothing_to_trace(path));
        }
        // Under MPI each process writes `<stem>.rank<r><ext>` beside `path`: the same directory.
        runtime::check_output_file("--trace", &trace_target(path, mpi_rank()))?;
    }
    // `train_local` / `train_mpi` check the output directory, the metrics log and the
    // checkpoint resumed from before any rank starts (runtime::check_before_start).
    let out_dir = config.output().dir.clone();
    let options = LaunchOptions {
        // Printed by this command's own monitor (below), whose failure names stdout.
        print_loss: false,
        metrics_log: Some(
            args.log_json
                .clone()
                .unwrap_or_else(|| config.output().metrics_file()),
        ),
        timeout: std::time::Duration::from_secs(args.timeout),
        mpi_watchdog: args.mpi_watchdog,
        trace: args.trace.is_some(),
        exit_on_hung_rank: true,
    };
    let devices = session.devices();
    let mut training = training.options(options);
    // MindSpore's loss lines, on rank 0 (the callbacks of `--backend mpi` run on every
    // process's rank). Stdout that cannot be written stops the run, with an error naming it.
    if args.backend == Backend::Local || mpi_rank_is_zero() {
        let every = config.train().per_print_times;
        training = training.callback(LossMonitor::new(Box::new(StdoutLines), every));
    }
    let start = Instant::now();
    let trained = match args.backend {
        Backend::Local => training.train_local().map_err(anyhow::Error::from),
        Backend::Mpi => train_mpi(training),
    };
    let report = match (trained, stdout::take_failure("the loss lines")) {
        (Ok(report), None) => report,
        (_, Some(failure)) => return Err(failure.context("training stopped")),
        (Err(err), None) => return Err(err),
    };
    let elapsed = start.elapsed().as_secs_f64();
    if let Some(path) = &args.trace {
        write_trace(path, &report)?;
    }
    let is_rank0 = report.ranks.len() == devices || mpi_rank_is_zero();
    if is_rank0 {
        let steps = report.losses().len();
        outln!(
            "trained {} steps on {} device(s) in {:.2} s ({:.1} steps/s); final loss {:.4}",
            steps,
            report.devices,
            elapsed,
            steps as f64 / elapsed.max(1e-9),
            report.losses().last().copied().unwrap_or(f32::NAN)
        )?;
        if report.skipped_steps() > 0 {
            outln!(
                "{} of the {steps} steps skipped their update: their gradients overflowed under train.loss_scale",
                report.skipped_steps()
            )?;
        }
        if let Some(acc) = report.accuracies().last() {
            outln!("test accuracy after the last epoch: {:.2}%", acc * 100.0)?;
        }
        if let Some(loss) = report.eval_losses().last() {
            outln!("validation loss after the last epoch: {loss:.4}")?;
        }
        if let Some(memory) = report.ranks.first().map(|r| &r.memory_by_rank) {
            if !memory.is_empty() {
                out!(
                    "memory per rank (measured peaks):\n{}",
                    runtime::memory_lines(memory)
                )?;
            }
        }
        if let Some(bubble) = report.pipeline_bubble() {
            outln!(
                "pipeline bubble (measured, idle share of every rank over each step): {:.1} %",
                bubble * 100.0
            )?;
            if let Some(predicted) = calibrated_bubble(&config, &report)? {
                outln!(
                    "pipeline bubble (predicted from this run's pass times per stage): {:.1} %",
                    predicted * 100.0
                )?;
            }
            let peaks: Vec<String> = report
                .ranks
                .iter()
                .filter_map(|r| r.pipeline.last())
                .map(|t| {
                    format!(
                        "{} × {:.2} MiB",
                        t.peak_in_flight,
                        t.micro_batch_bytes as f64 / (1 << 20) as f64
                    )
                })
                .collect();
            outln!(
                "micro-batches held at once × their buffers, per rank: {}",
                peaks.join(", ")
            )?;
        }
        if config.output().save_checkpoint {
            outln!(
                "checkpoints: {}/rank_<r>/checkpoint_<r>.safetensors; strategy: {}/strategy.json (Tessera) and strategy.ckpt (MindSpore)",
                out_dir.display(),
                out_dir.display()
            )?;
        }
    }
    Ok(())
}

/// The positional config path of `tessera train` and `tessera plan`: an existing file (a pipe
/// the shell made, `<(…)`, included), else an error saying it is the config file.
pub(crate) fn check_config_file(path: &std::path::Path) -> anyhow::Result<()> {
    runtime::check_input_path(
        "config file",
        path,
        runtime::PathKind::File,
        "a file (the training configuration, TOML; see docs/CONFIG.md)",
    )?;
    Ok(())
}

/// The predicted memory section of `--explain`: every rank's figures (the distinct ones when
/// there are many ranks), then the largest footprint of a rank (`local`: the ranks are threads
/// of this process), which the memory available is checked against before the run starts.
fn explain_memory(session: &TrainSession, local: bool) -> String {
    let ranks: Vec<_> = (0..session.devices())
        .map_while(|r| session.predict_memory(r))
        .collect();
    if ranks.is_empty() {
        return "\nmemory per rank: not predicted for pipelined steps\n".to_string();
    }
    let mut text =
        String::from("\nmemory per rank (predicted peaks; buffers freed after their last use):\n");
    let lines = runtime::memory_lines(&ranks);
    const SHOWN: usize = 16;
    for line in lines.lines().take(SHOWN) {
        text.push_str(line);
        text.push('\n');
    }
    if ranks.len() > SHOWN {
        let worst = ranks.iter().map(|r| r.peak).max().unwrap_or(0);
        text.push_str(&format!(
            "  … {} more ranks; the largest peak of any rank: {:.2} MiB\n",
            ranks.len() - SHOWN,
            worst as f64 / f64::from(1 << 20)
        ));
    }
    let largest = (0..session.devices())
        .filter_map(|r| session.predict_footprint(r, local).map(|f| (r, f)))
        .max_by_key(|(r, f)| (f.total(), std::cmp::Reverse(*r)));
    if let Some((rank, f)) = largest {
        let mib = |b: u64| b as f64 / f64::from(1 << 20);
        let mut parts = format!(
            "training {:.2} + evaluation {:.2} + returned parameters {:.2} + kernels {:.2} + thread stacks {:.2} + bookkeeping {:.2}",
            mib(f.training as u64),
            mib(f.evaluation as u64),
            mib(f.returned_parameters as u64),
            mib(f.kernel_workspace as u64),
            mib(f.thread_stacks as u64),
            mib(f.bookkeeping as u64)
        );
        if f.interleave_parts > 0 {
            parts.push_str(&format!(
                " + interleaved parts {:.2}",
                mib(f.interleave_parts as u64)
            ));
        }
        text.push_str(&format!(
            "memory of a rank's run in all (checked against the memory available before it starts), largest rank {rank}: {:.2} MiB = {parts}\n",
            mib(f.total())
        ));
    }
    text
}

/// `--explain --json`'s object for `rank`; `summary` is the training program's, `local`: the
/// ranks are threads of this process.
fn explain_json(
    session: &TrainSession,
    summary: &parallel::ProgramSummary,
    rank: usize,
    local: bool,
) -> serde_json::Value {
    let program = &session.train;
    serde_json::json!({
        "rank": rank,
        "devices": session.devices(),
        "mode": summary.mode,
        "steps": summary.steps.len(),
        "reshards": summary.reshards,
        "bytes_per_step": summary.bytes_per_step,
        "memory": session.predict_memory(rank).map(|m| runtime::memory_json(rank, &m)),
        "footprint": session.predict_footprint(rank, local).map(|f| serde_json::json!({
            "training": f.training,
            "evaluation": f.evaluation,
            "interleave_parts": f.interleave_parts,
            "returned_parameters": f.returned_parameters,
            "kernel_workspace": f.kernel_workspace,
            "thread_stacks": f.thread_stacks,
            "bookkeeping": f.bookkeeping,
            "total": f.total(),
        })),
        "comm_plans": {
            "distinct": program.plan_reuse.distinct,
            "total": program.plan_reuse.total,
        },
        "gather_buckets": program.gather_buckets.iter().map(|b| serde_json::json!({
            "kind": "allgather",
            "bytes": b.bytes,
            "groups": b.groups,
            "params": b.gathers.iter().map(|&g| program.params[program.weight_gathers[g].param].name.as_str()).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "buckets": program.buckets.iter().map(|b| serde_json::json!({
            "kind": if b.scatter { "reducescatter" } else { "allreduce" },
            "bytes": b.bytes,
            "params": b.params.iter().map(|&p| program.params[p].name.as_str()).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    })
}

#[cfg(feature = "mpi")]
fn train_mpi(training: Training) -> anyhow::Result<runtime::TrainReport> {
    Ok(training.train_mpi()?)
}

#[cfg(not(feature = "mpi"))]
fn train_mpi(_: Training) -> anyhow::Result<runtime::TrainReport> {
    anyhow::bail!("--backend mpi needs a tessera built with `cargo build --features mpi`")
}

/// Whether this process is rank 0 of an `mpirun` job (OpenMPI and MPICH set these).
fn mpi_rank_is_zero() -> bool {
    mpi_rank().is_none_or(|r| r == 0)
}

/// This process's rank under an MPI launcher (`None` outside one).
fn mpi_rank() -> Option<usize> {
    ["OMPI_COMM_WORLD_RANK", "PMI_RANK"]
        .iter()
        .find_map(|v| std::env::var(v).ok())
        .and_then(|r| r.parse().ok())
}

/// The file `--trace path` writes: `path` when this process ran every rank, else (`rank`: this
/// process's rank under MPI) `path` with `.rank<r>` before its extension.
fn trace_target(path: &std::path::Path, rank: Option<usize>) -> std::path::PathBuf {
    let Some(rank) = rank else {
        return path.to_path_buf();
    };
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let ext = path
        .extension()
        .map(|e| format!(".{}", e.to_string_lossy()))
        .unwrap_or_default();
    path.with_file_name(format!("{stem}.rank{rank}{ext}"))
}

/// The schedule simulator's bubble with each stage's passes timed as this run measured them
/// (`None` without a pipeline, or when some stage's ranks are not in this process).
fn calibrated_bubble(
    config: &TrainConfig,
    report: &runtime::TrainReport,
) -> anyhow::Result<Option<f64>> {
    let Some(pipeline) = config.parallel_config().pipeline.filter(|p| p.stages > 1) else {
        return Ok(None);
    };
    let schedule = parallel::pipeline::Schedule::generate(&pipeline)?;
    let per_rank: Vec<&[runtime::StepTrace]> =
        report.ranks.iter().map(|r| r.pipeline.as_slice()).collect();
    let per_stage = (report.devices / pipeline.stages).max(1);
    Ok(runtime::calibrated_prediction(
        &schedule, per_stage, &per_rank,
    )?)
}

/// Why `--trace path` has nothing to write.
fn nothing_to_trace(path: &std::path::Path) -> String {
    format!(
        "--trace {}: the run has no pipelined steps or ring attention to trace (set [parallel.pipeline] stages > 1 and micro_batches > 1, or parallel.context_parallel > 1 with context_parallel_algo = \"ring\")",
        path.display()
    )
}

/// Writes the ranks' timelines (pipelined steps, ring attention passes) as Chrome trace events: every rank into `path` when
/// this process ran them all, else this process's rank into `path` with `.rank<r>` inserted.
fn write_trace(path: &std::path::Path, report: &runtime::TrainReport) -> anyhow::Result<()> {
    let every_rank = report.ranks.len() == report.devices;
    let traces: Vec<(usize, Vec<runtime::StepTrace>)> = report
        .ranks
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let steps: Vec<runtime::StepTrace> =
                r.pipeline.iter().chain(&r.ring_trace).cloned().collect();
            let rank = match every_rank {
                true => i,
                false => steps
                    .iter()
                    .flat_map(|s| s.spans.first())
                    .map(|s| s.rank)
                    .next()
                    .unwrap_or(0),
            };
            (rank, steps)
        })
        .collect();
    if traces.iter().all(|(_, t)| t.is_empty()) {
        anyhow::bail!("{}", nothing_to_trace(path));
    }
    let target = trace_target(
        path,
        (!every_rank).then(|| traces.first().map_or(0, |(r, _)| *r)),
    );
    let borrowed: Vec<(usize, &[runtime::StepTrace])> =
        traces.iter().map(|(r, t)| (*r, t.as_slice())).collect();
    let text = serde_json::to_string(&runtime::chrome_trace(&borrowed))?;
    write_output_file(&target, text.as_bytes())
        .map_err(|e| anyhow::anyhow!("--trace: cannot write {}: {e}", target.display()))?;
    Ok(())
}

/// Writes `bytes` to `path` (`--trace`, `--timeline`): a regular file, or a new one, through a
/// temporary file beside it renamed into place, so a write that fails (a full disk, a
/// file-size limit) leaves the previous file whole and nothing half-written, and removes the
/// temporary file and the directories it created; a device or a FIFO (`/dev/stdout`)
/// directly, as it cannot be replaced.
pub(crate) fn write_output_file(path: &std::path::Path, bytes: &[u8]) -> anyhow::Result<()> {
    match std::fs::metadata(path) {
        Ok(meta) if !meta.is_file() && !meta.is_dir() => {
            std::fs::write(path, bytes).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
        }
        _ => ckpt::save_side_file(path, bytes, true)
            .map(drop)
            .map_err(anyhow::Error::from),
    }
}
