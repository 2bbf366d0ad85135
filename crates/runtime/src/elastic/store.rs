//! A node's in-memory store of elastic snapshots: a directory on a memory file system (the
//! launcher makes one per node under `/dev/shm` and names it in [`super::STORE_VAR`]).
//!
//! Snapshot of step N: `elastic_step_<N>/` holding `rank_<r>/checkpoint_<r>.safetensors` for
//! this node's ranks and for the ranks whose copies this node keeps, the strategy files and
//! `train_state.json`, and — once every rank of the job has written its part — the marker
//! [`COMPLETE_FILE`]. Only marked snapshots count; the store keeps the newest [`KEEP`].

use std::io::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::RuntimeError;

/// Name prefix of a snapshot's directory.
pub const STEP_PREFIX: &str = "elastic_step_";
/// The marker of a snapshot every rank finished.
pub const COMPLETE_FILE: &str = "elastic_complete.json";
/// Complete snapshots a store keeps.
pub const KEEP: usize = 2;

/// What a complete snapshot's marker says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Marker {
    /// The global step it holds.
    pub step: u64,
    /// The job's ranks when it was taken.
    pub world: usize,
}

/// A complete snapshot in a store: its step, the job's ranks then, and the ranks whose files
/// this store holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Held {
    /// The global step.
    pub step: u64,
    /// Ranks of the job that took it.
    pub world: usize,
    /// Ranks whose checkpoint file this store holds, ascending.
    pub ranks: Vec<usize>,
}

/// One node's store.
#[derive(Debug, Clone)]
pub struct NodeStore {
    dir: PathBuf,
}

impl NodeStore {
    /// The store at `dir`, which must be a directory.
    pub fn open(dir: PathBuf) -> Result<NodeStore, RuntimeError> {
        if !dir.is_dir() {
            return Err(RuntimeError::Config {
                key: super::STORE_VAR.to_string(),
                reason: format!(
                    "{} is not a directory (the launcher's in-memory store of train.elastic)",
                    dir.display()
                ),
            });
        }
        // The snapshots are written mid-run: a store no file can be made in is said now.
        if let Err(e) = crate::paths::probe(&dir) {
            return Err(RuntimeError::Config {
                key: super::STORE_VAR.to_string(),
                reason: format!(
                    "{}: no file can be made in it ({e}); expected a writable directory (the \
                     launcher's in-memory store of train.elastic's snapshots)",
                    dir.display()
                ),
            });
        }
        Ok(NodeStore { dir })
    }

    /// Which node the store is: ranks with the same id share a node (and its memory).
    pub fn id(&self) -> String {
        self.dir.to_string_lossy().into_owned()
    }

    /// The directory of step `step`'s snapshot.
    pub fn step_dir(&self, step: u64) -> PathBuf {
        self.dir.join(format!("{STEP_PREFIX}{step}"))
    }

    /// The checkpoint file of `rank` in step `step`'s snapshot.
    pub fn rank_file(&self, step: u64, rank: usize) -> PathBuf {
        ckpt::rank_file_path(
            &self.step_dir(step),
            rank,
            "checkpoint_",
            ckpt::Format::Safetensors,
        )
    }

    /// Writes `bytes` as `rank`'s file of step `step` (whole or not at all: a temporary file
    /// renamed into place). A failed write or rename (the store full, a directory in the way)
    /// removes the temporary file, which would otherwise hold the store's memory.
    pub fn write_rank_file(
        &self,
        step: u64,
        rank: usize,
        bytes: &[u8],
    ) -> Result<(), RuntimeError> {
        let path = self.rank_file(step, rank);
        let io = |e: std::io::Error| RuntimeError::CheckpointSet {
            rank,
            reason: format!("cannot write {}: {e}", path.display()),
        };
        let parent = path.parent().unwrap_or(&self.dir);
        std::fs::create_dir_all(parent).map_err(io)?;
        let partial = parent.join(format!(".partial-{}", std::process::id()));
        let mut file = std::fs::File::create(&partial).map_err(io)?;
        let written = file.write_all(bytes).and_then(|()| {
            drop(file);
            std::fs::rename(&partial, &path)
        });
        if written.is_err() {
            let _ = std::fs::remove_file(&partial);
        }
        written.map_err(io)
    }

