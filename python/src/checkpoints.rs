//! `mindspore.parallel`'s checkpoint tools over the `ckpt` crate, plus Tessera's
//! `reshard_plan` and `verify_checkpoint`. Results are plain Python data.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use ckpt::{ConvertOptions, ConvertReport, Format, MergeOptions, Strategy};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::arrays;
use crate::errors::ckpt_err;
use crate::progress::PyProgress;

/// Adds the functions of this module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(convert_checkpoints, m)?)?;
    m.add_function(wrap_pyfunction!(convert_checkpoint_files, m)?)?;
    m.add_function(wrap_pyfunction!(convert_unsharded, m)?)?;
    m.add_function(wrap_pyfunction!(rank_list, m)?)?;
    m.add_function(wrap_pyfunction!(unified_safetensors, m)?)?;
    m.add_function(wrap_pyfunction!(load_distributed_files, m)?)?;
    m.add_function(wrap_pyfunction!(load_rank_from_files, m)?)?;
    m.add_function(wrap_pyfunction!(load_rank_from_unified, m)?)?;
    m.add_function(wrap_pyfunction!(load_segmented_checkpoints, m)?)?;
    m.add_function(wrap_pyfunction!(build_searched_strategy, m)?)?;
    m.add_function(wrap_pyfunction!(merge_pipeline_strategys, m)?)?;
    m.add_function(wrap_pyfunction!(restore_group_info_list, m)?)?;
    m.add_function(wrap_pyfunction!(verify_checkpoint, m)?)?;
    m.add_function(wrap_pyfunction!(reshard_plan, m)?)?;
    m.add_function(wrap_pyfunction!(encrypt_checkpoint_file, m)?)?;
    Ok(())
}

fn format_of(name: Option<&str>) -> PyResult<Option<Format>> {
    name.map(|n| {
        n.parse::<Format>().map_err(|_| {
            pyo3::exceptions::PyValueError::new_err(format!(
                "format {n:?} is not supported: use 'ckpt' or 'safetensors'"
            ))
        })
    })
    .transpose()
}

fn path_str(p: &Path) -> String {
    p.display().to_string()
}

fn skipped_list<'py>(
    py: Python<'py>,
    skipped: &[(String, String)],
) -> PyResult<Bound<'py, PyList>> {
    let list = PyList::empty(py);
    for (name, reason) in skipped {
        let d = PyDict::new(py);
        d.set_item("name", name)?;
        d.set_item("reason", reason)?;
        list.append(d)?;
    }
    Ok(list)
}

fn rank_report<'py>(py: Python<'py>, r: &ckpt::RankReport) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("rank", r.rank)?;
    d.set_item("path", path_str(&r.path))?;
    d.set_item("source_ranks", &r.source_ranks)?;
    d.set_item("minimal", if r.exact { "exact" } else { "greedy" })?;
    d.set_item("tensors", r.n_tensors)?;
    d.set_item("bytes", r.data_bytes)?;
    Ok(d)
}

fn convert_report<'py>(py: Python<'py>, report: &ConvertReport) -> PyResult<Bound<'py, PyDict>> {
    let ranks = PyList::empty(py);
    for r in &report.ranks {
        ranks.append(rank_report(py, r)?)?;
    }
    let d = PyDict::new(py);
    d.set_item("ranks", ranks)?;
    d.set_item("skipped", skipped_list(py, &report.skipped)?)?;
    Ok(d)
}

/// Runs a conversion with the GIL released, its progress reported to `progress`; returns its
/// report as a dict.
fn converted<'py>(
    py: Python<'py>,
    progress: Option<Py<PyAny>>,
    convert: impl FnOnce(&dyn ckpt::Progress) -> ckpt::Result<ConvertReport> + Send,
) -> PyResult<Bound<'py, PyDict>> {
    let sink = PyProgress::new(progress);
    let report = sink.run(py, |sink| convert(sink))?.map_err(ckpt_err)?;
    convert_report(py, &report)
}

