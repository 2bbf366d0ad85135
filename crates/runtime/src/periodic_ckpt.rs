//! Checkpoints while training (MindSpore's `CheckpointConfig` and `ModelCheckpoint`) and
//! `output.resume_from = "latest"`.
//!
//! Every `output.save_checkpoint_steps` global steps, and whenever `output.save_checkpoint_seconds`
//! have passed since the run started or last saved, the run writes a checkpoint set into
//! `<output.dir>/checkpoint_step_<N>/` (`N` the global step it holds), the same atomic set as the
//! final one ([`ckpt::SetWriter`]: it appears whole or not at all). Each set Tessera writes while
//! training — periodic or final — holds [`TRAIN_STATE_FILE`], the loop's state beside the
//! tensors ([`TrainState`]: global step, optimizer step count, loss scaler, and a sequence
//! number that orders the sets of one directory by when they were committed).
//!
//! After a periodic set commits, the oldest periodic sets beyond `output.keep_checkpoint_max`
//! are removed ([`prune`]): only directories named `checkpoint_step_<N>` whose committed marker
//! lists a [`TRAIN_STATE_FILE`] that says step `N` — sets Tessera recognises as its own — and of
//! each only the entries its marker lists (anything else found inside is left, with the
//! directory). The set just committed is never removed, so at least one whole set remains.
//!
//! `resume_from = "latest"` resolves to the recognised set of `output.dir` (the final set in
//! `output.dir` itself, or a periodic one) committed last ([`latest_set`]).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::error::RuntimeError;

/// The loss scaler's state as a set records it (defined by `exec`, which runs the scaler).
pub use exec::LossScaleState;

/// The file of a checkpoint set that holds the training loop's state ([`TrainState`]).
pub const TRAIN_STATE_FILE: &str = "train_state.json";

/// The name prefix of periodic sets: `checkpoint_step_<N>`.
pub const PERIODIC_PREFIX: &str = "checkpoint_step_";

/// The `format` value of a [`TrainState`].
const FORMAT: &str = "tessera-train-state";

/// The largest [`TRAIN_STATE_FILE`] read: one is a few hundred bytes.
const MAX_STATE_BYTES: u64 = 1 << 20;

/// What a checkpoint set records of the training loop, so a resumed run continues it exactly:
/// the data position and every step-derived random draw follow from `global_step`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainState {
    /// Always `"tessera-train-state"`.
    pub format: String,
    /// Optimizer steps run (the data position: epoch and step within it).
    pub global_step: u64,
    /// Optimizer updates applied (Adam's bias-correction step count); fewer than
    /// `global_step` when the loss scaler skipped overflowing steps.
    pub optimizer_steps: u64,
    /// The loss scaler, when the run has one.
    pub loss_scale: Option<LossScaleState>,
    /// Orders the sets of one output directory by commit: one more than the largest found
    /// there when the set was written.
    pub sequence: u64,
}

impl TrainState {
    /// The state of a run at `global_step`.
    pub fn new(
        global_step: u64,
        optimizer_steps: u64,
        loss_scale: Option<LossScaleState>,
        sequence: u64,
    ) -> TrainState {
        TrainState {
            format: FORMAT.to_string(),
            global_step,
            optimizer_steps,
            loss_scale,
            sequence,
        }
    }

    /// The JSON text written as [`TRAIN_STATE_FILE`].
    pub fn to_json_bytes(&self) -> Vec<u8> {
        let mut bytes = serde_json::to_vec_pretty(self).unwrap_or_default();
        bytes.push(b'\n');
        bytes
    }

    /// Reads `dir`'s [`TRAIN_STATE_FILE`]: `Ok(None)` when there is none (a checkpoint written
    /// before it existed, or by another tool), an error naming the file when it is malformed
    /// or larger than 1 MiB.
    pub fn read(dir: &Path) -> Result<Option<TrainState>, RuntimeError> {
        use std::io::Read;
        let path = dir.join(TRAIN_STATE_FILE);
        let file = match std::fs::File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(RuntimeError::Io { path, source }),
        };
        let mut bytes = Vec::new();
        if let Err(source) = file.take(MAX_STATE_BYTES + 1).read_to_end(&mut bytes) {
            return Err(RuntimeError::Io { path, source });
        }
        if bytes.len() as u64 > MAX_STATE_BYTES {
            return Err(RuntimeError::Mismatch {
                what: path.display().to_string(),
                expected: format!("a training state (JSON) of at most {MAX_STATE_BYTES} bytes"),
                got: "a larger file".to_string(),
            });
        }
        match serde_json::from_slice::<TrainState>(&bytes) {
            Ok(state) if state.format == FORMAT => Ok(Some(state)),
            Ok(state) => Err(RuntimeError::Mismatch {
                what: path.display().to_string(),
                expected: format!("format \"{FORMAT}\""),
                got: format!("\"{}\"", state.format),
            }),
            Err(e) => Err(RuntimeError::Mismatch {
                what: path.display().to_string(),
                expected: "a training state (JSON)".to_string(),
                got: e.to_string(),
            }),
        }
    }
}

