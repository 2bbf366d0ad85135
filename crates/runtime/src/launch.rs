//! Starting the ranks of a training run: threads of this process (the `local` backend) or the
//! processes of an `mpirun` job (the `mpi` backend).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use comm::{Communicator, LocalCluster};

use crate::callbacks::{Callback, CallbackList, LocalNorm, LossMonitor, MetricsLog};
use crate::error::RuntimeError;
use crate::preflight::{check_before_start, RanksHere};
use crate::session::{RankOutcome, TrainSession};

/// How a run reports as it goes.
#[derive(Debug, Clone)]
pub struct LaunchOptions {
    /// Print MindSpore's loss lines (`epoch: 1 step: 10, loss is 2.2871`) from rank 0.
    pub print_loss: bool,
    /// Write the JSON-lines metrics log here from rank 0.
    pub metrics_log: Option<PathBuf>,
    /// The longest any collective may wait for a peer.
    pub timeout: Duration,
    /// The `mpi` backend only: run collectives as MPI's blocking calls under a watchdog that
    /// ends the whole job when one overruns `timeout` (`comm::mpi::OnTimeout::AbortJob`),
    /// instead of polled ones that return an error on every rank (the default).
    pub mpi_watchdog: bool,
    /// Record every step's ring attention passes ([`crate::RankOutcome::ring_trace`]) for
    /// `tessera train --trace`.
    pub trace: bool,
    /// The local backend only (for the command line): once a rank has failed, ranks still
    /// running `timeout` later are hung — their threads cannot be stopped — so the first
    /// failure is printed and the process exits with status 1 instead of waiting for them
    /// forever (`hang_watch`). Off by default: a library caller keeps its process.
    pub exit_on_hung_rank: bool,
}

impl Default for LaunchOptions {
    fn default() -> LaunchOptions {
        LaunchOptions {
            print_loss: true,
            metrics_log: None,
            timeout: Duration::from_secs(300),
            mpi_watchdog: false,
            trace: false,
            exit_on_hung_rank: false,
        }
    }
}

/// What a run ended with: every rank's outcome (one, under MPI: this process's).
#[derive(Debug, Clone)]
pub struct TrainReport {
    /// Number of devices.
    pub devices: usize,
    /// Each rank's outcome, by rank (under MPI only this process's rank is present).
    pub ranks: Vec<RankOutcome>,
}

impl TrainReport {
    /// The losses of every step (the same on every rank).
    pub fn losses(&self) -> &[f32] {
        self.ranks.first().map_or(&[], |r| r.losses.as_slice())
    }

    /// The steps whose update was skipped for overflowing gradients (the same on every rank).
    pub fn skipped_steps(&self) -> u64 {
        self.ranks.first().map_or(0, |r| r.skipped_steps)
    }

    /// The test accuracy after every epoch.
    pub fn accuracies(&self) -> &[f64] {
        self.ranks.first().map_or(&[], |r| r.accuracies.as_slice())
    }

    /// The measured pipeline bubble ([`crate::measured_bubble`]): per step, the share of
    /// rank-time over the step's span on every rank spent waiting for other stages (or before
    /// or after a rank's part of the step), averaged over the steps after the first; `None`
    /// without pipelined micro-batches.
    pub fn pipeline_bubble(&self) -> Option<f64> {
        let per_rank: Vec<&[crate::StepTrace]> =
            self.ranks.iter().map(|r| r.pipeline.as_slice()).collect();
        crate::measured_bubble(&per_rank)
    }

    /// The validation loss after every epoch (language models).
    pub fn eval_losses(&self) -> &[f64] {
        self.ranks.first().map_or(&[], |r| r.eval_losses.as_slice())
    }

    /// Step times of the first rank, in milliseconds.
    pub fn step_ms(&self) -> &[f64] {
        self.ranks.first().map_or(&[], |r| r.step_ms.as_slice())
    }
}

