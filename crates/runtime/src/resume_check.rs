//! Whether the checkpoint of `output.resume_from` belongs to this run, checked before any rank
//! starts:
//!
//! - it is read under its strategy file (`output.resume_strategy`, or `strategy.json` in the
//!   set: training writes one, and so does `tessera ckpt convert` with a destination strategy);
//!   without one, a set of rank 0 alone is read as unsharded (merged: every tensor whole
//!   in rank 0's file, as `tessera ckpt convert` without a destination strategy and MindSpore's
//!   merged checkpoints are), each of its tensors of the model's global shape
//!   ([`resume_source`]);
//! - every tensor it holds is one of this model's parameters, an optimizer state or master
//!   weight of one, or the step counter: a checkpoint of another architecture (more layers, a
//!   renamed cell) is refused, naming the tensors the model lacks, instead of dropping them;
//! - a GPT checkpoint's `model.json` describes this run's model: the same shape and the same
//!   vocabulary (a character tokenizer's alphabet, character for character), since a token id
//!   means a character only under one alphabet;
//! - its `train_state.json`, when it has one (training writes it, and conversions carry it),
//!   is a training state;
//! - the step it was saved at leaves something to train under `train.epochs` and
//!   `train.max_steps`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use exec::STATE_NAMES_OF_EVERY_RULE;
use serde_json::Value;

use crate::error::RuntimeError;
use crate::generate::{SavedModel, MODEL_FILE};
use crate::session::{TrainSession, GLOBAL_STEP, MASTER_WEIGHT};

/// How the checkpoint of `output.resume_from` is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ResumeSource {
    /// Under this strategy file (`output.resume_strategy`, or the set's `strategy.json`).
    File(PathBuf),
    /// Unsharded: no strategy file, and rank 0's file holds every tensor whole.
    Unsharded,
}

impl ResumeSource {
    /// The source as the checkpoint loader takes it.
    pub(crate) fn as_ckpt(&self) -> ckpt::SourceStrategy<'_> {
        match self {
            ResumeSource::File(path) => ckpt::SourceStrategy::File(path),
            ResumeSource::Unsharded => ckpt::SourceStrategy::Unsharded,
        }
    }
}

/// How the checkpoint set `from` is read: under `output.resume_strategy` (which must be a
/// file), else under the set's `strategy.json` when it has one, else, when the set holds rank
/// 0 alone, as unsharded. A set of several ranks without a strategy file is refused, naming
/// `output.resume_strategy`: rank 0's shards are not the tensors.
pub(crate) fn resume_source(
    session: &TrainSession,
    from: &Path,
) -> Result<ResumeSource, RuntimeError> {
    let given = session.config.output().resume_strategy.clone();
    let (key, strategy) = match &given {
        Some(path) => ("output.resume_strategy", path.clone()),
        None => ("output.resume_from", from.join(ckpt::SET_STRATEGY_FILE)),
    };
    if strategy.is_dir() {
        return Err(RuntimeError::Config {
            key: key.to_string(),
            reason: format!(
                "{}: is a directory; expected a file (the checkpoint's strategy file, strategy.json or strategy.ckpt)",
                strategy.display()
            ),
        });
    }
    if strategy.is_file() {
        return Ok(ResumeSource::File(strategy));
    }
    if given.is_some() {
        return Err(RuntimeError::Config {
            key: key.to_string(),
            reason: format!(
                "the strategy file {} does not exist (set output.resume_strategy to the \
                 checkpoint's strategy file)",
                strategy.display()
            ),
        });
    }
    let ranks: Vec<usize> = ckpt::RankFiles::discover(from)
        .map(|r| r.files.keys().copied().collect())
        .unwrap_or_default();
    if ranks.iter().any(|&r| r != 0) {
        return Err(RuntimeError::Config {
            key: key.to_string(),
            reason: format!(
                "{}: the checkpoint holds ranks {ranks:?} and no strategy file ({} does not \
                 exist): a sharded checkpoint is read under the strategy it was saved with; set \
                 output.resume_strategy to that file (without one, only a checkpoint of rank 0 \
                 alone is read, as merged: every tensor whole)",
                from.display(),
                strategy.display()
            ),
        });
    }
    Ok(ResumeSource::Unsharded)
}