/// Where the periodic set of global step `step` goes.
pub fn periodic_set_dir(output_dir: &Path, step: u64) -> PathBuf {
    output_dir.join(format!("{PERIODIC_PREFIX}{step}"))
}

/// The step of a periodic set's directory name (`checkpoint_step_<N>`).
pub(crate) fn step_of_name(name: &str) -> Option<u64> {
    name.strip_prefix(PERIODIC_PREFIX)
        .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|n| n.parse().ok())
}

/// A committed set of an output directory that Tessera wrote while training.
#[derive(Debug, Clone, PartialEq)]
pub struct RecognisedSet {
    /// The set's directory.
    pub dir: PathBuf,
    /// Its training state.
    pub state: TrainState,
    /// Whether it is a periodic set (`checkpoint_step_<N>/`) rather than the final one.
    pub periodic: bool,
    /// The top-level entries its marker lists (what removing it removes).
    entries: Vec<String>,
}

/// `dir` as a recognised set: committed (its marker agrees with its files), written by
/// training, holding a [`TRAIN_STATE_FILE`]; for a periodic set, one whose state says the step
/// its name says.
fn recognise(dir: &Path, periodic_step: Option<u64>) -> Option<RecognisedSet> {
    let marker = ckpt::check_set(dir).ok().flatten()?;
    if marker.tool != "train" || !marker.entries.iter().any(|e| e == TRAIN_STATE_FILE) {
        return None;
    }
    let state = TrainState::read(dir).ok().flatten()?;
    if periodic_step.is_some_and(|n| n != state.global_step) {
        return None;
    }
    Some(RecognisedSet {
        dir: dir.to_path_buf(),
        state,
        periodic: periodic_step.is_some(),
        entries: marker.entries,
    })
}

/// Every recognised set of `output_dir` (the final set in the directory itself and the periodic
/// ones in it), oldest commit first.
pub fn recognised_sets(output_dir: &Path) -> Vec<RecognisedSet> {
    let mut sets: Vec<RecognisedSet> = recognise(output_dir, None).into_iter().collect();
    if let Ok(entries) = std::fs::read_dir(output_dir) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(step) = step_of_name(&name) {
                sets.extend(recognise(&entry.path(), Some(step)));
            }
        }
    }
    sets.sort_by_key(|s| (s.state.sequence, s.state.global_step));
    sets
}

/// The recognised set of `output_dir` committed last (`resume_from = "latest"`), if any.
pub fn latest_set(output_dir: &Path) -> Option<PathBuf> {
    recognised_sets(output_dir).pop().map(|s| s.dir)
}

/// The sequence number of the next set written in `output_dir`.
pub fn next_sequence(output_dir: &Path) -> u64 {
    recognised_sets(output_dir)
        .last()
        .map_or(1, |s| s.state.sequence + 1)
}

/// Removes the periodic sets of `output_dir` beyond the `keep` committed last, never `written`
/// (the set just committed) and never fewer than one. Returns the directories removed.
pub fn prune(output_dir: &Path, keep: usize, written: &Path) -> Result<Vec<PathBuf>, RuntimeError> {
    finish_removals(output_dir);
    let mut periodic: Vec<RecognisedSet> = recognised_sets(output_dir)
        .into_iter()
        .filter(|s| s.periodic)
        .collect();
    let keep = keep.max(1);
    let mut removed = Vec::new();
    while periodic.len() > keep {
        let oldest = periodic.remove(0);
        if oldest.dir == written {
            periodic.push(oldest);
            continue;
        }
        remove_set(output_dir, &oldest)?;
        removed.push(oldest.dir);
    }
    Ok(removed)
}

/// The hidden name a set is moved to while it is removed, so no reader sees it half removed.
fn retiring_path(output_dir: &Path, name: &str) -> PathBuf {
    output_dir.join(format!(".{name}.tessera-retiring"))
}

/// Moves `set` aside and removes what its marker lists, then the marker and the directory
/// (left when it still holds anything else).
fn remove_set(output_dir: &Path, set: &RecognisedSet) -> Result<(), RuntimeError> {
    let name = set.dir.file_name().unwrap_or_default().to_string_lossy();
    let aside = retiring_path(output_dir, &name);
    std::fs::rename(&set.dir, &aside).map_err(|source| RuntimeError::Io {
        path: set.dir.clone(),
        source,
    })?;
    remove_listed(&aside, &set.entries);
    Ok(())
}

