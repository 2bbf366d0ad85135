//! Checks before any rank starts.
//!
//! Whatever can be found wrong from the configuration, the data headers and the file system is
//! found here, at once, before a rank runs: a run must not train for minutes, or wait for a
//! collective's timeout, to report that its metrics log cannot be written. The checks:
//!
//! - the session was built to train (not by [`crate::Session::for_planning`]);
//! - in a search mode, a searched plan's predicted peak (its fullest rank's) fits the
//!   `parallel.max_device_memory` the user set, as `tessera plan` refuses it;
//! - the predicted memory peak of the ranks this process runs fits the memory available
//!   ([`crate::host_memory`]);
//! - `output.dir` exists or can be created, and a file can be written in it;
//! - the metrics log's directory exists and the log can be opened for writing;
//! - the paths the ranks write to only once they run can be written: the local norms'
//!   directory (`train.dump_local_norm_path`) and each of this process's ranks' folder in it,
//!   the periodic checkpoint sets' directories (`checkpoint_step_<N>` in `output.dir`: none of
//!   the steps the run may save at is taken by something else than a directory), and this
//!   process's ranks' group-info files (`output.group_info_file`: not under a file);
//! - `output.resume_from` is a directory holding a checkpoint (rank 0's file) and the strategy
//!   file it is read with exists (without one, a set of rank 0 alone is read as unsharded),
//!   and the checkpoint is this model's with steps left to train ([`crate::resume_check`]).
//!
//! (The data files themselves are opened, their headers checked and `data.batch_size` checked
//! against the training split, by [`Session::new`]; before that, and before any search,
//! [`check_config_paths`] checks the paths a session reads or writes while it is built.)
//!
//! Nothing is left behind by a failed check: directories created to test `output.dir` are
//! removed again (only those, and only while empty), as is a probe file. After a successful
//! check `output.dir` exists, and in a search mode the plan's strategies are written to
//! `parallel.save_operator_strategy_file` (when set): a run refused here writes none.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};

use parallel::ParallelMode;

use crate::config::TrainConfig;
use crate::error::RuntimeError;
use crate::paths::{check_key_idx_dir, check_key_input, check_key_output, PathKind};
use crate::session::TrainSession;

/// Runs every check of this module for `session`, writing the metrics log at `metrics_log`
/// (when given). Creates `output.dir` when it is missing, and leaves nothing behind on failure.
pub fn check_before_start(
    session: &TrainSession,
    metrics_log: Option<&Path>,
    here: &RanksHere,
) -> Result<(), RuntimeError> {
    if session.planning_only {
        return Err(RuntimeError::Mismatch {
            what: "the session".to_string(),
            expected: "one built to train (Session::new)".to_string(),
            got: "one built by Session::for_planning, whose evaluation program is not compiled"
                .to_string(),
        });
    }
    crate::elastic::fault::check_fault_rank(session.devices())?;
    session.check_searched_budget()?;
    check_memory(session, here)?;
    let resumed_at = check_resume_from(session)?;
    check_group_info_files(session)?;
    let created = prepare_output_dir(&session.config.output().dir)?;
    // A failure from here on removes the output directories just created (when `created`
    // drops).
    if let Some(path) = metrics_log {
        check_output_file("metrics log", path)?;
    }
    check_local_norm_dir(session, here)?;
    check_periodic_sets(session, resumed_at.map_or(1, |step| step + 1))?;
    check_group_info_dirs(session, here)?;
    save_searched_strategies(session)?;
    created.keep();
    Ok(())
}

/// In a search mode with `parallel.save_operator_strategy_file`: the plan's strategies written
/// there (missing directories created), once every other check has passed.
fn save_searched_strategies(session: &TrainSession) -> Result<(), RuntimeError> {
    let (Some(plan), Some(path)) = (
        &session.searched,
        &session.config.search().save_operator_strategy_file,
    ) else {
        return Ok(());
    };
    ckpt::write_operator_strategy_file(path, &plan.records)?;
    Ok(())
}

/// The paths a session reads or writes while it is built, checked before anything is read,
/// built or searched: the data (`data.dir` or `data.path`, with `with_data`), the strategy
/// files read (`parallel.strategy_file`, and in a search mode
/// `parallel.load_operator_strategy_file`) and the one a search writes
/// (`parallel.save_operator_strategy_file`, whose missing directories the writer creates).
/// Every error names the key, the path and what was expected.
pub(crate) fn check_config_paths(
    config: &TrainConfig,
    with_data: bool,
) -> Result<(), RuntimeError> {
    if with_data {
        check_data_paths(config)?;
    }
    if let Some(path) = config.strategy_file() {
        check_key_input(
            "parallel.strategy_file",
            path,
            PathKind::File,
            "a file (a strategy file: the strategy.json or strategy.ckpt a run saves, or MindSpore's)",
        )?;
    }
    if matches!(config.parallel_config().mode, ParallelMode::Auto(_)) {
        let search = config.search();
        if let Some(path) = &search.load_operator_strategy_file {
            check_key_input(
                "parallel.load_operator_strategy_file",
                path,
                PathKind::File,
                "a file (an operator strategy JSON, as a search-mode run or `tessera plan` writes it)",
            )?;
        }
        if let Some(path) = &search.save_operator_strategy_file {
            check_key_output(
                "parallel.save_operator_strategy_file",
                path,
                PathKind::File,
                "a file to write (the operator strategy JSON; missing directories are created)",
            )?;
        }
    }
    Ok(())
}

