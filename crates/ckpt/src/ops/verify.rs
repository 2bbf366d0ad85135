//! Checking a distributed checkpoint against its strategy: every file parses (headers valid,
//! CRCs match), every rank the strategy names has its file, every tensor has the slice shape
//! and a consistent dtype, every element of every tensor is held by some rank, and (on request)
//! replicas hold identical bytes.
//!
//! Faults are collected, not returned one by one, so one run reports everything wrong, each
//! once: a file that cannot be read is one fault and the other files are still checked.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tensor::DType;

use crate::error::{CkptError, Result};
use crate::format::Format;
use crate::model::{ResolvedParam, Strategy};
use crate::set::{audit_set, DirIdentity};
use crate::source::{CheckpointFile, RankFiles, SourceSet};

/// One thing wrong with a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    /// The file (or directory) at fault.
    pub path: PathBuf,
    /// The tensor, when the fault is about one.
    pub tensor: Option<String>,
    /// The rule broken.
    pub rule: String,
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.tensor {
            Some(t) => write!(f, "{}: tensor {t:?}: {}", self.path.display(), self.rule),
            None => write!(f, "{}: {}", self.path.display(), self.rule),
        }
    }
}

/// The result of [`verify_checkpoints`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VerifyReport {
    /// Rank files checked.
    pub n_files: usize,
    /// Parameters of the strategy checked.
    pub n_params: usize,
    /// Stored tensor slices checked.
    pub n_slices: usize,
    /// Replica pairs compared byte for byte.
    pub n_replica_pairs: usize,
    /// Everything wrong; empty when the checkpoint is sound.
    pub faults: Vec<Fault>,
}

impl VerifyReport {
    /// Whether no fault was found.
    pub fn is_ok(&self) -> bool {
        self.faults.is_empty()
    }
}

/// Faults collected once each (the same fault found twice is reported once).
#[derive(Default)]
struct Faults {
    list: Vec<Fault>,
    seen: BTreeSet<String>,
}

impl Faults {
    /// Records `err` as a fault of `path`, without repeating the path its message starts with.
    fn push_error(&mut self, path: &Path, err: &CkptError) {
        let text = err.to_string();
        let prefix = format!("{}: ", path.display());
        let rule = text.strip_prefix(&prefix).unwrap_or(&text).to_string();
        self.push(path, None, rule);
    }

    fn push(&mut self, path: &Path, tensor: Option<&str>, rule: String) {
        let fault = Fault {
            path: path.to_path_buf(),
            tensor: tensor.map(str::to_string),
            rule,
        };
        if self.seen.insert(fault.to_string()) {
            self.list.push(fault);
        }
    }
}

/// Verifies the checkpoint in `src_dir/rank_<r>/` against `strategy`. With `check_replicas`,
/// every replica of every slice is compared with the first holder's bytes. Every fault of
/// every rank is reported: unreadable files, the set marker disagreeing with the files, rank
/// folders the strategy lacks or needs, and every slice's shape, dtype and coverage.
///
/// A set that a writer switches into `src_dir`'s place while it is being verified is a fault
/// (its files may come from two sets), never a pass.
pub fn verify_checkpoints(
    src_dir: &Path,
    strategy: &Path,
    check_replicas: bool,
) -> Result<VerifyReport> {
    // Taken before anything is read: a set switched in later is caught at the end.
    let identity = DirIdentity::of(src_dir).ok();
    let mut report = verify_files(src_dir, strategy, check_replicas)?;
    if let Some(Err(e)) = identity.map(|i| i.check()) {
        let text = e.to_string();
        let prefix = format!("{}: ", src_dir.display());
        report.faults.push(Fault {
            path: src_dir.to_path_buf(),
            tensor: None,
            rule: text.strip_prefix(&prefix).unwrap_or(&text).to_string(),
        });
    }
    Ok(report)
}