/// Removes `entries` of `dir`, then its marker, then `dir` if empty.
fn remove_listed(dir: &Path, entries: &[String]) {
    for entry in entries {
        let path = dir.join(entry);
        let _ = match path.is_dir() && !path.is_symlink() {
            true => std::fs::remove_dir_all(&path),
            false => std::fs::remove_file(&path),
        };
    }
    let _ = std::fs::remove_file(dir.join(ckpt::SET_MARKER));
    let _ = std::fs::remove_dir(dir);
}

/// Finishes removals a killed run left half done: a `.checkpoint_step_<N>.tessera-retiring`
/// directory still holding its marker has the entries the marker lists removed.
fn finish_removals(output_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(output_dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(inner) = name
            .strip_prefix('.')
            .and_then(|n| n.strip_suffix(".tessera-retiring"))
        else {
            continue;
        };
        if step_of_name(inner).is_none() {
            continue;
        }
        let dir = entry.path();
        if let Ok(Some(marker)) = ckpt::SetMarker::read(&dir) {
            if marker.tool == "train" {
                remove_listed(&dir, &marker.entries);
            }
        } else {
            let _ = std::fs::remove_dir(&dir);
        }
    }
}

/// When the next periodic set is due.
#[derive(Debug)]
pub struct SaveSchedule {
    every_steps: Option<u64>,
    every: Option<Duration>,
    last: Instant,
}

impl SaveSchedule {
    /// The schedule of `output.save_checkpoint_steps` and `output.save_checkpoint_seconds`
    /// (`None` when neither is set), its clock started now.
    pub fn new(every_steps: Option<u64>, every_seconds: Option<u64>) -> Option<SaveSchedule> {
        (every_steps.is_some() || every_seconds.is_some()).then(|| SaveSchedule {
            every_steps,
            every: every_seconds.map(Duration::from_secs),
            last: Instant::now(),
        })
    }

    /// Whether a set is due after `global_step` by the step count (the same on every rank).
    pub fn due_by_steps(&self, global_step: u64) -> bool {
        self.every_steps
            .is_some_and(|n| global_step.is_multiple_of(n))
    }

    /// Whether a set is due by this rank's clock (ranks must agree before acting on it).
    pub fn due_by_time(&self) -> bool {
        self.every.is_some_and(|d| self.last.elapsed() >= d)
    }

    /// Whether the schedule has a time interval (whose decision the ranks must share).
    pub fn timed(&self) -> bool {
        self.every.is_some()
    }

    /// Whether a set is due after `global_step`: by the step count, or by the clock of any
    /// rank of `world` (one all-reduce per step, only when the schedule is timed), so every
    /// rank decides alike.
    pub fn due(
        &self,
        global_step: u64,
        world: &dyn comm::Communicator,
    ) -> Result<bool, RuntimeError> {
        if self.due_by_steps(global_step) {
            return Ok(true);
        }
        if !self.timed() {
            return Ok(false);
        }
        let mine = f32::from(u8::from(self.due_by_time()));
        let mut due = tensor::Tensor::from_vec(&[1], vec![mine])?;
        world.all_reduce(&mut due, comm::ReduceOp::Max)?;
        Ok(due.to_f64_vec().first().copied().unwrap_or(0.0) > 0.0)
    }

