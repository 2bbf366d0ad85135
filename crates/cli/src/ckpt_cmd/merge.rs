//! `tessera ckpt merge` and `load-segmented`: full tensors from every rank of a checkpoint,
//! or from every file of one directory.

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Args;
use serde_json::json;

use super::flags::{
    check_dest_dir, check_input_dir, check_input_file, DecryptFlags, WriteFlags, CHECKPOINT_DIR,
    STRATEGY_FILE,
};
use super::output::{path_str, print, Bar};

/// Arguments of `tessera ckpt merge`.
#[derive(Debug, Args)]
pub(super) struct MergeArgs {
    /// Source checkpoint directory (holding rank_<N>/).
    #[arg(long)]
    src: PathBuf,
    /// The source strategy file.
    #[arg(long)]
    strategy: PathBuf,
    /// Destination directory.
    #[arg(long)]
    dst: PathBuf,
    /// Target size of one part file, in bytes.
    #[arg(long, default_value_t = ckpt::DEFAULT_PART_BYTES)]
    max_part_bytes: u64,
    /// The sources were saved without redundancy.
    #[arg(long)]
    dedup: bool,
    /// Merge only the safetensors files named `*<SUFFIX>.safetensors` in each rank directory
    /// (MindSpore's `file_suffix`).
    #[arg(long, value_name = "SUFFIX")]
    file_suffix: Option<String>,
    /// Write only run K of TOTAL of the part files, the index and hyper-parameter file only in
    /// run 1 (MindSpore's `split_dst_file`); TOTAL runs into one directory write everything.
    #[arg(long, value_name = "K/TOTAL", value_parser = parse_split)]
    split: Option<(usize, usize)>,
    #[command(flatten)]
    write: WriteFlags,
}

/// `K/TOTAL` of `--split`.
fn parse_split(s: &str) -> Result<(usize, usize), String> {
    let (k, total) = s
        .split_once('/')
        .ok_or_else(|| format!("{s:?} is not K/TOTAL"))?;
    let num = |v: &str| {
        v.trim()
            .parse::<usize>()
            .map_err(|_| format!("{v:?} is not a number"))
    };
    Ok((num(k)?, num(total)?))
}

/// Arguments of `tessera ckpt load-segmented`.
#[derive(Debug, Args)]
pub(super) struct LoadSegmentedArgs {
    /// Directory of checkpoint files.
    dir: PathBuf,
    /// Also write the merged tensors to this file (.ckpt or .safetensors).
    #[arg(long)]
    out: Option<PathBuf>,
    #[command(flatten)]
    decrypt: DecryptFlags,
    #[command(flatten)]
    write: WriteFlags,
}

/// Runs `tessera ckpt merge`.
pub(super) fn merge(a: &MergeArgs) -> anyhow::Result<()> {
    check_input_dir("--src", &a.src, CHECKPOINT_DIR)?;
    check_input_file("--strategy", &a.strategy, STRATEGY_FILE)?;
    check_dest_dir("--dst", &a.dst)?;
    if a.max_part_bytes == 0 {
        bail!("--max-part-bytes must be positive");
    }
    let bar = Bar::new(a.write.quiet || a.write.json);
    let opts = ckpt::MergeOptions {
        max_part_bytes: a.max_part_bytes,
        dedup: a.dedup,
        force: a.write.force,
        progress: &bar,
        file_suffix: a.file_suffix.as_deref(),
        split: a.split,
        fsync: !a.write.no_fsync,
        ..Default::default()
    };
    let r =
        ckpt::unified_safetensors(&a.src, &a.strategy, &a.dst, &opts).context("merge failed")?;
    for w in &r.warnings {
        eprintln!("warning: {w}");
    }
    let mut text = String::new();
    for (path, names) in &r.parts {
        text.push_str(&format!("{}: {}\n", path.display(), names.join(", ")));
    }
    if let Some(index) = &r.index {
        text.push_str(&format!("{}\n", index.display()));
    }
    if let Some(h) = &r.hyper {
        text.push_str(&format!("{}\n", h.display()));
    }
    text.push_str(&format!(
        "{} of full tensors from source ranks {:?}\n",
        bench::timing::human_bytes(r.total_size as usize),
        r.source_ranks
    ));
    for (name, why) in &r.skipped {
        text.push_str(&format!("skipped {name:?}: {why}\n"));
    }
    print(
        a.write.json,
        json!({
            "parts": r.parts.iter().map(|(p, n)| json!({"path": path_str(p), "tensors": n})).collect::<Vec<_>>(),
            "index": r.index.as_deref().map(path_str),
            "hyper_param": r.hyper.as_deref().map(path_str),
            "source_ranks": r.source_ranks,
            "total_size": r.total_size,
            "skipped": r.skipped.iter().map(|(n, why)| json!({"name": n, "reason": why})).collect::<Vec<_>>(),
            "warnings": r.warnings,
        }),
        text,
    )
}

/// Whether the file `out` would be written into the directory `dir` (compared canonically, so
/// `./x/../dir/merged.ckpt` is in `dir`); `false` when either cannot be resolved.
fn lands_in(out: &std::path::Path, dir: &std::path::Path) -> bool {
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => std::path::Path::new("."),
    };
    match (parent.canonicalize(), dir.canonicalize()) {
        (Ok(parent), Ok(dir)) => parent == dir,
        _ => false,
    }
}

/// Runs `tessera ckpt load-segmented`.
pub(super) fn load_segmented(a: &LoadSegmentedArgs) -> anyhow::Result<()> {
    runtime::check_input_path(
        "checkpoint directory",
        &a.dir,
        runtime::PathKind::Directory,
        "a directory (of segmented checkpoint files)",
    )?;
    if let Some(out) = &a.out {
        runtime::check_output_path(
            "--out",
            out,
            runtime::PathKind::File,
            "a file to write (ending in .ckpt or .safetensors)",
        )?;
        if lands_in(out, &a.dir) {
            eprintln!(
                "warning: --out {} is in the checkpoint directory {}: a later load-segmented of \
                 that directory reads it as one more segment, whose tensors stand in for the \
                 parts' by file name order (MindSpore's rule: the later file wins); write it \
                 elsewhere to keep the segments alone",
                out.display(),
                a.dir.display()
            );
        }
    }
    let decryption = a.decrypt.decryption()?;
    let entries = ckpt::load_segmented_checkpoints_with(&a.dir, decryption.as_ref())?;
    let written = match &a.out {
        Some(out) => {
            let bar = Bar::new(a.write.quiet || a.write.json);
            Some(ckpt::write_segmented(
                &entries,
                out,
                a.write.force,
                a.write.durability(),
                &bar,
            )?)
        }
        None => None,
    };
    let mut text = String::new();
    let mut tensors = serde_json::Map::new();
    for e in &entries {
        text.push_str(&format!(
            "{:<32} {:<9} {:?}  ({})\n",
            e.tensor.name,
            e.tensor.ty.mindspore_name(),
            e.tensor.shape,
            e.file.path().display()
        ));
        tensors.insert(
            e.tensor.name.clone(),
            json!({"shape": e.tensor.shape, "dtype": e.tensor.ty.mindspore_name(), "file": path_str(e.file.path())}),
        );
    }
    if let Some(p) = &written {
        text.push_str(&format!("wrote {}\n", p.display()));
    }
    print(
        a.write.json,
        json!({"tensors": tensors, "written": written.as_deref().map(path_str)}),
        text,
    )
}
