//! Checkpoints of a session: every rank's shards saved as one committed set (the final one, and
//! periodic ones), and resuming from a set saved under any strategy.

use std::path::{Path, PathBuf};

use comm::Communicator;
use exec::{state_checkpoint_name, LossScaler, MasterWeights, Optimizer, RankExecutor};
use layout::TensorLayout;
use tensor::Tensor;

use super::run::RankRun;
use super::{SessionData, TrainSession, GLOBAL_STEP, MASTER_WEIGHT};
use crate::config::ResumeFrom;
use crate::error::RuntimeError;
use crate::generate::MODEL_FILE;
use crate::periodic_ckpt::{periodic_set_dir, LossScaleState, SaveSchedule, TrainState};

/// What a rank saves at the end of a run.
pub(super) struct SavedState<'a> {
    exec: &'a RankExecutor,
    optimizer: &'a Optimizer,
    /// Mixed precision's f32 master pieces, saved beside the half-precision weights.
    master: Option<&'a MasterWeights>,
    trainable: &'a [usize],
    global_step: u64,
    /// The loss scaler, continued by a resume.
    scaler: Option<&'a LossScaler>,
}

/// What a resume restores besides the parameters and optimizer state: the global step, the
/// mixed-precision master pieces and the loss scaler's state.
pub(super) type Resumed = (u64, Vec<Option<Tensor>>, Option<LossScaleState>);

/// Which checkpoint set a save writes.
#[derive(Debug, Clone, Copy)]
enum SetTarget<'p> {
    /// The run's set in `output.dir`, opened before the ranks start.
    Final,
    /// A periodic set at this directory (`output.save_checkpoint_steps` / `_seconds`).
    Periodic(&'p Path),
}

/// `<id>\n<staging path>` as bytes.
fn encode_staging(staging: &Path, id: &str) -> Vec<u8> {
    let mut out = id.as_bytes().to_vec();
    out.push(b'\n');
    out.extend_from_slice(std::os::unix::ffi::OsStrExt::as_bytes(staging.as_os_str()));
    out
}

fn decode_staging(bytes: &[u8]) -> Option<(PathBuf, String)> {
    use std::os::unix::ffi::OsStrExt;
    let cut = bytes.iter().position(|&b| b == b'\n')?;
    let id = std::str::from_utf8(&bytes[..cut]).ok()?;
    // The path may be any bytes (Unix paths need not be UTF-8).
    let path = std::ffi::OsStr::from_bytes(&bytes[cut + 1..]);
    Some((PathBuf::from(path), id.to_string()))
}

/// Whether any rank of `world` says `flag` (an all-reduce of it, so every rank decides alike).
pub(super) fn any_rank(world: &dyn Communicator, flag: bool) -> Result<bool, RuntimeError> {
    let mut flag = Tensor::from_vec(&[1], vec![f32::from(u8::from(flag))])?;
    world.all_reduce(&mut flag, comm::ReduceOp::Max)?;
    Ok(flag.to_f64_vec().first().copied().unwrap_or(1.0) > 0.0)
}

/// Broadcasts `bytes` from rank 0 to every rank (its length first).
fn share_bytes(world: &dyn Communicator, bytes: &mut Vec<u8>) -> Result<(), RuntimeError> {
    let mut len = (bytes.len() as u64).to_le_bytes();
    world.broadcast_bytes(&mut len, 0)?;
    let len = u64::from_le_bytes(len);
    if len > 1 << 20 {
        return Err(RuntimeError::CheckpointSet {
            rank: world.rank(),
            reason: format!("a {len}-byte staging path is not plausible"),
        });
    }
    bytes.resize(len as usize, 0);
    world.broadcast_bytes(bytes, 0)?;
    Ok(())
}

impl RankRun {
    /// What this rank saves now.
    pub(super) fn saved_state(&self) -> SavedState<'_> {
        SavedState {
            exec: &self.exec,
            optimizer: &self.optimizer,
            master: self.master.as_ref(),
            trainable: &self.trainable,
            global_step: self.global_step,
            scaler: self.scaler.as_ref(),
        }
    }
}

impl TrainSession {
    /// Opens the checkpoint set of the run, when it saves one: takes the output directory's
    /// lock (a second run into the same directory fails here, naming this one) and creates the
    /// staging directory beside it, so an unwritable output fails before any rank starts. The
    /// process that runs rank 0 calls this; [`TrainSession::run_rank`] opens it late otherwise.
    pub fn open_checkpoint_set(&self) -> Result<(), RuntimeError> {
        let Some(dir) = self.checkpoint_dir() else {
            return Ok(());
        };
        let mut slot = self.set_slot();
        if slot.is_none() {
            *slot = Some(ckpt::SetWriter::begin(dir, "train", true)?);
        }
        Ok(())
    }

