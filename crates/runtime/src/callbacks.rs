//! Training callbacks: what the training loop reports after each step, each epoch and at the end.
//!
//! The loop calls, on every rank, [`Callback::on_step_end`] after a step's optimizer update,
//! [`Callback::on_epoch_end`] after an epoch (and its evaluation), and
//! [`Callback::on_train_end`] once. Which callbacks a rank runs is the loop's choice: the
//! loss and metrics are the same on every rank, so [`LossMonitor`] and [`MetricsLog`] belong on
//! rank 0 only; [`LocalNorm`] is per rank by nature.
//!
//! - [`LossMonitor`]: MindSpore's `LossMonitor` line, `epoch: 1 step: 10, loss is 2.2871413`.
//! - [`MetricsLog`]: JSON lines, one per step and one per epoch, flushed as written.
//! - [`LocalNorm`]: MindSpore's `print_local_norm` / `dump_local_norm`: per rank and per
//!   parameter shard, the L2 norm of the local shard of the parameter and of its gradient.
//! - [`CallbackList`]: several callbacks as one, called in order.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::json;
use tensor::{Storage, Tensor};

use crate::error::RuntimeError;

/// One rank's parameter shard as a callback sees it.
#[derive(Debug, Clone, Copy)]
pub struct ShardView<'a> {
    /// The parameter's name (`fc1_weight`).
    pub name: &'a str,
    /// This rank's shard of the parameter.
    pub param: &'a Tensor,
    /// This rank's shard of the parameter's gradient, when the loop still holds it.
    pub grad: Option<&'a Tensor>,
}

/// What a step reports.
#[derive(Debug, Clone, Copy)]
pub struct StepInfo<'a> {
    /// The rank reporting.
    pub rank: usize,
    /// The epoch, from 1.
    pub epoch: usize,
    /// The step within the epoch, from 1.
    pub step_in_epoch: usize,
    /// The step over the whole run (across epochs and resumes), from 1.
    pub global_step: u64,
    /// The loss of the global batch (the same on every rank).
    pub loss: f32,
    /// Wall time of the step, in milliseconds.
    pub step_ms: f64,
    /// The learning rate the step's update used (the schedule's rate for the step; the same
    /// on every rank).
    pub lr: f64,
    /// The global gradient norm of the step, when the loop computed one (gradient clipping).
    pub grad_norm: Option<f64>,
    /// With mixture-of-experts routing: the token choices the step dropped (chosen by the
    /// router, given no slot within an expert's capacity), over the whole batch.
    pub moe_dropped: Option<f64>,
    /// This rank's parameter shards (empty when no callback needs them).
    pub shards: &'a [ShardView<'a>],
}

/// What an epoch reports.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EpochInfo {
    /// The rank reporting.
    pub rank: usize,
    /// The epoch, from 1.
    pub epoch: usize,
    /// The global step at the end of the epoch.
    pub global_step: u64,
    /// Accuracy on the evaluation split, in [0, 1], when the loop evaluated a classifier.
    pub eval_accuracy: Option<f64>,
    /// Mean loss on the validation split, when the loop evaluated a language model.
    pub eval_loss: Option<f64>,
    /// Wall time of the epoch, in milliseconds.
    pub epoch_ms: f64,
}

/// What an evaluation every `train.eval_interval` steps reports.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EvalInfo {
    /// The rank reporting.
    pub rank: usize,
    /// The global step evaluated after.
    pub global_step: u64,
    /// Accuracy on the evaluation split, in [0, 1] (a classifier).
    pub eval_accuracy: Option<f64>,
    /// Mean loss on the validation split (a language model).
    pub eval_loss: Option<f64>,
}

/// What the end of training reports.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TrainEndInfo<'a> {
    /// The rank reporting.
    pub rank: usize,
    /// Epochs run (the last one possibly cut short by `max_steps`).
    pub epochs: usize,
    /// The global step reached.
    pub global_step: u64,
    /// The last step's loss, if a step ran.
    pub last_loss: Option<f32>,
    /// Every rank's memory peaks, by rank (empty for pipelined runs, whose micro-batch
    /// buffers the accounting does not follow).
    pub memory: &'a [parallel::memory::MemoryReport],
}

/// Something the training loop calls as training progresses. Every method defaults to doing
/// nothing; an error stops training.
pub trait Callback: Send {
    /// After a step's optimizer update.
    fn on_step_end(&mut self, _step: &StepInfo<'_>) -> Result<(), RuntimeError> {
        Ok(())
    }

