//! Checking a distributed checkpoint against its strategy: every file parses (headers valid,
//! CRCs match), every rank the strategy names has its file, every tensor has the slice shape
//! and a consistent dtype, every element of every tensor is held by some rank, and (on request)
//! replicas hold identical bytes.
//!
//! Faults are collected, not returned one by one, so one run reports everything wrong.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use tensor::DType;

use crate::ckpt_file::CheckpointFile;
use crate::error::Result;
use crate::rank_dir::RankFiles;
use crate::sources::SourceSet;
use crate::strategy::Strategy;

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

/// Verifies the checkpoint in `src_dir/rank_<r>/` against `strategy`. With `check_replicas`,
/// every replica of every slice is compared with the first holder's bytes.
pub fn verify_checkpoints(
    src_dir: &Path,
    strategy: &Path,
    check_replicas: bool,
) -> Result<VerifyReport> {
    let rank_files = RankFiles::discover(src_dir)?;
    let strategy = Strategy::load(strategy)?;
    let mut report = VerifyReport::default();
    let fault = |path: &Path, tensor: Option<&str>, rule: String| Fault {
        path: path.to_path_buf(),
        tensor: tensor.map(str::to_string),
        rule,
    };
    // Open every file; a file that does not parse (or fails its CRC) is a fault.
    let mut files: BTreeMap<usize, Rc<CheckpointFile>> = BTreeMap::new();
    for (&rank, path) in &rank_files.files {
        report.n_files += 1;
        match CheckpointFile::open(path) {
            Ok(f) => {
                if let Some(v) = f.metadata().get("crc_num") {
                    if let Err(rule) = check_safetensors_crc(&f, v) {
                        report.faults.push(fault(path, None, rule));
                    }
                }
                files.insert(rank, Rc::new(f));
            }
            Err(e) => report.faults.push(fault(path, None, e.to_string())),
        }
    }
    if let Err(e) = strategy.check_stages() {
        report
            .faults
            .push(fault(&strategy.path, None, e.to_string()));
        return Ok(report);
    }
    let resolved = match SourceSet::rank_dirs(src_dir).and_then(|s| s.resolve_source(&strategy)) {
        Ok((resolved, unknown)) => {
            for name in unknown {
                report.faults.push(fault(
                    src_dir,
                    Some(&name),
                    "the strategy lists it but no rank's file holds it".to_string(),
                ));
            }
            resolved
        }
        Err(e) => {
            report.faults.push(fault(src_dir, None, e.to_string()));
            return Ok(report);
        }
    };
    let dedup = files.values().any(|f| f.removes_redundancy());
    for rank in resolved.ranks() {
        if !rank_files.files.contains_key(&rank) {
            report.faults.push(fault(
                src_dir,
                None,
                format!("rank_{rank}/ holds no checkpoint file, but the strategy places data on rank {rank}"),
            ));
        }
    }
    for p in resolved.params() {
        report.n_params += 1;
        let mut dtype: Option<(DType, PathBuf)> = None;
        for pl in &p.placements {
            let mesh = pl.held.mesh();
            for (block, holders) in pl.held.distinct_boxes() {
                // Holders whose file has a well-formed slice of this block.
                let mut good: Vec<(usize, Rc<CheckpointFile>)> = Vec::new();
                for &slot in &holders {
                    let rank = mesh.device_of_slot(slot);
                    let Some(file) = files.get(&rank) else {
                        continue;
                    };
                    let Some(t) = file.tensor(&p.name) else {
                        if !dedup {
                            report.faults.push(fault(
                                file.path(),
                                Some(&p.name),
                                format!(
                                    "missing, but the strategy places box {block} on rank {rank}"
                                ),
                            ));
                        }
                        continue;
                    };
                    report.n_slices += 1;
                    if t.shape != pl.held.slice_shape() {
                        report.faults.push(fault(
                            file.path(),
                            Some(&p.name),
                            format!(
                                "shape {:?}, but the strategy gives rank {rank} a slice of shape {:?}",
                                t.shape,
                                pl.held.slice_shape()
                            ),
                        ));
                        continue;
                    }
                    match (t.dtype(), &dtype) {
                        (None, _) => {
                            report.faults.push(fault(
                                file.path(),
                                Some(&p.name),
                                format!("MindSpore type {} cannot be sharded", t.ty),
                            ));
                            continue;
                        }
                        (Some(d), None) => dtype = Some((d, file.path().to_path_buf())),
                        (Some(d), Some((first, first_path))) if d != *first => {
                            report.faults.push(fault(
                                file.path(),
                                Some(&p.name),
                                format!(
                                    "dtype {d}, but {} stores it as {first}",
                                    first_path.display()
                                ),
                            ));
                            continue;
                        }
                        _ => {}
                    }
                    good.push((rank, file.clone()));
                }
                if good.is_empty() {
                    report.faults.push(fault(
                        src_dir,
                        Some(&p.name),
                        format!(
                            "elements {block} are held by no rank (the strategy places them on ranks {:?})",
                            holders.iter().map(|&s| mesh.device_of_slot(s)).collect::<Vec<_>>()
                        ),
                    ));
                    continue;
                }
                if check_replicas {
                    let (first_rank, first) = &good[0];
                    for (rank, other) in &good[1..] {
                        report.n_replica_pairs += 1;
                        match same_bytes(first, other, &p.name) {
                            Ok(true) => {}
                            Ok(false) => report.faults.push(fault(
                                other.path(),
                                Some(&p.name),
                                format!("replica on rank {rank} differs from rank {first_rank}'s copy of {block}"),
                            )),
                            Err(e) => report.faults.push(fault(other.path(), Some(&p.name), e.to_string())),
                        }
                    }
                }
            }
        }
    }
    Ok(report)
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

/// MindSpore's safetensors `crc_num`: CRC32 chained over each tensor's name then data, in name
/// order.
fn check_safetensors_crc(file: &CheckpointFile, stored: &str) -> Result<(), String> {
    let stored: u64 = stored
        .parse()
        .map_err(|_| format!("metadata crc_num {stored:?} is not a number"))?;
    let mut names: Vec<&str> = file.tensors().iter().map(|t| t.name.as_str()).collect();
    names.sort_unstable();
    let mut hasher = crc32fast::Hasher::new();
    let mut buf = Vec::new();
    for name in names {
        hasher.update(name.as_bytes());
        let t = file.tensor(name).expect("listed");
        let mut at = 0;
        while at < t.n_bytes {
            let n = (t.n_bytes - at).min(4 << 20) as usize;
            buf.resize(n, 0);
            file.read_bytes(t, at, &mut buf)
                .map_err(|e| e.to_string())?;
            hasher.update(&buf);
            at += n as u64;
        }
    }
    let computed = hasher.finalize();
    if u64::from(computed) != stored {
        return Err(format!(
            "CRC32 check failed: metadata crc_num is {stored} but the tensors hash to {computed}"
        ));
    }
    Ok(())
}
