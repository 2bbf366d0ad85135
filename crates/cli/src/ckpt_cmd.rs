//! `tessera ckpt …`: distributed checkpoints (convert, ranks, merge, load, dedup, verify,
//! inspect, diff). Each subcommand validates its flags, makes one `ckpt` call and prints the result
//! as text or, with `--json`, as one JSON object.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use ckpt::{Format, InspectedFile, Progress};
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::{json, Value};

use crate::grid::write_stdout;

/// Arguments of `tessera ckpt`.
#[derive(Debug, Args)]
pub struct CkptArgs {
    #[command(subcommand)]
    command: CkptCommand,
}

#[derive(Debug, Subcommand)]
enum CkptCommand {
    /// Convert a checkpoint from one strategy to another (all destination ranks, or one).
    Convert(ConvertArgs),
    /// The minimal list of source ranks a destination rank needs.
    Ranks(RanksArgs),
    /// Merge all ranks into full tensors (unified safetensors: part files + index).
    Merge(MergeArgs),
    /// Slice a unified checkpoint for a target strategy (`load_distributed_checkpoint`).
    Load(LoadArgs),
    /// Merge every checkpoint file of one directory (`load_segmented_checkpoints`).
    LoadSegmented(LoadSegmentedArgs),
    /// Save a checkpoint without redundancy: each replica group's copy kept by one owner.
    Dedup(DedupArgs),
    /// Print a strategy's redundancy map (replica groups) and the owner of each copy.
    Redundancy(RedundancyArgs),
    /// Check a checkpoint against its strategy; exits non-zero on any fault.
    Verify(VerifyArgs),
    /// Show the tensors of a checkpoint file (or the layouts of a strategy file).
    Inspect(InspectArgs),
    /// Compare two checkpoints of any strategies tensor by tensor; exits 0 only when every
    /// tensor is bitwise equal (or within --tolerance).
    Diff(DiffArgs),
}

/// Flags shared by commands that write files.
#[derive(Debug, Args)]
struct WriteFlags {
    /// Replace destination files that exist.
    #[arg(long)]
    force: bool,
    /// No progress bar.
    #[arg(long, short)]
    quiet: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Do not fsync: leave the written files, the set marker and the directory entries to the
    /// OS page cache, as `cp` does. The output still appears atomically (a failed or killed run
    /// leaves the old checkpoint or the new one, never a mix), but what is given up is
    /// durability: a power loss or OS crash shortly after the command returns may lose the new
    /// checkpoint, or leave its files empty.
    #[arg(long)]
    no_fsync: bool,
}

impl WriteFlags {
    /// The durability `--no-fsync` asks for.
    fn durability(&self) -> ckpt::Durability {
        ckpt::Durability::from_fsync(!self.no_fsync)
    }
}

/// How to read encrypted `.ckpt` sources (MindSpore's `dec_key` / `dec_mode`).
#[derive(Debug, Args)]
struct DecryptFlags {
    /// Decrypt the `.ckpt` sources with this key, given in hex (16, 24 or 32 bytes for AES,
    /// 16 for SM4). Prefer --dec-key-file: a command line is visible to other users.
    #[arg(long, value_name = "HEX", conflicts_with = "dec_key_file")]
    dec_key: Option<String>,
    /// Decrypt the `.ckpt` sources with the key held in this file (its raw bytes).
    #[arg(long, value_name = "PATH")]
    dec_key_file: Option<PathBuf>,
    /// The cipher the sources were encrypted with: AES-GCM (the default), AES-CBC or SM4-CBC.
    #[arg(long, value_name = "MODE")]
    dec_mode: Option<String>,
}

impl DecryptFlags {
    /// The decryption asked for, if any; the key is checked against the mode.
    fn decryption(&self) -> anyhow::Result<Option<ckpt::Decryption>> {
        let key = match (&self.dec_key, &self.dec_key_file) {
            (Some(hex), _) => parse_hex_key(hex)?,
            (None, Some(path)) => std::fs::read(path).with_context(|| {
                format!("--dec-key-file {}: cannot read the key", path.display())
            })?,
            (None, None) if self.dec_mode.is_some() => {
                bail!("--dec-mode needs a key: give --dec-key or --dec-key-file")
            }
            (None, None) => return Ok(None),
        };
        let mode: ckpt::CipherMode = self
            .dec_mode
            .as_deref()
            .unwrap_or("AES-GCM")
            .parse()
            .context("--dec-mode")?;
        Ok(Some(
            ckpt::Decryption::new(&key, mode).context("the decryption key")?,
        ))
    }
}