    fn set_slot(&self) -> std::sync::MutexGuard<'_, Option<ckpt::SetWriter>> {
        self.checkpoint_set
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Where checkpoints and strategy files go, when saving is on.
    pub(super) fn checkpoint_dir(&self) -> Option<&Path> {
        let out = self.config.output();
        out.save_checkpoint.then_some(out.dir.as_path())
    }

    /// Whether checkpoints (and the strategy file describing them) hold parameter `p`: every
    /// trainable parameter, and the non-trainable ones when
    /// `parallel.strategy_file_only_for_trainable_params` is false (MindSpore's
    /// `stra_file_only_trainable_params`: its strategy file lists trainable parameters only
    /// unless told otherwise). A tensor the strategy file does not describe cannot be converted
    /// or resumed, so the rank files hold exactly what the strategy file lists.
    /// A shared parameter's copies on later pipeline stages are never checkpointed: its owner
    /// is, and a resume loads the owner's tensor into every copy.
    pub(super) fn checkpointed(&self, p: &parallel::ProgramParam) -> bool {
        (p.trainable || !self.config.strategy_file_only_for_trainable_params())
            && parallel::pipeline::shared_copy_of(&p.name).is_none()
    }

    /// Saves a periodic checkpoint set (`output.save_checkpoint_steps` / `_seconds`) when
    /// `schedule` says one is due at the step `run` has reached.
    pub(super) fn save_if_due(
        &self,
        run: &mut RankRun,
        schedule: &mut SaveSchedule,
    ) -> Result<(), RuntimeError> {
        if !schedule.due(run.global_step, run.world.as_ref())? {
            return Ok(());
        }
        run.exec.materialize_parameters()?;
        let dir = periodic_set_dir(&self.config.output().dir, run.global_step);
        let target = SetTarget::Periodic(&dir);
        self.save_checkpoint_set(run.world.as_ref(), &run.saved_state(), target)?;
        schedule.saved();
        Ok(())
    }

    /// Saves the run's final checkpoint set into `output.dir`, when saving is on.
    pub(super) fn save_final(&self, run: &RankRun) -> Result<(), RuntimeError> {
        if self.checkpoint_dir().is_some() {
            self.save_checkpoint_set(run.world.as_ref(), &run.saved_state(), SetTarget::Final)?;
        }
        Ok(())
    }

    /// Saves the run's checkpoint as one set: rank 0 shares the staging directory, every rank
    /// writes `rank_<r>/checkpoint_<r>.safetensors` into it (rank 0 also the strategy files),
    /// the ranks agree that every write succeeded, and rank 0 commits the set. A rank that
    /// fails to write makes every rank fail, and nothing is committed.
    fn save_checkpoint_set(
        &self,
        world: &dyn Communicator,
        saved: &SavedState<'_>,
        target: SetTarget<'_>,
    ) -> Result<(), RuntimeError> {
        let rank = world.rank();
        let mut shared = Vec::new();
        let mut writer = None;
        if rank == 0 {
            let opened = match target {
                SetTarget::Final => self.open_checkpoint_set().map(|()| self.set_slot().take()),
                SetTarget::Periodic(dir) => ckpt::SetWriter::begin(dir, "train", true)
                    .map(Some)
                    .map_err(RuntimeError::from),
            };
            if let Ok(Some(set)) = &opened {
                shared = encode_staging(set.staging(), set.id());
            }
            // An empty message tells the other ranks that rank 0 could not open the set.
            share_bytes(world, &mut shared)?;
            writer = opened?;
        } else {
            share_bytes(world, &mut shared)?;
        }
        let Some((staging, id)) = decode_staging(&shared) else {
            return Err(RuntimeError::CheckpointSet {
                rank: 0,
                reason: "could not open the checkpoint set".to_string(),
            });
        };
        let written = self.save_rank(saved, &staging, &id, rank, rank == 0);
        let failed = any_rank(world, written.is_err())?;
        written?;
        if failed {
            // Dropping the writer removes the staging directory.
            drop(writer);
            return Err(RuntimeError::PeerWriteFailed {
                rank,
                reason: "another rank failed to write its checkpoint; the set was not committed (the previous checkpoint is unchanged)".to_string(),
            });
        }
        if let Some(set) = writer {
            set.commit()?;
            if let SetTarget::Periodic(dir) = target {
                let out = self.config.output();
                crate::periodic_ckpt::prune(&out.dir, out.keep_checkpoint_max, dir)?;
            }
        }
        Ok(())
    }