/// Converts `src_dir/rank_<r>/` from `src_strategy` to `dst_strategy` (`None`: merged into
/// rank 0), writing `dst_dir/rank_<r>/<prefix><r>.<ext>`; returns the report as a dict.
/// `fsync=false` writes as atomically but issues no fsync ([`ckpt::Durability::OsBuffered`]),
/// as for every writer below.
#[pyfunction]
#[pyo3(signature = (src_dir, src_strategy, dst_dir, dst_strategy=None, prefix="checkpoint_", output_format=None, ranks=None, force=false, allow_missing=false, progress=None, fsync=true))]
#[allow(clippy::too_many_arguments)]
fn convert_checkpoints<'py>(
    py: Python<'py>,
    src_dir: PathBuf,
    src_strategy: PathBuf,
    dst_dir: PathBuf,
    dst_strategy: Option<PathBuf>,
    prefix: &str,
    output_format: Option<&str>,
    ranks: Option<Vec<usize>>,
    force: bool,
    allow_missing: bool,
    progress: Option<Py<PyAny>>,
    fsync: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let format = format_of(output_format)?;
    let prefix = prefix.to_string();
    converted(py, progress, |sink| {
        let opts = ConvertOptions {
            format,
            prefix: &prefix,
            ranks: ranks.as_deref(),
            force,
            allow_missing,
            progress: sink,
            fsync,
            ..Default::default()
        };
        ckpt::convert_checkpoints(
            &src_dir,
            &src_strategy,
            &dst_dir,
            dst_strategy.as_deref(),
            &opts,
        )
    })
}

/// Slices the unsharded checkpoint in `src_dir/rank_0/` for `dst_strategy`, writing
/// `dst_dir/rank_<r>/<prefix><r>.<ext>`; returns the report as a dict.
#[pyfunction]
#[pyo3(signature = (src_dir, dst_dir, dst_strategy, prefix="checkpoint_", output_format=None, force=false, progress=None, fsync=true))]
#[allow(clippy::too_many_arguments)]
fn convert_unsharded<'py>(
    py: Python<'py>,
    src_dir: PathBuf,
    dst_dir: PathBuf,
    dst_strategy: PathBuf,
    prefix: &str,
    output_format: Option<&str>,
    force: bool,
    progress: Option<Py<PyAny>>,
    fsync: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let format = format_of(output_format)?;
    let prefix = prefix.to_string();
    converted(py, progress, |sink| {
        let opts = ConvertOptions {
            format,
            prefix: &prefix,
            force,
            progress: sink,
            fsync,
            ..Default::default()
        };
        ckpt::convert_unsharded(&src_dir, &dst_dir, &dst_strategy, &opts)
    })
}

/// Converts destination rank `rank` from the source files `files` (rank → path) into exactly
/// `dst_file`; returns the rank's report as a dict.
#[pyfunction]
#[pyo3(signature = (rank, files, src_strategy, dst_file, dst_strategy=None, force=false, progress=None, fsync=true))]
#[allow(clippy::too_many_arguments)]
fn convert_checkpoint_files<'py>(
    py: Python<'py>,
    rank: usize,
    files: BTreeMap<usize, PathBuf>,
    src_strategy: Option<PathBuf>,
    dst_file: PathBuf,
    dst_strategy: Option<PathBuf>,
    force: bool,
    progress: Option<Py<PyAny>>,
    fsync: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let sink = PyProgress::new(progress);
    let report = sink
        .run(py, |sink| {
            let opts = ConvertOptions {
                force,
                progress: sink,
                fsync,
                ..Default::default()
            };
            ckpt::convert_checkpoint_files(
                rank,
                &files,
                src_strategy.as_deref(),
                &dst_file,
                dst_strategy.as_deref(),
                &opts,
            )
        })?
        .map_err(ckpt_err)?;
    rank_report(py, &report)
}

/// The minimal source ranks destination `rank` needs: `(ranks ascending, proven minimal)`.
#[pyfunction]
#[pyo3(signature = (rank, src_strategy, dst_strategy=None))]
fn rank_list(
    rank: usize,
    src_strategy: PathBuf,
    dst_strategy: Option<PathBuf>,
) -> PyResult<(Vec<usize>, bool)> {
    let src = Strategy::load(&src_strategy).map_err(ckpt_err)?;
    let dst = dst_strategy
        .as_deref()
        .map(Strategy::load)
        .transpose()
        .map_err(ckpt_err)?;
    let cover = ckpt::minimal_rank_list(&src, dst.as_ref(), rank).map_err(ckpt_err)?;
    Ok((cover.ranks, cover.exact))
}

