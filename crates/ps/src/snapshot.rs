//! A server's snapshot: its partition's weights, optimizer state and version, written
//! atomically (a temporary file renamed over the old one) to `<output.dir>/ps/server_<id>.safetensors`.

use std::path::{Path, PathBuf};

use runtime::{state_checkpoint_name, Optimizer};
use tensor::Tensor;

use crate::error::PsError;

/// The tensor holding the number of steps (sync) or pushes (async) a snapshot has applied.
pub const VERSION_TENSOR: &str = "ps_version";
/// The tensor holding the optimizer's step count.
pub const OPTIMIZER_STEP_TENSOR: &str = "ps_optimizer_step";

/// The snapshot file of server `server_id` in the run directory `output_dir`.
pub fn snapshot_path(output_dir: &Path, server_id: usize) -> PathBuf {
    output_dir
        .join("ps")
        .join(format!("server_{server_id}.safetensors"))
}

/// A server partition's state.
pub struct PartitionState<'a> {
    /// Parameter names, in the optimizer's order.
    pub names: &'a [String],
    /// The weights.
    pub weights: &'a [Tensor],
    /// The optimizer (its state per parameter).
    pub optimizer: &'a Optimizer,
    /// Steps or pushes applied.
    pub version: u64,
}

fn counter(n: u64) -> Result<Tensor, PsError> {
    // Two i32 halves: safetensors' readers here know i32; a u64 does not fit one.
    let halves = vec![(n & 0xffff_ffff) as u32 as i32, (n >> 32) as u32 as i32];
    Tensor::from_vec(&[2], halves).map_err(|e| PsError::tensor(format!("the counter {n}"), e))
}

fn read_counter(t: &Tensor, path: &Path, name: &str) -> Result<u64, PsError> {
    let values = t.to_f64_vec();
    match values.as_slice() {
        [lo, hi] => Ok((*lo as i64 as u32 as u64) | ((*hi as i64 as u32 as u64) << 32)),
        _ => Err(PsError::Snapshot {
            path: path.to_path_buf(),
            rule: format!("{name} has {} values, expected 2", values.len()),
        }),
    }
}

/// Writes `state` to `path` atomically.
pub fn save(path: &Path, state: &PartitionState<'_>) -> Result<(), PsError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| PsError::SnapshotIo {
            path: path.to_path_buf(),
            what: format!("cannot create {}", dir.display()),
            source: Box::new(e),
        })?;
    }
    let version = counter(state.version)?;
    let opt_step = counter(state.optimizer.step_count())?;
    let mut names: Vec<String> = Vec::new();
    let mut tensors: Vec<&Tensor> = Vec::new();
    for (k, (name, w)) in state.names.iter().zip(state.weights).enumerate() {
        names.push(name.clone());
        tensors.push(w);
        for (s, t) in state.optimizer.state(k)? {
            names.push(state_checkpoint_name(s, name));
            tensors.push(t);
        }
    }
    names.push(VERSION_TENSOR.to_string());
    tensors.push(&version);
    names.push(OPTIMIZER_STEP_TENSOR.to_string());
    tensors.push(&opt_step);
    let pairs: Vec<(&str, &Tensor)> = names.iter().map(String::as_str).zip(tensors).collect();
    ckpt::save_safetensors(path, &pairs, true).map_err(|e| PsError::SnapshotIo {
        path: path.to_path_buf(),
        what: "writing".to_string(),
        source: Box::new(e),
    })?;
    Ok(())
}

/// Loads the snapshot at `path` into `weights` and `optimizer` (parameters `names`, whose
/// shapes the weights give); returns its version.
pub fn load(
    path: &Path,
    names: &[String],
    weights: &mut [Tensor],
    optimizer: &mut Optimizer,
) -> Result<u64, PsError> {
    let bad = |rule: String| PsError::Snapshot {
        path: path.to_path_buf(),
        rule,
    };
    let unreadable = |what: String, e: ckpt::CkptError| PsError::SnapshotIo {
        path: path.to_path_buf(),
        what,
        source: Box::new(e),
    };
    let file =
        ckpt::CheckpointFile::open(path).map_err(|e| unreadable("opening".to_string(), e))?;
    let read = |name: &str| {
        file.read_tensor(name)
            .map_err(|e| unreadable(format!("reading {name}"), e))
    };
    for (k, name) in names.iter().enumerate() {
        let t = read(name)?;
        if t.shape() != weights[k].shape() {
            return Err(bad(format!(
                "{name} has shape {:?}, the partition's is {:?}",
                t.shape(),
                weights[k].shape()
            )));
        }
        weights[k] = t.to_dtype(weights[k].dtype());
        for s in optimizer.config().kind.state_names() {
            let state = read(&state_checkpoint_name(s, name))?;
            optimizer.load_state(k, s, &state)?;
        }
    }
    let version = read_counter(&read(VERSION_TENSOR)?, path, VERSION_TENSOR)?;
    let steps = read_counter(&read(OPTIMIZER_STEP_TENSOR)?, path, OPTIMIZER_STEP_TENSOR)?;
    optimizer.set_step_count(steps);
    Ok(version)
}