    /// Writes this rank's checkpoint `rank_<r>/checkpoint_<r>.safetensors` into the staging
    /// directory: its shards of the checkpointed parameters, its optimizer state shards and the
    /// step counter; with `side_files` (rank 0 of a set) also the strategy files, the training
    /// state and the model description.
    pub(super) fn save_rank(
        &self,
        saved: &SavedState<'_>,
        staging: &Path,
        set_id: &str,
        rank: usize,
        side_files: bool,
    ) -> Result<(), RuntimeError> {
        let step = Tensor::from_vec(&[1], vec![saved.global_step as i32])?;
        let mut names: Vec<String> = Vec::new();
        let mut tensors: Vec<&Tensor> = Vec::new();
        for (i, p) in self.train.params.iter().enumerate() {
            if self.checkpointed(p) && saved.exec.holds_param(i) {
                names.push(p.name.clone());
                tensors.push(saved.exec.param(i));
            }
        }
        for (k, &i) in saved.trainable.iter().enumerate() {
            // A shared parameter's owner saves its state; its copies hold the same.
            if !self.checkpointed(&self.train.params[i]) {
                continue;
            }
            for (state, t) in saved.optimizer.state(k)? {
                names.push(state_checkpoint_name(state, &self.train.params[i].name));
                tensors.push(t);
            }
            if let Some(master) = saved.master {
                names.push(state_checkpoint_name(
                    MASTER_WEIGHT,
                    &self.train.params[i].name,
                ));
                tensors.push(master.piece(k));
            }
        }
        names.push(GLOBAL_STEP.to_string());
        tensors.push(&step);
        let pairs: Vec<(&str, &Tensor)> = names.iter().map(String::as_str).zip(tensors).collect();
        ckpt::save_rank_checkpoint_in_set(staging, set_id, rank, &pairs)?;
        if side_files {
            self.save_strategy_files(staging)?;
            let state = crate::periodic_ckpt::TrainState::new(
                saved.global_step,
                saved.optimizer.step_count(),
                saved.scaler.map(LossScaler::state),
                crate::periodic_ckpt::next_sequence(&self.config.output().dir),
            );
            ckpt::save_side_file(
                &staging.join(crate::periodic_ckpt::TRAIN_STATE_FILE),
                &state.to_json_bytes(),
                true,
            )?;
            if let SessionData::Text(text) = &self.data {
                let saved = text.saved_model(&self.config)?;
                let mut bytes = serde_json::to_vec_pretty(&saved.to_json()).map_err(|e| {
                    RuntimeError::Mismatch {
                        what: "the model description".to_string(),
                        expected: "JSON".to_string(),
                        got: e.to_string(),
                    }
                })?;
                bytes.push(b'\n');
                ckpt::save_side_file(&staging.join(MODEL_FILE), &bytes, true)?;
            }
        }
        Ok(())
    }