/// MindSpore's `choice_func` over Python: a bool keeps or drops, a str renames. The first
/// Python error (an exception in the callable, or a value of another type) is kept in
/// `raised`, and the merge stops.
fn py_choice<'a>(
    f: &'a Py<PyAny>,
    raised: &'a Mutex<Option<PyErr>>,
) -> impl Fn(&str) -> ckpt::Result<ckpt::ParamChoice> + Sync + 'a {
    move |name: &str| {
        let result = Python::attach(|py| -> PyResult<ckpt::ParamChoice> {
            let out = f.bind(py).call1((name,))?;
            if let Ok(b) = out.cast::<pyo3::types::PyBool>() {
                return Ok(if b.is_true() {
                    ckpt::ParamChoice::Keep
                } else {
                    ckpt::ParamChoice::Drop
                });
            }
            if out.is_instance_of::<pyo3::types::PyString>() {
                return Ok(ckpt::ParamChoice::Rename(out.extract::<String>()?));
            }
            Err(pyo3::exceptions::PyValueError::new_err(format!(
                "For 'unified_safetensors', the return value type of the function 'choice_func' must be bool or str, but got {}.",
                out.get_type().repr()?
            )))
        });
        result.map_err(|e| {
            let message = e.to_string();
            let mut slot = raised.lock().unwrap_or_else(|p| p.into_inner());
            slot.get_or_insert(e);
            ckpt::CkptError::ChoiceFunc {
                param: name.to_string(),
                source: message.into(),
            }
        })
    }
}

/// Merges every rank of `src_dir` into full tensors in `dst_dir` (part files, index and
/// hyper-parameter file); returns the report as a dict. `file_suffix`, `choice` and `split`
/// are MindSpore's `file_suffix`, `choice_func` and `split_dst_file`.
#[pyfunction]
#[pyo3(signature = (src_dir, strategy, dst_dir, dedup=false, max_part_bytes=ckpt::DEFAULT_PART_BYTES, force=false, progress=None, file_suffix=None, choice=None, split=None, fsync=true))]
#[allow(clippy::too_many_arguments)]
fn unified_safetensors<'py>(
    py: Python<'py>,
    src_dir: PathBuf,
    strategy: PathBuf,
    dst_dir: PathBuf,
    dedup: bool,
    max_part_bytes: u64,
    force: bool,
    progress: Option<Py<PyAny>>,
    file_suffix: Option<String>,
    choice: Option<Py<PyAny>>,
    split: Option<(usize, usize)>,
    fsync: bool,
) -> PyResult<Bound<'py, PyDict>> {
    if max_part_bytes == 0 {
        return Err(pyo3::exceptions::PyValueError::new_err(
            "max_part_size must be positive",
        ));
    }
    let sink = PyProgress::new(progress);
    let raised = Mutex::new(None);
    let choice_fn = choice.as_ref().map(|f| py_choice(f, &raised));
    let r = sink.run(py, |sink| {
        let opts = MergeOptions {
            max_part_bytes,
            dedup,
            force,
            progress: sink,
            file_suffix: file_suffix.as_deref(),
            choice: choice_fn.as_ref().map(|f| f as ckpt::ChoiceFn<'_>),
            split,
            fsync,
            ..Default::default()
        };
        ckpt::unified_safetensors(&src_dir, &strategy, &dst_dir, &opts)
    })?;
    drop(choice_fn);
    if let Some(e) = raised.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(e);
    }
    let r = r.map_err(ckpt_err)?;
    let parts = PyList::empty(py);
    for (path, names) in &r.parts {
        let d = PyDict::new(py);
        d.set_item("path", path_str(path))?;
        d.set_item("tensors", names)?;
        parts.append(d)?;
    }
    let d = PyDict::new(py);
    d.set_item("parts", parts)?;
    d.set_item("index", r.index.as_deref().map(path_str))?;
    d.set_item("hyper_param", r.hyper.as_deref().map(path_str))?;
    d.set_item("source_ranks", &r.source_ranks)?;
    d.set_item("total_size", r.total_size)?;
    d.set_item("skipped", skipped_list(py, &r.skipped)?)?;
    d.set_item("warnings", &r.warnings)?;
    Ok(d)
}

