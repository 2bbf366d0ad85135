//! Converting a checkpoint from one strategy to another: `convert_checkpoints`,
//! `convert_checkpoint_by_rank`, and `load_distributed_checkpoint` (a unified checkpoint
//! sliced for a target strategy).
//!
//! Every destination file is planned before the first byte is written (strategies resolved,
//! source covers solved, source headers checked, destinations checked for existence), so a bad
//! input fails before anything is created; then files are written one by one, each atomically
//! (two at a time for safetensors output without fsync, [`super::engine::fan_out`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::engine::execute::write_items;
use super::engine::fan_out;
use super::engine::options::{data_bytes, WriteOptions, DEFAULT_CHUNK_BYTES};
use super::engine::plan::{plan_rank, Extras, OutItem, RankPlan};
use crate::error::{CkptError, Result};
use crate::format::crypto::Decryption;
use crate::format::{tessera_strategy, Format};
use crate::io::atomic_write::{write_file_with, Committer};
use crate::io::durability::Durability;
use crate::model::{OpStrategyRecord, ResolvedStrategy, ShapeHint, Strategy};
use crate::progress::{stop_point, NoProgress, Progress};
use crate::set::{SetWriter, SET_STRATEGY_FILE};
use crate::source::{rank_file_path, CheckpointFile, SourceSet};

/// Options of a conversion.
#[derive(Clone, Copy)]
pub struct ConvertOptions<'a> {
    /// Output format; `None` keeps the source's.
    pub format: Option<Format>,
    /// File-name prefix: `rank_<r>/<prefix><r>.<ext>`.
    pub prefix: &'a str,
    /// Only these destination ranks (`None`: all); a rank listed twice is converted once.
    pub ranks: Option<&'a [usize]>,
    /// Replace existing destination files.
    pub force: bool,
    /// Append MindSpore's `crc_num` trailer to `.ckpt` output.
    pub crc: bool,
    /// Convert even when the source or destination strategy lists parameters that no source
    /// file holds (they are reported as skipped); otherwise that is an error, as `verify` calls
    /// it a fault.
    pub allow_missing: bool,
    /// Largest chunk of one tensor held in memory by one writing thread (without fsync,
    /// safetensors output is written by two threads, a file each).
    pub chunk_bytes: usize,
    /// Progress sink; it can stop the conversion before its commit
    /// ([`Progress::stop_requested`], [`CkptError::Stopped`]).
    pub progress: &'a dyn Progress,
    /// Output names of renamed tensors (name in the source → name written): MindSpore's
    /// `name_map` of `load_distributed_checkpoint`. Strategies and sources use the source names.
    pub name_map: Option<&'a BTreeMap<String, String>>,
    /// How to read encrypted `.ckpt` sources (MindSpore's `dec_key` / `dec_mode`).
    pub decryption: Option<&'a Decryption>,
    /// Flush every file, the set marker and the directories to disk before the conversion
    /// returns (default). Off ([`crate::Durability::OsBuffered`]), the output is still written
    /// atomically (the old set or the new one, never a mix, if the process fails or is killed),
    /// but a power loss or OS crash soon after may lose it. Safetensors output is then written
    /// two files at a time.
    pub fsync: bool,
}

impl Default for ConvertOptions<'_> {
    fn default() -> Self {
        ConvertOptions {
            format: None,
            prefix: "checkpoint_",
            ranks: None,
            force: false,
            crc: false,
            allow_missing: false,
            chunk_bytes: DEFAULT_CHUNK_BYTES,
            progress: &NoProgress,
            name_map: None,
            decryption: None,
            fsync: true,
        }
    }
}

impl<'a> ConvertOptions<'a> {
    /// The durability [`ConvertOptions::fsync`] asks for.
    pub fn durability(&self) -> Durability {
        Durability::from_fsync(self.fsync)
    }

    /// The options of writing one file of this conversion in `format`.
    pub(crate) fn write_options(
        &self,
        format: Format,
        committer: Option<&'a Committer>,
    ) -> WriteOptions<'a> {
        WriteOptions {
            format,
            force: self.force,
            crc: self.crc,
            chunk_bytes: self.chunk_bytes,
            progress: self.progress,
            durability: self.durability(),
            committer,
            rename: self.name_map,
        }
    }
}

