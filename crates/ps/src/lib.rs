//! Parameter-server training (issue 19): a scheduler, S servers and N workers, each its own
//! OS process (or thread, in tests), talking gRPC (tonic, prost).
//!
//! - The **scheduler** ([`scheduler`]) registers servers and workers, tracks their liveness by
//!   heartbeat, fixes each step's members and splits the step's global batch over them
//!   (a dead worker's rows go to the live ones), and bounds async staleness.
//! - A **server** ([`server`]) holds a partition of the parameters ([`partition`], balanced by
//!   bytes), applies the runtime's optimizer to the gradients workers push (sync: the weighted
//!   mean of the step's live workers; async: each push), and snapshots its partition every
//!   `ps.checkpoint_every` steps ([`snapshot`]); restarted, it resumes from the snapshot and
//!   (sync) replays the gradients the workers kept.
//! - A **worker** ([`worker`]) pulls weights, computes gradients on its rows with the runtime's
//!   stand-alone programs ([`compute`]) and pushes them.
//!
//! - **Server-resident embedding tables** (`ps.embedding_on_server`, MindSpore's
//!   `EmbeddingLookup(target="CPU")`): a table is cut into row blocks, one per server
//!   ([`sparse`], [`table`]); workers pull only their batch's rows and push row-sparse
//!   gradients ([`embedding`]), and hold no parameter larger than `ps.worker_max_param_bytes`.
//!
//! Every call has a deadline and bounded retries with backoff ([`retry`]) and carries the
//! job's secret, which schedulers and servers check before anything else ([`auth`]). The
//! process contract (environment variables) is [`env`]; [`launch`] starts every role as a child
//! process for a plain `tessera train ps.toml`.
//!
//! # Architecture invariant
//! The numbers are the runtime's: programs, data order and optimizer come from `runtime`; this
//! crate moves tensors and decides who takes part in a step, nothing else.
#![deny(missing_docs)]

pub mod auth;
pub mod compute;
pub mod embedding;
pub mod env;
mod error;
pub mod launch;
pub mod liveness;
pub mod migrate;
pub mod net;
pub mod partition;
pub mod retry;
pub mod scheduler;
pub mod server;
pub mod snapshot;
pub mod sparse;
pub mod table;
pub mod wire;
pub mod worker;

pub use crate::env::{PsRole, RoleEnv};
pub use crate::error::PsError;
pub use crate::worker::WorkerReport;

/// The messages and services generated from `proto/ps.proto`.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod proto {
    tonic::include_proto!("tessera.ps");
}

/// Runs the role `env` names for `config` in this process (the scheduler and servers until the
/// job ends; a worker until its last step). Worker 0 writes the metrics log to `metrics_log`
/// (`None`: `<output.dir>/metrics.jsonl`); its report is returned for printing.
pub fn run_role(
    config: &runtime::TrainConfig,
    env: &RoleEnv,
    metrics_log: Option<&std::path::Path>,
) -> Result<Option<WorkerReport>, PsError> {
    let settings = env::JobSettings::new(config, env)?;
    match env.role {
        PsRole::Scheduler => {
            scheduler::run(&settings, env, config.data().batch_size).map(|()| None)
        }
        PsRole::Server => server::run(config, &settings, env).map(|()| None),
        PsRole::Worker => worker::run(config, &settings, env, metrics_log).map(Some),
    }
}

/// Worker 0's closing lines, as `tessera train` prints them (empty for other workers):
/// steps, the workers that finished the job, speed and final loss; each worker the job lost and
/// where; then the test accuracy.
pub fn summary(report: &WorkerReport, config: &runtime::TrainConfig, env: &RoleEnv) -> String {
    if report.worker_id != 0 {
        return String::new();
    }
    let keys = config.ps();
    let workers = report.finished_workers;
    let servers = env
        .num_servers
        .or(keys.and_then(|k| k.servers))
        .unwrap_or(0);
    let mut text = format!(
        "trained {} steps on {workers} worker(s) and {servers} server(s) in {:.2} s ({:.1} steps/s); final loss {:.4}\n",
        report.steps_run,
        report.seconds,
        report.steps_run as f64 / report.seconds.max(1e-9),
        report.losses.last().copied().unwrap_or(f32::NAN)
    );
    for (id, step) in &report.lost_workers {
        text.push_str(&format!(
            "worker {id} was lost at step {step} (declared dead: no heartbeat); the job finished on {workers} worker(s)\n"
        ));
    }
    if let Some(acc) = report.accuracies.last() {
        text.push_str(&format!(
            "test accuracy after the last epoch: {:.2}%\n",
            acc * 100.0
        ));
    }
    text
}