/// [`verify_checkpoints`] without the check that `src_dir` stayed the same directory.
fn verify_files(src_dir: &Path, strategy: &Path, check_replicas: bool) -> Result<VerifyReport> {
    let rank_files = RankFiles::discover(src_dir)?;
    let strategy = Strategy::load(strategy)?;
    let mut report = VerifyReport::default();
    let mut faults = Faults::default();
    let set_id = match audit_set(src_dir) {
        Ok(audit) => {
            for e in audit.faults {
                faults.push_error(src_dir, &e);
            }
            audit.marker.map(|m| m.id)
        }
        Err(e) => {
            faults.push_error(src_dir, &e);
            None
        }
    };
    // Open every file; a file that does not parse, fails its CRC or belongs to another set is
    // a fault, and only the others are checked further.
    let mut files: BTreeMap<usize, Arc<CheckpointFile>> = BTreeMap::new();
    let mut first_id: Option<(String, PathBuf)> = None;
    for (&rank, path) in &rank_files.files {
        report.n_files += 1;
        let file = match CheckpointFile::open(path) {
            Ok(f) => f,
            Err(e) => {
                faults.push_error(path, &e);
                continue;
            }
        };
        if let Err(e) = file.verify_metadata_crc() {
            faults.push_error(path, &e);
        }
        match (&set_id, file.set_id(), &first_id) {
            (Some(expected), found, _)
                if found != Some(expected.as_str())
                    && (found.is_some() || file.format() == Format::Safetensors) =>
            {
                faults.push(
                    path,
                    None,
                    format!(
                        "belongs to set {}, but the directory's marker says set {expected} (a mixed set)",
                        found.unwrap_or("(none)")
                    ),
                );
            }
            (None, Some(found), None) => first_id = Some((found.to_string(), path.clone())),
            (None, Some(found), Some((id, first))) if found != id => faults.push(
                path,
                None,
                format!(
                    "belongs to set {found}, but {} belongs to set {id} (a mixed set without a marker)",
                    first.display()
                ),
            ),
            _ => {}
        }
        files.insert(rank, Arc::new(file));
    }
    if let Err(e) = strategy.check_stages() {
        faults.push(&strategy.path, None, e.to_string());
        report.faults = faults.list;
        return Ok(report);
    }
    let readable = RankFiles {
        files: rank_files
            .files
            .iter()
            .filter(|(r, _)| files.contains_key(r))
            .map(|(&r, p)| (r, p.clone()))
            .collect(),
        ..rank_files.clone()
    };
    let sources = SourceSet::of_rank_files(readable);
    let resolved = match sources.resolve_unchecked(&strategy) {
        Ok((resolved, unknown)) => {
            for name in unknown {
                faults.push(
                    src_dir,
                    Some(&name),
                    "the strategy lists it but no readable rank file holds it".to_string(),
                );
            }
            resolved
        }
        Err(e) => {
            faults.push(src_dir, None, e.to_string());
            report.faults = faults.list;
            return Ok(report);
        }
    };
    // Folders past the strategy's ranks by the readers' rule (`SourceSet::stray_ranks`).
    let n_ranks = resolved.n_ranks();
    match sources.stray_ranks(&strategy, n_ranks) {
        Ok(stray) => {
            for (rank, reason) in stray {
                faults.push(
                    &src_dir.join(format!("rank_{rank}")),
                    None,
                    format!(
                        "an extra rank folder: {} describes only {n_ranks} ranks, and {reason}",
                        strategy.path.display()
                    ),
                );
            }
        }
        Err(e) => faults.push(src_dir, None, e.to_string()),
    }
    let dedup = files.values().any(|f| f.removes_redundancy());
    for rank in resolved.ranks() {
        if !rank_files.files.contains_key(&rank) {
            faults.push(
                src_dir,
                None,
                format!("rank_{rank}/ holds no checkpoint file, but the strategy places data on rank {rank}"),
            );
        }
    }
    let mut check = ParamCheck {
        files: &files,
        dedup,
        check_replicas,
        src_dir,
        faults: &mut faults,
        report: &mut report,
    };
    for p in resolved.params() {
        check.param(p);
    }
    report.faults = faults.list;
    Ok(report)
}

/// What checking one parameter's slices needs.
struct ParamCheck<'a> {
    files: &'a BTreeMap<usize, Arc<CheckpointFile>>,
    dedup: bool,
    check_replicas: bool,
    src_dir: &'a Path,
    faults: &'a mut Faults,
    report: &'a mut VerifyReport,
}