/// The data of `[data]`: `data.path` (the text or token file) for the text formats,
/// `data.dir` (a directory holding both splits' IDX files) otherwise. The error names the key,
/// the path and what was expected.
pub fn check_data_paths(config: &TrainConfig) -> Result<(), RuntimeError> {
    let data = config.data();
    match &data.text {
        Some(text) => check_key_input(
            "data.path",
            &text.path,
            PathKind::File,
            &format!(
                "a file (the {} file data.format = \"{}\" reads)",
                match data.format {
                    crate::config::DataFormat::Tokens => "token",
                    _ => "text",
                },
                data.format.name()
            ),
        ),
        None => check_key_idx_dir("data.dir", &data.dir),
    }
}

/// `parallel.mode = "parameter_server"` on one machine (every role started here): the run
/// directory `output.dir` (worker 0's metrics log, the servers' snapshots in `ps/`) can be
/// created or written, and its `ps/` is a directory or nothing, so that no server fails at its
/// first snapshot. Nothing is created.
pub fn check_parameter_server_output(config: &TrainConfig) -> Result<(), RuntimeError> {
    let dir = &config.output().dir;
    check_key_output(
        "output.dir",
        dir,
        PathKind::Directory,
        "a directory (the run directory; created if missing)",
    )?;
    check_key_output(
        "output.dir",
        &dir.join("ps"),
        PathKind::Directory,
        "a directory or nothing (the servers write their snapshots into ps/ every \
         ps.checkpoint_every steps)",
    )
}

/// `train.dump_local_norm`: the directory the ranks dump their norms into (the key's path, or
/// its default under `output.dir`) can be created or written, and no folder `rank_<r>` of this
/// process's ranks in it is something else than a directory. Nothing is created.
fn check_local_norm_dir(session: &TrainSession, here: &RanksHere) -> Result<(), RuntimeError> {
    let Some(dir) = &session.config.train().dump_local_norm else {
        return Ok(());
    };
    let key = "train.dump_local_norm_path";
    let expected = "a directory (train.dump_local_norm writes <dir>/rank_<r>/local_norm_step_<s>.json; missing directories are created)";
    check_key_output(key, dir, PathKind::Directory, expected)?;
    for &rank in &here.ranks {
        let folder = dir.join(format!("rank_{rank}"));
        if folder.exists() && !folder.is_dir() {
            check_key_output(key, &folder, PathKind::Directory, expected)?;
        }
    }
    Ok(())
}

/// `output.save_checkpoint_steps` / `_seconds`: no `checkpoint_step_<N>` in `output.dir` that
/// the run may write a periodic set into (every step from `first`, the first step it trains,
/// up to its last with a time interval, the multiples of the step interval otherwise) is
/// something else than a directory, which the set could not replace.
fn check_periodic_sets(session: &TrainSession, first: u64) -> Result<(), RuntimeError> {
    let out = session.config.output();
    let key = match (out.save_checkpoint_steps, out.save_checkpoint_seconds) {
        (_, Some(_)) => "output.save_checkpoint_seconds",
        (Some(_), None) => "output.save_checkpoint_steps",
        (None, None) => return Ok(()),
    };
    let last = session.planned_steps();
    let saved_at = |step: u64| {
        (first..=last).contains(&step)
            && (out.save_checkpoint_seconds.is_some()
                || out
                    .save_checkpoint_steps
                    .is_some_and(|n| step.is_multiple_of(n)))
    };
    let Ok(entries) = std::fs::read_dir(&out.dir) else {
        return Ok(());
    };
    let mut taken: Vec<(u64, PathBuf)> = entries
        .flatten()
        .filter_map(|e| {
            let step = crate::periodic_ckpt::step_of_name(&e.file_name().to_string_lossy())?;
            Some((step, e.path()))
        })
        .filter(|(step, path)| saved_at(*step) && !path.is_dir())
        .collect();
    taken.sort();
    match taken.first() {
        None => Ok(()),
        Some((step, path)) => check_key_output(
            key,
            path,
            PathKind::Directory,
            &format!("a directory or nothing (the periodic checkpoint set of step {step} is written there)"),
        ),
    }
}