/// One entry of MindSpore's layout dict, normalised by the Python side: name, dev_matrix,
/// tensor_map, param_split_shape, field_size, opt_shard_step, opt_shard_size.
type LayoutEntry = (String, Vec<i64>, Vec<i64>, Vec<i64>, i64, i64, i64);

/// The target strategy: the file `strategy`, the layout dict `layouts`, or neither (every
/// tensor whole on rank 0: MindSpore's `predict_strategy=None`).
fn target_strategy(
    strategy: Option<PathBuf>,
    layouts: Option<Vec<LayoutEntry>>,
) -> PyResult<Option<Strategy>> {
    match (strategy, layouts) {
        (None, None) => Ok(None),
        (Some(path), None) => Strategy::load(&path).map(Some).map_err(ckpt_err),
        (None, Some(entries)) => {
            let items: Vec<(String, ckpt::LayoutList)> = entries
                .into_iter()
                .map(
                    |(name, dev_matrix, tensor_map, param_split_shape, field_size, step, size)| {
                        (
                            name,
                            ckpt::LayoutList {
                                dev_matrix,
                                tensor_map,
                                param_split_shape,
                                field_size,
                                opt_shard_step: step,
                                opt_shard_size: size,
                            },
                        )
                    },
                )
                .collect();
            Strategy::from_layout_lists(Path::new("predict_strategy"), &items)
                .map(Some)
                .map_err(ckpt_err)
        }
        (Some(_), Some(_)) => Err(pyo3::exceptions::PyValueError::new_err(
            "give at most one of a strategy file and a layout dict",
        )),
    }
}

/// The key and mode of `dec_key` / `dec_mode`.
fn decryption(dec_key: Option<Vec<u8>>, dec_mode: &str) -> PyResult<Option<ckpt::Decryption>> {
    let Some(key) = dec_key else {
        return Ok(None);
    };
    let mode: ckpt::CipherMode = dec_mode.parse().map_err(ckpt_err)?;
    ckpt::Decryption::new(&key, mode)
        .map(Some)
        .map_err(ckpt_err)
}

/// Slices the unified checkpoint in `unified_dir` for `strategy` (a file) or `layouts` (a
/// layout dict), writing `dst_dir/rank_<r>/net.<ext>` for `ranks` (all by default), tensors
/// renamed by `name_map`; returns the report as a dict.
#[pyfunction]
#[pyo3(signature = (unified_dir, strategy, dst_dir, ranks=None, output_format=None, force=false, progress=None, layouts=None, name_map=None, fsync=true))]
#[allow(clippy::too_many_arguments)]
fn load_distributed_files<'py>(
    py: Python<'py>,
    unified_dir: PathBuf,
    strategy: Option<PathBuf>,
    dst_dir: PathBuf,
    ranks: Option<Vec<usize>>,
    output_format: Option<&str>,
    force: bool,
    progress: Option<Py<PyAny>>,
    layouts: Option<Vec<LayoutEntry>>,
    name_map: Option<BTreeMap<String, String>>,
    fsync: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let format = format_of(output_format)?;
    let strategy = target_strategy(strategy, layouts)?;
    converted(py, progress, |sink| {
        let opts = ConvertOptions {
            format,
            ranks: ranks.as_deref(),
            force,
            progress: sink,
            name_map: name_map.as_ref(),
            fsync,
            ..Default::default()
        };
        ckpt::load_distributed_checkpoint_with(&unified_dir, strategy.as_ref(), &dst_dir, &opts)
    })
}

/// The tensors destination `rank` holds under `dst_strategy` (a file), `layouts` (a layout
/// dict) or neither (whole tensors), from per-rank `files` saved under `src_strategy` (none: one
/// unsharded file, as rank 0; decrypted with `dec_key` /
/// `dec_mode` when a key is given), as a dict of numpy arrays. A parameter of either strategy
/// that no file holds is an error unless `allow_missing` (then it is left out).
#[pyfunction]
#[pyo3(signature = (files, src_strategy, dst_strategy, rank, layouts=None, dec_key=None, dec_mode="AES-GCM", allow_missing=false))]
#[allow(clippy::too_many_arguments)]
fn load_rank_from_files<'py>(
    py: Python<'py>,
    files: BTreeMap<usize, PathBuf>,
    src_strategy: Option<PathBuf>,
    dst_strategy: Option<PathBuf>,
    rank: usize,
    layouts: Option<Vec<LayoutEntry>>,
    dec_key: Option<Vec<u8>>,
    dec_mode: &str,
    allow_missing: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let dst = target_strategy(dst_strategy, layouts)?;
    let dec = decryption(dec_key, dec_mode)?;
    let tensors = py
        .detach(|| {
            ckpt::load_rank_from_files_allowing(
                &files,
                src_strategy.as_deref(),
                dst.as_ref(),
                rank,
                dec.as_ref(),
                allow_missing,
            )
        })
        .map_err(ckpt_err)?;
    arrays::to_dict(py, &tensors)
}