impl std::fmt::Debug for ConvertOptions<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConvertOptions")
            .field("format", &self.format)
            .field("prefix", &self.prefix)
            .field("ranks", &self.ranks)
            .field("force", &self.force)
            .field("crc", &self.crc)
            .field("allow_missing", &self.allow_missing)
            .field("chunk_bytes", &self.chunk_bytes)
            .field("fsync", &self.fsync)
            .finish()
    }
}

/// What one destination rank's conversion did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankReport {
    /// The destination rank.
    pub rank: usize,
    /// The file written.
    pub path: PathBuf,
    /// The source ranks read (a minimal cover of what this rank needs).
    pub source_ranks: Vec<usize>,
    /// Whether `source_ranks` is proven minimal.
    pub exact: bool,
    /// Tensors written.
    pub n_tensors: usize,
    /// Bytes of tensor data written.
    pub data_bytes: u64,
}

/// What a conversion did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConvertReport {
    /// One entry per destination rank written.
    pub ranks: Vec<RankReport>,
    /// Parameters left out, with the reason.
    pub skipped: Vec<(String, String)>,
}

/// MindSpore's `convert_checkpoints`: converts the checkpoint in `src_dir/rank_<r>/` saved
/// under `src_strategy` to `dst_strategy` (`None`: everything merged into rank 0), writing
/// `dst_dir/rank_<r>/<prefix><r>.<ext>`.
///
/// Parameters outside the source strategy are copied from source rank `r % n_src` as MindSpore
/// does; source parameters the destination strategy lacks are written whole.
///
/// The output set also holds the source set's layout-independent side files
/// (`model.json`, `train_state.json`, when its marker lists them) and, with a `dst_strategy`,
/// that strategy as [`SET_STRATEGY_FILE`] (Tessera JSON, whatever flavour `dst_strategy` is
/// in), so that a run resumes from the output as from the source set.
pub fn convert_checkpoints(
    src_dir: &Path,
    src_strategy: &Path,
    dst_dir: &Path,
    dst_strategy: Option<&Path>,
    opts: &ConvertOptions<'_>,
) -> Result<ConvertReport> {
    convert_from(src_dir, Some(src_strategy), dst_dir, dst_strategy, opts)
}

/// [`convert_checkpoints`] from a sharded (`Some` strategy) or unsharded (`None`) source.
fn convert_from(
    src_dir: &Path,
    src_strategy: Option<&Path>,
    dst_dir: &Path,
    dst_strategy: Option<&Path>,
    opts: &ConvertOptions<'_>,
) -> Result<ConvertReport> {
    let sources = SourceSet::rank_dirs(src_dir)?.with_decryption(opts.decryption.cloned());
    let dst_strategy = dst_strategy.map(Strategy::load).transpose()?;
    let src_strategy = src_strategy
        .map(|path| sources.load_strategy(path))
        .transpose()?;
    let ResolvedConversion {
        src: src_res,
        dst: dst_res,
        skipped,
    } = resolve_conversion(
        &sources,
        src_dir,
        src_strategy.as_ref(),
        dst_strategy.as_ref(),
        opts.allow_missing,
    )?;
    let extras = |rank: usize| Extras {
        src_only_params: dst_strategy.is_some(),
        home_rank: Some(rank % src_res.n_ranks().max(1)),
    };
    let dst_ops = dst_strategy.as_ref().map(|s| s.ops.as_slice());
    write_rank_dirs(
        &sources, &src_res, &dst_res, extras, src_dir, dst_dir, dst_ops, opts, skipped,
    )
}

/// Both strategies of a conversion bound to shapes, and the parameters left out with why.
pub(crate) struct ResolvedConversion {
    /// The source strategy, bound to the source files' shapes.
    pub src: ResolvedStrategy,
    /// The destination strategy (or everything merged on one rank).
    pub dst: ResolvedStrategy,
    /// Parameters left out, with the reason.
    pub skipped: Vec<(String, String)>,
}

