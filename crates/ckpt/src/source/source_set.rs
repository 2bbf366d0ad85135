//! Where source tensors come from: per-rank directories or a unified (merged) checkpoint.
//!
//! Files are opened and indexed on first use and kept, so a conversion reads each header once
//! and never opens a rank it does not need. A set is shared by the threads writing several
//! destination files at once (the cache is behind a mutex, the files behind `Arc`).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use super::file::CheckpointFile;
use super::rank_dir::RankFiles;
use crate::error::{io_err, CkptError, Result};
use crate::format::crypto::Decryption;
use crate::format::unified_index::{self, HYPER_PARAM_FILE, PARAM_NAME_MAP};
use crate::format::Format;
use crate::model::{ResolvedStrategy, ShapeHint, Strategy};
use crate::set::{check_file_id, check_set, DirIdentity, SetMarker};

#[derive(Debug)]
enum Kind {
    Ranks(RankFiles),
    Unified {
        dir: PathBuf,
        /// Parameter → part file, in index order.
        weight_map: Vec<(String, PathBuf)>,
        hyper: Option<PathBuf>,
    },
}

/// `mutex`'s contents; a panic elsewhere while holding it left them consistent (every update is
/// one insert or one assignment).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// A set of source checkpoint files.
#[derive(Debug)]
pub struct SourceSet {
    kind: Kind,
    cache: Mutex<HashMap<PathBuf, Arc<CheckpointFile>>>,
    /// The id of the committed set the files belong to (from its marker).
    set_id: Option<String>,
    /// Without a marker: the first set id met in a file, and that file.
    first_id: Mutex<Option<(String, PathBuf)>>,
    /// The key and mode encrypted `.ckpt` files are read with.
    decryption: Option<Decryption>,
    /// The directory the root led to before its set was checked: every file opened later must
    /// come from it, not from a set a writer switched into its place meanwhile.
    root_identity: Option<DirIdentity>,
    /// The committed set's top-level files that a conversion carries into its output
    /// ([`CARRIED_SIDE_FILES`] the marker lists).
    carried: Vec<String>,
}

/// The side files of a set that do not depend on its layout, so that a conversion carries them
/// into the set it writes, byte for byte (never parsed here: they are the training runtime's
/// JSON): `model.json` (a GPT's shape and tokenizer, which `tessera generate` and a resumed run
/// check the model against) and `train_state.json` (the training loop's state: global step,
/// the optimizer's own step count and the loss scaler, which a resumed run continues).
pub(crate) const CARRIED_SIDE_FILES: [&str; 2] = ["model.json", "train_state.json"];

/// The largest side file carried (a `model.json` with a character alphabet is a few KiB).
const MAX_CARRIED_BYTES: u64 = 16 << 20;

/// The [`CARRIED_SIDE_FILES`] a committed set's marker lists (none without a marker: a
/// directory assembled by hand or MindSpore's own carries nothing).
fn carried_of(marker: Option<&SetMarker>) -> Vec<String> {
    let Some(marker) = marker else {
        return Vec::new();
    };
    CARRIED_SIDE_FILES
        .iter()
        .filter(|name| marker.files.iter().any(|f| f.path == **name))
        .map(|name| name.to_string())
        .collect()
}

impl SourceSet {
    /// Sources in `dir/rank_<N>/`. An uncommitted or mixed set is refused ([`check_set`]).
    pub fn rank_dirs(dir: &Path) -> Result<SourceSet> {
        SourceSet::rank_dirs_with_suffix(dir, None)
    }

    /// [`SourceSet::rank_dirs`], each rank's file chosen among those ending in
    /// `<file_suffix>.safetensors` (see [`RankFiles::discover_with_suffix`]).
    pub fn rank_dirs_with_suffix(dir: &Path, file_suffix: Option<&str>) -> Result<SourceSet> {
        // Taken first: a set switched in after this is caught when a file is opened.
        let identity = DirIdentity::of(dir).ok();
        let marker = check_set(dir)?;
        let mut set = SourceSet::of_rank_files(RankFiles::discover_with_suffix(dir, file_suffix)?);
        set.carried = carried_of(marker.as_ref());
        set.set_id = marker.map(|m| m.id);
        set.root_identity = identity;
        Ok(set)
    }