    /// Marks step `step`'s snapshot complete (every rank of a `world`-rank job wrote its part).
    pub fn mark_complete(&self, step: u64, world: usize) -> Result<(), RuntimeError> {
        let bytes = serde_json::to_vec(&Marker { step, world }).unwrap_or_default();
        ckpt::save_side_file(&self.step_dir(step).join(COMPLETE_FILE), &bytes, true)?;
        Ok(())
    }

    /// The complete snapshots, newest first, with the ranks whose files each holds: a
    /// snapshot counts when its marker is sound and its training state readable, and a rank's
    /// file when its header is sound and its data all there.
    pub fn inventory(&self) -> Vec<Held> {
        let mut held: Vec<Held> = self
            .snapshot_dirs()
            .into_iter()
            .filter_map(|(step, dir)| {
                let marker: Marker =
                    serde_json::from_slice(&std::fs::read(dir.join(COMPLETE_FILE)).ok()?).ok()?;
                // A marker for no rank, or for more ranks than any job may have, is damaged.
                if marker.step != step
                    || marker.world == 0
                    || marker.world > layout::limits::max_ranks()
                {
                    return None;
                }
                // A snapshot whose training state is damaged cannot be resumed from.
                if !matches!(crate::periodic_ckpt::TrainState::read(&dir), Ok(Some(_))) {
                    return None;
                }
                // The rank folders present, not every rank number the marker allows; a rank
                // file that is damaged (cut short, say) is not held.
                let mut ranks: Vec<usize> = std::fs::read_dir(&dir)
                    .ok()?
                    .filter_map(|entry| {
                        let name = entry.ok()?.file_name();
                        name.to_str()?.strip_prefix("rank_")?.parse::<usize>().ok()
                    })
                    .filter(|&r| {
                        r < marker.world
                            && ckpt::CheckpointFile::open(&self.rank_file(step, r)).is_ok()
                    })
                    .collect();
                ranks.sort_unstable();
                Some(Held {
                    step,
                    world: marker.world,
                    ranks,
                })
            })
            .collect();
        held.sort_by_key(|h| std::cmp::Reverse(h.step));
        held
    }

    /// [`NodeStore::inventory`]'s snapshots split into those taken by a job of `world` ranks
    /// and the others: a restarted job has its predecessor's ranks, so a snapshot of another
    /// size is another job's (or a damaged marker's) and cannot be resumed from.
    pub fn inventory_by_size(&self, world: usize) -> (Vec<Held>, Vec<Held>) {
        self.inventory().into_iter().partition(|h| h.world == world)
    }

    /// Removes the snapshots older than the newest [`KEEP`] complete ones (complete or not).
    pub fn prune(&self) -> Result<(), RuntimeError> {
        let complete = self.inventory();
        let Some(oldest_kept) = complete.iter().take(KEEP).map(|h| h.step).min() else {
            return Ok(());
        };
        if complete.len() < KEEP {
            return Ok(());
        }
        for (step, dir) in self.snapshot_dirs() {
            if step < oldest_kept {
                self.remove_snapshot(&dir)?;
            }
        }
        Ok(())
    }

    /// Removes the snapshot directory `dir` if it holds only what a snapshot holds; a directory
    /// with anything else (a store named by hand may hold other files) is left, said on
    /// stderr: the store never deletes what it did not write.
    fn remove_snapshot(&self, dir: &Path) -> Result<(), RuntimeError> {
        if let Some(foreign) = foreign_entry(dir) {
            eprintln!(
                "elastic: left {} in place: it holds {}, which no snapshot writes",
                dir.display(),
                foreign.display()
            );
            return Ok(());
        }
        std::fs::remove_dir_all(dir).map_err(|e| RuntimeError::CheckpointSet {
            rank: 0,
            reason: format!("cannot remove the snapshot {}: {e}", dir.display()),
        })
    }