    /// After an epoch (and its evaluation).
    fn on_epoch_end(&mut self, _epoch: &EpochInfo) -> Result<(), RuntimeError> {
        Ok(())
    }

    /// After an evaluation every `train.eval_interval` steps (per-epoch evaluations are
    /// reported by [`Callback::on_epoch_end`]).
    fn on_eval(&mut self, _eval: &EvalInfo) -> Result<(), RuntimeError> {
        Ok(())
    }

    /// Once, when training ends.
    fn on_train_end(&mut self, _end: &TrainEndInfo<'_>) -> Result<(), RuntimeError> {
        Ok(())
    }
}

/// Several callbacks called in order as one; the first error stops the round.
#[derive(Default)]
pub struct CallbackList {
    callbacks: Vec<Box<dyn Callback>>,
}

impl CallbackList {
    /// An empty list.
    pub fn new() -> CallbackList {
        CallbackList::default()
    }

    /// Appends `callback`.
    pub fn push(&mut self, callback: Box<dyn Callback>) {
        self.callbacks.push(callback);
    }

    /// The number of callbacks.
    pub fn len(&self) -> usize {
        self.callbacks.len()
    }

    /// Whether the list is empty.
    pub fn is_empty(&self) -> bool {
        self.callbacks.is_empty()
    }
}

impl Callback for CallbackList {
    fn on_step_end(&mut self, step: &StepInfo<'_>) -> Result<(), RuntimeError> {
        self.callbacks
            .iter_mut()
            .try_for_each(|c| c.on_step_end(step))
    }

    fn on_epoch_end(&mut self, epoch: &EpochInfo) -> Result<(), RuntimeError> {
        self.callbacks
            .iter_mut()
            .try_for_each(|c| c.on_epoch_end(epoch))
    }

    fn on_eval(&mut self, eval: &EvalInfo) -> Result<(), RuntimeError> {
        self.callbacks.iter_mut().try_for_each(|c| c.on_eval(eval))
    }

    fn on_train_end(&mut self, end: &TrainEndInfo<'_>) -> Result<(), RuntimeError> {
        self.callbacks
            .iter_mut()
            .try_for_each(|c| c.on_train_end(end))
    }
}

/// A sink error as a runtime error, naming what was written.
fn sink_error(path: &Path, source: std::io::Error) -> RuntimeError {
    RuntimeError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// MindSpore's `LossMonitor`: prints `epoch: 1 step: 10, loss is 2.2871413` (the loss as its
/// shortest f32 representation, as MindSpore prints a float32 scalar) to a sink.
///
/// Like MindSpore, it prints when at least `per_print_times` global steps have passed since the
/// last print (so every `per_print_times` steps; 0 never prints), and a NaN or infinite loss
/// stops training with [`RuntimeError::InvalidLoss`], printed or not.
pub struct LossMonitor {
    out: Box<dyn Write + Send>,
    /// What `out` is called in a write error (`stdout`).
    out_name: &'static str,
    per_print_times: u64,
    last_print: u64,
}

impl LossMonitor {
    /// A monitor printing to `out` every `per_print_times` steps.
    pub fn new(out: Box<dyn Write + Send>, per_print_times: u64) -> LossMonitor {
        LossMonitor {
            out,
            out_name: "<loss monitor output>",
            per_print_times,
            last_print: 0,
        }
    }

    /// A monitor printing to standard output (a failed write is an error naming stdout).
    pub fn stdout(per_print_times: u64) -> LossMonitor {
        LossMonitor {
            out_name: "stdout",
            ..LossMonitor::new(Box::new(std::io::stdout()), per_print_times)
        }
    }
}

impl Callback for LossMonitor {
    fn on_step_end(&mut self, step: &StepInfo<'_>) -> Result<(), RuntimeError> {
        if !step.loss.is_finite() {
            return Err(RuntimeError::InvalidLoss {
                epoch: step.epoch,
                step: step.step_in_epoch,
                loss: step.loss,
            });
        }
        let due = step.global_step.saturating_sub(self.last_print) >= self.per_print_times;
        if self.per_print_times == 0 || !due {
            return Ok(());
        }
        self.last_print = step.global_step;
        writeln!(
            self.out,
            "epoch: {} step: {}, loss is {}",
            step.epoch, step.step_in_epoch, step.loss
        )
        .and_then(|()| self.out.flush())
        .map_err(|e| sink_error(Path::new(self.out_name), e))
    }
}

/// A count carried as f64 (summed over ranks by an all-reduce) as JSON: an integer when it is
/// one (every count is), else the number.
fn count_json(n: f64) -> serde_json::Value {
    const EXACT: f64 = (1u64 << f64::MANTISSA_DIGITS) as f64;
    match n.fract() == 0.0 && (0.0..=EXACT).contains(&n) {
        true => json!(n as u64),
        false => json!(n),
    }
}

/// JSON lines of training metrics, one object per line, flushed as each is written:
/// per step `{"epoch":1,"loss":2.2871413,"lr":0.001,"ms":1.9,"step":3}` (`step` counts within
/// the epoch, from 1; `lr` is the learning rate the step's update used; a `"grad_norm"` key
/// comes before `"loss"` when the loop computed the global gradient norm, and a
/// `"moe_dropped"` key (the token choices the mixture-of-experts routing dropped) before
/// `"ms"` with MoE layers) and per epoch `{"epoch":1,"eval_accuracy":0.93}` (`null` when the loop
/// did not evaluate), or for a language model `{"epoch":1,"eval_loss":2.31}`.
///
/// **Exact numbers** (issue 17): the f32 step loss is written as the shortest decimal that
/// parses back to the same f32 bits (Rust's `{}` for f32, the `LossMonitor` form:
/// `2.2871413`, never the widened `2.287141323089599`), so two runs' logs are bitwise equal
/// exactly when their losses are, and `text.parse::<f32>()` recovers the bits. A NaN or
/// infinite loss is written as `null` (JSON has no such numbers). f64 values (`ms`,
/// `eval_loss`, `eval_accuracy`) are the shortest f64 decimals.
pub struct MetricsLog {
    path: PathBuf,
    file: File,
    /// Whether this run has written a line: the file is cut just before its first one.
    started: bool,
}

/// Where a line of the log stands in a run: the step (epoch, step in the epoch) it follows,
/// or the global step of an evaluation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct LogPosition {
    epoch: u64,
    step_in_epoch: u64,
}