/// The callbacks of `rank`: the loss monitor (printing or not) and the metrics log on rank 0,
/// local norms on every rank when asked for. Returns them and whether they need the parameter shards.
fn callbacks_for(
    session: &TrainSession,
    options: &LaunchOptions,
    rank: usize,
) -> Result<(CallbackList, bool), RuntimeError> {
    let cfg = session.config.train();
    let mut list = CallbackList::new();
    let mut want_shards = false;
    if rank == 0 {
        // Printed or not, a NaN or infinite loss stops the run (MindSpore's `LossMonitor`
        // rule), in every front end: a run that diverged never ends as a success.
        let monitor = match options.print_loss {
            true => LossMonitor::stdout(cfg.per_print_times),
            false => LossMonitor::new(Box::new(std::io::sink()), 0),
        };
        list.push(Box::new(monitor));
        if let Some(path) = &options.metrics_log {
            list.push(Box::new(MetricsLog::create(path)?));
        }
    }
    if cfg.print_local_norm {
        list.push(Box::new(LocalNorm::printing_to_stdout()));
        want_shards = true;
    }
    if let Some(dir) = &cfg.dump_local_norm {
        list.push(Box::new(LocalNorm::dumping(dir)));
        want_shards = true;
    }
    Ok((list, want_shards))
}

/// Runs one rank of `session` over `world` with its callbacks.
pub fn run_rank(
    session: &TrainSession,
    options: &LaunchOptions,
    world: Arc<dyn Communicator>,
) -> Result<RankOutcome, RuntimeError> {
    run_rank_with(session, options, world, None)
}

/// Runs one rank of `session` over `world` with its callbacks, then `user`'s (if any).
fn run_rank_with(
    session: &TrainSession,
    options: &LaunchOptions,
    world: Arc<dyn Communicator>,
    user: Option<CallbackList>,
) -> Result<RankOutcome, RuntimeError> {
    let rank = world.rank();
    let (mut callbacks, want_shards) = callbacks_for(session, options, rank)?;
    if let Some(user) = user {
        callbacks.push(Box::new(user));
    }
    session.run_rank_traced(
        world,
        &mut callbacks as &mut dyn Callback,
        want_shards,
        options.trace,
    )
}

/// Trains `session` with one thread per device (the `local` backend).
///
/// Everything [`check_before_start`] checks fails before a rank starts. A rank that fails
/// stops the others at once (they fail waiting for it, not at `options.timeout`), and the
/// error returned is that rank's own, not its peers' "peer failed".
pub fn train_local(
    session: &TrainSession,
    options: &LaunchOptions,
) -> Result<TrainReport, RuntimeError> {
    train_local_with(session, options, CallbackList::new())
}

/// [`train_local`] with the caller's `callbacks` too: they run on rank 0, after the
/// run's own (the loss monitor, the metrics log), and see every step, evaluation and epoch of
/// the run and its end — MindSpore's `Model.train(…, callbacks=[…])`.
pub fn train_local_with(
    session: &TrainSession,
    options: &LaunchOptions,
    callbacks: CallbackList,
) -> Result<TrainReport, RuntimeError> {
    refuse_parameter_server(session)?;
    check_before_start(
        session,
        options.metrics_log.as_deref(),
        &RanksHere::every_rank(session),
    )?;
    let devices = session.devices();
    session.open_checkpoint_set()?;
    let cluster = LocalCluster::new(devices)?.with_timeout(options.timeout);
    // Rank 0 takes the caller's callbacks (the list is not shared between threads).
    let user = std::sync::Mutex::new(Some(callbacks));
    let watch = crate::hang_watch::HangWatch::new(devices);
    if options.exit_on_hung_rank {
        watch.exit_when_hung(options.timeout);
    }
    let results = cluster.run(|comm| {
        let rank = comm.rank();
        let mine = match rank {
            0 => user.lock().unwrap_or_else(|p| p.into_inner()).take(),
            _ => None,
        };
        let result = run_rank_with(session, options, Arc::new(comm), mine);
        watch.ended(
            rank,
            result.as_ref().err().map(|e| (blame(e), format!("{e:#}"))),
        );
        result
    });
    watch.finish();
    let ranks = root_cause(results)?;
    Ok(TrainReport { devices, ranks })
}