/// Resolves both strategies of a conversion reading `sources` (found under `src_dir`): the
/// source against the files (`None`: an unsharded source, source rank 0's file holding every
/// tensor whole), the destination against the source (`None`: everything merged into rank 0).
/// Returns them with the parameters left out and why. A source or destination strategy listing
/// parameters no source file holds is an error unless `allow_missing`.
pub(crate) fn resolve_conversion(
    sources: &SourceSet,
    src_dir: &Path,
    src_strategy: Option<&Strategy>,
    dst_strategy: Option<&Strategy>,
    allow_missing: bool,
) -> Result<ResolvedConversion> {
    let (src_res, mut skipped) = match src_strategy {
        Some(src) => resolve_source(sources, src_dir, src, allow_missing)?,
        None => (unsharded_source(sources, src_dir)?, Vec::new()),
    };
    let dst_res = match dst_strategy {
        Some(dst) => {
            let why = "in the destination strategy but not in the source checkpoint";
            let (res, unknown) = bind_target(dst, &src_res, sources, why)?;
            // Parameters with a shape of their own bind without any source: they are absent
            // all the same when neither the source strategy nor the source files hold them.
            let extras = sources.extras_file(0)?;
            let unsourced = res.params().iter().filter(|p| {
                src_res.param(&p.name).is_none()
                    && extras.as_ref().and_then(|f| f.tensor(&p.name)).is_none()
            });
            let absent: Vec<(String, String)> = unknown
                .into_iter()
                .chain(unsourced.map(|p| (p.name.clone(), why.to_string())))
                .collect();
            if let (false, Some((name, _))) = (allow_missing, absent.first()) {
                return Err(CkptError::TensorMissing {
                    path: src_dir.to_path_buf(),
                    tensor: name.clone(),
                    rule: format!(
                        "the destination strategy {} lists it (and {} more parameters the source checkpoint does not hold), so the output would not load under that strategy; is it the strategy of another model? (pass --allow-missing to convert without them)",
                        dst.path.display(),
                        absent.len() - 1
                    ),
                });
            }
            skipped.extend(absent);
            res
        }
        None => src_res.merged()?,
    };
    Ok(ResolvedConversion {
        src: src_res,
        dst: dst_res,
        skipped,
    })
}

/// The source strategy `src` bound to the files of `sources`, with the parameters
/// it lists that no file holds (an error unless `allow_missing`).
fn resolve_source(
    sources: &SourceSet,
    src_dir: &Path,
    src: &Strategy,
    allow_missing: bool,
) -> Result<(ResolvedStrategy, Vec<(String, String)>)> {
    let (src_res, src_unknown) = sources.resolve_source(src)?;
    if let (false, Some(name)) = (allow_missing, src_unknown.first()) {
        return Err(CkptError::TensorMissing {
            path: src_dir.to_path_buf(),
            tensor: name.clone(),
            rule: format!(
                "{} lists it (and {} more parameters no rank file holds); the checkpoint is incomplete (pass --allow-missing to convert without them)",
                src.path.display(),
                src_unknown.len() - 1
            ),
        });
    }
    let skipped = src_unknown
        .into_iter()
        .map(|n| {
            (
                n,
                "in the source strategy but in no source file".to_string(),
            )
        })
        .collect();
    Ok((src_res, skipped))
}

/// An unsharded source: source rank 0's file holds every tensor whole, on one rank. Folders of
/// other ranks mean a sharded checkpoint, which is refused: rank 0's shards are not the tensors.
pub(crate) fn unsharded_source(sources: &SourceSet, src_dir: &Path) -> Result<ResolvedStrategy> {
    if let Some(ranks) = sources.rank_files() {
        if ranks.files.keys().any(|&r| r != 0) {
            return Err(CkptError::UnshardedSource {
                ranks: ranks.files.keys().copied().collect(),
            });
        }
    }
    let file = sources.rank_file(0)?.ok_or(CkptError::MissingRank {
        path: src_dir.to_path_buf(),
        rank: 0,
    })?;
    let params: Vec<_> = file
        .tensors()
        .iter()
        .filter_map(|t| {
            t.dtype()
                .map(|d| (t.name.clone(), t.shape.clone(), Some(d)))
        })
        .collect();
    ResolvedStrategy::single_rank(&params)
}