    /// Clears a leftover snapshot directory of step `step` before it is written again; one
    /// that holds what no snapshot writes is refused, naming that entry.
    pub fn clear_step(&self, step: u64) -> Result<(), RuntimeError> {
        let dir = self.step_dir(step);
        if !dir.exists() {
            return Ok(());
        }
        if let Some(foreign) = foreign_entry(&dir) {
            return Err(RuntimeError::CheckpointSet {
                rank: 0,
                reason: format!(
                    "{} holds {}, which no elastic snapshot writes: it is not removed; move it, or name another store in {}",
                    dir.display(),
                    foreign.display(),
                    super::STORE_VAR
                ),
            });
        }
        std::fs::remove_dir_all(&dir).map_err(|e| RuntimeError::CheckpointSet {
            rank: 0,
            reason: format!("cannot clear {}: {e}", dir.display()),
        })
    }

    /// Removes the snapshots newer than `step` (a resumed job retakes them).
    pub fn drop_newer_than(&self, step: u64) -> Result<(), RuntimeError> {
        for (newer, dir) in self.snapshot_dirs() {
            if newer > step {
                self.remove_snapshot(&dir)?;
            }
        }
        Ok(())
    }

    /// Every `elastic_step_<N>/` directory with its step.
    fn snapshot_dirs(&self) -> Vec<(u64, PathBuf)> {
        std::fs::read_dir(&self.dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_str()?.to_string();
                let step = name.strip_prefix(STEP_PREFIX)?.parse().ok()?;
                e.file_type().ok()?.is_dir().then(|| (step, e.path()))
            })
            .collect()
    }

    /// The store's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// The first entry of snapshot directory `dir` that no snapshot writes, if any. A snapshot
/// holds the marker and side files (JSON, MindSpore strategy `.ckpt` files), `rank_<r>/`
/// holding `checkpoint_<r>.safetensors`, [`STAGE_STRATEGY_DIR`](crate::STAGE_STRATEGY_DIR)
/// holding `stage_<s>.ckpt`, and the temporary files of writes cut short (`.partial-*`,
/// `.*.tmp`).
fn foreign_entry(dir: &Path) -> Option<PathBuf> {
    let entries = std::fs::read_dir(dir).ok()?;
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        let rank = name
            .strip_prefix("rank_")
            .and_then(|r| r.parse::<usize>().ok());
        let inner = match (is_dir, rank) {
            (true, Some(rank)) => {
                let file = format!("checkpoint_{rank}.safetensors");
                foreign_file(&path, |n| n == file)
            }
            (true, None) if name == crate::STAGE_STRATEGY_DIR => foreign_file(&path, |n| {
                n.strip_prefix("stage_")
                    .and_then(|n| n.strip_suffix(".ckpt"))
                    .is_some_and(|s| s.parse::<usize>().is_ok())
            }),
            (true, None) => Some(path),
            (false, _) if is_temp(&name) || name.ends_with(".json") || name.ends_with(".ckpt") => {
                None
            }
            (false, _) => Some(path),
        };
        if inner.is_some() {
            return inner;
        }
    }
    None
}

/// The first entry of directory `dir` that is not a plain file named as `ours` says (or a
/// temporary file).
fn foreign_file(dir: &Path, ours: impl Fn(&str) -> bool) -> Option<PathBuf> {
    let entries = std::fs::read_dir(dir).ok()?;
    entries.flatten().find_map(|entry| {
        let name = entry.file_name().to_string_lossy().into_owned();
        let file = entry.file_type().is_ok_and(|t| t.is_file());
        (!file || !(ours(&name) || is_temp(&name))).then(|| entry.path())
    })
}

