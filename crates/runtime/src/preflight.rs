//! Checks before any rank starts.
//!
//! Whatever can be found wrong from the configuration, the data headers and the file system is
//! found here, at once, before a rank runs: a run must not train for minutes, or wait for a
//! collective's timeout, to report that its metrics log cannot be written. The checks:
//!
//! - the predicted memory peak of the ranks this process runs fits the memory available
//!   ([`crate::host_memory`]);
//! - `output.dir` exists or can be created, and a file can be written in it;
//! - the metrics log's directory exists and the log can be opened for writing;
//! - `output.resume_from` is a directory holding a checkpoint (rank 0's file) and the strategy
//!   file it is read with exists, and the checkpoint is this model's with steps left to train
//!   ([`crate::resume_check`]).
//!
//! (The data files themselves are opened, their headers checked and `data.batch_size` checked
//! against the training split, by [`Session::new`].)
//!
//! Nothing is left behind by a failed check: directories created to test `output.dir` are
//! removed again (only those, and only while empty), as is a probe file. After a successful
//! check `output.dir` exists.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};

use crate::error::RuntimeError;
use crate::session::TrainSession;

/// Runs every check of this module for `session`, writing the metrics log at `metrics_log`
/// (when given). Creates `output.dir` when it is missing, and leaves nothing behind on failure.
pub fn check_before_start(
    session: &TrainSession,
    metrics_log: Option<&Path>,
    here: &RanksHere,
) -> Result<(), RuntimeError> {
    crate::elastic::fault::check_fault_rank(session.devices())?;
    check_memory(session, here)?;
    check_resume_from(session)?;
    check_group_info_files(session)?;
    let created = prepare_output_dir(&session.config.output().dir)?;
    if let Some(path) = metrics_log {
        // A failure here removes the output directories just created (when `created` drops).
        check_output_file("metrics log", path)?;
    }
    created.keep();
    Ok(())
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
    let predicted: u64 = here
        .ranks
        .iter()
        .filter_map(|&rank| session.predict_footprint(rank, here.local_backend))
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

/// `output.resume_from`: a directory with rank 0's checkpoint file, and the strategy file.
fn check_resume_from(session: &TrainSession) -> Result<(), RuntimeError> {
    let output = session.config.output();
    let Some(from) = session.resume_dir()? else {
        return Ok(());
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
    let rank0 = ckpt::rank_file_path(from, 0, "checkpoint_", ckpt::Format::Safetensors);
    if !rank0.is_file() {
        return Err(bad(format!(
            "holds no checkpoint (no {})",
            rank0.strip_prefix(from).unwrap_or(&rank0).display()
        )));
    }
    let (key, strategy) = match &output.resume_strategy {
        Some(path) => ("output.resume_strategy", path.clone()),
        None => ("output.resume_from", from.join("strategy.json")),
    };
    if !strategy.is_file() {
        return Err(RuntimeError::Config {
            key: key.to_string(),
            reason: format!(
                "the strategy file {} does not exist (set output.resume_strategy to the \
                 checkpoint's strategy file)",
                strategy.display()
            ),
        });
    }
    crate::resume_check::check_resumable(session, from, &strategy)
}

/// Directories created by a check, removed again (deepest first, only while empty) unless
/// [`keep`](CreatedDirs::keep) is called.
#[derive(Debug)]
#[must_use = "dropping it removes the directories it created"]
struct CreatedDirs(Vec<PathBuf>);

impl CreatedDirs {
    /// Keeps the directories.
    fn keep(mut self) {
        self.0.clear();
    }
}

impl Drop for CreatedDirs {
    fn drop(&mut self) {
        // Deepest first; `remove_dir` refuses a directory that is not empty.
        for dir in self.0.iter().rev() {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// Creates `dir` (and its missing parents) and writes and removes a probe file in it. Returns
/// the directories it created; on failure, removes them and names `output.dir`.
fn prepare_output_dir(dir: &Path) -> Result<CreatedDirs, RuntimeError> {
    let bad = |reason: String| RuntimeError::Config {
        key: "output.dir".to_string(),
        reason: format!("{}: {reason}", dir.display()),
    };
    // The missing ancestors, outermost first.
    let mut missing: Vec<PathBuf> = dir
        .ancestors()
        .take_while(|a| !a.as_os_str().is_empty() && !a.exists())
        .map(Path::to_path_buf)
        .collect();
    missing.reverse();
    let mut created = CreatedDirs(Vec::new());
    for ancestor in missing {
        match std::fs::create_dir(&ancestor) {
            Ok(()) => created.0.push(ancestor),
            // Another process of the same job created it meanwhile.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(bad(format!("cannot create {}: {e}", ancestor.display()))),
        }
    }
    if !dir.is_dir() {
        return Err(bad("is not a directory".to_string()));
    }
    let probe = dir.join(format!(".tessera-write-check-{}", std::process::id()));
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
        .map_err(|e| bad(format!("cannot write a file in it: {e}")))?;
    let _ = std::fs::remove_file(&probe);
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