impl LogPosition {
    /// The position of `line`, a line this log wrote: a step's, the end of an epoch (after its
    /// every step), or `None` for anything else.
    fn of(line: &str) -> Option<LogPosition> {
        let value: serde_json::Value = serde_json::from_str(line).ok()?;
        let epoch = value.get("epoch")?.as_u64()?;
        let step_in_epoch = match value.get("step") {
            Some(step) => step.as_u64()?,
            None => u64::MAX,
        };
        Some(LogPosition {
            epoch,
            step_in_epoch,
        })
    }
}

impl MetricsLog {
    /// Opens (or creates) `path` for writing, creating its parent directories. An existing
    /// file is cut only when the first line is written, so a run that fails before its first
    /// step leaves the previous run's log beside the previous run's checkpoints. A run that
    /// resumes (from a snapshot after an elastic restart, or from `output.resume_from`) keeps
    /// the existing log's lines of the steps before its first one, and the evaluations
    /// before it: the log holds the whole run's history, each step once.
    pub fn create(path: &Path) -> Result<MetricsLog, RuntimeError> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|e| sink_error(parent, e))?;
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| sink_error(path, e))?;
        Ok(MetricsLog {
            path: path.to_path_buf(),
            file,
            started: false,
        })
    }

    /// The file written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn write_line(&mut self, value: serde_json::Value) -> Result<(), RuntimeError> {
        let mut line = value.to_string();
        line.push('\n');
        self.write_str(line)
    }

    /// The length of the existing log's lines that come before `first` (the step this run
    /// starts at, `global_step` its global number): a run's history up to it. Reading stops
    /// at the first line that is not this log's or not before it.
    fn kept_before(&mut self, first: LogPosition, global_step: u64) -> u64 {
        use std::io::{BufRead, BufReader, Seek};
        if first.epoch == 1 && first.step_in_epoch == 1 {
            return 0;
        }
        if self.file.rewind().is_err() {
            return 0;
        }
        let mut kept = 0u64;
        let mut line = String::new();
        let mut reader = BufReader::new(&self.file);
        while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line.ends_with('\n') {
            let before = match LogPosition::of(line.trim_end()) {
                Some(at) => at < first,
                // An evaluation every `eval_interval` steps names its global step.
                None => serde_json::from_str::<serde_json::Value>(line.trim_end())
                    .ok()
                    .and_then(|v| v.get("global_step")?.as_u64())
                    .is_some_and(|g| g < global_step),
            };
            if !before {
                break;
            }
            kept += line.len() as u64;
            line.clear();
        }
        kept
    }

    /// Writes one complete line (with its newline); the first cuts the existing log to the
    /// lines before `first` (see [`MetricsLog::create`]).
    fn write_first_or_next(
        &mut self,
        line: String,
        first: Option<(LogPosition, u64)>,
    ) -> Result<(), RuntimeError> {
        if !self.started {
            use std::io::{Seek, SeekFrom};
            let kept = first.map_or(0, |(at, global)| self.kept_before(at, global));
            self.file
                .set_len(kept)
                .and_then(|()| self.file.seek(SeekFrom::Start(kept)).map(drop))
                .map_err(|e| sink_error(&self.path, e))?;
            self.started = true;
        }
        self.write_str(line)
    }

    /// Writes one complete line (with its newline).
    fn write_str(&mut self, line: String) -> Result<(), RuntimeError> {
        if !self.started {
            return self.write_first_or_next(line, None);
        }
        use std::io::{Seek, SeekFrom};
        // One write per line: a reader tailing the file never sees half a line of ours. A
        // write cut short (a full disk, a file-size limit) is undone: the log is cut back to
        // the end of its last whole line, so it never ends in half a line.
        let end = self
            .file
            .stream_position()
            .map_err(|e| sink_error(&self.path, e))?;
        let written = self
            .file
            .write_all(line.as_bytes())
            .and_then(|()| self.file.flush());
        if let Err(e) = written {
            let _ = self
                .file
                .set_len(end)
                .and_then(|()| self.file.seek(SeekFrom::Start(end)));
            return Err(sink_error(&self.path, e));
        }
        Ok(())
    }
}

