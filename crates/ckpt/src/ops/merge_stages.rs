//! MindSpore's `merge_pipeline_strategys`: one strategy file per pipeline stage merged into one
//! file whose parameter names carry their stage (`"<stage>-<name>"`).
//!
//! Unlike MindSpore, which takes its inputs in unsorted `glob` order, files are merged in stage
//! order (then by file name), so the output does not depend on the filesystem.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::error::{io_err, CkptError, Result};
use crate::format::ms_strategy::MsStrategyFile;
use crate::io::atomic_write::write_file;
use crate::model::{check_unique_ops, StrategyFlavour};

/// What a stage merge did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MergeStagesReport {
    /// The merged file.
    pub path: PathBuf,
    /// Each input used and its stage, in merge order.
    pub merged: Vec<(PathBuf, u32)>,
    /// Inputs skipped (another copy of a stage already merged: the same bytes, or the same
    /// strategies), with why. A file contradicting a merged stage is an error.
    pub skipped: Vec<(PathBuf, String)>,
}

/// Merges the per-stage strategy files in `src_dir` (all `*.ckpt` protobuf, or all `*.json`)
/// into `dst`, written as protobuf unless its name ends in `.json`.
pub fn merge_pipeline_strategies(
    src_dir: &Path,
    dst: &Path,
    force: bool,
) -> Result<MergeStagesReport> {
    let mut pb = Vec::new();
    let mut js = Vec::new();
    for entry in std::fs::read_dir(src_dir).map_err(io_err(src_dir, "list directory"))? {
        let path = entry.map_err(io_err(src_dir, "list directory"))?.path();
        let list = match path.extension().and_then(|e| e.to_str()) {
            Some("ckpt") => &mut pb,
            Some("json") => &mut js,
            _ => continue,
        };
        // A strategy's name on a directory, a FIFO or a broken link is an error naming it,
        // not an input passed over without a word.
        crate::format::detect::open_regular(&path)?;
        list.push(path);
    }
    if !pb.is_empty() && !js.is_empty() {
        return Err(CkptError::MixedFormats {
            path: src_dir.to_path_buf(),
            detail: format!("{} and {}", pb[0].display(), js[0].display()),
        });
    }
    let (files, is_json) = if pb.is_empty() {
        (js, true)
    } else {
        (pb, false)
    };
    if files.is_empty() {
        return Err(CkptError::NoFiles {
            path: src_dir.to_path_buf(),
            what: "strategy file (*.ckpt or *.json)",
        });
    }
    let flavour = if is_json {
        StrategyFlavour::MsJson
    } else {
        StrategyFlavour::MsProtobuf
    };
    let mut parsed: Vec<(PathBuf, Vec<u8>, MsStrategyFile, u32)> = Vec::with_capacity(files.len());
    for path in files {
        let bytes = layout::limits::read_bounded(&path, layout::limits::MAX_STRATEGY_FILE_BYTES)
            .map_err(io_err(&path, "read"))?;
        let file = if is_json {
            MsStrategyFile::from_json_bytes(&path, &bytes)?
        } else {
            MsStrategyFile::decode(&path, &bytes)?
        };
        // A stage file repeating an op in one stage would be merged into a file every reader
        // refuses: name the input instead.
        check_unique_ops(
            file.strategy_items
                .iter()
                .map(|i| (i.node_name.as_str(), i.stage as usize)),
        )
        .map_err(|reason| CkptError::InvalidStrategy {
            path: path.clone(),
            reason: format!("parallel_strategy_item: {reason}"),
        })?;
        let (Some(first), false) = (file.strategy_items.first(), file.layout_items.is_empty())
        else {
            return Err(CkptError::InvalidStrategy {
                path,
                reason: "the strategy file is empty (it needs operator strategies, whose first one gives the pipeline stage, and parameter layouts)".to_string(),
            });
        };
        let stage = first.stage;
        // A stage file whose layouts break a rule (a bad optimizer shard, a tensor map out of
        // range, ...) would be merged into a file every reader refuses: name the input now.
        file.clone().into_strategy(&path, flavour)?;
        parsed.push((path, bytes, file, stage));
    }
    parsed.sort_by(|a, b| (a.3, &a.0).cmp(&(b.3, &b.0)));
    let mut out = MsStrategyFile {
        current_stage: 1,
        ..MsStrategyFile::default()
    };
    let mut report = MergeStagesReport::default();
    let mut seen_bytes: Vec<Vec<u8>> = Vec::new();
    // Each merged stage's file and its strategies, to tell another rank's copy of a stage
    // (the same strategies, kept once) from a file that contradicts it.
    let mut merged_stages: Vec<(u32, PathBuf, MsStrategyFile)> = Vec::new();
    for (path, bytes, file, stage) in parsed {
        if seen_bytes.contains(&bytes) {
            report
                .skipped
                .push((path, "identical to a file already merged".to_string()));
            continue;
        }
        if let Some((_, first, kept)) = merged_stages.iter().find(|(s, _, _)| *s == stage) {
            if !same_items(&kept.strategy_items, &file.strategy_items, |i| &i.node_name)
                || !same_items(&kept.layout_items, &file.layout_items, |i| &i.param_name)
            {
                return Err(CkptError::InvalidStrategy {
                    path,
                    reason: format!(
                        "it holds pipeline stage {stage}, as {} does, with other strategies or layouts: a stage has one strategy (give one file per stage, or copies of the same)",
                        first.display()
                    ),
                });
            }
            report.skipped.push((
                path,
                format!("stage {stage} was already merged, with the same strategies"),
            ));
            continue;
        }
        seen_bytes.push(bytes);
        merged_stages.push((stage, path.clone(), file.clone()));
        out.strategy_items.extend(file.strategy_items);
        out.layout_items
            .extend(file.layout_items.into_iter().map(|mut item| {
                item.param_name = format!("{stage}-{}", item.param_name);
                item
            }));
        report.merged.push((path, stage));
    }
    // MindSpore's readers need stages 0..n: a merge missing one would be refused by every tool.
    if let Some(gap) = (0..).zip(&report.merged).find(|(want, (_, s))| s != want) {
        let present: Vec<u32> = report.merged.iter().map(|(_, s)| *s).collect();
        return Err(CkptError::InvalidStrategy {
            path: gap.1 .0.clone(),
            reason: format!(
                "the files hold pipeline stages {present:?}, but stage {} is missing: a merged strategy needs every stage 0..n (give each stage's file)",
                gap.0
            ),
        });
    }
    // The stages together must make one strategy (every stage's layouts over the same number
    // of devices, ...): checked as a reader checks the merged file, before anything is written.
    out.clone().into_strategy(dst, flavour)?;
    let bytes = if dst.extension().is_some_and(|e| e == "json") {
        // A JSON strategy keys its operator strategies by name, so two stages' operators of one
        // name would be written as a duplicate key, which every JSON reader (ours included)
        // refuses or silently collapses. Protobuf keeps both; say so before writing anything.
        let mut first_stage: HashMap<&str, u32> = HashMap::new();
        for item in &out.strategy_items {
            if let Some(stage) = first_stage.insert(&item.node_name, item.stage) {
                return Err(CkptError::InvalidStrategy {
                    path: dst.to_path_buf(),
                    reason: format!(
                        "operator \"{}\" has a strategy in pipeline stage {stage} and in stage {}: a JSON strategy file holds each operator name once (write the merge as protobuf: an output name not ending in .json)",
                        item.node_name, item.stage
                    ),
                });
            }
        }
        let mut text = out.to_json_text();
        text.push('\n');
        text.into_bytes()
    } else {
        out.encode()
    };
    report.path = write_file(dst, &bytes, force)?;
    Ok(report)
}

/// Whether `a` and `b` hold the same items, in any order. Items are matched among those of the
/// same `key` (their name) only: comparing every item with every other was quadratic, and two
/// copies of a stage of 100 000 parameters took minutes.
fn same_items<T: PartialEq>(a: &[T], b: &[T], key: impl Fn(&T) -> &str) -> bool {
    fn by_key<'a, T>(items: &'a [T], key: &impl Fn(&T) -> &str) -> HashMap<&'a str, Vec<&'a T>> {
        let mut groups: HashMap<&str, Vec<&T>> = HashMap::new();
        for item in items {
            groups.entry(key(item)).or_default().push(item);
        }
        groups
    }
    if a.len() != b.len() {
        return false;
    }
    let (a, b) = (by_key(a, &key), by_key(b, &key));
    a.len() == b.len()
        && a.iter().all(|(name, xs)| {
            b.get(name).is_some_and(|ys| {
                xs.iter().all(|x| ys.contains(x)) && ys.iter().all(|y| xs.contains(y))
            })
        })
}