/// The tensors destination `rank` holds under `strategy` (a file) or `layouts` (a layout
/// dict), from the unified checkpoint in `unified_dir`, as a dict of numpy arrays.
#[pyfunction]
#[pyo3(signature = (unified_dir, strategy, rank, layouts=None))]
fn load_rank_from_unified<'py>(
    py: Python<'py>,
    unified_dir: PathBuf,
    strategy: Option<PathBuf>,
    rank: usize,
    layouts: Option<Vec<LayoutEntry>>,
) -> PyResult<Bound<'py, PyDict>> {
    let strategy = target_strategy(strategy, layouts)?;
    let tensors = py
        .detach(|| ckpt::load_rank_from_unified_with(&unified_dir, strategy.as_ref(), rank))
        .map_err(ckpt_err)?;
    arrays::to_dict(py, &tensors)
}

/// The union of every checkpoint file in `dir` (later files win), decrypted with `dec_key` /
/// `dec_mode` when a key is given, as a dict of numpy arrays.
#[pyfunction]
#[pyo3(signature = (dir, dec_key=None, dec_mode="AES-GCM"))]
fn load_segmented_checkpoints<'py>(
    py: Python<'py>,
    dir: PathBuf,
    dec_key: Option<Vec<u8>>,
    dec_mode: &str,
) -> PyResult<Bound<'py, PyDict>> {
    let dec = decryption(dec_key, dec_mode)?;
    let tensors = py
        .detach(|| {
            let entries = ckpt::load_segmented_checkpoints_with(&dir, dec.as_ref())?;
            entries
                .iter()
                .map(|e| Ok((e.tensor.name.clone(), e.file.read_tensor(&e.tensor.name)?)))
                .collect::<ckpt::Result<Vec<_>>>()
        })
        .map_err(ckpt_err)?;
    arrays::to_dict(py, &tensors)
}

/// `build_searched_strategy` as JSON text: per parameter its MindSpore layout fields.
#[pyfunction]
fn build_searched_strategy(file: PathBuf) -> PyResult<String> {
    let s = Strategy::load(&file).map_err(ckpt_err)?;
    let ms = match ckpt::MsStrategyFile::of_strategy(&s).map_err(ckpt_err)? {
        Some(ms) => ms,
        None => {
            let (resolved, _) = s.resolve(|_, _| Ok(None)).map_err(ckpt_err)?;
            ckpt::to_ms_strategy(&file, &resolved, true).map_err(ckpt_err)?
        }
    };
    Ok(ms.searched_strategy_json())
}

/// Merges the per-stage strategy files of `src_dir` into `dst_file`; returns the report.
#[pyfunction]
#[pyo3(signature = (src_dir, dst_file, force=false))]
fn merge_pipeline_strategys<'py>(
    py: Python<'py>,
    src_dir: PathBuf,
    dst_file: PathBuf,
    force: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let r = ckpt::merge_pipeline_strategies(&src_dir, &dst_file, force).map_err(ckpt_err)?;
    let d = PyDict::new(py);
    d.set_item("path", path_str(&r.path))?;
    let merged: Vec<(String, u32)> = r.merged.iter().map(|(p, s)| (path_str(p), *s)).collect();
    d.set_item("merged", merged)?;
    let skipped: Vec<(String, String)> = r
        .skipped
        .iter()
        .map(|(p, why)| (path_str(p), why.clone()))
        .collect();
    d.set_item("skipped", skipped)?;
    Ok(d)
}

/// The ranks whose checkpoint can restore this rank's, from a group-info file.
#[pyfunction]
fn restore_group_info_list(file: PathBuf) -> PyResult<Vec<u32>> {
    ckpt::restore_group_info_list(&file).map_err(ckpt_err)
}

