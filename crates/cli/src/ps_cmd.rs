//! `tessera train` in `parallel.mode = "parameter_server"`: run the role `TESSERA_ROLE` names,
//! or, when it is unset, start every role as a child process on this machine and supervise
//! them (`ps::launch`): a signal to this process stops every one of them.

use std::path::Path;
use std::sync::atomic::Ordering;

use runtime::TrainConfig;

use crate::stdout::write_stdout;

/// Runs a parameter-server config; worker 0 writes the metrics log to `metrics_log` (`None`:
/// `<output.dir>/metrics.jsonl`).
pub fn run(config: &TrainConfig, metrics_log: Option<&Path>) -> anyhow::Result<()> {
    // Before any role starts: the data every worker reads.
    runtime::check_data_paths(config)?;
    let Some(env) = ps::RoleEnv::from_process()? else {
        return run_local_job(config, metrics_log);
    };
    // A server started on its own (by `tessera launch --ps-servers`, on another machine, in a
    // pod) writes its snapshots into `<output.dir>/ps/` every `ps.checkpoint_every` steps: an
    // unusable run directory is said now, not at its first snapshot, mid-run.
    if env.role == ps::PsRole::Server {
        runtime::check_parameter_server_output(config)?;
    }
    if let Some(report) = ps::run_role(config, &env, metrics_log)? {
        write_stdout(&ps::summary(&report, config, &env))?;
    }
    Ok(())
}

/// Starts and supervises every role of the job on this machine, under the job secret of
/// `TESSERA_JOB_SECRET` when it is set, else a fresh one. The metrics log worker 0 will write
/// is checked first, so a bad path fails before anything starts.
fn run_local_job(config: &TrainConfig, metrics_log: Option<&Path>) -> anyhow::Result<()> {
    // The counts (with the launcher's TESSERA_NUM_SERVERS / TESSERA_NUM_WORKERS, which must
    // agree with `[ps]`) are checked here, once, rather than by every role as it starts.
    let (servers, workers) = ps::env::local_job_counts(config, |name| std::env::var(name).ok())?;
    // Before any role starts: the run directory the servers snapshot into.
    runtime::check_parameter_server_output(config)?;
    let default_log = config.output().metrics_file();
    runtime::MetricsLog::create(metrics_log.unwrap_or(&default_log))?;
    let secret = crate::launch::job_secret()?;
    let program = std::env::current_exe()?;
    let args: Vec<String> = std::env::args().skip(1).collect();
    eprintln!(
        "parameter-server job on this machine: 1 scheduler, {servers} server(s), {workers} worker(s)"
    );
    // From here a signal stops the children before this process ends (see `main`).
    crate::SUPERVISING.store(true, Ordering::SeqCst);
    let end = ps::launch::run_local_job(
        &program,
        &args,
        (servers, workers),
        &secret,
        &crate::STOP_SIGNAL,
    );
    match end {
        Ok(end) => {
            eprint!("{}", end.report());
            Ok(())
        }
        Err(ps::PsError::Stopped { signal }) => Err(crate::launch::Interrupted(signal).into()),
        Err(other) => Err(other.into()),
    }
}