/// The collective launchers train collective modes only: a parameter-server config is trained
/// by its scheduler, servers and workers (`tessera train` starts them; `ps::launch`), never
/// silently as one stand-alone device.
fn refuse_parameter_server(session: &TrainSession) -> Result<(), RuntimeError> {
    match session.config.ps() {
        Some(_) => Err(RuntimeError::Config {
            key: "parallel.mode".to_string(),
            reason: format!(
                "\"{}\" is trained by a scheduler, servers and workers (`tessera train` starts them), not by the collective launcher",
                crate::config::PARAMETER_SERVER_MODE
            ),
        }),
        None => Ok(()),
    }
}

/// Every rank's result, in rank order, or the root cause of a failure: a rank's own failure
/// rather than a timeout, and a timeout rather than its peers' "peer failed"; the lowest rank
/// among equals.
pub(crate) fn root_cause<R>(
    results: Vec<Result<Result<R, RuntimeError>, comm::CommError>>,
) -> Result<Vec<R>, RuntimeError> {
    let mut ranks = Vec::with_capacity(results.len());
    let mut errors: Vec<(usize, RuntimeError, Blame)> = Vec::new();
    for (rank, result) in results.into_iter().enumerate() {
        match result {
            Ok(Ok(outcome)) => ranks.push(outcome),
            Ok(Err(err)) => {
                let blame = blame(&err);
                errors.push((rank, err, blame));
            }
            Err(err) => errors.push((rank, RuntimeError::Comm(err), Blame::OwnFault)),
        }
    }
    let cause = errors
        .into_iter()
        .min_by_key(|(rank, _, blame)| (*blame, *rank));
    match cause {
        Some((rank, err, _)) => Err(RuntimeError::Rank {
            rank,
            source: Box::new(err),
        }),
        None => Ok(ranks),
    }
}

/// How much of a failure a rank's error explains, most first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Blame {
    /// The rank's own failure (bad data, a file it could not write, a panic, a mismatch).
    OwnFault,
    /// The rank waited for a peer that never came: the peer hung, or failed silently.
    Timeout,
    /// The rank only reports another rank's failure (a peer that failed, a poisoned group).
    Consequence,
}

fn blame(err: &RuntimeError) -> Blame {
    if let RuntimeError::PeerWriteFailed { .. } = err {
        // "Another rank failed to write": that rank's error tells which file and why.
        return Blame::Consequence;
    }
    let comm_err = match err {
        RuntimeError::Comm(e) => Some(e),
        RuntimeError::Reshard(reshard_exec::ExecError::Comm(e)) => Some(e),
        RuntimeError::Exec(e) => e.comm_error(),
        _ => None,
    };
    match comm_err {
        Some(comm::CommError::PeerFailed { .. } | comm::CommError::Poisoned { .. }) => {
            Blame::Consequence
        }
        Some(comm::CommError::Timeout { .. }) => Blame::Timeout,
        _ => Blame::OwnFault,
    }
}

/// Trains this process's rank of an `mpirun` job (the `mpi` backend). The job must have exactly
/// as many processes as the configuration has devices. The rank runs on the calling thread; if
/// MPI is not initialised yet, it is initialised for that thread alone (`MPI_THREAD_SINGLE`).
#[cfg(feature = "mpi")]
pub fn train_mpi(
    session: &TrainSession,
    options: &LaunchOptions,
) -> Result<TrainReport, RuntimeError> {
    train_mpi_with(session, options, CallbackList::new())
}