/// MindSpore's `convert_checkpoints` with `src_strategy_file=None`: the checkpoint in
/// `src_dir/rank_0/` holds every tensor whole (an unsharded checkpoint); each is sliced for
/// `dst_strategy`, and tensors the strategy lacks are copied whole to every rank.
pub fn convert_unsharded(
    src_dir: &Path,
    dst_dir: &Path,
    dst_strategy: &Path,
    opts: &ConvertOptions<'_>,
) -> Result<ConvertReport> {
    convert_from(src_dir, None, dst_dir, Some(dst_strategy), opts)
}

/// MindSpore's `convert_checkpoint_by_rank`: converts one destination rank.
pub fn convert_checkpoint_by_rank(
    rank: usize,
    src_dir: &Path,
    src_strategy: &Path,
    dst_dir: &Path,
    dst_strategy: Option<&Path>,
    opts: &ConvertOptions<'_>,
) -> Result<ConvertReport> {
    let ranks = [rank];
    let opts = ConvertOptions {
        ranks: Some(&ranks),
        ..*opts
    };
    convert_checkpoints(src_dir, src_strategy, dst_dir, dst_strategy, &opts)
}

/// MindSpore's `load_distributed_checkpoint` in save mode: slices the unified checkpoint in
/// `unified_dir` (see [`crate::unified_safetensors`]) for `strategy`, writing
/// `dst_dir/rank_<r>/net.<ext>`. Parameters of `hyper_param.safetensors` go to every rank;
/// parameters of the part files that `strategy` does not list are left out and reported as
/// skipped, as MindSpore leaves them out (they are not the target network's).
pub fn load_distributed_checkpoint(
    unified_dir: &Path,
    strategy: &Path,
    dst_dir: &Path,
    opts: &ConvertOptions<'_>,
) -> Result<ConvertReport> {
    load_distributed_checkpoint_with(unified_dir, Some(&Strategy::load(strategy)?), dst_dir, opts)
}

/// The destination of slicing a unified checkpoint: `strategy` bound to it, or, without one,
/// every tensor whole on rank 0. The skipped list names the strategy's parameters the unified
/// checkpoint lacks and the unified checkpoint's parameters the strategy lacks: MindSpore's
/// `load_distributed_checkpoint` slices only the parameters the target strategy lists (and
/// copies `hyper_param.safetensors` whole), so the latter are not written.
pub(crate) fn unified_target(
    sources: &SourceSet,
    src: &ResolvedStrategy,
    strategy: Option<&Strategy>,
) -> Result<(ResolvedStrategy, Vec<(String, String)>)> {
    match strategy {
        Some(strategy) => {
            let (dst, mut skipped) = bind_target(
                strategy,
                src,
                sources,
                "in the strategy but not in the unified checkpoint",
            )?;
            skipped.extend(
                src.params()
                    .iter()
                    .filter(|p| dst.param(&p.name).is_none())
                    .map(|p| {
                        (
                            p.name.clone(),
                            "in the unified checkpoint but not in the target strategy".to_string(),
                        )
                    }),
            );
            Ok((dst, skipped))
        }
        None => Ok((src.merged()?, Vec::new())),
    }
}

/// [`load_distributed_checkpoint`] for a destination strategy already in memory (for
/// instance one built from MindSpore's layout dict, [`Strategy::from_layout_lists`]), or for
/// none: MindSpore's `predict_strategy=None`, every tensor whole on rank 0.
pub fn load_distributed_checkpoint_with(
    unified_dir: &Path,
    strategy: Option<&Strategy>,
    dst_dir: &Path,
    opts: &ConvertOptions<'_>,
) -> Result<ConvertReport> {
    let sources = SourceSet::unified(unified_dir)?;
    let src_res = sources.unified_strategy()?;
    let (dst_res, skipped) = unified_target(&sources, &src_res, strategy)?;
    // The unified checkpoint's parameters the target strategy lacks are left out (MindSpore).
    let extras = |_| Extras {
        src_only_params: false,
        home_rank: Some(0),
    };
    let opts = ConvertOptions {
        format: Some(opts.format.unwrap_or(Format::Safetensors)),
        ..*opts
    };
    let name = |rank: usize, format: Format| {
        Path::new(&format!("rank_{rank}")).join(format!("net.{}", format.extension()))
    };
    let out = Output {
        dir: dst_dir,
        sources: &[unified_dir],
        tool: "ckpt load",
        strategy_ops: strategy.map(|s| s.ops.as_slice()),
    };
    run(
        &sources, &src_res, &dst_res, extras, name, out, &opts, skipped,
    )
}