/// A temporary file of a write cut short: `.partial-*` (a rank file) or `.<name>.<id>.tmp`
/// (the checkpoint writer's).
fn is_temp(name: &str) -> bool {
    name.starts_with(".partial-") || (name.starts_with('.') && name.ends_with(".tmp"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A well-formed safetensors file with no tensors, told apart by its metadata `tag`.
    fn rank_bytes(tag: &str) -> Vec<u8> {
        let header = format!("{{\"__metadata__\":{{\"tag\":\"{tag}\"}}}}");
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(header.as_bytes());
        bytes
    }

    /// Writes a snapshot of `step` holding `ranks`' files, marked complete for `world` ranks.
    fn snapshot(store: &NodeStore, step: u64, ranks: &[usize], world: usize) {
        for &r in ranks {
            store
                .write_rank_file(step, r, &rank_bytes(&format!("{step}-{r}")))
                .unwrap();
        }
        let state = crate::periodic_ckpt::TrainState::new(step, step, None, 0);
        std::fs::write(
            store
                .step_dir(step)
                .join(crate::periodic_ckpt::TRAIN_STATE_FILE),
            state.to_json_bytes(),
        )
        .unwrap();
        store.mark_complete(step, world).unwrap();
    }

    #[test]
    fn only_marked_snapshots_count_and_the_newest_two_stay() {
        let tmp = tempfile::tempdir().unwrap();
        let store = NodeStore::open(tmp.path().to_path_buf()).unwrap();
        for step in [10, 20, 30] {
            snapshot(&store, step, &[0, 2], 4);
        }
        // A snapshot the ranks never finished.
        store.write_rank_file(40, 0, &rank_bytes("c")).unwrap();
        let held = store.inventory();
        assert_eq!(
            held.iter().map(|h| h.step).collect::<Vec<_>>(),
            [30, 20, 10]
        );
        assert_eq!(held[0].ranks, [0, 2]);
        assert_eq!(held[0].world, 4);
        store.prune().unwrap();
        assert!(!store.step_dir(10).exists());
        assert!(store.step_dir(20).exists() && store.step_dir(40).exists());
        assert_eq!(
            std::fs::read(store.rank_file(30, 2)).unwrap(),
            rank_bytes("30-2")
        );
    }

    /// A rank file that cannot be put in place (a directory holds its name here; a full store
    /// cuts the write short the same way) fails naming the file and leaves no `.partial-*`
    /// file holding the store's memory.
    #[test]
    fn a_failed_rank_file_write_leaves_no_partial_file() {
        let tmp = tempfile::tempdir().unwrap();
        let store = NodeStore::open(tmp.path().to_path_buf()).unwrap();
        let path = store.rank_file(5, 1);
        std::fs::create_dir_all(path.join("in_the_way")).unwrap();
        let err = store
            .write_rank_file(5, 1, &rank_bytes("x"))
            .unwrap_err()
            .to_string();
        assert!(err.contains(&*path.to_string_lossy()), "{err}");
        let names: Vec<String> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            ["checkpoint_1.safetensors"],
            "only the directory in the way"
        );
    }

    /// A damaged rank file is not held, and a snapshot whose training state is damaged is not
    /// one: recovery then falls back to an older snapshot that is whole.
    #[test]
    fn damaged_files_are_not_held() {
        let tmp = tempfile::tempdir().unwrap();
        let store = NodeStore::open(tmp.path().to_path_buf()).unwrap();
        for step in [4, 6, 8] {
            snapshot(&store, step, &[0, 1], 2);
        }
        let cut = |path: PathBuf, len: u64| {
            std::fs::OpenOptions::new()
                .write(true)
                .open(path)
                .unwrap()
                .set_len(len)
                .unwrap()
        };
        cut(store.rank_file(8, 1), 12);
        cut(
            store
                .step_dir(6)
                .join(crate::periodic_ckpt::TRAIN_STATE_FILE),
            10,
        );
        let held = store.inventory();
        assert_eq!(
            held.iter()
                .map(|h| (h.step, h.ranks.clone()))
                .collect::<Vec<_>>(),
            [(8, vec![0]), (4, vec![0, 1])]
        );
    }

    /// The store removes only what snapshots hold: a directory named like a snapshot but
    /// holding anything else stays, pruned or not, and is not cleared for a new snapshot.
    #[test]
    fn a_directory_with_foreign_files_is_never_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let store = NodeStore::open(tmp.path().to_path_buf()).unwrap();
        for step in [1, 2, 3] {
            snapshot(&store, step, &[0], 1);
        }
        std::fs::write(store.step_dir(1).join("precious.txt"), "mine").unwrap();
        std::fs::create_dir_all(store.step_dir(99).join("rank_0")).unwrap();
        std::fs::write(store.step_dir(99).join("rank_0").join("notes"), "mine").unwrap();
        store.prune().unwrap();
        assert!(store.step_dir(1).join("precious.txt").exists());
        store.drop_newer_than(3).unwrap();
        assert!(store.step_dir(99).join("rank_0").join("notes").exists());
        let err = store.clear_step(99).unwrap_err().to_string();
        assert!(
            err.contains("notes") && err.contains("not removed"),
            "{err}"
        );
        // A snapshot's own leftovers are cleared: every kind of file a snapshot writes.
        store.write_rank_file(7, 0, &rank_bytes("x")).unwrap();
        let seven = store.step_dir(7);
        std::fs::create_dir_all(seven.join(crate::STAGE_STRATEGY_DIR)).unwrap();
        for name in [
            "strategy.ckpt",
            "strategy.json",
            ".model.json.12-0.tmp",
            "pipeline_stages/stage_1.ckpt",
            "rank_0/.partial-12",
        ] {
            std::fs::write(seven.join(name), "x").unwrap();
        }
        assert_eq!(foreign_entry(&seven), None);
        store.clear_step(7).unwrap();
        assert!(!store.step_dir(7).exists());
    }

    /// A marker claiming no rank, or more ranks than any job may have, marks nothing complete;
    /// a huge world costs nothing (the rank folders present are listed, not every number).
    #[test]
    fn a_marker_with_an_impossible_world_is_ignored() {
        let tmp = tempfile::tempdir().unwrap();
        let store = NodeStore::open(tmp.path().to_path_buf()).unwrap();
        for step in [4, 6, 8] {
            snapshot(&store, step, &[0, 1], 2);
        }
        let marker = |step: u64, world: &str| {
            std::fs::write(
                store.step_dir(step).join(COMPLETE_FILE),
                format!("{{\"step\":{step},\"world\":{world}}}"),
            )
            .unwrap()
        };
        marker(8, "18446744073709551615");
        marker(6, "0");
        let held = store.inventory();
        assert_eq!(held.len(), 1, "{held:?}");
        assert_eq!((held[0].step, &held[0].ranks[..]), (4, &[0, 1][..]));
        // A world of 1 counts only rank 0's file.
        marker(8, "1");
        assert_eq!(store.inventory()[0].ranks, [0]);
        // A 2-rank job passes over the 1-rank snapshot, and a 3-rank job over every one.
        let steps = |held: &[Held]| -> Vec<u64> { held.iter().map(|h| h.step).collect() };
        let (two, others) = store.inventory_by_size(2);
        assert_eq!((steps(&two), steps(&others)), (vec![4], vec![8]));
        assert_eq!(steps(&store.inventory_by_size(1).0), [8]);
        let (three, others) = store.inventory_by_size(3);
        assert!(three.is_empty());
        assert_eq!(steps(&others), [8, 4]);
    }

    #[test]
    fn a_store_must_exist() {
        let err = NodeStore::open(PathBuf::from("/nonexistent/tessera-store")).unwrap_err();
        assert!(err.to_string().contains(super::super::STORE_VAR), "{err}");
    }

    /// A store the snapshots cannot be written into is refused when the run starts, not at
    /// its first snapshot (`/proc/self` is a directory no file can be made in, even by root).
    #[test]
    fn a_store_must_be_writable() {
        let err = NodeStore::open(PathBuf::from("/proc/self")).unwrap_err();
        let text = err.to_string();
        assert!(text.contains(super::super::STORE_VAR), "{text}");
        assert!(
            text.contains("/proc/self: no file can be made in it"),
            "{text}"
        );
        let tmp = tempfile::tempdir().unwrap();
        NodeStore::open(tmp.path().to_path_buf()).unwrap();
        assert_eq!(
            std::fs::read_dir(tmp.path()).unwrap().count(),
            0,
            "the probe is removed"
        );
    }
}