impl Callback for MetricsLog {
    fn on_step_end(&mut self, step: &StepInfo<'_>) -> Result<(), RuntimeError> {
        // By hand, keys in the order serde_json's map writes them, because serde_json widens
        // an f32 to f64 and writes that f64's digits.
        let grad_norm = step
            .grad_norm
            .map_or(String::new(), |n| format!("\"grad_norm\":{},", json!(n)));
        let moe_dropped = step.moe_dropped.map_or(String::new(), |n| {
            format!("\"moe_dropped\":{},", count_json(n))
        });
        let line = format!(
            "{{\"epoch\":{},{grad_norm}\"loss\":{},\"lr\":{},{moe_dropped}\"ms\":{},\"step\":{}}}\n",
            step.epoch,
            f32_json(step.loss),
            json!(step.lr),
            json!(step.step_ms),
            step.step_in_epoch
        );
        let at = LogPosition {
            epoch: step.epoch as u64,
            step_in_epoch: step.step_in_epoch as u64,
        };
        self.write_first_or_next(line, Some((at, step.global_step)))
    }

    fn on_epoch_end(&mut self, epoch: &EpochInfo) -> Result<(), RuntimeError> {
        let line = match epoch.eval_loss {
            Some(loss) => json!({"epoch": epoch.epoch, "eval_loss": loss}),
            None => json!({"epoch": epoch.epoch, "eval_accuracy": epoch.eval_accuracy}),
        };
        self.write_line(line)
    }

    /// `{"eval_loss": x, "global_step": n}` (or `eval_accuracy`): an evaluation every
    /// `train.eval_interval` steps.
    fn on_eval(&mut self, eval: &EvalInfo) -> Result<(), RuntimeError> {
        let line = match eval.eval_loss {
            Some(loss) => json!({"global_step": eval.global_step, "eval_loss": loss}),
            None => json!({"global_step": eval.global_step, "eval_accuracy": eval.eval_accuracy}),
        };
        self.write_line(line)
    }

    /// One `{"memory": {"rank": r, …}}` line per rank: its peaks by category.
    fn on_train_end(&mut self, end: &TrainEndInfo<'_>) -> Result<(), RuntimeError> {
        for (rank, report) in end.memory.iter().enumerate() {
            self.write_line(json!({ "memory": exec::memory_json(rank, report) }))?;
        }
        Ok(())
    }
}

/// An f32 as a JSON number: the shortest decimal that parses back to the same bits (Rust's
/// `{}` for f32: `2.2871413`, `0.0000001`, `-0`, `3`), or `null` when it is NaN or infinite.
pub fn f32_json(x: f32) -> String {
    if x.is_finite() {
        x.to_string()
    } else {
        "null".to_string()
    }
}

/// The L2 norm of every element of `t`, accumulated in f64 (integer tensors count as their
/// values).
pub fn l2_norm(t: &Tensor) -> f64 {
    let sum_sq = match t.storage() {
        Storage::F32(v) => v.iter().map(|&x| f64::from(x) * f64::from(x)).sum(),
        Storage::F64(v) => v.iter().map(|&x| x * x).sum(),
        _ => t.to_f64_vec().iter().map(|&x| x * x).sum::<f64>(),
    };
    sum_sq.sqrt()
}