/// Binds the destination strategy `dst` to the source `src` (shapes from the source where
/// the strategy lacks them); its parameters no source holds are left out with `why`.
pub(crate) fn bind_target(
    dst: &Strategy,
    src: &ResolvedStrategy,
    sources: &SourceSet,
    why: &str,
) -> Result<(ResolvedStrategy, Vec<(String, String)>)> {
    dst.check_stages()?;
    let (dst_res, unknown) = resolve_target(dst, src, sources)?;
    let skipped = unknown.into_iter().map(|n| (n, why.to_string())).collect();
    Ok((dst_res, skipped))
}

/// Binds a destination strategy's shapes: its own, else the source parameter's of the same
/// name, else the stored shape of a tensor outside the source strategy.
pub(crate) fn resolve_target(
    dst: &Strategy,
    src: &ResolvedStrategy,
    sources: &SourceSet,
) -> Result<(ResolvedStrategy, Vec<String>)> {
    let extras = sources.extras_file(0)?;
    // Named by a file of it, so that a shape the destination disagrees with points somewhere.
    let source = match &extras {
        Some(f) => format!("the source checkpoint ({})", f.path().display()),
        None => "the source checkpoint".to_string(),
    };
    dst.resolve(|p, _| {
        if let Some(s) = src.param(&p.name) {
            return Ok(Some(ShapeHint {
                shape: s.shape.clone(),
                is_global: true,
                dtype: s.dtype,
                source: source.clone(),
            }));
        }
        Ok(extras
            .as_ref()
            .and_then(|f| f.tensor(&p.name))
            .map(|t| ShapeHint {
                shape: t.shape.clone(),
                is_global: true,
                dtype: t.dtype(),
                source: source.clone(),
            }))
    })
}