/// The names of the tensors the checkpoint in `from` holds: those its strategy file lists, or
/// for an unsharded one those of rank 0's file.
pub(crate) fn saved_names(from: &Path, source: &ResumeSource) -> Result<Vec<String>, RuntimeError> {
    match source {
        ResumeSource::File(path) => Ok(ckpt::Strategy::load(path)?
            .params
            .into_iter()
            .map(|p| p.name)
            .collect()),
        ResumeSource::Unsharded => Ok(rank0_tensors(from)?.into_iter().map(|t| t.name).collect()),
    }
}

/// The tensors of rank 0's file of the set `from`.
fn rank0_tensors(from: &Path) -> Result<Vec<ckpt::StoredTensor>, RuntimeError> {
    let file = rank0_file(from).ok_or_else(|| {
        resume_error(
            from,
            "holds no checkpoint (no rank_0/ with a .safetensors or .ckpt file)".to_string(),
        )
    })?;
    Ok(ckpt::CheckpointFile::open(&file)?.tensors().to_vec())
}

/// Checks the checkpoint in `from`, read as `source` says, against `session`; returns the step
/// it was saved at (the run goes on from the next).
pub(crate) fn check_resumable(
    session: &TrainSession,
    from: &Path,
    source: &ResumeSource,
) -> Result<u64, RuntimeError> {
    // A training state that cannot be read (carried as-is by a conversion, which never parses
    // it) fails here, naming the file, before any rank starts.
    crate::periodic_ckpt::TrainState::read(from)?;
    let names = saved_names(from, source)?;
    check_tensor_names(session, from, &names)?;
    check_optimizer_state(session, from, &names)?;
    if *source == ResumeSource::Unsharded {
        check_merged_shapes(session, from)?;
    }
    check_model_description(session, from)?;
    check_steps_left(session, from)
}

/// An unsharded checkpoint holds every tensor of the model (a parameter, its optimizer state,
/// its master weight) whole: of the model's global shape. A tensor of another shape is a shard
/// (a sharded checkpoint without its strategy file) or another model's; it is refused, naming
/// the tensor.
fn check_merged_shapes(session: &TrainSession, from: &Path) -> Result<(), RuntimeError> {
    let mut expected: std::collections::HashMap<String, &[usize]> =
        std::collections::HashMap::new();
    for p in &session.train.params {
        expected.insert(p.name.clone(), p.layout.shape());
        let state_layout = p.optimizer_shard().map_or(&p.layout, |shard| &shard.layout);
        for state in STATE_NAMES_OF_EVERY_RULE.iter().chain([&MASTER_WEIGHT]) {
            expected.insert(
                exec::state_checkpoint_name(state, &p.name),
                state_layout.shape(),
            );
        }
    }
    let file = rank0_file(from).unwrap_or_else(|| from.to_path_buf());
    for t in rank0_tensors(from)? {
        let Some(shape) = expected.get(&t.name) else {
            continue;
        };
        if t.shape.as_slice() != *shape {
            return Err(resume_error(
                from,
                format!(
                    "tensor {:?} in {} has shape {:?}, but this model's is {:?}: with no \
                     strategy file (output.resume_strategy is not set and the set has no \
                     strategy.json) the checkpoint is read as merged, every tensor whole in \
                     rank 0's file, and this is not a merged checkpoint of this model (a shard \
                     of a sharded one, or another model's); set output.resume_strategy to the \
                     strategy file it was saved under",
                    t.name,
                    file.display(),
                    t.shape,
                    shape
                ),
            ));
        }
    }
    Ok(())
}

fn resume_error(from: &Path, reason: String) -> RuntimeError {
    RuntimeError::Config {
        key: "output.resume_from".to_string(),
        reason: format!("{}: {reason}", from.display()),
    }
}