impl ParamCheck<'_> {
    /// Checks every slice of one parameter: present, of the right shape, of one dtype,
    /// covering every element, and (with `check_replicas`) identical across replicas.
    fn param(&mut self, p: &ResolvedParam) {
        self.report.n_params += 1;
        let mut dtype: Option<(DType, PathBuf)> = None;
        for pl in &p.placements {
            let mesh = pl.held.mesh();
            for (block, holders) in pl.held.distinct_boxes() {
                // Holders whose file has a well-formed slice of this block.
                let mut good: Vec<(usize, Arc<CheckpointFile>)> = Vec::new();
                for &slot in &holders {
                    let rank = mesh.device_of_slot(slot);
                    let Some(file) = self.files.get(&rank) else {
                        continue;
                    };
                    let Some(t) = file.tensor(&p.name) else {
                        if !self.dedup {
                            self.faults.push(
                                file.path(),
                                Some(&p.name),
                                format!(
                                    "missing, but the strategy places box {block} on rank {rank}"
                                ),
                            );
                        }
                        continue;
                    };
                    self.report.n_slices += 1;
                    if t.shape != pl.held.slice_shape() {
                        self.faults.push(
                            file.path(),
                            Some(&p.name),
                            format!(
                                "shape {:?}, but the strategy gives rank {rank} a slice of shape {:?}",
                                t.shape,
                                pl.held.slice_shape()
                            ),
                        );
                        continue;
                    }
                    match (t.dtype(), &dtype) {
                        (None, _) => {
                            self.faults.push(
                                file.path(),
                                Some(&p.name),
                                format!("MindSpore type {} cannot be sharded", t.ty),
                            );
                            continue;
                        }
                        (Some(d), None) => dtype = Some((d, file.path().to_path_buf())),
                        (Some(d), Some((first, first_path))) if d != *first => {
                            self.faults.push(
                                file.path(),
                                Some(&p.name),
                                format!(
                                    "dtype {d}, but {} stores it as {first}",
                                    first_path.display()
                                ),
                            );
                            continue;
                        }
                        _ => {}
                    }
                    good.push((rank, file.clone()));
                }
                if good.is_empty() {
                    self.faults.push(
                        self.src_dir,
                        Some(&p.name),
                        format!(
                            "elements {block} are held by no readable rank file (the strategy places them on ranks {:?})",
                            holders.iter().map(|&s| mesh.device_of_slot(s)).collect::<Vec<_>>()
                        ),
                    );
                    continue;
                }
                if self.check_replicas {
                    self.replicas(&p.name, &block.to_string(), &good);
                }
            }
        }
    }

    /// Compares every replica of one block with the first holder's bytes.
    fn replicas(&mut self, name: &str, block: &str, good: &[(usize, Arc<CheckpointFile>)]) {
        let (first_rank, first) = &good[0];
        for (rank, other) in &good[1..] {
            self.report.n_replica_pairs += 1;
            match same_bytes(first, other, name) {
                Ok(true) => {}
                Ok(false) => self.faults.push(
                    other.path(),
                    Some(name),
                    format!(
                        "replica on rank {rank} differs from rank {first_rank}'s copy of {block}"
                    ),
                ),
                Err(e) => self.faults.push(other.path(), Some(name), e.to_string()),
            }
        }
    }
}

/// Whether the tensor `name` has identical bytes in two files (compared in bounded chunks).
fn same_bytes(a: &CheckpointFile, b: &CheckpointFile, name: &str) -> Result<bool> {
    let (ta, tb) = match (a.tensor(name), b.tensor(name)) {
        (Some(x), Some(y)) => (x, y),
        _ => return Ok(false),
    };
    if ta.n_bytes != tb.n_bytes {
        return Ok(false);
    }
    const CHUNK: u64 = 4 << 20;
    let mut ba = vec![0u8; CHUNK.min(ta.n_bytes) as usize];
    let mut bb = ba.clone();
    let mut at = 0;
    while at < ta.n_bytes {
        let n = (ta.n_bytes - at).min(CHUNK) as usize;
        a.read_bytes(ta, at, &mut ba[..n])?;
        b.read_bytes(tb, at, &mut bb[..n])?;
        if ba[..n] != bb[..n] {
            return Ok(false);
        }
        at += n as u64;
    }
    Ok(true)
}