/// The ranks one process runs, and how many such processes share this machine's memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RanksHere {
    /// The ranks this process runs (every rank on the local backend, its own under MPI).
    pub ranks: Vec<usize>,
    /// Processes of the job on this machine, each holding its own ranks (1 on the local
    /// backend; under MPI, the launcher's local size).
    pub processes_on_machine: u64,
    /// The ranks are threads of this process (the local backend), which runs
    /// `parallel.micro_batch_interleave`'s other parts on executors of their own.
    pub local_backend: bool,
}

impl RanksHere {
    /// Every rank of `session` in this process, alone on the machine (the local backend).
    pub fn every_rank(session: &TrainSession) -> RanksHere {
        RanksHere {
            ranks: (0..session.devices()).collect(),
            processes_on_machine: 1,
            local_backend: true,
        }
    }
}

/// The predicted footprint of the ranks this process runs ([`TrainSession::predict_footprint`]:
/// the training program's peak and what lives beside it) fits the memory available to it: its
/// share (`1 / processes_on_machine`) of `MemAvailable`, lowered to a cgroup limit or the room
/// under the address-space limit where one is set. The error names both figures; `--explain`
/// is not affected.
fn check_memory(session: &TrainSession, here: &RanksHere) -> Result<(), RuntimeError> {
    let Some(memory) = crate::host_memory::host_memory() else {
        return Ok(());
    };
    // Each distinct footprint is predicted once ([`TrainSession::predict_footprints`]).
    let predicted: u64 = session
        .predict_footprints(&here.ranks, here.local_backend)
        .into_iter()
        .flatten()
        .map(|footprint| footprint.total())
        .fold(0, u64::saturating_add);
    let share = memory.available / here.processes_on_machine.max(1);
    if predicted <= share {
        return Ok(());
    }
    let gib = |bytes: u64| bytes as f64 / f64::from(1 << 30);
    let whose = match (here.ranks.len(), here.processes_on_machine) {
        (1, 1) => "its rank".to_string(),
        (n, 1) => format!("its {n} ranks"),
        (_, p) => format!(
            "its rank, one of {p} processes sharing this machine's {:.2} GiB",
            gib(memory.available)
        ),
    };
    // A prediction summed past 64 bits saturates: say so rather than print the saturated sum.
    let needs = match predicted {
        u64::MAX => "more than 2^64 bytes (a sum past 64 bits".to_string(),
        _ => format!("{:.2} GiB ({predicted} bytes", gib(predicted)),
    };
    Err(RuntimeError::Config {
        key: "parallel.devices".to_string(),
        reason: format!(
            "the run needs {needs}, the predicted peak of {whose}; see --explain) but {:.2} GiB ({share} bytes) is available ({}): use more devices, a smaller model or batch, hsdp or recompute",
            gib(share),
            memory.source
        ),
    })
}

/// `output.group_info_file`: no rank's path holds a file other than a group-info file, which
/// the run would refuse to replace after its first step.
fn check_group_info_files(session: &TrainSession) -> Result<(), RuntimeError> {
    let output = session.config.output();
    let Some(template) = &output.group_info_file else {
        return Ok(());
    };
    for rank in 0..session.devices() {
        let path = crate::group_info::group_info_path(&output.dir, template, rank);
        crate::group_info::check_replaceable(&path)?;
    }
    Ok(())
}

/// `output.group_info_file`: this process's ranks' group-info files, which the ranks write
/// after their first step (creating their directories), can be written (checked once
/// `output.dir` exists).
fn check_group_info_dirs(session: &TrainSession, here: &RanksHere) -> Result<(), RuntimeError> {
    let output = session.config.output();
    let Some(template) = &output.group_info_file else {
        return Ok(());
    };
    // One file per directory: the files of one directory are made alike.
    let mut files: Vec<PathBuf> = here
        .ranks
        .iter()
        .map(|&rank| crate::group_info::group_info_path(&output.dir, template, rank))
        .collect();
    files.sort_by(|a, b| a.parent().cmp(&b.parent()));
    files.dedup_by(|a, b| a.parent() == b.parent());
    for file in files {
        check_key_output(
            "output.group_info_file",
            &file,
            PathKind::File,
            "a file to write (each rank writes its group-info file after its first step; missing directories are created)",
        )?;
    }
    Ok(())
}