/// Orders `.ckpt` output as MindSpore's converter does. MindSpore loads the needed source
/// files in descending rank order and keeps each tensor name's first appearance; it writes the
/// parameters it redistributes (those in both strategies) first, then the rest (tensors outside
/// the source strategy, parameters the destination lacks) in that same order. Here the files
/// are those of `cover` (the source ranks the plan reads), highest rank first, then `home` (the
/// file tensors outside the strategy come from). With a pipeline source MindSpore reads every
/// stage a parameter lives in, so parameters are grouped by their last source stage, last
/// stage first. Tensors no file lists follow in plan order.
pub(crate) fn order_like_mindspore(
    items: &mut [OutItem<'_>],
    sources: &SourceSet,
    cover: &[usize],
    home: Option<&CheckpointFile>,
    src: &ResolvedStrategy,
    dst: &ResolvedStrategy,
) -> Result<()> {
    let mut first_seen: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    let mut note = |file: &CheckpointFile| {
        for t in file.tensors() {
            let next = first_seen.len();
            first_seen.entry(t.name.clone()).or_insert(next);
        }
    };
    for &r in cover.iter().rev() {
        if let Some(file) = sources.rank_file(r)? {
            note(&file);
        }
    }
    if let Some(file) = home {
        note(file);
    }
    // MindSpore reads every source stage a parameter lives in, last stage first, so a
    // parameter counts as seen in its last source stage even when the plan reads it elsewhere;
    // tensors outside the source strategy are in every file, hence in the last stage read.
    let last_stage = |name: &str| {
        src.param(name)
            .and_then(|p| p.placements.iter().map(|pl| pl.stage).max())
    };
    let top = items
        .iter()
        .filter_map(|i| last_stage(&i.meta.name))
        .max()
        .unwrap_or(0);
    items.sort_by_key(|i| {
        let name = i.meta.name.as_str();
        let redistributed = src.param(name).is_some() && dst.param(name).is_some();
        (
            !redistributed,
            std::cmp::Reverse(last_stage(name).unwrap_or(top)),
            first_seen.get(name).copied().unwrap_or(usize::MAX),
        )
    });
    Ok(())
}

/// Refuses a file-name prefix that could leave the destination directory.
fn check_prefix(prefix: &str) -> Result<()> {
    if prefix.contains(['/', '\\', '\0']) || prefix == "." || prefix == ".." {
        return Err(CkptError::UnsafeDestination {
            path: PathBuf::from(prefix),
            rule: "the file-name prefix must be a plain name fragment (no '/', '\\', NUL, '.' or '..'), so every file stays inside the destination".to_string(),
        });
    }
    Ok(())
}

/// Writes a conversion's output as `dst_dir/rank_<r>/<prefix><r>.<ext>` (see [`run`]).
#[allow(clippy::too_many_arguments)]
fn write_rank_dirs(
    sources: &SourceSet,
    src: &ResolvedStrategy,
    dst: &ResolvedStrategy,
    extras: impl Fn(usize) -> Extras,
    src_dir: &Path,
    dst_dir: &Path,
    dst_ops: Option<&[OpStrategyRecord]>,
    opts: &ConvertOptions<'_>,
    skipped: Vec<(String, String)>,
) -> Result<ConvertReport> {
    check_prefix(opts.prefix)?;
    let name =
        |rank: usize, format: Format| rank_file_path(Path::new(""), rank, opts.prefix, format);
    let out = Output {
        dir: dst_dir,
        sources: &[src_dir],
        tool: "ckpt convert",
        strategy_ops: dst_ops,
    };
    run(sources, src, dst, extras, name, out, opts, skipped)
}

/// Where a conversion writes: the destination set, the directories it reads (which the
/// destination may not overlap), the operation's name for the set marker, and whether the set
/// records its destination strategy.
struct Output<'a> {
    dir: &'a Path,
    sources: &'a [&'a Path],
    tool: &'a str,
    /// `Some` (the strategy file's operator records) when the destination strategy was given:
    /// the set then holds it as [`SET_STRATEGY_FILE`], the file a resumed run reads it under.
    strategy_ops: Option<&'a [OpStrategyRecord]>,
}

/// The destination strategy as the set written holds it: `dst` without the parameters left
/// out (`skipped`, under `allow_missing`), so that the strategy file lists no tensor the rank
/// files lack.
fn written_strategy(
    dst: &ResolvedStrategy,
    skipped: &[(String, String)],
) -> Result<ResolvedStrategy> {
    if skipped.is_empty() {
        return Ok(dst.clone());
    }
    let left_out: std::collections::HashSet<&str> =
        skipped.iter().map(|(n, _)| n.as_str()).collect();
    let kept = dst
        .params()
        .iter()
        .filter(|p| !left_out.contains(p.name.as_str()))
        .cloned()
        .collect();
    ResolvedStrategy::new(kept)
}

