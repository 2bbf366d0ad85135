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
    /// renamed into place).
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
        file.write_all(bytes).map_err(io)?;
        drop(file);
        std::fs::rename(&partial, &path).map_err(io)
    }

    /// Marks step `step`'s snapshot complete (every rank of a `world`-rank job wrote its part).
    pub fn mark_complete(&self, step: u64, world: usize) -> Result<(), RuntimeError> {
        let bytes = serde_json::to_vec(&Marker { step, world }).unwrap_or_default();
        ckpt::save_side_file(&self.step_dir(step).join(COMPLETE_FILE), &bytes, true)?;
        Ok(())
    }

    /// The complete snapshots, newest first, with the ranks whose files each holds.
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
                // The rank folders present, not every rank number the marker allows.
                let mut ranks: Vec<usize> = std::fs::read_dir(&dir)
                    .ok()?
                    .filter_map(|entry| {
                        let name = entry.ok()?.file_name();
                        name.to_str()?.strip_prefix("rank_")?.parse::<usize>().ok()
                    })
                    .filter(|&r| r < marker.world && self.rank_file(step, r).is_file())
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
                std::fs::remove_dir_all(&dir).map_err(|e| RuntimeError::CheckpointSet {
                    rank: 0,
                    reason: format!("cannot remove the old snapshot {}: {e}", dir.display()),
                })?;
            }
        }
        Ok(())
    }

    /// Removes the snapshots newer than `step` (a resumed job retakes them).
    pub fn drop_newer_than(&self, step: u64) -> Result<(), RuntimeError> {
        for (newer, dir) in self.snapshot_dirs() {
            if newer > step {
                std::fs::remove_dir_all(&dir).map_err(|e| RuntimeError::CheckpointSet {
                    rank: 0,
                    reason: format!("cannot remove the snapshot {}: {e}", dir.display()),
                })?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_marked_snapshots_count_and_the_newest_two_stay() {
        let tmp = tempfile::tempdir().unwrap();
        let store = NodeStore::open(tmp.path().to_path_buf()).unwrap();
        for step in [10, 20, 30] {
            store.write_rank_file(step, 0, b"a").unwrap();
            store.write_rank_file(step, 2, b"b").unwrap();
            store.mark_complete(step, 4).unwrap();
        }
        // A snapshot the ranks never finished.
        store.write_rank_file(40, 0, b"c").unwrap();
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
        assert_eq!(std::fs::read(store.rank_file(30, 2)).unwrap(), b"b");
    }

    /// A marker claiming no rank, or more ranks than any job may have, marks nothing complete;
    /// a huge world costs nothing (the rank folders present are listed, not every number).
    #[test]
    fn a_marker_with_an_impossible_world_is_ignored() {
        let tmp = tempfile::tempdir().unwrap();
        let store = NodeStore::open(tmp.path().to_path_buf()).unwrap();
        for step in [4, 6, 8] {
            store.write_rank_file(step, 0, b"a").unwrap();
            store.write_rank_file(step, 1, b"b").unwrap();
            store.mark_complete(step, 2).unwrap();
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
    }

    #[test]
    fn a_store_must_exist() {
        let err = NodeStore::open(PathBuf::from("/nonexistent/tessera-store")).unwrap_err();
        assert!(err.to_string().contains(super::super::STORE_VAR), "{err}");
    }
}