/// The bytes of a hex key (`--dec-key`): an even number of hex digits.
fn parse_hex_key(hex: &str) -> anyhow::Result<Vec<u8>> {
    let hex = hex.trim();
    if !hex.len().is_multiple_of(2) || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        bail!("--dec-key must be the key in hex (an even number of the digits 0-9a-f)");
    }
    Ok((0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("two hex digits"))
        .collect())
}

#[derive(Debug, Args)]
struct ConvertArgs {
    /// Source checkpoint directory (holding rank_<N>/).
    #[arg(long)]
    src: PathBuf,
    /// Source strategy file (MindSpore protobuf or JSON, or Tessera JSON); without it the
    /// source is unsharded (rank_0/ holds every tensor whole) and --dst-strategy is required.
    #[arg(long)]
    src_strategy: Option<PathBuf>,
    /// Destination directory.
    #[arg(long)]
    dst: PathBuf,
    /// Destination strategy file; without it everything is merged into rank 0.
    #[arg(long)]
    dst_strategy: Option<PathBuf>,
    /// Convert only this destination rank (repeatable).
    #[arg(long)]
    rank: Vec<usize>,
    /// Output format (default: the source's).
    #[arg(long)]
    format: Option<Format>,
    /// Output file-name prefix: rank_<r>/<prefix><r>.<ext>.
    #[arg(long, default_value = "checkpoint_")]
    prefix: String,
    /// Append MindSpore's crc_num trailer to .ckpt output.
    #[arg(long)]
    crc: bool,
    /// Convert even if the source strategy lists parameters no source file holds (reported
    /// as skipped); without it that is an error.
    #[arg(long)]
    allow_missing: bool,
    #[command(flatten)]
    decrypt: DecryptFlags,
    #[command(flatten)]
    write: WriteFlags,
}