/// `output.resume_from`: a directory with rank 0's checkpoint file, and the strategy file it
/// is read with, or none for a set of rank 0 alone (read as unsharded). Returns the step the
/// checkpoint was saved at, when the run resumes.
fn check_resume_from(session: &TrainSession) -> Result<Option<u64>, RuntimeError> {
    let Some(from) = session.resume_dir()? else {
        return Ok(None);
    };
    let from = &from;
    let bad = |reason: String| RuntimeError::Config {
        key: "output.resume_from".to_string(),
        reason: format!("{}: {reason}", from.display()),
    };
    if !from.is_dir() {
        return Err(bad(if from.exists() {
            "is not a directory".to_string()
        } else {
            "does not exist".to_string()
        }));
    }
    if crate::resume_check::rank0_file(from).is_none() {
        return Err(bad(
            "holds no checkpoint (no rank_0/ with a .safetensors or .ckpt file)".to_string(),
        ));
    }
    let source = crate::resume_check::resume_source(session, from)?;
    crate::resume_check::check_resumable(session, from, &source).map(Some)
}

/// Creates `dir` (and its missing parents, [`ckpt::CreatedDirs`]) and writes and removes a
/// probe file in it. Returns the directories it created, removed again (deepest first, only
/// while empty) when dropped before [`ckpt::CreatedDirs::keep`]; on failure, removes them and
/// names `output.dir`.
fn prepare_output_dir(dir: &Path) -> Result<ckpt::CreatedDirs, RuntimeError> {
    let bad = |reason: String| RuntimeError::Config {
        key: "output.dir".to_string(),
        reason: format!("{}: {reason}", dir.display()),
    };
    // The missing ancestors, outermost first; one another process of the same job created
    // meanwhile is not ours (nor removed). A failure has removed those already made.
    let created = ckpt::CreatedDirs::create(dir).map_err(|e| match e {
        ckpt::CkptError::Io { path, source, .. } => {
            bad(format!("cannot create {}: {source}", path.display()))
        }
        other => bad(other.to_string()),
    })?;
    if !dir.is_dir() {
        return Err(bad("is not a directory".to_string()));
    }
    crate::paths::probe(dir).map_err(|e| bad(format!("cannot write a file in it: {e}")))?;
    Ok(created)
}

/// An output file a run writes (`what`: "metrics log", "trace"): its directory exists and the
/// file opens for writing (a file the check creates is removed again; an existing one is not
/// truncated).
pub fn check_output_file(what: &str, path: &Path) -> Result<(), RuntimeError> {
    let bad = |reason: String| RuntimeError::Unusable {
        what: what.to_string(),
        path: path.to_path_buf(),
        reason,
    };
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if !parent.is_dir() {
        return Err(bad(if parent.exists() {
            format!("{} is not a directory", parent.display())
        } else {
            format!("its directory {} does not exist", parent.display())
        }));
    }
    if path.is_dir() {
        return Err(bad("is a directory".to_string()));
    }
    // Opening a FIFO for writing waits for a reader: refused before it is opened.
    layout::limits::refuse_pipe(path).map_err(|e| bad(e.to_string()))?;
    let existed = path.exists();
    OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .map_err(|e| bad(format!("cannot be opened for writing: {e}")))?;
    if !existed {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("tessera-preflight-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn output_dir_is_created_and_kept_or_removed() {
        let root = scratch("outdir");
        let dir = root.join("a").join("b");
        prepare_output_dir(&dir).unwrap().keep();
        assert!(dir.is_dir());
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "no probe left");
        let other = root.join("c").join("d");
        drop(prepare_output_dir(&other).unwrap());
        assert!(!root.join("c").exists(), "created directories removed");
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn output_dir_under_a_file_fails_and_leaves_nothing() {
        let root = scratch("underfile");
        std::fs::write(root.join("file"), b"x").unwrap();
        let err = prepare_output_dir(&root.join("file")).unwrap_err();
        assert!(err.to_string().contains("is not a directory"), "{err}");
        let err = prepare_output_dir(&root.join("file").join("out")).unwrap_err();
        assert!(err.to_string().contains("output.dir"), "{err}");
        let left: Vec<_> = std::fs::read_dir(&root).unwrap().collect();
        assert_eq!(left.len(), 1, "only the file remains: {left:?}");
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn metrics_log_needs_an_existing_directory_and_leaves_no_file() {
        let root = scratch("metrics");
        let missing = root.join("missing").join("log.jsonl");
        let err = check_output_file("metrics log", &missing)
            .unwrap_err()
            .to_string();
        assert!(err.contains(&missing.display().to_string()), "{err}");
        assert!(err.contains("does not exist"), "{err}");
        let fine = root.join("log.jsonl");
        check_output_file("metrics log", &fine).unwrap();
        assert!(!fine.exists(), "the check leaves no file behind");
        std::fs::write(&fine, b"kept").unwrap();
        check_output_file("metrics log", &fine).unwrap();
        assert_eq!(std::fs::read(&fine).unwrap(), b"kept", "not truncated");
        assert!(
            check_output_file("metrics log", &root).is_err(),
            "a directory is refused"
        );
        std::fs::remove_dir_all(&root).unwrap();
    }
}