    /// The side files a conversion of this set carries into its output, with their bytes:
    /// those of [`CARRIED_SIDE_FILES`] the committed set lists. Each is read whole (at most
    /// 16 MiB) and refused ([`CkptError::SetReplaced`]) when the set was replaced while it was
    /// read.
    pub fn carried_files(&self) -> Result<Vec<(String, Vec<u8>)>> {
        let mut out = Vec::with_capacity(self.carried.len());
        for name in &self.carried {
            let path = self.root().join(name);
            let file = std::fs::File::open(&path).map_err(io_err(&path, "open"))?;
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(
                &mut std::io::Read::take(file, MAX_CARRIED_BYTES + 1),
                &mut bytes,
            )
            .map_err(io_err(&path, "read"))?;
            if bytes.len() as u64 > MAX_CARRIED_BYTES {
                let reason =
                    format!("a side file of the set, larger than {MAX_CARRIED_BYTES} bytes");
                return Err(io_err(&path, "read")(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    reason,
                )));
            }
            if let Some(identity) = &self.root_identity {
                identity.check()?;
            }
            out.push((name.clone(), bytes));
        }
        Ok(out)
    }

    /// Sources from already discovered rank files, without checking their set.
    pub(crate) fn of_rank_files(files: RankFiles) -> SourceSet {
        SourceSet {
            kind: Kind::Ranks(files),
            cache: Mutex::default(),
            set_id: None,
            first_id: Mutex::default(),
            decryption: None,
            root_identity: None,
            carried: Vec::new(),
        }
    }

    /// Reads encrypted `.ckpt` files with `dec` (MindSpore's `dec_key` / `dec_mode`).
    pub fn with_decryption(mut self, dec: Option<Decryption>) -> SourceSet {
        self.decryption = dec;
        self
    }

    /// A unified checkpoint: `param_name_map.json`, its part files and an optional
    /// `hyper_param.safetensors` (and, when it is a committed set, the
    /// [`CARRIED_SIDE_FILES`] its marker lists, which slicing it carries on).
    pub fn unified(dir: &Path) -> Result<SourceSet> {
        let identity = DirIdentity::of(dir).ok();
        let marker = check_set(dir)?;
        let weight_map = unified_index::read(&dir.join(PARAM_NAME_MAP))?
            .into_iter()
            .map(|(name, file)| (name, dir.join(file)))
            .collect();
        let hyper = Some(dir.join(HYPER_PARAM_FILE)).filter(|p| p.is_file());
        let carried = carried_of(marker.as_ref());
        Ok(SourceSet {
            kind: Kind::Unified {
                dir: dir.to_path_buf(),
                weight_map,
                hyper,
            },
            cache: Mutex::default(),
            set_id: marker.map(|m| m.id),
            first_id: Mutex::default(),
            decryption: None,
            root_identity: identity,
            carried,
        })
    }

    /// A set with no files, for writes whose tensors all name their own file.
    pub(crate) fn empty(dir: &Path) -> SourceSet {
        SourceSet {
            kind: Kind::Unified {
                dir: dir.to_path_buf(),
                weight_map: Vec::new(),
                hyper: None,
            },
            cache: Mutex::default(),
            set_id: None,
            first_id: Mutex::default(),
            decryption: None,
            root_identity: None,
            carried: Vec::new(),
        }
    }

    /// The directory the sources live in.
    pub fn root(&self) -> &Path {
        match &self.kind {
            Kind::Ranks(r) => &r.root,
            Kind::Unified { dir, .. } => dir,
        }
    }

    /// The format of the source files.
    pub fn format(&self) -> Format {
        match &self.kind {
            Kind::Ranks(r) => r.format,
            Kind::Unified { .. } => Format::Safetensors,
        }
    }

    /// The per-rank files, for rank-directory sources.
    pub fn rank_files(&self) -> Option<&RankFiles> {
        match &self.kind {
            Kind::Ranks(r) => Some(r),
            Kind::Unified { .. } => None,
        }
    }

    /// Opens (once) and returns the file at `path`. Refuses it ([`CkptError::SetReplaced`])
    /// when the source directory is no longer the one whose set was checked: a writer switched
    /// another set into its place, and the files opened before may belong to the old one.
    pub fn open(&self, path: &Path) -> Result<Arc<CheckpointFile>> {
        if let Some(f) = lock(&self.cache).get(path) {
            return Ok(f.clone());
        }
        let file = match CheckpointFile::open_with(path, self.decryption.as_ref()) {
            Ok(file) => Arc::new(file),
            Err(e) => {
                // A file missing because its set was removed or replaced meanwhile: the set's
                // fault, said as such (not "does not exist" of one of its files).
                if let Some(identity) = &self.root_identity {
                    identity.check()?;
                }
                return Err(e);
            }
        };
        // After the open: a file opened before the switch came from the checked directory.
        if let Some(identity) = &self.root_identity {
            identity.check()?;
        }
        file.verify_metadata_crc()?;
        self.check_set_id(&file)?;
        lock(&self.cache).insert(path.to_path_buf(), file.clone());
        Ok(file)
    }

    /// Loads the strategy file at `path` as a reader of this set: a strategy inside the set's
    /// directory (`--src-strategy <set>/strategy.json`) must come from the set whose files are
    /// read, so it is checked against the directory's identity like a rank file
    /// ([`SourceSet::open`]): [`CkptError::SetReplaced`] when a writer switched another set
    /// into the directory before the strategy was read (or removed it, and the strategy with
    /// it). A strategy outside the directory is loaded as [`Strategy::load`] does.
    pub fn load_strategy(&self, path: &Path) -> Result<Strategy> {
        let loaded = Strategy::load(path);
        if let Some(identity) = &self.root_identity {
            // A strategy that cannot be read may be missing because its set went away: the
            // set's fault, said as such.
            if loaded.is_err() || self.holds(path) {
                identity.check()?;
            }
        }
        loaded
    }

    /// Whether `path` leads into the set's directory (symlinks followed; a path that cannot
    /// be resolved counts as inside).
    fn holds(&self, path: &Path) -> bool {
        match (
            std::fs::canonicalize(path),
            std::fs::canonicalize(self.root()),
        ) {
            (Ok(path), Ok(root)) => path.starts_with(root),
            _ => true,
        }
    }

    /// Refuses a file of another set than the directory's (or, without a marker, than the
    /// first file's).
    fn check_set_id(&self, file: &CheckpointFile) -> Result<()> {
        let root = self.root();
        if self.set_id.is_some() {
            if file.format() == Format::Safetensors && file.set_id().is_none() {
                return Err(CkptError::MixedSet {
                    path: root.to_path_buf(),
                    id: self.set_id.clone().unwrap_or_default(),
                    reason: format!("{} carries no set id", file.path().display()),
                });
            }
            return check_file_id(root, file.path(), self.set_id.as_deref(), file.set_id());
        }
        let Some(found) = file.set_id() else {
            return Ok(());
        };
        let mut first = lock(&self.first_id);
        match &*first {
            None => *first = Some((found.to_string(), file.path().to_path_buf())),
            Some((id, path)) if id != found => {
                return Err(CkptError::MixedSet {
                    path: root.to_path_buf(),
                    id: id.clone(),
                    reason: format!(
                        "the directory has no set marker, and {} belongs to set {id} but {} to set {found}",
                        path.display(),
                        file.path().display()
                    ),
                })
            }
            Some(_) => {}
        }
        Ok(())
    }

    /// Number of files opened so far.
    pub fn n_opened(&self) -> usize {
        lock(&self.cache).len()
    }

    /// The file of source rank `rank`, or `None` if the rank has none.
    pub fn rank_file(&self, rank: usize) -> Result<Option<Arc<CheckpointFile>>> {
        match &self.kind {
            Kind::Ranks(r) => match r.files.get(&rank) {
                Some(p) => self.open(p).map(Some),
                None => Ok(None),
            },
            Kind::Unified { .. } => Ok(None),
        }
    }

    /// The file that holds `tensor` for source rank `rank` (it may still lack the tensor when
    /// the checkpoint was saved without redundancy). `None` when the rank has no file.
    pub fn file_for(&self, rank: usize, tensor: &str) -> Result<Option<Arc<CheckpointFile>>> {
        match &self.kind {
            Kind::Ranks(_) => self.rank_file(rank),
            Kind::Unified { weight_map, .. } => {
                if rank != 0 {
                    return Ok(None);
                }
                match weight_map.iter().find(|(n, _)| n == tensor) {
                    Some((_, p)) => self.open(p).map(Some),
                    None => Ok(None),
                }
            }
        }
    }

    /// The file whose tensors outside the strategy a destination rank copies: source rank
    /// `home` (MindSpore copies from `rank % device_num`), or the lowest rank present when
    /// `home` has no file; for a unified checkpoint, `hyper_param.safetensors`.
    pub fn extras_file(&self, home: usize) -> Result<Option<Arc<CheckpointFile>>> {
        match &self.kind {
            Kind::Ranks(r) => {
                let path = r.files.get(&home).or_else(|| r.files.values().next());
                path.map(|p| self.open(p)).transpose()
            }
            Kind::Unified { hyper, .. } => hyper.as_deref().map(|p| self.open(p)).transpose(),
        }
    }

    /// Binds `strategy` to global shapes taken from the stored slices (the first rank of each
    /// placement whose file holds the tensor). Parameters no file holds are returned apart.
    ///
    /// Rank folders beyond the strategy's ranks are an error when they hold data the strategy
    /// does not account for ([`SourceSet::stray_ranks`]): the strategy is for fewer devices
    /// than the checkpoint was saved on. A folder past them holding only what its home rank
    /// holds outside the strategy (a step counter) is read past: a pipeline whose last stages
    /// save no parameter (a GPT's loss stage, holding only the tied table's unsaved copy)
    /// writes such folders, one per rank of the run.
    ///
    /// Why the reader accepts them rather than the strategy naming the device count: the
    /// strategy files are MindSpore's formats too (`strategy.ckpt`'s `ParallelStrategyMap`
    /// and its JSON have no device-count field), a strategy's ranks are those its layouts
    /// place (MindSpore derives the device count from them), and sets written before this
    /// rule, whose strategies cannot change, stay readable.
    pub fn resolve_source(&self, strategy: &Strategy) -> Result<(ResolvedStrategy, Vec<String>)> {
        strategy.check_stages()?;
        let resolved = self.resolve_unchecked(strategy)?;
        if let Kind::Ranks(files) = &self.kind {
            let n_ranks = resolved.0.n_ranks();
            let stray = self.stray_ranks(strategy, n_ranks)?;
            if let Some((_, reason)) = stray.first() {
                return Err(CkptError::RankCountMismatch {
                    path: files.root.clone(),
                    strategy: strategy.path.clone(),
                    n_ranks,
                    extra: stray.iter().map(|(r, _)| *r).collect(),
                    reason: reason.clone(),
                });
            }
        }
        Ok(resolved)
    }

    /// The rank folders at or past `n_ranks` (the ranks `strategy` places data on) that hold
    /// data a reader bound to `strategy` would lose, each with why: a tensor the strategy
    /// lists (a shard of a strategy for more devices), or a tensor outside the strategy that
    /// the folder's home rank (`rank % n_ranks`, or the lowest rank present, where readers
    /// copy such tensors from, as MindSpore does) does not hold. A folder holding only what
    /// its home rank holds outside the strategy (the step counter of a pipeline stage that
    /// saves no parameter) is not listed. None without parameters or rank folders.
    pub fn stray_ranks(&self, strategy: &Strategy, n_ranks: usize) -> Result<Vec<(usize, String)>> {
        let Kind::Ranks(files) = &self.kind else {
            return Ok(Vec::new());
        };
        if n_ranks == 0 {
            return Ok(Vec::new());
        }
        let listed: HashSet<&str> = strategy.params.iter().map(|p| p.name.as_str()).collect();
        let mut stray = Vec::new();
        for &rank in files.files.range(n_ranks..).map(|(r, _)| r) {
            let Some(file) = self.rank_file(rank)? else {
                continue;
            };
            let home = self.extras_file(rank % n_ranks)?;
            let reason = file.tensors().iter().find_map(|t| {
                if listed.contains(t.name.as_str()) {
                    return Some(format!(
                        "rank_{rank}/ holds {:?}, a parameter it places on those ranks only",
                        t.name
                    ));
                }
                match &home {
                    Some(h) if h.tensor(&t.name).is_some() => None,
                    Some(h) => Some(format!(
                        "rank_{rank}/ holds {:?}, outside the strategy, which {} (where tensors outside the strategy are read from) does not hold",
                        t.name,
                        h.path().display()
                    )),
                    None => Some(format!("rank_{rank}/ holds {:?}", t.name)),
                }
            });
            if let Some(reason) = reason {
                stray.push((rank, reason));
            }
        }
        Ok(stray)
    }

    /// [`SourceSet::resolve_source`] without the rank-folder check.
    pub(crate) fn resolve_unchecked(
        &self,
        strategy: &Strategy,
    ) -> Result<(ResolvedStrategy, Vec<String>)> {
        let mut held: HashSet<String> = HashSet::new();
        let (resolved, _) = strategy.resolve(|param, placement| {
            let mesh = placement.layout.mesh();
            for slot in 0..mesh.n_slots() {
                let rank = mesh.device_of_slot(slot);
                let Some(file) = self.file_for(rank, &param.name)? else {
                    continue;
                };
                if let Some(t) = file.tensor(&param.name) {
                    held.insert(param.name.clone());
                    return Ok(Some(ShapeHint {
                        shape: t.shape.clone(),
                        is_global: false,
                        dtype: t.dtype(),
                        source: format!("{} (rank {rank})", file.path().display()),
                    }));
                }
            }
            Ok(None)
        })?;
        // A parameter no file holds is absent whether or not the strategy file gives its shape
        // (MindSpore's JSON and Tessera's do): bound from the strategy alone, it would reach the
        // planner with no holder and, without a stored dtype, fail as "not numeric".
        let unknown: Vec<String> = strategy
            .params
            .iter()
            .filter(|p| !held.contains(&p.name))
            .map(|p| p.name.clone())
            .collect();
        if unknown.is_empty() {
            return Ok((resolved, unknown));
        }
        let kept = resolved
            .params()
            .iter()
            .filter(|p| held.contains(&p.name))
            .cloned()
            .collect();
        Ok((ResolvedStrategy::new(kept)?, unknown))
    }

    /// The strategy of a unified checkpoint: every indexed tensor whole on rank 0.
    pub fn unified_strategy(&self) -> Result<ResolvedStrategy> {
        let Kind::Unified { weight_map, .. } = &self.kind else {
            return Err(CkptError::NotUnified {
                path: self.root().to_path_buf(),
            });
        };
        let mut params = Vec::with_capacity(weight_map.len());
        for (name, path) in weight_map {
            let file = self.open(path)?;
            let t = file.tensor(name).ok_or_else(|| CkptError::TensorMissing {
                path: path.clone(),
                tensor: name.clone(),
                rule: format!("{PARAM_NAME_MAP} says this file holds it"),
            })?;
            params.push((name.clone(), t.shape.clone(), t.dtype()));
        }
        ResolvedStrategy::single_rank(&params)
    }
}