#[derive(Debug, Args)]
struct RanksArgs {
    /// Source strategy file.
    #[arg(long)]
    src_strategy: PathBuf,
    /// Destination strategy file; without it, a merge into rank 0.
    #[arg(long)]
    dst_strategy: Option<PathBuf>,
    /// The destination rank.
    #[arg(long)]
    rank: usize,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct MergeArgs {
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

#[derive(Debug, Args)]
struct LoadArgs {
    /// Unified checkpoint directory (param_name_map.json and part files).
    #[arg(long)]
    unified: PathBuf,
    /// Target strategy file.
    #[arg(long)]
    strategy: PathBuf,
    /// Destination directory: rank_<r>/net.<ext>.
    #[arg(long)]
    dst: PathBuf,
    /// Only this destination rank (repeatable).
    #[arg(long)]
    rank: Vec<usize>,
    /// Output format (default: safetensors).
    #[arg(long)]
    format: Option<Format>,
    #[command(flatten)]
    write: WriteFlags,
}

#[derive(Debug, Args)]
struct LoadSegmentedArgs {
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

#[derive(Debug, Args)]
struct DedupArgs {
    /// Source checkpoint directory (holding rank_<N>/).
    #[arg(long)]
    src: PathBuf,
    /// The strategy file.
    #[arg(long)]
    strategy: PathBuf,
    /// Destination directory.
    #[arg(long)]
    dst: PathBuf,
    #[command(flatten)]
    write: WriteFlags,
}

#[derive(Debug, Args)]
struct RedundancyArgs {
    /// The strategy file.
    #[arg(long)]
    strategy: PathBuf,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct VerifyArgs {
    /// Checkpoint directory (holding rank_<N>/).
    #[arg(long)]
    src: PathBuf,
    /// The strategy file.
    #[arg(long)]
    strategy: PathBuf,
    /// Also compare every replica's bytes.
    #[arg(long)]
    replicas: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct DiffArgs {
    /// Checkpoint A: a directory holding rank_<N>/ (a training run's output directory).
    a: PathBuf,
    /// Checkpoint B, of the same or another strategy.
    b: PathBuf,
    /// A's strategy file [default: A/strategy.json, as a training run saves it].
    #[arg(long)]
    strategy_a: Option<PathBuf>,
    /// B's strategy file [default: B/strategy.json].
    #[arg(long)]
    strategy_b: Option<PathBuf>,
    /// Accept tensors whose every element satisfies |a - b| <= T * max(1, |a|, |b|): an
    /// absolute tolerance for values up to 1 in magnitude, a relative one above. Without it,
    /// every tensor must be bitwise equal.
    #[arg(long, value_name = "T")]
    tolerance: Option<f64>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct InspectArgs {
    /// A checkpoint, strategy or group-info file.
    file: PathBuf,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// Runs `tessera ckpt …`.
pub fn run(args: &CkptArgs) -> anyhow::Result<()> {
    match &args.command {
        CkptCommand::Convert(a) => convert(a),
        CkptCommand::Ranks(a) => ranks(a),
        CkptCommand::Merge(a) => merge(a),
        CkptCommand::Load(a) => load(a),
        CkptCommand::LoadSegmented(a) => load_segmented(a),
        CkptCommand::Dedup(a) => dedup(a),
        CkptCommand::Redundancy(a) => redundancy(a),
        CkptCommand::Verify(a) => verify(a),
        CkptCommand::Inspect(a) => inspect(a),
        CkptCommand::Diff(a) => diff(a),
    }
}

/// A progress bar on stderr: hidden when stderr is not a terminal or with `--quiet`.
pub struct Bar(ProgressBar);

impl Bar {
    /// A bar, hidden when `quiet`.
    pub fn new(quiet: bool) -> Bar {
        let bar = if quiet {
            ProgressBar::hidden()
        } else {
            ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr())
        };
        Bar(bar)
    }
}

impl Progress for Bar {
    fn start(&self, label: &str, total_bytes: u64) {
        self.0.set_length(total_bytes);
        self.0.set_position(0);
        self.0.set_style(
            ProgressStyle::with_template(
                "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
            )
            .expect("a valid template")
            .progress_chars("=> "),
        );
        self.0.set_message(label.to_string());
    }
    fn advance(&self, bytes: u64) {
        self.0.inc(bytes);
    }
    fn finish(&self) {
        self.0.finish_and_clear();
    }
}

fn print(json: bool, value: Value, text: String) -> anyhow::Result<()> {
    if json {
        let mut s = serde_json::to_string_pretty(&value)?;
        s.push('\n');
        write_stdout(&s)
    } else {
        write_stdout(&text)
    }
}

fn path_str(p: &Path) -> String {
    p.display().to_string()
}

fn convert_report_json(report: &ckpt::ConvertReport) -> Value {
    json!({
        "ranks": report.ranks.iter().map(|r| json!({
            "rank": r.rank,
            "path": path_str(&r.path),
            "source_ranks": r.source_ranks,
            "minimal": if r.exact { "exact" } else { "greedy" },
            "tensors": r.n_tensors,
            "bytes": r.data_bytes,
        })).collect::<Vec<_>>(),
        "skipped": report.skipped.iter().map(|(n, why)| json!({"name": n, "reason": why})).collect::<Vec<_>>(),
    })
}

fn convert_report_text(report: &ckpt::ConvertReport) -> String {
    let mut out = String::new();
    for r in &report.ranks {
        out.push_str(&format!(
            "rank {}: {} ({} tensors, {}) from source ranks {:?} ({})\n",
            r.rank,
            r.path.display(),
            r.n_tensors,
            bench::timing::human_bytes(r.data_bytes as usize),
            r.source_ranks,
            if r.exact { "minimal" } else { "greedy cover" }
        ));
    }
    for (name, why) in &report.skipped {
        out.push_str(&format!("skipped {name:?}: {why}\n"));
    }
    out
}

fn convert(a: &ConvertArgs) -> anyhow::Result<()> {
    let decryption = a.decrypt.decryption()?;
    let bar = Bar::new(a.write.quiet || a.write.json);
    let ranks = (!a.rank.is_empty()).then_some(a.rank.as_slice());
    let opts = ckpt::ConvertOptions {
        format: a.format,
        prefix: &a.prefix,
        ranks,
        force: a.write.force,
        crc: a.crc,
        allow_missing: a.allow_missing,
        progress: &bar,
        decryption: decryption.as_ref(),
        fsync: !a.write.no_fsync,
        ..Default::default()
    };
    let report = match (&a.src_strategy, &a.dst_strategy) {
        (Some(src), dst) => ckpt::convert_checkpoints(&a.src, src, &a.dst, dst.as_deref(), &opts),
        (None, Some(dst)) => ckpt::convert_unsharded(&a.src, &a.dst, dst, &opts),
        (None, None) => bail!(
            "give --src-strategy, --dst-strategy or both: without either there is nothing to convert"
        ),
    }
    .context("checkpoint conversion failed")?;
    print(
        a.write.json,
        convert_report_json(&report),
        convert_report_text(&report),
    )
}

fn ranks(a: &RanksArgs) -> anyhow::Result<()> {
    let src = ckpt::Strategy::load(&a.src_strategy)?;
    let dst = a
        .dst_strategy
        .as_deref()
        .map(ckpt::Strategy::load)
        .transpose()?;
    let cover = ckpt::minimal_rank_list(&src, dst.as_ref(), a.rank)?;
    let how = if cover.exact { "exact" } else { "greedy" };
    print(
        a.json,
        json!({"rank": a.rank, "source_ranks": cover.ranks, "minimal": how}),
        format!(
            "destination rank {} needs source ranks {:?} ({} minimum)\n",
            a.rank, cover.ranks, how
        ),
    )
}

fn merge(a: &MergeArgs) -> anyhow::Result<()> {
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

fn load(a: &LoadArgs) -> anyhow::Result<()> {
    let bar = Bar::new(a.write.quiet || a.write.json);
    let ranks = (!a.rank.is_empty()).then_some(a.rank.as_slice());
    let opts = ckpt::ConvertOptions {
        format: a.format,
        ranks,
        force: a.write.force,
        progress: &bar,
        fsync: !a.write.no_fsync,
        ..Default::default()
    };
    let report = ckpt::load_distributed_checkpoint(&a.unified, &a.strategy, &a.dst, &opts)
        .context("loading the unified checkpoint failed")?;
    print(
        a.write.json,
        convert_report_json(&report),
        convert_report_text(&report),
    )
}

fn load_segmented(a: &LoadSegmentedArgs) -> anyhow::Result<()> {
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

fn dedup(a: &DedupArgs) -> anyhow::Result<()> {
    let bar = Bar::new(a.write.quiet || a.write.json);
    let r = ckpt::dedup_checkpoints(
        &a.src,
        &a.strategy,
        &a.dst,
        a.write.force,
        a.write.durability(),
        &bar,
    )
    .context("saving without redundancy failed")?;
    let mut text = String::new();
    for (rank, path, names) in &r.ranks {
        text.push_str(&format!(
            "rank {rank}: {} keeps {}\n",
            path.display(),
            names.join(", ")
        ));
    }
    text.push_str(&format!(
        "{} written of {} in the source\n",
        bench::timing::human_bytes(r.data_bytes as usize),
        bench::timing::human_bytes(r.source_bytes as usize)
    ));
    print(
        a.write.json,
        json!({
            "ranks": r.ranks.iter().map(|(rank, p, n)| json!({"rank": rank, "path": path_str(p), "tensors": n})).collect::<Vec<_>>(),
            "bytes_written": r.data_bytes,
            "bytes_source": r.source_bytes,
        }),
        text,
    )
}

fn redundancy(a: &RedundancyArgs) -> anyhow::Result<()> {
    let map = ckpt::redundancy_of_file(&a.strategy)?;
    let owners = ckpt::remove_param_redundancy(&map);
    let mut text = String::from("replica groups:\n");
    let mut groups = serde_json::Map::new();
    for (name, g) in &map {
        text.push_str(&format!("  {name:<32} {g:?}\n"));
        groups.insert(name.clone(), json!(g));
    }
    text.push_str("owners (one copy per replica group):\n");
    let mut own = serde_json::Map::new();
    for (rank, names) in &owners {
        let names: Vec<&String> = names.iter().collect();
        text.push_str(&format!("  rank {rank}: {names:?}\n"));
        own.insert(rank.to_string(), json!(names));
    }
    print(
        a.json,
        json!({"get_parameter_redundancy": groups, "remove_param_redundancy": own}),
        text,
    )
}

fn verify(a: &VerifyArgs) -> anyhow::Result<()> {
    let r = ckpt::verify_checkpoints(&a.src, &a.strategy, a.replicas)?;
    let mut text = format!(
        "{} files, {} parameters, {} slices checked, {} replica pairs compared\n",
        r.n_files, r.n_params, r.n_slices, r.n_replica_pairs
    );
    for f in &r.faults {
        text.push_str(&format!("FAULT {f}\n"));
    }
    text.push_str(if r.is_ok() { "OK\n" } else { "FAILED\n" });
    print(
        a.json,
        json!({
            "ok": r.is_ok(),
            "files": r.n_files,
            "parameters": r.n_params,
            "slices": r.n_slices,
            "replica_pairs": r.n_replica_pairs,
            "faults": r.faults.iter().map(|f| json!({"path": path_str(&f.path), "tensor": f.tensor, "rule": f.rule})).collect::<Vec<_>>(),
        }),
        text,
    )?;
    if !r.is_ok() {
        bail!("{} fault(s) found", r.faults.len());
    }
    Ok(())
}

/// The status word of one tensor of `tessera ckpt diff`.
fn diff_status(t: &ckpt::TensorDiff, tolerance: Option<f64>) -> &'static str {
    match &t.comparison {
        ckpt::TensorComparison::ShapeMismatch { .. } => "SHAPE",
        ckpt::TensorComparison::DTypeMismatch { .. } => "DTYPE",
        ckpt::TensorComparison::Compared(_) if t.bitwise_equal() => "EQUAL",
        ckpt::TensorComparison::Compared(_) if tolerance.is_some_and(|tol| t.within(tol)) => {
            "WITHIN"
        }
        ckpt::TensorComparison::Compared(_) => "DIFFERS",
    }
}

fn diff(a: &DiffArgs) -> anyhow::Result<()> {
    if let Some(tol) = a.tolerance {
        if !(tol.is_finite() && tol >= 0.0) {
            bail!("--tolerance {tol} must be a finite number >= 0");
        }
    }
    let strategy_a = a
        .strategy_a
        .clone()
        .unwrap_or_else(|| a.a.join("strategy.json"));
    let strategy_b = a
        .strategy_b
        .clone()
        .unwrap_or_else(|| a.b.join("strategy.json"));
    for (dir, strategy, flag) in [(&a.a, &strategy_a, "a"), (&a.b, &strategy_b, "b")] {
        if !strategy.is_file() {
            bail!(
                "{}: no strategy file {} (a training run saves strategy.json beside its \
                 rank folders; name another with --strategy-{flag})",
                dir.display(),
                strategy.display()
            );
        }
    }
    let side_a = ckpt::DiffSide {
        dir: &a.a,
        strategy: &strategy_a,
    };
    let side_b = ckpt::DiffSide {
        dir: &a.b,
        strategy: &strategy_b,
    };
    let report = ckpt::diff_checkpoints(&side_a, &side_b, &mut |_| {})
        .with_context(|| format!("comparing {} with {}", a.a.display(), a.b.display()))?;
    let ok = match a.tolerance {
        Some(tol) => report.within(tol),
        None => report.bitwise_equal(),
    };
    let mut text = String::new();
    let width = report
        .tensors
        .iter()
        .map(|t| t.name.len())
        .max()
        .unwrap_or(0);
    for t in &report.tensors {
        let dtype = t.dtype.map_or("?".to_string(), |d| d.to_string());
        let detail = match &t.comparison {
            ckpt::TensorComparison::Compared(s) => format!(
                "max abs {:.3e}  max rel {:.3e}  {} of {} elements differ",
                s.max_abs,
                s.max_rel,
                s.n_differing,
                t.shape.iter().product::<usize>()
            ),
            ckpt::TensorComparison::ShapeMismatch { a: sa, b: sb } => {
                format!("shape {sa:?} in A but {sb:?} in B")
            }
            ckpt::TensorComparison::DTypeMismatch { a: da, b: db } => {
                format!("dtype {da} in A but {db} in B")
            }
        };
        text.push_str(&format!(
            "{:<7}  {:<width$}  {:<16}  {detail}\n",
            diff_status(t, a.tolerance),
            t.name,
            format!("{dtype}{:?}", t.shape),
        ));
    }
    for name in &report.only_in_a {
        text.push_str(&format!("ONLY-A   {name}  (not in {})\n", a.b.display()));
    }
    for name in &report.only_in_b {
        text.push_str(&format!("ONLY-B   {name}  (not in {})\n", a.a.display()));
    }
    let count = |status: &str| {
        report
            .tensors
            .iter()
            .filter(|t| diff_status(t, a.tolerance) == status)
            .count()
    };
    let n_bad: Vec<&str> = report
        .tensors
        .iter()
        .filter(|t| !matches!(diff_status(t, a.tolerance), "EQUAL" | "WITHIN"))
        .map(|t| t.name.as_str())
        .collect();
    text.push_str(&format!(
        "{} tensors compared: {} bitwise equal, {} within tolerance, {} different; {} only in \
         A, {} only in B\n{}\n",
        report.tensors.len(),
        count("EQUAL"),
        count("WITHIN"),
        n_bad.len(),
        report.only_in_a.len(),
        report.only_in_b.len(),
        if ok { "OK" } else { "DIFFERENT" }
    ));
    let tensors: Vec<Value> = report
        .tensors
        .iter()
        .map(|t| {
            let mut v = json!({
                "name": t.name,
                "shape": t.shape,
                "dtype": t.dtype.map(|d| d.to_string()),
                "status": diff_status(t, a.tolerance).to_lowercase(),
                "bitwise_equal": t.bitwise_equal(),
            });
            match &t.comparison {
                ckpt::TensorComparison::Compared(s) => {
                    v["differing_elements"] = json!(s.n_differing);
                    v["max_abs"] = json!(s.max_abs);
                    v["max_rel"] = json!(s.max_rel);
                    v["max_scaled"] = json!(s.max_scaled);
                }
                ckpt::TensorComparison::ShapeMismatch { a: sa, b: sb } => {
                    v["shape_b"] = json!(sb);
                    v["shape"] = json!(sa);
                }
                ckpt::TensorComparison::DTypeMismatch { a: da, b: db } => {
                    v["dtype"] = json!(da.to_string());
                    v["dtype_b"] = json!(db.to_string());
                }
            }
            v
        })
        .collect();
    print(
        a.json,
        json!({
            "ok": ok,
            "bitwise_equal": report.bitwise_equal(),
            "tolerance": a.tolerance,
            "tensors": tensors,
            "only_in_a": report.only_in_a,
            "only_in_b": report.only_in_b,
        }),
        text,
    )?;
    if ok {
        return Ok(());
    }
    let mut reasons = Vec::new();
    let list = |names: &[&str]| {
        let shown: Vec<&str> = names.iter().take(8).copied().collect();
        let more = names.len().saturating_sub(shown.len());
        let mut s = shown.join(", ");
        if more > 0 {
            s.push_str(&format!(" and {more} more"));
        }
        s
    };
    if !n_bad.is_empty() {
        let what = match a.tolerance {
            Some(tol) => format!("beyond the tolerance {tol}"),
            None => "not bitwise equal".to_string(),
        };
        reasons.push(format!(
            "{} tensor(s) {what}: {}",
            n_bad.len(),
            list(&n_bad)
        ));
    }
    for (names, here, there) in [
        (&report.only_in_a, &a.a, &a.b),
        (&report.only_in_b, &a.b, &a.a),
    ] {
        if !names.is_empty() {
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            reasons.push(format!(
                "{} tensor(s) only in {} (missing from {}): {}",
                names.len(),
                here.display(),
                there.display(),
                list(&names)
            ));
        }
    }
    bail!("the checkpoints differ: {}", reasons.join("; "))
}

fn inspect(a: &InspectArgs) -> anyhow::Result<()> {
    let (file, detected) = ckpt::inspect_detected(&a.file)?;
    // Strategy and group-info listings have their own JSON; the detection goes beside it.
    if !matches!(file, InspectedFile::Checkpoint(_)) {
        if a.json {
            eprintln!("detected: {detected}");
        } else {
            println!("detected: {detected}");
        }
    }
    match file {
        InspectedFile::Checkpoint(f) => {
            let mut text = format!(
                "{} ({} checkpoint, {} tensors)\ndetected: {detected}\n",
                f.path().display(),
                f.format(),
                f.tensors().len()
            );
            if !f.metadata().is_empty() {
                text.push_str(&format!("metadata: {:?}\n", f.metadata()));
            }
            if let Some(crc) = f.crc() {
                text.push_str(&format!("crc_num: {crc} (verified)\n"));
            }
            for t in f.tensors() {
                text.push_str(&format!(
                    "  {:<32} {:<9} {:<16} {:>10} bytes{}\n",
                    t.name,
                    t.ty.mindspore_name(),
                    format!("{:?}", t.shape),
                    t.n_bytes,
                    if t.n_chunks() > 1 {
                        format!(" in {} chunks", t.n_chunks())
                    } else {
                        String::new()
                    }
                ));
            }
            print(
                a.json,
                json!({
                    "kind": "checkpoint",
                    "format": f.format().to_string(),
                    "detected": detected,
                    "metadata": f.metadata(),
                    "crc": f.crc(),
                    "tensors": f.tensors().iter().map(|t| json!({
                        "name": t.name, "dtype": t.ty.mindspore_name(), "shape": t.shape,
                        "bytes": t.n_bytes, "chunks": t.n_chunks(),
                    })).collect::<Vec<_>>(),
                }),
                text,
            )
        }
        InspectedFile::Strategy(s) => crate::strategy_cmd::show_strategy(&s, a.json),
        InspectedFile::GroupInfo(g) => crate::strategy_cmd::show_group_info(&g, a.json),
    }
}