#[allow(clippy::too_many_arguments)]
fn run(
    sources: &SourceSet,
    src: &ResolvedStrategy,
    dst: &ResolvedStrategy,
    extras: impl Fn(usize) -> Extras,
    name: impl Fn(usize, Format) -> PathBuf,
    out: Output<'_>,
    opts: &ConvertOptions<'_>,
    skipped: Vec<(String, String)>,
) -> Result<ConvertReport> {
    let all = dst.ranks();
    let ranks: Vec<usize> = match opts.ranks {
        None => all.clone(),
        Some(list) => {
            if let Some(r) = list.iter().find(|r| all.binary_search(r).is_err()) {
                return Err(CkptError::NotADestinationRank {
                    rank: *r,
                    ranks: all,
                });
            }
            // A rank asked for twice is written once: two plans for one file would write it
            // twice (on two threads at once without fsync) and report it twice.
            let mut seen = std::collections::HashSet::with_capacity(list.len());
            list.iter().copied().filter(|r| seen.insert(*r)).collect()
        }
    };
    let format = opts.format.unwrap_or(sources.format());
    // Plan every rank before writing anything.
    let mut plans: Vec<(usize, PathBuf, RankPlan<'_>)> = Vec::with_capacity(ranks.len());
    for &rank in &ranks {
        let ex = extras(rank);
        let mut plan = plan_rank(sources, src, dst, rank, ex)?;
        if format == Format::Ckpt {
            let home = match ex.home_rank {
                Some(h) => sources.extras_file(h)?,
                None => None,
            };
            let cover = plan.cover.ranks.clone();
            order_like_mindspore(&mut plan.items, sources, &cover, home.as_deref(), src, dst)?;
        }
        plans.push((rank, name(rank, format), plan));
    }
    // The source set's side files that do not depend on the layout, read before anything is
    // written (one past the bound is refused here, naming it), and the destination strategy.
    let carried = sources.carried_files()?;
    let strategy = match out.strategy_ops {
        Some(ops) => Some((written_strategy(dst, &skipped)?, ops)),
        None => None,
    };
    let set = SetWriter::begin_apart(
        out.dir,
        out.sources,
        out.tool,
        opts.force,
        opts.durability(),
    )?;
    let mut side_files: Vec<&str> = carried.iter().map(|(n, _)| n.as_str()).collect();
    side_files.extend(strategy.as_ref().map(|_| SET_STRATEGY_FILE));
    set.refuse_foreign(&side_files)?;
    let total: u64 = plans.iter().map(|(_, _, p)| data_bytes(&p.items)).sum();
    opts.progress.start("converting", total);
    let committer = Committer::new();
    let write = opts.write_options(format, Some(&committer));
    let metadata = [
        ("format".to_string(), "ms".to_string()),
        set.metadata_entry(),
    ];
    // Without fsync, safetensors output (copied by the kernel from the sources' pages,
    // `direct`) is written two files at a time. Measured on the 1 GiB 8→4 conversion (2 cores,
    // medians of 9 interleaved runs, `sync` before each): 0.27 s → 0.17 s (`cp -r`: 0.19 s),
    // peak RSS 41 → 75 MiB. With fsync the disk is the limit: 0.67 s → 0.69 s over 7 runs, so
    // one file at a time. `.ckpt` output already keeps two cores busy (assembling, writing)
    // and would hold two more chunk buffers per extra thread.
    let n_threads = if format == Format::Safetensors && !opts.fsync {
        fan_out::file_threads()
    } else {
        1
    };
    let settings = write.settings();
    let staged: Vec<_> = plans.iter().map(|(_, rel, _)| set.staged(rel)).collect();
    let jobs: Vec<_> = plans.into_iter().zip(staged).collect();
    let done = fan_out::run_jobs(jobs, n_threads, opts.progress, |progress, job| {
        let ((rank, rel, plan), staged) = job;
        let write = settings.with_progress(progress);
        let stats = write_items(sources, &staged, plan.items, &metadata, &write)?;
        Ok((rank, rel, plan.cover, stats))
    })?;
    let mut report = ConvertReport {
        ranks: Vec::with_capacity(done.len()),
        skipped,
    };
    for (rank, rel, cover, stats) in done {
        report.ranks.push(RankReport {
            rank,
            path: set.final_path(&rel),
            source_ranks: cover.ranks,
            exact: cover.exact,
            n_tensors: stats.n_tensors,
            data_bytes: stats.data_bytes,
        });
    }
    committer.finish()?;
    // The model the set describes and the training loop's state are the source's whatever the
    // layout: they come along, so a run resumed from (or `generate` reading) the converted set
    // checks the model and continues the loop (the optimizer's step count, the loss scaler).
    for (name, bytes) in &carried {
        write_file_with(&set.staged(Path::new(name)), bytes, false, set.durability())?;
    }
    // The layout written, under the name a resumed run looks for: no `output.resume_strategy`
    // is needed to read the set.
    if let Some((strategy, ops)) = &strategy {
        tessera_strategy::write_with(
            &set.staged(Path::new(SET_STRATEGY_FILE)),
            strategy,
            ops,
            false,
            set.durability(),
        )?;
    }
    // The last poll: a stop asked for by now drops the staged set.
    stop_point(opts.progress)?;
    set.commit()?;
    opts.progress.finish();
    Ok(report)
}