/// Every tensor of the checkpoint (`names`) is the model's.
fn check_tensor_names(
    session: &TrainSession,
    from: &Path,
    names: &[String],
) -> Result<(), RuntimeError> {
    let model: std::collections::BTreeSet<&str> = session
        .train
        .params
        .iter()
        .map(|p| p.name.as_str())
        .collect();
    let known = |name: &str| {
        model.contains(name)
            || name == GLOBAL_STEP
            || name.split_once('.').is_some_and(|(state, param)| {
                (state == MASTER_WEIGHT || STATE_NAMES_OF_EVERY_RULE.contains(&state))
                    && model.contains(param)
            })
    };
    let foreign: Vec<&str> = names
        .iter()
        .map(String::as_str)
        .filter(|name| !known(name))
        .collect();
    if foreign.is_empty() {
        return Ok(());
    }
    const SHOWN: usize = 5;
    let more = match foreign.len() > SHOWN {
        true => format!(" and {} more", foreign.len() - SHOWN),
        false => String::new(),
    };
    Err(resume_error(
        from,
        format!(
            "the checkpoint holds {} tensor(s) this model does not have ({}{more}): it was saved from another model; give [model] the shape of the run that saved it",
            foreign.len(),
            foreign[..foreign.len().min(SHOWN)].join(", ")
        ),
    ))
}

/// The checkpoint holds the optimizer state this run's rule keeps, no more, no less: another
/// rule's state would be dropped (or its moments read as another rule's), and a rule whose
/// state is missing could not continue the run.
fn check_optimizer_state(
    session: &TrainSession,
    from: &Path,
    names: &[String],
) -> Result<(), RuntimeError> {
    let optimizer = session.config.optimizer_config().kind;
    let ours: BTreeSet<&str> = optimizer.state_names().iter().copied().collect();
    let saved: BTreeSet<&str> = names
        .iter()
        .filter_map(|name| name.split_once('.'))
        .map(|(state, _)| state)
        .filter(|state| STATE_NAMES_OF_EVERY_RULE.contains(state))
        .collect();
    if saved == ours {
        return Ok(());
    }
    let list = |names: &BTreeSet<&str>| match names.is_empty() {
        true => "none".to_string(),
        false => names.iter().copied().collect::<Vec<_>>().join(", "),
    };
    // A tensor the run needs and the checkpoint lacks, named as the checkpoint would name it.
    let missing = ours.difference(&saved).next().and_then(|state| {
        let param = session.train.params.iter().find(|p| p.trainable)?;
        Some(format!(
            " (it has no {})",
            exec::state_checkpoint_name(state, &param.name)
        ))
    });
    // AMSGrad's running maximum is the one state a setting of the same rule adds.
    let only_vhat = ours.symmetric_difference(&saved).eq(["vhat"].iter());
    let (key, setting) = match (optimizer, only_vhat) {
        (exec::OptimizerKind::Adam { use_amsgrad, .. }, true) => (
            "train.use_amsgrad",
            format!(" with train.use_amsgrad = {use_amsgrad}"),
        ),
        _ => ("train.optimizer", String::new()),
    };
    Err(RuntimeError::Config {
        key: key.to_string(),
        reason: format!(
            "\"{}\"{setting} keeps the optimizer state {}, but the checkpoint in {} \
             (output.resume_from) holds {}{}: it was saved by another optimizer or setting; \
             resume with the one that saved it",
            optimizer.name(),
            list(&ours),
            from.display(),
            list(&saved),
            missing.unwrap_or_default(),
        ),
    })
}

/// A GPT checkpoint's `model.json` (when it has one) describes this run's model.
fn check_model_description(session: &TrainSession, from: &Path) -> Result<(), RuntimeError> {
    let Some(text) = session.text() else {
        return Ok(());
    };
    if !from.join(MODEL_FILE).is_file() {
        return Ok(());
    }
    let saved = SavedModel::read(from)?.to_json();
    let ours = text.saved_model(&session.config)?.to_json();
    let mut differing = Vec::new();
    differences("", &saved, &ours, &mut differing);
    if differing.is_empty() {
        return Ok(());
    }
    let vocabulary = differing.iter().any(|d| {
        ["vocab_size:", "tokenizer:", "alphabet:"]
            .iter()
            .any(|k| d.starts_with(k))
    });
    let advice = match vocabulary {
        true => "a token id means the same character only under the same alphabet, so resume on the text and [model] the checkpoint was trained with",
        false => "resume with the [model] the checkpoint was trained with",
    };
    Err(resume_error(
        from,
        format!(
            "its {MODEL_FILE} describes another model or vocabulary ({}); {advice}",
            differing.join("; ")
        ),
    ))
}