/// Where [`LocalNorm`] reports.
enum LocalNormSink {
    /// Lines to a writer, and what the writer is called in a write error.
    Print(Box<dyn Write + Send>, &'static str),
    Dump(PathBuf),
}

/// MindSpore's `print_local_norm` / `dump_local_norm`: on every rank, for every parameter shard
/// the rank holds, the L2 norm of the local shard of the parameter and, when the loop passes
/// it, of the local shard of its gradient.
///
/// - **print**: one line per norm, `rank 3 step 10 local_norm fc1_weight 1.2345` (the parameter)
///   and `rank 3 step 10 local_grad_norm fc1_weight 0.0123` (its gradient).
/// - **dump**: one JSON file per rank and step, `<dir>/rank_<r>/local_norm_step_<s>.json`,
///   `{"rank": 3, "step": 10, "device_local_norm": 4.5, "device_local_grad_norm": 0.06,
///   "params": [{"name": "fc1_weight", "shape": [16, 128], "local_norm": 1.2345,
///   "local_grad_norm": 0.0123}]}` (`null` without a gradient), written to a temporary file and
///   renamed, so a reader never sees a partial file. The device norms are those of everything
///   the rank holds, `√Σ local_norm²` over its shards (MindSpore's `dump_device_local_norm`).
///
/// # Differences from MindSpore
/// MindSpore inserts the norm into the compiled graph (`Print("dump local norm: ", name, …)`,
/// or `TensorDump` files `local_norm__<name>_float32_<id>.npy` with `finish_step` markers under
/// `<path>/rank_<r>/`) and computes it on the rank's local gradient slice; to our reading it has
/// no parameter norm (mindformers reports weight norms separately). Tessera computes on the host
/// after the step, reports both norms, and its gradient is the one the optimizer applied (after
/// the gradient reduction), the value that explains the update. Files are JSON, one per step,
/// named by the step rather than by a dump counter.
pub struct LocalNorm {
    sink: LocalNormSink,
}

impl LocalNorm {
    /// Prints lines to `out` (MindSpore's `print_local_norm`).
    pub fn printing(out: Box<dyn Write + Send>) -> LocalNorm {
        LocalNorm {
            sink: LocalNormSink::Print(out, "<local norm output>"),
        }
    }

    /// Prints lines to standard output (a failed write is an error naming stdout).
    pub fn printing_to_stdout() -> LocalNorm {
        LocalNorm {
            sink: LocalNormSink::Print(Box::new(std::io::stdout()), "stdout"),
        }
    }

    /// Dumps JSON files under `dir` (MindSpore's `dump_local_norm(dir)`).
    pub fn dumping(dir: &Path) -> LocalNorm {
        LocalNorm {
            sink: LocalNormSink::Dump(dir.to_path_buf()),
        }
    }

    /// The file rank `rank` writes for step `step` under `dir`.
    pub fn dump_file(dir: &Path, rank: usize, step: u64) -> PathBuf {
        dir.join(format!("rank_{rank}"))
            .join(format!("local_norm_step_{step}.json"))
    }