/// [`train_mpi`] with the caller's `callbacks` too: they run in this process, on its rank,
/// after the run's own.
#[cfg(feature = "mpi")]
pub fn train_mpi_with(
    session: &TrainSession,
    options: &LaunchOptions,
    callbacks: CallbackList,
) -> Result<TrainReport, RuntimeError> {
    let on_timeout = if options.mpi_watchdog {
        comm::mpi::OnTimeout::AbortJob
    } else {
        comm::mpi::OnTimeout::ReturnError
    };
    // The rank runs on this thread and makes every MPI call from it: MPI needs no thread
    // safety of its own (unless the application initialised it already).
    comm::mpi::prefer_thread_level(comm::mpi::ThreadLevel::Single);
    let world = Arc::new(comm::mpi::MpiComm::world_with(options.timeout, on_timeout)?);
    let devices = session.devices();
    // Only rank 0 writes the metrics log.
    let metrics_log = options.metrics_log.as_deref().filter(|_| world.rank() == 0);
    let here = RanksHere {
        ranks: vec![world.rank()],
        processes_on_machine: mpi_local_size(),
        local_backend: false,
    };
    // Every failure from here on is announced to the peers (below): a rank returning early
    // would leave them waiting in their first collective, which no timeout covers.
    let result = check_world_size(devices, world.size())
        .and_then(|()| refuse_parameter_server(session))
        .and_then(|()| crate::config::check_same_config(&session.config, world.as_ref()))
        .and_then(|()| check_before_start(session, metrics_log, &here))
        .and_then(|()| {
            // Rank 0's process holds the checkpoint set's lock and staging directory.
            if world.rank() == 0 {
                session.open_checkpoint_set()
            } else {
                Ok(())
            }
        })
        .and_then(|()| run_rank_with(session, options, world.clone(), Some(callbacks)));
    let outcome = match result {
        Ok(outcome) => outcome,
        Err(err) => {
            // Tell the peers before leaving, so that they stop now rather than at the timeout.
            // A rank that only reports a peer's failure stays silent: the peers heard of it from
            // that peer, and are not to blame this rank.
            if blame(&err) != Blame::Consequence {
                world.announce_failure(&err.to_string());
            }
            return Err(err);
        }
    };
    Ok(TrainReport {
        devices,
        ranks: vec![outcome],
    })
}

/// The MPI job's size must be the configuration's device count.
#[cfg(feature = "mpi")]
fn check_world_size(devices: usize, world_size: usize) -> Result<(), RuntimeError> {
    if world_size == devices {
        return Ok(());
    }
    Err(RuntimeError::Config {
        key: "parallel.devices".to_string(),
        reason: format!(
            "the configuration asks for {devices} devices but mpirun started {world_size} processes"
        ),
    })
}

/// Processes of this MPI job on this machine (OpenMPI's `OMPI_COMM_WORLD_LOCAL_SIZE`,
/// MPICH's `MPI_LOCALNRANKS`), 1 when the launcher does not say.
#[cfg(feature = "mpi")]
fn mpi_local_size() -> u64 {
    ["OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"]
        .iter()
        .find_map(|v| std::env::var(v).ok()?.parse().ok())
        .unwrap_or(1)
        .max(1)
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[test]
    fn the_failing_rank_keeps_its_own_error_as_the_source() {
        let own = RuntimeError::Config {
            key: "train.epochs".to_string(),
            reason: "must be at least 1".to_string(),
        };
        let panicked = comm::CommError::RankPanicked {
            rank: 2,
            message: "boom".to_string(),
        };
        let results: Vec<Result<Result<(), RuntimeError>, comm::CommError>> =
            vec![Ok(Ok(())), Ok(Err(own)), Err(panicked)];
        let err = root_cause(results).unwrap_err();
        assert_eq!(
            err.to_string(),
            "rank 1: config train.epochs: must be at least 1"
        );
        let source = err.source().expect("the rank's error");
        let cause = source
            .downcast_ref::<Box<RuntimeError>>()
            .expect("a RuntimeError");
        assert!(
            matches!(&**cause, RuntimeError::Config { key, .. } if key == "train.epochs"),
            "{cause:?}"
        );
        let RuntimeError::Rank { rank: 1, source } = err else {
            panic!("a Rank error: {err:?}");
        };
        assert!(matches!(*source, RuntimeError::Config { .. }), "{source:?}");
    }

    #[test]
    fn a_rank_that_only_failed_to_communicate_keeps_its_comm_error() {
        let panicked = comm::CommError::RankPanicked {
            rank: 0,
            message: "boom".to_string(),
        };
        let text = panicked.to_string();
        let results: Vec<Result<Result<(), RuntimeError>, comm::CommError>> = vec![Err(panicked)];
        let err = root_cause(results).unwrap_err();
        assert_eq!(err.to_string(), format!("rank 0: {text}"));
        let source = err
            .source()
            .and_then(|s| s.downcast_ref::<Box<RuntimeError>>());
        assert!(
            matches!(
                source.map(|s| &**s),
                Some(RuntimeError::Comm(comm::CommError::RankPanicked {
                    rank: 0,
                    ..
                }))
            ),
            "{source:?}"
        );
    }
}