/// Appends `key: saved …, this run …` for every leaf where `ours` differs from `saved`, keys of
/// nested tables joined by dots (`moe.capacity_factor`), so the message names the key that
/// differs rather than two cut-off tables.
fn differences(prefix: &str, saved: &Value, ours: &Value, out: &mut Vec<String>) {
    if let (Value::Object(saved), Value::Object(ours)) = (saved, ours) {
        let keys: std::collections::BTreeSet<&String> = saved.keys().chain(ours.keys()).collect();
        for key in keys {
            let name = format!("{prefix}{key}");
            let (theirs, mine) = (
                saved.get(key.as_str()).unwrap_or(&Value::Null),
                ours.get(key.as_str()).unwrap_or(&Value::Null),
            );
            differences(&format!("{name}."), theirs, mine, out);
        }
        return;
    }
    if saved != ours {
        let key = prefix.trim_end_matches('.');
        out.push(format!(
            "{key}: saved {}, this run {}",
            brief(saved),
            brief(ours)
        ));
    }
}

/// A JSON value for a message, long strings (an alphabet) cut to 40 characters.
fn brief(value: &Value) -> String {
    let text = value.to_string();
    match text.char_indices().nth(40) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text,
    }
}

/// Rank 0's checkpoint file in the set `from`, in either format (`.safetensors`, as training
/// writes it, or MindSpore's `.ckpt`, as `tessera ckpt convert --format ckpt` and MindSpore
/// write it), picked as the set's reader picks it ([`ckpt::RankFiles`]); `None` when the set has
/// none.
pub(crate) fn rank0_file(from: &Path) -> Option<std::path::PathBuf> {
    let files = ckpt::RankFiles::discover(from).ok()?;
    files.files.get(&0).cloned()
}

/// The step the checkpoint set `from` was saved at: its `global_step` tensor (rank 0's file),
/// 0 when it has none.
pub(crate) fn saved_step(from: &Path) -> u64 {
    rank0_file(from)
        .and_then(|file| ckpt::CheckpointFile::open(&file).ok())
        .and_then(|f| f.read_tensor(GLOBAL_STEP).ok())
        .map(|t| t.to_f64_vec().first().copied().unwrap_or(0.0) as u64)
        .unwrap_or(0)
}

/// The checkpoint's step leaves steps to train; returns that step.
fn check_steps_left(session: &TrainSession, from: &Path) -> Result<u64, RuntimeError> {
    let saved_step = saved_step(from);
    let planned = session.planned_steps();
    if saved_step < planned {
        return Ok(saved_step);
    }
    let train = session.config.train();
    Err(resume_error(
        from,
        format!(
            "the checkpoint was saved at step {saved_step}, and this run ends at step {planned} ({} epoch(s) of {} step(s){}): nothing is left to train; raise train.epochs or train.max_steps",
            train.epochs,
            session.steps_per_epoch(),
            train
                .max_steps
                .map_or(String::new(), |m| format!(", train.max_steps = {m}"))
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A nested table's differing leaf is named by its dotted key with both values, and equal
    /// leaves are not listed.
    #[test]
    fn differences_name_the_nested_key_that_differs() {
        let saved =
            json!({"layers": 2, "moe": {"experts": 4, "capacity_factor": 1.25}, "moe2": null});
        let ours = json!({"layers": 2, "moe": {"experts": 4, "capacity_factor": 2.0}, "moe2": {"top_k": 1}});
        let mut out = Vec::new();
        differences("", &saved, &ours, &mut out);
        assert_eq!(
            out,
            [
                "moe.capacity_factor: saved 1.25, this run 2.0",
                "moe2: saved null, this run {\"top_k\":1}",
            ]
        );
    }
}