    /// Reports the norms of `shards` for rank `rank` at global step `step`.
    pub fn record(
        &mut self,
        rank: usize,
        step: u64,
        shards: &[ShardView<'_>],
    ) -> Result<(), RuntimeError> {
        let norms: Vec<(f64, Option<f64>)> = shards
            .iter()
            .map(|s| (l2_norm(s.param), s.grad.map(l2_norm)))
            .collect();
        match &mut self.sink {
            LocalNormSink::Print(out, out_name) => {
                let mut text = String::new();
                for (shard, (norm, grad_norm)) in shards.iter().zip(&norms) {
                    text.push_str(&format!(
                        "rank {rank} step {step} local_norm {} {norm}\n",
                        shard.name
                    ));
                    if let Some(grad_norm) = grad_norm {
                        text.push_str(&format!(
                            "rank {rank} step {step} local_grad_norm {} {grad_norm}\n",
                            shard.name
                        ));
                    }
                }
                out.write_all(text.as_bytes())
                    .and_then(|()| out.flush())
                    .map_err(|e| sink_error(Path::new(*out_name), e))
            }
            LocalNormSink::Dump(dir) => {
                let params: Vec<serde_json::Value> = shards
                    .iter()
                    .zip(&norms)
                    .map(|(shard, (norm, grad_norm))| {
                        json!({
                            "name": shard.name,
                            "shape": shard.param.shape(),
                            "local_norm": norm,
                            "local_grad_norm": grad_norm,
                        })
                    })
                    .collect();
                // The norms of everything the rank holds (MindSpore's `dump_device_local_norm`).
                let device_norm = norms.iter().map(|(n, _)| n * n).sum::<f64>().sqrt();
                let device_grad_norm = norms
                    .iter()
                    .map(|(_, g)| g.map(|g| g * g))
                    .sum::<Option<f64>>()
                    .map(f64::sqrt);
                let body = json!({
                    "rank": rank,
                    "step": step,
                    "device_local_norm": device_norm,
                    "device_local_grad_norm": device_grad_norm,
                    "params": params,
                });
                write_atomically(
                    &LocalNorm::dump_file(dir, rank, step),
                    body.to_string().as_bytes(),
                )
            }
        }
    }
}

impl Callback for LocalNorm {
    fn on_step_end(&mut self, step: &StepInfo<'_>) -> Result<(), RuntimeError> {
        self.record(step.rank, step.global_step, step.shards)
    }
}

/// Writes `bytes` to `path` through a sibling temporary file renamed into place, creating the
/// parent directories. A failed write or rename (a full disk, a file-size limit, a directory
/// in the way) removes the temporary file: nothing is left beside the destination.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), RuntimeError> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| sink_error(parent, e))?;
    }
    let mut temp_name = path.as_os_str().to_owned();
    temp_name.push(".tmp");
    let temp = PathBuf::from(temp_name);
    // Not opened: nothing of ours to remove.
    let mut file = std::fs::File::create(&temp).map_err(|e| sink_error(&temp, e))?;
    let written = file
        .write_all(bytes)
        .map_err(|e| sink_error(&temp, e))
        .and_then(|()| {
            drop(file);
            std::fs::rename(&temp, path).map_err(|e| sink_error(path, e))
        });
    if written.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn l2_norm_of_each_dtype() {
        let f32_tensor = Tensor::from_vec(&[2], vec![3f32, 4.]).unwrap();
        let f64_tensor = Tensor::from_vec(&[3], vec![1f64, 2., 2.]).unwrap();
        let i32_tensor = Tensor::from_vec(&[2], vec![-6i32, 8]).unwrap();
        assert_eq!(l2_norm(&f32_tensor), 5.0);
        assert_eq!(l2_norm(&f64_tensor), 3.0);
        assert_eq!(l2_norm(&i32_tensor), 10.0);
        assert_eq!(l2_norm(&Tensor::zeros(tensor::DType::F32, &[0])), 0.0);
    }

    /// The step lines a `MetricsLog` writes for `losses`, as text.
    fn logged(losses: &[f32]) -> Vec<String> {
        let dir = std::env::temp_dir().join(format!(
            "tessera-callbacks-{}-{}",
            std::process::id(),
            losses.len()
        ));
        let path = dir.join("metrics.jsonl");
        let mut log = MetricsLog::create(&path).unwrap();
        for (i, &loss) in losses.iter().enumerate() {
            let step = StepInfo {
                rank: 0,
                epoch: 1,
                step_in_epoch: i + 1,
                global_step: i as u64 + 1,
                loss,
                step_ms: 1.25,
                lr: 0.001,
                grad_norm: None,
                moe_dropped: None,
                shards: &[],
            };
            log.on_step_end(&step).unwrap();
        }
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        text.lines().map(str::to_string).collect()
    }