/// Checks a checkpoint against its strategy; returns the findings as a dict.
#[pyfunction]
#[pyo3(signature = (src_dir, strategy, replicas=false))]
fn verify_checkpoint<'py>(
    py: Python<'py>,
    src_dir: PathBuf,
    strategy: PathBuf,
    replicas: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let r = py
        .detach(|| ckpt::verify_checkpoints(&src_dir, &strategy, replicas))
        .map_err(ckpt_err)?;
    let faults = PyList::empty(py);
    for f in &r.faults {
        let d = PyDict::new(py);
        d.set_item("file", path_str(&f.path))?;
        d.set_item("tensor", &f.tensor)?;
        d.set_item("rule", &f.rule)?;
        faults.append(d)?;
    }
    let d = PyDict::new(py);
    d.set_item("ok", r.is_ok())?;
    d.set_item("files", r.n_files)?;
    d.set_item("parameters", r.n_params)?;
    d.set_item("slices", r.n_slices)?;
    d.set_item("replica_pairs", r.n_replica_pairs)?;
    d.set_item("faults", faults)?;
    Ok(d)
}

fn box_dict<'py>(py: Python<'py>, b: &layout::SliceBox) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("offset", &b.offset[..])?;
    d.set_item("shape", &b.shape[..])?;
    Ok(d)
}

/// The plan of a conversion, per destination rank: the minimal source ranks, and for each
/// parameter the rank's box and the pieces it needs, each with the source ranks holding it
/// ([`ckpt::conversion_plan`]; shapes from `src_dir` when given, else from the strategies).
#[pyfunction]
#[pyo3(signature = (src_strategy, dst_strategy=None, src_dir=None, ranks=None))]
fn reshard_plan<'py>(
    py: Python<'py>,
    src_strategy: PathBuf,
    dst_strategy: Option<PathBuf>,
    src_dir: Option<PathBuf>,
    ranks: Option<Vec<usize>>,
) -> PyResult<Bound<'py, PyList>> {
    let src = Strategy::load(&src_strategy).map_err(ckpt_err)?;
    let dst = dst_strategy
        .as_deref()
        .map(Strategy::load)
        .transpose()
        .map_err(ckpt_err)?;
    let shapes = match src_dir.as_deref() {
        None => ckpt::PlanShapes::ScaleFree,
        Some(dir) => ckpt::PlanShapes::Checkpoint(dir),
    };
    let plan = py
        .detach(|| ckpt::conversion_plan(&src, dst.as_ref(), shapes, ranks.as_deref()))
        .map_err(ckpt_err)?;
    let out = PyList::empty(py);
    for rank in &plan {
        let params = PyDict::new(py);
        for p in &rank.params {
            let list = PyList::empty(py);
            for piece in &p.pieces {
                let d = box_dict(py, &piece.region)?;
                d.set_item("holders", &piece.holders)?;
                list.append(d)?;
            }
            let entry = box_dict(py, &p.region)?;
            entry.set_item("global_shape", &p.global_shape)?;
            entry.set_item("pieces", list)?;
            params.set_item(&p.name, entry)?;
        }
        let d = PyDict::new(py);
        d.set_item("rank", rank.rank)?;
        d.set_item("source_ranks", &rank.cover.ranks)?;
        d.set_item("minimal", if rank.cover.exact { "exact" } else { "greedy" })?;
        d.set_item("params", params)?;
        out.append(d)?;
    }
    Ok(out)
}

/// Writes `dst`, the plain `.ckpt` file `src` encrypted as MindSpore's
/// `save_checkpoint(enc_key=key, enc_mode=mode)` writes it (for tests and tools; the
/// `mindspore.parallel` functions only read encrypted files).
#[pyfunction]
#[pyo3(signature = (src, dst, key, mode="AES-GCM", force=false))]
fn encrypt_checkpoint_file(
    src: PathBuf,
    dst: PathBuf,
    key: Vec<u8>,
    mode: &str,
    force: bool,
) -> PyResult<String> {
    let mode: ckpt::CipherMode = mode.parse().map_err(ckpt_err)?;
    ckpt::crypto::encrypt_file(&src, &dst, &key, mode, force)
        .map(|p| path_str(&p))
        .map_err(ckpt_err)
}