    /// Loads this rank's checkpointed parameters (non-trainable ones only with
    /// `strategy_file_only_for_trainable_params = false`; otherwise they keep their
    /// initialisation) and optimizer state from the checkpoint in `from`, saved under any
    /// strategy (converted on load) or unsharded ([`crate::resume_check::resume_source`]);
    /// returns the step it was saved at. The optimizer's step count is the set's
    /// [`TrainState`]'s (the global step when it has none), and its loss scaler state is
    /// returned for the run's scaler to continue.
    ///
    /// Under mixed precision it also returns, by trainable parameter, the f32 master piece to
    /// continue from: the saved `master_weight.<name>`, or the piece of a weight saved in f32.
    pub(super) fn resume(
        &self,
        exec: &mut RankExecutor,
        optimizer: &mut Optimizer,
        trainable: &[usize],
        from: &Path,
        rank: usize,
    ) -> Result<Resumed, RuntimeError> {
        let source = crate::resume_check::resume_source(self, from)?;
        let states = self.config.optimizer_config().kind.state_names();
        let mut targets: Vec<(String, TensorLayout)> = Vec::new();
        for (i, p) in self.train.params.iter().enumerate() {
            let copy = parallel::pipeline::shared_copy_of(&p.name).is_some();
            if (copy || self.checkpointed(p)) && exec.holds_param(i) {
                targets.push((checkpoint_name(p).to_string(), p.layout.clone()));
            }
        }
        let masters_wanted = self.config.train().precision.has_master_weights();
        let saved_names: Vec<String> = match masters_wanted {
            true => crate::resume_check::saved_names(from, &source)?,
            false => Vec::new(),
        };
        for &i in trainable {
            let p = &self.train.params[i];
            let state_layout = p.optimizer_shard().map_or(&p.layout, |shard| &shard.layout);
            for s in states {
                targets.push((
                    state_checkpoint_name(s, checkpoint_name(p)),
                    state_layout.clone(),
                ));
            }
            let master = state_checkpoint_name(MASTER_WEIGHT, checkpoint_name(p));
            if saved_names.contains(&master) {
                targets.push((master, state_layout.clone()));
            }
        }
        let mut masters: Vec<Option<Tensor>> = vec![None; trainable.len()];
        let asked: Vec<(&str, &TensorLayout)> =
            targets.iter().map(|(n, l)| (n.as_str(), l)).collect();
        // One tensor in memory at a time beside the executor's own buffers (all at once, a
        // resume held a second copy of the rank's parameters and optimizer state).
        ckpt::for_each_rank_tensor(from, source.as_ckpt(), rank, &asked, |name, tensor| {
            // Training stops at a non-finite loss, so a saved tensor holds none: one here is
            // damage (a file changed in place keeps the size the set marker checks).
            if !exec::all_finite(&tensor) {
                return Err(RuntimeError::Data {
                    path: from.to_path_buf(),
                    reason: format!(
                        "tensor {name:?} (the piece rank {rank} resumes) holds a NaN or infinite \
                         value: the checkpoint is damaged"
                    ),
                });
            }
            let held = |(i, p): &(usize, &parallel::ProgramParam)| {
                checkpoint_name(p) == name && exec.holds_param(*i)
            };
            if let Some((i, _)) = self.train.params.iter().enumerate().find(held) {
                let want = exec.param_dtype(i);
                // Weights saved in f32 are the masters of a mixed-precision resume.
                if let Some(k) = trainable.iter().position(|&t| t == i) {
                    if masters_wanted && tensor.dtype() == tensor::DType::F32 {
                        let piece = exec.optimizer_piece(i);
                        masters[k] = Some(exec::f32_piece(
                            &tensor,
                            piece.param_offset,
                            &piece.shape,
                            1.0,
                        )?);
                    }
                }
                let values = match tensor.dtype() == want {
                    true => tensor,
                    false => tensor.to_dtype(want),
                };
                exec.set_param(i, values)?;
                return Ok(());
            }
            for (k, &i) in trainable.iter().enumerate() {
                let param = checkpoint_name(&self.train.params[i]);
                for s in states {
                    if state_checkpoint_name(s, param) == name {
                        optimizer.load_state(k, s, &tensor)?;
                    }
                }
                if state_checkpoint_name(MASTER_WEIGHT, param) == name {
                    masters[k] = Some(tensor.to_dtype(tensor::DType::F32));
                }
            }
            Ok::<(), RuntimeError>(())
        })?;
        let step = crate::resume_check::saved_step(from);
        let state = TrainState::read(from)?;
        optimizer.set_step_count(state.as_ref().map_or(step, |s| s.optimizer_steps));
        Ok((step, masters, state.and_then(|s| s.loss_scale)))
    }

    /// The checkpoint directory this run resumes from: `output.resume_from`'s, or for
    /// `"latest"` the set of `output.dir` committed last
    /// ([`crate::periodic_ckpt::latest_set`], resolved once per process); an error naming the
    /// key when `"latest"` finds none.
    pub fn resume_dir(&self) -> Result<Option<PathBuf>, RuntimeError> {
        let out = self.config.output();
        let dir = match &out.resume_from {
            None => return Ok(None),
            Some(ResumeFrom::Dir(dir)) => return Ok(Some(dir.clone())),
            Some(ResumeFrom::Latest) => self
                .latest
                .get_or_init(|| crate::periodic_ckpt::latest_set(&out.dir)),
        };
        match dir {
            Some(dir) => Ok(Some(dir.clone())),
            None => Err(RuntimeError::Config {
                key: "output.resume_from".to_string(),
                reason: format!(
                    "\"latest\": {} holds no committed checkpoint set of a training run (its final set or a `{}<N>/` set, each with {}); name a checkpoint directory, or train without output.resume_from first",
                    out.dir.display(),
                    crate::periodic_ckpt::PERIODIC_PREFIX,
                    crate::periodic_ckpt::TRAIN_STATE_FILE
                ),
            }),
        }
    }
}

/// The name `p`'s values are saved and resumed under: its own, or for a copy of a parameter
/// shared by pipeline stages its owner's.
fn checkpoint_name(p: &parallel::ProgramParam) -> &str {
    parallel::pipeline::shared_copy_of(&p.name).map_or(p.name.as_str(), |c| c.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staging_paths_cross_ranks_whatever_their_bytes() {
        use std::os::unix::ffi::OsStrExt;
        let path = Path::new(std::ffi::OsStr::from_bytes(
            b"/tmp/r\xffun/.x.tessera-staging-1",
        ));
        let bytes = encode_staging(path, "0123456789abcdef");
        assert_eq!(
            decode_staging(&bytes),
            Some((path.to_path_buf(), "0123456789abcdef".to_string()))
        );
        assert_eq!(decode_staging(b""), None);
    }
}