    /// A resumed run keeps the log's lines before its first step (steps, epoch ends and
    /// evaluations) and replaces the rest, which the run trains again: after an elastic
    /// restart the log holds every step once. A run from the first step replaces the log.
    #[test]
    fn metrics_log_of_a_resumed_run_keeps_the_history_before_it() {
        let dir =
            std::env::temp_dir().join(format!("tessera-metrics-resume-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("metrics.jsonl");
        let step = |epoch: usize, step_in_epoch: usize, global_step: u64| StepInfo {
            rank: 0,
            epoch,
            step_in_epoch,
            global_step,
            loss: global_step as f32,
            step_ms: 1.0,
            lr: 0.5,
            grad_norm: None,
            moe_dropped: None,
            shards: &[],
        };
        // The first attempt: 3 steps an epoch, an evaluation every 2 steps; it got to step 5.
        let mut log = MetricsLog::create(&path).unwrap();
        for g in 1..=5u64 {
            let (epoch, in_epoch) = ((g as usize - 1) / 3 + 1, (g as usize - 1) % 3 + 1);
            log.on_step_end(&step(epoch, in_epoch, g)).unwrap();
            if g % 2 == 0 {
                log.on_eval(&EvalInfo {
                    rank: 0,
                    global_step: g,
                    eval_accuracy: None,
                    eval_loss: Some(1.0),
                })
                .unwrap();
            }
            if in_epoch == 3 {
                log.on_epoch_end(&EpochInfo {
                    rank: 0,
                    epoch,
                    global_step: g,
                    eval_accuracy: None,
                    eval_loss: Some(2.0),
                    epoch_ms: 1.0,
                })
                .unwrap();
            }
        }
        let first = std::fs::read_to_string(&path).unwrap();
        // Restarted from the snapshot of step 3: steps 4 and 5 again.
        let mut log = MetricsLog::create(&path).unwrap();
        log.on_step_end(&step(2, 1, 4)).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let old: Vec<&str> = first.lines().collect();
        // Steps 1–3, the evaluation at 2 and epoch 1's end are kept; step 4's line is new.
        assert_eq!(lines[..5], old[..5], "{text}");
        assert!(old[4].contains("\"epoch\":1,\"eval_loss\""), "{first}");
        assert_eq!(lines.len(), 6, "{text}");
        assert!(lines[5].contains("\"loss\":4,") && lines[5].contains("\"step\":1}"));
        // A run from the first step replaces the log.
        let mut log = MetricsLog::create(&path).unwrap();
        log.on_step_end(&step(1, 1, 1)).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A run that fails before its first step leaves the previous run's log whole; the first
    /// line replaces it.
    #[test]
    fn metrics_log_keeps_the_old_log_until_its_first_line() {
        let dir = std::env::temp_dir().join(format!("tessera-metrics-old-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("metrics.jsonl");
        let old = "{\"epoch\":1,\"loss\":9.0}\n".repeat(3);
        std::fs::write(&path, &old).unwrap();
        let mut log = MetricsLog::create(&path).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), old);
        log.on_step_end(&StepInfo {
            rank: 0,
            epoch: 1,
            step_in_epoch: 1,
            global_step: 1,
            loss: 1.0,
            step_ms: 2.0,
            lr: 0.5,
            grad_norm: None,
            moe_dropped: None,
            shards: &[],
        })
        .unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            text,
            "{\"epoch\":1,\"loss\":1,\"lr\":0.5,\"ms\":2.0,\"step\":1}\n"
        );
    }

    /// Issue 17: the log holds each f32 loss as its shortest round-trip decimal (the f32
    /// Display form, not serde_json's widened f64 digits), parsing back to the same bits; the
    /// lines stay valid JSON, and a non-finite loss is `null`.
    #[test]
    fn metrics_log_writes_f32_losses_exactly() {
        let losses = [
            2.287_141_3_f32,
            0.1,
            1.0 / 3.0,
            f32::from_bits(0x4012_3457), // an f32 whose f64 widening has 16 digits
            3.0,
            -0.0,
            1.0e-7,
            f32::MIN_POSITIVE,
            f32::MAX,
            f32::NAN,
            f32::INFINITY,
        ];
        let lines = logged(&losses);
        assert_eq!(lines.len(), losses.len());
        for (line, &loss) in lines.iter().zip(&losses) {
            let value: serde_json::Value =
                serde_json::from_str(line).unwrap_or_else(|e| panic!("{line:?} is not JSON: {e}"));
            assert_eq!(value["ms"], 1.25, "{line}");
            let text = line
                .split("\"loss\":")
                .nth(1)
                .and_then(|rest| rest.split(',').next())
                .unwrap_or_else(|| panic!("no loss in {line:?}"));
            if !loss.is_finite() {
                assert_eq!(text, "null", "{line}");
                assert!(value["loss"].is_null());
                continue;
            }
            assert_eq!(text, format!("{loss}"), "the f32 Display form in {line}");
            let back: f32 = text.parse().unwrap();
            assert_eq!(back.to_bits(), loss.to_bits(), "{line}");
            assert!(value["loss"].is_number(), "{line}");
        }
        assert!(lines[0].contains("\"loss\":2.2871413,"), "{}", lines[0]);
        assert!(
            !lines[0].contains("2.287141323"),
            "widened to f64: {}",
            lines[0]
        );
        assert_eq!(
            lines[0],
            r#"{"epoch":1,"loss":2.2871413,"lr":0.001,"ms":1.25,"step":1}"#
        );
    }

    /// The step line carries the step's learning rate as its shortest f64 decimal, and a
    /// `grad_norm` only when the loop computed one, `moe_dropped` only with MoE routing; keys
    /// stay in sorted order.
    #[test]
    fn metrics_log_writes_lr_and_grad_norm_when_known() {
        let dir = std::env::temp_dir().join(format!("tessera-metrics-lr-{}", std::process::id()));
        let path = dir.join("metrics.jsonl");
        let mut log = MetricsLog::create(&path).unwrap();
        let lr = 0.1 + 0.2; // 0.30000000000000004: every digit kept
        for (grad_norm, moe_dropped) in [(None, None), (Some(1.5), None), (None, Some(12.0))] {
            log.on_step_end(&StepInfo {
                rank: 0,
                epoch: 2,
                step_in_epoch: 3,
                global_step: 7,
                loss: 1.5,
                step_ms: 2.0,
                lr,
                grad_norm,
                moe_dropped,
                shards: &[],
            })
            .unwrap();
        }
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines,
            [
                r#"{"epoch":2,"loss":1.5,"lr":0.30000000000000004,"ms":2.0,"step":3}"#,
                r#"{"epoch":2,"grad_norm":1.5,"loss":1.5,"lr":0.30000000000000004,"ms":2.0,"step":3}"#,
                r#"{"epoch":2,"loss":1.5,"lr":0.30000000000000004,"moe_dropped":12,"ms":2.0,"step":3}"#,
            ]
        );
        for line in lines {
            let value: serde_json::Value = serde_json::from_str(line).unwrap();
            assert_eq!(value["lr"].as_f64(), Some(lr), "{line}");
        }
    }

    /// The environment variable naming the log the child test writes.
    const CHILD_LOG: &str = "TESSERA_TEST_METRICS_LOG_PAST_LIMIT";

    /// A write cut short (here by a file-size limit, RLIMIT_FSIZE, as a full disk cuts it) fails
    /// naming the log, and the log keeps only whole lines: it never ends in half a line.
    #[test]
    fn metrics_log_never_ends_in_half_a_line_when_a_write_fails() {
        use std::os::unix::process::CommandExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.jsonl");
        let mut child = std::process::Command::new(std::env::current_exe().unwrap());
        child
            .args([
                "--exact",
                "callbacks::tests::metrics_log_child_writing_past_a_size_limit",
                "--ignored",
                "--test-threads=1",
            ])
            .env(CHILD_LOG, &path);
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            child.pre_exec(|| {
                // A write past the limit then fails with EFBIG instead of killing the process.
                libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
                let limit = libc::rlimit {
                    rlim_cur: 1000,
                    rlim_max: 1000,
                };
                if libc::setrlimit(libc::RLIMIT_FSIZE, &limit) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let out = child.output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{stdout}");
        assert!(stdout.contains("1 passed"), "{stdout}");
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.len() > 500 && text.len() <= 1000, "{}", text.len());
        assert!(text.ends_with('\n'), "the log ends in half a line: {text}");
        for line in text.lines() {
            serde_json::from_str::<serde_json::Value>(line).unwrap();
        }
    }

    /// Run by [`metrics_log_never_ends_in_half_a_line_when_a_write_fails`] in a child process
    /// whose files may not grow past 1000 bytes: writes steps until a write fails.
    #[test]
    #[ignore = "run in a child process under a file-size limit"]
    fn metrics_log_child_writing_past_a_size_limit() {
        let Some(path) = std::env::var_os(CHILD_LOG) else {
            return;
        };
        let mut log = MetricsLog::create(Path::new(&path)).unwrap();
        for i in 1..=1000 {
            let step = StepInfo {
                rank: 0,
                epoch: 1,
                step_in_epoch: i,
                global_step: i as u64,
                loss: 0.123_456_7,
                step_ms: 1.25,
                lr: 0.001,
                grad_norm: None,
                moe_dropped: None,
                shards: &[],
            };
            if let Err(e) = log.on_step_end(&step) {
                let named = e.to_string().contains(&*Path::new(&path).to_string_lossy());
                assert!(named, "{e}");
                return;
            }
        }
        panic!("no write failed under the file-size limit");
    }

    #[test]
    fn f32_json_is_the_display_form_or_null() {
        assert_eq!(f32_json(2.287_141_3), "2.2871413");
        assert_eq!(f32_json(f64::from(2.287_141_3_f32) as f32), "2.2871413");
        assert_eq!(f32_json(-0.0), "-0");
        assert_eq!(f32_json(f32::NEG_INFINITY), "null");
    }
}