    /// Restarts the clock (after a set is saved).
    pub fn saved(&mut self) {
        self.last = Instant::now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes a committed training set at `dir` holding `state` (and a rank file).
    fn write_set(dir: &Path, state: &TrainState) {
        let w = ckpt::SetWriter::begin(dir, "train", true).unwrap();
        std::fs::create_dir_all(w.staging().join("rank_0")).unwrap();
        std::fs::write(w.staging().join("rank_0/checkpoint_0.safetensors"), b"x").unwrap();
        std::fs::write(w.staging().join(TRAIN_STATE_FILE), state.to_json_bytes()).unwrap();
        w.commit().unwrap();
    }

    fn state(step: u64, sequence: u64) -> TrainState {
        TrainState::new(step, step, None, sequence)
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn pruning_keeps_the_newest_commits_and_never_the_foreign() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path();
        for (i, step) in [10u64, 20, 30].iter().enumerate() {
            write_set(&periodic_set_dir(out, *step), &state(*step, i as u64 + 1));
        }
        // Not Tessera's: a user's directory under the same name pattern, a set whose state
        // contradicts its name, and a user's file inside a set.
        std::fs::create_dir(out.join("checkpoint_step_5")).unwrap();
        std::fs::write(out.join("checkpoint_step_5/notes"), b"mine").unwrap();
        write_set(&periodic_set_dir(out, 7), &state(8, 0));
        std::fs::write(out.join("checkpoint_step_10/mine.txt"), b"mine").unwrap();
        let written = periodic_set_dir(out, 30);
        let removed = prune(out, 1, &written).unwrap();
        assert_eq!(removed.len(), 2, "{removed:?}");
        assert_eq!(
            names(out),
            vec![
                ".checkpoint_step_10.tessera-retiring",
                "checkpoint_step_30",
                "checkpoint_step_5",
                "checkpoint_step_7",
            ]
        );
        // The user's file is all that is left of the removed set.
        assert_eq!(
            names(&out.join(".checkpoint_step_10.tessera-retiring")),
            vec!["mine.txt"]
        );
        assert_eq!(latest_set(out), Some(written.clone()));
        assert!(ckpt::check_set(&written).unwrap().is_some());
    }

    #[test]
    fn the_set_just_written_survives_even_when_others_are_newer_by_step() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path();
        // A resumed run re-writes step 20 after an earlier run's step 40: the commit order,
        // not the step, says which is newer.
        write_set(&periodic_set_dir(out, 40), &state(40, 1));
        write_set(&periodic_set_dir(out, 20), &state(20, 2));
        let written = periodic_set_dir(out, 20);
        prune(out, 1, &written).unwrap();
        assert_eq!(names(out), vec!["checkpoint_step_20"]);
        assert_eq!(latest_set(out), Some(written));
        assert_eq!(next_sequence(out), 3);
    }

    #[test]
    fn latest_takes_the_final_set_when_it_committed_last_and_none_when_nothing_is_ours() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("run");
        assert_eq!(latest_set(&out), None);
        std::fs::create_dir(&out).unwrap();
        std::fs::create_dir(out.join("checkpoint_step_3")).unwrap();
        assert_eq!(latest_set(&out), None);
        write_set(&periodic_set_dir(&out, 3), &state(3, 1));
        write_set(&out, &state(4, 2));
        assert_eq!(latest_set(&out), Some(out.clone()));
        write_set(&periodic_set_dir(&out, 5), &state(5, 3));
        assert_eq!(latest_set(&out), Some(periodic_set_dir(&out, 5)));
    }

    #[test]
    fn an_interrupted_removal_is_finished_by_the_next_prune() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path();
        write_set(&periodic_set_dir(out, 1), &state(1, 1));
        write_set(&periodic_set_dir(out, 2), &state(2, 2));
        // Killed just after moving step 1 aside.
        std::fs::rename(
            periodic_set_dir(out, 1),
            retiring_path(out, "checkpoint_step_1"),
        )
        .unwrap();
        assert_eq!(latest_set(out), Some(periodic_set_dir(out, 2)));
        prune(out, 5, &periodic_set_dir(out, 2)).unwrap();
        assert_eq!(names(out), vec!["checkpoint_step_2"]);
    }

    /// A training state that is not one, or is too large to be one, is refused naming the file.
    #[test]
    fn a_malformed_or_oversized_training_state_is_refused_naming_the_file() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join(TRAIN_STATE_FILE);
        assert_eq!(TrainState::read(tmp.path()).unwrap(), None);
        let state = TrainState::new(7, 5, None, 2);
        let other = TrainState {
            format: "other".to_string(),
            ..state.clone()
        }
        .to_json_bytes();
        let oversized = vec![b' '; MAX_STATE_BYTES as usize + 1];
        for (bytes, says) in [
            (
                &b"{\"format\": \"tessera-train-state\", \"global"[..],
                "a training state",
            ),
            (&other[..], "tessera-train-state"),
            (&oversized[..], "at most"),
        ] {
            std::fs::write(&path, bytes).unwrap();
            let err = TrainState::read(tmp.path()).unwrap_err().to_string();
            assert!(
                err.contains(&path.display().to_string()) && err.contains(says),
                "{err}"
            );
        }
        std::fs::write(&path, state.to_json_bytes()).unwrap();
        assert_eq!(TrainState::read(tmp.path()).unwrap(), Some(state));
    }

    #[test]
    fn schedules_by_steps_and_time() {
        assert!(SaveSchedule::new(None, None).is_none());
        let s = SaveSchedule::new(Some(3), None).unwrap();
        assert_eq!(
            (1..=7).filter(|&n| s.due_by_steps(n)).collect::<Vec<_>>(),
            vec![3, 6]
        );
        assert!(!s.timed() && !s.due_by_time());
        let mut t = SaveSchedule::new(None, Some(0)).unwrap();
        assert!(t.timed() && t.due_by_time() && !t.due_by_steps(5));
        t.saved();
        assert!(t.due_by_time());
    }
}
